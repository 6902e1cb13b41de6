//! What the manager holds, in bytes: the capacity of its slab, lookups, timer heap and
//! queues (what a kernel pays in nonpaged pool, touched or not), and apart from it the
//! private data it caches (the budgets exclude cached private data).

use core::mem::size_of;

use super::CmManager;
use crate::error::CmError;
use crate::grow::{
    CHUNK, HeapBytes, reserve_queue, retired_bytes, shrink_map, shrink_queue, shrink_vec,
};

/// Slots the slab keeps however few CEPs live (16 chunks, about 1 MB); also the room a
/// lookup or the timer heap keeps beyond twice its need.
const TRIM_SLACK: usize = 16 * CHUNK;

/// The manager's heap by part (see [`CmManager::memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineMemory {
    /// The CEP slab and its free list, and the CEPs' alternate paths (path_table.rs).
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
    /// may (its two peer-lookup entries, its timer), so that handling
    /// MADs and timeouts allocates nothing; each table grows to that need and no further
    /// (hash tables by powers of two, the slab by chunks: amortised O(1) either way).
    /// Cheap when the room is there. Fails (keeping what it made) if memory runs out.
    pub fn prepare_for(&mut self, new: usize) -> Result<(), CmError> {
        let no = |_| CmError::NoResources;
        // What the owner wants room for (a listen's backlog) is kept: a trim between two
        // calls must not give back what the next call would make again.
        if new > 0 {
            self.room_wanted = new;
        }
        if self.trim_due(new) {
            self.trim(new);
        }
        // REQs past their listens' backlogs are held from this room too, while any are
        // (held.rs).
        let headroom = self.held_headroom();
        if headroom == 0 {
            // None held: a past storm's table goes back (held.rs).
            self.trim_held();
        }
        self.reserve_held(headroom)?;
        let new = new + headroom;
        let ceps = self.live + new;
        // One at least: the next CREATE takes a restored slot, not the slab's fresh end.
        self.restore_chunks(new.max(1))?;
        if self.fresh_and_reusable() < new {
            self.slots.try_reserve(new).map_err(no)?;
        }
        let slots = self.slots.capacity();
        if self.free.capacity() < slots {
            self.free.try_reserve(slots - self.free.len()).map_err(no)?;
        }
        for map in [&mut self.remote_ids, &mut self.remote_qpns] {
            if map.capacity() < ceps {
                map.try_reserve(ceps - map.len(), &self.slots)
                    .map_err(|_| CmError::NoResources)?;
            }
        }
        if self.local_qpns.capacity() < ceps {
            self.local_qpns
                .try_reserve(ceps - self.local_qpns.len())
                .map_err(|_| CmError::NoResources)?;
        }
        let sidr = new.min(4096);
        if self.sidr_requests.capacity() - self.sidr_requests.len() < sidr {
            self.sidr_requests
                .try_reserve(sidr)
                .map_err(|_| CmError::NoResources)?;
        }
        // One timer entry per CEP at most (timer_heap.rs).
        self.timers.try_reserve_total(ceps).map_err(no)?;
        // Alternate paths for the REQs and LAPs to come (path_table.rs); an unused table
        // past twice that goes back first.
        self.paths.trim(new);
        self.paths.prepare(new)?;
        self.paths_short = false;
        // The queues are drained after every MAD and timer pass.
        reserve_queue(&mut self.events, new.min(4096)).map_err(no)?;
        reserve_queue(&mut self.transmits, new.min(4096)).map_err(no)?;
        Ok(())
    }

    /// Whether the slab holds over `TRIM_FACTOR` times what the live CEPs need, beyond room
    /// for `new` more, and a sixteenth of it is chunks with no CEP; or a past burst left
    /// room reserved (slab room past its last slot used, queues) over twice what `new`
    /// more need: then the next [`prepare_for`](Self::prepare_for) (PASSIVE_LEVEL) gives
    /// them back. O(1).
    pub fn trim_due(&self, new: usize) -> bool {
        let new = self.kept_room(new);
        let kept = Self::kept_for(new) / CHUNK;
        self.slots.trim_due(self.live, new, TRIM_SLACK, kept)
            || self.slots.fresh_room() > 2 * Self::kept_for(new) + TRIM_SLACK
            || self.queues_over(new)
    }

    /// Whether the MAD or event queue holds room over twice what `prepare_for(new)`
    /// reserves (a storm's MRAs, all sent in one pass, grew it).
    fn queues_over(&self, new: usize) -> bool {
        let need = new.min(4096);
        let over = |capacity: usize| capacity > 2 * need + TRIM_SLACK;
        over(self.transmits.capacity()) || over(self.events.capacity())
    }

    /// The CEPs a trim keeps room for: `new`, what `prepare_for` and `reserve` were asked
    /// for, and the REQs held past their backlogs (they take their room from the same
    /// reservation, held.rs).
    fn kept_room(&self, new: usize) -> usize {
        new.max(self.room_wanted).max(self.reserve_need()) + self.held_headroom()
    }

    /// What [`Self::reserve`] was asked for, as far as the live CEPs and listens still
    /// need it: the kernel-client wrapper's own formula, room for twice the live CEPs
    /// and one more (driver/endpoint device/client.rs `client_downcall`), and every
    /// listen's backlog (a client's listen reserves it). A past peak's claim goes; an
    /// owner that needs more asks again at its next downcall (PASSIVE_LEVEL). O(1).
    fn reserve_need(&self) -> usize {
        let live_need = self
            .live
            .saturating_add(1)
            .saturating_mul(2)
            .saturating_add(self.listens.backlogs());
        self.reserved.min(live_need)
    }

    /// Vacant slots a trim keeps for `new` CEPs: as many chunks as they need free slots
    /// beyond the REUSE_AFTER - 1 that wait, so that the next CEPs find them rather than
    /// restoring what was just retired.
    fn kept_for(new: usize) -> usize {
        (new + super::REUSE_AFTER).next_multiple_of(CHUNK)
    }

    /// Slots a new CEP can take without allocating: fresh ones, and free ones beyond the
    /// REUSE_AFTER - 1 that `CmManager::alloc` leaves waiting.
    pub(super) fn fresh_and_reusable(&self) -> usize {
        let reusable = self.free.len().saturating_sub(super::REUSE_AFTER - 1);
        self.slots.capacity() - self.slots.len() + reusable
    }

    /// Puts retired chunks back (PASSIVE_LEVEL) until `new` CEPs fit in free slots, before
    /// the slab grows or its fresh room is used: their slots go to the back of the free
    /// list with the generations they had. (Fresh room taken while chunks are retired
    /// would move the slab's end, and its retired list, ever further.)
    pub(super) fn restore_chunks(&mut self, new: usize) -> Result<(), CmError> {
        let reusable = |m: &Self| m.free.len().saturating_sub(super::REUSE_AFTER - 1);
        while reusable(self) < new && !self.retired.is_empty() {
            self.free
                .try_reserve(CHUNK)
                .map_err(|_| CmError::NoResources)?;
            let restored = self
                .slots
                .restore_retired(&mut self.retired)
                .map_err(|_| CmError::NoResources)?;
            if let Some(indices) = restored {
                self.free.extend(indices.map(|i| i as u32));
            }
        }
        Ok(())
    }

    /// Gives back what a past peak left (PASSIVE_LEVEL; `prepare_for` calls it when
    /// [`trim_due`](Self::trim_due)): slab chunks without a CEP, keeping 4 bytes a slot
    /// for their generations (a slot's next comm ID must not repeat a recent one, IBA
    /// 12.9.8.3), and the lookups', timers' and free list's room beyond what the live
    /// CEPs and `new` more need.
    fn trim(&mut self, new: usize) {
        // `reserve`'s claim follows the live need from here on.
        self.reserved = self.reserve_need();
        let new = self.kept_room(new);
        let keep = Self::kept_for(new) / CHUNK;
        let retired = self.slots.retire_vacant(&mut self.retired, keep);
        // The room past the last slot used that a burst reserved (REQs held past a
        // backlog: held.rs) and no CEP ever took.
        let unused = self.slots.shrink_room(Self::kept_for(new));
        if retired > 0 {
            let slots = &self.slots;
            self.free.retain(|&i| slots.get(i as usize).is_some());
        }
        if retired + unused > 0 {
            shrink_queue(&mut self.free, self.slots.resident());
        }
        // The queues are drained after every MAD and timer pass: their room for a burst.
        let queued = new.min(4096);
        if self.queues_over(new) {
            shrink_queue(&mut self.transmits, queued);
            shrink_queue(&mut self.events, queued);
        }
        // Rehashing costs O(entries): only tables over twice their need shrink.
        let ceps = self.live + new;
        for map in [&mut self.remote_ids, &mut self.remote_qpns] {
            if map.capacity() > 2 * ceps + TRIM_SLACK {
                map.shrink_to(ceps, &self.slots);
            }
        }
        if self.local_qpns.capacity() > 2 * ceps + TRIM_SLACK {
            shrink_map(&mut self.local_qpns, ceps);
        }
        let sidr = new.min(4096);
        if self.sidr_requests.capacity() > 2 * sidr + TRIM_SLACK {
            shrink_map(&mut self.sidr_requests, sidr);
        }
        if self.timers.capacity() > 2 * ceps + TRIM_SLACK {
            self.timers.shrink_to(ceps);
        }
        shrink_vec(&mut self.retired, 0);
        self.trim_held();
    }

    /// The heap this manager holds, by part.
    pub fn memory(&self) -> EngineMemory {
        // The private-data pool: its blocks, in use or free, and its tables.
        let mut private_data = self.pdata.bytes();
        private_data += self.listens.compare_bytes();
        EngineMemory {
            slab: self.slots.heap_bytes()
                + self.free.heap_bytes()
                + retired_bytes(&self.retired)
                + self.paths.heap_bytes(),
            lookups: self.remote_ids.heap_bytes()
                + self.remote_qpns.heap_bytes()
                + hash_table_bytes(
                    self.local_qpns.capacity(),
                    size_of::<(super::local_qpn::QpnKey, super::local_qpn::Hold)>(),
                )
                + hash_table_bytes(
                    self.sidr_requests.capacity(),
                    size_of::<((u32, ibcm_mad::Gid, u16), crate::types::CepId)>(),
                ),
            timers: self.timers.capacity() * size_of::<super::timer_heap::TimerEntry>(),
            queues: self.transmits.heap_bytes()
                + self.events.heap_bytes()
                + self.listens.heap_bytes()
                + hash_table_bytes(
                    self.held.capacity(),
                    size_of::<(u32, super::held::HeldReq)>(),
                )
                + self.peers.heap_bytes(),
            private_data,
        }
    }
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::super::local_qpn::{Hold, QpnKey};
    use super::super::timer_heap::TimerEntry;
    use super::super::{Slot, lookup};

    /// What one connection costs the engine per part, before the tables' load factors
    /// and chunk rounding (the budget, design.md: 512 bytes in all with the dispatch
    /// layer's endpoint): the slot, two peer-lookup entries, a local-QPN entry, a timer
    /// entry, a free-list index. A field added to the CEP or a key widened shows here.
    #[test]
    fn per_connection_types_stay_small() {
        let parts = [
            ("slot", size_of::<Slot>(), 256),
            ("peer entry", lookup::entry_size(), 4),
            ("local QPN entry", size_of::<(QpnKey, Hold)>(), 24),
            ("timer entry", size_of::<TimerEntry>(), 16),
        ];
        for (name, size, most) in parts {
            assert!(size <= most, "{name}: {size} bytes, at most {most}");
        }
    }
}
