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
mod endpoint;
mod fabric_status;
mod ioctl;
mod memory;
mod pdata;
mod policy;
mod pool;
mod routing;
mod table;

pub use client::{Callback, ClientEvent, ClientId};
use endpoint::{Awaited, Endpoint, File, Owner, forget_waiting};
use ioctl::{batch, destroy_endpoint, ioctl, qp_transitions, room};
pub use memory::DispatchMemory;
pub use policy::{Caller, Held, Quotas, USER_MAX_PACKET_LIFE_TIME, UserTotals};
use pool::{Fifo, ROOM_RETRY_NS, RecordPool};
use table::Table;

use ibcm_cep::{CepId, CmConfig, CmManager, Instant, MadAddress, MadOwner, Transmit};
use ibcm_ioctl::status;

use crate::platform::{Lock, Platform, Request};
use crate::records::removal_record;
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
/// most one pending GET_EVENT) per timer it handles; a received MAD brings a couple (a
/// stale REQ: a REJ and a DREQ), so a receive batch is given four per MAD.
const DISPATCH_BATCH: usize = max(ibcm_cep::TIMER_BATCH, 4 * RECEIVE_BATCH) + 8;

const fn max(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

/// MADs one [`Device::receive_batch`] call takes at most: each brings a couple of MADs to
/// send and requests to complete, so a batch stays well inside [`DISPATCH_BATCH`].
pub const RECEIVE_BATCH: usize = 16;

/// Work one lock hold of IRP_MJ_CLEANUP does at most, in endpoints destroyed (a listen's
/// REQs queued unread count one each): a handle with 10^6 endpoints closes in many short
/// holds, never one that keeps every CPU's CM waiting.
const CLEANUP_BATCH: usize = 64;

/// Lingering CEPs looked at per pass of [`Inner::prune_lingering`] (a timer pass, a
/// CREATE refused over a budget): each pass holds the lock briefly however many linger.
const LINGER_PRUNE: usize = 64;

/// Lock holds of [`Device::cleanup`] in a row that may find memory short (each followed
/// by [`Platform::relax`]) before it stops waiting for memory: then its requests complete
/// without room (one per hold, straight to the platform) and the endpoints left are
/// destroyed at IRP_MJ_CLOSE.
const CLEANUP_RETRIES: u32 = 64;

/// Completions one IOCTL queues at most, beyond those of the endpoints it destroys (which
/// `destroy_endpoint` makes room for): its own, and a GET_EVENT for each event it causes.
const IOCTL_COMPLETIONS: usize = 8;
/// MADs one IOCTL sends at most, beyond those of the endpoints it destroys.
const IOCTL_MADS: usize = 8;

/// Largest listen backlog an IOCTL may ask for.
pub const MAX_BACKLOG: u32 = 4096;
/// Event records a new endpoint's FIFO holds.
const FIFO_DEPTH: usize = EVENT_HEADROOM;
/// Room every IOCTL naming an endpoint leaves in its FIFO (at PASSIVE_LEVEL) for the
/// events arriving at DISPATCH_LEVEL until the user names it again: without a user
/// operation the engine reports at most this many transitions of one connection
/// (REP_SENT: MRA, RTU, LAP, DREQ, DREP, REJ, timewait exit). The records themselves come
/// from the pool (pool.rs), which keeps room for what an entry point queues; a FIFO's room
/// bounds what a listen queues (its backlog's REQs).
const EVENT_HEADROOM: usize = 8;
/// Room in the FIFO of an endpoint a REQ creates, before the user first names it: from
/// REQ_RCVD the engine reports at most a REJ (or a stale connection) and a timewait exit.
const CHILD_DEPTH: usize = 2;

/// Everything the lock guards.
pub struct Inner<P: Platform> {
    cm: CmManager,
    removed: bool,
    files: Table<File<P::Request>>,
    tx: Vec<Transmit>,
    /// Emptied MAD batches with room, for the entry point that runs while another one's
    /// batch is out being sent.
    spare_tx: Vec<Vec<Transmit>>,
    /// Emptied completion batches with room, likewise: a receive completing a GET_EVENT
    /// while another entry point's completions are out must not allocate.
    spare_done: Vec<Vec<(P::Request, i32, usize)>>,
    done: Vec<(P::Request, i32, usize)>,
    records: RecordPool,
    /// The private data endpoints keep for QUERY (pdata.rs).
    pdata: pdata::PdataBlocks,
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
    /// While the record pool is short: the timer waits until then before its next pass.
    room_retry: Option<Instant>,
    /// DISPATCH_LEVEL work held back because the record pool was short.
    shortfalls: RoomShortfalls,
    /// The quotas of non-administrators' handles.
    quotas: Quotas,
    /// What non-administrators' handles hold together (against `quotas`' all-users
    /// budgets).
    users: UserTotals,
    /// IOCTLs failed with STATUS_QUOTA_EXCEEDED (COUNTERS).
    quota_exceeded: u64,
    /// The quota hits and forged MADs the platform was last told of
    /// ([`Platform::refused`]).
    refused_told: Refused,
    /// Users' CEPs whose endpoint was destroyed but which live on in the engine (DREQ,
    /// timewait): each still counts as an endpoint of its owner's account and of all
    /// users' until it ends ([`Inner::prune_lingering`]). Room for one is made before each
    /// destroy.
    lingering: VecDeque<(CepId, Caller)>,
}

/// DISPATCH_LEVEL work held back because the event-record pool was short (see
/// [`Device::room_shortfalls`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoomShortfalls {
    /// Received MADs dropped (the peer's retries recover them).
    pub mads_dropped: u64,
    /// Timer passes deferred by 1 ms.
    pub timer_passes_deferred: u64,
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
    /// Quota hits and forged MADs since the platform was last told.
    refused: Option<Refused>,
}

