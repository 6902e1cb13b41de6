//! Between the C structures of `iba_cm` and the engine's types. Total conversions: every
//! input value maps to something the engine then validates (a reserved value fails there
//! with `InvalidParameter`), and nothing here can panic.

use core::ffi::c_void;

use ibcm_cep::{AddressVector, Event, MigrationState, PathRecord, QpAttributes, QpState, ReqInfo};
use ibcm_mad::{AttributeId, Mtu, Rate, Transport};

use crate::abi::{
    Be16, Be32, Be64, IbAvAttr, IbAvConn, IbGrh, IbPathRec, IbQpInit, IbQpMod, IbQpModState,
    IbQpRtr, IbQpRts, IbaCmApr, IbaCmEvent, IbaCmEventData, IbaCmLap, IbaCmMraEvent, IbaCmPdata,
    IbaCmRejEvent, IbaCmRep, IbaCmRepEvent, IbaCmReqEvent, IbaCmSidrRep, access, apm_state,
    event_type, pdata, qp_opts, qp_state, qp_type,
};

/// The engine's path from a client's `ib_path_rec_t` (SA PathRecord encoding,
/// IBA 15.2.5.16): the selector bits of MTU, rate and packet life time are dropped; a
/// path is subnet-local when its hop limit is 0 or 1 (no GRH needed, as Linux's CM).
pub(crate) fn path_from_abi(p: &IbPathRec) -> PathRecord {
    let hfr = p.hop_flow_raw.get();
    let hop_limit = (hfr & 0xFF) as u8;
    PathRecord {
        slid: p.slid.get(),
        dlid: p.dlid.get(),
        sgid: p.sgid,
        dgid: p.dgid,
        flow_label: (hfr >> 8) & 0x000F_FFFF,
        traffic_class: p.tclass,
        hop_limit,
        sl: (p.qos_class_sl.get() & 0x000F) as u8,
        rate: Rate::from(p.rate & 0x3F),
        packet_life_time: p.pkt_life & 0x3F,
        subnet_local: hop_limit <= 1,
    }
}

/// A client's `ib_path_rec_t` for an engine path (the codes without selector bits, as AL's
/// `__format_path`).
pub(crate) fn path_to_abi(p: &PathRecord, pkey: u16, mtu: Mtu) -> IbPathRec {
    IbPathRec {
        service_id: Be64(0),
        dgid: p.dgid,
        sgid: p.sgid,
        dlid: Be16::new(p.dlid),
        slid: Be16::new(p.slid),
        hop_flow_raw: Be32::new((p.flow_label & 0x000F_FFFF) << 8 | u32::from(p.hop_limit)),
        tclass: p.traffic_class,
        num_path: 0,
        pkey: Be16::new(pkey),
        qos_class_sl: Be16::new(u16::from(p.sl & 0x0F)),
        mtu: u8::from(mtu) & 0x3F,
        rate: u8::from(p.rate) & 0x3F,
        pkt_life: p.packet_life_time & 0x3F,
        preference: 0,
        resv2: [0; 6],
    }
}

/// `ib_qp_type_t` to the REQ's transport; `None` for a type the CM does not carry.
pub(crate) fn transport_from_qp_type(t: i32) -> Option<Transport> {
    match t {
        qp_type::RELIABLE_CONN => Some(Transport::Rc),
        qp_type::UNRELIABLE_CONN => Some(Transport::Uc),
        qp_type::RELIABLE_DGRM => Some(Transport::Rd),
        _ => None,
    }
}

fn qp_type_of(t: Transport) -> i32 {
    match t {
        Transport::Rc => qp_type::RELIABLE_CONN,
        Transport::Uc => qp_type::UNRELIABLE_CONN,
        Transport::Rd => qp_type::RELIABLE_DGRM,
        // No `ib_qp_type_t` names XRC or another extended type: report RC's neighbour
        // value AL has none for either.
        Transport::Xrc | Transport::Extended(_) => qp_type::RELIABLE_CONN,
    }
}

