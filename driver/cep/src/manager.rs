//! The CEP manager: all CEPs of one CA, the lookups that route MADs to them, one timer
//! heap, and the queues of outgoing MADs and events.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::num::NonZeroU32;

use hashbrown::HashMap;
use ibcm_mad::{AttributeId, Gid, MAD_SIZE, MessageKind, RejReason, Transport};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

use crate::cep::{Cep, State, StateName};
use crate::comm_id::CommIdSpace;
use crate::config::CmConfig;
use crate::counters::Counters;
use crate::error::CmError;
use crate::event::Event;
use crate::grow::{ChunkedVec, reserve_queue};
use crate::path_table::PathTable;
use crate::pdata_pool::PdataPool;
use crate::trace::{TraceHook, TracePoint, Tracer};
use crate::types::{CepId, Instant, MadAddress, PathRecord, PrivateData};
use ibcm_iba::{QpAttributes, QpState};

mod alternate;
mod establish;
mod held;
mod lap;
mod link;
mod listen;
mod listen_table;
mod local_qpn;
mod lookup;
mod memory;
mod operations;
mod pdata;
mod peer;
mod ports;
mod qp;
mod receive;
mod release;
mod send;
mod sidr;
mod source;
mod state;
mod steer;
mod timer_heap;
mod timers;
mod waiting;

pub use link::PORT_SCAN_SLOTS;
use lookup::{KeyedHash, PeerField, PeerMap};
pub use memory::EngineMemory;
use qp::qp_attributes_of;
pub use sidr::{SidrParams, SidrReplyParams};
pub use steer::MadOwner;
pub(crate) use timer_heap::NO_TIMER;

/// Timers one [`CmManager::handle_timeout`] handles at most, so at most this many MADs
/// and events: what the platform's send batch must hold for a timer pass. 8 keeps a timer
/// DPC's p99 near 25 us with the dispatch layer's work at 1e6 connections (`ibcm cmtime
/// --dpc-times`: a mass timewait expiry of 128 timers a pass took 100-140 us at the
/// median, of 32 a p99 of 78-114 us).
pub const TIMER_BATCH: usize = 8;

/// Free slots before [`CmManager::alloc`] reuses one rather than take a fresh one (one
/// chunk of the slab): the floor of a local comm ID's reuse distance, in slots.
const REUSE_AFTER: usize = crate::grow::CHUNK;

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

/// `repr(C)`: the generation, checked first, shares the slot's first 64 bytes with the
/// CEP's hot fields (see [`Cep`]); as wide as the comm ID layout's generation (u32 sits in
/// the padding before the CEP, as the u8 did).
#[derive(Debug, Clone)]
#[repr(C)]
struct Slot {
    generation: u32,
    cep: Option<Cep>,
}

impl crate::grow::Vacancy for Slot {
    fn vacant_generation(&self) -> Option<u32> {
        self.cep.is_none().then_some(self.generation)
    }

