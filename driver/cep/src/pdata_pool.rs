//! The private data CEPs keep for repeats (the cached REQ/REP/RTU/DREQ/DREP/LAP/APR/SIDR
//! message's, the MRA's, and APR/SIDR_REP additional information), in fixed-size blocks
//! of one pool, so that a downcall at DISPATCH_LEVEL (a kernel client's `iba_cm` call
//! under its spin lock) stores private data without allocating.
//!
//! - Every block holds [`BLOCK`] bytes, the largest private data of any CM message (RTU
//!   and DREP: 224 bytes, IBA Tables 111, 113); a CEP holds a block only while it keeps
//!   private data that is not empty, and names it by a 4-byte [`Held`].
//! - The pool grows by chunks of [`CHUNK`] blocks that never move. It grows in
//!   [`PdataPool::prepare`] (PASSIVE_LEVEL), or, when its owner allows it
//!   ([`PdataPool::set_growth`]: the engine alone, at a user's downcall), in
//!   [`PdataPool::store`]. With growth off a store that finds no free block fails with
//!   `NoResources` and changes nothing.
//! - `prepare` keeps [`KEEP_FREE`] blocks free, and a quarter as many again as are in use,
//!   so that DISPATCH_LEVEL callers find room between two PASSIVE_LEVEL passes. It only
//!   grows: [`PdataPool::trim`], where connections end, gives back chunks nobody uses
//!   once far more is free than that (hysteresis), and everything when no block is in use,
//!   so memory returns to baseline after teardown.
//! - Freeing never allocates: the free list has room for every block.

use alloc::vec::Vec;

use crate::error::CmError;
use crate::grow::HeapBytes;

/// The largest private data a CEP keeps (IBA 12.6: REQ 92, MRA 222, REJ 148, REP 196,
/// RTU 224, DREQ 220, DREP 224, LAP 168, APR 148, SIDR_REQ 216, SIDR_REP 136 bytes; APR
/// and SIDR_REP additional information 72).
pub(crate) const BLOCK: usize = max_of(&[
    ibcm_mad::REQ_PRIVATE_DATA_SIZE,
    ibcm_mad::MRA_PRIVATE_DATA_SIZE,
    ibcm_mad::REP_PRIVATE_DATA_SIZE,
    ibcm_mad::RTU_PRIVATE_DATA_SIZE,
    ibcm_mad::DREQ_PRIVATE_DATA_SIZE,
    ibcm_mad::DREP_PRIVATE_DATA_SIZE,
    ibcm_mad::LAP_PRIVATE_DATA_SIZE,
    ibcm_mad::APR_PRIVATE_DATA_SIZE,
    ibcm_mad::APR_ADDITIONAL_INFO_SIZE,
    ibcm_mad::SIDR_REQ_PRIVATE_DATA_SIZE,
    ibcm_mad::SIDR_REP_PRIVATE_DATA_SIZE,
    ibcm_mad::SIDR_REP_ADDITIONAL_INFO_SIZE,
]);

const _: () = assert!(BLOCK == 224 && BLOCK < 256, "a length fits Held's top byte");

/// Blocks per chunk (3.5 KiB): a power of two, so a block's place is a shift and a mask,
/// and as many as the bits of a chunk's mask of blocks in use.
pub(crate) const CHUNK: usize = u16::BITS as usize;

/// Blocks `prepare` keeps free at least: one chunk.
pub(crate) const KEEP_FREE: usize = CHUNK;

/// Blocks a pool holds at most: [`Held`] numbers them in 24 bits.
const MAX_BLOCKS: usize = (1 << 24) - 1;

const fn max_of(sizes: &[usize]) -> usize {
    let mut m = 0;
    let mut i = 0;
    while i < sizes.len() {
        if sizes[i] > m {
            m = sizes[i];
        }
        i += 1;
    }
    m
}

/// Private data a CEP keeps: nothing (empty), or `len` bytes in one block of the pool.
/// 4 bytes: the length in the top byte, the block's index + 1 in the other 24.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Held(u32);

impl Held {
    /// No private data, no block.
    pub(crate) const NONE: Self = Self(0);

    fn new(block: usize, len: usize) -> Self {
        // block < MAX_BLOCKS and len <= BLOCK (checked by `store`).
        Self(((len as u32) << 24) | (block as u32 + 1))
    }

