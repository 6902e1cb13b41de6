//! The hook between AL and the HCA, on a host where AL's CM and ibcm share every port's
//! QP1 (issue #19): at any interleaving of arrivals, polls (one completion at a time, or
//! arrays), completions out of order, local errors with their flushes and AL's resets,
//! and ports going down and up, on two HCAs of two ports each:
//!
//! - AL's CM gets IPoIB-CM's REQs and every message naming AL's comm IDs byte for byte;
//!   ibcm gets its REQs and messages with Send restored, byte for byte; a MAD sent with
//!   the private method on the wire is refused; other classes reach AL's other clients;
//! - each MAD ends exactly once, or was never polled because AL reset or destroyed the QP
//!   with its completion on the CQ (AL's own loss, which the hook never sees);
//! - the hook's map holds exactly the receives the HCA holds, every ticket is claimed,
//!   and it never looks at a buffer whose receive did not complete successfully;
//! - nothing is allocated on the DISPATCH_LEVEL paths (post_recv, poll_cq, claim).
//!
//! `figures` runs a long seeded mix and prints what was steered and passed per kind:
//! `cargo test -p ibcm-qp1-hook --release --test interleavings figures -- --nocapture`.

mod model;

use std::collections::BTreeMap;

use ibcm_qp1_hook::method::{GRH_SIZE, RECEIVE_SIZE};
use ibcm_qp1_hook::{Counters, WorkCompletion};
use model::{DEPTH, Delivery, Hca, Kind, M, Sink, Traffic, Wire};
use proptest::prelude::*;

/// One step of the host.
#[derive(Debug, Clone)]
enum Op {
    /// A MAD of this kind arrives for (HCA, port).
    Arrive {
        hca: usize,
        port: usize,
        kind: usize,
        r: u32,
    },
    /// AL's completion DPC on (HCA, port): `n` per poll, at most `budget` a pass.
    Poll {
        hca: usize,
        port: usize,
        n: usize,
        budget: usize,
    },
    /// The HCA's CQ returns two completions swapped.
    Reorder {
        hca: usize,
        port: usize,
        i: usize,
        j: usize,
    },
    /// A local error on the port's QP1.
    Fail { hca: usize, port: usize },
    /// The port goes down and up: AL destroys QP1 and creates a new one.
    Cycle { hca: usize, port: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let hp = (0..2usize, 0..2usize);
    prop_oneof![
        8 => (hp.clone(), 0..Kind::all().len(), any::<u32>())
            .prop_map(|((hca, port), kind, r)| Op::Arrive { hca, port, kind, r }),
        5 => (hp.clone(), prop_oneof![3 => Just(1usize), 1 => 2..6usize], 1..20usize)
            .prop_map(|((hca, port), n, budget)| Op::Poll { hca, port, n, budget }),
        2 => (hp.clone(), any::<usize>(), any::<usize>())
            .prop_map(|((hca, port), i, j)| Op::Reorder { hca, port, i, j }),
        1 => hp.clone().prop_map(|(hca, port)| Op::Fail { hca, port }),
        1 => hp.prop_map(|(hca, port)| Op::Cycle { hca, port }),
    ]
}

/// The host: traffic, two HCAs, the wire, what was sent and what ended where.
struct Host {
    traffic: Traffic,
    hcas: Vec<Hca>,
    wire: Wire,
    sent: BTreeMap<u64, (Kind, u8, [u8; 256])>,
    dropped: Vec<u64>,
    out: Delivery,
    next_tid: u64,
}

impl Host {
    fn new() -> Self {
        Self {
            traffic: Traffic::new(),
            hcas: vec![Hca::new(0, 2), Hca::new(1, 2)],
            wire: Wire::new(),
            sent: BTreeMap::new(),
            dropped: Vec::new(),
            out: Delivery::default(),
            next_tid: 1,
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Arrive { hca, port, kind, r } => {
                let kind = Kind::all()[kind];
                let tid = self.next_tid;
                self.next_tid += 1;
                let mad = self.traffic.mad(kind, tid, r);
                let num = self.hcas[hca].ports[port].num;
                self.sent.insert(tid, (kind, num, mad));
                self.wire.entry((hca, port)).or_default().push_back(mad);
            }
            Op::Poll {
                hca,
                port,
                n,
                budget,
            } => {
                self.hcas[hca].poll(port, n, budget, &self.traffic, &mut self.out);
            }
            Op::Reorder { hca, port, i, j } => self.hcas[hca].ports[port].hca.reorder(i, j),
            Op::Fail { hca, port } => {
                let h = &mut self.hcas[hca];
                h.ports[port].hca.fail(&mut h.arena);
            }
            Op::Cycle { hca, port } => {
                self.note_dropped(hca, port);
                self.hcas[hca].cycle(port);
            }
        }
        self.deliver();
        self.note_resets();
        for h in &self.hcas {
            h.check();
        }
    }

