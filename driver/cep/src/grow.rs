//! Growing without copying, for the tables and queues that grow with the number of
//! connections.
//!
//! A `Vec` that doubles copies its whole old buffer into a new one: on a host that means
//! faulting in fresh pages for everything it held, and in a kernel a transient peak of
//! twice the table in nonpaged pool. [`ChunkedVec`] grows by chunks and never moves an
//! element; [`reserve_queue`] replaces an empty queue's buffer rather than growing it.

use alloc::collections::{TryReserveError, VecDeque};
use alloc::vec::Vec;

/// Room in `queue` for `n` more entries. An empty queue gets a new buffer: growing it
/// would copy its old buffer, every byte of it, for nothing.
pub fn reserve_queue<T>(queue: &mut VecDeque<T>, n: usize) -> Result<(), TryReserveError> {
    if queue.is_empty() && queue.capacity() < n {
        let mut fresh = VecDeque::new();
        fresh.try_reserve(n)?;
        *queue = fresh;
        return Ok(());
    }
    queue.try_reserve(n)
}

/// Shrinks `v`'s buffer to `min` elements (its length at least) without aborting when
/// memory is short: `Vec::shrink_to` reallocates and aborts the process (a bugcheck in
/// the kernel) if that fails, so a smaller buffer is allocated fallibly and the elements
/// moved; on failure `v` keeps its buffer. O(len).
pub fn shrink_vec<T>(v: &mut Vec<T>, min: usize) {
    let want = min.max(v.len());
    if v.capacity() <= want {
        return;
    }
    let mut fresh = Vec::new();
    if fresh.try_reserve_exact(want).is_ok() {
        fresh.append(v);
        *v = fresh;
    }
}

/// [`shrink_vec`] for a queue.
pub fn shrink_queue<T>(q: &mut VecDeque<T>, min: usize) {
    let want = min.max(q.len());
    if q.capacity() <= want {
        return;
    }
    let mut fresh = VecDeque::new();
    if fresh.try_reserve_exact(want).is_ok() {
        fresh.append(q);
        *q = fresh;
    }
}

/// [`shrink_vec`] for a hash map (hashbrown's `shrink_to` aborts on a failed
/// allocation too): the entries move to a map made with room for `min`.
pub fn shrink_map<K, V, S>(map: &mut hashbrown::HashMap<K, V, S>, min: usize)
where
    K: Eq + core::hash::Hash,
    S: core::hash::BuildHasher + Clone,
{
    let mut fresh = hashbrown::HashMap::with_hasher(map.hasher().clone());
    if fresh.try_reserve(min.max(map.len())).is_ok() {
        fresh.extend(map.drain());
        *map = fresh;
    }
}

/// Elements per chunk (a power of two: indexing is a shift and a mask).
pub const CHUNK: usize = 128;

/// A slab is trimmed once it holds more than this many times the slots its occupants
/// need (see [`ChunkedVec::trim_due`]).
pub const TRIM_FACTOR: usize = 4;

/// A growable array whose elements never move (see the module docs).
#[derive(Debug)]
pub struct ChunkedVec<T> {
    /// Every chunk has capacity for exactly [`CHUNK`] elements; all but the last are full,
    /// or retired (empty, no memory: see [`retire`](Self::retire)).
    chunks: Vec<Vec<T>>,
    len: usize,
    retired: usize,
    /// Occupants of each chunk, as the owner reports them ([`filled`](Self::filled),
    /// [`vacated`](Self::vacated)), and how many resident chunks have none: what makes
    /// asking whether a trim would give anything back O(1).
    occupants: Vec<u16>,
    vacant: usize,
}

