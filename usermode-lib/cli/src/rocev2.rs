//! The in-process driver on a real RoCEv2 link, talking to a real CM: Linux `ib_cm` and
//! `rdma_cm` over soft-RoCE, say. [`Roce`] starts a [`RocePort`] (QP1 over UDP 4791 on a
//! local IPv4 address) and opens a [`Provider`] on its node; the same IOCTL records as
//! everywhere else go to the driver's dispatch code in this process.
//!
//! Against `rdma_cm` the connections are RDMA-CM's (IBA Annex A11): the service ID is the
//! TCP port space's (`0x0000000001060000 | port`) and the REQ's private data starts with
//! the IP addressing header (version 0, IPv4, source port, source and destination
//! address), which `rdma_cm` checks against its net device before it hands a REQ to its
//! listener.
//!
//! - [`connect`]: the active side, N connections (all at once within a window, as
//!   `cmtime -s` does, or one after the other, each held until all were tried), then
//!   their teardown; every step timed.
//! - [`serve`]: the passive side, accepting every REQ as it comes (as `cmtime -b` does),
//!   ending each connection when the peer sends its DREQ or, on request, by sending ours.
//!
//! Beside AL ([`RoceConfig::beside_al`]) the node carries a second CM, a stand-in for
//! WinOF AL's, with a provider of its own ([`Roce::al`]): each serves its own services.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ibcm_ioctl::{ep_state, status};
use ibcm_mad::{IP_HEADER_SIZE, IpHeader, IpServiceId, RejReason};

pub use ibcm_host::rocev2::{
    PATH_MTU, RoceConfig, RoceCounts, RoceFaults, RocePort, guid_from_mac, ipv4_gid, path_record,
};

pub use crate::cmtime::Timing;
use ibcm::Provider;
use ibcm::{AcceptParams, ConnectParams, Failover, ListenParams, Transport};
use ibcm::{CompletionPort, Overlapped, spawn};
use ibcm::{ConnectEndpoint, ConnectionRequest};
use ibcm::{Detail, Error, Result};

/// The TCP port rdma-core's `cmtime` listens on and connects to.
pub const CMTIME_PORT: u16 = 7471;

/// A node on a RoCEv2 link and a provider open on it.
pub struct Roce {
    /// The port (counters, GUID, addresses).
    pub port: RocePort,
    /// The provider (beside AL, on ibcm's CM).
    pub provider: Provider,
    /// Beside AL, a provider on the AL stand-in's CM.
    pub al: Option<Provider>,
}

impl Roce {
    /// Starts the port and opens a provider on its node.
    pub fn start(config: &RoceConfig) -> std::result::Result<Self, String> {
        let port = RocePort::start(config).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                format!(
                    "RoCEv2 on {}: {e} (a raw socket needs root or CAP_NET_RAW)",
                    config.local
                )
            } else {
                format!("RoCEv2 on {}: {e}", config.local)
            }
        })?;
        let provider = Provider::in_process(port.node()).map_err(|e| e.to_string())?;
        let al = match port.shared() {
            Some(s) => Some(Provider::in_process(Arc::clone(s.al())).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(Self { port, provider, al })
    }
}

/// Real QPs for the connections (a real RDMA device): each connection's QP is made before
/// its REQ (active) or REP (passive) and moved to INIT, RTR and RTS with exactly the
/// transition records the engine returns. Without it the QPNs are made up (a raw RoCEv2
/// link has no QPs; the peer's CM only needs numbers).
pub trait Qps: Send + Sync {
    /// A new RC QP, in RESET.
    fn create(&self) -> std::result::Result<Box<dyn Qp>, String>;
}

/// One QP of [`Qps`].
pub trait Qp: Send + Sync {
    /// Its QPN.
    fn qpn(&self) -> u32;
    /// Applies one transition record.
    fn modify(&self, attributes: &ibcm::QpAttributes) -> std::result::Result<(), String>;
}

/// The active side's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectConfig {
    /// The peer's address.
    pub peer: Ipv4Addr,
    /// The service ID to connect to (RDMA-CM: [`IpServiceId::tcp`] of the port).
    pub service_id: u64,
    /// Connections.
    pub count: usize,
    /// Most connections being set up at once; 1 opens them one after the other.
    pub window: usize,
    /// CM timing.
    pub timing: Timing,
    /// The QPN of connection 0 (connection `i` has `qpn_base + i`).
    pub qpn_base: u32,
    /// Give every connection the same QPN (the peer must reject the reuse while the first
    /// connection is up: REJ reason 10, stale connection).
    pub reuse_qpn: bool,
    /// Longest wait for the whole setup or the whole teardown.
    pub deadline: Duration,
}