/// What a hostile or runaway caller was refused, for an administrator: IOCTLs failed with
/// STATUS_QUOTA_EXCEEDED, and MADs dropped as forged (a source the connection they name
/// does not use). Counts since the platform was last told ([`Platform::refused`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refused {
    /// IOCTLs refused over a quota or budget.
    pub quota_exceeded: u64,
    /// MADs dropped as forged.
    pub forged: u64,
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

impl<P: Platform> Device<P> {
    /// A device whose engine uses `config`.
    pub fn new(platform: P, config: CmConfig) -> Self {
        let trace = DispatchHook::new(platform.tracer());
        let mut cm = CmManager::new(config);
        // The receive path runs at DISPATCH_LEVEL: a CEP a REQ or SIDR_REQ creates comes
        // from the room the PASSIVE_LEVEL paths made (prepare_for_requests after every
        // IOCTL, listen_id, reserve_clients), never from a grown slab.
        cm.set_fixed_room(true);
        cm.set_tracer(trace.engine());
        let mut inner = Inner {
            cm,
            removed: false,
            files: Table::new(),
            tx: Vec::new(),
            spare_tx: Vec::with_capacity(KEPT_BATCHES),
            spare_done: Vec::with_capacity(KEPT_BATCHES),
            done: Vec::new(),
            records: RecordPool::default(),
            pdata: pdata::PdataBlocks::default(),
            now: Instant::from_nanos(0),
            clients: client::Clients::new(),
            flushes: 0,
            deadline: None,
            trace,
            room_retry: None,
            shortfalls: RoomShortfalls::default(),
            quotas: Quotas::default(),
            users: UserTotals::default(),
            quota_exceeded: 0,
            refused_told: Refused::default(),
            lingering: VecDeque::new(),
        };
        // Device add runs at PASSIVE_LEVEL: a node nobody has opened yet still answers
        // MADs (a REJ to a REQ for no listen) and runs timers without allocating.
        let _ = inner.cm.reserve(DISPATCH_BATCH);
        // Private data is stored only in blocks made at PASSIVE_LEVEL (`prepare_batches`):
        // a kernel client's downcall at DISPATCH_LEVEL takes a free block or fails.
        inner.cm.set_private_data_growth(false);
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

    /// The dispatch layer's memory by part (its tables' and pools' capacities).
    pub fn memory(&self) -> DispatchMemory {
        self.inner.with(|i| i.memory())
    }

    /// Runs `f` on the engine under the lock (counters and diagnostics).
    pub fn with_engine<T>(&self, f: impl FnOnce(&CmManager) -> T) -> T {
        self.inner.with(|i| f(&i.cm))
    }

    /// Whose a CM MAD received on host port `port` is, by this device's engine
    /// ([`CmManager::owner_of`]): the QP1 steering decision beside another CM on the same
    /// port (WinOF AL's on a stock host, issue #19), made from the QP1 verbs hook's
    /// `poll_cq` thunk at DISPATCH_LEVEL. Takes the device lock for the call only; reads
    /// the engine, changes nothing, allocates nothing, sends and completes nothing (no
    /// flush), so it may run inside another lock of the caller's (the hook's steering
    /// lock) as long as that lock is never taken under this one. After [`Device::remove`]
    /// it still answers from the engine's last state.
    pub fn owner_of(&self, port: u8, mad: &[u8]) -> MadOwner {
        self.inner.with(|i| i.cm.owner_of(port, mad))
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
        if let Some(refused) = flush.refused {
            self.platform.refused(refused);
        }
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

    /// A new file handle (IRP_MJ_CREATE) opened by `caller` (policy.rs: a user's account,
    /// if told, is what the per-account budgets count by); fails with
    /// STATUS_INSUFFICIENT_RESOURCES when memory runs out.
    pub fn open(&self, caller: Caller) -> Result<FileId, crate::Status> {
        self.inner.with(|i| {
            i.users.file_opened(caller)?;
            i.files
                .try_insert(File::new(caller))
                .map(FileId)
                .map_err(|_| {
                    i.users.file_gone(caller);
                    status::INSUFFICIENT_RESOURCES
                })
        })
    }

    /// The quotas of non-administrators' handles from now on (PASSIVE_LEVEL; the binding
    /// reads them from the registry at driver load).
    pub fn set_quotas(&self, quotas: Quotas) {
        self.inner.with(|i| i.quotas = quotas);
    }

    /// IRP_MJ_CLEANUP: destroys every endpoint of the file and completes its pending
    /// requests with STATUS_CANCELLED; later IOCTLs on the file fail with
    /// STATUS_FILE_CLOSED. Nothing waits on the network. The lock is held for
    /// [`CLEANUP_BATCH`] endpoints at a time, each batch sent and completed before the next.
    pub fn cleanup(&self, file: FileId) {
        let now = self.platform.now();
        let (mut from, mut short) = (0, 0);
        loop {
            let step = self.run(|i| cleanup_step(i, now, file, from));
            match step {
                Cleanup::More(next) => (from, short) = (next, 0),
                // Memory for the completions ran out: let others run, then go on, a
                // bounded number of times.
                Cleanup::Short if short < CLEANUP_RETRIES => {
                    short += 1;
                    self.platform.relax();
                }
                Cleanup::Short => {
                    self.cancel_without_room(file);
                    break;
                }
                Cleanup::Done => break,
            }
        }
    }

    /// Completes every request of the file with STATUS_CANCELLED, one per lock hold and
    /// straight to the platform: no room is needed (cleanup when memory stays short).
    fn cancel_without_room(&self, file: FileId) {
        let mut from = 0;
        loop {
            let taken = self.inner.with(|i| {
                let f = i.files.get_mut(file.0)?;
                if let Some(r) = f.channel.pop_front() {
                    return Some(r);
                }
                while let Some((h, next)) = f.endpoints.next_handle(from) {
                    let ep = f.endpoints.get_mut(h)?;
                    if let Some(r) = ep
                        .pending
                        .pop_front()
                        .or_else(|| ep.answer.take().map(|(r, _)| r))
                    {
                        forget_waiting(&mut f.waiting, h, r.key());
                        return Some(r);
                    }
                    from = next;
                }
                None
            });
            let Some(request) = taken else { break };
            self.platform.complete(request, status::CANCELLED, 0);
        }
    }

    /// IRP_MJ_CLOSE: forgets the file. Call after [`cleanup`](Self::cleanup).
    pub fn close(&self, file: FileId) -> bool {
        self.cleanup(file);
        // Endpoints a cleanup short of memory left (their requests completed): their
        // CEPs go now, with nothing to complete.
        self.run(|i| {
            let now = i.now;
            while let Some(f) = i.files.get_mut(file.0) {
                let Some((h, _)) = f.endpoints.next_handle(0) else {
                    break;
                };
                let Some(ep) = f.endpoints.remove(h) else {
                    break;
                };
                let caller = f.caller;
                f.queued = f.queued.saturating_sub(ep.events.len());
                f.backlog = f.backlog.saturating_sub(ep.backlog as usize);
                f.listens = f.listens.saturating_sub(u32::from(ep.backlog > 0));
                i.users.endpoint_removed(caller, ep.backlog);
                i.users.events_read(caller, ep.events.len());
                i.records.release(&ep.events);
                i.pdata.release(ep.private_data);
                let _ = i.cm.destroy(now, ep.cep);
                if i.lingering.try_reserve(1).is_ok() {
                    i.linger(caller, ep.cep);
                }
            }
        });
        self.inner.with(|i| match i.files.remove(file.0) {
            Some(f) => {
                i.users.file_closed(&f);
                for spare in &f.spares {
                    i.records.release(&spare.events);
                }
                true
            }
            None => false,
        })
    }

    /// What non-administrators' handles hold together now (the all-users budgets of
    /// [`Quotas`] bound it).
    pub fn user_totals(&self) -> UserTotals {
        self.inner.with(|i| i.users.clone())
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
        if code == ibcm_ioctl::code::STATUS {
            return self.status(file, request, input);
        }
        let now = self.platform.now();
        let unqueued = self.run(|i| {
            // Room for what an IOCTL completes and sends (its own completion, the
            // GET_EVENTs its events complete, its MADs); without it the request is
            // completed from outside the lock, having changed nothing.
            if i.done.try_reserve(IOCTL_COMPLETIONS).is_err()
                || i.tx.try_reserve(IOCTL_MADS).is_err()
            {
                return Some(request);
            }
            // Refused before anything is looked at or copied: an input longer than any
            // record, a handle whose cleanup ran, a removed device.
            let refused = if let Some(st) = oversized_input(code, input.len()) {
                Some(st)
            } else if i.file(file).is_ok_and(|f| f.closed) {
                Some(status::FILE_CLOSED)
            } else if i.removed {
                Some(status::DEVICE_REMOVED)
            } else {
                None
            };
            match refused {
                Some(st) => i.done.push((request, st, 0)),
                None => ioctl(i, now, file, request, code, input),
            }
            None
        });
        if let Some(request) = unqueued {
            self.platform
                .complete(request, status::INSUFFICIENT_RESOURCES, 0);
        }
    }

    /// The platform's cancel routine for a pending GET_EVENT: completes it with
    /// STATUS_CANCELLED unless it was already completed (then this does nothing).
    pub fn cancel(&self, file: FileId, key: u64) {
        self.run(|i| {
            // DISPATCH_LEVEL (the I/O manager's cancel routine): nothing is allocated.
            // The channel holds at most MAX_CHANNEL_GET_EVENTS; an endpoint's request is
            // found through the file's index, not by walking its endpoints.
            let Ok(f) = i.file(file) else { return };
            let on_channel = f.channel.iter().position(|r| r.key() == key);
            let found = on_channel.and_then(|pos| f.channel.remove(pos));
            let found = found.or_else(|| {
                let h = f.waiting.remove(&key)?;
                let ep = f.endpoints.get_mut(h)?;
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
            let short = self.run(|i| {
                if i.removed {
                    return false;
                }
                if !i.has_dispatch_room() {
                    let n = batch.clone().count();
                    i.shortfalls.mads_dropped += n as u64;
                    i.trace.point(DispatchPoint::NoRoom {
                        dropped: n as u32,
                        queued: i.records.queued() as u32,
                    });
                    return true;
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
                // Grow the pool before it runs out, not after a batch was dropped; and
                // the engine's room for REQs held past a backlog (held.rs) once short.
                i.running_low() || i.cm.wants_room()
            });
            if short {
                self.platform.request_passive_work();
            }
            let _ = rest.nth(RECEIVE_BATCH - 1);
        }
    }

    /// The timer fired (DISPATCH_LEVEL).
    pub fn timer_expired(&self) {
        let now = self.platform.now();
        let short = self.run(|i| {
            // The timer is spent: whatever the next deadline, arm it.
            i.deadline = None;
            if i.removed {
                return false;
            }
            if !i.has_dispatch_room() {
                // The pass waits for room (PASSIVE_LEVEL work), retrying shortly.
                i.room_retry = Some(now.add_nanos(ROOM_RETRY_NS));
                i.shortfalls.timer_passes_deferred += 1;
                i.trace.point(DispatchPoint::NoRoom {
                    dropped: 0,
                    queued: i.records.queued() as u32,
                });
                return true;
            }
            i.room_retry = None;
            i.cm.handle_timeout(now);
            // Timewaits that ended give their owners' budgets back.
            i.prune_lingering(LINGER_PRUNE);
            // Timewait exits free CEPs at DISPATCH_LEVEL; their memory goes back at PASSIVE.
            i.cm.trim_due(0) || i.running_low()
        });
        if short {
            self.platform.request_passive_work();
        }
    }

    /// PASSIVE_LEVEL work a DISPATCH_LEVEL path asked for
    /// ([`Platform::request_passive_work`]): grows the event-record pool (and the batches)
    /// so that deferred timer passes and dropped MADs' retries find room, the engine's
    /// room for REQs held past a listen's backlog (`prepare_for`), tops up the
    /// engine's private-data pool that kernel clients' downcalls drew on (giving back
    /// what teardown left unused), and gives back the engine's slab left over from a peak
    /// once its CEPs are gone.
    pub fn passive_work(&self) {
        self.run(|i| {
            i.cm.trim_private_data();
            // A past peak's slab goes back (the engine trims when due).
            let _ = i.cm.prepare_for(0);
            i.prepare_batches();
            if i.has_dispatch_room() && i.room_retry.take().is_some() {
                // The timer, deferred, fires at the engine's deadline again.
                i.deadline = None;
            }
        });
    }

    /// DISPATCH_LEVEL work held back so far because the event-record pool was short.
    pub fn room_shortfalls(&self) -> RoomShortfalls {
        self.inner.with(|i| i.shortfalls)
    }

    /// A port is up, or its addresses changed (PASSIVE_LEVEL: PnP, a port-change
    /// notification): from now on a REQ whose path names this CA but none of its ports'
    /// GIDs or LIDs gets REJ 12/13 (18/19 for the alternate path, IBA 12.6.7).
    pub fn set_port(
        &self,
        port: u8,
        lid: u16,
        lmc: u8,
        gids: &[ibcm_mad::Gid],
    ) -> Result<(), ibcm_cep::CmError> {
        self.run(|i| i.cm.set_port(port, lid, lmc, gids))
    }

    /// Which CA a host port belongs to (PASSIVE_LEVEL, when the port is numbered):
    /// connections on it name that CA's GUID in their REQ/REP (issue 25: a peer keys its
    /// stale-connection check by CA GUID and QPN, and two CAs reuse QPNs).
    pub fn set_port_ca_guid(&self, port: u8, ca_guid: u64) {
        self.run(|i| i.cm.set_port_ca_guid(port, ca_guid));
    }

    /// One port is gone: the engine reports DEVICE_REMOVAL on every CEP bound to it
    /// (user endpoints through their GET_EVENT queues, kernel clients through their
    /// callbacks), stops their timers and sends nothing more for them; the device and its
    /// other ports keep working. The engine walks its slab in bounded slices, each under
    /// the lock once, as [`Device::port_down`] does: an HCA's D0Exit (every sleep) runs
    /// this per port.
    pub fn remove_port(&self, port: u8) {
        self.run_sliced(|i, at| i.cm.remove_port_from(Some(port), at));
    }

    /// Runs a bounded engine walk to its end: `step` takes the slab index to go on from
    /// (0 first) and returns the next one (None: done); each call is one entry point,
    /// under the lock once.
    fn run_sliced(&self, mut step: impl FnMut(&mut Inner<P>, usize) -> Option<usize>) {
        let mut from = Some(0);
        while let Some(at) = from {
            from = self.run(|i| step(i, at));
        }
    }

    /// The port left the Active state (IBAL's `IB_PNP_PORT_DOWN`): nothing ends now
    /// (the engine's link.rs). Nothing is sent from the port and connects from it are
    /// refused until [`Device::port_up`]; handshakes keep their retry timers and end as an
    /// unanswered request ends; an established connection is told once, as the peer's
    /// DREQ, only if the port is still down when its QP's transport retries would have
    /// run out. Those events come from the timer, delivered to user endpoints through
    /// their GET_EVENT queues and to kernel clients through their callbacks. The engine
    /// walks its slab in bounded slices, each under the lock once: no lock is held long.
    pub fn port_down(&self, port: u8) {
        self.run_sliced(|i, at| {
            let now = i.now;
            i.cm.port_down(now, port, at)
        });
        // Each deadline took a timer arm of the two every CEP has room for (`prepare_for`):
        // make the room again here, at PASSIVE_LEVEL, so the DISPATCH_LEVEL paths that
        // follow (DREQ, timewait) allocate nothing.
        self.run(|i| {
            let _ = i.cm.prepare_for(0);
        });
    }

    /// The port is Active again (`IB_PNP_PORT_ACTIVE`): connects from it are taken and
    /// sends resume. Connections not yet told live on; those told owe their peers a DREQ,
    /// sent when their timewait next ends (the engine's link.rs).
    pub fn port_up(&self, port: u8) {
        self.run(|i| i.cm.port_up(port));
    }

    /// The HCA is gone: every endpoint gets a DEVICE_REMOVAL event (through a pending
    /// GET_EVENT if there is one), then every other pending request completes with
    /// STATUS_DEVICE_REMOVED. Later IOCTLs fail with STATUS_DEVICE_REMOVED; destroy and
    /// close still work and need no network.
    pub fn remove(&self) {
        // The engine reports DEVICE_REMOVAL on every CEP bound to a port and forgets their
        // timers, in bounded slices (each under the lock once); endpoints with no
        // connection (idle, listening) get the record below, so each endpoint hears of
        // the removal exactly once.
        self.run_sliced(|i, at| i.cm.remove_port_from(None, at));
        self.run(|i| {
            i.drain();
            i.removed = true;
            i.remove_clients();
            i.trace.point(DispatchPoint::Removed {
                files: i.files.live as u32,
            });
            // Walked by slot, nothing collected (under the spin lock, memory may be short).
            // A request whose completion finds no room stays where it is, to complete with
            // STATUS_CANCELLED at its endpoint's destroy or the handle's cleanup.
            let mut next_file = 0;
            while let Some((f, after)) = i.files.next_handle(next_file) {
                next_file = after;
                let file = FileId(f);
                let mut next_ep = 0;
                while let Some((h, after)) = i
                    .file(file)
                    .ok()
                    .and_then(|fl| fl.endpoints.next_handle(next_ep))
                {
                    next_ep = after;
                    let told = i.cep_of(file, h).ok().and_then(|c| i.cm.state(c).ok())
                        == Some(ibcm_cep::StateName::Removed);
                    if !told {
                        i.deliver(file, h, &removal_record(h));
                    }
                    while i.done.try_reserve(1).is_ok() {
                        let Ok(ep) = i.endpoint(file, h) else { break };
                        let Some(r) = ep
                            .pending
                            .pop_front()
                            .or_else(|| ep.answer.take().map(|(r, _)| r))
                        else {
                            break;
                        };
                        if let Ok(f) = i.file(file) {
                            f.leave_waiting(h, r.key());
                        }
                        i.done.push((r, status::DEVICE_REMOVED, 0));
                    }
                }
                while i.done.try_reserve(1).is_ok() {
                    let Some(r) = i.file(file).ok().and_then(|fl| fl.channel.pop_front()) else {
                        break;
                    };
                    i.done.push((r, status::DEVICE_REMOVED, 0));
                }
            }
        });
    }
}

/// The status of an IOCTL whose input is longer than any record: the binding refuses it
/// before copying the input into nonpaged pool, as [`Device::dispatch`] would.
pub fn oversized_input(code: u32, len: usize) -> Option<crate::Status> {
    if len <= ibcm_ioctl::MAX_INPUT_SIZE {
        return None;
    }
    let known = code == ibcm_ioctl::code::VERSION || ibcm_ioctl::code::ALL.contains(&code);
    Some(if known {
        status::INFO_LENGTH_MISMATCH
    } else {
        status::INVALID_DEVICE_REQUEST
    })
}

/// How far one lock hold of [`Device::cleanup`] got.
enum Cleanup {
    /// More endpoints, from this slot on.
    More(usize),
    /// No room for the next endpoint's completions; try again.
    Short,
    Done,
}

/// One lock hold of cleanup: marks the file closed, destroys up to [`CLEANUP_BATCH`] of its
/// endpoints from slot `from` on, and, once none is left, completes the channel's
/// requests. Each endpoint's completions and MADs get their room first (fallibly).
fn cleanup_step<P: Platform>(i: &mut Inner<P>, now: Instant, file: FileId, from: usize) -> Cleanup {
    let Ok(f) = i.file(file) else {
        return Cleanup::Done;
    };
    if !f.closed {
        f.closed = true;
        f.ready.clear();
        let endpoints = f.endpoints.live as u32;
        i.trace.point(DispatchPoint::Cleanup { file, endpoints });
    }
    let (mut from, mut budget, mut mads) = (from, CLEANUP_BATCH, 0);
    while budget > 0 {
        let Some((h, next)) = i
            .file(file)
            .ok()
            .and_then(|f| f.endpoints.next_handle(from))
        else {
            // Every endpoint is gone: the channel's requests complete.
            let n = i.files.get(file.0).map_or(0, |f| f.channel.len());
            if i.done.try_reserve(n).is_err() {
                return Cleanup::Short;
            }
            let Ok(f) = i.file(file) else {
                return Cleanup::Done;
            };
            let channel = core::mem::take(&mut f.channel);
            for r in channel {
                i.done.push((r, status::CANCELLED, 0));
            }
            return Cleanup::Done;
        };
        // Its requests, and the MADs the engine sends for it and the REQs it queued.
        let (requests, queued) = i
            .endpoint(file, h)
            .map_or((0, 0), |ep| (ep.pending.len() + 1, ep.events.len()));
        let cost = 1 + queued;
        if cost > budget && budget < CLEANUP_BATCH {
            // A large listen gets a hold of its own.
            break;
        }
        // The MADs leave the engine for `tx` only when the hold ends: room for them all.
        mads += 2 * cost;
        if i.done.try_reserve(requests).is_err() || i.tx.try_reserve(mads).is_err() {
            return Cleanup::Short;
        }
        if destroy_endpoint(i, now, file, h) == Err(status::INSUFFICIENT_RESOURCES) {
            return Cleanup::Short;
        }
        from = next;
        budget = budget.saturating_sub(cost);
    }
    Cleanup::More(from)
}
