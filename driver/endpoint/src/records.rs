//! Conversions between the IOCTL records (ioctl-defs) and the engine's types, with the
//! validation every input gets before it may change anything.

use ibcm_cep::{
    AddressVector, CepInfo, CmError, Event, MigrationState, PathRecord, QpAttributes, QpState,
    StateName,
};
use ibcm_ioctl::{
    AvAbi, EventRecord, PathAbi, QpAttrAbi, QueryOut, ep_state, event_type, qp_mask, qp_state,
    status, transport,
};
use ibcm_mad::{Mtu, Rate, Transport};
use zerocopy::FromZeros;

/// An NTSTATUS failure.
pub type Status = i32;

/// The NTSTATUS of an engine error.
pub fn status_of(e: CmError) -> Status {
    match e {
        CmError::UnknownCep => status::INVALID_HANDLE,
        CmError::InvalidState { .. } => status::INVALID_DEVICE_STATE,
        CmError::DuplicateListen => status::ADDRESS_ALREADY_EXISTS,
        CmError::NoResources => status::INSUFFICIENT_RESOURCES,
        _ => status::INVALID_PARAMETER,
    }
}

/// Fails with INVALID_PARAMETER unless `ok`.
pub fn require(ok: bool) -> Result<(), Status> {
    if ok {
        Ok(())
    } else {
        Err(status::INVALID_PARAMETER)
    }
}

/// The used part of an inline buffer, or INVALID_PARAMETER if `len` exceeds `max`.
pub fn used(buf: &[u8], len: u8, max: usize) -> Result<&[u8], Status> {
    let len = usize::from(len);
    require(len <= max)?;
    buf.get(..len).ok_or(status::INVALID_PARAMETER)
}

/// A path from its record; reserved bytes must be zero and fields within their widths.
pub fn path_from_abi(p: &PathAbi) -> Result<PathRecord, Status> {
    require(p.reserved == [0; 2])?;
    require(p.flow_label <= 0xF_FFFF && p.sl <= 15 && p.rate <= 63)?;
    require(p.packet_life_time <= 31 && p.subnet_local <= 1)?;
    Ok(path_of_abi(p))
}

/// A path from its record as the driver writes it (no validation: for the reader of
/// the driver's own output).
pub fn path_of_abi(p: &PathAbi) -> PathRecord {
    PathRecord {
        slid: p.slid,
        dlid: p.dlid,
        sgid: p.sgid,
        dgid: p.dgid,
        flow_label: p.flow_label,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        sl: p.sl,
        rate: Rate::from(p.rate),
        packet_life_time: p.packet_life_time,
        subnet_local: p.subnet_local != 0,
    }
}

/// A path's record.
pub fn path_to_abi(p: &PathRecord) -> PathAbi {
    PathAbi {
        slid: p.slid,
        dlid: p.dlid,
        flow_label: p.flow_label,
        sgid: p.sgid,
        dgid: p.dgid,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        sl: p.sl,
        rate: p.rate.into(),
        packet_life_time: p.packet_life_time,
        subnet_local: p.subnet_local.into(),
        reserved: [0; 2],
    }
}

/// A transport from its code.
pub fn transport_from_abi(code: u8) -> Result<Transport, Status> {
    match code {
        transport::RC => Ok(Transport::Rc),
        transport::UC => Ok(Transport::Uc),
        transport::RD => Ok(Transport::Rd),
        transport::XRC => Ok(Transport::Xrc),
        _ => Err(status::INVALID_PARAMETER),
    }
}

fn transport_to_abi(t: Transport) -> u8 {
    match t {
        Transport::Rc => transport::RC,
        Transport::Uc => transport::UC,
        Transport::Rd => transport::RD,
        Transport::Xrc | Transport::Extended(_) => transport::XRC,
    }
}

/// An MTU from its code (1..=5).
pub fn mtu_from_abi(code: u8) -> Result<Mtu, Status> {
    let mtu = Mtu::from(code);
    require(mtu.bytes().is_some())?;
    Ok(mtu)
}

/// A QP state from its code.
pub fn qp_state_from_abi(code: u32) -> Result<QpState, Status> {
    match code {
        qp_state::INIT => Ok(QpState::Init),
        qp_state::RTR => Ok(QpState::Rtr),
        qp_state::RTS => Ok(QpState::Rts),
        _ => Err(status::INVALID_PARAMETER),
    }
}

fn av_to_abi(av: &AddressVector) -> AvAbi {
    AvAbi {
        path: path_to_abi(&av.path),
        port: av.port,
        ack_timeout: av.ack_timeout,
        reserved: [0; 6],
    }
}

/// QP attributes as a record.
pub fn qp_attr_to_abi(a: &QpAttributes) -> QpAttrAbi {
    let mut r = QpAttrAbi::new_zeroed();
    r.state = match a.state {
        QpState::Init => qp_state::INIT,
        QpState::Rtr => qp_state::RTR,
        QpState::Rts => qp_state::RTS,
    };
    if let (Some(port), Some(pkey), Some(flags)) = (a.port, a.pkey, a.access_flags) {
        r.mask |= qp_mask::INIT;
        r.port = port;
        r.pkey = pkey;
        r.access_flags = flags;
    }
    if let (Some(mtu), Some(qpn), Some(psn), Some(rd), Some(av)) = (
        a.path_mtu,
        a.dest_qpn,
        a.rq_psn,
        a.max_dest_rd_atomic,
        a.primary,
    ) {
        r.mask |= qp_mask::RTR;
        r.path_mtu = mtu.into();
        r.dest_qpn = qpn;
        r.rq_psn = psn;
        r.max_dest_rd_atomic = rd;
        r.primary = av_to_abi(&av);
    }
    if let (Some(psn), Some(t), Some(retry), Some(rnr), Some(rd)) = (
        a.sq_psn,
        a.timeout,
        a.retry_count,
        a.rnr_retry,
        a.max_rd_atomic,
    ) {
        r.mask |= qp_mask::RTS;
        r.sq_psn = psn;
        r.timeout = t;
        r.retry_count = retry;
        r.rnr_retry = rnr;
        r.max_rd_atomic = rd;
    }
    if let Some(alt) = a.alternate {
        r.mask |= qp_mask::ALTERNATE;
        r.alternate = av_to_abi(&alt);
    }
    if let Some(m) = a.path_mig_state {
        r.mask |= qp_mask::PATH_MIG_STATE;
        r.path_mig_state = match m {
            MigrationState::Rearm => 0,
            MigrationState::Migrated => 1,
        };
    }
    r
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
        Event::MraReceived { service_timeout } => {
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