impl ConnectConfig {
    /// `count` connections to `peer`'s RDMA-CM TCP port `rdma_port`, all at once, default
    /// timing.
    pub fn new(peer: Ipv4Addr, rdma_port: u16, count: usize) -> Self {
        Self {
            peer,
            service_id: IpServiceId::tcp(rdma_port).to_service_id(),
            count,
            window: count.max(1),
            timing: Timing::patient(),
            qpn_base: 0x1000,
            reuse_qpn: false,
            deadline: Duration::from_secs(60),
        }
    }
}

/// Durations of one step over the connections that went through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepTimes {
    /// Connections.
    pub count: usize,
    /// From the first start to the last end.
    pub total: Duration,
    /// Shortest.
    pub min: Duration,
    /// Median.
    pub median: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Longest.
    pub max: Duration,
}

impl StepTimes {
    /// The row of the cmtime step table.
    pub fn row(&self, name: &str) -> crate::cmtime::StepRow {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        crate::cmtime::StepRow {
            name: name.to_string(),
            count: self.count,
            total_ns: ns(self.total),
            min_ns: ns(self.min),
            median_ns: ns(self.median),
            p99_ns: ns(self.p99),
            max_ns: ns(self.max),
        }
    }

    fn of(spans: &[(Instant, Instant)]) -> Self {
        if spans.is_empty() {
            return Self::default();
        }
        let mut d: Vec<Duration> = spans
            .iter()
            .map(|(a, b)| b.saturating_duration_since(*a))
            .collect();
        d.sort_unstable();
        let first = spans.iter().map(|s| s.0).min();
        let last = spans.iter().map(|s| s.1).max();
        Self {
            count: d.len(),
            total: match (first, last) {
                (Some(a), Some(b)) => b.saturating_duration_since(a),
                _ => Duration::ZERO,
            },
            min: d.first().copied().unwrap_or_default(),
            median: d.get(d.len() / 2).copied().unwrap_or_default(),
            p99: d
                .get((d.len() * 99).div_ceil(100).saturating_sub(1))
                .copied()
                .unwrap_or_default(),
            max: d.last().copied().unwrap_or_default(),
        }
    }
}

/// What [`connect`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectReport {
    /// Connections tried.
    pub attempted: usize,
    /// Established (REP received, RTU sent).
    pub established: usize,
    /// Torn down: DREP received for our DREQ, or our DREP sent for the peer's.
    pub disconnected: usize,
    /// Established connections the peer disconnected first (its DREQ came before ours).
    pub peer_disconnects: usize,
    /// Failures by description ("connect: rejected, reason StaleConn (10)").
    pub failures: BTreeMap<String, usize>,
    /// The peer's REJ reasons.
    pub rejections: BTreeMap<u16, usize>,
    /// Making each connection's endpoint, all before the first REQ (cmtime's "create
    /// id").
    pub create_id: StepTimes,
    /// With real QPs: making each, all before the first REQ (cmtime's "create qp").
    pub create_qp: StepTimes,
    /// REQ sent -> REP received.
    pub connect: StepTimes,
    /// REQ sent -> RTU sent (with real QPs, their RTR and RTS included, INIT having been
    /// made before the REQ): what rdma-core cmtime's "connect" step times, rdma_connect to
    /// ESTABLISHED.
    pub establish: StepTimes,
    /// With real QPs: each QP's move to INIT, inside `create_qp`, before its REQ, where
    /// librdmacm moves its QP to INIT in rdma_create_qp, before cmtime's "connect" step
    /// starts (rdma-core v44 cma.c:1676 -> ucma_init_conn_qp :1367-1380;
    /// cmtime.c:567-583).
    pub init: StepTimes,
    /// The first connection's REQ -> RTU: this process's first, a fresh client's as in
    /// each `cmtime -c 1` process, beside `establish`'s median of a warm client.
    pub first_establish: Option<Duration>,
    /// DREQ sent -> DREP received.
    pub disconnect: StepTimes,
    /// Wall time of the setup phase.
    pub setup_wall: Duration,
    /// Wall time of the teardown phase.
    pub teardown_wall: Duration,
}

