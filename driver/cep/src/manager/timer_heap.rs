//! The timer heap: one entry per armed CEP, its position kept in the CEP, so that a timer
//! cancelled or moved leaves or moves in place (O(log n)) instead of staying, stale, until
//! its deadline (16 bytes per REQ answered before its MRA timer, until half its sender's
//! response timeout; Linux `cm_establish` likewise takes the REQ's MAD timer off its
//! queue at once, `ib_cancel_mad`).
//!
//! A 4-ary min-heap: a level's four children of one entry are one 64-byte line, and it is
//! half as deep as a binary heap, so a sift touches half as many CEPs to tell them their
//! new positions (a timer wheel, as Linux's and Windows' kernel timers, would fire a timer
//! up to a slot's width late; CM deadlines here are exact).

use alloc::collections::TryReserveError;
use alloc::vec::Vec;
use core::num::NonZeroU32;

use crate::types::Instant;

/// A CEP's position when no timer of its is armed.
pub(crate) const NO_TIMER: u32 = u32::MAX;

/// Children per entry.
const ARITY: usize = 4;

/// One armed timer: its deadline, the sequence number that orders equal deadlines
/// first armed first, and the CEP's raw handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TimerEntry {
    pub at: Instant,
    pub seq: NonZeroU32,
    pub cep: u32,
}

impl TimerEntry {
    fn key(&self) -> (Instant, NonZeroU32) {
        (self.at, self.seq)
    }
}

/// The heap. Every method that moves an entry tells its CEP its new position through
/// `place(cep, position)`.
#[derive(Debug, Default)]
pub(super) struct TimerHeap {
    entries: Vec<TimerEntry>,
}

impl TimerHeap {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// Room for `total` entries: a quarter more than asked when it grows, so that growing
    /// entry by entry copies O(1) per entry (not the doubling of `Vec::try_reserve`).
    pub(super) fn try_reserve_total(&mut self, total: usize) -> Result<(), TryReserveError> {
        if self.entries.capacity() >= total {
            return Ok(());
        }
        let grown = total.max(self.entries.capacity() + self.entries.capacity() / 4);
        self.entries.try_reserve_exact(grown - self.entries.len())
    }

    /// Gives back room beyond `keep` entries (or what it holds).
    pub(super) fn shrink_to(&mut self, keep: usize) {
        let keep = keep.max(self.entries.len());
        crate::grow::shrink_vec(&mut self.entries, keep);
    }

    /// The entry due first.
    pub(super) fn peek(&self) -> Option<TimerEntry> {
        self.entries.first().copied()
    }

    /// The entry at `pos`.
    pub(super) fn get(&self, pos: u32) -> Option<TimerEntry> {
        self.entries.get(pos as usize).copied()
    }

    /// Adds an entry (allocates only when the room `try_reserve_total` made is used up).
    pub(super) fn push(&mut self, e: TimerEntry, place: &mut impl FnMut(u32, u32)) {
        let pos = self.entries.len();
        self.entries.push(e);
        self.sift_up(pos, place);
    }

    /// Removes the entry at `pos` and returns it; the entry moved into its place is
    /// placed anew. Allocates nothing.
    pub(super) fn remove(
        &mut self,
        pos: u32,
        place: &mut impl FnMut(u32, u32),
    ) -> Option<TimerEntry> {
        let pos = pos as usize;
        if pos >= self.entries.len() {
            return None;
        }
        let removed = self.entries.swap_remove(pos);
        if pos < self.entries.len() {
            self.settle(pos, place);
        }
        Some(removed)
    }

    /// Gives the entry at `pos` a new deadline and sequence number, moving it up or down.
    pub(super) fn update(
        &mut self,
        pos: u32,
        at: Instant,
        seq: NonZeroU32,
        place: &mut impl FnMut(u32, u32),
    ) {
        let pos = pos as usize;
        if let Some(e) = self.entries.get_mut(pos) {
            e.at = at;
            e.seq = seq;
            self.settle(pos, place);
        }
    }

    /// Moves the entry at `pos` to where its key belongs, up or down.
    fn settle(&mut self, pos: usize, place: &mut impl FnMut(u32, u32)) {
        let up = pos > 0
            && matches!(
                (self.entries.get(pos), self.entries.get((pos - 1) / ARITY)),
                (Some(e), Some(parent)) if e.key() < parent.key()
            );
        if up {
            self.sift_up(pos, place);
        } else {
            self.sift_down(pos, place);
        }
    }

    fn sift_up(&mut self, mut pos: usize, place: &mut impl FnMut(u32, u32)) {
        let Some(&e) = self.entries.get(pos) else {
            return;
        };
        while pos > 0 {
            let parent = (pos - 1) / ARITY;
            let Some(&p) = self.entries.get(parent) else {
                break;
            };
            if p.key() <= e.key() {
                break;
            }
            if let Some(slot) = self.entries.get_mut(pos) {
                *slot = p;
            }
            place(p.cep, pos as u32);
            pos = parent;
        }
        if let Some(slot) = self.entries.get_mut(pos) {
            *slot = e;
        }
        place(e.cep, pos as u32);
    }

    fn sift_down(&mut self, mut pos: usize, place: &mut impl FnMut(u32, u32)) {
        let Some(&e) = self.entries.get(pos) else {
            return;
        };
        loop {
            let first = pos * ARITY + 1;
            let Some(children) = self
                .entries
                .get(first..(first + ARITY).min(self.entries.len()))
            else {
                break;
            };
            let Some((i, &least)) = children.iter().enumerate().min_by_key(|(_, c)| c.key()) else {
                break;
            };
            if e.key() <= least.key() {
                break;
            }
            if let Some(slot) = self.entries.get_mut(pos) {
                *slot = least;
            }
            place(least.cep, pos as u32);
            pos = first + i;
        }
        if let Some(slot) = self.entries.get_mut(pos) {
            *slot = e;
        }
        place(e.cep, pos as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn seq(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
    }

    /// Random pushes, removals and updates keep the heap order and every position told.
    #[test]
    fn positions_follow_the_entries() {
        let mut h = TimerHeap::default();
        let mut pos = vec![NO_TIMER; 64];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for n in 1..4000u32 {
            let cep = (next() % 64) as u32;
            let at = Instant::from_nanos(next() % 1000);
            let (current, op) = (pos[cep as usize], next() % 3);
            let mut place = |c: u32, p: u32| pos[c as usize] = p;
            match (current, op) {
                (NO_TIMER, _) => h.push(
                    TimerEntry {
                        at,
                        seq: seq(n),
                        cep,
                    },
                    &mut place,
                ),
                (p, 0) => {
                    let e = h.remove(p, &mut place).unwrap();
                    assert_eq!(e.cep, cep);
                    pos[cep as usize] = NO_TIMER;
                }
                (p, _) => h.update(p, at, seq(n), &mut place),
            }
            for (i, e) in h.entries.iter().enumerate() {
                assert_eq!(pos[e.cep as usize], i as u32);
                if i > 0 {
                    assert!(h.entries[(i - 1) / ARITY].key() <= e.key());
                }
            }
            assert_eq!(h.len(), pos.iter().filter(|&&p| p != NO_TIMER).count());
        }
        // Popping from the top gives the deadlines in order.
        let mut last = (Instant::from_nanos(0), NonZeroU32::MIN);
        while let Some(top) = h.peek() {
            assert!(top.key() >= last);
            last = top.key();
            h.remove(0, &mut |c, p| pos[c as usize] = p);
        }
    }
}
