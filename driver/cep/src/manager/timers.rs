//! Timers: one heap entry per armed CEP (timer_heap.rs); retries with MRA honoured
//! once and an overall deadline (IBA 12.7.36, 12.6.6); a timer pass is bounded.

use core::num::NonZeroU32;

use ibcm_mad::{AttributeId, MessageKind, RejReason};

use crate::cep::{Cep, LapState, Retry, State};
use crate::counters::Counters;
use crate::event::Event;
use crate::trace::TracePoint;
use crate::types::{CepId, Instant};

use super::timer_heap::{NO_TIMER, TimerEntry};
use super::{CmManager, Slot, TIMER_BATCH};

/// Tells the CEP whose raw handle is `raw` that its heap entry is at `pos`.
fn place_in(slots: &mut crate::grow::ChunkedVec<Slot>, raw: u32, pos: u32) {
    if let Some(c) = slots
        .get_mut(CepId(raw).index())
        .and_then(|s| s.cep.as_mut())
    {
        c.timer_pos = pos;
    }
}

impl CmManager {
    /// Arms CEP `id`'s timer for `at`: its entry moves (O(log n)), or one is added. A
    /// timer moved later keeps its sequence number, so it stays first among timers due at
    /// the same instant that were armed after it.
    pub(super) fn arm(&mut self, id: CepId, at: Instant) {
        let Some(c) = self.cep_mut(id) else { return };
        let pos = c.timer_pos;
        let current = self.timers.get(pos).filter(|e| e.cep == id.0);
        let seq = match current {
            Some(e) if e.at <= at => e.seq,
            _ => {
                // 32 bits wrap: after 2^32 arms, timers due at the same instant may fire
                // in another order than armed; none fires early or late.
                let seq = self.timer_seq;
                self.timer_seq = seq.checked_add(1).unwrap_or(NonZeroU32::MIN);
                seq
            }
        };
        let slots = &mut self.slots;
        let mut place = |raw, pos| place_in(slots, raw, pos);
        if current.is_some() {
            self.timers.update(pos, at, seq, &mut place);
        } else {
            self.timers
                .push(TimerEntry { at, seq, cep: id.0 }, &mut place);
        }
    }

    /// Disarms CEP `id`'s timer: its heap entry goes at once.
    pub(super) fn cancel_timer(&mut self, id: CepId) {
        let Some(c) = self.cep_mut(id) else { return };
        let pos = core::mem::replace(&mut c.timer_pos, NO_TIMER);
        if self.timers.get(pos).is_some_and(|e| e.cep == id.0) {
            let slots = &mut self.slots;
            self.timers
                .remove(pos, &mut |raw, pos| place_in(slots, raw, pos));
        }
    }

    #[inline]
    pub(super) fn cep_any(&self, id: CepId) -> Option<&Cep> {
        self.slot(id)?.cep.as_ref()
    }

    pub(super) fn start_retry(&mut self, id: CepId, now: Instant, base_ns: u64, retries: u8) {
        let deadline = self
            .config
            .request_deadline_ns
            .map_or(Retry::NO_DEADLINE, |d| now.add_nanos(d));
        if let Some(c) = self.cep_mut(id) {
            c.retry = Retry {
                base_ns,
                left: retries,
                done: 0,
                deadline,
            };
        }
        self.arm(id, now.add_nanos(base_ns));
    }

    /// Handles the timers whose deadline is at or before `now`, at most [`TIMER_BATCH`]
    /// of them: a timer DPC holds the lock for a bounded time and sends a bounded batch.
    /// If more are due, [`poll_timeout`](Self::poll_timeout) still answers a deadline at
    /// or before `now`: drain the output and call again (re-arm the timer to fire now).
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut budget = TIMER_BATCH;
        let mut more_due = false;
        while let Some(top) = self.timers.peek() {
            if top.at > now {
                break;
            }
            if budget == 0 {
                more_due = true;
                break;
            }
            budget -= 1;
            let slots = &mut self.slots;
            self.timers
                .remove(0, &mut |raw, pos| place_in(slots, raw, pos));
            place_in(&mut self.slots, top.cep, NO_TIMER);
            self.on_timer(now, CepId(top.cep));
        }
        self.trace(TracePoint::TimerPass {
            handled: (TIMER_BATCH - budget) as u32,
            more_due,
        });
    }

    pub(super) fn on_timer(&mut self, now: Instant, id: CepId) {
        let Some(c) = self.cep_any(id) else { return };
        let state = c.state;
        let retry = c.retry;
        let expired = retry.left == 0 || now >= retry.deadline;
        let lap_sent = matches!(c.lap, LapState::Sent { .. });
        let port_down = self.down.contains(c.dest.port);
        let retried = match state {
            State::ReqSent { .. } => Some(AttributeId::Req),
            State::RepSent { .. } => Some(AttributeId::Rep),
            State::DreqSent => Some(AttributeId::Dreq),
            State::SidrReqSent => Some(AttributeId::SidrReq),
            State::Established if lap_sent => Some(AttributeId::Lap),
            _ => None,
        };
        match state {
            _ if !expired && retried.is_some() => {
                let Some(attr) = retried else { return };
                let done = retry.done.saturating_add(1);
                let wait = if self.config.exponential_backoff {
                    retry.base_ns.saturating_mul(1u64 << done.min(16))
                } else {
                    retry.base_ns
                };
                let at = now.add_nanos(wait).min(retry.deadline);
                if let Some(c) = self.cep_mut(id) {
                    c.retry.left -= 1;
                    c.retry.done = done;
                }
                self.resend(id, attr);
                Counters::bump(&mut self.counters.retries, attr);
                self.trace(TracePoint::Retry {
                    cep: id,
                    attribute: attr,
                    attempt: done,
                });
                self.arm(id, at);
            }
            State::ReqSent { .. } => {
                // IBA 12.9.8.1: the active side gives up and tells the passive side.
                self.send_rej_for(id, RejReason::Timeout, MessageKind::Other);
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::Req,
                    },
                );
                self.end_attempt(id);
            }
            State::RepSent { .. } => {
                self.send_rej_for(id, RejReason::Timeout, MessageKind::Other);
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::Rep,
                    },
                );
                self.enter_timewait(now, id);
            }
            State::DreqSent => {
                if port_down {
                    // Its retries went nowhere: the DREQ is still owed (link.rs).
                    if let Some(c) = self.cep_mut(id) {
                        c.owes_dreq = true;
                    }
                }
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::Dreq,
                    },
                );
                self.enter_timewait(now, id);
            }
            State::Timewait => self.timewait_over(now, id),
            // No LAP in flight: the deadline of a port that went down (link.rs).
            State::Established if !lap_sent => self.port_deadline(now, id),
            State::Established => {
                // The LAP went unanswered: the connection stays up on its current paths.
                if let Some(c) = self.cep_mut(id) {
                    c.lap = LapState::Idle;
                }
                self.drop_path(id, super::alternate::Alt::Pending);
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::Lap,
                    },
                );
                // A LAP in flight when its port went down kept its own timer; the port's
                // deadline, counted from the port's going down, takes over (link.rs).
                self.arm_port_deadline(id);
            }
            State::SidrReqSent => {
                self.emit(
                    id,
                    Event::Timeout {
                        message: AttributeId::SidrReq,
                    },
                );
                self.end_sidr(id);
            }
            State::SidrRepSent => self.end_sidr(id),
            // A REQ still unanswered at half its sender's response timeout (waiting.rs).
            State::ReqRcvd { mra_sent: false } | State::RepPrepared { mra_sent: false } => {
                self.mra_unanswered(now, id);
            }
            _ => {}
        }
    }
}
