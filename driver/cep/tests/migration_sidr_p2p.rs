//! Path migration (LAP/APR, `migrate`), SIDR, peer-to-peer establishment, ClassPortInfo
//! and port removal, through the two-node virtual-time [`Pair`] (the style of `states.rs`).
//!
//! Every test checks, on both sides: the states, the exact events each CEP got, the MADs
//! put on the link, the counters, and at the end (after destroy and timewait) that nothing
//! is left: no CEP, no peer-map entry, no timer.
//!
//! Timing (virtual ns, from `Pair`'s defaults): A's packet life time is 14 and B recovers
//! 15 from the REQ's LocalACKTimeout (16) minus one; both CAs have an ACK delay of 15; the
//! REQ's CM response timeouts are 16 and MaxCMRetries 3; the link takes 2 us one way.

use ibcm_cep::pair::{Fate, GUID_A, GUID_B, Pair, Side};
use ibcm_cep::{
    AddressVector, CepId, CmConfig, CmError, CmManager, ConnectParams, Event, Instant,
    ListenParams, MadAddress, MigrationState, PathRecord, PrivateData, QpState, RepParams,
    SidrParams, SidrRepInfo, SidrReplyParams, StateName as S, ack_timeout, counter_slot,
};
use ibcm_mad::{
    AprStatus, AttributeId, ClassPortInfo, CmMad, CmMessage, MAD_SIZE, MadHeader, Method, Rate,
    SidrStatus,
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

/// A's REQ, LAP and SIDR_REQ retry wait: 2 x PLT(14) + 4.096us * 2^16.
const REQ_WAIT: u64 = 2 * ib(14) + ib(16);
/// B's REP and LAP retry wait: 2 x PLT(15) + the REQ's CM response timeout (16).
const REP_WAIT: u64 = 2 * ib(15) + ib(16);
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
    Rej,
    Timeout(AttributeId),
    Dreq,
    Drep,
    Exit,
    Lap,
    Apr(AprStatus),
    SidrReq,
    SidrRep(SidrStatus),
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
        Event::Rejected { .. } => Ev::Rej,
        Event::Timeout { message } => Ev::Timeout(message),
        Event::DreqReceived(_) => Ev::Dreq,
        Event::DrepReceived(_) => Ev::Drep,
        Event::TimewaitExit => Ev::Exit,
        Event::LapReceived { .. } => Ev::Lap,
        Event::AprReceived { status, .. } => Ev::Apr(status),
        Event::SidrReqReceived(_) => Ev::SidrReq,
        Event::SidrRepReceived(info) => Ev::SidrRep(info.status),
        Event::DeviceRemoval => Ev::Removal,
    }
}

/// Private data as the peer receives it: the whole wire field, zero-filled.
fn pd(bytes: &[u8], field: usize) -> PrivateData {
    let mut v = vec![0u8; field];
    v[..bytes.len()].copy_from_slice(bytes);
    PrivateData::new(&v)
}

/// Additional information as an event carries it.
fn info72(bytes: &[u8]) -> [u8; 72] {
    let mut buf = [0u8; 72];
    buf[..bytes.len()].copy_from_slice(bytes);
    buf
}

fn gid(lid: u16) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[14..].copy_from_slice(&lid.to_be_bytes());
    g
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

fn all_retries(m: &CmManager) -> u64 {
    m.counters().retries.iter().sum()
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
fn assert_sent(p: &mut Pair, side: Side, attr: AttributeId, n: usize) {
    p.flush();
    assert_eq!(
        p.sent_count(side, attr),
        n,
        "{attr:?} MADs sent by {side:?}"
    );
}

#[track_caller]
fn invalid(state: S) -> Result<(), CmError> {
    Err(CmError::InvalidState { state })
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

fn settle(p: &mut Pair) {
    p.drive_for(SETTLE);
}

fn ns_since(p: &Pair, t0: Instant) -> u64 {
    p.now.nanos_since(t0)
}

/// Destroys every CEP either side knows of (the ones given and every one an event named,
/// and the listens ReqReceived and SidrReqReceived named), runs all timers out, and checks
/// that no event reached a destroyed CEP and that nothing is left: no CEP, no peer-map
/// entry, no timer.
#[track_caller]
fn finish(mut p: Pair, a: &[CepId], b: &[CepId]) {
    p.faults.clear();
    p.flush();
    let listens = |events: &[(CepId, Event)]| -> Vec<CepId> {
        events
            .iter()
            .filter_map(|(_, e)| match e {
                Event::ReqReceived(info) => Some(info.listen),
                Event::SidrReqReceived(info) => Some(info.listen),
                _ => None,
            })
            .collect()
    };
    let mut ceps_a: Vec<CepId> = a.to_vec();
    ceps_a.extend(p.events(Side::A).iter().map(|(c, _)| *c));
    ceps_a.extend(listens(p.events(Side::A)));
    let mut ceps_b: Vec<CepId> = b.to_vec();
    ceps_b.extend(p.events(Side::B).iter().map(|(c, _)| *c));
    ceps_b.extend(listens(p.events(Side::B)));
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

/// Both sides disconnect cleanly (A sends the DREQ), then everything is freed.
#[track_caller]
fn teardown(mut p: Pair, a: CepId, b: CepId, extra_a: &[CepId], extra_b: &[CepId]) {
    p.faults.clear();
    let now = p.now;
    p.a.disconnect(now, a, b"bye").unwrap();
    settle(&mut p);
    assert_state(&p.b, b, S::DreqRcvd);
    let now = p.now;
    p.b.drep(now, b, b"").unwrap();
    p.drive();
    assert_states(&p, a, S::Idle, b, S::Idle);
    let mut ca = vec![a];
    ca.extend_from_slice(extra_a);
    let mut cb = vec![b];
    cb.extend_from_slice(extra_b);
    finish(p, &ca, &cb);
}

// ---- paths ----------------------------------------------------------------------------

/// The alternate path A proposes, from A's side. Its life time (16) differs from the
/// primary's, so each field that follows it shows.
fn alt_a() -> PathRecord {
    PathRecord {
        slid: 3,
        dlid: 4,
        sgid: gid(3),
        dgid: gid(4),
        flow_label: 0x1_2345,
        traffic_class: 0x20,
        hop_limit: 0x40,
        sl: 5,
        rate: Rate::Gbps40,
        packet_life_time: 16,
        subnet_local: true,
    }
}

/// The same path as B sees it: ends swapped, life time recovered from the LAP's
/// LocalACKTimeout (ack_timeout(16, B's ACK delay 15) = 18) minus one.
fn alt_b() -> PathRecord {
    PathRecord {
        slid: 4,
        dlid: 3,
        sgid: gid(4),
        dgid: gid(3),
        packet_life_time: 17,
        ..alt_a()
    }
}

/// B's view of the primary path.
fn primary_b() -> PathRecord {
    PathRecord {
        packet_life_time: 15,
        ..Pair::path(Side::B)
    }
}

fn av(path: PathRecord, ack: u8) -> AddressVector {
    AddressVector {
        path,
        port: 1,
        ack_timeout: ack,
    }
}

/// A's ACK timeouts: its primary (PLT 14) and the alternate (PLT 16), B's ACK delay 15.
const ACK_A_PRIMARY: u8 = 16;
const ACK_A_ALT: u8 = 18;
/// B's, the passive side's: the LocalACKTimeout A sent in the REQ and the LAP (A's PLT
/// and A's own ACK delay 15), as Linux `cm_req_handler` (cm.c:1716-1718, 546) and AL
/// `__format_req_av` (al_cm_cep.c:800-801) / `__format_lap_av` (:1899-1900) take it;
/// B's paths carry PLT 15 and 17 (LocalACKTimeout - 1).
const ACK_B_PRIMARY: u8 = 16;
const ACK_B_ALT: u8 = 18;

#[test]
fn ack_timeouts_of_the_paths() {
    assert_eq!(ack_timeout(14, 15), ACK_A_PRIMARY);
    assert_eq!(ack_timeout(16, 15), ACK_A_ALT);
    assert_eq!(primary_b().packet_life_time + 1, ACK_B_PRIMARY);
    assert_eq!(alt_b().packet_life_time + 1, ACK_B_ALT);
}

fn established(seed: u8) -> (Pair, CepId, CepId) {
    let mut p = Pair::new(seed);
    let (a, b) = p.establish(SID);
    assert_states(&p, a, S::Established, b, S::Established);
    (p, a, b)
}

// ---- LAP / APR ------------------------------------------------------------------------

/// A LAP from A, answered by B (with an MRA first, or not): the pre-APR hands out the RTS
/// attributes with the proposed path loaded and REARM; nothing changes until `send_apr`;
/// then both sides have the new alternate path.
#[test]
fn lap_apr_round_trip_with_and_without_mra() {
    for with_mra in [false, true] {
        let (mut p, a, b) = established(21);
        let base = p.sent.len();
        let t0 = p.now;
        p.a.lap(t0, a, &alt_a(), b"lap").unwrap();
        // One LAP at a time.
        assert_eq!(p.a.lap(t0, a, &alt_a(), b"lap"), invalid(S::Established));
        assert_sent(&mut p, Side::A, AttributeId::Lap, 1);
        assert_eq!(p.a.query(a).unwrap().alternate_path, None);
        settle(&mut p);
        assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Lap]);
        assert_eq!(
            p.events_of(Side::B, b)[2],
            Event::LapReceived {
                alternate_path: alt_b(),
                private_data: pd(b"lap", ibcm_mad::LAP_PRIVATE_DATA_SIZE),
            }
        );
        // Nothing is loaded before the APR.
        assert_eq!(p.b.query(b).unwrap().alternate_path, None);
        // Only the receiver of a LAP answers it.
        assert_eq!(
            p.a.prepare_apr(a, AprStatus::Success, &[], &[]).map(|_| ()),
            invalid(S::Established)
        );
        assert_eq!(p.a.send_apr(a), invalid(S::Established));
        assert_eq!(p.b.send_apr(b), invalid(S::Established), "before prepare");
        if with_mra {
            p.b.mra(b, 18, b"thinking").unwrap();
            // Once per LAP.
            assert_eq!(p.b.mra(b, 18, b"thinking"), invalid(S::Established));
            assert_sent(&mut p, Side::B, AttributeId::Mra, 1);
            settle(&mut p);
            assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Mra(18)]);
            // The MRA moved A's retry out: ServiceTimeout 18 + one packet life.
            run_to(&mut p, t0.add_nanos(2 * REQ_WAIT));
            assert_eq!(retries(&p.a, AttributeId::Lap), 0);
        }
        let rts_before = p.b.qp_attributes(b, QpState::Rts).unwrap();
        let rts =
            p.b.prepare_apr(b, AprStatus::Success, b"info", b"apr")
                .unwrap()
                .expect("RTS attributes for Success");
        assert_eq!(rts.alternate, Some(av(alt_b(), ACK_B_ALT)));
        assert_eq!(rts.path_mig_state, Some(MigrationState::Rearm));
        // Everything else is the connection's RTS.
        assert_eq!(
            ibcm_cep::QpAttributes {
                alternate: None,
                path_mig_state: None,
                ..rts
            },
            rts_before
        );
        if with_mra {
            // The MRA may also follow the pre-APR, but only once per LAP.
            assert_eq!(p.b.mra(b, 18, b""), invalid(S::Established));
        }
        // Pre-APR sends nothing.
        settle(&mut p);
        assert_sent(&mut p, Side::B, AttributeId::Apr, 0);
        assert_eq!(p.b.query(b).unwrap().alternate_path, None);
        p.b.send_apr(b).unwrap();
        assert_eq!(p.b.send_apr(b), invalid(S::Established));
        assert_eq!(
            p.b.prepare_apr(b, AprStatus::Success, &[], &[]).map(|_| ()),
            invalid(S::Established)
        );
        assert_eq!(p.b.query(b).unwrap().alternate_path, Some(alt_b()));
        settle(&mut p);
        let mra: &[Ev] = if with_mra { &[Ev::Mra(18)] } else { &[] };
        let want_a: Vec<Ev> = [Ev::Rep]
            .iter()
            .chain(mra)
            .chain(&[Ev::Apr(AprStatus::Success)])
            .copied()
            .collect();
        assert_events(&mut p, Side::A, a, &want_a);
        assert_eq!(
            *p.events_of(Side::A, a).last().unwrap(),
            Event::AprReceived {
                status: AprStatus::Success,
                info: info72(b"info"),
                info_len: 4,
                private_data: pd(b"apr", ibcm_mad::APR_PRIVATE_DATA_SIZE),
            }
        );
        // Both sides have the new alternate path, each from its own side.
        let qa = p.a.query(a).unwrap();
        assert_eq!(
            (qa.primary_path, qa.alternate_path),
            (Pair::path(Side::A), Some(alt_a()))
        );
        let qb = p.b.query(b).unwrap();
        assert_eq!(
            (qb.primary_path, qb.alternate_path),
            (primary_b(), Some(alt_b()))
        );
        let a_rts = p.a.qp_attributes(a, QpState::Rts).unwrap();
        assert_eq!(a_rts.alternate, Some(av(alt_a(), ACK_A_ALT)));
        assert_eq!(a_rts.path_mig_state, Some(MigrationState::Rearm));
        assert_eq!(
            p.a.qp_attributes(a, QpState::Rtr).unwrap().alternate,
            Some(av(alt_a(), ACK_A_ALT))
        );
        assert_eq!(p.b.qp_attributes(b, QpState::Rts).unwrap(), rts);
        // No retry, no duplicate, nothing else on the link.
        p.drive_for(5 * REQ_WAIT);
        assert_eq!(all_retries(&p.a) + all_retries(&p.b), 0);
        assert_eq!(dups(&p.b, AttributeId::Lap), 0);
        assert_eq!(
            p.sent.len() - base,
            if with_mra { 3 } else { 2 },
            "{:?}",
            &p.sent[base..]
        );
        assert_eq!(p.a.counters().sent[slot(AttributeId::Lap)], 1);
        assert_eq!(p.b.counters().received[slot(AttributeId::Lap)], 1);
        assert_eq!(p.b.counters().sent[slot(AttributeId::Apr)], 1);
        assert_eq!(p.a.counters().received[slot(AttributeId::Apr)], 1);
        assert_states(&p, a, S::Established, b, S::Established);
        assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Lap]);
        teardown(p, a, b, &[], &[]);
    }
}

