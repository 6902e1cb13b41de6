//! Dispatch costs of the IOCTL path, on the host platform.
//!
//! 1. Overhead per IOCTL (criterion, ns/op): QUERY and COUNTERS round trips through
//!    `Node::ioctl_now` (validation, lock, engine, completion, and the host verifier's
//!    ledger), and the same through a bare `Device` on a minimal platform, which is the part
//!    the kernel pays too.
//! 2. System calls per event: 10^4 connections through the IOCTL records on a two-node
//!    fabric (connect, accept, RTU, disconnect, DREP, timewait on both sides), 64 in flight,
//!    by three clients: one that keeps one GET_EVENT (one record) pending per endpoint and
//!    re-issues it as soon as it has handled a completion; a batched one that handles
//!    completions and issues its GET_EVENTs (64 records) once per poll (every 20 us of
//!    fabric time), so that what queued meanwhile comes back in one completion; and the
//!    same letting two polls pass before it asks an endpoint again (a slow consumer).
//!    Prints GET_EVENT IOCTLs per event record received (at most 1; less when batched)
//!    and connections per second of wall time (host time: the verifier's ledger keeps a
//!    copy of every output buffer, which dominates with 64-record buffers).
//!
//! `cargo bench -p ibcm-host --bench dispatch`; under `cargo test --benches` (criterion's
//! `--test`), part 2 runs 500 connections.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant as WallInstant};

use criterion::Criterion;
use ibcm_cep::{CmConfig, Instant, Transmit};
use ibcm_endpoint::{Device, FileId, Lock, Platform, Request};
use ibcm_host::records::{connect_in, format_rep_in};
use ibcm_host::verifier::{Completion, Violation};
use ibcm_host::{Fabric, Node, node_guid};
use ibcm_ioctl::{
    ABI_VERSION, CountersIn, CountersOut, CreateIn, CreateOut, EventRecord, HandleIn, ListenIn,
    MAX_EVENTS_PER_REQUEST, PrivateDataIn, QpTransitionsOut, QueryOut, VersionIn, code, event_type,
    status,
};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

// ---- IOCTL records -------------------------------------------------------------------

fn version_in() -> VersionIn {
    VersionIn {
        size: VersionIn::SIZE,
        abi_version: ABI_VERSION,
    }
}

fn create_in() -> CreateIn {
    CreateIn {
        size: CreateIn::SIZE,
        reserved: 0,
    }
}

fn handle_in(h: u64) -> HandleIn {
    HandleIn {
        size: HandleIn::SIZE,
        reserved: 0,
        handle: h,
    }
}

fn counters_in() -> CountersIn {
    CountersIn {
        size: CountersIn::SIZE,
        reserved: 0,
    }
}

fn private_data_in(h: u64) -> PrivateDataIn {
    let mut p = PrivateDataIn::new_zeroed();
    p.size = PrivateDataIn::SIZE;
    p.handle = h;
    p
}

fn ok(node: &Node, file: FileId, code: u32, input: &[u8], output_len: usize) -> Completion {
    let done = node.ioctl_now(file, code, input, output_len);
    assert_eq!(done.status, status::SUCCESS, "IOCTL {code:#x}");
    done
}

fn open_versioned(node: &Node) -> FileId {
    let file = node.open();
    ok(node, file, code::VERSION, version_in().as_bytes(), 16);
    file
}

fn create(node: &Node, file: FileId) -> u64 {
    let done = ok(
        node,
        file,
        code::CREATE,
        create_in().as_bytes(),
        CreateOut::SIZE as usize,
    );
    CreateOut::read_from_bytes(&done.output).map_or(0, |c| c.handle)
}

// ---- 1. overhead per IOCTL -------------------------------------------------------------

/// Requests per fresh node: the host ledger keeps every request, so a long criterion run
/// starts over with a new node (outside the timed part) to bound its memory.
const CHUNK: u64 = 20_000;

/// A node whose endpoint is in REQ_SENT (CONNECT issued, fabric not run).
fn query_node() -> (Fabric, FileId, u64) {
    let fabric = Fabric::new(2, 7);
    let node = &fabric.nodes[0];
    let file = open_versioned(node);
    let ep = create(node, file);
    ok(
        node,
        file,
        code::CONNECT,
        connect_in(ep, 0x1234, 0x101).as_bytes(),
        0,
    );
    (fabric, file, ep)
}

