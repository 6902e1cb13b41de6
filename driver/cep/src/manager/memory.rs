//! What the manager holds, in bytes: the capacity of its slab, lookups, timer heap and
//! queues (what a kernel pays in nonpaged pool, touched or not), and apart from it the
//! private data it caches (the budgets exclude cached private data).

use core::mem::size_of;

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::CmManager;

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
    /// Private data cached for repeats (REQ/REP/DREQ..., MRA, APR) and listens' compare
    /// data.
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

fn vec_bytes<T>(v: &Vec<T>) -> usize {
    v.capacity() * size_of::<T>()
}

fn deque_bytes<T>(v: &VecDeque<T>) -> usize {
    v.capacity() * size_of::<T>()
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
    /// The heap this manager holds, by part.
    pub fn memory(&self) -> EngineMemory {
        let mut private_data = 0;
        for i in 0..self.slots.len() {
            if let Some(c) = self.slots.get(i).and_then(|s| s.cep.as_ref()) {
                private_data += c.pdata.capacity() + c.mra_pdata.capacity() + c.apr_info.capacity();
            }
        }
        private_data += self
            .listens
            .iter()
            .filter_map(|l| l.params.compare.as_ref())
            .map(|(_, bytes)| bytes.capacity())
            .sum::<usize>();
        EngineMemory {
            slab: self.slots.heap_bytes() + vec_bytes(&self.free),
            lookups: self.remote_ids.heap_bytes()
                + self.remote_qpns.heap_bytes()
                + hash_table_bytes(
                    self.sidr_requests.capacity(),
                    size_of::<((u32, ibcm_mad::Gid, u16), crate::types::CepId)>(),
                ),
            timers: self.timers.capacity()
                * size_of::<core::cmp::Reverse<(crate::types::Instant, core::num::NonZeroU32, u32)>>(
                ),
            queues: deque_bytes(&self.transmits)
                + deque_bytes(&self.events)
                + vec_bytes(&self.listens)
                + vec_bytes(&self.peers),
            private_data,
        }
    }
}