/// Either side may send the LAP: here B, the passive side.
#[test]
fn lap_from_the_passive_side() {
    let (mut p, a, b) = established(22);
    // B proposes alt_b (its side, PLT 17): A sees PLT ack_timeout(17, 15) - 1 = 18.
    let now = p.now;
    p.b.lap(now, b, &alt_b(), b"").unwrap();
    settle(&mut p);
    let seen_by_a = PathRecord {
        packet_life_time: 18,
        ..alt_a()
    };
    assert_eq!(
        *p.events_of(Side::A, a).last().unwrap(),
        Event::LapReceived {
            alternate_path: seen_by_a,
            private_data: pd(b"", ibcm_mad::LAP_PRIVATE_DATA_SIZE),
        }
    );
    let rts =
        p.a.prepare_apr(a, AprStatus::Success, &[], &[])
            .unwrap()
            .unwrap();
    // A loads it with the ACK delay B reported in its REP.
    assert_eq!(rts.alternate, Some(av(seen_by_a, ack_timeout(18, 15))));
    p.a.send_apr(a).unwrap();
    settle(&mut p);
    assert_events(
        &mut p,
        Side::B,
        b,
        &[Ev::Req, Ev::Rtu, Ev::Apr(AprStatus::Success)],
    );
    assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Lap]);
    assert_eq!(p.a.query(a).unwrap().alternate_path, Some(seen_by_a));
    assert_eq!(p.b.query(b).unwrap().alternate_path, Some(alt_b()));
    p.drive_for(5 * REP_WAIT);
    assert_eq!(all_retries(&p.a) + all_retries(&p.b), 0);
    teardown(p, a, b, &[], &[]);
}

/// A second LAP after the first was answered is a new request, not a repeat of the first:
/// it is reported and answered afresh.
#[test]
fn a_second_lap_is_a_new_request() {
    let (mut p, a, b) = established(23);
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"one").unwrap();
    settle(&mut p);
    p.b.prepare_apr(b, AprStatus::Success, &[], b"1").unwrap();
    p.b.send_apr(b).unwrap();
    settle(&mut p);
    assert_eq!(p.a.query(a).unwrap().alternate_path, Some(alt_a()));
    // The second proposes another path; B rejects it.
    let other = PathRecord { sl: 9, ..alt_a() };
    let now = p.now;
    p.a.lap(now, a, &other, b"two").unwrap();
    settle(&mut p);
    assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Lap, Ev::Lap]);
    assert_eq!(
        *p.events_of(Side::B, b).last().unwrap(),
        Event::LapReceived {
            alternate_path: PathRecord { sl: 9, ..alt_b() },
            private_data: pd(b"two", ibcm_mad::LAP_PRIVATE_DATA_SIZE),
        }
    );
    assert_eq!(p.b.prepare_apr(b, AprStatus::Reject, &[], b"2"), Ok(None));
    p.b.send_apr(b).unwrap();
    settle(&mut p);
    assert_events(
        &mut p,
        Side::A,
        a,
        &[
            Ev::Rep,
            Ev::Apr(AprStatus::Success),
            Ev::Apr(AprStatus::Reject),
        ],
    );
    // The rejected proposal changed nothing: the first alternate stays.
    assert_eq!(p.a.query(a).unwrap().alternate_path, Some(alt_a()));
    assert_eq!(p.b.query(b).unwrap().alternate_path, Some(alt_b()));
    assert_eq!(dups(&p.b, AttributeId::Lap), 0);
    assert_sent(&mut p, Side::A, AttributeId::Lap, 2);
    assert_sent(&mut p, Side::B, AttributeId::Apr, 2);
    p.drive_for(5 * REQ_WAIT);
    assert_eq!(all_retries(&p.a) + all_retries(&p.b), 0);
    teardown(p, a, b, &[], &[]);
}

#[test]
fn lost_lap_k_times_then_success() {
    for k in 1..=3u32 {
        let (mut p, a, b) = established(24);
        p.fault(Side::A, AttributeId::Lap, k, Fate::Drop);
        let t0 = p.now;
        p.a.lap(t0, a, &alt_a(), b"lap").unwrap();
        run_until(&mut p, 4 * REQ_WAIT, |p| p.events(Side::B).len() == 3);
        assert_eq!(ns_since(&p, t0), u64::from(k) * REQ_WAIT + LAT, "k = {k}");
        assert_eq!(retries(&p.a, AttributeId::Lap), u64::from(k));
        assert_sent(&mut p, Side::A, AttributeId::Lap, k as usize + 1);
        p.b.prepare_apr(b, AprStatus::Success, &[], &[]).unwrap();
        p.b.send_apr(b).unwrap();
        p.drive_for(5 * REQ_WAIT);
        assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Lap]);
        assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Apr(AprStatus::Success)]);
        assert_eq!(retries(&p.a, AttributeId::Lap), u64::from(k));
        assert_sent(&mut p, Side::A, AttributeId::Lap, k as usize + 1);
        assert_sent(&mut p, Side::B, AttributeId::Apr, 1);
        assert_eq!(dups(&p.b, AttributeId::Lap), 0);
        assert_eq!(p.a.query(a).unwrap().alternate_path, Some(alt_a()));
        assert_eq!(p.b.query(b).unwrap().alternate_path, Some(alt_b()));
        teardown(p, a, b, &[], &[]);
    }
}

/// The APR is lost: A's LAP retry reaches B, which repeats its cached APR (a duplicate,
/// not a new LapReceived).
#[test]
fn lost_apr_is_repeated_for_the_lap_retry() {
    for k in 1..=2u32 {
        let (mut p, a, b) = established(25);
        p.fault(Side::B, AttributeId::Apr, k, Fate::Drop);
        let t0 = p.now;
        p.a.lap(t0, a, &alt_a(), b"lap").unwrap();
        settle(&mut p);
        p.b.prepare_apr(b, AprStatus::Success, b"i", b"apr")
            .unwrap();
        p.b.send_apr(b).unwrap();
        run_until(&mut p, 4 * REQ_WAIT, |p| p.events(Side::A).len() == 2);
        assert_eq!(
            ns_since(&p, t0),
            u64::from(k) * REQ_WAIT + 2 * LAT,
            "k = {k}"
        );
        assert_eq!(retries(&p.a, AttributeId::Lap), u64::from(k));
        assert_eq!(dups(&p.b, AttributeId::Lap), u64::from(k));
        assert_sent(&mut p, Side::B, AttributeId::Apr, k as usize + 1);
        assert_eq!(p.b.counters().sent[slot(AttributeId::Apr)], 1);
        p.drive_for(5 * REQ_WAIT);
        assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Lap]);
        assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Apr(AprStatus::Success)]);
        // The repeat is the same APR.
        assert_eq!(
            p.events_of(Side::A, a)[1],
            Event::AprReceived {
                status: AprStatus::Success,
                info: info72(b"i"),
                info_len: 1,
                private_data: pd(b"apr", ibcm_mad::APR_PRIVATE_DATA_SIZE),
            }
        );
        assert_eq!(p.a.query(a).unwrap().alternate_path, Some(alt_a()));
        assert_eq!(dups(&p.a, AttributeId::Apr), 0);
        teardown(p, a, b, &[], &[]);
    }
}

/// A duplicate LAP after B's MRA gets the MRA again; one LapReceived, one MraReceived.
#[test]
fn duplicate_lap_after_mra_repeats_the_mra() {
    let (mut p, a, b) = established(26);
    p.fault(Side::B, AttributeId::Mra, 1, Fate::Drop);
    let t0 = p.now;
    p.a.lap(t0, a, &alt_a(), b"").unwrap();
    settle(&mut p);
    p.b.mra(b, 20, b"").unwrap();
    run_until(&mut p, 2 * REQ_WAIT, |p| p.events(Side::A).len() == 2);
    assert_eq!(ns_since(&p, t0), REQ_WAIT + 2 * LAT);
    assert_eq!(dups(&p.b, AttributeId::Lap), 1);
    assert_sent(&mut p, Side::B, AttributeId::Mra, 2);
    assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Mra(20)]);
    p.b.prepare_apr(b, AprStatus::Success, &[], &[]).unwrap();
    p.b.send_apr(b).unwrap();
    p.drive_for(3 * REQ_WAIT);
    assert_events(
        &mut p,
        Side::A,
        a,
        &[Ev::Rep, Ev::Mra(20), Ev::Apr(AprStatus::Success)],
    );
    assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Lap]);
    assert_eq!(retries(&p.a, AttributeId::Lap), 1);
    teardown(p, a, b, &[], &[]);
}