/// Describes an error for a report: the operation, the status, and the peer's REJ reason.
pub fn describe(e: &Error) -> String {
    match &e.detail {
        Detail::Rejected { reason, .. } => format!(
            "{}: rejected by the peer, reason {reason:?} ({})",
            e.operation,
            u16::from(*reason)
        ),
        Detail::Timeout { message } => {
            format!("{}: no answer to the {message:?}", e.operation)
        }
        Detail::None => format!("{}: {}", e.operation, ibcm::status_name(e.status)),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The REQ's private data for RDMA-CM: the Annex A11 IP header, nothing after it.
pub fn rdma_cm_private_data(
    local: Ipv4Addr,
    peer: Ipv4Addr,
    src_port: u16,
) -> [u8; IP_HEADER_SIZE] {
    let mut data = [0u8; IP_HEADER_SIZE];
    let h = IpHeader {
        src_port,
        src_addr: IpAddr::V4(local),
        dst_addr: IpAddr::V4(peer),
    };
    // Both addresses are IPv4 and the buffer is the header's size: emit cannot fail.
    let _ = h.emit(&mut data);
    data
}

/// The connect parameters of connection `i` to an RDMA-CM listener.
pub fn connect_params<'a>(
    local: Ipv4Addr,
    cfg: &ConnectConfig,
    qpn: u32,
    private_data: &'a [u8],
) -> ConnectParams<'a> {
    ConnectParams {
        service_id: cfg.service_id,
        port: ibcm_host::rocev2::PORT_NUM,
        pkey: 0xffff,
        qpn,
        transport: Transport::Rc,
        starting_psn: None,
        primary_path: path_record(local, cfg.peer, cfg.timing.packet_life_time),
        alternate_path: None,
        path_mtu: PATH_MTU,
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_response_timeout: cfg.timing.cm_response_timeout,
        local_cm_response_timeout: cfg.timing.cm_response_timeout,
        retry_count: 7,
        rnr_retry_count: 7,
        max_cm_retries: cfg.timing.max_cm_retries,
        srq: false,
        flow_control: true,
        private_data,
    }
}

struct ConnectTimes {
    req: Instant,
    rep: Option<Instant>,
    /// RTU sent (the QP in RTS before it, with [`Qps`]).
    rtu: Option<Instant>,
}

/// Why a connection's setup failed: the CM's answer, or a QP verb.
enum Failed {
    Cm(Error),
    Verbs(String),
}

/// The active side: `cfg.count` connections to an RDMA-CM listener at `cfg.peer`, then
/// their teardown. `log` gets a line per notable event.
pub fn connect(roce: &Roce, cfg: &ConnectConfig, log: &(dyn Fn(String) + Sync)) -> ConnectReport {
    connect_on(&roce.provider, roce.port.local(), None, cfg, log)
}

