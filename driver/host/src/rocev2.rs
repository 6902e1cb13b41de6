//! A RoCEv2 MAD port: one host node's QP1, carried over UDP port 4791 on a local IPv4
//! address, so the in-process driver can talk to a real CM (Linux `ib_cm`/`rdma_cm` over
//! soft-RoCE, a RoCE NIC) across a real link.
//!
//! Every MAD goes out as IPv4 / UDP (destination port 4791) / BTH (UD SEND_ONLY, opcode
//! 0x64, P_Key, destination QP 1) / DETH (Q_Key 0x80010000, source QP 1) / the 256-byte
//! MAD / ICRC ([`crate::wire`] builds and checks them). The packets are built whole, IPv4
//! header included, and sent on a raw socket
//! with `IP_HDRINCL`: the ICRC covers the IPv4 header (its identification, flags, length
//! and addresses; TOS, TTL and checksum are masked), so it must be computed over the
//! header actually sent. A UDP socket would let the kernel choose the IP ID after the ICRC
//! was computed (0 for an unconnected socket with don't-fragment set, a counter once
//! connected). Here the ID is ours, never 0, so the kernel leaves it alone.
//!
//! Received packets are read from the same raw socket (it sees every UDP datagram to the
//! local address, IPv4 header included); those to port 4791 for QP1 with a wrong ICRC are
//! counted and dropped, as a RoCE NIC drops them. A UDP socket bound to port 4791 keeps
//! the kernel from answering the peer with ICMP port-unreachable; it is never read.
//!
//! Addresses are RoCE's: the GIDs are IPv4-mapped (`::ffff:a.b.c.d`), LIDs are 0xFFFF
//! (permissive: no subnet manager), the CA GUID is the EUI-64 of the interface's MAC (as
//! Linux derives it) unless given, and a path between two addresses has hop limit 64 and
//! a 1024-byte MTU (what rxe reports). Sends are refused (and counted) for any destination
//! outside the local address's subnet: this port only ever talks on its own link.
//!
//! Beside AL ([`RoceConfig::beside_al`]) the port carries two CMs, ibcm's and a stand-in
//! for WinOF AL's ([`SharedPort`]): every MAD received goes to the one ibcm's engine names
//! ([`SharedPort::receive`]), and both send through the port.
//!
//! Threads: a receive thread per port feeds [`Node::receive`] (or the shared port's
//! steering); a transmit/timer thread drains the nodes' outboxes to the socket and fires
//! their device timers on the real clock.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ibcm_cep::{CmConfig, MadAddress, PathRecord};
use ibcm_endpoint::Platform;
use ibcm_mad::{Mtu, Rate};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::clock::Clock;
use crate::node::Node;
use crate::steering::SharedPort;
use crate::wake::Wake;
pub use crate::wire::{
    BTH_LEN, DETH_LEN, Decoded, DropReason, Framing, ICRC_LEN, IPV4_HEADER_LEN, PACKET_LEN,
    UDP_HEADER_LEN, decode, encode,
};
use crate::wire::{DEFAULT_PKEY, ROCEV2_PORT, TTL};

/// The hop limit of a RoCEv2 path (and the TTL sent).
pub const HOP_LIMIT: u8 = TTL;
/// The path MTU of a RoCE path here: 1024 (code 3), what rxe reports.
pub const PATH_MTU: Mtu = Mtu::Mtu1024;
/// The LID of every RoCE address (permissive).
pub const ROCE_LID: u16 = 0xffff;
/// The port number of the node's one port.
pub const PORT_NUM: u8 = 1;

/// The IPv4-mapped GID of `addr` (`::ffff:a.b.c.d`).
pub fn ipv4_gid(addr: Ipv4Addr) -> [u8; 16] {
    addr.to_ipv6_mapped().octets()
}

/// The IPv4 address of an IPv4-mapped GID.
pub fn gid_ipv4(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    Ipv6Addr::from(*gid).to_ipv4_mapped()
}

/// The modified EUI-64 of a MAC: the CA GUID Linux gives an rxe device (and the GID
/// interface ID of its link-local GID).
pub fn guid_from_mac(mac: [u8; 6]) -> u64 {
    let [a, b, c, d, e, f] = mac;
    u64::from_be_bytes([a ^ 0x02, b, c, 0xff, 0xfe, d, e, f])
}

