//! Every QP attribute ibcm hands out, both roles, INIT/RTR/RTS, against what the two
//! counterparts compute from the same REQ and REP (issue 25 #3): Linux `ib_cm`
//! (drivers/infiniband/core/cm.c, Linux 6.1: `cm_init_qp_{init,rtr,rts}_attr`,
//! `cm_req_handler`, `cm_rep_handler`, `ib_send_cm_req`/`_rep`, `cm_ack_timeout`) and
//! WinOF AL (core/al/kernel/al_cm_cep.c at lucasz93/WinOFED 913bc0ce:
//! `al_cep_get_{init,rtr,rts}_attr`, `__save_wire_req`, `__rep_handler`,
//! `__al_cep_pre_req`/`__al_cep_pre_rep`, and `calc_lcl_ack_timeout` in al_cm_cep.h).
//!
//! Each scenario runs a real exchange between two managers and reads the REQ and REP off
//! the wire. Two models below recompute each side's attributes from those messages as
//! the counterpart's code does, line by line (cited where each value is taken). The table
//! [`ROWS`] then says, per attribute, whom ibcm follows: both (they agree), one of them
//! (they differ; the reason is in the row), or neither (ibcm's own rule, checked by the
//! row's own expectation).

use std::collections::BTreeMap;

use ibcm_cep::pair::{GUID_A, GUID_B, Pair, Side, gid};
use ibcm_cep::{CmConfig, ConnectParams, MadAddress, PathRecord, QpAttributes, QpState, RepParams};
use ibcm_iba::{MigrationState, access, ack_timeout};
use ibcm_mad::{CmMad, CmMessage, Failover, Mtu, Rate, Rep, Req, Transport};

const SID: u64 = 0x1000;
const MS: u64 = 1_000_000;

/// One attribute's value by name; a name absent: the model does not set it.
type Values = BTreeMap<&'static str, u64>;

