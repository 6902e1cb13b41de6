//! The conformance suite: what the engine does, per IBA Vol 1 ch. 12 section (or the
//! anchor function of Linux `drivers/infiniband/core/cm.c` / WinOF
//! `core/al/kernel/al_cm_cep.c`), one test per rule. Each test's name says what it checks
//! and its doc names the section, table or function it comes from; read together they are
//! a table of the engine's behaviour by state and message:
//!
//! | Rule (source) | Test |
//! |---|---|
//! | REP: RDMA read limits cross over (Linux `cm_rep_handler`, WinOF `__save_wire_rep`) | `rep_resources_cross_over_*` |
//! | REQ/REP on a live QPN: REJ(StaleConn), DREQ the old (IBA 12.9.8.3.1, Linux `cm_match_req`) | `stale_*` |
//! | LocalCAGUID is the sending port's CA: two CAs reusing a QPN (IBA Table 103, Linux `cm_insert_remote_qpn`) | `two_cas_*` |
//! | Passive DREQ/LAP wait the REQ's LocalCMResponseTimeout (Linux `cm_req_handler`) | `passive_*_waits_*` |
//! | Timewait covers the alternate path (WinOF `max_2pkt_life`, `__calc_timewait`) | `timewait_*` |
//! | REP FailoverAccepted (IBA Table 110) | `failover_*` |
//! | XRC REP (Linux `cm_format_rep`, `cm_rep_get_qpn`) | `xrc_*` |
//! | REQ transport / QPN 0 (WinOF `__req_handler`, IBA 12.6.5 Table 106) | `req_with_*` |
//! | REQ paths end at this CA's ports: REJ 12/13/18/19 (IBA Table 108, Linux `cm_req_handler`) | `req_*_port_*`, `*_told_no_port_*` |
//! | Local comm IDs: reuse distance, fixed pattern, never 0 (Linux `cm_alloc_id_priv`, issue #19) | `local_comm_ids_*`, `*_comm_id_*` |
//!
//! Timing (virtual ns): A's packet life time is 14; B recovers 15 from the REQ's
//! LocalACKTimeout (16) minus one; both CAs have an ACK delay of 15.

use ibcm_cep::pair::{GUID_A, GUID_B, Pair, Side, gid};
use ibcm_cep::{
    CepId, CmConfig, CmError, CmManager, ConnectParams, Event, PathRecord, QpAttributes, QpState,
    RepParams, StateName as S,
};
use ibcm_mad::{
    AttributeId, CmMad, CmMessage, Failover, MAD_SIZE, MessageKind, RejReason, RepPacket, Transport,
};
use proptest::prelude::*;

const SID: u64 = 0x1000;
const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x22;
const MS: u64 = 1_000_000;

/// 4.096 us * 2^t in ns.
const fn ib(t: u32) -> u64 {
    4096 << t
}

fn cp() -> ConnectParams<'static> {
    Pair::connect_params(SID, QPN_A)
}

fn rp() -> RepParams<'static> {
    Pair::rep_params(QPN_B)
}

/// An alternate path from A to B (LIDs 3 -> 4) with the given packet life time.
fn alt_path(plt: u8) -> PathRecord {
    PathRecord {
        slid: 3,
        dlid: 4,
        sgid: gid(3),
        dgid: gid(4),
        packet_life_time: plt,
        ..Pair::path(Side::A)
    }
}

/// B listens on [`SID`], A connects with `cp`, B takes the request: (pair, A's CEP, B's).
fn requested(cp: &ConnectParams<'_>) -> (Pair, CepId, CepId) {
    let mut p = Pair::new(7);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 16)).unwrap();
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a, cp).unwrap();
    p.drive_for(MS);
    let b = p.last_request().expect("REQ received");
    p.b.take_request(b).unwrap();
    (p, a, b)
}

/// The whole REQ/REP/RTU exchange with the given parameters.
fn established(cp: &ConnectParams<'_>, rp: &RepParams<'_>) -> (Pair, CepId, CepId) {
    let (mut p, a, b) = requested(cp);
    let now = p.now;
    p.b.accept(now, b, rp).unwrap();
    p.drive_for(MS);
    p.a.rtu(a, b"").unwrap();
    p.drive_for(MS);
    assert_eq!(p.a.state(a), Ok(S::Established));
    assert_eq!(p.b.state(b), Ok(S::Established));
    (p, a, b)
}

fn attrs(p: &Pair, side: Side, cep: CepId, state: QpState) -> QpAttributes {
    let m = match side {
        Side::A => &p.a,
        Side::B => &p.b,
    };
    m.qp_attributes(cep, state).unwrap()
}

fn events(p: &mut Pair, side: Side, cep: CepId) -> Vec<Event> {
    p.flush();
    p.events_of(side, cep)
}

fn rejects(p: &mut Pair, side: Side, cep: CepId) -> Vec<(RejReason, MessageKind)> {
    events(p, side, cep)
        .into_iter()
        .filter_map(|e| match e {
            Event::Rejected {
                reason, message, ..
            } => Some((reason, message)),
            _ => None,
        })
        .collect()
}

// ---- 1. RDMA read limits after the REP -------------------------------------------------

/// Linux `cm_rep_handler` (`initiator_depth = REP.ResponderResources`,
/// `responder_resources = REP.InitiatorDepth`) and WinOF `__save_wire_rep`: after the REP
/// the active side's RTS max_rd_atomic is the passive side's ResponderResources and its
/// RTR max_dest_rd_atomic the passive side's InitiatorDepth, so neither side issues more
/// RDMA reads than the other accepts. REQ offers 4 responder / 8 initiator; the REP
/// answers 1 / 2.
#[test]
fn rep_resources_cross_over_into_the_active_sides_rtr_and_rts() {
    let cp = ConnectParams {
        responder_resources: 4,
        initiator_depth: 8,
        ..cp()
    };
    let rp = RepParams {
        responder_resources: 1,
        initiator_depth: 2,
        ..rp()
    };
    let (p, a, b) = established(&cp, &rp);
    let a_rtr = attrs(&p, Side::A, a, QpState::Rtr).max_dest_rd_atomic;
    let a_rts = attrs(&p, Side::A, a, QpState::Rts).max_rd_atomic;
    let b_rtr = attrs(&p, Side::B, b, QpState::Rtr).max_dest_rd_atomic;
    let b_rts = attrs(&p, Side::B, b, QpState::Rts).max_rd_atomic;
    assert_eq!(
        (a_rtr, a_rts, b_rtr, b_rts),
        (Some(2), Some(1), Some(1), Some(2)),
        "(A RTR max_dest_rd_atomic, A RTS max_rd_atomic, B RTR, B RTS)"
    );
    // What each side issues fits what the other accepts.
    assert!(a_rts <= b_rtr && b_rts <= a_rtr);
}

