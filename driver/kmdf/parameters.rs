//! The service key's `Parameters` (`HKLM\SYSTEM\CurrentControlSet\Services\ibcm\Parameters`):
//! the quotas of non-administrators, per handle and for all of them together (docs/security.md,
//! "Quotas"), the longest wait
//! the CM asks of a REQ's sender (`MaxRequestWaitMs`, `CmConfig::max_request_wait_ns`)
//! and the REQs a listen holds past its backlog (`MaxHeldRequestsPerListen`,
//! `CmConfig::held_requests_per_listen`, docs/reliability.md).
//! Each is a REG_DWORD read once, when the CM is made; a value missing, unreadable or 0
//! keeps its default ([`Quotas::default`], `CmConfig::MAX_REQUEST_WAIT_NS`,
//! `CmConfig::HELD_REQUESTS_PER_LISTEN`).
//!
//! `Disabled` (REG_DWORD, non-zero = on) is the kill switch, read at each HCA start
//! ([`switched_off`]): the filter stays in the HCA's stack but binds nothing, steers no
//! QP1 traffic and passes every CM query down, so AL's CM serves every client
//! (docs/windows.md, "Turning ibcm off"; `ibcm off`).

use core::sync::atomic::{AtomicPtr, Ordering};

use ibcm_endpoint::Quotas;
use wdk_sys::{KEY_READ, NT_SUCCESS, ULONG, WDF_NO_OBJECT_ATTRIBUTES, WDFDRIVER, WDFKEY};

use crate::wdf::{self, unicode};

/// The framework driver object (WdfDriverCreate's), whose `Parameters` key this reads.
static DRIVER: AtomicPtr<core::ffi::c_void> = AtomicPtr::new(core::ptr::null_mut());

/// DriverEntry: the framework driver object, once made.
pub fn set_driver(driver: WDFDRIVER) {
    DRIVER.store(driver.cast(), Ordering::Release);
}

static MAX_ENDPOINTS: [u16; 21] = wdf::utf16("MaxEndpointsPerHandle");
static MAX_LISTENS: [u16; 19] = wdf::utf16("MaxListensPerHandle");
static MAX_BACKLOG: [u16; 19] = wdf::utf16("MaxBacklogPerHandle");
static MAX_QUEUED: [u16; 24] = wdf::utf16("MaxQueuedEventsPerHandle");
static MAX_ENDPOINTS_ALL: [u16; 20] = wdf::utf16("MaxEndpointsAllUsers");
static MAX_LISTENS_ALL: [u16; 18] = wdf::utf16("MaxListensAllUsers");
static MAX_BACKLOG_ALL: [u16; 18] = wdf::utf16("MaxBacklogAllUsers");
static MAX_QUEUED_ALL: [u16; 23] = wdf::utf16("MaxQueuedEventsAllUsers");
static MAX_ENDPOINTS_ACCOUNT: [u16; 22] = wdf::utf16("MaxEndpointsPerAccount");
static MAX_LISTENS_ACCOUNT: [u16; 20] = wdf::utf16("MaxListensPerAccount");
static MAX_BACKLOG_ACCOUNT: [u16; 20] = wdf::utf16("MaxBacklogPerAccount");
static MAX_QUEUED_ACCOUNT: [u16; 25] = wdf::utf16("MaxQueuedEventsPerAccount");
static MAX_REQUEST_WAIT: [u16; 16] = wdf::utf16("MaxRequestWaitMs");
static MAX_HELD_REQUESTS: [u16; 24] = wdf::utf16("MaxHeldRequestsPerListen");
static DISABLED: [u16; 8] = wdf::utf16("Disabled");

/// What the registry sets.
pub struct Parameters {
    /// The quotas of non-administrators (per handle, per account, and all users' budgets).
    pub quotas: Quotas,
    /// `MaxRequestWaitMs`, when set.
    pub max_request_wait_ms: Option<u32>,
    /// `MaxHeldRequestsPerListen`, when set.
    pub max_held_requests: Option<u32>,
}

/// The parameters, as the registry sets them (PASSIVE_LEVEL).
pub fn read() -> Parameters {
    let mut quotas = Quotas::default();
    let mut max_request_wait_ms = 0;
    let mut max_held_requests = 0;
    query(&mut [
        (&MAX_ENDPOINTS, &mut quotas.endpoints),
        (&MAX_LISTENS, &mut quotas.listens),
        (&MAX_BACKLOG, &mut quotas.backlog),
        (&MAX_QUEUED, &mut quotas.queued_events),
        (&MAX_ENDPOINTS_ALL, &mut quotas.all_users_endpoints),
        (&MAX_LISTENS_ALL, &mut quotas.all_users_listens),
        (&MAX_BACKLOG_ALL, &mut quotas.all_users_backlog),
        (&MAX_QUEUED_ALL, &mut quotas.all_users_queued_events),
        (&MAX_ENDPOINTS_ACCOUNT, &mut quotas.account_endpoints),
        (&MAX_LISTENS_ACCOUNT, &mut quotas.account_listens),
        (&MAX_BACKLOG_ACCOUNT, &mut quotas.account_backlog),
        (&MAX_QUEUED_ACCOUNT, &mut quotas.account_queued_events),
        (&MAX_REQUEST_WAIT, &mut max_request_wait_ms),
        (&MAX_HELD_REQUESTS, &mut max_held_requests),
    ]);
    Parameters {
        quotas,
        max_request_wait_ms: (max_request_wait_ms != 0).then_some(max_request_wait_ms),
        max_held_requests: (max_held_requests != 0).then_some(max_held_requests),
    }
}

/// The kill switch `Disabled` (PASSIVE_LEVEL): true when set and non-zero. A key or value
/// that cannot be read leaves ibcm on.
pub fn switched_off() -> bool {
    let mut disabled = 0;
    query(&mut [(&DISABLED, &mut disabled)]);
    disabled != 0
}

/// Reads each named REG_DWORD of `Parameters` into its field; a value missing, unreadable
/// or 0 leaves the field as it is (PASSIVE_LEVEL).
fn query(values: &mut [(&'static [u16], &mut u32)]) {
    let driver: WDFDRIVER = DRIVER.load(Ordering::Acquire).cast();
    if driver.is_null() {
        return;
    }
    let mut key: WDFKEY = core::ptr::null_mut();
    // SAFETY: (G2) PASSIVE_LEVEL; the driver object (made in DriverEntry) lives until unload; valid out pointer. The key is
    // closed below.
    let opened = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDriverOpenParametersRegistryKey,
            driver,
            KEY_READ,
            WDF_NO_OBJECT_ATTRIBUTES,
            &raw mut key
        )
    };
    if !NT_SUCCESS(opened) {
        return;
    }
    for (name, field) in values.iter_mut() {
        let name = unicode(name);
        let mut value: ULONG = 0;
        // SAFETY: (G3) PASSIVE_LEVEL; the key is open; the name and the out pointer are
        // valid for the call.
        let read = unsafe {
            wdk_sys::call_unsafe_wdf_function_binding!(
                WdfRegistryQueryULong,
                key,
                &raw const name,
                &raw mut value
            )
        };
        if NT_SUCCESS(read) && value != 0 {
            **field = value;
        }
    }
    // SAFETY: (G4) the key opened above, closed once.
    unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfRegistryClose, key) };
}
