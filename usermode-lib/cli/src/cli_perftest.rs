//! `ibcm perftest`: a peer for Linux perftest's `ib_send_bw -R`, `ib_read_bw -R`,
//! `ib_write_bw -R`, `ib_read_lat -R` and `ib_send_lat -R` in either role
//! (`ibcm_cli::perftest`), Linux with the `devices` feature.
//!
//! The supported subset: one size (`-s`), one data QP, the bandwidth tests half duplex,
//! `-n` iterations. `ib_write_lat` is not followed (its ping-pong polls the last byte of
//! memory the peer writes, which this side does not do): `--test write-lat` is refused
//! before connecting. perftest modes with more exchanges or connections (`-b`, `-a`,
//! `-q N`, `--report-per-port`, `-D`) are not followed: perftest's side then waits in a
//! handshake this side never makes, and the run ends at the `--wait` timeout. A peer that
//! runs another test is refused where it shows (`perftest::check_read_limits`, the control
//! messages' lengths, a SEND on a READ or WRITE test's data QP): `perftest: REFUSED`,
//! exit status 1.

use std::time::Duration;

use clap::{Args, ValueEnum};
use ibcm_cli::cmtime::Timing;
use ibcm_cli::perftest::{self, Options, Tst, Verb};
use ibcm_cli::rc::{self, Rc};

use super::{Failure, positive};

/// The test, as perftest's binaries name it.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// `ib_send_bw`.
    Send,
    /// `ib_read_bw`.
    Read,
    /// `ib_write_bw`.
    Write,
    /// `ib_read_lat`.
    ReadLat,
    /// `ib_send_lat`.
    SendLat,
    /// `ib_write_lat`: not followed (refused).
    WriteLat,
}

// `ibcm perftest`: perftest's `-R` runs with one size, one QP, half duplex, `-n`
// iterations (not `-b`, `-a`, `-q`, `--report-per-port`, `-D`: those end in a timeout;
// not `ib_write_lat`). A peer running another test than `--test` is refused.
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
    /// Bytes per message (-s) [default: perftest's: 65536 for the bandwidth tests, 2 for
    /// the latency tests (perftest_parameters.h DEF_SIZE_BW, DEF_SIZE_LAT; pp.c:689)].
    #[arg(short = 's', long, value_parser = positive)]
    size: Option<usize>,
    /// Messages (-n).
    #[arg(short = 'n', long, default_value = "1000", value_parser = positive)]
    iters: usize,
    /// The data connection's responder resources (RDMA READs served at once; READ tests
    /// only: the others carry 0, as perftest's, pc.c:2290-2293).
    #[arg(long, default_value = "4")]
    responder_resources: u8,
    /// The data connection's initiator depth (RDMA READs issued at once; READ tests only).
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

/// perftest_parameters.h: the default `-s` of the bandwidth tests.
const DEF_SIZE_BW: usize = 65536;
/// perftest_parameters.h:108: the default `-s` of the latency tests.
const DEF_SIZE_LAT: usize = 2;

fn log(s: String) {
    println!("{s}");
}

