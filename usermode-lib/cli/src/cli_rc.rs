//! `ibcm rping` and `ibcm rc-bw`: connections that carry data on a real RDMA device
//! (`ibcm_cli::rc`), Linux with the `devices` feature.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use clap::Args;
use ibcm_cli::cmtime::Timing;
use ibcm_cli::rc::{self, Conn, Limits, RPING_INFO_LEN, Rc};
use ibcm_linux::verbs::{RcQp, Region};

use super::{Failure, positive};

// This node's address and the server's, with rping's options (-I, -a).
#[derive(Args, Debug)]
pub struct RpingAddrs {
    /// This node's IPv4 address (rping's -I): its RoCEv2 GID is the source of every
    /// packet, and a server listens on it.
    #[arg(short = 'I', long, value_name = "ADDR")]
    bind: Ipv4Addr,
    /// The server's IPv4 address (rping's -a): connect to it (the client); without it,
    /// accept one connection.
    #[arg(short = 'a', long, value_name = "ADDR")]
    server: Option<Ipv4Addr>,
}

// This node's address and the server's, with cmtime's and ucmatose's options (-b, -s).
#[derive(Args, Debug)]
pub struct CmAddrs {
    /// This node's IPv4 address (ucmatose's -b): its RoCEv2 GID is the source of every
    /// packet, and a server listens on it.
    #[arg(short = 'b', long, value_name = "ADDR")]
    bind: Ipv4Addr,
    /// The server's IPv4 address (ucmatose's -s): connect to it (the client); without
    /// it, accept one connection.
    #[arg(short = 's', long, value_name = "ADDR")]
    server: Option<Ipv4Addr>,
}

// What the connection runs on and how it is set up.
#[derive(Args, Debug)]
pub struct RcCommon {
    /// The RDMA device (its port 1 carries ibcm's CM through ib_umad) [default: the first
    /// one].
    #[arg(long, value_name = "DEV")]
    ib_dev: Option<String>,
    /// RDMA-CM TCP port.
    #[arg(short = 'p', long, default_value = "7471")]
    port: u16,
    /// Responder resources offered (RDMA READs served at once).
    #[arg(long, default_value = "1")]
    responder_resources: u8,
    /// Initiator depth asked for (RDMA READs issued at once).
    #[arg(long, default_value = "1")]
    initiator_depth: u8,
    /// Seconds to hold the connection before data flows (the harness reads both QPs then).
    #[arg(long, default_value = "0")]
    hold: u64,
    /// REQ retries before the connection times out.
    #[arg(long, default_value = "15")]
    max_cm_retries: u8,
    /// Longest wait for a REQ, a reply or a completion, seconds.
    #[arg(long, default_value = "60", value_parser = positive)]
    wait: usize,
}

// `ibcm rping`.
#[derive(Args, Debug)]
pub struct RpingArgs {
    #[command(flatten)]
    addrs: RpingAddrs,
    #[command(flatten)]
    common: RcCommon,
    /// Pings (client).
    #[arg(short = 'C', long, default_value = "1", value_parser = positive)]
    count: usize,
    /// Bytes per ping (the server: the largest it accepts).
    #[arg(short = 'S', long, default_value = "64", value_parser = positive)]
    size: usize,
}

// `ibcm ucmatose`.
#[derive(Args, Debug)]
pub struct UcmatoseArgs {
    #[command(flatten)]
    addrs: CmAddrs,
    #[command(flatten)]
    common: RcCommon,
    /// Messages each way on every connection (ucmatose's -C).
    #[arg(short = 'C', long, default_value = "10", value_parser = positive)]
    count: usize,
    /// Bytes per message (ucmatose's -S).
    #[arg(short = 'S', long, default_value = "100", value_parser = positive)]
    size: usize,
    /// Connections in this process (ucmatose's -c): the client opens them all, the
    /// server accepts as many, then every one exchanges its messages at once.
    #[arg(short = 'c', long, default_value = "1", value_parser = positive)]
    connections: usize,
}

