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
//! RoCEv2 GID of the local IPv4 address, as the verbs context finds it now (kept until
//! the port's GID_CHANGE), the destination the GID the engine addressed.
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
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
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

use crate::eventfd::EventFd;
use crate::pkey_table::PkeyTable;
use crate::port_events::PortEvents;
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

/// The index of the local RoCEv2 GID in the port's GID table now, which every MAD's GRH
/// names as its source: the device's verbs context keeps it until the port's GID_CHANGE
/// (`verbs::Context::gid_index`), so a GID that moved is looked up again.
pub type GidIndex = Box<dyn Fn() -> io::Result<u8> + Send + Sync>;

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
    /// MADs written by the caller of an IOCTL (its flush after the dispatch).
    pub written_by_caller: u64,
    /// MADs written by the port's thread after a MAD read (what it made the driver send).
    pub written_by_receiver: u64,
    /// MADs written by the port's thread after a timer pass, passive work or a port event,
    /// and what its periodic sweep found left queued.
    pub written_by_timer: u64,
}

/// Which thread writes a flush's MADs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// The caller of an IOCTL.
    Caller,
    /// The port's thread, after a MAD read.
    Receiver,
    /// The port's thread, after a timer pass, passive work or a port event, or sweeping.
    Timer,
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
    /// Indexed by [`Writer`].
    written_by: [AtomicU64; 3],
    /// What stopped or broke the port (the driver panicked, the device went away): the
    /// port no longer works as it should.
    faults: Mutex<Vec<String>>,
    /// What the port reported and went on from: the first write refused with each errno,
    /// the first read error of each kind.
    warnings: Mutex<Vec<String>>,
    /// The errnos of the write errors reported so far.
    write_errnos: Mutex<Vec<i32>>,
}

