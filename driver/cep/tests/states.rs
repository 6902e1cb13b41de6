//! Per-state tests of the CEP state machines, through the two-node virtual-time [`Pair`].
//!
//! The transition tables are cm-anchors.md §4a (Linux `cm.c`) and §4b (WinOF
//! `al_cm_cep.c`). Every test starts from a fixture that puts both nodes in a known state
//! (smoltcp style: one builder, [`Stage`] names the state pair), performs one transition,
//! and checks, on both sides: the state, the exact events each CEP got, the MADs put on the
//! link, the counters, and at the end (after destroy and timewait) that nothing is left:
//! no CEP, no peer-map entry, no timer.
//!
//! Where WinOF and Linux differ the engine documents its choice; the tests of those choices
//! say so in a comment naming the table row.
//!
//! Timing (virtual ns, from `Pair`'s defaults): A's packet life time is 14 and B recovers
//! 15 from the REQ's LocalACKTimeout (16) minus one; both CAs have an ACK delay of 15; the
//! REQ's CM response timeouts are 16; the link takes 2 us one way.

use ibcm_cep::pair::{Fate, GUID_A, GUID_B, Pair, Side};
use ibcm_cep::{
    AddressVector, CepId, CmConfig, CmError, CmManager, ConnectParams, Event, Instant,
    ListenParams, MadAddress, PathRecord, PrivateData, QpAttributes, QpState, RejectParams,
    RepParams, StateName as S, access, ack_timeout, counter_slot,
};
use ibcm_mad::{
    AttributeId, CmMad, CmMessage, Dreq, MAD_SIZE, MadHeader, MessageKind, Mtu, RejReason,
    Transport,
};

const SID: u64 = 0x1000;
const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x22;
const MS: u64 = 1_000_000;
/// One-way link latency of `Pair`.
const LAT: u64 = 2_000;

/// 4.096 us * 2^t in ns.
const fn ib(t: u32) -> u64 {
    4096 << t
}

/// A's REQ (and DREQ) retry wait: 2 x PLT(14) + RemoteCMResponseTimeout(16).
const REQ_WAIT: u64 = 2 * ib(14) + ib(16);
/// B's REP retry wait: 2 x PLT(15) + the REQ's LocalCMResponseTimeout(16).
const REP_WAIT: u64 = 2 * ib(15) + ib(16);
/// A's timewait: 2 x PLT(14) + B's ACK delay (15, from the REP).
const TW_A: u64 = 2 * ib(14) + ib(15);
/// B's timewait: 2 x PLT(15) + its own ACK delay (15).
const TW_B: u64 = 2 * ib(15) + ib(15);
/// Plenty for everything in flight to happen, short of any retry.
const SETTLE: u64 = MS;

// ---- event summaries ------------------------------------------------------------------

/// An event without its payload, for comparing whole sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Req,
    Rep,
    Rtu,
    Mra(u8),
    Rej(RejReason),
    Timeout(AttributeId),
    Dreq,
    Drep,
    Exit,
    Lap,
    Apr,
    SidrReq,
    SidrRep,
    Removal,
}

fn ev(e: &Event) -> Ev {
    match *e {
        Event::ReqReceived(_) => Ev::Req,
        Event::RepReceived(_) => Ev::Rep,
        Event::RtuReceived(_) => Ev::Rtu,
        Event::MraReceived {
            service_timeout, ..
        } => Ev::Mra(service_timeout),
        Event::Rejected { reason, .. } => Ev::Rej(reason),
        Event::Timeout { message } => Ev::Timeout(message),
        Event::DreqReceived(_) => Ev::Dreq,
        Event::DrepReceived(_) => Ev::Drep,
        Event::TimewaitExit => Ev::Exit,
        Event::LapReceived { .. } => Ev::Lap,
        Event::AprReceived { .. } => Ev::Apr,
        Event::SidrReqReceived(_) => Ev::SidrReq,
        Event::SidrRepReceived(_) => Ev::SidrRep,
        Event::DeviceRemoval => Ev::Removal,
    }
}

/// Private data as the peer receives it: the whole wire field, zero-filled.
fn pd(bytes: &[u8], field: usize) -> PrivateData {
    let mut v = vec![0u8; field];
    v[..bytes.len()].copy_from_slice(bytes);
    PrivateData::new(&v)
}

/// A `Rejected` event as a REJ from the wire produces it.
fn rej_event(reason: RejReason, message: MessageKind, ari: &[u8], pdata: &[u8]) -> Event {
    let mut buf = [0u8; 72];
    buf[..ari.len()].copy_from_slice(ari);
    Event::Rejected {
        reason,
        message,
        ari: buf,
        ari_len: ari.len() as u8,
        private_data: pd(pdata, ibcm_mad::REJ_PRIVATE_DATA_SIZE),
    }
}

/// A `Rejected` event the manager makes up itself (no REJ received): no private data.
fn local_rej(reason: RejReason, message: MessageKind) -> Event {
    Event::Rejected {
        reason,
        message,
        ari: [0; 72],
        ari_len: 0,
        private_data: PrivateData::new(&[]),
    }
}

// ---- counters -------------------------------------------------------------------------

fn slot(attr: AttributeId) -> usize {
    counter_slot(attr).expect("a counted attribute")
}

fn dups(m: &CmManager, attr: AttributeId) -> u64 {
    m.counters().duplicates[slot(attr)]
}

fn retries(m: &CmManager, attr: AttributeId) -> u64 {
    m.counters().retries[slot(attr)]
}

fn all_dups(m: &CmManager) -> u64 {
    m.counters().duplicates.iter().sum()
}

// ---- assertions -----------------------------------------------------------------------

#[track_caller]
fn assert_state(m: &CmManager, cep: CepId, want: S) {
    assert_eq!(m.state(cep), Ok(want), "state of {cep:?}");
}

#[track_caller]
fn assert_states(p: &Pair, a: CepId, sa: S, b: CepId, sb: S) {
    assert_eq!(p.a.state(a), Ok(sa), "state of A's {a:?}");
    assert_eq!(p.b.state(b), Ok(sb), "state of B's {b:?}");
}

#[track_caller]
fn assert_events(p: &mut Pair, side: Side, cep: CepId, want: &[Ev]) {
    p.flush();
    let got: Vec<Ev> = p.events_of(side, cep).iter().map(ev).collect();
    assert_eq!(got, want, "events of {side:?}'s {cep:?}");
}

#[track_caller]
fn assert_no_events(p: &mut Pair, side: Side) {
    p.flush();
    assert!(p.events(side).is_empty(), "{side:?}: {:?}", p.events(side));
}

#[track_caller]
fn assert_sent(p: &mut Pair, side: Side, attr: AttributeId, n: usize) {
    p.flush();
    assert_eq!(
        p.sent_count(side, attr),
        n,
        "{attr:?} MADs sent by {side:?}"
    );
}

/// The CEPs of B's ReqReceived events, in order.
fn reported_reqs(p: &Pair) -> Vec<CepId> {
    p.events(Side::B)
        .iter()
        .filter(|(_, e)| matches!(e, Event::ReqReceived(_)))
        .map(|(c, _)| *c)
        .collect()
}

/// B takes the `n`th reported REQ, `b`, from its listen and accepts it (QPN_B + n).
fn take_and_accept(p: &mut Pair, b: CepId, n: usize) {
    p.b.take_request(b).unwrap();
    let now = p.now;
    p.b.accept(now, b, &Pair::rep_params(QPN_B + n as u32))
        .unwrap();
}

/// How many ReqReceived events B has had in all.
fn req_events(p: &Pair) -> usize {
    p.events(Side::B)
        .iter()
        .filter(|(_, e)| matches!(e, Event::ReqReceived(_)))
        .count()
}

/// Steps until `cond` holds, failing if it takes more than `limit_ns` of virtual time.
#[track_caller]
fn run_until(p: &mut Pair, limit_ns: u64, cond: impl Fn(&Pair) -> bool) {
    let end = p.now.add_nanos(limit_ns);
    p.flush();
    while !cond(p) {
        assert!(
            p.step(),
            "nothing left to happen and the condition does not hold"
        );
        assert!(
            p.now <= end,
            "the condition did not hold within {limit_ns} ns"
        );
    }
}

/// Runs everything due up to `at` (inclusive) and moves the clock there.
fn run_to(p: &mut Pair, at: Instant) {
    p.drive_for(at.nanos_since(p.now));
    assert!(p.now <= at);
    p.now = at;
}

fn just_before(t: Instant) -> Instant {
    Instant::from_nanos(t.as_nanos() - 1)
}

fn settle(p: &mut Pair) {
    p.drive_for(SETTLE);
}

fn ns_since(p: &Pair, t0: Instant) -> u64 {
    p.now.nanos_since(t0)
}

/// Destroys every CEP either side knows of (the ones given and every one an event named),
/// runs all timers out, and checks that no event reached a destroyed CEP and that nothing
/// is left: no CEP, no peer-map entry, no timer.
#[track_caller]
fn finish(mut p: Pair, a: &[CepId], b: &[CepId]) {
    p.flush();
    let mut ceps_a: Vec<CepId> = a.to_vec();
    ceps_a.extend(p.events(Side::A).iter().map(|(c, _)| *c));
    let mut ceps_b: Vec<CepId> = b.to_vec();
    ceps_b.extend(p.events(Side::B).iter().map(|(c, _)| *c));
    if let Some(listen) = p.events(Side::B).iter().find_map(|(_, e)| match e {
        Event::ReqReceived(info) => Some(info.listen),
        _ => None,
    }) {
        ceps_b.push(listen);
    }
    let now = p.now;
    for c in ceps_a {
        let _ = p.a.destroy(now, c);
    }
    for c in ceps_b {
        let _ = p.b.destroy(now, c);
    }
    p.flush();
    let (ea, eb) = (p.events_a.len(), p.events_b.len());
    p.drive();
    assert_eq!(p.events_a[ea..], [], "A: events after destroy");
    assert_eq!(p.events_b[eb..], [], "B: events after destroy");
    for (side, m) in [(Side::A, &p.a), (Side::B, &p.b)] {
        assert_eq!(m.live_ceps(), 0, "{side:?}: CEPs left");
        assert_eq!(m.peer_map_entries(), 0, "{side:?}: peer-map entries left");
        assert_eq!(m.timer_entries(), 0, "{side:?}: timers left");
        assert_eq!(m.poll_timeout(), None, "{side:?}: a deadline left");
    }
}

// ---- fixtures -------------------------------------------------------------------------

/// Where a fixture leaves the two nodes. A is the active side, B listens on [`SID`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// A's CEP created, idle; B listening.
    Idle,
    /// A connected; the REQ is on the link.
    ReqSent,
    /// A: ReqSent; B: ReqRcvd (taken from the backlog).
    ReqRcvd,
    /// A: MraReqRcvd; B: MraReqSent (MRA with ServiceTimeout 10).
    MraReqSent,
    /// A: ReqSent; B: RepPrepared.
    RepPrepared,
    /// A: RepRcvd; B: RepSent.
    RepSent,
    /// Both established.
    Established,
    /// A: DreqSent; B: DreqRcvd.
    Dreq,
    /// Both in timewait.
    Timewait,
}

struct Fx {
    p: Pair,
    /// A's CEP.
    a: CepId,
    /// B's listen.
    l: CepId,
    /// B's REQ-created CEP, from ReqRcvd on.
    b: Option<CepId>,
}

impl Fx {
    fn b(&self) -> CepId {
        self.b.expect("B's CEP exists from ReqRcvd on")
    }

    fn finish(self) {
        let b: Vec<CepId> = self.b.into_iter().chain([self.l]).collect();
        finish(self.p, &[self.a], &b);
    }
}

fn cp() -> ConnectParams<'static> {
    Pair::connect_params(SID, QPN_A)
}

fn rp() -> RepParams<'static> {
    Pair::rep_params(QPN_B)
}

fn at(stage: Stage) -> Fx {
    build(stage, &cp(), &rp())
}

fn build(stage: Stage, cp: &ConnectParams<'_>, rp: &RepParams<'_>) -> Fx {
    let mut p = Pair::new(7);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 16)).unwrap();
    let a = p.a.create().unwrap();
    let mut fx = Fx { p, a, l, b: None };
    if stage == Stage::Idle {
        return fx;
    }
    let now = fx.p.now;
    fx.p.a.connect(now, a, cp).unwrap();
    fx.p.flush();
    if stage == Stage::ReqSent {
        return fx;
    }
    settle(&mut fx.p);
    let b = fx.p.last_request().expect("REQ received");
    fx.p.b.take_request(b).unwrap();
    fx.b = Some(b);
    match stage {
        Stage::ReqRcvd => return fx,
        Stage::MraReqSent => {
            fx.p.b.mra(b, 10, b"busy").unwrap();
            settle(&mut fx.p);
            return fx;
        }
        Stage::RepPrepared => {
            fx.p.b.prepare_rep(b, rp).unwrap();
            fx.p.flush();
            return fx;
        }
        _ => {}
    }
    let now = fx.p.now;
    fx.p.b.accept(now, b, rp).unwrap();
    settle(&mut fx.p);
    if stage == Stage::RepSent {
        return fx;
    }
    fx.p.a.rtu(a, b"rtu").unwrap();
    settle(&mut fx.p);
    if stage == Stage::Established {
        return fx;
    }
    let now = fx.p.now;
    fx.p.a.disconnect(now, a, b"bye").unwrap();
    settle(&mut fx.p);
    if stage == Stage::Dreq {
        return fx;
    }
    let now = fx.p.now;
    fx.p.b.drep(now, b, b"ok").unwrap();
    settle(&mut fx.p);
    fx
}

#[test]
fn fixtures_reach_their_states() {
    use Ev::*;
    struct Row {
        stage: Stage,
        a: S,
        b: Option<S>,
        ev_a: &'static [Ev],
        ev_b: &'static [Ev],
    }
    let rows = [
        Row {
            stage: Stage::Idle,
            a: S::Idle,
            b: None,
            ev_a: &[],
            ev_b: &[],
        },
        Row {
            stage: Stage::ReqSent,
            a: S::ReqSent,
            b: None,
            ev_a: &[],
            ev_b: &[],
        },
        Row {
            stage: Stage::ReqRcvd,
            a: S::ReqSent,
            b: Some(S::ReqRcvd),
            ev_a: &[],
            ev_b: &[Req],
        },
        Row {
            stage: Stage::MraReqSent,
            a: S::MraReqRcvd,
            b: Some(S::MraReqSent),
            ev_a: &[Mra(10)],
            ev_b: &[Req],
        },
        Row {
            stage: Stage::RepPrepared,
            a: S::ReqSent,
            b: Some(S::RepPrepared),
            ev_a: &[],
            ev_b: &[Req],
        },
        Row {
            stage: Stage::RepSent,
            a: S::RepRcvd,
            b: Some(S::RepSent),
            ev_a: &[Rep],
            ev_b: &[Req],
        },
        Row {
            stage: Stage::Established,
            a: S::Established,
            b: Some(S::Established),
            ev_a: &[Rep],
            ev_b: &[Req, Rtu],
        },
        Row {
            stage: Stage::Dreq,
            a: S::DreqSent,
            b: Some(S::DreqRcvd),
            ev_a: &[Rep],
            ev_b: &[Req, Rtu, Dreq],
        },
        Row {
            stage: Stage::Timewait,
            a: S::Timewait,
            b: Some(S::Timewait),
            ev_a: &[Rep, Drep],
            ev_b: &[Req, Rtu, Dreq],
        },
    ];
    for row in rows {
        let mut fx = at(row.stage);
        assert_state(&fx.p.a, fx.a, row.a);
        assert_events(&mut fx.p, Side::A, fx.a, row.ev_a);
        assert_state(&fx.p.b, fx.l, S::Listen);
        match row.b {
            Some(sb) => {
                let b = fx.b();
                assert_state(&fx.p.b, b, sb);
                assert_events(&mut fx.p, Side::B, b, row.ev_b);
            }
            None => assert_no_events(&mut fx.p, Side::B),
        }
        fx.finish();
    }
}

// ---- active side ------------------------------------------------------------------------

/// Distinct values on each side, so a swapped field shows.
fn cp_distinct() -> ConnectParams<'static> {
    ConnectParams {
        starting_psn: Some(0x12_3456),
        responder_resources: 3,
        initiator_depth: 2,
        retry_count: 5,
        rnr_retry_count: 6,
        ..cp()
    }
}

fn rp_distinct() -> RepParams<'static> {
    RepParams {
        starting_psn: Some(0xab_cdef),
        responder_resources: 2,
        initiator_depth: 3,
        rnr_retry_count: 4,
        ..rp()
    }
}

const ALL_ACCESS: u32 =
    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;

