//! The driver's trace points to ETW, as TraceLogging events of the provider `ibcm`
//! (GUID {40e1e27f-226b-5b77-7497-9f0800391b48}, derived from the name as EventSource
//! does; `tracelog -guid *ibcm` finds it by name). The `tracelogging` crate's kernel mode
//! writes with `EtwWriteTransfer`, which may be called at any IRQL with nonpaged data:
//! every field here is on the stack. `write_event!` checks the sessions' level and
//! keyword before it evaluates a field, so with nobody listening a point costs the
//! engine's branch and one `enabled` load.
//!
//! Keywords: 0x1 connection (state changes, events), 0x2 MADs (sends, retries,
//! duplicates, drops), 0x4 timers, 0x8 dispatch (IOCTLs, cleanup, removal).
//!
//! Windows only (empty elsewhere): CI type-checks it for x86_64-pc-windows-msvc against
//! core and alloc (`.ci/windows-check`), which the KMDF binding itself cannot be.
#![cfg(windows)]
#![no_std]
#![deny(unsafe_code)]
#![warn(missing_docs)]

use core::fmt::{self, Write};

use ibcm_cep::{DropReason, Event, Level, TracePoint, Tracer};
use ibcm_endpoint::{DispatchPoint, DispatchTracer};
use tracelogging as tlg;

tlg::define_provider!(PROVIDER, "ibcm");

/// Registers the provider (EtwRegister), at PASSIVE_LEVEL, once per driver load. A
/// failed registration leaves it disabled: tracing is off, nothing else changes.
///
/// # Safety
///
/// [`unregister`] must be called before the driver image unloads, so that no ETW enable
/// callback can reach unloaded code.
#[allow(unsafe_code)]
pub unsafe fn register() {
    // SAFETY: (E1) the caller unregisters before unload (this function's contract); the
    // provider is a static, registered once.
    unsafe {
        PROVIDER.register();
    }
}

/// Unregisters the provider (EtwUnregister), at PASSIVE_LEVEL; a no-op if it is not
/// registered.
pub fn unregister() {
    PROVIDER.unregister();
}

/// One `IRP_MN_QUERY_INTERFACE` for `GUID_INFINIBAND_INTERFACE_CM` on the HCA `ca_guid`
/// (network order as AL reports it; 0 before IBAL is bound): answered by ibcm, or passed
/// down to ibbus (AL's CM serves the client) for `reason`. Event `CmInterfaceQuery`,
/// keyword 0x8, level Informational when answered, Warning when passed down: the line a
/// user looks for to learn which CM WinVerbs and ndfltr got (docs/windows.md).
pub fn cm_interface_query(ca_guid: u64, version: u16, size: u16, answered: bool, reason: &str) {
    let ca_guid = u64::from_be(ca_guid);
    if answered {
        tlg::write_event!(
            PROVIDER,
            "CmInterfaceQuery",
            level(Informational),
            keyword(0x8),
            u64("CaGuid", &ca_guid),
            u16("Version", &version),
            u16("Size", &size),
            bool8("AnsweredByIbcm", &answered),
            str8("Reason", reason),
        );
    } else {
        tlg::write_event!(
            PROVIDER,
            "CmInterfaceQuery",
            level(Warning),
            keyword(0x8),
            u64("CaGuid", &ca_guid),
            u16("Version", &version),
            u16("Size", &size),
            bool8("AnsweredByIbcm", &answered),
            str8("Reason", reason),
        );
    }
}

/// IOCTLs of local users refused over a quota and CM MADs dropped as forged since the
/// last event (`ibcm_endpoint::Platform::refused`). Event `Refused`, keyword 0x8, level
/// Warning: one per entry point that refused something, where the System log has one a
/// minute.
pub fn refused(quota_exceeded: u64, forged: u64) {
    tlg::write_event!(
        PROVIDER,
        "Refused",
        level(Warning),
        keyword(0x8),
        u64("QuotaExceeded", &quota_exceeded),
        u64("Forged", &forged),
    );
}

