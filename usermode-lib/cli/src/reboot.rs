//! `ibcm cmtime --peer-reboot`: a peer that reboots with N connections up, on the
//! simulated fabric.
//!
//! The client (node 0) sets up N connections to the server (node 1) as cmtime does; then
//! node 0's host reboots ([`Sim::reboot`]): its driver's state is gone without a word to
//! the server, and a fresh driver takes the port with the same CA GUID, other comm IDs.
//! The client's application starts again and reconnects every connection from the QPN
//! it used before (a rebooted host's HCA hands out QPNs from the same start). The
//! server, the survivor, still holds N established connections to QPNs the peer now
//! reuses: IBA 12.9.8.3.1 (and Linux `cm_match_req` -> `cm_issue_rej(
//! IB_CM_REJ_STALE_CONN)`) has it answer each such REQ with REJ(StaleConn) and end the
//! old connection with a DREQ, which the fresh driver answers with an unaffiliated DREP
//! (IBA 12.9.8.5). The stale REJ puts the client's new attempt in timewait (the QPN is
//! quarantined, IBA 12.9.8.3.1); its application tries again once that ends, refused
//! again as long as the server's old connection is in its own, longer timewait (ibcm's
//! engine keeps the old connection's remote QPN and CA GUID until timewait ends; Linux's
//! ib_cm drops them as the connection enters timewait, `cm_enter_timewait` ->
//! `cm_remove_remote`, so there only a live connection makes a REQ stale). Then
//! everything is torn down and what each
//! driver still holds is counted: CEPs, timer entries, open handles, and endpoints left
//! at a handle's close (the verifier's `EndpointLeak`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hashbrown::HashMap;
use ibcm::{CompletionPort, ConnectEndpoint, ConnectionRequest, Overlapped, spawn};
use ibcm::{Error, Provider, RejReason, Result};
use ibcm_host::verifier::Violation;
use ibcm_ioctl::status;
use ibcm_mad::AttributeId;

use crate::cmtime::{self, Config, Progress, describe, lock, wait_until};
use crate::sim::{Pump, Sim, Waited};

/// The client's node, the one that reboots.
const REBOOTED: usize = 0;
/// The server's node, the survivor.
const SURVIVOR: usize = 1;

/// What one node's driver holds after the run, once every handle is closed and nothing
/// is left to happen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// CEPs alive in the engine (timewait included).
    pub ceps: usize,
    /// Entries in the engine's timer heap (cancelled ones not yet popped included).
    pub timer_entries: usize,
    /// File handles still open.
    pub handles: usize,
    /// Endpoints a handle still had when it was closed (the verifier's `EndpointLeak`).
    pub endpoints_at_close: usize,
}

impl Leftovers {
    /// Whether nothing is left.
    pub fn none(&self) -> bool {
        *self == Self::default()
    }
}

/// What [`run`] measured.
#[derive(Debug, Clone)]
pub struct RebootReport {
    /// Connections asked for.
    pub connections: usize,
    /// Established on both sides before the reboot.
    pub established_before: usize,
    /// Old connections the survivor ended after the reboot (each told once, out of
    /// timewait).
    pub stale_ended: usize,
    /// From the reboot until the survivor had ended every old connection (its last one
    /// out of timewait), ns of the fabric's clock.
    pub stale_ended_ns: u64,
    /// Connections made again after the reboot (established on both sides).
    pub reconnected: usize,
    /// From the reboot until the last of them was established on the survivor, ns.
    pub reconnected_ns: u64,
    /// REJ(StaleConn) the rebooted node's application saw.
    pub stale_rejects: u64,
    /// Reconnects that took more than one attempt, and the most attempts one took.
    pub retried: usize,
    /// The most attempts one reconnect took.
    pub most_attempts: u32,
    /// MADs the survivor sent after the reboot: REJ, DREQ; and DREPs it received.
    pub survivor_rej_sent: u64,
    /// DREQs the survivor sent after the reboot (one per stale connection).
    pub survivor_dreq_sent: u64,
    /// DREPs the survivor received after the reboot.
    pub survivor_drep_received: u64,
    /// REJs the rebooted node's driver received.
    pub rebooted_rej_received: u64,
    /// DREQs the rebooted node's driver received (for connections it never knew).
    pub rebooted_dreq_received: u64,
    /// DREPs the rebooted node's driver sent (unaffiliated, IBA 12.9.8.5).
    pub rebooted_drep_sent: u64,
    /// Failures, by reason ("side: error").
    pub failures: BTreeMap<String, usize>,
    /// Waits that ran out (a stall: something never completed).
    pub stalls: usize,
    /// What the survivor's and the rebooted node's drivers hold at the end.
    pub survivor_left: Leftovers,
    /// The same for the rebooted node.
    pub rebooted_left: Leftovers,
    /// Rules the host verifier saw broken, by node and kind.
    pub violations: BTreeMap<String, usize>,
}

