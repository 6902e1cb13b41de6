//! A port that flaps (issue 29 #3), at the engine: what each state does when its port goes
//! down (src/manager/link.rs, its table), and K live connections through a link that goes
//! down and comes back, with and without 1 % loss, duplication and reordering: every
//! connection is told once, nothing is sent while the port is down, timers and memory go
//! back to where they were, and all K reconnect from the same QPNs.
//!
//! The counterparts ignore the event (WinOF `__cep_pnp_cb`, al_cm_cep.c:3195-3196: port
//! down/active fall to "Ignore other PNP events"; Linux `cm_client` registers add/remove
//! only), so their handshakes run out their retries and established connections hear
//! nothing; see link.rs for the choice and why.

use ibcm_cep::pair::{Chaos, Pair, Side};
use ibcm_cep::{
    CepId, CmError, CmManager, EngineMemory, Event, StateName, TIMER_BATCH, counter_slot,
};
use ibcm_mad::AttributeId;

const SID: u64 = 0x2903;
const K: u32 = 500;
const QPN_A: u32 = 0x1000;
const QPN_B: u32 = 0x9000;
/// The port both nodes of the pair use (`Pair::address_of`).
const PORT: u8 = 1;

/// Tells `side` its port went down, draining its events between the bounded calls.
fn port_down(p: &mut Pair, side: Side) {
    let mut from = Some(0);
    while let Some(at) = from {
        let now = p.now;
        from = p.node(side).port_down(now, PORT, at);
        p.flush();
    }
}

fn sent(m: &CmManager, attr: AttributeId) -> u64 {
    m.counters().sent[counter_slot(attr).unwrap()]
}

fn sent_total(m: &CmManager) -> u64 {
    m.counters().sent.iter().sum()
}

/// Connects A's `QPN_A + i` to B for every i, B accepting each REQ as it comes and A
/// sending each RTU as its REP comes, until all K are established on both sides (bounded).
/// Returns (A's CEPs, B's CEPs).
fn connect_all(p: &mut Pair) -> (Vec<CepId>, Vec<CepId>) {
    let (mut seen_a, mut seen_b) = (p.events(Side::A).len(), p.events(Side::B).len());
    let a: Vec<CepId> = (0..K)
        .map(|i| {
            let cep = p.a.create().unwrap();
            let now = p.now;
            let mut params = Pair::connect_params(SID, QPN_A + i);
            params.max_cm_retries = 15;
            p.a.connect(now, cep, &params).unwrap();
            cep
        })
        .collect();
    let mut b: Vec<CepId> = Vec::new();
    let (mut rtus, mut rtus_in) = (0, 0);
    // Bounded: each step is one instant of virtual time at which something happens.
    for _ in 0..1_000_000 {
        if !p.step() {
            break;
        }
        let fresh: Vec<CepId> = p.events(Side::B)[seen_b..]
            .iter()
            .filter_map(|(c, e)| match e {
                Event::ReqReceived(_) => Some(*c),
                Event::RtuReceived(_) => {
                    rtus_in += 1;
                    None
                }
                _ => None,
            })
            .collect();
        seen_b = p.events(Side::B).len();
        for cep in fresh {
            p.b.take_request(cep).unwrap();
            let now = p.now;
            p.b.accept(now, cep, &Pair::rep_params(QPN_B + b.len() as u32))
                .unwrap();
            b.push(cep);
        }
        let reps: Vec<CepId> = p.events(Side::A)[seen_a..]
            .iter()
            .filter_map(|(c, e)| matches!(e, Event::RepReceived(_)).then_some(*c))
            .collect();
        seen_a = p.events(Side::A).len();
        for cep in reps {
            p.a.rtu(cep, b"").unwrap();
            rtus += 1;
        }
        if rtus == K && b.len() == K as usize && rtus_in == K {
            return (a, b);
        }
    }
    panic!(
        "not all connected: {} REQs reached B, {rtus} RTUs sent, {rtus_in} received",
        b.len()
    );
}

/// The events `cep` got from `from` on.
fn events_since(p: &Pair, side: Side, from: usize, cep: CepId) -> Vec<Event> {
    p.events(side)[from..]
        .iter()
        .filter(|(c, _)| *c == cep)
        .map(|(_, e)| *e)
        .collect()
}