/// [`connect`] from `local` through `provider`, with real QPs from `qps` or made-up QPNs.
pub fn connect_on(
    provider: &Provider,
    local: Ipv4Addr,
    qps: Option<&dyn Qps>,
    cfg: &ConnectConfig,
    log: &(dyn Fn(String) + Sync),
) -> ConnectReport {
    let n = cfg.count;
    let mut report = ConnectReport {
        attempted: n,
        ..ConnectReport::default()
    };
    let times: Arc<Mutex<Vec<Option<ConnectTimes>>>> =
        Arc::new(Mutex::new((0..n).map(|_| None).collect()));
    let fail = |report: &mut ConnectReport, e: &Error| {
        *report.failures.entry(describe(e)).or_default() += 1;
        if let Some(r) = e.reject_reason() {
            *report.rejections.entry(u16::from(r)).or_default() += 1;
        }
    };

    // Real QPs: all made first and moved to INIT, as rdma-core cmtime's client makes
    // them (its "create qp" step: rdma_create_qp, which moves the QP to INIT before
    // rdma_connect, rdma-core v44 cma.c:1676 ucma_init_conn_qp). The INIT attributes are
    // the connection's port, P_Key and responder resources, the same for every connection
    // here: no round trip to the CM (they are what it gives from the REQ on).
    let init = connect_params(local, cfg, 0, &[]).init_attributes();
    let mut made: Vec<Option<Arc<dyn Qp>>> = Vec::with_capacity(n);
    if let Some(qps) = qps {
        let mut spans = Vec::with_capacity(n);
        let mut init_spans = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            let qp = qps.create().and_then(|qp| {
                let created = Instant::now();
                qp.modify(&init)
                    .map_err(|e| format!("RESET -> INIT: {e}"))?;
                init_spans.push((created, Instant::now()));
                Ok(qp)
            });
            spans.push((start, Instant::now()));
            match qp {
                Ok(qp) => made.push(Some(Arc::from(qp))),
                Err(e) => {
                    *report
                        .failures
                        .entry(format!("create QP: {e}"))
                        .or_default() += 1;
                    made.push(None);
                }
            }
        }
        report.create_qp = StepTimes::of(&spans);
        report.init = StepTimes::of(&init_spans);
    }
    // Endpoints: all made before the first REQ, as rdma-core cmtime makes its ids (its
    // "create id" step, rdma_create_id for every connection before the first connect),
    // so that no endpoint's CREATE runs while connections are being set up.
    let mut ids: Vec<Option<ConnectEndpoint>> = Vec::with_capacity(n);
    let mut spans = Vec::with_capacity(n);
    for i in 0..n {
        if matches!(made.get(i), Some(None)) {
            // Its QP could not be made (counted above).
            ids.push(None);
            continue;
        }
        let start = Instant::now();
        let ep = provider.connect_endpoint();
        spans.push((start, Instant::now()));
        match ep {
            Ok(ep) => ids.push(Some(ep)),
            Err(e) => {
                fail(&mut report, &e);
                ids.push(None);
            }
        }
    }
    report.create_id = StepTimes::of(&spans);
    // Setup: up to `window` connections in flight, each an overlapped connect + RTU.
    let port = CompletionPort::new();
    let mut live: Vec<(usize, ConnectEndpoint)> = Vec::new();
    let mut inflight: BTreeMap<usize, ConnectEndpoint> = BTreeMap::new();
    let mut qp_of: BTreeMap<usize, Arc<dyn Qp>> = BTreeMap::new();
    let mut next = 0usize;
    let wall = Instant::now();
    let deadline = wall + cfg.deadline;
    while next < n || !inflight.is_empty() {
        while next < n && inflight.len() < cfg.window.max(1) {
            let i = next;
            next += 1;
            // No endpoint: its QP or the endpoint itself could not be made (counted).
            let Some(ep) = ids.get_mut(i).and_then(Option::take) else {
                continue;
            };
            let qp = made.get_mut(i).and_then(Option::take);
            let qpn = match &qp {
                Some(qp) => qp.qpn(),
                None if cfg.reuse_qpn => cfg.qpn_base,
                None => cfg.qpn_base + i as u32,
            } & 0x00ff_ffff;
            let pd = rdma_cm_private_data(local, cfg.peer, 0xc000 | (i as u16 & 0x3fff));
            let params = connect_params(local, cfg, qpn, &pd);
            if let Some(slot) = lock(&times).get_mut(i) {
                *slot = Some(ConnectTimes {
                    req: Instant::now(),
                    rep: None,
                    rtu: None,
                });
            }
            let (times2, ep2, qp2) = (Arc::clone(&times), ep.clone(), qp.clone());
            // The REQ leaves here (the IOCTL is issued when the future is made).
            let connect = ep.connect_async(&params);
            // RTR and RTS where the REP completes (INIT -> INIT first if the REP changed
            // the INIT attributes), then the RTU, as librdmacm moves its QP on the
            // CONNECT_RESPONSE before it sends the RTU (ucma_process_conn_resp).
            spawn(
                async move {
                    let reply = connect.await.map_err(Failed::Cm)?;
                    if let Some(Some(t)) = lock(&times2).get_mut(i) {
                        t.rep = Some(Instant::now());
                    }
                    if let Some(qp) = qp2 {
                        let again = reply.init_again(&init);
                        for a in again.into_iter().chain([&reply.rtr, &reply.rts]) {
                            if let Err(e) = qp.modify(a) {
                                // The connection goes no further: the peer's REP waits
                                // for an RTU that does not come, and times out.
                                ep2.cancel();
                                return Err(Failed::Verbs(e));
                            }
                        }
                    }
                    // The RTU is written when the IOCTL is issued (the backend sends what
                    // the call queued before it returns): that is when it was sent. The
                    // call's completion comes through the completion thread's queue,
                    // behind the other connections' REPs.
                    let rtu = ep2.rtu_async(&[]);
                    let sent = Instant::now();
                    rtu.await.map_err(Failed::Cm)?;
                    if let Some(Some(t)) = lock(&times2).get_mut(i) {
                        t.rtu = Some(sent);
                    }
                    Ok(reply.remote_qpn)
                },
                &Overlapped::with_port(&port, i),
            );
            if let Some(qp) = qp {
                qp_of.insert(i, qp);
            }
            inflight.insert(i, ep);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(packet) = port.get(Some(left.min(Duration::from_millis(200)))) else {
            if left.is_zero() {
                log(format!(
                    "setup: {} connections still pending at the deadline: cancelled",
                    inflight.len()
                ));
                for ep in inflight.values() {
                    ep.cancel();
                }
                // Their completions (cancelled) still arrive; collect them briefly.
                let grace = Instant::now() + Duration::from_secs(2);
                while !inflight.is_empty() && Instant::now() < grace {
                    if let Some(p) = port.get(Some(Duration::from_millis(100))) {
                        inflight.remove(&p.key);
                        let e = Error::new("connect", status::CANCELLED);
                        fail(&mut report, &e);
                    }
                }
                for _ in inflight.values() {
                    fail(&mut report, &Error::new("connect", status::IO_TIMEOUT));
                }
                inflight.clear();
                next = n;
            }
            continue;
        };
        let i = packet.key;
        let Some(ep) = inflight.remove(&i) else {
            continue;
        };
        match packet
            .overlapped
            .result::<std::result::Result<u32, Failed>>()
        {
            Some(Ok(remote_qpn)) => {
                report.established += 1;
                if cfg.window <= 1 || n <= 4 {
                    log(format!(
                        "connection {i}: established, peer QPN {remote_qpn:#08x}"
                    ));
                }
                live.push((i, ep));
            }
            Some(Err(Failed::Cm(e))) => {
                log(format!("connection {i}: {}", describe(&e)));
                fail(&mut report, &e);
            }
            Some(Err(Failed::Verbs(e))) => {
                log(format!("connection {i}: {e}"));
                *report.failures.entry(e).or_default() += 1;
            }
            None => fail(
                &mut report,
                &Error::new("connect", status::INVALID_PARAMETER),
            ),
        }
    }
    report.setup_wall = wall.elapsed();

    // Teardown: every established connection, all at once.
    let wall = Instant::now();
    let deadline = wall + cfg.deadline;
    let spans: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut pending = BTreeMap::new();
    for (i, ep) in live {
        if ep.query().is_ok_and(|q| q.state == ep_state::DREQ_RCVD) {
            report.peer_disconnects += 1;
            log(format!(
                "connection {i}: the peer disconnected it first (its DREQ came in)"
            ));
        }
        let (spans2, ep2) = (Arc::clone(&spans), ep.clone());
        let start = Instant::now();
        let disconnect = ep.disconnect_async(&[]);
        spawn(
            async move {
                disconnect.await?;
                lock(&spans2).push((start, Instant::now()));
                drop(ep2);
                Ok::<(), Error>(())
            },
            &Overlapped::with_port(&port, i),
        );
        pending.insert(i, ep);
    }
    while !pending.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            for ep in pending.values() {
                ep.cancel();
            }
            for _ in pending.values() {
                fail(&mut report, &Error::new("disconnect", status::IO_TIMEOUT));
            }
            break;
        }
        let Some(packet) = port.get(Some(left.min(Duration::from_millis(200)))) else {
            continue;
        };
        if pending.remove(&packet.key).is_none() {
            continue;
        }
        match packet.overlapped.result::<Result<()>>() {
            Some(Ok(())) => report.disconnected += 1,
            Some(Err(e)) => fail(&mut report, &e),
            None => {}
        }
    }
    report.teardown_wall = wall.elapsed();
    let connect_spans: Vec<(Instant, Instant)> = lock(&times)
        .iter()
        .flatten()
        .filter_map(|t| t.rep.map(|r| (t.req, r)))
        .collect();
    report.connect = StepTimes::of(&connect_spans);
    let establish_spans: Vec<(Instant, Instant)> = lock(&times)
        .iter()
        .flatten()
        .filter_map(|t| t.rtu.map(|r| (t.req, r)))
        .collect();
    report.establish = StepTimes::of(&establish_spans);
    report.first_establish = lock(&times)
        .first()
        .and_then(Option::as_ref)
        .and_then(|t| t.rtu.map(|r| r - t.req));
    // The QPs go once their connections are down (cmtime: rdma_destroy_qp after
    // rdma_disconnect).
    drop(qp_of);
    report.disconnect = StepTimes::of(&lock(&spans));
    report
}

