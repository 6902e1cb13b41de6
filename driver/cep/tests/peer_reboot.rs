//! A peer that reboots (issue 29 #2), CI-sized at the engine: B holds K established
//! connections with A; A loses its CM state (a new manager, same CA GUID, new comm IDs)
//! and reconnects from the same QPNs. IBA 12.9.8.3.1: B answers each REQ that reuses a
//! QPN of a live connection with REJ(StaleConn) and ends the old connection with a DREQ
//! (Linux `cm_match_req` -> `cm_issue_rej(IB_CM_REJ_STALE_CONN)`, and the old id is
//! disconnected). A's fresh manager knows none of the old comm IDs and answers each DREQ
//! with an unaffiliated DREP (IBA 12.9.8.5). B's application gets one clean end per old
//! connection (DREP received, then timewait exit); once B's timewait ends, A's
//! reconnects from the same QPNs all succeed, and nothing is left behind.

use ibcm_cep::pair::{GUID_A, Pair, Side};
use ibcm_cep::{CepId, CmConfig, CmManager, Event, StateName, counter_slot};
use ibcm_mad::{AttributeId, RejReason};

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
