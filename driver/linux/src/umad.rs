//! QP1 of a real RDMA port through the kernel's user MAD interface (ib_umad), carrying
//! the CM MADs of an in-process driver node (`ibcm_host::Node`: the dispatch layer and
//! the engine the Windows driver runs).
//!
//! The file `/dev/infiniband/umadN` of the port gets one agent for management class
//! 0x07 (CM), class version 2, on QP1, receiving the unsolicited methods the CM uses
//! (IBA 16.7.1: Send 0x03; Get/Set 0x01/0x02 for ClassPortInfo). Registration fails while
//! the kernel's `ib_cm` holds the class: on a node running ibcm it must not be loaded.
//!
//! Every MAD is sent with a GRH (RoCE has no LIDs): the source GID index is the port's
//! RoCEv2 GID of the local IPv4 address, the destination the GID the engine addressed.
//! The kernel resolves the peer's MAC from that GID, as it does for its own CM.
//!
//! One difference from the raw-socket port (`ibcm_host::rocev2`) is the kernel's: ib_umad
//! overwrites the high 32 bits of the TID of every MAD that is not a response
//! (drivers/infiniband/core/user_mad.c, ib_umad_write: "Set the high-order part of the
//! transaction ID ..."), and CM MADs are all Send (not responses), so a REP does not echo
//! the REQ's TID high half. Linux's CM matches connections by comm ID, not TID.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ibcm_cep::{CmConfig, MadAddress, PathRecord};
use ibcm_endpoint::Platform;
use ibcm_host::rocev2::{gid_ipv4, path_record, roce_address};
use ibcm_host::wire::{DEFAULT_PKEY, QP1_QKEY};
use ibcm_host::{Clock, Node, Wake};
use ibcm_mad::{CM_CLASS, CM_CLASS_VERSION, MAD_SIZE};

use crate::sysfs;

/// Methods received unsolicited: Get (0x01), Set (0x02), Send (0x03) (IBA 13.4.5, Table 150).
const METHODS: [u8; 3] = [0x01, 0x02, 0x03];

/// `struct ib_user_mad_hdr` with the P_Key index (include/uapi/rdma/ib_user_mad.h), 64 bytes.
const HDR_LEN: usize = 64;
/// `struct ib_user_mad_reg_req2` (include/uapi/rdma/ib_user_mad.h), 40 bytes.
const REG_REQ2_LEN: usize = 40;
/// `_IOC(dir, type, nr, size)` of asm-generic/ioctl.h.
const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (IB_IOCTL_MAGIC << 8) | nr
}
const IB_IOCTL_MAGIC: u64 = 0x1b;
/// `IB_USER_MAD_ENABLE_PKEY`: `_IO(IB_IOCTL_MAGIC, 3)`.
const IB_USER_MAD_ENABLE_PKEY: u64 = ioc(0, 3, 0);
/// `IB_USER_MAD_REGISTER_AGENT2`: `_IOWR(IB_IOCTL_MAGIC, 4, struct ib_user_mad_reg_req2)`.
const IB_USER_MAD_REGISTER_AGENT2: u64 = ioc(3, 4, REG_REQ2_LEN as u64);

/// Settings of a umad port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UmadConfig {
    /// The RDMA device (`rxe0`).
    pub device: String,
    /// Its port.
    pub port: u8,
    /// The local IPv4 address (its RoCEv2 GID is the source of every MAD).
    pub local: Ipv4Addr,
    /// Seed of the CM's RNG (comm IDs, PSNs); by default from the time and process ID.
    pub seed: Option<u64>,
}

/// What a umad port has counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UmadCounts {
    /// MADs written to the device.
    pub sent: u64,
    /// Writes the device refused.
    pub send_errors: u64,
    /// Sends refused here: the destination GID is not IPv4-mapped.
    pub refused: u64,
    /// MADs handed to the CM.
    pub received: u64,
    /// Reads dropped: short, a send status report, or a source that is not a RoCEv2 GID.
    pub dropped: u64,
    /// The longest `write` of a MAD (ib_umad_write builds the address handle, resolving
    /// the destination's MAC, before it queues the send).
    pub slowest_write: Duration,
    /// All writes together.
    pub write_time: Duration,
}