    /// Wire MADs into posted receives.
    fn deliver(&mut self) {
        for (&(hca, port), q) in &mut self.wire {
            let h = &mut self.hcas[hca];
            while let Some(mad) = q.front() {
                if !h.ports[port].hca.arrive(mad, &mut h.arena) {
                    break;
                }
                q.pop_front();
            }
        }
    }

    /// Successful completions still on a CQ that a destroy is about to drop.
    fn note_dropped(&mut self, hca: usize, port: usize) {
        let cqes = &self.hcas[hca].ports[port].hca.cqes;
        self.dropped.extend(cqes.iter().filter_map(|c| c.tid));
    }

    /// Successful completions AL's resets cleaned from the CQs.
    fn note_resets(&mut self) {
        for h in &mut self.hcas {
            for port in &mut h.ports {
                self.dropped.append(&mut port.hca.cleaned);
            }
        }
    }

    /// Polls every port until the wire and the CQs are empty.
    fn drain(&mut self) {
        for _ in 0..10_000 {
            self.deliver();
            let mut busy = self.wire.values().any(|q| !q.is_empty());
            for hca in 0..self.hcas.len() {
                for port in 0..self.hcas[hca].ports.len() {
                    busy |= !self.hcas[hca].ports[port].hca.cqes.is_empty();
                    self.hcas[hca].poll(port, 1, usize::MAX, &self.traffic, &mut self.out);
                }
            }
            self.note_resets();
            if !busy {
                return;
            }
        }
        panic!("the host did not drain");
    }

    /// Every MAD ended once, in its place, with its bytes; returns the figures.
    fn verify(&self) -> Figures {
        let mut seen: BTreeMap<u64, Sink> = BTreeMap::new();
        let mut figures = Figures::default();
        let sinks = [
            (Sink::Ibcm, &self.out.ibcm),
            (Sink::AlCm, &self.out.al_cm),
            (Sink::Others, &self.out.others),
            (Sink::Refused, &self.out.refused),
        ];
        for (sink, mads) in sinks {
            for (port, mad) in mads {
                let tid = u64::from_be_bytes(mad[8..16].try_into().unwrap());
                let (kind, sent_port, bytes) = self.sent.get(&tid).expect("a MAD nobody sent");
                assert_eq!(
                    seen.insert(tid, sink),
                    None,
                    "MAD {tid} ({kind:?}) delivered twice"
                );
                assert_eq!(sink, kind.sink(), "MAD {tid} ({kind:?}) reached {sink:?}");
                assert_eq!(port, sent_port, "MAD {tid} on the wrong port");
                assert_eq!(
                    mad, bytes,
                    "MAD {tid} ({kind:?}) changed on the way to {sink:?}"
                );
                if kind.steered() {
                    assert!(
                        self.traffic.is_ours(*port, mad),
                        "the model's ibcm MAD {kind:?} is not owner_of's"
                    );
                }
                *figures.ended.entry((*kind, sink)).or_default() += 1;
            }
        }
        for tid in &self.dropped {
            let (kind, _, _) = self.sent[tid];
            assert_eq!(
                seen.insert(*tid, Sink::Refused),
                None,
                "MAD {tid} dropped and delivered"
            );
            *figures.dropped.entry(kind).or_default() += 1;
        }
        for (tid, (kind, _, _)) in &self.sent {
            assert!(seen.contains_key(tid), "MAD {tid} ({kind:?}) lost");
            *figures.sent.entry(*kind).or_default() += 1;
        }
        for h in &self.hcas {
            h.check();
            for port in &h.ports {
                let (_, tickets) = h.hook.outstanding(port.num).unwrap();
                assert_eq!(tickets, 0, "unclaimed tickets");
            }
        }
        figures.garbage = self.out.garbage;
        figures
    }

