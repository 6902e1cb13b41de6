//! Connections that carry data: RC QPs on a real RDMA device (soft-RoCE, a RoCE NIC) set
//! up by the whole ibcm stack (user library -> IOCTL records -> dispatch -> engine ->
//! ib_umad, `ibcm_linux`), with verified traffic on them.
//!
//! - [`Rc`]: the driver on the device (the user library's `rdma` backend: its dispatch
//!   layer and engine on the device's QP1 through ib_umad), a [`Provider`] open on it,
//!   and the device's verbs context.
//! - [`connect`] / [`connect_or_accept`]: one connection, the QP moved through INIT, RTR
//!   and RTS with exactly the attributes the engine returned (as a Windows verbs provider
//!   would).
//! - [`rping_client`] / [`rping_server`]: rdma-core `rping`'s exchange (librdmacm/examples
//!   /rping.c), so either side can be Linux `rping -v -V`: the client advertises a buffer
//!   holding `"rdma-ping-%d: "` and a letter run, the server RDMA READs it, the client
//!   advertises a sink, the server RDMA WRITEs the data back, and the client compares.
//! - [`bw_client`] / [`bw_server`]: SEND and RDMA READ bandwidth between two ibcm nodes,
//!   every byte checked.
//!
//! After each connection [`QpQuery`] reports the QP as the device holds it, for the
//! harness to hold against the peer's: our sq_psn must be the peer's rq_psn and the
//! reverse, the QPNs crossed, the MTU equal, and the read limits crossed.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibcm::backend::rdma::Device;
use ibcm::{
    AcceptParams, ConnectEndpoint, ConnectParams, Failover, IpServiceId, ListenParams, Listener,
    Mtu, Provider, Transport,
};
use ibcm_linux::port_events::PortEvents;
use ibcm_linux::umad::UmadPort;
use ibcm_linux::verbs::{Completion, Context, Cq, QpQuery, RcQp, Region};

use crate::cmtime::Timing;
use crate::rocev2::{PATH_MTU, describe, rdma_cm_private_data};

/// The send and receive queue depth of every QP here (rping's RPING_SQ_DEPTH).
pub const QP_DEPTH: u32 = 16;
/// The size of rping's `struct rping_rdma_info` (`__be64 buf; __be32 rkey; __be32 size`),
/// the only message its SENDs carry.
pub const RPING_INFO_LEN: usize = 16;

type Res<T> = std::result::Result<T, String>;

/// A device with ibcm on its QP1 (the user library's `rdma` backend) and a verbs context.
pub struct Rc {
    /// The driver on the device (QP1 through ib_umad, port events), its verbs context.
    pub device: Arc<Device>,
    /// A provider (an open handle) on it.
    pub provider: Provider,
    /// Verbs on the device.
    pub ctx: Arc<Context>,
    /// The path MTU this side asks for: RoCE's (ibcm-host `PATH_MTU`), or the port's active
    /// MTU if smaller (`ibv_query_port`; perftest announces its port's active MTU,
    /// perftest_communication.c:1865 `set_mtu`; rxe's follows its netdev's MTU).
    pub path_mtu: Mtu,
}

impl Rc {
    /// Starts ibcm on `device`'s port 1 at `local` (without a name, on the first device
    /// libibverbs lists, as perftest picks) and opens a provider on it.
    pub fn start(device: Option<&str>, local: Ipv4Addr) -> Res<Self> {
        let device = Device::start(device, 1, local).map_err(|e| e.to_string())?;
        let provider = Provider::open_rdma(&device).map_err(|e| e.to_string())?;
        let ctx = Arc::clone(device.verbs());
        let active = ctx
            .port_state(1)
            .map_err(|e| format!("port 1 of the device: {e}"))?
            .active_mtu;
        let path_mtu = match u8::try_from(active) {
            // ibv_mtu numbers the MTUs as IBA's codes (1 = 256 .. 5 = 4096).
            Ok(code @ 1..=5) => Mtu::from(code.min(u8::from(PATH_MTU))),
            _ => PATH_MTU,
        };
        Ok(Self {
            device,
            provider,
            ctx,
            path_mtu,
        })
    }

    /// The umad port (addresses, paths, counts).
    pub fn port(&self) -> &UmadPort {
        self.device.port()
    }

    /// The device's port events, told to the engine.
    pub fn events(&self) -> &PortEvents {
        self.device.events()
    }
}

/// A connection with its QP.
pub struct Conn {
    /// The CM endpoint.
    pub ep: ConnectEndpoint,
    /// The QP, in RTS.
    pub qp: RcQp,
    /// From the REQ (sent or received) to the connection being established here.
    pub setup: Duration,
    /// From the REQ to the peer's answer (the REP, active) or to our REP's going out
    /// (passive: the QP created and moved to RTS on the way).
    pub answer: Duration,
    /// Active: the QP's move to INIT, before the REQ (outside `setup`, as librdmacm's
    /// is outside rdma_connect).
    pub init: Option<Duration>,
    /// Each step of the setup and when it ended, from the REQ sent (active) or taken
    /// from the listener (passive).
    pub steps: Steps,
    /// The peer's QP as a Linux CM sets it from this connection's REQ and REP.
    pub peer_qp: LinuxQp,
    /// The read limits the peer's REQ (passive) or REP (active) carried, before any
    /// bounding: (responder resources, initiator depth).
    pub peer_read_limits: (u8, u8),
}

