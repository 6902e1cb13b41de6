//! Handling MADs for established connections allocates nothing.
//!
//! A counting global allocator wraps the system one; it counts only on the thread that
//! enables it (the test harness's own threads may allocate meanwhile). Two managers
//! reserve room for M connections up front ([`CmManager::reserve`]), then establish them
//! (allocations allowed). The measured phase then, for every connection:
//!
//! 1. feeds A a duplicate of B's REP: A answers with its cached RTU, which B takes as a
//!    duplicate;
//! 2. disconnects from A with no private data: B gets the DREQ (twice: the duplicate is
//!    dropped) and reports DreqReceived;
//! 3. answers with a DREP with no private data: A gets it (twice) and reports
//!    DrepReceived; both sides enter timewait;
//! 4. replays the DREQ to B in timewait, which repeats its DREP; A drops that as a
//!    duplicate;
//! 5. lets timewait expire on both sides (TimewaitExit for every CEP, peer maps emptied);
//! 6. destroys every CEP.
//!
//! The MADs, events and timers of a phase fit the queues and the heap `reserve` sized, so
//! the count must be zero. (One test only: the counter is global.)

use ibcm_cep::pair::{GUID_A, GUID_B, Pair};
use ibcm_cep::{CepId, CmConfig, CmManager, Event, Instant, MadAddress, StateName};

const M: usize = 1000;
const SERVICE: u64 = 0x7000;

fn address(lid: u16) -> MadAddress {
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[14..].copy_from_slice(&lid.to_be_bytes());
    MadAddress {
        port: 1,
        lid,
        gid,
        grh: false,
        sl: 0,
        pkey: 0xffff,
    }
}

/// Delivers every MAD `from` has queued to `to`, `copies` times each; returns how many.
fn pump(
    now: Instant,
    from: &mut CmManager,
    src: &MadAddress,
    to: &mut CmManager,
    copies: usize,
) -> usize {
    let mut n = 0;
    while let Some(t) = from.poll_transmit() {
        for _ in 0..copies {
            to.handle_mad(now, src, &t.mad);
        }
        n += 1;
    }
    n
}

#[derive(Default, Debug, PartialEq, Eq)]
struct Tally {
    dreq: usize,
    drep: usize,
    timewait_exit: usize,
    other: usize,
}

fn tally(m: &mut CmManager, t: &mut Tally) {
    while let Some((_, e)) = m.poll_event() {
        match e {
            Event::DreqReceived(_) => t.dreq += 1,
            Event::DrepReceived(_) => t.drep += 1,
            Event::TimewaitExit => t.timewait_exit += 1,
            _ => t.other += 1,
        }
    }
}