    fn vacant(generation: u32) -> Self {
        Self {
            generation,
            cep: None,
        }
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
    /// Released slots, oldest first: reused first-in first-out so that a slot's next
    /// comm ID comes as late as possible (issue #16 item 8a; see [`Self::alloc`]).
    free: VecDeque<u32>,
    /// Slab chunks given back after a peak (`trim`): (chunk, its slots' generations),
    /// kept so that the slots' next comm IDs follow on from their last ones.
    retired: crate::grow::Retired,
    /// The room the last `prepare_for` was asked for (a listen's backlog): a trim keeps it.
    room_wanted: usize,
    /// The most room [`Self::reserve`] was asked for (a kernel client's burst): a trim
    /// keeps it as far as the live CEPs still need it (memory.rs `reserve_need`).
    reserved: usize,
    /// Whether `alloc` may grow the slab (see [`Self::set_fixed_room`]).
    fixed_room: bool,
    live: usize,
    /// The local comm ID layout (src/comm_id.rs).
    ids: CommIdSpace,
    tid_high: u32,
    tid_next: u32,
    rng: ChaCha8Rng,
    remote_ids: PeerMap,
    remote_qpns: PeerMap,
    /// Local QPNs bound to live connections, and their holders (local_qpn.rs).
    local_qpns: local_qpn::LocalQpns,
    /// Every listen, indexed by service ID (listen_table.rs).
    listens: listen_table::ListenTable,
    /// This CA's ports, as [`Self::set_port`] told them (empty: REQ paths unchecked).
    ports: Vec<ports::PortAddress>,
    /// The CA each port belongs to, as [`Self::set_port_ca_guid`] told it.
    port_cas: ports::PortCas,
    /// Ports that are down (link.rs): nothing is sent from them.
    down: link::DownPorts,
    /// Peer-to-peer CEPs with a REQ out (few; pruned as they move on).
    peers: Vec<CepId>,
    /// SIDR requests being answered or lately answered: (request ID, source GID, LID).
    sidr_requests: HashMap<(u32, Gid, u16), CepId, KeyedHash>,
    /// One entry per armed timer (timer_heap.rs), 16 bytes; `reserve` keeps one per CEP.
    timers: timer_heap::TimerHeap,
    timer_seq: NonZeroU32,
    transmits: VecDeque<Transmit>,
    events: VecDeque<(CepId, Event)>,
    /// The private data CEPs keep for repeats (src/pdata_pool.rs).
    pdata: PdataPool,
    /// The CEPs' alternate paths (src/path_table.rs).
    paths: PathTable,
    counters: Counters,
    /// REQs not answered yet, and the MRAs that keep their senders waiting.
    waiting: waiting::Waiting,
    /// REQs past their listens' backlogs, not reported yet (held.rs).
    held: held::HeldTable,
    /// A received REQ or LAP found no room for its alternate path, or the path table's
    /// room runs low, since the last `prepare_for` (alternate.rs).
    paths_short: bool,
    /// A REQ found no room to be held since the last `prepare_for` (held.rs).
    held_short: bool,
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
            free: VecDeque::new(),
            retired: Vec::new(),
            room_wanted: 0,
            reserved: 0,
            live: 0,
            ids: CommIdSpace::new(
                config.comm_id_mask,
                config.comm_id_value,
                config.max_ceps,
                [rng.next_u64(), rng.next_u64()],
            ),
            fixed_room: false,
            tid_high: rng.next_u32(),
            tid_next: 0,
            rng,
            remote_ids: PeerMap::new(hash, PeerField::CommId),
            remote_qpns: PeerMap::new(hash, PeerField::Qpn),
            local_qpns: HashMap::with_hasher(hash),
            listens: listen_table::ListenTable::new(hash),
            ports: Vec::new(),
            port_cas: ports::PortCas::new(),
            down: link::DownPorts::default(),
            peers: Vec::new(),
            sidr_requests: HashMap::with_hasher(hash),
            timers: timer_heap::TimerHeap::default(),
            timer_seq: NonZeroU32::MIN,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            pdata: PdataPool::new(),
            paths: PathTable::new(),
            counters: Counters::default(),
            waiting: waiting::Waiting::default(),
            held: HashMap::with_hasher(hash),
            held_short: false,
            paths_short: false,
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

    /// CEPs made for REQs never reported to their listen's owner: held behind its backlog,
    /// or ended while held and still in timewait (held.rs). O(slab): for checks, not for
    /// a hot path.
    pub fn unreported_requests(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|s| s.cep.as_ref())
            .filter(|c| c.backlog == crate::cep::Backlog::Held)
            .count()
    }

    /// Entries in the peer lookup maps (remote comm ID and remote QPN).
    pub fn peer_map_entries(&self) -> usize {
        self.remote_ids.len() + self.remote_qpns.len() + self.sidr_requests.len()
    }

    /// Timer heap entries: one per armed timer.
    pub fn timer_entries(&self) -> usize {
        self.timers.len()
    }