/// The steps of a connection's setup, each with the time it ended since the start.
#[derive(Debug, Clone)]
pub struct Steps {
    t0: Instant,
    ends: Vec<(&'static str, Duration)>,
}

impl Steps {
    /// Starts the clock.
    pub fn start() -> Self {
        Self {
            t0: Instant::now(),
            ends: Vec::with_capacity(8),
        }
    }

    /// Step `name` ended now (also a trace point, `-vv`, to set beside the driver's).
    pub fn end(&mut self, name: &'static str) {
        let at = self.t0.elapsed();
        tracing::debug!(target: "ibcm", step = name, at_us = at.as_micros() as u64, "setup step done");
        self.ends.push((name, at));
    }

    /// Since the start.
    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    /// `name +ms (at ms)` for each step, the step's own time then its end since the
    /// start.
    pub fn line(&self) -> String {
        let mut prev = Duration::ZERO;
        let mut out = Vec::with_capacity(self.ends.len());
        for (name, at) in &self.ends {
            out.push(format!(
                "{name} {:.3} (at {:.3})",
                at.saturating_sub(prev).as_secs_f64() * 1e3,
                at.as_secs_f64() * 1e3
            ));
            prev = *at;
        }
        out.join(", ")
    }
}

/// What a Linux peer's CM puts on its QP, from the connection's REQ and REP (the REP's
/// read limits, IBA Table 110; the REQ's PathMTU, Table 106):
///
/// - read limits, Linux passive (we connect): its REP's own values. librdmacm's
///   `rdma_accept` takes the application's numbers as given (rdma-core v44.0
///   librdmacm/cma.c:1918-1936) and modifies the QP with them; the kernel's REP carries the
///   same (cm.c `cm_format_rep`).
/// - read limits, Linux active (we accept): our REP's, crossed. librdmacm leaves the
///   kernel's values (cma.c:2346-2350, the RDMA_MAX_* sentinels), which cm.c's
///   `cm_rep_handler` takes from the REP crossed (initiator depth := REP
///   ResponderResources, responder resources := REP InitiatorDepth) and
///   `cm_init_qp_rtr_attr` / `cm_init_qp_rts_attr` apply.
/// - path MTU, either role: the REQ's PathMTU (passive: `cm_req_handler` keeps it for
///   `cm_init_qp_rtr_attr`; active: the path the REQ was formatted from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinuxQp {
    /// RDMA READs it issues at once.
    pub max_rd_atomic: u8,
    /// RDMA READs it serves at once.
    pub max_dest_rd_atomic: u8,
    /// Path MTU code.
    pub path_mtu: u8,
}

impl LinuxQp {
    /// One line for the harness.
    pub fn line(&self) -> String {
        format!(
            "qp-linux-cm max_rd_atomic={} max_dest_rd_atomic={} path_mtu={}",
            self.max_rd_atomic, self.max_dest_rd_atomic, self.path_mtu
        )
    }
}

/// The read limits and timing of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Responder resources offered (RDMA READs this side serves at once).
    pub responder_resources: u8,
    /// Initiator depth asked for (RDMA READs this side issues at once).
    pub initiator_depth: u8,
    /// CM timing.
    pub timing: Timing,
}

fn modify(qp: &RcQp, attrs: &ibcm::QpAttributes) -> Res<()> {
    qp.modify(attrs).map_err(|e| e.to_string())
}

/// Connects to the RDMA-CM listener on `peer`'s TCP port `rdma_port`; `before_rtu` posts
/// the receives the peer's first messages need, with the QP in RTS.
pub fn connect(
    rc: &Rc,
    peer: Ipv4Addr,
    rdma_port: u16,
    limits: &Limits,
    before_rtu: impl FnOnce(&RcQp) -> Res<()>,
) -> Res<Conn> {
    let qp = RcQp::create(&rc.ctx, QP_DEPTH).map_err(|e| e.to_string())?;
    connect_qp(rc, qp, peer, rdma_port, limits, before_rtu)
}