/// A disconnects every connection, B answers, both release them and timewait runs out.
fn ordinary_teardown(p: &mut Pair, a: &[CepId], b: &[CepId]) {
    for &cep in a {
        let now = p.now;
        p.a.disconnect(now, cep, b"").unwrap();
    }
    let from = p.events(Side::B).len();
    // Until every DREQ arrived (a lost one is re-sent).
    while p.events(Side::B)[from..]
        .iter()
        .filter(|(_, e)| matches!(e, Event::DreqReceived(_)))
        .count()
        < b.len()
    {
        assert!(p.step(), "DREQs lost for good");
    }
    for &cep in b {
        let now = p.now;
        p.b.drep(now, cep, b"").unwrap();
    }
    for (side, ceps) in [(Side::A, a), (Side::B, b)] {
        for &cep in ceps {
            let now = p.now;
            p.node(side).destroy(now, cep).unwrap();
        }
    }
    p.drive();
    assert_eq!(p.a.live_ceps() + p.b.live_ceps(), 1);
}

/// Two managers with the pair's link, faults as `chaos` says, B listening, and K
/// connections made and ended the ordinary way once (the tables keep the room they grew
/// to: that is the baseline).
fn warm_pair(seed: u8, chaos: bool) -> (Pair, CepId) {
    let mut p = Pair::new(seed);
    if chaos {
        let mut c = Chaos::new(u64::from(seed));
        c.drop_per_mille = 10;
        c.duplicate_per_mille = 10;
        c.delay_per_mille = 10;
        // Within the packet life time (Pair::path: 2^14 x 4.096 us = 67 ms).
        c.max_delay_ns = 20_000_000;
        p.chaos = Some(c);
    }
    let listen = p.b.create().unwrap();
    p.b.listen(listen, Pair::listen_params(SID, K)).unwrap();
    // Baseline: the listen, after K connections came and went the ordinary way (the
    // tables keep the room they grew to).
    let (a, b) = connect_all(&mut p);
    ordinary_teardown(&mut p, &a, &b);
    (p, listen)
}

/// The engines' tables (bytes) after K more connections are made and ended the ordinary
/// way: what the flap's must not exceed.
fn control(seed: u8, chaos: bool) -> (EngineMemory, EngineMemory) {
    let (mut p, _) = warm_pair(seed, chaos);
    let (a, b) = connect_all(&mut p);
    ordinary_teardown(&mut p, &a, &b);
    (p.a.memory(), p.b.memory())
}

