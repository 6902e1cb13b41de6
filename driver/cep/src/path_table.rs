//! Alternate paths, kept apart from the CEPs: only a connection with APM (a REQ's
//! alternate path) or a LAP in flight has one, and two inline `Option<PathRecord>`s
//! would cost every CEP 96 bytes (budget: 512 bytes a connection in all). A CEP names
//! an entry by a 4-byte [`PathRef`].
//!
//! - Entries never move once stored: an index is the handle.
//! - Room is made at PASSIVE_LEVEL ([`PathTable::prepare`]); a store at DISPATCH_LEVEL
//!   (a received REQ or LAP in fixed-room mode) takes only that room and fails with
//!   `NoResources` otherwise, changing nothing. Elsewhere a store may grow the table.
//! - Freeing never allocates: the free list has room for every entry.
//! - [`PathTable::trim`] gives everything back once no entry is in use.

use alloc::vec::Vec;
use core::num::NonZeroU32;

use crate::error::CmError;
use crate::grow::HeapBytes;
use crate::types::PathRecord;

/// Entries `prepare` keeps free at least.
pub(crate) const KEEP_FREE: usize = 64;

/// Entries `prepare` keeps free at most for the CEPs to come (a listen's backlog).
const MAX_ROOM: usize = 4096;

/// An entry of the table: its index + 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PathRef(NonZeroU32);

impl PathRef {
    fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

/// The table (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct PathTable {
    entries: Vec<PathRecord>,
    /// Free entries; room for every entry.
    free: Vec<u32>,
    in_use: usize,
}

impl PathTable {
    /// An empty table; allocates nothing.
    pub(crate) const fn new() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            in_use: 0,
        }
    }

    /// Entries a store takes without allocating (a new entry needs room in the free
    /// list too, so that freeing it never allocates).
    pub(crate) fn room(&self) -> usize {
        self.free.len() + self.fresh()
    }

    /// Entries never used that the vectors have room for.
    fn fresh(&self) -> usize {
        let entries = self.entries.capacity() - self.entries.len();
        let free = self.free.capacity().saturating_sub(self.entries.len());
        entries.min(free)
    }

    /// Entries in use.
    pub(crate) fn in_use(&self) -> usize {
        self.in_use
    }

    /// Stores `path`; allocates only if `may_grow` and no room is left.
    pub(crate) fn store(&mut self, path: PathRecord, may_grow: bool) -> Result<PathRef, CmError> {
        let index = if let Some(i) = self.free.pop() {
            let entry = self
                .entries
                .get_mut(i as usize)
                .ok_or(CmError::NoResources)?;
            *entry = path;
            i as usize
        } else {
            if self.fresh() == 0 {
                if !may_grow {
                    return Err(CmError::NoResources);
                }
                self.grow(1)?;
            }
            self.entries.push(path);
            self.entries.len() - 1
        };
        let handle = u32::try_from(index + 1)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or(CmError::NoResources)?;
        self.in_use += 1;
        Ok(PathRef(handle))
    }

    /// The path `r` names.
    pub(crate) fn get(&self, r: Option<PathRef>) -> Option<&PathRecord> {
        self.entries.get(r?.index())
    }

    /// The path `r` names, to change in place.
    pub(crate) fn get_mut(&mut self, r: Option<PathRef>) -> Option<&mut PathRecord> {
        self.entries.get_mut(r?.index())
    }

    /// Gives `r`'s entry back (nothing for `None`). Never allocates.
    pub(crate) fn free(&mut self, r: Option<PathRef>) {
        let Some(r) = r else { return };
        // Growth keeps room in the free list for every entry (`grow`).
        debug_assert!(self.free.len() < self.free.capacity(), "free list full");
        if r.index() < self.entries.len() && self.free.len() < self.free.capacity() {
            self.free.push(r.index() as u32);
            self.in_use = self.in_use.saturating_sub(1);
        }
    }

    /// The room `prepare(new)` keeps: `new` more entries (at most [`MAX_ROOM`], at least
    /// [`KEEP_FREE`]) and a quarter of those in use.
    fn wanted(&self, new: usize) -> usize {
        new.clamp(KEEP_FREE, MAX_ROOM) + self.in_use / 4
    }

    /// PASSIVE_LEVEL: room for the alternate paths of `new` CEPs to come and their LAPs
    /// (see `wanted`), so that the REQs and LAPs received at DISPATCH_LEVEL find it. One
    /// compare when the room is there.
    pub(crate) fn prepare(&mut self, new: usize) -> Result<(), CmError> {
        let (want, room) = (self.wanted(new), self.room());
        if room >= want {
            return Ok(());
        }
        self.grow(want - room)
    }

    /// Capacity for `more` entries, and the free list's for all of them.
    fn grow(&mut self, more: usize) -> Result<(), CmError> {
        let no = |_| CmError::NoResources;
        let spare = self.entries.capacity() - self.entries.len();
        if spare < more {
            self.entries.try_reserve(more).map_err(no)?;
        }
        let all = self.entries.capacity();
        if self.free.capacity() < all {
            self.free.try_reserve(all - self.free.len()).map_err(no)?;
        }
        Ok(())
    }

    /// PASSIVE_LEVEL: with no entry in use and over twice the room `prepare(new)` keeps,
    /// everything goes (the next `prepare` makes its room again; hysteresis, so that a
    /// table is not made and unmade at every call). Entries in use never move, so a table
    /// with any keeps its size. Never allocates.
    pub(crate) fn trim(&mut self, new: usize) {
        if self.in_use == 0 && self.entries.capacity() > 2 * self.wanted(new) {
            *self = Self::new();
        }
    }
}

impl HeapBytes for PathTable {
    fn heap_bytes(&self) -> usize {
        self.entries.heap_bytes() + self.free.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(slid: u16) -> PathRecord {
        PathRecord {
            slid,
            ..PathRecord::default()
        }
    }

    #[test]
    fn entries_stay_put_and_come_back() {
        let mut t = PathTable::new();
        let a = t.store(path(1), true).unwrap();
        let b = t.store(path(2), true).unwrap();
        assert_eq!(t.get(Some(a)).map(|p| p.slid), Some(1));
        t.free(Some(a));
        let c = t.store(path(3), false).unwrap();
        assert_eq!(c, a, "a freed entry is taken again");
        assert_eq!(t.get(Some(b)).map(|p| p.slid), Some(2));
        assert_eq!(t.in_use(), 2);
        t.free(Some(b));
        t.free(Some(c));
        t.trim(0);
        assert!(t.heap_bytes() > 0, "a table within twice its room stays");
        t.prepare(MAX_ROOM).unwrap();
        t.trim(0);
        assert_eq!(
            t.heap_bytes(),
            0,
            "an unused table past twice its room goes"
        );
    }

    #[test]
    fn without_growth_only_prepared_room_is_taken() {
        let mut t = PathTable::new();
        assert_eq!(t.store(path(1), false), Err(CmError::NoResources));
        t.prepare(0).unwrap();
        let room = t.room();
        assert!(room >= KEEP_FREE);
        for i in 0..room {
            t.store(path(i as u16), false).unwrap();
        }
        assert_eq!(t.store(path(0), false), Err(CmError::NoResources));
        assert_eq!(t.in_use(), room);
    }
}