/// [`connect`] with the caller's QP.
pub fn connect_qp(
    rc: &Rc,
    qp: RcQp,
    peer: Ipv4Addr,
    rdma_port: u16,
    limits: &Limits,
    before_rtu: impl FnOnce(&RcQp) -> Res<()>,
) -> Res<Conn> {
    let local = rc.port().local();
    let private_data =
        rdma_cm_private_data(local, peer, 0xc000 | (std::process::id() as u16 & 0x3fff));
    let params = ConnectParams {
        service_id: IpServiceId::tcp(rdma_port).to_service_id(),
        port: 1,
        pkey: 0xffff,
        qpn: qp.qpn(),
        transport: Transport::Rc,
        starting_psn: None,
        primary_path: rc.port().path_to(peer, limits.timing.packet_life_time),
        alternate_path: None,
        path_mtu: rc.path_mtu,
        responder_resources: limits.responder_resources,
        initiator_depth: limits.initiator_depth,
        remote_cm_response_timeout: limits.timing.cm_response_timeout,
        local_cm_response_timeout: limits.timing.cm_response_timeout,
        retry_count: 7,
        rnr_retry_count: 7,
        max_cm_retries: limits.timing.max_cm_retries,
        srq: false,
        flow_control: true,
        private_data: &private_data,
    };
    let ep = rc.provider.connect_endpoint().map_err(|e| describe(&e))?;
    // INIT before the REQ, as librdmacm's rdma_create_qp does (ucma_init_conn_qp): the
    // attributes are the port's, the P_Key's and the responder resources', no round
    // trip to the CM (they are what it gives from the REQ on).
    let t = Instant::now();
    let init = params.init_attributes();
    modify(&qp, &init)?;
    let init_time = t.elapsed();
    let mut steps = Steps::start();
    let reply = ep
        .connect(&params)
        .map_err(|e| format!("connect: {}", describe(&e)))?;
    steps.end("REQ->REP");
    let answer = steps.elapsed();
    if let Some(again) = reply.init_again(&init) {
        // The REP took this side's responder resources to or from 0: INIT -> INIT with
        // the CM's access flags (Linux cma.c cma_modify_qp_rtr, librdmacm
        // ucma_modify_qp_rtr).
        modify(&qp, again)?;
        steps.end("qp-init-again");
    }
    modify(&qp, &reply.rtr)?;
    steps.end("qp-rtr");
    modify(&qp, &reply.rts)?;
    steps.end("qp-rts");
    before_rtu(&qp)?;
    steps.end("post-recv");
    // The RTU is written when the IOCTL is issued (the backend sends what the call
    // queued before it returns); its completion comes a thread switch later.
    let rtu = ep.rtu_async(&[]);
    steps.end("RTU");
    ibcm::block_on(rtu).map_err(|e| format!("rtu: {}", describe(&e)))?;
    // The peer is passive: its REP's own values (LinuxQp).
    let peer_qp = LinuxQp {
        max_rd_atomic: reply.peer_initiator_depth,
        max_dest_rd_atomic: reply.peer_responder_resources,
        path_mtu: u8::from(rc.path_mtu),
    };
    Ok(Conn {
        ep,
        qp,
        setup: steps.elapsed(),
        answer,
        init: Some(init_time),
        steps,
        peer_qp,
        peer_read_limits: (reply.peer_responder_resources, reply.peer_initiator_depth),
    })
}

/// The client's connection to `server` or, without one, the server's, on RDMA-CM TCP port
/// `rdma_port` (the server waits `wait` for the REQ). `resources` (the connection's
/// registered buffers) are made before the REQ on the client and, with the QP, once the
/// REQ is in on the server, as rping does (rping.c `rping_run_client`; `rping_run_server`:
/// `rping_setup_qp`, `rping_setup_buffers`, then `rping_accept`). `before` posts the
/// receives the peer's first messages need, with the QP in RTS.
#[allow(clippy::too_many_arguments)]
pub fn connect_or_accept<R>(
    rc: &Rc,
    server: Option<Ipv4Addr>,
    rdma_port: u16,
    limits: &Limits,
    wait: Duration,
    resources: impl FnOnce() -> Res<R>,
    before: impl FnOnce(&RcQp, &R) -> Res<()>,
    log: &dyn Fn(String),
) -> Res<(Conn, R)> {
    if let Some(peer) = server {
        let made = resources()?;
        let conn = connect(rc, peer, rdma_port, limits, |qp| before(qp, &made))?;
        return Ok((conn, made));
    }
    let listener = listen(rc, rdma_port, log)?;
    let make = || {
        let qp = RcQp::create(&rc.ctx, QP_DEPTH).map_err(|e| e.to_string())?;
        Ok((qp, resources()?))
    };
    accept_next(&listener, wait, limits, make, before, log)
}

/// Listens on RDMA-CM TCP port `rdma_port`.
pub fn listen(rc: &Rc, rdma_port: u16, log: &dyn Fn(String)) -> Res<Listener> {
    let service_id = IpServiceId::tcp(rdma_port).to_service_id();
    let listener = rc
        .provider
        .listen(&ListenParams {
            service_id,
            service_mask: u64::MAX,
            port: None,
            compare: None,
            backlog: 16,
        })
        .map_err(|e| describe(&e))?;
    log(format!("listening on service ID {service_id:#018x}"));
    Ok(listener)
}

/// The server's side of [`connect_or_accept`] on the caller's listener (cancelled once the
/// REP is answered) with the caller's QP, made before the REQ.
pub fn accept_qp(
    listener: &Listener,
    qp: RcQp,
    limits: &Limits,
    wait: Duration,
    before_rep: impl FnOnce(&RcQp) -> Res<()>,
    log: &dyn Fn(String),
) -> Res<Conn> {
    let make = || Ok((qp, ()));
    let (conn, ()) = accept_next(listener, wait, limits, make, |qp, ()| before_rep(qp), log)?;
    Ok(conn)
}

