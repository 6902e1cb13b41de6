//! Two RoCEv2 ports on the loopback interface (127.0.x.1 and 127.0.x.2), each a node of the
//! in-process driver with its own provider: RDMA-CM connections through real raw sockets,
//! real IPv4 headers and real ICRCs. Needs root or CAP_NET_RAW (as CI has).
#![cfg(target_os = "linux")]

use std::net::Ipv4Addr;
use std::time::Duration;

use ibcm_cli::rocev2::{self, ConnectConfig, Ending, Roce, RoceConfig, RoceFaults, ServeConfig};
use ibcm_mad::IpServiceId;

fn port(addr: Ipv4Addr, guid: u64, faults: RoceFaults) -> Roce {
    let cfg = RoceConfig {
        prefix_len: 24,
        guid: Some(guid),
        seed: Some(guid),
        faults,
        ..RoceConfig::new(addr)
    };
    Roce::start(&cfg).unwrap_or_else(|e| {
        panic!("{e}: this test opens raw sockets on the loopback interface (run it as root)")
    })
}

fn exchange(net: u8, count: usize, ending: Ending, client_faults: RoceFaults) {
    let (a, b) = (Ipv4Addr::new(127, 0, net, 1), Ipv4Addr::new(127, 0, net, 2));
    let server = port(b, 0x0200_00ff_fe00_0002, RoceFaults::default());
    let client = port(a, 0x0200_00ff_fe00_0001, client_faults);
    let quiet = |_: String| {};
    let served = std::thread::scope(|s| {
        let h = s.spawn(|| {
            rocev2::serve(
                &server.provider,
                b,
                &ServeConfig {
                    service_id: IpServiceId::tcp(7471).to_service_id(),
                    count,
                    wait: Duration::from_secs(20),
                    ending,
                    qpn_base: 0x2000,
                },
                &quiet,
            )
        });
        // The listener is up within moments; a REQ before it is rejected, so wait for it.
        std::thread::sleep(Duration::from_millis(200));
        let mut cfg = ConnectConfig::new(b, 7471, count);
        cfg.timing.cm_response_timeout = 14;
        cfg.deadline = Duration::from_secs(20);
        let r = rocev2::connect(&client, &cfg, &quiet);
        assert_eq!(r.established, count, "{r:?}");
        assert_eq!(r.disconnected, count, "{r:?}");
        assert!(r.failures.is_empty(), "{r:?}");
        h.join().unwrap().unwrap()
    });
    assert_eq!(served.requests, count, "{served:?}");
    assert_eq!(
        served.ip_headers, count,
        "every REQ carries the RDMA-CM IP header"
    );
    assert_eq!(served.established, count);
    assert_eq!(served.completed, count);
    for (who, roce) in [("client", &client), ("server", &server)] {
        let c = roce.port.counts();
        assert_eq!(c.bad_icrc, 0, "{who}: {c:?}");
        assert_eq!(c.refused + c.send_errors, 0, "{who}: {c:?}");
        assert!(c.received >= count as u64 * 2, "{who}: {c:?}");
        let v = roce.port.node().violations();
        assert!(v.is_empty(), "{who}: the host verifier saw {v:?}");
    }
}

#[test]
fn connections_over_loopback_rocev2() {
    exchange(91, 20, Ending::Peer, RoceFaults::default());
}

#[test]
fn passive_side_ends_and_lost_reqs_are_resent() {
    let faults = RoceFaults {
        drop_tx: vec![(0x10, 2)],
        drop_rx: vec![],
    };
    exchange(92, 3, Ending::Us, faults);
}

#[test]
fn sends_off_the_link_are_refused() {
    let a = Ipv4Addr::new(127, 0, 93, 1);
    let client = port(a, 0x0200_00ff_fe00_0003, RoceFaults::default());
    let mut cfg = ConnectConfig::new(Ipv4Addr::new(127, 0, 94, 2), 7471, 1);
    cfg.timing.cm_response_timeout = 8;
    cfg.timing.max_cm_retries = 1;
    cfg.deadline = Duration::from_secs(10);
    let r = rocev2::connect(&client, &cfg, &|_| {});
    assert_eq!(r.established, 0);
    let c = client.port.counts();
    assert_eq!(c.sent, 0, "{c:?}");
    assert!(c.refused >= 1, "{c:?}");
}

