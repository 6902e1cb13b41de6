//! Alternate paths live in the manager's path table, apart from the CEPs (src/
//! path_table.rs). In fixed-room mode (DISPATCH_LEVEL, `set_fixed_room`) a received REQ
//! or LAP takes only the room made at PASSIVE_LEVEL (`prepare_for`, `reserve`); none
//! left, the REQ gets REJ(NoResources) (IBA 12.6.7 Table 108 reason 3) and the LAP
//! APR(Reject) (IBA 12.8, Table 117 APStatus 3), both counted.

use ibcm_cep::pair::{Pair, Side, gid};
use ibcm_cep::{CepId, Event, StateName};
use ibcm_iba::{AprStatus, ConnectParams, PathRecord, RejReason};

const SID: u64 = 0x2000;

/// A's side of an alternate path (distinct from the primary's ends).
fn alt_a() -> PathRecord {
    PathRecord {
        slid: 5,
        dlid: 6,
        sgid: gid(5),
        dgid: gid(6),
        ..Pair::path(Side::A)
    }
}

/// CEPs B makes room for: more than the path room `prepare_for` keeps at most (4096,
/// src/path_table.rs), so that the paths run out before the CEP slots.
const CEP_ROOM: usize = 6000;

/// B listens (backlog past what the test sends) in fixed-room mode with room made for
/// [`CEP_ROOM`] CEPs.
fn fixed_room_pair(seed: u8) -> Pair {
    let mut p = Pair::new(seed);
    p.b.reserve(CEP_ROOM).unwrap();
    p.b.set_fixed_room(true);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 8192)).unwrap();
    p
}

/// A connects from QPN `qpn` with an alternate path; returns A's CEP.
fn connect_with_alternate(p: &mut Pair, qpn: u32) -> CepId {
    let a = p.a.create().unwrap();
    let cp = ConnectParams {
        alternate_path: Some(alt_a()),
        ..Pair::connect_params(SID, qpn)
    };
    let now = p.now;
    p.a.connect(now, a, &cp).unwrap();
    a
}

fn rejected_no_resources(p: &Pair, a: CepId) -> bool {
    p.events_of(Side::A, a)
        .iter()
        .any(|e| matches!(e, Event::Rejected { reason, .. } if *reason == RejReason::NoResources))
}

/// REQs with alternate paths, left unanswered, in batches until B's path room is used
/// up: returns A's CEPs whose REQs B took, and those B refused.
fn use_up_path_room(p: &mut Pair) -> (Vec<CepId>, Vec<CepId>) {
    let mut sent = Vec::new();
    for batch in 0..(CEP_ROOM / 512) as u32 {
        for qpn in 0x100 + batch * 512..0x100 + (batch + 1) * 512 {
            sent.push(connect_with_alternate(p, qpn));
        }
        p.drive_for(1_000_000);
        if sent.iter().any(|&a| rejected_no_resources(p, a)) {
            return sent
                .into_iter()
                .partition(|&a| !rejected_no_resources(p, a));
        }
    }
    panic!("B's path room never ran out");
}

/// A REQ whose alternate path finds no room is rejected at once with NoResources and
/// costs B nothing; once room is made at PASSIVE_LEVEL, the next one is taken.
#[test]
fn req_without_room_for_its_alternate_path_is_rejected() {
    let mut p = fixed_room_pair(61);
    let (taken, refused) = use_up_path_room(&mut p);
    assert!(taken.len() >= 4096, "room for {} paths", taken.len());
    assert_eq!(p.b.alternate_paths(), taken.len());
    let refusals = refused.len() as u64;
    assert_eq!(p.b.counters().path_room_refusals, refusals);
    let requests = p
        .events(Side::B)
        .iter()
        .filter(|(_, e)| matches!(e, Event::ReqReceived(_)))
        .count();
    assert_eq!(requests, taken.len(), "the refused REQ is not reported");
    // Their senders' CEPs went back to Idle.
    for a in refused {
        assert_eq!(p.a.state(a).unwrap(), StateName::Idle);
    }
    // A REQ without an alternate path needs no room.
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a, &Pair::connect_params(SID, 0x6000))
        .unwrap();
    p.drive_for(1_000_000);
    assert!(!rejected_no_resources(&p, a));
    // PASSIVE_LEVEL room: the next REQ with an alternate path is taken.
    p.b.prepare_for(0).unwrap();
    let a = connect_with_alternate(&mut p, 0x6001);
    p.drive_for(1_000_000);
    assert!(!rejected_no_resources(&p, a));
    assert_eq!(p.b.alternate_paths(), taken.len() + 1);
    assert_eq!(p.b.counters().path_room_refusals, refusals);
}