impl<T> Default for ChunkedVec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ChunkedVec<T> {
    /// An empty vector; allocates nothing.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
            retired: 0,
            occupants: Vec::new(),
            vacant: 0,
        }
    }

    /// Elements held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements it holds without allocating.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    /// Chunks, retired ones included.
    #[must_use]
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Chunks retired.
    #[must_use]
    pub fn retired(&self) -> usize {
        self.retired
    }

    /// Slot `i` now holds an occupant (call once per occupant that moves in).
    pub fn filled(&mut self, i: usize) {
        if let Some(n) = self.occupants.get_mut(i / CHUNK) {
            if *n == 0 {
                self.vacant -= 1;
            }
            *n += 1;
        }
    }

    /// Slot `i`'s occupant left.
    pub fn vacated(&mut self, i: usize) {
        if let Some(n) = self.occupants.get_mut(i / CHUNK).filter(|n| **n > 0) {
            *n -= 1;
            if *n == 0 {
                self.vacant += 1;
            }
        }
    }

    /// Full chunks with no occupant: what [`retire_vacant`](Self::retire_vacant) would give
    /// back. O(the chunks not yet full: the last and the room reserved past it).
    #[must_use]
    pub fn retirable(&self) -> usize {
        let not_full = self.occupants.get(self.len / CHUNK..).unwrap_or_default();
        self.vacant
            .saturating_sub(not_full.iter().filter(|&&n| n == 0).count())
    }

    /// Whether a trim would be worth it (O(1) first, then the walk of `retirable`): the
    /// chunks in memory hold over [`TRIM_FACTOR`] times the `live` occupants' slots beyond
    /// `room` wanted and `slack`, and a sixteenth of them is vacant chunks beyond the
    /// `kept` chunks a trim leaves for the wanted room. Hysteresis: a steady load never
    /// pays for a trim, and a trim always gives back a sixteenth at least.
    #[must_use]
    pub fn trim_due(&self, live: usize, room: usize, slack: usize, kept: usize) -> bool {
        let resident = self.resident();
        resident > TRIM_FACTOR * live + room + slack
            && self.retirable().saturating_sub(kept) * CHUNK >= resident / 16
    }

    /// Elements the chunks in memory (not retired) have room for.
    #[must_use]
    pub fn resident(&self) -> usize {
        (self.chunks.len() - self.retired) * CHUNK
    }

    /// Takes full chunk `c` (not the one `push` fills) out, giving its memory back: its
    /// indices keep their place but name nothing (`get` is `None`) until
    /// [`restore`](Self::restore) puts a chunk back there.
    fn retire(&mut self, c: usize) -> Option<Vec<T>> {
        if (c + 1) * CHUNK > self.len {
            return None;
        }
        let chunk = self.chunks.get_mut(c).filter(|ch| ch.len() == CHUNK)?;
        if self.occupants.get(c) != Some(&0) {
            return None;
        }
        self.retired += 1;
        self.vacant -= 1;
        Some(core::mem::take(chunk))
    }

    /// Puts `chunk` (exactly [`CHUNK`] elements) where retired chunk `c` was; gives it
    /// back if `c` is not retired.
    fn restore(&mut self, c: usize, chunk: Vec<T>) -> Result<(), Vec<T>> {
        match self.chunks.get_mut(c) {
            Some(slot)
                if slot.is_empty() && chunk.len() == CHUNK && (c + 1) * CHUNK <= self.len =>
            {
                *slot = chunk;
                self.retired -= 1;
                self.vacant += 1;
                Ok(())
            }
            _ => Err(chunk),
        }
    }

    /// Element `i`.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i / CHUNK)?.get(i % CHUNK)
    }

    /// Element `i`, mutably.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.chunks.get_mut(i / CHUNK)?.get_mut(i % CHUNK)
    }

    /// Room for `additional` more elements; on failure nothing changed that matters
    /// (chunks already added stay, empty).
    pub fn try_reserve(&mut self, additional: usize) -> Result<(), TryReserveError> {
        let want = self.len.saturating_add(additional);
        if want > self.capacity() {
            let more = want.div_ceil(CHUNK) - self.chunks.len();
            self.chunks.try_reserve(more)?;
            self.occupants.try_reserve(more)?;
        }
        while self.capacity() < want {
            let mut chunk = Vec::new();
            chunk.try_reserve_exact(CHUNK)?;
            self.add_chunk(chunk);
        }
        Ok(())
    }

    /// Appends `value`; allocates one chunk when full (reserve first where allocating is
    /// not allowed).
    pub fn push(&mut self, value: T) {
        let c = self.len / CHUNK;
        if c == self.chunks.len() {
            self.add_chunk(Vec::with_capacity(CHUNK));
        }
        if let Some(chunk) = self.chunks.get_mut(c) {
            chunk.push(value);
            self.len += 1;
        }
    }

    /// Room past the last element: chunks reserved and never used yet.
    #[must_use]
    pub fn fresh_room(&self) -> usize {
        self.capacity() - self.len
    }

    /// Gives back the chunks past the last element (reserved for a burst, never used)
    /// beyond `keep` elements of room; returns how many went. Never allocates.
    pub fn shrink_room(&mut self, keep: usize) -> usize {
        let mut n = 0;
        while let Some(last) = self.chunks.last() {
            let start = (self.chunks.len() - 1) * CHUNK;
            // Past the last element (so neither used nor retired), and not needed.
            if !last.is_empty() || start < self.len.saturating_add(keep) {
                break;
            }
            self.chunks.pop();
            self.occupants.pop();
            self.vacant = self.vacant.saturating_sub(1);
            n += 1;
        }
        n
    }

    /// A new last chunk, with no occupant.
    fn add_chunk(&mut self, chunk: Vec<T>) {
        self.chunks.push(chunk);
        self.occupants.push(0);
        self.vacant += 1;
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// The elements in order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.chunks.iter_mut().flatten()
    }
}