impl RebootReport {
    /// Whether the run went as it must: every connection up before the reboot, every
    /// old one ended once by the survivor, every one made again, nothing failed or
    /// stalled, nothing left, the verifier clean.
    pub fn clean(&self) -> bool {
        let n = self.connections;
        self.established_before == n
            && self.stale_ended == n
            && self.reconnected == n
            && self.failures.is_empty()
            && self.stalls == 0
            && self.survivor_left.none()
            && self.rebooted_left.none()
            && self.violations.is_empty()
    }
}

/// Per connection index, when something happened (ns of the fabric's clock; 0: not).
struct Marks(Vec<AtomicU64>);

impl Marks {
    fn new(n: usize) -> Self {
        Self((0..n).map(|_| AtomicU64::new(0)).collect())
    }

    fn set(&self, i: usize, ns: u64) {
        if let Some(a) = self.0.get(i) {
            a.store(ns.max(1), Ordering::Relaxed);
        }
    }

    fn count(&self) -> usize {
        self.0
            .iter()
            .filter(|a| a.load(Ordering::Relaxed) != 0)
            .count()
    }

    fn last(&self) -> u64 {
        self.0
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }
}

/// The survivor's application: it accepts every REQ; an old connection (made before the
/// reboot) waits for its end, whoever ends it (the survivor's own DREQ, for a stale
/// one: its owner sees the DREP, then the timewait exit); a new one waits for the
/// client's DREQ, answers, and waits out timewait.
struct Survivor {
    clock: crate::sim::ClockFn,
    connections: usize,
    /// Whether the client has rebooted: REQs from then on are reconnects.
    rebooted: std::sync::atomic::AtomicBool,
    /// Old connections established, and ended after the reboot.
    established: Marks,
    ended: Marks,
    /// New connections established.
    reestablished: Marks,
    /// Tasks of new connections started and finished.
    spawned: AtomicUsize,
    finished: AtomicUsize,
    /// Old tasks that ended before the reboot (a failure).
    ended_early: AtomicUsize,
    failures: Mutex<BTreeMap<String, usize>>,
    /// Endpoints of tasks in progress (cancelled on a stall), by (new, index).
    live: Mutex<HashMap<(bool, usize), ConnectEndpoint>>,
}

impl Survivor {
    fn fail(&self, what: String) {
        *lock(&self.failures).entry(what).or_default() += 1;
    }

