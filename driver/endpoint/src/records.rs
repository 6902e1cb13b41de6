//! Conversions between the IOCTL records (ioctl-defs) and the engine's own types (events,
//! states, errors), with the validation every input gets before it may change anything.
//! The IBA values the records carry convert in `ibcm_ioctl::convert`.

use ibcm_cep::{CepInfo, CmError, Event, StateName};
pub use ibcm_ioctl::convert::{
    Status, mtu_from_abi, path_from_abi, path_to_abi, qp_attr_to_abi, qp_state_from_abi, require,
    transport_from_abi, transport_to_abi,
};
use ibcm_ioctl::{EventRecord, QueryOut, ep_state, event_type, status};
use zerocopy::FromZeros;

/// The NTSTATUS of an engine error.
pub fn status_of(e: CmError) -> Status {
    match e {
        CmError::UnknownCep => status::INVALID_HANDLE,
        CmError::InvalidState { .. } => status::INVALID_DEVICE_STATE,
        CmError::DuplicateListen => status::ADDRESS_ALREADY_EXISTS,
        CmError::NoResources => status::INSUFFICIENT_RESOURCES,
        CmError::PortDown { .. } => status::DEVICE_NOT_READY,
        _ => status::INVALID_PARAMETER,
    }
}

/// The used part of an inline buffer, or INVALID_PARAMETER if `len` exceeds `max`.
pub fn used(buf: &[u8], len: u8, max: usize) -> Result<&[u8], Status> {
    let len = usize::from(len);
    require(len <= max)?;
    buf.get(..len).ok_or(status::INVALID_PARAMETER)
}

/// The ABI code of a state.
pub fn state_to_abi(s: StateName) -> u32 {
    match s {
        StateName::Idle => ep_state::IDLE,
        StateName::Listen => ep_state::LISTEN,
        StateName::ReqSent => ep_state::REQ_SENT,
        StateName::MraReqRcvd => ep_state::MRA_REQ_RCVD,
        StateName::ReqRcvd => ep_state::REQ_RCVD,
        StateName::MraReqSent => ep_state::MRA_REQ_SENT,
        StateName::RepPrepared => ep_state::REP_PREPARED,
        StateName::RepSent => ep_state::REP_SENT,
        StateName::MraRepRcvd => ep_state::MRA_REP_RCVD,
        StateName::RepRcvd => ep_state::REP_RCVD,
        StateName::MraRepSent => ep_state::MRA_REP_SENT,
        StateName::Established => ep_state::ESTABLISHED,
        StateName::DreqSent => ep_state::DREQ_SENT,
        StateName::DreqRcvd => ep_state::DREQ_RCVD,
        StateName::Timewait => ep_state::TIMEWAIT,
        StateName::SidrReqSent => ep_state::SIDR_REQ_SENT,
        StateName::SidrReqRcvd => ep_state::SIDR_REQ_RCVD,
        StateName::SidrRepSent => ep_state::SIDR_REP_SENT,
        StateName::Removed => ep_state::REMOVED,
    }
}

/// A QUERY answer.
pub fn query_to_abi(info: &CepInfo, private_data: &[u8]) -> QueryOut {
    let mut q = QueryOut::new_zeroed();
    q.size = QueryOut::SIZE;
    q.state = state_to_abi(info.state);
    q.remote_ca_guid = info.remote_ca_guid;
    q.timewait_ns = info.timewait_ns;
    q.local_qpn = info.local_qpn;
    q.remote_qpn = info.remote_qpn;
    q.active = info.active.into();
    q.port = info.port;
    q.peer_responder_resources = info.peer_responder_resources;
    q.peer_initiator_depth = info.peer_initiator_depth;
    q.primary = path_to_abi(&info.primary_path);
    if let Some(alt) = &info.alternate_path {
        q.has_alternate = 1;
        q.alternate = path_to_abi(alt);
    }
    copy_private_data(&mut q.private_data, &mut q.private_data_len, private_data);
    q
}

fn copy_private_data(dst: &mut [u8; 224], len: &mut u8, src: &[u8]) {
    let n = src.len().min(dst.len());
    if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
        d.copy_from_slice(s);
    }
    *len = n as u8;
}

