//! `ibcm port-fault`: rping's client while the port goes down under it. The pings run
//! until the connection ends. The device's `IBV_EVENT_PORT_ERR` reaches the engine
//! (`ibcm_linux::port_events`: `Device::port_down`, as the KMDF binding's IB_PNP_PORT_DOWN);
//! this side waits for the one CM event that ends the connection, whichever the engine
//! gives (the peer's DREQ read from the port's loss, or an error), beside the pings.
//!
//! The QP's own transport is the judge of the work in flight: once the port is down a
//! probe SEND is posted, which cannot reach the peer while the link is down, and the QP
//! is left alone until the pings end by themselves or its transport retries have had
//! their time (4.096 us x 2^timeout per try, retry_cnt + 1 tries: IBA 9.7.6.1.1 and
//! C9-140); the completion status that ended them is printed (verbs.h `ibv_wc_status`:
//! rxe gives 2, LOC_QP_OP_ERR, at once, for a packet it cannot send; 12 is RETRY_EXC). Then the QP goes to ERR, the connection is destroyed and what the
//! engine still holds is counted. When the port is ACTIVE again the same process connects
//! again with a new QP and runs `-C` pings, every one verified.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use ibcm_cli::cmtime::Timing;
use ibcm_cli::rc::{self, Limits, RPING_INFO_LEN, Rc};
use ibcm_linux::verbs::{RcQp, Region};

use super::{Failure, positive};

/// Connect attempts after the port is back, and the pause between them.
const RECONNECT_ATTEMPTS: u32 = 5;
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);
/// The probe SEND's work request id (rc.rs's rping ids are 1-4).
const WR_PROBE: u64 = 99;

// `ibcm port-fault`.
#[derive(Args, Debug)]
pub struct FaultArgs {
    /// The RDMA device (its port 1 carries ibcm's CM through ib_umad) [default: the first
    /// one].
    #[arg(long, value_name = "DEV")]
    ib_dev: Option<String>,
    /// This node's IPv4 address (rping's -I).
    #[arg(short = 'I', long, value_name = "ADDR")]
    bind: Ipv4Addr,
    /// The rping server's IPv4 address (rping's -a; a `rping -s -P`).
    #[arg(short = 'a', long, value_name = "ADDR")]
    server: Ipv4Addr,
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
    /// A short flap instead: `-C` pings, the link down and up with nothing posted, then
    /// `-C` pings more on the same connection, which must have survived.
    #[arg(long)]
    flap: bool,
}

/// What the engine and the dispatch layer still hold.
fn held(rc: &Rc) -> String {
    let node = rc.port().node();
    let (ceps, peers, timers) = node
        .device
        .with_engine(|m| (m.live_ceps(), m.peer_map_entries(), m.timer_entries()));
    format!("live_ceps={ceps} peer_entries={peers} timers={timers}")
}

/// What the engine holds once nothing is left or 10 s have passed (a timewait ending).
fn settled(rc: &Rc) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    while !held(rc).starts_with("live_ceps=0 ") && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    held(rc)
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
    rc::connect_qp(rc, qp, a.server, a.port, &limits, post)
}

