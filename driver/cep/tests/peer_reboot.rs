//! A peer that reboots (issue 29 #2), CI-sized at the engine: B holds K established
//! connections with A; A loses its CM state (a new manager, same CA GUID, new comm IDs)
//! and reconnects from the same QPNs. IBA 12.9.8.3.1: B answers each REQ that reuses a
//! QPN of a live connection with REJ(StaleConn) and ends the old connection with a DREQ
//! (Linux `cm_match_req` -> `cm_issue_rej(IB_CM_REJ_STALE_CONN)`, and the old id is
//! disconnected). A's fresh manager knows none of the old comm IDs and answers each DREQ
//! with an unaffiliated DREP (IBA 12.9.8.5). B's application gets one clean end per old
//! connection (DREP received, then timewait exit); once B's timewait ends, A's
//! reconnects from the same QPNs all succeed, and nothing is left behind.

use ibcm_cep::pair::{Chaos, GUID_A, Pair, Side};
use ibcm_cep::{CepId, CmConfig, CmManager, Event, StateName, counter_slot};
use ibcm_mad::{AttributeId, RejReason};
use std::collections::{HashMap, HashSet};

const SID: u64 = 0x2900;
const K: u32 = 200;
const QPN_A: u32 = 0x1000;

/// A connects from `QPN_A + i` for every i; B takes and accepts every REQ, A sends the
/// RTUs. Returns (A's CEPs, B's CEPs) of the connections that got their REP.
fn connect_all(p: &mut Pair) -> (Vec<CepId>, Vec<CepId>) {
    let first_event = p.events(Side::B).len();
    let a: Vec<CepId> = (0..K)
        .map(|i| {
            let cep = p.a.create().unwrap();
            let now = p.now;
            p.a.connect(now, cep, &Pair::connect_params(SID, QPN_A + i))
                .unwrap();
            cep
        })
        .collect();
    p.drive_for(1_000_000);
    let b: Vec<CepId> = p.events(Side::B)[first_event..]
        .iter()
        .filter_map(|(c, e)| matches!(e, Event::ReqReceived(_)).then_some(*c))
        .collect();
    for (k, &cep) in b.iter().enumerate() {
        p.b.take_request(cep).unwrap();
        let now = p.now;
        p.b.accept(now, cep, &Pair::rep_params(0x9000 + k as u32))
            .unwrap();
    }
    p.drive_for(1_000_000);
    for &cep in &a {
        if p.a.state(cep) == Ok(StateName::RepRcvd) {
            p.a.rtu(cep, b"").unwrap();
        }
    }
    p.drive_for(1_000_000);
    (a, b)
}