/// Issue #19 on a real socket: the server's port carries ibcm's CM and the AL stand-in
/// (`RoceConfig::beside_al`), the client connects to a service of each at once, and every
/// MAD the port receives reaches the CM whose service or comm ID it names.
#[test]
fn two_cms_beside_al_share_one_port() {
    let (a, b) = (Ipv4Addr::new(127, 0, 95, 1), Ipv4Addr::new(127, 0, 95, 2));
    let count = 8;
    let server = Roce::start(&RoceConfig {
        guid: Some(0x0200_00ff_fe00_0005),
        seed: Some(5),
        beside_al: true,
        ..RoceConfig::new(b)
    })
    .unwrap_or_else(|e| panic!("{e}: this test opens raw sockets (run it as root)"));
    let client = port(a, 0x0200_00ff_fe00_0004, RoceFaults::default());
    let al = server.al.as_ref().expect("a provider on the AL stand-in");
    let serve_cfg = |port: u16, qpn_base| ServeConfig {
        service_id: IpServiceId::tcp(port).to_service_id(),
        count,
        wait: Duration::from_secs(20),
        ending: Ending::Peer,
        qpn_base,
    };
    let connect = |port: u16, qpn_base| {
        let mut cfg = ConnectConfig::new(b, port, count);
        cfg.qpn_base = qpn_base;
        cfg.timing.cm_response_timeout = 14;
        cfg.deadline = Duration::from_secs(20);
        cfg
    };
    let (to_ibcm, to_al) = (connect(7471, 0x1000), connect(7472, 0x5000));
    let quiet = |_: String| {};
    let (ours, theirs) = std::thread::scope(|s| {
        let ours = s.spawn(|| rocev2::serve(&server.provider, b, &serve_cfg(7471, 0x2000), &quiet));
        let theirs = s.spawn(|| rocev2::serve(al, b, &serve_cfg(7472, 0x3000), &quiet));
        std::thread::sleep(Duration::from_millis(200));
        let to_al = s.spawn(|| rocev2::connect(&client, &to_al, &quiet));
        let r = rocev2::connect(&client, &to_ibcm, &quiet);
        for r in [r, to_al.join().unwrap()] {
            assert_eq!((r.established, r.disconnected), (count, count), "{r:?}");
        }
        (
            ours.join().unwrap().unwrap(),
            theirs.join().unwrap().unwrap(),
        )
    });
    for r in [&ours, &theirs] {
        assert_eq!((r.requests, r.completed), (count, count), "{r:?}");
        assert!(r.failures.is_empty(), "{r:?}");
    }
    let shared = server.port.shared().expect("a shared port");
    let c = shared.counts();
    // REQ, RTU, DREQ at counter slots 0, 4, 5: `count` of each to each CM, nothing else.
    let mut each = [0u64; ibcm_host::STEER_ROWS];
    for row in [0, 4, 5] {
        each[row] = count as u64;
    }
    assert_eq!((c.steered, c.passed), (each, each), "{c:?}");
    for node in shared.nodes() {
        assert_eq!(node.violations(), vec![]);
    }
}

/// The transitions a [`RecordingQp`] was given: target state, access flags.
type Transitions = std::sync::Arc<std::sync::Mutex<Vec<(ibcm::QpState, Option<u32>)>>>;

/// A QP that only records the transitions it is given.
struct RecordingQp {
    qpn: u32,
    log: Transitions,
}

impl rocev2::Qp for RecordingQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }
    fn modify(&self, a: &ibcm::QpAttributes) -> Result<(), String> {
        self.log.lock().unwrap().push((a.state, a.access_flags));
        Ok(())
    }
}