    /// The block, if one is held.
    fn block(self) -> Option<usize> {
        match self.0 & 0x00ff_ffff {
            0 => None,
            b => Some(b as usize - 1),
        }
    }

    /// Bytes held.
    pub(crate) fn len(self) -> usize {
        (self.0 >> 24) as usize
    }
}

/// The pool (see the module docs).
#[derive(Debug)]
pub(crate) struct PdataPool {
    /// Chunks by number; `None` where a chunk was given back (the numbers of the others,
    /// and so every [`Held`], stay). Every chunk holds exactly [`CHUNK`] blocks.
    chunks: Vec<Option<Vec<[u8; BLOCK]>>>,
    /// The blocks in use of each chunk, one bit each (a chunk with none may be given
    /// back; a block freed twice is freed once).
    used_in: Vec<u16>,
    /// Free blocks; room for every block of every chunk.
    free: Vec<u32>,
    in_use: usize,
    /// Chunks held (`Some` in `chunks`).
    live_chunks: usize,
    /// Whether `store` may grow the pool when no block is free.
    growth: bool,
}

impl Default for PdataPool {
    fn default() -> Self {
        Self::new()
    }
}

impl PdataPool {
    /// An empty pool that grows when a store finds no free block; allocates nothing.
    pub(crate) const fn new() -> Self {
        Self {
            chunks: Vec::new(),
            used_in: Vec::new(),
            free: Vec::new(),
            in_use: 0,
            live_chunks: 0,
            growth: true,
        }
    }

    /// Whether [`store`](Self::store) may allocate: off, only [`prepare`](Self::prepare)
    /// grows the pool.
    pub(crate) fn set_growth(&mut self, on: bool) {
        self.growth = on;
    }

    /// Blocks in use.
    pub(crate) fn in_use(&self) -> usize {
        self.in_use
    }

    /// Blocks a store takes without allocating.
    pub(crate) fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// The free blocks `prepare` keeps.
    #[inline]
    fn target(&self) -> usize {
        KEEP_FREE + self.in_use / 4
    }

    /// Whether fewer than half the free blocks `prepare` keeps are left: time to ask for
    /// PASSIVE_LEVEL work.
    pub(crate) fn is_low(&self) -> bool {
        self.free.len() < self.target().div_ceil(2)
    }

    /// Copies `data` into a free block (none for empty data). Fails with `NoResources`,
    /// changing nothing, if no block is free and the pool may not (or cannot) grow.
    pub(crate) fn store(&mut self, data: &[u8]) -> Result<Held, CmError> {
        if data.is_empty() {
            return Ok(Held::NONE);
        }
        if data.len() > BLOCK {
            return Err(CmError::TooLong {
                field: "private_data",
                len: data.len(),
                max: BLOCK,
            });
        }
        if self.free.is_empty() {
            if !self.growth {
                return Err(CmError::NoResources);
            }
            self.grow_chunk()?;
        }
        let block = self.free.pop().ok_or(CmError::NoResources)? as usize;
        let (c, i) = (block / CHUNK, block % CHUNK);
        let slot = self
            .chunks
            .get_mut(c)
            .and_then(Option::as_mut)
            .and_then(|chunk| chunk.get_mut(i))
            .and_then(|b| b.get_mut(..data.len()));
        let (Some(dst), Some(used)) = (slot, self.used_in.get_mut(c)) else {
            // Only a block of a live chunk is ever free.
            self.free.push(block as u32);
            return Err(CmError::NoResources);
        };
        dst.copy_from_slice(data);
        *used |= 1 << i;
        self.in_use += 1;
        Ok(Held::new(block, data.len()))
    }

    /// The bytes `held` names (none for [`Held::NONE`]).
    pub(crate) fn get(&self, held: Held) -> &[u8] {
        let Some(block) = held.block() else {
            return &[];
        };
        self.chunks
            .get(block / CHUNK)
            .and_then(Option::as_ref)
            .and_then(|chunk| chunk.get(block % CHUNK))
            .and_then(|b| b.get(..held.len()))
            .unwrap_or(&[])
    }

