//! The device: every IOCTL, every received MAD and every timer expiry goes through here.
//!
//! One lock guards the engine and all tables. Each entry point takes the lock, validates
//! its input completely before changing anything, calls the engine, then drains the
//! engine's output into batches *under* the lock: MADs to send, and requests to complete
//! (a pending GET_EVENT takes its event records at once, written into its own output
//! buffer). The lock is released, and only then are MADs posted, requests completed and
//! the timer armed (design.md, "Data flow").

use alloc::collections::VecDeque;
use alloc::vec::Vec;

mod client;

pub use client::{Callback, ClientEvent, ClientId};

use ibcm_cep::grow::{ChunkedVec, reserve_queue};
use ibcm_cep::{CepId, CmConfig, CmManager, Event, Instant, MadAddress, QpState, Transmit};
use ibcm_ioctl::{
    ABI_VERSION, AprIn, ConnectIn, CountersIn, CountersOut, CreateIn, CreateOut, EventRecord,
    FormatRepIn, GetQpAttrIn, HandleIn, LapIn, ListenIn, MAX_EVENTS_PER_REQUEST, MraIn,
    PrivateDataIn, QpAttrOut, QpTransitionsOut, RejIn, SidrRepIn, SidrReqIn, VersionIn, VersionOut,
    code, event_type, flags, limits, status,
};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::platform::{Lock, Platform, Request};
use crate::records::{
    Status, event_to_abi, mtu_from_abi, path_from_abi, qp_attr_to_abi, qp_state_from_abi,
    query_to_abi, removal_record, require, status_of, transport_from_abi, used,
};
use crate::trace::{DispatchHook, DispatchPoint};

/// A file handle (one open of the device): index and generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId(u64);

impl FileId {
    /// The raw value (index | generation << 32), for platform tables.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

/// Emptied MAD batches kept ready for entry points that overlap (see `take_flush`).
const SPARE_BATCHES: usize = 4;
/// Emptied batches kept at most: entry points nest (a completion's caller issues the
/// next IOCTL from inside `finish`), and the batches of the outer ones come back after
/// the inner ones refilled the spares; keeping them saves allocating them again.
const KEPT_BATCHES: usize = 2 * SPARE_BATCHES;
/// MADs one entry point at DISPATCH_LEVEL may queue, and requests it may complete: a
/// timer pass sends at most one MAD and reports at most one event (which completes at
/// most one pending GET_EVENT) per timer it handles; a received MAD brings a couple.
const DISPATCH_BATCH: usize = ibcm_cep::TIMER_BATCH + 8;

/// MADs one [`Device::receive_batch`] call takes at most: each brings a couple of MADs to
/// send and requests to complete, so a batch stays well inside [`DISPATCH_BATCH`].
pub const RECEIVE_BATCH: usize = 16;

/// Largest listen backlog an IOCTL may ask for.
pub const MAX_BACKLOG: u32 = 4096;
/// Event records a new endpoint's FIFO holds.
const FIFO_DEPTH: usize = EVENT_HEADROOM;
/// Room every IOCTL naming an endpoint leaves in its FIFO (at PASSIVE_LEVEL), so that the
/// events arriving at DISPATCH_LEVEL until the user names it again never grow it: without
/// a user operation the engine reports at most this many transitions of one connection
/// (REP_SENT: MRA, RTU, LAP, DREQ, DREP, REJ, timewait exit).
const EVENT_HEADROOM: usize = 8;
/// Room in the FIFO of an endpoint a REQ creates, before the user first names it: from
/// REQ_RCVD the engine reports at most a REJ (or a stale connection) and a timewait exit.
const CHILD_DEPTH: usize = 2;

fn handle_of(index: u32, generation: u32) -> u64 {
    u64::from(index) | (u64::from(generation) << 32)
}

fn split(handle: u64) -> (usize, u32) {
    ((handle & 0xffff_ffff) as usize, (handle >> 32) as u32)
}

/// Records in one chunk of the [`RecordPool`] (475 KB).
const RECORD_CHUNK: usize = 1024;

/// The event records queued on the endpoints of the device, in one pool: an endpoint's
/// FIFO holds indices into it. Every FIFO's capacity is room promised here and made at
/// PASSIVE_LEVEL, so queueing a record at DISPATCH_LEVEL never allocates; and memory is
/// touched only for the records queued at once, not for every endpoint's headroom of
/// 464-byte records. The pool grows by whole chunks that are never moved: growing one
/// large vector would copy (and so touch) all the room it had.
#[derive(Debug, Default)]
struct RecordPool {
    chunks: Vec<Vec<EventRecord>>,
    /// Slots ever used; slot `i` is `chunks[i / RECORD_CHUNK][i % RECORD_CHUNK]`.
    used: usize,
    free: Vec<u32>,
    /// The capacities of every endpoint's FIFO (live and spare) summed.
    promised: usize,
}

impl RecordPool {
    fn slot(&mut self, i: u32) -> Option<&mut EventRecord> {
        let i = i as usize;
        self.chunks
            .get_mut(i / RECORD_CHUNK)?
            .get_mut(i % RECORD_CHUNK)
    }

    /// Stores `record`; `None` only past u32::MAX records.
    fn put(&mut self, record: &EventRecord) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            if let Some(slot) = self.slot(i) {
                *slot = *record;
            }
            return Some(i);
        }
        let i = u32::try_from(self.used).ok()?;
        let chunk = self.used / RECORD_CHUNK;
        if chunk == self.chunks.len() {
            // Only when more records are queued than was promised (not at DISPATCH_LEVEL).
            self.chunks.push(Vec::with_capacity(RECORD_CHUNK));
        }
        self.chunks.get_mut(chunk)?.push(*record);
        self.used += 1;
        Some(i)
    }

    fn get(&self, i: u32) -> Option<&EventRecord> {
        let i = i as usize;
        self.chunks.get(i / RECORD_CHUNK)?.get(i % RECORD_CHUNK)
    }

    /// Takes record `i` out, freeing its slot.
    fn take(&mut self, i: u32) -> Option<EventRecord> {
        let record = *self.get(i)?;
        self.free.push(i);
        Some(record)
    }

    /// A new FIFO of `depth` records.
    fn fifo(&mut self, depth: usize) -> VecDeque<u32> {
        let fifo = VecDeque::with_capacity(depth);
        self.promised += fifo.capacity();
        fifo
    }

    /// Room in `fifo` for `n` more records (PASSIVE_LEVEL).
    fn grow(&mut self, fifo: &mut VecDeque<u32>, n: usize) -> Result<(), Status> {
        let before = fifo.capacity();
        reserve_queue(fifo, n).map_err(|_| status::INSUFFICIENT_RESOURCES)?;
        self.promised += fifo.capacity() - before;
        Ok(())
    }

    /// A FIFO is gone: its records and its promise are released.
    fn release(&mut self, fifo: &VecDeque<u32>) {
        for &i in fifo {
            let _ = self.take(i);
        }
        self.promised = self.promised.saturating_sub(fifo.capacity());
    }

    /// Room for every record promised (PASSIVE_LEVEL): no FIFO holds more than its
    /// capacity, so at most `promised` slots are in use at once, and the free list holds
    /// at most every slot.
    fn prepare(&mut self) {
        let want = self.promised.div_ceil(RECORD_CHUNK);
        if self.chunks.len() < want {
            self.chunks.reserve(want - self.chunks.len());
            while self.chunks.len() < want {
                self.chunks.push(Vec::with_capacity(RECORD_CHUNK));
            }
        }
        let slots = self.chunks.len() * RECORD_CHUNK;
        if self.free.capacity() < slots {
            self.free.reserve(slots - self.free.len());
        }
    }
}

