//! The host platform's trace sink: the engine's and the dispatch layer's trace points go
//! to `tracing` (target `ibcm`), where the CLI's `-v` / `RUST_LOG` and any test
//! subscriber see them. On Windows the same points go to ETW (driver/kmdf/trace.rs).
//!
//! A subscriber formats as it likes, and may allocate doing so: that is the stand-in
//! for ETW's own buffers, not the driver's memory, so it is kept out of the DISPATCH_LEVEL
//! allocation count.

use ibcm_cep::{DropReason, Event, Level, TracePoint, Tracer};
use ibcm_endpoint::{DispatchPoint, DispatchTracer};
use tracing::level_filters::LevelFilter;

/// The sink every host node hands its device (when a subscriber listens).
pub static TRACING: TracingSink = TracingSink;

/// Trace points to `tracing`.
#[derive(Debug)]
pub struct TracingSink;

impl TracingSink {
    /// The sink if any subscriber listens at any level, else `None`: with nobody
    /// listening, a trace point then costs the engine one branch and nothing more.
    pub fn if_listening() -> Option<&'static dyn DispatchTracer> {
        (LevelFilter::current() != LevelFilter::OFF).then_some(&TRACING as &dyn DispatchTracer)
    }
}

fn level_enabled(level: Level) -> bool {
    match level {
        Level::Warn => tracing::enabled!(target: "ibcm", tracing::Level::WARN),
        Level::Info => tracing::enabled!(target: "ibcm", tracing::Level::INFO),
        Level::Debug => tracing::enabled!(target: "ibcm", tracing::Level::DEBUG),
        Level::Trace => tracing::enabled!(target: "ibcm", tracing::Level::TRACE),
    }
}

impl Tracer for TracingSink {
    fn enabled(&self, level: Level) -> bool {
        level_enabled(level)
    }

    fn trace(&self, ca_guid: u64, point: &TracePoint<'_>) {
        crate::counting::opt_out(|| engine_point(ca_guid, point));
    }
}

impl DispatchTracer for TracingSink {
    fn dispatch(&self, point: &DispatchPoint) {
        crate::counting::opt_out(|| dispatch_point(point));
    }
}

fn engine_point(ca: u64, point: &TracePoint<'_>) {
    let ca = format_args!("{ca:016x}");
    match *point {
        TracePoint::State {
            cep,
            local_comm_id,
            from,
            to,
        } => {
            tracing::debug!(target: "ibcm", %ca, cep = cep.to_raw(), comm_id = format_args!("{local_comm_id:#010x}"), ?from, ?to, "state change")
        }
        TracePoint::Send {
            attribute,
            dlid,
            tid,
            rej: Some(reason),
        } => {
            tracing::info!(target: "ibcm", %ca, ?attribute, dlid, tid = format_args!("{tid:#x}"), ?reason, "REJ sent: {reason:?} ({})", u16::from(reason))
        }
        TracePoint::Send {
            attribute,
            dlid,
            tid,
            rej: None,
        } => {
            tracing::trace!(target: "ibcm", %ca, ?attribute, dlid, tid = format_args!("{tid:#x}"), "send")
        }
        TracePoint::Retry {
            cep,
            attribute,
            attempt,
        } => {
            tracing::debug!(target: "ibcm", %ca, cep = cep.to_raw(), ?attribute, attempt, "no answer: {attribute:?} sent again (retry {attempt})")
        }
        TracePoint::Duplicate { attribute } => {
            tracing::debug!(target: "ibcm", %ca, ?attribute, "duplicate received")
        }
        TracePoint::Drop {
            attribute,
            reason: DropReason::Malformed(e),
        } => {
            tracing::warn!(target: "ibcm", %ca, attribute = format_args!("{attribute:#06x}"), error = %e, "malformed MAD dropped: {e}")
        }
        TracePoint::Drop { attribute, reason } => {
            tracing::debug!(target: "ibcm", %ca, attribute = format_args!("{attribute:#06x}"), ?reason, "MAD dropped")
        }
        TracePoint::Event { cep, event } => event_point(ca, cep.to_raw(), event),
        TracePoint::TimerPass { handled, more_due } => {
            tracing::trace!(target: "ibcm", %ca, handled, more_due, "timer pass")
        }
    }
}

/// An event for a CEP's owner; the ones that end a connection say why.
fn event_point(ca: core::fmt::Arguments<'_>, cep: u32, event: &Event) {
    match event {
        Event::Rejected {
            reason, message, ..
        } => {
            tracing::warn!(target: "ibcm", %ca, cep, ?reason, rejected = ?message, "connection failed: the peer rejected the {message:?} with REJ reason {reason:?} ({})", u16::from(*reason))
        }
        Event::Timeout { message } => {
            tracing::warn!(target: "ibcm", %ca, cep, unanswered = ?message, "connection failed: no answer to the {message:?} after its last retry (IBA 12.7.36)")
        }
        Event::DeviceRemoval => tracing::warn!(target: "ibcm", %ca, cep, "port removed"),
        other => tracing::info!(target: "ibcm", %ca, cep, event = event_name(other), "event"),
    }
}

fn event_name(event: &Event) -> &'static str {
    match event {
        Event::ReqReceived(_) => "REQ received",
        Event::RepReceived(_) => "REP received",
        Event::RtuReceived(_) => "RTU received: established",
        Event::MraReceived { .. } => "MRA received",
        Event::Rejected { .. } => "REJ received",
        Event::Timeout { .. } => "timeout",
        Event::DreqReceived(_) => "DREQ received",
        Event::DrepReceived(_) => "DREP received",
        Event::LapReceived { .. } => "LAP received",
        Event::AprReceived { .. } => "APR received",
        Event::SidrReqReceived(_) => "SIDR_REQ received",
        Event::SidrRepReceived(_) => "SIDR_REP received",
        Event::DeviceRemoval => "device removal",
        Event::TimewaitExit => "timewait over",
    }
}

fn dispatch_point(point: &DispatchPoint) {
    match *point {
        DispatchPoint::IoctlFailed { file, code, status } => {
            tracing::debug!(target: "ibcm", file = file.raw(), code = format_args!("{code:#010x}"), status = format_args!("{:#010x}", status as u32), "IOCTL refused")
        }
        DispatchPoint::Cancelled { file } => {
            tracing::debug!(target: "ibcm", file = file.raw(), "request cancelled")
        }
        DispatchPoint::Cleanup { file, endpoints: 0 } => {
            tracing::debug!(target: "ibcm", file = file.raw(), "handle closed")
        }
        DispatchPoint::Cleanup { file, endpoints } => {
            tracing::info!(target: "ibcm", file = file.raw(), endpoints, "handle closed: its endpoints destroyed")
        }
        DispatchPoint::Removed { files } => {
            tracing::warn!(target: "ibcm", files, "device removed")
        }
        DispatchPoint::NoRoom { dropped, queued } => {
            tracing::warn!(target: "ibcm", dropped, queued, "event-record pool short at DISPATCH_LEVEL: {dropped} MADs dropped (0: a timer pass deferred), {queued} records queued unread; growing it at PASSIVE_LEVEL")
        }
    }
}
