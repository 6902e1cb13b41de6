//! `DriverEntry` (`WdfDriverCreate`) and `EvtDriverDeviceAdd`.
//!
//! The device is root-enumerated (`Root\ibcm`, see `inf/ibcm.inx`): a PnP device with no
//! hardware, so the driver has a `EvtDriverDeviceAdd` and no unload routine (KMDF unloads a
//! PnP driver when its last device is removed).

use wdk_sys::{
    NTSTATUS, PCUNICODE_STRING, PDRIVER_OBJECT, PWDFDEVICE_INIT, WDF_DRIVER_CONFIG,
    WDF_NO_OBJECT_ATTRIBUTES, WDFDRIVER,
};

use crate::{device, wdf};

/// The body of `DriverEntry` (PASSIVE_LEVEL).
pub fn entry(driver: PDRIVER_OBJECT, registry_path: PCUNICODE_STRING) -> NTSTATUS {
    // WDF_DRIVER_CONFIG_INIT: only the device-add callback; pool tag left to the framework.
    let mut config = WDF_DRIVER_CONFIG {
        Size: wdf::size_of_ulong::<WDF_DRIVER_CONFIG>(),
        EvtDriverDeviceAdd: Some(evt_driver_device_add),
        ..WDF_DRIVER_CONFIG::default()
    };
    // SAFETY: (R1) `driver` and `registry_path` are the I/O manager's arguments to
    // DriverEntry; the configuration outlives the call; no driver handle is wanted
    // (the echo sample passes WDF_NO_HANDLE the same way).
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDriverCreate,
            driver,
            registry_path,
            WDF_NO_OBJECT_ATTRIBUTES,
            &raw mut config,
            core::ptr::null_mut::<WDFDRIVER>()
        )
    }
}

/// EvtDriverDeviceAdd (PASSIVE_LEVEL): one call per `Root\ibcm` device node.
unsafe extern "C" fn evt_driver_device_add(
    _driver: WDFDRIVER,
    device_init: PWDFDEVICE_INIT,
) -> NTSTATUS {
    device::add(device_init)
}
