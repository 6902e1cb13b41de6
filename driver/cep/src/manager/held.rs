//! REQs past a listen's backlog, held in the engine until the listen has room.
//!
//! A listen's backlog bounds the REQs it has reported (`Event::ReqReceived`) and nobody
//! has answered yet: a REQ counts from its event until its REP or REJ is sent, its CEP
//! is destroyed or its sender gives up (`leave_backlog`), whoever reads the events. So a
//! user library may read every event as it comes, and a kernel client that bypasses it is
//! bounded alike: neither ever holds more than the backlog of REQs it has not answered.
//!
//! A REQ that finds the backlog full is held here instead: its CEP is made (REQ_RCVD, the
//! peer lookups, the MRA timer of waiting.rs: its sender waits instead of retrying, IBA
//! 12.6.6) and its event waits in the listen's queue, reported in arrival order as
//! answers make room. At most [`CmConfig::held_requests_per_listen`] wait so; one past
//! that is refused at once with REJ(NoResources) (IBA 12.6.7.2 Table 112 reason 3),
//! before a CEP is taken, so a REQ flood costs at most the backlog plus the cap per
//! listen. Linux's rdma_cm has no such queue: a REQ past ucma's backlog is dropped
//! (`ucma_event_handler`, cm-anchors.md #6) and its sender retries; WinOF AL keeps every
//! REQ (no bound).
//!
//! The held events wait in one table of the manager, each listen's chained in arrival
//! order (a doubly linked list through the table, so a held REQ that ends unreported --
//! its sender's REJ, a stale peer, a port down, the listen destroyed -- leaves at once).
//! Nothing is allocated on the receive path: in fixed-room mode (the driver) the table
//! and the slab are grown at PASSIVE_LEVEL by [`CmManager::prepare_for`], to a quarter
//! of the REQs held plus [`HELD_CHUNK`] beyond them while any are held or one found no
//! room; a REQ that finds none is dropped as a full slab drops it (its sender retries),
//! and the manager asks for that room ([`CmManager::wants_room`]).
//!
//! [`CmConfig::held_requests_per_listen`]: crate::CmConfig::held_requests_per_listen

use hashbrown::HashMap;

use crate::cep::Backlog;
use crate::event::Event;
use crate::types::CepId;

use super::CmManager;
use super::lookup::KeyedHash;

/// Room made for held REQs beyond those held (and a quarter more), while any are held
/// or one found no room: the burst a receive path may meet before the next
/// PASSIVE_LEVEL call.
pub(super) const HELD_CHUNK: usize = 1024;

/// One listen's held REQs: the ends of its chain, and how many.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HeldReqs {
    head: Option<CepId>,
    tail: Option<CepId>,
    live: u32,
}

impl HeldReqs {
    /// REQs waiting.
    pub(super) fn len(&self) -> u32 {
        self.live
    }
}

/// A held REQ: its event, and its neighbours in its listen's chain.
#[derive(Debug, Clone, Copy)]
pub(super) struct HeldReq {
    event: Event,
    prev: Option<CepId>,
    next: Option<CepId>,
}

/// Every held REQ, by its CEP.
pub(super) type HeldTable = HashMap<u32, HeldReq, KeyedHash>;

impl CmManager {
    /// Whether there is room to hold one more REQ: in fixed-room mode only what
    /// [`Self::prepare_for`] made (asked for when short), else grown here.
    pub(super) fn room_to_hold(&mut self) -> bool {
        let room = if self.fixed_room {
            self.held.capacity() > self.held.len()
        } else {
            self.held.try_reserve(1).is_ok()
        };
        if !room {
            self.held_short = true;
        }
        room
    }

    /// The held REQs' part of the room [`Self::prepare_for`] makes.
    pub(super) fn held_headroom(&self) -> usize {
        if self.held.is_empty() && !self.held_short {
            return 0;
        }
        (self.held.len() / 4 + HELD_CHUNK).min(self.config.max_ceps as usize)
    }

    /// Makes the held table's room (PASSIVE_LEVEL, from `prepare_for`).
    pub(super) fn reserve_held(&mut self, headroom: usize) -> Result<(), crate::CmError> {
        if self.held.capacity() - self.held.len() < headroom {
            self.held
                .try_reserve(headroom)
                .map_err(|_| crate::CmError::NoResources)?;
        }
        self.held_short = false;
        Ok(())
    }