// `ibcm rc-bw`.
#[derive(Args, Debug)]
pub struct BwArgs {
    #[command(flatten)]
    addrs: CmAddrs,
    #[command(flatten)]
    common: RcCommon,
    /// Bytes per message.
    #[arg(short = 'S', long, default_value = "65536", value_parser = positive)]
    size: usize,
    /// Messages of each kind.
    #[arg(short = 'n', long, default_value = "200", value_parser = positive)]
    iters: usize,
    /// Work requests in flight.
    #[arg(long, default_value = "8", value_parser = positive)]
    depth: usize,
}

fn log(s: String) {
    println!("{s}");
}

fn start(c: &RcCommon, bind: Ipv4Addr) -> Result<(Rc, Limits, Duration), Failure> {
    let rc = Rc::start(c.ib_dev.as_deref(), bind)?;
    let gid_index = rc.port().gid_index()?;
    println!(
        "rc: ibcm on {} port 1 ({:?}), CA GUID {:#018x}, GID index {}",
        rc.ctx.device(),
        rc.port(),
        rc.port().guid(),
        gid_index
    );
    let limits = Limits {
        responder_resources: c.responder_resources,
        initiator_depth: c.initiator_depth,
        timing: Timing {
            max_cm_retries: c.max_cm_retries,
            ..Timing::patient()
        },
    };
    Ok((rc, limits, Duration::from_secs(c.wait as u64)))
}

fn established(c: &RcCommon, client: bool, conn: &Conn) -> Result<(), Failure> {
    println!(
        "rc: established in {:.3} ms ({} after {:.3} ms)",
        conn.setup.as_secs_f64() * 1e3,
        if client { "REP received" } else { "REP sent" },
        conn.answer.as_secs_f64() * 1e3
    );
    if let Some(init) = conn.init {
        println!(
            "rc: QP to INIT before the REQ in {:.3} ms",
            init.as_secs_f64() * 1e3
        );
    }
    println!("rc: steps, ms: {}", conn.steps.line());
    if c.hold > 0 {
        let q = conn.qp.query().map_err(|e| e.to_string())?;
        println!("{}", rc::qp_line("ours-established", &q));
        std::thread::sleep(Duration::from_secs(c.hold));
    }
    // Quiescent: nothing in flight until the data run starts.
    let q = conn.qp.query().map_err(|e| e.to_string())?;
    println!("{}", rc::qp_line("ours", &q));
    println!("{}", conn.peer_qp.line());
    Ok(())
}

/// The umad counts and CPU time; false if the port saw a fault (the driver panicked on
/// one of its threads, the umad device went away).
fn print_counts(rc: &Rc) -> bool {
    let c = rc.port().counts();
    println!(
        "rc: umad sent {}, received {}, send errors {}, dropped {}; writes took {:.3} ms, the slowest {:.3} ms",
        c.sent,
        c.received,
        c.send_errors,
        c.dropped,
        c.write_time.as_secs_f64() * 1e3,
        c.slowest_write.as_secs_f64() * 1e3
    );
    let (user, system) = ibcm_linux::process_cpu();
    println!(
        "rc: process CPU time so far: user {:.1} ms, system {:.1} ms",
        user.as_secs_f64() * 1e3,
        system.as_secs_f64() * 1e3
    );
    for w in rc.port().warnings() {
        println!("rc: umad warning: {w}");
    }
    let faults = rc.port().faults();
    for f in &faults {
        println!("rc: umad FAULT: {f}");
    }
    faults.is_empty()
}

fn ended(who: &str, r: ibcm::Result<()>) -> bool {
    match r {
        Ok(()) => {
            println!("rc: {who}disconnected");
            true
        }
        Err(e) => {
            println!("rc: {who}disconnect: {}", ibcm_cli::rocev2::describe(&e));
            false
        }
    }
}