/// Whom ibcm follows for one attribute.
#[derive(Clone, Copy)]
enum Follows {
    /// Linux and AL agree, and so does ibcm.
    Both,
    /// ibcm = AL; Linux differs, for the reason given.
    Al(&'static str),
    /// Linux <= ibcm <= AL (an ACK timeout: Linux may round below the sum it stands for,
    /// AL may double it; ibcm takes the exact ceiling), for the reason given.
    Between(&'static str),
}

/// (attribute, whom ibcm follows). Attributes: `init.*`, `rtr.*`, `rts.*`; `av.*` is the
/// primary address vector of RTR, `alt.*` the alternate one.
const ROWS: &[(&str, Follows)] = &[
    // INIT (Linux cm.c:4101-4137; AL __al_cep_fill_init_attr al_cm_cep.c:5171-5189).
    ("init.pkey", Follows::Both),
    (
        "init.access",
        Follows::Al(
            "LOCAL_WRITE as AL (al_cm_cep.c:5184): every QP that receives into memory needs \
             it, and Linux's users (rdma_cm, ucma) add it themselves",
        ),
    ),
    // RTR (Linux cm.c:4139-4190; AL al_cm_cep.c:6457-6525).
    ("rtr.rq_psn", Follows::Both),
    ("rtr.dest_qpn", Follows::Both),
    ("rtr.path_mtu", Follows::Both),
    ("rtr.max_dest_rd_atomic", Follows::Both),
    ("av.sl", Follows::Both),
    ("av.dlid", Follows::Both),
    ("av.slid", Follows::Both),
    ("av.rate", Follows::Both),
    ("av.dgid", Follows::Both),
    ("av.sgid", Follows::Both),
    ("av.flow_label", Follows::Both),
    ("av.traffic_class", Follows::Both),
    (
        "av.grh",
        Follows::Al(
            "the GRH follows the path's SubnetLocal bit (AL al_cm_cep.c:776-786, 4605-4607); \
             Linux decides by hop limit > 0 and, passive, by whether the REQ came with a \
             GRH (sa_query.c:1270-1272, cm.c:2171)",
        ),
    ),
    (
        "av.hop_limit",
        Follows::Al(
            "the REQ's HopLimit, the path the active side chose (AL al_cm_cep.c:783); \
             Linux's passive side takes 0xFF from the received GRH (cm.c:2171, \
             verbs.c:865-870)",
        ),
    ),
    (
        "av.timeout",
        Follows::Between(
            "active: 2 x PLT + the REP's TargetACKDelay; Linux `cm_ack_timeout` may round \
             the sum down (cm.c:926-943), AL `calc_lcl_ack_timeout` takes a strict upper \
             bound (al_cm_cep.h:476-518); ibcm takes the exact ceiling: never short of the \
             round trip, never a needless doubling. Passive: the REQ's LocalACKTimeout, \
             both (Linux cm.c:1716-1718, 546, with 0 as 1; AL al_cm_cep.c:800-801, 0 kept: \
             ibcm takes Linux's 1, as an infinite timeout hangs a QP on one lost packet)",
        ),
    ),
    ("alt.present", Follows::Both),
    ("alt.dlid", Follows::Both),
    (
        "alt.timeout",
        Follows::Between("as av.timeout, for the alternate path (cm.c:2571-2573)"),
    ),
    // RTS (Linux cm.c:4192-4252; AL al_cm_cep.c:6529-6600).
    ("rts.sq_psn", Follows::Both),
    ("rts.retry_count", Follows::Both),
    ("rts.rnr_retry", Follows::Both),
    ("rts.max_rd_atomic", Follows::Both),
    (
        "rts.timeout",
        Follows::Between("as av.timeout (Linux cm.c:4222-4224; AL al_cm_cep.c:6574-6575)"),
    ),
    ("rts.path_mig_state", Follows::Both),
    (
        "rts.alt.present",
        Follows::Al(
            "the alternate AV again at RTS (AL al_cm_cep.c:6580-6587): a QP modified \
             straight from INIT to RTS, or one whose RTR omitted it, still gets it; Linux \
             gives it at RTR only (cm.c:4173-4180, 4229-4232)",
        ),
    ),
];

/// One exchange: A connects with `cp`, B answers with `rp`; CA ACK delays of A and B.
struct Scenario {
    name: &'static str,
    cp: ConnectParams<'static>,
    rp: RepParams<'static>,
    ack_delay_a: u8,
    ack_delay_b: u8,
}

/// What one side's manager handed out: INIT, RTR, RTS.
struct Handed {
    init: QpAttributes,
    rtr: QpAttributes,
    rts: QpAttributes,
}

/// What ibcm gave, and the wire messages.
struct Run {
    req: Vec<u8>,
    rep: Vec<u8>,
    /// B in REQ_RCVD, before the REP was formatted.
    passive_before_rep: Handed,
    /// B and A, established.
    passive: Handed,
    active: Handed,
}

fn run(s: &Scenario) -> Run {
    let mut a_config = CmConfig::new(GUID_A, [3; 32]);
    a_config.ca_ack_delay = s.ack_delay_a;
    let mut b_config = CmConfig::new(GUID_B, [4; 32]);
    b_config.ca_ack_delay = s.ack_delay_b;
    let mut p = Pair::with_config(a_config, b_config);
    // Each side's MADs come from its end of the path (on RoCE, its IPv4-mapped GID).
    for (side, gid, lid) in [
        (Side::A, s.cp.primary_path.sgid, s.cp.primary_path.slid),
        (Side::B, s.cp.primary_path.dgid, s.cp.primary_path.dlid),
    ] {
        p.set_address(
            side,
            MadAddress {
                lid,
                gid,
                grh: !s.cp.primary_path.subnet_local,
                ..Pair::address_of(side)
            },
        );
    }
    p.wire = Some(Vec::new());
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a, &s.cp).unwrap();
    p.drive_for(MS);
    let b = p.last_request().expect("REQ received");
    p.b.take_request(b).unwrap();
    let handed = |p: &Pair, side: Side, cep| {
        let m = match side {
            Side::A => &p.a,
            Side::B => &p.b,
        };
        Handed {
            init: m.qp_attributes(cep, QpState::Init).unwrap(),
            rtr: m.qp_attributes(cep, QpState::Rtr).unwrap(),
            rts: m.qp_attributes(cep, QpState::Rts).unwrap(),
        }
    };
    let passive_before_rep = handed(&p, Side::B, b);
    let now = p.now;
    p.b.accept(now, b, &s.rp).unwrap();
    p.drive_for(MS);
    p.a.rtu(a, b"").unwrap();
    p.drive_for(MS);
    let passive = handed(&p, Side::B, b);
    let active = handed(&p, Side::A, a);
    let wire = p.wire.take().unwrap_or_default();
    let find = |from: Side, want: fn(&CmMessage<'_>) -> bool| {
        wire.iter()
            .find(|(side, mad)| *side == from && CmMad::parse(mad).is_ok_and(|m| want(&m.message)))
            .map(|(_, mad)| mad.to_vec())
            .expect("message on the wire")
    };
    Run {
        req: find(Side::A, |m| matches!(m, CmMessage::Req(_))),
        rep: find(Side::B, |m| matches!(m, CmMessage::Rep(_))),
        passive_before_rep,
        passive,
        active,
    }
}

fn req(mad: &[u8]) -> Req<'_> {
    match CmMad::parse(mad).map(|m| m.message) {
        Ok(CmMessage::Req(r)) => r,
        other => panic!("not a REQ: {other:?}"),
    }
}

fn rep(mad: &[u8]) -> Rep<'_> {
    match CmMad::parse(mad).map(|m| m.message) {
        Ok(CmMessage::Rep(r)) => r,
        other => panic!("not a REP: {other:?}"),
    }
}

fn gid_u64(g: [u8; 16]) -> u64 {
    u64::from_be_bytes(g[8..].try_into().unwrap())
}