/// A slab slot that may be vacant: what [`ChunkedVec::retire_vacant`] needs to give a
/// vacant chunk's memory back, and [`ChunkedVec::restore_retired`] to make it again.
pub trait Vacancy: Sized {
    /// `Some(generation)` if nothing lives in the slot.
    fn vacant_generation(&self) -> Option<u32>;
    /// A vacant slot of `generation`.
    fn vacant(generation: u32) -> Self;
}

/// Chunks a slab gave back, each with its slots' generations (4 bytes a slot: a handle
/// or comm ID a slot issued must not name its next occupant).
pub type Retired = Vec<(u32, Vec<u32>)>;

impl<T: Vacancy> ChunkedVec<T> {
    /// Retires every full chunk (but the one `push` fills, and the first `keep` found)
    /// whose slots are all vacant, appending each with its generations to `retired`
    /// (PASSIVE_LEVEL: allocates those lists); returns how many it retired.
    pub fn retire_vacant(&mut self, retired: &mut Retired, mut keep: usize) -> usize {
        let mut n = 0;
        for c in 0..self.len / CHUNK {
            // The owner's count first (O(1)); then every slot, to be sure.
            let vacant = self.occupants.get(c) == Some(&0)
                && self.chunks.get(c).is_some_and(|ch| {
                    ch.len() == CHUNK && ch.iter().all(|s| s.vacant_generation().is_some())
                });
            if !vacant || retired.try_reserve(1).is_err() {
                continue;
            }
            if keep > 0 {
                keep -= 1;
                continue;
            }
            let mut generations = Vec::new();
            if generations.try_reserve_exact(CHUNK).is_err() {
                break;
            }
            if let Some(chunk) = self.retire(c) {
                generations.extend(chunk.iter().map(|s| s.vacant_generation().unwrap_or(0)));
                retired.push((c as u32, generations));
                n += 1;
            }
        }
        n
    }

    /// Makes the chunk retired last again, its slots vacant with their generations;
    /// returns its indices (`None`: nothing retired). On failure it stays retired.
    pub fn restore_retired(
        &mut self,
        retired: &mut Retired,
    ) -> Result<Option<core::ops::Range<usize>>, TryReserveError> {
        let Some((c, generations)) = retired.pop() else {
            return Ok(None);
        };
        let mut chunk = Vec::new();
        if let Err(e) = chunk.try_reserve_exact(CHUNK) {
            retired.push((c, generations));
            return Err(e);
        }
        chunk.extend(generations.iter().map(|&g| T::vacant(g)));
        let first = c as usize * CHUNK;
        Ok(self
            .restore(c as usize, chunk)
            .is_ok()
            .then_some(first..first + CHUNK))
    }
}

/// The heap bytes a collection holds: its capacity, not its length (what a kernel pays
/// in nonpaged pool).
pub trait HeapBytes {
    /// Heap bytes held.
    fn heap_bytes(&self) -> usize;
}

impl<T> HeapBytes for Vec<T> {
    fn heap_bytes(&self) -> usize {
        self.capacity() * core::mem::size_of::<T>()
    }
}

impl<T> HeapBytes for VecDeque<T> {
    fn heap_bytes(&self) -> usize {
        self.capacity() * core::mem::size_of::<T>()
    }
}