fn flap(seed: u8, chaos: bool) {
    let (mut p, listen) = warm_pair(seed, chaos);
    let timers = (p.a.timer_entries(), p.b.timer_entries());
    let (a, b) = connect_all(&mut p);
    p.drive();

    // The link goes down: both ends' ports leave Active.
    let (told_a, told_b) = (p.events(Side::A).len(), p.events(Side::B).len());
    let sent_before = (sent_total(&p.a), sent_total(&p.b));
    port_down(&mut p, Side::A);
    port_down(&mut p, Side::B);
    // Every connection, on both sides, is told once, at once: the DREQ its owner knows.
    for (side, ceps, from) in [(Side::A, &a, told_a), (Side::B, &b, told_b)] {
        for &cep in ceps {
            assert_eq!(
                events_since(&p, side, from, cep),
                [Event::DreqReceived(Default::default())],
                "{side:?} {cep:?}"
            );
            assert_eq!(p.node(side).state(cep), Ok(StateName::DreqRcvd));
        }
    }
    // The listen stays.
    assert_eq!(p.b.state(listen), Ok(StateName::Listen));
    // The owners answer; nothing goes on the wire while the port is down.
    for (side, ceps) in [(Side::A, &a), (Side::B, &b)] {
        for &cep in ceps {
            let now = p.now;
            p.node(side).drep(now, cep, b"").unwrap();
            assert_eq!(p.node(side).state(cep), Ok(StateName::Timewait));
        }
    }
    // Timewait runs out; each connection ends with its exit, nothing else.
    p.drive();
    assert_eq!((sent_total(&p.a), sent_total(&p.b)), sent_before);
    for (side, ceps, from) in [(Side::A, &a, told_a), (Side::B, &b, told_b)] {
        for &cep in ceps {
            assert_eq!(
                events_since(&p, side, from, cep),
                [Event::DreqReceived(Default::default()), Event::TimewaitExit],
                "{side:?} {cep:?}"
            );
        }
    }
    // While down, a connect from the port is refused.
    let probe = p.a.create().unwrap();
    let now = p.now;
    assert_eq!(
        p.a.connect(now, probe, &Pair::connect_params(SID, 0x77)),
        Err(CmError::PortDown { port: PORT })
    );
    let now = p.now;
    p.a.destroy(now, probe).unwrap();

    // Everything released: back to the baseline.
    for (side, ceps) in [(Side::A, &a), (Side::B, &b)] {
        for &cep in ceps {
            let now = p.now;
            p.node(side).destroy(now, cep).unwrap();
        }
    }
    p.drive();
    assert_eq!(p.a.live_ceps(), 0);
    assert_eq!(p.b.live_ceps(), 1, "the listen");
    assert_eq!(p.a.peer_map_entries() + p.b.peer_map_entries(), 0);
    assert_eq!((p.a.timer_entries(), p.b.timer_entries()), timers);
    // The memory the flap leaves is what ending the same connections the ordinary way
    // leaves (the slab grows past a peak by the comm-ID reuse rule either way), but for
    // the event queue, which may have grown by one batch of port-down events.
    let ordinary = control(seed, chaos);
    let batch = TIMER_BATCH * std::mem::size_of::<(CepId, Event)>();
    for (m, o) in [(p.a.memory(), ordinary.0), (p.b.memory(), ordinary.1)] {
        assert_eq!((m.slab, m.lookups, m.timers), (o.slab, o.lookups, o.timers));
        assert!(m.queues <= o.queues + batch, "{m:?} {o:?}");
    }

    // The port comes back: all K reconnect from the same QPNs, through the same listen.
    p.a.port_up(PORT);
    p.b.port_up(PORT);
    let req_retries_before = p.a.counters().retries[counter_slot(AttributeId::Req).unwrap()];
    let (again, accepted) = connect_all(&mut p);
    assert_eq!((again.len(), accepted.len()), (K as usize, K as usize));
    let req_retries = p.a.counters().retries[counter_slot(AttributeId::Req).unwrap()];
    if !chaos {
        assert_eq!(req_retries, req_retries_before, "a REQ was re-sent");
        assert_eq!(sent(&p.b, AttributeId::Rej), 0);
    }
}

#[test]
fn link_flap_tells_every_connection_once_and_all_reconnect() {
    flap(31, false);
}

#[test]
fn link_flap_under_loss_duplication_and_reordering() {
    flap(32, true);
}

/// One connection taken to a state, then A's port goes down alone (B's stays up).
struct Case {
    name: &'static str,
    /// Which side's CEP is looked at.
    side: Side,
    /// The event it gets (None: none).
    event: Option<Event>,
    /// Its state after.
    after: StateName,
}

/// Builds a pair with one connection whose `side` CEP is in the state `case` names;
/// returns it and the CEP.
fn in_state(name: &str) -> (Pair, CepId) {
    let mut p = Pair::new(7);
    let (a, _) = p.start_connect(SID);
    let b = |p: &mut Pair| {
        p.drive_for(1_000_000);
        let b = p.last_request().unwrap();
        p.b.take_request(b).unwrap();
        b
    };
    let accept = |p: &mut Pair, cep: CepId| {
        let now = p.now;
        p.b.accept(now, cep, &Pair::rep_params(QPN_B)).unwrap();
        p.drive_for(1_000_000);
    };
    match name {
        "REQ sent" => (p, a),
        "MRA received for the REQ" => {
            let cep = b(&mut p);
            p.b.mra(cep, 20, b"").unwrap();
            p.drive_for(1_000_000);
            (p, a)
        }
        "REQ received" => {
            let cep = b(&mut p);
            (p, cep)
        }
        "REP sent" => {
            let cep = b(&mut p);
            let now = p.now;
            p.b.accept(now, cep, &Pair::rep_params(QPN_B)).unwrap();
            (p, cep)
        }
        "REP received" => {
            let cep = b(&mut p);
            accept(&mut p, cep);
            (p, a)
        }
        "established" => {
            let cep = b(&mut p);
            accept(&mut p, cep);
            p.a.rtu(a, b"").unwrap();
            p.drive_for(1_000_000);
            (p, a)
        }
        "DREQ sent" | "DREQ received" | "timewait" => {
            let cep = b(&mut p);
            accept(&mut p, cep);
            p.a.rtu(a, b"").unwrap();
            p.drive_for(1_000_000);
            let now = p.now;
            if name == "DREQ sent" {
                p.a.disconnect(now, a, b"").unwrap();
                return (p, a);
            }
            p.b.disconnect(now, cep, b"").unwrap();
            p.drive_for(100_000);
            if name == "timewait" {
                let now = p.now;
                p.a.drep(now, a, b"").unwrap();
            }
            (p, a)
        }
        _ => unreachable!("{name}"),
    }
}