    /// Gives the held table back (`trim`: it held a storm's events) once none is held:
    /// all of it when no CEP is left, else down to [`HELD_CHUNK`] (a listen still busy
    /// keeps the room its next REQ past the backlog needs).
    pub(super) fn trim_held(&mut self) {
        if !self.held.is_empty() {
            return;
        }
        if self.live == 0 {
            self.held = HeldTable::with_hasher(*self.held.hasher());
        } else if self.held.capacity() > 2 * HELD_CHUNK {
            self.held.shrink_to(HELD_CHUNK);
        }
    }

    /// A listen reported a REQ and now has `pending` of its `backlog` unanswered: from
    /// half full on, room to hold is asked for ahead, so that the first REQ past the
    /// backlog finds it.
    pub(super) fn backlog_filling(&mut self, pending: u32, backlog: u32) {
        if pending.saturating_mul(2) >= backlog && self.held.capacity() == self.held.len() {
            self.held_short = true;
        }
    }

    /// Whether a REQ found no room to be held since the last [`Self::prepare_for`] (or a
    /// listen's backlog is filling with none made), or a REQ or LAP none for its
    /// alternate path (or the path table runs low, alternate.rs): the owner should call
    /// it at PASSIVE_LEVEL soon.
    pub fn wants_room(&self) -> bool {
        self.held_short || self.paths_short
    }

    /// Holds CEP `id`'s REQ on `listen` (room made by [`Self::room_to_hold`]).
    pub(super) fn hold(&mut self, listen: CepId, id: CepId, event: Event) {
        let Some(l) = self.listens.get_mut(listen) else {
            return;
        };
        let prev = l.held.tail;
        l.held.tail = Some(id);
        if l.held.head.is_none() {
            l.held.head = Some(id);
        }
        l.held.live = l.held.live.saturating_add(1);
        if let Some(p) = prev.and_then(|p| self.held.get_mut(&p.0)) {
            p.next = Some(id);
        }
        self.held.insert(
            id.0,
            HeldReq {
                event,
                prev,
                next: None,
            },
        );
        // Half the chunk left (table or slab): more is asked for now, before a REQ finds
        // none.
        if self.held.capacity() - self.held.len() < HELD_CHUNK / 2
            || (self.fixed_room && self.fresh_and_reusable() < HELD_CHUNK / 2)
        {
            self.held_short = true;
        }
        if let Some(c) = self.cep_mut(id) {
            c.backlog_of = Some(listen);
            c.backlog = Backlog::Held;
        }
    }

    /// Takes CEP `id`'s REQ out of `listen`'s chain; its event.
    pub(super) fn unhold(&mut self, listen: CepId, id: CepId) -> Option<Event> {
        let gone = self.held.remove(&id.0)?;
        if let Some(p) = gone.prev.and_then(|p| self.held.get_mut(&p.0)) {
            p.next = gone.next;
        }
        if let Some(n) = gone.next.and_then(|n| self.held.get_mut(&n.0)) {
            n.prev = gone.prev;
        }
        if let Some(l) = self.listens.get_mut(listen) {
            if l.held.head == Some(id) {
                l.held.head = gone.next;
            }
            if l.held.tail == Some(id) {
                l.held.tail = gone.prev;
            }
            l.held.live = l.held.live.saturating_sub(1);
        }
        Some(gone.event)
    }

    /// Reports the held REQs of `listen` its backlog has room for, oldest first.
    pub(super) fn report_held(&mut self, listen: CepId) {
        loop {
            let Some(l) = self.listens.get(listen) else {
                return;
            };
            if l.pending >= l.params.backlog {
                return;
            }
            let Some(id) = l.held.head else { return };
            let Some(event) = self.unhold(listen, id) else {
                // Not in the table (cannot happen): end the chain rather than loop.
                if let Some(l) = self.listens.get_mut(listen) {
                    l.held = HeldReqs::default();
                }
                return;
            };
            if let Some(l) = self.listens.get_mut(listen) {
                l.pending += 1;
                let (pending, backlog) = (l.pending, l.params.backlog);
                self.backlog_filling(pending, backlog);
            }
            if let Some(c) = self.cep_mut(id) {
                c.backlog = Backlog::Reported;
            }
            self.emit(id, event);
        }
    }
}
