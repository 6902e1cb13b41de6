//! `ibcm perftest`: a peer for Linux perftest's `ib_send_bw -R` / `ib_read_bw -R` in
//! either role (`ibcm_cli::perftest`), Linux with the `devices` feature.
//!
//! The supported subset: one size (`-s`), one data QP, the bandwidth test half duplex,
//! `-n` iterations. perftest modes with more exchanges or connections (`-b`, `-a`, `-q N`,
//! `--report-per-port`, `-D`) are not followed: perftest's side then waits in a handshake
//! this side never makes, and the run ends at the `--wait` timeout.

use std::time::Duration;

use clap::{Args, ValueEnum};
use ibcm_cli::cmtime::Timing;
use ibcm_cli::perftest::{self, Options, Verb};
use ibcm_cli::rc::{self, Rc};

use super::{Failure, positive};

/// The test, as perftest's binaries name it.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum Test {
    /// `ib_send_bw`.
    Send,
    /// `ib_read_bw`.
    Read,
}

// `ibcm perftest`: perftest's `-R` runs with one size, one QP, half duplex, `-n`
// iterations (not `-b`, `-a`, `-q`, `--report-per-port`, `-D`: those end in a timeout).
#[derive(Args, Debug)]
pub struct PerftestArgs {
    /// The test.
    #[arg(long, value_enum)]
    test: Test,
    /// The RDMA device (perftest's -d; its port 1 carries ibcm's CM through ib_umad)
    /// [default: the first one, as perftest's].
    #[arg(short = 'd', long, value_name = "DEV")]
    ib_dev: Option<String>,
    /// This node's IPv4 address (perftest's --bind_source_ip): its RoCEv2 GID is the
    /// source of every packet, and a server listens on it.
    #[arg(long, value_name = "ADDR")]
    bind: std::net::Ipv4Addr,
    /// The perftest server to connect to (perftest's server argument; the client);
    /// without it, serve one client.
    #[arg(long, value_name = "ADDR")]
    server: Option<std::net::Ipv4Addr>,
    /// RDMA-CM TCP port (perftest's -p).
    #[arg(short = 'p', long, default_value = "18515")]
    port: u16,
    /// Bytes per message (-s).
    #[arg(short = 's', long, default_value = "65536", value_parser = positive)]
    size: usize,
    /// Messages (-n).
    #[arg(short = 'n', long, default_value = "1000", value_parser = positive)]
    iters: usize,
    /// The data connection's responder resources (RDMA READs served at once).
    #[arg(long, default_value = "4")]
    responder_resources: u8,
    /// The data connection's initiator depth (RDMA READs issued at once).
    #[arg(long, default_value = "4")]
    initiator_depth: u8,
    /// SENDs in flight / receives posted.
    #[arg(long, default_value = "64", value_parser = positive)]
    depth: usize,
    /// Seconds to hold the data connection before the handshakes that start the run (the
    /// harness reads both QPs then; perftest waits in its receive).
    #[arg(long, default_value = "0")]
    hold: u64,
    /// Longest wait for a REQ, a reply, a message or a completion, seconds.
    #[arg(long, default_value = "60", value_parser = positive)]
    wait: usize,
}

fn log(s: String) {
    println!("{s}");
}