#[test]
fn lost_lap_every_time_times_out_and_the_connection_stays() {
    let (mut p, a, b) = established(27);
    p.fault(Side::A, AttributeId::Lap, 4, Fate::Drop);
    let t0 = p.now;
    p.a.lap(t0, a, &alt_a(), b"lap").unwrap();
    run_until(&mut p, 5 * REQ_WAIT, |p| p.events(Side::A).len() == 2);
    // MaxCMRetries (3) + 1 sends, each waited out.
    assert_eq!(ns_since(&p, t0), 4 * REQ_WAIT);
    assert_events(
        &mut p,
        Side::A,
        a,
        &[Ev::Rep, Ev::Timeout(AttributeId::Lap)],
    );
    assert_eq!(retries(&p.a, AttributeId::Lap), 3);
    assert_sent(&mut p, Side::A, AttributeId::Lap, 4);
    // Still established, on its old paths; nothing else was sent.
    assert_states(&p, a, S::Established, b, S::Established);
    let qa = p.a.query(a).unwrap();
    assert_eq!(
        (qa.primary_path, qa.alternate_path),
        (Pair::path(Side::A), None)
    );
    let rts = p.a.qp_attributes(a, QpState::Rts).unwrap();
    assert_eq!((rts.alternate, rts.path_mig_state), (None, None));
    assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu]);
    assert_eq!(p.sent.len(), 3 + 4);
    assert_eq!(p.a.timer_entries(), 0);
    // A new LAP may follow, and succeed.
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"again").unwrap();
    settle(&mut p);
    p.b.prepare_apr(b, AprStatus::Success, &[], &[]).unwrap();
    p.b.send_apr(b).unwrap();
    settle(&mut p);
    assert_events(
        &mut p,
        Side::A,
        a,
        &[
            Ev::Rep,
            Ev::Timeout(AttributeId::Lap),
            Ev::Apr(AprStatus::Success),
        ],
    );
    assert_eq!(p.a.query(a).unwrap().alternate_path, Some(alt_a()));
    teardown(p, a, b, &[], &[]);
}

/// An APR with a failure status: reported with that status, no path changes on either
/// side (here the connection already had an alternate path from its REQ: it stays).
#[test]
fn lap_refused_by_the_apr_status() {
    let old_a = PathRecord {
        slid: 5,
        dlid: 6,
        sgid: gid(5),
        dgid: gid(6),
        ..Pair::path(Side::A)
    };
    for status in [
        AprStatus::Reject,
        AprStatus::InvalidGid,
        AprStatus::Unsupported,
    ] {
        let mut p = Pair::new(28);
        let l = p.b.create().unwrap();
        p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
        let a = p.a.create().unwrap();
        let cp = ConnectParams {
            alternate_path: Some(old_a),
            ..Pair::connect_params(SID, QPN_A)
        };
        let now = p.now;
        p.a.connect(now, a, &cp).unwrap();
        settle(&mut p);
        let b = p.last_request().unwrap();
        let now = p.now;
        // FailoverAccepted 0: the REQ's alternate path is loaded (IBA Table 110).
        let rp = RepParams {
            failover_accepted: ibcm_mad::Failover::Accepted,
            ..Pair::rep_params(QPN_B)
        };
        p.b.accept(now, b, &rp).unwrap();
        settle(&mut p);
        p.a.rtu(a, b"").unwrap();
        settle(&mut p);
        let before_a = p.a.query(a).unwrap();
        let before_b = p.b.query(b).unwrap();
        assert_eq!(before_a.alternate_path, Some(old_a));
        assert!(before_b.alternate_path.is_some());
        let rts_a = p.a.qp_attributes(a, QpState::Rts).unwrap();
        let rts_b = p.b.qp_attributes(b, QpState::Rts).unwrap();

        let now = p.now;
        p.a.lap(now, a, &alt_a(), b"").unwrap();
        settle(&mut p);
        assert_eq!(
            p.b.prepare_apr(b, status, b"why", b"no"),
            Ok(None),
            "{status:?}"
        );
        p.b.send_apr(b).unwrap();
        settle(&mut p);
        assert_eq!(
            *p.events_of(Side::A, a).last().unwrap(),
            Event::AprReceived {
                status,
                info: info72(b"why"),
                info_len: 3,
                private_data: pd(b"no", ibcm_mad::APR_PRIVATE_DATA_SIZE),
            }
        );
        assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Apr(status)]);
        assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Lap]);
        assert_eq!(p.a.query(a).unwrap(), before_a, "{status:?}");
        assert_eq!(p.b.query(b).unwrap(), before_b, "{status:?}");
        assert_eq!(p.a.qp_attributes(a, QpState::Rts).unwrap(), rts_a);
        assert_eq!(p.b.qp_attributes(b, QpState::Rts).unwrap(), rts_b);
        p.drive_for(5 * REQ_WAIT);
        assert_eq!(all_retries(&p.a) + all_retries(&p.b), 0);
        teardown(p, a, b, &[], &[l]);
    }
}

/// IBA 12.8.1: a LAP reaching the passive side in REP_SENT means the RTU was lost; the
/// connection is established (the REP retries stop) and the LAP is reported.
#[test]
fn lap_in_rep_sent_establishes_the_passive_side() {
    let mut p = Pair::new(29);
    let (a, _) = p.start_connect(SID);
    settle(&mut p);
    let b = p.last_request().unwrap();
    let now = p.now;
    p.b.take_request(b).unwrap();
    p.b.accept(now, b, &Pair::rep_params(QPN_B)).unwrap();
    settle(&mut p);
    p.fault(Side::A, AttributeId::Rtu, 1, Fate::Drop);
    p.a.rtu(a, b"").unwrap();
    settle(&mut p);
    assert_states(&p, a, S::Established, b, S::RepSent);
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"lap").unwrap();
    settle(&mut p);
    assert_state(&p.b, b, S::Established);
    assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Lap]);
    p.b.prepare_apr(b, AprStatus::Success, &[], &[]).unwrap();
    p.b.send_apr(b).unwrap();
    p.drive_for(5 * REP_WAIT);
    assert_eq!(retries(&p.b, AttributeId::Rep), 0);
    assert_sent(&mut p, Side::B, AttributeId::Rep, 1);
    assert_sent(&mut p, Side::A, AttributeId::Rtu, 1);
    assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Apr(AprStatus::Success)]);
    assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Lap]);
    assert_eq!(p.b.query(b).unwrap().alternate_path, Some(alt_b()));
    teardown(p, a, b, &[], &[]);
}

#[test]
fn lap_and_apr_are_refused_outside_established() {
    let mut p = Pair::new(30);
    let (a, l) = p.start_connect(SID);
    let now = p.now;
    assert_eq!(p.a.lap(now, a, &alt_a(), b""), invalid(S::ReqSent));
    assert_eq!(p.b.lap(now, l, &alt_a(), b""), invalid(S::Listen));
    assert_eq!(p.a.migrate(a), invalid(S::ReqSent));
    assert_eq!(p.b.migrate(l), invalid(S::Listen));
    settle(&mut p);
    let b = p.last_request().unwrap();
    assert_eq!(
        p.b.prepare_apr(b, AprStatus::Success, &[], &[]).map(|_| ()),
        invalid(S::ReqRcvd)
    );
    assert_eq!(p.b.send_apr(b), invalid(S::ReqRcvd));
    let idle = p.a.create().unwrap();
    assert_eq!(p.a.lap(now, idle, &alt_a(), b""), invalid(S::Idle));
    assert_eq!(p.a.migrate(idle), invalid(S::Idle));
    // Out-of-range and too-long values are refused on an established connection.
    let now = p.now;
    p.b.accept(now, b, &Pair::rep_params(QPN_B)).unwrap();
    settle(&mut p);
    p.a.rtu(a, b"").unwrap();
    settle(&mut p);
    let bad = PathRecord { sl: 16, ..alt_a() };
    let now = p.now;
    assert!(matches!(
        p.a.lap(now, a, &bad, b""),
        Err(CmError::OutOfRange { field: "sl", .. })
    ));
    assert!(matches!(
        p.a.lap(now, a, &alt_a(), &[0; 169]),
        Err(CmError::TooLong { .. })
    ));
    assert_sent(&mut p, Side::A, AttributeId::Lap, 0);
    p.a.lap(now, a, &alt_a(), &[0; 168]).unwrap();
    settle(&mut p);
    assert!(matches!(
        p.b.prepare_apr(b, AprStatus::Success, &[0; 73], &[]),
        Err(CmError::TooLong { .. })
    ));
    assert!(matches!(
        p.b.prepare_apr(b, AprStatus::Success, &[], &[0; 149]),
        Err(CmError::TooLong { .. })
    ));
    // The refused pre-APRs changed nothing.
    assert_eq!(p.b.send_apr(b), invalid(S::Established));
    p.b.prepare_apr(b, AprStatus::Success, &[0; 72], &[0; 148])
        .unwrap();
    p.b.send_apr(b).unwrap();
    settle(&mut p);
    assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Apr(AprStatus::Success)]);
    teardown(p, a, b, &[idle], &[]);
}

/// A LAP still open when the connection ends does not outlive it: a CEP reused after
/// timewait starts with no LAP in progress on either side.
#[test]
fn lap_state_does_not_outlive_the_connection() {
    let (mut p, a, b) = established(33);
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"").unwrap();
    settle(&mut p);
    assert_events(&mut p, Side::B, b, &[Ev::Req, Ev::Rtu, Ev::Lap]);
    // Disconnect with the LAP unanswered.
    let now = p.now;
    p.a.disconnect(now, a, b"").unwrap();
    settle(&mut p);
    assert_eq!(
        p.b.prepare_apr(b, AprStatus::Success, &[], &[]).map(|_| ()),
        invalid(S::DreqRcvd)
    );
    let now = p.now;
    p.b.drep(now, b, b"").unwrap();
    p.drive();
    assert_states(&p, a, S::Idle, b, S::Idle);
    assert_events(&mut p, Side::A, a, &[Ev::Rep, Ev::Drep, Ev::Exit]);
    assert_eq!(retries(&p.a, AttributeId::Lap), 0);
    // A's CEP connects again (B's listen is still there) and sends a LAP.
    let now = p.now;
    p.a.connect(now, a, &Pair::connect_params(SID, QPN_A))
        .unwrap();
    settle(&mut p);
    let b2 = p.last_request().unwrap();
    let now = p.now;
    p.b.accept(now, b2, &Pair::rep_params(QPN_B)).unwrap();
    settle(&mut p);
    p.a.rtu(a, b"").unwrap();
    settle(&mut p);
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"").unwrap();
    settle(&mut p);
    assert_events(&mut p, Side::B, b2, &[Ev::Req, Ev::Rtu, Ev::Lap]);
    p.b.prepare_apr(b2, AprStatus::Success, &[], &[]).unwrap();
    p.b.send_apr(b2).unwrap();
    settle(&mut p);
    // B's old CEP connects to A as an ordinary active side and receives a LAP.
    let la = p.a.create().unwrap();
    p.a.listen(la, Pair::listen_params(SID + 1, 4)).unwrap();
    let now = p.now;
    let cp = ConnectParams {
        primary_path: Pair::path(Side::B),
        ..Pair::connect_params(SID + 1, QPN_B + 1)
    };
    p.b.connect(now, b, &cp).unwrap();
    settle(&mut p);
    let a2 = p
        .events(Side::A)
        .iter()
        .rev()
        .find_map(|(c, e)| matches!(e, Event::ReqReceived(_)).then_some(*c))
        .unwrap();
    let now = p.now;
    p.a.accept(now, a2, &Pair::rep_params(QPN_A + 1)).unwrap();
    settle(&mut p);
    p.b.rtu(b, b"").unwrap();
    settle(&mut p);
    let now = p.now;
    p.a.lap(now, a2, &alt_a(), b"").unwrap();
    settle(&mut p);
    assert_eq!(ev(p.events_of(Side::B, b).last().unwrap()), Ev::Lap);
    p.b.prepare_apr(b, AprStatus::Success, &[], &[]).unwrap();
    p.b.send_apr(b).unwrap();
    settle(&mut p);
    assert_eq!(
        ev(p.events_of(Side::A, a2).last().unwrap()),
        Ev::Apr(AprStatus::Success)
    );
    assert_eq!(all_retries(&p.a) + all_retries(&p.b), 0);
    finish(p, &[a, a2, la], &[b, b2]);
}