#[test]
fn connect_sends_one_req_and_offers_init_only() {
    let mut fx = at(Stage::ReqSent);
    let a = fx.a;
    assert_state(&fx.p.a, a, S::ReqSent);
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 1);
    assert_eq!(fx.p.a.counters().sent[slot(AttributeId::Req)], 1);
    // §4a QP-attr legality: INIT from REQ_SENT on; RTR and RTS need the REP.
    let init = fx.p.a.qp_attributes(a, QpState::Init).unwrap();
    assert_eq!(
        init,
        QpAttributes {
            port: Some(1),
            pkey: Some(0xffff),
            access_flags: Some(ALL_ACCESS),
            ..empty(QpState::Init)
        }
    );
    for qs in [QpState::Rtr, QpState::Rts] {
        assert_eq!(
            fx.p.a.qp_attributes(a, qs),
            Err(CmError::InvalidState { state: S::ReqSent })
        );
    }
    let info = fx.p.a.query(a).unwrap();
    assert!(info.active);
    assert_eq!(
        (info.local_qpn, info.remote_qpn, info.remote_ca_guid),
        (QPN_A, 0, 0)
    );
    // A CEP sends one REQ.
    let now = fx.p.now;
    assert_eq!(
        fx.p.a.connect(now, a, &cp()),
        Err(CmError::InvalidState { state: S::ReqSent })
    );
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 1);
    settle(&mut fx.p);
    assert_eq!(req_events(&fx.p), 1);
    fx.finish();
}

#[test]
fn rep_received_reports_the_peer_and_rtu_establishes() {
    let mut fx = build(Stage::RepSent, &cp_distinct(), &rp_distinct());
    let (a, b) = (fx.a, fx.b());
    assert_states(&fx.p, a, S::RepRcvd, b, S::RepSent);
    let got = fx.p.events_of(Side::A, a);
    let [Event::RepReceived(info)] = got.as_slice() else {
        panic!("A: {got:?}");
    };
    assert_eq!(info.remote_ca_guid, GUID_B);
    assert_eq!(info.remote_qpn, QPN_B);
    assert_eq!(info.remote_psn, 0xab_cdef);
    assert_eq!(info.peer_responder_resources, 2);
    assert_eq!(info.peer_initiator_depth, 3);
    assert_eq!(info.failover_accepted, ibcm_mad::Failover::NotSupported);
    assert!(!info.srq);
    assert_eq!(info.private_data, pd(b"hello from B", 196));
    // Both sides know the other's read limits.
    let qa = fx.p.a.query(a).unwrap();
    assert_eq!(
        (
            qa.remote_qpn,
            qa.remote_ca_guid,
            qa.peer_responder_resources,
            qa.peer_initiator_depth
        ),
        (QPN_B, GUID_B, 2, 3)
    );
    let qb = fx.p.b.query(b).unwrap();
    assert!(!qb.active);
    assert_eq!(
        (
            qb.remote_qpn,
            qb.remote_ca_guid,
            qb.peer_responder_resources,
            qb.peer_initiator_depth
        ),
        (QPN_A, GUID_A, 3, 2)
    );

    fx.p.a.rtu(a, b"rtu").unwrap();
    assert_state(&fx.p.a, a, S::Established);
    assert_eq!(
        fx.p.a.rtu(a, b"rtu"),
        Err(CmError::InvalidState {
            state: S::Established
        })
    );
    settle(&mut fx.p);
    assert_states(&fx.p, a, S::Established, b, S::Established);
    assert_eq!(
        fx.p.events_of(Side::B, b)[1],
        Event::RtuReceived(pd(b"rtu", 224))
    );
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep]);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu]);
    for (side, attr) in [
        (Side::A, AttributeId::Req),
        (Side::B, AttributeId::Rep),
        (Side::A, AttributeId::Rtu),
    ] {
        assert_sent(&mut fx.p, side, attr, 1);
    }
    assert_eq!(fx.p.sent.len(), 3);
    fx.finish();
}

fn empty(state: QpState) -> QpAttributes {
    QpAttributes {
        state,
        port: None,
        pkey: None,
        access_flags: None,
        path_mtu: None,
        dest_qpn: None,
        rq_psn: None,
        max_dest_rd_atomic: None,
        primary: None,
        alternate: None,
        sq_psn: None,
        timeout: None,
        retry_count: None,
        rnr_retry: None,
        max_rd_atomic: None,
        path_mig_state: None,
    }
}

#[test]
fn qp_attributes_match_what_each_side_sent() {
    let (cp, rp) = (cp_distinct(), rp_distinct());
    let mut fx = build(Stage::ReqRcvd, &cp, &rp);
    let (a, b) = (fx.a, fx.b());
    let prepared = fx.p.b.prepare_rep(b, &rp).unwrap();
    let now = fx.p.now;
    fx.p.b.send_rep(now, b).unwrap();
    settle(&mut fx.p);
    fx.p.a.rtu(a, b"").unwrap();
    settle(&mut fx.p);
    assert_states(&fx.p, a, S::Established, b, S::Established);

    // A: RTR from the REP (its receive PSN its own REQ's StartingPSN, Linux
    // `ib_send_cm_req`; AL al_cm_cep.c:4865); RTS from its own REQ and the REP (send PSN
    // the REP's StartingPSN, AL :1316) with the REP's RNR retry count. The ACK
    // timeout covers 2 x its PLT (14) + B's ACK delay (15, from the REP).
    let a_ack = ack_timeout(14, 15);
    assert_eq!(a_ack, 16);
    let a_rtr = QpAttributes {
        path_mtu: Some(Mtu::Mtu4096),
        dest_qpn: Some(QPN_B),
        rq_psn: Some(0x12_3456),
        max_dest_rd_atomic: Some(3),
        primary: Some(AddressVector {
            path: Pair::path(Side::A),
            port: 1,
            ack_timeout: a_ack,
        }),
        ..empty(QpState::Rtr)
    };
    let a_rts = QpAttributes {
        sq_psn: Some(0xab_cdef),
        timeout: Some(a_ack),
        retry_count: Some(5),
        rnr_retry: Some(4),
        max_rd_atomic: Some(2),
        ..empty(QpState::Rts)
    };
    let init = QpAttributes {
        port: Some(1),
        pkey: Some(0xffff),
        access_flags: Some(ALL_ACCESS),
        ..empty(QpState::Init)
    };
    assert_eq!(fx.p.a.qp_attributes(a, QpState::Init), Ok(init));
    assert_eq!(fx.p.a.qp_attributes(a, QpState::Rtr), Ok(a_rtr));
    assert_eq!(fx.p.a.qp_attributes(a, QpState::Rts), Ok(a_rts));

    // B: the path as seen from B, its PLT recovered from the REQ (LocalACKTimeout 16 - 1).
    let b_path = PathRecord {
        packet_life_time: 15,
        ..Pair::path(Side::B)
    };
    // B's ACK timeout is the REQ's LocalACKTimeout, A's 2 x PLT + A's ACK delay (Linux
    // `cm_req_handler`, cm.c:1716-1718 with `cm_init_av_by_path` :546; AL al_cm_cep.c:800).
    let b_ack = a_ack;
    let b_rtr = QpAttributes {
        path_mtu: Some(Mtu::Mtu4096),
        dest_qpn: Some(QPN_A),
        rq_psn: Some(0xab_cdef),
        max_dest_rd_atomic: Some(2),
        primary: Some(AddressVector {
            path: b_path,
            port: 1,
            ack_timeout: b_ack,
        }),
        ..empty(QpState::Rtr)
    };
    let b_rts = QpAttributes {
        sq_psn: Some(0x12_3456),
        timeout: Some(b_ack),
        retry_count: Some(5),
        rnr_retry: Some(6),
        max_rd_atomic: Some(3),
        ..empty(QpState::Rts)
    };
    assert_eq!(prepared.init, init);
    assert_eq!(prepared.rtr, b_rtr);
    assert_eq!(prepared.rts, b_rts);
    // The pre-REP attributes stay what the established connection reports.
    assert_eq!(fx.p.b.qp_attributes(b, QpState::Init), Ok(init));
    assert_eq!(fx.p.b.qp_attributes(b, QpState::Rtr), Ok(b_rtr));
    assert_eq!(fx.p.b.qp_attributes(b, QpState::Rts), Ok(b_rts));

    // Cross-checks: each side's send PSN is the other's receive PSN, and reads issued never
    // exceed reads accepted.
    assert_eq!(a_rts.sq_psn, b_rtr.rq_psn);
    assert_eq!(b_rts.sq_psn, a_rtr.rq_psn);
    assert!(a_rts.max_rd_atomic <= b_rtr.max_dest_rd_atomic);
    assert!(b_rts.max_rd_atomic <= a_rtr.max_dest_rd_atomic);
    fx.finish();
}

#[test]
fn init_access_flags_follow_responder_resources() {
    for (resources, flags) in [
        (0u8, access::LOCAL_WRITE | access::REMOTE_WRITE),
        (1, ALL_ACCESS),
        (16, ALL_ACCESS),
    ] {
        let cp = ConnectParams {
            responder_resources: resources,
            ..cp()
        };
        // B may not issue more reads than A accepts.
        let rp = RepParams {
            responder_resources: resources,
            initiator_depth: 0,
            ..rp()
        };
        let mut fx = build(Stage::ReqRcvd, &cp, &rp);
        let (a, b) = (fx.a, fx.b());
        let init = fx.p.a.qp_attributes(a, QpState::Init).unwrap();
        assert_eq!(
            init.access_flags,
            Some(flags),
            "A, responder resources {resources}"
        );
        let prepared = fx.p.b.prepare_rep(b, &rp).unwrap();
        assert_eq!(
            prepared.init.access_flags,
            Some(flags),
            "B, responder resources {resources}"
        );
        assert_eq!(prepared.rtr.max_dest_rd_atomic, Some(resources));
        assert_eq!(prepared.rts.max_rd_atomic, Some(0));
        fx.finish();
    }
}

// ---- passive side: listen ---------------------------------------------------------------

fn listen_on(p: &mut Pair, params: ListenParams) -> CepId {
    let l = p.b.create().unwrap();
    p.b.listen(l, params).unwrap();
    l
}

/// A new CEP on A connects to `sid` with `qpn`; returns it.
fn connect_new(p: &mut Pair, sid: u64, qpn: u32) -> CepId {
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a, &Pair::connect_params(sid, qpn))
        .unwrap();
    a
}

/// Checks the outcome of one REQ against one listen: either a new CEP on B got the REQ
/// (returned) or A got REJ(InvalidServiceId) and B created nothing.
#[track_caller]
fn expect_match(p: &mut Pair, a: CepId, listen: CepId, sid: u64, matches: bool) -> Option<CepId> {
    settle(p);
    if matches {
        let b = p.last_request().expect("REQ received");
        let info = match p.events_of(Side::B, b).as_slice() {
            [Event::ReqReceived(info)] => *info,
            other => panic!("B: {other:?}"),
        };
        assert_eq!((info.listen, info.service_id), (listen, sid));
        assert_state(&p.a, a, S::ReqSent);
        assert_events(p, Side::A, a, &[]);
        Some(b)
    } else {
        assert_state(&p.a, a, S::Idle);
        assert_eq!(
            p.events_of(Side::A, a),
            [rej_event(
                RejReason::InvalidServiceId,
                MessageKind::Req,
                &[],
                &[]
            )]
        );
        None
    }
}

#[test]
fn listen_service_mask_matches_a_range() {
    let mut p = Pair::new(3);
    let l = listen_on(
        &mut p,
        ListenParams {
            service_mask: !0xff,
            ..Pair::listen_params(SID, 16)
        },
    );
    let (mut created, mut ceps) = (0, Vec::new());
    for (i, (sid, matches)) in [
        (0x1000, true),
        (0x10ab, true),
        (0x10ff, true),
        (0x1100, false),
        (0x0fff, false),
    ]
    .into_iter()
    .enumerate()
    {
        let rejs = p.sent_count(Side::B, AttributeId::Rej);
        let a = connect_new(&mut p, sid, 0x100 + i as u32);
        ceps.push(a);
        let b = expect_match(&mut p, a, l, sid, matches);
        created += usize::from(b.is_some());
        assert_sent(
            &mut p,
            Side::B,
            AttributeId::Rej,
            rejs + usize::from(!matches),
        );
        assert_eq!(p.b.live_ceps(), 1 + created);
    }
    assert_eq!(req_events(&p), 3);
    finish(p, &ceps, &[l]);
}

#[test]
fn listen_port_filter() {
    // Every REQ of the pair arrives on B's port 1.
    for (port, matches) in [(None, true), (Some(1), true), (Some(2), false)] {
        let mut p = Pair::new(4);
        let l = listen_on(
            &mut p,
            ListenParams {
                port,
                ..Pair::listen_params(SID, 16)
            },
        );
        let a = connect_new(&mut p, SID, QPN_A);
        if let Some(b) = expect_match(&mut p, a, l, SID, matches) {
            let Event::ReqReceived(info) = p.events_of(Side::B, b)[0] else {
                unreachable!()
            };
            assert_eq!(info.port, 1);
        }
        finish(p, &[a], &[l]);
    }
}

#[test]
fn listen_private_data_compare() {
    // A's REQ carries b"hello from A", zero-filled to the 92-byte field.
    let rows: [(u8, &[u8], bool); 6] = [
        (6, b"from A", true),
        (0, b"hello", true),
        (6, b"from B", false),
        (1, b"hello", false),
        (80, &[0; 12], true),
        (91, &[1], false),
    ];
    for (offset, bytes, matches) in rows {
        let mut p = Pair::new(5);
        let l = listen_on(
            &mut p,
            ListenParams {
                compare: Some((offset, bytes.to_vec())),
                ..Pair::listen_params(SID, 16)
            },
        );
        let a = connect_new(&mut p, SID, QPN_A);
        let b = expect_match(&mut p, a, l, SID, matches);
        assert_eq!(
            p.b.live_ceps(),
            1 + usize::from(b.is_some()),
            "compare at {offset}"
        );
        finish(p, &[a], &[l]);
    }
}

#[test]
fn listen_compare_past_92_bytes_is_too_long_and_changes_nothing() {
    let rows: [(u8, usize); 4] = [(89, 4), (92, 1), (0, 93), (255, 0)];
    for (offset, len) in rows {
        let mut p = Pair::new(6);
        let l = p.b.create().unwrap();
        let params = ListenParams {
            compare: Some((offset, vec![0; len])),
            ..Pair::listen_params(SID, 16)
        };
        assert_eq!(
            p.b.listen(l, params),
            Err(CmError::TooLong {
                field: "listen compare offset + length",
                len: usize::from(offset) + len,
                max: 92
            })
        );
        assert_state(&p.b, l, S::Idle);
        // Nothing was registered: a REQ finds no listener.
        let a = connect_new(&mut p, SID, QPN_A);
        expect_match(&mut p, a, l, SID, false);
        // The boundary fits.
        let params = ListenParams {
            compare: Some((88, vec![0; 4])),
            ..Pair::listen_params(SID, 16)
        };
        assert_eq!(p.b.listen(l, params), Ok(()));
        let a2 = connect_new(&mut p, SID, QPN_A + 1);
        expect_match(&mut p, a2, l, SID, true);
        finish(p, &[a, a2], &[l]);
    }
}

/// No two listens that could take one REQ (manager/listen.rs): AL's listen map
/// (al_cm_cep.c:4430-4505) refuses the same service ID with the same or an unnamed port
/// unless both compares have one length and offset and differ (4464-4497); Linux
/// `cm_insert_listen` refuses a second listen on one service ID. Masks widen "the same
/// service ID" to "a service ID both masks match".
#[test]
fn overlapping_listens_are_refused() {
    let mut p = Pair::new(8);
    let l1 = listen_on(&mut p, Pair::listen_params(SID, 16));
    let l2 = p.b.create().unwrap();
    // AL 4500-4505: the identical listen.
    assert_eq!(
        p.b.listen(l2, Pair::listen_params(SID, 16)),
        Err(CmError::DuplicateListen)
    );
    assert_state(&p.b, l2, S::Idle);
    // Already listening.
    assert_eq!(
        p.b.listen(l1, Pair::listen_params(SID + 1, 16)),
        Err(CmError::InvalidState { state: S::Listen })
    );
    // Each of these would take REQs for SID beside l1: a port (AL 4443-4445: an unnamed
    // port is every port), a mask covering SID, a compare prefix (AL 4464-4465).
    let overlapping = [
        ListenParams {
            port: Some(1),
            ..Pair::listen_params(SID, 16)
        },
        ListenParams {
            service_mask: !0xf,
            ..Pair::listen_params(SID, 16)
        },
        ListenParams {
            service_mask: 0,
            ..Pair::listen_params(0, 16)
        },
        ListenParams {
            compare: Some((0, b"x".to_vec())),
            ..Pair::listen_params(SID, 16)
        },
    ];
    for v in overlapping {
        let c = p.b.create().unwrap();
        assert_eq!(
            p.b.listen(c, v.clone()),
            Err(CmError::DuplicateListen),
            "{v:?}"
        );
        assert_state(&p.b, c, S::Idle);
        p.b.destroy(p.now, c).unwrap();
    }
    // Beside another service ID, listens that never take the same REQ coexist: two
    // named ports (AL 4447-4455), compares that differ where both look (AL 4478-4497);
    // a third listen overlapping either is refused.
    let sid = SID + 0x100;
    let coexisting = [
        (
            ListenParams {
                port: Some(1),
                ..Pair::listen_params(sid, 16)
            },
            ListenParams {
                port: Some(2),
                ..Pair::listen_params(sid, 16)
            },
        ),
        (
            ListenParams {
                compare: Some((4, b"ab".to_vec())),
                ..Pair::listen_params(sid + 1, 16)
            },
            ListenParams {
                compare: Some((4, b"ac".to_vec())),
                ..Pair::listen_params(sid + 1, 16)
            },
        ),
    ];
    let mut more = Vec::new();
    for (a, b) in coexisting {
        let (c, d, e) = (
            p.b.create().unwrap(),
            p.b.create().unwrap(),
            p.b.create().unwrap(),
        );
        assert_eq!(p.b.listen(c, a.clone()), Ok(()));
        assert_eq!(p.b.listen(d, b), Ok(()));
        let all = ListenParams {
            port: None,
            compare: None,
            ..a
        };
        assert_eq!(p.b.listen(e, all), Err(CmError::DuplicateListen));
        more.extend([c, d, e]);
    }
    // Destroying the first listen frees its key.
    let now = p.now;
    p.b.destroy(now, l1).unwrap();
    assert_eq!(p.b.listen(l2, Pair::listen_params(SID, 16)), Ok(()));
    assert_eq!(p.sent.len(), 0);
    more.push(l2);
    finish(p, &[], &more);
}