/// `iba_cm` QP state code to the engine's transition.
pub(crate) fn qp_state_from_abi(state: u32) -> Option<QpState> {
    match state {
        qp_state::INIT => Some(QpState::Init),
        qp_state::RTR => Some(QpState::Rtr),
        qp_state::RTS => Some(QpState::Rts),
        _ => None,
    }
}

/// The engine's access flags (`ibcm_cep::access`) as `ib_access_t`.
fn access_to_abi(flags: u32) -> u32 {
    let mut out = 0;
    if flags & ibcm_cep::access::LOCAL_WRITE != 0 {
        out |= access::LOCAL_WRITE;
    }
    if flags & ibcm_cep::access::REMOTE_WRITE != 0 {
        out |= access::RDMA_WRITE;
    }
    if flags & ibcm_cep::access::REMOTE_READ != 0 {
        out |= access::RDMA_READ;
    }
    if flags & ibcm_cep::access::REMOTE_ATOMIC != 0 {
        out |= access::ATOMIC;
    }
    out
}

/// An address vector (`ib_av_attr_t`): the GRH is used off the local subnet, with IP
/// version 6 in the top nibble of `ver_class_flow` (IBA 8.3.1).
fn av_to_abi(av: &AddressVector, mtu: Option<Mtu>, retry: u8, rnr: u8) -> IbAvAttr {
    let p = &av.path;
    IbAvAttr {
        port_num: av.port,
        sl: p.sl,
        dlid: Be16::new(p.dlid),
        grh_valid: i32::from(!p.subnet_local),
        grh: IbGrh {
            ver_class_flow: Be32::new(
                6 << 28 | u32::from(p.traffic_class) << 20 | (p.flow_label & 0x000F_FFFF),
            ),
            resv1: 0,
            resv2: 0,
            hop_limit: p.hop_limit,
            src_gid: p.sgid,
            dest_gid: p.dgid,
        },
        static_rate: u8::from(p.rate),
        path_bits: 0,
        conn: IbAvConn {
            path_mtu: mtu.map_or(0, u8::from),
            local_ack_timeout: av.ack_timeout,
            seq_err_retry_cnt: retry,
            rnr_retry_cnt: rnr,
        },
    }
}

