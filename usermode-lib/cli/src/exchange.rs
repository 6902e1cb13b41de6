//! `listen` and `connect`: ucmatose-style exchanges. Each connection is set up, private
//! data goes both ways (REQ and REP, DREQ and DREP), it is torn down and timewait is waited
//! out; every step of this side is reported as it happens.
//!
//! With an RDMA-CM port (`Service::Port`), the service ID is the TCP port space's
//! (IBA Annex A11, `0x0000000001060000 | port`) and the REQ's private data starts with the
//! RDMA-CM IP header, as `rdma_connect` sends it.
//!
//! Every wait is bounded: the CM's own timeouts bound connect, accept and disconnect;
//! waiting for a REQ or a DREQ is bounded by `wait`, after which it is cancelled.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use ibcm_mad::{IP_HEADER_SIZE, IpHeader, IpServiceId};

use ibcm::Provider;
use ibcm::{AcceptParams, ConnectParams, Failover, ListenParams, PathRecord};
use ibcm::{CompletionPort, Overlapped, STATUS_INTERNAL_ERROR, spawn};
use ibcm::{ConnectEndpoint, Listener};
use ibcm::{Error, Result};

/// The service to listen on or connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// An RDMA-CM TCP port: its port-space service ID, and an IP header in the REQ.
    Port(u16),
    /// A plain service ID.
    Id(u64),
}

impl Service {
    /// The 64-bit service ID.
    pub fn service_id(self) -> u64 {
        match self {
            Service::Port(p) => IpServiceId::tcp(p).to_service_id(),
            Service::Id(id) => id,
        }
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Service::Port(p) => write!(
                f,
                "service ID {:#018x} (RDMA-CM TCP port {p})",
                self.service_id()
            ),
            Service::Id(id) => write!(f, "service ID {id:#018x}"),
        }
    }
}

/// The IPv4 address the tools give the node with `lid` (as the pcap writer does).
pub fn node_ip(lid: u16) -> Ipv4Addr {
    let [a, b, c, d] = ibcm_host::pcap::node_ipv4(lid);
    Ipv4Addr::new(a, b, c, d)
}

/// What to exchange.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// The service.
    pub service: Service,
    /// Connections, one after the other.
    pub count: usize,
    /// The path: this side's (active side's) source LID and GID...
    pub local: PathEnd,
    /// ...and the peer's.
    pub remote: PathEnd,
    /// Longest wait for a REQ (listen) or a DREQ.
    pub wait: Duration,
}

/// One end of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathEnd {
    /// LID.
    pub lid: u16,
    /// GID.
    pub gid: [u8; 16],
}

impl PathEnd {
    /// Node `i` of the simulated fabric.
    pub fn sim_node(i: usize) -> Self {
        let a = ibcm_host::node_address(i);
        Self {
            lid: a.lid,
            gid: a.gid,
        }
    }

    /// A LID with its link-local GID (fe80::LID, as the simulated fabric's nodes have).
    pub fn lid(lid: u16) -> Self {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[14..].copy_from_slice(&lid.to_be_bytes());
        Self { lid, gid }
    }
}

/// How the exchanges went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Connections that went through every step.
    pub completed: usize,
    /// The failures, in order.
    pub failed: Vec<Error>,
}

/// Private data as text: printable ASCII as is, the rest as hex; trailing zeros dropped.
pub fn show(data: &[u8]) -> String {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let data = data.get(..end).unwrap_or(&[]);
    if data.is_empty() {
        return "(none)".into();
    }
    if data.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("\"{}\"", String::from_utf8_lossy(data))
    } else {
        data.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Runs the library operation `op` to its end on this thread's behalf, cancelling it (with
/// `cancel`) if it takes longer than `limit`: it then fails with STATUS_CANCELLED.
///
/// No thread of its own: the operation is spawned onto a completion port this thread
/// waits on with the limit as its timeout (a watchdog thread per wait cost a thread
/// creation in every connection's setup: milliseconds on a slow guest).
pub fn bounded<T: Send + 'static>(
    limit: Duration,
    cancel: impl FnOnce(),
    op: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let port = CompletionPort::new();
    spawn(op, &Overlapped::with_port(&port, 0));
    let packet = match port.get(Some(limit)) {
        Some(p) => p,
        None => {
            cancel();
            // A cancelled operation completes (with STATUS_CANCELLED), or its answer came
            // just now.
            port.get(None)
                .ok_or_else(|| Error::new("wait", STATUS_INTERNAL_ERROR))?
        }
    };
    packet
        .overlapped
        .result::<Result<T>>()
        // The operation panicked (its Overlapped holds `ibcm::Panicked`).
        .unwrap_or_else(|| Err(Error::new("wait", STATUS_INTERNAL_ERROR)))
}

