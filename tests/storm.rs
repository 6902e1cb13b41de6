//! Reconnect storm, CI-sized (issue 29 #1, #4): every client of a restarted server
//! reconnects at once (the whole window in flight), and the server's application takes
//! requests at a set rate, slower than the REQs' response timeout allows for the last of
//! them. In virtual time, through the user library, the dispatch layer and the engine.
//!
//! Asserted are outcomes, never timings: every connection established on both sides,
//! nothing failed or stalled, nothing leaked, and the senders waited on the server's MRA
//! (IBA 12.6.6) instead of re-sending their REQs. Without the MRA (before
//! src/manager/waiting.rs), a REQ waiting longer than the sender's retry interval
//! (142.6 ms by default) was re-sent each interval, and one waiting longer than its
//! MaxCMRetries allow failed: here the last REQ waits N/R = 3 s, past the 2.28 s of the
//! default 15 retries.

use ibcm::Faults;
use ibcm_cli::cmtime::{self, Timing};
use ibcm_cli::sim::{Sim, SimOptions};
use ibcm_mad::AttributeId;

const N: usize = 3_000;
/// Requests per second: N/R = 3 s, longer than a REQ's whole retry budget.
const RATE: u32 = 1_000;
const BACKLOG: u32 = 256;

fn storm(faults: Faults, seed: u64, backlog: u32) -> (cmtime::Report, Sim, [u64; 3]) {
    let sim = Sim::start(&SimOptions {
        nodes: 2,
        seed,
        faults,
        capture: false,
        real_time: false,
        max_held_requests: None,
    });
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let cfg = cmtime::Config {
        connections: N,
        window: N,
        timing: Timing::default(),
        backlog,
        accept_rate: Some(RATE),
        ..cmtime::Config::default()
    };
    let timing = cfg.timing;
    assert!(timing.request_lifetime().as_secs_f64() < N as f64 / f64::from(RATE));
    let report = cmtime::run(&client, &server, &sim, &cfg, &|_| {}).expect("cmtime runs");
    let slot = |a: AttributeId| usize::from(u16::from(a) - 0x10);
    let c = client.counters().expect("client counters");
    let s = server.counters().expect("server counters");
    let figures = [
        c.retries[slot(AttributeId::Req)],
        s.sent[slot(AttributeId::Mra)],
        s.sent[slot(AttributeId::Rej)],
    ];
    drop((client, server));
    (report, sim, figures)
}

fn assert_all_connected(report: &cmtime::Report) {
    assert!(
        report.failures.is_empty(),
        "failures: {:?}",
        report.failures
    );
    assert_eq!(report.established, N);
    assert_eq!(report.stalls, 0);
    assert_eq!(report.unexpected_requests, 0);
}

fn assert_nothing_leaked(sim: &Sim) {
    sim.pass(std::time::Duration::from_secs(60));
    assert_eq!(sim.live_ceps(0), 0, "client engine");
    assert_eq!(sim.live_ceps(1), 0, "server engine");
    let v = sim.violations();
    assert!(v.is_empty(), "verifier: {:?}", &v[..v.len().min(10)]);
}

#[test]
fn storm_connects_all_without_retries() {
    let (report, sim, [req_retries, mras, rejs]) = storm(Faults::default(), 29, BACKLOG);
    assert_all_connected(&report);
    // Every REQ that would have waited past its sender's timeout got an MRA: no REQ was
    // re-sent, and none was refused.
    assert_eq!(req_retries, 0, "REQ retries");
    assert!(mras > 0, "no MRA sent");
    assert_eq!(rejs, 0, "REJs");
    assert_nothing_leaked(&sim);
}

#[test]
fn storm_under_loss_duplication_and_reordering() {
    let faults = Faults {
        loss: 0.01,
        duplicate: 0.01,
        reorder: 0.01,
        delay_ns: 0,
        corrupt: 0.0,
    };
    let (report, sim, [req_retries, _, rejs]) = storm(faults, 30, BACKLOG);
    assert_all_connected(&report);
    // A lost REQ or MRA costs its sender a retry; nothing else does. With 1 % loss
    // that is a few per hundred connections, far from the waves of retries the
    // storm made without the MRA (several per connection).
    assert!(
        req_retries <= (N / 20) as u64,
        "{req_retries} REQ retries for {N} connections"
    );
    assert_eq!(rejs, 0, "REJs");
    assert_nothing_leaked(&sim);
}

/// Through a backlog of 64 (driver/cep/src/manager/held.rs): the server's driver reports
/// at most 64 REQs not answered yet however eagerly the library reads, holds the rest
/// behind its MRAs, and reports them as answers make room: all connected, none re-sent
/// or refused, nothing leaked. Before, a REQ left the backlog when the library read it,
/// and the backlog bounded nothing.
#[test]
fn storm_through_a_small_backlog_connects_all_without_retries() {
    let (report, sim, [req_retries, mras, rejs]) = storm(Faults::default(), 31, 64);
    assert_all_connected(&report);
    assert_eq!(req_retries, 0, "REQ retries");
    assert!(mras > 0, "no MRA sent");
    assert_eq!(rejs, 0, "REJs");
    assert_nothing_leaked(&sim);
}
