//! Engine benches (`cargo bench -p ibcm-cep --bench engine`).
//!
//! - **memory** (printed at start): heap bytes per established connection, per manager,
//!   measured with a counting global allocator over N = 10^5 connections.
//! - **setup**: complete REQ/REP/RTU exchanges per second between two in-process
//!   managers, 10^4 connections per iteration.
//! - **hot_1e6**: with 10^6 established connections (`reserve(1_100_000)` first), the cost
//!   of MADs addressed to connections chosen uniformly at random: a duplicate REP to the
//!   active side (answered with the cached RTU), and a DREQ + DREP pair (the disconnect and
//!   drep downcalls that emit them included). Each one MAD at a time (plain `handle_mad`),
//!   and in batches of 16 with `CmManager::prefetch` called for the whole batch first
//!   (`_batch16`), as a driver that polls its receive CQ in batches would. Torn-down
//!   connections are re-established outside the timed part so 10^6 stay live.
//!   `IBCM_BENCH_HOT_N=<n>` changes the 10^6 (e.g. 1000 for the in-cache cost).
//!
//! MADs go straight from one manager's `poll_transmit` to the other's `handle_mad`, with
//! no link model: this measures the engine, not the `Pair` harness.

use std::hint::black_box;
use std::time::{Duration, Instant as WallClock};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use ibcm_cep::pair::{GUID_A, GUID_B, Pair};
use ibcm_cep::{
    CepId, CmConfig, CmManager, ConnectParams, Event, Instant, ListenParams, MadAddress, RepParams,
    Transmit,
};
use ibcm_mad::{AttributeId, MAD_SIZE, RepPacket};

/// Heap bytes freed by dropping `value` (allocation_counter counts this thread only).
fn heap_of<T>(value: T) -> usize {
    let info = allocation_counter::measure(|| drop(value));
    info.bytes_current.unsigned_abs() as usize
}

// ---- two engines, driven directly ------------------------------------------------------

const SERVICE: u64 = 0x1000;
/// Virtual time between recycling rounds: longer than timewait and every retry timeout.
const TICK_NS: u64 = 1_000_000_000;

fn gid(lid: u16) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[14..].copy_from_slice(&lid.to_be_bytes());
    g
}

/// The address MADs from the node with `lid` arrive from.
fn addr(lid: u16) -> MadAddress {
    MadAddress {
        port: 1,
        lid,
        gid: gid(lid),
        grh: false,
        sl: 0,
        pkey: 0xffff,
    }
}

fn config(guid: u64, seed: u8) -> CmConfig {
    CmConfig {
        max_ceps: 1 << 24,
        ..CmConfig::new(guid, [seed; 32])
    }
}

/// One established connection: the CEP on each side and the QPNs it uses.
#[derive(Debug, Clone, Copy)]
struct Conn {
    a: CepId,
    b: CepId,
    qpn: u32,
}

/// Node A (active) and node B (passive, one listen), joined directly.
struct Engines {
    a: CmManager,
    b: CmManager,
    now: Instant,
    from_a: MadAddress,
    from_b: MadAddress,
}

fn expect_transmit(t: Option<Transmit>, what: &str) -> Transmit {
    t.unwrap_or_else(|| panic!("no {what} to send"))
}

impl Engines {
    fn new(reserve: usize) -> Self {
        let mut a = CmManager::new(config(GUID_A, 1));
        let mut b = CmManager::new(config(GUID_B, 2));
        if reserve > 0 {
            a.reserve(reserve).expect("reserve A");
            b.reserve(reserve + 1).expect("reserve B");
        }
        let listen = b.create().expect("create listen");
        b.listen(
            listen,
            ListenParams {
                backlog: u32::MAX,
                ..Pair::listen_params(SERVICE, 0)
            },
        )
        .expect("listen");
        Self {
            a,
            b,
            now: Instant::from_nanos(1_000_000),
            from_a: addr(1),
            from_b: addr(2),
        }
    }

    /// One REQ/REP/RTU exchange with no private data; both sides use QPN `qpn`.
    fn establish(&mut self, qpn: u32) -> Conn {
        self.establish_keeping_rep(qpn, None)
    }

