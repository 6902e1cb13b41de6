//! ibcm's System-log entries: what an administrator finds in Event Viewer under the source
//! `ibcm` when ibcm leaves a client to WinOF's own CM, skips an HCA, or waits on a client
//! at removal.
//!
//! The driver writes each entry with `IoWriteErrorLogEntry` (`driver/kmdf/event_log.rs`):
//! the packet's `ErrorCode` is a [`Message::code`] of the message table compiled from
//! `ibcm.mc` into `ibcm_driver.sys` (build.rs, Windows), and its insertion strings are
//! [`insertion_strings`]. The ids and texts here are the ones in `ibcm.mc`: the test reads
//! the `.mc` file and compares every field. Which message a situation gets is decided here
//! ([`for_pass_down`]), from the portable reasons of `ibcm-iba-cm` and `ibcm-qp1-hook`.
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use ibcm_iba_cm::PassDown;
use ibcm_qp1_hook::{HcaRoute, NoRoute, NotInstalled};

/// The severity field of an NTSTATUS-style message id (ntstatus.h / winerror.h layout:
/// bits 31-30).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// `STATUS_SEVERITY_INFORMATIONAL` (1).
    Informational = 1,
    /// `STATUS_SEVERITY_WARNING` (2).
    Warning = 2,
    /// `STATUS_SEVERITY_ERROR` (3).
    Error = 3,
}

/// ibcm's facility in the message ids (`ibcm.mc` `FacilityNames`; any value of the 12-bit
/// field with the customer bit set is outside Microsoft's codes).
pub const FACILITY_IBCM: u32 = 0x1CB;
/// The customer bit (bit 29), set by `mc.exe -c`.
pub const CUSTOMER: u32 = 1 << 29;

/// One message of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// The `.mc` `SymbolicName`.
    pub symbol: &'static str,
    /// The `.mc` `MessageId` (the low 16 bits: Event Viewer's "Event ID").
    pub id: u16,
    /// The `.mc` `Severity`.
    pub severity: Severity,
    /// The English text, lines joined by one space; %1 is the driver's name (the I/O
    /// manager's), %2 onwards [`insertion_strings`].
    pub text: &'static str,
    /// How many insertion strings the text uses (%2 .. %(1 + n)).
    pub strings: u16,
}

impl Message {
    /// The 32-bit code: `IO_ERROR_LOG_PACKET::ErrorCode`, and the message table's key.
    pub const fn code(&self) -> u32 {
        ((self.severity as u32) << 30) | CUSTOMER | (FACILITY_IBCM << 16) | self.id as u32
    }
}

/// A CM query passed down because the HCA has no QP1 route (%2 CA GUID, %3 reason).
pub const CM_QUERY_NO_QP1_ROUTE: Message = Message {
    symbol: "IBCM_CM_QUERY_NO_QP1_ROUTE",
    id: 1,
    severity: Severity::Warning,
    text: "ibcm passed a query for the InfiniBand CM interface on HCA %2 down to the access layer's CM: ibcm has no QP1 route on this HCA (%3). WinVerbs and NetworkDirect (ndfltr) connections on this HCA are served by WinOF's own CM, as without ibcm.",
    strings: 2,
};

/// A CM query passed down because the HCA's verbs table is of a layout ibcm does not
/// know, so QP1 steering could not be installed (%2 CA GUID, %3 reason).
pub const CM_QUERY_VERBS_UNKNOWN: Message = Message {
    symbol: "IBCM_CM_QUERY_VERBS_UNKNOWN",
    id: 2,
    severity: Severity::Warning,
    text: "ibcm passed a query for the InfiniBand CM interface on HCA %2 down to the access layer's CM: the HCA's verbs interface is not one ibcm recognises (%3), so ibcm cannot steer QP1 there. WinVerbs and NetworkDirect (ndfltr) connections on this HCA are served by WinOF's own CM, as without ibcm.",
    strings: 2,
};

/// A CM query passed down because AL refused ibcm's CM MAD service registrations
/// (%2 CA GUID, %3 reason).
pub const CM_QUERY_MAD_SERVICE_REFUSED: Message = Message {
    symbol: "IBCM_CM_QUERY_MAD_SERVICE_REFUSED",
    id: 3,
    severity: Severity::Warning,
    text: "ibcm passed a query for the InfiniBand CM interface on HCA %2 down to the access layer's CM: the access layer refused ibcm's CM MAD service on every port (%3). WinVerbs and NetworkDirect (ndfltr) connections on this HCA are served by WinOF's own CM, as without ibcm.",
    strings: 2,
};

/// A CM query passed down for another reason: its version or size, ibcm's CM not made
/// yet, or being removed (%2 CA GUID, %3 reason).
pub const CM_QUERY_PASSED_DOWN: Message = Message {
    symbol: "IBCM_CM_QUERY_PASSED_DOWN",
    id: 4,
    severity: Severity::Informational,
    text: "ibcm passed a query for the InfiniBand CM interface on HCA %2 down to the access layer's CM: %3. The client that asked (WinVerbs or ndfltr) uses WinOF's own CM for its connections on this HCA.",
    strings: 2,
};