/// How the passive side ends a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Wait for the peer's DREQ and answer it with a DREP.
    Peer,
    /// Send a DREQ as soon as the connection is established.
    Us,
}

/// The passive side's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeConfig {
    /// The service ID to listen on.
    pub service_id: u64,
    /// Connections to serve.
    pub count: usize,
    /// Longest wait for the next REQ, and for a connection's end.
    pub wait: Duration,
    /// Who ends the connections.
    pub ending: Ending,
    /// The QPN of the REP for connection 0 (connection `k` gets `qpn_base + k`).
    pub qpn_base: u32,
}

/// What [`serve`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServeReport {
    /// REQs handed over by the listener.
    pub requests: usize,
    /// Of those, REQs whose private data held a valid RDMA-CM IP header naming this side.
    pub ip_headers: usize,
    /// Established (RTU received).
    pub established: usize,
    /// Ended (DREQ/DREP exchanged, either way).
    pub completed: usize,
    /// Failures by description.
    pub failures: BTreeMap<String, usize>,
    /// The peer's REJ reasons (for our REP).
    pub rejections: BTreeMap<u16, usize>,
    /// First REQ to last connection ended.
    pub wall: Duration,
    /// REQ handed over -> RTU received (with real QPs: the QP made and moved to RTS on
    /// the way, as rdma-core cmtime's server does before rdma_accept).
    pub establish: StepTimes,
}