    fn serve(self: &Arc<Self>, req: ConnectionRequest) {
        let Some(i) = cmtime::index_of(&req.private_data).filter(|&i| i < self.connections) else {
            self.fail("server: a REQ naming no connection of this run".into());
            spawn(
                req.endpoint
                    .reject_async(RejReason::ConsumerDefined, b"unexpected"),
                &Overlapped::new(),
            );
            return;
        };
        let new = self.rebooted.load(Ordering::Acquire);
        if lock(&self.live)
            .insert((new, i), req.endpoint.clone())
            .is_some()
        {
            self.fail("server: a second REQ for one connection".into());
        }
        if new {
            self.spawned.fetch_add(1, Ordering::AcqRel);
        }
        let me = Arc::clone(self);
        let ep = req.endpoint;
        spawn(
            async move {
                let r = async {
                    ep.prepare_accept_async(&cmtime::accept_params(i)).await?;
                    Box::pin(ep.accept_async()).await?;
                    let now = (me.clock)();
                    if new {
                        me.reestablished.set(i, now);
                        Box::pin(ep.notify_disconnect_async()).await?;
                        Box::pin(ep.disconnect_async(&[])).await?;
                    } else {
                        me.established.set(i, now);
                    }
                    Box::pin(ep.wait_timewait_async()).await
                }
                .await;
                match r {
                    Ok(()) if !new => {
                        if me.rebooted.load(Ordering::Acquire) {
                            me.ended.set(i, (me.clock)());
                        } else {
                            me.ended_early.fetch_add(1, Ordering::AcqRel);
                            me.fail("server: an old connection ended before the reboot".into());
                        }
                    }
                    Ok(()) => {}
                    Err(e) => me.fail(describe("server", &e)),
                }
                lock(&me.live).remove(&(new, i));
                drop(ep);
                if new {
                    me.finished.fetch_add(1, Ordering::AcqRel);
                }
            },
            &Overlapped::new(),
        );
    }

    fn cancel(&self) {
        let eps: Vec<ConnectEndpoint> = lock(&self.live).values().cloned().collect();
        for ep in eps {
            ep.cancel();
        }
    }
}

/// MAD counters of a provider's driver by attribute: (sent, received).
fn counts(p: &Provider, attr: AttributeId) -> Result<(u64, u64)> {
    let c = p.counters()?;
    // IBA Table 103's attribute IDs from 0x10: the counters' slots.
    let slot = usize::from(u16::from(attr).saturating_sub(0x10));
    Ok((
        c.sent.get(slot).copied().unwrap_or(0),
        c.received.get(slot).copied().unwrap_or(0),
    ))
}

/// One client operation in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Connection `i`: REQ -> REP, RTU.
    Connect(usize),
    /// Connection `i`'s refused attempt waits out its timewait before the next.
    Timewait(usize),
    /// Connection `i`: DREQ -> DREP, then timewait.
    Disconnect(usize),
}

impl Op {
    fn key(self) -> usize {
        match self {
            Op::Connect(i) => 3 * i,
            Op::Timewait(i) => 3 * i + 1,
            Op::Disconnect(i) => 3 * i + 2,
        }
    }

    fn of(key: usize) -> Self {
        match key % 3 {
            0 => Op::Connect(key / 3),
            1 => Op::Timewait(key / 3),
            _ => Op::Disconnect(key / 3),
        }
    }
}

/// The client's application: connects (retrying a stale refusal once its timewait is
/// over) and disconnects, at most `window` connects or disconnects in flight.
struct Client<'a> {
    provider: &'a Provider,
    pump: &'a dyn Pump,
    cfg: &'a Config,
    port: CompletionPort,
    inflight: HashMap<usize, ConnectEndpoint>,
    /// Connects and disconnects in flight (timewait waits do not count: they only wait).
    windowed: usize,
    /// Per connection: attempts so far, and when the first began (ns).
    attempts: HashMap<usize, (u32, u64)>,
    stale_rejects: u64,
    failures: BTreeMap<String, usize>,
    stalls: usize,
}

impl<'a> Client<'a> {
    fn new(provider: &'a Provider, pump: &'a dyn Pump, cfg: &'a Config) -> Self {
        Self {
            provider,
            pump,
            cfg,
            port: CompletionPort::new(),
            inflight: HashMap::new(),
            windowed: 0,
            attempts: HashMap::new(),
            stale_rejects: 0,
            failures: BTreeMap::new(),
            stalls: 0,
        }
    }

    fn fail(&mut self, what: String) {
        *self.failures.entry(what).or_default() += 1;
    }

