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
//! The expected wait of a REQ: the REQs ahead of it, plus itself, times the interval
//! between the application's answers, doubled for safety; a ServiceTimeout is a power of
//! two, so the MRA asks for 2x to 4x the estimate, and never more than
//! [`CmConfig::max_request_wait_ns`]: the sender honours one MRA per REQ, and a retry
//! after a short wait finds the MRA again (a duplicate REQ repeats it: Linux
//! `cm_dup_req_handler` re-sends its MRA the same way).
//!
//! - The interval is measured per answer, from when the application could start on that
//!   REQ: the later of its arrival and the previous answer. Idle time does not count, nor
//!   does a REQ the application holds while it answers others (with a busy period
//!   measured from the first unanswered REQ, one REQ held long made every interval look
//!   long). It is smoothed (1/8 per answer, as TCP's SRTT) but never below the last
//!   answer's: a slower application is seen at its next answer, a faster one over a few.
//! - An answer is the application's: its REP, its REJ or its destroy. A REQ its client
//!   cancels (REJ received), or one ended because its peer went stale or its port went
//!   down, says nothing about how fast the application answers.
//! - The REQs ahead of one are those unanswered when it arrived, less the answers since
//!   (its ticket: the answer count at arrival plus the REQs then unanswered), at most
//!   the REQs unanswered now less itself: the first REQ in the queue waits one interval,
//!   the last the whole queue's.
//!
//! Before any answer nothing tells the rate: the MRA then asks for the sender's own
//! retry budget, what it would have waited anyway. Asking too much costs nothing while the
//! server works: the REP ends the wait whenever it is sent, and a lost REP is re-sent by
//! the server's own retries. It costs only when the server stops answering (its peer then
//! waits longer to find out).
//!
//! A wait too long to ask for is refused instead (IBA 12.6.7.2, Table 112 reason 3,
//! "no resources available"): a REQ whose expected wait, the REQs unanswered ahead of it
//! times the answer interval, is past [`CmConfig::max_request_wait_ns`] gets REJ(
//! NoResources) on arrival, before any CEP is taken for it. That interval is one the
//! application has kept: two answers at least, the faster of the smoothed and the last
//! (an MRA that asks too much costs nothing; a refusal costs a connection). Its sender learns at once,
//! within one round trip, that this server is saturated and can try another or later,
//! where a silent drop would cost it its whole retry budget; the REQs already held keep
//! their places. Under a sustained overload the REQs held stay at most the longest wait
//! times the answer rate. A burst that arrives before the first answer is held whole
//! (nothing tells the rate yet; the backlog bounds it), and its MRAs ask for what the
//! rate then shows. Linux drops a REQ past ucma's backlog silently
//! (cm-anchors.md #6) and WinOF's CM holds every one: both leave the sender to find out
//! through its retries.
//!
//! Nothing is allocated: the state is a few counters here, the REQ's arrival and ticket
//! in its CEP, and the CEP's own timer (the timer heap keeps room for two entries per
//! CEP).
//!
//! [`CmConfig::max_request_wait_ns`]: crate::CmConfig::max_request_wait_ns

use ibcm_mad::AttributeId;

use crate::cep::State;
use crate::counters::Counters;
use crate::types::{CepId, Instant};

use super::CmManager;

/// The REQs this manager holds unanswered, and how fast the application answers them.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Waiting {
    /// Passive CEPs in REQ_RCVD or REP prepared (REQs not answered yet).
    unanswered: u32,
    /// The application's answers since the manager started (wrapping, as tickets).
    answers: u32,
    /// When the application answered last.
    last_answer: Instant,
    /// Smoothed interval between answers, ns (0: no answer yet).
    smoothed_ns: u64,
    /// The last answer's interval, ns.
    last_ns: u64,
    /// The application has answered at least once (an interval is known).
    known: bool,
}

/// Whether a CEP in `state` holds a REQ nobody has answered yet.
fn unanswered(state: State) -> bool {
    matches!(state, State::ReqRcvd { .. } | State::RepPrepared { .. })
}

/// An instant in the units of `Cep::req_arrival`: 2^12 ns, wrapping.
fn arrival_units(at: Instant) -> u32 {
    (at.as_nanos() >> 12) as u32
}

/// When a REQ stamped `arrival` arrived, ns (the latest such instant up to `now`).
fn arrived_at(now: Instant, arrival: u32) -> u64 {
    let age = u64::from(arrival_units(now).wrapping_sub(arrival)) << 12;
    now.as_nanos().saturating_sub(age)
}

/// The shortest ServiceTimeout (IB time, 4.096 us x 2^t, IBA 12.6.6 / Table 107) that
/// covers `ns`; 31 at most.
fn service_timeout_for(ns: u64) -> u8 {
    (0..31u8)
        .find(|&t| ibcm_mad::ib_time_ns(t).is_some_and(|v| v >= ns))
        .unwrap_or(31)
}