    /// Preallocates room for `ceps` CEPs and their lookups, so that handling MADs for
    /// them allocates nothing. Fails (changing nothing) if memory runs out.
    pub fn reserve(&mut self, ceps: usize) -> Result<(), CmError> {
        self.reserved = self.reserved.max(ceps);
        // Alternate paths for their REQs and LAPs (path_table.rs): one compare when the
        // room is there.
        self.paths.prepare(ceps)?;
        self.paths_short = false;
        // Room already there costs nothing: a hash map asked to reserve when it has the
        // room but also tombstones rehashes in place, O(n) per call.
        if self.room() >= ceps {
            return Ok(());
        }
        let no = |_| CmError::NoResources;
        self.restore_chunks(ceps)?;
        self.slots.try_reserve(ceps).map_err(no)?;
        // A release never allocates: room in `free` for every slot the slab can hold.
        let slab = self.slots.capacity();
        self.free
            .try_reserve(slab.saturating_sub(self.free.len()))
            .map_err(no)?;
        self.remote_ids
            .try_reserve(ceps, &self.slots)
            .map_err(|_| CmError::NoResources)?;
        self.remote_qpns
            .try_reserve(ceps, &self.slots)
            .map_err(|_| CmError::NoResources)?;
        self.local_qpns
            .try_reserve(ceps)
            .map_err(|_| CmError::NoResources)?;
        // SIDR requests are few and short-lived: room for a burst, not for every CEP.
        self.sidr_requests
            .try_reserve(ceps.min(4096))
            .map_err(|_| CmError::NoResources)?;
        self.timers
            .try_reserve_total(self.live + ceps)
            .map_err(no)?;
        // The queues are empty between entry points.
        reserve_queue(&mut self.events, ceps.min(4096)).map_err(no)?;
        reserve_queue(&mut self.transmits, ceps.min(4096)).map_err(no)?;
        Ok(())
    }

    /// Fixed-room mode, for an owner that makes room ahead ([`Self::reserve`], at
    /// PASSIVE_LEVEL) and receives at DISPATCH_LEVEL, where nothing may be allocated (the
    /// kernel-client interface): a CEP that a received REQ or SIDR_REQ creates never grows
    /// the slab; once its capacity is used, the oldest free slot is reused before
    /// `REUSE_AFTER` are free (its generation still changes, so its comm ID does), or the
    /// request is dropped as a full backlog drops it (its sender retries). `create` still
    /// grows the slab (the owner checks [`Self::room`] first where it must not).
    pub fn set_fixed_room(&mut self, on: bool) {
        self.fixed_room = on;
    }

    /// Makes room (PASSIVE_LEVEL) for `n` listens more than are live, so that `listen`
    /// allocates nothing for them.
    pub fn reserve_listens(&mut self, n: usize) -> Result<(), CmError> {
        self.listens.try_reserve(n)
    }

    /// Listens `listen` adds without allocating.
    pub fn listen_room(&self) -> usize {
        self.listens.room()
    }

