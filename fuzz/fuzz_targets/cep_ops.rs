//! Operation-sequence fuzzing of the CEP manager (quinn's style): two managers, A and B,
//! joined by a link the fuzzer controls, driven by an arbitrary sequence of user
//! operations, time steps, link faults (drop, duplicate, reorder, mutate) and injected
//! MADs -- raw bytes, or real MADs seen on the link replayed with a byte flipped or aimed
//! at a live CEP's comm ID.
//!
//! Nothing may panic, and after every step, on both managers:
//! - every MAD a manager sends parses as a CM MAD;
//! - no CEP the user holds has vanished: `state`, `query` and the QP attributes work on
//!   it (checked on every step for the CEPs the step named or reported an event on, the
//!   only ones a step changes, and for every held CEP every 32 steps and at the end), and
//!   `live_ceps() >= held`; `live_ceps() <= created` (creates + ReqReceived);
//! - `peer_map_entries() <= 2 * live_ceps()` (a remote comm ID and a remote QPN per CEP),
//!   `alternate_paths() <= 2 * live_ceps()` (a loaded and a pending alternate path);
//! - `poll_timeout()` is `None` iff `timer_entries() == 0`, and after `handle_timeout(now)`
//!   it is `None` or later than `now`;
//! - events name only CEPs the user holds (none after `destroy`), except ReqReceived,
//!   which names a CEP never seen before and a listen the user holds;
//! - per connection (since ReqReceived or `connect`), at most one event of each kind,
//!   nothing after TimewaitExit, only TimewaitExit after Rejected or Timeout;
//! - path migration: any number of LapReceived; MraReceived at most once plus once per
//!   LAP this side sent; at most one AprReceived or Timeout{Lap} per LAP sent (a LAP
//!   timeout does not end the connection); `migrate` swaps the primary and alternate
//!   paths; a pre-APR with status Success hands out RTS attributes, any other none;
//! - SIDR: SidrReqReceived names a CEP never seen before and a listen the user holds; a
//!   requester gets at most one SidrRepReceived or Timeout{SidrReq} per request;
//! - peer-to-peer: a crossing REQ is reported on the `connect_peer` CEP itself, naming it
//!   as the listen;
//! - `remove_port`: every held CEP bound to the port gets exactly one DeviceRemoval and
//!   is Removed, nothing is sent, and nothing follows a DeviceRemoval;
//! - `port_down`: nothing is sent (then, or while the port stays down), and no held CEP
//!   is told or changes state at once (link.rs: handshakes keep their retry timers, an
//!   established connection waits for its deadline); listens stay listens;
//! - a ClassPortInfo Get is answered by exactly one GetResp with its TID (none while the
//!   port it arrives on is down);
//! - a user operation that succeeds leaves the state it documents (`rtu` Established,
//!   `disconnect` DreqSent, `drep` Timewait, ...);
//! - `destroy` of a held CEP succeeds and makes the handle unknown (and, for a listen,
//!   the handles of the requests nobody took from it, which it refuses).
//!
//! At the end every CEP is destroyed and the link and timers run dry (no faults): both
//! managers must then hold no CEP, no peer-map entry, no timer entry and no alternate path.
#![no_main]

use std::collections::{HashMap, VecDeque};

use arbitrary::Arbitrary;
use ibcm_cep::pair::{GUID_A, GUID_B, Pair};
use ibcm_cep::{
    CepId, CmConfig, CmManager, Event, Instant, ListenParams, MadAddress, QpState, RejectParams,
    SidrParams, SidrReplyParams, StateName, counter_slot,
};
use ibcm_mad::{
    AprStatus, AttributeId, ClassPortInfo, CmMad, CmMessage, MAD_SIZE, MadHeader, Method,
    RejReason, SidrStatus,
};
use libfuzzer_sys::fuzz_target;

include!("asan_options.rs");

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