#[test]
fn each_state_when_its_port_goes_down() {
    let timeout = |message| Some(Event::Timeout { message });
    let cases = [
        Case {
            name: "REQ sent",
            side: Side::A,
            event: timeout(AttributeId::Req),
            after: StateName::Idle,
        },
        Case {
            name: "MRA received for the REQ",
            side: Side::A,
            event: timeout(AttributeId::Req),
            after: StateName::Idle,
        },
        Case {
            name: "REQ received",
            side: Side::B,
            event: timeout(AttributeId::Rep),
            after: StateName::Idle,
        },
        Case {
            name: "REP sent",
            side: Side::B,
            event: timeout(AttributeId::Rep),
            after: StateName::Timewait,
        },
        Case {
            name: "REP received",
            side: Side::A,
            event: timeout(AttributeId::Req),
            after: StateName::Timewait,
        },
        Case {
            name: "established",
            side: Side::A,
            event: Some(Event::DreqReceived(Default::default())),
            after: StateName::DreqRcvd,
        },
        Case {
            name: "DREQ sent",
            side: Side::A,
            event: timeout(AttributeId::Dreq),
            after: StateName::Timewait,
        },
        Case {
            name: "DREQ received",
            side: Side::A,
            event: None,
            after: StateName::DreqRcvd,
        },
        Case {
            name: "timewait",
            side: Side::A,
            event: None,
            after: StateName::Timewait,
        },
    ];
    for case in cases {
        let (mut p, cep) = in_state(case.name);
        p.flush();
        let from = p.events(case.side).len();
        let sent_before = sent_total(p.node(case.side));
        port_down(&mut p, case.side);
        let got = events_since(&p, case.side, from, cep);
        assert_eq!(
            got,
            case.event.into_iter().collect::<Vec<_>>(),
            "{}",
            case.name
        );
        assert_eq!(
            p.node(case.side).state(cep),
            Ok(case.after),
            "{}",
            case.name
        );
        // Nothing more is sent from the port, not even the REJ(Timeout) a timeout sends.
        p.drive_for(5_000_000_000);
        assert_eq!(sent_total(p.node(case.side)), sent_before, "{}", case.name);
        // Whatever is left ends by itself: timewait runs out, nothing waits for ever
        // but what waits on its owner (DREQ received).
        let left = p.node(case.side).state(cep).unwrap();
        assert!(
            matches!(left, StateName::Idle | StateName::DreqRcvd),
            "{}: {left:?}",
            case.name
        );
    }
}

/// A port removed while down and added again under its number starts up: AL reports the
/// new port's state right after IB_PNP_PORT_ADD (ib_al.h, `IB_PNP_PORT_ADD`), and until
/// then nothing may be refused for the old port's state.
#[test]
fn a_port_removed_while_down_comes_back_up() {
    let mut p = Pair::new(9);
    port_down(&mut p, Side::A);
    assert!(p.a.is_port_down(PORT));
    p.a.remove_port(PORT);
    assert!(!p.a.is_port_down(PORT));
    let (a, _) = p.start_connect(SID);
    assert_eq!(p.a.state(a), Ok(StateName::ReqSent));
}
