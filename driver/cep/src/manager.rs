//! The CEP manager: all CEPs of one CA, the lookups that route MADs to them, one timer
//! heap, and the queues of outgoing MADs and events.

use alloc::collections::{BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::Reverse;
use core::hash::BuildHasher;
use core::num::NonZeroU32;

use hashbrown::HashMap;
use ibcm_mad::{
    AttributeId, ClassPortInfo, CmMad, CmMessage, CommIds, Dreq, Failover, Gid, MAD_SIZE,
    MadHeader, MessageKind, Method, Mra, Rej, RejReason, Rep, Req, Transport,
};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use siphasher::sip::SipHasher13;

use crate::cep::{Cep, LapState, Retry, State, StateName};
use crate::config::CmConfig;
use crate::counters::Counters;
use crate::error::{CmError, check_len, check_max, check_width};
use crate::event::{Event, RepInfo, ReqInfo};
use crate::grow::{ChunkedVec, reserve_queue};
use crate::trace::{DropReason, TraceHook, TracePoint, Tracer};
use crate::types::{
    CepId, ConnectParams, Instant, ListenParams, MadAddress, PathRecord, PrivateData, RejectParams,
    RepParams, WirePath,
};
use ibcm_iba::{AddressVector, MigrationState, QpAttributes, QpState, access, ack_timeout};

mod lap;
mod peer;
mod sidr;

pub use sidr::{SidrParams, SidrReplyParams};

/// Timers one [`CmManager::handle_timeout`] handles at most, so at most this many MADs
/// and events: what the platform's send batch must hold for a timer pass.
pub const TIMER_BATCH: usize = 128;

/// One MAD to send on QP1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Local port and the remote port's address.
    pub dest: MadAddress,
    /// The 256-byte MAD.
    pub mad: [u8; MAD_SIZE],
}

/// What [`CmManager::query`] reports about a CEP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CepInfo {
    /// The state.
    pub state: StateName,
    /// This side sent the REQ.
    pub active: bool,
    /// Local port.
    pub port: u8,
    /// The peer's CA GUID (0 before it is known).
    pub remote_ca_guid: u64,
    /// The local and remote QPNs.
    pub local_qpn: u32,
    /// The peer's QPN (0 before it is known).
    pub remote_qpn: u32,
    /// The peer's read limits: its responder resources bound this side's initiator depth.
    pub peer_responder_resources: u8,
    /// The peer's initiator depth.
    pub peer_initiator_depth: u8,
    /// The primary path.
    pub primary_path: PathRecord,
    /// The alternate path.
    pub alternate_path: Option<PathRecord>,
    /// How long timewait lasts for this connection, in ns.
    pub timewait_ns: u64,
}

/// What a pre-REP hands back: the REP is formatted, and these are the QP transitions the
/// consumer performs before [`CmManager::send_rep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreparedRep {
    /// Reset -> INIT.
    pub init: QpAttributes,
    /// INIT -> RTR.
    pub rtr: QpAttributes,
    /// RTR -> RTS.
    pub rts: QpAttributes,
}

#[derive(Debug, Clone)]
struct ListenEntry {
    cep: CepId,
    params: ListenParams,
    /// CEPs created by this listen that the user has not taken yet.
    pending: u32,
}

/// `repr(C)`: the generation, checked first, shares the slot's first 64 bytes with the
/// CEP's hot fields (see [`Cep`]).
#[derive(Debug, Clone)]
#[repr(C)]
struct Slot {
    generation: u8,
    cep: Option<Cep>,
}

/// SipHash-1-3 with a key drawn from the manager's RNG: peers choose comm IDs, QPNs and
/// GUIDs, so their keys must not be predictable to them (quinn's rule for peer keys).
#[derive(Debug, Clone, Copy)]
struct KeyedHash(u64, u64);

impl BuildHasher for KeyedHash {
    type Hasher = SipHasher13;
    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.0, self.1)
    }
}

/// A peer lookup: (comm ID or QPN, CA GUID) -> CEP. Two entries per connection, the largest
/// cost per connection after the slot: the key is kept in 12 bytes, so that an entry
/// takes 16 (a `(u32, u64)` key, padded to 16, makes 24).
#[derive(Debug)]
struct PeerMap(HashMap<PeerKey, CepId, KeyedHash>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeerKey {
    id: u32,
    guid: [u32; 2],
}

impl core::hash::Hash for PeerKey {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        state.write_u32(self.id);
        state.write_u32(self.guid[0]);
        state.write_u32(self.guid[1]);
    }
}

impl PeerMap {
    fn with_hasher(hash: KeyedHash) -> Self {
        Self(HashMap::with_hasher(hash))
    }

    fn key(&(id, guid): &(u32, u64)) -> PeerKey {
        PeerKey {
            id,
            guid: [(guid >> 32) as u32, guid as u32],
        }
    }

    fn get(&self, key: &(u32, u64)) -> Option<&CepId> {
        self.0.get(&Self::key(key))
    }

    fn insert(&mut self, key: (u32, u64), id: CepId) -> Option<CepId> {
        self.0.insert(Self::key(&key), id)
    }

    fn remove(&mut self, key: &(u32, u64)) -> Option<CepId> {
        self.0.remove(&Self::key(key))
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// Entries that fit without growing (hashbrown's capacity is items + growth left).
    fn capacity(&self) -> usize {
        self.0.capacity()
    }

    fn try_reserve(&mut self, additional: usize) -> Result<(), hashbrown::TryReserveError> {
        self.0.try_reserve(additional)
    }
}

/// The CEP manager of one CA: the sans-IO core of ibcm.
///
/// It performs no I/O, reads no clock and takes no lock. Its owner drives it:
///
/// - **Getters** (`query`, `qp_attributes`, `counters`, `state`) read state.
/// - **`handle_*`** feed it input: [`handle_mad`](Self::handle_mad) for every MAD received
///   on QP1 with the CM class, [`handle_timeout`](Self::handle_timeout) when the deadline
///   last returned by [`poll_timeout`](Self::poll_timeout) has passed (a spurious call is
///   harmless).
/// - **Mutators** (`create`, `listen`, `connect`, `accept`, `reject`, `disconnect`, ...)
///   carry out the user's operations; each fails with a [`CmError`] and changes nothing,
///   or succeeds completely.
/// - **`poll_*`** pull output. After every `handle_*` call or mutator, drain
///   [`poll_transmit`](Self::poll_transmit) (send each MAD), then
///   [`poll_event`](Self::poll_event) (deliver each event to the CEP's owner), then read
///   [`poll_timeout`](Self::poll_timeout) and arm one timer to it.
///
/// Every input takes `now`, which must never go backwards. IB times convert exactly
/// (4.096 us * 2^t, integer ns).
#[derive(Debug)]
pub struct CmManager {
    config: CmConfig,
    /// The CEP slab; grows by chunks, so a CEP never moves and growing copies nothing.
    slots: ChunkedVec<Slot>,
    free: Vec<u32>,
    live: usize,
    comm_id_operand: u32,
    tid_high: u32,
    tid_next: u32,
    rng: ChaCha8Rng,
    remote_ids: PeerMap,
    remote_qpns: PeerMap,
    listens: Vec<ListenEntry>,
    /// Peer-to-peer CEPs with a REQ out (few; pruned as they move on).
    peers: Vec<CepId>,
    /// SIDR requests being answered or lately answered: (request ID, source GID, LID).
    sidr_requests: HashMap<(u32, Gid, u16), CepId, KeyedHash>,
    /// (deadline, sequence number, CEP): live while the CEP's timer is still
    /// (deadline, sequence number). 16 bytes, as `reserve` keeps two per CEP.
    timers: BinaryHeap<Reverse<(Instant, NonZeroU32, u32)>>,
    timer_seq: NonZeroU32,
    transmits: VecDeque<Transmit>,
    events: VecDeque<(CepId, Event)>,
    counters: Counters,
    trace: TraceHook,
}

/// The "additional rejection information" of a REJ(Timeout): the sender's CA GUID.
fn guid_ari(guid: u64) -> [u8; 8] {
    guid.to_be_bytes()
}

impl CmManager {
    /// A manager with no CEPs.
    pub fn new(config: CmConfig) -> Self {
        let mut rng = ChaCha8Rng::from_seed(config.rng_seed);
        let hash = KeyedHash(rng.next_u64(), rng.next_u64());
        Self {
            config,
            slots: ChunkedVec::new(),
            free: Vec::new(),
            live: 0,
            comm_id_operand: rng.next_u32(),
            tid_high: rng.next_u32(),
            tid_next: 0,
            rng,
            remote_ids: PeerMap::with_hasher(hash),
            remote_qpns: PeerMap::with_hasher(hash),
            listens: Vec::new(),
            peers: Vec::new(),
            sidr_requests: HashMap::with_hasher(hash),
            timers: BinaryHeap::new(),
            timer_seq: NonZeroU32::MIN,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
            trace: TraceHook::default(),
        }
    }

    /// Installs (or removes) the tracer that receives this manager's trace points.
    pub fn set_tracer(&mut self, tracer: Option<&'static dyn Tracer>) {
        self.trace = TraceHook::new(tracer);
    }

    #[inline]
    fn trace(&self, point: TracePoint<'_>) {
        self.trace.point(self.config.ca_guid, point);
    }

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.config
    }

    /// Message counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// CEPs alive, including detached ones still in DREQ or timewait.
    pub fn live_ceps(&self) -> usize {
        self.live
    }

    /// Entries in the peer lookup maps (remote comm ID and remote QPN).
    pub fn peer_map_entries(&self) -> usize {
        self.remote_ids.len() + self.remote_qpns.len() + self.sidr_requests.len()
    }

    /// Timer heap entries, including cancelled ones not yet popped.
    pub fn timer_entries(&self) -> usize {
        self.timers.len()
    }

