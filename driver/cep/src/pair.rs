//! A deterministic two-node harness with virtual time (quinn's `Pair`, smoltcp's netsim):
//! two managers joined by a link with a fixed latency, and per-message fault injection.
//! Used by the tests, the benches and the fuzz target; compiled with feature `pair`.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use ibcm_mad::{AttributeId, MAD_SIZE, Mad, Mtu, Rate, Transport};

use crate::{
    CepId, CmConfig, CmManager, ConnectParams, Event, Instant, ListenParams, MadAddress,
    PathRecord, RepParams,
};

/// One of the two nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The node that usually connects.
    A,
    /// The node that usually listens.
    B,
}

impl Side {
    /// The other node.
    pub fn peer(self) -> Self {
        match self {
            Self::A => Self::B,
            Self::B => Self::A,
        }
    }
}

/// What the link does with one MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Deliver after the link latency.
    Deliver,
    /// Lose it.
    Drop,
    /// Deliver it twice.
    Duplicate,
    /// Deliver after the latency plus this many ns (reorders it behind later MADs).
    Delay(u64),
}

/// A rule: the next `count` MADs of `attribute` sent by `from` meet `fate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultRule {
    /// Sender.
    pub from: Side,
    /// Attribute.
    pub attribute: AttributeId,
    /// How many MADs the rule still applies to.
    pub count: u32,
    /// What happens to them.
    pub fate: Fate,
}

/// Random faults for every MAD no [`FaultRule`] claims, drawn from a seeded RNG
/// (splitmix64): each MAD is independently lost, duplicated (the copy gets its own random
/// delay) or delayed (reordering it behind later MADs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chaos {
    /// RNG state.
    pub state: u64,
    /// Chance in 1000 that a MAD is lost.
    pub drop_per_mille: u16,
    /// Chance in 1000 that a MAD is delivered twice.
    pub duplicate_per_mille: u16,
    /// Chance in 1000 that a copy is delayed.
    pub delay_per_mille: u16,
    /// Longest extra delay, in ns (keep it under the packet life time: the protocol
    /// assumes nothing outlives it).
    pub max_delay_ns: u64,
}

impl Chaos {
    /// No faults yet; set the rates.
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed,
            drop_per_mille: 0,
            duplicate_per_mille: 0,
            delay_per_mille: 0,
            max_delay_ns: 0,
        }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn chance(&mut self, per_mille: u16) -> bool {
        self.next() % 1000 < u64::from(per_mille)
    }

    fn delay(&mut self) -> u64 {
        if self.max_delay_ns > 0 && self.chance(self.delay_per_mille) {
            self.next() % (self.max_delay_ns + 1)
        } else {
            0
        }
    }

    /// The extra delay of each copy of one MAD (none: lost).
    fn copies(&mut self) -> [Option<u64>; 2] {
        if self.chance(self.drop_per_mille) {
            return [None, None];
        }
        let first = Some(self.delay());
        let second = self.chance(self.duplicate_per_mille).then(|| self.delay());
        [first, second]
    }
}

/// A MAD on the link.
#[derive(Debug, Clone)]
struct InFlight {
    at: Instant,
    seq: u64,
    to: Side,
    /// The sender's address as the receiver sees it.
    src: MadAddress,
    mad: [u8; MAD_SIZE],
}

/// Two managers, a link and a virtual clock.
#[derive(Debug)]
pub struct Pair {
    /// Node A.
    pub a: CmManager,
    /// Node B.
    pub b: CmManager,
    /// Virtual time.
    pub now: Instant,
    /// One-way latency of the link.
    pub latency_ns: u64,
    /// Fault rules, applied in order.
    pub faults: Vec<FaultRule>,
    /// Random faults for MADs no rule claims.
    pub chaos: Option<Chaos>,
    /// Every MAD put on the link: sender and attribute.
    pub sent: Vec<(Side, AttributeId)>,
    /// When set, every MAD put on the link, whole (for tests that read the wire).
    pub wire: Option<Vec<(Side, [u8; ibcm_mad::MAD_SIZE])>>,
    /// Events of node A, in order.
    pub events_a: Vec<(CepId, Event)>,
    /// Events of node B, in order.
    pub events_b: Vec<(CepId, Event)>,
    link: VecDeque<InFlight>,
    seq: u64,
    /// Where each side's MADs come from (A's, B's), [`Pair::address_of`] unless a test
    /// sets it ([`Pair::set_address`]): the manager takes a connection's messages only
    /// from an address of its path (src/manager/source.rs).
    addresses: [MadAddress; 2],
}

/// Node A's CA GUID.
pub const GUID_A: u64 = 0x0002_c903_0000_000a;
/// Node B's CA GUID.
pub const GUID_B: u64 = 0x0002_c903_0000_000b;