// ---- 3. the passive side's DREQ and LAP wait the REQ's LocalCMResponseTimeout ----------

/// REQ with RemoteCMResponseTimeout 16 (B's time to answer) and LocalCMResponseTimeout 20
/// (A's): when B, the passive side, sends a DREQ it waits for A, so 2 x PLT(15) + 2^20
/// units (Linux `cm_req_handler` sets the id's `timeout_ms` from the REQ's
/// LocalCMResponseTimeout, which `cm_send_dreq_locked` uses; WinOF `__save_wire_req`).
#[test]
fn passive_dreq_waits_the_reqs_local_cm_response_timeout() {
    let cp = ConnectParams {
        remote_cm_response_timeout: 16,
        local_cm_response_timeout: 20,
        ..cp()
    };
    let (mut p, _a, b) = established(&cp, &rp());
    p.fault(Side::B, AttributeId::Dreq, 1, ibcm_cep::pair::Fate::Drop);
    let t0 = p.now;
    p.b.disconnect(t0, b, b"").unwrap();
    let wait = p.b.poll_timeout().unwrap().nanos_since(t0);
    assert_eq!(wait, 2 * ib(15) + ib(20), "B's DREQ retry wait");
}

/// As [`passive_dreq_waits_the_reqs_local_cm_response_timeout`], for a LAP the passive
/// side sends (IBA 12.8.1; the same response time of the peer).
#[test]
fn passive_lap_waits_the_reqs_local_cm_response_timeout() {
    let cp = ConnectParams {
        remote_cm_response_timeout: 16,
        local_cm_response_timeout: 20,
        ..cp()
    };
    let (mut p, _a, b) = established(&cp, &rp());
    let t0 = p.now;
    p.b.lap(t0, b, &Pair::path(Side::B), b"").unwrap();
    let wait = p.b.poll_timeout().unwrap().nanos_since(t0);
    assert_eq!(wait, 2 * ib(15) + ib(20), "B's LAP retry wait");
}

/// The active side's DREQ still waits its REQ's RemoteCMResponseTimeout (IBA 12.7.36).
#[test]
fn active_dreq_waits_the_reqs_remote_cm_response_timeout() {
    let cp = ConnectParams {
        remote_cm_response_timeout: 16,
        local_cm_response_timeout: 20,
        ..cp()
    };
    let (mut p, a, _b) = established(&cp, &rp());
    let t0 = p.now;
    p.a.disconnect(t0, a, b"").unwrap();
    let wait = p.a.poll_timeout().unwrap().nanos_since(t0);
    assert_eq!(wait, 2 * ib(14) + ib(16), "A's DREQ retry wait");
}

// ---- 4. timewait covers the alternate path --------------------------------------------

/// IBA 12.9.8.7 with WinOF's `max_2pkt_life` ("maximum packet lifetime * 2 of any path
/// used on a connection", set by `__save_user_req` / `__save_wire_req`, used by
/// `__calc_timewait`): with an accepted alternate path of PLT 20 and a primary of 14,
/// timewait is 2 x PLT(20) + ACK delay on A. B recovers the alternate's PLT from its
/// LocalACKTimeout (ack_timeout(20, 15) = 22) minus one: 21.
#[test]
fn timewait_uses_the_larger_packet_life_time_of_primary_and_alternate() {
    let cp = ConnectParams {
        alternate_path: Some(alt_path(20)),
        ..cp()
    };
    let rp = RepParams {
        failover_accepted: Failover::Accepted,
        ..rp()
    };
    let (mut p, a, b) = established(&cp, &rp);
    assert_eq!(p.a.query(a).unwrap().timewait_ns, 2 * ib(20) + ib(15));
    assert_eq!(p.b.query(b).unwrap().timewait_ns, 2 * ib(21) + ib(15));
    // And the timer armed on entry to timewait is that long.
    let now = p.now;
    p.a.disconnect(now, a, b"").unwrap();
    p.drive_for(MS);
    let now = p.now;
    p.b.drep(now, b, b"").unwrap();
    let tw_b = p.b.poll_timeout().unwrap().nanos_since(now);
    assert_eq!(tw_b, 2 * ib(21) + ib(15), "B's timewait");
}

// ---- 5. FailoverAccepted ---------------------------------------------------------------

/// IBA Table 110 FailoverAccepted (0 accepted, 1 not supported, 2 rejected) and 12.7.x:
/// an alternate path the passive side did not accept is loaded into neither side's RTR or
/// RTS, and neither side may migrate to it.
#[test]
fn failover_not_accepted_loads_no_alternate_path_on_either_side() {
    for failover in [Failover::Rejected, Failover::NotSupported] {
        let cp = ConnectParams {
            alternate_path: Some(alt_path(14)),
            ..cp()
        };
        let rp = RepParams {
            failover_accepted: failover,
            ..rp()
        };
        let (mut p, a, b) = requested(&cp);
        let now = p.now;
        let prepared = p.b.accept(now, b, &rp).unwrap();
        assert_eq!(prepared.rtr.alternate, None, "{failover:?}: B RTR");
        assert_eq!(prepared.rts.alternate, None, "{failover:?}: B RTS");
        assert_eq!(prepared.rts.path_mig_state, None, "{failover:?}: B RTS");
        p.drive_for(MS);
        assert_eq!(attrs(&p, Side::A, a, QpState::Rtr).alternate, None);
        assert_eq!(attrs(&p, Side::A, a, QpState::Rts).alternate, None);
        assert_eq!(attrs(&p, Side::A, a, QpState::Rts).path_mig_state, None);
        p.a.rtu(a, b"").unwrap();
        p.drive_for(MS);
        assert!(matches!(p.a.migrate(a), Err(CmError::InvalidState { .. })));
        assert!(matches!(p.b.migrate(b), Err(CmError::InvalidState { .. })));
    }
}

