//! Local comm IDs: how a CEP's slot and generation become the LocalCommID it sends, and
//! how a RemoteCommID received maps back to a slot without a hash (issue #16 item 8a,
//! issue #19).
//!
//! A comm ID is a 4-byte field of the CM messages (IBA 12.6.5, Tables 106-116), sent most
//! significant byte first like every MAD field (IBA 13.4; the codec's big-endian field
//! access, driver/mad/src/field.rs). Here it is always the number the 4 wire bytes make
//! read big-endian: wire byte `k` holds bits `31-8k ..= 24-8k`.
//!
//! ```text
//!  wire value  = fixed pattern | deposit(compact)
//!  fixed       = CmConfig::comm_id_value on the bits of CmConfig::comm_id_mask
//!  compact     = (index | generation << index_bits) ^ operand      (free_bits wide)
//!  deposit     = the compact bits, low to high, into the bits the mask leaves free
//! ```
//!
//! - `index` selects the slot directly (O(1), no hash on the receive path): as many bits
//!   as `CmConfig::max_ceps` needs (2^20 by default: 20 bits), at most 24.
//! - `generation` is the rest of the free bits (12 by default); each slot's generation
//!   starts at a random value and is bumped every time the slot is released, so a wire
//!   ID comes back only after the slot has been reused 2^generation_bits times. Slots
//!   are reused first-in first-out, and only from a pool of at least 128 free ones
//!   (`CmManager::alloc`, `REUSE_AFTER`), so a slot is reused as late as possible.
//! - `operand` is random per manager, over the free bits only (Linux `cm_alloc_id_priv`
//!   XORs `cm.random_id_operand` over all 32 bits; here the fixed bits stay as set).
//!
//! Linux's IDs come from `xa_alloc_cyclic` over 2^32 (an ID repeats after ~2^32
//! allocations) and need an xarray walk per MAD; WinOF AL's are `cid | modifier << 24`
//! (24-bit vector index, 8-bit modifier, sequential, LIFO free list: `al_cm_cep.c`
//! `__get_lcid`). Ours repeat only after 128 x 2^generation_bits allocations (below
//! `max_ceps`): 2^19 with the default configuration, 2^15 beside AL (8 generation bits
//! left; a smaller `max_ceps` buys more).

/// Fewest generation bits the layout keeps: a wide fixed pattern takes index bits first
/// (fewer slots), not the last generation bits.
pub(crate) const MIN_GENERATION_BITS: u32 = 4;

/// Most index bits (the slab index of [`CepId`](crate::CepId) handles, 2^24 CEPs).
pub(crate) const MAX_INDEX_BITS: u32 = 24;

/// The local comm ID space of one manager. Everything the receive path needs is
/// precomputed: with no fixed pattern (or fixed bits only above the free ones) a wire ID
/// is the handle XOR the operand, two instructions, as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommIdSpace {
    /// Fixed bits: `wire & mask == value` for every local comm ID.
    mask: u32,
    value: u32,
    /// XORed onto the compact (index, generation) value; within the free bits.
    operand: u32,
    index_bits: u32,
    index_mask: u32,
    generation_mask: u32,
    /// The free bits are bits 0.. of the wire value: no deposit or extract needed.
    identity: bool,
    /// Runs of free bits, lowest first: (shift in the wire value, mask of its width).
    runs: [(u32, u32); 16],
    n_runs: usize,
}

fn low_mask(bits: u32) -> u32 {
    1u64.checked_shl(bits).map_or(u32::MAX, |m| (m - 1) as u32)
}

impl CommIdSpace {
    /// The space of a manager: `mask`/`value` from its configuration (bits of `value`
    /// outside `mask` are ignored), index bits for `max_ceps` CEPs, `random` for the
    /// operand.
    pub(crate) fn new(mask: u32, value: u32, max_ceps: u32, random: u32) -> Self {
        let mut runs = [(0u32, 0u32); 16];
        let mut n_runs = 0usize;
        let mut bit = 0u32;
        while bit < 32 {
            if mask & (1 << bit) != 0 {
                bit += 1;
                continue;
            }
            let start = bit;
            while bit < 32 && mask & (1 << bit) == 0 {
                bit += 1;
            }
            // At most 16 runs of free bits fit in 32 bits (each needs a fixed bit after).
            if let Some(r) = runs.get_mut(n_runs) {
                *r = (start, low_mask(bit - start));
                n_runs += 1;
            }
        }
        let free_bits = (!mask).count_ones();
        // Bits to number max_ceps slots (ceil log2), within the limits.
        let wanted = 32 - max_ceps.max(1).saturating_sub(1).leading_zeros();
        let index_bits = wanted
            .min(MAX_INDEX_BITS)
            .min(free_bits.saturating_sub(MIN_GENERATION_BITS));
        Self {
            mask,
            value: value & mask,
            operand: random & low_mask(free_bits),
            index_bits,
            index_mask: low_mask(index_bits),
            generation_mask: low_mask(free_bits - index_bits),
            identity: n_runs <= 1 && runs.first().is_some_and(|r| r.0 == 0),
            runs,
            n_runs,
        }
    }