/// The longest ServiceTimeout that asks for no more than `max_ns` (0 if even 4.096 us
/// is more): the cap of the MRAs this manager sends on its own.
fn service_timeout_within(max_ns: u64) -> u8 {
    (0..=31u8)
        .rev()
        .find(|&t| ibcm_mad::ib_time_ns(t).is_some_and(|v| v <= max_ns))
        .unwrap_or(0)
}

impl Waiting {
    /// A CEP goes from `from` to `to` (`CmManager::set_state`).
    pub(super) fn on_state(&mut self, from: State, to: State) {
        match (unanswered(from), unanswered(to)) {
            (false, true) => self.unanswered = self.unanswered.saturating_add(1),
            (true, false) => self.unanswered = self.unanswered.saturating_sub(1),
            _ => {}
        }
    }

    /// A CEP in `state` is freed without a state change.
    pub(super) fn on_release(&mut self, state: State) {
        if unanswered(state) {
            self.unanswered = self.unanswered.saturating_sub(1);
        }
    }

    /// A REQ just became unanswered (counted already): its ticket.
    fn ticket(&self) -> u32 {
        self.answers.wrapping_add(self.unanswered.saturating_sub(1))
    }

    /// The application answered, at `now`, a REQ that arrived at `arrival`
    /// (`Cep::req_arrival`): one interval, from the later of the two starts.
    fn answered(&mut self, now: Instant, arrival: u32) {
        let start = arrived_at(now, arrival).max(self.last_answer.as_nanos());
        let sample = now.as_nanos().saturating_sub(start);
        self.smoothed_ns = if !self.known {
            sample
        } else {
            // 7/8 old + 1/8 new (TCP's SRTT gain, RFC 6298).
            self.smoothed_ns - self.smoothed_ns / 8 + sample / 8
        };
        self.last_ns = sample;
        self.known = true;
        self.last_answer = now;
        self.answers = self.answers.wrapping_add(1);
    }

    /// The interval between answers, ns; None before the first answer.
    fn answer_interval_ns(&self) -> Option<u64> {
        self.known.then(|| self.smoothed_ns.max(self.last_ns))
    }

    /// The REQs ahead of the one holding `ticket`.
    fn ahead(&self, ticket: u32) -> u32 {
        let ahead = ticket.wrapping_sub(self.answers);
        // Past its place (answers out of order): none ahead.
        let ahead = if ahead > u32::MAX / 2 { 0 } else { ahead };
        ahead.min(self.unanswered.saturating_sub(1))
    }

    /// The wait the REQ holding `ticket`, arrived at `arrival`, can expect at `now`,
    /// doubled for safety (what its MRA asks for), ns; None before the first answer.
    /// The interval is at least the time since the application could have started on
    /// it without answering (a stalled application is seen before its next answer).
    fn expected_wait_ns(&self, now: Instant, ticket: u32, arrival: u32) -> Option<u64> {
        let open = now
            .as_nanos()
            .saturating_sub(arrived_at(now, arrival).max(self.last_answer.as_nanos()));
        self.answer_interval_ns().map(|i| {
            i.max(open)
                .saturating_mul(u64::from(self.ahead(ticket)) + 1)
                .saturating_mul(2)
        })
    }

    /// The interval a refusal rests on, ns: the faster of the smoothed and the last
    /// interval, once the application has answered twice (None before). A refusal fails
    /// its sender's connection where a long MRA costs nothing, so one slow answer does not
    /// refuse: the application's first pays its cold start (a server's first QP and
    /// pages: 565 ms where the next took 7, two TCG guests with 500 REQs at once), and
    /// refusing on it turned away 85 of a burst the next answers cleared in 3 s.
    fn refusal_interval_ns(&self) -> Option<u64> {
        (self.known && self.answers >= 2).then(|| self.smoothed_ns.min(self.last_ns))
    }

    /// Whether a REQ arriving now would wait past `max_ns`: behind every REQ unanswered
    /// now, at the interval the application has kept ([`Self::refusal_interval_ns`]).
    /// Never with nothing unanswered (the application then starts on it at once) and
    /// never before the second answer.
    fn too_long(&self, max_ns: u64) -> bool {
        if self.unanswered == 0 {
            return false;
        }
        self.refusal_interval_ns().is_some_and(|i| {
            i.saturating_mul(u64::from(self.unanswered).saturating_add(1)) > max_ns
        })
    }
}

impl CmManager {
    /// Whether a REQ arriving now would wait longer than this side may ask of its sender
    /// ([`CmConfig::max_request_wait_ns`](crate::CmConfig::max_request_wait_ns)): the
    /// caller refuses it with REJ(NoResources) (IBA Table 112 reason 3).
    pub(super) fn wait_too_long(&self) -> bool {
        self.config
            .max_request_wait_ns
            .is_some_and(|max| self.waiting.too_long(max))
    }