/// The heap bytes of a [`Retired`] list: the list, and each chunk's generations.
#[must_use]
pub fn retired_bytes(retired: &Retired) -> usize {
    retired.heap_bytes() + retired.iter().map(|(_, g)| g.heap_bytes()).sum::<usize>()
}

/// Its chunks (retired ones hold none), the list of them and their occupant counts.
impl<T> HeapBytes for ChunkedVec<T> {
    fn heap_bytes(&self) -> usize {
        (self.chunks.len() - self.retired) * CHUNK * core::mem::size_of::<T>()
            + self.chunks.heap_bytes()
            + self.occupants.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_keep_their_index_across_chunks() {
        let mut v = ChunkedVec::new();
        assert!(v.is_empty());
        assert_eq!(v.capacity(), 0);
        for i in 0..(3 * CHUNK + 5) {
            v.push(i);
        }
        assert_eq!(v.len(), 3 * CHUNK + 5);
        assert_eq!(v.capacity(), 4 * CHUNK);
        assert_eq!(v.get(CHUNK), Some(&CHUNK));
        assert_eq!(v.get(3 * CHUNK + 4), Some(&(3 * CHUNK + 4)));
        assert_eq!(v.get(3 * CHUNK + 5), None);
        if let Some(x) = v.get_mut(7) {
            *x = 70;
        }
        assert_eq!(v.iter().copied().nth(7), Some(70));
        assert!(v.iter().copied().skip(8).eq(8..3 * CHUNK + 5));
        v.iter_mut().for_each(|x| *x += 1);
        assert_eq!(v.get(0), Some(&1));
    }

    #[test]
    fn a_retired_chunk_names_nothing_until_restored_and_holds_no_memory() {
        let mut v = ChunkedVec::new();
        for i in 0..(2 * CHUNK + 1) {
            v.push(i);
        }
        for i in 0..v.len() {
            v.filled(i);
        }
        let bytes = v.heap_bytes();
        // The chunk `push` fills stays, and a chunk with an occupant.
        assert!(v.retire(2).is_none());
        assert!(v.retire(1).is_none());
        for i in CHUNK..2 * CHUNK {
            v.vacated(i);
        }
        assert_eq!(v.retirable(), 1);
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        let chunk = v.retire(1).unwrap();
        assert_eq!(v.retirable(), 0);
        assert_eq!(
            (v.retired(), v.len(), v.get(CHUNK)),
            (1, 2 * CHUNK + 1, None)
        );
        assert_eq!(
            v.heap_bytes(),
            bytes - CHUNK * core::mem::size_of::<usize>()
        );
        assert!(v.retire(1).is_none());
        assert!(v.restore(0, Vec::new()).is_err());
        assert!(v.restore(1, chunk).is_ok());
        assert_eq!(
            (v.retired(), v.get(CHUNK), v.heap_bytes()),
            (0, Some(&CHUNK), bytes)
        );
        v.push(7);
        assert_eq!(v.get(2 * CHUNK + 1), Some(&7));
    }

    #[test]
    fn an_empty_queue_gets_a_new_buffer_a_full_one_keeps_its_entries() {
        let mut q: VecDeque<u32> = VecDeque::with_capacity(1);
        assert!(reserve_queue(&mut q, 8).is_ok());
        assert!(q.capacity() >= 8 && q.is_empty());
        q.extend(1..=8);
        assert!(reserve_queue(&mut q, 8).is_ok());
        assert!(q.capacity() >= 16);
        assert!(q.iter().copied().eq(1..=8));
    }

    #[test]
    fn reserve_adds_whole_chunks_and_push_then_fits() {
        let mut v = ChunkedVec::new();
        assert!(v.try_reserve(1).is_ok());
        assert_eq!(v.capacity(), CHUNK);
        assert!(v.try_reserve(CHUNK + 1).is_ok());
        assert_eq!(v.capacity(), 2 * CHUNK);
        for i in 0..2 * CHUNK {
            v.push(i);
        }
        // Full chunks kept exactly their room: nothing was reallocated.
        assert!(v.chunks.iter().all(|c| c.capacity() == CHUNK));
        assert!(v.try_reserve(usize::MAX).is_err());
        assert_eq!(v.len(), 2 * CHUNK);
    }
}