/// ibcm's attributes, by the names the models use.
fn ours(h: &Handed) -> Values {
    let mut v = Values::new();
    v.insert("init.pkey", h.init.pkey.unwrap().into());
    v.insert("init.access", h.init.access_flags.unwrap().into());
    v.insert("rtr.rq_psn", h.rtr.rq_psn.unwrap().into());
    v.insert("rtr.dest_qpn", h.rtr.dest_qpn.unwrap().into());
    v.insert("rtr.path_mtu", u8::from(h.rtr.path_mtu.unwrap()).into());
    v.insert(
        "rtr.max_dest_rd_atomic",
        h.rtr.max_dest_rd_atomic.unwrap().into(),
    );
    let av = h.rtr.primary.unwrap();
    let path = av.path;
    v.insert("av.sl", path.sl.into());
    v.insert("av.dlid", path.dlid.into());
    v.insert("av.slid", path.slid.into());
    v.insert("av.rate", u8::from(path.rate).into());
    v.insert("av.dgid", gid_u64(path.dgid));
    v.insert("av.sgid", gid_u64(path.sgid));
    v.insert("av.flow_label", path.flow_label.into());
    v.insert("av.traffic_class", path.traffic_class.into());
    v.insert("av.grh", u64::from(!path.subnet_local));
    v.insert("av.hop_limit", path.hop_limit.into());
    v.insert("av.timeout", av.ack_timeout.into());
    v.insert("alt.present", u64::from(h.rtr.alternate.is_some()));
    if let Some(alt) = h.rtr.alternate {
        v.insert("alt.dlid", alt.path.dlid.into());
        v.insert("alt.timeout", alt.ack_timeout.into());
    }
    v.insert("rts.sq_psn", h.rts.sq_psn.unwrap().into());
    v.insert("rts.retry_count", h.rts.retry_count.unwrap().into());
    v.insert("rts.rnr_retry", h.rts.rnr_retry.unwrap().into());
    v.insert("rts.max_rd_atomic", h.rts.max_rd_atomic.unwrap().into());
    v.insert("rts.timeout", h.rts.timeout.unwrap().into());
    v.insert(
        "rts.path_mig_state",
        u64::from(h.rts.path_mig_state == Some(MigrationState::Rearm)),
    );
    v.insert("rts.alt.present", u64::from(h.rts.alternate.is_some()));
    v
}

/// Linux `cm_ack_timeout(ca_ack_delay, packet_life_time)`, cm.c:926-943.
fn linux_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let t = i32::from(packet_life_time) + 1;
    let d = i32::from(ca_ack_delay);
    let t = if t >= d {
        t + i32::from(d >= t - 1)
    } else {
        d + i32::from(t >= d - 1)
    };
    t.min(31) as u8
}

/// AL `calc_lcl_ack_timeout(round_trip_time, target_ack_delay)`, al_cm_cep.h:476-518.
fn al_ack_timeout(round_trip_time: u8, target_ack_delay: u8) -> u8 {
    if target_ack_delay == 0 {
        return round_trip_time.min(31);
    }
    let timeout = (1u64 << round_trip_time) + (1u64 << target_ack_delay);
    let mut n = 1u8;
    while (1u64 << n) <= timeout {
        n += 1;
        if n > 31 {
            return 31;
        }
    }
    n
}

/// The address vector a side builds from a path it holds in its own orientation.
fn path_av(v: &mut Values, prefix: &'static [&'static str; 10], p: &PathRecord, grh: bool) {
    let [sl, dlid, slid, rate, dgid, sgid, flow, tclass, g, hop] = *prefix;
    v.insert(sl, p.sl.into());
    v.insert(dlid, p.dlid.into());
    v.insert(slid, p.slid.into());
    v.insert(rate, u8::from(p.rate).into());
    v.insert(dgid, gid_u64(p.dgid));
    v.insert(sgid, gid_u64(p.sgid));
    v.insert(flow, p.flow_label.into());
    v.insert(tclass, p.traffic_class.into());
    v.insert(g, u64::from(grh));
    v.insert(hop, p.hop_limit.into());
}

const AV: [&str; 10] = [
    "av.sl",
    "av.dlid",
    "av.slid",
    "av.rate",
    "av.dgid",
    "av.sgid",
    "av.flow_label",
    "av.traffic_class",
    "av.grh",
    "av.hop_limit",
];

/// The passive side's view of a REQ path: local and remote swap (Linux
/// `cm_format_paths_from_req` cm.c:1694-1722; AL `__format_req_av` al_cm_cep.c:773-793).
fn passive_path(p: &ibcm_mad::Path) -> PathRecord {
    PathRecord {
        slid: p.remote_lid,
        dlid: p.local_lid,
        sgid: p.remote_gid,
        dgid: p.local_gid,
        flow_label: p.flow_label,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        sl: p.sl,
        rate: p.packet_rate,
        packet_life_time: p.local_ack_timeout.saturating_sub(1),
        subnet_local: p.subnet_local,
    }
}

fn read_access(responder_resources: u8, local_write: bool) -> u64 {
    let mut a = access::REMOTE_WRITE;
    if local_write {
        a |= access::LOCAL_WRITE;
    }
    if responder_resources != 0 {
        a |= access::REMOTE_READ | access::REMOTE_ATOMIC;
    }
    a.into()
}