/// What a CONNECT or SEND_REP with an output buffer waits for (see `code::CONNECT`).
#[derive(Debug, Clone, Copy)]
enum Awaited {
    /// The REP (or what ended the attempt, or, peer to peer, the crossing REQ that made
    /// this side passive); with the QP transitions after a REP when the buffer holds them.
    Rep { transitions: bool },
    /// The RTU (or a DREQ, or what ended the attempt).
    Rtu,
}

impl Awaited {
    fn answered_by(self, event: u32) -> bool {
        let ends = matches!(
            event,
            event_type::REJECTED | event_type::TIMEOUT | event_type::DEVICE_REMOVAL
        );
        ends || match self {
            Awaited::Rep { .. } => {
                matches!(event, event_type::REP_RECEIVED | event_type::REQ_RECEIVED)
            }
            Awaited::Rtu => matches!(event, event_type::RTU_RECEIVED | event_type::DREQ_RECEIVED),
        }
    }
}

#[derive(Debug)]
struct Endpoint<R> {
    cep: CepId,
    /// Queued events: indices into the device's [`RecordPool`].
    events: VecDeque<u32>,
    pending: VecDeque<R>,
    /// A CONNECT or SEND_REP waiting for its answer (held inline: parking it allocates
    /// nothing, and its answer arrives at DISPATCH_LEVEL).
    answer: Option<(R, Awaited)>,
    /// Private data of the last message received, for QUERY.
    private_data: [u8; 224],
    private_data_len: u8,
    /// LISTEN's backlog while listening.
    backlog: u32,
}

impl<R> Endpoint<R> {
    fn new(cep: CepId, events: VecDeque<u32>) -> Self {
        Self {
            cep,
            events,
            pending: VecDeque::new(),
            answer: None,
            private_data: [0; 224],
            private_data_len: 0,
            backlog: 0,
        }
    }
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// A generation-checked table: handles are `index | generation << 32`, generation >= 1.
#[derive(Debug)]
struct Table<T> {
    /// Grows by chunks: an endpoint never moves and growing copies nothing.
    slots: ChunkedVec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Table<T> {
    const fn new() -> Self {
        Self {
            slots: ChunkedVec::new(),
            free: Vec::new(),
            live: 0,
        }
    }

    fn get(&self, handle: u64) -> Option<&T> {
        let (i, g) = split(handle);
        let s = self.slots.get(i)?;
        (s.generation == g).then_some(s.value.as_ref()).flatten()
    }

    fn get_mut(&mut self, handle: u64) -> Option<&mut T> {
        let (i, g) = split(handle);
        let s = self.slots.get_mut(i)?;
        if s.generation != g {
            return None;
        }
        s.value.as_mut()
    }

    fn insert(&mut self, value: T) -> u64 {
        self.live += 1;
        if let Some(i) = self.free.pop()
            && let Some(s) = self.slots.get_mut(i as usize)
        {
            s.value = Some(value);
            return handle_of(i, s.generation);
        }
        let i = self.slots.len() as u32;
        self.slots.push(Slot {
            generation: 1,
            value: Some(value),
        });
        self.free
            .reserve(self.slots.len().saturating_sub(self.free.len()));
        handle_of(i, 1)
    }

    fn remove(&mut self, handle: u64) -> Option<T> {
        let (i, g) = split(handle);
        let s = self.slots.get_mut(i)?;
        if s.generation != g {
            return None;
        }
        let v = s.value.take()?;
        s.generation = s.generation.wrapping_add(1).max(1);
        self.live -= 1;
        self.free.push(i as u32);
        Some(v)
    }

    /// Room for `n` more values without allocating.
    fn reserve(&mut self, n: usize) {
        let spare = self.free.len();
        if n > spare {
            // Out of memory leaves the room short; `can_insert` then refuses the insert.
            let _ = self.slots.try_reserve(n - spare);
            // `insert` keeps room in `free` for every slot (so that `remove` never
            // allocates): make that room now for the slots the new values may add.
            let slots = self.slots.len() + (n - spare);
            self.free.reserve(slots.saturating_sub(self.free.len()));
        }
    }

    /// Whether `insert` can run without allocating.
    fn can_insert(&self) -> bool {
        !self.free.is_empty()
            || (self.slots.len() < self.slots.capacity() && self.free.capacity() > self.slots.len())
    }

    fn handles(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_ref().map(|_| handle_of(i as u32, s.generation)))
    }
}

#[derive(Debug)]
struct File<R> {
    versioned: bool,
    endpoints: Table<Endpoint<R>>,
    /// Endpoints built ahead (at PASSIVE_LEVEL) for REQs that arrive at DISPATCH_LEVEL.
    spares: Vec<Endpoint<R>>,
    /// The sum of its listens' backlogs (kept, so that preparing for REQs does not walk
    /// every endpoint of the file on every GET_EVENT).
    backlog: usize,
}

#[derive(Debug, Clone, Copy)]
struct Owner {
    cep: CepId,
    file: u64,
    endpoint: u64,
}

/// Everything the lock guards.
pub struct Inner<P: Platform> {
    cm: CmManager,
    removed: bool,
    files: Table<File<P::Request>>,
    /// The endpoint of each CEP, indexed by the CEP's slab index.
    owners: Vec<Option<Owner>>,
    tx: Vec<Transmit>,
    /// Emptied MAD batches with room, for the entry point that runs while another one's
    /// batch is out being sent.
    spare_tx: Vec<Vec<Transmit>>,
    /// Emptied completion batches with room, likewise: a receive completing a GET_EVENT
    /// while another entry point's completions are out must not allocate.
    spare_done: Vec<Vec<(P::Request, i32, usize)>>,
    done: Vec<(P::Request, i32, usize)>,
    records: RecordPool,
    /// The time of the entry point running under the lock.
    now: Instant,
    clients: client::Clients<P>,
    /// Flushes taken so far: orders their timer deadlines (see `finish`).
    flushes: u64,
    /// The deadline the last flush carried: a flush with the same one need not re-arm
    /// (the flush that carried it first arms it, unless a newer one overrides it). `None`
    /// once the timer fired: a one-shot timer (WdfTimerStart) must then be armed again.
    deadline: Option<Option<Instant>>,
    trace: DispatchHook,
}

/// Work to do once the lock is released.
struct Flush<R> {
    tx: Vec<Transmit>,
    done: Vec<(R, i32, usize)>,
    /// The deadline to arm the timer to, if it changed since the last flush.
    timer: Option<Option<Instant>>,
    /// Its place among flushes (`Inner::flushes`).
    seq: u64,
    /// Kernel clients have events to deliver.
    callbacks: bool,
}

/// The dispatch layer of one CA: the engine, the per-handle endpoint tables, and the
/// event queues; generic over the platform so that the KMDF binding and the host share it.
pub struct Device<P: Platform> {
    platform: P,
    inner: P::Lock<Inner<P>>,
    /// The flush whose deadline the timer was last armed to: flushes overlap once the lock
    /// is released, and an older one must not re-arm (or disarm) over a newer one.
    armed: P::Lock<u64>,
}

type Outcome = Result<usize, Status>;

/// A batch that holds `n` values without growing, for the entry points that run before
/// the next PASSIVE_LEVEL one. A batch that is not empty leaves with the running entry
/// point's flush (`take_flush` puts a spare in its place), so only an empty one matters;
/// it is replaced rather than grown, which would copy its old capacity for nothing.
fn room<T>(v: &mut Vec<T>, n: usize) {
    if v.is_empty() && v.capacity() < n {
        *v = Vec::with_capacity(n);
    }
}

fn input<T: FromBytes + KnownLayout + Immutable>(bytes: &[u8], size: u32) -> Result<T, Status> {
    let record = T::read_from_bytes(bytes).map_err(|_| status::INFO_LENGTH_MISMATCH)?;
    let declared = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes);
    if declared != Some(size) {
        return Err(status::REVISION_MISMATCH);
    }
    Ok(record)
}

