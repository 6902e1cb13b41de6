//! `cmtime`: connection setup and teardown timed step by step over many connections, in
//! the manner of rdma-core's `librdmacm/examples/cmtime.c` (whose `-m` mimic mode likewise
//! leaves the QPs out and times the CM alone).
//!
//! A server listens and answers every REQ with `prepare_accept` + `accept`; a client
//! opens N connections, keeping up to `window` of them in flight, every one an overlapped
//! operation ([`spawn`] with an [`Overlapped`] on a [`CompletionPort`]): no thread per
//! connection, and the futures advance on the threads that complete their requests. Then
//! the client disconnects them all, the same way, and both sides wait out timewait.
//!
//! Per connection it records when each step began and ended (the fabric's clock, real or
//! virtual): REQ sent -> REP received, RTU sent -> established on the server, DREQ sent ->
//! DREP received, and DREP -> timewait exit. Every wait is bounded: if nothing completes
//! for longer than the worst case the retry settings allow, what is still pending is
//! cancelled and reported as failed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hashbrown::HashMap;
use ibcm_ioctl::status;

use crate::exchange::PathEnd;
use crate::sim::{ClockFn, DriverMemory, Pump, Waited};
use ibcm::Provider;
use ibcm::{AcceptParams, Failover, ListenParams};
use ibcm::{CompletionPort, Overlapped, spawn};
use ibcm::{ConnectEndpoint, ConnectionRequest};
use ibcm::{Detail, Error, Result};

/// CM timing of the connections (IB time exponents: 4.096 us x 2^t).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// PacketLifeTime of the path: round trips and part of timewait.
    pub packet_life_time: u8,
    /// Remote and local CM response timeouts.
    pub cm_response_timeout: u8,
    /// MaxCMRetries.
    pub max_cm_retries: u8,
}

impl Default for Timing {
    /// 4.2 ms life time and 134 ms response timeout (a retry every ~143 ms), 15 retries:
    /// a run under several percent loss completes, and in seconds.
    fn default() -> Self {
        Self {
            packet_life_time: 10,
            cm_response_timeout: 15,
            max_cm_retries: 15,
        }
    }
}

fn ib_ns(t: u8) -> u64 {
    ibcm_mad::ib_time_ns(t.min(31)).unwrap_or(0)
}

impl Timing {
    /// A 16.8 ms packet life time and a 1.07 s response timeout (a REQ is re-sent after
    /// about 1.1 s), 15 retries: patient enough for a peer in an emulated VM (RoCEv2).
    pub fn patient() -> Self {
        Self {
            packet_life_time: 12,
            cm_response_timeout: 18,
            max_cm_retries: 15,
        }
    }

    /// How long a request waits before it is re-sent.
    pub fn retry_interval(&self) -> Duration {
        Duration::from_nanos(
            ib_ns(self.packet_life_time)
                .saturating_mul(2)
                .saturating_add(ib_ns(self.cm_response_timeout)),
        )
    }

    /// The longest a request can go unanswered before the engine gives up on it.
    pub fn request_lifetime(&self) -> Duration {
        self.retry_interval() * (u32::from(self.max_cm_retries) + 1)
    }
}

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Connections to open.
    pub connections: usize,
    /// Most connections in flight at once.
    pub window: usize,
    /// Client threads starting connections (each with its own completion port); 1 in
    /// virtual time.
    pub threads: usize,
    /// The service ID the server listens on.
    pub service_id: u64,
    /// CM timing.
    pub timing: Timing,
    /// The client's end of the path.
    pub client: PathEnd,
    /// The server's end.
    pub server: PathEnd,
    /// The server's listen backlog: REQs the driver holds for the application before
    /// it takes them.
    pub backlog: u32,
    /// The server application's accept rate, requests per second of the fabric's clock
    /// (None: as fast as it can). Modelled: it takes a request, then the next one 1/R
    /// later, so N connections cannot all be up before N/R.
    pub accept_rate: Option<u32>,
    /// Tear the connections down by a port flap instead of disconnecting them: every
    /// node's port goes down at once ([`Pump::set_ports_up`]) and stays down past the
    /// connections' deadline (their QPs' transport retries: (retry count + 1) x local
    /// ACK timeout, the driver's link.rs), until each side was told by its driver (the
    /// DREQ an established connection reads a port down as); the ports then come back,
    /// each side answers, the DREQs the drivers owed go out and timewait runs out.
    pub port_flap: bool,
    /// A short flap before an ordinary teardown: every port goes down for half the
    /// connections' deadline and comes back; nothing may end (the teardown that follows
    /// fails on any connection that did).
    pub short_flap: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            connections: 10_000,
            window: 256,
            threads: 1,
            service_id: 0x0000_0000_0001_c0de,
            timing: Timing::default(),
            client: PathEnd::sim_node(0),
            server: PathEnd::sim_node(1),
            backlog: 4096,
            accept_rate: None,
            port_flap: false,
            short_flap: false,
        }
    }
}

/// A step timed per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    /// REQ sent -> REP received (the client's connect completes).
    ReqToRep,
    /// RTU sent -> established on the server (its accept completes).
    RtuToEstablished,
    /// REQ sent -> established on the server: the whole setup.
    Setup,
    /// DREQ sent -> DREP received (the client's disconnect completes).
    DreqToDrep,
    /// DREP received -> timewait exit on the client.
    Timewait,
}

impl Step {
    /// Every step, in order.
    pub const ALL: [Step; 5] = [
        Step::ReqToRep,
        Step::RtuToEstablished,
        Step::Setup,
        Step::DreqToDrep,
        Step::Timewait,
    ];

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Step::ReqToRep => "REQ -> REP",
            Step::RtuToEstablished => "RTU -> established",
            Step::Setup => "REQ -> established",
            Step::DreqToDrep => "DREQ -> DREP",
            Step::Timewait => "DREP -> timewait exit",
        }
    }

    fn marks(self) -> (Mark, Mark) {
        match self {
            Step::ReqToRep => (Mark::Req, Mark::Rep),
            Step::RtuToEstablished => (Mark::Rtu, Mark::Established),
            Step::Setup => (Mark::Req, Mark::Established),
            Step::DreqToDrep => (Mark::Dreq, Mark::Drep),
            Step::Timewait => (Mark::Drep, Mark::TimewaitExit),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Mark {
    Req,
    Rep,
    Rtu,
    Established,
    Dreq,
    Drep,
    TimewaitExit,
    ServerTimewaitExit,
    /// The server's side heard of the end (its DREQ; a port flap's event).
    ServerTold,
}

const MARKS: usize = 9;

/// Per-connection timestamps (ns; 0 = not reached).
#[derive(Default)]
struct Times([AtomicU64; MARKS]);

impl Times {
    fn set(&self, m: Mark, ns: u64) {
        if let Some(a) = self.0.get(m as usize) {
            a.store(ns.max(1), Ordering::Relaxed);
        }
    }

    fn get(&self, m: Mark) -> u64 {
        self.0
            .get(m as usize)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }
}

/// Statistics of one step over the connections that completed it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepStats {
    /// The step.
    pub step: Step,
    /// Connections that completed it.
    pub count: usize,
    /// From the first start to the last end, ns.
    pub span_ns: u64,
    /// Shortest, ns.
    pub min_ns: u64,
    /// Median, ns.
    pub median_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// Longest, ns.
    pub max_ns: u64,
    /// The distribution, for a figure: (duration ns, fraction of the connections that
    /// took at most that) every half percent up to 99.5 %, then at 99.9 %, 99.99 % and
    /// the longest (where a slow minority shows), shortest first; empty if no connection
    /// completed the step. As many points whatever the connections.
    pub cdf: Vec<(u64, f64)>,
}

/// The quantiles of [`StepStats::cdf`].
fn cdf_quantiles() -> impl Iterator<Item = f64> {
    (0..200)
        .map(|k| f64::from(k) / 200.0)
        .chain([0.999, 0.9999, 1.0])
}

/// A count over a run, sampled at evenly spaced instants of the fabric's clock (as many
/// samples whatever the connections: a figure's line, in bounded memory).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Series {
    /// The fabric's clock at the first sample, ns.
    pub start_ns: u64,
    /// Between two samples, ns.
    pub interval_ns: u64,
    /// The count at each sample.
    pub counts: Vec<usize>,
}

