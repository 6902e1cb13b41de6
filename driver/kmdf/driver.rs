//! `DriverEntry` (`WdfDriverCreate` and the driver-wide wait lock, kept by `host.rs`),
//! `EvtDriverDeviceAdd` and `EvtDriverUnload`.
//!
//! The driver is an upper filter on each HCA's stack (`inf/ibcm.inx`): every
//! `EvtDriverDeviceAdd` is one HCA (`filter.rs`). KMDF unloads a PnP driver when its last
//! device object is gone; the control device is deleted with the last filter device for
//! that reason (`control.rs`), and the unload routine only unregisters the ETW provider.

use wdk_sys::{
    NTSTATUS, PCUNICODE_STRING, PDRIVER_OBJECT, PWDFDEVICE_INIT, WDF_DRIVER_CONFIG,
    WDF_NO_OBJECT_ATTRIBUTES, WDFDRIVER, WDFWAITLOCK,
};

use crate::{filter, host, verbs_hook, wdf};

/// The body of `DriverEntry` (PASSIVE_LEVEL).
pub fn entry(driver: PDRIVER_OBJECT, registry_path: PCUNICODE_STRING) -> NTSTATUS {
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
    host::set_filter_lock(lock);
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