    fn start(&mut self, op: Op, ep: ConnectEndpoint) {
        let o = Overlapped::with_port(&self.port, op.key());
        match op {
            Op::Connect(i) => {
                let now = self.pump.now_ns();
                self.attempts.entry(i).or_insert((0, now)).0 += 1;
                let index = (i as u32).to_le_bytes();
                let connect = ep.connect_async(&cmtime::connect_params(self.cfg, i, &index));
                let ep2 = ep.clone();
                spawn(
                    async move {
                        connect.await?;
                        ep2.rtu_async(&[]).await
                    },
                    &o,
                );
                self.windowed += 1;
            }
            Op::Timewait(_) => spawn(ep.wait_timewait_async(), &o),
            Op::Disconnect(_) => {
                // Boxed: an async block holds a future it awaits twice (rust-lang/rust#62958).
                let disconnect = Box::pin(ep.disconnect_async(&[]));
                let ep2 = ep.clone();
                spawn(
                    async move {
                        disconnect.await?;
                        ep2.wait_timewait_async().await
                    },
                    &o,
                );
                self.windowed += 1;
            }
        }
        self.inflight.insert(op.key(), ep);
    }

    /// Runs `todo` (connects or disconnects) to the end; returns the endpoints of the
    /// connections made (connects) or an empty map (disconnects).
    fn run(
        &mut self,
        mut todo: VecDeque<(Op, Option<ConnectEndpoint>)>,
        phase: &'static str,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> HashMap<usize, ConnectEndpoint> {
        let total = todo.len();
        let mut done = 0usize;
        let mut made = HashMap::new();
        let stall_ns = cmtime::stall_limit(self.cfg).as_nanos() as u64;
        let mut last = self.pump.now_ns();
        let mut stalled = 0;
        loop {
            while self.windowed < self.cfg.window.max(1) {
                let Some((op, ep)) = todo.pop_front() else {
                    break;
                };
                let ep = match ep.map_or_else(|| self.provider.connect_endpoint(), Ok) {
                    Ok(ep) => ep,
                    Err(e) => {
                        self.fail(describe("client", &e));
                        done += 1;
                        continue;
                    }
                };
                self.start(op, ep);
            }
            if self.inflight.is_empty() && todo.is_empty() {
                return made;
            }
            match self.pump.next_packet(&self.port, Duration::from_millis(20)) {
                Waited::Packet(p) => {
                    last = self.pump.now_ns();
                    let op = Op::of(p.key);
                    let Some(ep) = self.inflight.remove(&p.key) else {
                        continue;
                    };
                    let r = p
                        .overlapped
                        .result::<Result<()>>()
                        .unwrap_or_else(|| Err(Error::new("cmtime", status::INVALID_PARAMETER)));
                    match (op, r) {
                        (Op::Connect(i), Ok(())) => {
                            self.windowed -= 1;
                            made.insert(i, ep);
                            done += 1;
                        }
                        (Op::Connect(i), Err(e))
                            if e.reject_reason() == Some(RejReason::StaleConn) =>
                        {
                            self.windowed -= 1;
                            self.stale_rejects += 1;
                            // The refused attempt's CEP holds the QPN until its timewait
                            // ends (a few packet life times); then a fresh endpoint tries
                            // again, refused as long as the survivor's old connection is in
                            // its own timewait (with the CA's ACK delay: longer). Given up
                            // after as long as any step may take (the stall limit).
                            let first = self.attempts.get(&i).map_or(0, |a| a.1);
                            if self.pump.now_ns().saturating_sub(first) > stall_ns {
                                self.fail("client: refused as stale past the stall limit".into());
                                done += 1;
                            } else {
                                self.start(Op::Timewait(i), ep);
                            }
                        }
                        (Op::Timewait(i), Ok(())) => todo.push_back((Op::Connect(i), None)),
                        (Op::Disconnect(_), Ok(())) => {
                            self.windowed -= 1;
                            done += 1;
                        }
                        (op, Err(e)) => {
                            if !matches!(op, Op::Timewait(_)) {
                                self.windowed -= 1;
                            }
                            self.fail(describe("client", &e));
                            done += 1;
                        }
                    }
                    progress(Progress { phase, done, total });
                }
                w => {
                    if matches!(w, Waited::Idle)
                        || self.pump.now_ns().saturating_sub(last) > stall_ns
                    {
                        self.stalls += 1;
                        stalled += 1;
                        for ep in self.inflight.values() {
                            ep.cancel();
                        }
                        if stalled > 2 {
                            let left = self.inflight.len() + todo.len();
                            self.inflight.clear();
                            todo.clear();
                            self.windowed = 0;
                            *self
                                .failures
                                .entry(format!("client: {phase} stalled"))
                                .or_default() += left;
                            return made;
                        }
                        last = self.pump.now_ns();
                    }
                }
            }
        }
    }
}

