//! Trace points: what the manager did and why, for an administrator or a developer
//! looking at a connection that failed. The owner installs a [`Tracer`]
//! ([`CmManager::set_tracer`](crate::CmManager::set_tracer)); without one, a trace point
//! costs one branch. The host platform forwards them to `tracing`, the KMDF binding to
//! ETW (TraceLogging). A tracer is called under the manager's lock, at DISPATCH_LEVEL in
//! the kernel: it must not block or allocate.

use ibcm_mad::{AttributeId, RejReason};

use crate::cep::StateName;
use crate::event::Event;
use crate::types::CepId;

/// How much a trace point matters: the levels of `tracing` and of ETW (`TRACE_LEVEL_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// A connection failed or the peer broke the protocol.
    Warn,
    /// A connection's milestones.
    Info,
    /// Each state change, retry and drop.
    Debug,
    /// Each MAD sent and each timer pass.
    Trace,
}

/// Why a received MAD changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// It did not parse (IBA 13.4 header or a ch. 12 length field); the codec's error.
    Malformed(ibcm_mad::Error),
    /// It names no CEP of this manager, or one in a state that does not take it.
    Unmatched,
    /// A listen's backlog is full (or no CEP could be had): silent, so the peer retries.
    BacklogFull,
    /// It names a connection by its comm ID but comes from an address the connection
    /// does not use (src/manager/source.rs).
    Forged,
}

/// One trace point.
#[derive(Debug, Clone, Copy)]
pub enum TracePoint<'a> {
    /// A CEP changed state (IBA 12.9.6, Figure 154).
    State {
        /// The CEP.
        cep: CepId,
        /// Its comm ID on the wire.
        local_comm_id: u32,
        /// The state it left.
        from: StateName,
        /// The state it entered.
        to: StateName,
    },
    /// A MAD was queued to send.
    Send {
        /// The message.
        attribute: AttributeId,
        /// The destination LID.
        dlid: u16,
        /// Its transaction ID.
        tid: u64,
        /// For a REJ, its reason.
        rej: Option<RejReason>,
    },
    /// A request went unanswered for its timeout and is sent again (IBA 12.7.36).
    Retry {
        /// The CEP.
        cep: CepId,
        /// The message resent.
        attribute: AttributeId,
        /// Which retry this is (1 for the first).
        attempt: u8,
    },
    /// A received MAD repeated one already handled: the cached answer goes again, or
    /// nothing does.
    Duplicate {
        /// The message.
        attribute: AttributeId,
    },
    /// A received MAD was dropped.
    Drop {
        /// The message (its attribute ID as received).
        attribute: u16,
        /// Why.
        reason: DropReason,
    },
    /// An event for the CEP's owner: a REJ received (with its reason), a timeout after
    /// the last retry, a REQ reaching a listen, ...
    Event {
        /// The CEP.
        cep: CepId,
        /// The event.
        event: &'a Event,
    },
    /// A timer pass ended.
    TimerPass {
        /// Timers handled in this pass.
        handled: u32,
        /// More were due than one pass handles (`TIMER_BATCH`): the owner calls again.
        more_due: bool,
    },
}

impl TracePoint<'_> {
    /// The point's level.
    pub fn level(&self) -> Level {
        match self {
            Self::Event {
                event: Event::Rejected { .. } | Event::Timeout { .. },
                ..
            } => Level::Warn,
            Self::Drop {
                reason: DropReason::Malformed(_),
                ..
            } => Level::Warn,
            Self::Event { .. } => Level::Info,
            Self::Send { rej: Some(_), .. } => Level::Info,
            Self::State { .. }
            | Self::Retry { .. }
            | Self::Duplicate { .. }
            | Self::Drop { .. } => Level::Debug,
            Self::Send { .. } | Self::TimerPass { .. } => Level::Trace,
        }
    }
}

/// Where trace points go. Implemented by the platform on a `static`.
pub trait Tracer: Sync {
    /// Whether points of `level` are wanted now (an atomic load; checked before a point
    /// is built).
    fn enabled(&self, level: Level) -> bool;
    /// Records one point of the manager of CA `ca_guid`.
    fn trace(&self, ca_guid: u64, point: &TracePoint<'_>);
}

/// The manager's tracer, if one is installed.
#[derive(Clone, Copy, Default)]
pub(crate) struct TraceHook(Option<&'static dyn Tracer>);

impl TraceHook {
    pub(crate) fn new(tracer: Option<&'static dyn Tracer>) -> Self {
        Self(tracer)
    }

    /// Whether a tracer is installed (to skip building a point's costlier fields).
    #[inline]
    pub(crate) fn installed(self) -> bool {
        self.0.is_some()
    }

    /// Records `point` if a tracer wants its level.
    #[inline]
    pub(crate) fn point(self, ca_guid: u64, point: TracePoint<'_>) {
        if let Some(t) = self.0
            && t.enabled(point.level())
        {
            t.trace(ca_guid, &point);
        }
    }
}

impl core::fmt::Debug for TraceHook {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(if self.0.is_some() {
            "TraceHook(installed)"
        } else {
            "TraceHook(none)"
        })
    }
}