#[derive(Debug, Default)]
struct Stats {
    sent: AtomicU64,
    send_errors: AtomicU64,
    refused: AtomicU64,
    received: AtomicU64,
    dropped: AtomicU64,
    slowest_write_ns: AtomicU64,
    write_ns: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A running umad port: a driver node on a real RDMA port's QP1.
pub struct UmadPort {
    node: Arc<Node>,
    sender: Arc<Sender>,
    config: UmadConfig,
    guid: u64,
    gid_index: u8,
    path: PathBuf,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    wake: Arc<Wake>,
    threads: Vec<JoinHandle<()>>,
}

impl core::fmt::Debug for UmadPort {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UmadPort")
            .field("device", &self.config.device)
            .field("umad", &self.path)
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

fn ioctl(file: &File, request: u64, arg: *mut libc::c_void) -> io::Result<()> {
    // SAFETY: `file` is an open umad file; `arg` is null or points to the structure the
    // request's size encodes, alive and writable for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), request as libc::Ioctl, arg) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Registers the CM agent on QP1; returns its ID.
fn register_agent(file: &File) -> io::Result<u32> {
    ioctl(file, IB_USER_MAD_ENABLE_PKEY, std::ptr::null_mut())?;
    let mut req = [0u8; REG_REQ2_LEN];
    req[4..8].copy_from_slice(&1u32.to_ne_bytes()); // qpn: QP1
    req[8] = CM_CLASS;
    req[9] = CM_CLASS_VERSION;
    let mut mask = [0u64; 2];
    for m in METHODS {
        mask[usize::from(m / 64)] |= 1 << (m % 64);
    }
    req[16..24].copy_from_slice(&mask[0].to_ne_bytes());
    req[24..32].copy_from_slice(&mask[1].to_ne_bytes());
    ioctl(file, IB_USER_MAD_REGISTER_AGENT2, req.as_mut_ptr().cast()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("registering the CM agent (class 0x07 v2 on QP1): {e}; is ib_cm loaded?"),
        )
    })?;
    Ok(u32::from_ne_bytes([req[0], req[1], req[2], req[3]]))
}

/// P_Keys of the port by index (`ports/N/pkeys/I`).
fn pkey_table(device: &str, port: u8) -> Vec<u16> {
    (0..64)
        .map_while(|i| {
            std::fs::read_to_string(format!(
                "/sys/class/infiniband/{device}/ports/{port}/pkeys/{i}"
            ))
            .ok()
            .and_then(|s| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        })
        .collect()
}

impl UmadPort {
    /// Opens the port's umad device, registers the CM agent and starts the threads.
    pub fn start(config: &UmadConfig) -> io::Result<Self> {
        let config = config.clone();
        let path = sysfs::umad_path(&config.device, config.port)?;
        let guid = sysfs::node_guid(&config.device)?;
        let gid_index = sysfs::roce_v2_gid_index(&config.device, config.port, config.local)?;
        let pkeys = pkey_table(&config.device, config.port);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let agent = register_agent(&file)?;
        let file = Arc::new(file);

        let seed = config.seed.unwrap_or_else(seed_from_clock);
        let mut rng_seed = [0u8; 32];
        rng_seed[..8].copy_from_slice(&seed.to_le_bytes());
        rng_seed[8..16].copy_from_slice(&guid.to_le_bytes());
        let wake = Arc::new(Wake::default());
        let node = Arc::new(Node::new(
            CmConfig::new(guid, rng_seed),
            roce_address(config.local, DEFAULT_PKEY),
            Arc::new(Clock::real()),
            Arc::clone(&wake),
        ));
        let stats = Arc::new(Stats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let sender = Arc::new(Sender {
            file: Arc::clone(&file),
            agent,
            gid_index,
            stats: Arc::clone(&stats),
            order: Mutex::new(()),
        });
        let mut threads = Vec::new();
        {
            let (node, sender, stats, stop) = (
                Arc::clone(&node),
                Arc::clone(&sender),
                Arc::clone(&stats),
                Arc::clone(&stop),
            );
            threads.push(
                std::thread::Builder::new()
                    .name("ibcm-umad-rx".into())
                    .spawn(move || receive_loop(&node, &file, &pkeys, &sender, &stats, &stop))?,
            );
        }
        {
            let (node, sender, stop, wake) = (
                Arc::clone(&node),
                Arc::clone(&sender),
                Arc::clone(&stop),
                Arc::clone(&wake),
            );
            threads.push(
                std::thread::Builder::new()
                    .name("ibcm-umad-timer".into())
                    .spawn(move || timer_loop(&node, &sender, &stop, &wake))?,
            );
        }
        Ok(Self {
            node,
            sender,
            config,
            guid,
            gid_index,
            path,
            stats,
            stop,
            wake,
            threads,
        })
    }

    /// The node (open it with the user library's `Provider::in_process`).
    pub fn node(&self) -> Arc<Node> {
        Arc::clone(&self.node)
    }

    /// The CA GUID (the device's node GUID).
    pub fn guid(&self) -> u64 {
        self.guid
    }

    /// The source GID index of the MADs (the RoCEv2 GID of the local address).
    pub fn gid_index(&self) -> u8 {
        self.gid_index
    }

    /// The local address.
    pub fn local(&self) -> Ipv4Addr {
        self.config.local
    }

    /// The path from here to `remote`, as on the raw-socket port (RoCEv2: no SA).
    pub fn path_to(&self, remote: Ipv4Addr, packet_life_time: u8) -> PathRecord {
        path_record(self.config.local, remote, packet_life_time)
    }

    /// Writes what the driver has queued to send, in this thread: call it after running
    /// the driver (an IOCTL), so that its MADs leave before the call returns, as a
    /// driver's do (the timer thread would write them otherwise, a thread switch later).
    pub fn flush(&self) {
        self.sender.flush(&self.node);
    }

    /// Counts so far.
    pub fn counts(&self) -> UmadCounts {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        UmadCounts {
            sent: l(&self.stats.sent),
            send_errors: l(&self.stats.send_errors),
            refused: l(&self.stats.refused),
            received: l(&self.stats.received),
            dropped: l(&self.stats.dropped),
            slowest_write: Duration::from_nanos(l(&self.stats.slowest_write_ns)),
            write_time: Duration::from_nanos(l(&self.stats.write_ns)),
        }
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

impl Drop for UmadPort {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Waits up to 50 ms for the file to be readable.
fn readable(file: &File) -> bool {
    let mut fds = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, alive for the call.
    let n = unsafe { libc::poll(&mut fds, 1, 50) };
    n > 0 && fds.revents & libc::POLLIN != 0
}

/// What one read from the umad file means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming<'a> {
    /// A MAD from `from` for the CM.
    Mad {
        /// Where it came from (and a reply goes).
        from: MadAddress,
        /// The 256-byte MAD.
        mad: &'a [u8],
    },
    /// Nothing for the CM: too short, a send status report, or from a GID that is not a
    /// RoCEv2 (IPv4-mapped) one.
    Drop,
}

/// Takes apart one read of the umad file (`struct ib_user_mad`: the 64-byte header, then
/// the MAD), `pkeys` the port's P_Key table. Never panics, whatever the bytes.
pub fn parse<'a>(read: &'a [u8], pkeys: &[u16]) -> Incoming<'a> {
    let (Some(hdr), Some(mad)) = (read.get(..HDR_LEN), read.get(HDR_LEN..HDR_LEN + MAD_SIZE))
    else {
        return Incoming::Drop;
    };
    let u32_at = |o: usize| u32::from_ne_bytes([hdr[o], hdr[o + 1], hdr[o + 2], hdr[o + 3]]);
    // status: non-zero reports a send that timed out (we never ask for responses).
    if u32_at(4) != 0 {
        return Incoming::Drop;
    }
    let grh = hdr[32] != 0;
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&hdr[36..52]);
    let Some(addr) = gid_ipv4(&gid).filter(|_| grh) else {
        return Incoming::Drop;
    };
    let pkey_index = usize::from(u16::from_ne_bytes([hdr[56], hdr[57]]));
    let pkey = pkeys.get(pkey_index).copied().unwrap_or(DEFAULT_PKEY);
    let mut from = roce_address(addr, pkey);
    from.sl = hdr[30];
    Incoming::Mad { from, mad }
}

fn receive_loop(
    node: &Node,
    file: &File,
    pkeys: &[u16],
    sender: &Sender,
    stats: &Stats,
    stop: &AtomicBool,
) {
    let mut buf = [0u8; HDR_LEN + MAD_SIZE];
    let mut reader = file;
    while !stop.load(Ordering::Acquire) {
        if !readable(file) {
            continue;
        }
        let n = match reader.read(&mut buf) {
            Ok(n) => n,
            Err(_) => {
                bump(&stats.dropped);
                continue;
            }
        };
        match parse(buf.get(..n).unwrap_or(&[]), pkeys) {
            Incoming::Mad { from, mad } => {
                bump(&stats.received);
                tracing::debug!(target: "ibcm", attribute = format_args!("{:#06x}", attribute(mad)), "umad: MAD read");
                node.receive(&from, mad);
                // What the MAD made the driver send (a DREP, a duplicate's answer, ...).
                sender.flush(node);
            }
            Incoming::Drop => bump(&stats.dropped),
        }
    }
}

/// A MAD's attribute ID (bytes 16..18, IBA 13.4.2), for traces.
fn attribute(mad: &[u8]) -> u16 {
    mad.get(16..18)
        .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
}

/// The umad write of one MAD: the header (agent, QP1, the GSI Q_Key, a GRH to `dest`'s
/// GID from `gid_index`) and the MAD. `None` if `dest` is not a RoCEv2 GID.
pub fn frame(
    agent: u32,
    gid_index: u8,
    dest: &MadAddress,
    mad: &[u8; MAD_SIZE],
) -> Option<[u8; HDR_LEN + MAD_SIZE]> {
    gid_ipv4(&dest.gid)?;
    let mut out = [0u8; HDR_LEN + MAD_SIZE];
    out[0..4].copy_from_slice(&agent.to_ne_bytes());
    out[16..20].copy_from_slice(&((HDR_LEN + MAD_SIZE) as u32).to_ne_bytes());
    out[20..24].copy_from_slice(&1u32.to_be_bytes()); // QP1
    out[24..28].copy_from_slice(&QP1_QKEY.to_be_bytes());
    out[28..30].copy_from_slice(&dest.lid.to_be_bytes());
    out[30] = dest.sl;
    out[32] = 1; // grh_present: always on RoCE
    out[33] = gid_index;
    out[34] = ibcm_host::rocev2::HOP_LIMIT;
    out[36..52].copy_from_slice(&dest.gid);
    // pkey_index 0: the default partition, the only one rxe has.
    out[HDR_LEN..].copy_from_slice(mad);
    Some(out)
}

/// Writes the driver's MADs to the umad file: whoever has just run the driver (the
/// caller of an IOCTL, the receive thread, the timer thread) writes what it queued, in
/// that thread, as a driver posts its sends from the dispatch routine or DPC that made
/// them, rather than handing them to another thread (a thread switch per MAD on the
/// critical path of every connection).
struct Sender {
    file: Arc<File>,
    agent: u32,
    gid_index: u8,
    stats: Arc<Stats>,
    /// Held from taking the queued MADs to the last write: the MADs leave in the order
    /// the driver queued them, whichever thread writes them.
    order: Mutex<()>,
}

impl Sender {
    /// Writes every MAD the node has queued.
    fn flush(&self, node: &Node) {
        let _order = self.order.lock().unwrap_or_else(PoisonError::into_inner);
        let sent = node.platform.take_sent();
        let mut writer = &*self.file;
        for t in &sent {
            let Some(out) = frame(self.agent, self.gid_index, &t.dest, &t.mad) else {
                bump(&self.stats.refused);
                continue;
            };
            // ib_umad_write builds an address handle per MAD with rdma_create_user_ah
            // (drivers/infiniband/core/user_mad.c), which on RoCE resolves the
            // destination's MAC (verbs.c, rdma_create_user_ah -> ib_resolve_eth_dmac,
            // a round trip through the ib_addr workqueue) before the send is queued;
            // Linux's own CM builds its AHs with the MAC known (rdma_create_ah). Its
            // time is the kernel's, per MAD, counted here.
            let t0 = std::time::Instant::now();
            let written = writer.write_all(&out);
            let took = t0.elapsed();
            let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            self.stats.write_ns.fetch_add(ns, Ordering::Relaxed);
            self.stats.slowest_write_ns.fetch_max(ns, Ordering::Relaxed);
            tracing::debug!(target: "ibcm", attribute = format_args!("{:#06x}", attribute(&t.mad)), write_us = took.as_micros() as u64, ok = written.is_ok(), "umad: MAD written");
            match written {
                Ok(()) => bump(&self.stats.sent),
                Err(_) => bump(&self.stats.send_errors),
            }
        }
        node.platform.recycle_sent(sent);
    }
}

/// The node's timer on the real clock, and what the timer's passes send.
fn timer_loop(node: &Node, sender: &Sender, stop: &AtomicBool, wake: &Wake) {
    loop {
        let stopping = stop.load(Ordering::Acquire);
        let now = node.platform.now();
        if node.platform.timer().is_some_and(|t| t <= now) {
            node.fire_timer();
        }
        // The timer's sends, and any a writer left queued.
        sender.flush(node);
        if stopping {
            return;
        }
        let now = node.platform.now();
        let wait = node
            .platform
            .timer()
            .map(|t| Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos())))
            .unwrap_or(Duration::from_millis(50))
            .min(Duration::from_millis(50));
        if !wait.is_zero() {
            wake.wait(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_are_the_uapi_headers() {
        // _IO(0x1b, 3) and _IOWR(0x1b, 4, 40 bytes), as the C preprocessor computes them.
        assert_eq!(IB_USER_MAD_ENABLE_PKEY, 0x1b03);
        assert_eq!(IB_USER_MAD_REGISTER_AGENT2, 0xc028_1b04);
    }

    #[test]
    fn a_frame_parses_back_to_its_address() {
        let dest = roce_address(Ipv4Addr::new(10, 77, 0, 2), DEFAULT_PKEY);
        let mut mad = [0u8; MAD_SIZE];
        mad[1] = CM_CLASS;
        let out = frame(7, 1, &dest, &mad).unwrap();
        match parse(&out, &[DEFAULT_PKEY]) {
            Incoming::Mad { from, mad: m } => {
                assert_eq!(from, dest);
                assert_eq!(m, &mad[..]);
            }
            Incoming::Drop => panic!("dropped"),
        }
        assert_eq!(parse(&out[..100], &[]), Incoming::Drop);
        let mut ib = dest;
        ib.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert!(frame(7, 1, &ib, &mad).is_none());
    }

    /// Whoever flushes writes every queued MAD once, framed, in the order the driver
    /// queued them; a destination that is not a RoCEv2 GID is refused, not written.
    #[test]
    fn a_flush_writes_the_queue_in_order() {
        use ibcm_endpoint::Platform;
        let path = std::env::temp_dir().join(format!("ibcm-umad-flush-{}", std::process::id()));
        let file = Arc::new(File::create(&path).expect("temp file"));
        let node = Node::new(
            CmConfig::new(1, [0; 32]),
            roce_address(Ipv4Addr::new(10, 77, 0, 3), DEFAULT_PKEY),
            Arc::new(Clock::real()),
            Arc::new(Wake::default()),
        );
        let sender = Sender {
            file,
            agent: 9,
            gid_index: 1,
            stats: Arc::new(Stats::default()),
            order: Mutex::new(()),
        };
        let to = roce_address(Ipv4Addr::new(10, 77, 0, 2), DEFAULT_PKEY);
        let mut off_link = to;
        off_link.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        for (i, dest) in [to, off_link, to].into_iter().enumerate() {
            let mut mad = [0u8; MAD_SIZE];
            mad[1] = CM_CLASS;
            mad[17] = 0x10 + i as u8;
            node.platform.send(&ibcm_cep::Transmit { dest, mad });
        }
        sender.flush(&node);
        sender.flush(&node);
        let written = std::fs::read(&path).expect("read back");
        let _ = std::fs::remove_file(&path);
        let frames: Vec<&[u8]> = written.chunks(HDR_LEN + MAD_SIZE).collect();
        assert_eq!(frames.len(), 2);
        for (frame, attribute) in frames.iter().zip([0x10u16, 0x12]) {
            match parse(frame, &[DEFAULT_PKEY]) {
                Incoming::Mad { from, mad } => {
                    assert_eq!(from, to);
                    assert_eq!(super::attribute(mad), attribute);
                }
                Incoming::Drop => panic!("a written frame does not parse"),
            }
        }
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!((l(&sender.stats.sent), l(&sender.stats.refused)), (2, 1));
    }

    #[test]
    fn no_read_panics() {
        for len in 0..=HDR_LEN + MAD_SIZE {
            let _ = parse(&vec![0xff; len], &[]);
        }
    }

    proptest::proptest! {
        /// Whatever the umad device delivers, the receive path takes it apart without
        /// panicking, and hands the CM a 256-byte MAD or nothing.
        #[test]
        fn any_read_parses_or_drops(read in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
                                    pkeys in proptest::collection::vec(proptest::num::u16::ANY, 0..3)) {
            if let Incoming::Mad { mad, .. } = parse(&read, &pkeys) {
                proptest::prop_assert_eq!(mad.len(), MAD_SIZE);
            }
        }
    }
}