    /// [`establish`](Self::establish), copying B's REP to `rep` if given.
    fn establish_keeping_rep(&mut self, qpn: u32, rep: Option<&mut [u8; MAD_SIZE]>) -> Conn {
        let now = self.now;
        let a = self.a.create().expect("create");
        let params = ConnectParams {
            private_data: &[],
            ..Pair::connect_params(SERVICE, qpn)
        };
        self.a.connect(now, a, &params).expect("connect");
        let req = expect_transmit(self.a.poll_transmit(), "REQ");
        self.b.handle_mad(now, &self.from_a, &req.mad);
        let Some((b, Event::ReqReceived(_))) = self.b.poll_event() else {
            panic!("no ReqReceived");
        };
        let rep_params = RepParams {
            private_data: &[],
            ..Pair::rep_params(qpn)
        };
        self.b.accept(now, b, &rep_params).expect("accept");
        let rep_mad = expect_transmit(self.b.poll_transmit(), "REP").mad;
        if let Some(rep) = rep {
            *rep = rep_mad;
        }
        self.a.handle_mad(now, &self.from_b, &rep_mad);
        let Some((_, Event::RepReceived(_))) = self.a.poll_event() else {
            panic!("no RepReceived");
        };
        self.a.rtu(a, &[]).expect("rtu");
        let rtu = expect_transmit(self.a.poll_transmit(), "RTU");
        self.b.handle_mad(now, &self.from_a, &rtu.mad);
        let Some((_, Event::RtuReceived(_))) = self.b.poll_event() else {
            panic!("no RtuReceived");
        };
        Conn { a, b, qpn }
    }

    /// Destroys every CEP of `conns` (established) and lets the teardown finish.
    fn teardown(&mut self, conns: &[Conn]) {
        for c in conns {
            self.a.destroy(self.now, c.a).expect("destroy A");
            while let Some(t) = self.a.poll_transmit() {
                self.b.handle_mad(self.now, &self.from_a, &t.mad);
            }
            while self.b.poll_event().is_some() {}
            self.b.destroy(self.now, c.b).expect("destroy B");
            while let Some(t) = self.b.poll_transmit() {
                self.a.handle_mad(self.now, &self.from_b, &t.mad);
            }
            while self.a.poll_event().is_some() {}
        }
        self.expire();
    }

    /// Moves virtual time past every timewait and retry, and handles the timers.
    fn expire(&mut self) {
        self.now = self.now.add_nanos(TICK_NS);
        for m in [&mut self.a, &mut self.b] {
            while m.poll_timeout().is_some_and(|at| at <= self.now) {
                m.handle_timeout(self.now);
                while m.poll_event().is_some() {}
            }
        }
        assert!(self.a.poll_transmit().is_none() && self.b.poll_transmit().is_none());
    }
}

/// SplitMix64: a fast, seeded RNG for choosing connections.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

// ---- memory ----------------------------------------------------------------------------

const MEMORY_N: usize = 100_000;

/// Heap bytes of A and of B after establishing `n` connections (no private data).
fn heap_per_manager(n: usize, reserve: bool) -> (usize, usize) {
    let mut e = Engines::new(if reserve { n } else { 0 });
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        conns.push(e.establish(0x100 + i as u32));
    }
    assert_eq!(e.a.live_ceps(), n);
    let Engines { a, b, .. } = e;
    (heap_of(a), heap_of(b))
}

fn memory_report() {
    let n = MEMORY_N;
    println!("== ibcm-cep memory (heap bytes requested; allocator overhead excluded) ==");
    for reserve in [true, false] {
        let (a, b) = heap_per_manager(n, reserve);
        let how = if reserve {
            "with reserve(N)"
        } else {
            "grown, no reserve"
        };
        println!(
            "bytes per established connection, N={n}, {how}: active {:.1} B, passive {:.1} B (budget <= 512 per manager)",
            a as f64 / n as f64,
            b as f64 / n as f64,
        );
    }
    println!(
        "(size_of::<Transmit>() = {} B, size_of::<(CepId, Event)>() = {} B)",
        size_of::<Transmit>(),
        size_of::<(CepId, Event)>()
    );
}

// ---- setup rate --------------------------------------------------------------------------

const SETUP_BATCH: usize = 10_000;

fn setup(c: &mut Criterion) {
    memory_report();
    let mut group = c.benchmark_group("setup");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(SETUP_BATCH as u64));
    // Fresh managers (reserved for the batch) per iteration; dropping them is not timed.
    group.bench_function("req_rep_rtu_10k_fresh", |b| {
        b.iter_batched(
            || Engines::new(SETUP_BATCH),
            |mut e| {
                for i in 0..SETUP_BATCH {
                    black_box(e.establish(0x100 + i as u32));
                }
                e
            },
            BatchSize::PerIteration,
        );
    });
    // The same two managers throughout: each batch is torn down (untimed) afterwards.
    let mut warm = Engines::new(SETUP_BATCH);
    let mut conns = Vec::with_capacity(SETUP_BATCH);
    group.bench_function("req_rep_rtu_10k_warm", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                conns.clear();
                let t0 = WallClock::now();
                for i in 0..SETUP_BATCH {
                    conns.push(warm.establish(0x100 + i as u32));
                }
                total += t0.elapsed();
                warm.teardown(&conns);
            }
            total
        });
    });
    group.finish();
}

