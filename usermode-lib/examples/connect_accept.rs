//! One connection, step by step, with the in-process backend: two nodes on a simulated
//! fabric (the whole driver runs in this process), a listener on one, a client on the
//! other. Run: `cargo run -p ibcm --example connect_accept`.
//!
//! On Windows the same calls run against the installed driver: `Provider::open()` instead
//! of `Provider::in_process(node)`.

use ibcm::{AcceptParams, Clock, Fabric, Failover, ListenParams, Provider, Realtime};

fn main() -> ibcm::Result<()> {
    // Two nodes (LIDs 1 and 2) on a fabric running in real time.
    let fabric = Realtime::start(Fabric::with_clock(2, 1, Clock::real()));
    let (Some(server_node), Some(client_node)) = (fabric.node(1), fabric.node(0)) else {
        unreachable!("the fabric has two nodes");
    };
    let server = Provider::in_process(server_node)?;
    let client = Provider::in_process(client_node)?;

    // Passive side: listen for service ID 0x1000, accept one REQ.
    let listener = server.listen(&ListenParams {
        service_id: 0x1000,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: 8,
    })?;
    let server_thread = std::thread::spawn(move || -> ibcm::Result<()> {
        let request = listener.get_request()?;
        // A REQ's private data field is 92 bytes; the sender's bytes are zero-padded.
        let sent = request
            .private_data
            .split(|b| *b == 0)
            .next()
            .unwrap_or_default();
        println!(
            "server: REQ with private data {:?}",
            String::from_utf8_lossy(sent)
        );
        let qp = request.endpoint.prepare_accept(&AcceptParams {
            qpn: 0x22,
            starting_psn: None,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            failover_accepted: Failover::NotSupported,
            flow_control: true,
            srq: false,
            private_data: b"welcome",
        })?;
        // A real application moves its QP to INIT, RTR and RTS with these attributes.
        println!(
            "server: RTR attributes: destination QPN {:?}, path MTU {:?}",
            qp.rtr.dest_qpn, qp.rtr.path_mtu
        );
        request.endpoint.accept()?;
        println!("server: REP sent, RTU received: established");
        Ok(())
    });

    // Active side: connect from QPN 0x11 to the service.
    let ep = client.connect_endpoint()?;
    let mut params = ibcm::example_connect_params(0x1000, 0x11, 0, 1);
    params.private_data = b"hello";
    let reply = ep.connect(&params)?;
    println!(
        "client: REP from QPN {:?} with private data {:?}",
        reply.rtr.dest_qpn,
        String::from_utf8_lossy(&reply.private_data[..7])
    );
    ep.rtu(&[])?;
    println!("client: RTU sent: established");
    server_thread
        .join()
        .unwrap_or_else(|_| unreachable!("the server thread does not panic"))?;
    ep.disconnect(&[])?;
    println!("client: DREQ sent, DREP received: disconnected (timewait runs in the driver)");
    fabric.stop();
    Ok(())
}