/// The other row of IBA Table 110: FailoverAccepted = 0 loads the alternate path on both
/// sides (RTS with migration state REARM), and both may migrate.
#[test]
fn failover_accepted_loads_the_alternate_path_on_both_sides() {
    let cp = ConnectParams {
        alternate_path: Some(alt_path(14)),
        ..cp()
    };
    let rp = RepParams {
        failover_accepted: Failover::Accepted,
        ..rp()
    };
    let (mut p, a, b) = established(&cp, &rp);
    assert!(attrs(&p, Side::A, a, QpState::Rts).alternate.is_some());
    assert!(attrs(&p, Side::B, b, QpState::Rts).alternate.is_some());
    p.a.migrate(a).unwrap();
    p.b.migrate(b).unwrap();
}

// ---- 6. XRC ------------------------------------------------------------------------------

/// Linux `cm_format_rep`: an XRC target's REP carries its QPN in LocalEEContext (LocalQPN
/// 0) with SRQ set; the XRC initiator reads the peer's QPN from there
/// (`cm_rep_get_qpn`), so its RTR dest_qpn is the target's QPN.
#[test]
fn xrc_rep_carries_the_target_qpn_in_local_ee_context_with_srq_set() {
    let cp = ConnectParams {
        transport: Transport::Xrc,
        ..cp()
    };
    let (mut p, a, b) = requested(&cp);
    p.flush();
    let now = p.now;
    p.b.accept(now, b, &rp()).unwrap();
    let rep = p.b.poll_transmit().expect("the REP");
    let view = RepPacket::new_checked(&rep.mad[..]).unwrap();
    assert_eq!(
        (view.local_qpn(), view.local_eecn(), view.srq()),
        (0, QPN_B, 1),
        "(LocalQPN, LocalEEContext, SRQ) of an XRC target's REP"
    );
    p.a.handle_mad(now, &Pair::address_of(Side::B), &rep.mad);
    assert_eq!(attrs(&p, Side::A, a, QpState::Rtr).dest_qpn, Some(QPN_B));
    assert_eq!(p.a.query(a).unwrap().remote_qpn, QPN_B);
}

// ---- 7. REQ transport and QPN -----------------------------------------------------------

/// A's REQ for [`SID`], as bytes, after `edit`.
fn req_mad(edit: impl Fn(&mut [u8; MAD_SIZE])) -> (Pair, [u8; MAD_SIZE]) {
    let mut p = Pair::new(7);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 16)).unwrap();
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a, &cp()).unwrap();
    let mut mad = p.a.poll_transmit().expect("the REQ").mad;
    edit(&mut mad);
    (p, mad)
}

/// WinOF `__req_handler` ("Reserved value. Reject.", before any lookup) and IBA Table 106:
/// a REQ whose TransportServiceType is RD (2, which neither anchor supports) or 3 with a
/// reserved ExtendedTransportType, or whose LocalQPN is 0, gets REJ(InvalidTransportType,
/// 9) for MessageRejected REQ, and reaches no listen.
#[test]
fn req_with_reserved_transport_or_qpn_0_gets_rej_invalid_transport_type() {
    type Edit = fn(&mut [u8; MAD_SIZE]);
    let cases: [(&str, Edit); 3] = [
        // Byte 43 bits [2:1] TransportServiceType = 3, byte 51 bits [2:0] Extended = 2.
        ("extended 2", |m| {
            m[24 + 43] = (m[24 + 43] & !0x06) | (3 << 1);
            m[24 + 51] = (m[24 + 51] & !0x07) | 2;
        }),
        ("RD", |m| m[24 + 43] = (m[24 + 43] & !0x06) | (2 << 1)),
        ("LocalQPN 0", |m| m[24 + 32..24 + 35].fill(0)),
    ];
    for (what, edit) in cases {
        let (mut p, mad) = req_mad(edit);
        let now = p.now;
        p.b.handle_mad(now, &Pair::address_of(Side::A), &mad);
        let rej =
            p.b.poll_transmit()
                .unwrap_or_else(|| panic!("{what}: no answer"));
        let parsed = CmMad::parse(&rej.mad).unwrap();
        let CmMessage::Rej(rej) = parsed.message else {
            panic!("{what}: answered {:?}", parsed.message.attribute_id());
        };
        let req_comm_id = u32::from_be_bytes(mad[24..28].try_into().unwrap());
        assert_eq!(
            (rej.reason, rej.message_rejected, rej.remote_comm_id),
            (
                RejReason::InvalidTransportType,
                MessageKind::Req,
                req_comm_id
            ),
            "{what}"
        );
        assert!(p.b.poll_event().is_none(), "{what}: B reported the REQ");
    }
}

/// The other half of WinOF `__req_handler`'s rule: `connect` refuses to send such a REQ.
#[test]
fn connect_with_reserved_transport_or_qpn_0_is_refused() {
    let mut p = Pair::new(7);
    let a = p.a.create().unwrap();
    let now = p.now;
    for bad in [
        ConnectParams { qpn: 0, ..cp() },
        ConnectParams {
            transport: Transport::Extended(2),
            ..cp()
        },
        ConnectParams {
            transport: Transport::Rd,
            ..cp()
        },
    ] {
        assert!(
            matches!(p.a.connect(now, a, &bad), Err(CmError::Reserved { .. })),
            "{bad:?}"
        );
        assert_eq!(p.a.state(a), Ok(S::Idle));
        assert!(p.a.poll_transmit().is_none());
    }
}

// ---- 2. stale connections -----------------------------------------------------------------