/// The address a peer's MAD is reported from, and a reply goes to.
pub fn roce_address(addr: Ipv4Addr, pkey: u16) -> MadAddress {
    MadAddress {
        port: PORT_NUM,
        lid: ROCE_LID,
        gid: ipv4_gid(addr),
        grh: true,
        sl: 0,
        pkey,
    }
}

/// The path from `local` to `remote` as a path record would give it on RoCEv2 (there is
/// no SA): LIDs 0xFFFF, IPv4-mapped GIDs, hop limit 64, not subnet-local (RoCEv2 is
/// routed), a packet life time of `packet_life_time` (IB time exponent).
pub fn path_record(local: Ipv4Addr, remote: Ipv4Addr, packet_life_time: u8) -> PathRecord {
    PathRecord {
        slid: ROCE_LID,
        dlid: ROCE_LID,
        sgid: ipv4_gid(local),
        dgid: ipv4_gid(remote),
        flow_label: 0,
        traffic_class: 0,
        hop_limit: HOP_LIMIT,
        sl: 0,
        rate: Rate::Gbps10,
        packet_life_time,
        subnet_local: false,
    }
}

/// The MAD's attribute ID.
pub fn attribute_of(mad: &[u8]) -> u16 {
    mad.get(16..18)
        .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
}

/// Deterministic fault injection: drop the first `count` MADs of an attribute, sent or
/// received.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoceFaults {
    /// (attribute ID, how many) dropped before they are sent.
    pub drop_tx: Vec<(u16, u32)>,
    /// (attribute ID, how many) dropped as they arrive.
    pub drop_rx: Vec<(u16, u32)>,
}

impl RoceFaults {
    /// Whether the next MAD of `attribute` is to be dropped (and counts it).
    fn take(list: &mut [(u16, u32)], attribute: u16) -> bool {
        match list.iter_mut().find(|(a, n)| *a == attribute && *n > 0) {
            Some((_, n)) => {
                *n -= 1;
                true
            }
            None => false,
        }
    }
}

/// Settings of a RoCEv2 port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoceConfig {
    /// The local IPv4 address (it must be configured on an interface).
    pub local: Ipv4Addr,
    /// The length of the local subnet's prefix: destinations outside it are refused.
    pub prefix_len: u8,
    /// The CA GUID; by default the EUI-64 of `mac`.
    pub guid: Option<u64>,
    /// The interface's MAC; by default read from the interface the local subnet is
    /// routed on (`/proc/net/route`, `/sys/class/net`).
    pub mac: Option<[u8; 6]>,
    /// Seed of the CM's RNG (comm IDs, PSNs); by default from the time and process ID.
    pub seed: Option<u64>,
    /// Fault injection.
    pub faults: RoceFaults,
    /// Carry a second CM on the port beside ibcm's, standing in for WinOF AL's, with
    /// every received MAD steered between them by ibcm's engine ([`SharedPort`]).
    pub beside_al: bool,
}

impl RoceConfig {
    /// A port on `local`, in a /24, everything else by default.
    pub fn new(local: Ipv4Addr) -> Self {
        Self {
            local,
            prefix_len: 24,
            guid: None,
            mac: None,
            seed: None,
            faults: RoceFaults::default(),
            beside_al: false,
        }
    }

    /// Whether `addr` is on the local subnet.
    pub fn on_link(&self, addr: Ipv4Addr) -> bool {
        let bits = u32::from(self.prefix_len.min(32));
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        (u32::from(addr) & mask) == (u32::from(self.local) & mask)
            && addr != self.local
            && !addr.is_broadcast()
            && (u32::from(addr) & !mask) != !mask
    }
}