struct RecordingQps {
    qpn: u32,
    log: Transitions,
}

impl rocev2::Qps for RecordingQps {
    fn create(&self) -> Result<Box<dyn rocev2::Qp>, String> {
        Ok(Box::new(RecordingQp {
            qpn: self.qpn,
            log: std::sync::Arc::clone(&self.log),
        }))
    }
}

/// The active side's QP (`connect_on` with real QPs) goes to INIT before the REQ with
/// REMOTE_READ (its REQ offers responder resources 1); a REP whose initiator depth is 0
/// takes that away (Linux cm_init_qp_init_attr grants REMOTE_READ | REMOTE_ATOMIC only with
/// responder resources), so the QP goes INIT -> INIT with the CM's flags before RTR, as
/// librdmacm's ucma_modify_qp_rtr and the kernel's cma_modify_qp_rtr always do; a REP with
/// initiator depth 1 changes nothing, and the QP goes straight to RTR.
#[test]
fn the_active_qp_goes_init_to_init_when_the_rep_changes_its_access() {
    use ibcm::{AcceptParams, Failover, ListenParams, QpState};
    use ibcm_ioctl::iba::access;
    let (a, b) = (Ipv4Addr::new(127, 0, 96, 1), Ipv4Addr::new(127, 0, 96, 2));
    let server = port(b, 0x0200_00ff_fe00_0007, RoceFaults::default());
    let client = port(a, 0x0200_00ff_fe00_0006, RoceFaults::default());
    for (k, rep_initiator_depth) in [0u8, 1].into_iter().enumerate() {
        let rdma_port = 7480 + k as u16;
        let listener = server
            .provider
            .listen(&ListenParams {
                service_id: IpServiceId::tcp(rdma_port).to_service_id(),
                service_mask: u64::MAX,
                port: None,
                compare: None,
                backlog: 8,
            })
            .unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let report = std::thread::scope(|s| {
            let serve = s.spawn(move || {
                let request = listener.get_request().unwrap();
                let ep = request.endpoint;
                ep.prepare_accept(&AcceptParams {
                    qpn: 0x2100 + k as u32,
                    starting_psn: None,
                    responder_resources: 1,
                    initiator_depth: rep_initiator_depth,
                    rnr_retry_count: 7,
                    failover_accepted: Failover::NotSupported,
                    flow_control: true,
                    srq: false,
                    private_data: &[],
                })
                .unwrap();
                ep.accept().unwrap();
                // The client disconnects once set up.
                ep.notify_disconnect().unwrap();
                ep.disconnect(&[]).unwrap();
            });
            let mut cfg = ConnectConfig::new(b, rdma_port, 1);
            cfg.timing.cm_response_timeout = 14;
            cfg.deadline = Duration::from_secs(20);
            let qps = RecordingQps {
                qpn: 0x1100 + k as u32,
                log: std::sync::Arc::clone(&log),
            };
            let r = rocev2::connect_on(&client.provider, a, Some(&qps), &cfg, &|_| {});
            serve.join().unwrap();
            r
        });
        assert_eq!(report.established, 1, "{report:?}");
        assert!(report.failures.is_empty(), "{report:?}");
        let log = log.lock().unwrap().clone();
        let states: Vec<QpState> = log.iter().map(|(s, _)| *s).collect();
        let read = |flags: Option<u32>| flags.is_some_and(|f| f & access::REMOTE_READ != 0);
        if rep_initiator_depth == 0 {
            assert_eq!(
                states,
                [QpState::Init, QpState::Init, QpState::Rtr, QpState::Rts],
                "{log:?}"
            );
            assert!(read(log[0].1), "before the REQ: {log:?}");
            assert!(
                !read(log[1].1),
                "after a REP with initiator depth 0: {log:?}"
            );
        } else {
            assert_eq!(
                states,
                [QpState::Init, QpState::Rtr, QpState::Rts],
                "{log:?}"
            );
            assert!(read(log[0].1), "{log:?}");
        }
    }
}
