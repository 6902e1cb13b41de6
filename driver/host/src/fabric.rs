//! An in-process fabric: N host nodes, one port each, joined by links with a latency and
//! seeded faults (loss, duplication, reordering, delay, corruption).
//!
//! Two modes: virtual time, where [`Fabric::step`] advances the clock to the next event
//! (deterministic, for tests), and real time, where [`Realtime`] runs the fabric on its
//! own thread while user threads issue IOCTLs concurrently, so the locking design is
//! exercised for real.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ibcm_cep::{CmConfig, Instant, MadAddress};
use ibcm_endpoint::RECEIVE_BATCH;
use ibcm_mad::MAD_SIZE;

use crate::clock::Clock;
use crate::node::Node;
use crate::steering::SharedPort;
use crate::wake::Wake;

/// The CA GUID of node `i`.
pub fn node_guid(i: usize) -> u64 {
    0x0002_c903_00ab_0000 | i as u64
}

/// The address (LID `i + 1`, a link-local GID) of node `i`.
pub fn node_address(i: usize) -> MadAddress {
    let lid = (i + 1) as u16;
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[14..].copy_from_slice(&lid.to_be_bytes());
    MadAddress {
        port: 1,
        lid,
        gid,
        grh: false,
        sl: 0,
        pkey: 0xffff,
    }
}

/// Seeded fault injection, each a probability in [0, 1] applied per MAD.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// Lose the MAD.
    pub loss: f64,
    /// Deliver it twice.
    pub duplicate: f64,
    /// Hold it back behind later MADs (by up to 4 latencies).
    pub reorder: f64,
    /// Extra delay added to every MAD, ns.
    pub delay_ns: u64,
    /// Flip one random byte.
    pub corrupt: f64,
}

/// Fault counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultCounts {
    /// MADs lost.
    pub lost: u64,
    /// MADs duplicated.
    pub duplicated: u64,
    /// MADs held back.
    pub reordered: u64,
    /// MADs corrupted.
    pub corrupted: u64,
}

/// A captured MAD: when it crossed the fabric, from and to whom.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Virtual or real time, ns.
    pub at_ns: u64,
    /// Sender.
    pub from: MadAddress,
    /// Receiver.
    pub to: MadAddress,
    /// The MAD as delivered.
    pub mad: [u8; MAD_SIZE],
}

struct InFlight {
    to: usize,
    from: MadAddress,
    mad: [u8; MAD_SIZE],
}

/// MADs on the wire, delivered in (due time, send order): a heap of small keys over
/// parked MADs, so that a step costs O(log n) per MAD, not a pass over all in flight.
#[derive(Default)]
struct Link {
    /// (due time, sequence, index into `parked`).
    due: BinaryHeap<Reverse<(u64, u64, usize)>>,
    parked: Vec<Option<InFlight>>,
    free: Vec<usize>,
}

impl Link {
    fn push(&mut self, at: u64, seq: u64, m: InFlight) {
        let slot = match self.free.pop() {
            Some(i) => {
                if let Some(p) = self.parked.get_mut(i) {
                    *p = Some(m);
                }
                i
            }
            None => {
                self.parked.push(Some(m));
                self.parked.len() - 1
            }
        };
        self.due.push(Reverse((at, seq, slot)));
    }

    fn next_at(&self) -> Option<u64> {
        self.due.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The slot of the next MAD due at or before `now`, left in place: read it
    /// ([`parked`](Self::parked)), take it off the heap ([`pop`](Self::pop)), then
    /// [`release`](Self::release) it.
    fn next_due(&self, now: u64) -> Option<usize> {
        let &Reverse((at, _, slot)) = self.due.peek()?;
        (at <= now).then_some(slot)
    }

    fn pop(&mut self) {
        self.due.pop();
    }

    fn parked(&self, slot: usize) -> Option<&InFlight> {
        self.parked.get(slot)?.as_ref()
    }

    fn release(&mut self, slot: usize) {
        if let Some(p) = self.parked.get_mut(slot) {
            *p = None;
            self.free.push(slot);
        }
    }
}

/// SplitMix64: a small seeded generator for fault decisions.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// N nodes and the links between them.
pub struct Fabric {
    /// The clock every node's platform reads.
    pub clock: Arc<Clock>,
    /// The nodes.
    pub nodes: Vec<Arc<Node>>,
    /// One-way latency.
    pub latency_ns: u64,
    /// Fault injection.
    pub faults: Faults,
    /// Faults injected so far.
    pub fault_counts: FaultCounts,
    /// MADs delivered.
    pub delivered: u64,
    /// When set, every delivered MAD is captured here (for pcap).
    pub capture: Option<Vec<Captured>>,
    /// How late a node's PASSIVE_LEVEL work item runs: 0 (the default) right after the
    /// receive run or timer pass that asked for it, as on an idle CPU; otherwise at most
    /// once per this many ns of virtual time, as on a busy system, where DISPATCH_LEVEL
    /// work must live with the room it has meanwhile.
    pub passive_work_every_ns: u64,
    /// When each node's work item last ran (virtual ns).
    passive_work_at: Vec<u64>,
    wake: Arc<Wake>,
    /// Ports two CMs share (node index of ibcm's, the port): MADs to them are steered.
    shared: Vec<(usize, Arc<SharedPort>)>,
    /// Nodes whose port is down ([`Fabric::set_port_up`]): nothing leaves or reaches them.
    down: Vec<bool>,
    link: Link,
    seq: u64,
    rng: Rng,
    /// Reboots so far ([`Fabric::reboot`]): each seeds the fresh driver's RNG anew.
    reboots: u64,
}

impl Fabric {
    /// `n` nodes in virtual time with default engine settings; node `i`'s RNG is seeded
    /// from `seed` and `i`, and so are the faults.
    pub fn new(n: usize, seed: u64) -> Self {
        Self::with_clock(n, seed, Clock::virtual_at(1_000_000))
    }