/// IBA 12.9.8.3.1 and Linux `cm_match_req`: a REQ naming a QPN (and CA GUID) of a live
/// connection is refused with REJ(StaleConn), and the old connection is ended by a DREQ
/// (RemoteQPN = the QPN of the REQ), retried until the DREP, then timewait; not by a
/// one-shot REJ.
#[test]
fn stale_req_qpn_disconnects_the_old_connection_with_a_dreq() {
    let (mut p, a, b) = established(&cp(), &rp());
    let dreqs = p.sent_count(Side::B, AttributeId::Dreq);
    // A, restarted, connects again from the same QPN.
    let a2 = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a2, &cp()).unwrap();
    p.drive_for(MS);
    assert_eq!(
        rejects(&mut p, Side::A, a2),
        [(RejReason::StaleConn, MessageKind::Req)]
    );
    assert_eq!(p.sent_count(Side::B, AttributeId::Dreq), dreqs + 1);
    assert_eq!(p.b.state(b), Ok(S::DreqSent));
    // The old connection's owner on A is asked to disconnect, and answers.
    assert!(
        events(&mut p, Side::A, a)
            .iter()
            .any(|e| matches!(e, Event::DreqReceived(_)))
    );
    let now = p.now;
    p.a.drep(now, a, b"").unwrap();
    p.drive_for(MS);
    assert_eq!(p.b.state(b), Ok(S::Timewait));
    assert!(
        events(&mut p, Side::B, b)
            .iter()
            .any(|e| matches!(e, Event::DrepReceived(_)))
    );
    assert_eq!(rejects(&mut p, Side::B, b), []);
}

/// One CM serves the ports of several CAs, and each CA numbers its QPs on its own: a REQ
/// names the CA of the port it leaves by (IBA Table 103 LocalCAGUID). The peer keys its
/// stale-connection check by (CA GUID, QPN) (Linux `cm_match_req` ->
/// `cm_insert_remote_qpn`; ours, establish.rs): had both REQs carried the first CA's GUID,
/// the second would be rejected as stale and the first, healthy connection disconnected
/// with a DREQ (issue 25 #6).
#[test]
fn two_cas_reusing_a_qpn_towards_one_peer_both_connect() {
    const GUID_A2: u64 = 0x0002_c903_0000_00a2;
    let mut p = Pair::new(7);
    p.a.set_port_ca_guid(1, GUID_A);
    p.a.set_port_ca_guid(2, GUID_A2);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 16)).unwrap();
    let connect = |p: &mut Pair, port: u8| {
        let a = p.a.create().unwrap();
        let now = p.now;
        p.a.connect(now, a, &ConnectParams { port, ..cp() })
            .unwrap();
        p.drive_for(MS);
        let b = p.last_request().expect("REQ received");
        p.b.take_request(b).unwrap();
        let now = p.now;
        // B's one CA answers each with a QP of its own.
        p.b.accept(now, b, &Pair::rep_params(QPN_B + u32::from(port)))
            .unwrap();
        p.drive_for(MS);
        p.a.rtu(a, b"").unwrap();
        p.drive_for(MS);
        (a, b)
    };
    let (a1, b1) = connect(&mut p, 1);
    let (a2, b2) = connect(&mut p, 2);
    for (a, b) in [(a1, b1), (a2, b2)] {
        assert_eq!(p.a.state(a), Ok(S::Established));
        assert_eq!(p.b.state(b), Ok(S::Established));
    }
    assert_eq!(p.sent_count(Side::B, AttributeId::Rej), 0);
    assert_eq!(p.sent_count(Side::B, AttributeId::Dreq), 0);
    assert_eq!(p.b.query(b1).unwrap().remote_ca_guid, GUID_A);
    assert_eq!(p.b.query(b2).unwrap().remote_ca_guid, GUID_A2);
    // The REP names B's one CA back; an untold port stays the configured GUID.
    assert_eq!(p.a.query(a2).unwrap().remote_ca_guid, GUID_B);
}

/// As [`stale_req_qpn_disconnects_the_old_connection_with_a_dreq`], when no DREP comes:
/// the DREQ is retried MaxCMRetries times (IBA 12.7.36), then the old connection enters
/// timewait (Linux `cm_process_send_error` in DREQ_SENT).
#[test]
fn stale_req_dreq_is_retried_until_max_retries_then_timewait() {
    let (mut p, _a, b) = established(&cp(), &rp());
    p.fault(Side::B, AttributeId::Dreq, 100, ibcm_cep::pair::Fate::Drop);
    let dreqs = p.sent_count(Side::B, AttributeId::Dreq);
    let a2 = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a2, &cp()).unwrap();
    p.drive_for(10_000 * MS);
    // max_cm_retries 3: the first DREQ and three retries.
    assert_eq!(p.sent_count(Side::B, AttributeId::Dreq), dreqs + 4);
    assert!(events(&mut p, Side::B, b).iter().any(|e| matches!(
        e,
        Event::Timeout {
            message: AttributeId::Dreq
        }
    )));
}

/// Linux `cm_rep_handler` ("Check for a stale connection"): a REP naming a QPN of a live
/// connection is refused with REJ(StaleConn, MessageRejected REP), and the old connection
/// is ended by a DREQ.
#[test]
fn stale_rep_qpn_disconnects_the_old_connection_with_a_dreq() {
    let (mut p, a, _b) = established(&cp(), &rp());
    let dreqs = p.sent_count(Side::A, AttributeId::Dreq);
    // A second connection, to which B answers from the QPN of the first.
    let a2 = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a2, &Pair::connect_params(SID, QPN_A + 1))
        .unwrap();
    p.drive_for(MS);
    let b2 = p.last_request().unwrap();
    let now = p.now;
    p.b.accept(now, b2, &rp()).unwrap();
    p.drive_for(MS);
    assert_eq!(
        rejects(&mut p, Side::B, b2),
        [(RejReason::StaleConn, MessageKind::Rep)]
    );
    assert_eq!(p.sent_count(Side::A, AttributeId::Dreq), dreqs + 1);
    assert_eq!(p.a.state(a), Ok(S::DreqSent));
}