    /// Gives `held`'s block back (nothing for [`Held::NONE`]). Never allocates.
    pub(crate) fn free(&mut self, held: Held) {
        let Some(block) = held.block() else {
            return;
        };
        let bit = 1 << (block % CHUNK);
        let Some(used) = self.used_in.get_mut(block / CHUNK) else {
            return;
        };
        if *used & bit == 0 || self.free.len() == self.free.capacity() {
            // Not a block in use (cannot happen): never allocate, never free twice.
            return;
        }
        *used &= !bit;
        self.in_use -= 1;
        self.free.push(block as u32);
    }

    /// PASSIVE_LEVEL: [`KEEP_FREE`] + a quarter of the blocks in use free. Only grows
    /// (giving back is [`Self::trim`]'s): a pool whose use swings between nothing and a
    /// window of connections at every turn is not made and unmade each time. Called at
    /// every IOCTL: the common case is one compare, inlined. Fails (keeping what it made)
    /// if memory runs out.
    #[inline]
    pub(crate) fn prepare(&mut self) -> Result<(), CmError> {
        if self.free.len() >= self.target() {
            return Ok(());
        }
        self.grow_to_target()
    }

    #[cold]
    #[inline(never)]
    fn grow_to_target(&mut self) -> Result<(), CmError> {
        while self.free.len() < self.target() {
            self.grow_chunk()?;
        }
        Ok(())
    }

    /// PASSIVE_LEVEL, where connections end (a destroy, a handle's cleanup, passive
    /// work): with no block in use, everything goes (the next `prepare` makes the first
    /// chunk again: memory back to baseline after teardown); otherwise chunks nobody uses
    /// go once more than twice what `prepare` keeps (and a chunk) is free (hysteresis: a
    /// pool trimmed to its need would grow again at the next burst). Never allocates.
    #[inline]
    pub(crate) fn trim(&mut self) {
        let target = self.target();
        let idle = self.in_use == 0 && self.live_chunks > KEEP_FREE / CHUNK;
        if idle || self.free.len() > 2 * target + CHUNK {
            self.give_back(target);
        }
    }

    #[cold]
    #[inline(never)]
    fn give_back(&mut self, target: usize) {
        if self.in_use == 0 {
            // The vectors' capacity too: what the first `prepare` made, it makes again.
            *self = Self {
                growth: self.growth,
                ..Self::new()
            };
        } else {
            self.shrink(target);
        }
    }

    /// Gives back empty chunks until no more than `target` + a chunk are free.
    fn shrink(&mut self, target: usize) {
        let mut free = self.free.len();
        let mut gone = false;
        for (chunk, used) in self.chunks.iter_mut().zip(&self.used_in).rev() {
            if free < target + 2 * CHUNK {
                break;
            }
            if *used == 0 && chunk.take().is_some() {
                free -= CHUNK;
                self.live_chunks -= 1;
                gone = true;
            }
        }
        if gone {
            let chunks = &self.chunks;
            self.free
                .retain(|&b| chunks.get(b as usize / CHUNK).is_some_and(Option::is_some));
        }
    }

    /// One more chunk, in the first gap or at the end, its blocks free.
    fn grow_chunk(&mut self) -> Result<(), CmError> {
        let no = |_| CmError::NoResources;
        // Gaps exist only after a shrink: otherwise no search.
        let at = if self.live_chunks < self.chunks.len() {
            self.chunks
                .iter()
                .position(Option::is_none)
                .unwrap_or(self.chunks.len())
        } else {
            self.chunks.len()
        };
        let blocks = (at + 1) * CHUNK;
        if blocks > MAX_BLOCKS {
            return Err(CmError::NoResources);
        }
        // Room first (free list for every block, the chunk tables), then the chunk.
        let slots = self.chunks.len().max(at + 1) * CHUNK;
        if self.free.capacity() < slots {
            self.free.try_reserve(slots - self.free.len()).map_err(no)?;
        }
        if at == self.chunks.len() {
            self.chunks.try_reserve(1).map_err(no)?;
            self.used_in.try_reserve(1).map_err(no)?;
        }
        let mut chunk = Vec::new();
        chunk.try_reserve_exact(CHUNK).map_err(no)?;
        chunk.resize(CHUNK, [0u8; BLOCK]);
        if at == self.chunks.len() {
            self.chunks.push(Some(chunk));
            self.used_in.push(0);
        } else if let Some(gap) = self.chunks.get_mut(at) {
            *gap = Some(chunk);
        }
        self.live_chunks += 1;
        // Lowest block first out (the list pops from its end).
        self.free
            .extend((at * CHUNK..blocks).rev().map(|b| b as u32));
        Ok(())
    }