    /// `n` nodes on `clock`.
    pub fn with_clock(n: usize, seed: u64, clock: Clock) -> Self {
        Self::with_config(n, seed, clock, |_| {})
    }

    /// `n` nodes on `clock`, each engine's settings the defaults as `tune` changes them
    /// (what the Windows driver reads from the registry, e.g. `MaxHeldRequestsPerListen`).
    pub fn with_config(n: usize, seed: u64, clock: Clock, tune: impl Fn(&mut CmConfig)) -> Self {
        let clock = Arc::new(clock);
        let wake = Arc::new(Wake::default());
        let nodes = (0..n)
            .map(|i| {
                let mut rng_seed = [0u8; 32];
                rng_seed[..8].copy_from_slice(&seed.to_le_bytes());
                rng_seed[8..16].copy_from_slice(&(i as u64).to_le_bytes());
                let mut config = CmConfig::new(node_guid(i), rng_seed);
                tune(&mut config);
                Arc::new(Node::new(
                    config,
                    node_address(i),
                    Arc::clone(&clock),
                    Arc::clone(&wake),
                ))
            })
            .collect();
        Self {
            clock,
            nodes,
            latency_ns: 2_000,
            faults: Faults::default(),
            fault_counts: FaultCounts::default(),
            delivered: 0,
            capture: None,
            passive_work_every_ns: 0,
            passive_work_at: vec![0; n],
            wake,
            shared: Vec::new(),
            down: vec![false; n],
            link: Link::default(),
            seq: 0,
            rng: Rng(seed ^ 0x5EED_F00D),
            reboots: 0,
        }
    }

    /// Makes node `i`'s port one that two CMs share, as on a WinOF host (issue #19):
    /// node `i` becomes ibcm's engine (its configuration, comm IDs beside AL's) and a new
    /// last node at the same address the stand-in for AL's CM; every MAD to the address
    /// is steered between them ([`SharedPort`]). Call it before node `i` is used.
    pub fn share_port(&mut self, i: usize) -> Option<Arc<SharedPort>> {
        let old = self.nodes.get_mut(i)?;
        let config = old.device.with_engine(|cm| *cm.config());
        let shared = Arc::new(SharedPort::new(
            config,
            old.address,
            Arc::clone(&self.clock),
            Arc::clone(&self.wake),
        ));
        *old = Arc::clone(shared.ibcm());
        self.nodes.push(Arc::clone(shared.al()));
        self.shared.push((i, Arc::clone(&shared)));
        Some(shared)
    }

    /// Node `i`'s host reboots: its driver and all it held are gone at once (what it had
    /// queued never leaves, no DREQ goes out for its connections, its timers never
    /// fire), and a fresh driver starts on the same port: the same CA GUID, address and
    /// settings, its RNG seeded anew (other comm IDs, PSNs and TIDs, as a host that
    /// booted again draws them). MADs already on the wire to the port reach the fresh
    /// driver. The old node stays with whoever holds it (the providers of the host that
    /// went down), cut off from the fabric. Returns the fresh node; None if `i` is out of
    /// range or a port two CMs share ([`Self::share_port`]).
    pub fn reboot(&mut self, i: usize) -> Option<Arc<Node>> {
        if self.shared.iter().any(|(at, _)| *at == i) {
            return None;
        }
        let old = self.nodes.get(i)?;
        let mut config = old.device.with_engine(|cm| *cm.config());
        self.reboots += 1;
        if let Some(b) = config.rng_seed.get_mut(24..) {
            b.copy_from_slice(&self.reboots.to_le_bytes());
        }
        let fresh = Arc::new(Node::new(
            config,
            old.address,
            Arc::clone(&self.clock),
            Arc::clone(&self.wake),
        ));
        if self.down.get(i).is_some_and(|d| *d) {
            fresh.device.port_down(fresh.address.port);
        }
        if let Some(slot) = self.nodes.get_mut(i) {
            *slot = Arc::clone(&fresh);
        }
        if let Some(at) = self.passive_work_at.get_mut(i) {
            *at = 0;
        }
        Some(fresh)
    }