    /// The CEP slot indices the slab holds without growing: every CEP made before it grows
    /// has an index below this.
    pub fn slot_capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// How many more CEPs (and their lookups, timers, events and MADs) fit without
    /// allocating.
    pub fn room(&self) -> usize {
        // Free slots are reused only beyond REUSE_AFTER - 1 of them (see `alloc`).
        let slots = self.slots.capacity() - self.slots.len()
            + self.free.len().saturating_sub(REUSE_AFTER - 1);
        let ids = self.remote_ids.capacity() - self.remote_ids.len();
        let qpns = (self.remote_qpns.capacity() - self.remote_qpns.len())
            .min(self.local_qpns.capacity() - self.local_qpns.len());
        let sidr = match self.sidr_requests.capacity() - self.sidr_requests.len() {
            n if n >= 4096 => usize::MAX,
            n => n,
        };
        // Every live CEP may arm its timer.
        let timers = self.timers.capacity().saturating_sub(self.live);
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

    /// The slot a handle names, if its generation is the slot's.
    #[inline]
    fn slot(&self, id: CepId) -> Option<&Slot> {
        self.slots
            .get(id.index())
            .filter(|s| s.generation & 0xff == id.tag())
    }

    /// The handle of slot `index` as it is now.
    fn id_at(&self, index: usize, slot: &Slot) -> CepId {
        CepId::new(index as u32, slot.generation)
    }

    fn cep(&self, id: CepId) -> Option<&Cep> {
        self.slot(id)?.cep.as_ref().filter(|c| !c.detached)
    }

    fn cep_mut(&mut self, id: CepId) -> Option<&mut Cep> {
        let slot = self.slots.get_mut(id.index())?;
        if slot.generation & 0xff != id.tag() {
            return None;
        }
        slot.cep.as_mut()
    }

    fn user_cep(&self, id: CepId) -> Result<&Cep, CmError> {
        self.cep(id).ok_or(CmError::UnknownCep)
    }

    /// Whether a CEP its owner destroyed still lingers (sending its DREQ, in timewait):
    /// the dispatch layer counts it against its owner's budgets until it ends.
    pub fn lingers(&self, id: CepId) -> bool {
        self.slot(id)
            .and_then(|s| s.cep.as_ref())
            .is_some_and(|c| c.detached)
    }

    /// The state of a CEP.
    pub fn state(&self, id: CepId) -> Result<StateName, CmError> {
        Ok(self.user_cep(id)?.state.name())
    }

    /// Records who owns a CEP (the dispatch layer's file and endpoint, or kernel
    /// client): kept in the CEP, so that its owner needs no table indexed by slot that
    /// would keep a past peak's size (issue #20); `None` forgets it. Allocates nothing.
    pub fn set_owner(&mut self, id: CepId, owner: Option<[u64; 2]>) -> Result<(), CmError> {
        let c = self.cep_mut(id).ok_or(CmError::UnknownCep)?;
        c.owned = owner.is_some();
        c.owner = owner.unwrap_or_default();
        Ok(())
    }

    /// Who owns a CEP, as [`set_owner`](Self::set_owner) recorded (destroyed CEPs
    /// lingering in timewait included).
    pub fn owner(&self, id: CepId) -> Option<[u64; 2]> {
        let c = self.slot(id)?.cep.as_ref()?;
        c.owned.then_some(c.owner)
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
            alternate_path: self.alternate_of(c).copied(),
            timewait_ns: c.timewait_ns(self.alternate_of(c)),
        })
    }

    /// The wire LocalCommID of a CEP (its MADs, traces, tests), as the 32-bit big-endian
    /// number (src/comm_id.rs): derived from the slot's whole generation when the slot was
    /// given to it, and kept. Never 0 for a live CEP (see [`Self::alloc`]); 0 for a handle
    /// that names none.
    pub fn local_comm_id(&self, id: CepId) -> u32 {
        self.slot(id)
            .and_then(|s| s.cep.as_ref())
            .map_or(0, |c| c.local_comm_id)
    }

    /// Whether a RemoteCommID received can name one of this manager's CEPs at all (it
    /// carries [`CmConfig::comm_id_mask`]'s pattern and is not 0): what a QP1 steering
    /// function asks (issue #19); see [`CmConfig::is_local_comm_id`].
    pub fn is_local_comm_id(&self, wire: u32) -> bool {
        self.ids.contains(wire)
    }

    /// (index bits, generation bits) of this manager's comm IDs (src/comm_id.rs).
    pub fn comm_id_layout(&self) -> (u32, u32) {
        (self.ids.index_bits(), self.ids.generation_bits())
    }

    /// The handle a wire comm ID names: none if it is outside the space (wrong fixed
    /// bits, or 0) or its generation (all its bits) is not the slot's. O(1), no hash: the
    /// slot's first cache line, which the MAD's handling reads next anyway.
    #[inline]
    fn id_from_wire(&self, comm_id: u32) -> Option<CepId> {
        self.slot_from_wire(comm_id)
            .map(|(index, s)| CepId::new(index as u32, s.generation))
    }

    /// The slot (and its index) a wire comm ID names, if its generation is the slot's.
    #[inline]
    fn slot_from_wire(&self, comm_id: u32) -> Option<(usize, &Slot)> {
        let handle = self.ids.handle_of(comm_id)?;
        let index = self.ids.index(handle);
        let slot = self.slots.get(index)?;
        (slot.generation == self.ids.generation(handle)).then_some((index, slot))
    }

    /// The slot index a wire comm ID names, unchecked (for [`Self::prefetch`]).
    fn index_from_wire(&self, comm_id: u32) -> Option<usize> {
        self.ids.handle_of(comm_id).map(|h| self.ids.index(h))
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
        // INIT from the REQ on (AL `al_cep_get_init_attr`, al_cm_cep.c:6427-6443). RTR and
        // RTS also in REQ_RCVD, with or without an MRA sent, before the REP is formatted:
        // WinVerbs' passive accept reads both before `send_rep` (wv_ep.c:722-767, 816-871),
        // as AL (6480-6490, 6553-6566) and Linux `cm_init_qp_rtr_attr`/`_rts_attr` allow.
        // Not RTS in REQ_SENT, which AL allows (6554): before the REP no send PSN exists,
        // and Linux refuses it too.
        let allowed = match state {
            QpState::Init => {
                negotiated || matches!(c.state, State::ReqSent { .. } | State::ReqRcvd { .. })
            }
            QpState::Rtr | QpState::Rts => negotiated || matches!(c.state, State::ReqRcvd { .. }),
        };
        if !allowed {
            return Err(CmError::InvalidState { state: name });
        }
        Ok(qp_attributes_of(
            c,
            state,
            self.alternate_of(c),
            self.alternate_port(c),
        ))
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
        self.timers.peek().map(|e| e.at)
    }

    // ---- slab ----------------------------------------------------------------------

    /// A slot for a new CEP (issue #16 item 8a: a peer in a long timewait must not see
    /// a local comm ID again soon; IBA 12.9.8.3 stale connections):
    ///
    /// - the slot released longest ago (FIFO), once [`REUSE_AFTER`] slots are free, or
    ///   whatever is free once the slab holds `max_ceps` (or all the layout's index bits
    ///   number);
    /// - otherwise a fresh slot (from the room `reserve` made, or a new chunk), except for
    ///   a CEP a received MAD creates in fixed-room mode ([`Self::set_fixed_room`]) once
    ///   the room is used up: then the oldest free slot, however few are free (or
    ///   `NoResources` if none is), so that nothing is allocated.
    ///
    /// So the free list, once it has reached `REUSE_AFTER`, never drops below
    /// `REUSE_AFTER - 1` (below the limit), and a released slot waits behind at least
    /// that many others: with the generation bumped on every release and started at
    /// random, a wire ID returns only after `REUSE_AFTER` x 2^generation_bits
    /// allocations (2^19 by default), at a cost of at most `REUSE_AFTER` slots more than
    /// the most ever live. (WinOF `__get_lcid` reuses the slot freed last, LIFO; Linux
    /// `cm_alloc_id_priv` allocates cyclically over 2^32, `xa_alloc_cyclic`, in a radix
    /// tree.) An ID whose wire value would be 0 is skipped (0 is "none", IBA Table 108
    /// RemoteCommID).
    fn alloc(&mut self) -> Result<CepId, CmError> {
        self.alloc_slot(true)
    }

    /// [`Self::alloc`] for a CEP a received REQ or SIDR_REQ creates (DISPATCH_LEVEL on
    /// Windows): in fixed-room mode it never grows the slab.
    pub(crate) fn alloc_received(&mut self) -> Result<CepId, CmError> {
        self.alloc_slot(!self.fixed_room)
    }

    fn alloc_slot(&mut self, may_grow: bool) -> Result<CepId, CmError> {
        let len = self.slots.len();
        let limit = self.ids.slots().min(self.config.max_ceps as usize);
        let full = !may_grow && len >= self.slots.capacity();
        let index = if self.free.len() >= REUSE_AFTER || len >= limit || full {
            match self.free.pop_front() {
                Some(index) => Some(index),
                None => return Err(CmError::NoResources),
            }
        } else {
            None
        };
        let ids = self.ids;
        // The generation to hand out and its wire ID, moved off the generation whose wire
        // ID would be 0.
        let usable = |index: u32, generation: u32| {
            let wire = ids.wire(ids.handle(index, generation));
            if wire != 0 {
                return Some((generation, wire));
            }
            let g = generation.wrapping_add(1) & ids.generation_mask();
            let wire = ids.wire(ids.handle(index, g));
            // No generation bits to move off 0 (a mask fixing every free bit, to 0).
            (wire != 0).then_some((g, wire))
        };
        let id = match index {
            Some(index) => {
                let slot = self
                    .slots
                    .get_mut(index as usize)
                    .ok_or(CmError::NoResources)?;
                let Some((generation, wire)) = usable(index, slot.generation) else {
                    // The slot stays free (room for it in `free` was reserved with it).
                    self.free.push_back(index);
                    return Err(CmError::NoResources);
                };
                slot.generation = generation;
                slot.cep = Some(Cep {
                    local_comm_id: wire,
                    ..Cep::new()
                });
                self.slots.filled(index as usize);
                CepId::new(index, generation)
            }
            None => {
                let index = len as u32;
                let random = self.rng.next_u32() & ids.generation_mask();
                let (generation, wire) = usable(index, random).ok_or(CmError::NoResources)?;
                self.slots
                    .try_reserve(1)
                    .map_err(|_| CmError::NoResources)?;
                // Room to release every slot without allocating.
                self.free
                    .try_reserve((len + 1).saturating_sub(self.free.len()))
                    .map_err(|_| CmError::NoResources)?;
                self.slots.push(Slot {
                    generation,
                    cep: Some(Cep {
                        local_comm_id: wire,
                        ..Cep::new()
                    }),
                });
                self.slots.filled(index as usize);
                CepId::new(index, generation)
            }
        };
        self.live += 1;
        Ok(id)
    }

    fn release(&mut self, id: CepId) {
        // Its timer's entry goes with it.
        self.cancel_timer(id);
        let index = id.index();
        let mask = self.ids.generation_mask();
        // The (CA GUID, QPN) the CEP binds, if it does (local_qpn.rs).
        let bound = self
            .cep_any(id)
            .filter(|c| local_qpn::binds(c.state))
            .map(|c| (c.dest.port, c.local_qpn))
            .map(|(port, qpn)| (self.ca_guid_of(port), qpn));
        if let Some(slot) = self.slots.get_mut(index)
            && slot.generation & 0xff == id.tag()
            && let Some(c) = slot.cep.take()
        {
            if let Some(key) = bound {
                local_qpn::unbind(&mut self.local_qpns, key);
            }
            self.waiting.on_release(c.state);
            // Its private data goes back to the pool (never allocates).
            for held in [c.pdata, c.mra_pdata, c.apr_info] {
                self.pdata.free(held);
            }
            // And its alternate paths to the path table.
            self.paths.free(c.alternate);
            self.paths.free(c.pending_alternate);
            slot.generation = slot.generation.wrapping_add(1) & mask;
            self.live = self.live.saturating_sub(1);
            self.slots.vacated(index);
            // Capacity for every slot was reserved when the slot was created.
            self.free.push_back(index as u32);
        }
    }

    fn fresh_tid(&mut self) -> u64 {
        self.tid_next = self.tid_next.wrapping_add(1);
        (u64::from(self.tid_high) << 32) | u64::from(self.tid_next)
    }

    fn random_psn(&mut self) -> u32 {
        self.rng.next_u32() & 0x00ff_ffff
    }
}

/// The private data cached for `attr`, or none if the cache holds another message's.
fn cached<'a>(pool: &'a PdataPool, c: &Cep, attr: AttributeId) -> &'a [u8] {
    if c.cached == Some(attr) {
        pool.get(c.pdata)
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