    /// The hook's counters over every QP1 there was.
    fn counters(&self) -> Counters {
        let live = self
            .hcas
            .iter()
            .flat_map(|h| h.ports.iter().map(|p| h.hook.counters(p.num).unwrap()));
        let retired = self.hcas.iter().flat_map(|h| h.retired.iter().copied());
        live.chain(retired)
            .fold(Counters::default(), |t, c| Counters {
                steered: t.steered + c.steered,
                passed_cm: t.passed_cm + c.passed_cm,
                passed_other: t.passed_other + c.passed_other,
                flushed: t.flushed + c.flushed,
                errors: t.errors + c.errors,
                unknown: t.unknown + c.unknown,
                forgotten: t.forgotten + c.forgotten,
                claimed: t.claimed + c.claimed,
                posted: t.posted + c.posted,
                over_depth: t.over_depth + c.over_depth,
                refused: t.refused + c.refused,
                replaced: t.replaced + c.replaced,
                unmapped: t.unmapped + c.unmapped,
                tickets_evicted: t.tickets_evicted + c.tickets_evicted,
            })
    }

    /// The hook counted what the consumers got: every steered MAD reached ibcm and was
    /// claimed; no completion was unknown to it, no receive went unrecorded.
    fn verify_counters(&self) -> Counters {
        let c = self.counters();
        let steered = self.out.ibcm.iter().filter(|(_, m)| m[3] == 0x03).count() as u64;
        let al = self.out.al_cm.len() as u64;
        assert_eq!((c.steered, c.claimed, c.passed_cm), (steered, steered, al));
        assert_eq!(
            (c.unknown, c.over_depth, c.unmapped, c.tickets_evicted),
            (0, 0, 0, 0)
        );
        c
    }
}

#[derive(Default, Debug)]
struct Figures {
    sent: BTreeMap<Kind, u64>,
    ended: BTreeMap<(Kind, Sink), u64>,
    dropped: BTreeMap<Kind, u64>,
    garbage: usize,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_mad_ends_once_in_its_place_at_any_interleaving(ops in proptest::collection::vec(op(), 1..120)) {
        let mut host = Host::new();
        for op in &ops {
            host.apply(op);
        }
        host.drain();
        host.verify();
        host.verify_counters();
    }
}

#[test]
fn the_dispatch_level_paths_allocate_nothing() {
    let traffic = Traffic::new();
    let hook = model::ModelHook::new(2, M).unwrap();
    hook.create_spl_qp(2, ibcm_qp1_hook::IB_QPT_QP1, 0x10, 0x11, DEPTH as u32)
        .unwrap();
    let mut arena = model::Arena {
        bufs: vec![[0; RECEIVE_SIZE]; DEPTH],
        state: vec![model::BufState::Received; DEPTH],
        violations: Vec::with_capacity(1),
    };
    let mut wcs = Vec::with_capacity(DEPTH);
    for (i, buf) in arena.bufs.iter_mut().enumerate() {
        let kind = [Kind::ReqOurs, Kind::ReqIpoib, Kind::Get, Kind::NotCm][i % 4];
        buf[GRH_SIZE..].copy_from_slice(&traffic.mad(kind, i as u64, 7));
        wcs.push(WorkCompletion {
            wr_id: 0x1000 + i as u64,
            status: 0,
            length: RECEIVE_SIZE as u32,
        });
    }
    let steer = |port: u8, mad: &[u8]| traffic.is_ours(port, mad);
    let info = allocation_counter::measure(|| {
        for round in 0..100 {
            // post_recv, poll_cq (remap), the receive callback (claim + restore), and a
            // flushed round: AL's whole DISPATCH_LEVEL path.
            assert!(hook.post_recv(0x10, (0..DEPTH).map(|i| (0x1000 + i as u64, Some(i)))));
            if round % 10 == 9 {
                let flushed = wcs.iter().map(|w| WorkCompletion { status: 4, ..*w });
                assert_eq!(hook.poll_cq(0x11, &mut arena, &steer, flushed), 0);
                continue;
            }
            assert_eq!(
                hook.poll_cq(0x11, &mut arena, &steer, wcs.iter().copied()),
                2
            );
            for buf in arena.bufs.iter_mut() {
                let mad = &mut buf[GRH_SIZE..];
                if mad[3] == M.get() {
                    let from_hook = hook.claim(2, mad);
                    assert_eq!(
                        ibcm_qp1_hook::restore(mad, M, from_hook),
                        Ok(ibcm_qp1_hook::Delivered::Steered)
                    );
                }
            }
        }
    });
    assert_eq!(info.count_total, 0, "allocated on the DISPATCH_LEVEL paths");
    let c = hook.counters(2).unwrap();
    assert_eq!(
        (c.steered, c.claimed, c.flushed),
        (180, 180, 10 * DEPTH as u64)
    );
    assert_eq!(hook.outstanding(2), Some((0, 0)));
    assert!(arena.violations.is_empty());
}

#[test]
fn a_steered_mad_reaches_ibcm_with_send_and_an_ipoib_req_reaches_al_untouched() {
    let mut host = Host::new();
    host.apply(&Op::Arrive {
        hca: 1,
        port: 1,
        kind: 0,
        r: 5,
    });
    host.apply(&Op::Arrive {
        hca: 1,
        port: 1,
        kind: 1,
        r: 5,
    });
    host.apply(&Op::Poll {
        hca: 1,
        port: 1,
        n: 1,
        budget: 10,
    });
    assert_eq!(host.out.ibcm.len(), 1);
    assert_eq!(host.out.al_cm.len(), 1);
    assert_eq!(host.out.ibcm[0].1[3], 0x03);
    assert_eq!(
        host.out.al_cm[0].1[32..40],
        (model::SID_IPOIB | 5).to_be_bytes()
    );
    let c = host.hcas[1].hook.counters(2).unwrap();
    assert_eq!((c.steered, c.passed_cm, c.claimed), (1, 1, 1));
    host.verify();
}

/// A small xorshift for the seeded figures run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
}

