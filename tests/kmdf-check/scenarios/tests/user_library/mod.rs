//! The user library (`ibcm`) on the binding: a cmtime-style run of many connections with
//! the client a process on the binding's control device (its IOCTLs through the simulated
//! I/O manager, completions through a completion port) and the server a driver/host node
//! on the simulated fabric, every MAD through AL's MAD service. It reports what the
//! binding holds per established connection (its pool, the simulation's pool tracking)
//! and the setup rate; the verifier's rules hold throughout, and nothing is left at
//! unload.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use ibcm::backend::Backend as _;
use ibcm::{AcceptParams, ConnectEndpoint, Failover, ListenParams, Provider};
use ibcm_kmdf_scenarios::user_mode::SimHandle;

use super::*;

/// The service the server listens on.
const SERVICE_ID: u64 = 0x1000_0000_0000_0cc0;
/// Client and server threads each.
const THREADS: usize = 4;

/// Connections: `IBCM_SIM_CMTIME_CONNECTIONS`, 10 000 unless set (.ci/kmdf-sim runs fewer
/// under AddressSanitizer).
fn connections() -> usize {
    std::env::var("IBCM_SIM_CMTIME_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// The client's connect parameters: from the binding's port 1 to the peer.
fn connect_params(qpn: u32) -> ibcm::ConnectParams<'static> {
    let (ours, theirs) = (port(1, 0x10), peer_port());
    let mut p = ibcm::example_connect_params(SERVICE_ID, qpn, 0, 1);
    p.port = ours.port_num;
    p.primary_path.slid = ours.lid;
    p.primary_path.dlid = theirs.lid;
    p.primary_path.sgid = ours.gid;
    p.primary_path.dgid = theirs.gid;
    p
}

/// `connections()` connections set up (REQ, REP, RTU) and torn down (DREQ, DREP), four
/// client threads on the binding against four server threads on the peer.
pub fn cmtime_with_a_host_peer() {
    let n = connections();
    let device = boot(&[]);
    let (ours, theirs) = (port(1, 0x10), peer_port());
    let peer = Peer::start(0x0002_c903_00ab_0001, address(&theirs), address(&ours));
    let server = Provider::in_process(Arc::clone(&peer.node)).expect("the peer's provider");
    let handle = SimHandle::open(LINK, Open::user(Token::ADMIN)).expect("\\\\.\\ibcm opens");
    let client = Provider::with_backend(handle.clone()).expect("the version handshake");
    let listener = Arc::new(
        server
            .listen(&ListenParams {
                service_id: SERVICE_ID,
                service_mask: u64::MAX,
                port: None,
                compare: None,
                backlog: 1024,
            })
            .expect("LISTEN"),
    );
    let (_, pool_before) = ibcm_ntos::pool::outstanding();
    let start = Instant::now();
    let accepted = Arc::new(AtomicUsize::new(0));
    let servers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (listener, accepted) = (Arc::clone(&listener), Arc::clone(&accepted));
            std::thread::spawn(move || {
                let mut kept = Vec::new();
                for i in (t..n).step_by(THREADS) {
                    let request = listener.get_request().expect("a REQ");
                    let qpn = 0x10_0000 + i as u32;
                    request
                        .endpoint
                        .prepare_accept(&AcceptParams {
                            qpn,
                            starting_psn: None,
                            responder_resources: 1,
                            initiator_depth: 1,
                            rnr_retry_count: 7,
                            failover_accepted: Failover::NotSupported,
                            flow_control: true,
                            srq: false,
                            private_data: &[],
                        })
                        .expect("FORMAT_REP");
                    request
                        .endpoint
                        .accept()
                        .expect("the REP answered with an RTU");
                    accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    kept.push(request.endpoint);
                }
                // The client's DREQs, each answered with a DREP.
                for ep in &kept {
                    ep.notify_disconnect().expect("the DREQ");
                    ep.disconnect(&[]).expect("DREP");
                }
                kept
            })
        })
        .collect();
    let clients: Vec<_> = (0..THREADS)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || -> Vec<ConnectEndpoint> {
                (t..n)
                    .step_by(THREADS)
                    .map(|i| {
                        let ep = client.connect_endpoint().expect("CREATE");
                        ep.connect(&connect_params(0x100 + i as u32))
                            .expect("the REQ answered with a REP");
                        ep.rtu(&[]).expect("RTU");
                        ep
                    })
                    .collect()
            })
        })
        .collect();
    let connected: Vec<Vec<ConnectEndpoint>> = clients
        .into_iter()
        .map(|c| c.join().expect("a client thread"))
        .collect();
    // The last RTUs reach the server after the clients return.
    let deadline = Instant::now() + Duration::from_secs(30);
    while accepted.load(std::sync::atomic::Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "every accept completes");
        std::thread::sleep(Duration::from_millis(1));
    }
    let setup = start.elapsed();
    assert_eq!(
        connected.iter().map(Vec::len).sum::<usize>(),
        n,
        "every connection set up"
    );
    let (_, pool_established) = ibcm_ntos::pool::outstanding();
    let per_connection = pool_established.saturating_sub(pool_before) / n;
    let start = Instant::now();
    let connected: Vec<Vec<ConnectEndpoint>> = connected
        .into_iter()
        .map(|share| {
            std::thread::spawn(move || {
                for ep in &share {
                    ep.disconnect(&[]).expect("DREQ answered with a DREP");
                }
                share
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().expect("a client thread"))
        .collect();
    let passive: Vec<_> = servers
        .into_iter()
        .flat_map(|s| s.join().expect("a server thread"))
        .collect();
    let teardown = start.elapsed();
    // A figure, on stdout: the runner shows a passing scenario's stdout.
    println!(
        "cmtime through the binding: {n} connections set up in {:.2} s ({:.0}/s, {THREADS} client threads), torn down in {:.2} s; the binding's pool {} B per established connection",
        setup.as_secs_f64(),
        n as f64 / setup.as_secs_f64(),
        teardown.as_secs_f64(),
        per_connection
    );
    drop((connected, passive, listener, client, server));
    handle.close();
    handle.stop();
    peer.stop();
    shutdown(device);
}
