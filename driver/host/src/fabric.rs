//! An in-process fabric in virtual time: N host nodes, one port each, joined by links of
//! a fixed latency. Deterministic: MADs are delivered in (time, send order).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ibcm_cep::{CmConfig, Instant, MadAddress};
use ibcm_mad::MAD_SIZE;

use crate::node::Node;

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

struct InFlight {
    at: u64,
    seq: u64,
    to: usize,
    from: MadAddress,
    mad: [u8; MAD_SIZE],
}

/// N nodes and the links between them.
pub struct Fabric {
    /// Virtual time in ns, shared by every node's platform.
    pub clock: Arc<AtomicU64>,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// One-way latency.
    pub latency_ns: u64,
    link: Vec<InFlight>,
    seq: u64,
    /// MADs delivered.
    pub delivered: u64,
}

impl Fabric {
    /// `n` nodes with default engine settings; node `i`'s RNG is seeded with `seed + i`.
    pub fn new(n: usize, seed: u8) -> Self {
        let clock = Arc::new(AtomicU64::new(1_000_000));
        let nodes = (0..n)
            .map(|i| {
                let config = CmConfig::new(node_guid(i), [seed.wrapping_add(i as u8); 32]);
                Node::new(config, node_address(i), Arc::clone(&clock))
            })
            .collect();
        Self {
            clock,
            nodes,
            latency_ns: 2_000,
            link: Vec::new(),
            seq: 0,
            delivered: 0,
        }
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.clock.load(Ordering::Acquire))
    }

    fn collect(&mut self) {
        let now = self.clock.load(Ordering::Acquire);
        for (i, node) in self.nodes.iter().enumerate() {
            for t in node.platform.take_sent() {
                let Some(to) = self.nodes.iter().position(|n| n.address.lid == t.dest.lid) else {
                    continue;
                };
                self.seq += 1;
                self.link.push(InFlight {
                    at: now + self.latency_ns,
                    seq: self.seq,
                    to,
                    from: MadAddress {
                        port: 1,
                        ..node_address(i)
                    },
                    mad: t.mad,
                });
            }
        }
    }

    fn next_event(&self) -> Option<u64> {
        let link = self.link.iter().map(|m| m.at).min();
        let timers = self
            .nodes
            .iter()
            .filter_map(|n| n.platform.timer().map(Instant::as_nanos))
            .min();
        [link, timers].into_iter().flatten().min()
    }

    /// Delivers what is due and fires due timers, or advances time to the next of those.
    /// Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.collect();
        let Some(at) = self.next_event() else {
            return false;
        };
        let now = self.clock.load(Ordering::Acquire).max(at);
        self.clock.store(now, Ordering::Release);
        let mut due: Vec<InFlight> = Vec::new();
        let mut rest = Vec::with_capacity(self.link.len());
        for m in self.link.drain(..) {
            if m.at <= now {
                due.push(m)
            } else {
                rest.push(m)
            }
        }
        self.link = rest;
        due.sort_by_key(|m| (m.at, m.seq));
        for m in due {
            if let Some(node) = self.nodes.get(m.to) {
                node.receive(&m.from, &m.mad);
                self.delivered += 1;
            }
            self.collect();
        }
        for node in &self.nodes {
            if node.platform.timer().is_some_and(|t| t.as_nanos() <= now) {
                node.fire_timer();
            }
        }
        self.collect();
        true
    }

    /// Steps until nothing is due within `ns` of virtual time.
    pub fn run_for(&mut self, ns: u64) {
        let end = self.clock.load(Ordering::Acquire) + ns;
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