impl Series {
    /// Each sample: (ns since the first, count).
    pub fn points(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        (0u64..)
            .zip(&self.counts)
            .map(|(k, &c)| (k.saturating_mul(self.interval_ns), c))
    }

    /// From the first sample to the last, ns.
    pub fn span_ns(&self) -> u64 {
        (self.counts.len().saturating_sub(1) as u64).saturating_mul(self.interval_ns)
    }
}

/// Intervals a [`Series`] divides its run into.
const SERIES_INTERVALS: u64 = 200;

/// How one side of one connection ended. Its errors are boxed: a run keeps an outcome per
/// connection per side (two million at 10^6), failures are rare, and an inline [`Error`]
/// made every outcome 56 bytes instead of 16.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Never started (this side never heard of the connection).
    Absent,
    /// Set up, torn down and out of timewait.
    Complete,
    /// Set up, but the teardown failed.
    TeardownFailed(Box<Error>),
    /// Setup failed.
    SetupFailed(Box<Error>),
}

impl Outcome {
    /// Whether this side got the connection established.
    pub fn established(&self) -> bool {
        matches!(self, Outcome::Complete | Outcome::TeardownFailed(_))
    }
}

/// Both sides of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The client's side.
    pub client: Outcome,
    /// The server's side.
    pub server: Outcome,
}

/// Progress, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// "connect" or "disconnect".
    pub phase: &'static str,
    /// Connections done in this phase.
    pub done: usize,
    /// Connections in this phase.
    pub total: usize,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Connections asked for.
    pub connections: usize,
    /// Established on both sides.
    pub established: usize,
    /// Failed on one side at least, by reason ("side: error").
    pub failures: BTreeMap<String, usize>,
    /// Wall time of the setup phase (every connect and accept done).
    pub setup_wall: Duration,
    /// Wall time of the teardown phase (every disconnect and timewait done).
    pub teardown_wall: Duration,
    /// CPU time this process spent in the setup phase, all threads (Linux only; 10 ms
    /// resolution).
    pub setup_cpu: Option<Duration>,
    /// Per-step statistics.
    pub steps: Vec<StepStats>,
    /// Per-connection outcomes, by connection index.
    pub outcomes: Vec<Connection>,
    /// Connections the server was handed by its listener (REQs that became requests).
    pub requests: usize,
    /// Requests whose private data named no connection of this run, or one already seen.
    pub unexpected_requests: usize,
    /// Waits that ran out and were cancelled (a stall: something never completed).
    pub stalls: usize,
    /// Each node's driver memory before the run, with every connection established, and
    /// after the teardown (when the pump can tell: the simulated fabric).
    pub driver_memory: Option<[Vec<DriverMemory>; 3]>,
    /// The most the server's driver held during the setup phase (sampled as the paced
    /// application takes requests; None without `accept_rate` or a pump that can tell).
    pub server_memory_peak: Option<DriverMemory>,
    /// From the first REQ to the last connection established on the server, ns of the
    /// fabric's clock.
    pub time_to_all_ns: u64,
    /// With [`Config::port_flap`] or [`Config::short_flap`]: what the flap did.
    pub flap: Option<FlapFigures>,
    /// Server sides established, from the first REQ to the last connection established.
    pub established_over_time: Series,
    /// Server sides up (established and not yet told of the end: the peer's DREQ, or the
    /// driver's event after a port flap), from the first REQ to the last side told.
    pub up_over_time: Series,
}

/// The teardown by port flap, as [`run`] saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlapFigures {
    /// Sides of connections told by their driver (2 per established connection when all
    /// went well).
    pub told: usize,
    /// From the ports going down until the last side was told, ns of the fabric's clock.
    pub told_all_ns: u64,
    /// MADs both drivers sent while the ports were down (nothing can leave a port that
    /// is down: 0).
    pub sent_while_down: u64,
    /// The deadline the drivers gave the connections, ns: (retry count + 1) x 4.096 us x
    /// 2^local ACK timeout of a connection's QP (its RTS attributes; IBA 9.7.6.1.3).
    pub deadline_ns: u64,
    /// How long the ports were down, ns of the fabric's clock.
    pub down_ns: u64,
    /// When the ports went down, ns of the fabric's clock.
    pub down_at_ns: u64,
}

impl Report {
    /// Connections set up per second of CPU time (all threads) in the setup phase.
    pub fn setup_rate_per_cpu(&self) -> Option<f64> {
        let s = self.setup_cpu?.as_secs_f64();
        (s > 0.0).then(|| self.established as f64 / s)
    }

    /// Connections set up per second of setup wall time.
    pub fn setup_rate(&self) -> f64 {
        let s = self.setup_wall.as_secs_f64();
        if s > 0.0 {
            self.established as f64 / s
        } else {
            0.0
        }
    }
}

/// State the server side shares with its tasks.
struct Server {
    outcomes: Mutex<Vec<Outcome>>,
    /// The endpoint of each connection being served, by index (8 bytes each; a hash map
    /// of a million cost four times as much).
    live: Mutex<Vec<Option<ConnectEndpoint>>>,
    /// The overlapped every connection's task completes: the tasks report through
    /// `outcomes` and the counters, never their overlapped, so one serves all (a fresh
    /// one each cost every live connection 88 bytes and an allocation).
    tasks: Overlapped,
    spawned: AtomicUsize,
    accepted: AtomicUsize,
    finished: AtomicUsize,
    requests: AtomicUsize,
    unexpected: AtomicUsize,
}

/// What the client's driving threads and the server's tasks share.
struct Shared {
    cfg: Config,
    clock: ClockFn,
    times: Vec<Times>,
    server: Server,
    client_setup: Mutex<Vec<Outcome>>,
}

impl Shared {
    fn mark(&self, i: usize, m: Mark) {
        if let Some(t) = self.times.get(i) {
            t.set(m, (self.clock)());
        }
    }
}

pub(crate) fn describe(side: &str, e: &Error) -> String {
    let mut s = format!("{side} {}: {}", e.operation, ibcm::status_name(e.status));
    match &e.detail {
        Detail::None => {}
        Detail::Rejected { reason, .. } => s.push_str(&format!(" (rejected: {reason:?})")),
        Detail::Timeout { message } => s.push_str(&format!(" (no answer to the {message:?})")),
    }
    s
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The client's QPN for connection `i` (the server's is `SERVER_QPN + i`).
pub(crate) fn client_qpn(i: usize) -> u32 {
    0x100 + i as u32
}

const SERVER_QPN: u32 = 0x10_0000;

