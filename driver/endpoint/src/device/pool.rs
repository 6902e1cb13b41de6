//! The pool of event records kept for endpoints with no GET_EVENT waiting: grown at
//! PASSIVE_LEVEL, taken at DISPATCH_LEVEL without allocating.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use ibcm_cep::grow::reserve_queue;
use ibcm_ioctl::{EventRecord, status};

use crate::records::Status;

/// Records in one chunk of the [`RecordPool`] (475 KB).
pub(super) const RECORD_CHUNK: usize = 1024;

/// The event records queued on the endpoints of the device, in one pool: an endpoint's
/// FIFO holds indices into it. Every FIFO's capacity is room promised here and made at
/// PASSIVE_LEVEL, so queueing a record at DISPATCH_LEVEL never allocates; and memory is
/// touched only for the records queued at once, not for every endpoint's headroom of
/// 464-byte records. The pool grows by whole chunks that are never moved: growing one
/// large vector would copy (and so touch) all the room it had.
#[derive(Debug, Default)]
pub(super) struct RecordPool {
    pub(super) chunks: Vec<Vec<EventRecord>>,
    /// Slots ever used; slot `i` is `chunks[i / RECORD_CHUNK][i % RECORD_CHUNK]`.
    pub(super) used: usize,
    pub(super) free: Vec<u32>,
    /// The capacities of every endpoint's FIFO (live and spare) summed.
    pub(super) promised: usize,
}

impl RecordPool {
    pub(super) fn slot(&mut self, i: u32) -> Option<&mut EventRecord> {
        let i = i as usize;
        self.chunks
            .get_mut(i / RECORD_CHUNK)?
            .get_mut(i % RECORD_CHUNK)
    }

    /// Stores `record`; `None` only past u32::MAX records.
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
            // Only when more records are queued than was promised (not at DISPATCH_LEVEL).
            self.chunks.push(Vec::with_capacity(RECORD_CHUNK));
        }
        self.chunks.get_mut(chunk)?.push(*record);
        self.used += 1;
        Some(i)
    }

    pub(super) fn get(&self, i: u32) -> Option<&EventRecord> {
        let i = i as usize;
        self.chunks.get(i / RECORD_CHUNK)?.get(i % RECORD_CHUNK)
    }

    /// Takes record `i` out, freeing its slot.
    pub(super) fn take(&mut self, i: u32) -> Option<EventRecord> {
        let record = *self.get(i)?;
        self.free.push(i);
        Some(record)
    }

    /// A new FIFO of `depth` records.
    pub(super) fn fifo(&mut self, depth: usize) -> VecDeque<u32> {
        let fifo = VecDeque::with_capacity(depth);
        self.promised += fifo.capacity();
        fifo
    }

    /// Room in `fifo` for `n` more records (PASSIVE_LEVEL).
    pub(super) fn grow(&mut self, fifo: &mut VecDeque<u32>, n: usize) -> Result<(), Status> {
        let before = fifo.capacity();
        reserve_queue(fifo, n).map_err(|_| status::INSUFFICIENT_RESOURCES)?;
        self.promised += fifo.capacity() - before;
        Ok(())
    }

    /// A FIFO is gone: its records and its promise are released.
    pub(super) fn release(&mut self, fifo: &VecDeque<u32>) {
        for &i in fifo {
            let _ = self.take(i);
        }
        self.promised = self.promised.saturating_sub(fifo.capacity());
    }

    /// Room for every record promised (PASSIVE_LEVEL): no FIFO holds more than its
    /// capacity, so at most `promised` slots are in use at once, and the free list holds
    /// at most every slot.
    pub(super) fn prepare(&mut self) {
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