/// AL's `ib_qp_mod_t` for one transition (as `al_cep_get_init_attr` /
/// `al_cep_get_rtr_attr` / `al_cep_get_rts_attr` fill it: zeroed, then the transition's
/// fields; the alternate path with `IB_MOD_QP_ALTERNATE_AV`, and at RTS also
/// `IB_MOD_QP_APM_STATE` with REARM). `pkey_index` is the index of the attributes' P_Key
/// in the port's table.
pub(crate) fn qp_mod(a: &QpAttributes, pkey_index: u16) -> IbQpMod {
    let mut m = IbQpMod::zeroed();
    match a.state {
        QpState::Init => {
            m.req_state = qp_state::INIT;
            m.state = IbQpModState {
                init: IbQpInit {
                    primary_port: a.port.unwrap_or(0),
                    qkey: Be32(0),
                    pkey_index,
                    access_ctrl: access_to_abi(a.access_flags.unwrap_or(0)),
                },
            };
        }
        QpState::Rtr => {
            m.req_state = qp_state::RTR;
            let primary = a
                .primary
                .map(|av| av_to_abi(&av, a.path_mtu, 0, 0))
                .unwrap_or_default();
            let (opts, alternate) = match a.alternate {
                Some(av) => (qp_opts::ALTERNATE_AV, av_to_abi(&av, a.path_mtu, 0, 0)),
                None => (0, IbAvAttr::default()),
            };
            m.state = IbQpModState {
                rtr: IbQpRtr {
                    rq_psn: Be32::new(a.rq_psn.unwrap_or(0)),
                    dest_qp: Be32::new(a.dest_qpn.unwrap_or(0)),
                    primary_av: primary,
                    resp_res: a.max_dest_rd_atomic.unwrap_or(0),
                    // iba_cm passes 0 to AL's pre-REQ/pre-REP (655.36 ms, IBA Table 45).
                    rnr_nak_timeout: 0,
                    opts,
                    alternate_av: alternate,
                    qkey: Be32(0),
                    // AL leaves it 0 at RTR (no IB_MOD_QP_PKEY).
                    pkey_index: 0,
                    access_ctrl: 0,
                    sq_depth: 0,
                    rq_depth: 0,
                },
            };
        }
        QpState::Rts => {
            m.req_state = qp_state::RTS;
            let retry = a.retry_count.unwrap_or(0);
            let rnr = a.rnr_retry.unwrap_or(0);
            let (opts, alternate, apm) = match (a.alternate, a.path_mig_state) {
                (Some(av), mig) => (
                    qp_opts::ALTERNATE_AV | qp_opts::APM_STATE,
                    av_to_abi(&av, a.path_mtu, retry, rnr),
                    match mig {
                        Some(MigrationState::Migrated) => apm_state::MIGRATED,
                        _ => apm_state::REARM,
                    },
                ),
                (None, _) => (0, IbAvAttr::default(), 0),
            };
            m.state = IbQpModState {
                rts: IbQpRts {
                    sq_psn: Be32::new(a.sq_psn.unwrap_or(0)),
                    retry_cnt: retry,
                    rnr_retry_cnt: rnr,
                    local_ack_timeout: a.timeout.unwrap_or(0),
                    init_depth: a.max_rd_atomic.unwrap_or(0),
                    opts,
                    rnr_nak_timeout: 0,
                    current_state: 0,
                    qkey: Be32(0),
                    access_ctrl: 0,
                    resp_res: 0,
                    primary_av: IbAvAttr::default(),
                    alternate_av: alternate,
                    sq_depth: 0,
                    rq_depth: 0,
                    apm_state: apm,
                    primary_port: 0,
                    pkey_index: 0,
                },
            };
        }
    }
    m
}

/// The inline REQ event (`iba_cm_req_event`), from this side's point of view as AL's
/// `__format_event_req` gives it (al_cm_cep.c:6245-6277): this side's responder resources
/// are the peer's initiator depth and its initiator depth the peer's responder resources
/// (6260-6261); the peer's StartingPSN, MaxCMRetries, both CM response timeouts, flow
/// control and retry counts as the REQ carries them (6255, 6259, 6262-6266).
pub(crate) fn req_event(
    r: &ReqInfo,
    local_ca_guid: u64,
    port_num: u8,
    pkey_index: u16,
) -> IbaCmReqEvent {
    let mut pd = [0u8; pdata::REQ];
    let src = r.private_data.as_slice();
    let n = src.len().min(pdata::REQ);
    if let (Some(d), Some(s)) = (pd.get_mut(..n), src.get(..n)) {
        d.copy_from_slice(s);
    }
    IbaCmReqEvent {
        service_id: Be64::new(r.service_id),
        primary_path: path_to_abi(&r.primary_path, r.pkey, r.path_mtu),
        alt_path: r
            .alternate_path
            .map(|p| path_to_abi(&p, r.pkey, r.path_mtu))
            .unwrap_or_default(),
        qpn: Be32::new(r.remote_qpn),
        qp_type: qp_type_of(r.transport),
        starting_psn: Be32::new(r.starting_psn),
        pdata: pd,
        max_cm_retries: r.max_cm_retries,
        resp_res: r.peer_initiator_depth,
        init_depth: r.peer_responder_resources,
        remote_resp_timeout: r.remote_cm_response_timeout,
        flow_ctrl: u8::from(r.flow_control),
        local_resp_timeout: r.local_cm_response_timeout,
        rnr_retry_cnt: r.rnr_retry_count,
        retry_cnt: r.retry_count,
        srq: u8::from(r.srq),
        local_ca_guid: Be64::new(local_ca_guid),
        remote_ca_guid: Be64::new(r.remote_ca_guid),
        pkey_index,
        port_num,
    }
}