/// Runs cmtime: the server listens on `server`, the client connects from `client` (they
/// may be the same provider); `pump` is how the client's threads wait. `progress` is
/// called as connections finish each phase.
pub fn run(
    client: &Provider,
    server: &Provider,
    pump: &dyn Pump,
    cfg: &Config,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<Report> {
    let mut cfg = *cfg;
    cfg.window = cfg.window.max(1);
    cfg.threads = if pump.is_virtual() {
        1
    } else {
        cfg.threads.clamp(1, 64)
    };
    let n = cfg.connections;
    let sh = Arc::new(Shared {
        cfg,
        clock: pump.clock(),
        times: (0..n).map(|_| Times::default()).collect(),
        server: Server {
            outcomes: Mutex::new(vec![Outcome::Absent; n]),
            live: Mutex::new(vec![None; n]),
            tasks: Overlapped::new(),
            spawned: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            unexpected: AtomicUsize::new(0),
        },
        client_setup: Mutex::new(vec![Outcome::Absent; n]),
    });
    let listener = Arc::new(listen(server, &sh.cfg)?);
    let acceptor = Overlapped::new();
    let pacer = cfg
        .accept_rate
        .map(|r| Mutex::new(Pacer::new(Arc::clone(&sh), Arc::clone(&listener), r)));
    if pacer.is_none() {
        let (sh, l) = (Arc::clone(&sh), Arc::clone(&listener));
        spawn(
            async move {
                loop {
                    match l.get_request_async().await {
                        Ok(req) => serve(&sh, req),
                        Err(e) => return e,
                    }
                }
            },
            &acceptor,
        );
    }
    let stall = stall_limit(&cfg);
    let mut stalls = 0usize;

    let memory_before = pump.driver_memory();

    // Setup: every connect (REQ -> REP, RTU) and every accept (-> RTU).
    let wall = std::time::Instant::now();
    let cpu = process_cpu();
    let done = AtomicUsize::new(0);
    let shares: Vec<Vec<usize>> = (0..cfg.threads)
        .map(|t| (t..n).step_by(cfg.threads).collect())
        .collect();
    let results: Vec<Share<ConnectEndpoint>> = std::thread::scope(|s| {
        let handles: Vec<_> = shares
            .into_iter()
            .map(|ids| {
                let (sh, done) = (&sh, &done);
                let pacer = pacer.as_ref();
                s.spawn(move || setup_share(client, pump, sh, ids, done, progress, pacer))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut live: Vec<(usize, ConnectEndpoint)> = Vec::new();
    for share in results {
        stalls += share.stalls;
        live.extend(share.items);
    }
    live.sort_by_key(|(i, _)| *i);
    stalls += wait_until(
        pump,
        stall,
        || sh.server.accepted.load(Ordering::Acquire) >= sh.server.spawned.load(Ordering::Acquire),
        || cancel_server(&sh),
    );
    let server_memory_peak = pacer.as_ref().and_then(|p| lock(p).stop());
    let setup_wall = wall.elapsed();
    let setup_cpu = cpu.zip(process_cpu()).map(|(a, b)| b.saturating_sub(a));
    let memory_established = pump.driver_memory();

    // A flap: every port goes down; a long one stays down until every side was told (past
    // the deadline), a short one for half the deadline. Then the ports come back.
    let deadline_ns = live
        .first()
        .and_then(|(_, ep)| ep.qp_attributes(ibcm::QpState::Rts).ok())
        .map_or(0, |a| qp_deadline_ns(a.timeout, a.retry_count));
    let mut flap = None;
    if cfg.port_flap || cfg.short_flap {
        if cfg.port_flap {
            for (i, _) in &live {
                sh.mark(*i, Mark::Dreq);
            }
        }
        let sent_at_flap = sent_total(client)? + sent_total(server)?;
        if !pump.set_ports_up(false) {
            return Err(Error::new("port flap", status::INVALID_DEVICE_REQUEST));
        }
        let down_at = pump.now_ns();
        let hold = if cfg.port_flap {
            // Each side's deadline counts from its own QP attributes; the server's side is
            // seen told, the client's driver has queued its event by the same deadline.
            deadline_ns.saturating_add(deadline_ns / 8)
        } else {
            deadline_ns / 2
        };
        let expect = if cfg.port_flap { live.len() } else { 0 };
        let limit = stall + Duration::from_nanos(hold);
        stalls += wait_until(
            pump,
            limit,
            || pump.now_ns().saturating_sub(down_at) >= hold && server_told(&sh.times) >= expect,
            || {},
        );
        let sent_while_down =
            (sent_total(client)? + sent_total(server)?).saturating_sub(sent_at_flap);
        let down_ns = pump.now_ns().saturating_sub(down_at);
        if !pump.set_ports_up(true) {
            return Err(Error::new("port flap", status::INVALID_DEVICE_REQUEST));
        }
        flap = Some(FlapFigures {
            told: 0,
            told_all_ns: 0,
            sent_while_down,
            deadline_ns,
            down_ns,
            down_at_ns: down_at,
        });
    }

    // Teardown: every disconnect (DREQ -> DREP) and timewait, on both sides; or, after
    // a long flap, each side answers what its driver told it and waits out timewait.
    let wall = std::time::Instant::now();
    let done = AtomicUsize::new(0);
    let total = live.len();
    let mut shares: Vec<Vec<(usize, ConnectEndpoint)>> = vec![Vec::new(); cfg.threads];
    for (k, item) in live.into_iter().enumerate() {
        if let Some(s) = shares.get_mut(k % cfg.threads) {
            s.push(item);
        }
    }
    let results: Vec<Share<Ended>> = std::thread::scope(|s| {
        let handles: Vec<_> = shares
            .into_iter()
            .map(|list| {
                let (sh, done) = (&sh, &done);
                s.spawn(move || teardown_share(pump, sh, list, total, stall, done, progress))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut client_teardown: Vec<Option<Ended>> = vec![None; n];
    for share in results {
        stalls += share.stalls;
        for (i, r) in share.items {
            if let Some(slot) = client_teardown.get_mut(i) {
                *slot = Some(r);
            }
        }
    }
    stalls += wait_until(
        pump,
        stall,
        || sh.server.finished.load(Ordering::Acquire) >= sh.server.spawned.load(Ordering::Acquire),
        || cancel_server(&sh),
    );
    let teardown_wall = wall.elapsed();
    let memory_after = pump.driver_memory();
    let flap = flap.map(|f| {
        if cfg.port_flap {
            flap_figures(&sh.times, f)
        } else {
            f
        }
    });

    // The listener goes: its acceptor ends with STATUS_CANCELLED.
    listener.cancel();
    let acceptor_done = || match &pacer {
        Some(p) => lock(p).current.as_ref().is_none_or(Overlapped::is_done),
        None => acceptor.is_done(),
    };
    stalls += wait_until(pump, Duration::from_secs(5), acceptor_done, || {});
    drop(listener);

    let server_outcomes = std::mem::take(&mut *lock(&sh.server.outcomes));
    let client_setup = std::mem::take(&mut *lock(&sh.client_setup));
    let mut outcomes = Vec::with_capacity(n);
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    let mut established = 0;
    for (i, (c, s)) in client_setup.into_iter().zip(server_outcomes).enumerate() {
        let c = match (c, client_teardown.get_mut(i).and_then(Option::take)) {
            (Outcome::Complete, Some(Err(e))) => Outcome::TeardownFailed(e),
            (Outcome::Complete, None) => {
                Outcome::TeardownFailed(Box::new(Error::new("disconnect", status::CANCELLED)))
            }
            (other, _) => other,
        };
        if c.established() && s.established() {
            established += 1;
        }
        for (side, o) in [("client", &c), ("server", &s)] {
            let reason = match o {
                Outcome::SetupFailed(e) | Outcome::TeardownFailed(e) => describe(side, e),
                Outcome::Absent => format!("{side}: never saw the connection"),
                Outcome::Complete => continue,
            };
            *failures.entry(reason).or_default() += 1;
        }
        outcomes.push(Connection {
            client: c,
            server: s,
        });
    }
    let steps = Step::ALL
        .iter()
        .map(|&step| step_stats(&sh.times, step))
        .collect();
    let (established_over_time, up_over_time) = over_time(&sh.times);
    Ok(Report {
        connections: n,
        established,
        failures,
        setup_wall,
        teardown_wall,
        setup_cpu,
        steps,
        outcomes,
        requests: sh.server.requests.load(Ordering::Acquire),
        unexpected_requests: sh.server.unexpected.load(Ordering::Acquire),
        stalls,
        driver_memory: memory_before
            .zip(memory_established)
            .zip(memory_after)
            .map(|((b, e), a)| [b, e, a]),
        server_memory_peak,
        time_to_all_ns: time_to_all(&sh.times),
        flap,
        established_over_time,
        up_over_time,
    })
}

/// The server sides established, and up (established, not yet told of the end), over
/// the run: from the first REQ to the last connection established, and to the last side
/// told.
fn over_time(times: &[Times]) -> (Series, Series) {
    let marks = |m: Mark| times.iter().map(move |t| t.get(m)).filter(|&t| t != 0);
    let Some(start) = marks(Mark::Req).min() else {
        return (Series::default(), Series::default());
    };
    let last_established = marks(Mark::Established).max().unwrap_or(start);
    let last_told = marks(Mark::ServerTold).max().unwrap_or(start);
    let series = |end: u64, count: &dyn Fn(u64) -> Vec<usize>| {
        let interval_ns = end.saturating_sub(start).div_ceil(SERIES_INTERVALS).max(1);
        Series {
            start_ns: start,
            interval_ns,
            counts: count(interval_ns),
        }
    };
    let established = series(last_established, &|interval| {
        cumulative(marks(Mark::Established), start, interval)
    });
    let up = series(last_established.max(last_told), &|interval| {
        let told = cumulative(marks(Mark::ServerTold), start, interval);
        cumulative(marks(Mark::Established), start, interval)
            .into_iter()
            .zip(told)
            .map(|(e, t)| e.saturating_sub(t))
            .collect()
    });
    (established, up)
}

/// How many of `marks` had happened by each of the [`SERIES_INTERVALS`] + 1 instants
/// `start + k * interval` (one pass, and memory for the samples only).
fn cumulative(marks: impl Iterator<Item = u64>, start: u64, interval: u64) -> Vec<usize> {
    let mut counts = vec![0usize; SERIES_INTERVALS as usize + 1];
    for t in marks {
        // Sample k counts the marks in (start + (k-1) interval, start + k interval].
        let k = t
            .saturating_sub(start)
            .div_ceil(interval)
            .min(SERIES_INTERVALS) as usize;
        if let Some(c) = counts.get_mut(k) {
            *c += 1;
        }
    }
    let mut sum = 0;
    for c in &mut counts {
        sum += *c;
        *c = sum;
    }
    counts
}

/// MADs a driver has sent, all attributes.
fn sent_total(p: &Provider) -> Result<u64> {
    Ok(p.counters()?.sent.iter().sum())
}

/// Who was told of the flap: the sides that saw their driver's event (client: marked when
/// its notification completed; server: when its driver told it), and when the last server
/// side was told, from the ports going down (marked as every connection's DREQ). The
/// clients' events wait in their drivers until the ports are back.
fn flap_figures(times: &[Times], f: FlapFigures) -> FlapFigures {
    let down = times
        .iter()
        .map(|t| t.get(Mark::Dreq))
        .filter(|&t| t != 0)
        .min()
        .unwrap_or(0);
    let told = times
        .iter()
        .flat_map(|t| [t.get(Mark::Drep), t.get(Mark::ServerTold)])
        .filter(|&t| t != 0)
        .count();
    let last_server = times
        .iter()
        .map(|t| t.get(Mark::ServerTold))
        .max()
        .unwrap_or(0);
    FlapFigures {
        told,
        told_all_ns: last_server.saturating_sub(down),
        ..f
    }
}

/// Server sides told by their driver so far.
fn server_told(times: &[Times]) -> usize {
    times
        .iter()
        .filter(|t| t.get(Mark::ServerTold) != 0)
        .count()
}

/// When an RC QP with this local ACK timeout and retry count gives up: (retry count + 1)
/// x 4.096 us x 2^timeout (IBA 9.7.6.1.3), as the driver's deadline (link.rs).
fn qp_deadline_ns(timeout: Option<u8>, retry_count: Option<u8>) -> u64 {
    let per_try = 4096u64 << timeout.unwrap_or(0).clamp(1, 31);
    (u64::from(retry_count.unwrap_or(0).min(7)) + 1) * per_try
}

/// A port flap and the reconnect after it ([`port_flap`]).
#[derive(Debug, Clone)]
pub struct FlapReport {
    /// The first run, the ordinary way: N set up on a fabric that never flapped (its
    /// time to all is the ideal the reconnect is held to) and torn down; the drivers'
    /// memory after it is the baseline (their tables at their working size).
    pub warm: Report,
    /// N set up again, a short flap (half the deadline: nothing may end), then an
    /// ordinary teardown.
    pub short: Report,
    /// N set up again, then torn down by the ports going down for longer than the
    /// deadline ([`Report::flap`]).
    pub flap: Report,
    /// The reconnect, once the ports are back: the same N set up again (and torn down the
    /// ordinary way).
    pub reconnect: Report,
    /// Re-sent MADs during the reconnect (both nodes, every attribute), and REQ re-sends
    /// among them.
    pub reconnect_retries: (u64, u64),
    /// The same during the first run (the reference: what the fabric's faults cost a
    /// fabric that never flapped).
    pub warm_retries: (u64, u64),
}

impl FlapReport {
    /// The reconnect's time to all against the ideal (the first setup of the same N on
    /// the same fabric): 1.0 means the flap left nothing behind that slows it.
    pub fn reconnect_ratio(&self) -> f64 {
        let ideal = self.warm.time_to_all_ns;
        if ideal == 0 {
            return 0.0;
        }
        self.reconnect.time_to_all_ns as f64 / ideal as f64
    }
}

/// A port flap at N live connections: after a first run the ordinary way (the baseline
/// and the ideal), N are set up and the ports flap for half their deadline (nothing may
/// end: an ordinary teardown follows), then N are set up again and the ports go down for
/// longer than the deadline (each side of each connection must be told once by its
/// driver, answer, and wait out timewait once the ports are back: the drivers then hold
/// what they held before), and all N reconnect, timed against the first setup. `pump` must be able to take the
/// ports down ([`Pump::set_ports_up`]: the simulated fabric).
pub fn port_flap(
    client: &Provider,
    server: &Provider,
    pump: &dyn Pump,
    cfg: &Config,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<FlapReport> {
    let retries = |p: &Provider, slot: Option<usize>| -> Result<u64> {
        let c = p.counters()?;
        Ok(match slot {
            Some(s) => c.retries.get(s).copied().unwrap_or(0),
            None => c.retries.iter().sum(),
        })
    };
    // IBA Table 103's attribute IDs from 0x10: the counters' slots.
    let req = Some(usize::from(u16::from(ibcm_mad::AttributeId::Req) - 0x10));
    let count = || -> Result<(u64, u64)> {
        Ok((
            retries(client, None)? + retries(server, None)?,
            retries(client, req)?,
        ))
    };
    let since = |a: (u64, u64), b: (u64, u64)| (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1));
    let up = Config {
        port_flap: false,
        short_flap: false,
        ..*cfg
    };
    let start = count()?;
    let warm = run(client, server, pump, &up, progress)?;
    let warm_retries = since(start, count()?);
    let short = run(
        client,
        server,
        pump,
        &Config {
            short_flap: true,
            ..up
        },
        progress,
    )?;
    let down = Config {
        port_flap: true,
        ..up
    };
    let flap = run(client, server, pump, &down, progress)?;
    if !pump.set_ports_up(true) {
        return Err(Error::new("port flap", status::INVALID_DEVICE_REQUEST));
    }
    let before = count()?;
    let reconnect = run(client, server, pump, &up, progress)?;
    let reconnect_retries = since(before, count()?);
    Ok(FlapReport {
        warm,
        short,
        flap,
        reconnect,
        reconnect_retries,
        warm_retries,
    })
}

/// How long nothing may complete before what is pending counts as stalled: nothing
/// legitimately stays pending longer than a request's whole retry budget (a step may
/// need two: a lost REP is re-sent only after the REQ's retries ask for it).
pub(crate) fn stall_limit(cfg: &Config) -> Duration {
    cfg.timing.request_lifetime() * 2 + Duration::from_secs(5)
}

/// From the first REQ to the last connection established on the server, ns.
fn time_to_all(times: &[Times]) -> u64 {
    let first = times
        .iter()
        .map(|t| t.get(Mark::Req))
        .filter(|&t| t != 0)
        .min();
    let last = times.iter().map(|t| t.get(Mark::Established)).max();
    first
        .zip(last)
        .map_or(0, |(first, last)| last.saturating_sub(first))
}

/// The server application modelled at a set accept rate: it takes one request, and the
/// next no sooner than 1/R after the last one arrived. Whoever waits for completions
/// ticks it (in virtual time the one thread), and waits no longer than its next turn.
struct Pacer {
    sh: Arc<Shared>,
    listener: Arc<ibcm::Listener>,
    interval_ns: u64,
    /// The take in progress: done once a request came and was served.
    current: Option<Overlapped>,
    /// When the last request was taken (ns of the fabric's clock), shared with its task.
    last_take: Arc<AtomicU64>,
    /// Requests taken so far.
    taken: usize,
    peak: Option<DriverMemory>,
    stopped: bool,
}

/// Driver memory samples in a run, whatever its connections, besides one at the first
/// take (when a storm's burst has arrived and is held: the usual peak). A sample walks
/// every endpoint of the dispatch layer, O(N) with N connections and a cache miss each
/// once the tables outgrow the caches, so the sampling costs each connection as many
/// entry visits as there are samples: a fixed count keeps that the same at every N (a
/// floor of one every 512 takes, capped at 256 samples, gave 20 samples at 10^4 and 256
/// from 1.3 x 10^5 on: 9% of a 10^5 storm's CPU against 2% at 10^4; 64 samples still
/// cost 4% at 10^5).
const MEMORY_SAMPLES: usize = 16;

impl Pacer {
    fn new(sh: Arc<Shared>, listener: Arc<ibcm::Listener>, rate: u32) -> Self {
        Self {
            sh,
            listener,
            interval_ns: 1_000_000_000 / u64::from(rate.max(1)),
            current: None,
            last_take: Arc::new(AtomicU64::new(0)),
            taken: 0,
            peak: None,
            stopped: false,
        }
    }

    /// Takes the next request if it is time; returns how long until its next turn.
    fn tick(&mut self, pump: &dyn Pump) -> Duration {
        if self.stopped {
            return Duration::MAX;
        }
        // A take waits for a request: look again after one interval (its completion
        // wakes no one; waiting for the next MAD of the client's could make the
        // application late, and every later take with it).
        let poll = Duration::from_nanos(self.interval_ns);
        if self.current.as_ref().is_some_and(|o| !o.is_done()) {
            return poll;
        }
        if self.current.take().is_some() {
            self.taken += 1;
            let every = self.sh.cfg.connections.div_ceil(MEMORY_SAMPLES).max(1);
            if (self.taken == 1 || self.taken.is_multiple_of(every))
                && let Some(m) = pump.driver_memory().and_then(|m| m.get(1).copied())
            {
                self.peak = Some(match self.peak {
                    Some(p) if p.total() >= m.total() => p,
                    _ => m,
                });
            }
        }
        let now = pump.now_ns();
        let last = self.last_take.load(Ordering::Acquire);
        let next = if last == 0 {
            now
        } else {
            last + self.interval_ns
        };
        if now < next {
            return Duration::from_nanos(next - now);
        }
        let (sh, l, last_take) = (
            Arc::clone(&self.sh),
            Arc::clone(&self.listener),
            Arc::clone(&self.last_take),
        );
        let o = Overlapped::new();
        spawn(
            async move {
                if let Ok(req) = l.get_request_async().await {
                    last_take.store((sh.clock)().max(1), Ordering::Release);
                    serve(&sh, req);
                }
            },
            &o,
        );
        self.current = Some(o);
        poll
    }

    /// Ends the taking (the listener's cancel ends a take in progress); returns the
    /// peak memory seen.
    fn stop(&mut self) -> Option<DriverMemory> {
        self.stopped = true;
        self.peak
    }
}

/// Ticks the pacer, if any; the longest to wait for a completion meanwhile.
fn pace(pacer: Option<&Mutex<Pacer>>, pump: &dyn Pump, wait: Duration) -> Duration {
    pacer.map_or(wait, |p| lock(p).tick(pump).min(wait))
}

/// What one client thread got back.
/// How a connection's teardown ended, its rare error boxed (a run keeps one per
/// connection until the report: 16 bytes with its index, not 64).
type Ended = std::result::Result<(), Box<Error>>;

struct Share<T> {
    items: Vec<(usize, T)>,
    stalls: usize,
}

impl<T> Default for Share<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            stalls: 0,
        }
    }
}

/// The connection index a REQ's private data names.
pub(crate) fn index_of(private_data: &[u8]) -> Option<usize> {
    let b: [u8; 4] = private_data.get(..4)?.try_into().ok()?;
    Some(u32::from_le_bytes(b) as usize)
}

/// A REQ reached the server: serve it ([`serve_connection`]), or refuse one it did not
/// expect.
fn serve(sh: &Arc<Shared>, req: ConnectionRequest) {
    sh.server.requests.fetch_add(1, Ordering::AcqRel);
    let n = sh.cfg.connections;
    let idx = index_of(&req.private_data).filter(|&i| i < n);
    let fresh = idx.is_some_and(|i| {
        let mut live = lock(&sh.server.live);
        let seen = lock(&sh.server.outcomes)
            .get(i)
            .is_some_and(|o| *o != Outcome::Absent);
        match live.get_mut(i) {
            Some(slot @ None) if !seen => {
                *slot = Some(req.endpoint.clone());
                true
            }
            _ => false,
        }
    });
    // This runs on the thread that completes the provider's requests (the acceptor is a
    // spawned operation): every step is a future; a blocking call here would fail.
    let Some(i) = idx.filter(|_| fresh) else {
        sh.server.unexpected.fetch_add(1, Ordering::AcqRel);
        spawn(
            req.endpoint
                .reject_async(ibcm::RejReason::ConsumerDefined, b"unexpected"),
            &Overlapped::new(),
        );
        return;
    };
    sh.server.spawned.fetch_add(1, Ordering::AcqRel);
    spawn(
        serve_connection(Arc::clone(sh), req.endpoint, i),
        &sh.server.tasks,
    );
}

/// Connection `i` on the server, as one task that lives as long as the connection: accept
/// it, then wait for the DREQ, answer it, wait out timewait.
///
/// What every live connection holds is this task's future, so it is kept small: each
/// step's future is made inside it, not captured (one awaited from a capture is held
/// twice, rust-lang/rust#62958); the steps are in one block, not nested async blocks
/// (which hold references to the captures beside them); the setup's steps and the
/// disconnect (288, 112 and 1456 bytes) are boxed, for as long as each runs.
async fn serve_connection(sh: Arc<Shared>, ep: ConnectEndpoint, i: usize) {
    let outcome = 'connection: {
        // Made in a statement of its own: the parameters, a temporary, would otherwise
        // live as long as the match, across its awaits.
        let prepare = Box::pin(ep.prepare_accept_async(&accept_params(i)));
        // `if let`, not `match`: its scrutinee (the QP's transitions, 500 bytes) is
        // dropped before the `else` block's await.
        let setup = if let Err(e) = prepare.await {
            Err(e)
        } else {
            Box::pin(ep.accept_async()).await
        };
        sh.server.accepted.fetch_add(1, Ordering::AcqRel);
        // Consumed whole (`err()`): an `Ok` left in place would be kept across every
        // await to come.
        if let Some(e) = setup.err() {
            break 'connection Outcome::SetupFailed(Box::new(e));
        }
        sh.mark(i, Mark::Established);
        let failed = |e: Error| Outcome::TeardownFailed(Box::new(e));
        if let Err(e) = ep.notify_disconnect_async().await {
            break 'connection failed(e);
        }
        sh.mark(i, Mark::ServerTold);
        if let Err(e) = Box::pin(ep.disconnect_async(&[])).await {
            break 'connection failed(e);
        }
        match ep.wait_timewait_async().await {
            Ok(()) => {
                sh.mark(i, Mark::ServerTimewaitExit);
                Outcome::Complete
            }
            Err(e) => failed(e),
        }
    };
    if let Some(slot) = lock(&sh.server.outcomes).get_mut(i) {
        *slot = outcome;
    }
    forget_live(&sh, i);
    // Dropped once out of the server's list (the last reference's drop destroys the
    // endpoint, which is not done under that list's lock), and before the task counts
    // as finished.
    drop(ep);
    sh.server.finished.fetch_add(1, Ordering::AcqRel);
}

/// The server's listen: exactly the service ID, on any port, with the run's backlog.
pub(crate) fn listen(server: &Provider, cfg: &Config) -> Result<ibcm::Listener> {
    server.listen(&ListenParams {
        service_id: cfg.service_id,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: cfg.backlog,
    })
}

/// The server's answer to connection `i`'s REQ.
pub(crate) fn accept_params(i: usize) -> AcceptParams<'static> {
    AcceptParams {
        qpn: SERVER_QPN + i as u32,
        starting_psn: None,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        failover_accepted: Failover::NotSupported,
        flow_control: true,
        srq: false,
        private_data: &[],
    }
}

/// The client's REQ for connection `i` (from QPN [`client_qpn`]), its index as private
/// data.
pub(crate) fn connect_params<'a>(
    cfg: &Config,
    i: usize,
    index: &'a [u8; 4],
) -> ibcm::ConnectParams<'a> {
    let mut params = ibcm::example_connect_params(cfg.service_id, client_qpn(i), 0, 1);
    params.primary_path.slid = cfg.client.lid;
    params.primary_path.sgid = cfg.client.gid;
    params.primary_path.dlid = cfg.server.lid;
    params.primary_path.dgid = cfg.server.gid;
    params.primary_path.packet_life_time = cfg.timing.packet_life_time;
    params.remote_cm_response_timeout = cfg.timing.cm_response_timeout;
    params.local_cm_response_timeout = cfg.timing.cm_response_timeout;
    params.max_cm_retries = cfg.timing.max_cm_retries;
    params.private_data = index;
    params
}

/// Connection `i` is no longer served.
fn forget_live(sh: &Shared, i: usize) {
    if let Some(slot) = lock(&sh.server.live).get_mut(i) {
        *slot = None;
    }
}

fn cancel_server(sh: &Shared) {
    let eps: Vec<ConnectEndpoint> = lock(&sh.server.live).iter().flatten().cloned().collect();
    for ep in eps {
        ep.cancel();
    }
}

/// Waits (stepping a virtual fabric) until `done()`, for at most `limit` without it; on
/// a stall calls `on_stall` and gives what it cancelled a moment to finish. Returns 1 if
/// it stalled.
pub(crate) fn wait_until(
    pump: &dyn Pump,
    limit: Duration,
    done: impl Fn() -> bool,
    on_stall: impl Fn(),
) -> usize {
    let port = CompletionPort::new();
    let start = pump.now_ns();
    let limit_ns = limit.as_nanos() as u64;
    let slice = Duration::from_millis(2);
    while !done() {
        let idle = matches!(pump.next_packet(&port, slice), Waited::Idle);
        if done() {
            return 0;
        }
        if idle || pump.now_ns().saturating_sub(start) > limit_ns {
            on_stall();
            let again = pump.now_ns();
            while !done() && pump.now_ns().saturating_sub(again) < 1_000_000_000 {
                if matches!(pump.next_packet(&port, slice), Waited::Idle) {
                    break;
                }
            }
            return 1;
        }
    }
    0
}

/// Drives the in-flight window of one client thread: starts operations (`start`) and
/// collects their completions until every one finished; on a stall cancels what is in
/// flight (`cancel`), and after a second one gives those up. Out of line, so that a
/// profile shows each phase (`valgrind --toggle-collect`) apart.
#[inline(never)]
fn drive<T: Send + 'static>(
    pump: &dyn Pump,
    window: usize,
    stall: Duration,
    mut start: impl FnMut(&CompletionPort) -> Option<Option<(usize, ConnectEndpoint)>>,
    mut finish: impl FnMut(usize, Result<T>, Option<ConnectEndpoint>),
    pacer: Option<&Mutex<Pacer>>,
) -> usize {
    let port = CompletionPort::new();
    let mut inflight: HashMap<usize, ConnectEndpoint> = HashMap::new();
    let mut exhausted = false;
    let mut last = pump.now_ns();
    let stall_ns = stall.as_nanos() as u64;
    let mut stalls = 0;
    loop {
        while !exhausted && inflight.len() < window {
            match start(&port) {
                None => exhausted = true,
                Some(None) => {}
                Some(Some((i, ep))) => {
                    inflight.insert(i, ep);
                }
            }
        }
        if inflight.is_empty() {
            return stalls;
        }
        let wait = pace(pacer, pump, Duration::from_millis(20));
        match pump.next_packet(&port, wait) {
            Waited::Packet(p) => {
                let i = p.key;
                let ep = inflight.remove(&i);
                let r = p
                    .overlapped
                    .result::<Result<T>>()
                    .unwrap_or_else(|| Err(Error::new("cmtime", status::INVALID_PARAMETER)));
                finish(i, r, ep);
                last = pump.now_ns();
            }
            w => {
                let idle = matches!(w, Waited::Idle);
                if idle || pump.now_ns().saturating_sub(last) > stall_ns {
                    stalls += 1;
                    if stalls > 2 {
                        for (i, ep) in inflight.drain() {
                            finish(i, Err(Error::new("cmtime", status::CANCELLED)), Some(ep));
                        }
                        return stalls;
                    }
                    for ep in inflight.values() {
                        ep.cancel();
                    }
                    last = pump.now_ns();
                }
            }
        }
    }
}

fn setup_share(
    client: &Provider,
    pump: &dyn Pump,
    sh: &Arc<Shared>,
    ids: Vec<usize>,
    done: &AtomicUsize,
    progress: &(dyn Fn(Progress) + Sync),
    pacer: Option<&Mutex<Pacer>>,
) -> Share<ConnectEndpoint> {
    let cfg = sh.cfg;
    let stall = stall_limit(&cfg);
    let n = cfg.connections;
    let window = (cfg.window / cfg.threads).max(1);
    let mut ids = ids.into_iter();
    let mut out = Share::default();
    let record = |i: usize, o: Outcome| {
        if let Some(slot) = lock(&sh.client_setup).get_mut(i) {
            *slot = o;
        }
        let d = done.fetch_add(1, Ordering::AcqRel) + 1;
        progress(Progress {
            phase: "connect",
            done: d,
            total: n,
        });
    };
    out.stalls = drive::<()>(
        pump,
        window,
        stall,
        |port| {
            let i = ids.next()?;
            let ep = match client.connect_endpoint() {
                Ok(ep) => ep,
                Err(e) => {
                    record(i, Outcome::SetupFailed(Box::new(e)));
                    return Some(None);
                }
            };
            let index = (i as u32).to_le_bytes();
            let params = connect_params(&cfg, i, &index);
            let (sh2, ep2) = (Arc::clone(sh), ep.clone());
            sh.mark(i, Mark::Req);
            // Inline steps: this task ends with the setup (the server's tasks, which live
            // as long as their connections, box theirs).
            let connect = ep.connect_async(&params);
            spawn(
                async move {
                    connect.await?;
                    sh2.mark(i, Mark::Rep);
                    sh2.mark(i, Mark::Rtu);
                    ep2.rtu_async(&[]).await
                },
                &Overlapped::with_port(port, i),
            );
            Some(Some((i, ep)))
        },
        |i, r: Result<()>, ep| match r {
            Ok(()) => {
                if let Some(ep) = ep {
                    out.items.push((i, ep));
                }
                record(i, Outcome::Complete);
            }
            Err(e) => record(i, Outcome::SetupFailed(Box::new(e))),
        },
        pacer,
    );
    out
}

fn teardown_share(
    pump: &dyn Pump,
    sh: &Arc<Shared>,
    list: Vec<(usize, ConnectEndpoint)>,
    total: usize,
    stall: Duration,
    done: &AtomicUsize,
    progress: &(dyn Fn(Progress) + Sync),
) -> Share<Ended> {
    // A flap tells every connection at once: all wait for their event together.
    let window = if sh.cfg.port_flap {
        list.len().max(1)
    } else {
        (sh.cfg.window / sh.cfg.threads).max(1)
    };
    let flap = sh.cfg.port_flap;
    let mut list = list.into_iter();
    let mut out = Share::default();
    let report = |d: usize| {
        progress(Progress {
            phase: "disconnect",
            done: d,
            total,
        })
    };
    // Disconnects are windowed; the timewaits that follow are not (they only wait), so
    // they go on a port of their own.
    let timewaits = CompletionPort::new();
    // Connections in timewait, by index (a vector: 8 bytes a connection).
    let mut waiting: Vec<Option<ConnectEndpoint>> = vec![None; sh.times.len()];
    let mut in_timewait = 0usize;
    let mut failed: Vec<(usize, Ended)> = Vec::new();
    out.stalls = drive::<()>(
        pump,
        window,
        stall,
        |port| {
            let (i, ep) = list.next()?;
            let sh2 = Arc::clone(sh);
            if flap {
                // Told by the driver (Drep: when), then answered.
                let (told, ep2) = (ep.notify_disconnect_async(), ep.clone());
                spawn(
                    async move {
                        told.await?;
                        sh2.mark(i, Mark::Drep);
                        ep2.disconnect_async(&[]).await
                    },
                    &Overlapped::with_port(port, i),
                );
                return Some(Some((i, ep)));
            }
            sh.mark(i, Mark::Dreq);
            // Boxed: an async block holds a future it awaits twice (rust-lang/rust#62958),
            // and a storm has every disconnect in flight at once (1.4 KB each, not 2.9).
            let disconnect = Box::pin(ep.disconnect_async(&[]));
            spawn(
                async move {
                    disconnect.await?;
                    sh2.mark(i, Mark::Drep);
                    Ok::<(), Error>(())
                },
                &Overlapped::with_port(port, i),
            );
            Some(Some((i, ep)))
        },
        |i, r, ep| match (r, ep) {
            (Ok(()), Some(ep)) => {
                let (sh2, ep2) = (Arc::clone(sh), ep.clone());
                spawn(
                    // The wait made inside: one awaited from a capture is held twice
                    // (rust-lang/rust#62958), and every connection waits out timewait
                    // at once.
                    async move {
                        ep2.wait_timewait_async().await?;
                        sh2.mark(i, Mark::TimewaitExit);
                        Ok::<(), Error>(())
                    },
                    &Overlapped::with_port(&timewaits, i),
                );
                // Counted once per index: a repeated one would never count down to 0.
                if let Some(slot) = waiting.get_mut(i)
                    && slot.replace(ep).is_none()
                {
                    in_timewait += 1;
                }
            }
            (r, _) => {
                failed.push((i, r.map_err(Box::new)));
                report(done.fetch_add(1, Ordering::AcqRel) + 1);
            }
        },
        None,
    );
    out.items.extend(failed);
    // Collect the timewaits, bounded like everything else.
    let stall_ns = stall.as_nanos() as u64;
    let mut last = pump.now_ns();
    let mut stalls = 0;
    while in_timewait > 0 {
        match pump.next_packet(&timewaits, Duration::from_millis(20)) {
            Waited::Packet(p) => {
                let i = p.key;
                if waiting.get_mut(i).and_then(Option::take).is_some() {
                    in_timewait -= 1;
                }
                let r = p
                    .overlapped
                    .result::<Result<()>>()
                    .unwrap_or_else(|| Err(Error::new("cmtime", status::INVALID_PARAMETER)));
                out.items.push((i, r.map_err(Box::new)));
                report(done.fetch_add(1, Ordering::AcqRel) + 1);
                last = pump.now_ns();
            }
            w => {
                if matches!(w, Waited::Idle) || pump.now_ns().saturating_sub(last) > stall_ns {
                    stalls += 1;
                    if stalls > 2 {
                        for (i, slot) in waiting.iter_mut().enumerate() {
                            if slot.take().is_some() {
                                let e = Error::new("wait timewait", status::CANCELLED);
                                out.items.push((i, Err(Box::new(e))));
                            }
                        }
                        break;
                    }
                    for ep in waiting.iter().flatten() {
                        ep.cancel();
                    }
                    last = pump.now_ns();
                }
            }
        }
    }
    out.stalls += stalls;
    out
}

/// A step's durations in an HDR histogram (3 significant digits: 0.1% resolution at any
/// scale, a few KB whatever the number of connections), rather than a sorted copy of all.
fn step_stats(times: &[Times], step: Step) -> StepStats {
    let (a, b) = step.marks();
    let mut h = hdrhistogram::Histogram::<u64>::new(3).ok();
    let (mut first, mut last) = (u64::MAX, 0u64);
    for t in times {
        let (s, e) = (t.get(a), t.get(b));
        if s != 0 && e != 0 && e >= s {
            if let Some(h) = h.as_mut() {
                // An auto-resizing histogram takes any u64.
                let _ = h.record(e - s);
            }
            first = first.min(s);
            last = last.max(e);
        }
    }
    let count = h.as_ref().map_or(0, |h| h.len());
    let (min_ns, median_ns, p99_ns, max_ns, cdf) = match h {
        Some(h) if count > 0 => (
            h.min(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.max(),
            cdf_quantiles()
                .map(|q| (h.value_at_quantile(q), q))
                .collect(),
        ),
        _ => (0, 0, 0, 0, Vec::new()),
    };
    StepStats {
        step,
        count: count as usize,
        span_ns: last.saturating_sub(first),
        min_ns,
        median_ns,
        p99_ns,
        max_ns,
        cdf,
    }
}

/// CPU time (user + system) of this process so far, threads that exited included
/// (Linux: `/proc/self/stat`, in clock ticks of 10 ms); `None` elsewhere.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may contain spaces) in parentheses:
    // state is field 3, utime field 14, stime field 15.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    const TICKS_PER_SECOND: u64 = 100;
    Some(Duration::from_millis(
        (utime + stime) * 1000 / TICKS_PER_SECOND,
    ))
}

/// The process's resident set, bytes (Linux: `/proc/self/statm`, in pages of 4 KiB);
/// `None` elsewhere.
pub fn process_rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The process's peak resident set so far, bytes (Linux: `VmHWM` of `/proc/self/status`,
/// in KiB); `None` elsewhere.
pub fn process_peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What one wave of a churn run (`ibcm cmtime --waves`) cost and left behind.
#[derive(Debug, Clone, PartialEq)]
pub struct Wave {
    /// Its number, from 1.
    pub wave: usize,
    /// Each node's driver memory per established connection with all of them up (less
    /// what it held before the wave), bytes; empty when the pump cannot tell.
    pub bytes_per_connection: Vec<f64>,
    /// Both drivers' memory after the teardown, bytes (when the pump can tell).
    pub driver_after: Option<u64>,
    /// The process's resident set after the teardown, bytes (Linux).
    pub rss: Option<u64>,
}

impl Wave {
    /// The wave `wave` whose run `r` just ended (the process's RSS is read now).
    pub fn of(wave: usize, r: &Report) -> Self {
        let (bytes_per_connection, driver_after) = match &r.driver_memory {
            Some([before, established, after]) => (
                before
                    .iter()
                    .zip(established)
                    .map(|(b, e)| {
                        e.total().saturating_sub(b.total()) as f64 / r.established.max(1) as f64
                    })
                    .collect(),
                Some(DriverMemory::sum(after).total()),
            ),
            None => (Vec::new(), None),
        };
        Self {
            wave,
            bytes_per_connection,
            driver_after,
            rss: process_rss(),
        }
    }
}

/// One row of the cmtime step table, the same on every fabric (simulated, RoCEv2 link,
/// RDMA device): what rdma-core cmtime prints per step (total, min, max, per connection)
/// plus the median and 99th percentile, every duration in ns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRow {
    /// The step's name.
    pub name: String,
    /// Connections that completed it.
    pub count: usize,
    /// From the first start to the last end (cmtime's "total").
    pub total_ns: u64,
    /// Shortest.
    pub min_ns: u64,
    /// Median.
    pub median_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Longest.
    pub max_ns: u64,
}