/// Answers the next REQ `listener` is given within `wait` (then cancels it): `make` gives
/// the QP and the connection's buffers once the REQ is in (a caller's QP made before it
/// costs nothing there), the REP goes once the QP is in RTS and `before_rep` has posted.
fn accept_next<R>(
    listener: &Listener,
    wait: Duration,
    limits: &Limits,
    make: impl FnOnce() -> Res<(RcQp, R)>,
    before_rep: impl FnOnce(&RcQp, &R) -> Res<()>,
    log: &dyn Fn(String),
) -> Res<(Conn, R)> {
    let req = crate::exchange::bounded(wait, || listener.cancel(), listener.get_request_async())
        .map_err(|e| format!("no REQ: {}", describe(&e)))?;
    let mut steps = Steps::start();
    log(format!(
        "REQ from CA {:#018x}, QPN {:#x}, responder resources {}, initiator depth {}",
        req.remote_ca_guid, req.remote_qpn, req.peer_responder_resources, req.peer_initiator_depth
    ));
    let (qp, made) = make()?;
    steps.end("qp-and-buffers");
    let ep = req.endpoint;
    // IBA 12.7.29/12.7.30 (REP): responder resources no more than the REQ's initiator
    // depth, initiator depth no more than the REQ's responder resources.
    let responder_resources = limits.responder_resources.min(req.peer_initiator_depth);
    let initiator_depth = limits.initiator_depth.min(req.peer_responder_resources);
    // The peer is active: our REP crossed, the REQ's MTU (LinuxQp).
    let peer_qp = LinuxQp {
        max_rd_atomic: responder_resources,
        max_dest_rd_atomic: initiator_depth,
        path_mtu: u8::from(req.path_mtu),
    };
    let t = ep
        .prepare_accept(&AcceptParams {
            qpn: qp.qpn(),
            starting_psn: None,
            responder_resources,
            initiator_depth,
            rnr_retry_count: 7,
            failover_accepted: Failover::NotSupported,
            flow_control: true,
            srq: false,
            private_data: &[],
        })
        .map_err(|e| format!("accept: {}", describe(&e)))?;
    steps.end("prepare-accept");
    modify(&qp, &t.init)?;
    steps.end("qp-init");
    modify(&qp, &t.rtr)?;
    steps.end("qp-rtr");
    modify(&qp, &t.rts)?;
    steps.end("qp-rts");
    before_rep(&qp, &made)?;
    steps.end("post-recv");
    let answer = steps.elapsed();
    crate::exchange::bounded(wait, || ep.cancel(), ep.accept_async())
        .map_err(|e| format!("accept: {}", describe(&e)))?;
    steps.end("REP->RTU");
    listener.cancel();
    let conn = Conn {
        ep,
        qp,
        setup: steps.elapsed(),
        answer,
        init: None,
        steps,
        peer_qp,
        peer_read_limits: (req.peer_responder_resources, req.peer_initiator_depth),
    };
    Ok((conn, made))
}

/// The send and receive queue depth of cmtime's QPs (rdma-core cmtime.c, v44
/// librdmacm/examples/cmtime.c:653-656: `max_send_wr = 1`, `max_recv_wr = 1`).
pub const CMTIME_QP_DEPTH: u32 = 1;

/// Real QPs on the device for `ibcm cmtime`, `listen` and `connect`
/// ([`crate::rocev2::connect_on`], [`crate::rocev2::serve_on`]): RC QPs of cmtime's size,
/// all on one CQ without a channel, as cmtime's are (v44 cmtime.c `open_verbs`: one
/// `ibv_create_cq(id->verbs, 1, ...)` for the process; `create_qp`: every QP on it). They
/// carry no data: a CQ and a channel of each QP's own would cost three more system calls
/// and the CQ's queue mapping per connection, inside the passive side's setup.
pub struct VerbsQps(Arc<Cq>);

impl VerbsQps {
    /// The shared CQ on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Res<Self> {
        Cq::shared(ctx, CMTIME_QP_DEPTH)
            .map(Self)
            .map_err(|e| e.to_string())
    }
}

impl crate::rocev2::Qps for VerbsQps {
    fn create(&self) -> Res<Box<dyn crate::rocev2::Qp>> {
        RcQp::create_on(&self.0, CMTIME_QP_DEPTH)
            .map(|qp| Box::new(qp) as Box<dyn crate::rocev2::Qp>)
            .map_err(|e| e.to_string())
    }
}

impl crate::rocev2::Qp for RcQp {
    fn qpn(&self) -> u32 {
        RcQp::qpn(self)
    }

    fn modify(&self, attributes: &ibcm::QpAttributes) -> Res<()> {
        RcQp::modify(self, attributes).map_err(|e| e.to_string())
    }
}

/// One line describing a QP as the device holds it, `key=value` (decimal), for the
/// harness.
pub fn qp_line(who: &str, q: &QpQuery) -> String {
    format!(
        "qp-{who} qpn={} dest_qpn={} sq_psn={} rq_psn={} path_mtu={} max_rd_atomic={} max_dest_rd_atomic={} timeout={} retry_cnt={} rnr_retry={} state={}",
        q.qpn,
        q.dest_qpn,
        q.sq_psn,
        q.rq_psn,
        q.path_mtu,
        q.max_rd_atomic,
        q.max_dest_rd_atomic,
        q.timeout,
        q.retry_cnt,
        q.rnr_retry,
        q.state
    )
}

/// `IBV_WC_WR_FLUSH_ERR`: the QP went to ERR (the connection is ending) with the work
/// request still posted.
pub(crate) const WC_WR_FLUSH_ERR: u32 = 5;

/// How a failure that is a flush starts: the QP was moved to ERR under the run.
pub const FLUSHED: &str = "flushed";

/// The next completion within `limit`, failing unless it succeeded.
fn next_ok(qp: &RcQp, limit: Duration, what: &str) -> Res<Completion> {
    let c = qp
        .next(Instant::now() + limit)
        .map_err(|e| format!("{what}: {e}"))?;
    if c.ok() {
        Ok(c)
    } else if c.status == WC_WR_FLUSH_ERR {
        Err(format!("{FLUSHED}: {what}"))
    } else {
        Err(format!(
            "{what}: completion {} ({})",
            c.status_text(),
            c.status
        ))
    }
}

/// Waits for the completion of work request `wr_id`, collecting the others in `seen`.
fn wait_for(
    qp: &RcQp,
    wr_id: u64,
    limit: Duration,
    seen: &mut Vec<Completion>,
    what: &str,
) -> Res<Completion> {
    if let Some(i) = seen.iter().position(|c| c.wr_id == wr_id) {
        return Ok(seen.remove(i));
    }
    let end = Instant::now() + limit;
    loop {
        let c = next_ok(qp, end.saturating_duration_since(Instant::now()), what)?;
        if c.wr_id == wr_id {
            return Ok(c);
        }
        seen.push(c);
    }
}

