//! Listen benches (`cargo bench -p ibcm-cep --bench listen`): what a LISTEN and a received
//! REQ's listen lookup cost under the CM's lock with N listens on distinct exact service
//! IDs (users' listens) and 4 partial-mask ones (administrators' wildcards), N = 10^3,
//! 10^4, 10^5 (review-30 A5: with per-handle quotas and many handles, 10^5-10^6 listens).
//!
//! - **listen/N**: one LISTEN on a fresh exact service ID (the overlap check and the
//!   insert); its CEP is created and destroyed outside the timed part.
//! - **req_miss/N**: `owner_of` a REQ for a service ID no listen takes (the steering
//!   decision on a shared QP1, in the receive DPC; `handle_mad` looks the listen up the
//!   same way).
//! - **req_hit/N**: `owner_of` a REQ that one exact listen takes.

use std::hint::black_box;
use std::time::{Duration, Instant as WallClock};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ibcm_cep::pair::{GUID_A, GUID_B, Pair};
use ibcm_cep::{CmConfig, CmManager, Instant, ListenParams};
use ibcm_mad::{MAD_SIZE, ReqPacket};

/// Exact listens' service IDs: BASE + k.
const BASE: u64 = 0x0000_0001_0000_0000;
/// Partial-mask listens: PARTIAL + (k << 16) under a 16-bit wildcard.
const PARTIAL: u64 = 0x0000_0002_0000_0000;
const PARTIALS: u64 = 4;

fn exact(service_id: u64) -> ListenParams {
    ListenParams {
        service_id,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: 16,
    }
}

/// A manager with `n` exact listens and PARTIALS partial-mask ones.
fn listening(n: u64) -> CmManager {
    let mut cm = CmManager::new(CmConfig::new(GUID_B, [2; 32]));
    for k in 0..PARTIALS {
        let cep = cm.create().unwrap();
        let params = ListenParams {
            service_id: PARTIAL + (k << 16),
            service_mask: !0xffff,
            ..exact(0)
        };
        cm.listen(cep, params).unwrap();
    }
    for k in 0..n {
        let cep = cm.create().unwrap();
        cm.listen(cep, exact(BASE + k)).unwrap();
    }
    cm
}

/// A REQ MAD on the wire (from a second manager), its service ID to be set.
fn req_mad() -> [u8; MAD_SIZE] {
    let mut a = CmManager::new(CmConfig::new(GUID_A, [1; 32]));
    let cep = a.create().unwrap();
    a.connect(Instant::default(), cep, &Pair::connect_params(0, 0x11))
        .unwrap();
    a.poll_transmit().unwrap().mad
}

fn with_service_id(mut mad: [u8; MAD_SIZE], service_id: u64) -> [u8; MAD_SIZE] {
    ReqPacket::new_unchecked(&mut mad[24..]).set_service_id(service_id);
    mad
}

fn listens(c: &mut Criterion) {
    let mut g = c.benchmark_group("listens");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let req = req_mad();
    for n in [1_000u64, 10_000, 100_000] {
        let built = WallClock::now();
        let mut cm = listening(n);
        eprintln!("{n} listens made in {:?}", built.elapsed());
        let mut fresh = BASE + n;
        g.bench_function(BenchmarkId::new("listen", n), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let cep = cm.create().unwrap();
                    let params = exact(fresh);
                    fresh += 1;
                    let t = WallClock::now();
                    cm.listen(cep, params).unwrap();
                    total += t.elapsed();
                    cm.destroy(Instant::default(), cep).unwrap();
                    while cm.poll_event().is_some() {}
                }
                total
            });
        });
        let miss = with_service_id(req, 0x0000_0003_0000_0000);
        g.bench_function(BenchmarkId::new("req_miss", n), |b| {
            b.iter(|| cm.owner_of(1, black_box(&miss)));
        });
        let hit = with_service_id(req, BASE + n / 2);
        g.bench_function(BenchmarkId::new("req_hit", n), |b| {
            b.iter(|| cm.owner_of(1, black_box(&hit)));
        });
    }
    g.finish();
}

criterion_group!(benches, listens);
criterion_main!(benches);
