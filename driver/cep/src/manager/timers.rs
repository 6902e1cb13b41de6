//! Timers: one heap of (deadline, sequence, CEP) for every CEP; retries with MRA honoured
//! once and an overall deadline (IBA 12.7.36, 12.6.6); a timer pass is bounded.

use core::cmp::Reverse;
use core::num::NonZeroU32;

use ibcm_mad::{AttributeId, MessageKind, RejReason};

use crate::cep::{Cep, LapState, Retry, State};
use crate::counters::Counters;
use crate::event::Event;
use crate::trace::TracePoint;
use crate::types::{CepId, Instant};

use super::{CmManager, TIMER_BATCH};

impl CmManager {
    /// Arms CEP `id`'s timer for `at`. A timer moved later keeps its heap entry (due at
    /// or before `at`): when that entry comes up early it moves itself to the deadline
    /// (`handle_timeout`). Only a sooner deadline takes a new entry, the old one left
    /// stale. So a REQ answered before its MRA timer adds no entry: that timer becomes
    /// its REP's retry timer.
    pub(super) fn arm(&mut self, id: CepId, at: Instant) {
        let Some(c) = self.cep_mut(id) else { return };
        if let Some((due, seq)) = c.timer
            && due <= at
        {
            c.timer = Some((at, seq));
            return;
        }
        // 32 bits wrap: a stale entry that outlives 2^32 arms and matches a live timer's
        // number comes up at its own deadline, finds the live one later and moves to it
        // (a second entry for that timer, stale once it fires); it never fires early.
        let seq = self.timer_seq;
        self.timer_seq = seq.checked_add(1).unwrap_or(NonZeroU32::MIN);
        if let Some(c) = self.cep_mut(id) {
            c.timer = Some((at, seq));
            self.timers.push(Reverse((at, seq, id.0)));
        }
    }

    /// The deadline of the timer a heap entry (sequence number `seq`) belongs to, if
    /// the entry is still CEP `id`'s.
    fn entry_due(&self, id: CepId, seq: NonZeroU32) -> Option<Instant> {
        self.cep_any(id)
            .and_then(|c| c.timer)
            .and_then(|(due, s)| (s == seq).then_some(due))
    }

    pub(super) fn cancel_timer(&mut self, id: CepId) {
        if let Some(c) = self.cep_mut(id) {
            c.timer = None;
        }
        self.drop_stale_timers();
    }

    /// Pops cancelled entries off the top so that `poll_timeout` reports a live deadline,
    /// [`TIMER_BATCH`] of them at most: a heap pop at 1e6 entries is a dozen cache misses,
    /// and a mass of cancelled timers under a live one would otherwise be popped in one
    /// go at DISPATCH_LEVEL (a timer pass measured up to 0.9 ms). Past that,
    /// `poll_timeout` may name a cancelled entry's deadline: the timer then fires early,
    /// and that pass (bounded too) pops on.
    pub(super) fn drop_stale_timers(&mut self) {
        for _ in 0..TIMER_BATCH {
            let Some(Reverse((at, seq, raw))) = self.timers.peek().copied() else {
                return;
            };
            match self.entry_due(CepId(raw), seq) {
                Some(due) if due == at => return,
                // Moved later: it goes to its deadline.
                Some(due) if due > at => {
                    self.timers.pop();
                    self.timers.push(Reverse((due, seq, raw)));
                }
                _ => {
                    self.timers.pop();
                }
            }
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
        // Cancelled entries popped on the way count apart (they send and report nothing),
        // bounded alike.
        let mut stale_budget = TIMER_BATCH;
        let mut more_due = false;
        while let Some(Reverse((at, seq, raw))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            if budget == 0 || stale_budget == 0 {
                more_due = true;
                break;
            }
            self.timers.pop();
            let id = CepId(raw);
            let Some(due) = self.entry_due(id, seq).filter(|&due| due >= at) else {
                stale_budget -= 1;
                continue;
            };
            if due > now {
                // Moved later since its entry was pushed: to its deadline (no new entry).
                self.timers.push(Reverse((due, seq, raw)));
                stale_budget -= 1;
                continue;
            }
            budget -= 1;
            if let Some(c) = self.cep_mut(id) {
                c.timer = None;
            }
            self.on_timer(now, id);
        }
        self.drop_stale_timers();
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
                    c.pending_alternate = None;
                }
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