    /// Preallocates room for `ceps` CEPs and their lookups, so that handling MADs for
    /// them allocates nothing. Fails (changing nothing) if memory runs out.
    pub fn reserve(&mut self, ceps: usize) -> Result<(), CmError> {
        // Room already there costs nothing: a hash map asked to reserve when it has the
        // room but also tombstones rehashes in place, O(n) per call.
        if self.room() >= ceps {
            return Ok(());
        }
        let no = |_| CmError::NoResources;
        self.slots.try_reserve(ceps).map_err(no)?;
        self.free.try_reserve(ceps).map_err(no)?;
        self.remote_ids
            .try_reserve(ceps)
            .map_err(|_| CmError::NoResources)?;
        self.remote_qpns
            .try_reserve(ceps)
            .map_err(|_| CmError::NoResources)?;
        // SIDR requests are few and short-lived: room for a burst, not for every CEP.
        self.sidr_requests
            .try_reserve(ceps.min(4096))
            .map_err(|_| CmError::NoResources)?;
        self.timers
            .try_reserve(ceps.saturating_mul(2))
            .map_err(no)?;
        // The queues are empty between entry points.
        reserve_queue(&mut self.events, ceps.min(4096)).map_err(no)?;
        reserve_queue(&mut self.transmits, ceps.min(4096)).map_err(no)?;
        Ok(())
    }

    /// How many more CEPs (and their lookups, timers, events and MADs) fit without
    /// allocating.
    pub fn room(&self) -> usize {
        let slots = self.slots.capacity() - self.slots.len() + self.free.len();
        let ids = self.remote_ids.capacity() - self.remote_ids.len();
        let qpns = self.remote_qpns.capacity() - self.remote_qpns.len();
        let sidr = match self.sidr_requests.capacity() - self.sidr_requests.len() {
            n if n >= 4096 => usize::MAX,
            n => n,
        };
        let timers = (self.timers.capacity() - self.timers.len()) / 2;
        let events = (self.events.capacity() - self.events.len()).min(4096);
        let transmits = (self.transmits.capacity() - self.transmits.len()).min(4096);
        let queues = if events >= 4096 && transmits >= 4096 {
            usize::MAX
        } else {
            events.min(transmits)
        };
        slots.min(ids).min(qpns).min(sidr).min(timers).min(queues)
    }

    // ---- getters -------------------------------------------------------------------

    fn cep(&self, id: CepId) -> Option<&Cep> {
        let slot = self.slots.get(id.index())?;
        if slot.generation != id.generation() {
            return None;
        }
        slot.cep.as_ref().filter(|c| !c.detached)
    }

    fn cep_mut(&mut self, id: CepId) -> Option<&mut Cep> {
        let slot = self.slots.get_mut(id.index())?;
        if slot.generation != id.generation() {
            return None;
        }
        slot.cep.as_mut()
    }

    fn user_cep(&self, id: CepId) -> Result<&Cep, CmError> {
        self.cep(id).ok_or(CmError::UnknownCep)
    }

    /// The state of a CEP.
    pub fn state(&self, id: CepId) -> Result<StateName, CmError> {
        Ok(self.user_cep(id)?.state.name())
    }

    /// What this side knows of the connection, including the peer's read limits.
    pub fn query(&self, id: CepId) -> Result<CepInfo, CmError> {
        let c = self.user_cep(id)?;
        Ok(CepInfo {
            state: c.state.name(),
            active: c.active,
            port: c.dest.port,
            remote_ca_guid: c.remote_ca_guid,
            local_qpn: c.local_qpn,
            remote_qpn: c.remote_qpn,
            peer_responder_resources: c.peer_responder_resources,
            peer_initiator_depth: c.peer_initiator_depth,
            primary_path: c.primary,
            alternate_path: c.alternate,
            timewait_ns: c.timewait_ns(),
        })
    }

    /// The wire LocalCommID of a CEP (for traces and tests).
    pub fn local_comm_id(&self, id: CepId) -> u32 {
        id.0 ^ self.comm_id_operand
    }

    fn id_from_wire(&self, comm_id: u32) -> CepId {
        CepId(comm_id ^ self.comm_id_operand)
    }

    /// QP attributes for a transition, from what the REQ and REP negotiated.
    pub fn qp_attributes(&self, id: CepId, state: QpState) -> Result<QpAttributes, CmError> {
        let c = self.user_cep(id)?;
        let name = c.state.name();
        let negotiated = matches!(
            c.state,
            State::RepPrepared { .. }
                | State::RepSent { .. }
                | State::RepRcvd { .. }
                | State::Established
        );
        let allowed = match state {
            QpState::Init => {
                negotiated || matches!(c.state, State::ReqSent { .. } | State::ReqRcvd { .. })
            }
            QpState::Rtr | QpState::Rts => negotiated,
        };
        if !allowed {
            return Err(CmError::InvalidState { state: name });
        }
        Ok(qp_attributes_of(c, state))
    }

    // ---- poll ----------------------------------------------------------------------