#[test]
fn rebooted_peer_reusing_its_qpns_ends_every_stale_connection_once() {
    let mut p = Pair::new(29);
    let listen = p.b.create().unwrap();
    p.b.listen(listen, Pair::listen_params(SID, K)).unwrap();
    let (_, old) = connect_all(&mut p);
    assert_eq!(old.len(), K as usize);
    for &b in &old {
        assert_eq!(p.b.state(b), Ok(StateName::Established));
    }

    // A reboots: its CM state is gone; same CA GUID, other comm IDs.
    p.a = CmManager::new(CmConfig::new(GUID_A, [0xa5; 32]));
    let events_before = p.events(Side::A).len();
    let (fresh, taken) = connect_all(&mut p);
    // Every REQ was refused as stale, and no new connection was made on B.
    assert!(taken.is_empty(), "B took a REQ reusing a live QPN");
    let stale = p.events(Side::A)[events_before..]
        .iter()
        .filter(|(_, e)| {
            matches!(
                e,
                Event::Rejected {
                    reason: RejReason::StaleConn,
                    ..
                }
            )
        })
        .count();
    assert_eq!(stale, K as usize);
    // A stale REJ quarantines the QPN on A too (establish.rs on_rej): timewait.
    for &a in &fresh {
        assert_eq!(p.a.state(a), Ok(StateName::Timewait));
    }
    // Every old connection was ended with one DREQ, answered by A's unaffiliated DREP.
    let sent = |m: &CmManager, attr: AttributeId| m.counters().sent[counter_slot(attr).unwrap()];
    assert_eq!(sent(&p.b, AttributeId::Dreq), u64::from(K));
    assert_eq!(sent(&p.b, AttributeId::Rej), u64::from(K));

    // B's timewait ends; each old connection reported exactly one end, then its exit.
    p.drive();
    for &b in &old {
        let ends: Vec<Event> = p
            .events_of(Side::B, b)
            .into_iter()
            .filter(|e| {
                matches!(
                    e,
                    Event::DrepReceived(_) | Event::Timeout { .. } | Event::DreqReceived(_)
                )
            })
            .collect();
        assert_eq!(ends.len(), 1, "old connection {b:?}: {ends:?}");
        assert!(matches!(ends[0], Event::DrepReceived(_)));
        assert_eq!(p.events_of(Side::B, b).last(), Some(&Event::TimewaitExit));
        assert_eq!(p.b.state(b), Ok(StateName::Idle));
    }

    // A reconnects from the same QPNs: all succeed.
    let (again, accepted) = connect_all(&mut p);
    assert_eq!(accepted.len(), K as usize);
    for (&a, &b) in again.iter().zip(&accepted) {
        assert_eq!(p.a.state(a), Ok(StateName::Established));
        assert_eq!(p.b.state(b), Ok(StateName::Established));
    }

    // Nothing is left behind once everything is torn down.
    for &b in &old {
        let now = p.now;
        let _ = p.b.destroy(now, b);
    }
    for &a in fresh.iter().chain(&again) {
        let now = p.now;
        let _ = p.a.destroy(now, a);
    }
    for &b in accepted.iter().chain([&listen]) {
        let now = p.now;
        let _ = p.b.destroy(now, b);
    }
    p.drive();
    assert_eq!(p.a.live_ceps() + p.b.live_ceps(), 0);
    assert_eq!(p.a.peer_map_entries() + p.b.peer_map_entries(), 0);
}