// ---- 9. the codec never drops a peer's REJ -------------------------------------------------

/// IBA Table 108 gives RejectedInfoLength at most 72; a peer's REJ with 127 (all seven
/// bits) is still a REJ: handled with the ARI clamped to 72 and counted, never dropped as
/// malformed (dropping it would leave A waiting out its whole REQ timeout; Linux
/// `cm_format_rej_event` passes the length through unchecked).
#[test]
fn rej_with_rejected_info_length_over_72_still_rejects_the_connection() {
    let (mut p, a, b) = requested(&cp());
    p.flush();
    let now = p.now;
    let reject = ibcm_cep::RejectParams {
        reason: RejReason::ConsumerDefined,
        ari: &[0xA5; 8],
        private_data: b"",
    };
    p.b.reject(now, b, &reject).unwrap();
    let mut rej = p.b.poll_transmit().expect("the REJ").mad;
    rej[24 + 9] = 127 << 1;
    p.a.handle_mad(now, &Pair::address_of(Side::B), &rej);
    assert_eq!(p.a.state(a), Ok(S::Idle));
    let got = rejects(&mut p, Side::A, a);
    assert_eq!(got, [(RejReason::ConsumerDefined, MessageKind::Req)]);
    let ari_len = events(&mut p, Side::A, a).iter().find_map(|e| match e {
        Event::Rejected { ari_len, .. } => Some(*ari_len),
        _ => None,
    });
    assert_eq!(ari_len, Some(72));
    assert_eq!(p.a.counters().clamped_lengths, 1);
    assert_eq!(p.a.counters().malformed, 0);
}

// ---- 8. decided divergences -----------------------------------------------------------------

/// Linux `cm_rep_handler` ("Check for duplicate REP": `cm_insert_remote_id` fails): a REP
/// whose (LocalCommID, LocalCAGUID) already names another connection is dropped and
/// counted as a duplicate; the REQ it claims to answer stays in REQ_SENT (and retries),
/// and the existing connection's lookup is not re-pointed.
#[test]
fn rep_with_a_known_comm_id_and_ca_guid_is_dropped_as_a_duplicate() {
    let (mut p, a1, b1) = established(&cp(), &rp());
    let a2 = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a2, &Pair::connect_params(SID, QPN_A + 1))
        .unwrap();
    p.drive_for(MS);
    let b2 = p.last_request().unwrap();
    p.flush();
    let now = p.now;
    p.b.accept(now, b2, &Pair::rep_params(QPN_B + 1)).unwrap();
    let mut rep = p.b.poll_transmit().expect("the REP").mad;
    // The REP claims to come from B's first connection.
    rep[24..28].copy_from_slice(&p.b.local_comm_id(b1).to_be_bytes());
    let dups = p.a.counters().duplicates[ibcm_cep::counter_slot(AttributeId::Rep).unwrap()];
    p.a.handle_mad(now, &Pair::address_of(Side::B), &rep);
    assert_eq!(p.a.state(a2), Ok(S::ReqSent));
    assert_eq!(
        p.a.counters().duplicates[ibcm_cep::counter_slot(AttributeId::Rep).unwrap()],
        dups + 1
    );
    // The first connection is still reached by its peer's messages.
    let now = p.now;
    p.b.disconnect(now, b1, b"").unwrap();
    p.drive_for(MS);
    assert_eq!(p.a.state(a1), Ok(S::DreqRcvd));
}

/// WinOF `__process_stale` (MessageRejected 0 in REQ_RCVD/PRE_REP, 1 in REP_RCVD, 2
/// otherwise) and IBA Table 108: the REJ(StaleConn) that ends a not-yet-established old
/// connection names the message that CEP holds unanswered. Here B's old CEP is in
/// REQ_RCVD when a REQ from the same QPN arrives: its REJ says REQ.
#[test]
fn stale_rej_names_the_message_the_old_cep_holds() {
    let (mut p, a1, b1) = requested(&cp());
    let a2 = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a2, &cp()).unwrap();
    p.drive_for(MS);
    assert_eq!(p.b.state(b1), Ok(S::Timewait));
    assert_eq!(
        rejects(&mut p, Side::A, a1),
        [(RejReason::StaleConn, MessageKind::Req)]
    );
    assert_eq!(
        rejects(&mut p, Side::A, a2),
        [(RejReason::StaleConn, MessageKind::Req)]
    );
}

/// IBA 12.9.6 (Figure 154: DREQ_SENT + DREQ received -> DREQ_RCVD) and Linux
/// `cm_dreq_handler` (DREQ_SENT: cancel the DREQ, DREQ_RECEIVED): DREQs that cross are
/// each reported; each side answers with a DREP and both end in timewait, then exit.
#[test]
fn crossing_dreqs_each_get_a_drep_and_both_sides_reach_timewait() {
    let (mut p, a, b) = established(&cp(), &rp());
    let now = p.now;
    p.a.disconnect(now, a, b"").unwrap();
    p.b.disconnect(now, b, b"").unwrap();
    p.drive_for(MS);
    assert_eq!(p.a.state(a), Ok(S::DreqRcvd));
    assert_eq!(p.b.state(b), Ok(S::DreqRcvd));
    let now = p.now;
    p.a.drep(now, a, b"").unwrap();
    p.b.drep(now, b, b"").unwrap();
    p.drive_for(MS);
    assert_eq!(p.a.state(a), Ok(S::Timewait));
    assert_eq!(p.b.state(b), Ok(S::Timewait));
    p.drive();
    for (side, cep) in [(Side::A, a), (Side::B, b)] {
        let evs = events(&mut p, side, cep);
        assert!(
            matches!(evs.last(), Some(Event::TimewaitExit)),
            "{side:?}: {evs:?}"
        );
        assert_eq!(
            evs.iter()
                .filter(|e| matches!(e, Event::DreqReceived(_)))
                .count(),
            1,
            "{side:?}"
        );
    }
}

// ---- 10. local comm IDs ------------------------------------------------------------------

