//! perftest's rdma_cm mode (`ib_send_bw -R`, `ib_read_bw -R`, `ib_write_bw -R`,
//! `ib_read_lat -R`, `ib_send_lat -R`), so either side of a run can be Linux perftest. The source is perftest 4.5-0.17 (linux-rdma/perftest
//! tag `v4.5-0.17`, Debian bookworm's `perftest 4.5+0.17-1`; its version string is
//! configure.ac:32's "6.06"); `pc.c` below is its src/perftest_communication.c, `pr.c`
//! src/perftest_resources.c, `pr.h` src/perftest_resources.h, `pp.c` src/perftest_parameters.c.
//!
//! With `-R` perftest makes two rdma_cm connections to the same TCP port space port:
//!
//! 1. A control connection (pc.c:1230-1290 `create_comm_struct`: an RC QP, verb SEND, one
//!    receive of `sizeof(struct pingpong_dest)` = 56 bytes posted before the connection is
//!    established, pc.c:156-180 and pc.c:1034/1190). Every exchange on it is one SEND each
//!    way, the client's first (pc.c:1465-1495 `ctx_xchg_data_rdma`, pc.c:1380-1425
//!    `ctx_hand_shake`); each side reposts its receive right after a message arrives
//!    (pc.c:1517, pc.c:525). The control connection asks no read limits (pc.c:1024-1027 and
//!    1177-1180: only READ and ATOMIC set them).
//! 2. The data connection (pc.c:2714-2760 `create_rdma_cm_connection`): a handshake, the
//!    client's `rdma_connect` with responder resources = initiator depth = `out_reads`
//!    (pc.c:2290-2293, the server's `rdma_accept` the same, pc.c:2356-2358; `-o`, or the
//!    device's `max_qp_rd_atom`, perftest_parameters.c:2014-2033 `ctx_set_out_reads`) retried 10 times 100 ms apart
//!    if it fails (pc.c:2684-2707), and a handshake.
//!
//! The control exchanges in order (read_bw.c and send_bw.c `main`, both half duplex):
//! the version string, 16 bytes (pc.c:1786-1796; perftest stops below "5.70", pc.c:1799-
//! 1806); the cycle buffer and the cache line size, 4 bytes big-endian each (pc.c:1811-
//! 1846, from peer version 5.32); the port MTU as a decimal string in 2 bytes (pc.c:1852-
//! 1880); the data connection's two handshakes; then the `pingpong_dest` handshakes
//! (pc.c:431-535, big-endian fields, layout pr.h:221-231): ib_read_bw has three (read_bw.c
//! after `set_up_connection`: LOCAL, REMOTE, "after moving qp to RTR"), ib_send_bw four
//! (send_bw.c: two, REMOTE, and one after the server has posted its receives). Then the
//! run; ib_read_bw follows it with a handshake and the client's report to the server
//! (pc.c:1615-1700 `xchg_bw_reports`: size and iterations as 64-bit, peak and average
//! bandwidth and message rate as doubles, all big-endian), and both end with
//! `ctx_close_connection`'s handshake (pc.c:1759-1784). ib_write_bw (write_bw.c `main`) makes
//! ib_read_bw's exchanges: three handshakes (write_bw.c:181, 220, 229), the client's WRITEs,
//! then the end handshake and the report (write_bw.c:250-258 server, 396-405 client).
//!
//! The latency tests are ping-pongs with four handshakes before the run and the close
//! handshake after it, no report: ib_read_lat (read_lat.c:186, 194, 232, 241; the client
//! READs one at a time, the server only waits in `ctx_close_connection`, read_lat.c:245-
//! 251) and ib_send_lat (send_lat.c:308, 357, 380, and 453 after each side has posted its
//! receives; `run_iter_lat_send`, pr.c:4639-4815: the client SENDs first, each side answers
//! every message it receives). Latency is the time between two posts of one side
//! (pp.c:3703-3706 `print_report_lat`), halved for SEND and WRITE (pp.c:3692), the two
//! largest left out (pp.c:3677, 3725).
//!
//! Nothing in these exchanges names the test. What tells one from another: the data
//! connection's read limits (both 0 unless READ or ATOMIC: pc.c:2290-2293 in the client's
//! REQ, pc.c:2356-2358 in the server's REP), the number of handshakes before the run, and
//! what follows it (a 56-byte handshake or 8-byte report values on the control connection,
//! SENDs or none on the data connection). This side checks each where it meets it
//! ([`check_read_limits`], the message lengths of [`Control`]) and refuses a peer whose
//! test is another.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ibcm_linux::verbs::{Completion, QpQuery, RcQp, Region};

use crate::rc::{self, Conn, Limits, Rc};

type Res<T> = std::result::Result<T, String>;

/// `sizeof(struct pingpong_dest)` on x86-64 (pr.h:221-231: five ints, the padding before
/// the 8-byte vaddr, the 16-byte GID, two ints).
pub const PINGPONG_DEST_LEN: usize = 56;
/// The version this side announces: perftest 4.5-0.17's own (configure.ac:32), at or above
/// every threshold pc.c compares with (5.1, 5.31, 5.32, 5.33, 5.70).
pub const VERSION: &str = "6.06";
/// `MAX_VERSION` (perftest_parameters.h:320): the version field's size.
const MAX_VERSION: usize = 16;
/// perftest's cycle buffer: the page size (perftest_parameters.c:800).
const CYCLE_BUFFER: u32 = 4096;
/// perftest's cache line size default (perftest_parameters.h:129 `DEF_CACHE_LINE_SIZE`).
const CACHE_LINE_SIZE: u32 = 64;
/// The RDMA-CM connect attempts of perftest's client (pc.c:2687: `max_retries = 10`,
/// `delay = 100000` us).
const CONNECT_ATTEMPTS: u32 = 10;
const CONNECT_RETRY_DELAY: Duration = Duration::from_millis(100);
/// perftest's MB: `format_factor` 0x100000 for MB/sec reports (perftest_parameters.c:3377).
const MB: f64 = 1_048_576.0;
/// The receives ib_send_bw's server keeps posted: `DEF_RX_SEND` (perftest_parameters.h:118,
/// set at perftest_parameters.c:706), at most the iterations (perftest_parameters.c:1007-
/// 1008). Fewer than the client's SENDs in flight (`DEF_TX_BW` 128, perftest_parameters.h:
/// 111) would cost RNR NAKs, each a wait of the QP's minimum RNR timer (`MIN_RNR_TIMER`).
const DEF_RX_SEND: u64 = 512;
/// `DEF_TX_BW` (perftest_parameters.h:111): the SENDs perftest's client keeps in flight.
const DEF_TX_BW: usize = 128;
/// The memory this side registers for message slots: perftest itself uses one buffer
/// whatever the depth (pr.h:117 BUFF_SIZE, pr.c:1210), so slots x size must stay within a
/// budget (64 MiB), down to `DEF_TX_BW` receive slots, each one message.
const SLOT_BUDGET: usize = 64 << 20;
/// perftest's `MIN_RNR_TIMER` (perftest_resources.h:83): 0.64 ms (IBA Table 45 code 12).
const MIN_RNR_TIMER: u8 = 12;
/// The fewest iterations perftest runs (perftest_parameters.h:164 `MIN_ITER`, checked at
/// perftest_parameters.c:2361); a latency report needs more than `LAT_MEASURE_TAIL` + 1.
pub const MIN_ITER: u64 = 5;
/// The largest latencies `print_report_lat` leaves out (perftest_parameters.c:3677).
const LAT_MEASURE_TAIL: usize = 2;
/// What an error refusing the peer's test starts with (the CLI prints it as REFUSED).
pub const MISMATCH: &str = "the peer runs another test: ";