/// The interface and MAC the subnet of `addr` is routed on, from `/proc/net/route` and
/// `/sys/class/net` (inside a network namespace, the namespace's).
pub fn interface_mac(addr: Ipv4Addr) -> Option<(String, [u8; 6])> {
    let routes = std::fs::read_to_string("/proc/net/route").ok()?;
    let a = u32::from(addr);
    let mut best: Option<(u32, String)> = None;
    for line in routes.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (Some(iface), Some(dest), Some(mask)) = (cols.first(), cols.get(1), cols.get(7)) else {
            continue;
        };
        // The file prints the addresses as host-order hex of network-order words.
        let parse = |s: &str| u32::from_str_radix(s, 16).ok().map(u32::swap_bytes);
        let (Some(dest), Some(mask)) = (parse(dest), parse(mask)) else {
            continue;
        };
        if mask != 0 && a & mask == dest && best.as_ref().is_none_or(|(m, _)| mask > *m) {
            best = Some((mask, (*iface).to_string()));
        }
    }
    let (_, iface) = best?;
    let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/address")).ok()?;
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    Some((iface, mac))
}

/// What a port has counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoceCounts {
    /// Packets sent.
    pub sent: u64,
    /// Sends the socket failed.
    pub send_errors: u64,
    /// Sends refused: the destination was not an IPv4-mapped GID on the local subnet.
    pub refused: u64,
    /// MADs handed to the CM.
    pub received: u64,
    /// Packets dropped for a wrong ICRC.
    pub bad_icrc: u64,
    /// RoCEv2 packets that were not QP1 MADs.
    pub not_qp1: u64,
    /// Outgoing MADs dropped by fault injection.
    pub fault_tx: u64,
    /// Incoming MADs dropped by fault injection.
    pub fault_rx: u64,
}

/// A port's counters, shared by its threads (read them with [`counts`](Self::counts)).
#[derive(Debug, Default)]
pub struct RoceStats {
    sent: AtomicU64,
    send_errors: AtomicU64,
    refused: AtomicU64,
    received: AtomicU64,
    bad_icrc: AtomicU64,
    not_qp1: AtomicU64,
    fault_tx: AtomicU64,
    fault_rx: AtomicU64,
}

impl RoceStats {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// What has been counted so far.
    pub fn counts(&self) -> RoceCounts {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RoceCounts {
            sent: l(&self.sent),
            send_errors: l(&self.send_errors),
            refused: l(&self.refused),
            received: l(&self.received),
            bad_icrc: l(&self.bad_icrc),
            not_qp1: l(&self.not_qp1),
            fault_tx: l(&self.fault_tx),
            fault_rx: l(&self.fault_rx),
        }
    }
}

/// A running RoCEv2 port: a node of the in-process driver on a real link.
pub struct RocePort {
    node: Arc<Node>,
    shared: Option<Arc<SharedPort>>,
    config: RoceConfig,
    guid: u64,
    stats: Arc<RoceStats>,
    stop: Arc<AtomicBool>,
    wake: Arc<Wake>,
    threads: Vec<JoinHandle<()>>,
    _udp: UdpSocket,
}

impl core::fmt::Debug for RocePort {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RocePort")
            .field("local", &self.config.local)
            .field("guid", &format_args!("{:#018x}", self.guid))
            .finish_non_exhaustive()
    }
}

fn seed_from_clock() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