fn output<R: Request, T: IntoBytes + Immutable>(request: &mut R, value: &T) -> Outcome {
    let bytes = value.as_bytes();
    if request.output_len() < bytes.len() {
        return Err(status::BUFFER_TOO_SMALL);
    }
    request.write_output(0, bytes);
    Ok(bytes.len())
}

impl<P: Platform> Inner<P> {
    fn file(&mut self, file: FileId) -> Result<&mut File<P::Request>, Status> {
        self.files.get_mut(file.0).ok_or(status::INVALID_HANDLE)
    }

    fn endpoint(&mut self, file: FileId, handle: u64) -> Result<&mut Endpoint<P::Request>, Status> {
        self.file(file)?
            .endpoints
            .get_mut(handle)
            .ok_or(status::INVALID_HANDLE)
    }

    fn cep_of(&mut self, file: FileId, handle: u64) -> Result<CepId, Status> {
        Ok(self.endpoint(file, handle)?.cep)
    }

    /// The CEP of the endpoint an IOCTL names (PASSIVE_LEVEL), after making room in its
    /// FIFO for the events that may arrive at DISPATCH_LEVEL before it is named again.
    fn touch(&mut self, file: FileId, handle: u64) -> Result<CepId, Status> {
        self.grow_fifo(file, handle, EVENT_HEADROOM)
    }

    /// Room in an endpoint's FIFO for `n` more events (PASSIVE_LEVEL); its CEP.
    fn grow_fifo(&mut self, file: FileId, handle: u64, n: usize) -> Result<CepId, Status> {
        let ep = self
            .files
            .get_mut(file.0)
            .ok_or(status::INVALID_HANDLE)?
            .endpoints
            .get_mut(handle)
            .ok_or(status::INVALID_HANDLE)?;
        self.records.grow(&mut ep.events, n)?;
        Ok(ep.cep)
    }

    fn set_owner(&mut self, cep: CepId, owner: Owner) {
        let i = (cep.to_raw() & 0x00ff_ffff) as usize;
        if self.owners.len() <= i {
            self.owners.resize(i + 1, None);
        }
        if let Some(o) = self.owners.get_mut(i) {
            *o = Some(owner);
        }
    }

    fn owner(&self, cep: CepId) -> Option<Owner> {
        let i = (cep.to_raw() & 0x00ff_ffff) as usize;
        self.owners
            .get(i)
            .copied()
            .flatten()
            .filter(|o| o.cep == cep)
    }

    fn clear_owner(&mut self, cep: CepId) {
        let i = (cep.to_raw() & 0x00ff_ffff) as usize;
        if let Some(o) = self.owners.get_mut(i)
            && o.is_some_and(|o| o.cep == cep)
        {
            *o = None;
        }
    }

    /// Grows, at PASSIVE_LEVEL, everything a burst of REQs on this file's listens could
    /// need at DISPATCH_LEVEL: spare endpoints, table slots, owner entries, engine slots.
    /// The engine also gets room for a burst over every live CEP at once: a REP or DREP
    /// for each connecting or disconnecting CEP (peer-table entries, timers, events). The
    /// batches are bounded: a DISPATCH_LEVEL entry point sends and completes at most
    /// [`DISPATCH_BATCH`] MADs and requests.
    fn prepare_for_requests(&mut self, file: FileId, extra: usize) {
        let Some(f) = self.files.get_mut(file.0) else {
            return;
        };
        let want = f.backlog + extra;
        f.endpoints.reserve(want);
        while f.spares.len() < want {
            let events = self.records.fifo(CHILD_DEPTH);
            f.spares.push(Endpoint::new(CepId::from_raw(0), events));
        }
        self.prepare_owners(want);
        let burst = want + self.cm.live_ceps();
        // Grow by doubling when short, so the engine's tables grow amortised O(1).
        if self.cm.room() < burst {
            let _ = self.cm.reserve(burst.saturating_mul(2));
        }
    }

    /// Room in the owner table for `n` more CEPs, and in the batches (PASSIVE_LEVEL). The
    /// engine reuses free slab slots before it grows the slab, so `n` new CEPs have
    /// indices below the slab's high-water mark (which the table already covers) or below
    /// live + `n`: the table grows to that and no further, however often this is called.
    fn prepare_owners(&mut self, n: usize) {
        let room = self.owners.len().max(self.cm.live_ceps() + n);
        self.owners.resize(room, None);
        self.prepare_batches();
    }

    /// Room for [`DISPATCH_BATCH`] MADs and completions in the batches and in every
    /// spare batch, so that a timer pass or a receive at DISPATCH_LEVEL finds room
    /// whichever batch it gets (PASSIVE_LEVEL).
    fn prepare_batches(&mut self) {
        self.records.prepare();
        // A batch is made with room for DISPATCH_BATCH or none (an empty stand-in), and
        // `finish` keeps only batches with room: only missing ones need making.
        room(&mut self.tx, DISPATCH_BATCH);
        while self.spare_tx.len() < SPARE_BATCHES {
            self.spare_tx.push(Vec::with_capacity(DISPATCH_BATCH));
        }
        room(&mut self.done, DISPATCH_BATCH);
        while self.spare_done.len() < SPARE_BATCHES {
            self.spare_done.push(Vec::with_capacity(DISPATCH_BATCH));
        }
    }

    /// Moves the engine's output into the batches and the endpoints' queues.
    fn drain(&mut self) {
        loop {
            while let Some(t) = self.cm.poll_transmit() {
                if !self.removed {
                    self.tx.push(t);
                }
            }
            // Routing may send (a REQ refused for want of room is rejected).
            let Some((cep, event)) = self.cm.poll_event() else {
                break;
            };
            self.route(cep, &event);
        }
    }

    fn route(&mut self, cep: CepId, event: &Event) {
        match event {
            // A peer-to-peer CEP that turned passive reports the REQ on itself.
            Event::ReqReceived(req) if req.listen != cep => {
                self.route_request(cep, req.listen, event);
                return;
            }
            Event::SidrReqReceived(req) => {
                self.route_request(cep, req.listen, event);
                return;
            }
            _ => {}
        }
        let Some(o) = self.owner(cep) else { return };
        if o.file == client::CLIENT_FILE {
            self.queue_client(
                o.endpoint,
                client::ClientEvent {
                    event: *event,
                    new_id: None,
                },
            );
            return;
        }
        let record = event_to_abi(event, o.endpoint, 0);
        self.deliver(FileId(o.file), o.endpoint, &record);
    }

    /// A REQ created `cep` under `listen`: the new endpoint joins the listen's file, and
    /// the event is queued on the listen's endpoint, naming the new handle.
    fn route_request(&mut self, cep: CepId, listen: CepId, event: &Event) {
        let Some(lo) = self.owner(listen) else {
            return;
        };
        if lo.file == client::CLIENT_FILE {
            self.client_request(cep, lo.endpoint, event);
            return;
        }
        // DISPATCH_LEVEL: the REQ takes a spare endpoint, a table slot, an owner entry and
        // room in the listen's FIFO, all made at PASSIVE_LEVEL. Without them it is refused
        // (the engine rejects it) rather than allocated for: a peer cycling REQs and REJs
        // cannot grow the file while its owner does not read its events.
        let owned = ((cep.to_raw() & 0x00ff_ffff) as usize) < self.owners.len();
        let Ok(file) = self.file(FileId(lo.file)) else {
            return;
        };
        let listen_room = file
            .endpoints
            .get(lo.endpoint)
            .is_some_and(|l| l.events.len() < l.events.capacity());
        let spare = if owned && listen_room && file.endpoints.can_insert() {
            file.spares.pop()
        } else {
            None
        };
        let Some(mut ep) = spare else {
            let now = self.now;
            let _ = self.cm.destroy(now, cep);
            return;
        };
        ep.cep = cep;
        if let Event::ReqReceived(ibcm_cep::ReqInfo { private_data, .. })
        | Event::SidrReqReceived(ibcm_cep::SidrReqInfo { private_data, .. }) = event
        {
            let pd = private_data.as_slice();
            let n = pd.len().min(224);
            if let (Some(d), Some(s)) = (ep.private_data.get_mut(..n), pd.get(..n)) {
                d.copy_from_slice(s);
            }
            ep.private_data_len = n as u8;
        }
        let handle = file.endpoints.insert(ep);
        self.set_owner(
            cep,
            Owner {
                cep,
                file: lo.file,
                endpoint: handle,
            },
        );
        let record = event_to_abi(event, lo.endpoint, handle);
        self.deliver(FileId(lo.file), lo.endpoint, &record);
    }