/// What node `i`'s driver holds once nothing is left to happen.
fn leftovers(sim: &Sim, i: usize) -> Leftovers {
    let Some(node) = sim.node(i) else {
        return Leftovers::default();
    };
    let endpoints_at_close = node
        .violations()
        .iter()
        .map(|v| match v {
            Violation::EndpointLeak { count } => *count,
            _ => 0,
        })
        .sum();
    Leftovers {
        ceps: node.device.with_engine(|cm| cm.live_ceps()),
        timer_entries: node.device.with_engine(|cm| cm.timer_entries()),
        handles: node.device.file_count(),
        endpoints_at_close,
    }
}

/// The peer reboot: N connections up, node 0 (the client) reboots, its application
/// reconnects every one from the same QPNs, the server (node 1, the survivor) ends every
/// stale connection; then all is torn down and the leftovers counted. `sim` must be a
/// fresh two-node fabric (its node 0 is rebooted).
pub fn run(sim: &Sim, cfg: &Config, progress: &(dyn Fn(Progress) + Sync)) -> Result<RebootReport> {
    let n = cfg.connections;
    let server = sim.provider(SURVIVOR)?;
    let survivor = Arc::new(Survivor {
        clock: sim.clock(),
        connections: n,
        rebooted: false.into(),
        established: Marks::new(n),
        ended: Marks::new(n),
        reestablished: Marks::new(n),
        spawned: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        ended_early: AtomicUsize::new(0),
        failures: Mutex::new(BTreeMap::new()),
        live: Mutex::new(HashMap::new()),
    });
    let listener = Arc::new(cmtime::listen(&server, cfg)?);
    let acceptor = Overlapped::new();
    {
        let (s, l) = (Arc::clone(&survivor), Arc::clone(&listener));
        spawn(
            async move {
                loop {
                    match l.get_request_async().await {
                        Ok(req) => s.serve(req),
                        Err(e) => return e,
                    }
                }
            },
            &acceptor,
        );
    }
    let stall = cmtime::stall_limit(cfg);
    let mut stalls = 0;

    // N connections up.
    let old_client = sim.provider(REBOOTED)?;
    let mut client = Client::new(&old_client, sim, cfg);
    let todo = (0..n).map(|i| (Op::Connect(i), None)).collect();
    let old = client.run(todo, "connect", progress);
    stalls += wait_until(
        sim,
        stall,
        || survivor.established.count() >= old.len(),
        || survivor.cancel(),
    );
    let established_before = survivor.established.count().min(old.len());
    let mut failures = std::mem::take(&mut client.failures);
    stalls += client.stalls;
    drop(client);

    // The reboot: the client's host and all it held are gone; its driver sends nothing.
    let (rej0, _) = counts(&server, AttributeId::Rej)?;
    let (dreq0, _) = counts(&server, AttributeId::Dreq)?;
    let (_, drep0) = counts(&server, AttributeId::Drep)?;
    survivor.rebooted.store(true, Ordering::Release);
    if !sim.reboot(REBOOTED) {
        return Err(Error::new("reboot", status::INVALID_DEVICE_REQUEST));
    }
    let reboot_at = sim.now_ns();
    drop(old);
    drop(old_client);

    // The client's application starts again and reconnects all from the same QPNs.
    let fresh = sim.provider(REBOOTED)?;
    let mut client = Client::new(&fresh, sim, cfg);
    let todo = (0..n).map(|i| (Op::Connect(i), None)).collect();
    let again = client.run(todo, "reconnect", progress);
    stalls += wait_until(
        sim,
        stall,
        || {
            survivor.reestablished.count() >= again.len()
                && survivor.ended.count() + survivor.ended_early.load(Ordering::Acquire)
                    >= established_before
        },
        || survivor.cancel(),
    );
    let reconnected = survivor.reestablished.count().min(again.len());
    let stale_ended = survivor.ended.count();
    let stale_ended_ns = survivor.ended.last().saturating_sub(reboot_at);
    let reconnected_ns = survivor.reestablished.last().saturating_sub(reboot_at);
    let (rej1, _) = counts(&server, AttributeId::Rej)?;
    let (dreq1, _) = counts(&server, AttributeId::Dreq)?;
    let (_, drep1) = counts(&server, AttributeId::Drep)?;
    let (_, rebooted_rej_received) = counts(&fresh, AttributeId::Rej)?;
    let (_, rebooted_dreq_received) = counts(&fresh, AttributeId::Dreq)?;
    let (rebooted_drep_sent, _) = counts(&fresh, AttributeId::Drep)?;
    let attempts: Vec<u32> = client.attempts.values().map(|a| a.0).collect();

    // Teardown: the client disconnects every new connection; both wait out timewait.
    let todo = again
        .into_iter()
        .map(|(i, ep)| (Op::Disconnect(i), Some(ep)))
        .collect();
    client.run(todo, "disconnect", progress);
    stalls += wait_until(
        sim,
        stall,
        || survivor.finished.load(Ordering::Acquire) >= survivor.spawned.load(Ordering::Acquire),
        || survivor.cancel(),
    );
    listener.cancel();
    stalls += wait_until(sim, Duration::from_secs(5), || acceptor.is_done(), || {});
    drop(listener);
    for (what, count) in std::mem::take(&mut client.failures) {
        *failures.entry(what).or_default() += count;
    }
    for (what, count) in std::mem::take(&mut *lock(&survivor.failures)) {
        *failures.entry(what).or_default() += count;
    }
    stalls += client.stalls;
    let stale_rejects = client.stale_rejects;
    drop(client);
    fresh.close();
    server.close();
    drop((fresh, server));
    // What the handles' close set going (nothing, when all went well) runs out.
    let empty = || {
        [REBOOTED, SURVIVOR]
            .iter()
            .all(|&i| leftovers(sim, i).ceps == 0 && leftovers(sim, i).timer_entries == 0)
    };
    wait_until(sim, stall, empty, || {});

    let mut violations = BTreeMap::new();
    for (node, v) in sim.violations() {
        let name = format!("{v:?}");
        let kind = name.split([' ', '{']).next().unwrap_or("?").to_string();
        *violations
            .entry(format!("node {node}: {kind}"))
            .or_default() += 1;
    }
    Ok(RebootReport {
        connections: n,
        established_before,
        stale_ended,
        stale_ended_ns,
        reconnected,
        reconnected_ns,
        stale_rejects,
        retried: attempts.iter().filter(|&&a| a > 1).count(),
        most_attempts: attempts.iter().copied().max().unwrap_or(0),
        survivor_rej_sent: rej1.saturating_sub(rej0),
        survivor_dreq_sent: dreq1.saturating_sub(dreq0),
        survivor_drep_received: drep1.saturating_sub(drep0),
        rebooted_rej_received,
        rebooted_dreq_received,
        rebooted_drep_sent,
        failures,
        stalls,
        survivor_left: leftovers(sim, SURVIVOR),
        rebooted_left: leftovers(sim, REBOOTED),
        violations,
    })
}