/// An HCA ibcm could not bind (%2 CA GUID or "unknown", %3 what failed).
pub const HCA_SKIPPED: Message = Message {
    symbol: "IBCM_HCA_SKIPPED",
    id: 5,
    severity: Severity::Warning,
    text: "ibcm is not serving HCA %2: %3. Every query for the InfiniBand CM interface on this HCA goes down to the access layer's CM: WinVerbs and NetworkDirect (ndfltr) connections on it are served by WinOF's own CM, as without ibcm.",
    strings: 2,
};

/// Removal waits for clients' references to the `iba_cm` interface (%2 the count).
pub const REMOVAL_WAITING: Message = Message {
    symbol: "IBCM_REMOVAL_WAITING",
    id: 6,
    severity: Severity::Warning,
    text: "ibcm is being removed and waits until kernel clients (WinVerbs, ndfltr) release the %2 reference(s) they hold on its CM interface; they release them when they stop on the HCA. Until then the HCA's removal waits: if it does not finish, a client above ibcm on the HCA stack still holds the interface.",
    strings: 1,
};

/// Every message, in id order.
pub const ALL: [Message; 6] = [
    CM_QUERY_NO_QP1_ROUTE,
    CM_QUERY_VERBS_UNKNOWN,
    CM_QUERY_MAD_SERVICE_REFUSED,
    CM_QUERY_PASSED_DOWN,
    HCA_SKIPPED,
    REMOVAL_WAITING,
];

/// The message for a CM query passed down (`why`), given the HCA's route (`route`: the
/// reason recorded for its ports). None for a query that is not the CM interface's
/// (routine: every other interface goes down unlogged).
pub fn for_pass_down(why: PassDown, route: HcaRoute) -> Option<(Message, &'static str)> {
    if !why.is_cm_query() {
        return None;
    }
    Some(match (why, route) {
        (PassDown::NoQp1Route, HcaRoute::None(no_route)) => {
            (for_no_route(no_route), no_route.reason())
        }
        (PassDown::NoQp1Route, _) => (CM_QUERY_NO_QP1_ROUTE, why.reason()),
        _ => (CM_QUERY_PASSED_DOWN, why.reason()),
    })
}

/// Which of the three "no QP1 route" messages a port's reason gets: the verbs table of a
/// layout ibcm does not know (`ibcm_qp1_hook::install` said `UnknownVersion`), the MAD
/// service registrations refused (the ordinary one to AL's CM, then the private one), or
/// any other missing piece of the route.
pub fn for_no_route(no_route: NoRoute) -> Message {
    match no_route {
        NoRoute::TableLeft(NotInstalled::UnknownVersion) => CM_QUERY_VERBS_UNKNOWN,
        NoRoute::PrivateRegistrationFailed => CM_QUERY_MAD_SERVICE_REFUSED,
        NoRoute::NotBound
        | NoRoute::NoHookSlot
        | NoRoute::TableNotSeen
        | NoRoute::TableLeft(NotInstalled::Failed | NotInstalled::NotIbbus)
        | NoRoute::PatchRefused
        | NoRoute::NoQp1Seen
        | NoRoute::PortSetup => CM_QUERY_NO_QP1_ROUTE,
    }
}

/// The largest error log entry a driver may allocate on x64, in bytes: wdm.h
/// `ERROR_LOG_MAXIMUM_SIZE` = `IO_ERROR_LOG_MESSAGE_LENGTH` (min(512, 240 + 104)) minus
/// `IO_ERROR_LOG_MESSAGE_HEADER_LENGTH` (72 - 48 + 80): 240 (WDK 10.0.22621 km/wdm.h,
/// `ERROR_LOG_LIMIT_SIZE` ff.). `IoAllocateErrorLogEntry` takes it as a UCHAR.
pub const ERROR_LOG_MAXIMUM_SIZE: usize = 240;

/// The CA GUID as an administrator reads it elsewhere (vstat, ibstat): 0x and 16 hex
/// digits, from AL's network-order value.
pub fn ca_guid(ca_guid_network_order: u64) -> String {
    alloc::format!("0x{:016x}", u64::from_be(ca_guid_network_order))
}

/// The insertion strings of one entry as the packet carries them: UTF-16, each
/// NUL-terminated, at most `budget` bytes in all. A string that does not fit is cut (its
/// NUL kept) and the ones after it are dropped; with room for no string at all, none.
/// Returns the units and how many strings they hold (`NumberOfStrings`).
pub fn insertion_strings(strings: &[&str], budget: usize) -> (Vec<u16>, u16) {
    let max_units = budget / 2;
    let mut out = Vec::new();
    let mut count = 0u16;
    for s in strings {
        if out.len() + 1 > max_units {
            break;
        }
        let room = max_units - out.len() - 1;
        out.extend(s.encode_utf16().take(room));
        out.push(0);
        count += 1;
    }
    (out, count)
}

#[cfg(test)]
mod tests;
