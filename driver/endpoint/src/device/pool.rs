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

use alloc::collections::TryReserveError;
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

/// Event records by index; an endpoint's FIFO is a list through it. It grows by whole
/// chunks that never move (growing one large vector would copy, and so touch, all of it).
#[derive(Debug, Default)]
pub(super) struct RecordPool {
    pub(super) chunks: Vec<Vec<EventRecord>>,
    /// Slots ever used; slot `i` is `chunks[i / RECORD_CHUNK][i % RECORD_CHUNK]`.
    pub(super) used: usize,
    pub(super) free: Vec<u32>,
    /// The record queued after each queued record on its endpoint's FIFO: room for every
    /// slot, so queueing allocates nothing.
    pub(super) next: Vec<u32>,
}

/// An endpoint's queued events: a list through the [`RecordPool`] (16 bytes, where a
/// queue of its own took 32 and its buffer 32 more in every endpoint, queued or not).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Fifo {
    head: u32,
    tail: u32,
    len: u32,
    /// Records it may hold before its endpoint is named again (a listen: its backlog's
    /// REQs), made at PASSIVE_LEVEL (`Inner::grow_fifo`); checked where a REQ queues.
    room: u32,
}

impl Fifo {
    /// An empty FIFO with room for `room` records.
    pub(super) fn with_room(room: usize) -> Self {
        Self {
            room: u32::try_from(room).unwrap_or(u32::MAX),
            ..Self::default()
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len as usize
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether one more record is within its room.
    pub(super) fn has_room(&self) -> bool {
        self.len < self.room
    }

    /// Room for `n` records beyond those queued.
    pub(super) fn grow(&mut self, n: usize) {
        let want = self.len().saturating_add(n);
        self.room = self.room.max(u32::try_from(want).unwrap_or(u32::MAX));
    }
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

    /// Queues record `i` (from [`put`](Self::put)) at the back of `fifo`. Allocates
    /// nothing.
    pub(super) fn push_back(&mut self, fifo: &mut Fifo, i: u32) {
        if fifo.len == 0 {
            fifo.head = i;
        } else if let Some(link) = self.next.get_mut(fifo.tail as usize) {
            *link = i;
        }
        fifo.tail = i;
        fifo.len += 1;
    }

    /// The record index at the front of `fifo`, dequeued.
    pub(super) fn pop_front(&mut self, fifo: &mut Fifo) -> Option<u32> {
        if fifo.len == 0 {
            return None;
        }
        let i = fifo.head;
        fifo.len -= 1;
        if fifo.len > 0 {
            fifo.head = self.next.get(i as usize).copied()?;
        }
        Some(i)
    }

    /// The record index at position `k` of `fifo` (O(k)).
    pub(super) fn nth(&self, fifo: &Fifo, k: usize) -> Option<u32> {
        self.indices(fifo).nth(k)
    }

    /// The record index after `i` on `fifo` (`i` one of its records).
    pub(super) fn after(&self, fifo: &Fifo, i: u32) -> Option<u32> {
        (i != fifo.tail).then(|| self.next.get(i as usize).copied())?
    }

    /// Dequeues the record at position `k` of `fifo` (O(k)); its slot stays taken.
    pub(super) fn remove_nth(&mut self, fifo: &mut Fifo, k: usize) -> Option<u32> {
        if k == 0 {
            return self.pop_front(fifo);
        }
        let before = self.nth(fifo, k - 1)?;
        let i = self.nth(fifo, k)?;
        let after = self.next.get(i as usize).copied().unwrap_or(0);
        if let Some(link) = self.next.get_mut(before as usize) {
            *link = after;
        }
        if fifo.tail == i {
            fifo.tail = before;
        }
        fifo.len -= 1;
        Some(i)
    }

    /// The record indices of `fifo`, front first.
    pub(super) fn indices(&self, fifo: &Fifo) -> impl Iterator<Item = u32> + '_ {
        let (mut at, len) = (fifo.head, fifo.len);
        (0..len).map_while(move |n| {
            let i = at;
            if n + 1 < len {
                at = *self.next.get(i as usize)?;
            }
            Some(i)
        })
    }

    /// A FIFO is gone: its records are released.
    pub(super) fn release(&mut self, fifo: &Fifo) {
        let mut at = fifo.head;
        for n in 0..fifo.len {
            let next = self.next.get(at as usize).copied();
            let _ = self.take(at);
            match next {
                Some(next) if n + 1 < fifo.len => at = next,
                _ => break,
            }
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
            self.next
                .try_reserve_exact(slots.saturating_sub(self.next.len()))?;
            self.next.resize(slots, 0);
            self.chunks.push(chunk);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use zerocopy::FromZeros;

    fn record(tag: u32) -> EventRecord {
        let mut r = EventRecord::new_zeroed();
        r.event_type = tag;
        r
    }

    /// Two FIFOs interleaved through one pool keep their own order through pushes, pops
    /// and a removal from the middle, and release only their own records.
    #[test]
    fn fifos_keep_their_order_through_the_pool() {
        let mut pool = RecordPool::default();
        pool.prepare();
        let (mut a, mut b) = (Fifo::with_room(8), Fifo::with_room(8));
        for t in 0..6u32 {
            let i = pool.put(&record(t)).unwrap();
            let fifo = if t % 2 == 0 { &mut a } else { &mut b };
            pool.push_back(fifo, i);
        }
        let tags = |pool: &RecordPool, f: &Fifo| -> Vec<u32> {
            pool.indices(f)
                .map(|i| pool.get(i).unwrap().event_type)
                .collect()
        };
        assert_eq!(tags(&pool, &a), [0, 2, 4]);
        assert_eq!(tags(&pool, &b), [1, 3, 5]);
        let middle = pool.remove_nth(&mut a, 1).unwrap();
        assert_eq!(pool.take(middle).unwrap().event_type, 2);
        let last = pool.remove_nth(&mut b, 2).unwrap();
        assert_eq!(pool.take(last).unwrap().event_type, 5);
        let i = pool.put(&record(7)).unwrap();
        pool.push_back(&mut b, i);
        assert_eq!(tags(&pool, &a), [0, 4]);
        assert_eq!(tags(&pool, &b), [1, 3, 7]);
        let front = pool.pop_front(&mut b).unwrap();
        assert_eq!(pool.take(front).unwrap().event_type, 1);
        assert_eq!(tags(&pool, &b), [3, 7]);
        let queued = pool.queued();
        pool.release(&a);
        assert_eq!(pool.queued(), queued - 2);
        assert_eq!(tags(&pool, &b), [3, 7]);
        assert!(b.has_room() && b.len() == 2);
    }
}