impl Side {
    fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }
    fn peer(self) -> Self {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Create {
        side: Side,
    },
    Listen {
        side: Side,
        cep: u8,
        service: u8,
        wide_mask: bool,
        port: Option<u8>,
        compare: Option<(u8, u8)>,
        backlog: u8,
    },
    Connect {
        side: Side,
        cep: u8,
        service: u8,
        qpn: u16,
        packet_life_time: u8,
        remote_timeout: u8,
        local_timeout: u8,
        retries: u8,
        resources: u8,
        alternate: bool,
        pd_len: u8,
    },
    Accept {
        side: Side,
        cep: u8,
        qpn: u16,
        initiator_depth: u8,
        pd_len: u8,
    },
    PrepareRep {
        side: Side,
        cep: u8,
        qpn: u16,
    },
    SendRep {
        side: Side,
        cep: u8,
    },
    Reject {
        side: Side,
        cep: u8,
        reason: u16,
        ari_len: u8,
        pd_len: u8,
    },
    Mra {
        side: Side,
        cep: u8,
        timeout: u8,
        pd_len: u8,
    },
    Rtu {
        side: Side,
        cep: u8,
        pd_len: u8,
    },
    Disconnect {
        side: Side,
        cep: u8,
        pd_len: u8,
    },
    Drep {
        side: Side,
        cep: u8,
        pd_len: u8,
    },
    Destroy {
        side: Side,
        cep: u8,
    },
    Established {
        side: Side,
        cep: u8,
    },
    TakeRequest {
        side: Side,
        cep: u8,
    },
    QpAttributes {
        side: Side,
        cep: u8,
        state: u8,
    },
    AdvanceTime {
        ns: u32,
        shift: u8,
    },
    AdvanceToTimer,
    DeliverAll,
    DeliverOne,
    DropNext,
    DupNext,
    /// Moves the next MAD behind the others.
    ReorderNext,
    MutateNext {
        offset: u8,
        xor: u8,
    },
    InjectMad {
        side: Side,
        bytes: Vec<u8>,
    },
    /// A whole REQ/REP/RTU exchange from `active` to the other side on a fresh CEP (and
    /// a listen, if the service has none yet), delivering everything: a shortcut to
    /// established connections for the other operations to work on.
    Handshake {
        active: Side,
        service: u8,
        qpn: u16,
    },
    /// A real MAD seen on the link, replayed with one byte changed.
    Replay {
        side: Side,
        which: u8,
        offset: u8,
        xor: u8,
    },
    /// A real MAD seen on the link, its RemoteCommID pointed at a live CEP of `side`.
    Aim {
        side: Side,
        which: u8,
        cep: u8,
        offset: u8,
        xor: u8,
    },
    /// [`Op::Aim`], but sent by a third node (LID 3): a live CEP's comm ID from an address
    /// its connection does not use. Nothing may change but the forged counter (or, for a
    /// REQ or a message naming no live CEP, the other drop counters).
    AimFromStranger {
        side: Side,
        which: u8,
        cep: u8,
        offset: u8,
        xor: u8,
    },
    /// A LAP proposing a path like the primary with other LIDs, life time and SL.
    Lap {
        side: Side,
        cep: u8,
        lid: u8,
        packet_life_time: u8,
        sl: u8,
        pd_len: u8,
    },
    PrepareApr {
        side: Side,
        cep: u8,
        status: u8,
        info_len: u8,
        pd_len: u8,
    },
    SendApr {
        side: Side,
        cep: u8,
    },
    Migrate {
        side: Side,
        cep: u8,
    },
    SidrRequest {
        side: Side,
        cep: u8,
        service: u8,
        packet_life_time: u8,
        timeout: u8,
        retries: u8,
        pd_len: u8,
    },
    SidrReply {
        side: Side,
        cep: u8,
        status: u8,
        qpn: u32,
        qkey: u32,
        info_len: u8,
        pd_len: u8,
    },
    ConnectPeer {
        side: Side,
        cep: u8,
        service: u8,
        qpn: u16,
        packet_life_time: u8,
        timeout: u8,
        pd_len: u8,
    },
    RemovePort {
        side: Side,
        port: u8,
    },
    /// The port's link leaves Active (the engine's link.rs), in bounded batches.
    PortDown {
        side: Side,
        port: u8,
    },
    /// The port is Active again.
    PortUp {
        side: Side,
        port: u8,
    },
    /// A ClassPortInfo Get (or an unsolicited GetResp) to `side`.
    ClassPortInfo {
        side: Side,
        tid: u64,
        get: bool,
    },
    /// Both sides `connect_peer` to each other for one service on fresh CEPs, and
    /// (maybe) everything is delivered: a shortcut to crossing REQs.
    PeerConnect {
        service: u8,
        qpn_a: u16,
        qpn_b: u16,
        deliver: bool,
    },
    /// A SIDR_REQ from `requester` on a fresh CEP to the other side (given a listen on
    /// the service, if it has none yet), delivered: a shortcut to SIDR_REQ_RCVD.
    SidrExchange {
        requester: Side,
        service: u8,
    },
}

/// An input: these fields, then operations (each after a `true` byte, as `arbitrary`
/// lays out a trailing `Vec<Op>`), parsed one at a time and at most [`MAX_OPS`] of them.
#[derive(Arbitrary, Debug)]
struct Header {
    exponential_backoff: bool,
    deadline_us: Option<u16>,
    max_ceps: u8,
}

/// Operations run per input (`IBCM_FUZZ_MAX_OPS` overrides it); the rest of a longer
/// input is ignored. An operation costs about 10 us under ASan and compare tracing, so a
/// full-length input (4 KB, up to 512 operations before the cap) ran at about 600
/// execs/s; 32 keeps every input within a few hundred microseconds. Depth comes from the
/// corpus, not from long inputs: libFuzzer keeps the short sequences that reach a state
/// and mutates from them, and a connection through REQ, REP, RTU, LAP, APR, DREQ, DREP
/// and timewait takes about a dozen operations.
const MAX_OPS: usize = 32;

fn max_ops() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("IBCM_FUZZ_MAX_OPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MAX_OPS)
    })
}

const PD: [u8; 256] = [0x5a; 256];
/// Every this many steps, `check` reads every held CEP in full.
const FULL_CHECK: usize = 32;

fn pd(len: u8) -> &'static [u8] {
    &PD[..usize::from(len)]
}