/// Issue #16 item 8a: Linux allocates local comm IDs cyclically over 32 bits
/// (`xa_alloc_cyclic` in `cm_alloc_id_priv`, then XORed with `random_id_operand`), so an
/// ID comes back only after ~2^32 allocations. Ours were slot index + an 8-bit generation
/// from a LIFO free list (as WinOF `__get_lcid`): one CEP created and destroyed in a loop
/// got its first wire comm ID back after 256 rounds, which a peer still holding the old ID
/// (its own long timewait, IBA 12.9.8.3) would take for the old connection. Now slots are
/// used cyclically within the slab and reused FIFO, with 12 generation bits by default.
#[test]
fn local_comm_ids_do_not_repeat_within_65536_allocations() {
    let mut p = Pair::new(7);
    let now = p.now;
    let first = p.a.create().unwrap();
    let wire = p.a.local_comm_id(first);
    p.a.destroy(now, first).unwrap();
    for round in 1..=65_536u32 {
        let id = p.a.create().unwrap();
        assert_ne!(p.a.local_comm_id(id), wire, "repeated after {round} rounds");
        p.a.destroy(now, id).unwrap();
    }
}

/// The same under churn beside long-lived connections: 128 CEPs live (one full chunk of
/// the slab), the newest destroyed and a new one created 2^16 times. Reusing whatever slot
/// is free would hand the one just released straight back (a repeat after
/// 2^generation_bits rounds); `alloc` keeps a pool of free slots instead (issue #16 item
/// 8a).
#[test]
fn local_comm_ids_do_not_repeat_within_65536_allocations_at_a_steady_population() {
    let mut m = CmManager::new(CmConfig::new(GUID_A, [10; 32]));
    let now = ibcm_cep::Instant::from_nanos(0);
    let mut live: std::collections::VecDeque<CepId> =
        (0..128).map(|_| m.create().unwrap()).collect();
    let mut last = std::collections::HashMap::new();
    for round in 0..65_536u32 {
        m.destroy(now, live.pop_back().unwrap()).unwrap();
        let id = m.create().unwrap();
        if let Some(before) = last.insert(m.local_comm_id(id), round) {
            panic!("repeated after {} rounds", round - before);
        }
        live.push_back(id);
    }
    assert_eq!(m.live_ceps(), 128);
}

/// The device's owner table (driver/endpoint `Device::set_owner`) indexes by a handle's
/// low 24 bits: they stay the dense slab index whatever the comm ID layout (20 index bits
/// by default, the generation above them on the wire only), so 300 CEPs created, destroyed
/// and created again all index below 512.
#[test]
fn cep_handles_keep_the_slab_index_in_their_low_24_bits() {
    let mut m = CmManager::new(CmConfig::new(GUID_A, [11; 32]));
    let now = ibcm_cep::Instant::from_nanos(0);
    for _ in 0..2 {
        let ids: Vec<CepId> = (0..300).map(|_| m.create().unwrap()).collect();
        for id in ids {
            assert!(id.to_raw() & 0x00ff_ffff < 512, "{:#x}", id.to_raw());
            m.destroy(now, id).unwrap();
        }
    }
}

/// The A-side DREQ of an established pair (B disconnects), taken before delivery: the
/// MAD, and the RemoteCommID (A's local comm ID) it carries at MAD offset 24 + 4.
fn dreq_to_a(p: &mut Pair, b: CepId) -> [u8; MAD_SIZE] {
    p.flush();
    let now = p.now;
    p.b.disconnect(now, b, b"").unwrap();
    p.b.poll_transmit().expect("the DREQ").mad
}

fn with_remote_comm_id(mut mad: [u8; MAD_SIZE], id: u32) -> [u8; MAD_SIZE] {
    mad[28..32].copy_from_slice(&id.to_be_bytes());
    mad
}

/// Issue #19: with `CmConfig::BESIDE_WINOF_AL`, every local comm ID has wire byte 2 >=
/// 0xF0 (AL's IDs carry their small vector index there, winof-deployment.md §2), and a
/// DREQ whose RemoteCommID lacks the pattern (the bit flipped), is 0 (IBA Table 108:
/// "none"), or names the live slot with another generation reaches no CEP: the connection
/// stays up and the DREQ gets the unaffiliated DREP of IBA 12.9.8.5 (LocalCommID the
/// DREQ's RemoteCommID); the real one is taken.
#[test]
fn a_remote_comm_id_outside_the_space_or_of_another_generation_reaches_no_cep() {
    let config = |guid, seed| {
        CmConfig::new(guid, [seed; 32]).with_comm_id_pattern(CmConfig::BESIDE_WINOF_AL)
    };
    let mut p = Pair::with_config(config(GUID_A, 3), config(GUID_B, 4));
    let (a, b) = p.establish(SID);
    let wire = p.a.local_comm_id(a);
    assert!(wire.to_be_bytes()[2] >= 0xF0, "{wire:#010x}");
    assert!(p.a.is_local_comm_id(wire) && p.a.config().is_local_comm_id(wire));
    let dreq = dreq_to_a(&mut p, b);
    let now = p.now;
    // Bit 31 is the top generation bit (the top free bit); bit 12 a fixed one.
    for bad in [wire ^ 0x0000_1000, 0, wire ^ 0x8000_0000] {
        assert_eq!(
            p.a.is_local_comm_id(bad),
            bad == wire ^ 0x8000_0000,
            "{bad:#x}"
        );
        p.a.handle_mad(
            now,
            &Pair::address_of(Side::B),
            &with_remote_comm_id(dreq, bad),
        );
        assert_eq!(p.a.state(a), Ok(S::Established), "{bad:#x}");
        let drep = p.a.poll_transmit().expect("an unaffiliated DREP").mad;
        assert_eq!(drep[16..18], 0x0016u16.to_be_bytes(), "{bad:#x}");
        assert_eq!(drep[24..28], bad.to_be_bytes());
    }
    assert!(
        !events(&mut p, Side::A, a)
            .iter()
            .any(|e| matches!(e, Event::DreqReceived(_)))
    );
    p.a.handle_mad(now, &Pair::address_of(Side::B), &dreq);
    assert_eq!(p.a.state(a), Ok(S::DreqRcvd));
}

