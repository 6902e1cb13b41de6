//! REQs the application has not answered yet, and the MRA that keeps their senders
//! waiting instead of retrying (IBA 12.6.6).
//!
//! A REQ's sender re-sends it when no REP, REJ or MRA came within RemoteCMResponseTimeout
//! plus twice the packet life time (IBA 12.7.36). When a server's application takes
//! requests more slowly than they come (every client of a restarted server reconnects at
//! once), each waiting REQ would be re-sent every response timeout until it is answered,
//! and fail once MaxCMRetries are spent. Instead, a REQ still unanswered at half its
//! sender's response timeout gets an MRA whose ServiceTimeout covers the wait this
//! manager expects: the sender then waits that long (plus a packet life time) before its
//! next retry, and the REP normally comes well before.
//!
//! The senders honour it: Linux `cm_mra_handler` (drivers/infiniband/core/cm.c) in
//! REQ_SENT modifies the outstanding REQ's timeout to ServiceTimeout + the path's timeout
//! (`ib_modify_mad`), once per REQ (cm-anchors.md, "MRA"); WinOF `__mra_handler`
//! (core/al/kernel/al_cm_cep.c:1375-1379) delays the send by ServiceTimeout +
//! 2 x packet life time (`ib_delay_mad`); this engine's `on_mra` (establish.rs) waits
//! ServiceTimeout + packet life time, once. Linux's rdma_cm arms an MRA for every REQ it
//! hands up (`CMA_CM_MRA_SETTING`, IB_CM_MRA_FLAG_DELAY | 24: 68.7 s, sent when a
//! duplicate REQ shows that the sender retried); here the MRA leaves before the sender
//! retries, and asks for the wait expected rather than a fixed minute.
//!
//! The expected wait: the REQs unanswered now, times the interval between answers over
//! the current busy period (since the unanswered count last rose from 0), doubled for
//! safety; a ServiceTimeout is a power of two, so the MRA asks for 2x to 4x the
//! estimate. Before the period's first answer nothing tells the rate: the MRA then asks
//! for the sender's own retry budget, what it would have waited anyway. Asking too much costs nothing while the server works: the REP ends the wait
//! whenever it is sent, and a lost REP is re-sent by the server's own retries. It costs
//! only when the server stops answering (its peer then waits longer to find out).
//!
//! A wait too long to ask for is refused instead (IBA 12.6.7.2, Table 112 reason 3,
//! "no resources available"): a REQ whose expected wait, the REQs unanswered ahead of it
//! times the answer interval, is past [`CmConfig::max_request_wait_ns`] gets REJ(
//! NoResources) on arrival, before any CEP is taken for it. Its sender learns at once,
//! within one round trip, that this server is saturated and can try another or later,
//! where a silent drop would cost it its whole retry budget; the REQs already held keep
//! their places. Under a sustained overload the REQs held stay at most the longest wait
//! times the answer rate. A burst that arrives before the busy period's first answer is
//! held whole (nothing tells the rate yet; the backlog bounds it), and its MRAs ask for
//! what the rate then shows. Linux drops a REQ past ucma's backlog silently
//! (cm-anchors.md #6) and WinOF's CM holds every one: both leave the sender to find out
//! through its retries.
//!
//! Nothing is allocated: the state is three counters and the CEP's own timer (the timer
//! heap keeps room for two entries per CEP).
//!
//! [`CmConfig::max_request_wait_ns`]: crate::CmConfig::max_request_wait_ns

use ibcm_mad::AttributeId;

use crate::cep::State;
use crate::counters::Counters;
use crate::types::{CepId, Instant};

use super::CmManager;

/// The REQs this manager holds unanswered, and how fast they are answered.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Waiting {
    /// Passive CEPs in REQ_RCVD or REP prepared (REQs not answered yet).
    unanswered: u32,
    /// Answers given (REQs that left those states) since the manager started.
    answers: u64,
    /// Start of the current busy period (`unanswered` > 0), and `answers` then.
    busy_since: Instant,
    answers_then: u64,
}

/// Whether a CEP in `state` holds a REQ nobody has answered yet.
fn unanswered(state: State) -> bool {
    matches!(state, State::ReqRcvd { .. } | State::RepPrepared { .. })
}

/// The shortest ServiceTimeout (IB time, 4.096 us x 2^t, IBA 12.6.6 / Table 107) that
/// covers `ns`; 31 at most.
fn service_timeout_for(ns: u64) -> u8 {
    (0..31u8)
        .find(|&t| ibcm_mad::ib_time_ns(t).is_some_and(|v| v >= ns))
        .unwrap_or(31)
}

impl Waiting {
    /// A CEP goes from `from` to `to` (`CmManager::set_state`).
    pub(super) fn on_state(&mut self, from: State, to: State) {
        match (unanswered(from), unanswered(to)) {
            (false, true) => self.unanswered = self.unanswered.saturating_add(1),
            (true, false) => {
                self.unanswered = self.unanswered.saturating_sub(1);
                self.answers = self.answers.wrapping_add(1);
            }
            _ => {}
        }
    }

    /// A CEP in `state` is freed without a state change.
    pub(super) fn on_release(&mut self, state: State) {
        if unanswered(state) {
            self.unanswered = self.unanswered.saturating_sub(1);
            self.answers = self.answers.wrapping_add(1);
        }
    }

    /// The interval between answers over the current busy period, ns; None before its
    /// first answer (nothing tells the rate yet).
    fn answer_interval_ns(&self, now: Instant) -> Option<u64> {
        let busy = now.as_nanos().saturating_sub(self.busy_since.as_nanos());
        let answered = self.answers.wrapping_sub(self.answers_then);
        (answered != 0).then(|| busy / answered)
    }