/// Runs `run` while a watcher waits for the end of the connection that is not this
/// side's: the peer's DREQ, or the CM's own ending (a REJ, its DREQ for a stale connection,
/// the port gone; `notify_disconnect`). The watcher then moves the QP to ERR, so posted
/// work flushes and the run ends at once with the reason printed, as rping's
/// RDMA_CM_EVENT_DISCONNECTED ends its wait (rping.c `rping_cma_event_handler`). After
/// the run, the peer's DREQ may still come for `linger` (a server's peer sends its last
/// message, then its DREQ); then the watch is cancelled. True if the connection ended
/// from the other side.
fn watched<T>(conn: &Conn, linger: Duration, run: impl FnOnce() -> T) -> (T, bool) {
    std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let ended = match conn.ep.notify_disconnect() {
                Ok(_) => {
                    println!("rc: DREQ from the peer");
                    true
                }
                Err(e) if e.is_cancelled() => false,
                Err(e) => {
                    println!(
                        "rc: the connection ended: {}",
                        ibcm_cli::rocev2::describe(&e)
                    );
                    true
                }
            };
            if ended {
                let _ = conn.qp.to_error();
            }
            ended
        });
        let v = run();
        let end = Instant::now() + linger;
        while !watcher.is_finished() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        // A cancel before the watcher's wait began would miss it: cancel until it ends.
        while !watcher.is_finished() {
            conn.ep.cancel();
            std::thread::sleep(Duration::from_millis(20));
        }
        (v, watcher.join().unwrap_or(false))
    })
}

/// The client's data run, then its DREQ (unless the connection ended under the run).
fn run_client<T>(rc: &Rc, conn: &Conn, run: impl FnOnce() -> T) -> (T, bool) {
    let (v, _) = watched(conn, Duration::ZERO, run);
    let r = conn.ep.disconnect(&[]);
    let _ = conn.qp.to_error();
    let clean = print_counts(rc);
    (v, ended("", r) && clean)
}

/// The server's data run, ended by the peer's DREQ (see [`watched`]); if the run ends
/// first (a failure, or the peer's last message still to be followed by its DREQ), the
/// DREQ may come within 5 s, then we disconnect ourselves.
fn run_server<T>(rc: &Rc, conn: &Conn, run: impl FnOnce() -> T) -> (T, bool) {
    let (v, dreq) = watched(conn, Duration::from_secs(5), run);
    if !dreq {
        let _ = conn.qp.to_error();
    }
    let r = conn.ep.disconnect(&[]);
    let clean = print_counts(rc);
    (v, ended("", r) && clean)
}

// `ibcm rping`.
pub fn rping(a: &RpingArgs) -> Result<bool, Failure> {
    let (c, server) = (&a.common, a.addrs.server);
    let (rc, limits, wait) = start(c, a.addrs.bind)?;
    let region = || Region::new(&rc.ctx, RPING_INFO_LEN).map_err(|e| e.to_string());
    let post = |qp: &RcQp, recv: &Region| {
        qp.post_recv(recv, 0, RPING_INFO_LEN, 1)
            .map_err(|e| e.to_string())
    };
    let client = server.is_some();
    let (conn, recv) =
        rc::connect_or_accept(&rc, server, c.port, &limits, wait, region, post, &log)?;
    established(c, server.is_some(), &conn)?;
    let (report, disconnected) = if client {
        run_client(&rc, &conn, || {
            rc::rping_client(&rc, &conn, &recv, a.count as u32, a.size, wait, &log)
        })
    } else {
        run_server(&rc, &conn, || {
            rc::rping_server(&rc, &conn, &recv, a.size, wait, &log)
        })
    };
    let ok = match &report {
        Ok(r) => {
            let ms = r.elapsed.as_secs_f64() * 1e3;
            println!(
                "rping: {}/{} pings verified, {} bytes moved by RDMA READ+WRITE in {ms:.1} ms ({:.2} MB/s)",
                r.verified,
                r.pings,
                r.bytes,
                if ms > 0.0 {
                    r.bytes as f64 / ms / 1e3
                } else {
                    0.0
                }
            );
            r.pings > 0 && r.verified == r.pings
        }
        Err(e) => {
            println!("rping: FAILED: {e}");
            if let Ok(q) = conn.qp.query() {
                println!("{}", rc::qp_line("ours-after", &q));
            }
            false
        }
    };
    Ok(ok && disconnected)
}