/// IBA 12.9.8.3 (stale connections): a comm ID released with its CEP does not reach the
/// next CEP of the same slot. With `max_ceps` 1 the one slot is reused at once; the old
/// connection's DREQ (its RemoteCommID the released ID) is unmatched.
#[test]
fn a_released_comm_id_does_not_reach_the_next_cep_of_its_slot() {
    let mut config = CmConfig::new(GUID_A, [5; 32]);
    config.max_ceps = 1;
    let mut p = Pair::with_config(config, CmConfig::new(GUID_B, [6; 32]));
    let (a1, b1) = p.establish(SID);
    let old = p.a.local_comm_id(a1);
    let stale = dreq_to_a(&mut p, b1);
    let now = p.now;
    p.a.destroy(now, a1).unwrap();
    p.drive();
    assert_eq!(p.a.live_ceps(), 0);
    let a2 = p.a.create().unwrap();
    assert_ne!(p.a.local_comm_id(a2), old);
    let now = p.now;
    p.a.connect(now, a2, &Pair::connect_params(SID, QPN_A + 1))
        .unwrap();
    p.drive_for(MS);
    let b2 = p.last_request().unwrap();
    let now = p.now;
    p.b.take_request(b2).unwrap();
    p.b.accept(now, b2, &Pair::rep_params(QPN_B + 1)).unwrap();
    p.drive_for(MS);
    p.a.rtu(a2, b"").unwrap();
    p.drive_for(MS);
    assert_eq!(p.a.state(a2), Ok(S::Established));
    p.flush();
    let now = p.now;
    p.a.handle_mad(now, &Pair::address_of(Side::B), &stale);
    assert_eq!(p.a.state(a2), Ok(S::Established));
    // IBA 12.9.8.5: the unaffiliated DREP, from the released ID.
    let drep = p.a.poll_transmit().expect("an unaffiliated DREP").mad;
    assert_eq!(drep[24..28], old.to_be_bytes());
}

/// Linux XORs a random operand onto a cyclic counter (`cm_alloc_id_priv`); each of our
/// fresh slots also starts at a random generation: 64 CEPs created in a row do not get
/// IDs in arithmetic progression, and their generation bits (the top 12 by default)
/// differ, so one ID does not give away its neighbours'.
#[test]
fn local_comm_ids_are_not_sequential() {
    let mut m = CmManager::new(CmConfig::new(GUID_A, [8; 32]));
    assert_eq!(m.comm_id_layout(), (20, 12));
    let ids: Vec<u32> = (0..64)
        .map(|_| {
            let id = m.create().unwrap();
            m.local_comm_id(id)
        })
        .collect();
    let steps: std::collections::HashSet<u32> =
        ids.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    assert!(steps.len() > 8, "{ids:x?}");
    let tops: std::collections::HashSet<u32> = ids.iter().map(|w| w >> 20).collect();
    assert!(tops.len() > 32, "{ids:x?}");
}

/// The default configuration fixes no bit: every comm ID but 0 (IBA Table 108: "none")
/// may be local, and the layout is 20 index bits (max_ceps 2^20) + 12 generation bits.
#[test]
fn default_config_fixes_no_comm_id_bit() {
    let config = CmConfig::new(GUID_A, [9; 32]);
    assert_eq!((config.comm_id_mask, config.comm_id_value), (0, 0));
    for wire in [1, 0xF000, 0x0000_0FFF, u32::MAX, 0x8000_0000] {
        assert!(config.is_local_comm_id(wire), "{wire:#x}");
    }
    assert!(!config.is_local_comm_id(0));
    assert_eq!(CmManager::new(config).comm_id_layout(), (20, 12));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Issue #19: whatever the pattern (here up to 12 fixed bits anywhere), every local
    /// comm ID of 2000 allocations (creates and destroys interleaved, so slots are
    /// reused) carries it, is never 0, and no two live CEPs share one.
    #[test]
    fn local_comm_ids_carry_the_fixed_pattern(
        mask in any::<u32>().prop_filter("<= 12 fixed bits", |m| m.count_ones() <= 12),
        value in any::<u32>(),
        seed in any::<u8>(),
        max_ceps in 1u32..5000,
    ) {
        let mut config = CmConfig::new(GUID_A, [seed; 32]).with_comm_id_pattern((mask, value));
        config.max_ceps = max_ceps;
        let mut m = CmManager::new(config);
        let mut live: std::collections::VecDeque<CepId> = Default::default();
        let mut seen = std::collections::HashSet::new();
        let now = ibcm_cep::Instant::from_nanos(0);
        for round in 0..2000u32 {
            if live.len() > 40 || (round % 3 == 2 && !live.is_empty()) {
                let id = live.pop_front().unwrap();
                seen.remove(&m.local_comm_id(id));
                m.destroy(now, id).unwrap();
            }
            let Ok(id) = m.create() else {
                prop_assert!(live.len() >= max_ceps.min(1 << m.comm_id_layout().0) as usize);
                continue;
            };
            let wire = m.local_comm_id(id);
            prop_assert_ne!(wire, 0);
            prop_assert_eq!(wire & mask, value & mask, "{:#x}", wire);
            prop_assert!(m.is_local_comm_id(wire) && m.config().is_local_comm_id(wire));
            prop_assert!(seen.insert(wire), "two live CEPs share {:#x}", wire);
            live.push_back(id);
        }
    }
}

// ---- 11. the REQ's paths must end at this CA's ports ------------------------------------------

/// B's port 1 as `set_port` is told it: base LID 4 with LMC 2 (LIDs 4..=7), GID gid(2).
fn pair_with_b_port() -> Pair {
    let mut p = Pair::new(7);
    p.b.set_port(1, 4, 2, &[gid(9), gid(2)]).unwrap();
    p
}