impl RocePort {
    /// Opens the sockets (a raw socket needs CAP_NET_RAW) and starts the threads.
    pub fn start(config: &RoceConfig) -> io::Result<Self> {
        let config = config.clone();
        let mac = match config.mac {
            Some(m) => Some(m),
            None => interface_mac(config.local).map(|(_, m)| m),
        };
        let guid = match (config.guid, mac) {
            (Some(g), _) => g,
            (None, Some(m)) => guid_from_mac(m),
            (None, None) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no interface holds {}, so no MAC to make the CA GUID from; give the \
                         GUID (RoceConfig::guid, the CLI's --guid)",
                        config.local
                    ),
                ));
            }
        };
        let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))?;
        raw.set_header_included_v4(true)?;
        raw.bind(&SockAddr::from(SocketAddrV4::new(config.local, 0)))?;
        raw.set_read_timeout(Some(Duration::from_millis(50)))?;
        raw.set_recv_buffer_size(1 << 21)?;
        // Holds port 4791 so the kernel does not answer the peer's packets with ICMP
        // port-unreachable; the raw socket reads them.
        let udp = UdpSocket::bind(SocketAddrV4::new(config.local, ROCEV2_PORT))?;

        let seed = config.seed.unwrap_or_else(seed_from_clock);
        let mut rng_seed = [0u8; 32];
        rng_seed[..8].copy_from_slice(&seed.to_le_bytes());
        rng_seed[8..16].copy_from_slice(&guid.to_le_bytes());
        let clock = Arc::new(Clock::real());
        let wake = Arc::new(Wake::default());
        let cm = CmConfig::new(guid, rng_seed);
        let address = roce_address(config.local, DEFAULT_PKEY);
        let shared = config.beside_al.then(|| {
            Arc::new(SharedPort::new(
                cm,
                address,
                Arc::clone(&clock),
                Arc::clone(&wake),
            ))
        });
        let node = match &shared {
            Some(s) => Arc::clone(s.ibcm()),
            None => Arc::new(Node::new(cm, address, clock, Arc::clone(&wake))),
        };
        let nodes: Vec<Arc<Node>> = match &shared {
            Some(s) => s.nodes().into_iter().cloned().collect(),
            None => vec![Arc::clone(&node)],
        };
        let raw = Arc::new(raw);
        let stats = Arc::new(RoceStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let faults = Arc::new(Mutex::new(config.faults.clone()));
        let mut threads = Vec::new();
        {
            let (node, shared, raw, stats, stop, faults) = (
                Arc::clone(&node),
                shared.clone(),
                Arc::clone(&raw),
                Arc::clone(&stats),
                Arc::clone(&stop),
                Arc::clone(&faults),
            );
            let local = config.local;
            threads.push(
                std::thread::Builder::new()
                    .name("ibcm-rocev2-rx".into())
                    .spawn(move || {
                        receive_loop(
                            &node,
                            shared.as_deref(),
                            &raw,
                            local,
                            &stats,
                            &stop,
                            &faults,
                        );
                    })?,
            );
        }
        {
            let (stats, stop, wake) = (Arc::clone(&stats), Arc::clone(&stop), Arc::clone(&wake));
            let cfg = config.clone();
            let id_seed = (seed as u16) | 1;
            threads.push(
                std::thread::Builder::new()
                    .name("ibcm-rocev2-tx".into())
                    .spawn(move || {
                        transmit_loop(&nodes, &raw, &cfg, &stats, &stop, &wake, &faults, id_seed);
                    })?,
            );
        }
        Ok(Self {
            node,
            shared,
            config,
            guid,
            stats,
            stop,
            wake,
            threads,
            _udp: udp,
        })
    }

    /// The node (open it with the user library's `Provider::in_process`); beside AL,
    /// ibcm's.
    pub fn node(&self) -> Arc<Node> {
        Arc::clone(&self.node)
    }

    /// The two CMs and their steering counts, beside AL ([`RoceConfig::beside_al`]).
    pub fn shared(&self) -> Option<&Arc<SharedPort>> {
        self.shared.as_ref()
    }

    /// The CA GUID.
    pub fn guid(&self) -> u64 {
        self.guid
    }

    /// The local address.
    pub fn local(&self) -> Ipv4Addr {
        self.config.local
    }

    /// The path from here to `remote`.
    pub fn path_to(&self, remote: Ipv4Addr, packet_life_time: u8) -> PathRecord {
        path_record(self.config.local, remote, packet_life_time)
    }

    /// Counts so far.
    pub fn counts(&self) -> RoceCounts {
        self.stats.counts()
    }

    /// Stops the threads (what was queued to send is sent first).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for RocePort {
    fn drop(&mut self) {
        self.halt();
    }
}

fn receive_loop(
    node: &Node,
    shared: Option<&SharedPort>,
    raw: &Socket,
    local: Ipv4Addr,
    stats: &RoceStats,
    stop: &AtomicBool,
    faults: &Mutex<RoceFaults>,
) {
    let mut buf = [0u8; 2048];
    let mut reader = raw;
    while !stop.load(Ordering::Acquire) {
        let n = match io::Read::read(&mut reader, &mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let Some(packet) = buf.get(..n) else { continue };
        receive_packet(packet, local, stats, faults, |src, mad| match shared {
            Some(s) => s.receive(src, mad),
            None => node.receive(src, mad),
        });
    }
}

/// What the receive path did with one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A QP1 MAD to the local address with a good ICRC: handed to the CM (counted in
    /// `received`).
    Delivered,
    /// Not RoCEv2 (not IPv4/UDP to port 4791), or not to the local address: ignored, not
    /// counted.
    Ignored,
    /// RoCEv2 but not a QP1 MAD (counted in `not_qp1`).
    NotQp1,
    /// A wrong ICRC (counted in `bad_icrc`).
    BadIcrc,
    /// Dropped by fault injection (counted in `fault_rx`).
    Faulted,
}