    /// Gives a record to a waiting GET_EVENT, or queues it (copied once, to where it goes).
    fn deliver(&mut self, file: FileId, endpoint: u64, record: &EventRecord) {
        let Some(ep) = self
            .files
            .get_mut(file.0)
            .and_then(|f| f.endpoints.get_mut(endpoint))
        else {
            return;
        };
        if record.new_handle == 0 && record.private_data_len > 0 {
            let n = usize::from(record.private_data_len);
            if let (Some(d), Some(s)) = (ep.private_data.get_mut(..n), record.private_data.get(..n))
            {
                d.copy_from_slice(s);
            }
            ep.private_data_len = record.private_data_len;
        }
        if ep
            .answer
            .as_ref()
            .is_some_and(|(_, awaited)| awaited.answered_by(record.event_type))
            && let Some((mut request, awaited)) = ep.answer.take()
        {
            // The CONNECT or SEND_REP that waits for this answer takes it.
            let cep = ep.cep;
            request.write_output(0, record.as_bytes());
            let mut n = EventRecord::SIZE as usize;
            if let Awaited::Rep { transitions: true } = awaited
                && record.event_type == event_type::REP_RECEIVED
                && let Ok(t) = qp_transitions(&self.cm, cep)
            {
                request.write_output(n, t.as_bytes());
                n += QpTransitionsOut::SIZE as usize;
            }
            self.done.push((request, status::SUCCESS, n));
            return;
        }
        if ep.events.is_empty()
            && let Some(mut request) = ep.pending.pop_front()
        {
            // Nothing queued and a GET_EVENT waits (the usual case): the record goes
            // straight to its buffer, which holds one at least (checked at dispatch).
            request.write_output(0, record.as_bytes());
            self.handed_over(file, record);
            self.done
                .push((request, status::SUCCESS, EventRecord::SIZE as usize));
            return;
        }
        let Some(index) = self.records.put(record) else {
            return;
        };
        ep.events.push_back(index);
        if let Some(request) = ep.pending.pop_front() {
            self.fill(file, endpoint, request);
        }
    }

    /// Completes `request` with as many queued records of the endpoint as its buffer holds.
    fn fill(&mut self, file: FileId, endpoint: u64, mut request: P::Request) {
        let capacity = (request.output_len() / EventRecord::SIZE as usize)
            .min(MAX_EVENTS_PER_REQUEST as usize);
        let mut written = 0usize;
        while written < capacity {
            let Some(record) = self
                .endpoint(file, endpoint)
                .ok()
                .and_then(|ep| ep.events.pop_front())
                .and_then(|index| self.records.take(index))
            else {
                break;
            };
            request.write_output(written * EventRecord::SIZE as usize, record.as_bytes());
            written += 1;
            self.handed_over(file, &record);
        }
        self.done.push((
            request,
            status::SUCCESS,
            written * EventRecord::SIZE as usize,
        ));
    }

    /// A record reached the user: a REQ's new endpoint is now known to them, and leaves
    /// the listen's backlog.
    fn handed_over(&mut self, file: FileId, record: &EventRecord) {
        if (record.event_type == event_type::REQ_RECEIVED
            || record.event_type == event_type::SIDR_REQ_RECEIVED)
            && record.new_handle != 0
            && let Ok(child) = self.cep_of(file, record.new_handle)
        {
            let _ = self.cm.take_request(child);
        }
    }

    fn take_flush(&mut self) -> Flush<P::Request> {
        // The batches go out with no lock held; an entry point running meanwhile (the
        // receive path, DISPATCH_LEVEL, on another CPU) must still find room without
        // allocating: an empty batch stays, a MAD batch is replaced by a spare.
        let tx = if self.tx.is_empty() {
            Vec::new()
        } else {
            let spare = self.spare_tx.pop().unwrap_or_default();
            core::mem::replace(&mut self.tx, spare)
        };
        Flush {
            tx,
            done: if self.done.is_empty() {
                Vec::new()
            } else {
                let spare = self.spare_done.pop().unwrap_or_default();
                core::mem::replace(&mut self.done, spare)
            },
            timer: {
                let deadline = if self.removed {
                    None
                } else {
                    self.cm.poll_timeout()
                };
                let changed = self.deadline != Some(deadline);
                self.deadline = Some(deadline);
                changed.then_some(deadline)
            },
            seq: {
                self.flushes += 1;
                self.flushes
            },
            callbacks: !self.clients.ready.is_empty(),
        }
    }
}

impl<P: Platform> Device<P> {
    /// A device whose engine uses `config`.
    pub fn new(platform: P, config: CmConfig) -> Self {
        let trace = DispatchHook::new(platform.tracer());
        let mut cm = CmManager::new(config);
        cm.set_tracer(trace.engine());
        let mut inner = Inner {
            cm,
            removed: false,
            files: Table::new(),
            owners: Vec::new(),
            tx: Vec::new(),
            spare_tx: Vec::with_capacity(KEPT_BATCHES),
            spare_done: Vec::with_capacity(KEPT_BATCHES),
            done: Vec::new(),
            records: RecordPool::default(),
            now: Instant::from_nanos(0),
            clients: client::Clients::new(),
            flushes: 0,
            deadline: None,
            trace,
        };
        // Device add runs at PASSIVE_LEVEL: a node nobody has opened yet still answers
        // MADs (a REJ to a REQ for no listen) and runs timers without allocating.
        let _ = inner.cm.reserve(DISPATCH_BATCH);
        inner.prepare_batches();
        Self {
            platform,
            inner: P::new_lock(inner),
            armed: P::new_lock(0),
        }
    }

    /// The platform.
    pub fn platform(&self) -> &P {
        &self.platform
    }

    /// Runs `f` on the engine under the lock (counters and diagnostics).
    pub fn with_engine<T>(&self, f: impl FnOnce(&CmManager) -> T) -> T {
        self.inner.with(|i| f(&i.cm))
    }

    fn run<T>(&self, f: impl FnOnce(&mut Inner<P>) -> T) -> T {
        let now = self.platform.now();
        let (value, flush) = self.inner.with(|i| {
            i.now = now;
            let value = f(i);
            i.drain();
            (value, i.take_flush())
        });
        let callbacks = flush.callbacks;
        self.finish(flush);
        // Every entry point that makes a kernel client's event ready delivers it.
        if callbacks {
            self.deliver_callbacks();
        }
        value
    }