/// An engine event as the record GET_EVENT returns. `handle` is the endpoint the record
/// is queued on; `new_handle` the REQ-created endpoint, if any.
pub fn event_to_abi(event: &Event, handle: u64, new_handle: u64) -> EventRecord {
    let mut r = EventRecord::new_zeroed();
    r.size = EventRecord::SIZE;
    r.handle = handle;
    r.status = status::SUCCESS;
    match event {
        Event::ReqReceived(req) => {
            r.event_type = event_type::REQ_RECEIVED;
            r.new_handle = new_handle;
            r.port = req.port;
            r.service_id = req.service_id;
            r.remote_ca_guid = req.remote_ca_guid;
            r.remote_qpn = req.remote_qpn;
            r.pkey = req.pkey;
            r.primary = path_to_abi(&req.primary_path);
            if let Some(alt) = &req.alternate_path {
                r.has_alternate = 1;
                r.alternate = path_to_abi(alt);
            }
            r.path_mtu = req.path_mtu.into();
            r.transport = transport_to_abi(req.transport);
            r.peer_responder_resources = req.peer_responder_resources;
            r.peer_initiator_depth = req.peer_initiator_depth;
            r.rnr_retry_count = req.rnr_retry_count;
            r.srq = req.srq.into();
            copy_private_data(
                &mut r.private_data,
                &mut r.private_data_len,
                req.private_data.as_slice(),
            );
        }
        Event::RepReceived(rep) => {
            r.event_type = event_type::REP_RECEIVED;
            r.remote_ca_guid = rep.remote_ca_guid;
            r.remote_qpn = rep.remote_qpn;
            r.remote_psn = rep.remote_psn;
            r.peer_responder_resources = rep.peer_responder_resources;
            r.peer_initiator_depth = rep.peer_initiator_depth;
            r.failover_accepted = rep.failover_accepted.into();
            r.srq = rep.srq.into();
            copy_private_data(
                &mut r.private_data,
                &mut r.private_data_len,
                rep.private_data.as_slice(),
            );
        }
        Event::RtuReceived(pd) | Event::DreqReceived(pd) | Event::DrepReceived(pd) => {
            r.event_type = match event {
                Event::RtuReceived(_) => event_type::RTU_RECEIVED,
                Event::DreqReceived(_) => event_type::DREQ_RECEIVED,
                _ => event_type::DREP_RECEIVED,
            };
            copy_private_data(&mut r.private_data, &mut r.private_data_len, pd.as_slice());
        }
        Event::MraReceived {
            service_timeout, ..
        } => {
            r.event_type = event_type::MRA_RECEIVED;
            r.service_timeout = *service_timeout;
        }
        Event::Rejected {
            reason,
            message,
            ari,
            ari_len,
            private_data,
        } => {
            r.event_type = event_type::REJECTED;
            r.status = status::CONNECTION_REFUSED;
            r.reason = (*reason).into();
            r.message = (*message).into();
            r.ari = *ari;
            r.ari_len = *ari_len;
            copy_private_data(
                &mut r.private_data,
                &mut r.private_data_len,
                private_data.as_slice(),
            );
        }
        Event::Timeout { message } => {
            r.event_type = event_type::TIMEOUT;
            r.status = status::IO_TIMEOUT;
            r.message = u16::from(*message) as u8;
        }
        Event::TimewaitExit => r.event_type = event_type::TIMEWAIT_EXIT,
        Event::DeviceRemoval => {
            r.event_type = event_type::DEVICE_REMOVAL;
            r.status = status::DEVICE_REMOVED;
        }
        Event::LapReceived {
            alternate_path,
            private_data,
        } => {
            r.event_type = event_type::LAP_RECEIVED;
            r.has_alternate = 1;
            r.alternate = path_to_abi(alternate_path);
            copy_private_data(
                &mut r.private_data,
                &mut r.private_data_len,
                private_data.as_slice(),
            );
        }
        Event::AprReceived {
            status: ap,
            info,
            info_len,
            private_data,
        } => {
            r.event_type = event_type::APR_RECEIVED;
            r.reason = u8::from(*ap).into();
            r.ari = *info;
            r.ari_len = *info_len;
            copy_private_data(
                &mut r.private_data,
                &mut r.private_data_len,
                private_data.as_slice(),
            );
        }
        Event::SidrReqReceived(req) => {
            r.event_type = event_type::SIDR_REQ_RECEIVED;
            r.new_handle = new_handle;
            r.port = req.port;
            r.service_id = req.service_id;
            r.pkey = req.pkey;
            r.primary.dlid = req.source.lid;
            r.primary.dgid = req.source.gid;
            copy_private_data(
                &mut r.private_data,
                &mut r.private_data_len,
                req.private_data.as_slice(),
            );
        }
        Event::SidrRepReceived(rep) => {
            r.event_type = event_type::SIDR_REP_RECEIVED;
            r.reason = u8::from(rep.status).into();
            r.remote_qpn = rep.qpn;
            r.remote_psn = rep.qkey;
            r.ari = rep.info;
            r.ari_len = rep.info_len;
            copy_private_data(
                &mut r.private_data,
                &mut r.private_data_len,
                rep.private_data.as_slice(),
            );
        }
    }
    r
}

/// The DEVICE_REMOVAL record.
pub fn removal_record(handle: u64) -> EventRecord {
    let mut r = EventRecord::new_zeroed();
    r.size = EventRecord::SIZE;
    r.event_type = event_type::DEVICE_REMOVAL;
    r.handle = handle;
    r.status = status::DEVICE_REMOVED;
    r
}
