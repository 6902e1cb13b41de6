//! A server accepting connections from several client threads at once, with the
//! in-process backend, and what it cost: the listener's backlog holds the REQs that wait.
//! Run: `cargo run -p ibcm --example accept_many -- [CONNECTIONS] [THREADS]`.

use std::time::Instant;

use ibcm::{AcceptParams, Clock, Fabric, Failover, ListenParams, Provider, Realtime};

fn main() -> ibcm::Result<()> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u32>());
    let connections = args.next().and_then(Result::ok).unwrap_or(200);
    let threads = args.next().and_then(Result::ok).unwrap_or(4).max(1);
    let fabric = Realtime::start(Fabric::with_clock(2, 7, Clock::real()));
    let (Some(server_node), Some(client_node)) = (fabric.node(1), fabric.node(0)) else {
        unreachable!("the fabric has two nodes");
    };
    let server = Provider::in_process(server_node)?;
    let client = std::sync::Arc::new(Provider::in_process(client_node)?);
    let listener = server.listen(&ListenParams {
        service_id: 0x2000,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: 64,
    })?;
    let start = Instant::now();
    let server_thread = std::thread::spawn(move || -> ibcm::Result<Vec<ibcm::ConnectEndpoint>> {
        let mut accepted = Vec::new();
        for k in 0..connections {
            let request = listener.get_request()?;
            request.endpoint.prepare_accept(&AcceptParams {
                qpn: 0x10_0000 + k,
                starting_psn: None,
                responder_resources: 1,
                initiator_depth: 1,
                rnr_retry_count: 7,
                failover_accepted: Failover::NotSupported,
                flow_control: true,
                srq: false,
                private_data: &[],
            })?;
            request.endpoint.accept()?;
            accepted.push(request.endpoint);
        }
        Ok(accepted)
    });
    let per_thread = connections / threads;
    let clients: Vec<_> = (0..threads)
        .map(|t| {
            let client = std::sync::Arc::clone(&client);
            let count = if t + 1 == threads {
                connections - per_thread * t
            } else {
                per_thread
            };
            std::thread::spawn(move || -> ibcm::Result<Vec<ibcm::ConnectEndpoint>> {
                (0..count)
                    .map(|k| {
                        let ep = client.connect_endpoint()?;
                        let params =
                            ibcm::example_connect_params(0x2000, 0x1000 + t * 10_000 + k, 0, 1);
                        ep.connect(&params)?;
                        ep.rtu(&[])?;
                        Ok(ep)
                    })
                    .collect()
            })
        })
        .collect();
    let mut established = Vec::new();
    for c in clients {
        established.extend(
            c.join()
                .unwrap_or_else(|_| unreachable!("client threads do not panic"))?,
        );
    }
    let accepted = server_thread
        .join()
        .unwrap_or_else(|_| unreachable!("the server thread does not panic"))?;
    let elapsed = start.elapsed();
    println!(
        "{} connections from {threads} threads established in {:.1} ms ({:.0} per second); the server accepted {}",
        established.len(),
        elapsed.as_secs_f64() * 1e3,
        established.len() as f64 / elapsed.as_secs_f64(),
        accepted.len()
    );
    for ep in &established {
        ep.disconnect(&[])?;
    }
    drop((established, accepted));
    fabric.stop();
    Ok(())
}