// ---- passive side: REQ, pre-REP, MRA, accept --------------------------------------------

#[test]
fn req_creates_a_new_cep_naming_the_listen() {
    let mut fx = at(Stage::ReqRcvd);
    let (l, b) = (fx.l, fx.b());
    assert_ne!(b, l);
    assert_state(&fx.p.b, l, S::Listen);
    assert_events(&mut fx.p, Side::B, l, &[]);
    let got = fx.p.events_of(Side::B, b);
    let [Event::ReqReceived(info)] = got.as_slice() else {
        panic!("B: {got:?}")
    };
    assert_eq!(info.port, 1);
    assert_eq!(info.listen, l);
    assert_eq!(info.service_id, SID);
    assert_eq!(info.remote_ca_guid, GUID_A);
    assert_eq!(info.remote_qpn, QPN_A);
    assert_eq!(info.pkey, 0xffff);
    assert_eq!(
        info.primary_path,
        PathRecord {
            packet_life_time: 15,
            ..Pair::path(Side::B)
        }
    );
    assert_eq!(info.alternate_path, None);
    assert_eq!(info.path_mtu, Mtu::Mtu4096);
    assert_eq!(info.transport, Transport::Rc);
    assert_eq!(
        (info.peer_responder_resources, info.peer_initiator_depth),
        (4, 4)
    );
    assert_eq!(info.rnr_retry_count, 7);
    assert!(!info.srq);
    assert_eq!(info.private_data, pd(b"hello from A", 92));
    let q = fx.p.b.query(b).unwrap();
    assert!(!q.active);
    assert_eq!(q.primary_path, info.primary_path);
    // §4a: RTR and RTS are legal in REQ_RCVD, before the REP is formatted (AL
    // `al_cep_get_rtr_attr` al_cm_cep.c:6482, `_rts_attr` :6555; Linux
    // `cm_init_qp_rtr_attr`): WinVerbs' passive accept reads both before `send_rep`
    // (wv_ep.c:733, 760, 858). The read limits are the REQ's crossed (AL :869, 875).
    let rtr = fx.p.b.qp_attributes(b, QpState::Rtr).unwrap();
    assert_eq!(rtr.dest_qpn, Some(QPN_A));
    assert_eq!(rtr.max_dest_rd_atomic, Some(4), "the REQ's InitiatorDepth");
    let rts = fx.p.b.qp_attributes(b, QpState::Rts).unwrap();
    assert_eq!(rts.max_rd_atomic, Some(4), "the REQ's ResponderResources");
    assert_eq!(fx.p.b.counters().received[slot(AttributeId::Req)], 1);
    fx.finish();
}

#[test]
fn prepare_rep_sends_nothing_until_send_rep() {
    let mut fx = at(Stage::ReqRcvd);
    let (a, b) = (fx.a, fx.b());
    let now = fx.p.now;
    assert_eq!(
        fx.p.b.send_rep(now, b),
        Err(CmError::InvalidState { state: S::ReqRcvd })
    );
    let first = fx.p.b.prepare_rep(b, &rp()).unwrap();
    assert_eq!(first.rtr.dest_qpn, Some(QPN_A));
    assert_state(&fx.p.b, b, S::RepPrepared);
    settle(&mut fx.p);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 0);
    assert_state(&fx.p.a, a, S::ReqSent);
    // It may be re-formatted before it is sent.
    let again = RepParams {
        private_data: b"second thoughts",
        ..rp()
    };
    fx.p.b.prepare_rep(b, &again).unwrap();
    let now = fx.p.now;
    fx.p.b.send_rep(now, b).unwrap();
    assert_state(&fx.p.b, b, S::RepSent);
    assert_eq!(
        fx.p.b.send_rep(now, b),
        Err(CmError::InvalidState { state: S::RepSent })
    );
    assert_eq!(
        fx.p.b.prepare_rep(b, &rp()).map(|_| ()),
        Err(CmError::InvalidState { state: S::RepSent })
    );
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 1);
    settle(&mut fx.p);
    assert_state(&fx.p.a, a, S::RepRcvd);
    let Event::RepReceived(info) = fx.p.events_of(Side::A, a)[0] else {
        panic!()
    };
    assert_eq!(info.private_data, pd(b"second thoughts", 196));
    fx.finish();
}

/// The REP that follows an MRA carries its own private data, wherever the MRA came.
#[test]
fn mra_once_per_message_before_and_after_the_pre_rep() {
    for mra_first in [true, false] {
        let mut fx = at(Stage::ReqRcvd);
        let (a, b) = (fx.a, fx.b());
        if mra_first {
            fx.p.b.mra(b, 12, b"wait").unwrap();
            assert_state(&fx.p.b, b, S::MraReqSent);
            assert_eq!(
                fx.p.b.mra(b, 12, b"wait"),
                Err(CmError::InvalidState {
                    state: S::MraReqSent
                })
            );
            fx.p.b.prepare_rep(b, &rp()).unwrap();
        } else {
            fx.p.b.prepare_rep(b, &rp()).unwrap();
            fx.p.b.mra(b, 12, b"wait").unwrap();
        }
        assert_state(&fx.p.b, b, S::RepPrepared);
        assert_eq!(
            fx.p.b.mra(b, 12, b"wait"),
            Err(CmError::InvalidState {
                state: S::RepPrepared
            })
        );
        assert_sent(&mut fx.p, Side::B, AttributeId::Mra, 1);
        settle(&mut fx.p);
        assert_state(&fx.p.a, a, S::MraReqRcvd);
        let now = fx.p.now;
        fx.p.b.send_rep(now, b).unwrap();
        settle(&mut fx.p);
        assert_events(&mut fx.p, Side::A, a, &[Ev::Mra(12), Ev::Rep]);
        let Event::RepReceived(info) = fx.p.events_of(Side::A, a)[1] else {
            panic!()
        };
        assert_eq!(
            info.private_data,
            pd(b"hello from B", 196),
            "MRA first: {mra_first}"
        );
        fx.p.a.rtu(a, b"").unwrap();
        settle(&mut fx.p);
        assert_states(&fx.p, a, S::Established, b, S::Established);
        fx.finish();
    }
}

#[test]
fn accept_checks_initiator_depth_and_ca_limits() {
    let mut fx = at(Stage::ReqRcvd);
    let b = fx.b();
    let now = fx.p.now;
    // A offered 4 responder resources.
    let over_peer = RepParams {
        initiator_depth: 5,
        ..rp()
    };
    let err = CmError::InitiatorDepthOverPeer {
        requested: 5,
        peer: 4,
    };
    assert_eq!(fx.p.b.accept(now, b, &over_peer).map(|_| ()), Err(err));
    assert_eq!(fx.p.b.prepare_rep(b, &over_peer).map(|_| ()), Err(err));
    // The CA's limit (16) is checked first.
    let over_ca = |field: &'static str| CmError::OutOfRange {
        field,
        value: 17,
        max: 16,
    };
    let rows = [
        (
            RepParams {
                initiator_depth: 17,
                ..rp()
            },
            over_ca("initiator_depth"),
        ),
        (
            RepParams {
                responder_resources: 17,
                ..rp()
            },
            over_ca("responder_resources"),
        ),
    ];
    for (params, err) in rows {
        assert_eq!(fx.p.b.accept(now, b, &params).map(|_| ()), Err(err));
    }
    assert_state(&fx.p.b, b, S::ReqRcvd);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 0);
    // The peer's limit itself is fine.
    let at_peer = RepParams {
        initiator_depth: 4,
        ..rp()
    };
    fx.p.b.accept(now, b, &at_peer).unwrap();
    assert_state(&fx.p.b, b, S::RepSent);
    fx.finish();
}

/// One user operation that takes private data (or ARI) of `len` bytes.
struct PdataRow {
    name: &'static str,
    stage: Stage,
    max: usize,
    /// MADs the operation sends when it succeeds.
    sends: usize,
    op: fn(&mut Fx, &[u8]) -> Result<(), CmError>,
}

#[test]
fn private_data_over_the_maximum_is_too_long_and_sends_nothing() {
    let rows = [
        PdataRow {
            name: "REQ",
            stage: Stage::Idle,
            max: 92,
            sends: 1,
            op: |fx, d| {
                let now = fx.p.now;
                fx.p.a.connect(
                    now,
                    fx.a,
                    &ConnectParams {
                        private_data: d,
                        ..cp()
                    },
                )
            },
        },
        PdataRow {
            name: "REP (pre-REP)",
            stage: Stage::ReqRcvd,
            max: 196,
            sends: 0,
            op: |fx, d| {
                let b = fx.b();
                fx.p.b
                    .prepare_rep(
                        b,
                        &RepParams {
                            private_data: d,
                            ..rp()
                        },
                    )
                    .map(|_| ())
            },
        },
        PdataRow {
            name: "REP (accept)",
            stage: Stage::ReqRcvd,
            max: 196,
            sends: 1,
            op: |fx, d| {
                let (b, now) = (fx.b(), fx.p.now);
                fx.p.b
                    .accept(
                        now,
                        b,
                        &RepParams {
                            private_data: d,
                            ..rp()
                        },
                    )
                    .map(|_| ())
            },
        },
        PdataRow {
            name: "RTU",
            stage: Stage::RepSent,
            max: 224,
            sends: 1,
            op: |fx, d| fx.p.a.rtu(fx.a, d),
        },
        PdataRow {
            name: "DREQ",
            stage: Stage::Established,
            max: 220,
            sends: 1,
            op: |fx, d| {
                let now = fx.p.now;
                fx.p.a.disconnect(now, fx.a, d)
            },
        },
        PdataRow {
            name: "DREP",
            stage: Stage::Dreq,
            max: 224,
            sends: 1,
            op: |fx, d| {
                let (b, now) = (fx.b(), fx.p.now);
                fx.p.b.drep(now, b, d)
            },
        },
        PdataRow {
            name: "MRA",
            stage: Stage::ReqRcvd,
            max: 222,
            sends: 1,
            op: |fx, d| {
                let b = fx.b();
                fx.p.b.mra(b, 10, d)
            },
        },
        PdataRow {
            name: "REJ private data",
            stage: Stage::ReqRcvd,
            max: 148,
            sends: 1,
            op: |fx, d| {
                let (b, now) = (fx.b(), fx.p.now);
                let p = RejectParams {
                    reason: RejReason::ConsumerDefined,
                    ari: &[],
                    private_data: d,
                };
                fx.p.b.reject(now, b, &p)
            },
        },
        PdataRow {
            name: "REJ ARI",
            stage: Stage::ReqRcvd,
            max: 72,
            sends: 1,
            op: |fx, d| {
                let (b, now) = (fx.b(), fx.p.now);
                let p = RejectParams {
                    reason: RejReason::ConsumerDefined,
                    ari: d,
                    private_data: &[],
                };
                fx.p.b.reject(now, b, &p)
            },
        },
    ];
    for row in rows {
        let mut fx = at(row.stage);
        fx.p.flush();
        let states = (fx.p.a.state(fx.a), fx.b.map(|b| fx.p.b.state(b)));
        let sent = fx.p.sent.len();
        let too_long = vec![0x5a; row.max + 1];
        match (row.op)(&mut fx, &too_long) {
            Err(CmError::TooLong { len, max, .. }) => {
                assert_eq!((len, max), (row.max + 1, row.max), "{}", row.name);
            }
            other => panic!("{}: {other:?}", row.name),
        }
        fx.p.flush();
        assert_eq!(fx.p.sent.len(), sent, "{}: sent something", row.name);
        assert_eq!(
            (fx.p.a.state(fx.a), fx.b.map(|b| fx.p.b.state(b))),
            states,
            "{}: state changed",
            row.name
        );
        // The maximum itself fits.
        let fits = vec![0x5a; row.max];
        assert_eq!((row.op)(&mut fx, &fits), Ok(()), "{}", row.name);
        fx.p.flush();
        assert_eq!(fx.p.sent.len(), sent + row.sends, "{}", row.name);
        fx.finish();
    }
}

#[test]
fn out_of_range_values_are_refused() {
    let oor = |field: &'static str, value: u64, max: u64| CmError::OutOfRange { field, value, max };
    let connect_rows = [
        (
            ConnectParams {
                qpn: 0x100_0000,
                ..cp()
            },
            oor("qpn", 0x100_0000, 0xff_ffff),
        ),
        (
            ConnectParams {
                starting_psn: Some(0x100_0000),
                ..cp()
            },
            oor("starting_psn", 0x100_0000, 0xff_ffff),
        ),
        (
            ConnectParams {
                remote_cm_response_timeout: 32,
                ..cp()
            },
            oor("remote_cm_response_timeout", 32, 31),
        ),
        (
            ConnectParams {
                local_cm_response_timeout: 32,
                ..cp()
            },
            oor("local_cm_response_timeout", 32, 31),
        ),
        (
            ConnectParams {
                max_cm_retries: 16,
                ..cp()
            },
            oor("max_cm_retries", 16, 15),
        ),
        (
            ConnectParams {
                retry_count: 8,
                ..cp()
            },
            oor("retry_count", 8, 7),
        ),
        (
            ConnectParams {
                initiator_depth: 17,
                ..cp()
            },
            oor("initiator_depth", 17, 16),
        ),
    ];
    let mut fx = at(Stage::Idle);
    for (params, err) in connect_rows {
        let now = fx.p.now;
        assert_eq!(fx.p.a.connect(now, fx.a, &params), Err(err));
        assert_state(&fx.p.a, fx.a, S::Idle);
    }
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 0);
    fx.finish();

    let mut fx = at(Stage::ReqRcvd);
    let b = fx.b();
    let bad_qpn = RepParams {
        qpn: 0x100_0000,
        ..rp()
    };
    assert_eq!(
        fx.p.b.prepare_rep(b, &bad_qpn).map(|_| ()),
        Err(oor("qpn", 0x100_0000, 0xff_ffff))
    );
    let now = fx.p.now;
    assert_eq!(
        fx.p.b.accept(now, b, &bad_qpn).map(|_| ()),
        Err(oor("qpn", 0x100_0000, 0xff_ffff))
    );
    assert_eq!(fx.p.b.mra(b, 32, b""), Err(oor("service_timeout", 32, 31)));
    assert_state(&fx.p.b, b, S::ReqRcvd);
    fx.p.flush();
    assert_eq!(fx.p.sent.len(), 1, "only the REQ");
    fx.finish();
}

// ---- REJ paths ------------------------------------------------------------------------

#[test]
fn passive_rejects_the_req() {
    let mut fx = at(Stage::ReqRcvd);
    let (a, b) = (fx.a, fx.b());
    let now = fx.p.now;
    let params = RejectParams {
        reason: RejReason::ConsumerDefined,
        ari: &[1, 2],
        private_data: b"not now",
    };
    fx.p.b.reject(now, b, &params).unwrap();
    assert_state(&fx.p.b, b, S::Idle);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rej, 1);
    fx.p.drive();
    // §4a REQ_RCVD + ib_send_cm_rej -> IDLE; REQ_SENT + REJ rcvd -> IDLE. No timewait:
    // neither QP reached RTR.
    assert_states(&fx.p, a, S::Idle, b, S::Idle);
    assert_eq!(
        fx.p.events_of(Side::A, a),
        [rej_event(
            RejReason::ConsumerDefined,
            MessageKind::Req,
            &[1, 2],
            b"not now"
        )]
    );
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req]);
    assert_eq!(fx.p.a.peer_map_entries() + fx.p.b.peer_map_entries(), 0);
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 1);
    fx.finish();
}