    /// CEP `id` just took a REQ (REQ_RCVD): when it arrived and its place.
    pub(super) fn stamp_arrival(&mut self, now: Instant, id: CepId) {
        let ticket = self.waiting.ticket();
        if let Some(c) = self.cep_mut(id) {
            c.req_arrival = arrival_units(now);
            c.req_ticket = ticket;
        }
    }

    /// CEP `id`'s owner answers its REQ now (REP, REJ or destroy): one interval of the
    /// answer rate. Nothing for a CEP whose REQ is answered already.
    pub(super) fn owner_answers(&mut self, now: Instant, id: CepId) {
        if let Some(c) = self.cep_any(id)
            && !c.active
            && unanswered(c.state)
        {
            let arrival = c.req_arrival;
            self.waiting.answered(now, arrival);
        }
    }

    /// A REQ became CEP `id`'s (REQ_RCVD, from a listen): if its sender would retry
    /// before it is answered, the timer sends an MRA at half its response timeout.
    pub(super) fn await_answer(&mut self, now: Instant, id: CepId) {
        let Some(c) = self.cep_any(id) else { return };
        // RemoteCMResponseTimeout: how long the sender waits for this side's answer.
        let half = ibcm_mad::ib_time_ns(c.remote_cm_response_timeout.min(31)).unwrap_or(0) / 2;
        self.arm(id, now.add_nanos(half));
    }

    /// CEP `id` still holds its REQ unanswered (its timer fired): an MRA asks the sender
    /// to wait for what this manager expects (IBA 12.6.6), at most
    /// [`CmConfig::max_request_wait_ns`](crate::CmConfig::max_request_wait_ns). Sent
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
            .expected_wait_ns(now, c.req_ticket, c.req_arrival)
            .unwrap_or_else(budget)
            .saturating_add(c.round_trip_ns() / 2);
        let cap = self
            .config
            .max_request_wait_ns
            .map_or(31, service_timeout_within);
        let service_timeout = service_timeout_for(wait).min(cap);
        if let Some(c) = self.cep_mut(id) {
            c.mra_service_timeout = service_timeout;
            c.mra_by_manager = true;
        }
        self.resend_counted(id, AttributeId::Mra);
        self.set_state(id, next);
    }

    /// Repeats CEP `id`'s MRA for a duplicate of the REQ it holds (IBA 12.6.6; Linux
    /// `cm_dup_req_handler` -> `cm_send_mra` does the same in MRA_REQ_SENT), counted as
    /// sent.
    pub(super) fn repeat_mra(&mut self, id: CepId) {
        self.resend_counted(id, AttributeId::Mra);
    }

    /// `send_held` without a new cache entry, counted only if it went out (link.rs: not
    /// into a port that is down).
    fn resend_counted(&mut self, id: CepId, attr: AttributeId) {
        self.resend(id, attr);
        if self
            .cep_any(id)
            .is_some_and(|c| !self.down.contains(c.dest.port))
        {
            Counters::bump(&mut self.counters.sent, attr);
        }
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
    fn service_timeout_within_the_cap() {
        // 50 ms: 2^13 x 4.096 us = 33.6 ms fits, 2^14 = 67.1 ms does not.
        assert_eq!(service_timeout_within(50_000_000), 13);
        // The default cap, 4.096 us x 2^24 (68.7 s), is itself a ServiceTimeout.
        assert_eq!(service_timeout_within(4096 << 24), 24);
        assert_eq!(service_timeout_within(0), 0);
        assert_eq!(service_timeout_within(u64::MAX), 31);
    }

    #[test]
    fn expected_wait_follows_the_answer_rate() {
        let mut w = Waiting::default();
        assert_eq!(w.expected_wait_ns(Instant::from_nanos(0), 0, 0), None);
        let t0 = Instant::from_nanos(1 << 30);
        let mut tickets = [0u32; 100];
        for t in &mut tickets {
            w.on_state(State::Idle, State::ReqRcvd { mra_sent: false });
            *t = w.ticket();
        }
        // 10 answered 100 us apart from t0.
        for k in 1..=10u64 {
            w.on_state(
                State::ReqRcvd { mra_sent: false },
                State::RepSent { mra_rcvd: false },
            );
            w.answered(t0.add_nanos(k * 100_000), arrival_units(t0));
        }
        assert_eq!(w.unanswered, 90);
        // Right after: the first left waits one interval, the last all 90, doubled.
        let t = t0.add_nanos(1_000_000);
        let at0 = arrival_units(t0);
        assert_eq!(w.expected_wait_ns(t, tickets[10], at0), Some(200_000));
        assert_eq!(w.expected_wait_ns(t, tickets[99], at0), Some(18_000_000));
        // 1 ms on without an answer: the interval is at least that.
        let t = t0.add_nanos(2_000_000);
        assert_eq!(w.expected_wait_ns(t, tickets[10], at0), Some(2_000_000));
        // An MRA-only change does not count as an answer.
        w.on_state(
            State::ReqRcvd { mra_sent: false },
            State::ReqRcvd { mra_sent: true },
        );
        assert_eq!(w.unanswered, 90);
    }
}