fn chunked(iters: u64, mut op: impl FnMut(&Node, FileId, u64)) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK);
        left -= n;
        let (fabric, file, ep) = query_node();
        let node = &fabric.nodes[0];
        let start = WallInstant::now();
        for _ in 0..n {
            op(node, file, ep);
        }
        total += start.elapsed();
    }
    total
}

/// A platform that does as little as possible: a mutex, requests with a fixed inline
/// buffer, completions counted.
#[derive(Default)]
struct Bare {
    completed: AtomicU64,
    failed: AtomicU64,
}

struct BareLock<T>(Mutex<T>);

impl<T> Lock<T> for BareLock<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

const BARE_OUTPUT: usize = 512;

struct BareRequest {
    len: usize,
    output: [u8; BARE_OUTPUT],
}

impl BareRequest {
    fn new(len: usize) -> Self {
        assert!(len <= BARE_OUTPUT);
        Self {
            len,
            output: [0; BARE_OUTPUT],
        }
    }
}

impl Request for BareRequest {
    fn output_len(&self) -> usize {
        self.len
    }

    fn write_output(&mut self, offset: usize, bytes: &[u8]) {
        if let Some(dst) = self.output[..self.len].get_mut(offset..offset + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    }

    fn key(&self) -> u64 {
        0
    }
}

impl Platform for Bare {
    type Request = BareRequest;
    type Lock<T> = BareLock<T>;

    fn new_lock<T>(value: T) -> BareLock<T> {
        BareLock(Mutex::new(value))
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(1_000_000)
    }

    fn send(&self, transmit: &Transmit) {
        black_box(transmit);
    }

    fn complete(&self, request: BareRequest, status: i32, information: usize) {
        black_box(&request.output[..information]);
        self.completed.fetch_add(1, Ordering::Relaxed);
        if status != ibcm_ioctl::status::SUCCESS {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn set_timer(&self, deadline: Option<Instant>) {
        black_box(deadline);
    }
}

fn bare_device() -> (Device<Bare>, FileId, u64) {
    let device = Device::new(Bare::default(), CmConfig::new(node_guid(0), [7; 32]));
    let file = device
        .open(ibcm_endpoint::Caller::Administrator)
        .expect("memory for a handle");
    device.dispatch(
        file,
        BareRequest::new(16),
        code::VERSION,
        version_in().as_bytes(),
    );
    device.dispatch(
        file,
        BareRequest::new(CreateOut::SIZE as usize),
        code::CREATE,
        create_in().as_bytes(),
    );
    // The bare platform keeps no outputs: the first endpoint of a file is index 0,
    // generation 1 (CONNECT and every QUERY below fail if that changes).
    let ep = 1u64 << 32;
    device.dispatch(
        file,
        BareRequest::new(0),
        code::CONNECT,
        connect_in(ep, 0x1234, 0x101).as_bytes(),
    );
    let p = device.platform();
    assert_eq!(p.completed.load(Ordering::Relaxed), 3);
    assert_eq!(p.failed.load(Ordering::Relaxed), 0);
    (device, file, ep)
}

fn bench_ioctls(c: &mut Criterion) {
    let mut g = c.benchmark_group("ioctl");
    g.bench_function("query/node", |b| {
        b.iter_custom(|iters| {
            chunked(iters, |node, file, ep| {
                let done = node.ioctl_now(
                    file,
                    code::QUERY,
                    handle_in(ep).as_bytes(),
                    QueryOut::SIZE as usize,
                );
                debug_assert_eq!(done.status, status::SUCCESS);
                black_box(done);
            })
        });
    });
    g.bench_function("counters/node", |b| {
        b.iter_custom(|iters| {
            chunked(iters, |node, file, _| {
                let done = node.ioctl_now(
                    file,
                    code::COUNTERS,
                    counters_in().as_bytes(),
                    CountersOut::SIZE as usize,
                );
                debug_assert_eq!(done.status, status::SUCCESS);
                black_box(done);
            })
        });
    });
    let (device, file, ep) = bare_device();
    g.bench_function("query/device", |b| {
        b.iter(|| {
            device.dispatch(
                file,
                BareRequest::new(QueryOut::SIZE as usize),
                code::QUERY,
                handle_in(black_box(ep)).as_bytes(),
            );
        });
    });
    g.bench_function("counters/device", |b| {
        b.iter(|| {
            device.dispatch(
                file,
                BareRequest::new(CountersOut::SIZE as usize),
                code::COUNTERS,
                counters_in().as_bytes(),
            );
        });
    });
    g.finish();
    assert_eq!(device.platform().failed.load(Ordering::Relaxed), 0);
}

// ---- 2. system calls per event -------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Listen,
    Client,
    Server,
}

#[derive(Debug)]
struct Ep {
    node: usize,
    handle: u64,
    role: Role,
    /// The key of this endpoint's outstanding GET_EVENT.
    waiting: Option<u64>,
    /// The batched client's first poll that may issue this endpoint's next GET_EVENT.
    next_poll: u64,
}

#[derive(Debug, Default)]
struct Stats {
    get_event_ioctls: u64,
    get_event_at_once: u64,
    records: u64,
    other_ioctls: u64,
    connections: u64,
    max_batch: u64,
    /// Allocations the verifier saw at DISPATCH_LEVEL (printed before the assertion that
    /// there are none, so that a regression shows its size).
    dispatch_allocations: u64,
}

/// A user-mode client on each of the two nodes, driven between fabric steps.
struct Run {
    fabric: Fabric,
    files: [FileId; 2],
    eps: Vec<Ep>,
    /// Records per GET_EVENT buffer.
    buffer: usize,
    batched: bool,
    /// Polls the batched client lets pass after a completion before it asks again.
    lag: u64,
    round: u64,
    target: u64,
    started: u64,
    requests_seen: u64,
    window: u64,
    stats: Stats,
    qpn: u32,
}

const SERVICE: u64 = 0x1234;
/// The batched client's poll interval: ten one-way latencies.
const POLL_NS: u64 = 20_000;

impl Run {
    fn new(target: u64, batched: bool, lag: u64) -> Self {
        let fabric = Fabric::new(2, 11);
        let files = [
            open_versioned(&fabric.nodes[0]),
            open_versioned(&fabric.nodes[1]),
        ];
        let window = 64;
        let listen = create(&fabric.nodes[1], files[1]);
        let mut l = ListenIn::new_zeroed();
        l.size = ListenIn::SIZE;
        l.handle = listen;
        l.service_id = SERVICE;
        l.service_mask = u64::MAX;
        l.backlog = 256;
        ok(&fabric.nodes[1], files[1], code::LISTEN, l.as_bytes(), 0);
        let mut run = Self {
            fabric,
            files,
            eps: Vec::new(),
            buffer: if batched {
                MAX_EVENTS_PER_REQUEST as usize
            } else {
                1
            },
            batched,
            lag,
            round: 0,
            target,
            started: 0,
            requests_seen: 0,
            window,
            stats: Stats::default(),
            qpn: 0x100,
        };
        run.add(1, listen, Role::Listen);
        run
    }