// ---- migrate --------------------------------------------------------------------------

/// The path-migrated event: primary and alternate swap, in `query` and in the RTR/RTS
/// attributes, on both sides; a second migration swaps them back.
#[test]
fn migrate_swaps_primary_and_alternate() {
    let (mut p, a, b) = established(31);
    assert_eq!(p.a.migrate(a), invalid(S::Established), "no alternate yet");
    assert_eq!(p.b.migrate(b), invalid(S::Established), "no alternate yet");
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"").unwrap();
    settle(&mut p);
    p.b.prepare_apr(b, AprStatus::Success, &[], &[]).unwrap();
    p.b.send_apr(b).unwrap();
    settle(&mut p);
    let before_a_rts = p.a.qp_attributes(a, QpState::Rts).unwrap();
    let before_b_rtr = p.b.qp_attributes(b, QpState::Rtr).unwrap();

    let rows = [
        (
            Side::A,
            a,
            Pair::path(Side::A),
            ACK_A_PRIMARY,
            alt_a(),
            ACK_A_ALT,
        ),
        (Side::B, b, primary_b(), ACK_B_PRIMARY, alt_b(), ACK_B_ALT),
    ];
    for (side, cep, primary, ack_primary, alt, ack_alt) in rows {
        let m = p.node(side);
        m.migrate(cep).unwrap();
        let q = m.query(cep).unwrap();
        assert_eq!(
            (q.primary_path, q.alternate_path),
            (alt, Some(primary)),
            "{side:?}"
        );
        let rtr = m.qp_attributes(cep, QpState::Rtr).unwrap();
        assert_eq!(rtr.primary, Some(av(alt, ack_alt)), "{side:?}");
        assert_eq!(rtr.alternate, Some(av(primary, ack_primary)), "{side:?}");
        let rts = m.qp_attributes(cep, QpState::Rts).unwrap();
        assert_eq!(rts.timeout, Some(ack_alt), "{side:?}");
        assert_eq!(rts.alternate, Some(av(primary, ack_primary)), "{side:?}");
        assert_eq!(rts.path_mig_state, Some(MigrationState::Rearm));
        // Timewait follows the path in use.
        assert_eq!(
            q.timewait_ns,
            2 * ib(u32::from(alt.packet_life_time)) + ib(15),
            "{side:?}"
        );
        // And back.
        m.migrate(cep).unwrap();
        let q = m.query(cep).unwrap();
        assert_eq!((q.primary_path, q.alternate_path), (primary, Some(alt)));
        let rts = m.qp_attributes(cep, QpState::Rts).unwrap();
        assert_eq!(rts.timeout, Some(ack_primary));
        assert_eq!(rts.alternate, Some(av(alt, ack_alt)));
        m.migrate(cep).unwrap();
    }
    assert_ne!(p.a.qp_attributes(a, QpState::Rts).unwrap(), before_a_rts);
    assert_ne!(p.b.qp_attributes(b, QpState::Rtr).unwrap(), before_b_rtr);
    // Migration is local: nothing on the link.
    settle(&mut p);
    assert_eq!(p.sent.len(), 3 + 2);
    // The connection still disconnects and both sides go through timewait.
    teardown(p, a, b, &[], &[]);
}

/// After a migration the CM's own MADs follow the path in use: a DREQ goes to the new
/// path's LID and GID, with a GRH if that path leaves the subnet.
#[test]
fn mads_follow_the_migrated_path() {
    let remote = PathRecord {
        subnet_local: false,
        hop_limit: 8,
        ..alt_a()
    };
    let (mut p, a, b) = established(34);
    let now = p.now;
    p.a.lap(now, a, &remote, b"").unwrap();
    settle(&mut p);
    p.b.prepare_apr(b, AprStatus::Success, &[], &[]).unwrap();
    p.b.send_apr(b).unwrap();
    settle(&mut p);
    assert_eq!(p.a.query(a).unwrap().alternate_path, Some(remote));
    p.a.migrate(a).unwrap();
    let now = p.now;
    p.a.disconnect(now, a, b"").unwrap();
    let t = p.a.poll_transmit().expect("the DREQ");
    assert_eq!(
        t.dest,
        MadAddress {
            port: 1,
            lid: remote.dlid,
            gid: remote.dgid,
            grh: true,
            sl: remote.sl,
            pkey: 0xffff,
        }
    );
    // (Pair delivers by node, not by address: hand the DREQ over as the link would.)
    let src = MadAddress {
        port: 1,
        lid: 1,
        gid: gid(1),
        grh: false,
        sl: 0,
        pkey: 0xffff,
    };
    let now = p.now;
    p.b.handle_mad(now, &src, &t.mad);
    p.flush();
    assert_state(&p.b, b, S::DreqRcvd);
    let now = p.now;
    p.b.drep(now, b, b"").unwrap();
    p.drive();
    assert_states(&p, a, S::Idle, b, S::Idle);
    finish(p, &[a], &[b]);
}

/// An alternate path from the REQ can be migrated to without any LAP.
#[test]
fn migrate_to_the_req_alternate() {
    let alt = PathRecord {
        slid: 5,
        dlid: 6,
        sgid: gid(5),
        dgid: gid(6),
        ..Pair::path(Side::A)
    };
    let mut p = Pair::new(32);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
    let a = p.a.create().unwrap();
    let now = p.now;
    let cp = ConnectParams {
        alternate_path: Some(alt),
        ..Pair::connect_params(SID, QPN_A)
    };
    p.a.connect(now, a, &cp).unwrap();
    settle(&mut p);
    let b = p.last_request().unwrap();
    // Not before the connection is established.
    assert_eq!(p.b.migrate(b), invalid(S::ReqRcvd));
    let now = p.now;
    // FailoverAccepted 0: the REQ's alternate path is loaded (IBA Table 110).
    let rp = RepParams {
        failover_accepted: ibcm_mad::Failover::Accepted,
        ..Pair::rep_params(QPN_B)
    };
    p.b.accept(now, b, &rp).unwrap();
    settle(&mut p);
    assert_eq!(p.a.migrate(a), invalid(S::RepRcvd));
    p.a.rtu(a, b"").unwrap();
    settle(&mut p);
    p.a.migrate(a).unwrap();
    let q = p.a.query(a).unwrap();
    assert_eq!(
        (q.primary_path, q.alternate_path),
        (alt, Some(Pair::path(Side::A)))
    );
    teardown(p, a, b, &[], &[l]);
}

// ---- SIDR -----------------------------------------------------------------------------

/// A's SIDR_REQ: wait 2 x PLT(14) + 4.096us * 2^16 (= REQ_WAIT), three retries.
fn sidr(service_id: u64) -> SidrParams<'static> {
    SidrParams {
        service_id,
        port: 1,
        pkey: 0xffff,
        path: Pair::path(Side::A),
        timeout: 16,
        max_retries: 3,
        private_data: b"who serves?",
    }
}

fn sidr_reply(status: SidrStatus) -> SidrReplyParams<'static> {
    SidrReplyParams {
        status,
        qpn: 0x33,
        qkey: 0x1111_2222,
        info: b"info",
        private_data: b"served",
    }
}

fn address_of_a() -> MadAddress {
    MadAddress {
        port: 1,
        lid: 1,
        gid: gid(1),
        grh: false,
        sl: 0,
        pkey: 0xffff,
    }
}

fn served() -> Event {
    Event::SidrRepReceived(SidrRepInfo {
        status: SidrStatus::Success,
        qpn: 0x33,
        qkey: 0x1111_2222,
        info: info72(b"info"),
        info_len: 4,
        private_data: pd(b"served", ibcm_mad::SIDR_REP_PRIVATE_DATA_SIZE),
    })
}

fn refused(status: SidrStatus) -> Event {
    Event::SidrRepReceived(SidrRepInfo {
        status,
        qpn: 0,
        qkey: 0,
        info: [0; 72],
        info_len: 0,
        private_data: pd(b"", ibcm_mad::SIDR_REP_PRIVATE_DATA_SIZE),
    })
}

/// B listens on `SID`; A's new CEP sends a SIDR_REQ for `service_id`.
fn sidr_start(seed: u8, service_id: u64, backlog: u32) -> (Pair, CepId, CepId) {
    let mut p = Pair::new(seed);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, backlog)).unwrap();
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.sidr_request(now, a, &sidr(service_id)).unwrap();
    (p, a, l)
}

/// The newest SIDR_REQ-created CEP on B.
fn last_sidr(p: &Pair) -> Option<CepId> {
    p.events(Side::B).iter().rev().find_map(|(c, e)| match e {
        Event::SidrReqReceived(_) => Some(*c),
        _ => None,
    })
}