impl Options {
    /// Receives this side keeps posted on the data QP: ib_send_bw's server (as many as
    /// perftest's, within the memory budget but never fewer than the client's SENDs in
    /// flight) and both sides of ib_send_lat (`rx_depth`, `DEF_RX_SEND` within the
    /// iterations, perftest_parameters.c:706 and 1007-1008); none for the others.
    fn receives(&self, server: bool) -> u32 {
        let budget = (SLOT_BUDGET / self.size.max(1)).max(DEF_TX_BW) as u64;
        match (self.verb, self.tst) {
            (Verb::Send, Tst::Bw) if server => self.iters.clamp(1, DEF_RX_SEND).min(budget) as u32,
            (Verb::Send, Tst::Lat) => self.iters.clamp(1, DEF_RX_SEND).min(budget) as u32,
            _ => 0,
        }
    }

    /// Work requests the data QP's queues hold.
    fn slots(&self, server: bool) -> u32 {
        self.receives(server).max(self.depth)
    }

    /// perftest's binary for this test.
    pub fn name(&self) -> String {
        let verb = match self.verb {
            Verb::Send => "send",
            Verb::Read => "read",
            Verb::Write => "write",
        };
        let tst = match self.tst {
            Tst::Bw => "bw",
            Tst::Lat => "lat",
        };
        format!("ib_{verb}_{tst}")
    }

    /// The pingpong_dest handshakes between the data connection and the run: three for
    /// ib_read_bw and ib_write_bw, four for ib_send_bw and every latency test (module docs).
    fn handshakes_before_run(&self) -> usize {
        if self.verb == Verb::Send || self.tst == Tst::Lat {
            4
        } else {
            3
        }
    }
}

/// Which verb the test measures (perftest's `user_param.verb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `ib_send_*`: SENDs into the peer's receives.
    Send,
    /// `ib_read_*`: the client RDMA READs the server's buffer.
    Read,
    /// `ib_write_*`: the client RDMA WRITEs into the server's buffer.
    Write,
}

/// Bandwidth or latency (perftest's `user_param.tst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tst {
    /// `ib_*_bw`.
    Bw,
    /// `ib_*_lat`: a ping-pong, one message at a time.
    Lat,
}

/// What a run is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The verb.
    pub verb: Verb,
    /// Bandwidth or latency.
    pub tst: Tst,
    /// Bytes per message (`-s`).
    pub size: usize,
    /// Messages (`-n`).
    pub iters: u64,
    /// The data connection's read limits (perftest's `-o` on both for its side).
    pub limits: Limits,
    /// Work requests in flight (SEND), receives kept posted (server).
    pub depth: u32,
    /// Longest wait for anything.
    pub wait: Duration,
}

/// The peer's `struct pingpong_dest` (pr.h:221-231), what it tells of its data QP.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u32,
    /// The sender's outstanding reads (`out_reads`).
    pub out_reads: u32,
    /// Its QPN.
    pub qpn: u32,
    /// Its PSN (perftest draws a random one; with rdma_cm the CM's is the QP's).
    pub psn: u32,
    /// The rkey of its buffer.
    pub rkey: u32,
    /// Its buffer's address.
    pub vaddr: u64,
    /// Its GID.
    pub gid: [u8; 16],
}

impl Dest {
    /// pc.c:431-470 `rdma_write_keys` under HAVE_ENDIAN (perftest's configure.ac:94-102
    /// finds endian.h on Linux): every field big-endian; srqn and gid_index not used.
    pub fn encode(&self) -> [u8; PINGPONG_DEST_LEN] {
        let mut b = [0u8; PINGPONG_DEST_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b
    }

    /// pc.c:493-535 `rdma_read_keys`: the fields it converts back.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let u32_at = |o: usize| -> Option<u32> {
            Some(u32::from_be_bytes(b.get(o..o + 4)?.try_into().ok()?))
        };
        Some(Self {
            lid: u32_at(0)?,
            out_reads: u32_at(4)?,
            qpn: u32_at(8)?,
            psn: u32_at(12)?,
            rkey: u32_at(16)?,
            vaddr: u64::from_be_bytes(b.get(24..32)?.try_into().ok()?),
            gid: b.get(32..48)?.try_into().ok()?,
        })
    }
}

/// The bandwidth report ib_read_bw's client sends its server (pc.c:1615-1700).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth, MB/s (2^20 bytes).
    pub bw_peak: f64,
    /// Average bandwidth, MB/s (2^20 bytes).
    pub bw_avg: f64,
    /// Messages per second, millions.
    pub msg_rate: f64,
}

/// The control connection. Its QP has one CQ for both queues; perftest polls two (pc.c:
/// 1506-1508, 1554-1556). rxe's responder completes a receive before it sends the ACK
/// (rxe_resp.c: complete, then acknowledge), so the peer's answer can be polled before our
/// send's completion: a receive completion met while waiting for the send is kept for
/// the next receive.
pub struct Control {
    /// The connection.
    pub conn: Conn,
    received: Option<Completion>,
    recv: Region,
    send: Region,
    client: bool,
    wait: Duration,
}

const WR_CONTROL: u64 = 5; // pc.h:77 SYNC_SPEC_ID

fn post_control_recv(qp: &RcQp, recv: &Region) -> Res<()> {
    qp.post_recv(recv, 0, PINGPONG_DEST_LEN, WR_CONTROL)
        .map_err(|e| e.to_string())
}

impl Control {
    fn receive(&mut self) -> Res<Vec<u8>> {
        let c = match self.received.take() {
            Some(c) => c,
            None => self
                .conn
                .qp
                .next(Instant::now() + self.wait)
                .map_err(|e| format!("control receive: {e}"))?,
        };
        if !c.ok() {
            return Err(format!("control receive: {}", c.status_text()));
        }
        if c.wr_id != WR_CONTROL {
            return Err(format!("control: unexpected completion {}", c.wr_id));
        }
        let n = (c.byte_len as usize).min(PINGPONG_DEST_LEN);
        let got = self.recv.bytes()[..n].to_vec();
        post_control_recv(&self.conn.qp, &self.recv)?;
        Ok(got)
    }