    fn node(&self, i: usize) -> &Node {
        &self.fabric.nodes[i]
    }

    fn ioctl_ok(&mut self, node: usize, code: u32, input: &[u8], output_len: usize) -> Completion {
        self.stats.other_ioctls += 1;
        ok(self.node(node), self.files[node], code, input, output_len)
    }

    fn add(&mut self, node: usize, handle: u64, role: Role) {
        self.eps.push(Ep {
            node,
            handle,
            role,
            waiting: None,
            next_poll: self.round + 1 + self.lag,
        });
        if !self.batched {
            let i = self.eps.len() - 1;
            self.get_event(i);
        }
    }

    fn wants_events(&self, ep: &Ep) -> bool {
        ep.role != Role::Listen || self.requests_seen < self.target
    }

    /// Issues a GET_EVENT on endpoint `i` and handles it if it completes at once.
    fn get_event(&mut self, i: usize) {
        let (node, handle) = (self.eps[i].node, self.eps[i].handle);
        if !self.wants_events(&self.eps[i]) {
            return;
        }
        let len = self.buffer * EventRecord::SIZE as usize;
        let key = self.node(node).ioctl(
            self.files[node],
            code::GET_EVENT,
            handle_in(handle).as_bytes(),
            len,
        );
        self.stats.get_event_ioctls += 1;
        match self.node(node).completion(key) {
            Some(done) => {
                self.stats.get_event_at_once += 1;
                self.completed(i, &done);
            }
            None => self.eps[i].waiting = Some(key),
        }
    }

