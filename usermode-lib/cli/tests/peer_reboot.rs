//! `ibcm cmtime --peer-reboot` run small (`ibcm_cli::reboot`): through the user library,
//! the dispatch layer and the engine on the simulated fabric (virtual time), N
//! connections up, the client's node reboots (a fresh driver, same CA GUID and port,
//! other comm IDs) and its application reconnects every one from the same QPN.
//!
//! Asserted are outcomes, never timings: the survivor ends every stale connection once
//! (IBA 12.9.8.3.1: REJ(StaleConn) to the REQ that reuses the QPN, a DREQ for the old
//! connection; Linux `cm_match_req` -> `cm_issue_rej(IB_CM_REJ_STALE_CONN)` and
//! `ib_send_cm_dreq`), the rebooted node answers each DREQ with an unaffiliated DREP
//! (IBA 12.9.8.5), every connection is made again, and after the teardown neither driver
//! holds a CEP, a timer entry, a handle or an endpoint, the verifier clean.

use ibcm_cli::cmtime::Config;
use ibcm_cli::reboot;
use ibcm_cli::sim::{Sim, SimOptions};

const N: usize = 200;

fn sim() -> Sim {
    Sim::start(&SimOptions {
        real_time: false,
        ..SimOptions::default()
    })
}

#[test]
fn a_rebooted_peer_reconnects_and_the_survivor_ends_every_stale_connection() {
    let sim = sim();
    let cfg = Config {
        connections: N,
        ..Config::default()
    };
    let r = reboot::run(&sim, &cfg, &|_| {}).expect("the run");
    assert_eq!(r.established_before, N, "{r:#?}");
    // Each old connection ended once on the survivor, by its own DREQ, answered.
    assert_eq!(r.stale_ended, N, "{r:#?}");
    assert_eq!(r.survivor_dreq_sent, N as u64, "{r:#?}");
    assert_eq!(r.survivor_drep_received, N as u64, "{r:#?}");
    assert_eq!(r.rebooted_dreq_received, N as u64, "{r:#?}");
    assert_eq!(r.rebooted_drep_sent, N as u64, "{r:#?}");
    // Every REJ the survivor sent was a stale one, seen by the rebooted application.
    assert!(r.stale_rejects >= N as u64, "{r:#?}");
    assert_eq!(r.survivor_rej_sent, r.stale_rejects, "{r:#?}");
    assert_eq!(r.rebooted_rej_received, r.stale_rejects, "{r:#?}");
    assert_eq!(r.reconnected, N, "{r:#?}");
    assert!(r.failures.is_empty() && r.stalls == 0, "{r:#?}");
    assert!(r.survivor_left.none(), "{:?}", r.survivor_left);
    assert!(r.rebooted_left.none(), "{:?}", r.rebooted_left);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(r.clean());
    // Both nodes' drivers, the rebooted one fresh, are still the fabric's.
    assert_eq!(sim.live_ceps(0) + sim.live_ceps(1), 0);
}

/// `--max-held-requests` reaches each node's engine: a listen with backlog 4 and a cap
/// of 10 held REQs refuses part of a burst of 40 at once with REJ(NoResources)
/// (driver/cep/src/manager/held.rs), where the default cap holds all 40.
#[test]
fn the_held_requests_cap_is_each_nodes_setting() {
    let run = |cap: Option<u32>| {
        let sim = Sim::start(&SimOptions {
            real_time: false,
            max_held_requests: cap,
            ..SimOptions::default()
        });
        let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
        let cfg = Config {
            connections: 40,
            window: 40,
            backlog: 4,
            accept_rate: Some(1_000),
            ..Config::default()
        };
        let r = ibcm_cli::cmtime::run(&client, &server, &sim, &cfg, &|_| {}).unwrap();
        let refused: usize = r
            .failures
            .iter()
            .filter(|(reason, _)| reason.starts_with("client") && reason.contains("NoResources"))
            .map(|(_, n)| n)
            .sum();
        (r.established, refused)
    };
    let (established, refused) = run(Some(10));
    assert!(refused > 0, "{established} established, {refused} refused");
    assert_eq!(established + refused, 40);
    assert_eq!(run(None), (40, 0));
}