    fn transmit(&mut self, data: &[u8]) -> Res<()> {
        let n = data.len().min(PINGPONG_DEST_LEN);
        self.send.bytes_mut()[..n].copy_from_slice(&data[..n]);
        self.conn
            .qp
            .post_send(&self.send, 0, n, WR_CONTROL + 1)
            .map_err(|e| e.to_string())?;
        let end = Instant::now() + self.wait;
        loop {
            let c = self
                .conn
                .qp
                .next(end)
                .map_err(|e| format!("control send: {e}"))?;
            if c.ok() && c.wr_id == WR_CONTROL && self.received.is_none() {
                self.received = Some(c);
                continue;
            }
            if !c.ok() || c.wr_id != WR_CONTROL + 1 {
                return Err(format!("control send: {}", c.status_text()));
            }
            return Ok(());
        }
    }

    /// One exchange (pc.c:1465-1495): the client sends first, the server answers.
    pub fn xchg(&mut self, mine: &[u8]) -> Res<Vec<u8>> {
        if self.client {
            self.transmit(mine)?;
            self.receive()
        } else {
            let theirs = self.receive()?;
            self.transmit(mine)?;
            Ok(theirs)
        }
    }

    /// One exchange whose peer message must be `want` bytes long (`what`): a server
    /// refuses a wrong one before it answers.
    fn xchg_expect(&mut self, mine: &[u8], want: usize, what: &str) -> Res<Vec<u8>> {
        if self.client {
            self.transmit(mine)?;
            let theirs = self.receive()?;
            expect_len(&theirs, want, what)?;
            Ok(theirs)
        } else {
            let theirs = self.receive()?;
            expect_len(&theirs, want, what)?;
            self.transmit(mine)?;
            Ok(theirs)
        }
    }

    /// One `ctx_hand_shake` (pc.c:1380-1425): the peer's message must be a whole
    /// `pingpong_dest` (pc.c:493-497 reads `sizeof(struct pingpong_dest)`); anything else
    /// is another exchange of another test (an 8-byte report value, pc.c:1615-1700).
    pub fn hand_shake(&mut self, mine: &Dest) -> Res<Dest> {
        let b = self.xchg_expect(
            &mine.encode(),
            PINGPONG_DEST_LEN,
            "a handshake (pingpong_dest)",
        )?;
        Dest::decode(&b).ok_or_else(|| format!("a pingpong_dest of {} bytes", b.len()))
    }

    /// Control messages received that this side did not ask for yet (successful receive
    /// completions the control QP holds, polled without waiting).
    pub fn pending(&mut self) -> usize {
        let mut out = Vec::new();
        let _ = self.conn.qp.poll(&mut out, 16);
        out.iter()
            .filter(|c| c.wr_id == WR_CONTROL && c.ok())
            .count()
            + usize::from(self.received.is_some())
    }
}

/// How a run's error starts when no data-QP completion came within `--wait`: the state in
/// which a control message already waiting suggests the peer runs another test.
pub const DATA_TIMEOUT: &str = "no completion on the data QP within --wait: ";

/// A control message of the length this test's exchange has, or the refusal.
fn expect_len(b: &[u8], want: usize, what: &str) -> Res<()> {
    if b.len() == want {
        Ok(())
    } else {
        Err(format!(
            "{MISMATCH}a control message of {} bytes where this test has {what} of {want} bytes",
            b.len()
        ))
    }
}

/// The data connection's read limits against the test (module docs): perftest asks and
/// grants RDMA READs (both limits `out_reads`, at least 1, perftest_parameters.c:2014-
/// 2033) for READ and ATOMIC tests only, both 0 otherwise (pc.c:2290-2293 in the client's
/// REQ, pc.c:2356-2358 in the server's REP). `peer`: (responder resources, initiator
/// depth) of the peer's REQ (`server`) or REP.
pub fn check_read_limits(o: &Options, peer: (u8, u8), server: bool) -> Res<()> {
    let reads = peer.0 > 0 || peer.1 > 0;
    let what = if server { "REQ" } else { "REP" };
    match (o.verb == Verb::Read, reads) {
        (true, false) => Err(format!(
            "{MISMATCH}its {what} carries no read limits (responder resources 0, initiator \
             depth 0): perftest sets them for ib_read_* and ib_atomic_* only (pc.c:2290-2293, \
             2356-2358), so it runs ib_send_* or ib_write_*, not {}",
            o.name()
        )),
        (false, true) => Err(format!(
            "{MISMATCH}its {what} carries read limits (responder resources {}, initiator \
             depth {}): perftest sets them for ib_read_* and ib_atomic_* only (pc.c:2290-2293, \
             2356-2358), so it runs one of those, not {}",
            peer.0,
            peer.1,
            o.name()
        )),
        _ => Ok(()),
    }
}

/// The control connection, client side.
pub fn control_connect(rc: &Rc, peer: Ipv4Addr, port: u16, wait: Duration) -> Res<Control> {
    let recv = Region::new(&rc.ctx, PINGPONG_DEST_LEN).map_err(|e| e.to_string())?;
    let send = Region::new(&rc.ctx, PINGPONG_DEST_LEN).map_err(|e| e.to_string())?;
    let qp = RcQp::create(&rc.ctx, 4).map_err(|e| e.to_string())?;
    let limits = control_limits();
    let conn = rc::connect_qp(rc, qp, peer, port, &limits, |qp| {
        post_control_recv(qp, &recv)
    })?;
    Ok(Control {
        conn,
        received: None,
        recv,
        send,
        client: true,
        wait,
    })
}

/// The control connection, server side.
pub fn control_accept(rc: &Rc, port: u16, wait: Duration, log: &dyn Fn(String)) -> Res<Control> {
    let recv = Region::new(&rc.ctx, PINGPONG_DEST_LEN).map_err(|e| e.to_string())?;
    let send = Region::new(&rc.ctx, PINGPONG_DEST_LEN).map_err(|e| e.to_string())?;
    let qp = RcQp::create(&rc.ctx, 4).map_err(|e| e.to_string())?;
    let listener = rc::listen(rc, port, log)?;
    let limits = control_limits();
    let conn = rc::accept_qp(
        &listener,
        qp,
        &limits,
        wait,
        |qp| post_control_recv(qp, &recv),
        log,
    )?;
    Ok(Control {
        conn,
        received: None,
        recv,
        send,
        client: false,
        wait,
    })
}

fn control_limits() -> Limits {
    Limits {
        // pc.c:1024-1027 and 1177-1180: the control connection (verb SEND) asks none.
        responder_resources: 0,
        initiator_depth: 0,
        timing: crate::cmtime::Timing::patient(),
    }
}

/// What the control exchanges before the data connection settled.
#[derive(Debug, Clone)]
pub struct Agreed {
    /// The peer's version string.
    pub peer_version: String,
    /// The larger cycle buffer (pc.c:1838).
    pub cycle_buffer: u32,
    /// The smaller MTU code (pc.c:1871).
    pub mtu: u8,
}

fn version_number(v: &str) -> f64 {
    // atof: the leading number.
    let end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    v[..end].parse().unwrap_or(0.0)
}

