//! System-log entries (event source `ibcm`, registered by `inf/ibcm.inx` with
//! ibcm_driver.sys's message table): one function per situation an administrator must
//! see, each written with `IoAllocateErrorLogEntry` / `IoWriteErrorLogEntry` (≤
//! DISPATCH_LEVEL). Which message and which words are `ibcm_eventlog`'s (portable, checked
//! against `driver/eventlog/ibcm.mc`); this file fills the packet. ETW and DbgPrint keep
//! their own lines at the call sites.
//!
//! The packet's object is the driver object (saved by [`init`]): the I/O manager inserts
//! the driver's name as %1; the insertion strings are %2 onwards.
//!
//! A condition that lasts is written once per boot, per HCA and reason
//! ([`ibcm_eventlog::Logged`]): a CM query passed down comes at every start and resume of
//! every client; the repeats are counted (DbgPrint and ETW keep a line for each).

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use ibcm_eventlog::{ERROR_LOG_MAXIMUM_SIZE, Logged, Message};
use ibcm_iba_cm::PassDown;
use ibcm_qp1_hook::HcaRoute;
use wdk_sys::ntddk::{IoAllocateErrorLogEntry, IoWriteErrorLogEntry};
use wdk_sys::{IO_ERROR_LOG_PACKET, NTSTATUS, PDRIVER_OBJECT, STATUS_SUCCESS};

/// The driver object, for the entries' `IoObject` (set once in DriverEntry; it outlives
/// every caller).
static DRIVER: AtomicPtr<core::ffi::c_void> = AtomicPtr::new(core::ptr::null_mut());

/// The entries written since the driver loaded (a boot-start driver loads once per boot).
static LOGGED: Logged = Logged::new();

/// Remembers the driver object (DriverEntry).
pub fn init(driver: PDRIVER_OBJECT) {
    DRIVER.store(driver.cast(), Ordering::Release);
}

/// A query for `GUID_INFINIBAND_INTERFACE_CM` passed down to AL's CM on the HCA
/// `ca_guid` (network order) because of `why`; `route` is the HCA's route, whose reason
/// picks the message (no QP1 route, a verbs table ibcm does not recognise, the MAD
/// service registrations refused). Nothing for other interfaces.
pub fn cm_query_passed_down(ca_guid: u64, why: PassDown, route: HcaRoute) {
    if let Some((message, reason)) = ibcm_eventlog::for_pass_down(why, route)
        && LOGGED.first(ca_guid, &message, reason)
    {
        write(
            &message,
            &[&ibcm_eventlog::ca_guid(ca_guid), reason],
            STATUS_SUCCESS,
        );
    }
}

/// The HCA `ca_guid` (network order; 0 before IBAL named it) is not served: `what` could
/// not be done, with `status` (the packet's FinalStatus).
pub fn hca_skipped(ca_guid: u64, what: &str, status: NTSTATUS) {
    let hca = if ca_guid == 0 {
        alloc::string::String::from("(not yet known)")
    } else {
        ibcm_eventlog::ca_guid(ca_guid)
    };
    if LOGGED.first(ca_guid, &ibcm_eventlog::HCA_SKIPPED, what) {
        write(&ibcm_eventlog::HCA_SKIPPED, &[&hca, what], status);
    }
}

/// Every CA the host now knows to have no ibcm in its device stack, once each per boot
/// (`ibcm_lifecycle::HostCm`, then [`LOGGED`]): which message depends on whether WinVerbs already took
/// ibcm's CM (then the CA's WinVerbs connections fail) or AL's serves every HCA.
pub fn hcas_without_ibcm(host: &crate::host::Host) {
    while let Some((ca_guid, verdict)) =
        host.verdict(|v| v.next_without_ibcm().map(|ca| (ca, v.verdict())))
    {
        let message = if verdict == Some(true) {
            &ibcm_eventlog::HCA_WITHOUT_IBCM_UNSERVED
        } else {
            &ibcm_eventlog::HCA_WITHOUT_IBCM
        };
        let hca = ibcm_eventlog::ca_guid(ca_guid);
        wdk::println!("ibcm: CA {hca} has no ibcm in its device stack");
        // Named again after a sleep (the CA left the table with the reports): one entry.
        if LOGGED.first(ca_guid, message, "") {
            write(message, &[&hca], STATUS_SUCCESS);
        }
    }
}

/// The kill switch was found on at an HCA's start (once per boot).
pub fn switched_off() {
    let message = &ibcm_eventlog::SWITCHED_OFF;
    if LOGGED.first(0, message, "") {
        write(message, &[ibcm_eventlog::SWITCH_VALUE], STATUS_SUCCESS);
    }
}

/// Removal is about to wait for `references` client references to the `iba_cm`
/// interface; nothing when there are none.
pub fn removal_waiting(references: usize) {
    if references > 0 {
        let count = alloc::format!("{references}");
        write(&ibcm_eventlog::REMOVAL_WAITING, &[&count], STATUS_SUCCESS);
    }
}

