//! The PnP manager and KMDF's PnP/power state machine as the filter's stack lives through
//! them (the order `ibcm_lifecycle`'s models cite): load, device add per HCA, start
//! (EvtDeviceD0Entry after the D0 IRP completed below), orderly removal
//! (EvtDeviceD0Exit to D3Final, the remove IRP down to ibbus, which waits for every
//! interface reference, then the device's deletion), and unload with the leak report.

use crate::objects::Kind;
use crate::state;
use crate::thread::{PASSIVE, call_driver};
use crate::verifier::{Rule, bugcheck};
use crate::wdf_device::{DeviceInit, delete, new_init};
use crate::*;

#[derive(Default)]
pub struct Pnp {
    pub loaded: bool,
}

/// The image's `DriverEntry`.
pub type DriverEntry = unsafe extern "system" fn(PDRIVER_OBJECT, PCUNICODE_STRING) -> NTSTATUS;

/// Loads the driver: DriverEntry at PASSIVE_LEVEL in a system thread.
pub fn load(entry: DriverEntry) -> NTSTATUS {
    crate::sched::start();
    let path: Vec<u16> = "\\Registry\\Machine\\System\\CurrentControlSet\\Services\\ibcm"
        .encode_utf16()
        .collect();
    let registry_path = UNICODE_STRING {
        Length: (path.len() * 2) as u16,
        MaximumLength: (path.len() * 2) as u16,
        Buffer: path.as_ptr().cast_mut(),
    };
    // The DRIVER_OBJECT is opaque to the binding (it only hands it back): any address.
    let driver_object = 0xD000_0000_usize as PDRIVER_OBJECT;
    let status = call_driver("DriverEntry", PASSIVE, || {
        // SAFETY: the image's entry point with a driver object and registry path.
        unsafe { entry(driver_object, &registry_path) }
    });
    state::lock().pnp.loaded = NT_SUCCESS(status);
    status
}

/// IRP_MN_START's path for a new HCA stack (ibbus's FDO below, `ca` its CA): KMDF's
/// EvtDriverDeviceAdd with a fresh WDFDEVICE_INIT. The filter device, if one was made.
pub fn add_device(ca: usize) -> Option<usize> {
    let (driver, add) = {
        let guard = state::lock();
        (guard.devices.driver, guard.devices.device_add)
    };
    let Some(add) = add else {
        bugcheck(Rule::Simulation, format_args!("no EvtDriverDeviceAdd"));
    };
    let init = new_init(DeviceInit {
        hca: ca,
        ..DeviceInit::default()
    });
    let before: Vec<usize> = state::lock().devices.devices.keys().copied().collect();
    let status = call_driver("EvtDriverDeviceAdd", PASSIVE, || {
        // SAFETY: the driver's device-add callback with its driver and a device init.
        unsafe { add(driver as WDFDRIVER, init) }
    });
    let mut guard = state::lock();
    // A filter that made no device: KMDF frees the init (fxdriverkm.cpp:80-97).
    guard.devices.inits.remove(&(init as usize));
    if !NT_SUCCESS(status) {
        return None;
    }
    guard
        .devices
        .devices
        .iter()
        .find(|(h, d)| !before.contains(h) && d.init.hca == ca && !d.init.control)
        .map(|(h, _)| *h)
}

fn callbacks(device: usize) -> WDF_PNPPOWER_EVENT_CALLBACKS {
    let guard = state::lock();
    guard
        .devices
        .devices
        .get(&device)
        .and_then(|d| d.init.pnp_power)
        .unwrap_or_default()
}

/// Start: the D0 IRP went down and ibbus registered the CA; EvtDeviceD0Entry.
pub fn start(device: usize) -> NTSTATUS {
    let Some(d0_entry) = callbacks(device).EvtDeviceD0Entry else {
        return STATUS_SUCCESS;
    };
    call_driver("EvtDeviceD0Entry", PASSIVE, || {
        // SAFETY: the driver's D0Entry with its device, from D3Final (a start).
        unsafe {
            d0_entry(
                device as WDFDEVICE,
                _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3Final,
            )
        }
    })
}

/// Orderly removal: EvtDeviceD0Exit(D3Final), the IRP down to ibbus (which waits for every
/// reference on its interfaces before it deregisters the CA: a reference left is a wait
/// that never ends, bus_pnp.c:790-829), the remove IRP, then the device's deletion (its
/// cleanup callback).
pub fn remove(device: usize) {
    let ca = state::lock()
        .devices
        .devices
        .get(&device)
        .map(|d| d.init.hca)
        .unwrap_or(0);
    if let Some(d0_exit) = callbacks(device).EvtDeviceD0Exit {
        call_driver("EvtDeviceD0Exit", PASSIVE, || {
            // SAFETY: the driver's D0Exit with its device, to D3Final (a removal).
            unsafe {
                d0_exit(
                    device as WDFDEVICE,
                    _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3Final,
                )
            }
        });
    }
    let held = crate::al::references(ca);
    if held != 0 {
        bugcheck(
            Rule::WaitNeverReturns,
            format_args!(
                "ibbus waits at the removal of CA {ca} for {held} AL interface reference(s) the filter keeps (bus_pnp.c:790-829)"
            ),
        );
    }
    {
        let mut guard = state::lock();
        guard
            .objects
            .get_kind(device, Kind::Device, "the PnP manager (remove)");
    }
    delete(device, "the PnP manager (remove)");
}

/// Unload: EvtDriverUnload, the driver object and its children go, and nothing of the
/// driver may be left: no device, no open file or pending request, no registry key, no
/// pool (Driver Verifier's Pool Tracking, 0xC4/0x62).
pub fn unload() {
    let (driver, unload) = {
        let guard = state::lock();
        (guard.devices.driver, guard.devices.unload)
    };
    let devices: Vec<usize> = state::lock().devices.devices.keys().copied().collect();
    if !devices.is_empty() {
        bugcheck(
            Rule::LeakAtUnload,
            format_args!(
                "unload with {} device(s) left (KMDF unloads a PnP driver only when its last device is gone)",
                devices.len()
            ),
        );
    }
    if let Some(unload) = unload {
        call_driver("EvtDriverUnload", PASSIVE, || {
            // SAFETY: the driver's unload routine.
            unsafe { unload(driver as WDFDRIVER) }
        });
    }
    let keys = state::lock().devices.keys.len();
    if keys > 0 {
        bugcheck(
            Rule::LeakAtUnload,
            format_args!("{keys} registry key(s) left open at unload"),
        );
    }
    delete(driver, "the I/O manager (unload)");
    let guard = state::lock();
    let live: Vec<String> = guard
        .objects
        .live
        .iter()
        .map(|(h, o)| format!("{:?} {h:#x} (references {})", o.kind, o.references))
        .collect();
    let requests = guard.io.requests.values().filter(|r| !r.completed).count();
    drop(guard);
    if !live.is_empty() {
        bugcheck(
            Rule::LeakAtUnload,
            format_args!("framework objects left at unload: {}", live.join(", ")),
        );
    }
    if requests > 0 {
        bugcheck(
            Rule::LeakAtUnload,
            format_args!("{requests} request(s) never completed at unload"),
        );
    }
    let (blocks, bytes) = crate::pool::outstanding();
    if blocks > 0 {
        bugcheck(
            Rule::LeakAtUnload,
            format_args!(
                "{blocks} pool allocation(s), {bytes} bytes, not freed at unload (bug check 0xC4, P1 = 0x62)"
            ),
        );
    }
}