/// The QP1 route the HCA `ca_guid` (network order as AL reports it; 0 if IBAL was never
/// bound) got once its ports were bound: ibcm's ordinary CM MAD service, QP1 steering by
/// the verbs hook, or none (AL's CM serves the HCA's clients) for `reason`. Event
/// `Qp1Route`, keyword 0x8, level Informational with a route, Warning without: the line
/// an administrator looks for on a stock WinOF host (docs/windows.md).
pub fn qp1_route(ca_guid: u64, routed: bool, route: &str, reason: &str) {
    let ca_guid = u64::from_be(ca_guid);
    if routed {
        tlg::write_event!(
            PROVIDER,
            "Qp1Route",
            level(Informational),
            keyword(0x8),
            u64("CaGuid", &ca_guid),
            bool8("Routed", &routed),
            str8("Route", route),
            str8("Reason", reason),
        );
    } else {
        tlg::write_event!(
            PROVIDER,
            "Qp1Route",
            level(Warning),
            keyword(0x8),
            u64("CaGuid", &ca_guid),
            bool8("Routed", &routed),
            str8("Route", route),
            str8("Reason", reason),
        );
    }
}

/// The one sink the platform hands every device.
pub static ETW: EtwSink = EtwSink;

/// Trace points to the `ibcm` ETW provider.
pub struct EtwSink;

fn etw_level(level: Level) -> tlg::Level {
    match level {
        Level::Warn => tlg::Level::Warning,
        Level::Info => tlg::Level::Informational,
        Level::Debug | Level::Trace => tlg::Level::Verbose,
    }
}

impl Tracer for EtwSink {
    fn enabled(&self, level: Level) -> bool {
        PROVIDER.enabled(etw_level(level), 0)
    }

    fn trace(&self, ca_guid: u64, point: &TracePoint<'_>) {
        let mut a = Text::new();
        let mut b = Text::new();
        match *point {
            TracePoint::State {
                cep,
                local_comm_id,
                from,
                to,
            } => {
                tlg::write_event!(
                    PROVIDER,
                    "StateChange",
                    level(Verbose),
                    keyword(0x1),
                    u64("CaGuid", &ca_guid),
                    u32("Cep", &cep.to_raw()),
                    u32("LocalCommId", &local_comm_id),
                    str8("From", a.debug(&from)),
                    str8("To", b.debug(&to)),
                );
            }
            TracePoint::Send {
                attribute,
                dlid,
                tid,
                rej: Some(reason),
            } => {
                let code = u16::from(reason);
                tlg::write_event!(
                    PROVIDER,
                    "RejSent",
                    level(Informational),
                    keyword(0x2),
                    u64("CaGuid", &ca_guid),
                    u16("Dlid", &dlid),
                    u64("Tid", &tid),
                    str8("Reason", a.debug(&reason)),
                    u16("ReasonCode", &code),
                    str8("Attribute", b.debug(&attribute)),
                );
            }
            TracePoint::Send {
                attribute,
                dlid,
                tid,
                rej: None,
            } => {
                tlg::write_event!(
                    PROVIDER,
                    "Send",
                    level(Verbose),
                    keyword(0x2),
                    u64("CaGuid", &ca_guid),
                    str8("Attribute", a.debug(&attribute)),
                    u16("Dlid", &dlid),
                    u64("Tid", &tid),
                );
            }
            TracePoint::Retry {
                cep,
                attribute,
                attempt,
            } => {
                tlg::write_event!(
                    PROVIDER,
                    "Retry",
                    level(Verbose),
                    keyword(0x2),
                    u64("CaGuid", &ca_guid),
                    u32("Cep", &cep.to_raw()),
                    str8("Attribute", a.debug(&attribute)),
                    u8("Attempt", &attempt),
                );
            }
            TracePoint::Duplicate { attribute } => {
                tlg::write_event!(
                    PROVIDER,
                    "Duplicate",
                    level(Verbose),
                    keyword(0x2),
                    u64("CaGuid", &ca_guid),
                    str8("Attribute", a.debug(&attribute)),
                );
            }
            TracePoint::Drop {
                attribute,
                reason: DropReason::Malformed(e),
            } => {
                tlg::write_event!(
                    PROVIDER,
                    "MalformedMad",
                    level(Warning),
                    keyword(0x2),
                    u64("CaGuid", &ca_guid),
                    u16("Attribute", &attribute),
                    str8("Error", a.display(&e)),
                );
            }
            TracePoint::Drop { attribute, reason } => {
                tlg::write_event!(
                    PROVIDER,
                    "Drop",
                    level(Verbose),
                    keyword(0x2),
                    u64("CaGuid", &ca_guid),
                    u16("Attribute", &attribute),
                    str8("Reason", a.debug(&reason)),
                );
            }
            TracePoint::Event { cep, event } => event_point(ca_guid, cep.to_raw(), event),
            TracePoint::TimerPass { handled, more_due } => {
                tlg::write_event!(
                    PROVIDER,
                    "TimerPass",
                    level(Verbose),
                    keyword(0x4),
                    u64("CaGuid", &ca_guid),
                    u32("Handled", &handled),
                    bool8("MoreDue", &more_due),
                );
            }
        }
    }
}

