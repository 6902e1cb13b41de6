//! The service key's `Parameters` (`HKLM\SYSTEM\CurrentControlSet\Services\ibcm\Parameters`):
//! the quotas of non-administrators, per handle and for all of them together (docs/security.md,
//! "Quotas"), the longest wait
//! the CM asks of a REQ's sender (`MaxRequestWaitMs`, `CmConfig::max_request_wait_ns`)
//! and the REQs a listen holds past its backlog (`MaxHeldRequestsPerListen`,
//! `CmConfig::held_requests_per_listen`, docs/reliability.md).
//! Each is a REG_DWORD read once, when the CM is made; a value missing, unreadable or 0
//! keeps its default ([`Quotas::default`], `CmConfig::MAX_REQUEST_WAIT_NS`,
//! `CmConfig::HELD_REQUESTS_PER_LISTEN`).

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
static MAX_REQUEST_WAIT: [u16; 16] = wdf::utf16("MaxRequestWaitMs");
static MAX_HELD_REQUESTS: [u16; 24] = wdf::utf16("MaxHeldRequestsPerListen");

/// What the registry sets.
pub struct Parameters {
    /// The quotas of non-administrators (per handle, and all users' budgets).
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
    let driver: WDFDRIVER = DRIVER.load(Ordering::Acquire).cast();
    let parameters = |quotas, wait: u32, held: u32| Parameters {
        quotas,
        max_request_wait_ms: (wait != 0).then_some(wait),
        max_held_requests: (held != 0).then_some(held),
    };
    if driver.is_null() {
        return parameters(quotas, 0, 0);
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
        return parameters(quotas, 0, 0);
    }
    let values: [(&'static [u16], &mut u32); 10] = [
        (&MAX_ENDPOINTS, &mut quotas.endpoints),
        (&MAX_LISTENS, &mut quotas.listens),
        (&MAX_BACKLOG, &mut quotas.backlog),
        (&MAX_QUEUED, &mut quotas.queued_events),
        (&MAX_ENDPOINTS_ALL, &mut quotas.all_users_endpoints),
        (&MAX_LISTENS_ALL, &mut quotas.all_users_listens),
        (&MAX_BACKLOG_ALL, &mut quotas.all_users_backlog),
        (&MAX_QUEUED_ALL, &mut quotas.all_users_queued_events),
        (&MAX_REQUEST_WAIT, &mut max_request_wait_ms),
        (&MAX_HELD_REQUESTS, &mut max_held_requests),
    ];
    for (name, field) in values {
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
            *field = value;
        }
    }
    // SAFETY: (G4) the key opened above, closed once.
    unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfRegistryClose, key) };
    parameters(quotas, max_request_wait_ms, max_held_requests)
}
