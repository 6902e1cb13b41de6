//! A port that flaps (issue 29 #3), at the engine (src/manager/link.rs): handshakes keep
//! their own retry timers, an established connection is told once only if its port is
//! still down when its QP's transport retries would have run out, a short flap ends
//! nothing, a connection told owes its peer the DREQ it could not send and sends it once
//! the port is back, APM connections migrate instead, and one `port_down` call is
//! bounded. K live connections go through long flaps (both sides, one side) with and
//! without 1 % loss, duplication and reordering: every connection is told once, nothing is
//! sent while the port is down, timers and memory go back to where they were, and all K
//! reconnect from the same QPNs.
//!
//! The counterparts ignore the event (WinOF `__cep_pnp_cb`, al_cm_cep.c:3194-3196: port
//! down/active fall to "Ignore other PNP events"; Linux `cm_client` registers add/remove
//! only): their handshakes run out their retries (al_cm_cep.c:2322-2331, Linux
//! `cm_process_send_error`) and established connections learn from their QPs, which is
//! what the deadline stands for.

use ibcm_cep::pair::{Chaos, Pair, Side, gid};
use ibcm_cep::{
    CepId, CmError, CmManager, EngineMemory, Event, Instant, PORT_SCAN_SLOTS, StateName,
    TIMER_BATCH, counter_slot,
};
use ibcm_iba::QpState;
use ibcm_mad::AttributeId;

const SID: u64 = 0x2903;
const K: u32 = 500;
const QPN_A: u32 = 0x1000;
const QPN_B: u32 = 0x9000;
/// The port both nodes of the pair use (`Pair::address_of`).
const PORT: u8 = 1;

/// Tells `side` its port went down, draining its events between the bounded calls.
fn port_down(p: &mut Pair, side: Side) {
    port_n_down(p, side, PORT);
}

/// [`port_down`] for port `port`; returns how many calls it took.
fn port_n_down(p: &mut Pair, side: Side, port: u8) -> usize {
    let (mut from, mut calls) = (Some(0), 0);
    while let Some(at) = from {
        let now = p.now;
        from = p.node(side).port_down(now, port, at);
        calls += 1;
        p.flush();
    }
    calls
}

/// When a connection's QP gives up with its port down, from the QP attributes the CEP
/// gave (RTS: Local ACK Timeout and Retry Count): (retry_count + 1) x 4.096 us x
/// 2^timeout (IBA 9.7.6.1.3, C9-140; link.rs `transport_give_up_ns`).
fn deadline_ns(m: &CmManager, cep: CepId) -> u64 {
    let rts = m.qp_attributes(cep, QpState::Rts).unwrap();
    let (timeout, retries) = (rts.timeout.unwrap(), rts.retry_count.unwrap());
    (u64::from(retries) + 1) * (4096u64 << timeout)
}