/// Linux, the active side, after the REP.
fn linux_active(s: &Scenario, req: &Req<'_>, rep: &Rep<'_>) -> Values {
    let mut v = Values::new();
    let path = s.cp.primary_path;
    // cm_rep_handler: responder_resources = REP.InitiatorDepth, initiator_depth =
    // REP.ResponderResources (cm.c:2560-2563); rnr from the REP (2565); TAD (2566-2567).
    let resp = rep.initiator_depth;
    v.insert("init.pkey", req.partition_key.into()); // cm_init_av_by_path, cm.c:525-526
    v.insert("init.access", read_access(resp, false)); // cm.c:4121-4124
    v.insert("rtr.rq_psn", req.starting_psn.into()); // ib_send_cm_req, cm.c:1574
    let qpn = if req.transport == Transport::Xrc {
        rep.local_eecn // cm_rep_get_qpn, cm_msgs.h:60-66
    } else {
        rep.local_qpn
    };
    v.insert("rtr.dest_qpn", qpn.into()); // cm.c:2559
    v.insert("rtr.path_mtu", u8::from(req.path_mtu).into()); // cm.c:1547
    v.insert("rtr.max_dest_rd_atomic", resp.into()); // cm.c:4165
    // ib_init_ah_attr_from_path: GRH when hop_limit > 0 (sa_query.c:1270-1272).
    path_av(&mut v, &AV, &path, path.hop_limit > 0);
    // av.timeout = cm_ack_timeout(REP.TargetACKDelay, PLT) at the REP (cm.c:2566-2573).
    let timeout = linux_ack_timeout(rep.target_ack_delay, path.packet_life_time);
    v.insert("av.timeout", timeout.into());
    let alt =
        s.cp.alternate_path
            .filter(|_| rep.failover_accepted == Failover::Accepted);
    v.insert("alt.present", u64::from(alt.is_some())); // cm.c:4173
    if let Some(alt) = alt {
        v.insert("alt.dlid", alt.dlid.into());
        let t = linux_ack_timeout(rep.target_ack_delay, alt.packet_life_time);
        v.insert("alt.timeout", t.into()); // cm.c:2571-2573
    }
    v.insert("rts.sq_psn", rep.starting_psn.into()); // cm.c:2564
    v.insert("rts.retry_count", s.cp.retry_count.into()); // cm.c:1546
    v.insert("rts.rnr_retry", rep.rnr_retry_count.into()); // cm.c:2565
    v.insert("rts.max_rd_atomic", rep.responder_resources.into()); // cm.c:2560-2561
    v.insert("rts.timeout", timeout.into()); // cm.c:4222-4224
    v.insert("rts.path_mig_state", u64::from(alt.is_some())); // REARM, cm.c:4229-4232
    v.insert("rts.alt.present", 0); // the alternate only at RTR (cm.c:4173-4180)
    v
}

/// AL, the active side, after the REP.
fn al_active(s: &Scenario, req: &Req<'_>, rep: &Rep<'_>) -> Values {
    let mut v = Values::new();
    let path = s.cp.primary_path;
    // __rep_handler: init_depth = REP.resp_resources, resp_res = REP.initiator_depth
    // (al_cm_cep.c:1313-1314), rnr (1302), target_ack_delay (1297).
    let resp = rep.initiator_depth;
    v.insert("init.pkey", req.partition_key.into()); // __find_port_cep, al_cm_cep.c:4569
    v.insert("init.access", read_access(resp, true)); // al_cm_cep.c:5184-5188
    v.insert("rtr.rq_psn", req.starting_psn.into()); // al_cm_cep.c:4865
    v.insert("rtr.dest_qpn", rep.local_qpn.into()); // al_cm_cep.c:1294
    v.insert("rtr.path_mtu", u8::from(req.path_mtu).into()); // al_cm_cep.c:4616
    v.insert("rtr.max_dest_rd_atomic", resp.into()); // al_cm_cep.c:6498
    // __format_path_av: a GRH for RoCE, a routed DGID or hop limit > 1 (4605-4607).
    let link_local = path.dgid[..2] == [0xfe, 0x80];
    path_av(
        &mut v,
        &AV,
        &path,
        !path.subnet_local || !link_local || path.hop_limit > 1,
    );
    // pre_req: calc(PLT + 1, 0) (al_cm_cep.c:4617-4618); at the REP calc(that, TAD)
    // (1300-1308).
    let at_rep = |plt: u8| al_ack_timeout(al_ack_timeout(plt + 1, 0), rep.target_ack_delay);
    let timeout = at_rep(path.packet_life_time);
    v.insert("av.timeout", timeout.into());
    let alt =
        s.cp.alternate_path
            .filter(|_| rep.failover_accepted == Failover::Accepted);
    v.insert("alt.present", u64::from(alt.is_some())); // al_cm_cep.c:6503-6508
    if let Some(alt) = alt {
        v.insert("alt.dlid", alt.dlid.into());
        v.insert("alt.timeout", at_rep(alt.packet_life_time).into());
    }
    v.insert("rts.sq_psn", rep.starting_psn.into()); // al_cm_cep.c:1316
    v.insert("rts.retry_count", s.cp.retry_count.into()); // al_cm_cep.c:4781
    v.insert("rts.rnr_retry", rep.rnr_retry_count.into()); // al_cm_cep.c:1302
    v.insert("rts.max_rd_atomic", rep.responder_resources.into()); // 1313
    v.insert("rts.timeout", timeout.into()); // al_cm_cep.c:6574-6575
    v.insert("rts.path_mig_state", u64::from(alt.is_some())); // REARM, 6583
    v.insert("rts.alt.present", u64::from(alt.is_some())); // 6580-6587
    v
}