#[test]
fn sidr_success() {
    let (mut p, a, l) = sidr_start(41, SID, 4);
    assert_state(&p.a, a, S::SidrReqSent);
    let now = p.now;
    assert_eq!(
        p.a.sidr_request(now, a, &sidr(SID)),
        invalid(S::SidrReqSent)
    );
    assert_eq!(
        p.a.connect(now, a, &Pair::connect_params(SID, QPN_A)),
        invalid(S::SidrReqSent)
    );
    settle(&mut p);
    let b = last_sidr(&p).expect("SIDR_REQ received");
    assert_ne!(b, l);
    assert_state(&p.b, b, S::SidrReqRcvd);
    assert_eq!(
        p.events_of(Side::B, b),
        [Event::SidrReqReceived(ibcm_cep::SidrReqInfo {
            listen: l,
            port: 1,
            service_id: SID,
            pkey: 0xffff,
            source: address_of_a(),
            private_data: pd(b"who serves?", ibcm_mad::SIDR_REQ_PRIVATE_DATA_SIZE),
        })]
    );
    assert_events(&mut p, Side::B, l, &[]);
    // A SIDR CEP is not a connection.
    assert_eq!(
        p.b.accept(now, b, &Pair::rep_params(QPN_B)).map(|_| ()),
        invalid(S::SidrReqRcvd)
    );
    let now = p.now;
    p.b.sidr_reply(now, b, &sidr_reply(SidrStatus::Success))
        .unwrap();
    assert_state(&p.b, b, S::SidrRepSent);
    assert_eq!(
        p.b.sidr_reply(now, b, &sidr_reply(SidrStatus::Success)),
        invalid(S::SidrRepSent)
    );
    settle(&mut p);
    assert_eq!(p.events_of(Side::A, a), [served()]);
    // The requester is idle again, and may be reused.
    assert_state(&p.a, a, S::Idle);
    p.drive_for(5 * REQ_WAIT);
    assert_sent(&mut p, Side::A, AttributeId::SidrReq, 1);
    assert_sent(&mut p, Side::B, AttributeId::SidrRep, 1);
    assert_eq!(p.sent.len(), 2);
    assert_eq!(all_retries(&p.a) + all_retries(&p.b), 0);
    assert_eq!(p.b.counters().received[slot(AttributeId::SidrReq)], 1);
    assert_eq!(p.a.counters().received[slot(AttributeId::SidrRep)], 1);
    assert_eq!(p.a.counters().sent[slot(AttributeId::SidrReq)], 1);
    assert_eq!(p.b.counters().sent[slot(AttributeId::SidrRep)], 1);
    assert_eq!(p.a.peer_map_entries(), 0);
    let now = p.now;
    p.a.sidr_request(now, a, &sidr(SID)).unwrap();
    settle(&mut p);
    assert_eq!(p.events(Side::B).len(), 2, "a new request");
    finish(p, &[a], &[b, l]);
}

/// Once answered, B keeps the request a while (4 s) to repeat its answer; then the CEP
/// is idle, and still its owner's.
#[test]
fn sidr_rep_sent_lingers_then_goes_idle() {
    let (mut p, a, l) = sidr_start(42, SID, 4);
    settle(&mut p);
    let b = last_sidr(&p).unwrap();
    let t0 = p.now;
    p.b.sidr_reply(t0, b, &sidr_reply(SidrStatus::Success))
        .unwrap();
    assert_eq!(p.b.peer_map_entries(), 1);
    run_to(&mut p, t0.add_nanos(4_000_000_000 - 1));
    assert_state(&p.b, b, S::SidrRepSent);
    run_to(&mut p, t0.add_nanos(4_000_000_000));
    assert_state(&p.b, b, S::Idle);
    assert_eq!(p.b.peer_map_entries(), 0);
    assert_eq!(p.b.timer_entries(), 0);
    assert_eq!(p.b.live_ceps(), 2);
    assert_events(&mut p, Side::B, b, &[Ev::SidrReq]);
    finish(p, &[a], &[b, l]);
}

#[test]
fn sidr_without_listener_is_unsupported() {
    let (mut p, a, l) = sidr_start(43, SID + 1, 4);
    settle(&mut p);
    assert_eq!(p.events_of(Side::A, a), [refused(SidrStatus::Unsupported)]);
    assert_state(&p.a, a, S::Idle);
    assert_eq!(p.b.live_ceps(), 1, "no CEP for an unmatched SIDR_REQ");
    assert!(p.events(Side::B).is_empty());
    p.drive_for(5 * REQ_WAIT);
    assert_sent(&mut p, Side::A, AttributeId::SidrReq, 1);
    assert_sent(&mut p, Side::B, AttributeId::SidrRep, 1);
    assert_eq!(p.sent.len(), 2);
    finish(p, &[a], &[l]);
}

#[test]
fn lost_sidr_req_k_times_then_answered() {
    for k in 1..=3u32 {
        let mut p = Pair::new(44);
        p.fault(Side::A, AttributeId::SidrReq, k, Fate::Drop);
        let l = p.b.create().unwrap();
        p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
        let a = p.a.create().unwrap();
        let t0 = p.now;
        p.a.sidr_request(t0, a, &sidr(SID)).unwrap();
        run_until(&mut p, 5 * REQ_WAIT, |p| last_sidr(p).is_some());
        assert_eq!(ns_since(&p, t0), u64::from(k) * REQ_WAIT + LAT, "k = {k}");
        assert_eq!(retries(&p.a, AttributeId::SidrReq), u64::from(k));
        let b = last_sidr(&p).unwrap();
        let now = p.now;
        p.b.sidr_reply(now, b, &sidr_reply(SidrStatus::Success))
            .unwrap();
        p.drive_for(5 * REQ_WAIT);
        assert_eq!(p.events_of(Side::A, a), [served()]);
        assert_events(&mut p, Side::B, b, &[Ev::SidrReq]);
        assert_sent(&mut p, Side::A, AttributeId::SidrReq, k as usize + 1);
        assert_sent(&mut p, Side::B, AttributeId::SidrRep, 1);
        assert_eq!(retries(&p.a, AttributeId::SidrReq), u64::from(k));
        assert_eq!(dups(&p.b, AttributeId::SidrReq), 0);
        finish(p, &[a], &[b, l]);
    }
}

/// The same SIDR_REQ twice: reported once, answered once (the second copy arrives before
/// the answer and is dropped as a duplicate).
#[test]
fn duplicated_sidr_req_is_reported_and_answered_once() {
    let mut p = Pair::new(45);
    p.fault(Side::A, AttributeId::SidrReq, 1, Fate::Duplicate);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.sidr_request(now, a, &sidr(SID)).unwrap();
    settle(&mut p);
    let b = last_sidr(&p).unwrap();
    assert_eq!(p.events(Side::B).len(), 1);
    assert_eq!(dups(&p.b, AttributeId::SidrReq), 1);
    assert_eq!(p.b.counters().received[slot(AttributeId::SidrReq)], 2);
    assert_eq!(p.b.live_ceps(), 2);
    assert_sent(&mut p, Side::B, AttributeId::SidrRep, 0);
    let now = p.now;
    p.b.sidr_reply(now, b, &sidr_reply(SidrStatus::Success))
        .unwrap();
    p.drive_for(5 * REQ_WAIT);
    assert_sent(&mut p, Side::B, AttributeId::SidrRep, 1);
    assert_eq!(p.events_of(Side::A, a), [served()]);
    assert_events(&mut p, Side::B, b, &[Ev::SidrReq]);
    assert_eq!(dups(&p.a, AttributeId::SidrRep), 0);
    finish(p, &[a], &[b, l]);
}

/// The SIDR_REP is lost: A's retry is a repeat after the answer; B sends the same
/// SIDR_REP again, with no new event -- also after its owner destroyed the CEP, as long as
/// the request is remembered.
#[test]
fn repeated_sidr_req_after_the_answer_gets_the_same_sidr_rep() {
    let mut p = Pair::new(46);
    p.fault(Side::B, AttributeId::SidrRep, 2, Fate::Drop);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
    let a = p.a.create().unwrap();
    let t0 = p.now;
    p.a.sidr_request(t0, a, &sidr(SID)).unwrap();
    settle(&mut p);
    let b = last_sidr(&p).unwrap();
    let now = p.now;
    p.b.sidr_reply(now, b, &sidr_reply(SidrStatus::Success))
        .unwrap();
    run_until(&mut p, 2 * REQ_WAIT, |p| {
        p.sent_count(Side::B, AttributeId::SidrRep) == 2
    });
    assert_eq!(ns_since(&p, t0), REQ_WAIT + LAT);
    assert_eq!(dups(&p.b, AttributeId::SidrReq), 1);
    let now = p.now;
    p.b.destroy(now, b).unwrap();
    assert_eq!(p.b.state(b), Err(CmError::UnknownCep));
    run_until(&mut p, 2 * REQ_WAIT, |p| !p.events(Side::A).is_empty());
    assert_eq!(ns_since(&p, t0), 2 * REQ_WAIT + 2 * LAT);
    assert_eq!(p.events_of(Side::A, a), [served()]);
    assert_events(&mut p, Side::B, b, &[Ev::SidrReq]);
    assert_eq!(p.events(Side::B).len(), 1, "no new SidrReqReceived");
    assert_eq!(dups(&p.b, AttributeId::SidrReq), 2);
    assert_eq!(retries(&p.a, AttributeId::SidrReq), 2);
    assert_sent(&mut p, Side::B, AttributeId::SidrRep, 3);
    assert_eq!(p.b.counters().sent[slot(AttributeId::SidrRep)], 1);
    p.drive_for(5 * REQ_WAIT);
    assert_sent(&mut p, Side::A, AttributeId::SidrReq, 3);
    assert_eq!(dups(&p.a, AttributeId::SidrRep), 0);
    finish(p, &[a], &[l]);
}

#[test]
fn sidr_times_out_when_every_request_is_lost() {
    let mut p = Pair::new(47);
    p.fault(Side::A, AttributeId::SidrReq, 4, Fate::Drop);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
    let a = p.a.create().unwrap();
    let t0 = p.now;
    p.a.sidr_request(t0, a, &sidr(SID)).unwrap();
    run_until(&mut p, 5 * REQ_WAIT, |p| !p.events(Side::A).is_empty());
    assert_eq!(ns_since(&p, t0), 4 * REQ_WAIT);
    assert_events(&mut p, Side::A, a, &[Ev::Timeout(AttributeId::SidrReq)]);
    assert_state(&p.a, a, S::Idle);
    assert_eq!(retries(&p.a, AttributeId::SidrReq), 3);
    assert_sent(&mut p, Side::A, AttributeId::SidrReq, 4);
    p.drive();
    assert!(p.events(Side::B).is_empty());
    assert_eq!(p.sent.len(), 4);
    assert_eq!(p.a.timer_entries(), 0);
    finish(p, &[a], &[l]);
}

/// Linux `ib_destroy_cm_id` in SIDR_REQ_RCVD: the request is answered with Reject.
#[test]
fn destroy_of_an_unanswered_sidr_req_rejects_it() {
    let (mut p, a, l) = sidr_start(48, SID, 4);
    settle(&mut p);
    let b = last_sidr(&p).unwrap();
    let now = p.now;
    p.b.destroy(now, b).unwrap();
    assert_eq!(p.b.state(b), Err(CmError::UnknownCep));
    assert_eq!(p.b.live_ceps(), 1);
    assert_eq!(p.b.peer_map_entries(), 0);
    assert_sent(&mut p, Side::B, AttributeId::SidrRep, 1);
    settle(&mut p);
    assert_eq!(p.events_of(Side::A, a), [refused(SidrStatus::Reject)]);
    assert_state(&p.a, a, S::Idle);
    p.drive();
    assert_events(&mut p, Side::B, b, &[Ev::SidrReq]);
    assert_eq!(p.sent.len(), 2);
    finish(p, &[a], &[l]);
}

/// Destroying the requester abandons the request: no more retries, no event.
#[test]
fn destroy_of_the_requester_stops_its_retries() {
    let mut p = Pair::new(49);
    p.fault(Side::A, AttributeId::SidrReq, u32::MAX, Fate::Drop);
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.sidr_request(now, a, &sidr(SID)).unwrap();
    p.a.destroy(now, a).unwrap();
    assert_eq!(p.a.live_ceps(), 0);
    p.drive();
    assert_sent(&mut p, Side::A, AttributeId::SidrReq, 1);
    assert!(p.events(Side::A).is_empty());
    finish(p, &[], &[]);
}