    /// The next MAD to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event, with the CEP it belongs to.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<(CepId, Event)> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _, _))| *at)
    }

    // ---- slab ----------------------------------------------------------------------

    fn alloc(&mut self) -> Result<CepId, CmError> {
        if let Some(index) = self.free.pop() {
            let operand = self.comm_id_operand;
            let slot = self
                .slots
                .get_mut(index as usize)
                .ok_or(CmError::NoResources)?;
            // A CEP whose wire comm ID would be 0 cannot be told from "none": skip it.
            if (CepId::new(index, slot.generation).0 ^ operand) == 0 {
                slot.generation = slot.generation.wrapping_add(1);
            }
            slot.cep = Some(Cep::new());
            self.live += 1;
            return Ok(CepId::new(index, slot.generation));
        }
        let index = self.slots.len();
        if index >= self.config.max_ceps.min(CepId::INDEX_MASK + 1) as usize {
            return Err(CmError::NoResources);
        }
        self.slots
            .try_reserve(1)
            .map_err(|_| CmError::NoResources)?;
        self.free.try_reserve(1).map_err(|_| CmError::NoResources)?;
        let mut generation = 0u8;
        if (CepId::new(index as u32, 0).0 ^ self.comm_id_operand) == 0 {
            generation = 1;
        }
        self.slots.push(Slot {
            generation,
            cep: Some(Cep::new()),
        });
        self.live += 1;
        Ok(CepId::new(index as u32, generation))
    }

    fn release(&mut self, id: CepId) {
        if let Some(slot) = self.slots.get_mut(id.index())
            && slot.generation == id.generation()
            && slot.cep.take().is_some()
        {
            slot.generation = slot.generation.wrapping_add(1);
            self.live = self.live.saturating_sub(1);
            // Capacity for every slot was reserved when the slot was created.
            self.free.push(id.index() as u32);
        }
    }

    fn fresh_tid(&mut self) -> u64 {
        self.tid_next = self.tid_next.wrapping_add(1);
        (u64::from(self.tid_high) << 32) | u64::from(self.tid_next)
    }

    fn random_psn(&mut self) -> u32 {
        self.rng.next_u32() & 0x00ff_ffff
    }

    // ---- timers --------------------------------------------------------------------

    fn arm(&mut self, id: CepId, at: Instant) {
        // 32 bits wrap, but an entry is matched by deadline and number both: a stale one
        // would have to outlive 2^32 arms and share the live one's deadline to the ns.
        let seq = self.timer_seq;
        self.timer_seq = seq.checked_add(1).unwrap_or(NonZeroU32::MIN);
        if let Some(c) = self.cep_mut(id) {
            c.timer = Some((at, seq));
            self.timers.push(Reverse((at, seq, id.0)));
        }
    }

    fn cancel_timer(&mut self, id: CepId) {
        if let Some(c) = self.cep_mut(id) {
            c.timer = None;
        }
        self.drop_stale_timers();
    }

    /// Pops cancelled entries off the top so `poll_timeout` reports a live deadline.
    fn drop_stale_timers(&mut self) {
        while let Some(Reverse((at, seq, raw))) = self.timers.peek().copied() {
            let live = self
                .cep_any(CepId(raw))
                .is_some_and(|c| c.timer == Some((at, seq)));
            if live {
                break;
            }
            self.timers.pop();
        }
    }

    fn cep_any(&self, id: CepId) -> Option<&Cep> {
        let slot = self.slots.get(id.index())?;
        (slot.generation == id.generation())
            .then_some(slot.cep.as_ref())
            .flatten()
    }

    fn start_retry(&mut self, id: CepId, now: Instant, base_ns: u64, retries: u8) {
        let deadline = self
            .config
            .request_deadline_ns
            .map_or(Retry::NO_DEADLINE, |d| now.add_nanos(d));
        if let Some(c) = self.cep_mut(id) {
            c.retry = Retry {
                base_ns,
                left: retries,
                done: 0,
                deadline,
            };
        }
        self.arm(id, now.add_nanos(base_ns));
    }

    /// Handles the timers whose deadline is at or before `now`, at most [`TIMER_BATCH`]
    /// of them: a timer DPC holds the lock for a bounded time and sends a bounded batch.
    /// If more are due, [`poll_timeout`](Self::poll_timeout) still answers a deadline at
    /// or before `now`: drain the output and call again (re-arm the timer to fire now).
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut budget = TIMER_BATCH;
        let mut more_due = false;
        while let Some(Reverse((at, seq, raw))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            if budget == 0 {
                more_due = true;
                break;
            }
            budget -= 1;
            self.timers.pop();
            let id = CepId(raw);
            let Some(cep) = self.cep_any(id) else {
                continue;
            };
            if cep.timer != Some((at, seq)) {
                continue;
            }
            if let Some(c) = self.cep_mut(id) {
                c.timer = None;
            }
            self.on_timer(now, id);
        }
        self.drop_stale_timers();
        self.trace(TracePoint::TimerPass {
            handled: (TIMER_BATCH - budget) as u32,
            more_due,
        });
    }

    fn on_timer(&mut self, now: Instant, id: CepId) {
        let Some(c) = self.cep_any(id) else { return };
        let state = c.state;
        let retry = c.retry;
        let expired = retry.left == 0 || now >= retry.deadline;
        let retried = match state {
            State::ReqSent { .. } => Some(AttributeId::Req),
            State::RepSent { .. } => Some(AttributeId::Rep),
            State::DreqSent => Some(AttributeId::Dreq),
            State::SidrReqSent => Some(AttributeId::SidrReq),
            State::Established if matches!(c.lap, LapState::Sent { .. }) => Some(AttributeId::Lap),
            _ => None,
        };
        match state {
            _ if !expired && retried.is_some() => {
                let Some(attr) = retried else { return };
                let done = retry.done.saturating_add(1);
                let wait = if self.config.exponential_backoff {
                    retry.base_ns.saturating_mul(1u64 << done.min(16))
                } else {
                    retry.base_ns
                };
                let at = now.add_nanos(wait).min(retry.deadline);
                if let Some(c) = self.cep_mut(id) {
                    c.retry.left -= 1;
                    c.retry.done = done;
                }
                self.resend(id, attr);
                Counters::bump(&mut self.counters.retries, attr);
                self.trace(TracePoint::Retry {
                    cep: id,
                    attribute: attr,
                    attempt: done,
                });
                self.arm(id, at);
            }
            State::ReqSent { .. } => {
                // IBA 12.9.8.1: the active side gives up and tells the passive side.
                self.send_rej_for(id, RejReason::Timeout, MessageKind::Other);
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::Req,
                    },
                );
                self.end_attempt(id);
            }
            State::RepSent { .. } => {
                self.send_rej_for(id, RejReason::Timeout, MessageKind::Other);
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::Rep,
                    },
                );
                self.enter_timewait(now, id);
            }
            State::DreqSent => {
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::Dreq,
                    },
                );
                self.enter_timewait(now, id);
            }
            State::Timewait => self.exit_timewait(id),
            State::Established => {
                // The LAP went unanswered: the connection stays up on its current paths.
                if let Some(c) = self.cep_mut(id) {
                    c.lap = LapState::Idle;
                    c.pending_alternate = None;
                }
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::Lap,
                    },
                );
            }
            State::SidrReqSent => {
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::SidrReq,
                    },
                );
                self.end_sidr(id);
            }
            State::SidrRepSent => self.end_sidr(id),
            _ => {}
        }
    }

    // ---- state changes ---------------------------------------------------------------

    /// The one place a CEP changes state.
    fn set_state(&mut self, id: CepId, state: State) {
        let to = state.name();
        let Some(c) = self.cep_mut(id) else { return };
        let from = c.state.name();
        c.state = state;
        self.trace(TracePoint::State {
            cep: id,
            local_comm_id: self.local_comm_id(id),
            from,
            to,
        });
    }

    fn emit(&mut self, id: CepId, event: Event) {
        self.trace(TracePoint::Event {
            cep: id,
            event: &event,
        });
        if self.cep_any(id).is_some_and(|c| !c.detached) {
            self.events.push_back((id, event));
        }
    }

    fn forget_peer(&mut self, id: CepId) {
        let Some(c) = self.cep_any(id) else { return };
        let (rid, rqpn, guid) = (c.remote_comm_id, c.remote_qpn, c.remote_ca_guid);
        if self.remote_ids.get(&(rid, guid)) == Some(&id) {
            self.remote_ids.remove(&(rid, guid));
        }
        if self.remote_qpns.get(&(rqpn, guid)) == Some(&id) {
            self.remote_qpns.remove(&(rqpn, guid));
        }
    }

    fn leave_backlog(&mut self, id: CepId) {
        let Some(listen) = self.cep_mut(id).and_then(|c| c.backlog_of.take()) else {
            return;
        };
        if let Some(l) = self.listens.iter_mut().find(|l| l.cep == listen) {
            l.pending = l.pending.saturating_sub(1);
        }
    }

    /// The connection attempt is over without reaching timewait: forget the peer, and
    /// free a detached CEP.
    fn end_attempt(&mut self, id: CepId) {
        self.cancel_timer(id);
        self.forget_peer(id);
        self.leave_backlog(id);
        self.set_state(id, State::Idle);
        if self.cep_any(id).is_some_and(|c| c.detached) {
            self.release(id);
        }
    }

    /// Timewait keeps the peer's comm ID and QPN in the lookups until it ends, so a late
    /// duplicate or a QPN reused too early is recognised (WinOF's choice; Linux drops
    /// them on entry and so misses both).
    fn enter_timewait(&mut self, now: Instant, id: CepId) {
        self.cancel_timer(id);
        self.leave_backlog(id);
        self.set_state(id, State::Timewait);
        let wait = self.cep_any(id).map_or(0, Cep::timewait_ns);
        self.arm(id, now.add_nanos(wait));
    }

    fn exit_timewait(&mut self, id: CepId) {
        self.forget_peer(id);
        self.set_state(id, State::Idle);
        if self.cep_any(id).is_some_and(|c| c.detached) {
            self.release(id);
        } else {
            self.emit(id, Event::TimewaitExit);
        }
    }

    // ---- sending -----------------------------------------------------------------------

    fn push_mad(&mut self, dest: MadAddress, header: MadHeader, message: CmMessage<'_>) {
        let attr = message.attribute_id();
        let mad = CmMad { header, message };
        let mut buf = [0u8; MAD_SIZE];
        // Every field was validated when the user gave it; a failure here is a bug in
        // this crate, and dropping the MAD is the safe answer (the peer retries).
        if mad.emit(&mut buf).is_ok() {
            self.trace(TracePoint::Send {
                attribute: attr,
                dlid: dest.lid,
                tid: header.transaction_id,
                rej: match mad.message {
                    CmMessage::Rej(ref r) => Some(r.reason),
                    _ => None,
                },
            });
            self.transmits.push_back(Transmit { dest, mad: buf });
            Counters::bump(&mut self.counters.sent, attr);
        }
    }

    fn build_req<'a>(&self, id: CepId, c: &'a Cep) -> Req<'a> {
        Req {
            local_comm_id: self.local_comm_id(id),
            vendor_id: 0,
            service_id: c.service_id,
            local_ca_guid: self.config.ca_guid,
            local_qkey: 0,
            local_qpn: c.local_qpn,
            responder_resources: c.responder_resources,
            local_eecn: 0,
            initiator_depth: c.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: c.remote_cm_response_timeout,
            transport: c.transport,
            end_to_end_flow_control: c.flow_control,
            starting_psn: c.local_psn,
            local_cm_response_timeout: c.local_cm_response_timeout,
            retry_count: c.retry_count,
            partition_key: c.pkey,
            path_mtu: c.path_mtu,
            rdc_exists: false,
            rnr_retry_count: c.peer_rnr_retry,
            max_cm_retries: c.max_cm_retries,
            srq: c.srq,
            primary_path: c.primary.to_wire(c.ack_timeout),
            alternate_path: c.alternate.map_or_else(Default::default, |a| {
                a.to_wire(ack_timeout(a.packet_life_time, self.config.ca_ack_delay))
            }),
            sap_supported: false,
            private_data: cached(c, AttributeId::Req),
        }
    }

    fn build_rep<'a>(&self, id: CepId, c: &'a Cep) -> Rep<'a> {
        // An XRC target puts its QPN in LocalEEContext and sets SRQ (Linux `cm_format_rep`
        // for IB_QPT_XRC_TGT; the initiator reads it back with `cm_rep_get_qpn`).
        let xrc = c.transport == Transport::Xrc;
        Rep {
            local_comm_id: self.local_comm_id(id),
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: if xrc { 0 } else { c.local_qpn },
            local_eecn: if xrc { c.local_qpn } else { 0 },
            vendor_id: 0,
            starting_psn: c.local_psn,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            target_ack_delay: self.config.ca_ack_delay,
            failover_accepted: c.failover,
            end_to_end_flow_control: c.flow_control,
            rnr_retry_count: c.peer_rnr_retry,
            srq: c.srq || xrc,
            local_ca_guid: self.config.ca_guid,
            private_data: cached(c, AttributeId::Rep),
        }
    }

    /// Sends (again) the message a CEP has cached: the REQ, REP or DREQ being retried, or
    /// the MRA, REP, RTU or DREP that answers a duplicate.
    fn resend(&mut self, id: CepId, attr: AttributeId) {
        let Some(c) = self.cep_any(id) else { return };
        let header = MadHeader::send(c.tid);
        let dest = c.dest;
        let ids = CommIds {
            local_comm_id: self.local_comm_id(id),
            remote_comm_id: c.remote_comm_id,
            private_data: cached(c, attr),
        };
        let message = match attr {
            AttributeId::Req => CmMessage::Req(self.build_req(id, c)),
            AttributeId::Rep => CmMessage::Rep(self.build_rep(id, c)),
            AttributeId::Rtu => CmMessage::Rtu(ids),
            AttributeId::Drep => CmMessage::Drep(ids),
            AttributeId::Dreq => CmMessage::Dreq(Dreq {
                local_comm_id: ids.local_comm_id,
                remote_comm_id: ids.remote_comm_id,
                remote_qpn_eecn: c.remote_qpn,
                private_data: ids.private_data,
            }),
            AttributeId::Mra => CmMessage::Mra(Mra {
                local_comm_id: ids.local_comm_id,
                remote_comm_id: ids.remote_comm_id,
                message_mraed: if c.state == State::Established {
                    MessageKind::Other
                } else if c.active {
                    MessageKind::Rep
                } else {
                    MessageKind::Req
                },
                service_timeout: c.mra_service_timeout,
                private_data: &c.mra_pdata,
            }),
            AttributeId::Lap => CmMessage::Lap(self.build_lap(id, c)),
            AttributeId::Apr => CmMessage::Apr(ibcm_mad::Apr {
                local_comm_id: ids.local_comm_id,
                remote_comm_id: ids.remote_comm_id,
                status: ibcm_mad::AprStatus::from(c.apr_status),
                additional_info: &c.apr_info,
                private_data: ids.private_data,
            }),
            AttributeId::SidrReq => CmMessage::SidrReq(ibcm_mad::SidrReq {
                request_id: ids.local_comm_id,
                partition_key: c.pkey,
                service_id: c.service_id,
                private_data: ids.private_data,
            }),
            AttributeId::SidrRep => CmMessage::SidrRep(ibcm_mad::SidrRep {
                request_id: c.remote_comm_id,
                status: ibcm_mad::SidrStatus::from(c.apr_status),
                vendor_id: 0,
                qpn: c.local_qpn,
                service_id: c.service_id,
                qkey: c.remote_psn,
                additional_info: &c.apr_info,
                private_data: ids.private_data,
            }),
            _ => return,
        };
        // `message` borrows `c`, which borrows `self`: emit into a local buffer first.
        let mad = CmMad { header, message };
        let mut buf = [0u8; MAD_SIZE];
        if mad.emit(&mut buf).is_ok() {
            self.transmits.push_back(Transmit { dest, mad: buf });
        }
    }

    /// Sends a message now (first time) and caches its private data for a repeat.
    fn send_cached(&mut self, id: CepId, attr: AttributeId, pdata: &[u8]) -> Result<(), CmError> {
        let c = self.cep_mut(id).ok_or(CmError::UnknownCep)?;
        c.pdata.clear();
        c.pdata
            .try_reserve(pdata.len())
            .map_err(|_| CmError::NoResources)?;
        c.pdata.extend_from_slice(pdata);
        c.cached = Some(attr);
        self.resend(id, attr);
        Counters::bump(&mut self.counters.sent, attr);
        Ok(())
    }

    fn send_rej_for(&mut self, id: CepId, reason: RejReason, message: MessageKind) {
        let guid = guid_ari(self.config.ca_guid);
        let ari: &[u8] = if reason == RejReason::Timeout {
            &guid
        } else {
            &[]
        };
        self.send_rej(id, reason, message, ari, &[]);
    }

    fn send_rej(
        &mut self,
        id: CepId,
        reason: RejReason,
        message: MessageKind,
        ari: &[u8],
        pdata: &[u8],
    ) {
        let Some(c) = self.cep_any(id) else { return };
        let (dest, tid, remote) = (c.dest, c.tid, c.remote_comm_id);
        let rej = Rej {
            local_comm_id: self.local_comm_id(id),
            remote_comm_id: remote,
            message_rejected: message,
            reason,
            ari,
            private_data: pdata,
        };
        self.push_mad(dest, MadHeader::send(tid), CmMessage::Rej(rej));
    }

    /// A REJ not tied to a CEP (no listener, stale connection): echo the TID, name the
    /// peer's comm ID, give none of ours.
    fn reply_rej(
        &mut self,
        src: &MadAddress,
        tid: u64,
        remote_comm_id: u32,
        message: MessageKind,
        reason: RejReason,
    ) {
        let rej = Rej {
            local_comm_id: 0,
            remote_comm_id,
            message_rejected: message,
            reason,
            ari: &[],
            private_data: &[],
        };
        self.push_mad(*src, MadHeader::send(tid), CmMessage::Rej(rej));
    }

    // ---- receiving ------------------------------------------------------------------------

    /// Starts loading what [`handle_mad`](Self::handle_mad) will read for this MAD (the
    /// CEP it names; for a REQ, the lookups of its peer), and handles nothing.
    ///
    /// With many CEPs, the one a MAD names is seldom in the cache, and `handle_mad` waits
    /// for memory (at 10^6 connections that wait is most of its cost). An owner that
    /// receives MADs in batches (one completion-queue poll) may call this for each MAD of
    /// the batch, then `handle_mad` for each: the batch's cache misses then overlap
    /// instead of adding up. Any buffer is harmless; skipping the call changes only speed.
    pub fn prefetch(&self, mad: &[u8]) {
        let be32 = |at: usize| {
            mad.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes)
        };
        let attribute = mad
            .get(16..18)
            .and_then(|b| b.try_into().ok())
            .map(u16::from_be_bytes);
        let id = match attribute {
            // REQ: LocalCommID, LocalCAGUID and LocalQPN (CM data offsets 0, 16 and 32).
            Some(0x0010) => {
                let guid = mad
                    .get(40..48)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes);
                let (Some(comm), Some(guid), Some(qpn)) = (be32(24), guid, be32(56)) else {
                    return;
                };
                core::hint::black_box(self.remote_qpns.get(&(qpn >> 8, guid)));
                self.remote_ids.get(&(comm, guid)).copied()
            }
            // Every other connection message: RemoteCommID at CM data offset 4.
            Some(0x0011..=0x0016 | 0x0019 | 0x001a) => be32(28).map(|w| self.id_from_wire(w)),
            _ => None,
        };
        if let Some(slot) = id.and_then(|id| self.slots.get(id.index())) {
            // The generation and the CEP's hot fields fill the slot's first 64 bytes; the
            // private data cache follows them (a repeat reads both).
            let pdata = slot.cep.as_ref().map_or(0, |c| c.pdata.len());
            core::hint::black_box((slot.generation, pdata));
        }
    }

    /// Handles one MAD received on QP1 from `src` (the port it arrived on and the sender's
    /// address). Malformed MADs, unknown CEPs and wrong states are counted and dropped;
    /// nothing here panics or allocates once the manager is warm.
    pub fn handle_mad(&mut self, now: Instant, src: &MadAddress, mad: &[u8]) {
        let parsed = match CmMad::parse(mad) {
            Ok(m) => m,
            Err(e) => {
                self.counters.malformed += 1;
                self.trace(TracePoint::Drop {
                    attribute: mad
                        .get(16..18)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u16::from_be_bytes),
                    reason: DropReason::Malformed(e),
                });
                return;
            }
        };
        let tid = parsed.header.transaction_id;
        if matches!(
            parsed.message,
            CmMessage::Rej(_) | CmMessage::Apr(_) | CmMessage::SidrRep(_)
        ) && CmMad::length_clamped(mad)
        {
            // Handled with the length clamped to 72 (never dropped: see `Rej::parse`).
            self.counters.clamped_lengths += 1;
        }
        match parsed.message {
            CmMessage::Req(m) => self.on_req(now, src, tid, &m),
            CmMessage::Mra(m) => self.on_mra(now, &m),
            CmMessage::Rej(m) => self.on_rej(now, &m),
            CmMessage::Rep(m) => self.on_rep(now, src, tid, &m),
            CmMessage::Rtu(m) => self.on_rtu(&m),
            CmMessage::Dreq(m) => self.on_dreq(now, src, tid, &m),
            CmMessage::Drep(m) => self.on_drep(now, &m),
            CmMessage::Lap(m) => self.on_lap(tid, &m),
            CmMessage::Apr(m) => self.on_apr(&m),
            CmMessage::SidrReq(m) => self.on_sidr_req(now, src, tid, &m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(&m),
            CmMessage::ClassPortInfo(_) if parsed.header.method == Method::Get => {
                self.on_class_port_info(src, parsed.header);
            }
            other => self.unmatched(other.attribute_id()),
        }
        self.drop_stale_timers();
    }

    fn received(&mut self, attr: AttributeId) {
        Counters::bump(&mut self.counters.received, attr);
    }

    fn duplicate(&mut self, attr: AttributeId) {
        Counters::bump(&mut self.counters.duplicates, attr);
        self.trace(TracePoint::Duplicate { attribute: attr });
    }

    /// A MAD that names no CEP, or one whose state does not take it: counted and dropped.
    fn unmatched(&mut self, attr: AttributeId) {
        self.counters.unmatched += 1;
        self.trace(TracePoint::Drop {
            attribute: attr.into(),
            reason: DropReason::Unmatched,
        });
    }

    /// A REQ or SIDR_REQ for a listen with no room: dropped silently so the peer retries.
    fn backlog_drop(&mut self, attr: AttributeId) {
        self.counters.backlog_drops += 1;
        self.trace(TracePoint::Drop {
            attribute: attr.into(),
            reason: DropReason::BacklogFull,
        });
    }

    /// A CEP named by a message's RemoteCommID whose peer is the message's sender (once
    /// the peer's comm ID is known).
    fn addressed(&self, remote_comm_id: u32, sender_comm_id: u32) -> Option<CepId> {
        let id = self.id_from_wire(remote_comm_id);
        let c = self.cep_any(id)?;
        (c.remote_comm_id == 0 || c.remote_comm_id == sender_comm_id).then_some(id)
    }

    fn on_class_port_info(&mut self, src: &MadAddress, header: MadHeader) {
        self.received(AttributeId::ClassPortInfo);
        // RespTimeValue: the CM answers at DISPATCH_LEVEL, well within 4.096us * 2^16.
        let cpi = ClassPortInfo {
            base_version: ibcm_mad::BASE_VERSION,
            class_version: ibcm_mad::CM_CLASS_VERSION,
            capability_mask: 0,
            capability_mask2: 0,
            resp_time_value: 16,
            ..ClassPortInfo::default()
        };
        let reply = MadHeader {
            method: Method::GetResp,
            ..header
        };
        self.push_mad(*src, reply, CmMessage::ClassPortInfo(cpi));
    }

    fn listen_for(&self, port: u8, req: &Req<'_>) -> Option<usize> {
        self.listens.iter().position(|l| {
            let p = &l.params;
            (req.service_id & p.service_mask) == (p.service_id & p.service_mask)
                && p.port.is_none_or(|x| x == port)
                && p.compare.as_ref().is_none_or(|(offset, bytes)| {
                    let start = usize::from(*offset);
                    req.private_data.get(start..start + bytes.len()) == Some(bytes.as_slice())
                })
        })
    }

    fn on_req(&mut self, now: Instant, src: &MadAddress, tid: u64, req: &Req<'_>) {
        self.received(AttributeId::Req);
        // WinOF `__req_handler` checks this first, before any lookup ("Reserved value.
        // Reject."): a transport this CM does not run (RD, which neither anchor supports,
        // or a reserved ExtendedTransportType, IBA Table 106) or LocalQPN 0 (QP0 is the
        // SMI's, never a connection's) gets REJ(InvalidTransportType).
        if !transport_supported(req.transport) || req.local_qpn == 0 {
            self.reply_rej(
                src,
                tid,
                req.local_comm_id,
                MessageKind::Req,
                RejReason::InvalidTransportType,
            );
            return;
        }
        let peer = (req.local_comm_id, req.local_ca_guid);
        if let Some(&id) = self.remote_ids.get(&peer) {
            self.duplicate(AttributeId::Req);
            match self.cep_any(id).map(|c| c.state) {
                Some(State::ReqRcvd { mra_sent: true } | State::RepPrepared { mra_sent: true }) => {
                    self.resend(id, AttributeId::Mra);
                }
                Some(State::RepSent { .. }) => self.resend(id, AttributeId::Rep),
                // The connection this REQ asked for has come and gone (IBA 12.9.8.3.1).
                Some(State::Timewait) => {
                    self.reply_rej(
                        src,
                        tid,
                        req.local_comm_id,
                        MessageKind::Req,
                        RejReason::StaleConn,
                    );
                }
                _ => {}
            }
            return;
        }
        if let Some(&old) = self.remote_qpns.get(&(req.local_qpn, req.local_ca_guid)) {
            // The peer reuses a QPN we still associate with a connection (IBA 12.9.8.3.2).
            self.reply_rej(
                src,
                tid,
                req.local_comm_id,
                MessageKind::Req,
                RejReason::StaleConn,
            );
            self.end_stale(now, old);
            return;
        }
        if self.crossing_req(src, tid, req) {
            return;
        }
        let Some(listen_index) = self.listen_for(src.port, req) else {
            self.reply_rej(
                src,
                tid,
                req.local_comm_id,
                MessageKind::Req,
                RejReason::InvalidServiceId,
            );
            return;
        };
        let Some(listen) = self.listens.get(listen_index) else {
            return;
        };
        let listen_id = listen.cep;
        if listen.pending >= listen.params.backlog {
            // Silent drop: the peer's retry may find room (never a REJ storm).
            self.backlog_drop(AttributeId::Req);
            return;
        }
        let Ok(id) = self.alloc() else {
            self.backlog_drop(AttributeId::Req);
            return;
        };
        if let Some(l) = self.listens.get_mut(listen_index) {
            l.pending += 1;
        }
        if let Some(c) = self.cep_mut(id) {
            c.backlog_of = Some(listen_id);
        }
        self.take_req(id, listen_id, src, tid, req);
    }

    /// A CEP answers `req` (from a listen, or a peer-to-peer CEP that turned passive):
    /// it takes the peer's side of the connection from the REQ, enters REQ_RCVD, joins the
    /// peer lookups and reports [`Event::ReqReceived`] naming `listen`.
    pub(super) fn take_req(
        &mut self,
        id: CepId,
        listen: CepId,
        src: &MadAddress,
        tid: u64,
        req: &Req<'_>,
    ) {
        let primary = PathRecord::from_peer(&req.primary_path);
        let alternate = req
            .alternate_path
            .is_present()
            .then(|| PathRecord::from_peer(&req.alternate_path));
        let ca_ack_delay = self.config.ca_ack_delay;
        let Some(c) = self.cep_mut(id) else { return };
        c.active = false;
        c.dest = *src;
        c.tid = tid;
        c.remote_comm_id = req.local_comm_id;
        c.remote_ca_guid = req.local_ca_guid;
        c.service_id = req.service_id;
        c.remote_qpn = req.local_qpn;
        c.remote_psn = req.starting_psn;
        c.pkey = req.partition_key;
        c.transport = req.transport;
        c.path_mtu = req.path_mtu;
        c.primary = primary;
        c.alternate = alternate;
        c.ack_timeout = ack_timeout(primary.packet_life_time, ca_ack_delay);
        c.peer_responder_resources = req.responder_resources;
        c.peer_initiator_depth = req.initiator_depth;
        c.retry_count = req.retry_count;
        c.rnr_retry = req.rnr_retry_count;
        c.max_cm_retries = req.max_cm_retries;
        c.remote_cm_response_timeout = req.remote_cm_response_timeout;
        c.local_cm_response_timeout = req.local_cm_response_timeout;
        c.target_ack_delay = ca_ack_delay;
        c.srq = req.srq;
        c.flow_control = req.end_to_end_flow_control;
        self.set_state(id, State::ReqRcvd { mra_sent: false });
        self.remote_ids
            .insert((req.local_comm_id, req.local_ca_guid), id);
        self.remote_qpns
            .insert((req.local_qpn, req.local_ca_guid), id);
        self.emit(
            id,
            Event::ReqReceived(ReqInfo {
                port: src.port,
                listen,
                service_id: req.service_id,
                remote_ca_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                pkey: req.partition_key,
                primary_path: primary,
                alternate_path: alternate,
                path_mtu: req.path_mtu,
                transport: req.transport,
                peer_responder_resources: req.responder_resources,
                peer_initiator_depth: req.initiator_depth,
                rnr_retry_count: req.rnr_retry_count,
                srq: req.srq,
                private_data: PrivateData::new(req.private_data),
            }),
        );
    }

    /// An older connection owns a QPN the peer reuses: it is stale (IBA 12.9.8.3.1).
    ///
    /// - Established: disconnect it with a DREQ, retried until the DREP or MaxCMRetries,
    ///   then timewait (Linux `cm_match_req` / `cm_rep_handler` -> `ib_send_cm_dreq`; the
    ///   DREQ's RemoteQPN is the connection's remote QPN, the one the REQ/REP reuses).
    ///   Its owner sees the DREP (or the DREQ's timeout) and then TimewaitExit.
    /// - Not yet established: REJ(StaleConn) to its peer, MessageRejected from its state
    ///   (WinOF `__process_stale`), reported to its owner, then timewait.
    /// - Already disconnecting or in timewait: nothing more.
    fn end_stale(&mut self, now: Instant, old: CepId) {
        let Some(state) = self.cep_any(old).map(|c| c.state) else {
            return;
        };
        match state {
            State::Established => {
                // A DREQ with no private data needs no allocation and cannot fail.
                let _ = self.send_dreq(now, old, &[]);
            }
            State::ReqSent { .. }
            | State::ReqRcvd { .. }
            | State::RepPrepared { .. }
            | State::RepSent { .. }
            | State::RepRcvd { .. } => {
                let message = message_rejected(state);
                self.send_rej_for(old, RejReason::StaleConn, message);
                self.emit(old, rejected(RejReason::StaleConn, message, &[], &[]));
                self.enter_timewait(now, old);
            }
            State::DreqSent
            | State::DreqRcvd
            | State::Timewait
            | State::Idle
            | State::Listen
            | State::SidrReqSent
            | State::SidrReqRcvd
            | State::SidrRepSent
            | State::Removed => {}
        }
    }

    fn on_rep(&mut self, now: Instant, src: &MadAddress, tid: u64, rep: &Rep<'_>) {
        self.received(AttributeId::Rep);
        let Some(id) = self.addressed(rep.remote_comm_id, rep.local_comm_id) else {
            self.unmatched(AttributeId::Rep);
            return;
        };
        let Some(c) = self.cep_any(id) else { return };
        match c.state {
            State::ReqSent { .. } => {}
            State::RepRcvd { mra_sent: true } => {
                self.duplicate(AttributeId::Rep);
                self.resend(id, AttributeId::Mra);
                return;
            }
            State::Established if c.active && c.cached == Some(AttributeId::Rtu) => {
                self.duplicate(AttributeId::Rep);
                self.resend(id, AttributeId::Rtu);
                return;
            }
            _ => {
                self.duplicate(AttributeId::Rep);
                return;
            }
        }
        // Linux `cm_rep_handler` "Check for duplicate REP": a (LocalCommID, CA GUID) that
        // already names another connection is not this REQ's answer (a stray or forged
        // REP); drop it rather than re-point that connection's lookup. The REQ retries.
        if self
            .remote_ids
            .get(&(rep.local_comm_id, rep.local_ca_guid))
            .is_some_and(|&other| other != id)
        {
            self.duplicate(AttributeId::Rep);
            return;
        }
        // An XRC initiator finds the target's QPN in LocalEEContext (Linux `cm_rep_get_qpn`).
        let rep_qpn = if c.transport == Transport::Xrc {
            rep.local_eecn
        } else {
            rep.local_qpn
        };
        let peer_qpn = (rep_qpn, rep.local_ca_guid);
        if let Some(&old) = self.remote_qpns.get(&peer_qpn) {
            // The passive side answers with a QPN another live connection uses. The REJ
            // names our comm ID too (Linux `cm_issue_rej` swaps the REP's IDs): the passive
            // CEP knows its peer, so a REJ from comm ID 0 would not reach it.
            let rej = Rej {
                local_comm_id: rep.remote_comm_id,
                remote_comm_id: rep.local_comm_id,
                message_rejected: MessageKind::Rep,
                reason: RejReason::StaleConn,
                ari: &[],
                private_data: &[],
            };
            self.push_mad(*src, MadHeader::send(tid), CmMessage::Rej(rej));
            self.end_stale(now, old);
            self.emit(
                id,
                rejected(RejReason::StaleConn, MessageKind::Rep, &[], &[]),
            );
            self.end_attempt(id);
            return;
        }
        self.cancel_timer(id);
        let Some(c) = self.cep_mut(id) else { return };
        c.remote_comm_id = rep.local_comm_id;
        c.remote_ca_guid = rep.local_ca_guid;
        c.remote_qpn = rep_qpn;
        c.remote_psn = rep.starting_psn;
        c.peer_responder_resources = rep.responder_resources;
        c.peer_initiator_depth = rep.initiator_depth;
        // The read limits cross over (Linux `cm_rep_handler`: initiator_depth =
        // REP.ResponderResources, responder_resources = REP.InitiatorDepth; WinOF
        // `__save_wire_rep`): this side issues no more RDMA reads than the passive side
        // accepts (RTS max_rd_atomic) and accepts as many as it issues (RTR
        // max_dest_rd_atomic).
        c.initiator_depth = rep.responder_resources;
        c.responder_resources = rep.initiator_depth;
        // IBA Table 110: an alternate path the passive side did not accept (1 not
        // supported, 2 rejected) is loaded into no QP state and cannot be migrated to.
        if rep.failover_accepted != Failover::Accepted {
            c.alternate = None;
        }
        c.target_ack_delay = rep.target_ack_delay;
        c.rnr_retry = rep.rnr_retry_count;
        c.failover = rep.failover_accepted;
        c.ack_timeout = ack_timeout(c.primary.packet_life_time, rep.target_ack_delay);
        self.set_state(id, State::RepRcvd { mra_sent: false });
        self.remote_ids
            .insert((rep.local_comm_id, rep.local_ca_guid), id);
        self.remote_qpns.insert(peer_qpn, id);
        self.emit(
            id,
            Event::RepReceived(RepInfo {
                remote_ca_guid: rep.local_ca_guid,
                remote_qpn: rep_qpn,
                remote_psn: rep.starting_psn,
                peer_responder_resources: rep.responder_resources,
                peer_initiator_depth: rep.initiator_depth,
                failover_accepted: rep.failover_accepted,
                srq: rep.srq,
                private_data: PrivateData::new(rep.private_data),
            }),
        );
    }

    fn on_rtu(&mut self, rtu: &CommIds<'_>) {
        self.received(AttributeId::Rtu);
        let Some(id) = self.addressed(rtu.remote_comm_id, rtu.local_comm_id) else {
            self.unmatched(AttributeId::Rtu);
            return;
        };
        if !matches!(
            self.cep_any(id).map(|c| c.state),
            Some(State::RepSent { .. })
        ) {
            self.duplicate(AttributeId::Rtu);
            return;
        }
        self.cancel_timer(id);
        self.set_state(id, State::Established);
        self.emit(id, Event::RtuReceived(PrivateData::new(rtu.private_data)));
    }

    fn on_mra(&mut self, now: Instant, mra: &Mra<'_>) {
        self.received(AttributeId::Mra);
        let Some(id) = self.addressed(mra.remote_comm_id, mra.local_comm_id) else {
            self.unmatched(AttributeId::Mra);
            return;
        };
        let Some(c) = self.cep_any(id) else { return };
        let next = match (c.state, mra.message_mraed) {
            (State::ReqSent { mra_rcvd: false }, MessageKind::Req) => {
                State::ReqSent { mra_rcvd: true }
            }
            (State::RepSent { mra_rcvd: false }, MessageKind::Rep) => {
                State::RepSent { mra_rcvd: true }
            }
            (State::Established, MessageKind::Other)
                if c.lap == (LapState::Sent { mra_rcvd: false }) =>
            {
                State::Established
            }
            _ => {
                // A repeated MRA extends nothing (Linux "apply MRA only once").
                self.duplicate(AttributeId::Mra);
                return;
            }
        };
        // IBA 12.6.6: wait ServiceTimeout + packet life time before the next retry.
        let wait = ibcm_mad::ib_time_ns(mra.service_timeout.min(31))
            .unwrap_or(0)
            .saturating_add(c.round_trip_ns() / 2);
        let deadline = c.retry.deadline;
        if let Some(c) = self.cep_mut(id)
            && next == State::Established
        {
            c.lap = LapState::Sent { mra_rcvd: true };
        }
        self.set_state(id, next);
        let at = now.add_nanos(wait).min(deadline.max(now));
        self.arm(id, at);
        self.emit(
            id,
            Event::MraReceived {
                service_timeout: mra.service_timeout,
            },
        );
    }

    fn on_rej(&mut self, now: Instant, rej: &Rej<'_>) {
        self.received(AttributeId::Rej);
        let by_comm_id = (rej.remote_comm_id != 0)
            .then(|| self.addressed(rej.remote_comm_id, rej.local_comm_id))
            .flatten();
        // A REJ(Timeout) may name no comm ID of ours; its ARI is the sender's CA GUID.
        let by_guid = || {
            let guid = rej.ari.get(..8)?;
            let guid = u64::from_be_bytes(guid.try_into().ok()?);
            self.remote_ids.get(&(rej.local_comm_id, guid)).copied()
        };
        let Some(id) = by_comm_id.or_else(by_guid) else {
            self.unmatched(AttributeId::Rej);
            return;
        };
        let Some(state) = self.cep_any(id).map(|c| c.state) else {
            return;
        };
        let event = rejected(rej.reason, rej.message_rejected, rej.ari, rej.private_data);
        let stale = rej.reason == RejReason::StaleConn;
        match state {
            State::ReqSent { .. }
                if rej.reason == RejReason::InvalidServiceId
                    && self.cep_any(id).is_some_and(|c| c.peer_to_peer) =>
            {
                // A peer-to-peer CEP whose peer has not started connecting yet keeps
                // retrying its REQ (as WinOF's p2p): the crossing REQ settles who answers.
            }
            // Before RTR no packet can be in flight; a stale REJ still quarantines the QPN.
            State::ReqSent { .. } | State::ReqRcvd { .. } | State::RepPrepared { .. } => {
                // WinOF drops a REJ in REQ_RCVD without an event; the consumer then only
                // learns when its REP fails. Linux reports it, and so do we.
                self.emit(id, event);
                if stale {
                    self.enter_timewait(now, id);
                } else {
                    self.end_attempt(id);
                }
            }
            // From RTR on, the QP may have seen packets: always through timewait (Linux
            // goes to IDLE from REP_SENT; timewait is the safe choice for QP reuse).
            State::RepSent { .. }
            | State::RepRcvd { .. }
            | State::Established
            | State::DreqSent
            | State::DreqRcvd => {
                self.emit(id, event);
                self.enter_timewait(now, id);
            }
            State::Idle
            | State::Listen
            | State::Timewait
            | State::SidrReqSent
            | State::SidrReqRcvd
            | State::SidrRepSent
            | State::Removed => {
                self.duplicate(AttributeId::Rej);
            }
        }
    }

    fn on_dreq(&mut self, now: Instant, src: &MadAddress, tid: u64, dreq: &Dreq<'_>) {
        self.received(AttributeId::Dreq);
        let target = self
            .addressed(dreq.remote_comm_id, dreq.local_comm_id)
            .filter(|&id| {
                self.cep_any(id).is_some_and(|c| {
                    c.remote_comm_id == dreq.local_comm_id && c.local_qpn == dreq.remote_qpn_eecn
                })
            });
        let Some(id) = target else {
            // IBA 12.9.8.5: an unknown or mismatched DREQ gets an unaffiliated DREP.
            let drep = CommIds {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: &[],
            };
            self.push_mad(*src, MadHeader::send(tid), CmMessage::Drep(drep));
            return;
        };
        match self.cep_any(id).map(|c| c.state) {
            // A DREQ in REP_SENT means the RTU was lost: the connection was established.
            Some(State::RepSent { .. } | State::Established | State::DreqSent) => {
                self.cancel_timer(id);
                if let Some(c) = self.cep_mut(id) {
                    c.tid = tid;
                    c.drep_rcvd = false;
                }
                self.set_state(id, State::DreqRcvd);
                if self.cep_any(id).is_some_and(|c| c.detached) {
                    // Destroyed in DREQ_SENT (a simultaneous disconnect): no owner is left
                    // to answer, so answer now as `destroy` does in DREQ_RCVD.
                    let _ = self.send_cached(id, AttributeId::Drep, &[]);
                    self.enter_timewait(now, id);
                } else {
                    self.emit(id, Event::DreqReceived(PrivateData::new(dreq.private_data)));
                }
            }
            // TIMEWAIT + DREQ -> DREP (IBA 12.9.6; Linux re-sends the saved DREP), also when
            // this side sent the DREQ (DREP received, or DREQ timed out: WinOF pre-formats a
            // DREP then), with no private data. Past timewait (idle) the peer's retry means
            // our DREP was lost: answer it, as an unknown comm ID would be.
            Some(State::Timewait | State::Idle) => {
                self.duplicate(AttributeId::Dreq);
                self.resend(id, AttributeId::Drep);
            }
            _ => self.duplicate(AttributeId::Dreq),
        }
    }

    fn on_drep(&mut self, now: Instant, drep: &CommIds<'_>) {
        self.received(AttributeId::Drep);
        let Some(id) = self.addressed(drep.remote_comm_id, drep.local_comm_id) else {
            self.unmatched(AttributeId::Drep);
            return;
        };
        match self.cep_any(id).map(|c| c.state) {
            Some(State::DreqSent) => {
                self.emit(id, Event::DrepReceived(PrivateData::new(drep.private_data)));
                self.enter_timewait(now, id);
            }
            // Simultaneous disconnect: the peer answered our DREQ while ours is still
            // owed; the consumer's DREP ends it. Reported once: a duplicate DREP is not.
            Some(State::DreqRcvd) if self.cep_any(id).is_some_and(|c| !c.drep_rcvd) => {
                if let Some(c) = self.cep_mut(id) {
                    c.drep_rcvd = true;
                }
                self.emit(id, Event::DrepReceived(PrivateData::new(drep.private_data)));
            }
            _ => self.duplicate(AttributeId::Drep),
        }
    }

    // ---- user operations --------------------------------------------------------------------

    fn state_of(&self, id: CepId) -> Result<State, CmError> {
        Ok(self.user_cep(id)?.state)
    }

    fn invalid(&self, id: CepId) -> CmError {
        match self.state(id) {
            Ok(state) => CmError::InvalidState { state },
            Err(e) => e,
        }
    }

    /// Creates an idle CEP.
    pub fn create(&mut self) -> Result<CepId, CmError> {
        self.alloc()
    }

    /// Makes an idle CEP listen. The compare buffer must fit the 92-byte REQ private data.
    pub fn listen(&mut self, id: CepId, params: ListenParams) -> Result<(), CmError> {
        if self.state_of(id)? != State::Idle {
            return Err(self.invalid(id));
        }
        if let Some((offset, bytes)) = &params.compare {
            let end = usize::from(*offset) + bytes.len();
            check_len(
                "listen compare offset + length",
                end,
                ibcm_mad::REQ_PRIVATE_DATA_SIZE,
            )?;
        }
        let duplicate = self.listens.iter().any(|l| {
            let p = &l.params;
            p.service_id & p.service_mask == params.service_id & params.service_mask
                && p.service_mask == params.service_mask
                && p.port == params.port
                && p.compare == params.compare
        });
        if duplicate {
            return Err(CmError::DuplicateListen);
        }
        self.listens
            .try_reserve(1)
            .map_err(|_| CmError::NoResources)?;
        self.listens.push(ListenEntry {
            cep: id,
            params,
            pending: 0,
        });
        self.set_state(id, State::Listen);
        Ok(())
    }

    /// Takes a REQ-created CEP out of its listen's backlog: the user owns it now.
    pub fn take_request(&mut self, id: CepId) -> Result<(), CmError> {
        self.user_cep(id)?;
        self.leave_backlog(id);
        Ok(())
    }

    /// Sends a REQ from an idle CEP (active side).
    pub fn connect(
        &mut self,
        now: Instant,
        id: CepId,
        p: &ConnectParams<'_>,
    ) -> Result<(), CmError> {
        if self.state_of(id)? != State::Idle {
            return Err(self.invalid(id));
        }
        check_width("qpn", p.qpn.into(), 24)?;
        // The REQ the passive side would refuse (WinOF `__req_handler`): never send it.
        if p.qpn == 0 {
            return Err(CmError::Reserved {
                field: "qpn",
                value: 0,
            });
        }
        if !transport_supported(p.transport) {
            let (service_type, extended) = p.transport.to_wire();
            return Err(CmError::Reserved {
                field: "transport",
                value: u64::from(service_type) << 8 | u64::from(extended),
            });
        }
        if let Some(psn) = p.starting_psn {
            check_width("starting_psn", psn.into(), 24)?;
        }
        check_max(
            "remote_cm_response_timeout",
            p.remote_cm_response_timeout,
            31,
        )?;
        check_max("local_cm_response_timeout", p.local_cm_response_timeout, 31)?;
        check_max("retry_count", p.retry_count, 7)?;
        check_max("rnr_retry_count", p.rnr_retry_count, 7)?;
        check_max("max_cm_retries", p.max_cm_retries, 15)?;
        check_max(
            "responder_resources",
            p.responder_resources,
            self.config.max_responder_resources,
        )?;
        check_max(
            "initiator_depth",
            p.initiator_depth,
            self.config.max_initiator_depth,
        )?;
        for path in core::iter::once(&p.primary_path).chain(p.alternate_path.iter()) {
            check_width("flow_label", path.flow_label.into(), 20)?;
            check_max("sl", path.sl, 15)?;
            check_max("packet_life_time", path.packet_life_time, 31)?;
            check_width("rate", u8::from(path.rate).into(), 6)?;
        }
        check_width("path_mtu", u8::from(p.path_mtu).into(), 4)?;
        check_len(
            "private_data",
            p.private_data.len(),
            ibcm_mad::REQ_PRIVATE_DATA_SIZE,
        )?;
        let psn = match p.starting_psn {
            Some(psn) => psn,
            None => self.random_psn(),
        };
        let tid = self.fresh_tid();
        let ack = ack_timeout(p.primary_path.packet_life_time, self.config.ca_ack_delay);
        let Some(c) = self.cep_mut(id) else {
            return Err(CmError::UnknownCep);
        };
        c.pdata
            .try_reserve(p.private_data.len())
            .map_err(|_| CmError::NoResources)?;
        c.active = true;
        c.tid = tid;
        c.dest = MadAddress {
            port: p.port,
            lid: p.primary_path.dlid,
            gid: p.primary_path.dgid,
            grh: !p.primary_path.subnet_local,
            sl: p.primary_path.sl,
            pkey: p.pkey,
        };
        c.service_id = p.service_id;
        c.local_qpn = p.qpn;
        c.local_psn = psn;
        c.remote_comm_id = 0;
        c.remote_ca_guid = 0;
        c.remote_qpn = 0;
        c.pkey = p.pkey;
        c.transport = p.transport;
        c.path_mtu = p.path_mtu;
        c.primary = p.primary_path;
        c.alternate = p.alternate_path;
        c.ack_timeout = ack;
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.retry_count = p.retry_count;
        c.peer_rnr_retry = p.rnr_retry_count;
        c.max_cm_retries = p.max_cm_retries;
        c.remote_cm_response_timeout = p.remote_cm_response_timeout;
        c.local_cm_response_timeout = p.local_cm_response_timeout;
        c.srq = p.srq;
        c.flow_control = p.flow_control;
        // A reused CEP starts afresh: no LAP of its last connection, not peer-to-peer
        // unless `connect_peer` says so again.
        c.lap = LapState::Idle;
        c.pending_alternate = None;
        c.peer_to_peer = false;
        // IBA 12.7.36: wait 2 x packet life time + RemoteCMResponseTimeout.
        let base = c
            .round_trip_ns()
            .saturating_add(ibcm_mad::ib_time_ns(p.remote_cm_response_timeout).unwrap_or(0));
        self.set_state(id, State::ReqSent { mra_rcvd: false });
        self.send_cached(id, AttributeId::Req, p.private_data)?;
        self.start_retry(id, now, base, p.max_cm_retries);
        Ok(())
    }

    /// Sends an MRA for the REQ (passive) or the REP (active) just received: once per
    /// message, before or after the pre-REP.
    pub fn mra(
        &mut self,
        id: CepId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let next = match self.state_of(id)? {
            State::ReqRcvd { mra_sent: false } => State::ReqRcvd { mra_sent: true },
            State::RepPrepared { mra_sent: false } => State::RepPrepared { mra_sent: true },
            State::RepRcvd { mra_sent: false } => State::RepRcvd { mra_sent: true },
            State::Established => {
                let lap = self.user_cep(id)?.lap;
                let next = match lap {
                    LapState::Rcvd { mra_sent: false } => LapState::Rcvd { mra_sent: true },
                    LapState::AprPrepared { mra_sent: false } => {
                        LapState::AprPrepared { mra_sent: true }
                    }
                    _ => return Err(self.invalid(id)),
                };
                check_max("service_timeout", service_timeout, 31)?;
                check_len(
                    "private_data",
                    private_data.len(),
                    ibcm_mad::MRA_PRIVATE_DATA_SIZE,
                )?;
                if let Some(c) = self.cep_mut(id) {
                    c.mra_service_timeout = service_timeout;
                    c.mra_pdata.clear();
                    c.mra_pdata
                        .try_reserve(private_data.len())
                        .map_err(|_| CmError::NoResources)?;
                    c.mra_pdata.extend_from_slice(private_data);
                    c.lap = next;
                }
                self.resend(id, AttributeId::Mra);
                Counters::bump(&mut self.counters.sent, AttributeId::Mra);
                return Ok(());
            }
            _ => return Err(self.invalid(id)),
        };
        check_max("service_timeout", service_timeout, 31)?;
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::MRA_PRIVATE_DATA_SIZE,
        )?;
        // Not through `send_cached`: after the pre-REP that cache holds the REP's data.
        let c = self.cep_mut(id).ok_or(CmError::UnknownCep)?;
        c.mra_pdata.clear();
        c.mra_pdata
            .try_reserve(private_data.len())
            .map_err(|_| CmError::NoResources)?;
        c.mra_pdata.extend_from_slice(private_data);
        c.mra_service_timeout = service_timeout;
        self.resend(id, AttributeId::Mra);
        Counters::bump(&mut self.counters.sent, AttributeId::Mra);
        self.set_state(id, next);
        Ok(())
    }

    /// Pre-REP: validates and stores the REP, and returns the QP attributes for the
    /// INIT, RTR and RTS transitions. Nothing is sent until [`send_rep`](Self::send_rep).
    /// May be called again to re-format.
    pub fn prepare_rep(&mut self, id: CepId, p: &RepParams<'_>) -> Result<PreparedRep, CmError> {
        let mra_sent = match self.state_of(id)? {
            State::ReqRcvd { mra_sent } | State::RepPrepared { mra_sent } => mra_sent,
            _ => return Err(self.invalid(id)),
        };
        let c = self.user_cep(id)?;
        check_width("qpn", p.qpn.into(), 24)?;
        if let Some(psn) = p.starting_psn {
            check_width("starting_psn", psn.into(), 24)?;
        }
        check_max("rnr_retry_count", p.rnr_retry_count, 7)?;
        check_max(
            "responder_resources",
            p.responder_resources,
            self.config.max_responder_resources,
        )?;
        check_max(
            "initiator_depth",
            p.initiator_depth,
            self.config.max_initiator_depth,
        )?;
        if p.initiator_depth > c.peer_responder_resources {
            return Err(CmError::InitiatorDepthOverPeer {
                requested: p.initiator_depth,
                peer: c.peer_responder_resources,
            });
        }
        check_width("failover_accepted", u8::from(p.failover_accepted).into(), 2)?;
        check_len(
            "private_data",
            p.private_data.len(),
            ibcm_mad::REP_PRIVATE_DATA_SIZE,
        )?;
        let psn = match p.starting_psn {
            Some(psn) => psn,
            None => self.random_psn(),
        };
        let Some(c) = self.cep_mut(id) else {
            return Err(CmError::UnknownCep);
        };
        c.pdata.clear();
        c.pdata
            .try_reserve(p.private_data.len())
            .map_err(|_| CmError::NoResources)?;
        c.pdata.extend_from_slice(p.private_data);
        c.cached = Some(AttributeId::Rep);
        c.local_qpn = p.qpn;
        c.local_psn = psn;
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.peer_rnr_retry = p.rnr_retry_count;
        c.failover = p.failover_accepted;
        // IBA Table 110: the REQ's alternate path is loaded only if accepted. Kept aside
        // (no LAP can be pending before the connection is established) so that a
        // re-formatted REP may still accept it.
        if p.failover_accepted == Failover::Accepted {
            if c.alternate.is_none() {
                c.alternate = c.pending_alternate.take();
            }
        } else if let Some(alt) = c.alternate.take() {
            c.pending_alternate = Some(alt);
        }
        c.flow_control = p.flow_control;
        c.srq = p.srq;
        self.set_state(id, State::RepPrepared { mra_sent });
        let c = self.cep_any(id).ok_or(CmError::UnknownCep)?;
        Ok(PreparedRep {
            init: qp_attributes_of(c, QpState::Init),
            rtr: qp_attributes_of(c, QpState::Rtr),
            rts: qp_attributes_of(c, QpState::Rts),
        })
    }

    /// Sends the REP formatted by [`prepare_rep`](Self::prepare_rep).
    pub fn send_rep(&mut self, now: Instant, id: CepId) -> Result<(), CmError> {
        if !matches!(self.state_of(id)?, State::RepPrepared { .. }) {
            return Err(self.invalid(id));
        }
        self.leave_backlog(id);
        if let Some(c) = self.cep_mut(id) {
            // The REQ's refused alternate path, if any, is forgotten now.
            c.pending_alternate = None;
        }
        self.set_state(id, State::RepSent { mra_rcvd: false });
        self.resend(id, AttributeId::Rep);
        Counters::bump(&mut self.counters.sent, AttributeId::Rep);
        let Some(c) = self.cep_any(id) else {
            return Err(CmError::UnknownCep);
        };
        // The REQ's LocalCMResponseTimeout is how long the active side may take to answer.
        let base = c
            .round_trip_ns()
            .saturating_add(ibcm_mad::ib_time_ns(c.local_cm_response_timeout.min(31)).unwrap_or(0));
        let retries = c.max_cm_retries;
        self.start_retry(id, now, base, retries);
        Ok(())
    }

    /// Pre-REP and send in one step.
    pub fn accept(
        &mut self,
        now: Instant,
        id: CepId,
        p: &RepParams<'_>,
    ) -> Result<PreparedRep, CmError> {
        let prepared = self.prepare_rep(id, p)?;
        self.send_rep(now, id)?;
        Ok(prepared)
    }

    /// Sends the RTU after a REP (active side): the connection is established.
    pub fn rtu(&mut self, id: CepId, private_data: &[u8]) -> Result<(), CmError> {
        if !matches!(self.state_of(id)?, State::RepRcvd { .. }) {
            return Err(self.invalid(id));
        }
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::RTU_PRIVATE_DATA_SIZE,
        )?;
        self.send_cached(id, AttributeId::Rtu, private_data)?;
        self.set_state(id, State::Established);
        Ok(())
    }

    /// The QP received a packet before the RTU (communication established async event):
    /// the passive side is established.
    pub fn established(&mut self, id: CepId) -> Result<(), CmError> {
        if !matches!(self.state_of(id)?, State::RepSent { .. }) {
            return Err(self.invalid(id));
        }
        self.cancel_timer(id);
        self.set_state(id, State::Established);
        Ok(())
    }

    /// Rejects the connection: a REQ or REP received (or, active side, a REQ in flight).
    pub fn reject(&mut self, now: Instant, id: CepId, p: &RejectParams<'_>) -> Result<(), CmError> {
        let state = self.state_of(id)?;
        let message = match state {
            State::ReqRcvd { .. } | State::RepPrepared { .. } => MessageKind::Req,
            State::RepRcvd { .. } => MessageKind::Rep,
            State::ReqSent { .. } | State::RepSent { .. } => MessageKind::Other,
            _ => return Err(self.invalid(id)),
        };
        check_width("reason", u16::from(p.reason).into(), 16)?;
        check_len("ari", p.ari.len(), ibcm_mad::REJ_ARI_SIZE)?;
        check_len(
            "private_data",
            p.private_data.len(),
            ibcm_mad::REJ_PRIVATE_DATA_SIZE,
        )?;
        self.send_rej(id, p.reason, message, p.ari, p.private_data);
        match state {
            // WinOF: REP_RCVD -> TIMEWAIT; Linux: -> IDLE. Our QP reached RTR, so timewait.
            State::RepRcvd { .. } | State::RepSent { .. } => self.enter_timewait(now, id),
            _ => self.end_attempt(id),
        }
        Ok(())
    }

    /// Sends a DREQ on an established connection.
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: CepId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if self.state_of(id)? != State::Established {
            return Err(self.invalid(id));
        }
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::DREQ_PRIVATE_DATA_SIZE,
        )?;
        self.send_dreq(now, id, private_data)
    }

    fn send_dreq(&mut self, now: Instant, id: CepId, private_data: &[u8]) -> Result<(), CmError> {
        self.cancel_timer(id);
        self.set_state(id, State::DreqSent);
        self.send_cached(id, AttributeId::Dreq, private_data)?;
        let Some(c) = self.cep_any(id) else {
            return Err(CmError::UnknownCep);
        };
        // The peer's response time: the passive side waits the REQ's LocalCMResponseTimeout.
        let base = c
            .round_trip_ns()
            .saturating_add(ibcm_mad::ib_time_ns(peer_response_timeout(c).min(31)).unwrap_or(0));
        let retries = c.max_cm_retries;
        self.start_retry(id, now, base, retries);
        Ok(())
    }

    /// Answers a DREQ: the connection enters timewait.
    pub fn drep(&mut self, now: Instant, id: CepId, private_data: &[u8]) -> Result<(), CmError> {
        if self.state_of(id)? != State::DreqRcvd {
            return Err(self.invalid(id));
        }
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::DREP_PRIVATE_DATA_SIZE,
        )?;
        self.send_cached(id, AttributeId::Drep, private_data)?;
        self.enter_timewait(now, id);
        Ok(())
    }

    /// Destroys a CEP. It never waits: a connection still up is torn down in the
    /// background (REJ, DREQ or DREP as its state requires, then timewait) and reports
    /// nothing more; its slot is freed when that ends.
    pub fn destroy(&mut self, now: Instant, id: CepId) -> Result<(), CmError> {
        let state = self.state_of(id)?;
        self.leave_backlog(id);
        if let Some(c) = self.cep_mut(id) {
            c.detached = true;
        }
        match state {
            State::Idle => {
                self.cancel_timer(id);
                self.release(id);
            }
            State::Listen => {
                self.listens.retain(|l| l.cep != id);
                // Requests nobody took from this listen can never be answered: refuse
                // them now rather than let the peers time out.
                let orphans: Vec<CepId> = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        let c = s.cep.as_ref()?;
                        (c.backlog_of == Some(id)).then(|| CepId::new(i as u32, s.generation))
                    })
                    .collect();
                for orphan in orphans {
                    let _ = self.destroy(now, orphan);
                }
                self.release(id);
            }
            State::ReqSent { .. } => {
                // Linux `cm_destroy_id`: tell the passive side with REJ(Timeout).
                self.send_rej_for(id, RejReason::Timeout, MessageKind::Other);
                self.end_attempt(id);
            }
            State::ReqRcvd { .. } | State::RepPrepared { .. } => {
                self.send_rej(id, RejReason::ConsumerDefined, MessageKind::Req, &[], &[]);
                self.end_attempt(id);
            }
            State::RepSent { .. } | State::RepRcvd { .. } => {
                let message = if state == (State::RepRcvd { mra_sent: false })
                    || state == (State::RepRcvd { mra_sent: true })
                {
                    MessageKind::Rep
                } else {
                    MessageKind::Other
                };
                self.send_rej(id, RejReason::ConsumerDefined, message, &[], &[]);
                self.enter_timewait(now, id);
            }
            State::Established => {
                // A DREQ with no private data needs no allocation and cannot fail.
                let _ = self.send_dreq(now, id, &[]);
            }
            State::DreqRcvd => {
                let _ = self.send_cached(id, AttributeId::Drep, &[]);
                self.enter_timewait(now, id);
            }
            State::DreqSent | State::Timewait => {}
            State::SidrReqRcvd => {
                // Linux `ib_destroy_cm_id` in SIDR_REQ_RCVD: answer with status Reject.
                self.send_sidr_rep_status(id, ibcm_mad::SidrStatus::Reject);
                self.end_sidr(id);
            }
            // Answered: it lingers, ownerless, to repeat its answer, and is freed when that
            // ends.
            State::SidrRepSent => {}
            State::SidrReqSent | State::Removed => self.end_sidr(id),
        }
        Ok(())
    }
}

