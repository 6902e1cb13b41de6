//! The pool of event records queued on endpoints with no GET_EVENT waiting: one pool for
//! the device, grown at PASSIVE_LEVEL, taken from at DISPATCH_LEVEL without allocating.
//!
//! Memory follows what is queued, not what could be: the pool keeps as many records free
//! as are queued ([`KEEP_FREE`] at least), and every DISPATCH_LEVEL entry point first checks that
//! [`DISPATCH_RECORDS`] are free (what one receive batch or timer pass can queue at most).
//! When they are not (consumers that read no events while thousands queue), that entry
//! point holds back: a receive batch is dropped as a full receive queue would drop it
//! (the CM's retries recover, IBA 12.7.36), a timer pass is deferred by
//! [`ROOM_RETRY_NS`]; the platform is asked for PASSIVE_LEVEL work, which grows the pool,
//! and so does the next IOCTL. No event is ever lost: an event the engine reports always
//! finds a record. A 464-byte record per possible event per endpoint was promised before,
//! 3.7 KB an endpoint whether anything queued or not.

use alloc::collections::{TryReserveError, VecDeque};
use alloc::vec::Vec;

use ibcm_ioctl::EventRecord;

use super::DISPATCH_BATCH;

/// Records in one chunk of the [`RecordPool`] (59 KB).
pub(super) const RECORD_CHUNK: usize = 128;

/// The records one DISPATCH_LEVEL entry point queues at most: one per event, and an entry
/// point's events are bounded by its batch ([`DISPATCH_BATCH`]: a timer pass handles at
/// most `TIMER_BATCH` timers, a receive pass `RECEIVE_BATCH` MADs).
pub(super) const DISPATCH_RECORDS: usize = DISPATCH_BATCH;

/// Free records kept beyond those queued: two DISPATCH_LEVEL entry points' worth.
pub(super) const KEEP_FREE: usize = 2 * DISPATCH_RECORDS;

/// How long a timer pass waits for room when the pool is short (1 ms).
pub(super) const ROOM_RETRY_NS: u64 = 1_000_000;

/// Event records by index; an endpoint's FIFO holds indices into it. It grows by whole
/// chunks that never move (growing one large vector would copy, and so touch, all of it).
#[derive(Debug, Default)]
pub(super) struct RecordPool {
    pub(super) chunks: Vec<Vec<EventRecord>>,
    /// Slots ever used; slot `i` is `chunks[i / RECORD_CHUNK][i % RECORD_CHUNK]`.
    pub(super) used: usize,
    pub(super) free: Vec<u32>,
}

impl RecordPool {
    pub(super) fn slot(&mut self, i: u32) -> Option<&mut EventRecord> {
        let i = i as usize;
        self.chunks
            .get_mut(i / RECORD_CHUNK)?
            .get_mut(i % RECORD_CHUNK)
    }

    /// Records that can be stored without allocating.
    pub(super) fn free_slots(&self) -> usize {
        self.free.len() + (self.chunks.len() * RECORD_CHUNK).saturating_sub(self.used)
    }

    /// Fewer than [`KEEP_FREE`] free: time to ask for the PASSIVE_LEVEL work that grows
    /// the pool, before a burst (a reconnect storm's REQs, or the MRAs answering them)
    /// finds no room and its MADs are dropped.
    pub(super) fn running_low(&self) -> bool {
        self.free_slots() < KEEP_FREE
    }

    /// Records queued now.
    pub(super) fn queued(&self) -> usize {
        self.used - self.free.len()
    }

    /// Whether a DISPATCH_LEVEL entry point finds room for all it may queue.
    pub(super) fn has_dispatch_room(&self) -> bool {
        self.free_slots() >= DISPATCH_RECORDS
    }

    /// Stores `record`; `None` past u32::MAX records or when memory runs out. Allocates
    /// only when no slot is free, which a DISPATCH_LEVEL entry point has checked cannot
    /// happen.
    pub(super) fn put(&mut self, record: &EventRecord) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            if let Some(slot) = self.slot(i) {
                *slot = *record;
            }
            return Some(i);
        }
        let i = u32::try_from(self.used).ok()?;
        let chunk = self.used / RECORD_CHUNK;
        if chunk == self.chunks.len() {
            self.grow(1).ok()?;
        }
        self.chunks.get_mut(chunk)?.push(*record);
        self.used += 1;
        Some(i)
    }

    pub(super) fn get(&self, i: u32) -> Option<&EventRecord> {
        let i = i as usize;
        self.chunks.get(i / RECORD_CHUNK)?.get(i % RECORD_CHUNK)
    }

    /// Takes record `i` out, freeing its slot (the free list has room for every slot).
    pub(super) fn take(&mut self, i: u32) -> Option<EventRecord> {
        let record = *self.get(i)?;
        self.free.push(i);
        Some(record)
    }

    /// A FIFO is gone: its records are released.
    pub(super) fn release(&mut self, fifo: &VecDeque<u32>) {
        for &i in fifo {
            let _ = self.take(i);
        }
    }

    /// PASSIVE_LEVEL: as many records free as are queued, [`KEEP_FREE`] at least, and a free list
    /// with room for every slot. With nothing queued, a pool grown by a burst shrinks
    /// back to that (nothing is kept at its high-water mark).
    pub(super) fn prepare(&mut self) {
        // Shrink only well past the need (hysteresis): a pool reset on every call would
        // be allocated again at the next.
        if self.queued() == 0 && self.chunks.len() * RECORD_CHUNK >= 4 * KEEP_FREE {
            *self = Self::default();
        }
        // As many free as queued (at least KEEP_FREE): a pool that ran short doubles, so
        // the retries of what it dropped find room at once, and stays within twice what
        // is queued.
        let short = KEEP_FREE
            .max(self.queued())
            .saturating_sub(self.free_slots());
        let more = short.div_ceil(RECORD_CHUNK);
        // Out of memory: the pool stays short, and the DISPATCH_LEVEL paths hold back.
        let _ = self.grow(more);
    }

    /// `more` chunks, each with its room in the free list, or as many as memory allows.
    fn grow(&mut self, more: usize) -> Result<(), TryReserveError> {
        self.chunks.try_reserve(more)?;
        for _ in 0..more {
            let mut chunk = Vec::new();
            chunk.try_reserve_exact(RECORD_CHUNK)?;
            let slots = (self.chunks.len() + 1) * RECORD_CHUNK;
            self.free
                .try_reserve(slots.saturating_sub(self.free.len()))?;
            self.chunks.push(chunk);
        }
        Ok(())
    }
}
