//! rdma-core udaddy's exchange (librdmacm/examples/udaddy.c) on a real RDMA device: a UD
//! QP found through SIDR (IBA 12.11) and datagrams both ways, so either side can be Linux
//! `udaddy`.
//!
//! - The server ([`serve`]) listens on rdma_cm's UDP port-space service ID for the port
//!   (cma.c `cma_get_service_id`: 0x0000000001110000 | port, [`PortSpace::Udp`]), checks
//!   the SIDR_REQ's rdma_cm header (its destination is this node), creates its UD QP with
//!   rdma_cm's Q_Key (`RDMA_UDP_QKEY`, cma.c `cma_set_qkey`), posts its receives and
//!   answers with a SIDR_REP naming the QP and the Q_Key (cma.c `cma_send_sidr_rep`).
//!   It takes `count` datagrams, then answers each to the address the first came from
//!   (`ibv_create_ah_from_wc`) and its QP (which its immediate data must name), as udaddy.c
//!   `create_reply_ah` does, with what udaddy's server sends: the first `size` bytes of
//!   the last receive buffer, the GRH included (udaddy.c `post_sends` from `node->mem`).
//! - The client ([`resolve`]) posts its receives, sends the SIDR_REQ with the rdma_cm
//!   header (cma.c `cma_resolve_ib_udp`: `cma_format_hdr`, a 2^(20-8) ms response
//!   timeout, 15 retries), takes the SIDR_REP only with success and rdma_cm's Q_Key (cma.c
//!   `cma_sidr_rep_handler`: a failed status is UNREACHABLE, another Q_Key an error event;
//!   Linux 6.1's udaddy reports ADDR_ERROR -22 for it), sends `count` datagrams with
//!   its QPN as immediate data (udaddy.c `post_sends`) and checks every reply: from the
//!   server's QP, the length sent, and its echo of our own datagram (the IPv4 header the
//!   server received, our message after it).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ibcm::{IpHeader, IpServiceId, ListenParams, ResolveParams, SidrStatus};
use ibcm_ioctl::iba::PortSpace;
use ibcm_linux::ud::{AddressHandle, GRH_LEN, UdCompletion, UdQp};
use ibcm_linux::verbs::Region;

use crate::rc::Rc;
use crate::rocev2::{describe, rdma_cm_private_data};

type Res<T> = std::result::Result<T, String>;

/// rdma_cm's Q_Key for the UDP port space (rdma/ib.h `RDMA_UDP_QKEY`; kernel cma.c
/// `cma_set_qkey`, librdmacm cma.c `ucma_init_ud_qp`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// udaddy's default port (udaddy.c: `port = "7174"`).
pub const DEFAULT_PORT: u16 = 7174;
/// The SIDR_REQ's response timeout, 5-bit IB time: rdma_cm's CMA_CM_RESPONSE_TIMEOUT
/// (kernel cma.c; `cma_resolve_ib_udp` waits 2^(20-8) ms, about this long).
pub const SIDR_TIMEOUT: u8 = 20;
/// SIDR_REQ retries: rdma_cm's CMA_MAX_CM_RETRIES (kernel cma.c).
pub const SIDR_RETRIES: u8 = 15;
/// Offset of the IPv4 header in a RoCEv2 receive's 40-byte GRH slot (the last 20 bytes:
/// rdma-core libibverbs/verbs.c `ibv_init_ah_from_wc` reads it at grh + 20).
const IPV4_IN_GRH: usize = 20;

/// The service ID of rdma_cm's UDP port space for `port`.
pub fn service_id(port: u16) -> u64 {
    IpServiceId {
        port_space: PortSpace::Udp,
        port,
    }
    .to_service_id()
}

/// The bytes of each datagram the client sends: a run of letters, as rping's pattern.
pub fn message(size: usize) -> Vec<u8> {
    (0..size).map(|i| b'A' + (i % 26) as u8).collect()
}