    /// Sends, completes and re-arms with no lock held, then hands the emptied batch
    /// vectors back so their capacity is reused.
    fn finish(&self, mut flush: Flush<P::Request>) {
        for t in &flush.tx {
            self.platform.send(t);
        }
        for (request, st, info) in flush.done.drain(..) {
            self.platform.complete(request, st, info);
        }
        // The newest flush's deadline is the engine's: one computed before it (by an entry
        // point whose batch went out more slowly) would leave the timer stale, or disarm
        // it while a retry or timewait is pending (nothing would then fire it).
        if let Some(timer) = flush.timer {
            self.armed.with(|last| {
                if flush.seq > *last {
                    *last = flush.seq;
                    self.platform.set_timer(timer);
                }
            });
        }
        flush.tx.clear();
        if flush.tx.capacity() == 0 && flush.done.capacity() == 0 {
            // Both batches stayed in place (they were empty): nothing to hand back.
            return;
        }
        self.inner.with(|i| {
            // Between entry points the batch is empty: keep the roomier one, spare the other.
            if i.tx.capacity() < flush.tx.capacity() {
                core::mem::swap(&mut i.tx, &mut flush.tx);
            }
            if flush.tx.capacity() > 0 && i.spare_tx.len() < i.spare_tx.capacity() {
                i.spare_tx.push(core::mem::take(&mut flush.tx));
            }
            if i.done.capacity() < flush.done.capacity() {
                core::mem::swap(&mut i.done, &mut flush.done);
            }
            if flush.done.capacity() > 0 && i.spare_done.len() < i.spare_done.capacity() {
                i.spare_done.push(core::mem::take(&mut flush.done));
            }
        });
    }

    /// A new file handle (IRP_MJ_CREATE).
    pub fn open(&self) -> FileId {
        self.inner.with(|i| {
            FileId(i.files.insert(File {
                versioned: false,
                endpoints: Table::new(),
                spares: Vec::new(),
                backlog: 0,
            }))
        })
    }

    /// IRP_MJ_CLEANUP: destroys every endpoint of the file and completes its pending
    /// requests with STATUS_CANCELLED. Nothing waits on the network.
    pub fn cleanup(&self, file: FileId) {
        let now = self.platform.now();
        self.run(|i| {
            let handles: Vec<u64> = match i.file(file) {
                Ok(f) => f.endpoints.handles().collect(),
                Err(_) => return,
            };
            i.trace.point(DispatchPoint::Cleanup {
                file,
                endpoints: handles.len() as u32,
            });
            for h in handles {
                let _ = destroy_endpoint(i, now, file, h);
            }
        });
    }

    /// IRP_MJ_CLOSE: forgets the file. Call after [`cleanup`](Self::cleanup).
    pub fn close(&self, file: FileId) -> bool {
        self.cleanup(file);
        self.inner.with(|i| match i.files.remove(file.0) {
            Some(f) => {
                for spare in &f.spares {
                    i.records.release(&spare.events);
                }
                true
            }
            None => false,
        })
    }

    /// Endpoints of a file, for accounting at close.
    pub fn endpoint_count(&self, file: FileId) -> usize {
        self.inner
            .with(|i| i.files.get(file.0).map_or(0, |f| f.endpoints.live))
    }

    /// Open files.
    pub fn file_count(&self) -> usize {
        self.inner.with(|i| i.files.live)
    }

    /// EvtIoDeviceControl: validates and carries out one IOCTL. The request is always
    /// completed, now or (GET_EVENT) when an event arrives, is cancelled, or the handle
    /// closes.
    pub fn dispatch(&self, file: FileId, request: P::Request, code: u32, input: &[u8]) {
        let now = self.platform.now();
        self.run(|i| {
            if i.removed {
                i.done.push((request, status::DEVICE_REMOVED, 0));
            } else {
                ioctl(i, now, file, request, code, input);
            }
        });
    }

    /// The platform's cancel routine for a pending GET_EVENT: completes it with
    /// STATUS_CANCELLED unless it was already completed (then this does nothing).
    pub fn cancel(&self, file: FileId, key: u64) {
        self.run(|i| {
            // DISPATCH_LEVEL (the I/O manager's cancel routine): nothing is allocated.
            let Ok(f) = i.file(file) else { return };
            let found = f
                .endpoints
                .slots
                .iter_mut()
                .filter_map(|s| s.value.as_mut())
                .find_map(|ep| {
                    if ep.answer.as_ref().is_some_and(|(r, _)| r.key() == key) {
                        return ep.answer.take().map(|(r, _)| r);
                    }
                    let pos = ep.pending.iter().position(|r| r.key() == key)?;
                    ep.pending.remove(pos)
                });
            if let Some(request) = found {
                i.trace.point(DispatchPoint::Cancelled { file });
                i.done.push((request, status::CANCELLED, 0));
            }
        });
    }

    /// A MAD received on QP1 (DISPATCH_LEVEL).
    pub fn receive(&self, src: &MadAddress, mad: &[u8]) {
        self.receive_batch(core::iter::once((src, mad)));
    }

    /// MADs received on QP1 in one completion pass (DISPATCH_LEVEL), handled in order,
    /// [`RECEIVE_BATCH`] at a time: one lock, one send batch and one round of completions
    /// per batch rather than per MAD, and each batch's peer and CEP lookups are made
    /// first, so that their cache misses overlap instead of adding up.
    pub fn receive_batch<'a, I>(&self, mads: I)
    where
        I: IntoIterator<Item = (&'a MadAddress, &'a [u8])>,
        I::IntoIter: Clone,
    {
        let mut rest = mads.into_iter();
        while rest.clone().next().is_some() {
            let batch = rest.clone().take(RECEIVE_BATCH);
            let several = batch.clone().nth(1).is_some();
            let now = self.platform.now();
            self.run(|i| {
                if i.removed {
                    return;
                }
                if several {
                    batch.clone().for_each(|(_, mad)| i.cm.prefetch(mad));
                }
                for (src, mad) in batch {
                    i.cm.handle_mad(now, src, mad);
                    // What each MAD produced leaves the engine before the next: the
                    // batches hold it, and the engine's queues stay as short as for one.
                    i.drain();
                }
            });
            let _ = rest.nth(RECEIVE_BATCH - 1);
        }
    }

    /// The timer fired (DISPATCH_LEVEL).
    pub fn timer_expired(&self) {
        let now = self.platform.now();
        self.run(|i| {
            // The timer is spent: whatever the next deadline, arm it.
            i.deadline = None;
            if !i.removed {
                i.cm.handle_timeout(now);
            }
        });
    }

    /// One port is gone: the engine reports DEVICE_REMOVAL on every CEP bound to it
    /// (user endpoints through their GET_EVENT queues, kernel clients through their
    /// callbacks), stops their timers and sends nothing more for them; the device and its
    /// other ports keep working.
    pub fn remove_port(&self, port: u8) {
        self.run(|i| i.cm.remove_port(port));
    }

    /// The HCA is gone: every endpoint gets a DEVICE_REMOVAL event (through a pending
    /// GET_EVENT if there is one), then every other pending request completes with
    /// STATUS_DEVICE_REMOVED. Later IOCTLs fail with STATUS_DEVICE_REMOVED; destroy and
    /// close still work and need no network.
    pub fn remove(&self) {
        self.run(|i| {
            // The engine reports DEVICE_REMOVAL on every CEP bound to a port and forgets
            // their timers; endpoints with no connection (idle, listening) get the record
            // here, so each endpoint hears of the removal exactly once.
            for port in 0..=u8::MAX {
                i.cm.remove_port(port);
            }
            i.drain();
            i.removed = true;
            i.remove_clients();
            let files: Vec<u64> = i.files.handles().collect();
            i.trace.point(DispatchPoint::Removed {
                files: files.len() as u32,
            });
            for f in files {
                let file = FileId(f);
                let handles: Vec<u64> = match i.file(file) {
                    Ok(fl) => fl.endpoints.handles().collect(),
                    Err(_) => continue,
                };
                for h in handles {
                    let told = i.cep_of(file, h).ok().and_then(|c| i.cm.state(c).ok())
                        == Some(ibcm_cep::StateName::Removed);
                    if !told {
                        i.deliver(file, h, &removal_record(h));
                    }
                    if let Ok(ep) = i.endpoint(file, h) {
                        let answer = ep.answer.take().map(|(r, _)| r);
                        let rest: Vec<P::Request> = ep.pending.drain(..).chain(answer).collect();
                        for r in rest {
                            i.done.push((r, status::DEVICE_REMOVED, 0));
                        }
                    }
                }
            }
        });
    }
}

