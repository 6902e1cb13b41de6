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
//!  wire value = fixed pattern | deposit(compact)
//!  fixed       = CmConfig::comm_id_value on the bits of CmConfig::comm_id_mask
//!  compact     = permute_key(index | generation << index_bits)      (free_bits wide)
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
//! - `permute` is a keyed permutation of the free bits ([`Feistel`]: four rounds of a
//!   Feistel network whose round function is SipHash-1-3 under a key drawn from the
//!   manager's RNG, seeded from BCryptGenRandom in the driver). A comm ID is the only
//!   secret a third node must guess to forge a message for a connection in REQ_SENT (a
//!   REJ is matched by its RemoteCommID alone there: IBA 12.6.7; Linux
//!   `cm_acquire_rejected_id`): with an XOR operand, as before, one comm ID seen gave
//!   away the index bits of every other (they count up), leaving 2^12 guesses; the
//!   permutation leaves every bit of another comm ID unknown. It is a bijection of the
//!   free bits, so the receive path inverts it and still reads one slot.
//!
//! Linux's IDs come from `xa_alloc_cyclic` over 2^32 (an ID repeats after ~2^32
//! allocations) and need an xarray walk per MAD, XORed with `cm.random_id_operand`
//! (`cm_alloc_id_priv`: predictable from one ID seen, as ours were); WinOF AL's are
//! `cid | modifier << 24` (24-bit vector index, 8-bit modifier, sequential, LIFO free
//! list: `al_cm_cep.c` `__get_lcid`). Ours repeat only after 128 x 2^generation_bits
//! allocations (below `max_ceps`): 2^19 with the default configuration, 2^15 beside AL
//! (8 generation bits left; a smaller `max_ceps` buys more).

use core::hash::Hasher;

use siphasher::sip::SipHasher13;

/// Fewest generation bits the layout keeps: a wide fixed pattern takes index bits first
/// (fewer slots), not the last generation bits.
pub(crate) const MIN_GENERATION_BITS: u32 = 4;

/// Most index bits (the slab index of [`CepId`](crate::CepId) handles, 2^24 CEPs).
pub(crate) const MAX_INDEX_BITS: u32 = 24;

/// The local comm ID space of one manager. Everything the receive path needs is
/// precomputed: with no fixed pattern (or fixed bits only above the free ones) a wire ID
/// is the permuted handle, with no deposit or extract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommIdSpace {
    /// Fixed bits: `wire & mask == value` for every local comm ID.
    mask: u32,
    value: u32,
    /// Permutes the compact (index, generation) value; within the free bits.
    permute: Feistel,
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
    /// outside `mask` are ignored), index bits for `max_ceps` CEPs, `key` (random) for
    /// the permutation.
    pub(crate) fn new(mask: u32, value: u32, max_ceps: u32, key: [u64; 2]) -> Self {
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
            permute: Feistel::new(free_bits, key),
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
        let x = self.permute.forward(handle);
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
            return Some(self.permute.inverse(wire & !self.mask));
        }
        let mut x = 0u32;
        let mut at = 0u32;
        for &(shift, width) in self.runs.iter().take(self.n_runs) {
            x |= ((wire >> shift) & width).checked_shl(at).unwrap_or(0);
            at += width.count_ones();
        }
        Some(self.permute.inverse(x))
    }

    /// Whether `wire` carries the fixed pattern (and is not 0, which means "none": IBA
    /// Table 108, a REJ's RemoteCommID of 0).
    #[inline]
    pub(crate) fn contains(&self, wire: u32) -> bool {
        wire != 0 && wire & self.mask == self.value
    }
}

/// A keyed permutation of `bits`-bit values (0..=32): an unbalanced Feistel network,
/// the low `bits / 2` bits and the rest as its halves, each round XORing one half with
/// SipHash-1-3 of the other (Luby-Rackoff: four rounds of a pseudorandom function make a
/// pseudorandom permutation). Each round is its own inverse given the other half, so
/// [`Self::inverse`] runs the rounds backwards.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Feistel {
    key: [u64; 2],
    low_bits: u32,
    low_mask: u32,
    high_mask: u32,
}

impl core::fmt::Debug for Feistel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The key stays out of traces and logs.
        f.debug_struct("Feistel")
            .field("low_bits", &self.low_bits)
            .finish_non_exhaustive()
    }
}

const FEISTEL_ROUNDS: u32 = 4;

impl Feistel {
    fn new(bits: u32, key: [u64; 2]) -> Self {
        let bits = bits.min(32);
        let low_bits = bits / 2;
        Self {
            key,
            low_bits,
            low_mask: low_mask(low_bits),
            high_mask: low_mask(bits - low_bits),
        }
    }

    fn round(&self, round: u32, half: u32) -> u32 {
        let mut h = SipHasher13::new_with_keys(self.key[0], self.key[1]);
        h.write_u64(u64::from(round) << 32 | u64::from(half));
        h.finish() as u32
    }

    fn split(&self, x: u32) -> (u32, u32) {
        (
            x & self.low_mask,
            x.checked_shr(self.low_bits).unwrap_or(0) & self.high_mask,
        )
    }

    fn join(&self, low: u32, high: u32) -> u32 {
        low | high.checked_shl(self.low_bits).unwrap_or(0)
    }