/// The private data cached for `attr`, or none if the cache holds another message's.
fn cached(c: &Cep, attr: AttributeId) -> &[u8] {
    if c.cached == Some(attr) {
        &c.pdata
    } else {
        &[]
    }
}

fn rejected(reason: RejReason, message: MessageKind, ari: &[u8], pdata: &[u8]) -> Event {
    let mut buf = [0u8; 72];
    let len = ari.len().min(72);
    if let (Some(dst), Some(src)) = (buf.get_mut(..len), ari.get(..len)) {
        dst.copy_from_slice(src);
    }
    Event::Rejected {
        reason,
        message,
        ari: buf,
        ari_len: len as u8,
        private_data: PrivateData::new(pdata),
    }
}

/// INIT, RTR and RTS attributes as Linux `cm_init_qp_{init,rtr,rts}_attr` computes them.
fn qp_attributes_of(c: &Cep, state: QpState) -> QpAttributes {
    let mut a = QpAttributes::empty(state);
    let av = |path: PathRecord, ack: u8| AddressVector {
        path,
        port: c.dest.port,
        ack_timeout: ack,
    };
    let alternate = c
        .alternate
        .filter(|p| p.is_present())
        .map(|p| av(p, ack_timeout(p.packet_life_time, c.target_ack_delay)));
    match state {
        QpState::Init => {
            let mut flags = access::LOCAL_WRITE | access::REMOTE_WRITE;
            if c.responder_resources > 0 {
                flags |= access::REMOTE_READ | access::REMOTE_ATOMIC;
            }
            a.port = Some(c.dest.port);
            a.pkey = Some(c.pkey);
            a.access_flags = Some(flags);
        }
        QpState::Rtr => {
            a.path_mtu = Some(c.path_mtu);
            a.dest_qpn = Some(c.remote_qpn);
            a.rq_psn = Some(c.remote_psn);
            a.max_dest_rd_atomic = Some(c.responder_resources);
            a.primary = Some(av(c.primary, c.ack_timeout));
            a.alternate = alternate;
        }
        QpState::Rts => {
            a.sq_psn = Some(c.local_psn);
            a.timeout = Some(c.ack_timeout);
            a.retry_count = Some(c.retry_count);
            a.rnr_retry = Some(c.rnr_retry);
            a.max_rd_atomic = Some(c.initiator_depth);
            if alternate.is_some() {
                a.alternate = alternate;
                a.path_mig_state = Some(MigrationState::Rearm);
            }
        }
    }
    a
}