/// The exchanges before the data connection (versions, system data, MTU).
pub fn agree(ctl: &mut Control, mtu: u8) -> Res<Agreed> {
    let mut v = [0u8; MAX_VERSION];
    v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    let theirs = ctl.xchg(&v)?;
    let peer_version = String::from_utf8_lossy(&theirs)
        .trim_end_matches('\0')
        .to_string();
    let n = version_number(&peer_version);
    // pc.c:1801: perftest refuses peers below 5.70; this side does too (what follows is
    // the protocol from that version on).
    if n < 5.70 {
        return Err(format!("perftest version {peer_version:?} is below 5.70"));
    }
    let c = ctl.xchg(&CYCLE_BUFFER.to_be_bytes())?;
    let c = u32::from_be_bytes(
        c.get(..4)
            .ok_or("short cycle buffer")?
            .try_into()
            .map_err(|_| "cycle buffer")?,
    );
    let cycle_buffer = CYCLE_BUFFER.max(c);
    ctl.xchg(&CACHE_LINE_SIZE.to_be_bytes())?;
    // pc.c:1860-1871: "%d" of the MTU code in sizeof(char[2]) bytes; the smaller wins.
    let text = [b'0' + mtu, 0];
    let m = ctl.xchg(&text)?;
    let theirs = m.first().map_or(0, |b| b.wrapping_sub(b'0'));
    let mtu = if (1..=5).contains(&theirs) {
        mtu.min(theirs)
    } else {
        mtu
    };
    Ok(Agreed {
        peer_version,
        cycle_buffer,
        mtu,
    })
}

/// The data connection with its buffer.
pub struct Data {
    /// The connection.
    pub conn: Conn,
    /// The buffer (server READ: what the peer reads; SEND: the receives).
    pub buf: Region,
}

/// The RoCEv2 GID of an IPv4 address (IPv4-mapped IPv6).
fn gid_of(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// Our `pingpong_dest` for the data QP.
pub fn my_dest(rc: &Rc, data: &Data, q: &QpQuery) -> Dest {
    Dest {
        lid: 0,
        out_reads: u32::from(q.max_rd_atomic),
        qpn: q.qpn,
        psn: q.sq_psn,
        rkey: data.buf.rkey(),
        vaddr: data.buf.addr(),
        gid: gid_of(rc.port().local()),
    }
}

fn data_buffer(rc: &Rc, o: &Options, agreed: &Agreed, server: bool) -> Res<Region> {
    let len = match o.verb {
        // pr.h:117 BUFF_SIZE: the peer addresses max(size, cycle buffer) bytes.
        Verb::Read | Verb::Write => o.size.max(agreed.cycle_buffer as usize),
        Verb::Send => o.size * o.receives(server).max(1) as usize,
    };
    let mut buf = Region::new(&rc.ctx, len).map_err(|e| e.to_string())?;
    buf.bytes_mut().copy_from_slice(&prefill(len));
    if o.verb == Verb::Write && !server {
        // What the write client writes must not be what the server's buffer already holds
        // ([`written_over`] tells the two apart): the pattern reversed, as `send_lat`'s.
        buf.bytes_mut().reverse();
    }
    Ok(buf)
}

/// What this side's buffers hold before the peer writes or sends into them.
fn prefill(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(3))
        .collect()
}

/// A receive on the data QP of a test whose client sends nothing there (READ, WRITE):
/// a SEND that takes it shows the client runs ib_send_* ([`stray_sends`]).
const WR_SENTINEL: u64 = u64::MAX;

fn post_sentinel(qp: &RcQp, buf: &Region) -> Res<()> {
    qp.post_recv(buf, 0, buf.len().min(PINGPONG_DEST_LEN), WR_SENTINEL)
        .map_err(|e| e.to_string())
}

/// SENDs that reached the data QP of a READ or WRITE test (its sentinel receive taken):
/// the client runs ib_send_*. Polls without waiting.
pub fn stray_sends(data: &Data) -> usize {
    let mut out = Vec::new();
    let _ = data.conn.qp.poll(&mut out, 16);
    sentinel_taken(&out)
}

/// The sentinel's completions among `out` that a SEND made: any status but the flush of
/// a QP going to ERR. A SEND longer than the sentinel's 56 bytes (ib_send_bw's 65536 by
/// default) completes it with IBV_WC_LOC_LEN_ERR (IBA 10.8.3.2: the message does not fit
/// the receive's buffers), which is as much a SEND as a successful one.
fn sentinel_taken(out: &[Completion]) -> usize {
    out.iter()
        .filter(|c| c.wr_id == WR_SENTINEL && c.status != rc::WC_WR_FLUSH_ERR)
        .count()
}

