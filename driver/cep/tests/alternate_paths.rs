//! Alternate paths live in the manager's path table, apart from the CEPs (src/
//! path_table.rs). In fixed-room mode (DISPATCH_LEVEL, `set_fixed_room`) a received REQ
//! or LAP takes only the room made at PASSIVE_LEVEL (`prepare_for`, `reserve`); none
//! left, it is dropped (counted) and passive work asked for (`wants_room`), and the
//! sender's retry finds the room it makes.

use std::collections::HashSet;

use ibcm_cep::pair::{Fate, Pair, Side, gid};
use ibcm_cep::{CepId, CmConfig, Event, StateName};
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

/// B listens in fixed-room mode with room made for [`CEP_ROOM`] CEPs; the backlog is far
/// past what the test sends (a half-full backlog asks for room of its own, held.rs, which
/// would hide whether no path room asks).
fn fixed_room_pair(seed: u8) -> Pair {
    let mut p = Pair::new(seed);
    p.b.reserve(CEP_ROOM).unwrap();
    p.b.set_fixed_room(true);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 60_000)).unwrap();
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

/// A's CEP and the QPN its REQ names.
type Sent = (CepId, u32);

/// REQs with alternate paths, left unanswered, in batches until B's path room is used
/// up: returns A's CEPs (with their QPNs) whose REQs B took, and those B dropped.
fn use_up_path_room(p: &mut Pair) -> (Vec<Sent>, Vec<Sent>) {
    let mut sent = Vec::new();
    for batch in 0..(CEP_ROOM / 512) as u32 {
        for qpn in 0x100 + batch * 512..0x100 + (batch + 1) * 512 {
            sent.push((connect_with_alternate(p, qpn), qpn));
        }
        p.drive_for(1_000_000);
        if p.b.counters().path_room_drops > 0 {
            let reported = reported(p);
            return sent
                .into_iter()
                .partition(|(_, qpn)| reported.contains(qpn));
        }
    }
    panic!("B's path room never ran out");
}

/// The QPNs of the REQs B's owner heard of.
fn reported(p: &Pair) -> HashSet<u32> {
    p.events(Side::B)
        .iter()
        .filter_map(|(_, e)| match e {
            Event::ReqReceived(r) => Some(r.remote_qpn),
            _ => None,
        })
        .collect()
}

/// A REQ whose alternate path finds no room is dropped (counted) as a REQ that finds no
/// slot is, costs B nothing and asks for PASSIVE_LEVEL work (`wants_room`); its sender
/// retries and, once room is made, it is taken. Nothing is refused for good.
#[test]
fn req_without_room_for_its_alternate_path_is_dropped_and_retried() {
    let mut p = fixed_room_pair(61);
    let (taken, dropped) = use_up_path_room(&mut p);
    assert!(taken.len() >= 4096, "room for {} paths", taken.len());
    assert!(!dropped.is_empty());
    assert_eq!(p.b.alternate_paths(), taken.len());
    assert!(p.b.wants_room(), "no path room asks for passive work");
    assert_eq!(p.sent_count(Side::B, ibcm_mad::AttributeId::Rej), 0);
    for &(a, _) in &dropped {
        assert!(!rejected_no_resources(&p, a));
        assert_eq!(p.a.state(a).unwrap(), StateName::ReqSent);
    }
    // A REQ without an alternate path needs no room.
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a, &Pair::connect_params(SID, 0x6000))
        .unwrap();
    p.drive_for(1_000_000);
    assert!(reported(&p).contains(&0x6000));
    // The passive work asked for makes room: the senders' retries are taken.
    p.b.prepare_for(0).unwrap();
    assert!(!p.b.wants_room());
    let drops = p.b.counters().path_room_drops;
    p.drive_for(60_000_000_000);
    let reported = reported(&p);
    for (_, qpn) in &dropped {
        assert!(reported.contains(qpn), "a dropped REQ's retry is taken");
    }
    assert_eq!(p.b.alternate_paths(), taken.len() + dropped.len());
    assert_eq!(p.b.counters().path_room_drops, drops);
}

/// A LAP whose alternate path finds no room is dropped, as Linux `cm_lap_handler` and
/// WinOF `__lap_handler` drop a LAP they cannot load: its owner hears nothing, the
/// connection keeps its paths, passive work is asked for, and the peer's LAP retry
/// reaches the owner once room is made (IBA 12.8).
#[test]
fn lap_without_room_for_its_path_is_dropped_and_retried() {
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
    let drops = p.b.counters().path_room_drops;
    let now = p.now;
    p.a.lap(now, a, &alt_a(), b"lap").unwrap();
    p.drive_for(1_000_000);
    assert!(
        !p.events_of(Side::B, b)
            .iter()
            .any(|e| matches!(e, Event::LapReceived { .. })),
        "B's owner hears no LAP"
    );
    assert_eq!(p.sent_count(Side::B, ibcm_mad::AttributeId::Apr), 0);
    assert_eq!(p.b.query(b).unwrap(), before);
    assert_eq!(p.b.counters().path_room_drops, drops + 1);
    assert!(p.b.wants_room());
    assert_eq!(p.b.state(b).unwrap(), StateName::Established);
    // Room made at PASSIVE_LEVEL: A's LAP retry reaches B's owner.
    p.b.prepare_for(0).unwrap();
    p.drive_for(60_000_000_000);
    assert!(
        p.events_of(Side::B, b)
            .iter()
            .any(|e| matches!(e, Event::LapReceived { .. })),
        "the LAP's retry is taken"
    );
}

