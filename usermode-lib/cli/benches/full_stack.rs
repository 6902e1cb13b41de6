//! The full stack in process (design.md budget: >= 1e5 connection setups per second on
//! one core): the user library's overlapped connects and accepts -> IOCTL records ->
//! dispatch -> engine -> simulated fabric, both sides, on one thread in virtual time.
//!
//! Each sample runs `cmtime` and counts only its setup phase (REQ, REP, RTU and
//! established on both sides); the teardown that follows (disconnect, timewait) is not
//! timed. The figure criterion prints as thrpt is connection setups per second.
//!
//! - `cmtime_setup_fresh_fabric`: each sample on new nodes, so every table grows from
//!   empty and its memory is new to the process (faulted in). cmtime's default window:
//!   256 connections in flight.
//! - `cmtime_setup_warm_fabric`: every sample on the same two nodes, as a server that has
//!   been up a while: the tables have the room earlier connections left behind.
//! - `cmtime_setup_window_64`: fresh nodes, 64 connections in flight. In virtual time a
//!   step delivers every MAD in flight, so the window is the batch each step works
//!   through: 256 connections' state outgrows a core's L2, 64 does not. (cmtime's default
//!   stays 256: with loss, a smaller window stalls behind retries.)
//!
//! `cargo bench -p ibcm --bench full_stack`

use std::time::Duration;

use criterion::{Criterion, Throughput};
use ibcm_cli::cmtime::{self, Config};
use ibcm_cli::sim::{Sim, SimOptions};

/// Connections per sample: enough to fill the window many times over.
const CONNECTIONS: usize = 4000;

fn virtual_sim() -> Sim {
    Sim::start(&SimOptions {
        real_time: false,
        ..SimOptions::default()
    })
}

/// The setup phase of one cmtime run of `connections` over `sim`, `window` in flight.
fn setup_time(sim: &Sim, connections: usize, window: usize) -> Duration {
    let (client, server) = match (sim.provider(0), sim.provider(1)) {
        (Ok(c), Ok(s)) => (c, s),
        _ => panic!("the simulated fabric has two nodes"),
    };
    let cfg = Config {
        connections,
        window,
        ..Config::default()
    };
    let report = match cmtime::run(&client, &server, sim, &cfg, &|_| {}) {
        Ok(r) => r,
        Err(e) => panic!("cmtime: {e}"),
    };
    assert_eq!(report.established, connections, "{:?}", report.failures);
    report.setup_wall
}

fn full_stack(c: &mut Criterion) {
    let mut g = c.benchmark_group("full_stack");
    g.sample_size(10);
    g.throughput(Throughput::Elements(CONNECTIONS as u64));
    let window = Config::default().window;
    g.bench_function("cmtime_setup_fresh_fabric", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| setup_time(&virtual_sim(), CONNECTIONS, window))
                .sum()
        })
    });
    let sim = virtual_sim();
    g.bench_function("cmtime_setup_warm_fabric", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| setup_time(&sim, CONNECTIONS, window))
                .sum()
        })
    });
    g.bench_function("cmtime_setup_window_64", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| setup_time(&virtual_sim(), CONNECTIONS, 64))
                .sum()
        })
    });
    g.finish();

    // One IOCTL through the library: QUERY on an idle endpoint, blocking and awaited.
    let sim = virtual_sim();
    let Ok(provider) = sim.provider(0) else {
        panic!("the simulated fabric has a node 0")
    };
    let Ok(ep) = provider.connect_endpoint() else {
        panic!("CREATE failed")
    };
    let mut g = c.benchmark_group("ioctl");
    g.bench_function("query_blocking", |b| b.iter(|| ep.query().map(|q| q.state)));
    g.bench_function("create_destroy", |b| {
        b.iter(|| provider.connect_endpoint().map(drop))
    });
    g.finish();
}

criterion::criterion_group!(benches, full_stack);
criterion::criterion_main!(benches);