#[test]
fn established_connections_allocate_nothing() {
    let (src_a, src_b) = (address(1), address(2));
    let mut now = Instant::from_nanos(1_000_000);
    let mut a = CmManager::new(CmConfig::new(GUID_A, [1; 32]));
    let mut b = CmManager::new(CmConfig::new(GUID_B, [2; 32]));
    a.reserve(M + 1).expect("reserve A");
    b.reserve(M + 1).expect("reserve B");

    // Establish M connections (allocations allowed).
    let listen = b.create().unwrap();
    b.listen(listen, Pair::listen_params(SERVICE, M as u32 + 1))
        .unwrap();
    let mut a_ceps: Vec<CepId> = Vec::with_capacity(M);
    for i in 0..M {
        let cep = a.create().unwrap();
        a.connect(now, cep, &Pair::connect_params(SERVICE, 1 + i as u32))
            .unwrap();
        a_ceps.push(cep);
    }
    assert_eq!(pump(now, &mut a, &src_a, &mut b, 1), M);
    let mut b_ceps = Vec::with_capacity(M);
    while let Some((cep, e)) = b.poll_event() {
        assert!(matches!(e, Event::ReqReceived(_)), "{e:?}");
        b.take_request(cep).unwrap();
        b.accept(now, cep, &Pair::rep_params(0x10_0000 + b_ceps.len() as u32))
            .unwrap();
        b_ceps.push(cep);
    }
    assert_eq!(b_ceps.len(), M);
    let mut reps = Vec::with_capacity(M);
    while let Some(t) = b.poll_transmit() {
        a.handle_mad(now, &src_b, &t.mad);
        reps.push(t.mad);
    }
    while let Some((cep, e)) = a.poll_event() {
        assert!(matches!(e, Event::RepReceived(_)), "{e:?}");
        a.rtu(cep, &[]).unwrap();
    }
    assert_eq!(pump(now, &mut a, &src_a, &mut b, 1), M);
    let mut t = Tally::default();
    tally(&mut b, &mut t);
    assert_eq!(t.other, M, "RtuReceived on every CEP");
    for (&ca, &cb) in a_ceps.iter().zip(&b_ceps) {
        assert_eq!(a.state(ca).unwrap(), StateName::Established);
        assert_eq!(b.state(cb).unwrap(), StateName::Established);
    }
    assert_eq!((a.timer_entries(), b.timer_entries()), (0, 0));

    // Warm up: one round of duplicate REPs, uncounted.
    for rep in &reps {
        a.handle_mad(now, &src_b, rep);
    }
    assert_eq!(pump(now, &mut a, &src_a, &mut b, 1), M);
    let mut dreqs: Vec<[u8; 256]> = Vec::with_capacity(M);
    let mut ta = Tally::default();
    let mut tb = Tally::default();

    // The measured phase: allocation_counter counts this thread's allocations only.
    let mut counted = (0, 0, 0, 0);
    let info = allocation_counter::measure(|| {
        // 1. Duplicate REPs -> cached RTUs -> duplicates at B.
        for rep in &reps {
            a.handle_mad(now, &src_b, rep);
        }
        let rtus = pump(now, &mut a, &src_a, &mut b, 1);
        // 2. DREQ from A, delivered twice.
        for &cep in &a_ceps {
            let _ = a.disconnect(now, cep, &[]);
        }
        while let Some(t) = a.poll_transmit() {
            b.handle_mad(now, &src_a, &t.mad);
            b.handle_mad(now, &src_a, &t.mad);
            dreqs.push(t.mad);
        }
        tally(&mut b, &mut tb);
        // 3. DREP from B, delivered twice.
        now = now.add_nanos(1_000);
        for &cep in &b_ceps {
            let _ = b.drep(now, cep, &[]);
        }
        let dreps = pump(now, &mut b, &src_b, &mut a, 2);
        tally(&mut a, &mut ta);
        // 4. A DREQ replayed into timewait: B repeats its DREP, A drops it.
        for dreq in &dreqs {
            b.handle_mad(now, &src_a, dreq);
        }
        let repeated = pump(now, &mut b, &src_b, &mut a, 1);
        // 5. Timewait ends, a bounded batch of timers per pass (a timer DPC's work).
        now = now.add_nanos(10_000_000_000);
        for (m, t) in [(&mut a, &mut ta), (&mut b, &mut tb)] {
            let mut passes = 0;
            while m.poll_timeout().is_some_and(|at| at <= now) {
                let before = t.timewait_exit;
                m.handle_timeout(now);
                tally(m, t);
                assert!(t.timewait_exit - before <= ibcm_cep::TIMER_BATCH);
                passes += 1;
            }
            // Besides its timers, a pass pops at most TIMER_BATCH cancelled entries (the
            // DREQs' retry timers here, one a CEP) in the loop and as many after it.
            let live = M.div_ceil(ibcm_cep::TIMER_BATCH);
            assert!(
                (live..=live + M.div_ceil(2 * ibcm_cep::TIMER_BATCH)).contains(&passes),
                "{passes} passes for {M} timers"
            );
        }
        // 6. Destroy.
        for &cep in &a_ceps {
            let _ = a.destroy(now, cep);
        }
        for &cep in &b_ceps {
            let _ = b.destroy(now, cep);
        }
        counted = (rtus, dreqs.len(), dreps, repeated);
    });
    let allocations = info.count_total;
    println!("measured phase: {allocations} allocations");
    assert_eq!(counted, (M, M, M, M));
    let done = |dreq, drep| Tally {
        dreq,
        drep,
        timewait_exit: M,
        other: 0,
    };
    assert_eq!(ta, done(0, M), "A's events");
    assert_eq!(tb, done(M, 0), "B's events");
    assert_eq!(
        (a.live_ceps(), b.live_ceps()),
        (0, 1),
        "only B's listen is left"
    );
    assert_eq!((a.peer_map_entries(), b.peer_map_entries()), (0, 0));
    assert_eq!((a.timer_entries(), b.timer_entries()), (0, 0));
    assert_eq!(
        allocations, 0,
        "handling MADs of established connections allocated"
    );
}
