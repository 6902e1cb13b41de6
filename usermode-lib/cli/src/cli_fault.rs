//! `ibcm port-fault`: rping's client while the port goes down under it. The pings run
//! until the connection ends; the device's `IBV_EVENT_PORT_ERR` reaches the engine
//! (`ibcm_linux::port_events`), whose DEVICE_REMOVAL event this side waits for beside the
//! pings: it moves the QP to ERR (the pings' work flushes), destroys the connection and
//! counts what the engine still holds. When the port is ACTIVE again the same process
//! connects again and runs `-C` pings, every one verified.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use clap::Args;
use ibcm_cli::cmtime::Timing;
use ibcm_cli::rc::{self, Limits, RPING_INFO_LEN, Rc};
use ibcm_linux::verbs::{RcQp, Region};

use super::{Failure, positive};

/// Connect attempts after the port is back, and the pause between them.
const RECONNECT_ATTEMPTS: u32 = 5;
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// `ibcm port-fault`.
#[derive(Args, Debug)]
pub struct FaultArgs {
    /// The RDMA device (its port 1 carries ibcm's CM through ib_umad).
    #[arg(long, default_value = "rxe0")]
    dev: String,
    /// The local IPv4 address.
    #[arg(long)]
    local: Ipv4Addr,
    /// The rping server (`rping -s -P`).
    #[arg(long)]
    peer: Ipv4Addr,
    /// RDMA-CM TCP port.
    #[arg(short = 'p', long, default_value = "7471")]
    port: u16,
    /// Pings on the connection made after the port is back.
    #[arg(short = 'C', long, default_value = "10", value_parser = positive)]
    count: usize,
    /// Bytes per ping.
    #[arg(short = 'S', long, default_value = "4096", value_parser = positive)]
    size: usize,
    /// Longest wait for the fault, the port's return, a reply or a completion, seconds.
    #[arg(long, default_value = "60", value_parser = positive)]
    wait: usize,
}

/// What the engine and the dispatch layer still hold.
fn held(rc: &Rc) -> String {
    let node = rc.port().node();
    let (ceps, peers, timers) = node
        .device
        .with_engine(|m| (m.live_ceps(), m.peer_map_entries(), m.timer_entries()));
    format!("live_ceps={ceps} peer_entries={peers} timers={timers}")
}

fn connect(rc: &Rc, a: &FaultArgs, qp: RcQp, recv: &Region) -> Result<rc::Conn, String> {
    let limits = Limits {
        responder_resources: 1,
        initiator_depth: 1,
        timing: Timing::patient(),
    };
    let post = |qp: &RcQp| {
        qp.post_recv(recv, 0, RPING_INFO_LEN, 1)
            .map_err(|e| e.to_string())
    };
    rc::connect_qp(rc, qp, a.peer, a.port, &limits, post)
}

