//! End to end through the user library: `ibcm` (blocking, async, overlapped) -> IOCTL byte
//! records -> the driver's dispatch -> the CEP engine -> the simulated fabric, on two
//! nodes in real time. Every scenario ends with the host verifier clean: no request left
//! uncompleted, none completed twice or under a lock, no endpoint outliving its handle.

use std::time::Duration;

use ibcm::{
    AcceptParams, CompletionPort, ConnectParams, Detail, Error, Failover, ListenParams, Overlapped,
    Provider, RejReason, spawn,
};
use ibcm_cli::sim::{Sim, SimOptions};
use ibcm_ioctl::status;
use ibcm_mad::AttributeId;

fn sim() -> Sim {
    Sim::start(&SimOptions::default())
}

fn listen(p: &Provider, service_id: u64) -> ibcm::Listener {
    p.listen(&ListenParams {
        service_id,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: 8,
    })
    .expect("listen")
}

fn accept_params(qpn: u32, private_data: &[u8]) -> AcceptParams<'_> {
    AcceptParams {
        qpn,
        starting_psn: None,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        failover_accepted: Failover::NotSupported,
        flow_control: true,
        srq: false,
        private_data,
    }
}

/// Short CM timeouts, so that a silent peer is noticed in milliseconds.
fn quick(mut p: ConnectParams<'static>, retries: u8) -> ConnectParams<'static> {
    p.primary_path.packet_life_time = 8; // 1 ms
    p.remote_cm_response_timeout = 10; // 4 ms
    p.local_cm_response_timeout = 10;
    p.max_cm_retries = retries;
    p
}

/// Drops the providers' last references (closing their handles) and checks the verifier
/// and the engines.
fn assert_clean(sim: &Sim) {
    let v = sim.violations();
    assert!(v.is_empty(), "verifier: {v:?}");
}

/// Waits (bounded) for an overlapped operation.
fn finished<T: 'static>(ov: &Overlapped, what: &str) -> T {
    let port = CompletionPort::new();
    for _ in 0..500 {
        if ov.is_done() {
            return ov
                .result::<T>()
                .unwrap_or_else(|| panic!("{what}: wrong result type"));
        }
        let _ = port.get(Some(Duration::from_millis(10)));
    }
    panic!("{what} did not complete within 5 s");
}

#[test]
fn connect_accept_rtu_disconnect_with_private_data_both_ways() {
    let sim = sim();
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let listener = listen(&server, 0x5000);
    let srv = std::thread::spawn(move || -> ibcm::Result<(Vec<u8>, Vec<u8>)> {
        let req = listener.get_request()?;
        assert_eq!(req.service_id, 0x5000);
        assert_eq!(req.remote_qpn, 0x11);
        let ep = req.endpoint;
        let qp = ep.prepare_accept(&accept_params(0x22, b"welcome"))?;
        assert_eq!(qp.rtr.dest_qpn, Some(0x11));
        ep.accept()?;
        let dreq = ep.notify_disconnect()?;
        ep.disconnect(b"goodbye")?;
        ep.wait_timewait()?;
        Ok((req.private_data, dreq))
    });
    let ep = client.connect_endpoint().unwrap();
    let mut params = ibcm::example_connect_params(0x5000, 0x11, 0, 1);
    params.private_data = b"hello";
    let reply = ep.connect(&params).expect("connect");
    assert_eq!(reply.remote_qpn, 0x22);
    assert_eq!(&reply.private_data[..7], b"welcome");
    assert_eq!(reply.rtr.dest_qpn, Some(0x22));
    ep.rtu(&[]).expect("rtu");
    ep.disconnect(b"bye").expect("disconnect");
    let q = ep.query().expect("query");
    assert_eq!(&q.private_data[..7], b"goodbye", "the DREP's private data");
    ep.wait_timewait().expect("timewait");
    let (req_pd, dreq_pd) = srv.join().unwrap().expect("server side");
    assert_eq!(&req_pd[..5], b"hello");
    assert_eq!(&dreq_pd[..3], b"bye");
    drop(ep);
    drop((client, server));
    assert_eq!(sim.live_ceps(0), 0);
    assert_eq!(sim.live_ceps(1), 0);
    assert_clean(&sim);
}

