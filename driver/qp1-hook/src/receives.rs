//! The receives posted on one QP1 and not yet completed: `wr_id` -> receive buffer.
//!
//! AL posts at most the QP's depth (`core/al/kernel/al_smi.c`: `spl_qp_svc_post_recvs`),
//! and the HCA refuses more than its receive queue holds (`ci_post_recv`:
//! `IB_INSUFFICIENT_RESOURCES`), so the map never holds more than the QP's receive depth.
//! Its room is made when the QP is created (PASSIVE_LEVEL); `post_recv` and `poll_cq`
//! (DISPATCH_LEVEL) insert and remove without allocating: the table is reserved for twice
//! the depth, so hashbrown's rehash after many removals happens in place (it grows only
//! past half its buckets' capacity).

use core::hash::{BuildHasherDefault, Hasher};

use hashbrown::HashMap;

/// Hashes a `wr_id`: AL's element address (`al_smi.c`: `recv_wr.wr_id =
/// (uintn_t)p_al_element`), chosen by AL, not by the network, so a multiplicative hash
/// is enough.
#[derive(Default)]
pub(crate) struct WrIdHasher(u64);

impl Hasher for WrIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: the golden-ratio multiplier spreads aligned pointers.
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Why a receive was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRecorded {
    /// The QP's receive depth is reached: the HCA refuses this post anyway.
    Full,
}

/// The map (see the module's documentation).
#[derive(Debug)]
pub struct Receives<B> {
    map: HashMap<u64, B, BuildHasherDefault<WrIdHasher>>,
    depth: usize,
}

impl<B: Copy> Receives<B> {
    /// Room for `depth` posted receives (PASSIVE_LEVEL); None if it cannot be had.
    pub fn with_depth(depth: usize) -> Option<Self> {
        let mut map = HashMap::default();
        map.try_reserve(depth.checked_mul(2)?).ok()?;
        Some(Self { map, depth })
    }

    /// Records a posted receive. A `wr_id` already present is replaced (its receive can
    /// no longer complete: AL re-posts an element only after its completion or a reset)
    /// and `Ok(true)` says so.
    pub fn insert(&mut self, wr_id: u64, buffer: B) -> Result<bool, NotRecorded> {
        if let Some(slot) = self.map.get_mut(&wr_id) {
            *slot = buffer;
            return Ok(true);
        }
        if self.map.len() >= self.depth {
            return Err(NotRecorded::Full);
        }
        self.map.insert(wr_id, buffer);
        Ok(false)
    }

    /// Takes the buffer of a completed (or refused) receive out of the map.
    pub fn take(&mut self, wr_id: u64) -> Option<B> {
        self.map.remove(&wr_id)
    }

    /// Forgets every receive (the QP went to RESET: the HCA dropped its receive queue and
    /// cleaned its completions from the CQ). Returns how many were forgotten.
    pub fn clear(&mut self) -> usize {
        let n = self.map.len();
        self.map.clear();
        n
    }

    /// Receives recorded.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is recorded.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The QP's receive depth.
    pub fn depth(&self) -> usize {
        self.depth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_by_the_depth_and_allocation_free_once_made() {
        let mut r = Receives::<u32>::with_depth(64).unwrap();
        let info = allocation_counter::measure(|| {
            // Many rounds of a full queue completing in a scrambled order: tombstones
            // and in-place rehashes, never a new table.
            for round in 0..200u64 {
                for i in 0..64u64 {
                    let wr_id = 0xFFFF_8000_0000_0000 + (round * 64 + i) * 0x140;
                    assert_eq!(r.insert(wr_id, i as u32), Ok(false));
                }
                assert_eq!(r.insert(1, 0), Err(NotRecorded::Full));
                for i in (0..64u64)
                    .rev()
                    .step_by(3)
                    .chain((0..64).filter(|i| i % 3 != 0))
                {
                    let wr_id = 0xFFFF_8000_0000_0000 + (round * 64 + i) * 0x140;
                    assert_eq!(r.take(wr_id), Some(i as u32), "round {round} wr {i}");
                }
                assert!(r.is_empty());
            }
        });
        assert_eq!(info.count_total, 0);
    }

    #[test]
    fn a_reposted_wr_id_replaces_its_stale_buffer() {
        let mut r = Receives::with_depth(2).unwrap();
        assert_eq!(r.insert(7, 'a'), Ok(false));
        assert_eq!(r.insert(7, 'b'), Ok(true));
        assert_eq!(r.len(), 1);
        assert_eq!(r.take(7), Some('b'));
        assert_eq!(r.take(7), None);
        assert_eq!(r.insert(8, 'c'), Ok(false));
        assert_eq!(r.insert(9, 'd'), Ok(false));
        assert_eq!(r.clear(), 2);
        assert!(r.is_empty());
    }
}