/// The backlog counts SIDR requests as it counts REQs, from their event until answered:
/// beyond it a SIDR request is dropped silently (its sender retries), a REQ is held and
/// reported once there is room (held.rs); the SIDR retry gets in once both are answered.
#[test]
fn backlog_applies_to_sidr() {
    let mut p = Pair::new(50);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 1)).unwrap();
    let a1 = p.a.create().unwrap();
    let a2 = p.a.create().unwrap();
    let now = p.now;
    p.a.sidr_request(now, a1, &sidr(SID)).unwrap();
    p.a.sidr_request(now, a2, &sidr(SID)).unwrap();
    settle(&mut p);
    assert_eq!(p.events(Side::B).len(), 1);
    assert_eq!(p.b.counters().backlog_drops, 1);
    assert_sent(&mut p, Side::B, AttributeId::SidrRep, 0);
    let b1 = last_sidr(&p).unwrap();
    // A SIDR request reported and not answered fills the backlog for REQs too: the REQ
    // is held, not reported.
    let c = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, c, &Pair::connect_params(SID, QPN_A))
        .unwrap();
    settle(&mut p);
    assert_eq!(p.b.counters().backlog_drops, 1);
    assert_eq!(p.events(Side::B).len(), 1);
    let now = p.now;
    p.b.sidr_reply(now, b1, &sidr_reply(SidrStatus::Success))
        .unwrap();
    // Answering it reports the held REQ at once.
    p.flush();
    assert_eq!(p.events(Side::B).len(), 2);
    let bc = p.events(Side::B)[1].0;
    assert!(matches!(p.events(Side::B)[1].1, Event::ReqReceived(_)));
    let now = p.now;
    let refuse = ibcm_cep::RejectParams {
        reason: ibcm_mad::RejReason::ConsumerDefined,
        ari: &[],
        private_data: &[],
    };
    p.b.reject(now, bc, &refuse).unwrap();
    // A2's retry finds room.
    run_until(&mut p, 2 * REQ_WAIT, |p| p.events(Side::B).len() == 3);
    let b2 = last_sidr(&p).expect("the retry got in");
    assert_ne!(b2, b1);
    let now = p.now;
    p.b.sidr_reply(now, b2, &sidr_reply(SidrStatus::Success))
        .unwrap();
    settle(&mut p);
    assert_eq!(p.events_of(Side::A, a1), [served()]);
    assert_eq!(p.events_of(Side::A, a2), [served()]);
    assert_eq!(retries(&p.a, AttributeId::SidrReq), 1);
    finish(p, &[a1, a2, c], &[b1, b2, bc, l]);
}

#[test]
fn sidr_values_are_checked() {
    let mut p = Pair::new(51);
    let a = p.a.create().unwrap();
    let now = p.now;
    let bad = [
        SidrParams {
            timeout: 32,
            ..sidr(SID)
        },
        SidrParams {
            max_retries: 16,
            ..sidr(SID)
        },
    ];
    for params in bad {
        assert!(matches!(
            p.a.sidr_request(now, a, &params),
            Err(CmError::OutOfRange { .. })
        ));
    }
    assert!(matches!(
        p.a.sidr_request(
            now,
            a,
            &SidrParams {
                private_data: &[0; 217],
                ..sidr(SID)
            }
        ),
        Err(CmError::TooLong { .. })
    ));
    assert_state(&p.a, a, S::Idle);
    assert_eq!(p.sent.len(), 0);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
    p.a.sidr_request(now, a, &sidr(SID)).unwrap();
    settle(&mut p);
    let b = last_sidr(&p).unwrap();
    let now = p.now;
    for bad in [
        SidrReplyParams {
            qpn: 1 << 24,
            ..sidr_reply(SidrStatus::Success)
        },
        SidrReplyParams {
            info: &[0; 73],
            ..sidr_reply(SidrStatus::Success)
        },
        SidrReplyParams {
            private_data: &[0; 137],
            ..sidr_reply(SidrStatus::Success)
        },
    ] {
        assert!(p.b.sidr_reply(now, b, &bad).is_err());
        assert_state(&p.b, b, S::SidrReqRcvd);
    }
    assert_eq!(
        p.b.sidr_reply(now, l, &sidr_reply(SidrStatus::Success)),
        invalid(S::Listen)
    );
    p.b.sidr_reply(now, b, &sidr_reply(SidrStatus::NoQp))
        .unwrap();
    settle(&mut p);
    let got = p.events_of(Side::A, a);
    let [Event::SidrRepReceived(info)] = got.as_slice() else {
        panic!("{got:?}")
    };
    assert_eq!(info.status, SidrStatus::NoQp);
    finish(p, &[a], &[b, l]);
}

// ---- peer-to-peer -----------------------------------------------------------------------

/// How the two peers' REQs meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// A connects 1 us before B: A's REQ reaches B first (both REQs in flight).
    AFirst,
    /// B connects 1 us before A.
    BFirst,
    /// Both at the same instant: the REQs cross on the link.
    Crossing,
    /// B connects; its REQ reaches A, which has nothing for it (REJ InvalidServiceId);
    /// only then A connects.
    ALate,
    /// The mirror image.
    BLate,
}

fn p2p_params(side: Side, qpn: u32) -> ConnectParams<'static> {
    ConnectParams {
        primary_path: Pair::path(side),
        private_data: match side {
            Side::A => b"peer A",
            Side::B => b"peer B",
        },
        ..Pair::connect_params(SID, qpn)
    }
}

struct P2p {
    guid_a: u64,
    guid_b: u64,
    qpn_a: u32,
    qpn_b: u32,
    order: Order,
    lost: Option<Side>,
    /// The passive side answers with prepare_rep + send_rep (else accept).
    split: bool,
}

fn p2p_case(c: &P2p) {
    let ctx = format!(
        "GUIDs {:#x}/{:#x} QPNs {:#x}/{:#x} {:?} lost {:?}",
        c.guid_a, c.guid_b, c.qpn_a, c.qpn_b, c.order, c.lost
    );
    let mut p = Pair::with_config(
        CmConfig::new(c.guid_a, [61; 32]),
        CmConfig::new(c.guid_b, [62; 32]),
    );
    if let Some(side) = c.lost {
        p.fault(side, AttributeId::Req, 1, Fate::Drop);
    }
    let a = p.a.create().unwrap();
    let b = p.b.create().unwrap();
    let (pa, pb) = (p2p_params(Side::A, c.qpn_a), p2p_params(Side::B, c.qpn_b));
    let t0 = p.now;
    let (first, gap) = match c.order {
        Order::AFirst => (Side::A, 1_000),
        Order::BFirst => (Side::B, 1_000),
        Order::Crossing => (Side::A, 0),
        Order::ALate => (Side::B, 10_000),
        Order::BLate => (Side::A, 10_000),
    };
    let (cep_first, params_first, cep_second, params_second) = match first {
        Side::A => (a, &pa, b, &pb),
        Side::B => (b, &pb, a, &pa),
    };
    p.node(first)
        .connect_peer(t0, cep_first, params_first)
        .unwrap();
    p.flush();
    run_to(&mut p, t0.add_nanos(gap));
    let now = p.now;
    p.node(first.peer())
        .connect_peer(now, cep_second, params_second)
        .unwrap();
    assert_states(&p, a, S::ReqSent, b, S::ReqSent);

    // The larger (CA GUID, QPN) stays active.
    let (winner, loser) = if (c.guid_a, c.qpn_a) > (c.guid_b, c.qpn_b) {
        (Side::A, Side::B)
    } else {
        (Side::B, Side::A)
    };
    let cep = |side: Side| if side == Side::A { a } else { b };
    let (w, l) = (cep(winner), cep(loser));
    let (w_guid, w_qpn, l_guid, l_qpn) = match winner {
        Side::A => (c.guid_a, c.qpn_a, c.guid_b, c.qpn_b),
        Side::B => (c.guid_b, c.qpn_b, c.guid_a, c.qpn_a),
    };
    run_until(&mut p, 3 * REQ_WAIT, |p| !p.events(loser).is_empty());
    let got = p.events_of(loser, l);
    let [Event::ReqReceived(info)] = got.as_slice() else {
        panic!("{ctx}: loser {loser:?}: {got:?}")
    };
    // On its own CEP, which it names as the listen.
    assert_eq!(info.listen, l, "{ctx}");
    assert_eq!(info.service_id, SID, "{ctx}");
    assert_eq!(
        (info.remote_ca_guid, info.remote_qpn),
        (w_guid, w_qpn),
        "{ctx}"
    );
    assert_eq!(
        info.primary_path,
        PathRecord {
            packet_life_time: 15,
            ..Pair::path(loser)
        },
        "{ctx}"
    );
    let w_pd: &[u8] = if winner == Side::A {
        b"peer A"
    } else {
        b"peer B"
    };
    assert_eq!(info.private_data, pd(w_pd, 92), "{ctx}");
    assert_state(p.node(loser), l, S::ReqRcvd);
    assert_state(p.node(winner), w, S::ReqSent);
    assert!(p.events(winner).is_empty(), "{ctx}: {:?}", p.events(winner));
    let q = p.node(loser).query(l).unwrap();
    assert!(!q.active, "{ctx}");
    assert!(p.node(winner).query(w).unwrap().active, "{ctx}");

    // The loser answers as any passive side does.
    let rep = RepParams {
        private_data: b"loser accepts",
        ..Pair::rep_params(l_qpn)
    };
    let now = p.now;
    if c.split {
        p.node(loser).prepare_rep(l, &rep).unwrap();
        p.node(loser).send_rep(now, l).unwrap();
    } else {
        p.node(loser).accept(now, l, &rep).unwrap();
    }
    settle(&mut p);
    let got = p.events_of(winner, w);
    let [Event::RepReceived(rinfo)] = got.as_slice() else {
        panic!("{ctx}: winner {winner:?}: {got:?}")
    };
    assert_eq!(
        (rinfo.remote_ca_guid, rinfo.remote_qpn),
        (l_guid, l_qpn),
        "{ctx}"
    );
    assert_eq!(rinfo.private_data, pd(b"loser accepts", 196), "{ctx}");
    p.node(winner).rtu(w, b"winner").unwrap();
    settle(&mut p);
    assert_states(&p, a, S::Established, b, S::Established);
    // Long enough for any stray retry.
    p.drive_for(6 * REQ_WAIT);
    assert_states(&p, a, S::Established, b, S::Established);
    assert_events(&mut p, loser, l, &[Ev::Req, Ev::Rtu]);
    assert_events(&mut p, winner, w, &[Ev::Rep]);
    assert_eq!(
        p.events_of(loser, l)[1],
        Event::RtuReceived(pd(b"winner", 224)),
        "{ctx}"
    );
    assert_sent(&mut p, loser, AttributeId::Rep, 1);
    assert_sent(&mut p, winner, AttributeId::Rep, 0);
    assert_sent(&mut p, winner, AttributeId::Rtu, 1);
    assert_sent(&mut p, loser, AttributeId::Rtu, 0);
    // The only REJ: the late side's answer to a REQ that came before it connected.
    let late = match c.order {
        Order::ALate => Some(Side::A),
        Order::BLate => Some(Side::B),
        _ => None,
    };
    for side in [Side::A, Side::B] {
        let want = usize::from(late == Some(side));
        assert_eq!(
            p.sent_count(side, AttributeId::Rej),
            want,
            "{ctx}: REJ from {side:?}"
        );
    }
    // The loser stopped retrying its REQ once it turned passive.
    assert_eq!(
        all_retries(p.node(loser)),
        retries(p.node(loser), AttributeId::Req)
    );
    // The two sides agree on the connection.
    let (qa, qb) = (p.a.query(a).unwrap(), p.b.query(b).unwrap());
    assert_eq!((qa.remote_qpn, qb.remote_qpn), (c.qpn_b, c.qpn_a), "{ctx}");
    assert_eq!(
        (qa.remote_ca_guid, qb.remote_ca_guid),
        (c.guid_b, c.guid_a),
        "{ctx}"
    );
    let (ra, rb) = (
        p.a.qp_attributes(a, QpState::Rts).unwrap(),
        p.b.qp_attributes(b, QpState::Rts).unwrap(),
    );
    let (ta, tb) = (
        p.a.qp_attributes(a, QpState::Rtr).unwrap(),
        p.b.qp_attributes(b, QpState::Rtr).unwrap(),
    );
    assert_eq!((ra.sq_psn, rb.sq_psn), (tb.rq_psn, ta.rq_psn), "{ctx}");
    assert_eq!((ta.dest_qpn, tb.dest_qpn), (Some(c.qpn_b), Some(c.qpn_a)));
    assert!(
        p.events_a
            .iter()
            .chain(&p.events_b)
            .all(|(_, e)| !matches!(e, Event::Rejected { .. } | Event::Timeout { .. })),
        "{ctx}"
    );
    // A disconnects; both go through timewait.
    let now = p.now;
    p.a.disconnect(now, a, b"").unwrap();
    settle(&mut p);
    let now = p.now;
    p.b.drep(now, b, b"").unwrap();
    p.drive();
    assert_states(&p, a, S::Idle, b, S::Idle);
    finish(p, &[a], &[b]);
}