fn post_receives(qp: &RcQp, buf: &Region, o: &Options, server: bool) -> Res<()> {
    for slot in 0..o.receives(server) as usize {
        qp.post_recv(buf, slot * o.size, o.size, slot as u64)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The data connection, client side: the handshake, the connect (retried as perftest's,
/// pc.c:2684-2707), the handshake.
pub fn data_connect(
    rc: &Rc,
    ctl: &mut Control,
    peer: Ipv4Addr,
    port: u16,
    o: &Options,
    agreed: &Agreed,
    log: &dyn Fn(String),
) -> Res<Data> {
    ctl.hand_shake(&Dest::default())?;
    let buf = data_buffer(rc, o, agreed, false)?;
    // A READ client's QP holds as many work requests as the REP may let it issue: perftest's
    // server grants its own out_reads whatever the REQ asked (pc.c:2356-2358, librdmacm
    // cma.c:1922/1928), the device's max_qp_rd_atom without -o (pp.c:2014-2030), and the
    // engine takes the REP's ResponderResources as the initiator depth (cm.c
    // cm_rep_handler). The READs in flight are bounded by both (`read_client`).
    let slots = match o.verb {
        Verb::Read => o
            .depth
            .max(rc.ctx.max_qp_init_rd_atom().map_err(|e| e.to_string())?),
        Verb::Send | Verb::Write => o.slots(false),
    };
    let mut last = String::new();
    for attempt in 1..=CONNECT_ATTEMPTS {
        let qp = RcQp::create(&rc.ctx, slots).map_err(|e| e.to_string())?;
        match rc::connect_qp(rc, qp, peer, port, &o.limits, |qp| {
            post_receives(qp, &buf, o, false)
        }) {
            Ok(conn) => {
                ctl.hand_shake(&Dest::default())?;
                return Ok(Data { conn, buf });
            }
            Err(e) => {
                log(format!("perftest: data connect attempt {attempt}: {e}"));
                last = e;
                std::thread::sleep(CONNECT_RETRY_DELAY);
            }
        }
    }
    Err(format!("data connection: {last}"))
}

/// The data connection, server side: listening before the handshake (perftest's server
/// listens after it, pc.c:2737-2746, and its client retries), accepting, the handshake.
pub fn data_accept(
    rc: &Rc,
    ctl: &mut Control,
    port: u16,
    o: &Options,
    agreed: &Agreed,
    log: &dyn Fn(String),
) -> Res<Data> {
    let listener = rc::listen(rc, port, log)?;
    ctl.hand_shake(&Dest::default())?;
    let buf = data_buffer(rc, o, agreed, true)?;
    let qp = RcQp::create(&rc.ctx, o.slots(true)).map_err(|e| e.to_string())?;
    let conn = rc::accept_qp(
        &listener,
        qp,
        &o.limits,
        o.wait,
        |qp| {
            if o.verb == Verb::Send {
                post_receives(qp, &buf, o, true)
            } else {
                post_sentinel(qp, &buf)
            }
        },
        log,
    )?;
    if o.verb == Verb::Send {
        // perftest's server lowers its data QP's RNR timer after the accept (pc.c:2324-2326,
        // 2380): a receive shortage then costs 0.64 ms (code 12, pr.h:83 MIN_RNR_TIMER)
        // instead of the CM's 655 ms (code 0, IBA Table 45).
        conn.qp
            .set_min_rnr_timer(MIN_RNR_TIMER)
            .map_err(|e| e.to_string())?;
    }
    ctl.hand_shake(&Dest::default())?;
    Ok(Data { conn, buf })
}

/// The `pingpong_dest` handshakes after the data connection (module docs): returns the
/// peer's.
pub fn exchange_dests(ctl: &mut Control, o: &Options, mine: &Dest) -> Res<Dest> {
    let theirs = ctl.hand_shake(mine)?;
    for _ in 1..o.handshakes_before_run() {
        ctl.hand_shake(mine)?;
    }
    Ok(theirs)
}

/// What the run did on this side.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    /// Messages or reads completed and checked.
    pub ops: u64,
    /// Bytes.
    pub bytes: u64,
    /// From the first post (or receive) to the last completion.
    pub elapsed: Duration,
    /// RDMA READs in flight at most.
    pub in_flight: u32,
    /// The QP's max_rd_atomic (READ client).
    pub rd_atomic: u8,
    /// The QP's send queue slots (READ client).
    pub send_slots: u32,
    /// Every byte was compared (READs; received SENDs above half the cycle buffer).
    pub contents_checked: bool,
}

impl Run {
    /// MB/s in perftest's unit (2^20 bytes).
    pub fn mib_per_s(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 / s / MB
        } else {
            0.0
        }
    }

    /// The report perftest's server prints for its client.
    pub fn report(&self, size: usize) -> BwReport {
        let s = self.elapsed.as_secs_f64();
        let bw = self.mib_per_s();
        BwReport {
            size: size as u64,
            iters: self.ops,
            bw_peak: bw,
            bw_avg: bw,
            msg_rate: if s > 0.0 {
                self.ops as f64 / s / 1e6
            } else {
                0.0
            },
        }
    }
}

fn completion_ok(qp: &RcQp, wait: Duration, what: &str) -> Res<Completion> {
    let c = qp.next(Instant::now() + wait).map_err(|e| {
        if e.kind() == std::io::ErrorKind::TimedOut {
            format!("{DATA_TIMEOUT}{what}")
        } else {
            format!("{what}: {e}")
        }
    })?;
    if c.ok() {
        Ok(c)
    } else {
        Err(format!(
            "{what}: completion {} ({})",
            c.status_text(),
            c.status
        ))
    }
}

/// ib_read_bw's client: `iters` RDMA READs of the peer's buffer, as many in flight as the
/// QP's negotiated initiator depth (its max_rd_atomic, as the device rounded it) and its
/// send queue (`cap.max_send_wr`) both allow: a post beyond the send queue fails
/// (rxe: ENOMEM). perftest's buffer holds random
/// bytes (pr.c:1784-1790) that do not change during the run: a first READ into a zeroed
/// and into a 0xFF-filled slot must agree (every byte was written), and every later
/// READ must return the same bytes.
pub fn read_client(rc: &Rc, data: &Data, peer: &Dest, o: &Options) -> Res<Run> {
    let qp = &data.conn.qp;
    let q = qp.query().map_err(|e| e.to_string())?;
    let depth = u32::from(q.max_rd_atomic).min(q.max_send_wr).max(1);
    let size = o.size;
    // The READs' destinations: a ring within the memory budget. Two READs in flight into
    // one slot write the same bytes (the peer's buffer does not change).
    let ring = (depth as usize).min((SLOT_BUDGET / size.max(1)).max(1)) as u64;
    let mut buf = Region::new(&rc.ctx, (ring as usize + 2) * size).map_err(|e| e.to_string())?;
    // The reference: two READs into differently filled slots.
    buf.bytes_mut()[size..2 * size].fill(0xff);
    for slot in 0..2u64 {
        qp.post_read(
            &buf,
            slot as usize * size,
            size,
            peer.vaddr,
            peer.rkey,
            slot,
        )
        .map_err(|e| e.to_string())?;
    }
    for _ in 0..2 {
        completion_ok(qp, o.wait, "reference RDMA READ")?;
    }
    let reference = buf.bytes()[..size].to_vec();
    if buf.bytes()[size..2 * size] != reference[..] {
        return Err("two RDMA READs of the peer's buffer differ".into());
    }
    let base = 2 * size;
    let t0 = Instant::now();
    let (mut posted, mut done, mut in_flight_max) = (0u64, 0u64, 0u32);
    while done < o.iters {
        while posted < o.iters && posted - done < u64::from(depth) {
            let slot = (posted % ring) as usize;
            qp.post_read(
                &buf,
                base + slot * size,
                size,
                peer.vaddr,
                peer.rkey,
                100 + slot as u64,
            )
            .map_err(|e| e.to_string())?;
            posted += 1;
            in_flight_max = in_flight_max.max((posted - done) as u32);
        }
        let c = completion_ok(qp, o.wait, "RDMA READ")?;
        let slot = c.wr_id.checked_sub(100).ok_or("stray completion")? as usize;
        let got = buf
            .bytes()
            .get(base + slot * size..base + (slot + 1) * size);
        if got != Some(reference.as_slice()) {
            return Err(format!(
                "RDMA READ {done}: bytes differ from the peer's buffer"
            ));
        }
        done += 1;
    }
    Ok(Run {
        ops: done,
        bytes: done * size as u64,
        elapsed: t0.elapsed(),
        in_flight: in_flight_max,
        rd_atomic: q.max_rd_atomic,
        send_slots: q.max_send_wr,
        contents_checked: true,
    })
}

/// ib_send_bw's client: `iters` SENDs of `size` bytes, `depth` in flight.
pub fn send_client(data: &Data, o: &Options) -> Res<Run> {
    let qp = &data.conn.qp;
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let slots = (data.buf.len() / o.size).max(1) as u64;
    while done < o.iters {
        while posted < o.iters && posted - done < u64::from(o.depth) {
            let slot = (posted % slots) as usize;
            qp.post_send(&data.buf, slot * o.size, o.size, posted)
                .map_err(|e| e.to_string())?;
            posted += 1;
        }
        completion_ok(qp, o.wait, "SEND")?;
        done += 1;
    }
    Ok(Run {
        ops: done,
        bytes: done * o.size as u64,
        elapsed: t0.elapsed(),
        ..Run::default()
    })
}

/// ib_send_bw's server: `iters` messages of `size` bytes, each of the length sent. When the
/// size exceeds half the agreed cycle buffer (`cycle_buffer`, the larger of the two sides',
/// pc.c:1838) perftest's client sends the same random bytes each time (one buffer,
/// pr.c:1784-1790, its address moving only when size <= cycle/2, pr.c:3190-3191): every
/// message must then equal the first, which must differ from what the slot held before.
/// Below that each message comes from another place of the random buffer, and only its
/// length can be checked (`Run::contents_checked` false).
pub fn send_server(data: &Data, o: &Options, cycle_buffer: u32) -> Res<Run> {
    let comparable = o.size > cycle_buffer as usize / 2;
    let qp = &data.conn.qp;
    let mut first: Option<Vec<u8>> = None;
    let mut t0 = None;
    let mut done = 0u64;
    let prefill = prefill(o.size);
    while done < o.iters {
        let c = completion_ok(qp, o.wait, "receive")?;
        t0.get_or_insert_with(Instant::now);
        if c.byte_len as usize != o.size {
            return Err(format!(
                "message {done} of {} bytes, not {}",
                c.byte_len, o.size
            ));
        }
        let slot = c.wr_id as usize;
        let got = data
            .buf
            .bytes()
            .get(slot * o.size..(slot + 1) * o.size)
            .ok_or("bad slot")?;
        match &first {
            None => {
                if got == prefill.as_slice() && comparable {
                    return Err("the first message left the buffer as it was".into());
                }
                first = Some(got.to_vec());
            }
            Some(f) if comparable && f.as_slice() != got => {
                return Err(format!("message {done} differs from the first"));
            }
            Some(_) => {}
        }
        done += 1;
        if done + u64::from(o.receives(true)) <= o.iters {
            qp.post_recv(&data.buf, slot * o.size, o.size, slot as u64)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(Run {
        ops: done,
        bytes: done * o.size as u64,
        elapsed: t0.map_or(Duration::ZERO, |t| t.elapsed()),
        contents_checked: comparable,
        ..Run::default()
    })
}

/// ib_write_bw's client: `iters` RDMA WRITEs of `size` bytes from this side's buffer to
/// the peer's buffer (its `pingpong_dest` vaddr and rkey), as many in flight as `depth`
/// and the send queue allow. Each completion is the responder's acknowledgement that it
/// placed the bytes (IBA 9.7.5.1.1); the peer grants no RDMA READs on a WRITE test
/// (pc.c:2356-2358), so they cannot be read back from here.
pub fn write_client(data: &Data, peer: &Dest, o: &Options) -> Res<Run> {
    let qp = &data.conn.qp;
    let q = qp.query().map_err(|e| e.to_string())?;
    let depth = o.depth.min(q.max_send_wr).max(1);
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < o.iters {
        while posted < o.iters && posted - done < u64::from(depth) {
            qp.post_write(&data.buf, 0, o.size, peer.vaddr, peer.rkey, posted)
                .map_err(|e| e.to_string())?;
            posted += 1;
        }
        completion_ok(qp, o.wait, "RDMA WRITE")?;
        done += 1;
    }
    Ok(Run {
        ops: done,
        bytes: done * o.size as u64,
        elapsed: t0.elapsed(),
        send_slots: q.max_send_wr,
        ..Run::default()
    })
}

/// ib_write_bw's server, after the client's end handshake: the client's first WRITE lands
/// at the start of this side's buffer whatever the size (pr.c `ctx_set_send_wqes`: the
/// remote address starts at the peer's vaddr), and perftest's buffer holds random bytes
/// (pr.c:1780-1790), which keep about 1 byte in 256 of this side's pattern. Returns the
/// bytes of the first `size` that still hold the pattern; more than 1 in 16 means the
/// client did not write there. `size` is the client's message size (its report's), no
/// more than this side's: perftest's server takes a client of any `-s`
/// (read_bw.c:392-400), whose WRITEs cover its own size from the start (pr.h:728-744
/// `increase_rem_addr` cycles within the cycle buffer). None: fewer than
/// [`WRITTEN_MIN`] bytes, too few to tell random bytes from the pattern.
pub fn written_over(data: &Data, size: usize) -> Res<Option<usize>> {
    kept_pattern(data.buf.bytes(), size)
}

/// The smallest message [`written_over`] judges: random bytes keep 1 in 256 of the
/// pattern, so more than 1 in 16 of 64 (5 or more) happens about 7 times in 10^6 runs; at
/// `-s 8` the same rule (1 or more) would fail 3 % of legitimate runs.
pub const WRITTEN_MIN: usize = 64;

/// [`written_over`] on the buffer's bytes.
fn kept_pattern(buf: &[u8], size: usize) -> Res<Option<usize>> {
    if size < WRITTEN_MIN {
        return Ok(None);
    }
    let got = buf.get(..size).ok_or("buffer shorter than a message")?;
    let kept = got
        .iter()
        .zip(prefill(size))
        .filter(|(a, b)| **a == *b)
        .count();
    if kept > size / 16 {
        return Err(format!(
            "{kept} of the first {size} bytes of this side's buffer still hold what it held \
             before the run: the client's RDMA WRITEs did not land"
        ));
    }
    Ok(Some(kept))
}

/// A latency run's figures, in microseconds, as `print_report_lat` makes them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latency {
    /// Iterations run.
    pub iters: u64,
    /// `t_min`.
    pub min: f64,
    /// `t_max`: `delta[n]`, the smaller of the two samples `LAT_MEASURE_TAIL` leaves out of
    /// the rest (pp.c:3757), so the second-largest delta.
    pub max: f64,
    /// `t_typical`: the median.
    pub typical: f64,
    /// `t_avg`.
    pub avg: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The 99.9th percentile.
    pub p99_9: f64,
}

impl Latency {
    /// perftest_parameters.c:3678-3790 `print_report_lat`: the time between consecutive
    /// posts (3703-3706), divided by `rtt_factor` (2 for SEND and WRITE ping-pongs, 1 for
    /// READ, 3692), sorted, the `LAT_MEASURE_TAIL` largest left out (3724-3725); the
    /// median as `get_median` takes it (3625-3631), the average of the rest, the 99th and
    /// 99.9th percentile at ceil(n x 0.99) and ceil(n x 0.999) (3757-3758). None below
    /// `MIN_ITER` posts.
    pub fn from_posts(posts: &[Instant], rtt_factor: u32) -> Option<Self> {
        if (posts.len() as u64) < MIN_ITER {
            return None;
        }
        let f = f64::from(rtt_factor.max(1));
        let mut delta: Vec<f64> = posts
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e6 / f)
            .collect();
        delta.sort_by(f64::total_cmp);
        let n = delta.len() - LAT_MEASURE_TAIL;
        let typical = if (n - 1) % 2 == 1 {
            (delta[n / 2] + delta[n / 2 - 1]) / 2.0
        } else {
            delta[n / 2]
        };
        let at = |q: f64| delta[((n as f64 * q).ceil() as usize).min(n)];
        Some(Self {
            iters: posts.len() as u64,
            min: delta[0],
            max: delta[n],
            typical,
            avg: delta[..n].iter().sum::<f64>() / n as f64,
            p99: at(0.99),
            p99_9: at(0.999),
        })
    }
}

/// ib_read_lat's client (read_lat.c, pr.c:4558-4637 `run_iter_lat`): one RDMA READ at a
/// time, each posted when the last completed. The peer's buffer does not change during
/// the run (read_bw's reasoning, [`read_client`]): each READ must return the bytes of a
/// reference read twice into differently filled places.
pub fn read_lat_client(rc: &Rc, data: &Data, peer: &Dest, o: &Options) -> Res<Latency> {
    let qp = &data.conn.qp;
    let size = o.size;
    let mut buf = Region::new(&rc.ctx, 3 * size).map_err(|e| e.to_string())?;
    buf.bytes_mut()[size..2 * size].fill(0xff);
    for slot in 0..2usize {
        qp.post_read(&buf, slot * size, size, peer.vaddr, peer.rkey, slot as u64)
            .map_err(|e| e.to_string())?;
        completion_ok(qp, o.wait, "reference RDMA READ")?;
    }
    let reference = buf.bytes()[..size].to_vec();
    if buf.bytes()[size..2 * size] != reference[..] {
        return Err("two RDMA READs of the peer's buffer differ".into());
    }
    let mut posts = Vec::with_capacity(o.iters as usize);
    for i in 0..o.iters {
        buf.bytes_mut()[2 * size..].fill(0);
        posts.push(Instant::now());
        qp.post_read(&buf, 2 * size, size, peer.vaddr, peer.rkey, 2)
            .map_err(|e| e.to_string())?;
        completion_ok(qp, o.wait, "RDMA READ")?;
        if buf.bytes()[2 * size..] != reference[..] {
            return Err(format!(
                "RDMA READ {i}: bytes differ from the peer's buffer"
            ));
        }
    }
    Latency::from_posts(&posts, 1).ok_or_else(|| format!("fewer than {MIN_ITER} READs"))
}

/// ib_send_lat's ping-pong, either side (pr.c:4639-4815 `run_iter_lat_send`): the client
/// SENDs first; each side SENDs once for every message it receives, `iters` each way,
/// reposting a receive while more messages are due than are posted (pr.c:4708). perftest
/// SENDs the same bytes of its buffer every time (the SGE's address does not move without
/// `--flows`, pr.c:4751-4758), random ones (pr.c:1780-1790): every message must equal the
/// first, which must have overwritten this side's pattern. The SQ and RQ share one CQ
/// here, told apart by the completion's opcode.
pub fn send_lat(rc: &Rc, data: &Data, o: &Options, client: bool) -> Res<Latency> {
    let qp = &data.conn.qp;
    let size = o.size;
    let mut send = Region::new(&rc.ctx, size).map_err(|e| e.to_string())?;
    send.bytes_mut().copy_from_slice(&prefill(size));
    send.bytes_mut().reverse();
    let posted_receives = u64::from(o.receives(!client));
    let before = prefill(size);
    let mut first: Option<Vec<u8>> = None;
    let mut posts = Vec::with_capacity(o.iters as usize);
    let (mut sent, mut received) = (0u64, 0u64);
    let mut receive = |sent: &mut u64| -> Res<()> {
        loop {
            let c = completion_ok(qp, o.wait, "ping-pong")?;
            if c.opcode & IBV_WC_RECV == 0 {
                *sent += 1;
                continue;
            }
            if c.byte_len as usize != size {
                return Err(format!(
                    "message {received} of {} bytes, not {size}",
                    c.byte_len
                ));
            }
            let slot = c.wr_id as usize;
            let got = data
                .buf
                .bytes()
                .get(slot * size..(slot + 1) * size)
                .ok_or("bad slot")?;
            match &first {
                None if got == before.as_slice() => {
                    return Err("the first message left the buffer as it was".into());
                }
                None => first = Some(got.to_vec()),
                Some(f) if f.as_slice() != got => {
                    return Err(format!("message {received} differs from the first"));
                }
                Some(_) => {}
            }
            received += 1;
            if received + posted_receives <= o.iters {
                qp.post_recv(&data.buf, slot * size, size, c.wr_id)
                    .map_err(|e| e.to_string())?;
            }
            return Ok(());
        }
    };
    let mut completed = 0u64;
    for _ in 0..o.iters {
        if !client {
            receive(&mut completed)?;
        }
        posts.push(Instant::now());
        qp.post_send(&send, 0, size, u64::MAX - 1)
            .map_err(|e| e.to_string())?;
        sent += 1;
        if client {
            receive(&mut completed)?;
        }
    }
    while completed < sent {
        let c = completion_ok(qp, o.wait, "SEND")?;
        if c.opcode & IBV_WC_RECV == 0 {
            completed += 1;
        }
    }
    Latency::from_posts(&posts, 2).ok_or_else(|| format!("fewer than {MIN_ITER} messages"))
}

/// `ibv_wc_opcode`'s receive bit (verbs.h `IBV_WC_RECV = 1 << 7`).
const IBV_WC_RECV: u32 = 1 << 7;

/// `xchg_bw_reports` (pc.c:1615-1700): five 8-byte big-endian values each way, the
/// client's first.
pub fn xchg_reports(ctl: &mut Control, mine: &BwReport) -> Res<BwReport> {
    let mut v = [0u64; 5];
    let ours = [
        mine.size,
        mine.iters,
        mine.bw_peak.to_bits(),
        mine.bw_avg.to_bits(),
        mine.msg_rate.to_bits(),
    ];
    for (i, x) in ours.iter().enumerate() {
        let b = ctl.xchg_expect(&x.to_be_bytes(), 8, "a bandwidth report value")?;
        v[i] = u64::from_be_bytes(
            b.get(..8)
                .ok_or("short report")?
                .try_into()
                .map_err(|_| "report")?,
        );
    }
    Ok(BwReport {
        size: v[0],
        iters: v[1],
        bw_peak: f64::from_bits(v[2]),
        bw_avg: f64::from_bits(v[3]),
        msg_rate: f64::from_bits(v[4]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes no pattern predicts (xorshift64, fixed seed): perftest's random buffer.
    fn random_bytes(len: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn written_over_tells_a_written_buffer_from_an_untouched_one() {
        // Untouched: the pattern, all of it kept.
        let mut buf = prefill(65536);
        assert!(kept_pattern(&buf, 65536).is_err());
        // perftest's client, -s 4096 against this side's 65536: it writes only the first
        // 4096 B (pr.h:728-744), and only those are judged.
        buf[..4096].copy_from_slice(&random_bytes(4096));
        let kept = kept_pattern(&buf, 4096).unwrap().unwrap();
        assert!(kept <= 4096 / 16, "{kept}");
        assert!(kept_pattern(&buf, 65536).is_err());
        // ibcm's own write client: the pattern reversed (data_buffer) is not the pattern.
        let mut reversed = prefill(65536);
        reversed.reverse();
        assert!(kept_pattern(&reversed, 65536).unwrap().is_some());
        // Below WRITTEN_MIN nothing is judged: at -s 8 one byte in 256 matching would fail
        // 3 % of legitimate runs.
        assert_eq!(kept_pattern(&prefill(8), 8), Ok(None));
        assert!(kept_pattern(&prefill(64), WRITTEN_MIN).is_err());
        // A buffer shorter than the size asked is an error, not a panic.
        assert!(kept_pattern(&[0; 100], 200).is_err());
    }

    #[test]
    fn a_send_that_took_the_sentinel_is_seen_whatever_its_status() {
        let c = |wr_id, status| Completion {
            wr_id,
            status,
            opcode: IBV_WC_RECV,
            byte_len: 0,
        };
        // ib_send_bw's 65536-B SEND into the 56-B sentinel: IBV_WC_LOC_LEN_ERR (1).
        assert_eq!(sentinel_taken(&[c(WR_SENTINEL, 1)]), 1);
        // A SEND that fits: success.
        assert_eq!(sentinel_taken(&[c(WR_SENTINEL, 0)]), 1);
        // The QP going to ERR flushes the sentinel: no SEND came.
        assert_eq!(sentinel_taken(&[c(WR_SENTINEL, rc::WC_WR_FLUSH_ERR)]), 0);
        // Another work request's completion is not the sentinel's.
        assert_eq!(sentinel_taken(&[c(3, 0), c(3, 1)]), 0);
    }

    #[test]
    fn pingpong_dest_is_perftests_layout() {
        // pr.h:221-231 on x86-64: lid 0, out_reads 4, qpn 8, psn 12, rkey 16, (pad 20),
        // vaddr 24, gid 32, srqn 48, gid_index 52; pc.c:442-449 converts to big-endian.
        let d = Dest {
            lid: 1,
            out_reads: 4,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x0102_0304_0506_0708,
            gid: [9; 16],
        };
        let b = d.encode();
        assert_eq!(&b[0..4], &[0, 0, 0, 1]);
        assert_eq!(&b[8..12], &[0, 0, 0, 0x11]);
        assert_eq!(&b[24..32], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b[32], 9);
        assert_eq!(Dest::decode(&b), Some(d));
        assert_eq!(Dest::decode(&b[..40]), None);
    }

    fn opts(verb: Verb, tst: Tst) -> Options {
        Options {
            verb,
            tst,
            size: 64,
            iters: 10,
            limits: Limits {
                responder_resources: 0,
                initiator_depth: 0,
                timing: crate::cmtime::Timing::patient(),
            },
            depth: 4,
            wait: Duration::from_secs(1),
        }
    }

    #[test]
    fn read_limits_tell_a_read_test_from_the_others() {
        // pc.c:2290-2293 / 2356-2358: READ and ATOMIC carry out_reads (at least 1), the
        // others 0. The case: a READ server facing ib_write_bw's REQ (0, 0).
        let read = opts(Verb::Read, Tst::Bw);
        let e = check_read_limits(&read, (0, 0), true).unwrap_err();
        assert!(e.starts_with(MISMATCH) && e.contains("REQ"), "{e}");
        assert!(check_read_limits(&read, (128, 128), true).is_ok());
        assert!(check_read_limits(&opts(Verb::Read, Tst::Lat), (1, 1), false).is_ok());
        for verb in [Verb::Write, Verb::Send] {
            for tst in [Tst::Bw, Tst::Lat] {
                let o = opts(verb, tst);
                assert!(check_read_limits(&o, (0, 0), true).is_ok());
                let e = check_read_limits(&o, (4, 4), false).unwrap_err();
                assert!(e.starts_with(MISMATCH) && e.contains("REP"), "{e}");
            }
        }
    }

    #[test]
    fn handshakes_before_the_run_are_each_tests() {
        // read_bw.c / write_bw.c: 3; send_bw.c, read_lat.c, send_lat.c: 4 (module docs).
        assert_eq!(opts(Verb::Read, Tst::Bw).handshakes_before_run(), 3);
        assert_eq!(opts(Verb::Write, Tst::Bw).handshakes_before_run(), 3);
        assert_eq!(opts(Verb::Send, Tst::Bw).handshakes_before_run(), 4);
        assert_eq!(opts(Verb::Read, Tst::Lat).handshakes_before_run(), 4);
        assert_eq!(opts(Verb::Send, Tst::Lat).handshakes_before_run(), 4);
        assert_eq!(opts(Verb::Write, Tst::Lat).name(), "ib_write_lat");
    }

    #[test]
    fn a_report_value_where_a_handshake_is_due_is_refused() {
        // ib_read_lat's client closes (a 56-byte pingpong_dest) where ib_read_bw's server
        // waits for the report's first 8-byte value, and the reverse.
        assert!(expect_len(&[0; 56], 56, "a handshake").is_ok());
        let e = expect_len(&[0; 8], 56, "a handshake").unwrap_err();
        assert!(e.starts_with(MISMATCH) && e.contains("of 8 bytes"), "{e}");
        assert!(expect_len(&[0; 56], 8, "a report value").is_err());
    }

    #[test]
    fn latency_is_print_report_lats() {
        // Posts 0, 10, 30, 60, 100, 150, 210 us apart by 10, 20, ..., 60: sorted deltas
        // 10..60, the two largest left out: n = 4 of [10, 20, 30, 40 | 50, 60].
        let t0 = Instant::now();
        let us = [0u64, 10, 30, 60, 100, 150, 210];
        let posts: Vec<Instant> = us.iter().map(|u| t0 + Duration::from_micros(*u)).collect();
        let l = Latency::from_posts(&posts, 2).unwrap();
        // rtt_factor 2 halves each; get_median(4): (n - 1) % 2 = 1, the mean of [2], [1].
        assert_eq!(l.iters, 7);
        assert!((l.min - 5.0).abs() < 1e-9);
        assert!((l.max - 25.0).abs() < 1e-9, "delta[n] = 50 / 2");
        assert!((l.typical - 12.5).abs() < 1e-9);
        assert!((l.avg - 12.5).abs() < 1e-9);
        // ceil(4 x 0.99) = 4: delta[4].
        assert!((l.p99 - 25.0).abs() < 1e-9);
        let l = Latency::from_posts(&posts[..6], 1).unwrap();
        // deltas 10..50, n = 3 of [10, 20, 30 | 40, 50]: (n - 1) % 2 = 0, delta[1].
        assert!((l.typical - 20.0).abs() < 1e-9);
        assert!(Latency::from_posts(&posts[..4], 1).is_none());
    }

    #[test]
    fn versions_read_as_atof() {
        assert_eq!(version_number("6.06"), 6.06);
        assert_eq!(version_number("5.70\0"), 5.70);
        assert_eq!(version_number("junk"), 0.0);
    }
}