/// The IPv4 (source, destination) of the header a RoCEv2 receive holds in its GRH slot.
pub fn grh_ipv4(grh: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let ip = grh.get(IPV4_IN_GRH..GRH_LEN)?;
    // IPv4 (RFC 791): version 4 in the first nibble, addresses at bytes 12 and 16.
    if ip.first()? >> 4 != 4 {
        return None;
    }
    let src: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
    let dst: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
    Some((Ipv4Addr::from(src), Ipv4Addr::from(dst)))
}

/// Checks a reply of udaddy's server received into `slot` (GRH, then `size` bytes): what
/// the server sends is the first `size` bytes of its own receive buffer, so the GRH the
/// server saw on our datagram (sent from `local` to `peer`), then our `message` cut to
/// fit.
pub fn check_echo(
    slot: &[u8],
    size: usize,
    msg: &[u8],
    local: Ipv4Addr,
    peer: Ipv4Addr,
) -> Res<()> {
    let payload = slot
        .get(GRH_LEN..GRH_LEN + size)
        .ok_or_else(|| format!("a {}-byte slot holds no {size}-byte reply", slot.len()))?;
    if size >= GRH_LEN {
        match grh_ipv4(payload) {
            Some((src, dst)) if src == local && dst == peer => {}
            other => {
                return Err(format!(
                    "the reply echoes no datagram of ours ({local} -> {peer}): its header \
                     says {other:?}"
                ));
            }
        }
    }
    let echoed = payload.get(GRH_LEN..).unwrap_or(&[]);
    let want = msg.get(..echoed.len()).unwrap_or(msg);
    if echoed != want {
        return Err(format!(
            "the reply's {} bytes after the header are not our message",
            echoed.len()
        ));
    }
    Ok(())
}

/// How an exchange went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Datagrams received, each checked.
    pub received: usize,
    /// Datagrams sent and completed.
    pub sent: usize,
    /// The peer's QPN.
    pub peer_qpn: u32,
}

/// A UD QP and what its work requests name. The QP is dropped first: destroying it ends
/// the device's use of the address handle and the buffers, which go after it (an error
/// return with receives posted, or sends in flight, must not free memory the device may
/// still write or read).
struct Ud {
    qp: UdQp,
    recv: Region,
    out: Option<Region>,
    ah: Option<AddressHandle>,
}

/// A UD QP in RTS with rdma_cm's Q_Key, and `count` receives of `size` bytes (after the
/// GRH) posted, one slot each.
fn ud_qp(rc: &Rc, count: usize, size: usize) -> Res<Ud> {
    let depth = u32::try_from(count).map_err(|_| format!("{count} messages: too many"))?;
    let slot = GRH_LEN + size;
    let recv = Region::new(&rc.ctx, count * slot).map_err(|e| e.to_string())?;
    let ud = Ud {
        qp: UdQp::create(&rc.ctx, depth).map_err(|e| e.to_string())?,
        recv,
        out: None,
        ah: None,
    };
    ud.qp
        .to_rts(1, 0xffff, RDMA_UDP_QKEY)
        .map_err(|e| e.to_string())?;
    for i in 0..count {
        ud.qp
            .post_recv(&ud.recv, i * slot, slot, i as u64)
            .map_err(|e| e.to_string())?;
    }
    Ok(ud)
}

fn next(qp: &UdQp, deadline: Instant, what: &str) -> Res<UdCompletion> {
    let c = qp
        .next(deadline)
        .map_err(|e| format!("waiting for {what}: {e}"))?;
    if !c.ok() {
        return Err(format!("{what}: completion status {}", c.status()));
    }
    Ok(c)
}

/// A received datagram's checks: a receive, `size` bytes after the GRH, a GRH, immediate
/// data naming its sender's QP (udaddy.c `post_sends`: `imm_data = qp_num`).
fn check_recv(c: &UdCompletion, size: usize) -> Res<()> {
    if !c.is_recv() {
        return Err(format!(
            "a completion of opcode {} among the receives",
            c.opcode()
        ));
    }
    if c.byte_len() as usize != GRH_LEN + size {
        return Err(format!(
            "a datagram of {} bytes, not {GRH_LEN} + {size}",
            c.byte_len()
        ));
    }
    if !c.has_grh() {
        return Err("a datagram without its GRH".into());
    }
    if c.imm() != Some(c.src_qp()) {
        return Err(format!(
            "a datagram from QPN {:#x} whose immediate data is {:?}, not its QPN",
            c.src_qp(),
            c.imm()
        ));
    }
    Ok(())
}