/// `ibcm perftest`.
pub fn perftest(a: &PerftestArgs) -> Result<bool, Failure> {
    let (verb, tst) = match a.test {
        Test::Send => (Verb::Send, Tst::Bw),
        Test::Read => (Verb::Read, Tst::Bw),
        Test::Write => (Verb::Write, Tst::Bw),
        Test::ReadLat => (Verb::Read, Tst::Lat),
        Test::SendLat => (Verb::Send, Tst::Lat),
        Test::WriteLat => {
            return Err(Failure(
                "--test write-lat is not followed: ib_write_lat's ping-pong polls the last \
                 byte of the buffer the peer writes into (pr.c:4448-4555 run_iter_lat_write), \
                 which this side does not do"
                    .into(),
            ));
        }
    };
    if tst == Tst::Lat && (a.iters as u64) < perftest::MIN_ITER {
        return Err(Failure(format!(
            "-n {}: a latency test runs at least {} iterations (perftest's MIN_ITER)",
            a.iters,
            perftest::MIN_ITER
        )));
    }
    if verb == Verb::Read && (a.responder_resources == 0 || a.initiator_depth == 0) {
        return Err(Failure(
            "a READ test needs read limits of at least 1 (perftest's out_reads)".into(),
        ));
    }
    let rc = Rc::start(a.ib_dev.as_deref(), a.bind)?;
    let wait = Duration::from_secs(a.wait as u64);
    // pc.c:2290-2293 and 2356-2358: the data connection carries read limits for READ
    // tests only.
    let (responder_resources, initiator_depth) = if verb == Verb::Read {
        (a.responder_resources, a.initiator_depth)
    } else {
        (0, 0)
    };
    let size = a.size.unwrap_or(match tst {
        Tst::Lat => DEF_SIZE_LAT,
        Tst::Bw => DEF_SIZE_BW,
    });
    let o = Options {
        verb,
        tst,
        size,
        iters: a.iters as u64,
        limits: rc::Limits {
            responder_resources,
            initiator_depth,
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
    let outcome = run(a, &rc, &o, &mut ctl, &data, &agreed, &q, client);
    let ok = match outcome {
        Ok(ok) => ok,
        Err(e) => {
            match e.strip_prefix(perftest::MISMATCH) {
                Some(why) => println!(
                    "perftest: REFUSED: the peer does not run {}: {why}",
                    o.name()
                ),
                None => println!("perftest: FAILED: {e}"),
            }
            diagnose(&o, &mut ctl, &data, client, &e);
            if let Ok(q) = data.conn.qp.query() {
                println!("{}", rc::qp_line("ours-after", &q));
            }
            false
        }
    };
    let a_ok = end(&data.conn, "data");
    let b_ok = end(&ctl.conn, "control");
    let c = rc.port().counts();
    println!(
        "rc: umad sent {}, received {}, send errors {}, dropped {}",
        c.sent, c.received, c.send_errors, c.dropped
    );
    Ok(ok && a_ok && b_ok)
}

/// What a failed run left behind that names the peer's test: a SEND on the data QP of a
/// READ or WRITE test (proof: that client sends none), or, when `error` is the `--wait`
/// timeout on a data-QP completion, a control message already waiting (a sign only: a
/// peer that runs this test may have sent its next message after a failure here).
fn diagnose(
    o: &Options,
    ctl: &mut perftest::Control,
    data: &perftest::Data,
    client: bool,
    error: &str,
) {
    if !client && o.verb != Verb::Send {
        let n = perftest::stray_sends(data);
        if n > 0 {
            println!(
                "perftest: REFUSED: the peer does not run {}: a SEND reached the data QP, \
                 where {}'s client sends none: it runs ib_send_*",
                o.name(),
                o.name()
            );
        }
    }
    if !error.starts_with(perftest::DATA_TIMEOUT) {
        return;
    }
    let received = ctl.pending();
    if received > 0 {
        println!(
            "perftest: the peer probably does not run {}: {received} control message(s) came \
             while this side waited on the data connection: its exchanges look like another \
             test's",
            o.name()
        );
    }
}

/// The handshakes, the run and what follows it; Err with [`perftest::MISMATCH`] when the
/// peer shows it runs another test.
#[allow(clippy::too_many_arguments)]
fn run(
    a: &PerftestArgs,
    rc: &Rc,
    o: &Options,
    ctl: &mut perftest::Control,
    data: &perftest::Data,
    agreed: &perftest::Agreed,
    q: &ibcm_linux::verbs::QpQuery,
    client: bool,
) -> Result<bool, String> {
    perftest::check_read_limits(o, data.conn.peer_read_limits, !client)?;
    if a.hold > 0 {
        std::thread::sleep(Duration::from_secs(a.hold));
    }
    let mine = perftest::my_dest(rc, data, q);
    let theirs = perftest::exchange_dests(ctl, o, &mine)?;
    println!(
        "perftest: peer QPN {:#x} (the CM's {:#x}), rkey {:#x}, vaddr {:#x}, out_reads {}",
        theirs.qpn, q.dest_qpn, theirs.rkey, theirs.vaddr, theirs.out_reads
    );
    let mut ok = true;
    if o.tst == Tst::Lat {
        let lat = match (o.verb, client) {
            (Verb::Read, true) => Some(perftest::read_lat_client(rc, data, &theirs, o)?),
            (Verb::Send, _) => Some(perftest::send_lat(rc, data, o, client)?),
            // ib_read_lat's server only waits for the close (read_lat.c:245-251).
            _ => None,
        };
        if let Some(l) = lat {
            let what = if o.verb == Verb::Read {
                "RDMA READ, each verified"
            } else {
                "SEND ping-pong, every message verified"
            };
            // perftest's arithmetic on other timings: perftest busy-polls its CQ and
            // checks nothing in its timed loop (pr.c:4614-4629, 4686-4733), and its SENDs
            // are mostly unsignalled and inline at <= 236 B (pr.c:4667-4670). This side
            // sleeps on the completion channel after a few polls (RcQp::next) and checks
            // every message in the loop, as perftest's -e with its data validation would:
            // the figures are not comparable with a default perftest's.
            println!(
                "perftest: latency {} x {} B ({what}), usec: t_min {:.2} t_max {:.2} \
                 t_typical {:.2} t_avg {:.2} 99% {:.2} 99.9% {:.2} (event-driven waits and \
                 checks inside the timed loop: not comparable with perftest's busy-polled \
                 figures)",
                l.iters, o.size, l.min, l.max, l.typical, l.avg, l.p99, l.p99_9
            );
        }
        // ctx_close_connection (pc.c:1759-1784).
        ctl.hand_shake(&mine)?;
        return Ok(ok);
    }
    let run = match (o.verb, client) {
        (Verb::Read, true) => Some(perftest::read_client(rc, data, &theirs, o)?),
        (Verb::Write, true) => Some(perftest::write_client(data, &theirs, o)?),
        (Verb::Send, true) => Some(perftest::send_client(data, o)?),
        (Verb::Send, false) => Some(perftest::send_server(data, o, agreed.cycle_buffer)?),
        // The peer reads or writes our buffer; nothing moves on this side's queues.
        (Verb::Read | Verb::Write, false) => None,
    };
    if let Some(r) = &run {
        let what = match (o.verb, client) {
            (Verb::Read, _) => "RDMA READ",
            (Verb::Write, _) => "RDMA WRITE",
            (Verb::Send, true) => "SEND",
            (Verb::Send, false) => "received",
        };
        // A SEND's or WRITE's bytes are the receiver's to check; below half the cycle
        // buffer the receiver can check only each message's length (perftest::send_server).
        let checked = if client && o.verb != Verb::Read {
            "completed"
        } else if r.contents_checked {
            "verified"
        } else {
            "length checked only"
        };
        let reads = if o.verb == Verb::Read {
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
            o.size,
            r.elapsed.as_secs_f64() * 1e3,
            r.mib_per_s(),
        );
        ok &= r.ops == o.iters;
    }
    if o.verb != Verb::Send {
        // read_bw.c and write_bw.c:250-258: the server waits for the client's end, then
        // the report.
        ctl.hand_shake(&mine)?;
        let mine_report = run.map(|r| r.report(o.size)).unwrap_or_default();
        let peer = perftest::xchg_reports(ctl, &mine_report)?;
        if !client {
            println!(
                "perftest: client report: {} x {} B, peak {:.2}, average {:.2} MB/s (2^20 B), {:.6} Mpps",
                peer.iters, peer.size, peer.bw_peak, peer.bw_avg, peer.msg_rate
            );
            // perftest's server prints the client's report whatever its own -n/-s
            // (read_bw.c:392-400): so does this side.
        }
        if o.verb == Verb::Write && !client {
            // The client's size, not this side's (written_over).
            let size = usize::try_from(peer.size).map_or(o.size, |s| s.min(o.size));
            match perftest::written_over(data, size)? {
                Some(kept) => println!(
                    "perftest: RDMA WRITE landed: {} of the first {size} B of our buffer \
                     overwritten ({kept} kept our pattern, as random bytes do about 1 in 256)",
                    size - kept
                ),
                None => println!(
                    "perftest: RDMA WRITE not checked: {size} B is too few to tell the \
                     client's bytes from ours (at least {})",
                    perftest::WRITTEN_MIN
                ),
            }
        }
    }
    // ctx_close_connection (pc.c:1759-1784).
    ctl.hand_shake(&mine)?;
    Ok(ok)
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