/// The passive side: listens on `cfg.service` and serves `cfg.count` connections,
/// reporting each step through `log`.
pub fn listen(provider: &Provider, cfg: &Config, log: &(dyn Fn(String) + Sync)) -> Result<Summary> {
    let listener = provider.listen(&ListenParams {
        service_id: cfg.service.service_id(),
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: 16,
    })?;
    log(format!("listening on {}", cfg.service));
    serve(&listener, cfg, log)
}

/// Serves `cfg.count` connections on an existing listener.
pub fn serve(listener: &Listener, cfg: &Config, log: &(dyn Fn(String) + Sync)) -> Result<Summary> {
    each(cfg, log, |k| serve_one(listener, cfg, k, log))
}

/// Runs `one` for connections 0..`cfg.count`, one after the other, logging each failure,
/// then waits out the timewait of those that were set up.
fn each(
    cfg: &Config,
    log: &(dyn Fn(String) + Sync),
    one: impl Fn(usize) -> Result<ConnectEndpoint>,
) -> Result<Summary> {
    let mut done = Vec::new();
    let mut summary = Summary::default();
    for k in 0..cfg.count {
        match one(k) {
            Ok(ep) => done.push((k, ep)),
            Err(e) => {
                log(format!("connection {k}: {e}"));
                summary.failed.push(e);
            }
        }
    }
    finish(done, cfg, log, &mut summary);
    Ok(summary)
}

/// Waits out the timewait of each connection that was disconnected. The next connection
/// does not wait for the last one's timewait (its QP would; this exchange has none).
fn finish(
    done: Vec<(usize, ConnectEndpoint)>,
    cfg: &Config,
    log: &(dyn Fn(String) + Sync),
    summary: &mut Summary,
) {
    for (k, ep) in done {
        match timewait(&ep, cfg, k, log) {
            Ok(()) => summary.completed += 1,
            Err(e) => {
                log(format!("connection {k}: {e}"));
                summary.failed.push(e);
            }
        }
    }
}

fn serve_one(
    listener: &Listener,
    cfg: &Config,
    k: usize,
    log: &(dyn Fn(String) + Sync),
) -> Result<ConnectEndpoint> {
    let req = bounded(cfg.wait, || listener.cancel(), listener.get_request_async())?;
    let ip = match req.ip_header() {
        Some(h) => format!(
            ", IP header {}:{} -> {}",
            h.src_addr, h.src_port, h.dst_addr
        ),
        None => String::new(),
    };
    let pd = if req.ip_header().is_some() {
        req.private_data.get(IP_HEADER_SIZE..).unwrap_or(&[])
    } else {
        &req.private_data[..]
    };
    log(format!(
        "connection {k}: REQ received for service ID {:#018x} from CA {:#018x} (LID {}), QPN {:#08x}{ip}, private data {}",
        req.service_id,
        req.remote_ca_guid,
        req.primary_path.dlid,
        req.remote_qpn,
        show(pd)
    ));
    let ep = req.endpoint;
    let reply = format!("accepted connection {k}");
    let qp = ep.prepare_accept(&AcceptParams {
        qpn: 0x200 + k as u32,
        starting_psn: None,
        responder_resources: req.peer_initiator_depth.min(1),
        initiator_depth: req.peer_responder_resources.min(1),
        rnr_retry_count: 7,
        failover_accepted: Failover::NotSupported,
        flow_control: true,
        srq: false,
        private_data: reply.as_bytes(),
    })?;
    log(format!(
        "connection {k}: REP sent: QPN {:#08x}, RTR to QPN {:#08x}, private data \"{reply}\"",
        0x200 + k,
        qp.rtr.dest_qpn.unwrap_or(0)
    ));
    ep.accept()?;
    log(format!("connection {k}: RTU received: established"));
    let dreq = bounded(cfg.wait, || ep.cancel(), ep.notify_disconnect_async())?;
    log(format!(
        "connection {k}: DREQ received, private data {}",
        show(&dreq)
    ));
    let bye = format!("bye from the listener ({k})");
    ep.disconnect(bye.as_bytes())?;
    log(format!("connection {k}: DREP sent, private data \"{bye}\""));
    Ok(ep)
}

fn timewait(
    ep: &ConnectEndpoint,
    cfg: &Config,
    k: usize,
    log: &(dyn Fn(String) + Sync),
) -> Result<()> {
    bounded(cfg.wait, || ep.cancel(), ep.wait_timewait_async())?;
    log(format!("connection {k}: timewait over"));
    Ok(())
}

/// The active side: `cfg.count` connections to `cfg.service`, reporting each step.
pub fn connect(
    provider: &Provider,
    cfg: &Config,
    log: &(dyn Fn(String) + Sync),
) -> Result<Summary> {
    each(cfg, log, |k| connect_one(provider, cfg, k, log))
}