#[test]
fn peer_to_peer_every_ordering() {
    const G: u64 = 0x0002_c903_0000_00cc;
    // (GUID A, GUID B, QPN A, QPN B): B wins by GUID, A by GUID, then QPN ties both ways.
    let configs = [
        (GUID_A, GUID_B, QPN_A, QPN_B),
        (GUID_B, GUID_A, QPN_A, QPN_B),
        (G, G, QPN_A, QPN_B),
        (G, G, QPN_B, QPN_A),
        // A larger QPN does not beat a larger GUID.
        (GUID_B, GUID_A, 0x10, 0xff_ffff),
    ];
    let orders = [
        Order::AFirst,
        Order::BFirst,
        Order::Crossing,
        Order::ALate,
        Order::BLate,
    ];
    let mut n = 0;
    for (guid_a, guid_b, qpn_a, qpn_b) in configs {
        for order in orders {
            for lost in [None, Some(Side::A), Some(Side::B)] {
                if lost.is_some() && matches!(order, Order::ALate | Order::BLate) {
                    continue;
                }
                p2p_case(&P2p {
                    guid_a,
                    guid_b,
                    qpn_a,
                    qpn_b,
                    order,
                    lost,
                    split: n % 2 == 1,
                });
                n += 1;
            }
        }
    }
    assert_eq!(n, 5 * (3 * 3 + 2));
}

/// A peer-to-peer CEP whose peer never connects keeps retrying through the peer's
/// REJ(InvalidServiceId)s, and times out; an ordinary connect takes the REJ at once.
#[test]
fn peer_to_peer_alone_times_out() {
    let mut p = Pair::new(63);
    let a = p.a.create().unwrap();
    let t0 = p.now;
    p.a.connect_peer(t0, a, &p2p_params(Side::A, QPN_A))
        .unwrap();
    run_until(&mut p, 5 * REQ_WAIT, |p| !p.events(Side::A).is_empty());
    assert_eq!(ns_since(&p, t0), 4 * REQ_WAIT);
    assert_events(&mut p, Side::A, a, &[Ev::Timeout(AttributeId::Req)]);
    assert_state(&p.a, a, S::Idle);
    assert_sent(&mut p, Side::A, AttributeId::Req, 4);
    assert_sent(&mut p, Side::B, AttributeId::Rej, 4);
    assert_eq!(p.a.counters().received[slot(AttributeId::Rej)], 4);
    p.drive();
    // The CEP, back to idle, connects as an ordinary CEP: the REJ now ends it.
    let now = p.now;
    p.a.connect(now, a, &Pair::connect_params(SID, QPN_A))
        .unwrap();
    settle(&mut p);
    assert_state(&p.a, a, S::Idle);
    assert_events(
        &mut p,
        Side::A,
        a,
        &[Ev::Timeout(AttributeId::Req), Ev::Rej],
    );
    assert_sent(&mut p, Side::A, AttributeId::Req, 5);
    finish(p, &[a], &[]);
}

/// A peer-to-peer REQ for another service, or from another node, is not a crossing: it
/// goes to the listens as usual.
#[test]
fn peer_to_peer_only_crosses_its_own_service() {
    let mut p = Pair::new(64);
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.connect_peer(now, a, &p2p_params(Side::A, QPN_A))
        .unwrap();
    // B connects to another service A listens on.
    let la = p.a.create().unwrap();
    p.a.listen(la, Pair::listen_params(SID + 1, 4)).unwrap();
    let b = p.b.create().unwrap();
    let cp = ConnectParams {
        service_id: SID + 1,
        ..p2p_params(Side::B, QPN_B)
    };
    p.b.connect_peer(now, b, &cp).unwrap();
    settle(&mut p);
    // A's REQ found nothing on B; B's reached A's listen, on a new CEP.
    assert_state(&p.a, a, S::ReqSent);
    let got = p.events(Side::A).to_vec();
    let [(nb, Event::ReqReceived(info))] = got.as_slice() else {
        panic!("{got:?}")
    };
    assert_ne!(*nb, a);
    assert_eq!(info.listen, la);
    assert_sent(&mut p, Side::B, AttributeId::Rej, 1);
    assert!(p.events(Side::B).is_empty());
    finish(p, &[a, la, *nb], &[b]);
}

// ---- ClassPortInfo ---------------------------------------------------------------------

#[test]
fn class_port_info_get_is_answered() {
    let mut p = Pair::new(71);
    let mut mad = [0u8; MAD_SIZE];
    CmMad {
        header: MadHeader {
            method: Method::Get,
            ..MadHeader::send(0x1234_5678_9abc_def0)
        },
        message: CmMessage::ClassPortInfo(ClassPortInfo::default()),
    }
    .emit(&mut mad)
    .unwrap();
    let src = MadAddress {
        port: 1,
        lid: 9,
        gid: gid(9),
        grh: false,
        sl: 2,
        pkey: 0xffff,
    };
    let now = p.now;
    p.a.handle_mad(now, &src, &mad);
    let t = p.a.poll_transmit().expect("a GetResp");
    assert!(p.a.poll_transmit().is_none(), "exactly one answer");
    assert_eq!(t.dest, src);
    let resp = CmMad::parse(&t.mad).unwrap();
    assert_eq!(resp.header.method, Method::GetResp);
    assert_eq!(resp.header.transaction_id, 0x1234_5678_9abc_def0);
    assert_eq!(resp.header.status, 0);
    let CmMessage::ClassPortInfo(cpi) = resp.message else {
        panic!("{:?}", resp.message)
    };
    assert_eq!((cpi.base_version, cpi.class_version), (1, 2));
    assert_ne!(cpi.resp_time_value, 0);
    assert!(cpi.resp_time_value <= 31);
    let ci = slot(AttributeId::ClassPortInfo);
    assert_eq!(p.a.counters().received[ci], 1);
    assert_eq!(p.a.counters().sent[ci], 1);
    assert_eq!(p.a.counters().unmatched, 0);
    assert_eq!(p.a.poll_event(), None);
    assert_eq!(p.a.live_ceps(), 0);
    // A GetResp (someone else's answer) is not answered.
    let mut resp_mad = t.mad;
    let now = p.now;
    p.a.handle_mad(now, &src, &resp_mad);
    assert!(p.a.poll_transmit().is_none());
    assert_eq!(p.a.counters().received[ci], 1);
    // Nor one whose class version is wrong.
    resp_mad[2] = 1;
    p.a.handle_mad(now, &src, &resp_mad);
    assert!(p.a.poll_transmit().is_none());
    assert_eq!(p.a.counters().malformed, 1);
    finish(p, &[], &[]);
}

// ---- port removal ----------------------------------------------------------------------