/// Storage for the pointer payloads of one delivered event (valid during the callback).
pub(crate) struct Scratch {
    pub pdata: [u8; 224],
    pub info: [u8; pdata::ARI],
    pub path: IbPathRec,
}

impl Scratch {
    pub(crate) const fn new() -> Self {
        Self {
            pdata: [0; 224],
            info: [0; pdata::ARI],
            path: IbPathRec {
                service_id: Be64(0),
                dgid: [0; 16],
                sgid: [0; 16],
                dlid: Be16(0),
                slid: Be16(0),
                hop_flow_raw: Be32(0),
                tclass: 0,
                num_path: 0,
                pkey: Be16(0),
                qos_class_sl: Be16(0),
                mtu: 0,
                rate: 0,
                pkt_life: 0,
                preference: 0,
                resv2: [0; 6],
            },
        }
    }

    /// Copies private data into the zeroed buffer; the event reports the message's whole
    /// field (`len`), as AL does (`IB_*_PDATA_SIZE`).
    fn pdata(&mut self, data: &[u8], len: usize) -> (*mut c_void, u8) {
        let n = data.len().min(len).min(self.pdata.len());
        if let (Some(d), Some(s)) = (self.pdata.get_mut(..n), data.get(..n)) {
            d.copy_from_slice(s);
        }
        (self.pdata.as_mut_ptr().cast(), len.min(224) as u8)
    }

    fn info(&mut self, data: &[u8]) -> (*mut c_void, u8) {
        let n = data.len().min(self.info.len());
        if let (Some(d), Some(s)) = (self.info.get_mut(..n), data.get(..n)) {
            d.copy_from_slice(s);
        }
        (self.info.as_mut_ptr().cast(), n as u8)
    }
}