/// The receive path of a port for one packet as the raw socket delivered it (IPv4 header
/// first): taken apart and its ICRC checked ([`decode`]), counted in `stats`, and, if it
/// is a QP1 MAD to `local` with a good ICRC that fault injection spares, handed to
/// `deliver` with the address a reply goes to. The receive thread runs this for every
/// packet it reads; it is public so that the path can be driven without a socket (the
/// fuzz target does).
pub fn receive_packet(
    packet: &[u8],
    local: Ipv4Addr,
    stats: &RoceStats,
    faults: &Mutex<RoceFaults>,
    deliver: impl FnOnce(&MadAddress, &[u8]),
) -> Received {
    match decode(packet) {
        Ok(d) if d.framing.dst == local => {
            let lose = RoceFaults::take(
                &mut faults
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .drop_rx,
                attribute_of(d.mad),
            );
            if lose {
                RoceStats::bump(&stats.fault_rx);
                return Received::Faulted;
            }
            RoceStats::bump(&stats.received);
            deliver(&roce_address(d.framing.src, d.framing.pkey), d.mad);
            Received::Delivered
        }
        Ok(_) | Err(DropReason::NotRoce) => Received::Ignored,
        Err(DropReason::NotQp1) => {
            RoceStats::bump(&stats.not_qp1);
            Received::NotQp1
        }
        Err(DropReason::BadIcrc { .. }) => {
            RoceStats::bump(&stats.bad_icrc);
            Received::BadIcrc
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn transmit_loop(
    nodes: &[Arc<Node>],
    raw: &Socket,
    cfg: &RoceConfig,
    stats: &RoceStats,
    stop: &AtomicBool,
    wake: &Wake,
    faults: &Mutex<RoceFaults>,
    id_seed: u16,
) {
    let mut ip_id = id_seed;
    let mut psn: u32 = 0;
    let udp_src = 0xc000 | (id_seed & 0x3fff);
    loop {
        let stopping = stop.load(Ordering::Acquire);
        for node in nodes {
            let now = node.platform.now();
            if node.platform.timer().is_some_and(|t| t <= now) {
                node.fire_timer();
            }
        }
        for t in nodes.iter().flat_map(|n| n.platform.take_sent()) {
            let Some(dst) = gid_ipv4(&t.dest.gid).filter(|a| cfg.on_link(*a)) else {
                RoceStats::bump(&stats.refused);
                continue;
            };
            let lose = RoceFaults::take(
                &mut faults
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .drop_tx,
                attribute_of(&t.mad),
            );
            if lose {
                RoceStats::bump(&stats.fault_tx);
                continue;
            }
            let framing = Framing {
                src: cfg.local,
                dst,
                ip_id,
                udp_src,
                pkey: t.dest.pkey,
                psn,
                ack_req: false,
                mig_req: false,
            };
            ip_id = ip_id.wrapping_add(1).max(1);
            psn = (psn + 1) & 0x00ff_ffff;
            let Some(packet) = encode(&framing, &t.mad) else {
                RoceStats::bump(&stats.send_errors);
                continue;
            };
            match raw.send_to(&packet, &SockAddr::from(SocketAddrV4::new(dst, 0))) {
                Ok(_) => RoceStats::bump(&stats.sent),
                Err(_) => RoceStats::bump(&stats.send_errors),
            }
        }
        if stopping {
            return;
        }
        let wait = nodes
            .iter()
            .filter_map(|n| {
                let now = n.platform.now();
                n.platform
                    .timer()
                    .map(|t| Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos())))
            })
            .min()
            .unwrap_or(Duration::from_millis(50))
            .min(Duration::from_millis(50));
        if !wait.is_zero() {
            wake.wait(wait);
        }
    }
}