/// An event for a CEP's owner; a connection's failure names its reason.
fn event_point(ca_guid: u64, cep: u32, event: &Event) {
    let mut a = Text::new();
    let mut b = Text::new();
    match event {
        Event::Rejected {
            reason, message, ..
        } => {
            let code = u16::from(*reason);
            tlg::write_event!(
                PROVIDER,
                "ConnectionRejected",
                level(Warning),
                keyword(0x1),
                u64("CaGuid", &ca_guid),
                u32("Cep", &cep),
                str8("Reason", a.debug(reason)),
                u16("ReasonCode", &code),
                str8("Rejected", b.debug(message)),
            );
        }
        Event::Timeout { message } => {
            tlg::write_event!(
                PROVIDER,
                "ConnectionTimeout",
                level(Warning),
                keyword(0x1),
                u64("CaGuid", &ca_guid),
                u32("Cep", &cep),
                str8("Unanswered", a.debug(message)),
            );
        }
        other => {
            tlg::write_event!(
                PROVIDER,
                "Event",
                level(Informational),
                keyword(0x1),
                u64("CaGuid", &ca_guid),
                u32("Cep", &cep),
                str8("Event", a.variant(other)),
            );
        }
    }
}

impl DispatchTracer for EtwSink {
    fn dispatch(&self, point: &DispatchPoint) {
        match *point {
            DispatchPoint::IoctlFailed { file, code, status } => {
                tlg::write_event!(
                    PROVIDER,
                    "IoctlFailed",
                    level(Verbose),
                    keyword(0x8),
                    u64("File", &file.raw()),
                    u32("Code", &code),
                    i32("Status", &status),
                );
            }
            DispatchPoint::Cancelled { file } => {
                tlg::write_event!(
                    PROVIDER,
                    "Cancelled",
                    level(Verbose),
                    keyword(0x8),
                    u64("File", &file.raw()),
                );
            }
            DispatchPoint::Cleanup { file, endpoints } => {
                tlg::write_event!(
                    PROVIDER,
                    "Cleanup",
                    level(Informational),
                    keyword(0x8),
                    u64("File", &file.raw()),
                    u32("Endpoints", &endpoints),
                );
            }
            DispatchPoint::Removed { files } => {
                tlg::write_event!(
                    PROVIDER,
                    "DeviceRemoved",
                    level(Warning),
                    keyword(0x8),
                    u32("Files", &files),
                );
            }
            DispatchPoint::NoRoom { dropped, queued } => {
                tlg::write_event!(
                    PROVIDER,
                    "EventPoolShort",
                    level(Warning),
                    keyword(0x8),
                    u32("MadsDropped", &dropped),
                    u32("RecordsQueued", &queued),
                );
            }
        }
    }
}

/// A value's name formatted on the stack (nothing is allocated at DISPATCH_LEVEL);
/// longer text is cut.
struct Text {
    buf: [u8; 96],
    len: usize,
}

impl Text {
    fn new() -> Self {
        Self {
            buf: [0; 96],
            len: 0,
        }
    }

    fn debug(&mut self, v: &dyn fmt::Debug) -> &str {
        self.len = 0;
        let _ = write!(self, "{v:?}");
        self.as_str()
    }

    fn display(&mut self, v: &dyn fmt::Display) -> &str {
        self.len = 0;
        let _ = write!(self, "{v}");
        self.as_str()
    }

    /// An event's variant name: its `Debug` text up to the first `(` or ` `.
    fn variant(&mut self, v: &dyn fmt::Debug) -> &str {
        let full = self.debug(v);
        let end = full.find(['(', ' ']).unwrap_or(full.len());
        full.get(..end).unwrap_or(full)
    }

    fn as_str(&self) -> &str {
        let bytes = self.buf.get(..self.len).unwrap_or(&[]);
        match core::str::from_utf8(bytes) {
            Ok(s) => s,
            // Cut inside a character: keep what is whole.
            Err(e) => {
                core::str::from_utf8(bytes.get(..e.valid_up_to()).unwrap_or(&[])).unwrap_or("")
            }
        }
    }
}

impl Write for Text {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - self.len;
        let n = s.len().min(room);
        if let (Some(dst), Some(src)) = (
            self.buf.get_mut(self.len..self.len + n),
            s.as_bytes().get(..n),
        ) {
            dst.copy_from_slice(src);
            self.len += n;
        }
        if n < s.len() { Err(fmt::Error) } else { Ok(()) }
    }
}