#[test]
fn active_rejects_the_rep_and_both_go_through_timewait() {
    let mut fx = at(Stage::RepSent);
    let (a, b) = (fx.a, fx.b());
    let now = fx.p.now;
    let params = RejectParams {
        reason: RejReason::ConsumerDefined,
        ari: &[],
        private_data: b"no",
    };
    fx.p.a.reject(now, a, &params).unwrap();
    // §4b: WinOF al_cep_rej from REP_RCVD -> TIMEWAIT (Linux -> IDLE); our choice follows
    // WinOF because the QP has reached RTR (manager.rs `reject`).
    assert_state(&fx.p.a, a, S::Timewait);
    assert_sent(&mut fx.p, Side::A, AttributeId::Rej, 1);
    settle(&mut fx.p);
    // §4a REP_SENT + REJ rcvd -> IDLE in Linux; ours: a REJ after RTR goes to timewait
    // (manager.rs `on_rej`).
    assert_states(&fx.p, a, S::Timewait, b, S::Timewait);
    assert_eq!(
        fx.p.events_of(Side::B, b)[1],
        rej_event(RejReason::ConsumerDefined, MessageKind::Rep, &[], b"no")
    );
    fx.p.drive();
    assert_states(&fx.p, a, S::Idle, b, S::Idle);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep, Ev::Exit]);
    assert_events(
        &mut fx.p,
        Side::B,
        b,
        &[Ev::Req, Ev::Rej(RejReason::ConsumerDefined), Ev::Exit],
    );
    assert_eq!(
        retries(&fx.p.b, AttributeId::Rep),
        0,
        "the REJ cancelled the REP retries"
    );
    fx.finish();
}

#[test]
fn rej_received_in_req_rcvd_delivers_an_event() {
    // Two ways the active side gives up while B holds the REQ: destroy (Linux
    // `cm_destroy_id`: REJ(Timeout), ARI = its CA GUID) or an explicit REJ.
    for destroy in [true, false] {
        let mut fx = at(Stage::ReqRcvd);
        let (a, b) = (fx.a, fx.b());
        let now = fx.p.now;
        if destroy {
            fx.p.a.destroy(now, a).unwrap();
            assert_eq!(fx.p.a.live_ceps(), 0);
        } else {
            let ari = GUID_A.to_be_bytes();
            let params = RejectParams {
                reason: RejReason::Timeout,
                ari: &ari,
                private_data: &[],
            };
            fx.p.a.reject(now, a, &params).unwrap();
            assert_state(&fx.p.a, a, S::Idle);
        }
        assert_sent(&mut fx.p, Side::A, AttributeId::Rej, 1);
        settle(&mut fx.p);
        // §4b: WinOF REQ_RCVD + REJ -> IDLE with no event; Linux delivers REJ_RECEIVED, and
        // so do we (manager.rs `on_rej`), so the consumer learns before it answers.
        assert_state(&fx.p.b, b, S::Idle);
        assert_eq!(
            fx.p.events_of(Side::B, b)[1..],
            [rej_event(
                RejReason::Timeout,
                MessageKind::Other,
                &GUID_A.to_be_bytes(),
                &[]
            )]
        );
        assert_events(&mut fx.p, Side::A, a, &[]);
        fx.finish();
    }
}

#[test]
fn rej_received_in_mra_req_sent_delivers_an_event() {
    let mut fx = at(Stage::MraReqSent);
    let (a, b) = (fx.a, fx.b());
    let now = fx.p.now;
    fx.p.a.destroy(now, a).unwrap();
    settle(&mut fx.p);
    assert_state(&fx.p.b, b, S::Idle);
    assert_events(
        &mut fx.p,
        Side::B,
        b,
        &[Ev::Req, Ev::Rej(RejReason::Timeout)],
    );
    fx.finish();
}

#[test]
fn no_listener_is_invalid_service_id() {
    let mut p = Pair::new(9);
    // A listen on another service does not match.
    let l = listen_on(&mut p, Pair::listen_params(SID + 1, 16));
    let a = connect_new(&mut p, SID, QPN_A);
    expect_match(&mut p, a, l, SID, false);
    assert_sent(&mut p, Side::B, AttributeId::Rej, 1);
    assert_eq!(p.b.live_ceps(), 1);
    assert_eq!(p.b.counters().received[slot(AttributeId::Req)], 1);
    p.drive();
    assert_sent(&mut p, Side::A, AttributeId::Req, 1);
    assert_no_events(&mut p, Side::B);
    finish(p, &[a], &[l]);
}

// ---- loss ------------------------------------------------------------------------------

#[test]
fn lost_req_k_times_then_success() {
    for k in 1..=3u32 {
        let mut fx = at(Stage::Idle);
        let a = fx.a;
        fx.p.fault(Side::A, AttributeId::Req, k, Fate::Drop);
        let t0 = fx.p.now;
        fx.p.a.connect(t0, a, &cp()).unwrap();
        run_until(&mut fx.p, 4 * REQ_WAIT, |p| p.last_request().is_some());
        assert_eq!(
            ns_since(&fx.p, t0),
            u64::from(k) * REQ_WAIT + LAT,
            "k = {k}"
        );
        assert_eq!(retries(&fx.p.a, AttributeId::Req), u64::from(k));
        assert_sent(&mut fx.p, Side::A, AttributeId::Req, k as usize + 1);
        let b = fx.p.last_request().unwrap();
        fx.p.b.take_request(b).unwrap();
        let now = fx.p.now;
        fx.p.b.accept(now, b, &rp()).unwrap();
        settle(&mut fx.p);
        fx.p.a.rtu(a, b"").unwrap();
        // Long enough for any stray retry.
        fx.p.drive_for(5 * REQ_WAIT);
        assert_states(&fx.p, a, S::Established, b, S::Established);
        assert_events(&mut fx.p, Side::A, a, &[Ev::Rep]);
        assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu]);
        assert_eq!(req_events(&fx.p), 1);
        assert_sent(&mut fx.p, Side::A, AttributeId::Req, k as usize + 1);
        assert_eq!(all_dups(&fx.p.a) + all_dups(&fx.p.b), 0);
        fx.finish();
    }
}

#[test]
fn lost_req_every_time_times_out() {
    let mut fx = at(Stage::Idle);
    let a = fx.a;
    fx.p.fault(Side::A, AttributeId::Req, 4, Fate::Drop);
    let t0 = fx.p.now;
    fx.p.a.connect(t0, a, &cp()).unwrap();
    run_until(&mut fx.p, 5 * REQ_WAIT, |p| !p.events(Side::A).is_empty());
    // MaxCMRetries (3) + 1 sends, each waited out.
    assert_eq!(ns_since(&fx.p, t0), 4 * REQ_WAIT);
    assert_state(&fx.p.a, a, S::Idle);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Timeout(AttributeId::Req)]);
    assert_eq!(retries(&fx.p.a, AttributeId::Req), 3);
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 4);
    // §4b: WinOF sends REJ(Timeout) on a send timeout; so do we. B never saw the REQ.
    assert_sent(&mut fx.p, Side::A, AttributeId::Rej, 1);
    fx.p.drive();
    assert_no_events(&mut fx.p, Side::B);
    assert_eq!(
        fx.p.b.counters().unmatched,
        1,
        "the REJ names nothing B knows"
    );
    assert_eq!(fx.p.b.live_ceps(), 1);
    fx.finish();
}

/// A waits long for the REP (RemoteCMResponseTimeout 20 = 4.3 s), so only B retries.
fn cp_patient() -> ConnectParams<'static> {
    ConnectParams {
        remote_cm_response_timeout: 20,
        ..cp()
    }
}

#[test]
fn lost_rep_k_times_then_success() {
    for k in 1..=3u32 {
        let mut fx = build(Stage::ReqRcvd, &cp_patient(), &rp());
        let (a, b) = (fx.a, fx.b());
        fx.p.fault(Side::B, AttributeId::Rep, k, Fate::Drop);
        let tb = fx.p.now;
        fx.p.b.accept(tb, b, &rp()).unwrap();
        run_until(&mut fx.p, 4 * REP_WAIT, |p| !p.events(Side::A).is_empty());
        assert_eq!(
            ns_since(&fx.p, tb),
            u64::from(k) * REP_WAIT + LAT,
            "k = {k}"
        );
        assert_eq!(retries(&fx.p.b, AttributeId::Rep), u64::from(k));
        assert_sent(&mut fx.p, Side::B, AttributeId::Rep, k as usize + 1);
        assert_sent(&mut fx.p, Side::A, AttributeId::Req, 1);
        fx.p.a.rtu(a, b"").unwrap();
        fx.p.drive_for(2 * REP_WAIT);
        assert_states(&fx.p, a, S::Established, b, S::Established);
        assert_events(&mut fx.p, Side::A, a, &[Ev::Rep]);
        assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu]);
        assert_sent(&mut fx.p, Side::B, AttributeId::Rep, k as usize + 1);
        assert_eq!(all_dups(&fx.p.a) + all_dups(&fx.p.b), 0);
        fx.finish();
    }
}

#[test]
fn lost_rep_every_time_times_out_with_rej_timeout() {
    let mut fx = build(Stage::ReqRcvd, &cp_patient(), &rp());
    let (a, b) = (fx.a, fx.b());
    fx.p.fault(Side::B, AttributeId::Rep, 4, Fate::Drop);
    let tb = fx.p.now;
    fx.p.b.accept(tb, b, &rp()).unwrap();
    run_until(&mut fx.p, 5 * REP_WAIT, |p| p.events(Side::B).len() == 2);
    assert_eq!(ns_since(&fx.p, tb), 4 * REP_WAIT);
    assert_eq!(retries(&fx.p.b, AttributeId::Rep), 3);
    assert_events(
        &mut fx.p,
        Side::B,
        b,
        &[Ev::Req, Ev::Timeout(AttributeId::Rep)],
    );
    // The passive side reached RTR: timewait.
    assert_state(&fx.p.b, b, S::Timewait);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rej, 1);
    settle(&mut fx.p);
    assert_state(&fx.p.a, a, S::Idle);
    assert_eq!(
        fx.p.events_of(Side::A, a),
        [rej_event(
            RejReason::Timeout,
            MessageKind::Other,
            &GUID_B.to_be_bytes(),
            &[]
        )]
    );
    fx.p.drive();
    assert_events(
        &mut fx.p,
        Side::B,
        b,
        &[Ev::Req, Ev::Timeout(AttributeId::Rep), Ev::Exit],
    );
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 1);
    fx.finish();
}

#[test]
fn lost_rtu_is_answered_from_the_cache() {
    for k in 1..=3u32 {
        let mut fx = at(Stage::ReqRcvd);
        let (a, b) = (fx.a, fx.b());
        let tb = fx.p.now;
        fx.p.b.accept(tb, b, &rp()).unwrap();
        settle(&mut fx.p);
        fx.p.fault(Side::A, AttributeId::Rtu, k, Fate::Drop);
        fx.p.a.rtu(a, b"rtu").unwrap();
        run_until(&mut fx.p, 4 * REP_WAIT, |p| {
            p.b.state(b) == Ok(S::Established)
        });
        // Each REP retry is answered with the cached RTU; the k+1-th gets through.
        assert_eq!(
            ns_since(&fx.p, tb),
            u64::from(k) * REP_WAIT + 2 * LAT,
            "k = {k}"
        );
        assert_eq!(retries(&fx.p.b, AttributeId::Rep), u64::from(k));
        assert_eq!(dups(&fx.p.a, AttributeId::Rep), u64::from(k));
        assert_sent(&mut fx.p, Side::A, AttributeId::Rtu, k as usize + 1);
        fx.p.drive_for(2 * REP_WAIT);
        assert_states(&fx.p, a, S::Established, b, S::Established);
        assert_events(&mut fx.p, Side::A, a, &[Ev::Rep]);
        assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu]);
        assert_eq!(
            fx.p.events_of(Side::B, b)[1],
            Event::RtuReceived(pd(b"rtu", 224))
        );
        fx.finish();
    }
}

#[test]
fn lost_dreq_k_times_then_success() {
    for k in 1..=3u32 {
        let mut fx = at(Stage::Established);
        let (a, b) = (fx.a, fx.b());
        fx.p.fault(Side::A, AttributeId::Dreq, k, Fate::Drop);
        let t0 = fx.p.now;
        fx.p.a.disconnect(t0, a, b"bye").unwrap();
        run_until(&mut fx.p, 4 * REQ_WAIT, |p| p.b.state(b) == Ok(S::DreqRcvd));
        assert_eq!(
            ns_since(&fx.p, t0),
            u64::from(k) * REQ_WAIT + LAT,
            "k = {k}"
        );
        assert_eq!(retries(&fx.p.a, AttributeId::Dreq), u64::from(k));
        assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Dreq]);
        let now = fx.p.now;
        fx.p.b.drep(now, b, b"ok").unwrap();
        fx.p.drive();
        assert_events(&mut fx.p, Side::A, a, &[Ev::Rep, Ev::Drep, Ev::Exit]);
        assert_events(
            &mut fx.p,
            Side::B,
            b,
            &[Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit],
        );
        assert_sent(&mut fx.p, Side::A, AttributeId::Dreq, k as usize + 1);
        assert_sent(&mut fx.p, Side::B, AttributeId::Drep, 1);
        assert_eq!(all_dups(&fx.p.a) + all_dups(&fx.p.b), 0);
        fx.finish();
    }
}

#[test]
fn lost_drep_k_times_then_success() {
    for k in 1..=3u32 {
        let mut fx = at(Stage::Established);
        let (a, b) = (fx.a, fx.b());
        fx.p.fault(Side::B, AttributeId::Drep, k, Fate::Drop);
        let t0 = fx.p.now;
        fx.p.a.disconnect(t0, a, b"bye").unwrap();
        settle(&mut fx.p);
        let now = fx.p.now;
        fx.p.b.drep(now, b, b"ok").unwrap();
        run_until(&mut fx.p, 4 * REQ_WAIT, |p| p.events(Side::A).len() == 2);
        // Each DREQ retry is answered with a DREP, in timewait and after it (k >= 2: B's
        // timewait, 3 x 2^15 units, ends as the second retry arrives).
        assert_eq!(
            ns_since(&fx.p, t0),
            u64::from(k) * REQ_WAIT + 2 * LAT,
            "k = {k}"
        );
        assert_eq!(retries(&fx.p.a, AttributeId::Dreq), u64::from(k));
        assert_eq!(dups(&fx.p.b, AttributeId::Dreq), u64::from(k));
        assert_sent(&mut fx.p, Side::B, AttributeId::Drep, k as usize + 1);
        fx.p.drive();
        assert_events(&mut fx.p, Side::A, a, &[Ev::Rep, Ev::Drep, Ev::Exit]);
        assert_events(
            &mut fx.p,
            Side::B,
            b,
            &[Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit],
        );
        assert_eq!(
            fx.p.events_of(Side::A, a)[1],
            Event::DrepReceived(pd(b"ok", 224))
        );
        fx.finish();
    }
}

#[test]
fn lost_dreq_every_time_times_out_into_timewait() {
    let mut fx = at(Stage::Established);
    let (a, b) = (fx.a, fx.b());
    fx.p.fault(Side::A, AttributeId::Dreq, 4, Fate::Drop);
    let t0 = fx.p.now;
    fx.p.a.disconnect(t0, a, b"bye").unwrap();
    run_until(&mut fx.p, 5 * REQ_WAIT, |p| p.events(Side::A).len() == 2);
    assert_eq!(ns_since(&fx.p, t0), 4 * REQ_WAIT);
    assert_events(
        &mut fx.p,
        Side::A,
        a,
        &[Ev::Rep, Ev::Timeout(AttributeId::Dreq)],
    );
    assert_state(&fx.p.a, a, S::Timewait);
    assert_eq!(retries(&fx.p.a, AttributeId::Dreq), 3);
    // B never heard: still established.
    assert_state(&fx.p.b, b, S::Established);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu]);
    // B's own DREQ reaches A in timewait, which answers it (§4a TIMEWAIT + DREQ -> DREP;
    // WinOF pre-formats a DREP on DREQ timeout for this).
    let now = fx.p.now;
    fx.p.b.disconnect(now, b, b"me too").unwrap();
    settle(&mut fx.p);
    assert_eq!(dups(&fx.p.a, AttributeId::Dreq), 1);
    assert_sent(&mut fx.p, Side::A, AttributeId::Drep, 1);
    assert_states(&fx.p, a, S::Timewait, b, S::Timewait);
    fx.p.drive();
    assert_events(
        &mut fx.p,
        Side::A,
        a,
        &[Ev::Rep, Ev::Timeout(AttributeId::Dreq), Ev::Exit],
    );
    assert_events(
        &mut fx.p,
        Side::B,
        b,
        &[Ev::Req, Ev::Rtu, Ev::Drep, Ev::Exit],
    );
    assert_eq!(retries(&fx.p.b, AttributeId::Dreq), 0);
    fx.finish();
}