    #[inline]
    fn forward(&self, x: u32) -> u32 {
        let (mut low, mut high) = self.split(x);
        for r in 0..FEISTEL_ROUNDS {
            if r % 2 == 0 {
                high ^= self.round(r, low) & self.high_mask;
            } else {
                low ^= self.round(r, high) & self.low_mask;
            }
        }
        self.join(low, high)
    }

    #[inline]
    fn inverse(&self, y: u32) -> u32 {
        let (mut low, mut high) = self.split(y);
        for r in (0..FEISTEL_ROUNDS).rev() {
            if r % 2 == 0 {
                high ^= self.round(r, low) & self.high_mask;
            } else {
                low ^= self.round(r, high) & self.low_mask;
            }
        }
        self.join(low, high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u64; 2] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];

    #[test]
    fn default_layout_is_20_index_bits_and_12_generation_bits() {
        let s = CommIdSpace::new(0, 0, 1 << 20, KEY);
        assert_eq!((s.index_bits(), s.generation_bits()), (20, 12));
        let h = s.handle(5, 7);
        assert_eq!(s.handle_of(s.wire(h)), Some(h));
    }

    #[test]
    fn a_wide_pattern_takes_index_bits_before_generation_bits() {
        let s = CommIdSpace::new(0xFFFF_FF00, 0x0100_0000, 1 << 20, KEY);
        assert_eq!((s.index_bits(), s.generation_bits()), (4, 4));
        let s = CommIdSpace::new(u32::MAX, 0xF, 1 << 20, KEY);
        assert_eq!((s.index_bits(), s.generation_bits()), (0, 0));
        assert_eq!(s.wire(0), 0xF);
    }

    #[test]
    fn round_trip_through_a_split_pattern() {
        let s = CommIdSpace::new(0x00F0_F00F, 0x00A0_5003, 1000, KEY);
        for h in [0, 1, 999, s.handle(999, 0xFFF), s.handle(3, 0x155)] {
            let w = s.wire(h);
            assert_eq!(w & 0x00F0_F00F, 0x00A0_5003, "{w:#x}");
            assert_eq!(s.handle_of(w), Some(h));
        }
        assert_eq!(s.handle_of(0x00B0_5003), None);
    }

    /// The permutation is a bijection: every value of a 16-bit space (a pattern fixing
    /// the high half) has its own wire ID, and comes back from it; over 32 bits, samples
    /// come back.
    #[test]
    fn the_keyed_permutation_is_a_bijection() {
        let s = CommIdSpace::new(0xFFFF_0000, 0x1234_0000, 1 << 12, KEY);
        let mut seen = alloc::vec![false; 1 << 16];
        for h in 0..1u32 << 16 {
            let w = s.wire(h);
            assert_eq!(w >> 16, 0x1234);
            let low = (w & 0xFFFF) as usize;
            assert!(!seen[low], "{h:#x} -> {w:#x} twice");
            seen[low] = true;
            assert_eq!(s.handle_of(w), Some(h), "{w:#x}");
        }
        let s = CommIdSpace::new(0, 0, 1 << 20, KEY);
        let mut x = 1u32;
        for _ in 0..100_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let w = s.wire(x);
            if w != 0 {
                assert_eq!(s.handle_of(w), Some(x));
            }
        }
        // Odd widths: the halves differ by one bit.
        for bits in [1, 7, 13] {
            let f = Feistel::new(bits, KEY);
            let mut outs: alloc::vec::Vec<u32> = (0..1u32 << bits).map(|x| f.forward(x)).collect();
            assert!(outs.iter().all(|&y| y < 1 << bits));
            assert!((0..1u32 << bits).all(|x| f.inverse(f.forward(x)) == x));
            outs.sort_unstable();
            outs.dedup();
            assert_eq!(outs.len(), 1 << bits);
        }
    }

    /// Consecutive slots (what a manager hands out in a row) give comm IDs spread evenly
    /// over all 32 bits: a chi-squared test on each byte of 65 536 wire IDs (256 bins,
    /// 255 degrees of freedom; 330.5 is the 0.1% critical value), and on the XOR of
    /// neighbours' IDs (what the old layout gave away: it was the index's XOR). The
    /// XOR-operand layout fails it (its low byte counts up).
    #[test]
    fn consecutive_comm_ids_pass_a_uniformity_test() {
        let s = CommIdSpace::new(0, 0, 1 << 20, KEY);
        let n = 1u32 << 16;
        let wires: alloc::vec::Vec<u32> = (0..n).map(|i| s.wire(s.handle(i, 0x5a5))).collect();
        let chi2 = |values: &mut dyn Iterator<Item = u8>| {
            let mut bins = [0u32; 256];
            let mut count = 0u32;
            for v in values {
                bins[usize::from(v)] += 1;
                count += 1;
            }
            let expected = f64::from(count) / 256.0;
            bins.iter()
                .map(|&o| (f64::from(o) - expected) * (f64::from(o) - expected) / expected)
                .sum::<f64>()
        };
        for byte in 0..4 {
            let at = |w: u32| (w >> (8 * byte)) as u8;
            let c = chi2(&mut wires.iter().map(|&w| at(w)));
            assert!(c < 330.5, "byte {byte}: chi2 {c}");
            let c = chi2(&mut wires.windows(2).map(|p| at(p[0] ^ p[1])));
            assert!(c < 330.5, "neighbours' XOR, byte {byte}: chi2 {c}");
        }
    }
}