/// The REQ's path from `cfg`.
fn params(cfg: &Config, qpn: u32) -> ConnectParams<'static> {
    let mut p = ibcm::example_connect_params(cfg.service.service_id(), qpn, 0, 1);
    p.primary_path = PathRecord {
        slid: cfg.local.lid,
        dlid: cfg.remote.lid,
        sgid: cfg.local.gid,
        dgid: cfg.remote.gid,
        ..p.primary_path
    };
    p
}

fn connect_one(
    provider: &Provider,
    cfg: &Config,
    k: usize,
    log: &(dyn Fn(String) + Sync),
) -> Result<ConnectEndpoint> {
    let ep = provider.connect_endpoint()?;
    let qpn = 0x100 + k as u32;
    let text = format!("hello from connection {k}");
    let mut data = [0u8; 92];
    let mut used = 0;
    let mut ip = String::new();
    if let Service::Port(port) = cfg.service {
        let h = IpHeader {
            src_port: 0xc000u16.wrapping_add(k as u16),
            src_addr: IpAddr::V4(node_ip(cfg.local.lid)),
            dst_addr: IpAddr::V4(node_ip(cfg.remote.lid)),
        };
        h.emit(&mut data)
            .map_err(|_| Error::new("connect", ibcm_ioctl::status::INVALID_PARAMETER))?;
        used = IP_HEADER_SIZE;
        ip = format!(
            ", IP header {}:{} -> {}:{port}",
            h.src_addr, h.src_port, h.dst_addr
        );
    }
    let n = text.len().min(data.len() - used);
    data[used..used + n].copy_from_slice(&text.as_bytes()[..n]);
    let mut p = params(cfg, qpn);
    p.private_data = &data[..used + n];
    log(format!(
        "connection {k}: REQ sent to {} at LID {}, QPN {qpn:#08x}{ip}, private data \"{text}\"",
        cfg.service, cfg.remote.lid
    ));
    let reply = ep.connect(&p)?;
    log(format!(
        "connection {k}: REP received: peer QPN {:#08x}, starting PSN {:#08x}, private data {}",
        reply.remote_qpn,
        reply.remote_psn,
        show(&reply.private_data)
    ));
    ep.rtu(&[])?;
    log(format!("connection {k}: RTU sent: established"));
    let bye = format!("bye from connection {k}");
    log(format!("connection {k}: DREQ sent, private data \"{bye}\""));
    ep.disconnect(bye.as_bytes())?;
    let q = ep.query()?;
    let drep = q
        .private_data
        .get(..usize::from(q.private_data_len))
        .unwrap_or(&[]);
    log(format!(
        "connection {k}: DREP received, private data {}",
        show(drep)
    ));
    Ok(ep)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::sim::{Sim, SimOptions};

    fn listener(sim: &Sim) -> Listener {
        sim.provider(1)
            .and_then(|p| {
                p.listen(&ListenParams {
                    service_id: 0x77,
                    service_mask: u64::MAX,
                    port: None,
                    compare: None,
                    backlog: 4,
                })
            })
            .expect("listen on the simulated fabric")
    }

    /// Nothing comes: the wait is cancelled at its limit and fails with STATUS_CANCELLED,
    /// neither before the limit nor long after it.
    #[test]
    fn a_wait_past_its_limit_is_cancelled() {
        let sim = Sim::start(&SimOptions::default());
        let l = listener(&sim);
        let t0 = Instant::now();
        let r = bounded(
            Duration::from_millis(100),
            || l.cancel(),
            l.get_request_async(),
        );
        let took = t0.elapsed();
        assert_eq!(
            r.err().map(|e| e.status),
            Some(ibcm_ioctl::status::CANCELLED)
        );
        assert!(took >= Duration::from_millis(100), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    /// What comes within the limit is the answer, and the cancel is not called.
    #[test]
    fn an_answer_within_the_limit_is_returned() {
        let sim = Sim::start(&SimOptions::default());
        let l = listener(&sim);
        let client = sim.provider(0).expect("provider");
        let ep = client.connect_endpoint().expect("endpoint");
        let connect = ep.connect_async(&ibcm::example_connect_params(0x77, 0x42, 0, 1));
        spawn(connect, &Overlapped::new());
        let cancelled = std::sync::atomic::AtomicBool::new(false);
        let r = bounded(
            Duration::from_secs(10),
            || cancelled.store(true, std::sync::atomic::Ordering::Release),
            l.get_request_async(),
        );
        assert_eq!(r.map(|req| req.remote_qpn).ok(), Some(0x42));
        assert!(!cancelled.load(std::sync::atomic::Ordering::Acquire));
    }
}