    /// Bits of the slot index.
    pub(crate) fn index_bits(&self) -> u32 {
        self.index_bits
    }

    /// Bits of the generation.
    pub(crate) fn generation_bits(&self) -> u32 {
        self.generation_mask.count_ones()
    }

    /// Most slots the space numbers.
    pub(crate) fn slots(&self) -> usize {
        1usize << self.index_bits
    }

    /// The mask of a generation.
    pub(crate) fn generation_mask(&self) -> u32 {
        self.generation_mask
    }

    /// The handle value of (index, generation): the compact value before the operand.
    pub(crate) fn handle(&self, index: u32, generation: u32) -> u32 {
        (index & self.index_mask) | ((generation & self.generation_mask) << self.index_bits)
    }

    /// The slot index of a handle value.
    #[inline]
    pub(crate) fn index(&self, handle: u32) -> usize {
        (handle & self.index_mask) as usize
    }

    /// The generation of a handle value.
    #[inline]
    pub(crate) fn generation(&self, handle: u32) -> u32 {
        (handle >> self.index_bits) & self.generation_mask
    }

    /// The wire comm ID of a handle value.
    #[inline]
    pub(crate) fn wire(&self, handle: u32) -> u32 {
        let x = handle ^ self.operand;
        if self.identity {
            return self.value | (x & !self.mask);
        }
        let mut x = x;
        let mut out = self.value;
        for &(shift, width) in self.runs.iter().take(self.n_runs) {
            out |= (x & width) << shift;
            x = x.checked_shr(width.count_ones()).unwrap_or(0);
        }
        out
    }

    /// The handle value a wire comm ID names, if it is in this space at all. Whether a
    /// live CEP holds it is the slab's question (index and generation).
    #[inline]
    pub(crate) fn handle_of(&self, wire: u32) -> Option<u32> {
        if !self.contains(wire) {
            return None;
        }
        if self.identity {
            return Some((wire & !self.mask) ^ self.operand);
        }
        let mut x = 0u32;
        let mut at = 0u32;
        for &(shift, width) in self.runs.iter().take(self.n_runs) {
            x |= ((wire >> shift) & width).checked_shl(at).unwrap_or(0);
            at += width.count_ones();
        }
        Some(x ^ self.operand)
    }

    /// Whether `wire` carries the fixed pattern (and is not 0, which means "none": IBA
    /// Table 108, a REJ's RemoteCommID of 0).
    #[inline]
    pub(crate) fn contains(&self, wire: u32) -> bool {
        wire != 0 && wire & self.mask == self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_is_20_index_bits_and_12_generation_bits() {
        let s = CommIdSpace::new(0, 0, 1 << 20, 0x1234_5678);
        assert_eq!((s.index_bits(), s.generation_bits()), (20, 12));
        let h = s.handle(5, 7);
        assert_eq!(s.wire(h), h ^ 0x1234_5678);
        assert_eq!(s.handle_of(s.wire(h)), Some(h));
    }

    #[test]
    fn a_wide_pattern_takes_index_bits_before_generation_bits() {
        let s = CommIdSpace::new(0xFFFF_FF00, 0x0100_0000, 1 << 20, 7);
        assert_eq!((s.index_bits(), s.generation_bits()), (4, 4));
        let s = CommIdSpace::new(u32::MAX, 0xF, 1 << 20, 7);
        assert_eq!((s.index_bits(), s.generation_bits()), (0, 0));
        assert_eq!(s.wire(0), 0xF);
    }

    #[test]
    fn round_trip_through_a_split_pattern() {
        let s = CommIdSpace::new(0x00F0_F00F, 0x00A0_5003, 1000, 0xdead_beef);
        for h in [0, 1, 999, s.handle(999, 0xFFF), s.handle(3, 0x155)] {
            let w = s.wire(h);
            assert_eq!(w & 0x00F0_F00F, 0x00A0_5003, "{w:#x}");
            assert_eq!(s.handle_of(w), Some(h));
        }
        assert_eq!(s.handle_of(0x00B0_5003), None);
    }
}
