//! Proof that a MAD with the private method came from the hook: the header of each MAD
//! the hook remapped, until ibcm's receive callback claims it.
//!
//! A peer can put the private method on the wire; AL would deliver that MAD to ibcm's
//! service as well. The hook remembers the 24-byte common header of every MAD it
//! remapped (TransactionID, AttributeID and AttributeModifier included, method already
//! `M`); the receive callback claims one matching header or refuses the MAD. AL delivers
//! a remapped MAD in the same DPC that polled it (`core/al/kernel/al_smi.c`:
//! `spl_qp_comp` -> `process_mad_recv` -> the client's receive callback), so a few
//! tickets per port suffice; the oldest is overwritten when they run out (a MAD AL
//! dropped before delivering it leaves a ticket that ages out that way). A retried MAD
//! (the CM resends with the same TID) gets one ticket per copy.

use alloc::vec::Vec;

use crate::method::MAD_HEADER_SIZE;

/// Tickets kept per port.
pub const TICKETS: usize = 32;

/// One remapped MAD's header.
pub type Ticket = [u8; MAD_HEADER_SIZE];

/// The tickets of one port: a ring, oldest overwritten.
#[derive(Debug)]
pub struct Tickets {
    ring: Vec<Option<Ticket>>,
    next: usize,
}

impl Tickets {
    /// Room for [`TICKETS`] (PASSIVE_LEVEL); None if it cannot be had.
    pub fn new() -> Option<Self> {
        let mut ring = Vec::new();
        ring.try_reserve_exact(TICKETS).ok()?;
        ring.resize(TICKETS, None);
        Some(Self { ring, next: 0 })
    }

    /// Remembers a remapped MAD's header; returns whether an unclaimed ticket was
    /// overwritten.
    pub fn issue(&mut self, ticket: Ticket) -> bool {
        let len = self.ring.len();
        let Some(slot) = self.ring.get_mut(self.next) else {
            return false;
        };
        let evicted = slot.replace(ticket).is_some();
        self.next = (self.next + 1) % len.max(1);
        evicted
    }

    /// Claims the ticket of a delivered MAD's header, if one was issued.
    pub fn claim(&mut self, header: &[u8]) -> bool {
        let found = self
            .ring
            .iter_mut()
            .find(|slot| slot.as_ref().is_some_and(|t| t[..] == *header));
        match found {
            Some(slot) => {
                *slot = None;
                true
            }
            None => false,
        }
    }

    /// Forgets every ticket (the QP is gone).
    pub fn clear(&mut self) {
        self.ring.fill(None);
    }

    /// Tickets not claimed.
    pub fn outstanding(&self) -> usize {
        self.ring.iter().filter(|t| t.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(tid: u8) -> Ticket {
        let mut h = [0u8; MAD_HEADER_SIZE];
        h[..4].copy_from_slice(&[1, 7, 2, 126]);
        h[15] = tid;
        h
    }

    #[test]
    fn a_ticket_is_claimed_once_per_issue() {
        let mut t = Tickets::new().unwrap();
        assert!(!t.issue(header(1)));
        assert!(!t.issue(header(1)));
        assert!(t.claim(&header(1)));
        assert!(t.claim(&header(1)));
        assert!(!t.claim(&header(1)));
        assert!(!t.claim(&header(2)));
        assert!(!t.claim(&header(2)[..4]));
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn the_oldest_ticket_ages_out() {
        let mut t = Tickets::new().unwrap();
        for i in 0..TICKETS as u8 {
            assert!(!t.issue(header(i)));
        }
        assert!(t.issue(header(200)));
        assert!(!t.claim(&header(0)));
        assert!(t.claim(&header(1)));
        assert!(t.claim(&header(200)));
        t.clear();
        assert_eq!(t.outstanding(), 0);
    }
}
