//! `ibcm cmtime --device` runs the library's Windows backend, where every completion
//! (and every spawned operation's step) runs on the backend's one completion thread. Its
//! server used to make blocking calls there (`prepare_accept`, `reject`), waiting for the
//! thread that was waiting: the run hung at the first connection (issue 30). Here the
//! same run goes over the backend's logic with emulated Win32 calls
//! (`ibcm::backend::emulated`), both sides, on a real-time simulated fabric.

use std::sync::mpsc;
use std::time::Duration;

use ibcm_cli::cmtime::{self, Config};
use ibcm_cli::sim::{Sim, SimOptions};

#[test]
fn cmtime_over_the_windows_backend_completes() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let sim = Sim::start(&SimOptions::default());
        let client = ibcm::backend::emulated::provider(sim.node(0).unwrap()).unwrap();
        let server = ibcm::backend::emulated::provider(sim.node(1).unwrap()).unwrap();
        let cfg = Config {
            connections: 16,
            window: 4,
            ..Config::default()
        };
        let _ = tx.send(cmtime::run(&client, &server, &sim, &cfg, &|_| {}));
    });
    let report = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("cmtime hung")
        .unwrap();
    assert_eq!(report.established, 16, "{:?}", report.failures);
    assert_eq!(report.unexpected_requests, 0);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}