/// `ibcm port-fault`.
pub fn port_fault(a: &FaultArgs) -> Result<bool, Failure> {
    let rc = Rc::start(a.ib_dev.as_deref(), a.bind)?;
    let wait = Duration::from_secs(a.wait as u64);
    let log = |s: String| println!("{s}");
    println!("fault: engine at start: {}", held(&rc));
    let recv = Region::new(&rc.ctx, RPING_INFO_LEN).map_err(|e| e.to_string())?;
    let qp = RcQp::create(&rc.ctx, rc::QP_DEPTH).map_err(|e| e.to_string())?;
    let conn = connect(&rc, a, qp, &recv)?;
    let q = conn.qp.query().map_err(|e| e.to_string())?;
    println!("{}", rc::qp_line("ours", &q));
    if a.flap {
        return flap(&rc, a, conn, &recv);
    }
    println!("fault: pinging until the connection ends");
    let probe = Region::new(&rc.ctx, RPING_INFO_LEN).map_err(|e| e.to_string())?;
    // The transport's give-up time, with room for a slow guest: every try's timeout.
    let tries = u32::from(q.retry_cnt) + 1;
    let transport = Duration::from_nanos(4096u64 << q.timeout.min(31)) * tries;
    let pings_over = AtomicBool::new(false);
    let (pings, event, probe_posted, state_at_event, t_event) = std::thread::scope(|s| {
        let pinger = s.spawn(|| {
            let r = rc::rping_client(&rc, &conn, &recv, u32::MAX, a.size, wait, &log);
            pings_over.store(true, Ordering::Relaxed);
            r
        });
        // The port's loss as the device reports it (not the engine's reading of it).
        let end = Instant::now() + wait;
        while rc.events().counts().port_err == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let probe_posted = rc.events().counts().port_err > 0
            && conn
                .qp
                .post_send(&probe, 0, RPING_INFO_LEN, WR_PROBE)
                .is_ok();
        let t0 = Instant::now();
        let r = ibcm_cli::exchange::bounded(
            wait,
            || conn.ep.cancel(),
            conn.ep.notify_disconnect_async(),
        );
        let t_event = t0.elapsed();
        let state_at_event = conn.qp.query().map(|q| q.state).unwrap_or(u32::MAX);
        // The transport has its time to end the work in flight; then the QP goes to ERR.
        let end = Instant::now() + 2 * transport + Duration::from_secs(1);
        while !pings_over.load(Ordering::Relaxed) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = conn.qp.to_error();
        let pings = pinger
            .join()
            .unwrap_or_else(|_| Err("the ping thread panicked".into()));
        (pings, r, probe_posted, state_at_event, t_event)
    });
    println!(
        "fault: probe SEND posted after PORT_ERR: {probe_posted}; transport give-up time {:.0} ms ({tries} tries)",
        transport.as_secs_f64() * 1e3
    );
    let ok_event = t_event < wait
        && match &event {
            Err(e) => {
                println!("rc: CM event: {}", ibcm_cli::rocev2::describe(e));
                !e.is_cancelled()
            }
            Ok(_) => {
                println!("rc: CM event: DREQ (the connection ended)");
                true
            }
        };
    println!(
        "fault: CM event {:.0} ms after PORT_ERR",
        t_event.as_secs_f64() * 1e3
    );
    println!("fault: QP state at the CM event (before ibcm moved it): {state_at_event}");
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
    let rc::Conn { ep, qp, .. } = conn;
    drop(ep);
    drop(qp);
    // A connection that ended as by the peer's DREQ holds its CEP through timewait (IBA
    // 12.9.9): wait it out, bounded.
    let after_fault = settled(&rc);
    println!("fault: engine after the connection is destroyed: {after_fault}");
    // The port back: the event thread has told the engine.
    let end = Instant::now() + wait;
    while rc.events().counts().port_active == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    let c = rc.events().counts();
    print_port_events(&c);
    if c.port_active == 0 {
        println!("fault: FAILED: the port did not come back");
        return Ok(false);
    }
    println!("fault: port back (PORT_ACTIVE seen)");
    // A new QP connects. The peer may still hold the old connection (nothing reached it
    // while the port was down); connect again after a pause if it refuses.
    let mut attempt = 0;
    let conn = loop {
        attempt += 1;
        let q = RcQp::create(&rc.ctx, rc::QP_DEPTH).map_err(|e| e.to_string())?;
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
    let at_end = settled(&rc);
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

/// `--flap`: the link goes down and up while nothing is posted on the connection; it
/// survives if neither the engine nor the transport ended it. rxe fails the first packet
/// it cannot send while the link is down (LOC_QP_OP_ERR, the QP to ERR), and sends nothing
/// for an idle RC QP: an idle connection outlives a short flap at the transport.
fn flap(rc: &Rc, a: &FaultArgs, conn: rc::Conn, recv: &Region) -> Result<bool, Failure> {
    let wait = Duration::from_secs(a.wait as u64);
    let log = |s: String| println!("{s}");
    let pings =
        |what: &str| match rc::rping_client(rc, &conn, recv, a.count as u32, a.size, wait, &log) {
            Ok(r) => {
                println!("rping: {}/{} pings verified {what}", r.verified, r.pings);
                r.verified == a.count as u32
            }
            Err(e) => {
                println!("rping: FAILED {what}: {e}");
                false
            }
        };
    let before = pings("before the flap");
    println!("flap: idle, waiting for the link to go down and up");
    let end = Instant::now() + wait;
    while rc.events().counts().port_active == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = rc.events().counts();
    print_port_events(&c);
    // A CM event that ended the connection is pending by now, or there is none.
    let ev = ibcm_cli::exchange::bounded(
        Duration::from_secs(1),
        || conn.ep.cancel(),
        conn.ep.notify_disconnect_async(),
    );
    let survived = match &ev {
        Err(e) if e.is_cancelled() => {
            println!("flap: no CM event: the connection survived");
            true
        }
        Err(e) => {
            println!("flap: CM event: {}", ibcm_cli::rocev2::describe(e));
            false
        }
        Ok(_) => {
            println!("flap: CM event: DREQ (the connection ended)");
            false
        }
    };
    let q = conn.qp.query().map_err(|e| e.to_string())?;
    println!("{}", rc::qp_line("ours-after-flap", &q));
    let after = survived && pings("after the flap");
    let disconnected = conn.ep.disconnect(&[]).is_ok();
    let _ = conn.qp.to_error();
    drop(conn);
    let at_end = settled(rc);
    println!("fault: engine at the end: {at_end}");
    Ok(before
        && c.port_err > 0
        && c.port_active > 0
        && after
        && disconnected
        && at_end.starts_with("live_ceps=0 "))
}

/// The port events the platform told the engine, as the harness greps them.
fn print_port_events(c: &ibcm_linux::port_events::PortEventCounts) {
    println!(
        "fault: port events: PORT_ERR {}, PORT_ACTIVE {}, DEVICE_FATAL {}, PKEY_CHANGE {}, GID_CHANGE {}, other {}, down at start {}",
        c.port_err,
        c.port_active,
        c.device_fatal,
        c.pkey_change,
        c.gid_change,
        c.other,
        c.down_at_start
    );
}