/// rping's client buffer for ping `ping` (rping.c, rping_test_client): "rdma-ping-%d: "
/// then letters from `start` cycling through 'A'..='z' (65..=122), the last byte NUL.
pub fn rping_pattern(ping: u32, size: usize) -> Vec<u8> {
    let mut buf = format!("rdma-ping-{ping}: ").into_bytes();
    buf.truncate(size);
    // `start` begins at 65 and steps once per ping, wrapping past 122.
    let mut c = 65 + (ping % 58) as u8;
    while buf.len() < size {
        buf.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
    buf
}

fn info(addr: u64, rkey: u32, size: u32) -> [u8; RPING_INFO_LEN] {
    let mut b = [0u8; RPING_INFO_LEN];
    b[..8].copy_from_slice(&addr.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

fn parse_info(b: &[u8]) -> Option<(u64, u32, u32)> {
    let addr = u64::from_be_bytes(b.get(..8)?.try_into().ok()?);
    let rkey = u32::from_be_bytes(b.get(8..12)?.try_into().ok()?);
    let size = u32::from_be_bytes(b.get(12..16)?.try_into().ok()?);
    Some((addr, rkey, size))
}

/// What an rping run did.
#[derive(Debug, Clone, Default)]
pub struct RpingReport {
    /// Pings whose data came back (client) or was read (server) as sent.
    pub verified: u32,
    /// Pings attempted.
    pub pings: u32,
    /// Time from the first ping to the last.
    pub elapsed: Duration,
    /// Bytes moved by RDMA READ and WRITE.
    pub bytes: u64,
}

const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;

/// rping's client on `conn`: `count` pings of `size` bytes, each verified.
pub fn rping_client(
    rc: &Rc,
    conn: &Conn,
    recv: &Region,
    count: u32,
    size: usize,
    limit: Duration,
    log: &dyn Fn(String),
) -> Res<RpingReport> {
    let qp = &conn.qp;
    let mut start = Region::new(&rc.ctx, size).map_err(|e| e.to_string())?;
    let sink = Region::new(&rc.ctx, size).map_err(|e| e.to_string())?;
    let mut send = Region::new(&rc.ctx, RPING_INFO_LEN).map_err(|e| e.to_string())?;
    let mut seen = Vec::new();
    let mut report = RpingReport::default();
    let t0 = Instant::now();
    for ping in 0..count {
        report.pings += 1;
        let want = rping_pattern(ping, size);
        start.bytes_mut().copy_from_slice(&want);
        send.bytes_mut()
            .copy_from_slice(&info(start.addr(), start.rkey(), size as u32));
        qp.post_send(&send, 0, RPING_INFO_LEN, WR_SEND)
            .map_err(|e| e.to_string())?;
        wait_for(qp, WR_SEND, limit, &mut seen, "send (source advertisement)")?;
        // The server reads the buffer, then says go ahead.
        let c = wait_for(qp, WR_RECV, limit, &mut seen, "receive (go ahead)")?;
        if c.byte_len as usize != RPING_INFO_LEN {
            return Err(format!("go ahead of {} bytes", c.byte_len));
        }
        qp.post_recv(recv, 0, RPING_INFO_LEN, WR_RECV)
            .map_err(|e| e.to_string())?;
        send.bytes_mut()
            .copy_from_slice(&info(sink.addr(), sink.rkey(), size as u32));
        qp.post_send(&send, 0, RPING_INFO_LEN, WR_SEND)
            .map_err(|e| e.to_string())?;
        wait_for(qp, WR_SEND, limit, &mut seen, "send (sink advertisement)")?;
        let c = wait_for(qp, WR_RECV, limit, &mut seen, "receive (write done)")?;
        if c.byte_len as usize != RPING_INFO_LEN {
            return Err(format!("write done of {} bytes", c.byte_len));
        }
        qp.post_recv(recv, 0, RPING_INFO_LEN, WR_RECV)
            .map_err(|e| e.to_string())?;
        report.bytes += 2 * size as u64;
        if sink.bytes() == want.as_slice() {
            report.verified += 1;
            if ping < 4 {
                let text = String::from_utf8_lossy(&want[..want.len().saturating_sub(1).min(40)]);
                log(format!("ping data: {text}"));
            }
        } else {
            return Err(format!(
                "ping {ping}: the data written back differs from what was sent"
            ));
        }
    }
    report.elapsed = t0.elapsed();
    Ok(report)
}

/// rping's server on `conn` until the peer disconnects (or `limit` passes without a
/// message): each advertised buffer is RDMA READ, checked against rping's pattern, and
/// written back to the advertised sink.
pub fn rping_server(
    rc: &Rc,
    conn: &Conn,
    recv: &Region,
    size: usize,
    limit: Duration,
    log: &dyn Fn(String),
) -> Res<RpingReport> {
    let qp = &conn.qp;
    let mut data = Region::new(&rc.ctx, size).map_err(|e| e.to_string())?;
    let send = Region::new(&rc.ctx, RPING_INFO_LEN).map_err(|e| e.to_string())?;
    let mut seen = Vec::new();
    let mut report = RpingReport::default();
    let mut t0 = None;
    let mut ping = 0u32;
    loop {
        // The source advertisement, or the end: a flush when the QP goes to ERR on the
        // peer's DREQ, or nothing for `limit`.
        let c = match qp.next(Instant::now() + limit) {
            Ok(c) => c,
            Err(e) => return Err(format!("waiting for a ping: {e}")),
        };
        if !c.ok() {
            log(format!("ping wait ended: {}", c.status_text()));
            if c.status != WC_WR_FLUSH_ERR {
                return Err(format!("waiting for a ping: {}", c.status_text()));
            }
            break;
        }
        if c.wr_id != WR_RECV {
            seen.push(c);
            continue;
        }
        t0.get_or_insert_with(Instant::now);
        report.pings += 1;
        match serve_ping(
            qp, recv, &mut data, &send, size, ping, limit, &mut seen, log,
        ) {
            Ok((verified, bytes)) => {
                report.verified += u32::from(verified);
                report.bytes += bytes;
            }
            Err(e) if e.starts_with(FLUSHED) => {
                // The peer ended the connection with this ping in flight.
                log(format!("ping {ping} cut short: {e}"));
                report.pings -= 1;
                break;
            }
            Err(e) => return Err(e),
        }
        ping += 1;
    }
    report.elapsed = t0.map_or(Duration::ZERO, |t| t.elapsed());
    Ok(report)
}

/// One ping of rping's server, its advertisement received: (the data was rping's, bytes
/// moved).
#[allow(clippy::too_many_arguments)]
fn serve_ping(
    qp: &RcQp,
    recv: &Region,
    data: &mut Region,
    send: &Region,
    size: usize,
    ping: u32,
    limit: Duration,
    seen: &mut Vec<Completion>,
    log: &dyn Fn(String),
) -> Res<(bool, u64)> {
    let (addr, rkey, len) = parse_info(recv.bytes()).ok_or("short advertisement")?;
    let len = len as usize;
    if len > size {
        return Err(format!("advertised {len} bytes, the buffer holds {size}"));
    }
    qp.post_recv(recv, 0, RPING_INFO_LEN, WR_RECV)
        .map_err(|e| e.to_string())?;
    data.bytes_mut().fill(0);
    qp.post_read(data, 0, len, addr, rkey, WR_READ)
        .map_err(|e| e.to_string())?;
    wait_for(qp, WR_READ, limit, seen, "RDMA READ")?;
    let got = &data.bytes()[..len];
    let verified = got == rping_pattern(ping, len).as_slice();
    if !verified {
        log(format!(
            "ping {ping}: RDMA READ data is not rping's pattern"
        ));
    }
    if ping < 4 {
        let text = String::from_utf8_lossy(&got[..len.saturating_sub(1).min(40)]);
        log(format!("server ping data: {text}"));
    }
    // rping writes strlen + 1 bytes back: the whole buffer for its pattern.
    let n = got.iter().position(|&b| b == 0).map_or(len, |i| i + 1);
    qp.post_send(send, 0, RPING_INFO_LEN, WR_SEND)
        .map_err(|e| e.to_string())?;
    let c = wait_for(qp, WR_RECV, limit, seen, "receive (sink advertisement)")?;
    let (addr, rkey, _) = parse_info(recv.bytes()).ok_or("short advertisement")?;
    if c.byte_len as usize != RPING_INFO_LEN {
        return Err(format!("sink advertisement of {} bytes", c.byte_len));
    }
    qp.post_recv(recv, 0, RPING_INFO_LEN, WR_RECV)
        .map_err(|e| e.to_string())?;
    qp.post_write(data, 0, n, addr, rkey, WR_WRITE)
        .map_err(|e| e.to_string())?;
    wait_for(qp, WR_WRITE, limit, seen, "RDMA WRITE")?;
    qp.post_send(send, 0, RPING_INFO_LEN, WR_SEND)
        .map_err(|e| e.to_string())?;
    Ok((verified, (len + n) as u64))
}

/// What a bandwidth run moved.
#[derive(Debug, Clone, Copy, Default)]
pub struct BwReport {
    /// Messages (SEND) or reads (RDMA READ) completed and checked.
    pub ops: u64,
    /// Bytes.
    pub bytes: u64,
    /// From the first post to the last completion.
    pub elapsed: Duration,
}

impl BwReport {
    /// MB/s (10^6 bytes per second).
    pub fn mbps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 / s / 1e6
        } else {
            0.0
        }
    }
}

/// The bandwidth test's data: byte `i` of message `n`.
fn bw_byte(n: u64, i: usize) -> u8 {
    (n.wrapping_mul(31).wrapping_add(i as u64 * 7 + 13)) as u8
}

/// The bandwidth server: serves RDMA READs of a `size`-byte buffer and receives SENDs of
/// `size` bytes, checking each, until a 16-byte "done" message.
pub fn bw_server(
    rc: &Rc,
    conn: &Conn,
    recv: &Region,
    size: usize,
    limit: Duration,
) -> Res<BwReport> {
    let qp = &conn.qp;
    let mut source = Region::new(&rc.ctx, size).map_err(|e| e.to_string())?;
    for (i, b) in source.bytes_mut().iter_mut().enumerate() {
        *b = bw_byte(0, i);
    }
    let mut send = Region::new(&rc.ctx, RPING_INFO_LEN).map_err(|e| e.to_string())?;
    send.bytes_mut()
        .copy_from_slice(&info(source.addr(), source.rkey(), size as u32));
    qp.post_send(&send, 0, RPING_INFO_LEN, u64::MAX)
        .map_err(|e| e.to_string())?;
    let mut report = BwReport::default();
    let mut t0 = None;
    loop {
        let c = next_ok(qp, limit, "receive")?;
        if c.wr_id == u64::MAX {
            continue; // our advertisement went out
        }
        t0.get_or_insert_with(Instant::now);
        let slot = c.wr_id as usize;
        if c.byte_len as usize == RPING_INFO_LEN {
            break;
        }
        let msg = recv
            .bytes()
            .get(slot * size..(slot + 1) * size)
            .ok_or("bad slot")?;
        let n = u64::from_be_bytes(msg[..8].try_into().map_err(|_| "short")?);
        if c.byte_len as usize != size
            || msg[8..]
                .iter()
                .enumerate()
                .any(|(i, &b)| b != bw_byte(n, i + 8))
        {
            return Err(format!("message {n}: bytes differ from what was sent"));
        }
        report.ops += 1;
        report.bytes += size as u64;
        qp.post_recv(recv, slot * size, size, slot as u64)
            .map_err(|e| e.to_string())?;
    }
    report.elapsed = t0.map_or(Duration::ZERO, |t| t.elapsed());
    Ok(report)
}

/// The bandwidth client: `iters` RDMA READs of the server's buffer (each checked), then
/// `iters` SENDs of `size` bytes, `depth` in flight; ends with a 16-byte "done".
pub fn bw_client(
    rc: &Rc,
    conn: &Conn,
    recv: &Region,
    depth: usize,
    size: usize,
    iters: u64,
    limit: Duration,
) -> Res<(BwReport, BwReport)> {
    let qp = &conn.qp;
    let c = next_ok(qp, limit, "the server's advertisement")?;
    if c.byte_len as usize != RPING_INFO_LEN {
        return Err("no advertisement".into());
    }
    let (addr, rkey, len) = parse_info(recv.bytes()).ok_or("short advertisement")?;
    if len as usize != size {
        return Err(format!("the server's buffer is {len} bytes, not {size}"));
    }
    let mut buf = Region::new(&rc.ctx, depth * size).map_err(|e| e.to_string())?;
    let want: Vec<u8> = (0..size).map(|i| bw_byte(0, i)).collect();
    // RDMA READ.
    let mut read = BwReport::default();
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < iters {
        while posted < iters && posted - done < depth as u64 {
            let slot = (posted % depth as u64) as usize;
            qp.post_read(&buf, slot * size, size, addr, rkey, slot as u64)
                .map_err(|e| e.to_string())?;
            posted += 1;
        }
        let c = next_ok(qp, limit, "RDMA READ")?;
        let slot = c.wr_id as usize;
        if buf.bytes().get(slot * size..(slot + 1) * size) != Some(want.as_slice()) {
            return Err(format!("RDMA READ {done}: bytes differ from the server's"));
        }
        done += 1;
    }
    read.elapsed = t0.elapsed();
    read.ops = done;
    read.bytes = done * size as u64;
    // SEND.
    let mut sends = BwReport::default();
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < iters {
        while posted < iters && posted - done < depth as u64 {
            let slot = (posted % depth as u64) as usize;
            let msg = &mut buf.bytes_mut()[slot * size..(slot + 1) * size];
            msg[..8].copy_from_slice(&posted.to_be_bytes());
            for (i, b) in msg.iter_mut().enumerate().skip(8) {
                *b = bw_byte(posted, i);
            }
            qp.post_send(&buf, slot * size, size, slot as u64)
                .map_err(|e| e.to_string())?;
            posted += 1;
        }
        next_ok(qp, limit, "SEND")?;
        done += 1;
    }
    sends.elapsed = t0.elapsed();
    sends.ops = done;
    sends.bytes = done * size as u64;
    qp.post_send(&buf, 0, RPING_INFO_LEN, u64::MAX)
        .map_err(|e| e.to_string())?;
    next_ok(qp, limit, "done message")?;
    Ok((read, sends))
}

/// rdma-core ucmatose's data phase (librdmacm/examples/cmatose.c: post_sends, then
/// poll_cqs for the sends and for the receives): `count` SENDs of `size` bytes each way,
/// the receives posted before the connection is established. ucmatose sends whatever its
/// buffer holds, so only the count and length of each message are checked. Returns the
/// (sends, receives) completed.
///
/// `receive_first`: cmatose's client order (cmatose.c run_client: `poll_cqs(RECV_CQ_INDEX)`
/// on every connection, then `post_sends` on each): every message is received, then all
/// the connections meet at the barrier, then this one sends. Without it (the server's
/// order, run_server) the sends are posted at once and both directions run together.
pub fn messages(
    rc: &Rc,
    conn: &Conn,
    exchange: &Exchange,
    recv: &Region,
    limit: Duration,
    receive_first: Option<&std::sync::Barrier>,
) -> Res<(usize, usize)> {
    let (qp, count, size, depth) = (&conn.qp, exchange.count, exchange.size, exchange.depth);
    // The caller posted the first `min(count, depth)` receives (slots 0..): each one that
    // completes is posted again at its slot while more messages are due.
    let mut receives = Receives {
        posted: count.min(depth),
        done: 0,
    };
    let progress = |e: String, sent: usize, received: usize| {
        // Every message received and sends left: their ACKs were lost and the peer, done,
        // no longer answers the retries; rxe retries without end at retry_cnt 7 (rxe_comp.c
        // rxe_completer, COMPST_ERROR_RETRY decrements only below 7), so no error comes.
        let unacked = if received == count && sent < count {
            "; sends unacknowledged after every receive: likely ACKs lost after the peer ended its QP"
        } else {
            ""
        };
        format!(
            "{e} ({sent} of {count} sends and {received} of {count} receives completed{unacked})"
        )
    };
    if let Some(all_received) = receive_first {
        let phase = (|| -> Res<()> {
            while receives.done < count {
                let c = next_ok(qp, limit, "message").map_err(|e| progress(e, 0, receives.done))?;
                receives.take(qp, recv, exchange, &c)?;
            }
            Ok(())
        })();
        // Every connection reaches the barrier, whatever its receives did: the others wait
        // on it.
        all_received.wait();
        phase?;
    }
    let mut send = Region::new(&rc.ctx, size).map_err(|e| e.to_string())?;
    send.bytes_mut().fill(0x5a);
    // At most `depth` sends in flight: the send queue's size. Each completion makes room.
    let mut posted = 0;
    let post_send = |posted: &mut usize| -> Res<()> {
        qp.post_send(&send, 0, size, WR_SEND)
            .map_err(|e| e.to_string())?;
        *posted += 1;
        Ok(())
    };
    while posted < count.min(depth) {
        post_send(&mut posted)?;
    }
    let mut sent = 0;
    while sent < count || receives.done < count {
        let c = next_ok(qp, limit, "message").map_err(|e| progress(e, sent, receives.done))?;
        if c.opcode & IBV_WC_RECV == 0 {
            sent += 1;
            if posted < count {
                post_send(&mut posted)?;
            }
        } else {
            receives.take(qp, recv, exchange, &c)?;
        }
    }
    Ok((sent, receives.done))
}

/// A ucmatose exchange's receives: how many are posted and how many completed.
struct Receives {
    posted: usize,
    done: usize,
}

impl Receives {
    /// Counts receive completion `c` (its length checked) and posts its slot again while
    /// more messages are due.
    fn take(&mut self, qp: &RcQp, recv: &Region, exchange: &Exchange, c: &Completion) -> Res<()> {
        let size = exchange.size;
        if c.opcode & IBV_WC_RECV == 0 {
            return Err(format!(
                "a send completion (wr_id {}) before any send was posted",
                c.wr_id
            ));
        }
        if c.byte_len as usize != size {
            return Err(format!("a message of {} bytes, not {size}", c.byte_len));
        }
        self.done += 1;
        if self.posted < exchange.count {
            qp.post_recv(recv, c.wr_id as usize * size, size, c.wr_id)
                .map_err(|e| e.to_string())?;
            self.posted += 1;
        }
        Ok(())
    }
}

/// `ibv_wc_opcode`'s receive bit (verbs.h `IBV_WC_RECV = 1 << 7`): every receive
/// completion's opcode has it, no send's does.
const IBV_WC_RECV: u32 = 1 << 7;

/// A ucmatose exchange: `count` messages of `size` bytes each way, on a QP whose queues
/// are `depth` deep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// Messages each way (ucmatose's -C).
    pub count: usize,
    /// Bytes per message (ucmatose's -S).
    pub size: usize,
    /// The send and receive queues' depth: sends in flight and receives posted at most.
    pub depth: usize,
}