/// Linux, the passive side; `rp` None: before `ib_send_cm_rep` (REQ_RCVD).
fn linux_passive(req: &Req<'_>, rep: Option<(&Rep<'_>, &RepParams<'_>)>) -> Values {
    let mut v = Values::new();
    // cm_req_handler: responder_resources = REQ.InitiatorDepth, initiator_depth =
    // REQ.ResponderResources (cm.c:2105-2108); ib_send_cm_rep replaces both with the
    // user's (2317-2318) and sets rq_psn (2319).
    let (resp, init) = match rep {
        Some((_, rp)) => (rp.responder_resources, rp.initiator_depth),
        None => (req.initiator_depth, req.responder_resources),
    };
    let path = passive_path(&req.primary_path);
    v.insert("init.pkey", req.partition_key.into()); // cm.c:1708, 525-526
    v.insert("init.access", read_access(resp, false)); // cm.c:4121-4124
    if let Some((rep, _)) = rep {
        v.insert("rtr.rq_psn", rep.starting_psn.into()); // cm.c:2319
    }
    v.insert("rtr.dest_qpn", req.local_qpn.into()); // cm.c:2103-2104
    v.insert("rtr.path_mtu", u8::from(req.path_mtu).into()); // cm.c:2109
    v.insert("rtr.max_dest_rd_atomic", resp.into()); // cm.c:4165
    path_av(&mut v, &AV, &path, !path.subnet_local);
    // Linux takes hop limit and GRH from the received MAD (cm.c:2171); not modelled.
    v.remove("av.grh");
    v.remove("av.hop_limit");
    // PLT = LocalACKTimeout - 1 (cm.c:1716-1718); av.timeout = PLT + 1 (546).
    let timeout = path.packet_life_time + 1;
    v.insert("av.timeout", timeout.into());
    let alt = req
        .alternate_path
        .is_present()
        .then(|| passive_path(&req.alternate_path));
    let alt =
        alt.filter(|_| rep.is_none_or(|(rep, _)| rep.failover_accepted == Failover::Accepted));
    v.insert("alt.present", u64::from(alt.is_some())); // cm.c:1633-1639, 4173
    if let Some(alt) = alt {
        v.insert("alt.dlid", alt.dlid.into());
        v.insert("alt.timeout", (alt.packet_life_time + 1).into());
    }
    v.insert("rts.sq_psn", req.starting_psn.into()); // cm.c:2111
    v.insert("rts.retry_count", req.retry_count.into()); // cm.c:2112
    v.insert("rts.rnr_retry", req.rnr_retry_count.into()); // cm.c:2113
    v.insert("rts.max_rd_atomic", init.into()); // cm.c:4220
    v.insert("rts.timeout", timeout.into()); // cm.c:4222-4224
    v.insert("rts.path_mig_state", u64::from(alt.is_some())); // cm.c:4229-4232
    v.insert("rts.alt.present", 0);
    v
}

/// AL, the passive side; `rp` None: before the pre-REP (REQ_RCVD).
fn al_passive(req: &Req<'_>, rep: Option<(&Rep<'_>, &RepParams<'_>)>, ca_max: u8) -> Values {
    let mut v = Values::new();
    // __save_wire_req: resp_res = REQ.init_depth (al_cm_cep.c:869), init_depth =
    // REQ.resp_res (875); __al_cep_pre_rep: init_depth = the user's (5058), resp_res the
    // user's if non-zero (5069-5070), capped at the CA's max_qp_resp_res (5074-5083).
    let (resp, init) = match rep {
        Some((_, rp)) => {
            let resp = if rp.responder_resources != 0 {
                rp.responder_resources
            } else {
                req.initiator_depth
            };
            (resp.min(ca_max), rp.initiator_depth)
        }
        None => (req.initiator_depth, req.responder_resources),
    };
    let path = passive_path(&req.primary_path);
    v.insert("init.pkey", req.partition_key.into()); // __find_port_cep, al_cm_cep.c:719-720
    v.insert("init.access", read_access(resp, true)); // al_cm_cep.c:5184-5188
    if let Some((rep, _)) = rep {
        v.insert("rtr.rq_psn", rep.starting_psn.into()); // al_cm_cep.c:5057
    }
    v.insert("rtr.dest_qpn", req.local_qpn.into()); // al_cm_cep.c:834
    v.insert("rtr.path_mtu", u8::from(req.path_mtu).into()); // al_cm_cep.c:799
    v.insert("rtr.max_dest_rd_atomic", resp.into()); // al_cm_cep.c:6498
    // __format_req_av: GRH for RoCE or !SubnetLocal (776-786), the REQ's hop limit (783).
    path_av(&mut v, &AV, &path, !path.subnet_local);
    // The REQ's LocalACKTimeout as it is (al_cm_cep.c:800-801).
    let timeout = req.primary_path.local_ack_timeout;
    v.insert("av.timeout", timeout.into());
    let alt = req
        .alternate_path
        .is_present()
        .then(|| passive_path(&req.alternate_path));
    // A user failover other than accepted clears av[1] (al_cm_cep.c:5120-5127).
    let alt =
        alt.filter(|_| rep.is_none_or(|(rep, _)| rep.failover_accepted == Failover::Accepted));
    v.insert("alt.present", u64::from(alt.is_some())); // al_cm_cep.c:6503-6508
    if let Some(alt) = alt {
        v.insert("alt.dlid", alt.dlid.into());
        v.insert("alt.timeout", req.alternate_path.local_ack_timeout.into());
    }
    v.insert("rts.sq_psn", req.starting_psn.into()); // al_cm_cep.c:877
    v.insert("rts.retry_count", req.retry_count.into()); // al_cm_cep.c:802-803
    v.insert("rts.rnr_retry", req.rnr_retry_count.into()); // al_cm_cep.c:804-805
    v.insert("rts.max_rd_atomic", init.into()); // al_cm_cep.c:6576
    v.insert("rts.timeout", timeout.into()); // al_cm_cep.c:6574-6575
    v.insert("rts.path_mig_state", u64::from(alt.is_some())); // 6583
    v.insert("rts.alt.present", u64::from(alt.is_some())); // 6580-6587
    v
}