#[test]
fn dreq_reaching_a_connection_past_timewait_is_answered() {
    // A's DREQ times out (all lost), A's timewait ends, then B disconnects: A's CEP is idle
    // but B still needs its DREP.
    let mut fx = at(Stage::Established);
    let (a, b) = (fx.a, fx.b());
    fx.p.fault(Side::A, AttributeId::Dreq, 4, Fate::Drop);
    let now = fx.p.now;
    fx.p.a.disconnect(now, a, b"").unwrap();
    run_until(&mut fx.p, 6 * REQ_WAIT, |p| p.events(Side::A).len() == 3);
    assert_state(&fx.p.a, a, S::Idle);
    let now = fx.p.now;
    fx.p.b.disconnect(now, b, b"").unwrap();
    settle(&mut fx.p);
    assert_sent(&mut fx.p, Side::A, AttributeId::Drep, 1);
    assert_state(&fx.p.b, b, S::Timewait);
    fx.p.drive();
    assert_events(
        &mut fx.p,
        Side::B,
        b,
        &[Ev::Req, Ev::Rtu, Ev::Drep, Ev::Exit],
    );
    assert_state(&fx.p.a, a, S::Idle);
    fx.finish();
}

// ---- MRA ------------------------------------------------------------------------------

#[test]
fn mra_extends_the_req_timeout_once() {
    let mut fx = at(Stage::ReqRcvd);
    let (a, b) = (fx.a, fx.b());
    let t0 = fx.p.now;
    fx.p.b.mra(b, 20, b"busy").unwrap();
    settle(&mut fx.p);
    assert_states(&fx.p, a, S::MraReqRcvd, b, S::MraReqSent);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Mra(20)]);
    // IBA 12.6.6: the next REQ waits ServiceTimeout + one packet life time (A's: 14) from
    // the MRA's arrival, instead of REQ_WAIT from the send.
    let retry_at = t0.add_nanos(LAT + ib(20) + ib(14));
    const { assert!(ib(20) > 4 * REQ_WAIT) };
    run_to(&mut fx.p, just_before(retry_at));
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 1);
    run_to(&mut fx.p, retry_at);
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 2);
    // B answers the repeated REQ with its MRA again; A takes it as a duplicate: no second
    // event and no second extension (Linux "apply MRA only once").
    settle(&mut fx.p);
    assert_sent(&mut fx.p, Side::B, AttributeId::Mra, 2);
    assert_eq!(dups(&fx.p.b, AttributeId::Req), 1);
    assert_eq!(dups(&fx.p.a, AttributeId::Mra), 1);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Mra(20)]);
    let next = retry_at.add_nanos(REQ_WAIT);
    run_to(&mut fx.p, just_before(next));
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 2);
    run_to(&mut fx.p, next);
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 3);
    // B accepts before A gives up.
    settle(&mut fx.p);
    let now = fx.p.now;
    fx.p.b.accept(now, b, &rp()).unwrap();
    settle(&mut fx.p);
    fx.p.a.rtu(a, b"").unwrap();
    fx.p.drive_for(5 * REQ_WAIT);
    assert_states(&fx.p, a, S::Established, b, S::Established);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Mra(20), Ev::Rep]);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu]);
    assert_eq!(req_events(&fx.p), 1);
    fx.finish();
}

#[test]
fn mra_for_the_rep_extends_the_rep_timeout() {
    let mut fx = at(Stage::ReqRcvd);
    let (a, b) = (fx.a, fx.b());
    let tb = fx.p.now;
    fx.p.b.accept(tb, b, &rp()).unwrap();
    settle(&mut fx.p);
    fx.p.a.mra(a, 18, b"hold on").unwrap();
    assert_state(&fx.p.a, a, S::MraRepSent);
    assert_eq!(
        fx.p.a.mra(a, 18, b""),
        Err(CmError::InvalidState {
            state: S::MraRepSent
        })
    );
    let t_mra = fx.p.now;
    settle(&mut fx.p);
    assert_states(&fx.p, a, S::MraRepSent, b, S::MraRepRcvd);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Mra(18)]);
    // B's next REP waits ServiceTimeout + its packet life time (15).
    let retry_at = t_mra.add_nanos(LAT + ib(18) + ib(15));
    assert!(retry_at > tb.add_nanos(REP_WAIT));
    run_to(&mut fx.p, just_before(retry_at));
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 1);
    run_to(&mut fx.p, retry_at);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 2);
    // §4a MRA_REP_SENT + dup REP -> re-send MRA; the second MRA extends nothing.
    settle(&mut fx.p);
    assert_sent(&mut fx.p, Side::A, AttributeId::Mra, 2);
    assert_eq!(dups(&fx.p.a, AttributeId::Rep), 1);
    assert_eq!(dups(&fx.p.b, AttributeId::Mra), 1);
    fx.p.a.rtu(a, b"").unwrap();
    settle(&mut fx.p);
    // §4a MRA_REP_RCVD + RTU -> ESTABLISHED.
    assert_states(&fx.p, a, S::Established, b, S::Established);
    fx.p.drive_for(5 * REP_WAIT);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep]);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Mra(18), Ev::Rtu]);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 2);
    fx.finish();
}

// ---- duplicates -------------------------------------------------------------------------

#[test]
fn duplicated_messages_give_one_event_each() {
    let rows = [
        (Side::A, AttributeId::Req),
        (Side::B, AttributeId::Rep),
        (Side::A, AttributeId::Rtu),
        (Side::A, AttributeId::Dreq),
        (Side::B, AttributeId::Drep),
    ];
    for (from, attr) in rows {
        let mut p = Pair::new(11);
        p.fault(from, attr, 1, Fate::Duplicate);
        let (a, b) = p.establish(SID);
        let now = p.now;
        p.a.disconnect(now, a, b"").unwrap();
        settle(&mut p);
        let now = p.now;
        p.b.drep(now, b, b"").unwrap();
        p.drive();
        assert_states(&p, a, S::Idle, b, S::Idle);
        assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Drep, Ev::Exit]);
        assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit]);
        assert_eq!(req_events(&p), 1);
        let receiver = match from.peer() {
            Side::A => &p.a,
            Side::B => &p.b,
        };
        assert_eq!(dups(receiver, attr), 1, "{attr:?}");
        assert_eq!(all_dups(&p.a) + all_dups(&p.b), 1, "{attr:?}");
        // Nothing answered the duplicate.
        for (side, sent) in [
            (Side::A, AttributeId::Req),
            (Side::B, AttributeId::Rep),
            (Side::A, AttributeId::Rtu),
            (Side::A, AttributeId::Dreq),
            (Side::B, AttributeId::Drep),
        ] {
            assert_sent(&mut p, side, sent, 1);
        }
        assert_eq!(p.sent.len(), 5, "{attr:?}: {:?}", p.sent);
        finish(p, &[a], &[b]);
    }
}

#[test]
fn duplicate_req_in_mra_req_sent_resends_the_mra() {
    let mut fx = at(Stage::ReqRcvd);
    let (a, b) = (fx.a, fx.b());
    fx.p.fault(Side::B, AttributeId::Mra, 1, Fate::Drop);
    fx.p.b.mra(b, 20, b"busy").unwrap();
    settle(&mut fx.p);
    assert_events(&mut fx.p, Side::A, a, &[]);
    // A's REQ retry finds B in MRA_REQ_SENT (§4a: re-send MRA).
    run_until(&mut fx.p, 2 * REQ_WAIT, |p| {
        p.sent_count(Side::B, AttributeId::Mra) == 2
    });
    assert_eq!(dups(&fx.p.b, AttributeId::Req), 1);
    // The repeat is counted as sent, as the first (Linux `cm_dup_req_handler` ->
    // `cm_send_mra` sends it as any other MRA).
    assert_eq!(fx.p.b.counters().sent[slot(AttributeId::Mra)], 2);
    settle(&mut fx.p);
    assert_state(&fx.p.a, a, S::MraReqRcvd);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Mra(20)]);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req]);
    fx.finish();
}

#[test]
fn duplicate_req_in_rep_sent_resends_the_rep() {
    let mut fx = at(Stage::ReqRcvd);
    let (a, b) = (fx.a, fx.b());
    fx.p.fault(Side::B, AttributeId::Rep, 1, Fate::Drop);
    // The REQ arrived LAT after A sent it.
    let tb = fx.p.now;
    fx.p.b.accept(tb, b, &rp()).unwrap();
    // A's REQ retry (REQ_WAIT after its send, earlier than B's REP retry) fetches the REP.
    const { assert!(REQ_WAIT < REP_WAIT) };
    run_until(&mut fx.p, 2 * REQ_WAIT, |p| !p.events(Side::A).is_empty());
    assert_eq!(ns_since(&fx.p, tb), REQ_WAIT + LAT);
    assert_eq!(dups(&fx.p.b, AttributeId::Req), 1);
    assert_eq!(retries(&fx.p.b, AttributeId::Rep), 0);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 2);
    fx.p.a.rtu(a, b"").unwrap();
    fx.p.drive_for(2 * REP_WAIT);
    assert_states(&fx.p, a, S::Established, b, S::Established);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep]);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu]);
    fx.finish();
}

// ---- stale connections ------------------------------------------------------------------

#[test]
fn stale_qpn_reused_during_timewait() {
    let mut fx = at(Stage::Timewait);
    let (a1, b1) = (fx.a, fx.b());
    // A reuses QPN_A from a new CEP (new comm ID) while B still waits out the old one.
    let a2 = connect_new(&mut fx.p, SID, QPN_A);
    settle(&mut fx.p);
    // IBA 12.9.8.3.2: B refuses with REJ(StaleConn) and creates nothing.
    assert_eq!(req_events(&fx.p), 1);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rej, 1);
    assert_eq!(fx.p.b.live_ceps(), 2);
    assert_eq!(
        fx.p.events_of(Side::A, a2),
        [rej_event(RejReason::StaleConn, MessageKind::Req, &[], &[])]
    );
    // A stale REJ quarantines the QPN: the newcomer goes through timewait (§4a REJ rcvd
    // -> TIMEWAIT if reason = STALE_CONN).
    assert_state(&fx.p.a, a2, S::Timewait);
    // The old connection is unaffected.
    assert_states(&fx.p, a1, S::Timewait, b1, S::Timewait);
    fx.p.drive();
    assert_events(
        &mut fx.p,
        Side::A,
        a2,
        &[Ev::Rej(RejReason::StaleConn), Ev::Exit],
    );
    assert_events(&mut fx.p, Side::A, a1, &[Ev::Rep, Ev::Drep, Ev::Exit]);
    assert_events(
        &mut fx.p,
        Side::B,
        b1,
        &[Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit],
    );
    // After timewait the QPN is free again.
    let a3 = connect_new(&mut fx.p, SID, QPN_A);
    settle(&mut fx.p);
    assert_eq!(req_events(&fx.p), 2);
    assert_state(&fx.p.a, a3, S::ReqSent);
    finish(fx.p, &[a1, a2, a3], &[b1, fx.l]);
}

#[test]
fn stale_req_reusing_a_live_qpn_ends_both_connections() {
    let mut fx = at(Stage::Established);
    let (a1, b1) = (fx.a, fx.b());
    let a2 = connect_new(&mut fx.p, SID, QPN_A);
    settle(&mut fx.p);
    // The newcomer is refused...
    assert_eq!(req_events(&fx.p), 1);
    assert_eq!(
        fx.p.events_of(Side::A, a2),
        [rej_event(RejReason::StaleConn, MessageKind::Req, &[], &[])]
    );
    assert_state(&fx.p.a, a2, S::Timewait);
    // ... and the old connection is disconnected (IBA 12.9.8.3.1; Linux `cm_match_req`
    // -> `ib_send_cm_dreq`): B's only REJ is the newcomer's; the old one gets a DREQ.
    assert_sent(&mut fx.p, Side::B, AttributeId::Rej, 1);
    assert_sent(&mut fx.p, Side::B, AttributeId::Dreq, 1);
    assert_states(&fx.p, a1, S::DreqRcvd, b1, S::DreqSent);
    assert_events(&mut fx.p, Side::A, a1, &[Ev::Rep, Ev::Dreq]);
    let now = fx.p.now;
    fx.p.a.drep(now, a1, b"").unwrap();
    fx.p.drive();
    let stale = Ev::Rej(RejReason::StaleConn);
    assert_events(&mut fx.p, Side::A, a1, &[Ev::Rep, Ev::Dreq, Ev::Exit]);
    assert_events(&mut fx.p, Side::A, a2, &[stale, Ev::Exit]);
    assert_events(
        &mut fx.p,
        Side::B,
        b1,
        &[Ev::Req, Ev::Rtu, Ev::Drep, Ev::Exit],
    );
    finish(fx.p, &[a1, a2], &[b1, fx.l]);
}

#[test]
fn stale_rep_reusing_a_live_qpn_is_refused() {
    let mut fx = at(Stage::Established);
    let (a1, b1) = (fx.a, fx.b());
    // A second connection on a new QPN; B answers with the QPN of the first.
    let a2 = connect_new(&mut fx.p, SID, 0x33);
    settle(&mut fx.p);
    let b2 = fx.p.last_request().unwrap();
    assert_ne!(b2, b1);
    fx.p.b.take_request(b2).unwrap();
    let now = fx.p.now;
    fx.p.b.accept(now, b2, &rp()).unwrap();
    settle(&mut fx.p);
    // §4a REP rcvd with a QPN collision: REJ(StaleConn) to the sender, and the old
    // connection is ended. Ours fails the attempt with an event (Linux drops it silently).
    assert_state(&fx.p.a, a2, S::Idle);
    assert_eq!(
        fx.p.events_of(Side::A, a2),
        [local_rej(RejReason::StaleConn, MessageKind::Rep)]
    );
    // A's only REJ is the newcomer's; the old connection gets a DREQ (Linux
    // `cm_rep_handler` -> `ib_send_cm_dreq`).
    assert_sent(&mut fx.p, Side::A, AttributeId::Rej, 1);
    assert_sent(&mut fx.p, Side::A, AttributeId::Dreq, 1);
    // B's new CEP hears of it and goes to timewait (its QP reached RTR).
    assert_state(&fx.p.b, b2, S::Timewait);
    assert_events(
        &mut fx.p,
        Side::B,
        b2,
        &[Ev::Req, Ev::Rej(RejReason::StaleConn)],
    );
    // The old connection is disconnected.
    assert_states(&fx.p, a1, S::DreqSent, b1, S::DreqRcvd);
    let now = fx.p.now;
    fx.p.b.drep(now, b1, b"").unwrap();
    fx.p.drive();
    let stale = Ev::Rej(RejReason::StaleConn);
    assert_events(&mut fx.p, Side::A, a1, &[Ev::Rep, Ev::Drep, Ev::Exit]);
    assert_events(&mut fx.p, Side::A, a2, &[stale]);
    assert_events(
        &mut fx.p,
        Side::B,
        b1,
        &[Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit],
    );
    assert_events(&mut fx.p, Side::B, b2, &[Ev::Req, stale, Ev::Exit]);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 2);
    finish(fx.p, &[a1, a2], &[b1, b2, fx.l]);
}

// ---- teardown ----------------------------------------------------------------------------

#[test]
fn simultaneous_dreq() {
    let mut fx = at(Stage::Established);
    let (a, b) = (fx.a, fx.b());
    let now = fx.p.now;
    fx.p.a.disconnect(now, a, b"a").unwrap();
    fx.p.b.disconnect(now, b, b"b").unwrap();
    settle(&mut fx.p);
    // §4a DREQ_SENT + DREQ rcvd -> DREQ_RCVD, on both sides.
    assert_states(&fx.p, a, S::DreqRcvd, b, S::DreqRcvd);
    assert_eq!(
        fx.p.events_of(Side::A, a)[1],
        Event::DreqReceived(pd(b"b", 220))
    );
    assert_eq!(
        fx.p.events_of(Side::B, b)[2],
        Event::DreqReceived(pd(b"a", 220))
    );
    let now = fx.p.now;
    fx.p.a.drep(now, a, b"").unwrap();
    fx.p.b.drep(now, b, b"").unwrap();
    settle(&mut fx.p);
    assert_states(&fx.p, a, S::Timewait, b, S::Timewait);
    // Each DREP finds its receiver already in timewait.
    assert_eq!(dups(&fx.p.a, AttributeId::Drep), 1);
    assert_eq!(dups(&fx.p.b, AttributeId::Drep), 1);
    fx.p.drive();
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep, Ev::Dreq, Ev::Exit]);
    assert_events(
        &mut fx.p,
        Side::B,
        b,
        &[Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit],
    );
    assert_eq!(
        retries(&fx.p.a, AttributeId::Dreq) + retries(&fx.p.b, AttributeId::Dreq),
        0
    );
    fx.finish();
}

fn inject(p: &mut Pair, to: Side, message: CmMessage<'_>) {
    let mut mad = [0u8; MAD_SIZE];
    CmMad {
        header: MadHeader::send(0x77),
        message,
    }
    .emit(&mut mad)
    .unwrap();
    let lid = match to {
        Side::A => 2,
        Side::B => 1,
    };
    let src = MadAddress {
        port: 1,
        lid,
        gid: [0; 16],
        grh: false,
        sl: 0,
        pkey: 0xffff,
    };
    let now = p.now;
    p.node(to).handle_mad(now, &src, &mad);
    p.flush();
}

