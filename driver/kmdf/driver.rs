//! `DriverEntry` (`WdfDriverCreate`) and `EvtDriverDeviceAdd`.
//!
//! The device is root-enumerated (`Root\ibcm`, see `inf/ibcm.inx`): a PnP device with no
//! hardware, so the driver has a `EvtDriverDeviceAdd`; KMDF unloads a PnP driver when its
//! last device is removed, and the unload routine only unregisters the ETW provider.

use wdk_sys::{
    NTSTATUS, PCUNICODE_STRING, PDRIVER_OBJECT, PWDFDEVICE_INIT, WDF_DRIVER_CONFIG,
    WDF_NO_OBJECT_ATTRIBUTES, WDFDRIVER,
};

use crate::{device, wdf};

/// The body of `DriverEntry` (PASSIVE_LEVEL).
pub fn entry(driver: PDRIVER_OBJECT, registry_path: PCUNICODE_STRING) -> NTSTATUS {
    // SAFETY: (R2) the ETW provider (ibcm-etw) is registered at PASSIVE_LEVEL, once per
    // load; every path out of the driver unregisters it (EvtDriverUnload, or below if
    // WdfDriverCreate fails), as `register`'s contract asks.
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
    }
    status
}

/// EvtDriverUnload (PASSIVE_LEVEL): the last device is gone; the ETW provider goes too.
unsafe extern "C" fn evt_driver_unload(_driver: WDFDRIVER) {
    ibcm_etw::unregister();
}

/// EvtDriverDeviceAdd (PASSIVE_LEVEL): one call per `Root\ibcm` device node.
unsafe extern "C" fn evt_driver_device_add(
    _driver: WDFDRIVER,
    device_init: PWDFDEVICE_INIT,
) -> NTSTATUS {
    device::add(device_init)
}