/// Compares ibcm's values with both models row by row; returns the failures.
fn judge(
    scenario: &str,
    role: &str,
    ours: &Values,
    linux: &Values,
    al: Option<&Values>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for &(name, follows) in ROWS {
        let (Some(&o), Some(&l)) = (ours.get(name), linux.get(name)) else {
            continue;
        };
        let a = al.and_then(|al| al.get(name).copied());
        let (ok, why) = match follows {
            Follows::Both => (o == l && a.is_none_or(|a| a == o), "Linux and AL agree"),
            Follows::Al(why) => (a.is_none_or(|a| a == o), why),
            Follows::Between(why) => (l <= o && a.is_none_or(|a| o <= a), why),
        };
        if !ok {
            failures.push(format!(
                "{scenario} / {role} / {name}: ibcm {o:#x}, Linux {l:#x}, AL {a:x?} ({why})"
            ));
        }
    }
    failures
}

fn path(side: Side, plt: u8) -> PathRecord {
    PathRecord {
        packet_life_time: plt,
        ..Pair::path(side)
    }
}

fn scenarios() -> Vec<Scenario> {
    let base = Scenario {
        name: "IB, defaults",
        cp: Pair::connect_params(SID, 0x11),
        rp: Pair::rep_params(0x22),
        ack_delay_a: 15,
        ack_delay_b: 15,
    };
    let alternate = PathRecord {
        slid: 3,
        dlid: 4,
        sgid: gid(3),
        dgid: gid(4),
        packet_life_time: 16,
        ..Pair::path(Side::A)
    };
    // RoCEv2: IPv4-mapped GIDs, permissive LIDs, a GRH always (linux-peer.md).
    let mapped = |last: u8| {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 77, 0, last]);
        g
    };
    let roce = PathRecord {
        slid: 0xffff,
        dlid: 0xffff,
        sgid: mapped(1),
        dgid: mapped(2),
        flow_label: 0x1_2345,
        traffic_class: 0x20,
        hop_limit: 64,
        sl: 3,
        rate: Rate::Gbps25,
        packet_life_time: 18,
        subnet_local: false,
    };
    vec![
        Scenario {
            name: "asymmetric read limits",
            cp: ConnectParams {
                responder_resources: 4,
                initiator_depth: 8,
                ..base.cp
            },
            rp: RepParams {
                responder_resources: 1,
                initiator_depth: 2,
                ..base.rp
            },
            ..base
        },
        Scenario {
            name: "no RDMA read at all",
            cp: ConnectParams {
                responder_resources: 0,
                initiator_depth: 0,
                ..base.cp
            },
            rp: RepParams {
                responder_resources: 0,
                initiator_depth: 0,
                ..base.rp
            },
            ..base
        },
        Scenario {
            name: "alternate path accepted",
            cp: ConnectParams {
                alternate_path: Some(alternate),
                ..base.cp
            },
            rp: RepParams {
                failover_accepted: Failover::Accepted,
                ..base.rp
            },
            ..base
        },
        Scenario {
            name: "alternate path refused",
            cp: ConnectParams {
                alternate_path: Some(alternate),
                ..base.cp
            },
            rp: RepParams {
                failover_accepted: Failover::Rejected,
                ..base.rp
            },
            ..base
        },
        Scenario {
            name: "RoCEv2 path with GRH, MTU 1024",
            cp: ConnectParams {
                primary_path: roce,
                path_mtu: Mtu::Mtu1024,
                ..base.cp
            },
            ..base
        },
        Scenario {
            name: "retry and RNR counts",
            cp: ConnectParams {
                retry_count: 3,
                rnr_retry_count: 2,
                ..base.cp
            },
            rp: RepParams {
                rnr_retry_count: 5,
                ..base.rp
            },
            ..base
        },
        Scenario {
            name: "long packet life, small ACK delays",
            cp: ConnectParams {
                primary_path: path(Side::A, 18),
                ..base.cp
            },
            ack_delay_a: 10,
            ack_delay_b: 12,
            ..base
        },
        Scenario {
            name: "explicit PSNs",
            cp: ConnectParams {
                starting_psn: Some(0xab_cdef),
                ..base.cp
            },
            rp: RepParams {
                starting_psn: Some(0x12_3456),
                ..base.rp
            },
            ..base
        },
        Scenario {
            name: "XRC",
            cp: ConnectParams {
                transport: Transport::Xrc,
                ..base.cp
            },
            rp: RepParams {
                srq: true,
                ..base.rp
            },
            ..base
        },
        base,
    ]
}

