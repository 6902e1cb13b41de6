//! State changes: the one `set_state`, events for a CEP's owner, and the ends of a
//! connection (an attempt that failed, timewait, IBA 12.9.7).

use crate::cep::{Backlog, State};
use crate::event::Event;
use crate::trace::TracePoint;
use crate::types::{CepId, Instant};

use super::CmManager;

impl CmManager {
    /// The one place a CEP changes state.
    pub(super) fn set_state(&mut self, id: CepId, state: State) {
        let to = state.name();
        let Some(c) = self.cep_mut(id) else { return };
        let was = c.state;
        let from = was.name();
        c.state = state;
        let (qpn, owner) = ((c.dest.port, c.local_qpn), c.owned.then_some(c.owner[0]));
        self.waiting.on_state(was, state);
        self.rebind_local_qpn(qpn, owner, was, state);
        self.down.note_state(qpn.0, was, state);
        if state == State::Established && was != State::Established {
            // Established while its port is down (an RTU sent into it): the same deadline
            // as at the port's going down (link.rs). Every caller has cancelled the
            // handshake's timer first.
            self.arm_port_deadline(id);
        }
        // Only for a tracer.
        if !self.trace.installed() {
            return;
        }
        self.trace(TracePoint::State {
            cep: id,
            local_comm_id: self.local_comm_id(id),
            from,
            to,
        });
    }

    pub(super) fn emit(&mut self, id: CepId, event: Event) {
        self.trace(TracePoint::Event {
            cep: id,
            event: &event,
        });
        // A REQ held behind its listen's backlog has not been reported: nobody owns its
        // CEP yet, so nothing it does is anyone's event.
        if self
            .cep_any(id)
            .is_some_and(|c| !c.detached && c.backlog != Backlog::Held)
        {
            self.events.push_back((id, event));
        }
    }

    pub(super) fn forget_peer(&mut self, id: CepId) {
        let Some(c) = self.cep_any(id) else { return };
        let (rid, rqpn, guid) = (c.remote_comm_id, c.remote_qpn, c.remote_ca_guid);
        self.remote_ids.remove_if(&(rid, guid), id, &self.slots);
        self.remote_qpns.remove_if(&(rqpn, guid), id, &self.slots);
    }

    /// CEP `id`'s REQ is answered (or it ended): it counts against its listen's backlog
    /// no more, and a REQ held behind the backlog may be reported (held.rs).
    pub(super) fn leave_backlog(&mut self, id: CepId) {
        let Some(c) = self.cep_mut(id) else { return };
        let Some(listen) = c.backlog_of.take() else {
            return;
        };
        if c.backlog == Backlog::Held {
            // Ended before it was reported (a REJ, a stale connection, its port gone): no
            // owner will ever destroy it, so it is freed as a destroyed CEP is, once it is
            // idle (`end_attempt`, `exit_timewait`, `remove_port`).
            c.detached = true;
            self.unhold(listen, id);
            return;
        }
        if let Some(l) = self.listens.get_mut(listen) {
            l.pending = l.pending.saturating_sub(1);
        }
        self.report_held(listen);
    }

    /// The connection attempt is over without reaching timewait: forget the peer, and
    /// free a detached CEP.
    pub(super) fn end_attempt(&mut self, id: CepId) {
        self.cancel_timer(id);
        self.forget_peer(id);
        self.leave_backlog(id);
        self.set_state(id, State::Idle);
        if self.cep_any(id).is_some_and(|c| c.detached) {
            self.release(id);
        }
    }

    /// Timewait keeps the peer's comm ID and QPN in the lookups until it ends, so a late
    /// duplicate or a QPN reused too early is recognised (WinOF's choice; Linux drops
    /// them on entry and so misses both).
    pub(super) fn enter_timewait(&mut self, now: Instant, id: CepId) {
        self.cancel_timer(id);
        self.leave_backlog(id);
        self.set_state(id, State::Timewait);
        let wait = self
            .cep_any(id)
            .map_or(0, |c| c.timewait_ns(self.alternate_of(c)));
        self.arm(id, now.add_nanos(wait));
    }

    pub(super) fn exit_timewait(&mut self, id: CepId) {
        if let Some(c) = self.cep_mut(id) {
            c.owes_dreq = false;
        }
        self.forget_peer(id);
        self.set_state(id, State::Idle);
        if self.cep_any(id).is_some_and(|c| c.detached) {
            self.release(id);
        } else {
            self.emit(id, Event::TimewaitExit);
        }
    }
}
