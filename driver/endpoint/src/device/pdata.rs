//! The private data of the last message each endpoint received (for QUERY), out of line:
//! a block of one device-wide pool, held only while that private data has a byte that is
//! not zero. A CM message's private data field has a fixed size on the wire (IBA 12.6:
//! REQ 92 bytes, REP 196, ...), all zeros when its sender put none, as most connections'
//! senders do (a 224-byte array in every endpoint cost 224 MB per million endpoints for
//! nothing): such private data is kept as its length alone, and QUERY reads it back as as
//! many zeros. An endpoint names its block by a 4-byte [`Kept`].
//!
//! Memory follows use as the record pool's does (pool.rs): the pool keeps
//! [`KEEP_FREE`] blocks free and a quarter as many again as are held, made at
//! PASSIVE_LEVEL ([`PdataBlocks::prepare`]); a DISPATCH_LEVEL entry point first checks that
//! [`DISPATCH_BLOCKS`] are free (one per event it may deliver) and otherwise holds back
//! like the record pool, so a block is always found and no private data is lost.
//! [`PdataBlocks::trim`] gives back all but that room once no block is held.

use alloc::vec::Vec;

use ibcm_cep::grow::{HeapBytes, shrink_vec};

use super::pool::DISPATCH_RECORDS;

/// The largest private data an event record carries (RTU and DREP, IBA Tables 111, 113).
pub(super) const BLOCK: usize = 224;

/// Blocks in one chunk (14 KB).
const BLOCK_CHUNK: usize = 64;

/// The blocks one DISPATCH_LEVEL entry point takes at most: one per event it delivers.
pub(super) const DISPATCH_BLOCKS: usize = DISPATCH_RECORDS;

/// Free blocks kept beyond a quarter of those held: two entry points' worth.
pub(super) const KEEP_FREE: usize = 2 * DISPATCH_BLOCKS;

/// An endpoint's private data: `len` bytes in one block, or `len` zeros without one (0:
/// none). 4 bytes: the length in the top byte, the block's index + 1 (0: no block) in
/// the other 24.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Kept(u32);

const _: () = assert!(BLOCK < 256, "a length fits Kept's top byte");

impl Kept {
    fn new(block: u32, len: usize) -> Self {
        // block < 2^24 - 1 (checked by `grow_chunk`), len <= BLOCK.
        Self(((len as u32) << 24) | (block + 1))
    }

    /// `len` zeros, no block.
    fn zeros(len: usize) -> Self {
        Self((len as u32) << 24)
    }

    fn block(self) -> Option<usize> {
        match self.0 & 0x00ff_ffff {
            0 => None,
            b => Some(b as usize - 1),
        }
    }

    fn len(self) -> usize {
        (self.0 >> 24) as usize
    }
}

/// The pool (see the module docs).
#[derive(Debug, Default)]
pub(super) struct PdataBlocks {
    /// Blocks by index: block `i` is `chunks[i / BLOCK_CHUNK][i % BLOCK_CHUNK]`.
    chunks: Vec<Vec<[u8; BLOCK]>>,
    /// Free blocks; room for every block.
    free: Vec<u32>,
    held: usize,
}

impl PdataBlocks {
    fn block_mut(&mut self, i: usize) -> Option<&mut [u8; BLOCK]> {
        self.chunks
            .get_mut(i / BLOCK_CHUNK)?
            .get_mut(i % BLOCK_CHUNK)
    }

    fn target(&self) -> usize {
        KEEP_FREE + self.held / 4
    }

    /// Whether a DISPATCH_LEVEL entry point finds a block for every event it may deliver.
    pub(super) fn has_dispatch_room(&self) -> bool {
        self.free.len() >= DISPATCH_BLOCKS
    }

    /// Fewer free than [`prepare`](Self::prepare) keeps: time for PASSIVE_LEVEL work.
    pub(super) fn running_low(&self) -> bool {
        self.free.len() < self.target()
    }

    /// The private data `kept` names.
    pub(super) fn get(&self, kept: Kept) -> &[u8] {
        const ZEROS: [u8; BLOCK] = [0; BLOCK];
        let Some(i) = kept.block() else {
            return ZEROS.get(..kept.len()).unwrap_or(&[]);
        };
        self.chunks
            .get(i / BLOCK_CHUNK)
            .and_then(|c| c.get(i % BLOCK_CHUNK))
            .and_then(|b| b.get(..kept.len()))
            .unwrap_or(&[])
    }

    /// Replaces what `kept` names by `data` (at most [`BLOCK`] bytes kept): data all zeros
    /// (or empty) gives its block back and keeps its length; otherwise its own block is
    /// reused, or a free one taken. With none free (only where no DISPATCH_LEVEL entry
    /// point checked the room: an IOCTL at PASSIVE_LEVEL) the pool grows; out of memory,
    /// nothing is kept.
    pub(super) fn keep(&mut self, kept: &mut Kept, data: &[u8]) {
        let data = data.get(..BLOCK).unwrap_or(data);
        if data.iter().all(|&b| b == 0) {
            self.release(core::mem::take(kept));
            *kept = Kept::zeros(data.len());
            return;
        }
        let block = match kept.block() {
            Some(b) => Some(b as u32),
            None => self.take(),
        };
        *kept = Kept::default();
        let Some(b) = block else { return };
        if let Some(d) = self
            .block_mut(b as usize)
            .and_then(|d| d.get_mut(..data.len()))
        {
            d.copy_from_slice(data);
            *kept = Kept::new(b, data.len());
        }
    }