struct ServeShared {
    established: AtomicUsize,
    completed: AtomicUsize,
    finished: AtomicUsize,
    failures: Mutex<BTreeMap<String, usize>>,
    rejections: Mutex<BTreeMap<u16, usize>>,
    live: Mutex<BTreeMap<usize, ConnectEndpoint>>,
    establish: Mutex<Vec<(Instant, Instant)>>,
}

/// The passive side, on `provider` of the node at `local`: listens on `cfg.service_id`
/// and serves `cfg.count` connections as their REQs come (all at once if they come at
/// once).
pub fn serve(
    provider: &Provider,
    local: Ipv4Addr,
    cfg: &ServeConfig,
    log: &(dyn Fn(String) + Sync),
) -> Result<ServeReport> {
    serve_on(provider, local, None, cfg, log)
}

/// [`serve`], each connection with a real QP from `qps` or a made-up QPN.
pub fn serve_on(
    provider: &Provider,
    local: Ipv4Addr,
    qps: Option<&dyn Qps>,
    cfg: &ServeConfig,
    log: &(dyn Fn(String) + Sync),
) -> Result<ServeReport> {
    let listener = provider.listen(&ListenParams {
        service_id: cfg.service_id,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: 1024,
    })?;
    log(format!("listening on service ID {:#018x}", cfg.service_id));
    let sh = Arc::new(ServeShared {
        established: AtomicUsize::new(0),
        completed: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        failures: Mutex::new(BTreeMap::new()),
        rejections: Mutex::new(BTreeMap::new()),
        live: Mutex::new(BTreeMap::new()),
        establish: Mutex::new(Vec::new()),
    });
    let mut report = ServeReport::default();
    let mut first: Option<Instant> = None;
    for k in 0..cfg.count {
        let req =
            crate::exchange::bounded(cfg.wait, || listener.cancel(), listener.get_request_async());
        let req = match req {
            Ok(r) => r,
            Err(e) => {
                log(format!("no REQ for connection {k}: {}", describe(&e)));
                *lock(&sh.failures)
                    .entry(format!("listen: {}", describe(&e)))
                    .or_default() += 1;
                break;
            }
        };
        first.get_or_insert_with(Instant::now);
        report.requests += 1;
        if let Some(h) = req.ip_header() {
            if h.dst_addr == IpAddr::V4(local) {
                report.ip_headers += 1;
            }
            if k < 4 || cfg.count <= 4 {
                log(format!(
                    "connection {k}: REQ from CA {:#018x}, QPN {:#08x}, RDMA-CM IP header {}:{} -> {}",
                    req.remote_ca_guid, req.remote_qpn, h.src_addr, h.src_port, h.dst_addr
                ));
            }
        } else {
            log(format!(
                "connection {k}: REQ from CA {:#018x}, QPN {:#08x}, without an RDMA-CM IP header",
                req.remote_ca_guid, req.remote_qpn
            ));
        }
        let t0 = Instant::now();
        let qp = match qps.map(Qps::create) {
            Some(Ok(qp)) => Some(qp),
            Some(Err(e)) => {
                log(format!("connection {k}: create QP: {e}"));
                *lock(&sh.failures)
                    .entry(format!("create QP: {e}"))
                    .or_default() += 1;
                let _ = req.endpoint.reject(RejReason::NoQp, &[]);
                continue;
            }
            None => None,
        };
        serve_one(&sh, req, k, cfg, t0, qp);
    }
    listener.cancel();
    // Every connection ends within the peer's timing or the wait; bound it anyway.
    let end = Instant::now() + cfg.wait;
    while sh.finished.load(Ordering::Acquire) < report.requests && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stuck: Vec<ConnectEndpoint> = lock(&sh.live).values().cloned().collect();
    if !stuck.is_empty() {
        log(format!(
            "{} connections not ended after {:?}: cancelled",
            stuck.len(),
            cfg.wait
        ));
        for ep in &stuck {
            ep.cancel();
        }
        let grace = Instant::now() + Duration::from_secs(2);
        while sh.finished.load(Ordering::Acquire) < report.requests && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    report.wall = first.map_or(Duration::ZERO, |f| f.elapsed());
    report.established = sh.established.load(Ordering::Acquire);
    report.completed = sh.completed.load(Ordering::Acquire);
    report.failures = std::mem::take(&mut *lock(&sh.failures));
    report.rejections = std::mem::take(&mut *lock(&sh.rejections));
    report.establish = StepTimes::of(&lock(&sh.establish));
    Ok(report)
}

fn serve_one(
    sh: &Arc<ServeShared>,
    req: ConnectionRequest,
    k: usize,
    cfg: &ServeConfig,
    t0: Instant,
    qp: Option<Box<dyn Qp>>,
) {
    let ep = req.endpoint;
    lock(&sh.live).insert(k, ep.clone());
    let sh = Arc::clone(sh);
    let qpn = qp.as_ref().map_or(cfg.qpn_base + k as u32, |qp| qp.qpn()) & 0x00ff_ffff;
    let ending = cfg.ending;
    let (rr, id) = (
        req.peer_initiator_depth.min(1),
        req.peer_responder_resources.min(1),
    );
    spawn(
        async move {
            let result = async {
                let t = ep.prepare_accept(&AcceptParams {
                    qpn,
                    starting_psn: None,
                    responder_resources: rr,
                    initiator_depth: id,
                    rnr_retry_count: 7,
                    failover_accepted: Failover::NotSupported,
                    flow_control: true,
                    srq: false,
                    private_data: &[],
                })?;
                // The QP in RTS before the REP goes, as rdma_accept moves it (librdmacm
                // ucma_modify_qp_rtr, ucma_modify_qp_rts) before the kernel sends the REP.
                if let Some(qp) = &qp {
                    for a in [&t.init, &t.rtr, &t.rts] {
                        if let Err(e) = qp.modify(a) {
                            *lock(&sh.failures).entry(e).or_default() += 1;
                            return ep.reject_async(RejReason::NoQp, &[]).await;
                        }
                    }
                }
                ep.accept_async().await?;
                lock(&sh.establish).push((t0, Instant::now()));
                sh.established.fetch_add(1, Ordering::AcqRel);
                match ending {
                    Ending::Peer => {
                        ep.notify_disconnect_async().await?;
                        ep.disconnect_async(&[]).await?;
                    }
                    Ending::Us => ep.disconnect_async(&[]).await?,
                }
                sh.completed.fetch_add(1, Ordering::AcqRel);
                Ok::<(), Error>(())
            }
            .await;
            if let Err(e) = result {
                *lock(&sh.failures).entry(describe(&e)).or_default() += 1;
                if let Some(r) = e.reject_reason() {
                    *lock(&sh.rejections).entry(u16::from(r)).or_default() += 1;
                }
            }
            // The QP goes once its connection is down.
            drop(qp);
            lock(&sh.live).remove(&k);
            sh.finished.fetch_add(1, Ordering::AcqRel);
        },
        &Overlapped::new(),
    );
}

/// A REJ reason's name, for reports.
pub fn rej_reason_name(code: u16) -> String {
    format!("{:?} ({code})", RejReason::from(code))
}