    /// The wait a REQ unanswered now can expect, doubled for safety (what its MRA asks
    /// for), ns; None before the first answer of the busy period.
    fn expected_wait_ns(&self, now: Instant) -> Option<u64> {
        self.answer_interval_ns(now).map(|i| {
            i.saturating_mul(u64::from(self.unanswered.max(1)))
                .saturating_mul(2)
        })
    }

    /// Whether a REQ arriving now would wait past `max_ns`: behind every REQ unanswered
    /// now, at the busy period's answer interval. Never before the period's first answer,
    /// and never with nothing unanswered: the REQ then starts a busy period of its own,
    /// and the last one's interval (idle time included) says nothing about it.
    fn too_long(&self, now: Instant, max_ns: u64) -> bool {
        if self.unanswered == 0 {
            return false;
        }
        self.answer_interval_ns(now).is_some_and(|i| {
            i.saturating_mul(u64::from(self.unanswered).saturating_add(1)) > max_ns
        })
    }
}

impl CmManager {
    /// Whether a REQ arriving now would wait longer than this side may ask of its sender
    /// ([`CmConfig::max_request_wait_ns`](crate::CmConfig::max_request_wait_ns)): the
    /// caller refuses it with REJ(NoResources) (IBA Table 112 reason 3).
    pub(super) fn wait_too_long(&self, now: Instant) -> bool {
        self.config
            .max_request_wait_ns
            .is_some_and(|max| self.waiting.too_long(now, max))
    }

    /// A REQ became CEP `id`'s (REQ_RCVD, from a listen): if its sender would retry
    /// before it is answered, the timer sends an MRA at half its response timeout.
    pub(super) fn await_answer(&mut self, now: Instant, id: CepId) {
        if self.waiting.unanswered <= 1 {
            self.waiting.busy_since = now;
            self.waiting.answers_then = self.waiting.answers;
        }
        let Some(c) = self.cep_any(id) else { return };
        // RemoteCMResponseTimeout: how long the sender waits for this side's answer.
        let half = ibcm_mad::ib_time_ns(c.remote_cm_response_timeout.min(31)).unwrap_or(0) / 2;
        self.arm(id, now.add_nanos(half));
    }

    /// CEP `id` still holds its REQ unanswered (its timer fired, or its sender retried):
    /// an MRA asks the sender to wait for what this manager expects (IBA 12.6.6). Sent
    /// once; a duplicate REQ after it repeats it (`on_req`).
    pub(super) fn mra_unanswered(&mut self, now: Instant, id: CepId) {
        let next = match self.cep_any(id).map(|c| c.state) {
            Some(State::ReqRcvd { mra_sent: false }) => State::ReqRcvd { mra_sent: true },
            Some(State::RepPrepared { mra_sent: false }) => State::RepPrepared { mra_sent: true },
            _ => return,
        };
        let Some(c) = self.cep_any(id) else { return };
        // With no answer yet to tell the rate, ask for what the sender would have waited
        // through all its retries anyway: (RemoteCMResponseTimeout + 2 x packet life
        // time) x (MaxCMRetries + 1) (IBA 12.7.36).
        let budget = || {
            ibcm_mad::ib_time_ns(c.remote_cm_response_timeout.min(31))
                .unwrap_or(0)
                .saturating_add(c.round_trip_ns())
                .saturating_mul(u64::from(c.max_cm_retries) + 1)
        };
        // The sender waits ServiceTimeout + a packet life time; the REP needs one more.
        let wait = self
            .waiting
            .expected_wait_ns(now)
            .unwrap_or_else(budget)
            .saturating_add(c.round_trip_ns() / 2);
        let service_timeout = service_timeout_for(wait);
        if let Some(c) = self.cep_mut(id) {
            c.mra_service_timeout = service_timeout;
            c.mra_by_manager = true;
        }
        // `send_held` without a new cache entry: counted only if it went out (link.rs).
        self.resend(id, AttributeId::Mra);
        if self
            .cep_any(id)
            .is_some_and(|c| !self.down.contains(c.dest.port))
        {
            Counters::bump(&mut self.counters.sent, AttributeId::Mra);
        }
        self.set_state(id, next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_timeout_covers_the_wait() {
        // 4.096 us x 2^t (IBA 12.6.6): 0 ns -> 0, 4.096 us -> 0, 4.097 us -> 1.
        assert_eq!(service_timeout_for(0), 0);
        assert_eq!(service_timeout_for(4096), 0);
        assert_eq!(service_timeout_for(4097), 1);
        // 5 s needs 2^21 x 4.096 us = 8.59 s (2^20 is 4.29 s).
        assert_eq!(service_timeout_for(5_000_000_000), 21);
        assert_eq!(service_timeout_for(u64::MAX), 31);
    }

    #[test]
    fn expected_wait_follows_the_answer_rate() {
        let mut w = Waiting::default();
        assert_eq!(w.expected_wait_ns(Instant::from_nanos(1_000_000)), None);
        for _ in 0..100 {
            w.on_state(State::Idle, State::ReqRcvd { mra_sent: false });
        }
        // 10 answered in 1 ms: 100 us apart; 90 left -> 9 ms, doubled.
        for _ in 0..10 {
            w.on_state(
                State::ReqRcvd { mra_sent: false },
                State::RepSent { mra_rcvd: false },
            );
        }
        assert_eq!(w.unanswered, 90);
        assert_eq!(
            w.expected_wait_ns(Instant::from_nanos(1_000_000)),
            Some(18_000_000)
        );
        // An MRA-only change does not count as an answer.
        w.on_state(
            State::ReqRcvd { mra_sent: false },
            State::ReqRcvd { mra_sent: true },
        );
        assert_eq!(w.unanswered, 90);
    }
}