    /// A free block, taken (the pool grows by a chunk if none is free).
    fn take(&mut self) -> Option<u32> {
        if self.free.is_empty() {
            self.grow_chunk().ok()?;
        }
        let b = self.free.pop()?;
        self.held += 1;
        Some(b)
    }

    /// Gives `kept`'s block back (nothing for none). Never allocates.
    pub(super) fn release(&mut self, kept: Kept) {
        // Growth keeps room in the free list for every block (`grow_chunk`).
        debug_assert!(
            kept.block().is_none() || self.free.len() < self.free.capacity(),
            "free list full"
        );
        if let Some(b) = kept.block()
            && self.free.len() < self.free.capacity()
        {
            self.free.push(b as u32);
            self.held = self.held.saturating_sub(1);
        }
    }

    /// PASSIVE_LEVEL: [`KEEP_FREE`] blocks free and a quarter of those held. One compare
    /// when the room is there. Fails (keeping what it made) if memory runs out.
    pub(super) fn prepare(&mut self) -> Result<(), ()> {
        while self.free.len() < self.target() {
            self.grow_chunk()?;
        }
        Ok(())
    }

    fn grow_chunk(&mut self) -> Result<(), ()> {
        let first = self.chunks.len() * BLOCK_CHUNK;
        if first + BLOCK_CHUNK >= 0x00ff_ffff {
            return Err(());
        }
        self.chunks.try_reserve(1).map_err(|_| ())?;
        self.free
            .try_reserve(first + BLOCK_CHUNK - self.free.len())
            .map_err(|_| ())?;
        let mut chunk = Vec::new();
        chunk.try_reserve_exact(BLOCK_CHUNK).map_err(|_| ())?;
        chunk.resize(BLOCK_CHUNK, [0; BLOCK]);
        self.chunks.push(chunk);
        // Lowest index last: taken first.
        self.free
            .extend((first..first + BLOCK_CHUNK).rev().map(|i| i as u32));
        Ok(())
    }

    /// PASSIVE_LEVEL, where endpoints go (DESTROY, cleanup): with no block held and more
    /// than twice what `prepare` keeps, all but the chunks [`KEEP_FREE`] blocks take go:
    /// the pool stays prepared, so the DISPATCH_LEVEL entry points that follow find
    /// [`DISPATCH_BLOCKS`] free (cleanup runs no `prepare`; an empty pool would drop every
    /// receive batch until passive work). Blocks held never move, so a pool with any
    /// keeps its size. Allocates only to shrink the lists (fallibly: `shrink_vec`).
    pub(super) fn trim(&mut self) {
        if self.held != 0 || self.free.len() <= 2 * self.target() {
            return;
        }
        let keep = KEEP_FREE.div_ceil(BLOCK_CHUNK);
        self.chunks.truncate(keep);
        shrink_vec(&mut self.chunks, keep);
        let blocks = self.chunks.len() * BLOCK_CHUNK;
        self.free.clear();
        // Lowest index last: taken first.
        self.free.extend((0..blocks).rev().map(|i| i as u32));
        shrink_vec(&mut self.free, blocks);
    }

    /// Heap bytes: the blocks, free or held, and the free list.
    pub(super) fn bytes(&self) -> usize {
        self.chunks.len() * BLOCK_CHUNK * BLOCK + self.chunks.heap_bytes() + self.free.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_held_only_for_private_data() {
        let mut p = PdataBlocks::default();
        p.prepare().unwrap();
        let free = p.free.len();
        let mut k = Kept::default();
        p.keep(&mut k, &[]);
        assert_eq!((k, p.held), (Kept::default(), 0));
        p.keep(&mut k, &[0; 92]);
        assert_eq!((p.get(k), p.held), (&[0; 92][..], 0), "zeros take no block");
        p.keep(&mut k, b"hello");
        assert_eq!((p.get(k), p.held), (&b"hello"[..], 1));
        p.keep(&mut k, b"again, longer");
        assert_eq!((p.get(k), p.held), (&b"again, longer"[..], 1));
        p.keep(&mut k, &[7; 300]);
        assert_eq!(p.get(k), &[7; BLOCK][..], "cut to a block");
        p.keep(&mut k, &[0; 196]);
        assert_eq!((p.get(k), p.held, p.free.len()), (&[0; 196][..], 0, free));
    }

    #[test]
    fn prepared_room_covers_a_dispatch_entry_point() {
        let mut p = PdataBlocks::default();
        assert!(!p.has_dispatch_room());
        p.prepare().unwrap();
        assert!(p.has_dispatch_room());
        let chunks = p.chunks.len();
        let mut kept = Vec::new();
        for i in 0..DISPATCH_BLOCKS {
            let mut k = Kept::default();
            p.keep(&mut k, &[i as u8 + 1]);
            kept.push(k);
        }
        assert_eq!(p.chunks.len(), chunks, "taken without growing");
        for k in kept {
            p.release(k);
        }
        p.prepare().unwrap();
        for _ in 0..40 {
            p.grow_chunk().unwrap();
        }
        let prepared = {
            let mut q = PdataBlocks::default();
            q.prepare().unwrap();
            q.bytes()
        };
        p.trim();
        assert!(p.has_dispatch_room(), "the trimmed pool stays prepared");
        assert!(!p.running_low());
        assert!(
            p.bytes() <= prepared,
            "nothing held: all but the prepared room goes ({} B, prepared {prepared})",
            p.bytes()
        );
        let mut k = Kept::default();
        p.keep(&mut k, b"after the trim");
        assert_eq!(p.get(k), b"after the trim");
    }
}