// ---- hot path at 10^6 live connections -------------------------------------------------------

const HOT_N: usize = 1_000_000;

/// Live connections for `hot_1e6`: 10^6, or `IBCM_BENCH_HOT_N` (to compare cache effects);
/// 10^4 when run as a test (`cargo test --benches`: no `--bench` argument), to stay quick.
fn hot_n() -> usize {
    let default = if std::env::args().any(|a| a == "--bench") {
        HOT_N
    } else {
        10_000
    };
    std::env::var("IBCM_BENCH_HOT_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Precomputed duplicate REPs: 64 MiB of MADs, far beyond the 32 MiB LLC, so neither
/// the MADs nor the CEPs they name stay cached between passes.
const DUP_MADS: usize = 1 << 18;
/// Connections torn down (timed) and re-established (untimed) per round.
const CHUNK: usize = 4096;

struct Hot {
    e: Engines,
    /// Live connections.
    n: usize,
    conns: Vec<Conn>,
    /// A random permutation of `0..n`: the order connections are torn down in.
    order: Vec<u32>,
    next: usize,
    rep_template: [u8; MAD_SIZE],
    rng: SplitMix,
    /// Duplicate-REP MADs, built for the current comm IDs.
    dup_reps: Vec<[u8; MAD_SIZE]>,
    dup_next: usize,
    /// Re-establishing torn-down connections at 10^6 live (untimed by criterion).
    recycled: usize,
    recycle_time: Duration,
}

impl Hot {
    fn build() -> Self {
        let n = hot_n();
        let mut e = Engines::new(n + n / 10);
        let mut conns = Vec::with_capacity(n);
        let t0 = WallClock::now();
        let mut rep_template = [0u8; MAD_SIZE];
        conns.push(e.establish_keeping_rep(0x100, Some(&mut rep_template)));
        for i in 1..n {
            conns.push(e.establish(0x100 + i as u32));
        }
        let took = t0.elapsed();
        println!(
            "hot_1e6 setup: {n} connections established in {:.2} s = {:.0} setups/s ({:.0} ns/setup)",
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64(),
            took.as_nanos() as f64 / n as f64,
        );
        let mut rng = SplitMix(0x5eed);
        let mut order: Vec<u32> = (0..n as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        Self {
            e,
            n,
            conns,
            order,
            next: 0,
            rep_template,
            rng,
            dup_reps: Vec::new(),
            dup_next: 0,
            recycled: 0,
            recycle_time: Duration::ZERO,
        }
    }

    /// B's REP for a connection, as if sent again.
    fn dup_rep(&self, c: &Conn) -> [u8; MAD_SIZE] {
        let mut mad = self.rep_template;
        let mut p = RepPacket::new_unchecked(&mut mad[..]);
        p.set_local_comm_id(self.e.b.local_comm_id(c.b));
        p.set_remote_comm_id(self.e.a.local_comm_id(c.a));
        p.set_local_qpn(c.qpn);
        mad
    }

    fn build_dup_reps(&mut self) {
        let mut mads = Vec::with_capacity(DUP_MADS);
        for _ in 0..DUP_MADS {
            let c = self.conns[self.rng.below(self.n)];
            mads.push(self.dup_rep(&c));
        }
        self.dup_reps = mads;
        self.dup_next = 0;
    }

    /// The next `n` connections of the random order (distinct for n <= self.n).
    fn pick(&mut self, n: usize, out: &mut Vec<(usize, Conn)>) {
        out.clear();
        for _ in 0..n {
            let k = self.order[self.next] as usize;
            self.next = (self.next + 1) % self.n;
            out.push((k, self.conns[k]));
        }
    }

    /// Ends the torn-down connections' timewait and establishes replacements.
    fn recycle(&mut self, batch: &[(usize, Conn)]) {
        let t0 = WallClock::now();
        for (_, c) in batch {
            self.e.a.destroy(self.e.now, c.a).expect("destroy A");
            self.e.b.destroy(self.e.now, c.b).expect("destroy B");
        }
        self.e.expire();
        for &(k, c) in batch {
            self.conns[k] = self.e.establish(c.qpn);
        }
        self.recycle_time += t0.elapsed();
        self.recycled += batch.len();
        // Comm IDs changed: the duplicate REPs must be rebuilt before they are used again.
        self.dup_reps.clear();
    }
}

/// MADs received per completion-queue poll in the `_batch16` benches.
const BATCH: usize = 16;

/// Tears down `conns`: A disconnects, B handles the DREQ and answers with a DREP, A handles
/// it; events drained. MADs are received `batch` at a time, each batch prefetched first if
/// `prefetch` (one at a time and no prefetch: the plain `handle_mad` path).
fn dreq_drep(e: &mut Engines, conns: &[(usize, Conn)], batch: usize, prefetch: bool) {
    let now = e.now;
    let mut mads = [[0u8; MAD_SIZE]; BATCH];
    for group in conns.chunks(batch.min(BATCH)) {
        let mads = &mut mads[..group.len()];
        for ((_, c), mad) in group.iter().zip(mads.iter_mut()) {
            e.a.disconnect(now, c.a, &[]).expect("disconnect");
            *mad = expect_transmit(e.a.poll_transmit(), "DREQ").mad;
        }
        if prefetch {
            mads.iter().for_each(|m| e.b.prefetch(m));
        }
        for ((_, c), mad) in group.iter().zip(mads.iter_mut()) {
            e.b.handle_mad(now, &e.from_a, &mad[..]);
            black_box(e.b.poll_event().expect("DreqReceived"));
            e.b.drep(now, c.b, &[]).expect("drep");
            *mad = expect_transmit(e.b.poll_transmit(), "DREP").mad;
        }
        if prefetch {
            mads.iter().for_each(|m| e.a.prefetch(m));
        }
        for mad in mads.iter() {
            e.a.handle_mad(now, &e.from_b, &mad[..]);
            black_box(e.a.poll_event().expect("DrepReceived"));
        }
    }
}

fn hot(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_1e6");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    let mut hot: Option<Hot> = None;

    // A duplicate REP to the active side: parse, slab lookup, state check, RTU re-sent
    // from the cached state, transmit drained. One `handle_mad` per iteration, or
    // BATCH of them after a `prefetch` of each (the batch16 variant).
    for batch in [1, BATCH] {
        let name = if batch == 1 {
            "dup_rep_resend_rtu".to_owned()
        } else {
            format!("dup_rep_resend_rtu_batch{batch}")
        };
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(name, |b| {
            let h = hot.get_or_insert_with(Hot::build);
            if h.dup_reps.is_empty() {
                h.build_dup_reps();
            }
            let before = h.e.a.counters().duplicates;
            let Hot {
                e,
                dup_reps,
                dup_next,
                ..
            } = h;
            *dup_next -= *dup_next % batch;
            b.iter(|| {
                let mads = &dup_reps[*dup_next..*dup_next + batch];
                *dup_next = (*dup_next + batch) % DUP_MADS;
                if batch > 1 {
                    mads.iter().for_each(|m| e.a.prefetch(m));
                }
                for mad in mads {
                    e.a.handle_mad(e.now, &e.from_b, mad);
                    black_box(e.a.poll_transmit().expect("RTU"));
                }
            });
            let slot = ibcm_cep::counter_slot(AttributeId::Rep).expect("slot");
            assert!(h.e.a.counters().duplicates[slot] > before[slot]);
            assert_eq!(h.e.a.counters().unmatched, 0);
        });
    }

    // A DREQ to the passive side and its DREP back to the active side, on random
    // established connections: A.disconnect (emits the DREQ), B.handle_mad(DREQ), B.drep
    // (emits the DREP), A.handle_mad(DREP), events drained. Two MADs per iteration. The
    // torn-down connections are replaced, untimed, in rounds of CHUNK.
    group.throughput(Throughput::Elements(2));
    let mut picked = Vec::with_capacity(CHUNK);
    for batch in [1, BATCH] {
        let name = if batch == 1 {
            "dreq_drep_pair".to_owned()
        } else {
            format!("dreq_drep_pair_batch{batch}")
        };
        group.bench_function(name, |b| {
            let h = hot.get_or_insert_with(Hot::build);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let n = left.min(CHUNK).min(h.n);
                    h.pick(n, &mut picked);
                    let t0 = WallClock::now();
                    dreq_drep(&mut h.e, &picked, batch, batch > 1);
                    total += t0.elapsed();
                    h.recycle(&picked);
                    left -= n;
                }
                total
            });
        });
    }
    group.finish();
    if let Some(h) = &hot {
        if h.recycled > 0 {
            println!(
                "hot_1e6 recycle (untimed above): {} teardowns + REQ/REP/RTU setups at {} live, {:.0} ns each = {:.0} setups/s",
                h.recycled,
                h.n,
                h.recycle_time.as_nanos() as f64 / h.recycled as f64,
                h.recycled as f64 / h.recycle_time.as_secs_f64(),
            );
        }
        assert_eq!(h.e.a.live_ceps(), h.n);
        assert_eq!(h.e.b.live_ceps(), h.n + 1);
    }
}

criterion_group!(benches, setup, hot);
criterion_main!(benches);
