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
use core::sync::atomic::{AtomicU64, Ordering};

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

/// The kill switch is on at an HCA's start (%2 the registry value's path).
pub const SWITCHED_OFF: Message = Message {
    symbol: "IBCM_SWITCHED_OFF",
    id: 7,
    severity: Severity::Warning,
    text: "ibcm is switched off (%2 is set): it stays in each HCA's device stack but serves no connection, steers no QP1 traffic and answers no query for the InfiniBand CM interface on any HCA that starts while the value is set. WinVerbs, NetworkDirect (ndfltr) and every other client use WinOF's own CM, as without ibcm. The command ibcm on clears the value and restarts the HCAs.",
    strings: 1,
};

/// Local users' requests refused over their quotas and forged CM messages dropped (%2 and
/// %3 the counts since the last such entry), written at most once a minute.
pub const REFUSED: Message = Message {
    symbol: "IBCM_REFUSED",
    id: 8,
    severity: Severity::Warning,
    text: "ibcm refused %2 request(s) of local users over their quotas and dropped %3 CM message(s) that named a connection from an address it does not use (forged) since its last such entry. ibcm stats shows the totals (quota exceeded, forged); docs/security.md says what each quota bounds and what a forged message could have done.",
    strings: 2,
};

/// An HCA the access layer reports has no ibcm in its device stack, and the host's CM
/// verdict is (or will be) AL's for every HCA (%2 CA GUID).
pub const HCA_WITHOUT_IBCM: Message = Message {
    symbol: "IBCM_HCA_WITHOUT_IBCM",
    id: 9,
    severity: Severity::Warning,
    text: "HCA %2 has no ibcm filter in its device stack: ibcm is not in its UpperFilters (a reinstall of the HCA's driver rewrites that list) or could not attach there. WinVerbs takes one CM for every HCA when it starts, so WinOF's own CM serves WinVerbs and NetworkDirect (ndfltr) connections on every HCA, as without ibcm, until the computer restarts with ibcm in each HCA's stack. ibcm install --check lists the HCAs without ibcm; ibcm install adds it.",
    strings: 1,
};

/// An HCA without ibcm in its device stack arrived after WinVerbs took ibcm's CM for
/// every HCA (%2 CA GUID).
pub const HCA_WITHOUT_IBCM_UNSERVED: Message = Message {
    symbol: "IBCM_HCA_WITHOUT_IBCM_UNSERVED",
    id: 10,
    severity: Severity::Error,
    text: "HCA %2 has no ibcm filter in its device stack (ibcm is not in its UpperFilters, or could not attach there) and arrived after WinVerbs took ibcm's CM for every HCA: WinVerbs keeps that CM until it is restarted, so its connections on this HCA fail until the computer restarts. ibcm install --check lists the HCAs without ibcm; ibcm install adds it.",
    strings: 1,
};

/// Every message, in id order.
pub const ALL: [Message; 10] = [
    CM_QUERY_NO_QP1_ROUTE,
    CM_QUERY_VERBS_UNKNOWN,
    CM_QUERY_MAD_SERVICE_REFUSED,
    CM_QUERY_PASSED_DOWN,
    HCA_SKIPPED,
    REMOVAL_WAITING,
    SWITCHED_OFF,
    REFUSED,
    HCA_WITHOUT_IBCM,
    HCA_WITHOUT_IBCM_UNSERVED,
];

/// Where the kill switch lives, as the administrator types it (`reg query`).
pub const SWITCH_VALUE: &str = r"HKLM\SYSTEM\CurrentControlSet\Services\ibcm\Parameters\Disabled";

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

/// What a cut insertion string ends with: HORIZONTAL ELLIPSIS, so that a reader sees the
/// text goes on (the entry's size is limited, [`ERROR_LOG_MAXIMUM_SIZE`]).
pub const CUT_MARKER: u16 = 0x2026;

/// The insertion strings of one entry as the packet carries them: UTF-16, each
/// NUL-terminated, at most `budget` bytes in all. Every string is kept, so that no `%n` of
/// the message is left unfilled: when they do not all fit, the longest are cut to share the
/// room evenly (the short ones stay whole), each cut one ending with [`CUT_MARKER`]. Only
/// when the budget cannot hold even a marker and a NUL per string are strings dropped (from
/// the end). Returns the units and how many strings they hold (`NumberOfStrings`).
pub fn insertion_strings(strings: &[&str], budget: usize) -> (Vec<u16>, u16) {
    let max_units = budget / 2;
    let lengths: Vec<usize> = strings.iter().map(|s| s.encode_utf16().count()).collect();
    // With less than two units (a marker and a NUL) per string, keep as many as fit so.
    let kept = strings.len().min(max_units / 2);
    let room = max_units - kept;
    // The largest per-string length `cap` with sum(min(len, cap)) <= room (each string
    // shorter than the cap stays whole; a longer one gets exactly `cap` units).
    let total: usize = lengths[..kept].iter().sum();
    let cap = if total <= room {
        usize::MAX
    } else {
        let mut sorted: Vec<usize> = lengths[..kept].to_vec();
        sorted.sort_unstable();
        let mut left = room;
        let mut cap = 0;
        for (i, len) in sorted.iter().enumerate() {
            let share = left / (kept - i);
            if *len <= share {
                left -= len;
            } else {
                cap = share;
                break;
            }
        }
        cap
    };
    let mut out = Vec::with_capacity(max_units.min(total + kept));
    for (s, len) in strings[..kept].iter().zip(&lengths) {
        if *len <= cap {
            out.extend(s.encode_utf16());
        } else {
            out.extend(s.encode_utf16().take(cap.saturating_sub(1)));
            out.push(CUT_MARKER);
        }
        out.push(0);
    }
    (out, kept as u16)
}

/// The entries written this boot, one per HCA, message and reason: a condition that lasts
/// (a CM query passed down at every start and resume, on every port) is written once, and
/// the entries after it are counted instead of written. Lock-free (≤ DISPATCH_LEVEL
/// callers); at most [`Logged::SLOTS`] distinct entries are remembered, and once all are
/// taken every further entry is counted, not written.
pub struct Logged {
    keys: [AtomicU64; Logged::SLOTS],
    suppressed: AtomicU64,
}

impl Logged {
    /// Distinct (HCA, message, reason) entries remembered per boot.
    pub const SLOTS: usize = 64;

    /// Nothing written yet.
    pub const fn new() -> Self {
        Self {
            keys: [const { AtomicU64::new(0) }; Logged::SLOTS],
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether this entry (`ca_guid`, `message`, `reason`) is the first of its kind this
    /// boot, and so is to be written; a repeat is counted in [`Logged::suppressed`].
    pub fn first(&self, ca_guid: u64, message: &Message, reason: &str) -> bool {
        let key = Self::key(ca_guid, message, reason);
        for slot in &self.keys {
            match slot.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(k) if k == key => break,
                Err(_) => continue,
            }
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Entries not written because they repeated one (or the slots were full).
    pub fn suppressed(&self) -> u64 {
        self.suppressed.load(Ordering::Relaxed)
    }

    /// FNV-1a over the three, never 0 (0 marks a free slot).
    fn key(ca_guid: u64, message: &Message, reason: &str) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let bytes = ca_guid
            .to_le_bytes()
            .into_iter()
            .chain(message.id.to_le_bytes())
            .chain(reason.bytes());
        for b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h | 1
    }
}

impl Default for Logged {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