#[test]
fn a_reject_reaches_the_client_with_its_reason_and_private_data() {
    let sim = sim();
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let listener = listen(&server, 0x5001);
    let srv = std::thread::spawn(move || {
        let req = listener.get_request().expect("request");
        req.endpoint
            .reject(RejReason::ConsumerDefined, b"not today")
            .expect("reject");
    });
    let ep = client.connect_endpoint().unwrap();
    let err = ep
        .connect(&ibcm::example_connect_params(0x5001, 0x11, 0, 1))
        .expect_err("rejected");
    srv.join().unwrap();
    assert_eq!(err.operation, "connect");
    assert_eq!(err.status, status::CONNECTION_REFUSED);
    assert_eq!(err.reject_reason(), Some(RejReason::ConsumerDefined));
    match &err.detail {
        Detail::Rejected { private_data, .. } => assert_eq!(&private_data[..9], b"not today"),
        other => panic!("expected a REJ, got {other:?}"),
    }
    assert!(err.to_string().contains("connect failed"), "{err}");
    drop(ep);
    drop((client, server));
    assert_clean(&sim);
}

#[test]
fn a_silent_peer_times_out_naming_the_operation() {
    // Node 5 does not exist: the fabric drops every MAD for it.
    let sim = sim();
    let client = sim.provider(0).unwrap();
    let ep = client.connect_endpoint().unwrap();
    let mut params = quick(ibcm::example_connect_params(0x5002, 0x11, 0, 5), 2);
    params.private_data = b"anyone?";
    let started = std::time::Instant::now();
    let err = ep.connect(&params).expect_err("nobody answers");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(err.operation, "connect");
    assert_eq!(err.status, status::IO_TIMEOUT);
    assert_eq!(
        err.detail,
        Detail::Timeout {
            message: AttributeId::Req
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("connect") && text.contains("STATUS_IO_TIMEOUT") && text.contains("Req"),
        "{text}"
    );
    // Three REQs went out: the first and two retries.
    let c = client.counters().unwrap();
    assert_eq!((c.sent[0], c.retries[0]), (1, 2));
    drop(ep);
    drop(client);
    assert_clean(&sim);
}

#[test]
fn a_pending_get_request_is_cancelled() {
    let sim = sim();
    let server = sim.provider(1).unwrap();
    let listener = std::sync::Arc::new(listen(&server, 0x5003));
    let l = std::sync::Arc::clone(&listener);
    let waiter = std::thread::spawn(move || l.get_request().map(|_| ()));
    std::thread::sleep(Duration::from_millis(50));
    listener.cancel();
    let err: Error = waiter.join().unwrap().expect_err("cancelled");
    assert!(err.is_cancelled(), "{err}");
    assert_eq!(err.operation, "get request");
    // The listener still works afterwards: the overlapped form, cancelled again.
    let ov = Overlapped::new();
    spawn(listener.get_request_async(), &ov);
    std::thread::sleep(Duration::from_millis(20));
    assert!(!ov.is_done());
    listener.cancel();
    let r: ibcm::Result<ibcm::ConnectionRequest> = finished(&ov, "get request");
    assert!(r.err().is_some_and(|e| e.is_cancelled()));
    drop(listener);
    drop(server);
    assert_clean(&sim);
}

#[test]
fn dropping_an_endpoint_with_an_operation_pending() {
    let sim = sim();
    let client = sim.provider(0).unwrap();
    let port = CompletionPort::new();
    // A connect to nobody, overlapped; the application drops its endpoint at once.
    let ep = client.connect_endpoint().unwrap();
    let params = quick(ibcm::example_connect_params(0x5004, 0x11, 0, 5), 1);
    let ov = Overlapped::with_port(&port, 7);
    spawn(ep.connect_async(&params), &ov);
    drop(ep);
    // The operation still ends (the driver's retries run out), on the port, and the
    // endpoint is destroyed once nothing refers to it.
    let packet = port
        .get(Some(Duration::from_secs(5)))
        .expect("the connect completes");
    assert_eq!(packet.key, 7);
    let r: ibcm::Result<ibcm::ConnectReply> = packet.overlapped.result().expect("a result");
    assert_eq!(r.expect_err("timed out").status, status::IO_TIMEOUT);
    // An endpoint dropped while a wait on it is pending from another clone: the wait
    // is ended by cancel, and the drop then destroys it.
    let ep = client.connect_endpoint().unwrap();
    let ov = Overlapped::new();
    spawn(ep.notify_disconnect_async(), &ov);
    ep.cancel();
    drop(ep);
    let r: ibcm::Result<Vec<u8>> = finished(&ov, "notify disconnect");
    assert!(r.err().is_some_and(|e| e.is_cancelled()));
    for _ in 0..100 {
        if sim.live_ceps(0) == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(sim.live_ceps(0), 0, "both endpoints destroyed");
    drop(client);
    assert_clean(&sim);
}

#[test]
fn closing_the_provider_cancels_everything_outstanding() {
    let sim = sim();
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let port = CompletionPort::new();
    // 1: an established connection whose server waits for a DREQ; the client waits too.
    let listener = listen(&server, 0x5005);
    let srv = std::thread::spawn(move || {
        let req = listener.get_request().expect("request");
        req.endpoint
            .prepare_accept(&accept_params(0x22, b""))
            .expect("prepare");
        req.endpoint.accept().expect("accept");
        (listener, req.endpoint)
    });
    let ep = client.connect_endpoint().unwrap();
    ep.connect(&ibcm::example_connect_params(0x5005, 0x11, 0, 1))
        .expect("connect");
    ep.rtu(&[]).unwrap();
    let (listener, server_ep) = srv.join().unwrap();
    spawn(
        ep.notify_disconnect_async(),
        &Overlapped::with_port(&port, 1),
    );
    // 2: a connect to nobody with long timeouts.
    let silent = client.connect_endpoint().unwrap();
    let mut params = ibcm::example_connect_params(0x5006, 0x12, 0, 5);
    params.max_cm_retries = 15;
    spawn(
        silent.connect_async(&params),
        &Overlapped::with_port(&port, 2),
    );
    // 3: a timewait that has not begun (no disconnect yet).
    spawn(ep.wait_timewait_async(), &Overlapped::with_port(&port, 3));
    // 4, 5 on the server: a get_request and a notify_disconnect.
    spawn(
        listener.get_request_async(),
        &Overlapped::with_port(&port, 4),
    );
    spawn(
        server_ep.notify_disconnect_async(),
        &Overlapped::with_port(&port, 5),
    );
    std::thread::sleep(Duration::from_millis(20));
    assert!(port.get(Some(Duration::ZERO)).is_none(), "all pending");

    // Close both handles while the application still holds everything. The fabric goes
    // silent first: otherwise the DREQ the first close sends (its connection is torn down
    // in the background) would legitimately complete the peer's notify_disconnect.
    sim.with_fabric(|f| f.faults.loss = 1.0);
    client.close();
    server.close();
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let p = port
            .get(Some(Duration::from_secs(5)))
            .expect("every pending operation completes");
        let err = match p.key {
            1 | 5 => p
                .overlapped
                .result::<ibcm::Result<Vec<u8>>>()
                .unwrap()
                .err(),
            2 => p
                .overlapped
                .result::<ibcm::Result<ibcm::ConnectReply>>()
                .unwrap()
                .err(),
            3 => p.overlapped.result::<ibcm::Result<()>>().unwrap().err(),
            4 => p
                .overlapped
                .result::<ibcm::Result<ibcm::ConnectionRequest>>()
                .unwrap()
                .err(),
            k => panic!("unexpected key {k}"),
        };
        let err = err.unwrap_or_else(|| panic!("operation {} succeeded", p.key));
        assert_eq!(err.status, status::CANCELLED, "operation {}: {err}", p.key);
        seen.push(p.key);
    }
    seen.sort_unstable();
    assert_eq!(seen, [1, 2, 3, 4, 5]);
    // Later operations on the closed handle fail cleanly.
    assert_eq!(
        client.connect_endpoint().err().map(|e| e.status),
        Some(status::INVALID_HANDLE)
    );
    drop((ep, silent, listener, server_ep));
    drop((client, server));
    assert_clean(&sim);
}

/// A connection with the short timeouts of [`quick`], established between a client on
/// node 0 (QPN 0x11) and a server on node 1 (QPN 0x22); the client's and the server's
/// endpoints.
fn established_quick(
    client: &Provider,
    server: &Provider,
    service_id: u64,
) -> (ibcm::ConnectEndpoint, ibcm::ConnectEndpoint) {
    let listener = listen(server, service_id);
    let srv = std::thread::spawn(move || {
        let req = listener.get_request().expect("request");
        req.endpoint
            .prepare_accept(&accept_params(0x22, b""))
            .expect("prepare");
        req.endpoint.accept().expect("accept");
        req.endpoint
    });
    let ep = client.connect_endpoint().unwrap();
    ep.connect(&quick(
        ibcm::example_connect_params(service_id, 0x11, 0, 1),
        2,
    ))
    .expect("connect");
    ep.rtu(&[]).expect("rtu");
    let server_ep = srv.join().unwrap();
    (ep, server_ep)
}

/// Node 0's host reboots and its fresh driver connects to `params`' service again from
/// the connection's QPN: the server's CM answers REJ(StaleConn) and ends the old
/// connection with its own DREQ (IBA 12.9.8.3.1; Linux `cm_match_req`). The rebooted
/// node's provider and endpoint.
fn reconnect_stale(sim: &Sim, params: &ConnectParams<'_>) -> (Provider, ibcm::ConnectEndpoint) {
    assert!(sim.reboot(0));
    let rebooted = sim.provider(0).unwrap();
    let again = rebooted.connect_endpoint().unwrap();
    let refused = again
        .connect(params)
        .expect_err("a REQ from a connected QPN is stale");
    assert_eq!(refused.reject_reason(), Some(RejReason::StaleConn));
    (rebooted, again)
}

/// The CM ends a connection itself ([`reconnect_stale`]) with its DREQ, which the
/// rebooted CM answers with a DREP as it answers any DREQ for no connection of its own
/// (Linux `cm_dreq_handler` -> `cm_issue_drep`). The server's watch for the end of the
/// connection completes with the CM's reason, as rdma_cm reports IB_CM_DREP_RECEIVED as
/// RDMA_CM_EVENT_DISCONNECTED (cma.c `cma_ib_handler`); before, it waited for a peer's
/// DREQ that never comes.
#[test]
fn a_watch_for_the_end_of_a_connection_ends_when_the_cm_ends_it() {
    let sim = sim();
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let (client_ep, server_ep) = established_quick(&client, &server, 0x5007);
    let watch = Overlapped::new();
    spawn(server_ep.notify_disconnect_async(), &watch);
    let (rebooted, again) = reconnect_stale(
        &sim,
        &quick(ibcm::example_connect_params(0x5007, 0x11, 0, 1), 2),
    );
    let ended: ibcm::Result<Vec<u8>> = finished(&watch, "the watch for the end");
    let e = ended.expect_err("the CM ended the connection, not the peer");
    assert_eq!(e.status, ibcm::STATUS_CONNECTION_DISCONNECTED, "{e}");
    server_ep
        .disconnect(&[])
        .expect("already over: nothing to do");
    drop((again, server_ep, client_ep));
    drop((client, rebooted, server));
    assert_clean(&sim);
}

/// The application disconnects while it also watches for the end of its connection: the
/// DREP answering its DREQ is its disconnect's, and the watch stays pending (it would
/// otherwise take the DREP for the CM's own ending and leave the disconnect to time out).
#[test]
fn the_answer_to_the_applications_dreq_stays_its_disconnects() {
    let sim = sim();
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let (client_ep, server_ep) = established_quick(&client, &server, 0x5008);
    let peer = std::thread::spawn(move || {
        let dreq = client_ep.notify_disconnect().expect("the server's DREQ");
        client_ep.disconnect(b"ok").expect("the DREP");
        (dreq, client_ep)
    });
    let watch = Overlapped::new();
    spawn(server_ep.notify_disconnect_async(), &watch);
    std::thread::sleep(Duration::from_millis(20));
    let disconnect = Overlapped::new();
    spawn(server_ep.disconnect_async(b"bye"), &disconnect);
    let done: ibcm::Result<()> = finished(&disconnect, "the disconnect");
    done.expect("disconnect");
    let q = server_ep.query().expect("query");
    assert_eq!(
        &q.private_data[..2],
        b"ok",
        "the DREP's private data reached disconnect"
    );
    let (dreq, client_ep) = peer.join().unwrap();
    assert_eq!(&dreq[..3], b"bye");
    std::thread::sleep(Duration::from_millis(20));
    assert!(!watch.is_done(), "the watch took the DREP");
    server_ep.cancel();
    let cancelled: ibcm::Result<Vec<u8>> = finished(&watch, "the cancelled watch");
    assert!(cancelled.expect_err("cancelled").is_cancelled());
    drop((server_ep, client_ep));
    drop((client, server));
    assert_clean(&sim);
}

/// The application disconnects while the CM's own DREQ for a stale connection is out
/// (every MAD takes 300 ms, so the DREP is still on its way): its DREQ is refused, there
/// is nothing more to do, and the DREP that answers the CM's DREQ still reaches the
/// watch. A refused DREQ must give the events back: counting it as out for good, the
/// watch would never complete.
#[test]
fn a_refused_disconnect_leaves_the_end_to_the_watch() {
    let sim = sim();
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let (client_ep, server_ep) = established_quick(&client, &server, 0x5009);
    let watch = Overlapped::new();
    spawn(server_ep.notify_disconnect_async(), &watch);
    sim.with_fabric(|f| f.faults.delay_ns = 300_000_000);
    let mut params = ibcm::example_connect_params(0x5009, 0x11, 0, 1);
    params.remote_cm_response_timeout = 18; // 1 s: the delayed REJ comes first
    let (rebooted, again) = reconnect_stale(&sim, &params);
    // The CM's DREQ went out with the REJ; its DREP is 300 ms away.
    server_ep
        .disconnect(&[])
        .expect("the connection is already ending: nothing to do");
    let ended: ibcm::Result<Vec<u8>> = finished(&watch, "the watch for the end");
    let e = ended.expect_err("the CM ended the connection");
    assert_eq!(e.status, ibcm::STATUS_CONNECTION_DISCONNECTED, "{e}");
    sim.with_fabric(|f| f.faults.delay_ns = 0);
    drop((again, server_ep, client_ep));
    drop((client, rebooted, server));
    assert_clean(&sim);
}