    /// Node `i`'s port goes down (`up` false: its cable pulled) or comes back. While down
    /// nothing it sends leaves and nothing reaches it, MADs already on the wire to it
    /// included; its driver is told as IBAL would tell it (`Device::port_down` on
    /// `IB_PNP_PORT_DOWN`, `Device::port_up` on `IB_PNP_PORT_ACTIVE`). What its driver
    /// queued before it was told is dropped too.
    pub fn set_port_up(&mut self, i: usize, up: bool) {
        let (Some(node), Some(down)) = (self.nodes.get(i), self.down.get_mut(i)) else {
            return;
        };
        *down = !up;
        let node = Arc::clone(node);
        if up {
            node.device.port_up(node.address.port);
        } else {
            let queued = node.platform.take_sent();
            node.platform.recycle_sent(queued);
            node.device.port_down(node.address.port);
        }
    }

    /// Whether node `i`'s port is up.
    pub fn is_port_up(&self, i: usize) -> bool {
        self.down.get(i).is_some_and(|d| !d)
    }

    /// Now.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    fn collect(&mut self) {
        let now = self.clock.now().as_nanos();
        for i in 0..self.nodes.len() {
            let Some(node) = self.nodes.get(i) else {
                continue;
            };
            let node = Arc::clone(node);
            let sent = node.platform.take_sent();
            let from_down = self.down.get(i).is_some_and(|d| *d);
            for t in &sent {
                let Some(to) = self.nodes.iter().position(|n| n.address.lid == t.dest.lid) else {
                    continue;
                };
                if from_down || self.down.get(to).is_some_and(|d| *d) {
                    continue;
                }
                let from = node.address;
                let f = self.faults;
                if self.rng.chance(f.loss) {
                    self.fault_counts.lost += 1;
                    continue;
                }
                let copies = if self.rng.chance(f.duplicate) {
                    self.fault_counts.duplicated += 1;
                    2
                } else {
                    1
                };
                let mut mad = t.mad;
                if self.rng.chance(f.corrupt) {
                    self.fault_counts.corrupted += 1;
                    let at = (self.rng.next() % MAD_SIZE as u64) as usize;
                    if let Some(b) = mad.get_mut(at) {
                        *b ^= 1 << (self.rng.next() % 8);
                    }
                }
                for _ in 0..copies {
                    let mut at = now + self.latency_ns + f.delay_ns;
                    if self.rng.chance(f.reorder) {
                        self.fault_counts.reordered += 1;
                        at += self.latency_ns * (1 + self.rng.next() % 4);
                    }
                    self.seq += 1;
                    self.link.push(at, self.seq, InFlight { to, from, mad });
                }
            }
            node.platform.recycle_sent(sent);
        }
    }

    fn next_event(&self) -> Option<u64> {
        let link = self.link.next_at();
        let timers = self
            .nodes
            .iter()
            .filter_map(|n| n.platform.timer().map(Instant::as_nanos))
            .min();
        [link, timers].into_iter().flatten().min()
    }