/// Destroys an endpoint: the engine tears the connection down in the background, the
/// endpoint's pending requests complete with STATUS_CANCELLED, and REQ-created endpoints
/// the user never heard of (queued on a listen) go with it.
fn destroy_endpoint<P: Platform>(
    i: &mut Inner<P>,
    now: Instant,
    file: FileId,
    handle: u64,
) -> Result<(), Status> {
    let ep = i
        .file(file)?
        .endpoints
        .remove(handle)
        .ok_or(status::INVALID_HANDLE)?;
    let children: Vec<u64> = ep
        .events
        .iter()
        .filter_map(|&index| i.records.get(index))
        .filter(|r| {
            (r.event_type == event_type::REQ_RECEIVED
                || r.event_type == event_type::SIDR_REQ_RECEIVED)
                && r.new_handle != 0
        })
        .map(|r| r.new_handle)
        .collect();
    i.records.release(&ep.events);
    for child in children {
        let _ = destroy_endpoint(i, now, file, child);
    }
    if ep.backlog != 0 {
        let f = i.file(file)?;
        f.backlog = f.backlog.saturating_sub(ep.backlog as usize);
    }
    for r in ep.pending.into_iter().chain(ep.answer.map(|(r, _)| r)) {
        i.done.push((r, status::CANCELLED, 0));
    }
    i.clear_owner(ep.cep);
    let _ = i.cm.destroy(now, ep.cep);
    Ok(())
}

fn check_reserved(ok: bool) -> Result<(), Status> {
    require(ok)
}

/// One IOCTL, under the lock: the request is completed (queued on `done`) or, for a
/// GET_EVENT with nothing to report, left pending on its endpoint.
fn ioctl<P: Platform>(
    i: &mut Inner<P>,
    now: Instant,
    file: FileId,
    mut request: P::Request,
    code: u32,
    bytes: &[u8],
) {
    let mut extra = 0;
    let failed = if code == code::GET_EVENT {
        match get_event(i, file, request, bytes) {
            Ok(records) => {
                extra = records;
                None
            }
            Err(failed) => Some(failed),
        }
    } else if (code == code::CONNECT || code == code::SEND_REP) && request.output_len() > 0 {
        answered_operation(i, now, file, request, code, bytes).err()
    } else {
        match operation(i, now, file, &mut request, code, bytes) {
            Ok(n) => {
                i.done.push((request, status::SUCCESS, n));
                None
            }
            Err(st) => Some((request, st)),
        }
    };
    if let Some((request, st)) = failed {
        i.trace.point(DispatchPoint::IoctlFailed {
            file,
            code,
            status: st,
        });
        i.done.push((request, st, 0));
    }
    // PASSIVE_LEVEL: whatever the IOCTL changed (a connection started, a REP sent, a
    // timewait entered), the DISPATCH_LEVEL paths find room for what follows, and a
    // GET_EVENT's room for the REQs it may deliver.
    i.prepare_for_requests(file, extra);
}

/// CONNECT or SEND_REP with an output buffer: carried out, then left pending on its
/// endpoint until the answer arrives (see `code::CONNECT`, `code::SEND_REP`).
fn answered_operation<P: Platform>(
    i: &mut Inner<P>,
    now: Instant,
    file: FileId,
    mut request: P::Request,
    code: u32,
    bytes: &[u8],
) -> Result<(), (P::Request, Status)> {
    let size = EventRecord::SIZE as usize;
    if request.output_len() < size {
        return Err((request, status::BUFFER_TOO_SMALL));
    }
    let awaited = if code == code::CONNECT {
        Awaited::Rep {
            transitions: request.output_len() >= size + QpTransitionsOut::SIZE as usize,
        }
    } else {
        Awaited::Rtu
    };
    let handle = if code == code::CONNECT {
        input::<ConnectIn>(bytes, ConnectIn::SIZE).map(|c| c.handle)
    } else {
        handle_in(bytes)
    };
    // One answer awaited per endpoint: refused before anything is sent.
    if let Ok(h) = handle
        && i.endpoint(file, h).is_ok_and(|ep| ep.answer.is_some())
    {
        return Err((request, status::INVALID_DEVICE_STATE));
    }
    if let Err(st) = operation(i, now, file, &mut request, code, bytes) {
        return Err((request, st));
    }
    // The operation succeeded, so the handle named an endpoint of this file.
    match handle.and_then(|h| i.endpoint(file, h)) {
        Ok(ep) => {
            ep.answer = Some((request, awaited));
            Ok(())
        }
        Err(st) => Err((request, st)),
    }
}

/// The INIT, RTR and RTS attributes of `cep` (GET_QP_TRANSITIONS, an answered CONNECT).
fn qp_transitions(cm: &CmManager, cep: CepId) -> Result<QpTransitionsOut, Status> {
    let attr = |state| cm.qp_attributes(cep, state).map_err(status_of);
    Ok(QpTransitionsOut {
        size: QpTransitionsOut::SIZE,
        reserved: 0,
        init: qp_attr_to_abi(&attr(QpState::Init)?),
        rtr: qp_attr_to_abi(&attr(QpState::Rtr)?),
        rts: qp_attr_to_abi(&attr(QpState::Rts)?),
    })
}

/// GET_EVENT: completes at once with the queued events, or pends until one arrives.
/// Returns how many records the request holds.
fn get_event<P: Platform>(
    i: &mut Inner<P>,
    file: FileId,
    request: P::Request,
    bytes: &[u8],
) -> Result<usize, (P::Request, Status)> {
    let h = match check_get_event(i, file, &request, bytes) {
        Ok(h) => h,
        Err(st) => return Err((request, st)),
    };
    let capacity =
        (request.output_len() / EventRecord::SIZE as usize).min(MAX_EVENTS_PER_REQUEST as usize);
    if let Err(st) = i.grow_fifo(file, h, EVENT_HEADROOM) {
        return Err((request, st));
    }
    let Ok(ep) = i.endpoint(file, h) else {
        return Err((request, status::INVALID_HANDLE));
    };
    if ep.pending.try_reserve(1).is_err() {
        return Err((request, status::INSUFFICIENT_RESOURCES));
    }
    if ep.events.is_empty() {
        ep.pending.push_back(request);
    } else {
        i.fill(file, h, request);
    }
    Ok(capacity)
}

fn check_get_event<P: Platform>(
    i: &mut Inner<P>,
    file: FileId,
    request: &P::Request,
    bytes: &[u8],
) -> Result<u64, Status> {
    if !i.file(file)?.versioned {
        return Err(status::INVALID_DEVICE_STATE);
    }
    let h = handle_in(bytes)?;
    i.endpoint(file, h)?;
    if request.output_len() < EventRecord::SIZE as usize {
        return Err(status::BUFFER_TOO_SMALL);
    }
    Ok(h)
}