/// udaddy's server: one SIDR_REQ for `port` within `wait`, then `count` datagrams of
/// `size` bytes in and `count` replies out.
pub fn serve(
    rc: &Rc,
    port: u16,
    count: usize,
    size: usize,
    wait: Duration,
    log: &dyn Fn(String),
) -> Res<Report> {
    let local = rc.port().local();
    let sid = service_id(port);
    let listener = rc
        .provider
        .listen(&ListenParams {
            service_id: sid,
            service_mask: u64::MAX,
            port: None,
            compare: None,
            backlog: 16,
        })
        .map_err(|e| describe(&e))?;
    // Receives posted before the SIDR_REP names the QP: the client sends at once.
    let mut ud = ud_qp(rc, count, size)?;
    let (qp, recv) = (&ud.qp, &ud.recv);
    log(format!(
        "listening on service ID {sid:#018x} (UD QPN {:#x})",
        qp.qpn()
    ));
    let answered = AtomicBool::new(false);
    let req = std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = Instant::now() + wait;
            while !answered.load(Ordering::Acquire) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !answered.load(Ordering::Acquire) {
                listener.cancel();
            }
        });
        let r = listener.get_datagram_request();
        answered.store(true, Ordering::Release);
        r
    })
    .map_err(|e| format!("no SIDR_REQ: {}", describe(&e)))?;
    // The rdma_cm header (Annex A11) names the client and this node: a request for
    // another address is refused, as rdma_cm finds no listener for it.
    let peer = match IpHeader::parse(&req.private_data) {
        Ok(IpHeader {
            src_addr: IpAddr::V4(src),
            dst_addr: IpAddr::V4(dst),
            src_port,
        }) if dst == local => {
            log(format!(
                "SIDR_REQ for {:#018x} from {src} port {src_port}",
                req.service_id
            ));
            src
        }
        other => {
            let _ = req.endpoint.reply(SidrStatus::Reject, 0, 0, &[], &[]);
            return Err(format!(
                "SIDR_REQ refused: its rdma_cm header is not for {local}: {other:?}"
            ));
        }
    };
    req.endpoint
        .reply(SidrStatus::Success, qp.qpn(), RDMA_UDP_QKEY, &[], &[])
        .map_err(|e| format!("SIDR_REP: {}", describe(&e)))?;
    log(format!(
        "SIDR_REP sent: QPN {:#x}, Q_Key {RDMA_UDP_QKEY:#010x}",
        qp.qpn()
    ));
    let slot = GRH_LEN + size;
    let deadline = Instant::now() + wait;
    let mut peer_qpn = None;
    let mut reply = None;
    let mut last = 0usize;
    for n in 0..count {
        let c = next(qp, deadline, &format!("datagram {} of {count}", n + 1))?;
        check_recv(&c, size)?;
        let i = usize::try_from(c.wr_id()).unwrap_or(usize::MAX);
        let grh = recv
            .bytes()
            .get(i.saturating_mul(slot)..)
            .and_then(|b| b.get(..GRH_LEN))
            .ok_or_else(|| format!("a receive of unknown slot {i}"))?;
        match grh_ipv4(grh) {
            Some((src, dst)) if src == peer && dst == local => {}
            other => return Err(format!("a datagram not from {peer} to {local}: {other:?}")),
        }
        match peer_qpn {
            None => {
                // udaddy.c create_reply_ah: the AH from the first completion, the QPN
                // from its immediate data.
                reply = Some(
                    AddressHandle::reply_to(&rc.ctx, 1, &c, recv, i * slot)
                        .map_err(|e| e.to_string())?,
                );
                peer_qpn = Some(c.src_qp());
            }
            Some(q) if q != c.src_qp() => {
                return Err(format!("datagrams from QPN {q:#x} and {:#x}", c.src_qp()));
            }
            Some(_) => {}
        }
        last = i;
    }
    let (Some(ah), Some(peer_qpn)) = (reply, peer_qpn) else {
        return Ok(Report {
            received: 0,
            sent: 0,
            peer_qpn: 0,
        });
    };
    let ah = &*ud.ah.insert(ah);
    let (qp, recv) = (&ud.qp, &ud.recv);
    log(format!(
        "{count} datagrams of {size} bytes from QPN {peer_qpn:#x}; replying"
    ));
    // The replies carry this QP's own Q_Key (udaddy.c create_reply_ah: ibv_query_qp).
    let qkey = qp.qkey().map_err(|e| e.to_string())?;
    for n in 0..count {
        qp.post_send_imm(
            ah,
            peer_qpn,
            qkey,
            recv,
            last * slot,
            size,
            qp.qpn(),
            n as u64,
        )
        .map_err(|e| e.to_string())?;
    }
    for n in 0..count {
        let c = next(qp, deadline, &format!("reply {} of {count}", n + 1))?;
        if !c.is_send() {
            return Err(format!(
                "a completion of opcode {} among the sends",
                c.opcode()
            ));
        }
    }
    Ok(Report {
        received: count,
        sent: count,
        peer_qpn,
    })
}