#[test]
fn unaffiliated_dreq_gets_a_drep_and_changes_nothing() {
    let mut fx = at(Stage::Established);
    let (a, b) = (fx.a, fx.b());
    let (ida, idb) = (fx.p.a.local_comm_id(a), fx.p.b.local_comm_id(b));
    let rows = [
        ("wrong remote QPN", ida, idb, QPN_B + 1),
        ("unknown comm ID", ida, idb ^ 0x5a5a_0000, QPN_B),
        ("wrong sender comm ID", ida ^ 1, idb, QPN_B),
    ];
    for (i, (name, local, remote, qpn)) in rows.into_iter().enumerate() {
        let dreq = Dreq {
            local_comm_id: local,
            remote_comm_id: remote,
            remote_qpn_eecn: qpn,
            private_data: &[],
        };
        inject(&mut fx.p, Side::B, CmMessage::Dreq(dreq));
        // IBA 12.9.8.5 / WinOF: a DREQ must match the comm IDs and the QPN, else an
        // unaffiliated DREP answers it.
        assert_sent(&mut fx.p, Side::B, AttributeId::Drep, i + 1);
        settle(&mut fx.p);
        assert_states(&fx.p, a, S::Established, b, S::Established);
        assert_events(&mut fx.p, Side::A, a, &[Ev::Rep]);
        assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu]);
        assert_eq!(
            fx.p.b.counters().received[slot(AttributeId::Dreq)],
            i as u64 + 1,
            "{name}"
        );
    }
    // The DREP naming A's CEP is a duplicate there; the others name nothing A knows.
    assert_eq!(dups(&fx.p.a, AttributeId::Drep), 1);
    assert_eq!(fx.p.a.counters().unmatched, 2);
    fx.finish();
}

#[test]
fn dreq_in_rep_sent_means_the_rtu_was_lost() {
    let mut fx = at(Stage::ReqRcvd);
    let (a, b) = (fx.a, fx.b());
    fx.p.fault(Side::A, AttributeId::Rtu, 1, Fate::Drop);
    let now = fx.p.now;
    fx.p.b.accept(now, b, &rp()).unwrap();
    settle(&mut fx.p);
    fx.p.a.rtu(a, b"").unwrap();
    settle(&mut fx.p);
    assert_states(&fx.p, a, S::Established, b, S::RepSent);
    let now = fx.p.now;
    fx.p.a.disconnect(now, a, b"bye").unwrap();
    settle(&mut fx.p);
    // §4a REP_SENT + DREQ (QPN ok) -> DREQ_RCVD, REP retries cancelled.
    assert_state(&fx.p.b, b, S::DreqRcvd);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Dreq]);
    let now = fx.p.now;
    fx.p.b.drep(now, b, b"").unwrap();
    fx.p.drive();
    assert_eq!(retries(&fx.p.b, AttributeId::Rep), 0);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 1);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep, Ev::Drep, Ev::Exit]);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Dreq, Ev::Exit]);
    fx.finish();
}

#[test]
fn timewait_lasts_two_packet_lives_plus_the_ack_delay() {
    let mut fx = at(Stage::Dreq);
    let (a, b) = (fx.a, fx.b());
    let t1 = fx.p.now;
    fx.p.b.drep(t1, b, b"").unwrap();
    assert_eq!(fx.p.b.query(b).unwrap().timewait_ns, TW_B);
    settle(&mut fx.p);
    assert_eq!(fx.p.a.query(a).unwrap().timewait_ns, TW_A);
    const { assert!(TW_A < TW_B) };
    // A entered timewait when the DREP arrived.
    let exit_a = t1.add_nanos(LAT + TW_A);
    let exit_b = t1.add_nanos(TW_B);
    run_to(&mut fx.p, just_before(exit_a));
    assert_states(&fx.p, a, S::Timewait, b, S::Timewait);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep, Ev::Drep]);
    run_to(&mut fx.p, exit_a);
    assert_state(&fx.p.a, a, S::Idle);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep, Ev::Drep, Ev::Exit]);
    run_to(&mut fx.p, just_before(exit_b));
    assert_state(&fx.p.b, b, S::Timewait);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Dreq]);
    run_to(&mut fx.p, exit_b);
    assert_state(&fx.p.b, b, S::Idle);
    assert_events(
        &mut fx.p,
        Side::B,
        b,
        &[Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit],
    );
    // An idle CEP after timewait has forgotten its peer.
    assert_eq!(fx.p.a.peer_map_entries() + fx.p.b.peer_map_entries(), 0);
    fx.finish();
}

// ---- backlog --------------------------------------------------------------------------

/// A REQ past the backlog is held, not dropped (held.rs): the backlog counts REQs
/// reported and not answered, so reading one (take_request) makes no room, answering
/// it does, and the held REQ is reported at once, its sender never retrying. Before, a
/// REQ left the backlog when its event was read, and one past it was dropped silently
/// for its sender's retry to find room.
#[test]
fn req_past_the_backlog_is_held_until_an_answer_makes_room() {
    let mut p = Pair::new(12);
    let l = listen_on(&mut p, Pair::listen_params(SID, 2));
    let ceps: Vec<CepId> = (0..3)
        .map(|i| connect_new(&mut p, SID, QPN_A + i))
        .collect();
    settle(&mut p);
    assert_eq!(req_events(&p), 2);
    assert_eq!(p.b.counters().backlog_drops, 0);
    assert_sent(&mut p, Side::B, AttributeId::Rej, 0);
    assert_eq!(p.b.live_ceps(), 4, "the held REQ has its CEP");
    for &a in &ceps {
        assert_state(&p.a, a, S::ReqSent);
    }
    // Reading one makes no room.
    let first = p.events(Side::B)[0].0;
    p.b.take_request(first).unwrap();
    settle(&mut p);
    assert_eq!(req_events(&p), 2);
    // Answering it does: the third is reported at once.
    let now = p.now;
    p.b.accept(now, first, &rp()).unwrap();
    p.flush();
    assert_eq!(req_events(&p), 3);
    let third = p.last_request().unwrap();
    let Event::ReqReceived(info) = p.events_of(Side::B, third)[0] else {
        panic!()
    };
    assert_eq!(info.remote_qpn, QPN_A + 2);
    assert_eq!(retries(&p.a, AttributeId::Req), 0);
    assert_sent(&mut p, Side::B, AttributeId::Rej, 0);
    let cleanup: Vec<CepId> = p
        .events(Side::B)
        .iter()
        .map(|(c, _)| *c)
        .chain([l])
        .collect();
    finish(p, &ceps, &cleanup);
}

/// A REQ held behind the backlog whose sender gives up before it is reported (its
/// destroy sends a REJ): nothing on the passive side names the CEP nobody was told of,
/// and the CEP is freed. The fuzz smoke found both on the merged held REQs: an event on
/// an unknown CEP (a stale connection ending it), and a CEP left after every handle
/// closed.
#[test]
fn a_held_req_that_ends_unreported_leaves_nothing() {
    let mut p = Pair::new(19);
    let l = listen_on(&mut p, Pair::listen_params(SID, 2));
    let ceps: Vec<CepId> = (0..3)
        .map(|i| connect_new(&mut p, SID, QPN_A + i))
        .collect();
    settle(&mut p);
    assert_eq!(req_events(&p), 2);
    assert_eq!(p.b.live_ceps(), 4, "the held REQ has its CEP");
    let told = p.events(Side::B).len();
    let now = p.now;
    p.a.destroy(now, ceps[2]).unwrap();
    settle(&mut p);
    assert_eq!(
        p.events(Side::B)[told..],
        [],
        "no event names a REQ never reported"
    );
    assert_eq!(p.b.live_ceps(), 3, "its CEP is freed");
    let cleanup: Vec<CepId> = p
        .events(Side::B)
        .iter()
        .map(|(c, _)| *c)
        .chain([l])
        .collect();
    finish(p, &ceps[..2], &cleanup);
}

/// A storm through a small backlog (held.rs): 2000 clients at once, backlog 64, the
/// application answering one REQ a millisecond (2 s for all, past the senders' retry
/// budget of 1.6 s). At no time are more than 64 REQs reported and unanswered, however
/// eagerly the events are read; every connection is made in N/R, and no REQ is re-sent
/// (the held ones wait on the manager's MRAs). Before, REQs past the 64 were dropped,
/// and those waiting past the retry budget failed.
#[test]
fn storm_through_a_small_backlog_holds_at_most_the_backlog_reported() {
    const N: u32 = 2000;
    const BACKLOG: usize = 64;
    let mut p = Pair::new(17);
    let l = listen_on(&mut p, Pair::listen_params(SID, BACKLOG as u32));
    let ceps: Vec<CepId> = (0..N)
        .map(|i| connect_new(&mut p, SID, QPN_A + i))
        .collect();
    let t0 = p.now;
    let mut answered = 0usize;
    let mut peak = 0usize;
    // Bounded: before held.rs REQs past the backlog were lost and the loop would not end.
    while answered < N as usize && ns_since(&p, t0) < 10_000 * MS {
        let next = p.now.add_nanos(MS);
        run_to(&mut p, next);
        let reported = reported_reqs(&p);
        peak = peak.max(reported.len() - answered);
        assert!(
            reported.len() - answered <= BACKLOG,
            "{} reported unanswered",
            reported.len() - answered
        );
        if let Some(&b) = reported.get(answered) {
            take_and_accept(&mut p, b, answered);
            answered += 1;
        }
    }
    settle(&mut p);
    assert_eq!(peak, BACKLOG);
    for &a in &ceps {
        assert_state(&p.a, a, S::RepRcvd);
    }
    // N/R = 2 s, and a step of the loop per answer.
    assert!(ns_since(&p, t0) < 2_100 * MS, "{} ns", ns_since(&p, t0));
    assert_eq!(retries(&p.a, AttributeId::Req), 0);
    assert_eq!(p.b.counters().backlog_drops, 0);
    assert_sent(&mut p, Side::B, AttributeId::Rej, 0);
    for &a in &ceps {
        p.a.rtu(a, b"").unwrap();
    }
    finish(p, &ceps, &[l]);
}

/// After a storm through a small backlog the server's room goes back at the next
/// PASSIVE_LEVEL pass (`prepare_for`, which the dispatch layer runs at every IOCTL and
/// after a timer pass that asks for it), its listen still up: the slab room past its last
/// slot used that the held REQs' headroom reserved and no CEP took, and the MAD queue's
/// room for the MRAs sent in one pass. Before, a trim gave back only vacant slab chunks
/// below the last slot used and nothing of the queues (a 10^5 storm left 9.7 MB of slab
/// and 6.2 MB of queues on the server).
#[test]
fn a_storms_room_goes_back_once_its_connections_end() {
    const N: u32 = 2000;
    let mut p = Pair::new(18);
    let l = listen_on(&mut p, Pair::listen_params(SID, 64));
    p.b.prepare_for(64).unwrap();
    let before = p.b.memory();
    let ceps: Vec<CepId> = (0..N)
        .map(|i| connect_new(&mut p, SID, QPN_A + i))
        .collect();
    let t0 = p.now;
    let mut answered = 0usize;
    let mut peak = before;
    while answered < N as usize && ns_since(&p, t0) < 10_000 * MS {
        let next = p.now.add_nanos(MS);
        run_to(&mut p, next);
        p.b.prepare_for(64).unwrap();
        let m = p.b.memory();
        peak.slab = peak.slab.max(m.slab);
        peak.queues = peak.queues.max(m.queues);
        let reported = reported_reqs(&p);
        if let Some(&b) = reported.get(answered) {
            take_and_accept(&mut p, b, answered);
            answered += 1;
        }
    }
    settle(&mut p);
    let now = p.now;
    for &a in &ceps {
        p.a.rtu(a, b"").unwrap();
        p.a.destroy(now, a).unwrap();
    }
    for (c, e) in p.events(Side::B).to_vec() {
        if matches!(e, Event::ReqReceived(_)) {
            let _ = p.b.destroy(now, c);
        }
    }
    p.drive();
    assert_eq!(p.b.live_ceps(), 1, "the listen is left");
    p.b.prepare_for(64).unwrap();
    let after = p.b.memory();
    assert!(peak.slab > before.slab + 500_000, "the storm grew the slab");
    // Most of what the storm made goes (the slab keeps its slack of 16 chunks anyway).
    // Before: 551 KB of slab and 2.28 MB of queues were left (of 1.01 and 2.64 MB).
    assert!(
        after.slab - before.slab <= (peak.slab - before.slab) / 4,
        "slab: {} B after, {} before, {} at the peak",
        after.slab,
        before.slab,
        peak.slab
    );
    assert!(
        after.queues - before.queues <= (peak.queues - before.queues) / 2,
        "queues: {} B after, {} before, {} at the peak",
        after.queues,
        before.queues,
        peak.queues
    );
    finish(p, &ceps, &[l]);
}

/// The kernel-client wrapper's pattern (driver/endpoint device/client.rs
/// `client_downcall`: before each downcall, `reserve(2 * (live + 1))` when the room is
/// short of `live + 1`) up to a peak of CEPs, all destroyed: the trims that follow give
/// the peak's room back, as for user endpoints; `reserve`'s claim follows the live need.
#[test]
fn a_kernel_clients_peak_room_goes_back_once_its_ceps_end() {
    const N: usize = 20_000;
    let mut p = Pair::new(19);
    p.b.set_fixed_room(true);
    p.b.prepare_for(0).unwrap();
    let before = p.b.memory();
    let mut ceps = Vec::with_capacity(N);
    for _ in 0..N {
        let live = p.b.live_ceps();
        if p.b.room() < live + 1 {
            p.b.reserve(2 * (live + 1)).unwrap();
        }
        ceps.push(p.b.create().unwrap());
    }
    let peak = p.b.memory();
    let now = p.now;
    for c in ceps {
        p.b.destroy(now, c).unwrap();
    }
    p.drive();
    assert_eq!(p.b.live_ceps(), 0);
    for _ in 0..3 {
        p.b.prepare_for(0).unwrap();
    }
    let after = p.b.memory();
    assert!(
        peak.slab > before.slab + 4_000_000,
        "the peak grew the slab"
    );
    // Before: nothing went back (slab 108.4 of 108.5 MB at 2 x 10^5).
    for (part, b, pk, a) in [
        ("slab", before.slab, peak.slab, after.slab),
        ("lookups", before.lookups, peak.lookups, after.lookups),
        ("timers", before.timers, peak.timers, after.timers),
    ] {
        assert!(
            a.saturating_sub(b) <= pk.saturating_sub(b) / 4,
            "{part}: {a} B after, {b} before, {pk} at the peak"
        );
    }
}

/// A flood past the backlog and the cap of REQs held behind it (held.rs): the backlog's
/// 8 are reported, the cap's 100 held, every other refused at once with REJ(NoResources)
/// (IBA 12.6.7.2 Table 112 reason 3) before a CEP is taken, so the flood costs the
/// server at most backlog + cap CEPs; the held ones are all reported and connect as
/// answers make room.
#[test]
fn flood_past_the_cap_is_refused_at_once() {
    let mut b_cfg = CmConfig::new(GUID_B, [15; 32]);
    b_cfg.held_requests_per_listen = 100;
    let mut p = Pair::with_config(CmConfig::new(GUID_A, [14; 32]), b_cfg);
    let l = listen_on(&mut p, Pair::listen_params(SID, 8));
    let ceps: Vec<CepId> = (0..300)
        .map(|i| connect_new(&mut p, SID, QPN_A + i))
        .collect();
    settle(&mut p);
    assert_eq!(req_events(&p), 8);
    assert_eq!(p.b.live_ceps(), 1 + 8 + 100);
    let refused: Vec<CepId> = ceps
        .iter()
        .copied()
        .filter(|&a| {
            p.events_of(Side::A, a)
                == [rej_event(
                    RejReason::NoResources,
                    MessageKind::Req,
                    &[],
                    &[],
                )]
        })
        .collect();
    assert_eq!(refused.len(), 192);
    assert_eq!(p.b.counters().backlog_drops, 192);
    // Answers make room: every held REQ is reported and connects.
    let mut answered = 0usize;
    while answered < 108 {
        let reported = reported_reqs(&p);
        let b = reported[answered];
        let now = p.now;
        p.b.accept(now, b, &Pair::rep_params(QPN_B + answered as u32))
            .unwrap();
        answered += 1;
        p.flush();
    }
    settle(&mut p);
    let connected = ceps
        .iter()
        .filter(|&&a| p.a.state(a) == Ok(S::RepRcvd))
        .count();
    assert_eq!(connected, 108);
    assert_eq!(retries(&p.a, AttributeId::Req), 0);
    finish(p, &ceps, &[l]);
}