/// The transports a connection may use: RC, UC and XRC (Linux `cm_req_get_qp_type`). RD
/// (TransportServiceType 2) has no support in either anchor, and ExtendedTransportType
/// values other than 1 are reserved (IBA Table 106).
fn transport_supported(transport: Transport) -> bool {
    match transport {
        Transport::Rc | Transport::Uc | Transport::Xrc => true,
        Transport::Extended(e) => Transport::from_wire(3, e) == Transport::Xrc,
        Transport::Rd => false,
    }
}

/// How long the peer may take to answer this side's DREQ or LAP (5-bit IB time): on the
/// active side the REQ's RemoteCMResponseTimeout, on the passive side the REQ's
/// LocalCMResponseTimeout (Linux `cm_req_handler` sets the id's `timeout_ms` from it, and
/// `cm_send_dreq_locked` waits that; WinOF `__save_wire_req`).
pub(crate) fn peer_response_timeout(c: &Cep) -> u8 {
    if c.active {
        c.remote_cm_response_timeout
    } else {
        c.local_cm_response_timeout
    }
}

/// MessageRejected of a REJ this CEP sends: the REQ while it answers one, the REP while
/// it holds one unanswered, otherwise Other (WinOF `__process_stale`; IBA Table 108).
fn message_rejected(state: State) -> MessageKind {
    match state {
        State::ReqRcvd { .. } | State::RepPrepared { .. } => MessageKind::Req,
        State::RepRcvd { .. } => MessageKind::Rep,
        _ => MessageKind::Other,
    }
}