/// A LAP whose alternate path finds no room is answered by the engine with
/// APR(Reject), its owner hears nothing and the connection keeps its paths; a LAP sent
/// once room is made goes through.
#[test]
fn lap_without_room_for_its_path_gets_apr_reject() {
    let mut p = fixed_room_pair(62);
    let (a, b) = {
        let a = p.a.create().unwrap();
        let now = p.now;
        p.a.connect(now, a, &Pair::connect_params(SID, 0x11))
            .unwrap();
        p.drive_for(1_000_000);
        let b = p.last_request().unwrap();
        let now = p.now;
        p.b.take_request(b).unwrap();
        p.b.accept(now, b, &Pair::rep_params(0x22)).unwrap();
        p.drive_for(1_000_000);
        p.a.rtu(a, b"").unwrap();
        p.drive_for(1_000_000);
        (a, b)
    };
    assert_eq!(p.b.state(b).unwrap(), StateName::Established);
    use_up_path_room(&mut p);
    let before = p.b.query(b).unwrap();
    let refusals = p.b.counters().path_room_refusals;
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"lap").unwrap();
    p.drive_for(1_000_000);
    assert!(matches!(
        p.events_of(Side::A, a).last(),
        Some(Event::AprReceived {
            status: AprStatus::Reject,
            ..
        })
    ));
    assert!(
        !p.events_of(Side::B, b)
            .iter()
            .any(|e| matches!(e, Event::LapReceived { .. })),
        "B's owner hears no LAP"
    );
    assert_eq!(p.b.query(b).unwrap(), before);
    assert_eq!(p.b.counters().path_room_refusals, refusals + 1);
    assert_eq!(p.b.state(b).unwrap(), StateName::Established);
    // Room made at PASSIVE_LEVEL: a new LAP reaches B's owner.
    p.b.prepare_for(0).unwrap();
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"again").unwrap();
    p.drive_for(1_000_000);
    assert!(matches!(
        p.events_of(Side::B, b).last(),
        Some(Event::LapReceived { .. })
    ));
}

/// Every path a connection held goes back when it ends: a REQ's alternate path, a
/// LAP's, after APR and teardown.
#[test]
fn alternate_paths_go_back_when_connections_end() {
    let mut p = Pair::new(63);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 16)).unwrap();
    let a = connect_with_alternate(&mut p, 0x11);
    p.drive_for(1_000_000);
    let b = p.last_request().unwrap();
    p.b.take_request(b).unwrap();
    let now = p.now;
    let rp = ibcm_iba::RepParams {
        failover_accepted: ibcm_mad::Failover::Accepted,
        ..Pair::rep_params(0x22)
    };
    p.b.accept(now, b, &rp).unwrap();
    p.drive_for(1_000_000);
    p.a.rtu(a, b"").unwrap();
    p.drive_for(1_000_000);
    assert_eq!((p.a.alternate_paths(), p.b.alternate_paths()), (1, 1));
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"").unwrap();
    p.drive_for(1_000_000);
    assert_eq!((p.a.alternate_paths(), p.b.alternate_paths()), (2, 2));
    p.b.prepare_apr(b, AprStatus::Success, b"", b"").unwrap();
    p.b.send_apr(b).unwrap();
    p.drive_for(1_000_000);
    assert_eq!((p.a.alternate_paths(), p.b.alternate_paths()), (1, 1));
    let now = p.now;
    p.a.destroy(now, a).unwrap();
    p.b.destroy(now, b).unwrap();
    p.drive();
    assert_eq!((p.a.alternate_paths(), p.b.alternate_paths()), (0, 0));
}