/// A REQ its application leaves unanswered past half the sender's response timeout
/// gets an MRA (IBA 12.6.6) whose ServiceTimeout covers the wait; the sender waits
/// instead of retrying (it honours one MRA: Linux `cm_mra_handler`, WinOF
/// `__mra_handler` al_cm_cep.c:1375-1379), and the late REP still connects. Before
/// waiting.rs the REQ was re-sent every response timeout.
#[test]
fn unanswered_req_gets_an_mra_and_its_sender_waits() {
    let mut p = Pair::new(13);
    let l = listen_on(&mut p, Pair::listen_params(SID, 8));
    let a = connect_new(&mut p, SID, QPN_A);
    settle(&mut p);
    assert_eq!(req_events(&p), 1);
    let b = p.last_request().unwrap();
    p.b.take_request(b).unwrap();
    // The application thinks for three of the sender's retry intervals.
    let think = 3 * REQ_WAIT;
    p.drive_for(think);
    assert_eq!(p.b.counters().sent[slot(AttributeId::Mra)], 1);
    assert_state(&p.b, b, S::MraReqSent);
    assert_state(&p.a, a, S::MraReqRcvd);
    assert_eq!(retries(&p.a, AttributeId::Req), 0);
    let now = p.now;
    p.b.accept(now, b, &rp()).unwrap();
    settle(&mut p);
    assert_state(&p.a, a, S::RepRcvd);
    assert_eq!(retries(&p.a, AttributeId::Req), 0);
    assert_eq!(p.b.counters().duplicates[slot(AttributeId::Req)], 0);
    let cleanup = [b, l];
    finish(p, &[a], &cleanup);
}

/// A REQ answered before its MRA timer is due takes no second timer entry: the MRA
/// timer becomes the REP's retry timer (timers.rs `arm`: a CEP's one entry moves), and
/// the retry still comes at its own deadline. Before, the REP's timer
/// took a new entry and the MRA timer's stayed in the heap, stale, until its deadline:
/// 16 bytes per REQ, half the sender's response timeout long.
#[test]
fn answered_req_takes_no_second_timer_entry() {
    let mut p = Pair::new(18);
    let l = listen_on(&mut p, Pair::listen_params(SID, 8));
    let a = connect_new(&mut p, SID, QPN_A);
    settle(&mut p);
    let b = p.last_request().unwrap();
    p.b.take_request(b).unwrap();
    assert_eq!(p.b.timer_entries(), 1, "the MRA timer");
    // The REP is lost: its retry comes REP_WAIT after it was sent, past the MRA
    // timer's deadline (half of ib(16)).
    p.fault(Side::B, AttributeId::Rep, 1, Fate::Drop);
    let sent = p.now;
    p.b.accept(sent, b, &rp()).unwrap();
    assert_eq!(p.b.timer_entries(), 1, "the MRA timer's entry, moved");
    const { assert!(REP_WAIT > ib(16) / 2) };
    run_until(&mut p, 2 * REP_WAIT, |p| {
        retries(&p.b, AttributeId::Rep) == 1
    });
    assert_eq!(ns_since(&p, sent), REP_WAIT);
    assert_eq!(p.b.counters().sent[slot(AttributeId::Mra)], 0);
    settle(&mut p);
    assert_state(&p.a, a, S::RepRcvd);
    finish(p, &[a], &[b, l]);
}

/// Connections established hold no timer entry: a REQ's timer (the sender's retry timer,
/// the receiver's MRA timer become its REP's retry timer) leaves the heap when the REP
/// or RTU ends it (timer_heap.rs), as Linux takes a MAD's retry off its queue at once
/// (`cm_establish` -> `ib_cancel_mad`, cm.c). Before, one that ended under a live timer
/// due sooner (here one REQ left unanswered, its timers due first on both sides) stayed,
/// stale, until its own deadline: 9 entries on each side instead of 1.
#[test]
fn established_connections_hold_no_timer_entry() {
    let mut p = Pair::new(18);
    let l = listen_on(&mut p, Pair::listen_params(SID, 16));
    let waiting = connect_new(&mut p, SID, QPN_A);
    settle(&mut p);
    let waiting_b = p.last_request().unwrap();
    p.b.take_request(waiting_b).unwrap();
    let mut a_all = vec![waiting];
    let mut b_all = vec![l, waiting_b];
    for i in 1..9u32 {
        let a = connect_new(&mut p, SID, QPN_A + i);
        settle(&mut p);
        let b = p.last_request().unwrap();
        p.b.take_request(b).unwrap();
        let now = p.now;
        p.b.accept(now, b, &Pair::rep_params(QPN_B + i)).unwrap();
        settle(&mut p);
        p.a.rtu(a, b"").unwrap();
        settle(&mut p);
        assert_state(&p.a, a, S::Established);
        assert_state(&p.b, b, S::Established);
        a_all.push(a);
        b_all.push(b);
    }
    assert_state(&p.a, waiting, S::ReqSent);
    assert_state(&p.b, waiting_b, S::ReqRcvd);
    assert_eq!((p.a.timer_entries(), p.b.timer_entries()), (1, 1));
    finish(p, &a_all, &b_all);
}

/// Once established, the passive side keeps neither its REP's nor its MRA's private data
/// (pdata.rs `forget_handshake_pdata`): nothing repeats them any more (a duplicate REQ
/// gets the REP only in REP_SENT, the MRA only before the REP; Linux
/// `cm_dup_req_handler`). The active side keeps its RTU's, which a duplicate REP gets
/// again. Before, both blocks stayed in the pool until the CEP ended: base + 2 here.
#[test]
fn established_passive_side_keeps_no_handshake_private_data() {
    let mut p = Pair::new(21);
    let l = listen_on(&mut p, Pair::listen_params(SID, 8));
    let a = connect_new(&mut p, SID, QPN_A);
    settle(&mut p);
    let b = p.last_request().unwrap();
    p.b.take_request(b).unwrap();
    let base = p.b.private_data_blocks();
    p.b.mra(b, 20, b"owner waits").unwrap();
    settle(&mut p);
    let mut rep = rp();
    rep.private_data = b"rep data";
    let now = p.now;
    p.b.accept(now, b, &rep).unwrap();
    settle(&mut p);
    assert_eq!(
        p.b.private_data_blocks(),
        base + 2,
        "the MRA's and the REP's"
    );
    p.a.rtu(a, b"rtu data").unwrap();
    settle(&mut p);
    assert_state(&p.a, a, S::Established);
    assert_state(&p.b, b, S::Established);
    assert_eq!(p.b.private_data_blocks(), base);
    assert_eq!(
        p.a.private_data_blocks(),
        1,
        "the RTU's, for a duplicate REP"
    );
    finish(p, &[a], &[b, l]);
}

/// The owner's own MRA after the manager's (issue 29): it is taken, not refused, and
/// replaces the manager's for the repeats a duplicate REQ asks for. Nothing is sent at
/// the call: a sender drops a second MRA for one REQ (AL `__mra_handler`,
/// al_cm_cep.c:1382-1386; Linux `cm_mra_handler`, IB_CM_MRA_REQ_RCVD: a duplicate).
/// Before, the call failed with InvalidState although the owner had sent nothing.
#[test]
fn owner_mra_after_the_managers_replaces_it() {
    let mut p = Pair::new(14);
    let l = listen_on(&mut p, Pair::listen_params(SID, 8));
    let a = connect_new(&mut p, SID, QPN_A);
    settle(&mut p);
    let b = p.last_request().unwrap();
    p.b.take_request(b).unwrap();
    // The manager's MRA, at half of the REQ's response timeout (16), is lost.
    p.fault(Side::B, AttributeId::Mra, 1, Fate::Drop);
    p.drive_for(ib(16) / 2 + SETTLE);
    assert_eq!(p.b.counters().sent[slot(AttributeId::Mra)], 1);
    assert_state(&p.b, b, S::MraReqSent);
    p.b.mra(b, 20, b"owner waits").unwrap();
    assert_eq!(
        p.b.counters().sent[slot(AttributeId::Mra)],
        1,
        "sent at the call"
    );
    // Once per message for the owner's own.
    assert_eq!(
        p.b.mra(b, 20, b"again"),
        Err(CmError::InvalidState {
            state: S::MraReqSent
        })
    );
    // A's retry is a duplicate REQ: B repeats the owner's MRA.
    run_until(&mut p, 2 * REQ_WAIT, |p| p.a.state(a) == Ok(S::MraReqRcvd));
    assert_eq!(retries(&p.a, AttributeId::Req), 1);
    assert_eq!(
        p.events_of(Side::A, a),
        [Event::MraReceived {
            service_timeout: 20,
            private_data: pd(b"owner waits", ibcm_mad::MRA_PRIVATE_DATA_SIZE),
        }]
    );
    let now = p.now;
    p.b.accept(now, b, &rp()).unwrap();
    settle(&mut p);
    assert_state(&p.a, a, S::RepRcvd);
    finish(p, &[a], &[b, l]);
}

/// A REQ that would wait longer than the server may ask of its sender is refused at
/// once with REJ(NoResources) (IBA 12.6.7.2 Table 112, reason 3; waiting.rs), before a
/// CEP is taken for it; the REQs already held keep their places, and once the queue
/// drains a REQ is held again. Before, it was held and its sender asked to wait.
#[test]
fn req_that_would_wait_too_long_is_refused_at_once() {
    let mut b_cfg = CmConfig::new(GUID_B, [15; 32]);
    b_cfg.max_request_wait_ns = Some(50 * MS);
    let mut p = Pair::with_config(CmConfig::new(GUID_A, [14; 32]), b_cfg);
    let l = listen_on(&mut p, Pair::listen_params(SID, 16));
    let first: Vec<CepId> = (0..10)
        .map(|i| connect_new(&mut p, SID, QPN_A + i))
        .collect();
    settle(&mut p);
    assert_eq!(req_events(&p), 10);
    let held: Vec<CepId> = p.events(Side::B).iter().map(|(c, _)| *c).collect();
    // The application answers two, 10 ms apart: 8 wait, 10 ms apart, 90 ms ahead of
    // the next REQ, past the 50 ms the server may ask for (a refusal rests on two
    // answers at least).
    for (k, &c) in held[..2].iter().enumerate() {
        let t = p.now.add_nanos(10 * MS);
        run_to(&mut p, t);
        p.b.take_request(c).unwrap();
        let now = p.now;
        p.b.accept(now, c, &Pair::rep_params(QPN_B + 100 + k as u32))
            .unwrap();
    }
    let live = p.b.live_ceps();
    let late = connect_new(&mut p, SID, QPN_A + 10);
    settle(&mut p);
    assert_eq!(
        p.events_of(Side::A, late),
        [rej_event(
            RejReason::NoResources,
            MessageKind::Req,
            &[],
            &[]
        )]
    );
    assert_state(&p.a, late, S::Idle);
    assert_eq!(p.b.live_ceps(), live, "a CEP was taken for the refused REQ");
    assert_eq!(req_events(&p), 10);
    // The held ones are answered; the queue drains and a REQ is held again.
    for (k, &c) in held[2..].iter().enumerate() {
        p.b.take_request(c).unwrap();
        let now = p.now;
        p.b.accept(now, c, &Pair::rep_params(QPN_B + 1 + k as u32))
            .unwrap();
    }
    settle(&mut p);
    // Idle for longer than the longest wait: the next REQ starts a busy period of its
    // own, whatever the last one's interval was.
    let t = p.now.add_nanos(1_000 * MS);
    run_to(&mut p, t);
    let again = connect_new(&mut p, SID, QPN_A + 11);
    settle(&mut p);
    assert_eq!(req_events(&p), 11);
    let taken = p.last_request().unwrap();
    let mut a_all = first.clone();
    a_all.extend([late, again]);
    for &c in &first {
        p.a.rtu(c, b"").unwrap();
    }
    let mut b_all = held.clone();
    b_all.extend([taken, l]);
    finish(p, &a_all, &b_all);
}

/// The application's first answer pays its cold start (a server's first QP and pages:
/// 565 ms where the next took 7 on two TCG guests with 500 REQs at once): a refusal rests
/// on two answers and the faster of the smoothed and the last interval (waiting.rs), so
/// the REQs that arrive after that slow answer are held, and the fast answers that follow
/// clear them. Before, the first answer's interval alone refused every REQ that came
/// after it while enough were unanswered: 85 of those 500 got REJ(NoResources).
#[test]
fn a_slow_first_answer_does_not_refuse_a_burst() {
    let mut b_cfg = CmConfig::new(GUID_B, [15; 32]);
    b_cfg.max_request_wait_ns = Some(50 * MS);
    let mut p = Pair::with_config(CmConfig::new(GUID_A, [14; 32]), b_cfg);
    let l = listen_on(&mut p, Pair::listen_params(SID, 64));
    let mut a_all: Vec<CepId> = (0..20)
        .map(|i| connect_new(&mut p, SID, QPN_A + i))
        .collect();
    settle(&mut p);
    let held: Vec<CepId> = p.events(Side::B).iter().map(|(c, _)| *c).collect();
    assert_eq!(held.len(), 20);
    // The first answer after 40 ms (40 ms x 20 unanswered is past the 50 ms allowed),
    // then one every millisecond, a new REQ after each.
    for (k, &c) in held.iter().enumerate() {
        let t = p.now.add_nanos(if k == 0 { 40 * MS } else { MS });
        run_to(&mut p, t);
        p.b.take_request(c).unwrap();
        let now = p.now;
        p.b.accept(now, c, &Pair::rep_params(QPN_B + k as u32))
            .unwrap();
        if k < 5 {
            a_all.push(connect_new(&mut p, SID, QPN_A + 100 + k as u32));
            settle(&mut p);
        }
    }
    assert_eq!(
        p.a.counters().received[slot(AttributeId::Rej)],
        0,
        "a REQ after the slow first answer was refused"
    );
    assert_eq!(req_events(&p), 25, "every REQ held and reported");
    finish(p, &a_all, &[l]);
}

/// The ServiceTimeout of the MRA A's CEP `a` received.
fn mra_asked(p: &Pair, a: CepId) -> u8 {
    p.events_of(Side::A, a)
        .iter()
        .find_map(|e| match *e {
            Event::MraReceived {
                service_timeout, ..
            } => Some(service_timeout),
            _ => None,
        })
        .expect("an MRA reached A")
}

/// A REQ the application holds while it answers the others at once does not make the
/// others look slow (waiting.rs: an answer's interval starts at the later of its REQ's
/// arrival and the previous answer). Before, the busy period ran from the held REQ's
/// arrival, so idle time counted: with 50 ms allowed, the second REQ (100 ms later,
/// one answer) saw a 100 ms interval and every REQ after it got REJ(NoResources).
#[test]
fn one_req_held_long_does_not_slow_the_others() {
    let mut b_cfg = CmConfig::new(GUID_B, [15; 32]);
    b_cfg.max_request_wait_ns = Some(50 * MS);
    let mut p = Pair::with_config(CmConfig::new(GUID_A, [14; 32]), b_cfg);
    let l = listen_on(&mut p, Pair::listen_params(SID, 16));
    let held_a = connect_new(&mut p, SID, QPN_A);
    settle(&mut p);
    let held = p.last_request().unwrap();
    p.b.take_request(held).unwrap();
    let mut a_all = vec![held_a];
    for i in 0..8u32 {
        let t = p.now.add_nanos(100 * MS);
        run_to(&mut p, t);
        let a = connect_new(&mut p, SID, QPN_A + 1 + i);
        settle(&mut p);
        assert_eq!(req_events(&p), 2 + i as usize, "REQ {i} was not held");
        let b = p.last_request().unwrap();
        p.b.take_request(b).unwrap();
        let now = p.now;
        p.b.accept(now, b, &Pair::rep_params(QPN_B + i)).unwrap();
        settle(&mut p);
        assert_state(&p.a, a, S::RepRcvd);
        a_all.push(a);
    }
    assert_eq!(p.a.counters().received[slot(AttributeId::Rej)], 0);
    finish(p, &a_all, &[held, l]);
}

/// REQs their clients cancel (REJ received) are not answers (waiting.rs): the rate is
/// the application's alone. Before, 10 cancelled in the first 5 ms and one answer at
/// 10 ms made a 0.9 ms interval, and a REQ 100 ms from its answer was held.
#[test]
fn cancelled_reqs_do_not_count_as_answers() {
    let mut b_cfg = CmConfig::new(GUID_B, [15; 32]);
    b_cfg.max_request_wait_ns = Some(50 * MS);
    let mut p = Pair::with_config(CmConfig::new(GUID_A, [14; 32]), b_cfg);
    let l = listen_on(&mut p, Pair::listen_params(SID, 32));
    let t0 = p.now;
    let first: Vec<CepId> = (0..20)
        .map(|i| connect_new(&mut p, SID, QPN_A + i))
        .collect();
    settle(&mut p);
    let held: Vec<CepId> = p.events(Side::B).iter().map(|(c, _)| *c).collect();
    assert_eq!(held.len(), 20);
    // Half the clients give up at 5 ms: REJ(Timeout) ends their REQs on B.
    run_to(&mut p, t0.add_nanos(5 * MS));
    for &a in &first[..10] {
        let now = p.now;
        p.a.destroy(now, a).unwrap();
    }
    settle(&mut p);
    // The application answers one at 10 ms and one at 20 ms: 8 wait at 10 ms each,
    // 90 ms for the next.
    for (k, &c) in held[10..12].iter().enumerate() {
        run_to(&mut p, t0.add_nanos(10 * MS * (k as u64 + 1)));
        p.b.take_request(c).unwrap();
        let now = p.now;
        p.b.accept(now, c, &Pair::rep_params(QPN_B + k as u32))
            .unwrap();
    }
    let late = connect_new(&mut p, SID, QPN_A + 20);
    settle(&mut p);
    assert_eq!(
        p.events_of(Side::A, late),
        [rej_event(
            RejReason::NoResources,
            MessageKind::Req,
            &[],
            &[]
        )]
    );
    let mut a_all = first.clone();
    a_all.push(late);
    let mut b_all = held.clone();
    b_all.push(l);
    finish(p, &a_all, &b_all);
}