/// `ibcm port-fault`.
pub fn port_fault(a: &FaultArgs) -> Result<bool, Failure> {
    let rc = Rc::start(&a.dev, a.local)?;
    let wait = Duration::from_secs(a.wait as u64);
    let log = |s: String| println!("{s}");
    println!("fault: engine at start: {}", held(&rc));
    let recv = Region::new(&rc.ctx, RPING_INFO_LEN).map_err(|e| e.to_string())?;
    let qp = RcQp::create(&rc.ctx, rc::QP_DEPTH).map_err(|e| e.to_string())?;
    let conn = connect(&rc, a, qp, &recv)?;
    let q = conn.qp.query().map_err(|e| e.to_string())?;
    println!("{}", rc::qp_line("ours", &q));
    println!("fault: pinging until the connection ends");
    let (pings, event, t_fault) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let r = ibcm_cli::exchange::bounded(
                wait,
                || conn.ep.cancel(),
                conn.ep.notify_disconnect_async(),
            );
            let at = Instant::now();
            // The CM event ends the connection: its QP's work flushes.
            let _ = conn.qp.to_error();
            (r, at)
        });
        let pings = rc::rping_client(&rc, &conn, &recv, u32::MAX, a.size, wait, &log);
        let (r, at) = watcher.join().unwrap_or((Ok(Vec::new()), Instant::now()));
        (pings, r, at)
    });
    let ok_event = match &event {
        Err(e) => {
            println!("rc: CM event: {}", ibcm_cli::rocev2::describe(e));
            true
        }
        Ok(_) => {
            println!("rc: CM event: the peer's DREQ, not the port's fault");
            false
        }
    };
    match &pings {
        Ok(r) => println!("fault: pings ended without an error after {}", r.pings),
        Err(e) => println!("fault: pings ended: {e}"),
    }
    let q = conn.qp.query().map_err(|e| e.to_string())?;
    println!("{}", rc::qp_line("ours-after-fault", &q));
    let in_err = q.state == 6; // IBV_QPS_ERR (verbs.h enum ibv_qp_state)
    match conn.ep.disconnect(&[]) {
        Ok(()) => println!("fault: disconnect after the fault: done"),
        Err(e) => println!(
            "fault: disconnect after the fault: {}",
            ibcm_cli::rocev2::describe(&e)
        ),
    }
    // The connection's endpoint goes; its QP stays, reset, for the reconnect.
    let rc::Conn { ep, qp, .. } = conn;
    drop(ep);
    qp.to_reset().map_err(|e| e.to_string())?;
    let after_fault = held(&rc);
    println!("fault: engine after the connection is destroyed: {after_fault}");
    // The port back: the event thread has told the engine.
    let end = Instant::now() + wait;
    while rc.events().counts().port_active == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    let c = rc.events().counts();
    println!(
        "fault: port events: PORT_ERR {}, PORT_ACTIVE {}, other {}",
        c.port_err, c.port_active, c.other
    );
    if c.port_active == 0 {
        println!("fault: FAILED: the port did not come back");
        return Ok(false);
    }
    println!(
        "fault: port back {:.1} s after the CM event",
        t_fault.elapsed().as_secs_f64()
    );
    // The same QP (its QPN) connects again. The peer may still hold the old connection
    // (nothing reached it since the port went): Linux's CM answers a REQ from the same CA
    // GUID and QPN with REJ "stale connection" and sends its old connection a DREQ
    // (cm.c cm_match_req), so the old connection ends there too; connect again after a
    // pause.
    let mut qp = Some(qp);
    let mut attempt = 0;
    let conn = loop {
        attempt += 1;
        let q = match qp.take() {
            Some(q) => q,
            None => RcQp::create(&rc.ctx, rc::QP_DEPTH).map_err(|e| e.to_string())?,
        };
        let qpn = q.qpn();
        match connect(&rc, a, q, &recv) {
            Ok(c) => break c,
            Err(e) if attempt < RECONNECT_ATTEMPTS => {
                println!("fault: reconnect attempt {attempt} (QPN {qpn}): {e}");
                std::thread::sleep(RECONNECT_PAUSE);
            }
            Err(e) => return Err(e.into()),
        }
    };
    let q = conn.qp.query().map_err(|e| e.to_string())?;
    println!("{}", rc::qp_line("ours-reconnected", &q));
    let r = rc::rping_client(&rc, &conn, &recv, a.count as u32, a.size, wait, &log);
    let verified = match &r {
        Ok(r) => {
            println!(
                "rping: {}/{} pings verified after the reconnect",
                r.verified, r.pings
            );
            r.verified == a.count as u32
        }
        Err(e) => {
            println!("rping: FAILED after the reconnect: {e}");
            false
        }
    };
    let disconnected = conn.ep.disconnect(&[]).is_ok();
    let _ = conn.qp.to_error();
    println!(
        "rc: {}",
        if disconnected {
            "disconnected"
        } else {
            "disconnect failed"
        }
    );
    drop(conn);
    // The DREQ's timewait holds the CEP a while (IBA 12.9.9); wait it out, bounded.
    let end = Instant::now() + Duration::from_secs(10);
    while !held(&rc).starts_with("live_ceps=0 ") && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    let at_end = held(&rc);
    println!("fault: engine at the end: {at_end}");
    let c = rc.port().counts();
    println!(
        "rc: umad sent {}, received {}, send errors {}, dropped {}",
        c.sent, c.received, c.send_errors, c.dropped
    );
    Ok(ok_event
        && in_err
        && after_fault.starts_with("live_ceps=0 ")
        && verified
        && disconnected
        && at_end.starts_with("live_ceps=0 "))
}
