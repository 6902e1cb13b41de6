//! The id pool's layout: slots in chunks that never move, several client addresses per
//! slot, and the free list taken oldest-first, so that a pointer to a destroyed id names a
//! dead slot for a long time.
//!
//! Why: a client may call with the pointer of an id it already destroyed. ndfltr calls
//! `destroy_id` for an endpoint alive at HCA removal from its D0Exit remove handler
//! (nd_ep.cpp:149-156) and again from its destructor (nd_ep.cpp:100-102; `m_hIfc` is
//! never cleared); a callback's error return frees an id (al_cm.c:90-95) while its client
//! may be calling `destroy_id` on another CPU. If that pointer named the id created next,
//! the call would destroy another connection, possibly another process's. AL frees the
//! memory (use after free); here the pointer is only ever compared with the pool's
//! bounds:
//! - each slot has [`CELLS`] addresses; use `g` of a slot is handed out at address
//!   `g % CELLS`, and every call checks that the address is the slot's current one (the
//!   generation check): a stale pointer names a live id only after its slot was taken
//!   `CELLS` more times;
//! - free slots are taken oldest-first, so a freed slot is taken again only after every
//!   other free slot: a stale pointer stays dead for at least `CELLS` times the free slots
//!   creations;
//! - the pool grows at PASSIVE_LEVEL (doubling, in chunks that never move): a client that
//!   leaks ids (WinVerbs overwrites `pIbCmId` at every connect after a REQ timeout,
//!   wv_ep.c:514 then 641) runs out no sooner than under AL, whose ids come from the
//!   nonpaged pool one by one (`cm_create_id`).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::cell::UnsafeCell;
use core::ptr::null_mut;

use ibcm_endpoint::{Callback, ClientId, Platform};

use crate::abi::{Be32, IbPathRec, IbaCmId, pdata, rdma_cm};

/// Addresses per slot (24 bytes each).
pub(crate) const CELLS: usize = 4;

/// Chunks a pool grows to at most: chunk 0 holds `Config::ids` slots, chunk `k >= 1`
/// `ids << (k - 1)` (each growth doubles the pool); 2^23 times the first chunk is beyond
/// any memory.
pub(crate) const MAX_CHUNKS: usize = 24;

/// One use of a slot: its index and the generation the use was taken with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Use {
    pub index: usize,
    pub generation: u32,
}

impl Use {
    /// The address (of the slot's [`CELLS`]) this use is handed out at.
    pub(crate) fn cell(self) -> usize {
        self.generation as usize % CELLS
    }
}

/// Chunk `k`'s first slot and its slot count, for a pool whose first chunk holds `ids`.
pub(crate) fn chunk_span(ids: usize, k: usize) -> (usize, usize) {
    match k {
        0 => (0, ids),
        _ => {
            let n = ids << (k - 1);
            (n, n)
        }
    }
}

/// The chunk and the index in it of slot `index`.
pub(crate) fn locate(ids: usize, index: usize) -> Option<(usize, usize)> {
    let q = index.checked_div(ids)?;
    let k = (usize::BITS - q.leading_zeros()) as usize;
    let (first, len) = chunk_span(ids, k);
    let local = index - first;
    (k < MAX_CHUNKS && local < len).then_some((k, local))
}

/// What a SIDR_REQ event from `get_request` points to.
#[repr(C)]
pub(crate) struct SidrStore {
    pub path: IbPathRec,
    pub pdata: [u8; pdata::SIDR_REQ],
}

/// A chunk of slots, made at PASSIVE_LEVEL and never moved nor freed before the instance.
pub(crate) struct Chunk<P: Platform> {
    /// The client ids, [`CELLS`] per slot (slot `i`'s at `i * CELLS ..`). Written by the
    /// client (`context`, `callback`) at any time: only ever accessed through raw
    /// pointers, never by reference.
    pub cells: Box<[UnsafeCell<IbaCmId>]>,
    /// Per slot: the path and private data a SIDR_REQ from `get_request` points to;
    /// written only by the `get_request` that took the (free, so unshared) slot.
    pub sidr: Box<[UnsafeCell<SidrStore>]>,
    /// Per slot: the dispatch layer's callback (cloning one is a reference count, not an
    /// allocation).
    pub callbacks: Box<[Callback<P>]>,
}

impl<P: Platform> Chunk<P> {
    /// A chunk of `len` slots whose callbacks are `callback(first + i)`; `None` if memory
    /// runs out.
    pub(crate) fn new(
        first: usize,
        len: usize,
        callback: impl Fn(usize) -> Callback<P>,
    ) -> Option<Self> {
        let mut cells = Vec::new();
        cells.try_reserve_exact(len.checked_mul(CELLS)?).ok()?;
        cells.resize_with(len * CELLS, || {
            UnsafeCell::new(IbaCmId {
                context: null_mut(),
                callback: None,
                cid: Be32(0),
            })
        });
        let mut sidr = Vec::new();
        sidr.try_reserve_exact(len).ok()?;
        sidr.resize_with(len, || {
            UnsafeCell::new(SidrStore {
                path: IbPathRec::default(),
                pdata: [0; pdata::SIDR_REQ],
            })
        });
        let mut callbacks = Vec::new();
        callbacks.try_reserve_exact(len).ok()?;
        callbacks.extend((first..first + len).map(callback));
        Some(Self {
            cells: cells.into_boxed_slice(),
            sidr: sidr.into_boxed_slice(),
            callbacks: callbacks.into_boxed_slice(),
        })
    }

    /// The first address of the chunk's cells.
    pub(crate) fn base(&self) -> usize {
        self.cells.as_ptr() as usize
    }