/// Drives the pair until `at` (virtual time), not past it, and sets the clock to `at`.
fn drive_until(p: &mut Pair, at: Instant) {
    let left = at.as_nanos().saturating_sub(p.now.as_nanos());
    p.drive_for(left);
    if p.now < at {
        p.now = at;
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

/// Both ends' ports go down (`both`) or only A's, for longer than the connections'
/// deadline, then come back.
fn flap(seed: u8, chaos: bool, both: bool) {
    let (mut p, listen) = warm_pair(seed, chaos);
    let timers = (p.a.timer_entries(), p.b.timer_entries());
    let (a, b) = connect_all(&mut p);
    p.drive();
    let deadline = deadline_ns(&p.a, a[0]).max(deadline_ns(&p.b, b[0]));

    let (told_a, told_b) = (p.events(Side::A).len(), p.events(Side::B).len());
    let sent_before = (sent_total(&p.a), sent_total(&p.b));
    let down_at = p.now;
    port_down(&mut p, Side::A);
    if both {
        port_down(&mut p, Side::B);
    }
    let flapped: &[(Side, &Vec<CepId>, usize)] = if both {
        &[(Side::A, &a, told_a), (Side::B, &b, told_b)]
    } else {
        &[(Side::A, &a, told_a)]
    };
    // Nobody is told before the QPs would have given up.
    drive_until(&mut p, down_at.add_nanos(deadline - 1_000_000));
    assert_eq!(p.events(Side::A).len(), told_a);
    assert_eq!(p.events(Side::B).len(), told_b);
    // Then each connection on a port that is down is told once: the DREQ its owner knows.
    drive_until(&mut p, down_at.add_nanos(deadline + 1_000_000));
    for &(side, ceps, from) in flapped {
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
    // The owners answer; their timewait does not end while the DREQ is owed.
    for &(side, ceps, _) in flapped {
        for &cep in ceps {
            let now = p.now;
            p.node(side).drep(now, cep, b"").unwrap();
            assert_eq!(p.node(side).state(cep), Ok(StateName::Timewait));
        }
    }
    p.drive_for(5_000_000_000);
    for &(side, ceps, _) in flapped {
        for &cep in ceps {
            assert_eq!(p.node(side).state(cep), Ok(StateName::Timewait));
        }
    }
    // Nothing went on the wire from a port that is down.
    assert_eq!(sent_total(&p.a), sent_before.0);
    if both {
        assert_eq!(sent_total(&p.b), sent_before.1);
    } else {
        // B's side heard nothing and still holds its connections.
        assert_eq!(p.events(Side::B).len(), told_b);
        for &cep in &b {
            assert_eq!(p.b.state(cep), Ok(StateName::Established));
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

    // The port comes back: each owed DREQ goes out once, and the peer answers.
    let (up_a, up_b) = (p.events(Side::A).len(), p.events(Side::B).len());
    let dreqs = (sent(&p.a, AttributeId::Dreq), sent(&p.b, AttributeId::Dreq));
    p.a.port_up(PORT);
    if both {
        p.b.port_up(PORT);
    }
    if !both {
        // B is told once, after A's port is up, with the DREQ A owed; its owner answers.
        let mut told = Vec::new();
        for _ in 0..1_000_000 {
            told = p.events(Side::B)[up_b..]
                .iter()
                .filter(|(_, e)| matches!(e, Event::DreqReceived(_)))
                .map(|(c, _)| *c)
                .collect();
            if told.len() >= b.len() || !p.step() {
                break;
            }
        }
        told.sort();
        let mut want = b.clone();
        want.sort();
        assert_eq!(told, want, "B told once each");
        for &cep in &b {
            let now = p.now;
            p.b.drep(now, cep, b"").unwrap();
        }
    }
    p.drive();
    assert_eq!(sent(&p.a, AttributeId::Dreq) - dreqs.0, K as u64);
    if both {
        assert_eq!(sent(&p.b, AttributeId::Dreq) - dreqs.1, K as u64);
    }
    // Each side heard once and left timewait (a DREQ on the wire carries its whole
    // private-data field, zeros here: B's is 220 bytes).
    for (side, ceps, from) in [(Side::A, &a, told_a), (Side::B, &b, told_b)] {
        for &cep in ceps {
            let got = events_since(&p, side, from, cep);
            assert!(
                matches!(got[..], [Event::DreqReceived(d), Event::TimewaitExit] if d.as_slice().iter().all(|&b| b == 0)),
                "{side:?} {cep:?}: {got:?}"
            );
        }
    }
    assert_eq!(
        p.events(Side::A)[up_a..].len(),
        K as usize,
        "A: the exits only"
    );
    let _ = up_b;

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
    // the event queue, which may have grown by one batch of told connections.
    let ordinary = control(seed, chaos);
    let batch = TIMER_BATCH * std::mem::size_of::<(CepId, Event)>();
    for (m, o) in [(p.a.memory(), ordinary.0), (p.b.memory(), ordinary.1)] {
        assert_eq!((m.slab, m.lookups, m.timers), (o.slab, o.lookups, o.timers));
        assert!(m.queues <= o.queues + batch, "{m:?} {o:?}");
    }

    // All K reconnect from the same QPNs, through the same listen: no REJ(StaleConn).
    let req_retries_before = p.a.counters().retries[counter_slot(AttributeId::Req).unwrap()];
    let rejs = sent(&p.b, AttributeId::Rej);
    let (again, accepted) = connect_all(&mut p);
    assert_eq!((again.len(), accepted.len()), (K as usize, K as usize));
    let req_retries = p.a.counters().retries[counter_slot(AttributeId::Req).unwrap()];
    if !chaos {
        assert_eq!(req_retries, req_retries_before, "a REQ was re-sent");
        assert_eq!(sent(&p.b, AttributeId::Rej), rejs);
    }
}

#[test]
fn link_flap_tells_every_connection_once_and_all_reconnect() {
    flap(31, false, true);
}

/// Only A's port goes down (review finding 1): B hears once, after A's port is back, and
/// the same QPNs reconnect without REJ(StaleConn).
#[test]
fn one_sided_flap_tells_the_peer_once_and_all_reconnect() {
    flap(33, false, false);
}

#[test]
fn link_flap_under_loss_duplication_and_reordering() {
    flap(32, true, true);
}

/// One connection taken to a state, then one side's port goes down alone (the peer's
/// stays up) and stays down for 20 s, longer than any retry budget or deadline here.
struct Case {
    name: &'static str,
    /// Which side's CEP is looked at (its port goes down).
    side: Side,
    /// The events it gets while down.
    events: Vec<Event>,
    /// Its state at the end.
    after: StateName,
}

/// Builds a pair with one connection whose CEP is in the state `name` names; returns it
/// and the CEP.
fn in_state(name: &str) -> (Pair, CepId) {
    let mut p = Pair::new(7);
    if name == "SIDR_REQ sent" {
        let a = p.a.create().unwrap();
        let now = p.now;
        let params = ibcm_cep::SidrParams {
            service_id: SID,
            port: PORT,
            pkey: 0xffff,
            path: Pair::path(Side::A),
            timeout: 16,
            max_retries: 3,
            private_data: b"",
        };
        p.a.sidr_request(now, a, &params).unwrap();
        return (p, a);
    }
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
    let established = |p: &mut Pair| {
        let cep = b(p);
        accept(p, cep);
        p.a.rtu(a, b"").unwrap();
        p.drive_for(1_000_000);
        cep
    };
    match name {
        "REQ sent" => (p, a),
        "REQ sent, MRA received" => {
            let cep = b(&mut p);
            p.b.mra(cep, 20, b"").unwrap();
            p.drive_for(1_000_000);
            (p, a)
        }
        "REQ received" => {
            let cep = b(&mut p);
            (p, cep)
        }
        "REQ received, MRA sent" => {
            let cep = b(&mut p);
            p.b.mra(cep, 20, b"").unwrap();
            (p, cep)
        }
        "REP prepared" => {
            let cep = b(&mut p);
            p.b.prepare_rep(cep, &Pair::rep_params(QPN_B)).unwrap();
            (p, cep)
        }
        "REP sent" => {
            let cep = b(&mut p);
            let now = p.now;
            p.b.accept(now, cep, &Pair::rep_params(QPN_B)).unwrap();
            (p, cep)
        }
        "REP sent, MRA received" => {
            let cep = b(&mut p);
            accept(&mut p, cep);
            p.a.mra(a, 20, b"").unwrap();
            p.drive_for(1_000_000);
            (p, cep)
        }
        "REP received" => {
            let cep = b(&mut p);
            accept(&mut p, cep);
            (p, a)
        }
        "REP received, MRA sent" => {
            let cep = b(&mut p);
            accept(&mut p, cep);
            p.a.mra(a, 20, b"").unwrap();
            (p, a)
        }
        "established" => {
            established(&mut p);
            (p, a)
        }
        "established, LAP sent" => {
            established(&mut p);
            let now = p.now;
            let mut alt = Pair::path(Side::A);
            alt.slid = 3;
            alt.sgid = gid(3);
            p.a.lap(now, a, &alt, b"").unwrap();
            (p, a)
        }
        "DREQ sent" | "DREQ received" | "timewait" => {
            let cep = established(&mut p);
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

/// Each state when its port goes down and stays down (link.rs's table): handshakes end
/// as an unanswered request ends (Timeout, as their retries run out: AL
/// `__cep_mad_send_cb` al_cm_cep.c:2322-2331, Linux `cm_process_send_error`), states that
/// wait on their owner keep waiting (AL and Linux send nothing and time nothing there),
/// an established connection is told once at its deadline (after its LAP, if one is in
/// flight, has given up), and nothing is sent from the port.
#[test]
fn each_state_when_its_port_goes_down() {
    use StateName as S;
    let timeout = |message| Event::Timeout { message };
    let told = Event::DreqReceived(Default::default());
    let case = |name, side, events: &[Event], after| Case {
        name,
        side,
        events: events.to_vec(),
        after,
    };
    let cases = [
        case("REQ sent", Side::A, &[timeout(AttributeId::Req)], S::Idle),
        case(
            "REQ sent, MRA received",
            Side::A,
            &[timeout(AttributeId::Req)],
            S::Idle,
        ),
        // The manager's own MRA at half the sender's timeout (waiting.rs), not sent.
        case("REQ received", Side::B, &[], S::MraReqSent),
        case("REQ received, MRA sent", Side::B, &[], S::MraReqSent),
        case("REP prepared", Side::B, &[], S::RepPrepared),
        case("REP sent", Side::B, &[timeout(AttributeId::Rep)], S::Idle),
        case(
            "REP sent, MRA received",
            Side::B,
            &[timeout(AttributeId::Rep)],
            S::Idle,
        ),
        case("REP received", Side::A, &[], S::RepRcvd),
        case("REP received, MRA sent", Side::A, &[], S::MraRepSent),
        case("established", Side::A, &[told], S::DreqRcvd),
        case(
            "established, LAP sent",
            Side::A,
            &[timeout(AttributeId::Lap), told],
            S::DreqRcvd,
        ),
        // Its DREQ went nowhere: still owed, so timewait waits for the port.
        case(
            "DREQ sent",
            Side::A,
            &[timeout(AttributeId::Dreq)],
            S::Timewait,
        ),
        case("DREQ received", Side::A, &[], S::DreqRcvd),
        case("timewait", Side::A, &[], S::Idle),
        case(
            "SIDR_REQ sent",
            Side::A,
            &[timeout(AttributeId::SidrReq)],
            S::Idle,
        ),
    ];
    for case in cases {
        let (mut p, cep) = in_state(case.name);
        p.flush();
        let from = p.events(case.side).len();
        let sent_before = sent_total(p.node(case.side));
        port_down(&mut p, case.side);
        // At once: nothing.
        assert_eq!(events_since(&p, case.side, from, cep), [], "{}", case.name);
        p.drive_for(20_000_000_000);
        let got = events_since(&p, case.side, from, cep);
        let no_exit: Vec<Event> = got
            .into_iter()
            .filter(|e| *e != Event::TimewaitExit)
            .collect();
        assert_eq!(no_exit, case.events, "{}", case.name);
        assert_eq!(
            p.node(case.side).state(cep),
            Ok(case.after),
            "{}",
            case.name
        );
        // Nothing is sent from the port, not even the REJ(Timeout) a timeout sends.
        assert_eq!(sent_total(p.node(case.side)), sent_before, "{}", case.name);
    }
}

/// A short flap ends nothing (review finding 2): down, up within the deadline; the
/// connection is still established on both sides, nobody is told, and a later DREQ works.
#[test]
fn a_short_flap_ends_nothing() {
    let mut p = Pair::new(11);
    let (a, b) = p.establish(SID);
    p.drive();
    let deadline = deadline_ns(&p.a, a).min(deadline_ns(&p.b, b));
    let told = (p.events(Side::A).len(), p.events(Side::B).len());
    let down_at = p.now;
    port_down(&mut p, Side::A);
    port_down(&mut p, Side::B);
    drive_until(&mut p, down_at.add_nanos(deadline / 2));
    p.a.port_up(PORT);
    p.b.port_up(PORT);
    // Past the deadline: it fires with the port up and does nothing.
    p.drive_for(2 * deadline);
    assert_eq!((p.events(Side::A).len(), p.events(Side::B).len()), told);
    assert_eq!(p.a.state(a), Ok(StateName::Established));
    assert_eq!(p.b.state(b), Ok(StateName::Established));
    let now = p.now;
    p.a.disconnect(now, a, b"bye").unwrap();
    p.drive_for(1_000_000);
    assert!(matches!(
        events_since(&p, Side::B, told.1, b)[..],
        [Event::DreqReceived(d)] if d.as_slice().starts_with(b"bye")
    ));
    let now = p.now;
    p.b.drep(now, b, b"").unwrap();
    p.drive();
    assert!(matches!(
        events_since(&p, Side::A, told.0, a)[..],
        [Event::DrepReceived(_), Event::TimewaitExit]
    ));
}

/// A port that goes down twice without coming back (AL: ACTIVE -> INIT -> DOWN,
/// al_pnp.c:1382-1397) keeps the first deadline; a flap that goes down again later counts
/// from the later down.
#[test]
fn down_twice_and_down_again() {
    let mut p = Pair::new(12);
    let (a, _b) = p.establish(SID);
    p.drive();
    let deadline = deadline_ns(&p.a, a);
    let told = p.events(Side::A).len();
    // Down, up, down again half a deadline later: the second down is what counts.
    let first = p.now;
    port_down(&mut p, Side::A);
    drive_until(&mut p, first.add_nanos(deadline / 4));
    p.a.port_up(PORT);
    drive_until(&mut p, first.add_nanos(deadline / 2));
    let second = p.now;
    port_down(&mut p, Side::A);
    // A repeated DOWN walks nothing.
    assert_eq!(p.a.port_down(p.now, PORT, 0), None);
    drive_until(&mut p, second.add_nanos(deadline - 1_000_000));
    assert_eq!(p.events(Side::A).len(), told, "told before its deadline");
    drive_until(&mut p, second.add_nanos(deadline + 1_000_000));
    assert_eq!(
        events_since(&p, Side::A, told, a),
        [Event::DreqReceived(Default::default())]
    );
}

/// A listen bound to the port stays while it is down; a REQ said to arrive on the port
/// then is dropped, and the sender's retry after the port is back is taken.
#[test]
fn a_listen_bound_to_the_port_stays() {
    let mut p = Pair::new(13);
    let listen = p.b.create().unwrap();
    let mut params = Pair::listen_params(SID, 4);
    params.port = Some(PORT);
    p.b.listen(listen, params).unwrap();
    port_down(&mut p, Side::B);
    let a = p.a.create().unwrap();
    let now = p.now;
    let mut connect = Pair::connect_params(SID, 0x11);
    connect.max_cm_retries = 15;
    p.a.connect(now, a, &connect).unwrap();
    p.drive_for(1_000_000);
    assert_eq!(p.b.state(listen), Ok(StateName::Listen));
    assert_eq!(
        p.last_request(),
        None,
        "a REQ on a port that is down is dropped"
    );
    p.b.port_up(PORT);
    p.drive_for(5_000_000_000);
    assert!(p.last_request().is_some(), "the retry is taken");
}

/// Two ports: only the CEPs on the port that goes down get a deadline (the port filter);
/// those on the other port are not even given a timer.
#[test]
fn only_the_port_that_goes_down() {
    let mut p = Pair::new(14);
    let (a1, _) = p.establish(SID);
    // A second connection from A's port 2 (the pair delivers every MAD as on port 1: the
    // engine matches REP and RTU by comm ID, not by port).
    let a2 = p.a.create().unwrap();
    let now = p.now;
    let mut params = Pair::connect_params(SID, 0x12);
    params.port = 2;
    p.a.connect(now, a2, &params).unwrap();
    p.drive_for(1_000_000);
    let b2 = p.last_request().unwrap();
    p.b.take_request(b2).unwrap();
    let now = p.now;
    p.b.accept(now, b2, &Pair::rep_params(0x23)).unwrap();
    p.drive_for(1_000_000);
    p.a.rtu(a2, b"").unwrap();
    p.drive();
    assert_eq!(p.a.state(a2), Ok(StateName::Established));
    let timers = p.a.timer_entries();
    let told = p.events(Side::A).len();
    port_n_down(&mut p, Side::A, 2);
    assert_eq!(p.a.timer_entries(), timers + 1, "one deadline, port 2's");
    p.drive_for(2 * deadline_ns(&p.a, a2));
    assert_eq!(
        p.events(Side::A)[told..],
        [(a2, Event::DreqReceived(Default::default()))]
    );
    assert_eq!(p.a.state(a1), Ok(StateName::Established));
}

/// APM (review finding 3): a connection whose alternate path leaves from another port
/// that is up is not told when its primary port goes down (its QP migrates); after the
/// migration its port is the alternate's, so that port's going down is what counts.
#[test]
fn apm_to_another_port_is_not_told() {
    let mut p = Pair::new(15);
    p.a.set_port(1, 1, 0, &[gid(1)]).unwrap();
    p.a.set_port(2, 3, 0, &[gid(3)]).unwrap();
    let listen = p.b.create().unwrap();
    p.b.listen(listen, Pair::listen_params(SID, 4)).unwrap();
    let a = p.a.create().unwrap();
    let mut alt = Pair::path(Side::A);
    alt.slid = 3;
    alt.sgid = gid(3);
    alt.dlid = 4;
    alt.dgid = gid(4);
    let mut params = Pair::connect_params(SID, 0x11);
    params.alternate_path = Some(alt);
    let now = p.now;
    p.a.connect(now, a, &params).unwrap();
    p.drive_for(1_000_000);
    let b = p.last_request().unwrap();
    p.b.take_request(b).unwrap();
    let mut rep = Pair::rep_params(0x22);
    rep.failover_accepted = ibcm_mad::Failover::Accepted;
    let now = p.now;
    p.b.accept(now, b, &rep).unwrap();
    p.drive_for(1_000_000);
    p.a.rtu(a, b"").unwrap();
    p.drive();
    let deadline = deadline_ns(&p.a, a);
    let told = p.events(Side::A).len();
    port_n_down(&mut p, Side::A, 1);
    p.drive_for(2 * deadline);
    assert_eq!(p.events(Side::A).len(), told, "its QP migrates: not told");
    assert_eq!(p.a.state(a), Ok(StateName::Established));
    // The QP migrated to port 2; then port 2 goes down too (port 1 still down): now it
    // has nowhere to go, and is told at the deadline.
    p.a.migrate(a).unwrap();
    port_n_down(&mut p, Side::A, 2);
    p.drive_for(2 * deadline_ns(&p.a, a));
    assert_eq!(
        events_since(&p, Side::A, told, a),
        [Event::DreqReceived(Default::default())]
    );
}

/// One `port_down` call looks at [`PORT_SCAN_SLOTS`] slots at most (review finding 4):
/// the index it returns counts the slots it walked. A port with no established
/// connection, and a repeated DOWN, walk nothing.
#[test]
fn port_down_is_bounded() {
    let mut p = Pair::new(16);
    let idle: Vec<CepId> = (0..3 * PORT_SCAN_SLOTS)
        .map(|_| p.a.create().unwrap())
        .collect();
    let (a, _) = p.establish(SID);
    p.drive();
    // Port 2 has nothing established: None from the first call.
    let now = p.now;
    assert_eq!(p.a.port_down(now, 2, 0), None);
    assert_eq!(p.a.port_down(now, 2, 0), None);
    // Port 1: every call advances at most PORT_SCAN_SLOTS.
    let mut from = 0;
    let mut calls = 0;
    while let Some(next) = p.a.port_down(now, PORT, from) {
        assert!(
            next > from && next - from <= PORT_SCAN_SLOTS,
            "{from} -> {next}"
        );
        from = next;
        calls += 1;
    }
    assert!(calls >= 3, "{calls}");
    // Repeated: nothing walked.
    assert_eq!(p.a.port_down(now, PORT, 0), None);
    p.drive_for(2 * deadline_ns(&p.a, a));
    assert_eq!(p.a.state(a), Ok(StateName::DreqRcvd));
    drop(idle);
}

/// One `remove_port_from` call looks at [`PORT_SCAN_SLOTS`] slots at most, as
/// `port_down` (the removal runs at every D0Exit, under the dispatch layer's spinlock): a
/// connection past the first slice hears nothing until the walk reaches it, then exactly
/// one DeviceRemoval; `None` (the CA is gone) walks every port the same way.
#[test]
fn remove_port_is_bounded() {
    let mut p = Pair::new(18);
    let idle: Vec<CepId> = (0..2 * PORT_SCAN_SLOTS)
        .map(|_| p.a.create().unwrap())
        .collect();
    let (a, _) = p.establish(SID);
    p.drive();
    let told = p.events(Side::A).len();
    let mut from = 0;
    let mut calls = 0;
    while let Some(next) = p.a.remove_port_from(Some(PORT), from) {
        assert!(
            next > from && next - from <= PORT_SCAN_SLOTS,
            "{from} -> {next}"
        );
        if next <= 2 * PORT_SCAN_SLOTS {
            assert_eq!(p.a.state(a), Ok(StateName::Established), "not reached yet");
        }
        from = next;
        calls += 1;
    }
    assert!(calls >= 2, "{calls}");
    p.flush();
    assert_eq!(events_since(&p, Side::A, told, a), [Event::DeviceRemoval]);
    // Every port: the walk is as bounded, and a CEP already removed is not told again.
    let mut from = 0;
    while let Some(next) = p.a.remove_port_from(None, from) {
        assert!(next - from <= PORT_SCAN_SLOTS);
        from = next;
    }
    p.flush();
    assert_eq!(events_since(&p, Side::A, told, a), [Event::DeviceRemoval]);
    drop(idle);
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

/// The orders AL sends (al_pnp.c): HCA removal is DOWN then REMOVE for a port whose link
/// was INIT or better (`__pnp_process_remove_port`, al_pnp.c:1022-1036), and gives each
/// connection one event, DeviceRemoval (the DOWN ends nothing and its deadline goes with
/// the port); ACTIVE without a DOWN before it (a port added Active, al_pnp.c:653-656)
/// changes nothing.
#[test]
fn al_orders_down_then_remove_and_active_alone() {
    let mut p = Pair::new(17);
    let (a, b) = p.establish(SID);
    p.drive();
    let told = p.events(Side::A).len();
    p.a.port_up(PORT);
    assert_eq!(p.a.state(a), Ok(StateName::Established));
    assert!(!p.a.is_port_down(PORT));
    port_down(&mut p, Side::A);
    p.a.remove_port(PORT);
    p.flush();
    let deadline = deadline_ns(&p.b, b);
    p.drive_for(3 * deadline);
    assert_eq!(
        events_since(&p, Side::A, told, a),
        [Event::DeviceRemoval],
        "one event on HCA removal"
    );
    assert_eq!(p.a.state(a), Ok(StateName::Removed));
}
