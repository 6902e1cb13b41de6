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
//! A held REQ that ends before it is reported (its sender's REJ, a stale peer, a port
//! down, the listen destroyed) leaves its entry behind, skipped when it comes up; the
//! queue is compacted when such entries outnumber the live ones.
//!
//! [`CmConfig::held_requests_per_listen`]: crate::CmConfig::held_requests_per_listen

use alloc::collections::VecDeque;

use crate::cep::Backlog;
use crate::event::Event;
use crate::types::CepId;

use super::CmManager;

/// One listen's held REQs: their CEPs and the events to report.
#[derive(Debug, Clone, Default)]
pub(super) struct HeldReqs {
    queue: VecDeque<(CepId, Event)>,
    /// Entries of `queue` whose REQ still waits.
    live: u32,
}

impl HeldReqs {
    /// REQs waiting.
    pub(super) fn len(&self) -> u32 {
        self.live
    }

    /// Heap bytes of the queue.
    pub(super) fn heap_bytes(&self) -> usize {
        self.queue.capacity() * core::mem::size_of::<(CepId, Event)>()
    }

    /// One of the waiting REQs ended unreported (its entry stays, skipped later).
    pub(super) fn ended(&mut self) {
        self.live = self.live.saturating_sub(1);
    }
}

impl CmManager {
    /// Makes room to hold one more REQ on `listen` (allocates only here, through
    /// `try_reserve`); false if memory runs out. Compacts first when ended entries
    /// outnumber the live ones.
    pub(super) fn room_to_hold(&mut self, listen: CepId) -> bool {
        let slots = &self.slots;
        let Some(l) = self.listens.get_mut(listen) else {
            return false;
        };
        let h = &mut l.held;
        if h.queue.len() > 2 * h.live as usize + 64 {
            h.queue.retain(|(id, _)| {
                slots
                    .get(id.index())
                    .filter(|s| s.generation & 0xff == id.tag())
                    .and_then(|s| s.cep.as_ref())
                    .is_some_and(|c| c.backlog_of == Some(listen) && c.backlog == Backlog::Held)
            });
        }
        h.queue.try_reserve(1).is_ok()
    }

    /// Holds CEP `id`'s REQ on `listen` (room made by [`Self::room_to_hold`]).
    pub(super) fn hold(&mut self, listen: CepId, id: CepId, event: Event) {
        if let Some(c) = self.cep_mut(id) {
            c.backlog_of = Some(listen);
            c.backlog = Backlog::Held;
        }
        if let Some(l) = self.listens.get_mut(listen) {
            l.held.queue.push_back((id, event));
            l.held.live = l.held.live.saturating_add(1);
        }
    }

    /// Reports the held REQs of `listen` its backlog has room for, oldest first.
    pub(super) fn report_held(&mut self, listen: CepId) {
        loop {
            let Some(l) = self.listens.get_mut(listen) else {
                return;
            };
            if l.pending >= l.params.backlog {
                return;
            }
            let Some((id, event)) = l.held.queue.pop_front() else {
                return;
            };
            let waits = self
                .cep_any(id)
                .is_some_and(|c| c.backlog_of == Some(listen) && c.backlog == Backlog::Held);
            if !waits {
                continue;
            }
            if let Some(l) = self.listens.get_mut(listen) {
                l.held.live = l.held.live.saturating_sub(1);
                l.pending += 1;
            }
            if let Some(c) = self.cep_mut(id) {
                c.backlog = Backlog::Reported;
            }
            self.emit(id, event);
        }
    }
}