/// `ibcm perftest`.
pub fn perftest(a: &PerftestArgs) -> Result<bool, Failure> {
    let rc = Rc::start(&super::cli_rc::ib_dev(a.ib_dev.as_deref())?, a.bind)?;
    let wait = Duration::from_secs(a.wait as u64);
    let verb = match a.test {
        Test::Send => Verb::Send,
        Test::Read => Verb::Read,
    };
    let o = Options {
        verb,
        size: a.size,
        iters: a.iters as u64,
        limits: rc::Limits {
            responder_resources: a.responder_resources,
            initiator_depth: a.initiator_depth,
            timing: Timing::patient(),
        },
        depth: a.depth as u32,
        wait,
    };
    let client = a.server.is_some();
    let mut ctl = match a.server {
        Some(peer) => perftest::control_connect(&rc, peer, a.port, wait)?,
        None => perftest::control_accept(&rc, a.port, wait, &log)?,
    };
    println!(
        "perftest: control connection established in {:.3} ms",
        ctl.conn.setup.as_secs_f64() * 1e3
    );
    let agreed = perftest::agree(&mut ctl, u8::from(rc.path_mtu))?;
    println!(
        "perftest: peer version {}, cycle buffer {}, MTU code {}",
        agreed.peer_version, agreed.cycle_buffer, agreed.mtu
    );
    let data = match a.server {
        Some(peer) => perftest::data_connect(&rc, &mut ctl, peer, a.port, &o, &agreed, &log)?,
        None => perftest::data_accept(&rc, &mut ctl, a.port, &o, &agreed, &log)?,
    };
    println!(
        "rc: established in {:.3} ms ({} after {:.3} ms)",
        data.conn.setup.as_secs_f64() * 1e3,
        if client { "REP received" } else { "REP sent" },
        data.conn.answer.as_secs_f64() * 1e3
    );
    let q = data.conn.qp.query().map_err(|e| e.to_string())?;
    println!("{}", rc::qp_line("ours", &q));
    println!("{}", data.conn.peer_qp.line());
    if a.hold > 0 {
        std::thread::sleep(Duration::from_secs(a.hold));
    }
    let mine = perftest::my_dest(&rc, &data, &q);
    let theirs = perftest::exchange_dests(&mut ctl, verb, &mine)?;
    println!(
        "perftest: peer QPN {:#x} (the CM's {:#x}), rkey {:#x}, vaddr {:#x}, out_reads {}",
        theirs.qpn, q.dest_qpn, theirs.rkey, theirs.vaddr, theirs.out_reads
    );
    let run = match (verb, client) {
        (Verb::Read, true) => perftest::read_client(&rc, &data, &theirs, &o).map(Some),
        (Verb::Send, true) => perftest::send_client(&data, &o).map(Some),
        (Verb::Send, false) => perftest::send_server(&data, &o, agreed.cycle_buffer).map(Some),
        // The peer reads our buffer; nothing moves on this side's queues.
        (Verb::Read, false) => Ok(None),
    };
    let run = match run {
        Ok(r) => r,
        Err(e) => {
            println!("perftest: FAILED: {e}");
            if let Ok(q) = data.conn.qp.query() {
                println!("{}", rc::qp_line("ours-after", &q));
            }
            return Ok(false);
        }
    };
    let mut ok = true;
    if let Some(r) = &run {
        let what = match (verb, client) {
            (Verb::Read, _) => "RDMA READ",
            (Verb::Send, true) => "SEND",
            (Verb::Send, false) => "received",
        };
        // A SEND's bytes are the receiver's to check; below half the cycle buffer the
        // receiver can check only each message's length (perftest::send_server).
        let checked = if client && verb == Verb::Send {
            "completed"
        } else if r.contents_checked {
            "verified"
        } else {
            "length checked only"
        };
        let reads = if verb == Verb::Read {
            format!(
                ", at most {} READs in flight (QP: max_rd_atomic {}, send queue {})",
                r.in_flight, r.rd_atomic, r.send_slots
            )
        } else {
            String::new()
        };
        println!(
            "perftest: {what} {} x {} B {checked} in {:.1} ms: {:.2} MB/s (2^20 B){reads}",
            r.ops,
            a.size,
            r.elapsed.as_secs_f64() * 1e3,
            r.mib_per_s(),
        );
        ok &= r.ops == o.iters;
    }
    if verb == Verb::Read {
        // read_bw.c: the server waits for the client's end, then the report.
        ctl.hand_shake(&mine)?;
        let mine_report = run.map(|r| r.report(a.size)).unwrap_or_default();
        let peer = perftest::xchg_reports(&mut ctl, &mine_report)?;
        if !client {
            println!(
                "perftest: client report: {} x {} B, peak {:.2}, average {:.2} MB/s (2^20 B), {:.6} Mpps",
                peer.iters, peer.size, peer.bw_peak, peer.bw_avg, peer.msg_rate
            );
            // perftest's server prints the client's report whatever its own -n/-s
            // (read_bw.c:392-400): so does this side.
        }
    }
    // ctx_close_connection (pc.c:1759-1784).
    ctl.hand_shake(&mine)?;
    let a_ok = end(&data.conn, "data");
    let b_ok = end(&ctl.conn, "control");
    let c = rc.port().counts();
    println!(
        "rc: umad sent {}, received {}, send errors {}, dropped {}",
        c.sent, c.received, c.send_errors, c.dropped
    );
    Ok(ok && a_ok && b_ok)
}

/// Ends one connection: the QP to ERR, then a DREQ (or the DREP to the peer's, which may
/// cross ours: perftest destroys its ids right after the last handshake, pr.c
/// `destroy_ctx`).
fn end(conn: &rc::Conn, what: &str) -> bool {
    let _ = conn.qp.to_error();
    match conn.ep.disconnect(&[]) {
        Ok(()) => {
            println!("rc: {what} connection disconnected");
            true
        }
        Err(e) => {
            println!(
                "rc: {what} connection disconnect: {}",
                ibcm_cli::rocev2::describe(&e)
            );
            false
        }
    }
}