/// Every IOCTL but GET_EVENT: `Ok(n)` completes with SUCCESS and `n` output bytes.
fn operation<P: Platform>(
    i: &mut Inner<P>,
    now: Instant,
    file: FileId,
    request: &mut P::Request,
    code: u32,
    bytes: &[u8],
) -> Result<usize, Status> {
    let versioned = i.file(file)?.versioned;
    if code == code::VERSION {
        let v: VersionIn = input(bytes, VersionIn::SIZE)?;
        if v.abi_version != ABI_VERSION {
            return Err(status::REVISION_MISMATCH);
        }
        let out = VersionOut {
            size: VersionOut::SIZE,
            abi_version: ABI_VERSION,
            event_record_size: EventRecord::SIZE,
            max_events_per_request: MAX_EVENTS_PER_REQUEST,
        };
        let n = output(request, &out)?;
        i.file(file)?.versioned = true;
        return Ok(n);
    }
    if !code::ALL.contains(&code) {
        return Err(status::INVALID_DEVICE_REQUEST);
    }
    // The handshake comes first: a caller of another ABI must not reach the records.
    if !versioned {
        return Err(status::INVALID_DEVICE_STATE);
    }
    match code {
        code::CREATE => {
            let c: CreateIn = input(bytes, CreateIn::SIZE)?;
            check_reserved(c.reserved == 0)?;
            if request.output_len() < CreateOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            let cep = i.cm.create().map_err(status_of)?;
            let events = i.records.fifo(FIFO_DEPTH);
            let f = i.file(file)?;
            let handle = f.endpoints.insert(Endpoint::new(cep, events));
            i.set_owner(
                cep,
                Owner {
                    cep,
                    file: file.0,
                    endpoint: handle,
                },
            );
            let out = CreateOut {
                size: CreateOut::SIZE,
                reserved: 0,
                handle,
            };
            Ok(output(request, &out)?)
        }
        code::DESTROY => {
            let h = handle_in(bytes)?;
            destroy_endpoint(i, now, file, h)?;
            Ok(0)
        }
        code::LISTEN => {
            let l: ListenIn = input(bytes, ListenIn::SIZE)?;
            check_reserved(l.reserved == 0 && l.reserved1 == 0 && l.reserved2 == [0; 4])?;
            require((1..=MAX_BACKLOG).contains(&l.backlog))?;
            let compare = used(&l.compare, l.compare_len, limits::REQ_PRIVATE_DATA)?;
            require(usize::from(l.compare_offset) + compare.len() <= limits::REQ_PRIVATE_DATA)?;
            let cep = i.touch(file, l.handle)?;
            let mut buf = Vec::new();
            buf.try_reserve_exact(compare.len())
                .map_err(|_| status::INSUFFICIENT_RESOURCES)?;
            buf.extend_from_slice(compare);
            let params = ibcm_cep::ListenParams {
                service_id: l.service_id,
                service_mask: l.service_mask,
                port: (l.port != 0).then_some(l.port),
                compare: (!compare.is_empty()).then_some((l.compare_offset, buf)),
                backlog: l.backlog,
            };
            i.cm.listen(cep, params).map_err(status_of)?;
            let depth = l.backlog as usize;
            i.grow_fifo(file, l.handle, depth)?;
            let ep = i.endpoint(file, l.handle)?;
            let old = core::mem::replace(&mut ep.backlog, l.backlog);
            let f = i.file(file)?;
            f.backlog = f.backlog.saturating_sub(old as usize) + depth;
            i.prepare_for_requests(file, 0);
            Ok(0)
        }
        code::CANCEL_LISTEN => {
            let h = handle_in(bytes)?;
            let cep = i.touch(file, h)?;
            if i.cm.state(cep).map_err(status_of)? != ibcm_cep::StateName::Listen {
                return Err(status::INVALID_DEVICE_STATE);
            }
            // A listen is ended by destroying its CEP; the endpoint gets a fresh one.
            let fresh = i.cm.create().map_err(status_of)?;
            let _ = i.cm.destroy(now, cep);
            i.clear_owner(cep);
            let Inner { files, records, .. } = &mut *i;
            let ep = files
                .get_mut(file.0)
                .and_then(|f| f.endpoints.get_mut(h))
                .ok_or(status::INVALID_HANDLE)?;
            ep.cep = fresh;
            let old = core::mem::replace(&mut ep.backlog, 0) as usize;
            // REQs and SIDR_REQs nobody retrieved go with the listen.
            let mut pending_requests: Vec<u64> = Vec::new();
            ep.events.retain(|&index| {
                let child = records.get(index).map_or(0, |r| r.new_handle);
                if child != 0 {
                    pending_requests.push(child);
                    let _ = records.take(index);
                }
                child == 0
            });
            let f = i.file(file)?;
            f.backlog = f.backlog.saturating_sub(old);
            for child in pending_requests {
                let _ = destroy_endpoint(i, now, file, child);
            }
            i.set_owner(
                fresh,
                Owner {
                    cep: fresh,
                    file: file.0,
                    endpoint: h,
                },
            );
            Ok(0)
        }
        code::CONNECT => {
            let c: ConnectIn = input(bytes, ConnectIn::SIZE)?;
            check_reserved(c.reserved == 0 && c.reserved1 == [0; 3])?;
            require(c.flags & !flags::ALL == 0)?;
            let primary = path_from_abi(&c.primary)?;
            let alternate = if c.flags & flags::ALTERNATE_PATH != 0 {
                Some(path_from_abi(&c.alternate)?)
            } else {
                require(c.alternate == ibcm_ioctl::PathAbi::new_zeroed())?;
                None
            };
            let private_data = used(
                &c.private_data,
                c.private_data_len,
                limits::REQ_PRIVATE_DATA,
            )?;
            let params = ibcm_cep::ConnectParams {
                service_id: c.service_id,
                port: c.port,
                pkey: c.pkey,
                qpn: c.qpn,
                transport: transport_from_abi(c.transport)?,
                starting_psn: (c.flags & flags::PSN_GIVEN != 0).then_some(c.starting_psn),
                primary_path: primary,
                alternate_path: alternate,
                path_mtu: mtu_from_abi(c.path_mtu)?,
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                remote_cm_response_timeout: c.remote_cm_response_timeout,
                local_cm_response_timeout: c.local_cm_response_timeout,
                retry_count: c.retry_count,
                rnr_retry_count: c.rnr_retry_count,
                max_cm_retries: c.max_cm_retries,
                srq: c.flags & flags::SRQ != 0,
                flow_control: c.flags & flags::FLOW_CONTROL != 0,
                private_data,
            };
            let cep = i.touch(file, c.handle)?;
            // The REP (or REJ, or timeout) comes at DISPATCH_LEVEL: room for it now.
            i.prepare_for_requests(file, 0);
            if c.flags & flags::PEER_TO_PEER != 0 {
                i.cm.connect_peer(now, cep, &params).map_err(status_of)?;
            } else {
                i.cm.connect(now, cep, &params).map_err(status_of)?;
            }
            Ok(0)
        }
        code::FORMAT_REP => {
            let r: FormatRepIn = input(bytes, FormatRepIn::SIZE)?;
            check_reserved(r.reserved == 0 && r.reserved1 == [0; 3])?;
            require(r.flags & !(flags::PSN_GIVEN | flags::SRQ | flags::FLOW_CONTROL) == 0)?;
            require(r.failover_accepted <= 2)?;
            if request.output_len() < QpTransitionsOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            let private_data = used(
                &r.private_data,
                r.private_data_len,
                limits::REP_PRIVATE_DATA,
            )?;
            let params = ibcm_cep::RepParams {
                qpn: r.qpn,
                starting_psn: (r.flags & flags::PSN_GIVEN != 0).then_some(r.starting_psn),
                responder_resources: r.responder_resources,
                initiator_depth: r.initiator_depth,
                rnr_retry_count: r.rnr_retry_count,
                failover_accepted: ibcm_mad::Failover::from(r.failover_accepted),
                flow_control: r.flags & flags::FLOW_CONTROL != 0,
                srq: r.flags & flags::SRQ != 0,
                private_data,
            };
            let cep = i.touch(file, r.handle)?;
            let prepared = i.cm.prepare_rep(cep, &params).map_err(status_of)?;
            let out = QpTransitionsOut {
                size: QpTransitionsOut::SIZE,
                reserved: 0,
                init: qp_attr_to_abi(&prepared.init),
                rtr: qp_attr_to_abi(&prepared.rtr),
                rts: qp_attr_to_abi(&prepared.rts),
            };
            Ok(output(request, &out)?)
        }
        code::SEND_REP => {
            let cep = i.touch(file, handle_in(bytes)?)?;
            i.cm.send_rep(now, cep).map_err(status_of)?;
            Ok(0)
        }
        code::RTU | code::DREQ | code::DREP => {
            let p: PrivateDataIn = input(bytes, PrivateDataIn::SIZE)?;
            check_reserved(p.reserved == 0 && p.reserved1 == [0; 7])?;
            let max = if code == code::DREQ {
                limits::DREQ_PRIVATE_DATA
            } else {
                limits::RTU_PRIVATE_DATA
            };
            let data = used(&p.private_data, p.private_data_len, max)?;
            let cep = i.touch(file, p.handle)?;
            match code {
                code::RTU => i.cm.rtu(cep, data),
                code::DREQ => i.cm.disconnect(now, cep, data),
                _ => i.cm.drep(now, cep, data),
            }
            .map_err(status_of)?;
            Ok(0)
        }
        code::REJ => {
            let r: RejIn = input(bytes, RejIn::SIZE)?;
            check_reserved(r.reserved == 0 && r.reserved1 == 0 && r.reserved2 == [0; 4])?;
            let ari = used(&r.ari, r.ari_len, limits::REJ_ARI)?;
            let data = used(
                &r.private_data,
                r.private_data_len,
                limits::REJ_PRIVATE_DATA,
            )?;
            let cep = i.touch(file, r.handle)?;
            let params = ibcm_cep::RejectParams {
                reason: ibcm_mad::RejReason::from(r.reason),
                ari,
                private_data: data,
            };
            i.cm.reject(now, cep, &params).map_err(status_of)?;
            Ok(0)
        }
        code::MRA => {
            let m: MraIn = input(bytes, MraIn::SIZE)?;
            check_reserved(m.reserved == 0 && m.reserved1 == [0; 6] && m.reserved2 == [0; 2])?;
            let data = used(
                &m.private_data,
                m.private_data_len,
                limits::MRA_PRIVATE_DATA,
            )?;
            let cep = i.touch(file, m.handle)?;
            i.cm.mra(cep, m.service_timeout, data).map_err(status_of)?;
            Ok(0)
        }
        code::GET_QP_ATTR => {
            let q: GetQpAttrIn = input(bytes, GetQpAttrIn::SIZE)?;
            check_reserved(q.reserved == 0 && q.reserved1 == 0)?;
            let state = qp_state_from_abi(q.qp_state)?;
            if request.output_len() < QpAttrOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            let cep = i.touch(file, q.handle)?;
            let attr = i.cm.qp_attributes(cep, state).map_err(status_of)?;
            let out = QpAttrOut {
                size: QpAttrOut::SIZE,
                reserved: 0,
                attr: qp_attr_to_abi(&attr),
            };
            Ok(output(request, &out)?)
        }
        code::GET_QP_TRANSITIONS => {
            let h = handle_in(bytes)?;
            if request.output_len() < QpTransitionsOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            let cep = i.touch(file, h)?;
            let out = qp_transitions(&i.cm, cep)?;
            Ok(output(request, &out)?)
        }
        code::QUERY => {
            let h = handle_in(bytes)?;
            let ep = i.endpoint(file, h)?;
            let (cep, len) = (ep.cep, usize::from(ep.private_data_len));
            let pd = ep.private_data;
            let info = i.cm.query(cep).map_err(status_of)?;
            let out = query_to_abi(&info, pd.get(..len).unwrap_or(&[]));
            Ok(output(request, &out)?)
        }
        code::ESTABLISHED => {
            let cep = i.touch(file, handle_in(bytes)?)?;
            i.cm.established(cep).map_err(status_of)?;
            Ok(0)
        }
        code::LAP => {
            let l: LapIn = input(bytes, LapIn::SIZE)?;
            check_reserved(l.reserved == 0 && l.reserved1 == [0; 7])?;
            let path = path_from_abi(&l.alternate)?;
            let data = used(&l.private_data, l.private_data_len, 168)?;
            let cep = i.touch(file, l.handle)?;
            i.cm.lap(now, cep, &path, data).map_err(status_of)?;
            Ok(0)
        }
        code::PREPARE_APR => {
            let a: AprIn = input(bytes, AprIn::SIZE)?;
            check_reserved(a.reserved == 0 && a.reserved1 == [0; 5] && a.reserved2 == [0; 4])?;
            require(a.status <= 13)?;
            let info = used(&a.info, a.info_len, 72)?;
            let data = used(&a.private_data, a.private_data_len, 148)?;
            if request.output_len() < QpAttrOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            let cep = i.touch(file, a.handle)?;
            let rts =
                i.cm.prepare_apr(cep, ibcm_mad::AprStatus::from(a.status), info, data)
                    .map_err(status_of)?;
            let mut out = QpAttrOut::new_zeroed();
            out.size = QpAttrOut::SIZE;
            if let Some(rts) = rts {
                out.attr = qp_attr_to_abi(&rts);
            }
            Ok(output(request, &out)?)
        }
        code::SEND_APR => {
            let cep = i.touch(file, handle_in(bytes)?)?;
            i.cm.send_apr(cep).map_err(status_of)?;
            Ok(0)
        }
        code::MIGRATE => {
            let cep = i.touch(file, handle_in(bytes)?)?;
            i.cm.migrate(cep).map_err(status_of)?;
            Ok(0)
        }
        code::SIDR_REQ => {
            let r: SidrReqIn = input(bytes, SidrReqIn::SIZE)?;
            check_reserved(r.reserved == 0 && r.reserved1 == [0; 2])?;
            let path = path_from_abi(&r.path)?;
            let data = used(&r.private_data, r.private_data_len, 216)?;
            let params = ibcm_cep::SidrParams {
                service_id: r.service_id,
                port: r.port,
                pkey: r.pkey,
                path,
                timeout: r.timeout,
                max_retries: r.max_retries,
                private_data: data,
            };
            let cep = i.touch(file, r.handle)?;
            i.cm.sidr_request(now, cep, &params).map_err(status_of)?;
            Ok(0)
        }
        code::SIDR_REP => {
            let r: SidrRepIn = input(bytes, SidrRepIn::SIZE)?;
            check_reserved(r.reserved == 0 && r.reserved1 == [0; 5])?;
            require(r.status <= 5)?;
            let info = used(&r.info, r.info_len, 72)?;
            let data = used(&r.private_data, r.private_data_len, 136)?;
            let params = ibcm_cep::SidrReplyParams {
                status: ibcm_mad::SidrStatus::from(r.status),
                qpn: r.qpn,
                qkey: r.qkey,
                info,
                private_data: data,
            };
            let cep = i.touch(file, r.handle)?;
            i.cm.sidr_reply(now, cep, &params).map_err(status_of)?;
            Ok(0)
        }
        code::COUNTERS => {
            let c: CountersIn = input(bytes, CountersIn::SIZE)?;
            check_reserved(c.reserved == 0)?;
            let k = i.cm.counters();
            let out = CountersOut {
                size: CountersOut::SIZE,
                reserved: 0,
                sent: k.sent,
                retries: k.retries,
                received: k.received,
                duplicates: k.duplicates,
                malformed: k.malformed,
                unmatched: k.unmatched,
                backlog_drops: k.backlog_drops,
            };
            Ok(output(request, &out)?)
        }
        _ => Err(status::INVALID_DEVICE_REQUEST),
    }
}

fn handle_in(bytes: &[u8]) -> Result<u64, Status> {
    let h: HandleIn = input(bytes, HandleIn::SIZE)?;
    check_reserved(h.reserved == 0)?;
    Ok(h.handle)
}