    /// Handles a GET_EVENT completion of endpoint `i`; the one-pending client re-issues.
    fn completed(&mut self, i: usize, done: &Completion) {
        assert_eq!(done.status, status::SUCCESS, "GET_EVENT failed");
        let records: Vec<EventRecord> = done.output[..done.information]
            .chunks(EventRecord::SIZE as usize)
            .filter_map(|c| EventRecord::read_from_bytes(c).ok())
            .collect();
        assert!(!records.is_empty());
        self.stats.records += records.len() as u64;
        self.stats.max_batch = self.stats.max_batch.max(records.len() as u64);
        self.eps[i].next_poll = self.round + 1 + self.lag;
        let mut finished = false;
        for r in &records {
            finished |= self.handle(i, r);
        }
        if finished {
            let (node, handle) = (self.eps[i].node, self.eps[i].handle);
            self.ioctl_ok(node, code::DESTROY, handle_in(handle).as_bytes(), 0);
            self.eps.swap_remove(i);
        } else if !self.batched {
            self.get_event(i);
        }
    }

    /// One event record of endpoint `i`; true when the endpoint is done.
    fn handle(&mut self, i: usize, r: &EventRecord) -> bool {
        let (role, handle) = (self.eps[i].role, self.eps[i].handle);
        match (role, r.event_type) {
            (Role::Listen, event_type::REQ_RECEIVED) => {
                self.requests_seen += 1;
                self.qpn += 1;
                let child = r.new_handle;
                let rep = format_rep_in(child, self.qpn);
                self.ioctl_ok(
                    1,
                    code::FORMAT_REP,
                    rep.as_bytes(),
                    QpTransitionsOut::SIZE as usize,
                );
                // The one-pending client waits on the new endpoint before the REP leaves.
                self.add(1, child, Role::Server);
                self.ioctl_ok(1, code::SEND_REP, handle_in(child).as_bytes(), 0);
                false
            }
            (Role::Client, event_type::REP_RECEIVED) => {
                self.ioctl_ok(0, code::RTU, private_data_in(handle).as_bytes(), 0);
                self.ioctl_ok(0, code::DREQ, private_data_in(handle).as_bytes(), 0);
                false
            }
            (Role::Server, event_type::DREQ_RECEIVED) => {
                self.ioctl_ok(1, code::DREP, private_data_in(handle).as_bytes(), 0);
                false
            }
            (Role::Server, event_type::RTU_RECEIVED)
            | (Role::Client, event_type::DREP_RECEIVED) => false,
            (Role::Client, event_type::TIMEWAIT_EXIT) => {
                self.stats.connections += 1;
                true
            }
            (Role::Server, event_type::TIMEWAIT_EXIT) => true,
            (role, t) => panic!("{role:?}: unexpected event {t} (status {:#x})", r.status),
        }
    }

    fn start_connections(&mut self) {
        let live = self.eps.iter().filter(|e| e.role == Role::Client).count() as u64;
        for _ in live..self.window {
            if self.started == self.target {
                break;
            }
            self.started += 1;
            self.qpn += 1;
            let ep = CreateOut::read_from_bytes(
                &self
                    .ioctl_ok(
                        0,
                        code::CREATE,
                        create_in().as_bytes(),
                        CreateOut::SIZE as usize,
                    )
                    .output,
            )
            .map_or(0, |c| c.handle);
            let c = connect_in(ep, SERVICE, self.qpn);
            self.ioctl_ok(0, code::CONNECT, c.as_bytes(), 0);
            self.add(0, ep, Role::Client);
        }
    }

    /// Collects the completions of outstanding GET_EVENTs; the batched client then asks
    /// again on every endpoint whose rest after its last completion is over.
    fn poll(&mut self) {
        self.round += 1;
        let mut i = 0;
        while i < self.eps.len() {
            let before = self.eps.len();
            if let Some(key) = self.eps[i].waiting {
                let node = self.eps[i].node;
                if let Some(done) = self.node(node).completion(key) {
                    self.eps[i].waiting = None;
                    self.completed(i, &done);
                }
            }
            if self.eps.len() == before {
                i += 1;
            }
        }
        if self.batched {
            let mut i = 0;
            while i < self.eps.len() {
                let before = self.eps.len();
                if self.eps[i].waiting.is_none() && self.round >= self.eps[i].next_poll {
                    self.get_event(i);
                }
                if self.eps.len() == before {
                    i += 1;
                }
            }
        }
    }