/// The event a connection's callback gets (`kal_cep_format_event`), its pointers into
/// `scratch`; `None` for what `iba_cm` has no event for (timewait exit, device removal,
/// a REQ on a peer-to-peer id).
pub(crate) fn event_to_abi(e: &Event, scratch: &mut Scratch) -> Option<IbaCmEvent> {
    let mut ev = IbaCmEvent::zeroed(0);
    match e {
        Event::RepReceived(r) => {
            let (p, len) = scratch.pdata(r.private_data.as_slice(), pdata::REP);
            ev.event_type = event_type::REP_RECEIVED;
            ev.data = IbaCmEventData {
                rep: IbaCmRepEvent {
                    rep: IbaCmRep {
                        qpn: Be32::new(r.remote_qpn),
                        starting_psn: Be32::new(r.remote_psn),
                        p_pdata: p.cast_const(),
                        pdata_len: len,
                        failover_accepted: u8::from(r.failover_accepted),
                        // This side's view (`__format_event_rep`, al_cm_cep.c:6292-6295).
                        resp_res: r.peer_initiator_depth,
                        init_depth: r.peer_responder_resources,
                        flow_ctrl: u8::from(r.flow_control),
                        rnr_retry_cnt: r.rnr_retry_count,
                        srq: u8::from(r.srq),
                    },
                    ca_guid: Be64::new(r.remote_ca_guid),
                    // al_cm_cep.c:6284.
                    target_ack_delay: r.target_ack_delay,
                },
            };
        }
        Event::RtuReceived(pd) | Event::DreqReceived(pd) | Event::DrepReceived(pd) => {
            let (kind, size) = match e {
                Event::RtuReceived(_) => (event_type::RTU_RECEIVED, pdata::RTU),
                Event::DreqReceived(_) => (event_type::DREQ_RECEIVED, pdata::DREQ),
                _ => (event_type::DREP_RECEIVED, pdata::DREP),
            };
            let (p, len) = scratch.pdata(pd.as_slice(), size);
            ev.event_type = kind;
            ev.data = IbaCmEventData {
                rtu: IbaCmPdata {
                    p_pdata: p,
                    pdata_len: len,
                },
            };
        }
        Event::MraReceived {
            service_timeout,
            private_data,
        } => {
            // The whole 222-byte field, as `__format_event_mra` (al_cm_cep.c:6311-6312).
            let (p, len) = scratch.pdata(private_data.as_slice(), pdata::MRA);
            ev.event_type = event_type::MRA_RECEIVED;
            ev.data = IbaCmEventData {
                mra: IbaCmMraEvent {
                    p_pdata: p,
                    pdata_len: len,
                    service_timeout: *service_timeout,
                },
            };
        }
        Event::Rejected {
            reason,
            ari,
            ari_len,
            private_data,
            ..
        } => {
            let (a, alen) = scratch.info(ari.get(..usize::from(*ari_len)).unwrap_or(&[]));
            let (p, len) = scratch.pdata(private_data.as_slice(), pdata::REJ);
            ev.event_type = event_type::REJ_RECEIVED;
            ev.data = IbaCmEventData {
                rej: IbaCmRejEvent {
                    ari: a,
                    p_pdata: p,
                    reason: Be16::new(u16::from(*reason)),
                    ari_length: alen,
                    pdata_len: len,
                },
            };
        }
        Event::Timeout { message } => {
            ev.event_type = match message {
                AttributeId::Req => event_type::REQ_ERROR,
                AttributeId::Rep => event_type::REP_ERROR,
                AttributeId::Dreq => event_type::DREQ_ERROR,
                AttributeId::Lap => event_type::LAP_ERROR,
                AttributeId::SidrReq => event_type::SIDR_REQ_ERROR,
                _ => return None,
            };
        }
        Event::LapReceived {
            alternate_path,
            private_data,
        } => {
            scratch.path = path_to_abi(alternate_path, 0, Mtu::from(0));
            let (p, len) = scratch.pdata(private_data.as_slice(), pdata::LAP);
            ev.event_type = event_type::LAP_RECEIVED;
            ev.data = IbaCmEventData {
                lap: IbaCmLap {
                    p_alt_path: &raw mut scratch.path,
                    p_pdata: p,
                    pdata_len: len,
                    remote_resp_timeout: 0,
                },
            };
        }
        Event::AprReceived {
            status,
            info,
            info_len,
            private_data,
        } => {
            let (i, ilen) = scratch.info(info.get(..usize::from(*info_len)).unwrap_or(&[]));
            let (p, len) = scratch.pdata(private_data.as_slice(), pdata::APR);
            ev.event_type = event_type::APR_RECEIVED;
            ev.data = IbaCmEventData {
                apr: IbaCmApr {
                    p_pdata: p,
                    p_info: i,
                    pdata_len: len,
                    info_length: ilen,
                    status: u8::from(*status),
                },
            };
        }
        Event::SidrRepReceived(r) => {
            let (i, ilen) = scratch.info(r.info.get(..usize::from(r.info_len)).unwrap_or(&[]));
            let (p, len) = scratch.pdata(r.private_data.as_slice(), pdata::SIDR_REP);
            ev.event_type = event_type::SIDR_REP_RECEIVED;
            ev.data = IbaCmEventData {
                sidr_rep: IbaCmSidrRep {
                    qpn: Be32::new(r.qpn),
                    qkey: Be32::new(r.qkey),
                    p_pdata: p,
                    p_info: i,
                    pdata_len: len,
                    info_len: ilen,
                    status: u8::from(r.status),
                },
            };
        }
        Event::ReqReceived(_)
        | Event::SidrReqReceived(_)
        | Event::DeviceRemoval
        | Event::TimewaitExit => return None,
    }
    Some(ev)
}