fn address_of(side: Side) -> MadAddress {
    let lid: u16 = match side {
        Side::A => 1,
        Side::B => 2,
    };
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

struct Node {
    m: CmManager,
    /// CEPs the user holds (created or reported by ReqReceived, not destroyed).
    held: Vec<CepId>,
    /// How many CEPs were ever created here.
    created: usize,
    /// Request-created CEPs not taken yet, and their listen.
    untaken: Vec<(CepId, CepId)>,
    /// The newest request-created CEP.
    last_request: Option<CepId>,
    /// Events of each CEP's current connection (since its ReqReceived or `connect`).
    lifetime: HashMap<CepId, Vec<Event>>,
    /// LAPs each CEP sent in its current connection.
    laps: HashMap<CepId, usize>,
    /// CEPs an operation named or an event reported since the last `check`.
    touched: Vec<CepId>,
}

impl Node {
    fn new(m: CmManager) -> Self {
        Self {
            m,
            held: Vec::new(),
            created: 0,
            untaken: Vec::new(),
            last_request: None,
            lifetime: HashMap::new(),
            laps: HashMap::new(),
            touched: Vec::new(),
        }
    }
}

/// One connection's events make sense: nothing after TimewaitExit or DeviceRemoval, only
/// TimewaitExit (or DeviceRemoval) after Rejected or Timeout, and at most one of each
/// kind (Rejected and Timeout together count as one) -- but path migration may repeat:
/// LapReceived any number of times, MraReceived once more per LAP this side sent (`laps`),
/// and one AprReceived or Timeout{Lap} per LAP sent, which end nothing.
fn check_lifetime(side: Side, past: &[Event], e: &Event, laps: usize) {
    let lap_timeout = |x: &Event| {
        matches!(
            x,
            Event::Timeout {
                message: AttributeId::Lap
            }
        )
    };
    let ending =
        |x: &Event| matches!(x, Event::Rejected { .. } | Event::Timeout { .. }) && !lap_timeout(x);
    assert!(
        !past
            .iter()
            .any(|x| matches!(x, Event::TimewaitExit | Event::DeviceRemoval)),
        "{side:?}: {e:?} after TimewaitExit or DeviceRemoval: {past:?}"
    );
    if past.iter().any(ending) {
        assert!(
            matches!(e, Event::TimewaitExit | Event::DeviceRemoval),
            "{side:?}: {e:?} after the connection ended: {past:?}"
        );
    }
    let count = |pred: &dyn Fn(&Event) -> bool| past.iter().filter(|x| pred(x)).count();
    match e {
        Event::LapReceived { .. } => {}
        Event::MraReceived { .. } => assert!(
            count(&|x| matches!(x, Event::MraReceived { .. })) < 1 + laps,
            "{side:?}: {e:?} beyond one per REQ/REP and one per LAP ({laps}): {past:?}"
        ),
        _ if matches!(e, Event::AprReceived { .. }) || lap_timeout(e) => assert!(
            count(&|x| matches!(x, Event::AprReceived { .. }) || lap_timeout(x)) < laps,
            "{side:?}: {e:?} beyond one per LAP sent ({laps}): {past:?}"
        ),
        _ => {
            let same = |x: &Event| {
                core::mem::discriminant(x) == core::mem::discriminant(e) && !lap_timeout(x)
            };
            assert!(
                !past.iter().any(same),
                "{side:?}: a second {e:?} in one connection: {past:?}"
            );
        }
    }
}

struct World {
    nodes: [Node; 2],
    now: Instant,
    /// MADs in flight: destination and bytes.
    link: VecDeque<(Side, [u8; MAD_SIZE])>,
    /// Real MADs seen on the link, for replays.
    seen: Vec<[u8; MAD_SIZE]>,
}

impl World {
    fn node(&mut self, side: Side) -> &mut Node {
        &mut self.nodes[side.index()]
    }

    /// A seen MAD aimed at one of `side`'s CEPs (its comm ID as the RemoteCommID, data
    /// offset 4 of every CM message but the REQ), then mangled at `offset`; the CEP too.
    fn aimed(
        &mut self,
        side: Side,
        which: u8,
        cep: u8,
        offset: u8,
        xor: u8,
    ) -> Option<(CepId, [u8; MAD_SIZE])> {
        if self.seen.is_empty() {
            return None;
        }
        let cep = self.pick(side, cep)?;
        let mut mad = self.seen[usize::from(which) % self.seen.len()];
        let id = self.nodes[side.index()].m.local_comm_id(cep);
        mad[28..32].copy_from_slice(&id.to_be_bytes());
        mad[usize::from(offset)] ^= xor;
        Some((cep, mad))
    }

    fn pick(&mut self, side: Side, cep: u8) -> Option<CepId> {
        let node = &mut self.nodes[side.index()];
        let held = &node.held;
        let cep = (!held.is_empty()).then(|| held[usize::from(cep) % held.len()])?;
        node.touched.push(cep);
        Some(cep)
    }

    /// Drains a node's output: MADs onto the link, events checked.
    fn drain(&mut self, side: Side) {
        while let Some(t) = self.node(side).m.poll_transmit() {
            assert!(
                CmMad::parse(&t.mad).is_ok(),
                "{side:?} sent a MAD that does not parse"
            );
            if self.seen.len() < 64 {
                self.seen.push(t.mad);
            } else {
                let i = (self.now.as_nanos() as usize ^ self.link.len()) % 64;
                self.seen[i] = t.mad;
            }
            self.link.push_back((side.peer(), t.mad));
        }
        while let Some((cep, event)) = self.node(side).m.poll_event() {
            let node = self.node(side);
            node.touched.push(cep);
            if let Event::SidrReqReceived(info) = event {
                assert!(
                    !node.held.contains(&cep),
                    "{side:?}: SidrReqReceived on a held CEP"
                );
                assert!(
                    node.held.contains(&info.listen),
                    "{side:?}: SidrReqReceived names a listen not held"
                );
                node.held.push(cep);
                node.untaken.push((cep, info.listen));
                node.created += 1;
                node.lifetime.insert(cep, vec![event]);
                node.laps.remove(&cep);
            } else if let Event::ReqReceived(info) = event
                && info.listen != cep
            {
                assert!(
                    !node.held.contains(&cep),
                    "{side:?}: ReqReceived on a held CEP"
                );
                assert!(
                    node.held.contains(&info.listen),
                    "{side:?}: ReqReceived names a listen not held"
                );
                node.held.push(cep);
                node.untaken.push((cep, info.listen));
                node.last_request = Some(cep);
                node.created += 1;
                node.lifetime.insert(cep, vec![event]);
                node.laps.remove(&cep);
            } else {
                // (A peer-to-peer CEP's ReqReceived names itself as the listen.)
                assert!(
                    node.held.contains(&cep),
                    "{side:?}: {event:?} on a CEP not held"
                );
                let laps = node.laps.get(&cep).copied().unwrap_or(0);
                let past = node.lifetime.entry(cep).or_default();
                check_lifetime(side, past, &event, laps);
                past.push(event);
            }
        }
    }

    fn drain_all(&mut self) {
        self.drain(Side::A);
        self.drain(Side::B);
    }

    /// The invariants of every step. Every CEP an operation named or an event reported
    /// since the last check is read in full (`state`, `query`, its QP attributes), and so
    /// is every held CEP on every [`FULL_CHECK`]th step and at the end of the sequence: a
    /// CEP changes only through an operation on it or a MAD or timer that reports an
    /// event on it, and reading every CEP on every step made the checks cost more than
    /// the steps.
    fn check(&mut self, full: bool) {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let m = &node.m;
            // The engine's own CEPs for REQs it never reported (held behind a backlog)
            // are live without the sequence having seen them.
            let live = m.live_ceps();
            let unreported = m.unreported_requests();
            assert!(
                live <= node.created + unreported,
                "node {i}: {live} live > {} created + {unreported} unreported",
                node.created
            );
            assert!(live >= node.held.len(), "node {i}: a held CEP vanished");
            let full_check = |cep: CepId| {
                let state = m.state(cep).expect("held CEP unknown");
                assert_eq!(m.query(cep).expect("query").state, state);
                for qp in [QpState::Init, QpState::Rtr, QpState::Rts] {
                    let _ = m.qp_attributes(cep, qp);
                }
            };
            if full {
                node.held.iter().copied().for_each(full_check);
            } else {
                node.touched.sort_unstable();
                node.touched.dedup();
                node.touched
                    .iter()
                    .copied()
                    .filter(|c| node.held.contains(c))
                    .for_each(full_check);
            }
            node.touched.clear();
            assert!(
                m.peer_map_entries() <= 2 * live,
                "node {i}: {} peer entries for {live} CEPs",
                m.peer_map_entries()
            );
            assert!(
                m.alternate_paths() <= 2 * live,
                "node {i}: {} alternate paths for {live} CEPs",
                m.alternate_paths()
            );
            assert_eq!(m.poll_timeout().is_none(), m.timer_entries() == 0);
            let _ = m.counters();
        }
    }

    /// The timer fires: passes of at most `TIMER_BATCH` timers, the output drained after
    /// each, until no deadline is due (the call order `handle_timeout` documents). Every
    /// pass handles a full batch or ends the due ones, so the passes are bounded by the
    /// timers armed.
    fn timeout(&mut self) {
        let now = self.now;
        for side in [Side::A, Side::B] {
            let bound = self.node(side).m.timer_entries() / ibcm_cep::TIMER_BATCH + 1;
            let mut passes = 0;
            loop {
                self.node(side).m.handle_timeout(now);
                self.drain(side);
                passes += 1;
                if self.node(side).m.poll_timeout().is_none_or(|t| t > now) {
                    break;
                }
                assert!(
                    passes <= bound,
                    "{side:?}: deadlines at or before now survive {passes} timer passes"
                );
            }
        }
    }

    fn deliver(&mut self, to: Side, mad: &[u8]) {
        let now = self.now;
        let src = address_of(to.peer());
        self.node(to).m.handle_mad(now, &src, mad);
        self.drain_all();
    }

    /// A user operation that succeeded left the CEP in one of `states`.
    fn after(&self, side: Side, cep: CepId, ok: bool, states: &[StateName]) {
        if ok {
            let state = self.nodes[side.index()].m.state(cep);
            assert!(
                state.is_ok_and(|s| states.contains(&s)),
                "{side:?}: {state:?} after an operation, expected one of {states:?}"
            );
        }
    }

    fn deliver_all(&mut self) {
        // Bounded: an exchange of answers could in principle never settle.
        for _ in 0..10_000 {
            let Some((to, mad)) = self.link.pop_front() else {
                return;
            };
            self.deliver(to, &mad);
        }
    }

    fn destroy(&mut self, side: Side, cep: CepId) {
        let now = self.now;
        let node = self.node(side);
        // Destroying a listen refuses the requests nobody took: those handles end too.
        let orphans: Vec<CepId> = if node.m.state(cep) == Ok(StateName::Listen) {
            node.untaken
                .iter()
                .filter(|&&(req, listen)| {
                    listen == cep
                        && matches!(
                            node.m.state(req),
                            Ok(StateName::ReqRcvd
                                | StateName::MraReqSent
                                | StateName::RepPrepared
                                | StateName::SidrReqRcvd)
                        )
                })
                .map(|&(req, _)| req)
                .collect()
        } else {
            Vec::new()
        };
        assert!(
            node.m.destroy(now, cep).is_ok(),
            "destroy of a held CEP fails"
        );
        assert!(node.m.state(cep).is_err(), "destroyed CEP still known");
        for &orphan in &orphans {
            assert!(
                node.m.state(orphan).is_err(),
                "untaken request outlives its listen"
            );
        }
        node.held.retain(|c| *c != cep && !orphans.contains(c));
        node.untaken
            .retain(|&(req, _)| req != cep && !orphans.contains(&req));
    }

    fn apply(&mut self, op: Op) {
        let now = self.now;
        match op {
            Op::Create { side } => {
                let node = self.node(side);
                if let Ok(cep) = node.m.create() {
                    node.held.push(cep);
                    node.created += 1;
                }
            }
            Op::Listen {
                side,
                cep,
                service,
                wide_mask,
                port,
                compare,
                backlog,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let params = ListenParams {
                    service_id: 0x1000 + u64::from(service % 4),
                    service_mask: if wide_mask { !3 } else { u64::MAX },
                    port: port.map(|p| p % 3),
                    compare: compare
                        .map(|(off, len)| (off % 100, vec![0x5a; usize::from(len % 8)])),
                    backlog: u32::from(backlog % 8),
                };
                let ok = self.node(side).m.listen(cep, params).is_ok();
                self.after(side, cep, ok, &[StateName::Listen]);
                if ok {
                    // A listen's events (DeviceRemoval) are not its last connection's.
                    self.node(side).lifetime.insert(cep, Vec::new());
                }
            }
            Op::Connect {
                side,
                cep,
                service,
                qpn,
                packet_life_time,
                remote_timeout,
                local_timeout,
                retries,
                resources,
                alternate,
                pd_len,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let mut p = Pair::connect_params(0x1000 + u64::from(service % 4), qpn.into());
                if side == Side::B {
                    p.primary_path = Pair::path(ibcm_cep::pair::Side::B);
                }
                p.primary_path.packet_life_time = packet_life_time % 34;
                p.remote_cm_response_timeout = remote_timeout % 34;
                p.local_cm_response_timeout = local_timeout % 34;
                p.max_cm_retries = retries % 17;
                p.responder_resources = resources % 18;
                p.initiator_depth = resources.rotate_left(4) % 18;
                p.alternate_path = alternate.then_some(p.primary_path);
                p.private_data = pd(pd_len % 100);
                let ok = self.node(side).m.connect(now, cep, &p).is_ok();
                self.after(side, cep, ok, &[StateName::ReqSent]);
                if ok {
                    self.node(side).lifetime.insert(cep, Vec::new());
                    self.node(side).laps.remove(&cep);
                }
            }
            Op::Accept {
                side,
                cep,
                qpn,
                initiator_depth,
                pd_len,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let mut p = Pair::rep_params(qpn.into());
                p.initiator_depth = initiator_depth % 6;
                p.private_data = pd(pd_len % 200);
                let ok = self.node(side).m.accept(now, cep, &p).is_ok();
                self.after(side, cep, ok, &[StateName::RepSent]);
            }
            Op::PrepareRep { side, cep, qpn } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let p = Pair::rep_params(qpn.into());
                let ok = self.node(side).m.prepare_rep(cep, &p).is_ok();
                self.after(side, cep, ok, &[StateName::RepPrepared]);
            }
            Op::SendRep { side, cep } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let ok = self.node(side).m.send_rep(now, cep).is_ok();
                self.after(side, cep, ok, &[StateName::RepSent]);
            }
            Op::Reject {
                side,
                cep,
                reason,
                ari_len,
                pd_len,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let p = RejectParams {
                    reason: RejReason::from(reason % 40),
                    ari: pd(ari_len % 80),
                    private_data: pd(pd_len % 160),
                };
                let ok = self.node(side).m.reject(now, cep, &p).is_ok();
                self.after(side, cep, ok, &[StateName::Idle, StateName::Timewait]);
            }
            Op::Mra {
                side,
                cep,
                timeout,
                pd_len,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let ok = self
                    .node(side)
                    .m
                    .mra(cep, timeout % 34, pd(pd_len % 230))
                    .is_ok();
                // An MRA for a LAP leaves the connection established.
                let states = [
                    StateName::MraReqSent,
                    StateName::RepPrepared,
                    StateName::MraRepSent,
                    StateName::Established,
                ];
                self.after(side, cep, ok, &states);
            }
            Op::Rtu { side, cep, pd_len } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let ok = self.node(side).m.rtu(cep, pd(pd_len % 230)).is_ok();
                self.after(side, cep, ok, &[StateName::Established]);
            }
            Op::Disconnect { side, cep, pd_len } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let ok = self
                    .node(side)
                    .m
                    .disconnect(now, cep, pd(pd_len % 230))
                    .is_ok();
                self.after(side, cep, ok, &[StateName::DreqSent]);
            }
            Op::Drep { side, cep, pd_len } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let ok = self.node(side).m.drep(now, cep, pd(pd_len % 230)).is_ok();
                self.after(side, cep, ok, &[StateName::Timewait]);
            }
            Op::Destroy { side, cep } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                self.destroy(side, cep);
            }
            Op::Established { side, cep } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let ok = self.node(side).m.established(cep).is_ok();
                self.after(side, cep, ok, &[StateName::Established]);
            }
            Op::TakeRequest { side, cep } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let node = self.node(side);
                if node.m.take_request(cep).is_ok() {
                    node.untaken.retain(|&(req, _)| req != cep);
                }
            }
            Op::QpAttributes { side, cep, state } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let qp = [QpState::Init, QpState::Rtr, QpState::Rts][usize::from(state % 3)];
                let _ = self.node(side).m.qp_attributes(cep, qp);
            }
            Op::AdvanceTime { ns, shift } => {
                self.now = self.now.add_nanos(u64::from(ns) << (shift % 24));
                self.timeout();
            }
            Op::AdvanceToTimer => {
                let next = [
                    self.nodes[0].m.poll_timeout(),
                    self.nodes[1].m.poll_timeout(),
                ]
                .into_iter()
                .flatten()
                .min();
                if let Some(t) = next
                    && t > self.now
                {
                    self.now = t;
                }
                self.timeout();
            }
            Op::Handshake {
                active,
                service,
                qpn,
            } => {
                let passive = active.peer();
                let service_id = 0x1000 + u64::from(service % 4);
                if let Ok(listen) = self.node(passive).m.create() {
                    let node = self.node(passive);
                    node.held.push(listen);
                    node.created += 1;
                    if node
                        .m
                        .listen(listen, Pair::listen_params(service_id, 4))
                        .is_err()
                    {
                        self.destroy(passive, listen);
                    }
                }
                let Ok(cep) = self.node(active).m.create() else {
                    return;
                };
                let node = self.node(active);
                node.held.push(cep);
                node.created += 1;
                let mut p = Pair::connect_params(service_id, qpn.into());
                if active == Side::B {
                    p.primary_path = Pair::path(ibcm_cep::pair::Side::B);
                }
                if node.m.connect(now, cep, &p).is_err() {
                    return;
                }
                node.lifetime.insert(cep, Vec::new());
                self.node(passive).last_request = None;
                self.drain_all();
                self.deliver_all();
                let Some(req) = self.node(passive).last_request else {
                    return;
                };
                let node = self.node(passive);
                if node.m.take_request(req).is_ok() {
                    node.untaken.retain(|&(r, _)| r != req);
                }
                let rep = Pair::rep_params(u32::from(qpn) + 1);
                if node.m.accept(now, req, &rep).is_err() {
                    return;
                }
                self.drain_all();
                self.deliver_all();
                let _ = self.node(active).m.rtu(cep, b"rtu");
                self.drain_all();
                self.deliver_all();
            }
            Op::DeliverAll => self.deliver_all(),
            Op::DeliverOne => {
                if let Some((to, mad)) = self.link.pop_front() {
                    self.deliver(to, &mad);
                }
            }
            Op::DropNext => {
                self.link.pop_front();
            }
            Op::DupNext => {
                if let Some(&front) = self.link.front() {
                    self.link.push_front(front);
                }
            }
            Op::ReorderNext => {
                if let Some(front) = self.link.pop_front() {
                    self.link.push_back(front);
                }
            }
            Op::MutateNext { offset, xor } => {
                if let Some((_, mad)) = self.link.front_mut() {
                    mad[usize::from(offset)] ^= xor;
                }
            }
            Op::InjectMad { side, bytes } => self.deliver(side, &bytes),
            Op::Replay {
                side,
                which,
                offset,
                xor,
            } => {
                if self.seen.is_empty() {
                    return;
                }
                let mut mad = self.seen[usize::from(which) % self.seen.len()];
                mad[usize::from(offset)] ^= xor;
                self.deliver(side, &mad);
            }
            Op::Aim {
                side,
                which,
                cep,
                offset,
                xor,
            } => {
                let Some((_, mad)) = self.aimed(side, which, cep, offset, xor) else {
                    return;
                };
                self.deliver(side, &mad);
            }
            Op::AimFromStranger {
                side,
                which,
                cep,
                offset,
                xor,
            } => {
                let Some((cep, mad)) = self.aimed(side, which, cep, offset, xor) else {
                    return;
                };
                // The attribute the MAD carries once mangled (the XOR may hit it).
                let attribute = u16::from_be_bytes([mad[16], mad[17]]);
                let before = self.nodes[side.index()].m.state(cep);
                let mut stranger = address_of(side.peer());
                stranger.lid = 3;
                stranger.gid[15] = 3;
                let now = self.now;
                let m = &mut self.node(side).m;
                m.handle_mad(now, &stranger, &mad);
                // A REQ and a SIDR_REQ name no CEP by comm ID (a listen answers anyone);
                // ClassPortInfo is answered to anyone.
                if !matches!(attribute, 0x0001 | 0x0010 | 0x0017) {
                    assert_eq!(m.state(cep), before, "a stranger's MAD changed a CEP");
                    assert!(m.poll_event().is_none(), "a stranger's MAD made an event");
                    let answer = m.poll_transmit();
                    if attribute == 0x0015 {
                        // A DREQ naming no connection of its sender's gets an
                        // unaffiliated DREP, back to that sender (IBA 12.9.8.5): that is
                        // all.
                        assert!(
                            answer.as_ref().is_none_or(|t| t.dest.lid == stranger.lid
                                && t.mad[16..18] == 0x0016u16.to_be_bytes()),
                            "a stranger's DREQ was answered with more than a DREP to it"
                        );
                        assert!(m.poll_transmit().is_none(), "a stranger's MAD was answered");
                    } else {
                        assert!(answer.is_none(), "a stranger's MAD was answered");
                    }
                }
            }
            op => self.apply_more(op),
        }
        self.drain_all();
    }

    /// The operations of path migration, SIDR, peer-to-peer, port removal and
    /// ClassPortInfo.
    fn apply_more(&mut self, op: Op) {
        let now = self.now;
        let path_of = |side: Side| {
            Pair::path(match side {
                Side::A => ibcm_cep::pair::Side::A,
                Side::B => ibcm_cep::pair::Side::B,
            })
        };
        match op {
            Op::Lap {
                side,
                cep,
                lid,
                packet_life_time,
                sl,
                pd_len,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let mut path = path_of(side);
                path.slid = path.slid.wrapping_add(u16::from(lid % 4) * 16);
                path.dlid = path.dlid.wrapping_add(u16::from(lid / 64) * 16);
                path.packet_life_time = packet_life_time % 34;
                path.sl = sl % 17;
                let ok = self
                    .node(side)
                    .m
                    .lap(now, cep, &path, pd(pd_len % 180))
                    .is_ok();
                self.after(side, cep, ok, &[StateName::Established]);
                if ok {
                    *self.node(side).laps.entry(cep).or_default() += 1;
                }
            }
            Op::PrepareApr {
                side,
                cep,
                status,
                info_len,
                pd_len,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let status = AprStatus::from(status % 16);
                let got =
                    self.node(side)
                        .m
                        .prepare_apr(cep, status, pd(info_len % 80), pd(pd_len % 160));
                let ok = got.is_ok();
                match (status == AprStatus::Success, got) {
                    (_, Err(_)) | (false, Ok(None)) => {}
                    (true, Ok(Some(rts))) => assert_eq!(rts.state, QpState::Rts),
                    (success, other) => panic!("pre-APR {status:?} ({success}) gave {other:?}"),
                }
                self.after(side, cep, ok, &[StateName::Established]);
            }
            Op::SendApr { side, cep } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let ok = self.node(side).m.send_apr(cep).is_ok();
                self.after(side, cep, ok, &[StateName::Established]);
            }
            Op::Migrate { side, cep } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let before = self.node(side).m.query(cep);
                let ok = self.node(side).m.migrate(cep).is_ok();
                self.after(side, cep, ok, &[StateName::Established]);
                if ok {
                    let (before, after) = (before.expect("query"), self.node(side).m.query(cep));
                    let after = after.expect("query");
                    assert_eq!(Some(after.primary_path), before.alternate_path);
                    assert_eq!(after.alternate_path, Some(before.primary_path));
                }
            }
            Op::SidrRequest {
                side,
                cep,
                service,
                packet_life_time,
                timeout,
                retries,
                pd_len,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let mut path = path_of(side);
                path.packet_life_time = packet_life_time % 34;
                let p = SidrParams {
                    service_id: 0x1000 + u64::from(service % 4),
                    port: 1,
                    pkey: 0xffff,
                    path,
                    timeout: timeout % 34,
                    max_retries: retries % 17,
                    private_data: pd(pd_len % 230),
                };
                let ok = self.node(side).m.sidr_request(now, cep, &p).is_ok();
                self.after(side, cep, ok, &[StateName::SidrReqSent]);
                if ok {
                    self.node(side).lifetime.insert(cep, Vec::new());
                    self.node(side).laps.remove(&cep);
                }
            }
            Op::SidrReply {
                side,
                cep,
                status,
                qpn,
                qkey,
                info_len,
                pd_len,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let p = SidrReplyParams {
                    status: SidrStatus::from(status % 8),
                    qpn: if qpn & 1 == 0 { qpn & 0xff_ffff } else { qpn },
                    qkey,
                    info: pd(info_len % 80),
                    private_data: pd(pd_len % 140),
                };
                let ok = self.node(side).m.sidr_reply(now, cep, &p).is_ok();
                self.after(side, cep, ok, &[StateName::SidrRepSent]);
                if ok {
                    self.node(side).untaken.retain(|&(req, _)| req != cep);
                }
            }
            Op::ConnectPeer {
                side,
                cep,
                service,
                qpn,
                packet_life_time,
                timeout,
                pd_len,
            } => {
                let Some(cep) = self.pick(side, cep) else {
                    return;
                };
                let mut p = Pair::connect_params(0x1000 + u64::from(service % 4), qpn.into());
                p.primary_path = path_of(side);
                p.primary_path.packet_life_time = packet_life_time % 34;
                p.remote_cm_response_timeout = timeout % 34;
                p.local_cm_response_timeout = timeout.rotate_left(4) % 34;
                p.private_data = pd(pd_len % 100);
                let ok = self.node(side).m.connect_peer(now, cep, &p).is_ok();
                self.after(side, cep, ok, &[StateName::ReqSent]);
                if ok {
                    self.node(side).lifetime.insert(cep, Vec::new());
                    self.node(side).laps.remove(&cep);
                }
            }
            Op::RemovePort { side, port } => {
                let port = port % 3;
                let node = &self.nodes[side.index()];
                let bound: Vec<(CepId, usize)> = node
                    .held
                    .iter()
                    .copied()
                    .filter(|&c| {
                        node.m.query(c).is_ok_and(|q| {
                            q.port == port
                                && !matches!(
                                    q.state,
                                    StateName::Idle | StateName::Listen | StateName::Removed
                                )
                        })
                    })
                    .map(|c| (c, node.lifetime.get(&c).map_or(0, Vec::len)))
                    .collect();
                let others: Vec<(CepId, StateName)> = node
                    .held
                    .iter()
                    .copied()
                    .filter(|c| !bound.iter().any(|(b, _)| b == c))
                    .filter_map(|c| Some((c, node.m.state(c).ok()?)))
                    .collect();
                let link = self.link.len();
                self.node(side).m.remove_port(port);
                self.drain_all();
                assert_eq!(self.link.len(), link, "{side:?}: remove_port sent a MAD");
                let node = &self.nodes[side.index()];
                for (c, before) in bound {
                    assert_eq!(node.m.state(c), Ok(StateName::Removed));
                    let life = &node.lifetime[&c];
                    assert_eq!(life.len(), before + 1, "{side:?}: {life:?}");
                    assert!(matches!(life.last(), Some(Event::DeviceRemoval)));
                }
                for (c, state) in others {
                    let now_state = node.m.state(c).expect("held CEP unknown");
                    // Only a listen bound to the port may change (to Removed).
                    assert!(
                        now_state == state
                            || (state == StateName::Listen && now_state == StateName::Removed),
                        "{side:?}: {state:?} -> {now_state:?} on removal of another CEP's port"
                    );
                }
            }
            Op::PortDown { side, port } => {
                let port = port % 3;
                let node = &self.nodes[side.index()];
                let before: Vec<(CepId, StateName, usize)> = node
                    .held
                    .iter()
                    .copied()
                    .filter_map(|c| {
                        let q = node.m.query(c).ok()?;
                        Some((c, q.state, node.lifetime.get(&c).map_or(0, Vec::len)))
                    })
                    .collect();
                let link = self.link.len();
                let mut from = Some(0);
                while let Some(at) = from {
                    let now = self.now;
                    from = self.node(side).m.port_down(now, port, at);
                    self.drain_all();
                }
                assert_eq!(self.link.len(), link, "{side:?}: port_down sent a MAD");
                let node = &self.nodes[side.index()];
                for (c, state, events) in before {
                    let life = node.lifetime.get(&c).map_or(0, Vec::len);
                    let now_state = node.m.state(c).expect("held CEP unknown");
                    assert_eq!(life, events, "{side:?}: {state:?} told at once");
                    assert_eq!(now_state, state, "{side:?}: {state:?} changed at once");
                }
            }
            Op::PortUp { side, port } => self.node(side).m.port_up(port % 3),
            Op::ClassPortInfo { side, tid, get } => {
                let header = MadHeader {
                    method: if get { Method::Get } else { Method::GetResp },
                    ..MadHeader::send(tid)
                };
                let mut mad = [0u8; MAD_SIZE];
                let cpi = CmMessage::ClassPortInfo(ClassPortInfo::default());
                if (CmMad {
                    header,
                    message: cpi,
                })
                .emit(&mut mad)
                .is_err()
                {
                    return;
                }
                let slot = counter_slot(AttributeId::ClassPortInfo).expect("counted");
                let sent = self.nodes[side.index()].m.counters().sent[slot];
                let link = self.link.len();
                self.deliver(side, &mad);
                let after = self.nodes[side.index()].m.counters().sent[slot];
                // A port that is down takes nothing in (link.rs).
                let down = self.nodes[side.index()]
                    .m
                    .is_port_down(address_of(side.peer()).port);
                if down {
                    assert_eq!((after, self.link.len()), (sent, link));
                } else if get {
                    assert_eq!((after, self.link.len()), (sent + 1, link + 1));
                    let (_, resp) = self.link.back().expect("the GetResp");
                    let resp = CmMad::parse(resp).expect("parses");
                    assert_eq!(resp.header.method, Method::GetResp);
                    assert_eq!(resp.header.transaction_id, tid);
                    let CmMessage::ClassPortInfo(cpi) = resp.message else {
                        panic!("{:?}", resp.message)
                    };
                    assert_eq!((cpi.base_version, cpi.class_version), (1, 2));
                } else {
                    assert_eq!((after, self.link.len()), (sent, link));
                }
            }
            Op::PeerConnect {
                service,
                qpn_a,
                qpn_b,
                deliver,
            } => {
                let service_id = 0x1000 + u64::from(service % 4);
                for (side, qpn) in [(Side::A, qpn_a), (Side::B, qpn_b)] {
                    let node = self.node(side);
                    let Ok(cep) = node.m.create() else {
                        continue;
                    };
                    node.held.push(cep);
                    node.created += 1;
                    let mut p = Pair::connect_params(service_id, qpn.into());
                    p.primary_path = path_of(side);
                    if node.m.connect_peer(now, cep, &p).is_ok() {
                        node.lifetime.insert(cep, Vec::new());
                        node.laps.remove(&cep);
                    }
                }
                self.drain_all();
                if deliver {
                    self.deliver_all();
                }
            }
            Op::SidrExchange { requester, service } => {
                let responder = requester.peer();
                let service_id = 0x1000 + u64::from(service % 4);
                if let Ok(listen) = self.node(responder).m.create() {
                    let node = self.node(responder);
                    node.held.push(listen);
                    node.created += 1;
                    if node
                        .m
                        .listen(listen, Pair::listen_params(service_id, 4))
                        .is_err()
                    {
                        self.destroy(responder, listen);
                    }
                }
                let node = self.node(requester);
                let Ok(cep) = node.m.create() else {
                    return;
                };
                node.held.push(cep);
                node.created += 1;
                let p = SidrParams {
                    service_id,
                    port: 1,
                    pkey: 0xffff,
                    path: path_of(requester),
                    timeout: 16,
                    max_retries: 3,
                    private_data: b"sidr",
                };
                if node.m.sidr_request(now, cep, &p).is_ok() {
                    node.lifetime.insert(cep, Vec::new());
                    node.laps.remove(&cep);
                }
                self.drain_all();
                self.deliver_all();
            }
            _ => unreachable!("handled by apply"),
        }
    }

    /// Destroys everything and runs the link and the timers dry.
    fn finish(&mut self) {
        // A connection told while its port was down keeps its timewait until the port is
        // back (it owes its peer a DREQ: link.rs): the ports come back first.
        for side in [Side::A, Side::B] {
            for port in 0..3 {
                self.node(side).m.port_up(port);
            }
        }
        for side in [Side::A, Side::B] {
            while let Some(&cep) = self.node(side).held.last() {
                self.destroy(side, cep);
                self.drain_all();
            }
        }
        for _ in 0..100_000 {
            if let Some((to, mad)) = self.link.pop_front() {
                self.deliver(to, &mad);
                continue;
            }
            let next = [
                self.nodes[0].m.poll_timeout(),
                self.nodes[1].m.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(t) = next else { break };
            if t > self.now {
                self.now = t;
            }
            self.timeout();
        }
        assert!(self.link.is_empty(), "the link never ran dry");
        for (i, node) in self.nodes.iter().enumerate() {
            let m = &node.m;
            assert_eq!(
                (
                    m.live_ceps(),
                    m.peer_map_entries(),
                    m.timer_entries(),
                    m.alternate_paths()
                ),
                (0, 0, 0, 0),
                "node {i} not empty after teardown"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = arbitrary::Unstructured::new(data);
    let Ok(input) = Header::arbitrary(&mut u) else {
        return;
    };
    let mut config = [
        CmConfig::new(GUID_A, [1; 32]),
        CmConfig::new(GUID_B, [2; 32]),
    ];
    for c in &mut config {
        c.max_ceps = u32::from(input.max_ceps % 64) + 1;
        c.exponential_backoff = input.exponential_backoff;
        c.request_deadline_ns = input.deadline_us.map(|us| u64::from(us) * 1000);
    }
    let [a, b] = config;
    let mut world = World {
        nodes: [Node::new(CmManager::new(a)), Node::new(CmManager::new(b))],
        now: Instant::from_nanos(1_000_000),
        link: VecDeque::new(),
        seen: Vec::new(),
    };
    let Ok(ops) = u.arbitrary_take_rest_iter::<Op>() else {
        return;
    };
    for (i, op) in ops.map_while(Result::ok).take(max_ops()).enumerate() {
        world.apply(op);
        world.check((i + 1) % FULL_CHECK == 0);
    }
    world.check(true);
    world.finish();
});