/// The link-local GID of the port with `lid` (fe80::lid), as the pair's nodes use.
pub fn gid(lid: u16) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[14..].copy_from_slice(&lid.to_be_bytes());
    g
}

impl Pair {
    /// Two managers with default settings and the given RNG seed.
    pub fn new(seed: u8) -> Self {
        Self::with_config(
            CmConfig::new(GUID_A, [seed; 32]),
            CmConfig::new(GUID_B, [seed.wrapping_add(1); 32]),
        )
    }

    /// Two managers with the given settings.
    pub fn with_config(a: CmConfig, b: CmConfig) -> Self {
        Self {
            a: CmManager::new(a),
            b: CmManager::new(b),
            now: Instant::from_nanos(1_000_000),
            latency_ns: 2_000,
            faults: Vec::new(),
            chaos: None,
            sent: Vec::new(),
            wire: None,
            events_a: Vec::new(),
            events_b: Vec::new(),
            link: VecDeque::new(),
            seq: 0,
            addresses: [Self::address_of(Side::A), Self::address_of(Side::B)],
        }
    }

    /// A node's manager.
    pub fn node(&mut self, side: Side) -> &mut CmManager {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// A node's events so far.
    pub fn events(&self, side: Side) -> &[(CepId, Event)] {
        match side {
            Side::A => &self.events_a,
            Side::B => &self.events_b,
        }
    }

    /// A node's events for one CEP.
    pub fn events_of(&self, side: Side, cep: CepId) -> Vec<Event> {
        self.events(side)
            .iter()
            .filter(|(c, _)| *c == cep)
            .map(|(_, e)| *e)
            .collect()
    }

    /// Adds a fault rule.
    pub fn fault(&mut self, from: Side, attribute: AttributeId, count: u32, fate: Fate) {
        self.faults.push(FaultRule {
            from,
            attribute,
            count,
            fate,
        });
    }

    /// How many MADs of `attribute` `from` has put on the link.
    pub fn sent_count(&self, from: Side, attribute: AttributeId) -> usize {
        self.sent
            .iter()
            .filter(|(s, a)| *s == from && *a == attribute)
            .count()
    }

    /// The path from `side` to its peer.
    pub fn path(side: Side) -> PathRecord {
        let (s, d) = match side {
            Side::A => (1, 2),
            Side::B => (2, 1),
        };
        PathRecord {
            slid: s,
            dlid: d,
            sgid: gid(s),
            dgid: gid(d),
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 0,
            sl: 0,
            rate: Rate::Gbps100,
            packet_life_time: 14,
            subnet_local: true,
        }
    }

    /// REQ parameters from A to B for `service_id`.
    pub fn connect_params(service_id: u64, qpn: u32) -> ConnectParams<'static> {
        ConnectParams {
            service_id,
            port: 1,
            pkey: 0xffff,
            qpn,
            transport: Transport::Rc,
            starting_psn: None,
            primary_path: Self::path(Side::A),
            alternate_path: None,
            path_mtu: Mtu::Mtu4096,
            responder_resources: 4,
            initiator_depth: 4,
            remote_cm_response_timeout: 16,
            local_cm_response_timeout: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            max_cm_retries: 3,
            srq: false,
            flow_control: true,
            private_data: b"hello from A",
        }
    }