/// udaddy's client: resolves `peer`'s UDP `port` with SIDR, sends `count` datagrams of
/// `size` bytes and checks the `count` replies.
pub fn resolve(
    rc: &Rc,
    peer: Ipv4Addr,
    port: u16,
    count: usize,
    size: usize,
    wait: Duration,
    log: &dyn Fn(String),
) -> Res<Report> {
    let local = rc.port().local();
    // Receives posted before the SIDR_REQ (udaddy.c route_handler: post_recvs, then
    // rdma_connect): the server answers as soon as our datagrams reach it.
    let mut ud = ud_qp(rc, count, size)?;
    let private_data =
        rdma_cm_private_data(local, peer, 0xc000 | (std::process::id() as u16 & 0x3fff));
    let path = rc
        .port()
        .path_to(peer, crate::cmtime::Timing::patient().packet_life_time);
    let dgram = rc.provider.datagram_endpoint().map_err(|e| describe(&e))?;
    let t0 = Instant::now();
    let rep = dgram
        .resolve(&ResolveParams {
            service_id: service_id(port),
            port: 1,
            pkey: 0xffff,
            path,
            timeout: SIDR_TIMEOUT,
            max_retries: SIDR_RETRIES,
            private_data: &private_data,
        })
        .map_err(|e| format!("SIDR_REQ: {}", describe(&e)))?;
    log(format!(
        "SIDR_REP in {:.3} ms: status {:?}, QPN {:#x}, Q_Key {:#010x}",
        t0.elapsed().as_secs_f64() * 1e3,
        rep.status,
        rep.qpn,
        rep.qkey
    ));
    // cma.c cma_sidr_rep_handler: a failed status is UNREACHABLE, a Q_Key other than
    // ours (cma_set_qkey: -EINVAL) an error event; neither resolves the service.
    if rep.status != SidrStatus::Success {
        return Err(format!("unreachable: SIDR_REP status {:?}", rep.status));
    }
    if rep.qkey != RDMA_UDP_QKEY {
        return Err(format!(
            "unreachable: SIDR_REP Q_Key {:#010x}, not rdma_cm's {RDMA_UDP_QKEY:#010x}",
            rep.qkey
        ));
    }
    let msg = message(size);
    let mut out = Region::new(&rc.ctx, size).map_err(|e| e.to_string())?;
    out.bytes_mut()
        .get_mut(..size)
        .ok_or("message region too small")?
        .copy_from_slice(&msg);
    let out = &*ud.out.insert(out);
    let ah = AddressHandle::from_path(&rc.ctx, 1, &path).map_err(|e| e.to_string())?;
    let ah = &*ud.ah.insert(ah);
    let (qp, recv) = (&ud.qp, &ud.recv);
    for n in 0..count {
        qp.post_send_imm(ah, rep.qpn, rep.qkey, out, 0, size, qp.qpn(), n as u64)
            .map_err(|e| e.to_string())?;
    }
    let slot = GRH_LEN + size;
    let deadline = Instant::now() + wait;
    let (mut sent, mut received) = (0usize, 0usize);
    while sent < count || received < count {
        let c = next(
            qp,
            deadline,
            &format!("{} sends and {} replies", count - sent, count - received),
        )?;
        if c.is_send() {
            sent += 1;
            continue;
        }
        check_recv(&c, size)?;
        if c.src_qp() != rep.qpn {
            return Err(format!(
                "a reply from QPN {:#x}, not the SIDR_REP's {:#x}",
                c.src_qp(),
                rep.qpn
            ));
        }
        let i = usize::try_from(c.wr_id()).unwrap_or(usize::MAX);
        let bytes = recv
            .bytes()
            .get(i.saturating_mul(slot)..)
            .and_then(|b| b.get(..slot))
            .ok_or_else(|| format!("a receive of unknown slot {i}"))?;
        check_echo(bytes, size, &msg, local, peer)
            .map_err(|e| format!("reply {}: {e}", received + 1))?;
        received += 1;
    }
    Ok(Report {
        received,
        sent,
        peer_qpn: rep.qpn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rdma_cm's UDP port space (rdma_cma.h RDMA_PS_UDP 0x0111) in cma.c
    /// `cma_get_service_id`'s form, at udaddy's default port.
    #[test]
    fn the_service_id_is_rdma_cms_for_udp() {
        assert_eq!(service_id(DEFAULT_PORT), 0x0000_0000_0111_1c06);
    }

    /// A GRH slot as rxe fills it for RoCEv2 over IPv4: 20 unused bytes, then the
    /// IPv4 header.
    fn grh(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
        let mut g = vec![0u8; GRH_LEN];
        g[20] = 0x45;
        g[32..36].copy_from_slice(&src.octets());
        g[36..40].copy_from_slice(&dst.octets());
        g
    }

    const A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
    const B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);

    /// What udaddy's server sends back (its buffer: the GRH it got, our message) passes;
    /// a reply that is not the echo of our datagram, or of someone else's, fails.
    #[test]
    fn a_reply_is_the_echo_of_our_own_datagram() {
        let size = 100;
        let msg = message(size);
        // The server's buffer: the GRH of our datagram (A -> B), then our message.
        let mut theirs = grh(A, B);
        theirs.extend_from_slice(&msg);
        // Our slot: the GRH of their reply (B -> A), then their first `size` bytes.
        let mut slot = grh(B, A);
        slot.extend_from_slice(&theirs[..size]);
        assert_eq!(check_echo(&slot, size, &msg, A, B), Ok(()));
        // Another node's datagram echoed.
        let mut other = grh(B, A);
        other.extend_from_slice(&grh(Ipv4Addr::new(10, 77, 0, 9), B));
        other.extend_from_slice(&msg[..size - GRH_LEN]);
        assert!(check_echo(&other, size, &msg, A, B).is_err());
        // Our message changed on the way.
        let mut bent = slot.clone();
        bent[GRH_LEN + GRH_LEN + 7] ^= 1;
        assert!(check_echo(&bent, size, &msg, A, B).is_err());
        // A slot too short for the reply.
        assert!(check_echo(&slot[..GRH_LEN + 10], size, &msg, A, B).is_err());
    }

    /// A reply shorter than a GRH echoes part of the header only: nothing of ours to
    /// compare beyond it, and that is not an error.
    #[test]
    fn a_short_reply_echoes_part_of_the_header() {
        let size = 16;
        let msg = message(size);
        let mut slot = grh(B, A);
        slot.extend_from_slice(&grh(A, B)[..size]);
        assert_eq!(check_echo(&slot, size, &msg, A, B), Ok(()));
    }

    #[test]
    fn the_ipv4_header_of_a_grh_slot_is_read_or_refused() {
        assert_eq!(grh_ipv4(&grh(A, B)), Some((A, B)));
        assert_eq!(grh_ipv4(&[0u8; GRH_LEN]), None);
        assert_eq!(grh_ipv4(&[0x45u8; 30]), None);
    }
}
