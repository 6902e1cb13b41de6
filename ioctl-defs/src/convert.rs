//! Between the records and the IBA values they carry (`ibcm-iba`): the driver reads user
//! input with the validating `*_from_abi` functions and writes its output with `*_to_abi`;
//! the user library reads the driver's output back with `*_of_abi`. One conversion each
//! way, shared by both sides of the ABI.

use ibcm_iba::{
    AddressVector, MigrationState, Mtu, PathRecord, QpAttributes, QpState, Rate, Transport,
};
use zerocopy::FromZeros;

use crate::{AvAbi, PathAbi, QpAttrAbi, qp_mask, qp_state, status, transport};

/// An NTSTATUS failure.
pub type Status = i32;

/// Fails with INVALID_PARAMETER unless `ok`.
pub fn require(ok: bool) -> Result<(), Status> {
    if ok {
        Ok(())
    } else {
        Err(status::INVALID_PARAMETER)
    }
}

/// A path from a caller's record: reserved bytes must be zero and fields within their
/// widths (IBA Table 106: FlowLabel 20 bits, SL 4, rate 6, packet life time 5).
pub fn path_from_abi(p: &PathAbi) -> Result<PathRecord, Status> {
    require(p.reserved == [0; 2])?;
    require(p.flow_label <= 0xF_FFFF && p.sl <= 15 && p.rate <= 63)?;
    require(p.packet_life_time <= 31 && p.subnet_local <= 1)?;
    Ok(path_of_abi(p))
}

/// A path from a record the driver wrote (no validation: for the reader of the driver's
/// own output).
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

/// A transport's code (an extended transport is XRC's: the only one the ABI names).
pub fn transport_to_abi(t: Transport) -> u8 {
    match t {
        Transport::Rc => transport::RC,
        Transport::Uc => transport::UC,
        Transport::Rd => transport::RD,
        Transport::Xrc | Transport::Extended(_) => transport::XRC,
    }
}

/// An MTU from its code (1..=5, IBA Table 106's PathPacketPayloadMTU).
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

/// A QP state's code.
pub fn qp_state_to_abi(state: QpState) -> u32 {
    match state {
        QpState::Init => qp_state::INIT,
        QpState::Rtr => qp_state::RTR,
        QpState::Rts => qp_state::RTS,
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

fn av_of_abi(a: &AvAbi) -> AddressVector {
    AddressVector {
        path: path_of_abi(&a.path),
        port: a.port,
        ack_timeout: a.ack_timeout,
    }
}

/// QP attributes as a record: each group of fields (INIT, RTR, RTS, alternate path,
/// migration state) is written, and its `qp_mask` bit set, only when the transition sets it.
pub fn qp_attr_to_abi(a: &QpAttributes) -> QpAttrAbi {
    let mut r = QpAttrAbi::new_zeroed();
    r.state = qp_state_to_abi(a.state);
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

/// QP attributes from a record the driver wrote: the inverse of [`qp_attr_to_abi`] (a
/// group whose mask bit is clear reads as `None`).
pub fn qp_attr_of_abi(r: &QpAttrAbi) -> QpAttributes {
    let init = r.mask & qp_mask::INIT != 0;
    let rtr = r.mask & qp_mask::RTR != 0;
    let rts = r.mask & qp_mask::RTS != 0;
    QpAttributes {
        state: qp_state_from_abi(r.state).unwrap_or(QpState::Rts),
        port: init.then_some(r.port),
        pkey: init.then_some(r.pkey),
        access_flags: init.then_some(r.access_flags),
        path_mtu: rtr.then(|| Mtu::from(r.path_mtu)),
        dest_qpn: rtr.then_some(r.dest_qpn),
        rq_psn: rtr.then_some(r.rq_psn),
        max_dest_rd_atomic: rtr.then_some(r.max_dest_rd_atomic),
        primary: rtr.then(|| av_of_abi(&r.primary)),
        alternate: (r.mask & qp_mask::ALTERNATE != 0).then(|| av_of_abi(&r.alternate)),
        sq_psn: rts.then_some(r.sq_psn),
        timeout: rts.then_some(r.timeout),
        retry_count: rts.then_some(r.retry_count),
        rnr_retry: rts.then_some(r.rnr_retry),
        max_rd_atomic: rts.then_some(r.max_rd_atomic),
        path_mig_state: (r.mask & qp_mask::PATH_MIG_STATE != 0).then_some(
            if r.path_mig_state == 0 {
                MigrationState::Rearm
            } else {
                MigrationState::Migrated
            },
        ),
    }
}