/// The manager's own MRA asks no more than the longest wait it may ask for
/// (`max_request_wait_ns`; IBA 12.6.6: ServiceTimeout is the wait the sender is asked
/// to add). Before, with no answer yet, it asked for the sender's whole retry budget
/// whatever the cap: 4.3 s (20) with a 50 ms cap, and 137 s (25) for a budget of 77 s
/// under the default 68.7 s (24, Linux's `CMA_CM_MRA_SETTING`).
#[test]
fn managers_mra_asks_no_more_than_the_longest_wait() {
    // (cap, the REQ's RemoteCMResponseTimeout and MaxCMRetries, the most it may ask)
    for (cap, timeout, retries, most) in [(50 * MS, 16, 3, 13), (4096 << 24, 21, 8, 24)] {
        let mut b_cfg = CmConfig::new(GUID_B, [15; 32]);
        b_cfg.max_request_wait_ns = Some(cap);
        let mut p = Pair::with_config(CmConfig::new(GUID_A, [14; 32]), b_cfg);
        let l = listen_on(&mut p, Pair::listen_params(SID, 8));
        let a = p.a.create().unwrap();
        let mut params = Pair::connect_params(SID, QPN_A);
        params.remote_cm_response_timeout = timeout;
        params.max_cm_retries = retries;
        let now = p.now;
        p.a.connect(now, a, &params).unwrap();
        settle(&mut p);
        let b = p.last_request().unwrap();
        p.b.take_request(b).unwrap();
        p.drive_for(ib(u32::from(timeout)) / 2 + SETTLE);
        assert_state(&p.b, b, S::MraReqSent);
        assert_eq!(mra_asked(&p, a), most, "cap {cap} ns");
        let now = p.now;
        p.b.accept(now, b, &rp()).unwrap();
        settle(&mut p);
        assert_state(&p.a, a, S::RepRcvd);
        finish(p, &[a], &[b, l]);
    }
}

/// Each MRA asks for the wait of the REQs ahead of its own, not the whole queue's
/// (waiting.rs: a REQ's ticket). 100 REQs at once, 13 answered 10 ms apart up to just
/// before half the response timeout; then the first still waiting asks for 2 x 10 ms
/// (+ a packet life time, 134 ms: ServiceTimeout 16, 268 ms), the last for 2 x 870 ms (19,
/// 2.1 s). Before, every MRA asked for the whole queue at the busy period's interval
/// (19 for all).
#[test]
fn mra_wait_follows_the_reqs_ahead() {
    let mut p = Pair::new(16);
    let l = listen_on(&mut p, Pair::listen_params(SID, 128));
    let t0 = p.now;
    let first: Vec<CepId> = (0..100)
        .map(|i| connect_new(&mut p, SID, QPN_A + i))
        .collect();
    settle(&mut p);
    let held: Vec<CepId> = p.events(Side::B).iter().map(|(c, _)| *c).collect();
    assert_eq!(held.len(), 100);
    for (k, &b) in held[..13].iter().enumerate() {
        run_to(&mut p, t0.add_nanos((k as u64 + 1) * 10 * MS));
        p.b.take_request(b).unwrap();
        let now = p.now;
        p.b.accept(now, b, &Pair::rep_params(QPN_B + k as u32))
            .unwrap();
    }
    p.drive_for(ib(16) / 2);
    let asked: Vec<u8> = first[13..].iter().map(|&a| mra_asked(&p, a)).collect();
    assert_eq!(asked[0], 16);
    assert_eq!(asked[86], 19);
    assert!(asked.windows(2).all(|w| w[0] <= w[1]), "{asked:?}");
    let mut b_all = held.clone();
    b_all.push(l);
    finish(p, &first, &b_all);
}

// ---- destroy ------------------------------------------------------------------------------

#[test]
fn destroy_in_req_sent_sends_rej_timeout() {
    // The REQ is still on the link: B gets it, then the REJ.
    let mut fx = at(Stage::ReqSent);
    let a = fx.a;
    let now = fx.p.now;
    fx.p.a.destroy(now, a).unwrap();
    assert_eq!(fx.p.a.live_ceps(), 0);
    assert_eq!(fx.p.a.state(a), Err(CmError::UnknownCep));
    assert_sent(&mut fx.p, Side::A, AttributeId::Rej, 1);
    settle(&mut fx.p);
    let b = fx.p.last_request().unwrap();
    assert_state(&fx.p.b, b, S::Idle);
    assert_eq!(
        fx.p.events_of(Side::B, b)[1..],
        [rej_event(
            RejReason::Timeout,
            MessageKind::Other,
            &GUID_A.to_be_bytes(),
            &[]
        )]
    );
    fx.p.drive();
    assert_no_events(&mut fx.p, Side::A);
    assert_sent(&mut fx.p, Side::A, AttributeId::Req, 1);
    fx.b = Some(b);
    fx.finish();
}

#[test]
fn destroy_before_the_rep_sends_rej_consumer_defined() {
    for stage in [Stage::ReqRcvd, Stage::MraReqSent, Stage::RepPrepared] {
        let mut fx = at(stage);
        let (a, b) = (fx.a, fx.b());
        let now = fx.p.now;
        fx.p.b.destroy(now, b).unwrap();
        assert_eq!(fx.p.b.live_ceps(), 1, "{stage:?}: only the listen");
        assert_sent(&mut fx.p, Side::B, AttributeId::Rej, 1);
        settle(&mut fx.p);
        assert_state(&fx.p.a, a, S::Idle);
        let last = *fx.p.events_of(Side::A, a).last().unwrap();
        assert_eq!(
            last,
            rej_event(RejReason::ConsumerDefined, MessageKind::Req, &[], &[]),
            "{stage:?}"
        );
        fx.p.drive();
        assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 0);
        assert_eq!(fx.p.b.peer_map_entries(), 0);
        fx.finish();
    }
}

#[test]
fn destroy_in_rep_sent_and_rep_rcvd_goes_through_timewait() {
    for destroy_b in [true, false] {
        let mut fx = at(Stage::RepSent);
        let (a, b) = (fx.a, fx.b());
        let now = fx.p.now;
        let (gone, other) = if destroy_b {
            fx.p.b.destroy(now, b).unwrap();
            (Side::B, Side::A)
        } else {
            fx.p.a.destroy(now, a).unwrap();
            (Side::A, Side::B)
        };
        assert_sent(&mut fx.p, gone, AttributeId::Rej, 1);
        // It lingers in timewait, reporting nothing.
        let lingering = if destroy_b { 2 } else { 1 };
        assert_eq!(fx.p.node(gone).live_ceps(), lingering);
        settle(&mut fx.p);
        let (survivor, kind) = if destroy_b {
            (a, MessageKind::Other)
        } else {
            (b, MessageKind::Rep)
        };
        assert_state(fx.p.node(other), survivor, S::Timewait);
        assert_eq!(
            *fx.p.events_of(other, survivor).last().unwrap(),
            rej_event(RejReason::ConsumerDefined, kind, &[], &[])
        );
        fx.p.drive();
        assert_eq!(fx.p.node(gone).live_ceps(), lingering - 1);
        assert_state(fx.p.node(other), survivor, S::Idle);
        assert_eq!(
            *fx.p.events_of(other, survivor).last().unwrap(),
            Event::TimewaitExit
        );
        if destroy_b {
            assert_events(&mut fx.p, Side::B, b, &[Ev::Req]);
        } else {
            assert_events(&mut fx.p, Side::A, a, &[Ev::Rep]);
        }
        fx.finish();
    }
}

#[test]
fn destroy_established_sends_dreq_and_frees_after_timewait() {
    let mut fx = at(Stage::Established);
    let (a, b) = (fx.a, fx.b());
    let now = fx.p.now;
    fx.p.a.destroy(now, a).unwrap();
    assert_eq!(fx.p.a.state(a), Err(CmError::UnknownCep));
    assert_eq!(fx.p.a.live_ceps(), 1);
    assert_sent(&mut fx.p, Side::A, AttributeId::Dreq, 1);
    settle(&mut fx.p);
    assert_state(&fx.p.b, b, S::DreqRcvd);
    let now = fx.p.now;
    fx.p.b.drep(now, b, b"").unwrap();
    settle(&mut fx.p);
    // The DREP is absorbed by the destroyed CEP, now in timewait.
    assert_eq!(fx.p.a.live_ceps(), 1);
    fx.p.drive();
    assert_eq!(fx.p.a.live_ceps(), 0);
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep]);
    assert_events(
        &mut fx.p,
        Side::B,
        b,
        &[Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit],
    );
    assert_eq!(fx.p.a.peer_map_entries(), 0);
    fx.finish();
}

#[test]
fn destroy_late_states() {
    // (stage, destroy A or B, what the destroy sends, the survivor's events after)
    let rows = [
        (
            Stage::Dreq,
            false,
            Some(AttributeId::Drep),
            vec![Ev::Rep, Ev::Drep, Ev::Exit],
        ),
        (
            Stage::Dreq,
            true,
            None,
            vec![Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit],
        ),
        (
            Stage::Timewait,
            true,
            None,
            vec![Ev::Req, Ev::Rtu, Ev::Dreq, Ev::Exit],
        ),
        (
            Stage::Timewait,
            false,
            None,
            vec![Ev::Rep, Ev::Drep, Ev::Exit],
        ),
    ];
    for (stage, destroy_a, sends, survivor_events) in rows {
        let mut fx = at(stage);
        let (a, b) = (fx.a, fx.b());
        let before = fx.p.sent.len();
        let now = fx.p.now;
        let (gone, cep, other, survivor) = if destroy_a {
            fx.p.a.destroy(now, a).unwrap();
            (Side::A, a, Side::B, b)
        } else {
            fx.p.b.destroy(now, b).unwrap();
            (Side::B, b, Side::A, a)
        };
        fx.p.flush();
        match sends {
            Some(attr) => assert_sent(&mut fx.p, gone, attr, 1),
            None => assert_eq!(fx.p.sent.len(), before, "{stage:?}"),
        }
        let events = fx.p.events_of(gone, cep).len();
        if stage == Stage::Dreq && destroy_a {
            // The survivor still owes its DREP.
            let now = fx.p.now;
            fx.p.b.drep(now, b, b"").unwrap();
        }
        fx.p.drive();
        assert_eq!(
            fx.p.events_of(gone, cep).len(),
            events,
            "{stage:?}: no event after destroy"
        );
        assert_eq!(fx.p.node(gone).state(cep), Err(CmError::UnknownCep));
        assert_eq!(fx.p.node(gone).live_ceps(), usize::from(gone == Side::B));
        assert_state(fx.p.node(other), survivor, S::Idle);
        assert_events(&mut fx.p, other, survivor, &survivor_events);
        fx.finish();
    }
}

#[test]
fn destroy_idle_frees_at_once() {
    let mut fx = at(Stage::Idle);
    let now = fx.p.now;
    fx.p.a.destroy(now, fx.a).unwrap();
    assert_eq!(fx.p.a.live_ceps(), 0);
    assert_eq!(fx.p.a.destroy(now, fx.a), Err(CmError::UnknownCep));
    assert_eq!(fx.p.sent.len(), 0);
    fx.finish();
}

#[test]
fn destroy_listen_rejects_requests_not_taken() {
    let mut p = Pair::new(13);
    let l = listen_on(&mut p, Pair::listen_params(SID, 16));
    let a1 = connect_new(&mut p, SID, QPN_A);
    let a2 = connect_new(&mut p, SID, QPN_A + 1);
    settle(&mut p);
    let b1 = p.events(Side::B)[0].0;
    let b2 = p.events(Side::B)[1].0;
    p.b.take_request(b1).unwrap();
    let now = p.now;
    p.b.destroy(now, l).unwrap();
    // The untaken request is refused at once; the taken one is the user's.
    assert_eq!(p.b.state(b2), Err(CmError::UnknownCep));
    assert_state(&p.b, b1, S::ReqRcvd);
    assert_eq!(p.b.live_ceps(), 1);
    assert_sent(&mut p, Side::B, AttributeId::Rej, 1);
    settle(&mut p);
    assert_state(&p.a, a2, S::Idle);
    assert_eq!(
        p.events_of(Side::A, a2),
        [rej_event(
            RejReason::ConsumerDefined,
            MessageKind::Req,
            &[],
            &[]
        )]
    );
    assert_state(&p.a, a1, S::ReqSent);
    // The taken one can still be accepted.
    let now = p.now;
    p.b.accept(now, b1, &rp()).unwrap();
    settle(&mut p);
    p.a.rtu(a1, b"").unwrap();
    settle(&mut p);
    assert_states(&p, a1, S::Established, b1, S::Established);
    finish(p, &[a1, a2], &[b1]);
}

#[test]
fn destroy_never_needs_the_network() {
    let stages = [
        Stage::ReqSent,
        Stage::ReqRcvd,
        Stage::MraReqSent,
        Stage::RepPrepared,
        Stage::RepSent,
        Stage::Established,
        Stage::Dreq,
        Stage::Timewait,
    ];
    let attrs = [
        AttributeId::Req,
        AttributeId::Mra,
        AttributeId::Rej,
        AttributeId::Rep,
        AttributeId::Rtu,
        AttributeId::Dreq,
        AttributeId::Drep,
    ];
    for stage in stages {
        let mut fx = at(stage);
        for side in [Side::A, Side::B] {
            for attr in attrs {
                fx.p.fault(side, attr, u32::MAX, Fate::Drop);
            }
        }
        let now = fx.p.now;
        fx.p.a.destroy(now, fx.a).unwrap();
        if let Some(b) = fx.b {
            fx.p.b.destroy(now, b).unwrap();
        }
        fx.p.b.destroy(now, fx.l).unwrap();
        let events = (fx.p.events_a.len(), fx.p.events_b.len());
        fx.p.drive();
        assert_eq!(
            (fx.p.events_a.len(), fx.p.events_b.len()),
            events,
            "{stage:?}"
        );
        for m in [&fx.p.a, &fx.p.b] {
            assert_eq!(m.live_ceps(), 0, "{stage:?}");
            assert_eq!(m.peer_map_entries(), 0, "{stage:?}");
            assert_eq!(m.timer_entries(), 0, "{stage:?}");
        }
    }
}

#[test]
fn established_in_rep_sent_cancels_the_rep_retries() {
    let mut fx = at(Stage::ReqRcvd);
    let (a, b) = (fx.a, fx.b());
    let now = fx.p.now;
    fx.p.b.accept(now, b, &rp()).unwrap();
    settle(&mut fx.p);
    fx.p.fault(Side::A, AttributeId::Rtu, 1, Fate::Drop);
    fx.p.a.rtu(a, b"").unwrap();
    settle(&mut fx.p);
    assert_state(&fx.p.b, b, S::RepSent);
    // The QP saw traffic before the RTU (communication established).
    fx.p.b.established(b).unwrap();
    assert_state(&fx.p.b, b, S::Established);
    assert_eq!(
        fx.p.b.established(b),
        Err(CmError::InvalidState {
            state: S::Established
        })
    );
    fx.p.drive_for(5 * REP_WAIT);
    assert_eq!(retries(&fx.p.b, AttributeId::Rep), 0);
    assert_sent(&mut fx.p, Side::B, AttributeId::Rep, 1);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req]);
    assert_states(&fx.p, a, S::Established, b, S::Established);
    // Not valid before the REP is sent.
    let mut fx2 = at(Stage::ReqRcvd);
    let b2 = fx2.b();
    assert_eq!(
        fx2.p.b.established(b2),
        Err(CmError::InvalidState { state: S::ReqRcvd })
    );
    fx2.finish();
    // The connection works as any other.
    let now = fx.p.now;
    fx.p.b.disconnect(now, b, b"").unwrap();
    settle(&mut fx.p);
    let now = fx.p.now;
    fx.p.a.drep(now, a, b"").unwrap();
    fx.p.drive();
    assert_events(&mut fx.p, Side::A, a, &[Ev::Rep, Ev::Dreq, Ev::Exit]);
    assert_events(&mut fx.p, Side::B, b, &[Ev::Req, Ev::Drep, Ev::Exit]);
    fx.finish();
}
