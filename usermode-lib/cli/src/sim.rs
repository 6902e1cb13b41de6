//! The simulated fabric as the command line and the tests use it: two (or more) nodes of
//! the in-process driver, run either in real time (a runner thread delivers MADs and fires
//! timers while user threads issue IOCTLs) or in virtual time (the thread waiting for
//! completions steps the fabric itself: deterministic, and everything on one core).
//!
//! [`Pump`] is what the tools wait through: a simulated fabric, or (on Windows) the real
//! device, where waiting is just waiting.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ibcm_host::verifier::Violation;
use ibcm_host::{Clock, Fabric, FaultCounts, Faults, Node, Realtime};

use ibcm::Provider;
use ibcm::Result;
use ibcm::{CompletionPacket, CompletionPort};

/// What a wait for a completion packet ended with.
#[derive(Debug)]
pub enum Waited {
    /// A packet.
    Packet(CompletionPacket),
    /// The time asked for passed.
    Timeout,
    /// Nothing is left to happen (virtual time: no MAD in flight, no timer armed), so
    /// nothing will ever be queued without new work.
    Idle,
}

/// A clock that tasks may keep: ns since some start.
pub type ClockFn = Arc<dyn Fn() -> u64 + Send + Sync>;

/// How waiting for completions makes progress.
pub trait Pump: Sync {
    /// Now, ns (the fabric's clock: real or virtual).
    fn now_ns(&self) -> u64;
    /// The same clock, for tasks to keep.
    fn clock(&self) -> ClockFn;
    /// The next packet queued on `port`, waiting up to `wait` (of this pump's time). In
    /// virtual time the fabric is stepped meanwhile.
    fn next_packet(&self, port: &CompletionPort, wait: Duration) -> Waited;
    /// Whether time is virtual (then only one thread may wait at a time).
    fn is_virtual(&self) -> bool {
        false
    }
    /// What the driver of each node behind this pump holds now, if it can tell (the
    /// simulated nodes).
    fn driver_memory(&self) -> Option<Vec<DriverMemory>> {
        None
    }
    /// Takes every node's port down (`up` false: the link flaps) or brings it back, if
    /// this pump can (the simulated fabric); false if it cannot.
    fn set_ports_up(&self, up: bool) -> bool {
        let _ = up;
        false
    }
}

/// The heap a simulated node's driver holds, by part: the capacities of the engine's and
/// the dispatch layer's tables, pools and queues (what a kernel pays in nonpaged pool,
/// touched or not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverMemory {
    /// The engines: CEP slabs, peer lookups, timer heaps, queues.
    pub engine: u64,
    /// Cached private data: the engines' (for repeats) and the endpoints' (for QUERY),
    /// outside the budget.
    pub private_data: u64,
    /// The event-record pools.
    pub records: u64,
    /// File and endpoint tables, FIFOs, owners.
    pub endpoints: u64,
    /// Kernel-client endpoints.
    pub clients: u64,
    /// Send and completion batches.
    pub batches: u64,
}

impl DriverMemory {
    /// The sum over nodes.
    pub fn sum(nodes: &[DriverMemory]) -> Self {
        nodes.iter().fold(Self::default(), |a, m| Self {
            engine: a.engine + m.engine,
            private_data: a.private_data + m.private_data,
            records: a.records + m.records,
            endpoints: a.endpoints + m.endpoints,
            clients: a.clients + m.clients,
            batches: a.batches + m.batches,
        })
    }

    /// Everything but the cached private data.
    pub fn total(&self) -> u64 {
        self.engine + self.records + self.endpoints + self.clients + self.batches
    }
}

fn from_port(p: Option<CompletionPacket>) -> Waited {
    p.map_or(Waited::Timeout, Waited::Packet)
}

/// Waiting on a real device: the port alone, and the monotonic clock.
#[derive(Debug)]
pub struct RealTimePump {
    start: std::time::Instant,
}

impl Default for RealTimePump {
    fn default() -> Self {
        Self {
            start: std::time::Instant::now(),
        }
    }
}

impl Pump for RealTimePump {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn clock(&self) -> ClockFn {
        let start = self.start;
        Arc::new(move || start.elapsed().as_nanos() as u64)
    }