/// `ibcm rc-bw`.
pub fn bw(a: &BwArgs) -> Result<bool, Failure> {
    let (c, server) = (&a.common, a.addrs.server);
    let (rc, limits, wait) = start(c, a.addrs.bind)?;
    let client = server.is_some();
    // The server keeps twice the client's depth posted: a SEND finds a receive even while
    // the server checks and reposts the previous ones (no RNR NAK, whose timer is 655 ms).
    let slots = if client { 1 } else { 2 * a.depth };
    let region =
        || Region::new(&rc.ctx, slots * a.size.max(RPING_INFO_LEN)).map_err(|e| e.to_string());
    let post = |qp: &RcQp, recv: &Region| {
        for slot in 0..slots {
            qp.post_recv(recv, slot * a.size, a.size, slot as u64)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    let (conn, recv) =
        rc::connect_or_accept(&rc, server, c.port, &limits, wait, region, post, &log)?;
    established(c, server.is_some(), &conn)?;
    let (ok, disconnected) = if client {
        run_client(&rc, &conn, || {
            match rc::bw_client(&rc, &conn, &recv, a.depth, a.size, a.iters as u64, wait) {
                Ok((read, send)) => {
                    println!(
                        "bw: RDMA READ {} x {} B verified in {:.1} ms: {:.2} MB/s",
                        read.ops,
                        a.size,
                        read.elapsed.as_secs_f64() * 1e3,
                        read.mbps()
                    );
                    println!(
                        "bw: SEND {} x {} B in {:.1} ms: {:.2} MB/s",
                        send.ops,
                        a.size,
                        send.elapsed.as_secs_f64() * 1e3,
                        send.mbps()
                    );
                    true
                }
                Err(e) => {
                    println!("bw: FAILED: {e}");
                    false
                }
            }
        })
    } else {
        run_server(&rc, &conn, || {
            match rc::bw_server(&rc, &conn, &recv, a.size, wait) {
                Ok(r) => {
                    println!(
                        "bw: received {} SENDs x {} B, every byte verified",
                        r.ops, a.size
                    );
                    true
                }
                Err(e) => {
                    println!("bw: FAILED: {e}");
                    false
                }
            }
        })
    };
    Ok(ok && disconnected)
}

/// "connection N: " before connection `i`'s lines when there are several.
fn label(i: usize, connections: usize) -> String {
    if connections > 1 {
        format!("connection {}: ", i + 1)
    } else {
        String::new()
    }
}

/// One connection's (sends, receives) completed, or why not.
type Exchanged = Result<(usize, usize), String>;

/// `ibcm ucmatose`: rdma-core ucmatose's exchange (`count` messages each way) on
/// `connections` connections. As cmatose.c's `run_client` and `run_server`: every
/// connection is established before any data moves (`connect_events` until
/// `connects_left` is 0), then each exchanges its messages; its client receives on every
/// connection before it replies on any (`poll_cqs(RECV_CQ_INDEX)`, then `post_sends`), so
/// this side runs the connections' exchanges side by side, one thread each, not one
/// after the other.
pub fn ucmatose(a: &UcmatoseArgs) -> Result<bool, Failure> {
    let (c, server) = (&a.common, a.addrs.server);
    let (rc, limits, wait) = start(c, a.addrs.bind)?;
    let max_depth = rc.ctx.max_queue_depth().map_err(|e| e.to_string())?;
    let exchange = rc::Exchange::sized(a.count, a.size, max_depth);
    let depth = u32::try_from(exchange.depth).unwrap_or(u32::MAX);
    let listener = match server {
        Some(_) => None,
        None => Some(rc::listen(&rc, c.port, &log)?),
    };
    let mut conns: Vec<(rc::Conn, Region)> = Vec::with_capacity(a.connections);
    for i in 0..a.connections {
        let recv = Region::new(&rc.ctx, exchange.depth * a.size).map_err(|e| e.to_string())?;
        let post = |qp: &RcQp| {
            for slot in 0..a.count.min(exchange.depth) {
                qp.post_recv(&recv, slot * a.size, a.size, slot as u64)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        };
        let conn = RcQp::create(&rc.ctx, depth)
            .map_err(|e| e.to_string())
            .and_then(|qp| match (server, &listener) {
                (Some(peer), _) => rc::connect_qp(&rc, qp, peer, c.port, &limits, post),
                (None, Some(l)) => rc::accept_qp(l, qp, &limits, wait, post, &log),
                (None, None) => Err("no listener".into()),
            });
        let conn = match conn {
            Ok(conn) => conn,
            Err(e) => {
                // The connections already up end here, not at Drop: cmatose.c run_client
                // goes from a failed connect_events to `disc` (disconnect_events), and
                // run_server to `out`, its nodes destroyed.
                if let Some(l) = &listener {
                    l.cancel();
                }
                for (k, (conn, _)) in conns.iter().enumerate() {
                    let d = conn.ep.disconnect(&[]);
                    let _ = conn.qp.to_error();
                    ended(&format!("connection {}: ", k + 1), d);
                }
                return Err(format!("connection {} of {}: {e}", i + 1, a.connections).into());
            }
        };
        if a.connections > 1 {
            println!(
                "ucmatose: connection {} of {} established",
                i + 1,
                a.connections
            );
        }
        conns.push((conn, recv));
    }
    if let Some(l) = &listener {
        l.cancel();
    }
    for (conn, _) in conns.iter().take(1) {
        established(c, server.is_some(), conn)?;
    }
    // Both ucmatose sides disconnect when their transfers are done (cmatose.c run_server
    // and run_client): so does ibcm, in either role, every connection.
    // The client receives on every connection before it sends on any (cmatose.c
    // run_client); the server sends at once (run_server).
    let all_received = std::sync::Barrier::new(conns.len());
    let receive_first = server.is_some().then_some(&all_received);
    let results: Vec<(Exchanged, bool)> = std::thread::scope(|s| {
        let runs: Vec<_> =
            conns
                .iter()
                .enumerate()
                .map(|(i, (conn, recv))| {
                    let (rc, exchange) = (&rc, &exchange);
                    let who = label(i, a.connections);
                    s.spawn(move || {
                        let r = rc::messages(rc, conn, exchange, recv, wait, receive_first)
                            .map_err(|e| match conn.qp.query() {
                                Ok(q) => format!("{e}; {}", rc::qp_line("qp", &q)),
                                Err(_) => e,
                            });
                        let d = conn.ep.disconnect(&[]);
                        let _ = conn.qp.to_error();
                        (r, ended(&who, d))
                    })
                })
                .collect();
        runs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| (Err("the exchange's thread panicked".into()), false))
            })
            .collect()
    });
    let clean = print_counts(&rc);
    let mut complete = 0;
    for (i, (r, disconnected)) in results.iter().enumerate() {
        let who = label(i, a.connections);
        match r {
            Ok((s, r)) => {
                println!(
                    "ucmatose: {who}{s} sends and {r} receives of {} bytes",
                    a.size
                );
                if *s == a.count && *r == a.count && *disconnected {
                    complete += 1;
                }
            }
            Err(e) => println!("ucmatose: {who}FAILED: {e}"),
        }
    }
    println!(
        "ucmatose: {complete} of {} connections exchanged {} messages each way and disconnected",
        a.connections, a.count
    );
    Ok(complete == a.connections && clean)
}