impl Exchange {
    /// Queues as deep as the messages, as rdma-core's cmatose sizes them (`init_node`:
    /// `max_send_wr` and `max_recv_wr` = `message_count`, every receive posted at once),
    /// but no deeper than the device allows (`max_depth`: `Context::max_queue_depth`) nor
    /// shallower than [`QP_DEPTH`]: past the device's limit the receives are posted again
    /// as they complete.
    pub fn sized(count: usize, size: usize, max_depth: u32) -> Self {
        let max = (max_depth as usize).max(1);
        Self {
            count,
            size,
            depth: count.max(QP_DEPTH as usize).min(max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rping_pattern_is_rpings() {
        // rping.c rping_test_client: "rdma-ping-0: " then 'A', 'B', ... ; ping 1 starts at 'B'.
        let p = rping_pattern(0, 20);
        assert_eq!(&p, b"rdma-ping-0: ABCDEF\0");
        let p = rping_pattern(1, 20);
        assert_eq!(&p, b"rdma-ping-1: BCDEFG\0");
        // The letters wrap from 'z' (122) to 'A' (65).
        let p = rping_pattern(57, 16);
        assert_eq!(&p[14..], b"z\0");
        assert_eq!(rping_pattern(58, 15)[14], 0);
        assert_eq!(&rping_pattern(58, 16)[14..], b"A\0");
    }

    #[test]
    fn ucmatose_queues_are_as_deep_as_the_messages_within_the_device() {
        // cmatose.c init_node: max_send_wr = max_recv_wr = message_count.
        assert_eq!(Exchange::sized(50, 100, 0x4000).depth, 50);
        assert_eq!(Exchange::sized(10, 100, 0x4000).depth, QP_DEPTH as usize);
        assert_eq!(Exchange::sized(100_000, 100, 0x4000).depth, 0x4000);
        assert_eq!(Exchange::sized(5, 100, 0).depth, 1);
    }

    #[test]
    fn rping_info_is_big_endian() {
        let b = info(0x1122_3344_5566_7788, 0xaabb_ccdd, 64);
        assert_eq!(b[0], 0x11);
        assert_eq!(b[8], 0xaa);
        assert_eq!(b[15], 64);
        assert_eq!(
            parse_info(&b),
            Some((0x1122_3344_5566_7788, 0xaabb_ccdd, 64))
        );
    }
}