    /// One past its last cell.
    pub(crate) fn end(&self) -> usize {
        self.base() + self.cells.len() * core::mem::size_of::<UnsafeCell<IbaCmId>>()
    }
}

/// What the pool knows of a slot (under the pool lock).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Meta {
    pub live: bool,
    /// Counts the slot's uses (see [`Use`]).
    pub generation: u32,
    pub client: Option<ClientId>,
    pub listen: bool,
    /// RDMA-CM listen: header ranges the engine does not compare, checked per REQ.
    pub post_check: Option<PostCheck>,
}

/// The header bytes an RDMA-CM listen compares beyond what the engine's one contiguous
/// compare covers: up to two ranges of the 36-byte header (see `listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PostCheck {
    pub header: [u8; rdma_cm::HEADER_SIZE],
    pub ranges: [(u8, u8); 2],
}

impl PostCheck {
    /// Whether a REQ's private data matches.
    pub(crate) fn matches(&self, private_data: &[u8]) -> bool {
        self.ranges.iter().all(|&(start, end)| {
            let r = usize::from(start)..usize::from(end);
            private_data.get(r.clone()) == self.header.get(r)
        })
    }
}

/// The pool's state under its lock.
pub(crate) struct Pool {
    /// Slots of the first chunk (`Config::ids`).
    pub ids: usize,
    /// Free slots, oldest-freed first; room for every slot (freeing never allocates).
    pub free: VecDeque<u32>,
    /// Per chunk, its slots' [`Meta`] (room for [`MAX_CHUNKS`] made at creation).
    pub meta: Vec<Vec<Meta>>,
    /// Compare buffers for listens (the engine keeps the one a listen takes).
    pub compare: Vec<Vec<u8>>,
}

impl Pool {
    /// Slots in all chunks.
    pub(crate) fn slots(&self) -> usize {
        self.meta.iter().map(Vec::len).sum()
    }

    pub(crate) fn meta(&self, index: usize) -> Option<&Meta> {
        let (k, local) = locate(self.ids, index)?;
        self.meta.get(k)?.get(local)
    }

    pub(crate) fn meta_mut(&mut self, index: usize) -> Option<&mut Meta> {
        let (k, local) = locate(self.ids, index)?;
        self.meta.get_mut(k)?.get_mut(local)
    }

    /// The meta of `u` if `u` is the slot's live use.
    pub(crate) fn live_mut(&mut self, u: Use) -> Option<&mut Meta> {
        self.meta_mut(u.index)
            .filter(|m| m.live && m.generation == u.generation)
    }

    /// Takes the oldest free slot (no allocation).
    pub(crate) fn take(&mut self) -> Option<Use> {
        let index = self.free.pop_front()? as usize;
        let m = self.meta_mut(index)?;
        *m = Meta {
            live: true,
            generation: m.generation.wrapping_add(1),
            ..Meta::default()
        };
        Some(Use {
            index,
            generation: m.generation,
        })
    }

    /// Gives `u`'s slot back if `u` is its live use (a stale free frees nothing).
    pub(crate) fn release(&mut self, u: Use) {
        if let Some(m) = self.live_mut(u) {
            *m = Meta {
                generation: m.generation,
                ..Meta::default()
            };
            // Room for every slot was made when its chunk was added.
            self.free.push_back(u.index as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use alloc::collections::VecDeque;
    use alloc::vec;
    use alloc::vec::Vec;

    use super::{CELLS, MAX_CHUNKS, Meta, Pool, Use, chunk_span, locate};

    fn pool(ids: usize) -> Pool {
        Pool {
            ids,
            free: (0..ids as u32).collect::<VecDeque<_>>(),
            meta: vec![vec![Meta::default(); ids]],
            compare: Vec::new(),
        }
    }

    /// A freed slot is taken again only after every other free one, and then at another
    /// address; a release of a use that ended frees nothing.
    #[test]
    fn slots_are_reused_oldest_first_at_a_new_address() {
        let mut p = pool(4);
        let a = p.take().unwrap();
        p.release(a);
        let others: Vec<Use> = (0..3).map(|_| p.take().unwrap()).collect();
        assert!(others.iter().all(|u| u.index != a.index));
        let again = p.take().unwrap();
        assert_eq!(again.index, a.index);
        assert_ne!(again.cell(), a.cell());
        // The stale use cannot free the slot's new use.
        p.release(a);
        assert!(p.live_mut(again).is_some());
        assert!(p.live_mut(a).is_none());
        // A slot's address comes back only after CELLS uses of the slot.
        for o in &others {
            p.release(*o);
        }
        let (mut u, mut uses) = (again, 1);
        while u.cell() != a.cell() {
            p.release(u);
            let taken: Vec<Use> = (0..4).map(|_| p.take().unwrap()).collect();
            for t in &taken {
                if t.index == a.index {
                    u = *t;
                } else {
                    p.release(*t);
                }
            }
            uses += 1;
        }
        assert_eq!(uses, CELLS);
        assert_eq!(u.generation, a.generation + CELLS as u32);
    }

    #[test]
    fn chunks_double_the_pool_and_tile_the_indices() {
        let ids = 32;
        let mut next = 0;
        for k in 0..8 {
            let (first, len) = chunk_span(ids, k);
            assert_eq!(first, next, "chunk {k} starts where {} ended", k.max(1) - 1);
            assert_eq!(first + len, ids << k, "after chunk {k} the pool is doubled");
            for local in [0, len / 2, len - 1] {
                assert_eq!(locate(ids, first + local), Some((k, local)));
            }
            next = first + len;
        }
        assert_eq!(locate(0, 5), None);
        assert_eq!(locate(ids, ids << (MAX_CHUNKS - 1)), None);
    }
}