    fn next_packet(&self, port: &CompletionPort, wait: Duration) -> Waited {
        from_port(port.get(Some(wait)))
    }
}

/// Settings of a simulated fabric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimOptions {
    /// Nodes (node `i` has LID `i + 1`).
    pub nodes: usize,
    /// Seeds the nodes' RNGs and the fault decisions.
    pub seed: u64,
    /// Fault injection.
    pub faults: Faults,
    /// Capture every delivered MAD (for [`Sim::write_pcap`]).
    pub capture: bool,
    /// Real time (a runner thread) or virtual time (stepped by the waiting thread).
    pub real_time: bool,
    /// Most REQs a listen holds past its backlog before it refuses one with
    /// REJ(NoResources): the Windows driver's registry value `MaxHeldRequestsPerListen`
    /// (`CmConfig::held_requests_per_listen`; None: its default).
    pub max_held_requests: Option<u32>,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            nodes: 2,
            seed: 1,
            faults: Faults::default(),
            capture: false,
            real_time: true,
            max_held_requests: None,
        }
    }
}

enum Mode {
    Real(Realtime),
    Virtual(Box<Mutex<Fabric>>),
}

/// A running simulated fabric.
pub struct Sim {
    mode: Mode,
    clock: Arc<Clock>,
    /// The fabric's nodes, as [`Sim::reboot`] leaves them.
    nodes: Mutex<Vec<Arc<Node>>>,
}

impl Sim {
    /// Builds the fabric and, in real time, starts its thread.
    pub fn start(options: &SimOptions) -> Self {
        let clock = if options.real_time {
            Clock::real()
        } else {
            Clock::virtual_at(1_000_000)
        };
        let held = options.max_held_requests;
        let mut fabric = Fabric::with_config(options.nodes.max(1), options.seed, clock, |c| {
            if let Some(h) = held {
                c.held_requests_per_listen = h;
            }
        });
        fabric.faults = options.faults;
        if options.capture {
            fabric.capture = Some(Vec::new());
        }
        let clock = Arc::clone(&fabric.clock);
        let nodes = fabric.nodes.clone();
        let mode = if options.real_time {
            Mode::Real(Realtime::start(fabric))
        } else {
            Mode::Virtual(Box::new(Mutex::new(fabric)))
        };
        Self {
            mode,
            clock,
            nodes: Mutex::new(nodes),
        }
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> Option<Arc<Node>> {
        self.nodes().get(i).cloned()
    }

    /// The nodes.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Node `i`'s host reboots ([`Fabric::reboot`]): its driver's state is gone without
    /// a word to its peers, a fresh driver takes its port (same CA GUID and address).
    /// Providers opened on it before keep the old, cut-off node; open new ones with
    /// [`Sim::provider`]. False if there is no such node.
    pub fn reboot(&self, i: usize) -> bool {
        let Some(fresh) = self.with_fabric(|f| f.reboot(i)) else {
            return false;
        };
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        match nodes.get_mut(i) {
            Some(slot) => {
                *slot = fresh;
                true
            }
            None => false,
        }
    }

    /// Opens a provider on node `i` (the last node if `i` is out of range).
    pub fn provider(&self, i: usize) -> Result<Provider> {
        let nodes = self.nodes();
        let node = nodes
            .get(i)
            .or(nodes.last())
            .cloned()
            .ok_or_else(|| ibcm::Error::new("open", ibcm_ioctl::status::INVALID_PARAMETER))?;
        Provider::in_process(node)
    }

    /// Whether the fabric runs in real time.
    pub fn is_real_time(&self) -> bool {
        matches!(self.mode, Mode::Real(_))
    }

    /// Runs `f` on the fabric (counters, capture). Not from inside a completion.
    pub fn with_fabric<T>(&self, f: impl FnOnce(&mut Fabric) -> T) -> T {
        match &self.mode {
            Mode::Real(rt) => rt.with_fabric(f),
            Mode::Virtual(m) => f(&mut m.lock().unwrap_or_else(PoisonError::into_inner)),
        }
    }

    /// Lets `d` pass: sleeps, or runs the virtual fabric for `d`.
    pub fn pass(&self, d: Duration) {
        match &self.mode {
            Mode::Real(_) => std::thread::sleep(d),
            Mode::Virtual(m) => m
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .run_for(d.as_nanos() as u64),
        }
    }

    /// Faults injected so far.
    pub fn fault_counts(&self) -> FaultCounts {
        self.with_fabric(|f| f.fault_counts)
    }

    /// MADs delivered so far.
    pub fn delivered(&self) -> u64 {
        self.with_fabric(|f| f.delivered)
    }

    /// MADs captured so far.
    pub fn captured(&self) -> usize {
        self.with_fabric(|f| f.capture.as_ref().map_or(0, Vec::len))
    }

    /// Writes what was captured as RoCEv2 frames to a pcap file; returns the frames
    /// written.
    pub fn write_pcap(&self, path: &Path) -> std::io::Result<usize> {
        let captured = self.with_fabric(|f| f.capture.clone().unwrap_or_default());
        let file = std::io::BufWriter::new(std::fs::File::create(path)?);
        ibcm_host::pcap::write_pcap(file, &captured)?;
        Ok(captured.len())
    }

    /// CEPs alive in node `i`'s engine (including those in timewait).
    pub fn live_ceps(&self, i: usize) -> usize {
        self.node(i)
            .map_or(0, |n| n.device.with_engine(|cm| cm.live_ceps()))
    }

    /// Every rule the host verifier saw broken, by node.
    pub fn violations(&self) -> Vec<(usize, Violation)> {
        self.nodes()
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.violations().into_iter().map(move |v| (i, v)))
            .collect()
    }
}