#[test]
fn figures() {
    let mut host = Host::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let kinds = Kind::all().len() as u64;
    let mads = if cfg!(debug_assertions) {
        20_000
    } else {
        200_000
    };
    let mut arrived = 0;
    while arrived < mads {
        let (hca, port) = (rng.below(2), rng.below(2));
        let op = match rng.below(1000) {
            0..=549 => {
                arrived += 1;
                Op::Arrive {
                    hca,
                    port,
                    kind: rng.below(kinds),
                    r: rng.next() as u32,
                }
            }
            550..=899 => Op::Poll {
                hca,
                port,
                n: 1,
                budget: 16,
            },
            900..=979 => Op::Poll {
                hca,
                port,
                n: 2 + rng.below(6),
                budget: 16,
            },
            980..=996 => Op::Reorder {
                hca,
                port,
                i: rng.below(9),
                j: rng.below(9),
            },
            997..=998 => Op::Fail { hca, port },
            _ => Op::Cycle { hca, port },
        };
        host.apply(&op);
    }
    host.drain();
    let f = host.verify();
    let c = host.verify_counters();
    println!("{mads} MADs on 2 HCAs x 2 ports, QP1 depth {DEPTH}; where each kind ended:");
    println!(
        "{:<22} {:>7} {:>13} {:>13} {:>8} {:>8} {:>10} {:>5}",
        "kind", "sent", "ibcm", "AL's CM", "others", "refused", "AL reset", "lost"
    );
    let mut total_steered = 0;
    for kind in Kind::all() {
        let at = |s| f.ended.get(&(kind, s)).copied().unwrap_or(0);
        let sent = f.sent.get(&kind).copied().unwrap_or(0);
        let dropped = f.dropped.get(&kind).copied().unwrap_or(0);
        let ended = at(Sink::Ibcm) + at(Sink::AlCm) + at(Sink::Others) + at(Sink::Refused);
        if kind.steered() {
            total_steered += at(Sink::Ibcm);
        }
        println!(
            "{:<22} {:>7} {:>13} {:>13} {:>8} {:>8} {:>10} {:>5}",
            format!("{kind:?}"),
            sent,
            at(Sink::Ibcm),
            at(Sink::AlCm),
            at(Sink::Others),
            at(Sink::Refused),
            dropped,
            sent - ended - dropped
        );
    }
    println!(
        "steered (remapped to M, restored by ibcm) {total_steered}; error completions AL \
         dispatched as garbage: {}",
        f.garbage
    );
    println!(
        "the hook counted: steered {}, CM passed to AL {}, other passed {}, flushed {}, \
         errors {}, unknown {}, forgotten at RESET/destroy {}, tickets claimed {}",
        c.steered,
        c.passed_cm,
        c.passed_other,
        c.flushed,
        c.errors,
        c.unknown,
        c.forgotten,
        c.claimed
    );
}