/// A reconnect storm through a listen (backlog 256) in fixed-room mode, the owner
/// accepting every REQ and making room at PASSIVE_LEVEL only as the dispatch layer does:
/// at its downcalls (`prepare_for(backlog)`) and when the engine asks (`wants_room`).
/// Each REQ may be sent 16 times (this harness delivers a whole retry wave at one
/// instant). Returns the connections established and those refused.
fn storm(seed: u8, n: u32, alternate: bool) -> (usize, usize) {
    const BACKLOG: u32 = 256;
    let mut p = Pair::new(seed);
    p.b.set_fixed_room(true);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, BACKLOG)).unwrap();
    p.b.prepare_for(BACKLOG as usize).unwrap();
    let sent: Vec<CepId> = (0..n)
        .map(|k| {
            let a = p.a.create().unwrap();
            let cp = ConnectParams {
                alternate_path: alternate.then(alt_a),
                max_cm_retries: 15,
                ..Pair::connect_params(SID, 0x100 + k)
            };
            let now = p.now;
            p.a.connect(now, a, &cp).unwrap();
            a
        })
        .collect();
    let mut seen = 0;
    let mut qpn = 0x40000;
    while p.step() {
        if p.b.wants_room() {
            p.b.prepare_for(0).unwrap();
        }
        let requests: Vec<CepId> = p.events(Side::B)[seen..]
            .iter()
            .filter(|(_, e)| matches!(e, Event::ReqReceived(_)))
            .map(|(b, _)| *b)
            .collect();
        seen = p.events(Side::B).len();
        for b in requests {
            p.b.prepare_for(BACKLOG as usize).unwrap();
            p.b.take_request(b).unwrap();
            qpn += 1;
            let now = p.now;
            p.b.accept(now, b, &Pair::rep_params(qpn)).unwrap();
        }
        for &a in &sent {
            if p.a.state(a) == Ok(StateName::RepRcvd) {
                p.a.rtu(a, b"").unwrap();
            }
        }
    }
    let established = sent
        .iter()
        .filter(|&&a| p.a.state(a) == Ok(StateName::Established))
        .count();
    let refused = sent
        .iter()
        .filter(|&&a| {
            p.events_of(Side::A, a)
                .iter()
                .any(|e| matches!(e, Event::Rejected { .. }))
        })
        .count();
    (established, refused)
}

/// A storm of REQs with alternate paths fares as one without: every connection
/// establishes, none is refused for want of path room (it is made when the engine
/// asks, as for slots).
#[test]
fn storm_of_reqs_with_alternate_paths_all_establish() {
    const N: u32 = 3000;
    assert_eq!(storm(64, N, false), (N as usize, 0));
    assert_eq!(storm(64, N, true), (N as usize, 0));
}

/// A peer-to-peer crossing where B (the larger CA GUID) stays active and has no path
/// room (fixed-room mode, nothing prepared): A's REQ carries an alternate path B never
/// stores (A turns passive and answers B's REQ), so B must not refuse it. B's first REQ
/// is lost, so A's REQ reaches B first.
#[test]
fn p2p_crossing_needs_no_path_room_on_the_side_that_stays_active() {
    let mut p = Pair::with_config(
        CmConfig::new(1, [1; 32]),
        CmConfig::new(0xffff_0000, [2; 32]),
    );
    p.b.set_fixed_room(true);
    p.fault(Side::B, ibcm_mad::AttributeId::Req, 1, Fate::Drop);
    let a = p.a.create().unwrap();
    let b = p.b.create().unwrap();
    let ca = ConnectParams {
        alternate_path: Some(alt_a()),
        ..Pair::connect_params(SID, 0x11)
    };
    let cb = ConnectParams {
        primary_path: Pair::path(Side::B),
        ..Pair::connect_params(SID, 0x22)
    };
    let now = p.now;
    p.a.connect_peer(now, a, &ca).unwrap();
    p.b.connect_peer(now, b, &cb).unwrap();
    while p.step() {
        if p.a.state(a) == Ok(StateName::ReqRcvd) {
            let now = p.now;
            p.a.accept(now, a, &Pair::rep_params(0x11)).unwrap();
        }
        if p.b.state(b) == Ok(StateName::RepRcvd) {
            p.b.rtu(b, b"").unwrap();
        }
    }
    assert_eq!(p.sent_count(Side::B, ibcm_mad::AttributeId::Rej), 0);
    assert_eq!(p.a.state(a).unwrap(), StateName::Established);
    assert_eq!(p.b.state(b).unwrap(), StateName::Established);
    assert_eq!(p.b.counters().path_room_drops, 0);
}

/// A REQ with an alternate path for a service no one listens on, at a node with no path
/// room, gets REJ(InvalidServiceId) as with room: the listen is looked up before any room
/// is checked (Linux `cm_match_req`, WinOF `__lookup_listen` before `__create_cep`).
#[test]
fn req_for_no_listen_gets_invalid_service_id_whatever_the_room() {
    let mut p = Pair::new(65);
    p.b.set_fixed_room(true);
    let a = connect_with_alternate(&mut p, 0x11);
    p.drive_for(1_000_000);
    assert!(p.events_of(Side::A, a).iter().any(|e| matches!(
        e,
        Event::Rejected { reason, .. } if *reason == RejReason::InvalidServiceId
    )));
    assert_eq!(p.b.counters().path_room_drops, 0);
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
