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

/// Elements per chunk (a power of two: indexing is a shift and a mask).
pub const CHUNK: usize = 128;

/// A growable array whose elements never move (see the module docs).
#[derive(Debug)]
pub struct ChunkedVec<T> {
    /// Every chunk has capacity for exactly [`CHUNK`] elements; all but the last are full.
    chunks: Vec<Vec<T>>,
    len: usize,
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
            self.chunks
                .try_reserve(want.div_ceil(CHUNK) - self.chunks.len())?;
        }
        while self.capacity() < want {
            let mut chunk = Vec::new();
            chunk.try_reserve_exact(CHUNK)?;
            self.chunks.push(chunk);
        }
        Ok(())
    }

    /// Appends `value`; allocates one chunk when full (reserve first where allocating is
    /// not allowed).
    pub fn push(&mut self, value: T) {
        let c = self.len / CHUNK;
        if c == self.chunks.len() {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(chunk) = self.chunks.get_mut(c) {
            chunk.push(value);
            self.len += 1;
        }
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

/// Its chunks and the list of them.
impl<T> HeapBytes for ChunkedVec<T> {
    fn heap_bytes(&self) -> usize {
        self.capacity() * core::mem::size_of::<T>() + self.chunks.heap_bytes()
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