impl Stats {
    fn fault(&self, what: String) {
        tracing::error!(target: "ibcm", "umad: {what}");
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    fn warn(&self, what: String) {
        tracing::warn!(target: "ibcm", "umad: {what}");
        self.warnings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    /// A refused write: counted, and reported once per errno (after an address change
    /// every write fails with EINVAL, and every connection would time out unexplained).
    fn write_error(&self, e: &io::Error) {
        bump(&self.send_errors);
        let errno = e.raw_os_error().unwrap_or(0);
        let mut seen = self
            .write_errnos
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !seen.contains(&errno) {
            seen.push(errno);
            drop(seen);
            self.warn(format!(
                "a MAD write failed: {e} (later ones with it only counted)"
            ));
        }
    }
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
    path: PathBuf,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    wake: Arc<Wake>,
    thread: Option<JoinHandle<()>>,
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

impl UmadPort {
    /// Opens the port's umad device, registers the CM agent and starts the port's thread,
    /// which receives MADs, runs the driver's timer and PASSIVE_LEVEL work, and reads
    /// `events` (the device's asynchronous events: the port's state, its table changes).
    /// Every write takes its source GID's index from `gid_index`.
    pub fn start(
        config: &UmadConfig,
        gid_index: GidIndex,
        events: Option<Arc<PortEvents>>,
    ) -> io::Result<Self> {
        let config = config.clone();
        let path = sysfs::umad_path(&config.device, config.port)?;
        let guid = sysfs::node_guid(&config.device)?;
        let pkeys = Arc::new(PkeyTable::sysfs(&config.device, config.port));
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
        let signal = Arc::new(EventFd::new()?);
        let wake = {
            let signal = Arc::clone(&signal);
            Arc::new(Wake::timer_only(Box::new(move || signal.raise())))
        };
        let node = Arc::new(Node::new(
            CmConfig::new(guid, rng_seed),
            roce_address(config.local, DEFAULT_PKEY),
            Arc::new(Clock::real()),
            Arc::clone(&wake),
        ));
        if let Some(events) = &events {
            events
                .attach(&node)
                .map_err(|e| io::Error::new(e.kind(), format!("the port's state: {e}")))?;
        }
        let stats = Arc::new(Stats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let sender = Arc::new(Sender {
            file: Arc::clone(&file),
            agent,
            gid_index,
            pkeys: Arc::clone(&pkeys),
            stats: Arc::clone(&stats),
            order: Mutex::new(()),
        });
        let thread = PortThread {
            node: Arc::clone(&node),
            file,
            pkeys: Arc::clone(&pkeys),
            sender: Arc::clone(&sender),
            stats: Arc::clone(&stats),
            stop: Arc::clone(&stop),
            wake: Arc::clone(&wake),
            signal,
            events,
        };
        let thread = std::thread::Builder::new()
            .name("ibcm-umad".into())
            .spawn(move || thread.run())?;
        Ok(Self {
            node,
            sender,
            config,
            guid,
            path,
            stats,
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// The node. Open it with the user library's `Provider::open_rdma`, whose handles
    /// run their completions on a thread of their own: the port's thread completes
    /// requests, and an application's completion run there would stop the port while it
    /// blocks.
    pub fn node(&self) -> Arc<Node> {
        Arc::clone(&self.node)
    }

    /// The CA GUID (the device's node GUID).
    pub fn guid(&self) -> u64 {
        self.guid
    }

    /// The source GID index of the MADs (the RoCEv2 GID of the local address).
    pub fn gid_index(&self) -> io::Result<u8> {
        (self.sender.gid_index)()
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
    /// driver's do (the port's thread would write them otherwise, a thread switch later).
    pub fn flush(&self) {
        self.sender.flush(&self.node, Writer::Caller);
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
            written_by_caller: l(&self.stats.written_by[Writer::Caller as usize]),
            written_by_receiver: l(&self.stats.written_by[Writer::Receiver as usize]),
            written_by_timer: l(&self.stats.written_by[Writer::Timer as usize]),
        }
    }

    /// What stopped or broke the port so far (the driver panicked on one of its threads,
    /// the umad device went away): a run that saw any of these failed.
    pub fn faults(&self) -> Vec<String> {
        self.stats
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What the port reported and went on from (the first failed write of each errno,
    /// read errors it backed off from).
    pub fn warnings(&self) -> Vec<String> {
        self.stats
            .warnings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the port's thread (what was queued to send is sent first).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for UmadPort {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The longest pause after read errors in a row.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A panic's message, for the report.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

/// Runs a piece of the driver on one of the port's threads; a panic (a bug: the kernel
/// would bugcheck) is reported as a fault of the port instead of ending the thread
/// silently, which would leave every later request of every handle waiting for its
/// deadline. `None` if it panicked.
fn guarded<T>(stats: &Stats, what: &str, run: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(v) => Some(v),
        Err(panic) => {
            stats.fault(format!(
                "the driver panicked in {what}: {}",
                panic_message(&*panic)
            ));
            None
        }
    }
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
/// the MAD), `pkey_at` the port's P_Key table by index. Never panics, whatever the bytes.
pub fn parse(read: &[u8], pkey_at: impl Fn(usize) -> Option<u16>) -> Incoming<'_> {
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
    let pkey = pkey_at(pkey_index).unwrap_or(DEFAULT_PKEY);
    let mut from = roce_address(addr, pkey);
    from.sl = hdr[30];
    Incoming::Mad { from, mad }
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
    pkey_index: u16,
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
    out[56..58].copy_from_slice(&pkey_index.to_ne_bytes());
    out[HDR_LEN..].copy_from_slice(mad);
    Some(out)
}

/// Writes the driver's MADs to the umad file: whoever has just run the driver (the
/// caller of an IOCTL, the port's thread) writes what it queued, in
/// that thread, as a driver posts its sends from the dispatch routine or DPC that made
/// them, rather than handing them to another thread (a thread switch per MAD on the
/// critical path of every connection).
struct Sender {
    file: Arc<File>,
    agent: u32,
    gid_index: GidIndex,
    /// The port's P_Key table (`ports/N/pkeys`), read as far as lookups need.
    pkeys: Arc<PkeyTable>,
    stats: Arc<Stats>,
    /// Held from taking the queued MADs to the last write: the MADs leave in the order
    /// the driver queued them, whichever thread writes them.
    order: Mutex<()>,
}

impl Sender {
    /// Writes every MAD the node has queued, from `by`'s thread.
    fn flush(&self, node: &Node, by: Writer) {
        // Nothing queued: no wait for a writer that holds `order` (a umad write can block
        // for the kernel's address resolution, up to its 1 s timeout; the port's thread
        // sweeps every 50 ms). A MAD queued after this look is written by whoever queued
        // it, who flushes after running the driver.
        if !node.platform.sends_queued() {
            return;
        }
        let _order = self.order.lock().unwrap_or_else(PoisonError::into_inner);
        let sent = node.platform.take_sent();
        let mut writer = &*self.file;
        // Asked at every flush that writes, not kept here: the GID may have moved
        // (the context forgets on GID_CHANGE). An error (the GID is gone) refuses them.
        let gid_index = (!sent.is_empty())
            .then(|| (self.gid_index)().ok())
            .flatten();
        for t in &sent {
            let out = gid_index.and_then(|g| {
                self.pkeys
                    .index_of(t.dest.pkey)
                    .and_then(|i| frame(self.agent, g, i, &t.dest, &t.mad))
            });
            let Some(out) = out else {
                bump(&self.stats.refused);
                continue;
            };
            // ib_umad_write builds an address handle per MAD with rdma_create_user_ah
            // (drivers/infiniband/core/user_mad.c), which on RoCE resolves the
            // destination's MAC (verbs.c, rdma_create_user_ah -> ib_resolve_eth_dmac,
            // a round trip through the ib_addr workqueue) before the send is queued;
            // a MAD read pays one too (recv_handler -> ib_init_ah_attr_from_wc), not
            // counted here. Linux's CM resolves once per REQ received
            // (cm_init_av_for_response) and reuses the address vector for its later
            // sends; its active side has the MAC from the path. ib_umad's header has
            // no way to pass a MAC or keep an AH. The write's time is counted here.
            let t0 = std::time::Instant::now();
            let written = writer.write_all(&out);
            let took = t0.elapsed();
            let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            self.stats.write_ns.fetch_add(ns, Ordering::Relaxed);
            self.stats.slowest_write_ns.fetch_max(ns, Ordering::Relaxed);
            tracing::debug!(target: "ibcm", attribute = format_args!("{:#06x}", attribute(&t.mad)), write_us = took.as_micros() as u64, ok = written.is_ok(), "umad: MAD written");
            match written {
                Ok(()) => {
                    bump(&self.stats.sent);
                    bump(&self.stats.written_by[by as usize]);
                }
                Err(e) => self.stats.write_error(&e),
            }
        }
        node.platform.recycle_sent(sent);
    }
}

/// The longest the port's thread sleeps: what a thread that does not flush left queued
/// is written within it (none does now; a sweep is cheap, a MAD left behind is a lost
/// connection).
const SWEEP: Duration = Duration::from_millis(50);

/// The port's one thread, as a driver's DPC and PnP callbacks are its code run by the
/// system rather than threads of its own: it waits on the umad file, the device's async
/// events and an eventfd together, and runs the node's timer on the real clock, the
/// PASSIVE_LEVEL work its DISPATCH_LEVEL paths ask for, the MADs read and the port
/// events, writing what each made the driver send.
///
/// The node's wake is timer-only ([`Wake::timer_only`]): the caller of an IOCTL writes
/// what it queued itself (a flush here would race it for it), so a MAD queued does not
/// wake this thread, and a timer re-armed raises the eventfd only when due before the
/// deadline it sleeps until.
struct PortThread {
    node: Arc<Node>,
    file: Arc<File>,
    pkeys: Arc<PkeyTable>,
    sender: Arc<Sender>,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    wake: Arc<Wake>,
    signal: Arc<EventFd>,
    events: Option<Arc<PortEvents>>,
}

/// Receiving from the umad file: whether it still can, and the pause after read errors.
#[derive(Default)]
struct Receiving {
    /// The file will never be readable again (the device went away): the thread goes on
    /// running the timer, so that what waits for an answer times out.
    gone: bool,
    /// After read errors in a row, no read before this.
    paused_until: Option<std::time::Instant>,
    backoff: Duration,
    /// The kinds of read error reported so far (each once).
    read_errors: Vec<io::ErrorKind>,
    /// A failed wait was reported (once).
    wait_failed: bool,
}

/// What one wait found ready (the eventfd is cleared inside the wait).
#[derive(Debug, Default, PartialEq, Eq)]
struct Ready {
    /// A MAD (or a send report) is queued on the umad file.
    umad: bool,
    /// The umad file will never be readable again: ib_umad_poll returns EPOLLERR alone
    /// once the port's agents are dead (the device went away; drivers/infiniband/core/
    /// user_mad.c, ib_umad_poll).
    umad_gone: Option<String>,
    /// An async event is queued.
    event: bool,
    /// The async fd reports an error without an event (the context is dead).
    events_gone: Option<i16>,
}

/// Waits up to `timeout` for any of `fds` (signal, umad, events; a negative fd is not
/// waited on), with `ppoll`'s nanosecond timeout (the timer's deadline, not rounded up to
/// a millisecond).
fn poll_files(fds: [RawFd; 3], timeout: Duration) -> io::Result<[i16; 3]> {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: three valid pollfds and a timespec, alive for the call; no signal mask.
    let n = unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok([0; 3])
        } else {
            Err(e)
        };
    }
    Ok(p.map(|p| p.revents))
}

/// What `revents` of one file say.
fn readable(revents: i16) -> bool {
    revents & libc::POLLIN != 0
}

/// An error without data: nothing will come.
fn broken(revents: i16) -> bool {
    !readable(revents) && revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
}

impl PortThread {
    fn run(&self) {
        // Entry 0, the default partition's, is what the first MAD either way looks up (a
        // receive's header names it, a send's partition is found there): read now, while
        // the port is idle, not inside the first REQ's turnaround (a sysfs open and read,
        // half a millisecond on a slow machine).
        let _ = self.pkeys.at(0);
        let node = &*self.node;
        let mut receiving = Receiving::default();
        let mut events = self.events.as_deref();
        let mut swept = std::time::Instant::now();
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            let now = node.platform.now();
            let mut ran = false;
            if node.platform.timer().is_some_and(|t| t <= now) {
                guarded(&self.stats, "a timer pass", || node.fire_timer());
                ran = true;
            }
            // The work item the device asks for when its record pool runs low or timewait
            // frees memory (trims, deferred timer passes), as KMDF's work item and the
            // simulated fabric run it; an atomic swap when nothing was asked.
            ran |= guarded(&self.stats, "passive work", || node.run_passive_work()).unwrap_or(true);
            if ran || stopping || swept.elapsed() >= SWEEP {
                self.sender.flush(node, Writer::Timer);
                swept = std::time::Instant::now();
            }
            if stopping {
                return;
            }
            let ready = self.wait(&mut receiving, events);
            if let Some(why) = ready.umad_gone {
                self.stats.fault(format!("{why}: no MAD will be received"));
                receiving.gone = true;
            }
            if let (Some(e), true) = (events, ready.event) {
                guarded(&self.stats, "a port event", || e.take(node, &self.pkeys));
                // What the event made the driver send (a port down ends connections).
                self.sender.flush(node, Writer::Timer);
            }
            if let Some(revents) = ready.events_gone {
                self.stats.warn(format!(
                    "the device's async events report poll events {revents:#x}: no port event will be read"
                ));
                events = None;
            }
            if ready.umad {
                self.receive(&mut receiving);
            }
        }
    }

    /// Sleeps until the node's timer, at most [`SWEEP`], or until a file is ready.
    fn wait(&self, receiving: &mut Receiving, events: Option<&PortEvents>) -> Ready {
        let node = &*self.node;
        let paused = receiving
            .paused_until
            .map(|t| t.saturating_duration_since(std::time::Instant::now()))
            .filter(|left| !left.is_zero());
        let umad = if receiving.gone || paused.is_some() {
            -1
        } else {
            self.file.as_raw_fd()
        };
        let fds = [self.signal.fd(), umad, events.map_or(-1, PortEvents::fd)];
        let mut ready = Ready::default();
        let mut failed = None;
        self.wake.sleep_for_timer(
            SWEEP,
            || (node.platform.now(), node.platform.timer()),
            |timeout| match poll_files(fds, paused.map_or(timeout, |p| p.min(timeout))) {
                Ok([signal, umad, event]) => {
                    // Cleared here, before the wake forgets it was signalled: a signal
                    // from then on raises the file again. Cleared after, it could take
                    // that raise with it while the wake still counts itself signalled,
                    // and the next signal would raise nothing (found in review: a
                    // passive work request then waited for the 50 ms sweep).
                    if readable(signal) {
                        self.signal.clear();
                    }
                    ready = Ready {
                        umad: readable(umad),
                        umad_gone: broken(umad).then(|| {
                            format!(
                                "the umad file reports poll events {umad:#x} (the device went away)"
                            )
                        }),
                        event: readable(event),
                        events_gone: broken(event).then_some(event),
                    };
                }
                Err(e) => failed = Some(e),
            },
        );
        if let Some(e) = failed {
            // ppoll fails for want of memory (ENOMEM), not for a file going away (that
            // is POLLERR): reported once, retried after a pause rather than in a spin.
            if !receiving.wait_failed {
                receiving.wait_failed = true;
                self.stats
                    .warn(format!("waiting on the umad file failed: {e} (retrying)"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        ready
    }

    /// Reads one MAD (the file is readable) and hands it to the driver.
    fn receive(&self, receiving: &mut Receiving) {
        let mut buf = [0u8; HDR_LEN + MAD_SIZE];
        let n = match (&*self.file).read(&mut buf) {
            Ok(n) => {
                receiving.backoff = Duration::ZERO;
                receiving.paused_until = None;
                n
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            // ib_umad_read fails with EIO once the port's agents are dead, ENODEV when
            // the device is gone (user_mad.c, ib_umad_read).
            Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::ENODEV)) => {
                self.stats.fault(format!(
                    "reading the umad file: {e}; no MAD will be received"
                ));
                receiving.gone = true;
                return;
            }
            Err(e) => {
                // Anything else may last (a packet the kernel requeues after a failed
                // copy): reported once per kind, counted, and retried after a pause that
                // doubles while the errors go on, not in a busy loop; the timer runs on
                // meanwhile.
                bump(&self.stats.dropped);
                if !receiving.read_errors.contains(&e.kind()) {
                    receiving.read_errors.push(e.kind());
                    self.stats
                        .warn(format!("reading the umad file: {e} (retrying)"));
                }
                receiving.backoff =
                    (receiving.backoff * 2).clamp(Duration::from_millis(1), MAX_BACKOFF);
                receiving.paused_until = Some(std::time::Instant::now() + receiving.backoff);
                return;
            }
        };
        let node = &*self.node;
        match parse(buf.get(..n).unwrap_or(&[]), |i| self.pkeys.at(i)) {
            Incoming::Mad { from, mad } => {
                bump(&self.stats.received);
                tracing::debug!(target: "ibcm", attribute = format_args!("{:#06x}", attribute(mad)), "umad: MAD read");
                guarded(&self.stats, "receiving a MAD", || node.receive(&from, mad));
                // What the MAD made the driver send (a DREP, a duplicate's answer, ...).
                self.sender.flush(node, Writer::Receiver);
            }
            Incoming::Drop => bump(&self.stats.dropped),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// The default partition's table: one full member at index 0.
    fn default_pkey_at(index: usize) -> Option<u16> {
        [DEFAULT_PKEY].get(index).copied()
    }

    fn default_pkeys() -> Arc<PkeyTable> {
        Arc::new(PkeyTable::new(Box::new(default_pkey_at)))
    }

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
        let out = frame(7, 1, 0, &dest, &mad).unwrap();
        match parse(&out, default_pkey_at) {
            Incoming::Mad { from, mad: m } => {
                assert_eq!(from, dest);
                assert_eq!(m, &mad[..]);
            }
            Incoming::Drop => panic!("dropped"),
        }
        assert_eq!(parse(&out[..100], |_| None), Incoming::Drop);
        let mut ib = dest;
        ib.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert!(frame(7, 1, 0, &ib, &mad).is_none());
    }

    /// A node at 10.77.0.3 and a sender writing its MADs to a new temporary file (the
    /// path, for reading them back), their source GID index from `gid_index`.
    fn flush_fixture(name: &str, gid_index: GidIndex) -> (PathBuf, Node, Sender) {
        let path = std::env::temp_dir().join(format!("ibcm-umad-{name}-{}", std::process::id()));
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
            gid_index,
            pkeys: default_pkeys(),
            stats: Arc::new(Stats::default()),
            order: Mutex::new(()),
        };
        (path, node, sender)
    }

    /// Whoever flushes writes every queued MAD once, framed, in the order the driver
    /// queued them; a destination that is not a RoCEv2 GID is refused, not written.
    #[test]
    fn a_flush_writes_the_queue_in_order() {
        use ibcm_endpoint::Platform;
        let (path, node, sender) = flush_fixture("flush", Box::new(|| Ok(1)));
        let to = roce_address(Ipv4Addr::new(10, 77, 0, 2), DEFAULT_PKEY);
        let mut off_link = to;
        off_link.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        for (i, dest) in [to, off_link, to].into_iter().enumerate() {
            let mut mad = [0u8; MAD_SIZE];
            mad[1] = CM_CLASS;
            mad[17] = 0x10 + i as u8;
            node.platform.send(&ibcm_cep::Transmit { dest, mad });
        }
        sender.flush(&node, Writer::Caller);
        sender.flush(&node, Writer::Timer);
        let written = std::fs::read(&path).expect("read back");
        let _ = std::fs::remove_file(&path);
        let frames: Vec<&[u8]> = written.chunks(HDR_LEN + MAD_SIZE).collect();
        assert_eq!(frames.len(), 2);
        for (frame, attribute) in frames.iter().zip([0x10u16, 0x12]) {
            match parse(frame, default_pkey_at) {
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

    /// A MAD's source GID index is the context's cache's answer at the flush that writes
    /// it: after the port's GID_CHANGE the GID is looked up again and the next MAD names
    /// its new index; a GID that is gone refuses the MADs.
    #[test]
    fn a_moved_gid_is_the_next_mads_source() {
        use crate::port_indices::PortIndices;
        use ibcm_endpoint::Platform;
        use std::sync::atomic::AtomicI32;
        let gids = Arc::new(PortIndices::<[u8; 16], u8>::new());
        // The GID table's index of the local GID now; -1: not in the table.
        let table = Arc::new(AtomicI32::new(1));
        let local = Ipv4Addr::new(10, 77, 0, 3).to_ipv6_mapped().octets();
        let (g, t) = (Arc::clone(&gids), Arc::clone(&table));
        let (path, node, sender) = flush_fixture(
            "gid",
            Box::new(move || {
                g.get(1, local, || {
                    u8::try_from(t.load(Ordering::Relaxed))
                        .map_err(|_| io::Error::other("no such GID"))
                })
            }),
        );
        let to = roce_address(Ipv4Addr::new(10, 77, 0, 2), DEFAULT_PKEY);
        let send = || {
            let mut mad = [0u8; MAD_SIZE];
            mad[1] = CM_CLASS;
            node.platform.send(&ibcm_cep::Transmit { dest: to, mad });
            sender.flush(&node, Writer::Caller);
        };
        send();
        // The GID re-added at another index: GID_CHANGE, the context forgets the port.
        table.store(4, Ordering::Relaxed);
        gids.forget(1);
        send();
        table.store(-1, Ordering::Relaxed);
        gids.forget(1);
        send();
        let written = std::fs::read(&path).expect("read back");
        let _ = std::fs::remove_file(&path);
        let sources: Vec<u8> = written.chunks(HDR_LEN + MAD_SIZE).map(|f| f[33]).collect();
        assert_eq!(sources, [1, 4]);
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!((l(&sender.stats.sent), l(&sender.stats.refused)), (2, 1));
    }

    /// Two threads each queue numbered MADs and flush, as the caller of an IOCTL and the
    /// port's thread do, into a pipe read slowly (a write blocks while it is full): the
    /// MADs leave in the order they were queued. Without `order`, one thread's flush can
    /// write a later batch while the other still holds an earlier one.
    #[test]
    fn concurrent_flushes_keep_the_queue_order() {
        use ibcm_endpoint::Platform;
        const PER_THREAD: u32 = 300;
        let (mut reader, writer) = std::io::pipe().expect("pipe");
        let file = File::from(std::os::fd::OwnedFd::from(writer));
        let node = Arc::new(Node::new(
            CmConfig::new(1, [0; 32]),
            roce_address(Ipv4Addr::new(10, 77, 0, 3), DEFAULT_PKEY),
            Arc::new(Clock::real()),
            Arc::new(Wake::default()),
        ));
        let sender = Arc::new(Sender {
            file: Arc::new(file),
            agent: 9,
            gid_index: Box::new(|| Ok(1)),
            pkeys: default_pkeys(),
            stats: Arc::new(Stats::default()),
            order: Mutex::new(()),
        });
        let to = roce_address(Ipv4Addr::new(10, 77, 0, 2), DEFAULT_PKEY);
        // Numbers are taken and queued together: the queue holds them in order.
        let next = Arc::new(Mutex::new(0u32));
        let slow = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut frame = [0u8; HDR_LEN + MAD_SIZE];
            while reader.read_exact(&mut frame).is_ok() {
                got.push(u32::from_be_bytes(
                    frame[HDR_LEN + 24..HDR_LEN + 28].try_into().unwrap(),
                ));
                if got.len() % 16 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            got
        });
        let writers: Vec<_> = [Writer::Caller, Writer::Receiver]
            .into_iter()
            .map(|by| {
                let (node, sender, next) =
                    (Arc::clone(&node), Arc::clone(&sender), Arc::clone(&next));
                std::thread::spawn(move || {
                    for _ in 0..PER_THREAD / 3 {
                        for _ in 0..3 {
                            let mut n = next.lock().unwrap();
                            let mut mad = [0u8; MAD_SIZE];
                            mad[1] = CM_CLASS;
                            mad[24..28].copy_from_slice(&n.to_be_bytes());
                            node.platform.send(&ibcm_cep::Transmit { dest: to, mad });
                            *n += 1;
                        }
                        sender.flush(&node, by);
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        sender.flush(&node, Writer::Timer);
        drop(sender);
        let got = slow.join().unwrap();
        let want: Vec<u32> = (0..got.len() as u32).collect();
        assert_eq!(got.len() as u32, 2 * (PER_THREAD / 3) * 3);
        assert!(got == want, "written out of queue order");
    }

    /// A flush with nothing queued (the port thread's 50 ms sweep, mostly) does not wait
    /// for a writer that holds the write order: a umad write can block for the kernel's
    /// address resolution, and the port's thread would stop with it.
    #[test]
    fn an_empty_flush_does_not_wait_for_a_writer() {
        let (path, node, sender) = flush_fixture("empty", Box::new(|| Ok(1)));
        let _ = std::fs::remove_file(&path);
        let (node, sender) = (Arc::new(node), Arc::new(sender));
        let held = sender.order.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (n, s) = (Arc::clone(&node), Arc::clone(&sender));
        std::thread::spawn(move || {
            s.flush(&n, Writer::Timer);
            let _ = tx.send(());
        });
        let done = rx.recv_timeout(Duration::from_secs(5));
        drop(held);
        assert!(done.is_ok(), "an empty flush waited for the writer");
    }

    /// A port thread with `file` as its umad file (MADs written to /dev/null), its node's
    /// wake raising its eventfd, as `UmadPort::start` makes it; and the thread running it.
    fn port_thread(file: File) -> (Arc<PortThread>, JoinHandle<()>) {
        port_thread_with(file, default_pkeys())
    }

    /// [`port_thread`] with `pkeys` as its P_Key table.
    fn port_thread_with(file: File, pkeys: Arc<PkeyTable>) -> (Arc<PortThread>, JoinHandle<()>) {
        let signal = Arc::new(EventFd::new().expect("eventfd"));
        let raise = Arc::clone(&signal);
        let wake = Arc::new(Wake::timer_only(Box::new(move || raise.raise())));
        let stats = Arc::new(Stats::default());
        let port = Arc::new(PortThread {
            node: Arc::new(Node::new(
                CmConfig::new(1, [0; 32]),
                roce_address(Ipv4Addr::new(10, 77, 0, 3), DEFAULT_PKEY),
                Arc::new(Clock::real()),
                Arc::clone(&wake),
            )),
            file: Arc::new(file),
            pkeys,
            sender: Arc::new(Sender {
                file: Arc::new(File::open("/dev/null").expect("/dev/null")),
                agent: 9,
                gid_index: Box::new(|| Ok(1)),
                pkeys: default_pkeys(),
                stats: Arc::clone(&stats),
                order: Mutex::new(()),
            }),
            stats,
            stop: Arc::new(AtomicBool::new(false)),
            wake,
            signal,
            events: None,
        });
        let run = Arc::clone(&port);
        (port, std::thread::spawn(move || run.run()))
    }

    /// Stops the thread as `UmadPort` does; it must end within 5 s.
    fn stop(port: &PortThread, thread: JoinHandle<()>) {
        port.stop.store(true, Ordering::Release);
        port.wake.notify();
        let begun = std::time::Instant::now();
        while !thread.is_finished() {
            assert!(
                begun.elapsed() < Duration::from_secs(5),
                "the port thread does not stop"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        thread.join().unwrap();
    }

    /// Waits up to 5 s for `done`.
    fn within_5s(done: impl Fn() -> bool) -> bool {
        let begun = std::time::Instant::now();
        while !done() {
            if begun.elapsed() > Duration::from_secs(5) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// The default partition's entry is read when the thread starts, before any MAD: the
    /// first REQ's turnaround does not wait for sysfs.
    #[test]
    fn the_port_thread_reads_the_default_partition_before_any_mad() {
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let pkeys = Arc::new(PkeyTable::new(Box::new(move |i| {
            counted.fetch_add(1, Ordering::Relaxed);
            default_pkey_at(i)
        })));
        let (_writer, reader) = {
            let (reader, writer) = std::io::pipe().expect("pipe");
            (writer, reader)
        };
        let (port, thread) = port_thread_with(
            File::from(std::os::fd::OwnedFd::from(reader)),
            Arc::clone(&pkeys),
        );
        assert!(
            within_5s(|| reads.load(Ordering::Relaxed) == 1),
            "entry 0 was not read before a MAD"
        );
        stop(&port, thread);
        assert_eq!(pkeys.at(0), Some(DEFAULT_PKEY));
        assert_eq!(reads.load(Ordering::Relaxed), 1, "entry 0 read twice");
    }

    /// A umad file that reports POLLHUP alone (a pipe without a writer: as ib_umad_poll
    /// reports EPOLLERR alone once the device is gone) is a fault, reported once, not read
    /// again; the thread goes on running passive work (and the timer: what waits for an
    /// answer still times out), and stops when asked. Before, the receive loop spun on
    /// it once, for ever, at full CPU.
    #[test]
    fn a_gone_device_is_a_fault_and_passive_work_runs_on() {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(writer);
        let (port, thread) = port_thread(File::from(std::os::fd::OwnedFd::from(reader)));
        let faults = || port.stats.faults.lock().unwrap().clone();
        assert!(within_5s(|| !faults().is_empty()), "no fault reported");
        std::thread::sleep(Duration::from_millis(120));
        port.node.platform.request_passive_work();
        assert!(
            within_5s(|| !port.node.platform.passive_work_asked()),
            "the passive work asked for was never run"
        );
        stop(&port, thread);
        assert_eq!(faults().len(), 1, "{:?}", faults().first());
    }

    /// The passive work the device asks for (as KMDF's work item and the simulated fabric
    /// run it) is run at once: the request raises the eventfd (the thread would otherwise
    /// sleep until its 50 ms sweep). Before, on a umad port, the request stayed pending
    /// for ever.
    #[test]
    fn the_port_thread_runs_passive_work_when_asked() {
        let (_writer_end, port, thread) = {
            let (reader, writer) = std::io::pipe().expect("pipe");
            let (port, thread) = port_thread(File::from(std::os::fd::OwnedFd::from(reader)));
            (writer, port, thread)
        };
        // 50 requests, each taken within microseconds when raised; each waits for the
        // next sweep (50 ms) when not: 2.5 s.
        let begun = std::time::Instant::now();
        for _ in 0..50 {
            port.node.platform.request_passive_work();
            assert!(
                within_5s(|| !port.node.platform.passive_work_asked()),
                "the passive work asked for was never run"
            );
        }
        let took = begun.elapsed();
        stop(&port, thread);
        assert!(
            took < Duration::from_secs(1),
            "not woken by the requests: {took:?}"
        );
        assert!(port.stats.faults.lock().unwrap().is_empty());
    }

    /// A MAD on the umad file reaches the driver, as many as are written, while the
    /// thread also waits on its eventfd; a short read is dropped.
    #[test]
    fn the_port_thread_hands_each_mad_read_to_the_driver() {
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        let (port, thread) = port_thread(File::from(std::os::fd::OwnedFd::from(reader)));
        let from = roce_address(Ipv4Addr::new(10, 77, 0, 2), DEFAULT_PKEY);
        let mut mad = [0u8; MAD_SIZE];
        mad[1] = CM_CLASS;
        let framed = frame(9, 0, 0, &from, &mad).unwrap();
        for _ in 0..3 {
            writer.write_all(&framed).unwrap();
            // One read takes one MAD, as ib_umad_read returns one packet per read.
            let received = port.stats.received.load(Ordering::Relaxed);
            assert!(within_5s(
                || port.stats.received.load(Ordering::Relaxed) > received
            ));
        }
        writer.write_all(&framed[..HDR_LEN]).unwrap();
        assert!(within_5s(|| port.stats.dropped.load(Ordering::Relaxed) == 1));
        stop(&port, thread);
        assert_eq!(port.stats.received.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn no_read_panics() {
        for len in 0..=HDR_LEN + MAD_SIZE {
            let _ = parse(&vec![0xff; len], |_| None);
        }
    }

    proptest::proptest! {
        /// Whatever the umad device delivers, the receive path takes it apart without
        /// panicking, and hands the CM a 256-byte MAD or nothing.
        #[test]
        fn any_read_parses_or_drops(read in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
                                    pkeys in proptest::collection::vec(proptest::num::u16::ANY, 0..3)) {
            if let Incoming::Mad { mad, .. } = parse(&read, |i| pkeys.get(i).copied()) {
                proptest::prop_assert_eq!(mad.len(), MAD_SIZE);
            }
        }
    }
}
