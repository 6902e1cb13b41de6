//! A port that flaps with live connections (issue 29 #3, #4), CI-sized: N connections
//! through the user library, the dispatch layer and the engine on the simulated fabric
//! (virtual time), with and without 1 % loss, duplication and reordering
//! (`cmtime::port_flap`): a short flap (both nodes' ports down for half the connections'
//! deadline) ends nothing, and a long one (down past the deadline) tells each side once.
//!
//! Asserted are outcomes, never timings: after the short flap every connection still
//! tears down the ordinary way (a connection told or ended would fail its DREQ or DREP);
//! after the long one every side of every connection was told by its driver exactly once
//! (an established connection reads it as the peer's DREQ: driver/cep/src/manager/link.rs),
//! answered, and left timewait once the ports were back; nothing was sent while the ports
//! were down; every connection re-made, with no REQ re-sent on a clean fabric; nothing
//! failed, stalled or leaked; and the drivers hold what an ordinary teardown of the same
//! connections leaves them.
//!
//! WinOF's CEP manager ignores `IB_PNP_PORT_DOWN` (al_cm_cep.c:3194-3196) and Linux ib_cm
//! registers no port event handler: there a short flap ends nothing either, and an
//! established connection learns of a long one from its QP, at the deadline the drivers
//! stand in for.

use ibcm::{Faults, Provider};
use ibcm_cli::cmtime::{self, FlapReport, Outcome};
use ibcm_cli::sim::{DriverMemory, Sim, SimOptions};

const N: usize = 500;

fn sim(faults: Faults, seed: u64) -> Sim {
    Sim::start(&SimOptions {
        nodes: 2,
        seed,
        faults,
        capture: false,
        real_time: false,
        max_held_requests: None,
    })
}

fn cfg() -> cmtime::Config {
    cmtime::Config {
        connections: N,
        window: N,
        ..cmtime::Config::default()
    }
}

fn providers(sim: &Sim) -> (Provider, Provider) {
    (sim.provider(0).unwrap(), sim.provider(1).unwrap())
}

fn flap(faults: Faults, seed: u64) -> (FlapReport, Sim) {
    let sim = sim(faults, seed);
    let (client, server) = providers(&sim);
    let report = cmtime::port_flap(&client, &server, &sim, &cfg(), &|_| {}).expect("runs");
    drop((client, server));
    (report, sim)
}

/// The drivers' memory (both nodes) after the same runs as [`flap`] (the first, the short
/// flap's, the flap's) but for an ordinary teardown where the long flap was. (A
/// connection torn down after the short flap leaves its deadline's entry in the timer
/// heap until the deadline passes, timers.rs: the heap may grow for it, in both.)
fn ordinary(faults: Faults, seed: u64) -> u64 {
    let sim = sim(faults, seed);
    let (client, server) = providers(&sim);
    let mut memory = 0;
    for short_flap in [false, true, false] {
        let cfg = cmtime::Config {
            short_flap,
            ..cfg()
        };
        let r = cmtime::run(&client, &server, &sim, &cfg, &|_| {}).expect("runs");
        assert_eq!(r.established, N);
        memory = r.driver_memory.map_or(0, |[_, _, after]| total(&after));
    }
    memory
}

fn total(m: &[DriverMemory]) -> u64 {
    DriverMemory::sum(m).total()
}

fn assert_flap(r: &FlapReport, sim: &Sim, clean: bool, control: u64) {
    assert_eq!(r.warm.established, N);
    // The short flap ended nothing: all torn down the ordinary way afterwards.
    let short = r.short.flap.expect("short flap figures");
    assert!(short.deadline_ns > 0 && short.down_ns < short.deadline_ns);
    assert_eq!(short.sent_while_down, 0);
    assert_eq!(r.short.established, N);
    assert!(r.short.failures.is_empty(), "{:?}", r.short.failures);
    for (i, c) in r.short.outcomes.iter().enumerate() {
        assert_eq!(c.client, Outcome::Complete, "short: client {i}");
        assert_eq!(c.server, Outcome::Complete, "short: server {i}");
    }
    assert_eq!(r.flap.established, N, "{:?}", r.flap.failures);
    let f = r.flap.flap.expect("flap figures");
    // Each side of each connection told once, and nothing left the ports while down.
    assert!(f.down_ns > f.deadline_ns);
    assert_eq!(f.told, 2 * N);
    assert_eq!(f.sent_while_down, 0);
    // ... and each answered and waited out timewait.
    for (i, c) in r.flap.outcomes.iter().enumerate() {
        assert_eq!(c.client, Outcome::Complete, "client {i}");
        assert_eq!(c.server, Outcome::Complete, "server {i}");
    }
    assert!(r.flap.failures.is_empty(), "{:?}", r.flap.failures);
    assert_eq!(r.flap.stalls, 0);
    // Every connection re-made.
    assert_eq!(r.reconnect.established, N, "{:?}", r.reconnect.failures);
    assert!(
        r.reconnect.failures.is_empty(),
        "{:?}",
        r.reconnect.failures
    );
    assert_eq!(r.reconnect.stalls + r.reconnect.unexpected_requests, 0);
    if clean {
        assert_eq!(r.reconnect_retries, (0, 0), "MADs re-sent");
    }
    // The flap leaves the drivers holding what an ordinary teardown leaves them.
    let after_flap = r
        .flap
        .driver_memory
        .as_ref()
        .map_or(0, |[_, _, a]| total(a));
    assert!(after_flap > 0);
    assert!(
        after_flap <= control,
        "after the flap {after_flap} B, after an ordinary teardown {control} B: {:?}",
        r.flap
            .driver_memory
            .as_ref()
            .map(|[_, _, a]| DriverMemory::sum(a))
    );
    // Nothing leaked once the last run's teardown is over.
    sim.pass(std::time::Duration::from_secs(60));
    assert_eq!(sim.live_ceps(0) + sim.live_ceps(1), 0);
    let v = sim.violations();
    assert!(v.is_empty(), "verifier: {:?}", &v[..v.len().min(10)]);
}

#[test]
fn port_flap_tells_every_side_once_and_all_reconnect() {
    let (r, sim) = flap(Faults::default(), 29);
    assert_flap(&r, &sim, true, ordinary(Faults::default(), 29));
}

#[test]
fn port_flap_under_loss_duplication_and_reordering() {
    let faults = Faults {
        loss: 0.01,
        duplicate: 0.01,
        reorder: 0.01,
        delay_ns: 0,
        corrupt: 0.0,
    };
    let (r, sim) = flap(faults, 30);
    assert_flap(&r, &sim, false, ordinary(faults, 30));
}