/// How many connections [`rebooted_peer_reconnects_everything_in_a_retry_loop`] holds:
/// `IBCM_REBOOT_CONNECTIONS` (issue 29 #2 asks 1e4; CI runs the default).
fn reboot_connections() -> u32 {
    std::env::var("IBCM_REBOOT_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

/// What an application does with each event, and what it saw.
#[derive(Default)]
struct Apps {
    /// A's attempt per connection index: (CEP, attempt number).
    attempts: HashMap<u32, (CepId, u32)>,
    /// Connection index of each of A's CEPs.
    index_of: HashMap<CepId, u32>,
    /// Ends (DREQ/DREP received, REJ, timeout) B's old connections reported, and their
    /// timewait exits.
    old_ends: HashMap<CepId, u32>,
    old_exits: HashMap<CepId, u32>,
    stale_rejects: u64,
    other_failures: Vec<String>,
    /// Connections established on B since the reboot.
    established: u32,
    next_qpn_b: u32,
    events_seen: [usize; 2],
}

impl Apps {
    /// A (re)connects connection `i` from its old QPN.
    fn connect(&mut self, p: &mut Pair, i: u32) {
        let cep = p.a.create().unwrap();
        let now = p.now;
        p.a.connect(now, cep, &Pair::connect_params(SID, QPN_A + i))
            .unwrap();
        let attempt = self.attempts.get(&i).map_or(1, |(_, n)| n + 1);
        self.attempts.insert(i, (cep, attempt));
        self.index_of.insert(cep, i);
    }

    /// Runs both applications over the events logged since the last call: A retries a
    /// connection refused as stale once its CEP leaves timewait (IBA 12.9.8.3.1: the
    /// QPN is quarantined until then); B accepts every REQ and frees its old CEPs once
    /// their timewait ends.
    fn react(&mut self, p: &mut Pair, old: &HashSet<CepId>) {
        let a_events: Vec<(CepId, Event)> = p.events(Side::A)[self.events_seen[0]..].to_vec();
        self.events_seen[0] += a_events.len();
        for (cep, e) in a_events {
            match e {
                Event::RepReceived(_) => p.a.rtu(cep, b"").unwrap(),
                Event::Rejected {
                    reason: RejReason::StaleConn,
                    ..
                } => self.stale_rejects += 1,
                Event::TimewaitExit => {
                    let now = p.now;
                    p.a.destroy(now, cep).unwrap();
                    if let Some(i) = self.index_of.remove(&cep) {
                        self.connect(p, i);
                    }
                }
                other => self.other_failures.push(format!("A {cep:?}: {other:?}")),
            }
        }
        let b_events: Vec<(CepId, Event)> = p.events(Side::B)[self.events_seen[1]..].to_vec();
        self.events_seen[1] += b_events.len();
        for (cep, e) in b_events {
            match e {
                Event::ReqReceived(_) => {
                    p.b.take_request(cep).unwrap();
                    let now = p.now;
                    self.next_qpn_b += 1;
                    p.b.accept(now, cep, &Pair::rep_params(0x10_0000 + self.next_qpn_b))
                        .unwrap();
                }
                Event::RtuReceived(_) => self.established += 1,
                Event::TimewaitExit if old.contains(&cep) => {
                    *self.old_exits.entry(cep).or_default() += 1;
                    let now = p.now;
                    p.b.destroy(now, cep).unwrap();
                }
                Event::DrepReceived(_)
                | Event::DreqReceived(_)
                | Event::Timeout { .. }
                | Event::Rejected { .. }
                    if old.contains(&cep) =>
                {
                    *self.old_ends.entry(cep).or_default() += 1;
                }
                other => self.other_failures.push(format!("B {cep:?}: {other:?}")),
            }
        }
    }
}

/// Issue 29 #2 at scale, in virtual time: B holds K established connections when A
/// reboots (same CA GUID, CM state lost) and A's application reconnects every one at
/// once from its old QPNs, retrying each refused one when its CEP leaves timewait, as
/// an rdma_cm application would. Asserted: every old connection on B ends exactly once
/// (its DREQ answered by A's unaffiliated DREP) and leaves timewait once, every
/// connection is re-made, nothing else fails, and nothing is left after the teardown.
/// Printed: the time from the reboot until all are re-made, the attempts, the messages
/// and B's memory (`cargo test --release -p ibcm-cep --test peer_reboot -- --nocapture`,
/// with `IBCM_REBOOT_CONNECTIONS=10000` for the 1e4).
#[test]
fn rebooted_peer_reconnects_everything_in_a_retry_loop() {
    reboot_and_reconnect("no faults", None);
}

/// The same with 1 % of MADs lost, 1 % duplicated and 1 % delayed past later ones
/// (issue 29 #4): lost REJs, DREQs, DREPs and RTUs cost retries, never an outcome.
#[test]
fn rebooted_peer_reconnects_everything_under_loss_duplication_and_reordering() {
    let mut chaos = Chaos::new(0x29_04);
    chaos.drop_per_mille = 10;
    chaos.duplicate_per_mille = 10;
    chaos.delay_per_mille = 10;
    chaos.max_delay_ns = 50_000;
    reboot_and_reconnect("1% loss, duplication, reordering", Some(chaos));
}

fn reboot_and_reconnect(label: &str, chaos: Option<Chaos>) {
    let k = reboot_connections();
    let mut p = Pair::new(31);
    let faults = chaos.is_some();
    p.chaos = chaos;
    let listen = p.b.create().unwrap();
    p.b.listen(listen, Pair::listen_params(SID, k)).unwrap();
    let mut apps = Apps::default();
    for i in 0..k {
        apps.connect(&mut p, i);
    }
    loop {
        apps.react(&mut p, &HashSet::new());
        if apps.established == k {
            break;
        }
        assert!(p.step(), "the first connections stalled");
    }
    apps.react(&mut p, &HashSet::new());
    assert!(
        apps.other_failures.is_empty(),
        "{:?}",
        &apps.other_failures[..1]
    );
    let old: HashSet<CepId> = p
        .events(Side::B)
        .iter()
        .filter_map(|(c, e)| matches!(e, Event::RtuReceived(_)).then_some(*c))
        .collect();
    assert_eq!(old.len(), k as usize);
    let memory_before = p.b.memory().total();

    // A reboots: its CM state is gone (same CA GUID); its application reconnects all.
    p.a = CmManager::new(CmConfig::new(GUID_A, [0x31; 32]));
    let sent = |m: &CmManager, attr: AttributeId| m.counters().sent[counter_slot(attr).unwrap()];
    let (b_rej, b_dreq) = (sent(&p.b, AttributeId::Rej), sent(&p.b, AttributeId::Dreq));
    let mut apps = Apps {
        events_seen: [p.events(Side::A).len(), p.events(Side::B).len()],
        next_qpn_b: apps.next_qpn_b,
        ..Apps::default()
    };
    let reboot = p.now;
    for i in 0..k {
        apps.connect(&mut p, i);
    }
    let mut memory_peak = memory_before;
    let mut steps = 0u64;
    loop {
        apps.react(&mut p, &old);
        if apps.established == k {
            break;
        }
        assert!(p.step(), "reconnects stalled at {}/{k}", apps.established);
        steps += 1;
        if steps.is_multiple_of(64) {
            memory_peak = memory_peak.max(p.b.memory().total());
        }
    }
    let recovered_ns = p.now.nanos_since(reboot);
    // B's old connections finish their timewait.
    p.drive();
    apps.react(&mut p, &old);

    assert!(
        apps.other_failures.is_empty(),
        "{:?}",
        &apps.other_failures[..1]
    );
    for &c in &old {
        assert_eq!(
            apps.old_ends.get(&c),
            Some(&1),
            "old connection {c:?}: its ends"
        );
        assert_eq!(
            apps.old_exits.get(&c),
            Some(&1),
            "old connection {c:?}: its exits"
        );
    }
    // A REQ arriving while B's old connection is still in timewait is stale as well
    // (this engine keeps the old connection's remote QPN and CA GUID until its timewait
    // ends; Linux's ib_cm drops them on entering timewait, `cm_enter_timewait` ->
    // `cm_remove_remote`, and refuses only for a live connection): A retries again
    // after its own timewait. Every refusal was a stale one.
    assert!(apps.stale_rejects >= u64::from(k));
    // Lost REJs are answered again when their REQ is re-sent.
    let rejs = sent(&p.b, AttributeId::Rej) - b_rej;
    if faults {
        assert!(rejs >= apps.stale_rejects);
    } else {
        assert_eq!(rejs, apps.stale_rejects);
    }
    assert_eq!(sent(&p.b, AttributeId::Dreq) - b_dreq, u64::from(k));
    let max_attempts = apps.attempts.values().map(|(_, n)| *n).max().unwrap_or(0);
    let retried = apps.attempts.values().filter(|(_, n)| *n > 1).count();
    println!(
        "peer reboot, {k} connections, {label}: all re-made {:.3} ms after the reboot; {retried} \
         retried once their stale REJ's timewait ended (most attempts {max_attempts}); \
         B sent {} REJ(StaleConn) and {} DREQ; B's engine {} KB before, {} KB at most, \
         {} steps",
        recovered_ns as f64 / 1e6,
        sent(&p.b, AttributeId::Rej) - b_rej,
        sent(&p.b, AttributeId::Dreq) - b_dreq,
        memory_before / 1024,
        memory_peak / 1024,
        steps,
    );

    // Teardown: nothing is left on either side.
    let now = p.now;
    for (cep, _) in apps.attempts.values() {
        let _ = p.a.destroy(now, *cep);
    }
    let b_all: Vec<CepId> = p.events(Side::B).iter().map(|(c, _)| *c).collect();
    for c in b_all.into_iter().chain([listen]) {
        let _ = p.b.destroy(now, c);
    }
    p.drive();
    assert_eq!(p.a.live_ceps() + p.b.live_ceps(), 0);
    assert_eq!(p.a.peer_map_entries() + p.b.peer_map_entries(), 0);
    assert_eq!(p.a.timer_entries() + p.b.timer_entries(), 0);
}