#[test]
fn every_attribute_of_both_sides_matches_linux_or_al_as_the_table_says() {
    let mut failures = Vec::new();
    let mut compared = 0;
    for s in scenarios() {
        let r = run(&s);
        let (req, rep) = (req(&r.req), rep(&r.rep));
        // AL has no XRC: it rejects such a REQ (al_cm_cep.c:1106-1113).
        let al_models = s.cp.transport != Transport::Xrc;
        let ca_max = CmConfig::new(GUID_B, [0; 32]).max_responder_resources;
        let active = ours(&r.active);
        let linux = linux_active(&s, &req, &rep);
        let al = al_models.then(|| al_active(&s, &req, &rep));
        failures.extend(judge(s.name, "active", &active, &linux, al.as_ref()));
        let passive = ours(&r.passive);
        let linux = linux_passive(&req, Some((&rep, &s.rp)));
        let al = al_models.then(|| al_passive(&req, Some((&rep, &s.rp)), ca_max));
        failures.extend(judge(s.name, "passive", &passive, &linux, al.as_ref()));
        let before = ours(&r.passive_before_rep);
        let linux = linux_passive(&req, None);
        let al = al_models.then(|| al_passive(&req, None, ca_max));
        failures.extend(judge(
            s.name,
            "passive before the REP",
            &before,
            &linux,
            al.as_ref(),
        ));
        compared += 3;
    }
    assert_eq!(compared, 30);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Before the REP neither counterpart knows the passive side's receive PSN (Linux sets it
/// in `ib_send_cm_rep`, cm.c:2319; AL at the pre-REP, al_cm_cep.c:5057): WinVerbs
/// overrides `rq_psn` with the PSN it then puts in the REP (wv_ep.c:740, 829, 858), and
/// rdma_cm forces its own (cma.c:1261-1262). ibcm chooses the REP's PSN with the REQ, so
/// a client that does not override gets the PSN the REP will carry.
#[test]
fn the_passive_rtr_before_the_rep_names_the_reps_starting_psn() {
    for s in scenarios() {
        let r = run(&s);
        let rep = rep(&r.rep);
        let want = s.rp.starting_psn.unwrap_or(rep.starting_psn);
        assert_eq!(rep.starting_psn, want, "{}", s.name);
        if s.rp.starting_psn.is_none() {
            assert_eq!(
                r.passive_before_rep.rtr.rq_psn,
                Some(rep.starting_psn),
                "{}",
                s.name
            );
        }
        assert_eq!(r.passive.rtr.rq_psn, Some(rep.starting_psn), "{}", s.name);
    }
}

/// Both sides' QPs agree with each other: each one's send PSN is the other's receive PSN,
/// each one's dest QPN the other's QPN, and neither issues more RDMA reads than the other
/// accepts (the checks the soft-RoCE runs make on real QPs, issue 26).
#[test]
fn the_two_sides_qps_fit_together() {
    for s in scenarios() {
        let r = run(&s);
        let (a, b) = (&r.active, &r.passive);
        let ctx = s.name;
        assert_eq!(a.rts.sq_psn, b.rtr.rq_psn, "{ctx}");
        assert_eq!(b.rts.sq_psn, a.rtr.rq_psn, "{ctx}");
        assert!(a.rts.max_rd_atomic <= b.rtr.max_dest_rd_atomic, "{ctx}");
        assert!(b.rts.max_rd_atomic <= a.rtr.max_dest_rd_atomic, "{ctx}");
        assert_eq!(a.rtr.path_mtu, b.rtr.path_mtu, "{ctx}");
        let (req, rep) = (req(&r.req), rep(&r.rep));
        assert_eq!(b.rtr.dest_qpn, Some(req.local_qpn), "{ctx}");
        let rep_qpn = if s.cp.transport == Transport::Xrc {
            rep.local_eecn
        } else {
            rep.local_qpn
        };
        assert_eq!(a.rtr.dest_qpn, Some(rep_qpn), "{ctx}");
    }
}

/// ibcm's ACK timeout is the exact ceiling of 2 x 4.096 us x 2^PLT + 4.096 us x 2^delay:
/// never below Linux's `cm_ack_timeout` (which may round the sum down, cm.c:926-943) and
/// never above AL's `calc_lcl_ack_timeout` (a strict upper bound that doubles when the sum
/// is a power of two, al_cm_cep.h:476-518), over every 5-bit input.
#[test]
fn ack_timeout_lies_between_linux_and_al_over_the_whole_range() {
    for plt in 0..=30u8 {
        for delay in 1..=31u8 {
            let ours = ack_timeout(plt, delay);
            let linux = linux_ack_timeout(delay, plt);
            let al = al_ack_timeout(plt + 1, delay);
            assert!(
                linux <= ours,
                "plt {plt} delay {delay}: Linux {linux} > ours {ours}"
            );
            assert!(ours <= al, "plt {plt} delay {delay}: ours {ours} > AL {al}");
            // The exact ceiling: 2^ours >= 2^(plt+1) + 2^delay > 2^(ours-1), below 31.
            let sum = (1u64 << (plt + 1)) + (1u64 << delay);
            if ours < 31 {
                assert!(1u64 << ours >= sum && (1u64 << (ours - 1)) < sum);
            }
        }
    }
}

/// Two managers with two ports each, same CA (A: LIDs 1 and 3, B: LIDs 2 and 4, GIDs
/// after them), B listening on [`SID`].
fn two_port_pair(seed: u8) -> Pair {
    let mut p = Pair::new(seed);
    p.a.set_port(1, 1, 0, &[gid(1)]).unwrap();
    p.a.set_port(2, 3, 0, &[gid(3)]).unwrap();
    p.b.set_port(1, 2, 0, &[gid(2)]).unwrap();
    p.b.set_port(2, 4, 0, &[gid(4)]).unwrap();
    let listen = p.b.create().unwrap();
    p.b.listen(listen, Pair::listen_params(SID, 4)).unwrap();
    p
}

/// A's alternate path from LID `slid` to B's port 2.
fn alt_path(slid: u16) -> PathRecord {
    PathRecord {
        slid,
        dlid: 4,
        sgid: gid(slid),
        dgid: gid(4),
        ..Pair::path(Side::A)
    }
}

/// The REP for A's REQ in flight, failover accepted: (B's request CEP, its prepared
/// attributes); not yet sent.
fn prepare_failover_rep(p: &mut Pair) -> (ibcm_cep::CepId, ibcm_cep::PreparedRep) {
    p.drive_for(MS);
    let b = p.last_request().unwrap();
    p.b.take_request(b).unwrap();
    let mut rep = Pair::rep_params(0x22);
    rep.failover_accepted = Failover::Accepted;
    (b, p.b.prepare_rep(b, &rep).unwrap())
}

/// APM across ports: the alternate address vector names the port the alternate path
/// leaves from, on both sides and after a LAP, not the primary's. AL places each path by
/// its source GID (`__format_path_av` -> `__find_port_cep`, al_cm_cep.c:4570-4579; a
/// REQ's alternate 4815, a received REQ's 735-752, a LAP's 5766) and Linux takes
/// `alt_port_num` from the alternate AV's own port (cm.c `cm_init_qp_rtr_attr`,
/// `cm_id_priv->alt_av.port`, which `cm_init_av_by_path` finds from the path's SGID).
#[test]
fn the_alternate_av_leaves_from_the_alternate_paths_own_port() {
    let mut p = two_port_pair(41);
    let a = p.a.create().unwrap();
    let mut params = Pair::connect_params(SID, 0x11);
    params.alternate_path = Some(alt_path(3));
    let now = p.now;
    p.a.connect(now, a, &params).unwrap();
    let (b, prepared) = prepare_failover_rep(&mut p);
    let ports = |a: &QpAttributes| (a.primary.map(|av| av.port), a.alternate.map(|av| av.port));
    assert_eq!(ports(&prepared.rtr), (Some(1), Some(2)), "B's REP: RTR");
    assert_eq!(ports(&prepared.rts), (None, Some(2)), "B's REP: RTS");
    let now = p.now;
    p.b.send_rep(now, b).unwrap();
    p.drive_for(MS);
    let rtr = p.a.qp_attributes(a, QpState::Rtr).unwrap();
    assert_eq!(ports(&rtr), (Some(1), Some(2)), "A's RTR");
    p.a.rtu(a, b"").unwrap();
    p.drive();
    let rtr = p.b.qp_attributes(b, QpState::Rtr).unwrap();
    assert_eq!(ports(&rtr), (Some(1), Some(2)), "B's RTR, queried");

    // A LAP loads a new alternate from A's port 2 again; B's APR attributes place it on
    // B's port 2.
    let now = p.now;
    p.a.lap(now, a, &alt_path(3), b"").unwrap();
    p.drive_for(MS);
    let apr =
        p.b.prepare_apr(b, ibcm_mad::AprStatus::Success, b"", b"")
            .unwrap()
            .expect("a successful APR loads the alternate");
    assert_eq!(ports(&apr), (None, Some(2)), "B's APR: RTS");
}

/// An alternate path no local port has, or one on another CA's port, is refused before
/// anything is sent (CONNECT and LAP): AL's `__format_path_av` finds no port
/// (al_cm_cep.c:4815, 5766-5772: IB_INVALID_SETTING), and a QP cannot migrate to another
/// CA (4816-4821, 5779-5784). One on another port of the same CA is loaded.
#[test]
fn an_alternate_path_off_the_connections_ca_is_refused() {
    let mut p = two_port_pair(42);
    p.a.set_port(3, 5, 0, &[gid(5)]).unwrap();
    p.a.set_port_ca_guid(3, GUID_A ^ 1);
    let not_local = Err(ibcm_cep::CmError::NotLocal {
        field: "alternate path source",
    });
    let a = p.a.create().unwrap();
    let now = p.now;
    for (slid, what) in [(7, "no local port"), (5, "another CA's port")] {
        let mut params = Pair::connect_params(SID, 0x11);
        params.alternate_path = Some(alt_path(slid));
        assert_eq!(p.a.connect(now, a, &params), not_local, "CONNECT: {what}");
    }
    assert_eq!(p.a.state(a), Ok(ibcm_cep::StateName::Idle));
    let mut params = Pair::connect_params(SID, 0x11);
    params.alternate_path = Some(alt_path(3));
    p.a.connect(now, a, &params).unwrap();
    let (b, _) = prepare_failover_rep(&mut p);
    let now = p.now;
    p.b.send_rep(now, b).unwrap();
    p.drive_for(MS);
    p.a.rtu(a, b"").unwrap();
    p.drive();
    for (slid, what) in [(7, "no local port"), (5, "another CA's port")] {
        let now = p.now;
        assert_eq!(
            p.a.lap(now, a, &alt_path(slid), b""),
            not_local,
            "LAP: {what}"
        );
    }
    let now = p.now;
    p.a.lap(now, a, &alt_path(3), b"").unwrap();
}