    /// Delivers what is due and fires due timers; in virtual time, first advances the
    /// clock to the next event. Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.collect();
        let Some(at) = self.next_event() else {
            return false;
        };
        self.clock.advance_to(Instant::from_nanos(at));
        self.deliver_due();
        true
    }

    /// [`step`](Self::step), but never past `end` (ns): when the next event is later,
    /// virtual time advances to `end` and nothing is delivered (a waiter that keeps time
    /// of its own, such as an application modelled to act at a set rate, wakes on time).
    /// Returns false when nothing is left to happen.
    pub fn step_until(&mut self, end: u64) -> bool {
        self.collect();
        let Some(at) = self.next_event() else {
            return false;
        };
        if at > end {
            self.clock.advance_to(Instant::from_nanos(end));
            return true;
        }
        self.step()
    }

    fn deliver_due(&mut self) {
        let now = self.clock.now().as_nanos();
        // What is due now, in order, each receiver taking the MADs due for it in runs (as
        // a QP1 completion pass hands up what the CQ holds), read where they were parked:
        // a MAD is copied onto the wire once. What the receivers send waits in their
        // outboxes, and reaches the link in a later step (`collect`).
        let mut run = [0usize; RECEIVE_BATCH];
        loop {
            let mut n = 0;
            let mut to = None;
            while let Some(slot) = self.link.next_due(now) {
                let Some(dest) = self.link.parked(slot).map(|m| m.to) else {
                    self.link.pop();
                    self.link.release(slot);
                    continue;
                };
                if self.down.get(dest).is_some_and(|d| *d) {
                    // Its port went down while the MAD was on the wire.
                    self.link.pop();
                    self.link.release(slot);
                    continue;
                }
                if n == RECEIVE_BATCH || to.is_some_and(|t| t != dest) {
                    break;
                }
                self.link.pop();
                to = Some(dest);
                if let Some(r) = run.get_mut(n) {
                    *r = slot;
                }
                n += 1;
            }
            let (Some(to), Some(slots)) = (to, run.get(..n)) else {
                break;
            };
            if let Some(node) = self.nodes.get(to) {
                let mads = slots.iter().filter_map(|&s| self.link.parked(s));
                if let Some(cap) = self.capture.as_mut() {
                    cap.extend(mads.clone().map(|m| Captured {
                        at_ns: now,
                        from: m.from,
                        to: node.address,
                        mad: m.mad,
                    }));
                }
                match self.shared.iter().find(|(at, _)| *at == to) {
                    Some((_, port)) => mads.for_each(|m| port.receive(&m.from, &m.mad)),
                    None => node.receive_batch(mads.map(|m| (&m.from, &m.mad[..]))),
                }
                self.delivered += n as u64;
            }
            for &slot in slots {
                self.link.release(slot);
            }
            // The work item a receive DPC queued runs at once, as it would on another
            // CPU, not after the whole burst.
            self.passive_work(to, now);
        }
        for i in 0..self.nodes.len() {
            if let Some(node) = self.nodes.get(i)
                && node.platform.timer().is_some_and(|t| t.as_nanos() <= now)
            {
                node.fire_timer();
            }
            self.passive_work(i, now);
        }
        self.collect();
    }

    /// Runs node `i`'s work item if it was asked for and is due ([`Self::passive_work_every_ns`]).
    fn passive_work(&mut self, i: usize, now: u64) {
        let (Some(node), Some(at)) = (self.nodes.get(i), self.passive_work_at.get_mut(i)) else {
            return;
        };
        if self.passive_work_every_ns == 0 || now >= at.saturating_add(self.passive_work_every_ns) {
            *at = now;
            node.run_passive_work();
        }
    }

    /// Steps until nothing is due within `ns` of virtual time.
    pub fn run_for(&mut self, ns: u64) {
        let end = self.clock.now().as_nanos() + ns;
        self.collect();
        while self.next_event().is_some_and(|t| t <= end) {
            if !self.step() {
                break;
            }
        }
    }

    /// Steps until `done()` holds or nothing is left (bounded).
    pub fn run_until(&mut self, mut done: impl FnMut(&Self) -> bool) -> bool {
        for _ in 0..10_000_000 {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        false
    }
}

/// A fabric running in real time on its own thread.
pub struct Realtime {
    fabric: Arc<Mutex<Fabric>>,
    nodes: Vec<Arc<Node>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Realtime {
    /// Starts the fabric's thread. The fabric must use a real clock.
    pub fn start(fabric: Fabric) -> Self {
        let nodes = fabric.nodes.clone();
        let wake = Arc::clone(&fabric.wake);
        let fabric = Arc::new(Mutex::new(fabric));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (Arc::clone(&fabric), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("ibcm-fabric".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    let wait = {
                        let mut fab = f.lock().unwrap_or_else(PoisonError::into_inner);
                        fab.collect();
                        fab.deliver_due();
                        let now = fab.clock.now().as_nanos();
                        fab.next_event()
                            .map_or(Duration::from_millis(5), |t| {
                                Duration::from_nanos(t.saturating_sub(now))
                            })
                            .min(Duration::from_millis(5))
                    };
                    // A MAD due within a few microseconds (the link's latency) is not
                    // worth a sleep the OS would stretch to its timer slack (~50 us or,
                    // on a busy machine, a scheduling quantum): yield and deliver it.
                    if wait <= Duration::from_micros(100) {
                        std::thread::yield_now();
                    } else {
                        wake.wait(wait);
                    }
                }
            })
            .ok();
        Self {
            fabric,
            nodes,
            stop,
            thread,
        }
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> Option<Arc<Node>> {
        self.nodes.get(i).cloned()
    }

    /// Runs `f` on the fabric (counters, capture).
    pub fn with_fabric<T>(&self, f: impl FnOnce(&mut Fabric) -> T) -> T {
        f(&mut self.fabric.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Stops the thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            if let Some(n) = self.nodes.first() {
                n.platform.wake();
            }
            let _ = t.join();
        }
    }
}

impl Drop for Realtime {
    fn drop(&mut self) {
        self.halt();
    }
}