impl From<&StepStats> for StepRow {
    fn from(s: &StepStats) -> Self {
        Self {
            name: s.step.name().to_string(),
            count: s.count,
            total_ns: s.span_ns,
            min_ns: s.min_ns,
            median_ns: s.median_ns,
            p99_ns: s.p99_ns,
            max_ns: s.max_ns,
        }
    }
}

impl StepRow {
    /// The total over the connections (cmtime's "us / conn"), ns.
    pub fn per_connection_ns(&self) -> u64 {
        self.total_ns / self.count.max(1) as u64
    }

    /// The row as JSON: durations in us.
    pub fn json(&self) -> serde_json::Value {
        let us = |ns: u64| ns as f64 / 1e3;
        serde_json::json!({
            "step": self.name,
            "count": self.count,
            "total_us": us(self.total_ns),
            "min_us": us(self.min_ns),
            "median_us": us(self.median_ns),
            "p99_us": us(self.p99_ns),
            "max_us": us(self.max_ns),
            "us_per_connection": us(self.per_connection_ns()),
        })
    }
}

/// The step table: one header and one line per row, every column as wide as its widest
/// cell (a long step name or a slow step never runs into the next column). Total in ms,
/// the rest in us, as rdma-core cmtime prints them.
pub fn step_table(rows: &[StepRow]) -> String {
    const HEAD: [&str; 8] = [
        "step",
        "count",
        "total ms",
        "min us",
        "median us",
        "p99 us",
        "max us",
        "us/conn",
    ];
    let us = |ns: u64| format!("{:.1}", ns as f64 / 1e3);
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.count.to_string(),
                format!("{:.2}", r.total_ns as f64 / 1e6),
                us(r.min_ns),
                us(r.median_ns),
                us(r.p99_ns),
                us(r.max_ns),
                us(r.per_connection_ns()),
            ]
        })
        .collect();
    let mut width = HEAD.map(str::len);
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |row: [&str; 8]| {
        let mut out = format!("{:<w$}", row[0], w = width[0]);
        for (c, w) in row.iter().zip(width).skip(1) {
            out.push_str(&format!("  {c:>w$}"));
        }
        out.push('\n');
        out
    };
    let mut out = line(HEAD);
    for row in &cells {
        out.push_str(&line(row.each_ref().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod step_table_tests {
    use super::*;

    #[test]
    fn columns_fit_their_widest_cell() {
        let rows = [
            StepRow {
                name: "disconnect (DREQ -> DREP)".into(),
                count: 100,
                total_ns: 123_456_789_000,
                min_ns: 1_000,
                median_ns: 2_000,
                p99_ns: 3_000,
                max_ns: 98_765_432_100,
            },
            StepRow {
                name: "REQ -> REP".into(),
                count: 1,
                total_ns: 5,
                min_ns: 5,
                median_ns: 5,
                p99_ns: 5,
                max_ns: 5,
            },
        ];
        let table = step_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        // Every line as long as the header, and each column's right edge in one place.
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{table}");
        assert!(
            lines[1].starts_with("disconnect (DREQ -> DREP)  "),
            "{table}"
        );
        assert!(lines[1].contains("98765432.1"), "{table}");
        assert!(lines[1].ends_with("1234567.9"), "{table}");
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// What a run keeps per connection for its whole length: a side's outcome is 16 bytes
    /// (its rare error boxed), the timestamps 9 x 8.
    #[test]
    fn per_connection_bookkeeping_stays_small() {
        assert!(size_of::<Outcome>() <= 16, "{}", size_of::<Outcome>());
        assert_eq!(size_of::<Times>(), 8 * MARKS);
    }
}
