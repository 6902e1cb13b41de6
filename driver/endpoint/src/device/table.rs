//! Per-file tables of files and endpoints: a handle is index | generation << 32, so a
//! stale handle never names a new entry (design.md: handles are per file, never global).

use alloc::collections::TryReserveError;
use alloc::vec::Vec;

use ibcm_cep::grow::{CHUNK, ChunkedVec, Retired, Vacancy, retired_bytes, shrink_vec};

/// Slots a table keeps however few values live (8 chunks).
const TRIM_SLACK: usize = 8 * CHUNK;

pub(super) fn handle_of(index: u32, generation: u32) -> u64 {
    u64::from(index) | (u64::from(generation) << 32)
}

pub(super) fn split(handle: u64) -> (usize, u32) {
    ((handle & 0xffff_ffff) as usize, (handle >> 32) as u32)
}

#[derive(Debug)]
pub(super) struct Slot<T> {
    pub(super) generation: u32,
    pub(super) value: Option<T>,
}

impl<T> Vacancy for Slot<T> {
    fn vacant_generation(&self) -> Option<u32> {
        self.value.is_none().then_some(self.generation)
    }

    fn vacant(generation: u32) -> Self {
        Self {
            generation,
            value: None,
        }
    }
}

/// A generation-checked table: handles are `index | generation << 32`, generation >= 1.
#[derive(Debug)]
pub(super) struct Table<T> {
    /// Grows by chunks: an endpoint never moves and growing copies nothing.
    pub(super) slots: ChunkedVec<Slot<T>>,
    /// Free slots of resident chunks.
    pub(super) free: Vec<u32>,
    pub(super) live: usize,
    /// Chunks given back after a peak ([`trim`](Self::trim)), with their generations.
    pub(super) retired: Retired,
}

impl<T> Table<T> {
    pub(super) const fn new() -> Self {
        Self {
            slots: ChunkedVec::new(),
            free: Vec::new(),
            live: 0,
            retired: Vec::new(),
        }
    }

    /// Every live value.
    pub(super) fn values(&self) -> impl Iterator<Item = &T> {
        (0..self.slots.len()).filter_map(|i| self.slots.get(i)?.value.as_ref())
    }

    pub(super) fn get(&self, handle: u64) -> Option<&T> {
        let (i, g) = split(handle);
        let s = self.slots.get(i)?;
        (s.generation == g).then_some(s.value.as_ref()).flatten()
    }

    pub(super) fn get_mut(&mut self, handle: u64) -> Option<&mut T> {
        let (i, g) = split(handle);
        let s = self.slots.get_mut(i)?;
        if s.generation != g {
            return None;
        }
        s.value.as_mut()
    }

    /// Stores `value` and returns its handle; without room (memory ran out) hands it back.
    /// Allocates only when [`can_insert`](Self::can_insert) is false.
    pub(super) fn try_insert(&mut self, value: T) -> Result<u64, T> {
        if !self.can_insert() && self.try_reserve(1).is_err() {
            return Err(value);
        }
        if let Some(i) = self.free.pop() {
            let Some(s) = self.slots.get_mut(i as usize) else {
                // A free index names a resident slot (`trim` drops the others).
                return Err(value);
            };
            s.value = Some(value);
            let handle = handle_of(i, s.generation);
            self.slots.filled(i as usize);
            self.live += 1;
            return Ok(handle);
        }
        // Room checked: the slab has a fresh slot and `free` room for it.
        let i = self.slots.len() as u32;
        self.slots.push(Slot {
            generation: 1,
            value: Some(value),
        });
        self.slots.filled(i as usize);
        self.live += 1;
        Ok(handle_of(i, 1))
    }

    pub(super) fn remove(&mut self, handle: u64) -> Option<T> {
        let (i, g) = split(handle);
        let s = self.slots.get_mut(i)?;
        if s.generation != g {
            return None;
        }
        let v = s.value.take()?;
        s.generation = s.generation.wrapping_add(1).max(1);
        self.live -= 1;
        self.slots.vacated(i);
        self.free.push(i as u32);
        Some(v)
    }

    /// Room for `n` more values without allocating (PASSIVE_LEVEL): retired chunks come
    /// back first, with their generations, before the table grows. On failure (memory ran
    /// out) the room is short; `can_insert` then says so.
    pub(super) fn try_reserve(&mut self, n: usize) -> Result<(), TryReserveError> {
        while self.free.len() < n && !self.retired.is_empty() {
            self.free.try_reserve(CHUNK)?;
            if let Some(indices) = self.slots.restore_retired(&mut self.retired)? {
                self.free.extend(indices.rev().map(|i| i as u32));
            }
        }
        let spare = self.free.len();
        if n > spare {
            self.slots.try_reserve(n - spare)?;
            // `remove` never allocates: room in `free` for every slot the new values may
            // fill. (Room for these slots, not the slab's whole chunk: `can_insert` reads
            // `free`'s capacity as the room reserved, which bounds the kernel clients' pool.)
            let slots = self.slots.len() + (n - spare);
            self.free
                .try_reserve(slots.saturating_sub(self.free.len()))?;
        }
        Ok(())
    }

    /// Gives back what a past peak left (PASSIVE_LEVEL), once the table holds over
    /// `TRIM_FACTOR` times the slots its values need beyond room for `keep` more, and a
    /// sixteenth of it
    /// is chunks with no value: those chunks, keeping their generations (a stale handle
    /// must never name a new value). O(1) when not due.
    /// Returns whether it gave anything back.
    pub(super) fn trim(&mut self, keep: usize) -> bool {
        let kept = keep.div_ceil(CHUNK);
        if !self.slots.trim_due(self.live, keep, TRIM_SLACK, kept) {
            return false;
        }
        let retired = self.slots.retire_vacant(&mut self.retired, kept) > 0;
        if retired {
            let slots = &self.slots;
            self.free.retain(|&i| slots.get(i as usize).is_some());
            // `remove` never allocates: room for every resident slot stays.
            let resident = self.slots.resident();
            shrink_vec(&mut self.free, resident);
            shrink_vec(&mut self.retired, 0);
        }
        retired
    }

    /// Heap bytes of the chunks given back (their generations).
    pub(super) fn retired_bytes(&self) -> usize {
        retired_bytes(&self.retired)
    }

    /// Whether `insert` can run without allocating.
    pub(super) fn can_insert(&self) -> bool {
        !self.free.is_empty()
            || (self.slots.len() < self.slots.capacity() && self.free.capacity() > self.slots.len())
    }

    /// The first live handle at or after slot `from`, and the slot after it: a walk that
    /// leaves the lock between steps (cleanup) resumes where it stopped.
    pub(super) fn next_handle(&self, from: usize) -> Option<(u64, usize)> {
        (from..self.slots.len()).find_map(|i| {
            let s = self.slots.get(i)?;
            s.value
                .as_ref()
                .map(|_| (handle_of(i as u32, s.generation), i + 1))
        })
    }

    pub(super) fn handles(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_ref().map(|_| handle_of(i as u32, s.generation)))
    }
}
