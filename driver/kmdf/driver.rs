//! `DriverEntry` (`WdfDriverCreate`), `EvtDriverDeviceAdd` and the driver-wide wait lock.
//!
//! The driver is an upper filter on each HCA's stack (`inf/ibcm.inx`): every
//! `EvtDriverDeviceAdd` is one HCA (`filter.rs`). KMDF unloads a PnP driver when its last
//! device object is gone; the control device is deleted with the last filter device for
//! that reason (`control.rs`), and the unload routine only unregisters the ETW provider.

use core::sync::atomic::{AtomicPtr, Ordering};

use wdk_sys::{
    NTSTATUS, PCUNICODE_STRING, PDRIVER_OBJECT, PWDFDEVICE_INIT, WDF_DRIVER_CONFIG,
    WDF_NO_OBJECT_ATTRIBUTES, WDFDRIVER, WDFWAITLOCK,
};

use crate::{event_log, filter, verbs_hook, wdf};

/// Serialises filter-device add and cleanup (the filter count, the control device's
/// creation and deletion, the host's teardown). A WDFWAITLOCK whose parent is the driver
/// (created in DriverEntry, PASSIVE_LEVEL only).
static FILTER_LOCK: AtomicPtr<core::ffi::c_void> = AtomicPtr::new(core::ptr::null_mut());

/// The number of filter devices, under [`FILTER_LOCK`].
struct FilterCount(core::cell::UnsafeCell<usize>);
// SAFETY: (R3) only reached through `with_filter_lock`, which holds the wait lock.
unsafe impl Sync for FilterCount {}
static FILTER_COUNT: FilterCount = FilterCount(core::cell::UnsafeCell::new(0));

/// Runs `f` on the filter count with the driver's wait lock held (PASSIVE_LEVEL).
pub fn with_filter_lock<R>(f: impl FnOnce(&mut usize) -> R) -> R {
    let lock: WDFWAITLOCK = FILTER_LOCK.load(Ordering::Acquire).cast();
    // SAFETY: (R4) the wait lock was created in DriverEntry before any device could be
    // added and lives as long as the driver; PASSIVE_LEVEL; a null timeout waits without
    // limit (and so always succeeds).
    let _acquired = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(WdfWaitLockAcquire, lock, core::ptr::null_mut())
    };
    // SAFETY: (R5) the wait lock is held: this is the only reference to the count.
    let result = f(unsafe { &mut *FILTER_COUNT.0.get() });
    // SAFETY: (R6) acquired above by this thread.
    unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfWaitLockRelease, lock) };
    result
}

/// The body of `DriverEntry` (PASSIVE_LEVEL).
pub fn entry(driver: PDRIVER_OBJECT, registry_path: PCUNICODE_STRING) -> NTSTATUS {
    event_log::init(driver);
    // SAFETY: (R2) the ETW provider (ibcm-etw) is registered at PASSIVE_LEVEL, once per
    // load; every path out of the driver unregisters it (EvtDriverUnload, or below if
    // DriverEntry fails), as `register`'s contract asks.
    unsafe {
        ibcm_etw::register();
    }
    // WDF_DRIVER_CONFIG_INIT: the device-add callback and the unload routine (for the ETW
    // provider); pool tag left to the framework.
    let mut config = WDF_DRIVER_CONFIG {
        Size: wdf::size_of_ulong::<WDF_DRIVER_CONFIG>(),
        EvtDriverDeviceAdd: Some(evt_driver_device_add),
        EvtDriverUnload: Some(evt_driver_unload),
        ..WDF_DRIVER_CONFIG::default()
    };
    // SAFETY: (R1) `driver` and `registry_path` are the I/O manager's arguments to
    // DriverEntry; the configuration outlives the call; no driver handle is wanted
    // (the echo sample passes WDF_NO_HANDLE the same way).
    let status = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDriverCreate,
            driver,
            registry_path,
            WDF_NO_OBJECT_ATTRIBUTES,
            &raw mut config,
            core::ptr::null_mut::<WDFDRIVER>()
        )
    };
    if !wdk_sys::NT_SUCCESS(status) {
        // No unload routine runs after a failed DriverEntry.
        ibcm_etw::unregister();
        return status;
    }
    let mut lock: WDFWAITLOCK = core::ptr::null_mut();
    // SAFETY: (R7) the driver object exists (WdfDriverCreate succeeded): with no
    // attributes the lock's parent is the driver; valid out pointer.
    let status = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfWaitLockCreate,
            WDF_NO_OBJECT_ATTRIBUTES,
            &raw mut lock
        )
    };
    if !wdk_sys::NT_SUCCESS(status) {
        // The framework deletes the driver object of a failed DriverEntry; no unload
        // routine runs.
        ibcm_etw::unregister();
        return status;
    }
    FILTER_LOCK.store(lock.cast(), Ordering::Release);
    status
}

/// EvtDriverUnload (PASSIVE_LEVEL): every device is gone (the control device with the
/// last filter), so no verbs table of ours is in use: the verbs hook's slots free their
/// hooks; the ETW provider goes too.
unsafe extern "C" fn evt_driver_unload(_driver: WDFDRIVER) {
    verbs_hook::unload();
    ibcm_etw::unregister();
}

/// EvtDriverDeviceAdd (PASSIVE_LEVEL): one call per HCA whose stack lists ibcm as an
/// upper filter.
unsafe extern "C" fn evt_driver_device_add(
    driver: WDFDRIVER,
    device_init: PWDFDEVICE_INIT,
) -> NTSTATUS {
    filter::add(driver, device_init)
}