/// The System log's share of [`refused`]: counts not written yet, and when (interrupt time,
/// 100 ns; 0: never) the last entry was.
static REFUSED_QUOTA: AtomicU64 = AtomicU64::new(0);
static REFUSED_FORGED: AtomicU64 = AtomicU64::new(0);
static REFUSED_LAST: AtomicU64 = AtomicU64::new(0);
/// At most one `IBCM_REFUSED` entry a minute, in 100 ns units: a flood of refusals (a
/// user looping over a quota, a node spraying forged REJs) must not flood the log.
const REFUSED_PERIOD_100NS: u64 = 60 * 10_000_000;

/// Local users' requests refused over a quota and forged MADs dropped (any IRQL up to
/// DISPATCH_LEVEL, no lock held): counted, and written as one entry with the counts since
/// the last when a minute has passed since it (the first at once). Nothing is allocated.
pub fn refused(refused: ibcm_endpoint::Refused, now_100ns: u64) {
    REFUSED_QUOTA.fetch_add(refused.quota_exceeded, Ordering::AcqRel);
    REFUSED_FORGED.fetch_add(refused.forged, Ordering::AcqRel);
    let last = REFUSED_LAST.load(Ordering::Acquire);
    if last != 0 && now_100ns.saturating_sub(last) < REFUSED_PERIOD_100NS {
        return;
    }
    // One writer per period: the one that moves the mark.
    if REFUSED_LAST
        .compare_exchange(last, now_100ns.max(1), Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let (quota, forged) = (
        REFUSED_QUOTA.swap(0, Ordering::AcqRel),
        REFUSED_FORGED.swap(0, Ordering::AcqRel),
    );
    let (mut q, mut f) = (itoa::Buffer::new(), itoa::Buffer::new());
    write(
        &ibcm_eventlog::REFUSED,
        &[q.format(quota), f.format(forged)],
        STATUS_SUCCESS,
    );
}

/// One entry: `message`'s code, `strings` as its insertion strings (cut to the entry's
/// maximum size), `status` as FinalStatus. Dropped silently without a driver object or
/// when the I/O manager has no entry to give (it limits the log's memory).
fn write(message: &Message, strings: &[&str], status: NTSTATUS) {
    let driver = DRIVER.load(Ordering::Acquire);
    if driver.is_null() {
        return;
    }
    // Strings right after the fixed part (no dump data), as wdm.h's FIELD_OFFSET usage.
    let header = core::mem::offset_of!(IO_ERROR_LOG_PACKET, DumpData);
    let (units, count) = ibcm_eventlog::insertion_strings(strings, ERROR_LOG_MAXIMUM_SIZE - header);
    let size = (header + units.len() * 2).max(core::mem::size_of::<IO_ERROR_LOG_PACKET>());
    let Ok(entry_size) = u8::try_from(size) else {
        return;
    };
    // SAFETY: (E1) ≤ DISPATCH_LEVEL; the driver object lives as long as the driver; the
    // size is at most ERROR_LOG_MAXIMUM_SIZE (240) and at least the packet's.
    let entry = unsafe { IoAllocateErrorLogEntry(driver, entry_size) };
    if entry.is_null() {
        return;
    }
    // SAFETY: (E2) IO_ERROR_LOG_PACKET is integers and a LARGE_INTEGER union: all-zero is
    // a valid value (and the fields not set below must be zero).
    let mut packet: IO_ERROR_LOG_PACKET = unsafe { core::mem::zeroed() };
    packet.NumberOfStrings = count;
    packet.StringOffset = header as u16;
    packet.ErrorCode = message.code() as NTSTATUS;
    packet.UniqueErrorValue = u32::from(message.id);
    packet.FinalStatus = status;
    let packet_ptr = entry.cast::<IO_ERROR_LOG_PACKET>();
    // SAFETY: (E3) the entry is `size` >= sizeof(IO_ERROR_LOG_PACKET) bytes of pool the
    // I/O manager allocated for it (pool alignment suits the packet), ours until written.
    unsafe { packet_ptr.write(packet) };
    // SAFETY: (E4) `header + units.len() * 2` <= `size` bytes (above): the strings end
    // inside the entry; u16 alignment holds (`header` is even).
    let strings_ptr = unsafe { entry.cast::<u8>().add(header) }.cast::<u16>();
    // SAFETY: (E5) as E4; the two buffers are distinct.
    unsafe { core::ptr::copy_nonoverlapping(units.as_ptr(), strings_ptr, units.len()) };
    // SAFETY: (E6) the entry came from IoAllocateErrorLogEntry and is filled; the I/O
    // manager owns and frees it from here.
    unsafe { IoWriteErrorLogEntry(entry) };
}
