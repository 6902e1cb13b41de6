//! What the manager holds, in bytes: the capacity of its slab, lookups, timer heap and
//! queues (what a kernel pays in nonpaged pool, touched or not), and apart from it the
//! private data it caches (the budgets exclude cached private data).

use core::mem::size_of;

use super::CmManager;
use crate::error::CmError;
use crate::grow::{HeapBytes, reserve_queue};

/// The manager's heap by part (see [`CmManager::memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineMemory {
    /// The CEP slab and its free list.
    pub slab: usize,
    /// The peer lookups (remote comm ID and QPN, SIDR requests).
    pub lookups: usize,
    /// The timer heap.
    pub timers: usize,
    /// Queued MADs and events, listens and peer-to-peer requests.
    pub queues: usize,
    /// Private data cached for repeats (REQ/REP/DREQ..., MRA, APR): the private-data
    /// pool, its free blocks included; and listens' compare data.
    pub private_data: usize,
}

impl EngineMemory {
    /// Everything but the cached private data.
    pub fn tables(&self) -> usize {
        self.slab + self.lookups + self.timers + self.queues
    }

    /// Everything.
    pub fn total(&self) -> usize {
        self.tables() + self.private_data
    }
}

/// The allocation of a hashbrown table of `capacity` (items + growth left) entries of
/// `entry` bytes: one control byte a bucket plus a group's width (16), the buckets a
/// power of two with 7/8 of them usable (hashbrown's `capacity_to_buckets` inverted).
pub(super) fn hash_table_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        capacity + 1
    } else {
        capacity / 7 * 8
    };
    let data = (buckets * entry).next_multiple_of(16);
    data + buckets + 16
}

impl CmManager {
    /// Makes room, at PASSIVE_LEVEL, for `new` more CEPs and for every CEP to hold all it
    /// may (its two peer-lookup entries, two more timer arms), so that handling
    /// MADs and timeouts allocates nothing; each table grows to that need and no further
    /// (hash tables by powers of two, the slab by chunks: amortised O(1) either way).
    /// Cheap when the room is there. Fails (keeping what it made) if memory runs out.
    pub fn prepare_for(&mut self, new: usize) -> Result<(), CmError> {
        let no = |_| CmError::NoResources;
        let ceps = self.live + new;
        // Free slots are reused only beyond REUSE_AFTER - 1 of them (`CmManager::alloc`).
        let reusable = self.free.len().saturating_sub(super::REUSE_AFTER - 1);
        if self.slots.capacity() - self.slots.len() + reusable < new {
            self.slots.try_reserve(new).map_err(no)?;
        }
        let slots = self.slots.capacity();
        if self.free.capacity() < slots {
            self.free.try_reserve(slots - self.free.len()).map_err(no)?;
        }
        for map in [&mut self.remote_ids, &mut self.remote_qpns] {
            if map.capacity() < ceps {
                map.try_reserve(ceps - map.len())
                    .map_err(|_| CmError::NoResources)?;
            }
        }
        let sidr = new.min(4096);
        if self.sidr_requests.capacity() - self.sidr_requests.len() < sidr {
            self.sidr_requests
                .try_reserve(sidr)
                .map_err(|_| CmError::NoResources)?;
        }
        // Cancelled entries stay in the heap until they reach its top: room for two
        // more arms of every CEP beyond what it holds, as `reserve` makes.
        let timers = ceps.saturating_mul(2);
        if self.timers.capacity() - self.timers.len() < timers {
            self.timers.try_reserve(timers).map_err(no)?;
        }
        // The queues are drained after every MAD and timer pass.
        reserve_queue(&mut self.events, new.min(4096)).map_err(no)?;
        reserve_queue(&mut self.transmits, new.min(4096)).map_err(no)?;
        Ok(())
    }

    /// The heap this manager holds, by part.
    pub fn memory(&self) -> EngineMemory {
        // The private-data pool: its blocks, in use or free, and its tables.
        let mut private_data = self.pdata.bytes();
        private_data += self
            .listens
            .iter()
            .filter_map(|l| l.params.compare.as_ref())
            .map(|(_, bytes)| bytes.capacity())
            .sum::<usize>();
        EngineMemory {
            slab: self.slots.heap_bytes() + self.free.heap_bytes(),
            lookups: self.remote_ids.heap_bytes()
                + self.remote_qpns.heap_bytes()
                + hash_table_bytes(
                    self.sidr_requests.capacity(),
                    size_of::<((u32, ibcm_mad::Gid, u16), crate::types::CepId)>(),
                ),
            timers: self.timers.capacity()
                * size_of::<core::cmp::Reverse<(crate::types::Instant, core::num::NonZeroU32, u32)>>(
                ),
            queues: self.transmits.heap_bytes()
                + self.events.heap_bytes()
                + self.listens.heap_bytes()
                + self.peers.heap_bytes(),
            private_data,
        }
    }
}