    /// Heap bytes held: the chunks, their table, the free list.
    pub(crate) fn bytes(&self) -> usize {
        self.live_chunks * CHUNK * BLOCK
            + self.chunks.heap_bytes()
            + self.used_in.heap_bytes()
            + self.free.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_gets_and_frees() {
        let mut p = PdataPool::new();
        assert_eq!(p.store(&[]), Ok(Held::NONE));
        assert_eq!(p.bytes(), 0, "empty data takes nothing");
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        let a = p.store(&[1, 2, 3]).unwrap();
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        let b = p.store(&[9; BLOCK]).unwrap();
        assert_eq!(p.get(a), [1, 2, 3]);
        assert_eq!(p.get(b), [9; BLOCK]);
        assert_eq!(p.get(Held::NONE), [0u8; 0]);
        assert_eq!(p.in_use(), 2);
        assert!(p.store(&[0; BLOCK + 1]).is_err());
        p.free(a);
        p.free(a);
        assert_eq!(p.in_use(), 1);
        p.free(b);
        assert_eq!((p.in_use(), p.free_blocks()), (0, CHUNK));
    }

    #[test]
    fn without_growth_a_store_takes_only_what_prepare_made() {
        let mut p = PdataPool::new();
        p.set_growth(false);
        assert_eq!(p.store(&[1]), Err(CmError::NoResources));
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        p.prepare().unwrap();
        let bytes = p.bytes();
        let held: Vec<Held> = (0..KEEP_FREE)
            // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
            .map(|i| p.store(&[i as u8]).unwrap())
            .collect();
        assert_eq!(p.bytes(), bytes, "nothing allocated");
        assert!(p.is_low());
        assert_eq!(p.store(&[1]), Err(CmError::NoResources));
        assert_eq!(p.in_use(), KEEP_FREE, "the failed store changed nothing");
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        p.prepare().unwrap();
        assert!(p.free_blocks() >= KEEP_FREE + KEEP_FREE / 4);
        assert!(p.store(&[1]).is_ok());
        for (i, h) in held.iter().enumerate() {
            assert_eq!(p.get(*h), [i as u8]);
        }
    }

    #[test]
    fn gives_memory_back_with_hysteresis() {
        let mut p = PdataPool::new();
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        p.prepare().unwrap();
        let baseline = p.bytes();
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        let mut held: Vec<Held> = (0..1000).map(|_| p.store(&[7; 100]).unwrap()).collect();
        p.prepare().unwrap();
        let peak = p.bytes();
        assert_eq!(
            peak,
            p.chunks
                .iter()
                .flatten()
                .map(HeapBytes::heap_bytes)
                .sum::<usize>()
                + p.chunks.heap_bytes()
                + p.used_in.heap_bytes()
                + p.free.heap_bytes()
        );
        // A few freed: nothing given back (no oscillation at the edge).
        for h in held.drain(..10) {
            p.free(h);
        }
        p.trim();
        p.prepare().unwrap();
        assert_eq!(p.bytes(), peak);
        // Most freed: empty chunks go back, what is left is intact.
        for h in held.drain(..900) {
            p.free(h);
        }
        p.prepare().unwrap();
        assert_eq!(p.bytes(), peak, "prepare only grows");
        p.trim();
        p.prepare().unwrap();
        assert!(p.bytes() < peak / 3, "{} of {peak}", p.bytes());
        assert!(p.free_blocks() >= KEEP_FREE);
        for h in &held {
            assert_eq!(p.get(*h), [7; 100]);
        }
        // Refilled through the gaps, then everything freed: back to baseline.
        held.extend((0..500).map(|_| p.store(&[8; 10]).unwrap()));
        for h in held.drain(..) {
            p.free(h);
        }
        p.trim();
        assert_eq!(p.bytes(), 0);
        p.prepare().unwrap();
        assert_eq!(p.bytes(), baseline);
        p.trim();
        p.prepare().unwrap();
        assert_eq!(p.bytes(), baseline, "stable");
    }
}