/// A connects to B with `cp` (B listens); returns the REJ B sent, if any, with its ARI,
/// and whether B reported the REQ. Read off the wire: a REQ to a LID or GID that is not
/// B's would, on a fabric, reach another node or none, and A takes a REJ only from the
/// address its REQ went to (src/manager/source.rs); the pair's link delivers it to B
/// anyway, which is what these checks of B's are about.
fn connect_to_b(mut p: Pair, cp: &ConnectParams<'_>) -> (Option<(RejReason, Vec<u8>)>, bool) {
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 16)).unwrap();
    let a = p.a.create().unwrap();
    let now = p.now;
    p.wire = Some(Vec::new());
    p.a.connect(now, a, cp).unwrap();
    p.drive_for(MS);
    let reported = p.last_request().is_some();
    let rej = p
        .wire
        .take()
        .unwrap()
        .iter()
        .filter(|(from, _)| *from == Side::B)
        .find_map(|(_, mad)| match CmMad::parse(mad).ok()?.message {
            CmMessage::Rej(r) if r.message_rejected == MessageKind::Req => {
                Some((r.reason, r.ari.to_vec()))
            }
            _ => None,
        });
    (rej, reported)
}

fn to_b(dlid: u16, dgid: [u8; 16], subnet_local: bool) -> PathRecord {
    PathRecord {
        dlid,
        dgid,
        subnet_local,
        ..Pair::path(Side::A)
    }
}

/// IBA 12.6.7 Table 108 reason 12 (InvalidGID): the REQ's Primary Remote Port GID (the
/// passive side's, IBA Table 106) is on none of B's ports: REJ with, as ARI, the GID of
/// the port the REQ came in on (Linux `cm_req_handler`: GID index 0 of `work->port`).
#[test]
fn req_to_a_gid_on_no_port_gets_rej_invalid_gid_with_the_ports_gid() {
    let cp = ConnectParams {
        primary_path: to_b(5, gid(3), true),
        ..cp()
    };
    let (rej, reported) = connect_to_b(pair_with_b_port(), &cp);
    assert_eq!(rej, Some((RejReason::InvalidGid, gid(9).to_vec())));
    assert!(!reported);
}

/// IBA Table 108 reason 13 (InvalidLID): the GID is B's but the subnet-local path's
/// Remote Port LID is outside the port's range (base 4, LMC 2: 4..=7, as WinOF
/// `__is_lid_valid`): REJ with the port's base LID (2 bytes) as ARI. A LID within the
/// range is taken.
#[test]
fn req_to_a_lid_off_the_port_gets_rej_invalid_lid_and_one_in_its_lmc_range_is_taken() {
    let off = ConnectParams {
        primary_path: to_b(8, gid(2), true),
        ..cp()
    };
    let (rej, reported) = connect_to_b(pair_with_b_port(), &off);
    assert_eq!(rej, Some((RejReason::InvalidLid, vec![0, 4])));
    assert!(!reported);
    let within = ConnectParams {
        primary_path: to_b(7, gid(2), true),
        ..cp()
    };
    assert_eq!(connect_to_b(pair_with_b_port(), &within), (None, true));
}

/// A path that is not subnet-local carries router or permissive LIDs (Linux
/// `cm_format_req` sends 0xFFFF: "Work-around until there's a way to obtain remote LID
/// info"), and RoCE paths carry 0xFFFF: only the GID is checked then.
#[test]
fn req_port_lid_is_not_checked_off_subnet_or_when_permissive() {
    for path in [to_b(0x30, gid(2), false), to_b(0xFFFF, gid(2), true)] {
        let cp = ConnectParams {
            primary_path: path,
            ..cp()
        };
        assert_eq!(
            connect_to_b(pair_with_b_port(), &cp),
            (None, true),
            "{path:?}"
        );
    }
}

/// IBA Table 108 reasons 18 and 19 (InvalidAlternateGID/LID): the same checks on the
/// alternate path; the GID ARI is the primary path's GID, as Linux `cm_req_handler`
/// (INVALID_ALT_GID with `work->path[0].sgid`); the LID ARI the port's base LID.
#[test]
fn req_alternate_path_off_the_ports_gets_rej_invalid_alt_gid_or_alt_lid() {
    let cp = ConnectParams {
        alternate_path: Some(to_b(6, gid(3), true)),
        ..cp()
    };
    let want_gid = (RejReason::InvalidAltGid, gid(2).to_vec());
    let (rej, reported) = connect_to_b(
        pair_with_b_port(),
        &ConnectParams {
            primary_path: to_b(4, gid(2), true),
            ..cp
        },
    );
    assert_eq!(rej, Some(want_gid));
    assert!(!reported);
    let cp = ConnectParams {
        primary_path: to_b(4, gid(2), true),
        alternate_path: Some(to_b(3, gid(9), true)),
        ..cp
    };
    assert_eq!(
        connect_to_b(pair_with_b_port(), &cp).0,
        Some((RejReason::InvalidAltLid, vec![0, 4]))
    );
}

/// A manager told no port (`set_port` never called: tests, fuzzers, a host that cannot
/// tell) checks no path, as before: a REQ to any GID and LID is reported.
#[test]
fn manager_told_no_port_checks_no_req_path() {
    let cp = ConnectParams {
        primary_path: to_b(0x77, gid(3), true),
        alternate_path: Some(to_b(0x78, gid(4), true)),
        ..cp()
    };
    assert_eq!(connect_to_b(Pair::new(7), &cp), (None, true));
}

/// `remove_port` (device removal) forgets the port's GIDs: a REQ naming them is then
/// refused with InvalidGID (another port still told keeps the check on).
#[test]
fn req_to_a_removed_ports_gid_gets_rej_invalid_gid() {
    let mut p = pair_with_b_port();
    p.b.set_port(2, 0x40, 0, &[gid(0x40)]).unwrap();
    p.b.remove_port(1);
    let cp = ConnectParams {
        port: 1,
        primary_path: to_b(4, gid(2), true),
        ..cp()
    };
    let (rej, _) = connect_to_b(p, &cp);
    assert_eq!(rej.map(|r| r.0), Some(RejReason::InvalidGid));
}