/// Every kind of CEP A can hold, and the peer CEPs B holds for them.
struct Zoo {
    p: Pair,
    /// A's CEPs on port 1, by the state they are in.
    bound: Vec<(&'static str, CepId, S)>,
    /// A's CEPs removal must not touch.
    spared: Vec<(&'static str, CepId, S)>,
    /// A CEP A destroyed that lingers (DREQ sent, then timewait) on port 1.
    detached: CepId,
    /// B's CEPs.
    b: Vec<CepId>,
}

const S_A: u64 = 0x2000;
const S_A_ANY: u64 = 0x3000;
const S_B: u64 = 0x4000;

fn zoo() -> Zoo {
    let mut p = Pair::new(81);
    let mut qpn = 0x100u32;
    let mut next_qpn = || {
        qpn += 1;
        qpn
    };
    let mut bound = Vec::new();
    let mut spared = Vec::new();
    let mut b_ceps = Vec::new();
    // B's listens.
    let lb = p.b.create().unwrap();
    p.b.listen(lb, Pair::listen_params(S_B, 64)).unwrap();
    b_ceps.push(lb);
    // A's listens: one on port 1, one on any port, one on port 2.
    let l1 = p.a.create().unwrap();
    p.a.listen(
        l1,
        ListenParams {
            port: Some(1),
            ..Pair::listen_params(S_A, 64)
        },
    )
    .unwrap();
    bound.push(("listen on port 1", l1, S::Listen));
    let l_any = p.a.create().unwrap();
    p.a.listen(l_any, Pair::listen_params(S_A_ANY, 64)).unwrap();
    spared.push(("listen on any port", l_any, S::Listen));
    let l2 = p.a.create().unwrap();
    p.a.listen(
        l2,
        ListenParams {
            port: Some(2),
            ..Pair::listen_params(S_A, 64)
        },
    )
    .unwrap();
    spared.push(("listen on port 2", l2, S::Listen));
    let idle = p.a.create().unwrap();
    spared.push(("idle", idle, S::Idle));

    // A active: connect to B, B's answer as each state needs.
    let mut a_connects = |p: &mut Pair, port: u8| -> (CepId, CepId) {
        let a = p.a.create().unwrap();
        let now = p.now;
        let cp = ConnectParams {
            port,
            ..Pair::connect_params(S_B, next_qpn())
        };
        p.a.connect(now, a, &cp).unwrap();
        settle(p);
        let b = p.last_request().unwrap();
        p.b.take_request(b).unwrap();
        (a, b)
    };
    let (a, b) = a_connects(&mut p, 1);
    bound.push(("REQ sent", a, S::ReqSent));
    b_ceps.push(b);
    let accept_b = |p: &mut Pair, b: CepId| {
        let now = p.now;
        p.b.accept(now, b, &Pair::rep_params(0x900 + b.to_raw() % 0x100))
            .unwrap();
        settle(p);
    };
    let (a, b) = a_connects(&mut p, 1);
    accept_b(&mut p, b);
    bound.push(("REP received", a, S::RepRcvd));
    b_ceps.push(b);
    let mut establish = |p: &mut Pair, port: u8| -> (CepId, CepId) {
        let (a, b) = a_connects(p, port);
        accept_b(p, b);
        p.a.rtu(a, b"").unwrap();
        settle(p);
        (a, b)
    };
    let (a, b) = establish(&mut p, 1);
    bound.push(("established", a, S::Established));
    b_ceps.push(b);
    let (a, b) = establish(&mut p, 1);
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"").unwrap();
    settle(&mut p);
    bound.push(("LAP sent", a, S::Established));
    b_ceps.push(b);
    let (a, b) = establish(&mut p, 1);
    let now = p.now;
    p.a.disconnect(now, a, b"").unwrap();
    settle(&mut p);
    bound.push(("DREQ sent", a, S::DreqSent));
    b_ceps.push(b);
    let (a, b) = establish(&mut p, 1);
    let now = p.now;
    p.b.disconnect(now, b, b"").unwrap();
    settle(&mut p);
    bound.push(("DREQ received", a, S::DreqRcvd));
    b_ceps.push(b);
    let (a, b) = establish(&mut p, 1);
    let now = p.now;
    p.a.disconnect(now, a, b"").unwrap();
    settle(&mut p);
    let now = p.now;
    p.b.drep(now, b, b"").unwrap();
    settle(&mut p);
    bound.push(("timewait", a, S::Timewait));
    b_ceps.push(b);
    let (detached, b) = establish(&mut p, 1);
    let now = p.now;
    p.a.destroy(now, detached).unwrap();
    settle(&mut p);
    b_ceps.push(b);
    let (a, b) = establish(&mut p, 2);
    spared.push(("established on port 2", a, S::Established));
    b_ceps.push(b);
    // A's SIDR request, which B has not answered.
    let sa = p.a.create().unwrap();
    let now = p.now;
    p.a.sidr_request(
        now,
        sa,
        &SidrParams {
            service_id: S_B,
            ..sidr(S_B)
        },
    )
    .unwrap();
    settle(&mut p);
    bound.push(("SIDR_REQ sent", sa, S::SidrReqSent));
    b_ceps.push(last_sidr(&p).unwrap());

    // B active: connect to A's port-1 listen; A answers as each state needs.
    let mut b_connects = |p: &mut Pair| -> (CepId, CepId) {
        let b = p.b.create().unwrap();
        let now = p.now;
        let cp = ConnectParams {
            primary_path: Pair::path(Side::B),
            ..Pair::connect_params(S_A, next_qpn())
        };
        p.b.connect(now, b, &cp).unwrap();
        settle(p);
        let a = p
            .events(Side::A)
            .iter()
            .rev()
            .find_map(|(c, e)| matches!(e, Event::ReqReceived(_)).then_some(*c))
            .unwrap();
        (a, b)
    };
    let (a, b) = b_connects(&mut p);
    bound.push(("REQ received", a, S::ReqRcvd));
    b_ceps.push(b);
    let (a, b) = b_connects(&mut p);
    p.a.take_request(a).unwrap();
    p.a.prepare_rep(a, &Pair::rep_params(0x700)).unwrap();
    bound.push(("REP prepared", a, S::RepPrepared));
    b_ceps.push(b);
    let (a, b) = b_connects(&mut p);
    let now = p.now;
    p.a.accept(now, a, &Pair::rep_params(0x701)).unwrap();
    settle(&mut p);
    bound.push(("REP sent", a, S::RepSent));
    b_ceps.push(b);
    // B's SIDR request, which A has not answered.
    let sb = p.b.create().unwrap();
    let now = p.now;
    p.b.sidr_request(
        now,
        sb,
        &SidrParams {
            path: Pair::path(Side::B),
            ..sidr(S_A)
        },
    )
    .unwrap();
    settle(&mut p);
    let sa = p
        .events(Side::A)
        .iter()
        .rev()
        .find_map(|(c, e)| matches!(e, Event::SidrReqReceived(_)).then_some(*c))
        .unwrap();
    bound.push(("SIDR_REQ received", sa, S::SidrReqRcvd));
    b_ceps.push(sb);
    Zoo {
        p,
        bound,
        spared,
        detached,
        b: b_ceps,
    }
}

#[test]
fn remove_port_ends_every_cep_on_it() {
    let Zoo {
        mut p,
        bound,
        spared,
        detached,
        b,
    } = zoo();
    for &(name, cep, state) in bound.iter().chain(&spared) {
        assert_eq!(p.a.state(cep), Ok(state), "{name}");
    }
    let live = p.a.live_ceps();
    assert_eq!(live, bound.len() + spared.len() + 1, "and the detached one");
    // The port is gone: nothing from B reaches A any more.
    for attr in [
        AttributeId::Req,
        AttributeId::Mra,
        AttributeId::Rej,
        AttributeId::Rep,
        AttributeId::Rtu,
        AttributeId::Dreq,
        AttributeId::Drep,
        AttributeId::SidrReq,
        AttributeId::SidrRep,
        AttributeId::Lap,
        AttributeId::Apr,
    ] {
        p.fault(Side::B, attr, u32::MAX, Fate::Drop);
    }
    p.flush();
    let events_before: Vec<usize> = bound
        .iter()
        .chain(&spared)
        .map(|&(_, c, _)| p.events_of(Side::A, c).len())
        .collect();
    let sent_before = p.a.counters().sent;
    let retries_before = p.a.counters().retries;
    let link_before: usize = p.sent.iter().filter(|(s, _)| *s == Side::A).count();

    p.a.remove_port(1);
    p.flush();
    // The detached CEP had no owner to tell: freed at once.
    assert_eq!(p.a.live_ceps(), live - 1);
    assert_eq!(p.a.state(detached), Err(CmError::UnknownCep));
    for (i, &(name, cep, state)) in bound.iter().chain(&spared).enumerate() {
        let events = p.events_of(Side::A, cep);
        if i < bound.len() {
            assert_eq!(p.a.state(cep), Ok(S::Removed), "{name}");
            assert_eq!(events[events_before[i]..], [Event::DeviceRemoval], "{name}");
        } else {
            assert_eq!(p.a.state(cep), Ok(state), "{name}");
            assert_eq!(events.len(), events_before[i], "{name}");
        }
    }
    // Once only.
    p.a.remove_port(1);
    p.a.remove_port(3);
    p.flush();
    // Nothing more is sent for them, their timers are stopped.
    p.drive_for(20_000_000_000);
    p.flush();
    assert_eq!(p.a.timer_entries(), 0);
    assert_eq!(p.a.poll_timeout(), None);
    assert_eq!(p.a.counters().sent, sent_before);
    assert_eq!(p.a.counters().retries, retries_before);
    assert_eq!(
        p.sent.iter().filter(|(s, _)| *s == Side::A).count(),
        link_before
    );
    for (i, &(name, cep, _)) in bound.iter().chain(&spared).enumerate() {
        let want = events_before[i] + usize::from(i < bound.len());
        assert_eq!(p.events_of(Side::A, cep).len(), want, "{name}");
    }
    // Only destroy remains.
    let est = bound
        .iter()
        .find(|(n, _, _)| *n == "established")
        .unwrap()
        .1;
    let now = p.now;
    assert_eq!(p.a.disconnect(now, est, b""), invalid(S::Removed));
    assert_eq!(p.a.lap(now, est, &alt_a(), b""), invalid(S::Removed));
    assert_eq!(p.a.migrate(est), invalid(S::Removed));
    assert_eq!(
        p.a.qp_attributes(est, QpState::Rts).map(|_| ()),
        invalid(S::Removed)
    );
    assert_eq!(
        p.a.connect(now, est, &Pair::connect_params(S_B, 0x999)),
        invalid(S::Removed)
    );
    // The peer map kept only what the spared connection needs.
    assert_eq!(p.a.peer_map_entries(), 2);
    let mut live = p.a.live_ceps();
    for &(name, cep, _) in &bound {
        p.a.destroy(now, cep).unwrap();
        live -= 1;
        assert_eq!(p.a.live_ceps(), live, "{name}: freed at once");
        assert_eq!(p.a.state(cep), Err(CmError::UnknownCep), "{name}");
    }
    p.flush();
    assert_eq!(p.a.counters().sent, sent_before, "destroy sent nothing");
    assert_eq!(p.a.live_ceps(), spared.len());
    assert_eq!(p.a.timer_entries(), 0);
    // The spared ones still work: the port-2 listen answers a REQ.
    for &(name, cep, state) in &spared {
        assert_eq!(p.a.state(cep), Ok(state), "{name}");
    }
    let spared_ceps: Vec<CepId> = spared.iter().map(|&(_, c, _)| c).collect();
    finish(p, &spared_ceps, &b);
}

/// Removal of a port with a lingering passive SIDR CEP and an untaken REQ: both end, the
/// listen's backlog is released.
#[test]
fn remove_port_on_the_passive_side() {
    let mut p = Pair::new(82);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 2)).unwrap();
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a, &Pair::connect_params(SID, QPN_A))
        .unwrap();
    let s = p.a.create().unwrap();
    p.a.sidr_request(now, s, &sidr(SID)).unwrap();
    settle(&mut p);
    let req = p.last_request().unwrap();
    let sidr_cep = last_sidr(&p).unwrap();
    let now = p.now;
    p.b.sidr_reply(now, sidr_cep, &sidr_reply(SidrStatus::Success))
        .unwrap();
    settle(&mut p);
    assert_state(&p.b, sidr_cep, S::SidrRepSent);
    p.b.remove_port(1);
    p.flush();
    assert_events(&mut p, Side::B, req, &[Ev::Req, Ev::Removal]);
    assert_events(&mut p, Side::B, sidr_cep, &[Ev::SidrReq, Ev::Removal]);
    // A listen on any port stays.
    assert_state(&p.b, l, S::Listen);
    assert_eq!(p.b.peer_map_entries(), 0);
    assert_eq!(p.b.timer_entries(), 0);
    let now = p.now;
    p.b.destroy(now, req).unwrap();
    p.b.destroy(now, sidr_cep).unwrap();
    assert_eq!(p.b.live_ceps(), 1);
    // The backlog is free again: two new REQs get in.
    let a2 = p.a.create().unwrap();
    let a3 = p.a.create().unwrap();
    p.a.connect(now, a2, &Pair::connect_params(SID, QPN_A + 1))
        .unwrap();
    p.a.connect(now, a3, &Pair::connect_params(SID, QPN_A + 2))
        .unwrap();
    settle(&mut p);
    assert_eq!(p.b.counters().backlog_drops, 0);
    assert_eq!(p.b.live_ceps(), 3);
    finish(p, &[a, s, a2, a3], &[l]);
}