impl Sim {
    /// Starts timing every node's DISPATCH_LEVEL entry points (receive batches, timer
    /// passes).
    pub fn time_dpcs(&self) {
        for n in &self.nodes() {
            n.time_dpcs(true);
        }
    }

    /// Every node's DISPATCH_LEVEL times so far.
    pub fn dpc_times(&self) -> Vec<ibcm_host::DpcTimes> {
        self.nodes().iter().map(|n| n.dpc_times()).collect()
    }

    /// What the driver of each node holds now.
    pub fn driver_memory(&self) -> Vec<DriverMemory> {
        self.nodes()
            .iter()
            .map(|n| {
                let d = n.device.memory();
                let e = n.device.with_engine(|cm| cm.memory());
                DriverMemory {
                    engine: e.tables() as u64,
                    private_data: (e.private_data + d.private_data) as u64,
                    records: d.records as u64,
                    endpoints: d.endpoints as u64,
                    clients: d.clients as u64,
                    batches: d.batches as u64,
                }
            })
            .collect()
    }
}

impl Pump for Sim {
    fn driver_memory(&self) -> Option<Vec<DriverMemory>> {
        Some(Sim::driver_memory(self))
    }

    fn set_ports_up(&self, up: bool) -> bool {
        self.with_fabric(|f| {
            for i in 0..f.nodes.len() {
                f.set_port_up(i, up);
            }
        });
        true
    }

    fn now_ns(&self) -> u64 {
        self.clock.now().as_nanos()
    }

    fn clock(&self) -> ClockFn {
        let clock = Arc::clone(&self.clock);
        Arc::new(move || clock.now().as_nanos())
    }

    fn next_packet(&self, port: &CompletionPort, wait: Duration) -> Waited {
        match &self.mode {
            Mode::Real(_) => from_port(port.get(Some(wait))),
            Mode::Virtual(m) => {
                let end = self.now_ns().saturating_add(wait.as_nanos() as u64);
                loop {
                    if let Some(p) = port.get(Some(Duration::ZERO)) {
                        return Waited::Packet(p);
                    }
                    let mut fabric = m.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(p) = port.get(Some(Duration::ZERO)) {
                        return Waited::Packet(p);
                    }
                    if self.now_ns() >= end {
                        return Waited::Timeout;
                    }
                    if !fabric.step_until(end) {
                        drop(fabric);
                        return port
                            .get(Some(Duration::ZERO))
                            .map_or(Waited::Idle, Waited::Packet);
                    }
                }
            }
        }
    }

    fn is_virtual(&self) -> bool {
        !self.is_real_time()
    }
}