    /// REP parameters for `qpn`.
    pub fn rep_params(qpn: u32) -> RepParams<'static> {
        RepParams {
            qpn,
            starting_psn: None,
            responder_resources: 4,
            initiator_depth: 4,
            rnr_retry_count: 7,
            failover_accepted: ibcm_mad::Failover::NotSupported,
            flow_control: true,
            srq: false,
            private_data: b"hello from B",
        }
    }

    /// A listen on `service_id` (exact match) with the given backlog.
    pub fn listen_params(service_id: u64, backlog: u32) -> ListenParams {
        ListenParams {
            service_id,
            service_mask: u64::MAX,
            port: None,
            compare: None,
            backlog,
        }
    }

    /// Makes `side`'s MADs come from `address` (a RoCE pair: its IPv4-mapped GID).
    pub fn set_address(&mut self, side: Side, address: MadAddress) {
        self.addresses[usize::from(side == Side::B)] = address;
    }

    /// The address a MAD from `side` arrives from, unless [`Self::set_address`] said
    /// otherwise.
    pub fn address_of(side: Side) -> MadAddress {
        let lid = match side {
            Side::A => 1,
            Side::B => 2,
        };
        MadAddress {
            port: 1,
            lid,
            gid: gid(lid),
            grh: false,
            sl: 0,
            pkey: 0xffff,
        }
    }

    fn collect(&mut self, from: Side) {
        while let Some(t) = self.node(from).poll_transmit() {
            let src = self.addresses[usize::from(from == Side::B)];
            let attribute = AttributeId::from(Mad::new_unchecked(&t.mad[..]).attribute_id());
            self.sent.push((from, attribute));
            if let Some(wire) = self.wire.as_mut() {
                wire.push((from, t.mad));
            }
            let rule = self
                .faults
                .iter_mut()
                .find(|r| r.from == from && r.attribute == attribute && r.count > 0);
            let copies = match (rule, &mut self.chaos) {
                (Some(rule), _) => {
                    rule.count -= 1;
                    match rule.fate {
                        Fate::Deliver => [Some(0), None],
                        Fate::Drop => [None, None],
                        Fate::Duplicate => [Some(0), Some(0)],
                        Fate::Delay(ns) => [Some(ns), None],
                    }
                }
                (None, Some(chaos)) => chaos.copies(),
                (None, None) => [Some(0), None],
            };
            for extra in copies.into_iter().flatten() {
                self.seq += 1;
                self.link.push_back(InFlight {
                    at: self.now.add_nanos(self.latency_ns.saturating_add(extra)),
                    seq: self.seq,
                    to: from.peer(),
                    src,
                    mad: t.mad,
                });
            }
        }
        while let Some(e) = self.node(from).poll_event() {
            match from {
                Side::A => self.events_a.push(e),
                Side::B => self.events_b.push(e),
            }
        }
    }

    /// Drains both nodes' output onto the link and into the event logs.
    pub fn flush(&mut self) {
        self.collect(Side::A);
        self.collect(Side::B);
    }

    /// When something next happens: a MAD arrives or a node's timer fires.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let link = self.link.iter().map(|m| m.at).min();
        [link, self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Delivers everything due, or advances time to the next delivery or timer. Returns
    /// false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.flush();
        let Some(at) = self.next_wakeup() else {
            return false;
        };
        if at > self.now {
            self.now = at;
        }
        // Deliver due MADs in (time, send order).
        let mut due: Vec<InFlight> = Vec::new();
        self.link.retain(|m| {
            if m.at <= self.now {
                due.push(m.clone());
                false
            } else {
                true
            }
        });
        due.sort_by_key(|m| (m.at, m.seq));
        let now = self.now;
        for m in due {
            self.node(m.to).handle_mad(now, &m.src, &m.mad);
            self.flush();
        }
        self.a.handle_timeout(now);
        self.b.handle_timeout(now);
        self.flush();
        true
    }

    /// Steps until nothing is left to happen or virtual time passes `limit_ns` from now.
    pub fn drive_for(&mut self, limit_ns: u64) {
        let end = self.now.add_nanos(limit_ns);
        self.flush();
        while self.next_wakeup().is_some_and(|t| t <= end) {
            if !self.step() {
                break;
            }
        }
    }

    /// Steps until the link is empty and no timer is armed (bounded: 10^6 steps).
    pub fn drive(&mut self) {
        for _ in 0..1_000_000 {
            if !self.step() {
                break;
            }
        }
    }

    /// A listens on `service_id`; A connects to it; returns (A's CEP, B's listen CEP).
    pub fn start_connect(&mut self, service_id: u64) -> (CepId, CepId) {
        let listen = self.b.create().expect("create listen"); // ok: test harness (feature `pair`), never in the driver
        self.b
            .listen(listen, Self::listen_params(service_id, 16))
            .expect("listen"); // ok: test harness (feature `pair`), never in the driver
        let cep = self.a.create().expect("create"); // ok: test harness (feature `pair`), never in the driver
        let now = self.now;
        self.a
            .connect(now, cep, &Self::connect_params(service_id, 0x11))
            .expect("connect"); // ok: test harness (feature `pair`), never in the driver
        (cep, listen)
    }

    /// The newest REQ-created CEP on B.
    pub fn last_request(&self) -> Option<CepId> {
        self.events_b.iter().rev().find_map(|(c, e)| match e {
            Event::ReqReceived(_) => Some(*c),
            _ => None,
        })
    }

    /// Runs a whole REQ/REP/RTU exchange; returns (A's CEP, B's connected CEP).
    pub fn establish(&mut self, service_id: u64) -> (CepId, CepId) {
        let (a, _) = self.start_connect(service_id);
        self.drive_for(1_000_000);
        let b = self.last_request().expect("REQ received"); // ok: test harness (feature `pair`), never in the driver
        let now = self.now;
        self.b.take_request(b).expect("take"); // ok: test harness (feature `pair`), never in the driver
        self.b
            .accept(now, b, &Self::rep_params(0x22))
            .expect("accept"); // ok: test harness (feature `pair`), never in the driver
        self.drive_for(1_000_000);
        self.a.rtu(a, b"rtu").expect("rtu"); // ok: test harness (feature `pair`), never in the driver
        self.drive_for(1_000_000);
        (a, b)
    }
}