    fn run(mut self) -> (Stats, Duration, u64) {
        let t0 = self.fabric.now();
        let start = WallInstant::now();
        while self.stats.connections < self.target || self.eps.len() > 1 {
            self.start_connections();
            if self.batched {
                let before = self.fabric.now();
                self.fabric.run_for(POLL_NS);
                if self.fabric.now() == before {
                    // Nothing within a poll: sleep until the next thing happens (or
                    // poll at once if only the client itself can move things on).
                    self.fabric.step();
                }
                assert!(self.round < 1000 * self.target + 10_000, "stuck");
            } else {
                assert!(self.fabric.step(), "stuck");
            }
            self.poll();
        }
        let wall = start.elapsed();
        let virtual_ns = self.fabric.now().as_nanos() - t0.as_nanos();
        for n in 0..2 {
            self.node(n).close(self.files[n]);
            for v in self.node(n).violations() {
                match v {
                    Violation::DispatchAllocation { count } => {
                        self.stats.dispatch_allocations += count;
                    }
                    other => panic!("node {n}: {other:?}"),
                }
            }
        }
        (self.stats, wall, virtual_ns)
    }
}

/// Connections per fabric: the host ledger keeps every request with its whole output
/// buffer (29 KiB for a 64-record GET_EVENT), so a long run is split over fresh fabrics.
const SEGMENT: u64 = 500;

fn connection_run(target: u64, batched: bool, lag: u64) -> (Stats, Duration, u64) {
    let mut total = Stats::default();
    let (mut wall, mut virtual_ns) = (Duration::ZERO, 0);
    let mut left = target;
    while left > 0 {
        let n = left.min(SEGMENT);
        left -= n;
        let (s, w, v) = Run::new(n, batched, lag).run();
        total.get_event_ioctls += s.get_event_ioctls;
        total.get_event_at_once += s.get_event_at_once;
        total.records += s.records;
        total.other_ioctls += s.other_ioctls;
        total.connections += s.connections;
        total.max_batch = total.max_batch.max(s.max_batch);
        total.dispatch_allocations += s.dispatch_allocations;
        wall += w;
        virtual_ns += v;
    }
    (total, wall, virtual_ns)
}

fn connection_runs(target: u64) {
    println!();
    println!(
        "system calls per event: {target} connections, 2-node fabric, window 64, \
         {SEGMENT} per fabric"
    );
    println!(
        "{:<26} {:>9} {:>8} {:>6} {:>7} {:>5} {:>10} {:>7} {:>8} {:>6}",
        "client",
        "GET_EVENT",
        "records",
        "ratio",
        "at once",
        "batch",
        "other/conn",
        "conn/s",
        "virt s",
        "alloc"
    );
    let clients = [
        ("one pending (1 record)", false, 0),
        ("batched (64 records)", true, 0),
        ("batched, lagging 2 polls", true, 2),
    ];
    for (name, batched, lag) in clients {
        let (s, wall, virtual_ns) = connection_run(target, batched, lag);
        assert_eq!(s.connections, target);
        let ratio = s.get_event_ioctls as f64 / s.records as f64;
        assert!(ratio <= 1.0, "more GET_EVENTs than events: {s:?}");
        println!(
            "{:<26} {:>9} {:>8} {:>6.3} {:>6.1}% {:>5} {:>10.2} {:>7.0} {:>8.3} {:>6}",
            name,
            s.get_event_ioctls,
            s.records,
            ratio,
            100.0 * s.get_event_at_once as f64 / s.get_event_ioctls as f64,
            s.max_batch,
            s.other_ioctls as f64 / target as f64,
            target as f64 / wall.as_secs_f64(),
            virtual_ns as f64 / 1e9,
            s.dispatch_allocations,
        );
        assert_eq!(
            s.dispatch_allocations, 0,
            "{name}: allocations at DISPATCH_LEVEL"
        );
    }
    println!(
        "(ratio = GET_EVENT IOCTLs / event records; at once = GET_EVENTs that found events \
         queued; batch = most records in one completion; other/conn = other IOCTLs per \
         connection, both sides; conn/s = whole run, wall time; virt s = fabric time; \
         alloc = allocations at DISPATCH_LEVEL)"
    );
}

fn main() {
    let test_mode = std::env::args().any(|a| a == "--test");
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    bench_ioctls(&mut c);
    c.final_summary();
    connection_runs(if test_mode { 500 } else { 10_000 });
}
