//! `ibcm udaddy`: rdma-core udaddy's exchange (`ibcm_cli::udaddy`) on a real RDMA device,
//! Linux with the `devices` feature: a UD QP resolved with SIDR, datagrams both ways.

use std::net::Ipv4Addr;
use std::time::Duration;

use clap::Args;
use ibcm_cli::rc::Rc;
use ibcm_cli::udaddy;

use super::{Failure, positive};

// `ibcm udaddy`, with udaddy's options (-b, -s, -p, -C, -S).
#[derive(Args, Debug)]
pub struct UdaddyArgs {
    /// This node's IPv4 address (udaddy's -b): its RoCEv2 GID is the source of every
    /// packet, and a server listens on it.
    #[arg(short = 'b', long, value_name = "ADDR")]
    bind: Ipv4Addr,
    /// The server's IPv4 address (udaddy's -s): resolve its service with SIDR and send to
    /// it (the client); without it, serve one client.
    #[arg(short = 's', long, value_name = "ADDR")]
    server: Option<Ipv4Addr>,
    /// The RDMA device (its port 1 carries ibcm's CM through ib_umad) [default: the first
    /// one].
    #[arg(long, value_name = "DEV")]
    ib_dev: Option<String>,
    /// rdma_cm UDP port (udaddy's -p is its port space; its port is fixed at 7174).
    #[arg(short = 'p', long, default_value_t = udaddy::DEFAULT_PORT)]
    port: u16,
    /// Datagrams each way (udaddy's -C).
    #[arg(short = 'C', long, default_value = "10", value_parser = positive)]
    count: usize,
    /// Bytes per datagram (udaddy's -S): at most the port's MTU.
    #[arg(short = 'S', long, default_value = "100", value_parser = positive)]
    size: usize,
    /// Longest wait for the SIDR_REQ (server), and for all the datagrams, seconds.
    #[arg(long, default_value = "60", value_parser = positive)]
    wait: usize,
}

fn log(s: String) {
    println!("{s}");
}

/// `ibcm udaddy`: true when every datagram went and came back checked.
pub fn udaddy(a: &UdaddyArgs) -> Result<bool, Failure> {
    let rc = Rc::start(a.ib_dev.as_deref(), a.bind)?;
    // udaddy.c verify_test_params: a datagram fits in one packet of the active MTU.
    let mtu = 128usize << u8::from(rc.path_mtu);
    if a.size > mtu {
        return Err(Failure(format!(
            "{} bytes per datagram: more than the path MTU ({mtu})",
            a.size
        )));
    }
    println!(
        "udaddy: ibcm on {} port 1 ({:?}), {} datagrams of {} bytes",
        rc.ctx.device(),
        rc.port(),
        a.count,
        a.size
    );
    let wait = Duration::from_secs(a.wait as u64);
    let r = match a.server {
        Some(peer) => udaddy::resolve(&rc, peer, a.port, a.count, a.size, wait, &log),
        None => udaddy::serve(&rc, a.port, a.count, a.size, wait, &log),
    };
    match r {
        Ok(r) => {
            println!(
                "udaddy: {} sends and {} receives of {} bytes, peer QPN {:#x}",
                r.sent, r.received, a.size, r.peer_qpn
            );
            Ok(r.sent == a.count && r.received == a.count)
        }
        Err(e) => {
            println!("udaddy: FAILED: {e}");
            Ok(false)
        }
    }
}
