//! The PnP manager and KMDF's PnP/power state machine as the filter's stack lives through
//! them, for a filter that is not the power policy owner (the order
//! `driver/lifecycle/tests/model/kmdf.rs` cites from microsoft/Windows-Driver-Frameworks):
//! load, device add per HCA, start (EvtDeviceD0Entry after the D0 IRP completed below),
//! sleep and hibernation (EvtDeviceD0Exit to D3, then the Dx IRP down to ibbus), wake,
//! resource rebalance (stop and start again), surprise removal from D0 and from Dx,
//! orderly removal (EvtDeviceD0Exit to D3Final, the remove IRP down to ibbus, then the
//! device's deletion), and unload with the leak report. Wherever ibbus deregisters the CA
//! it first waits for every reference on its interfaces (`al::deregister_ca`).

use std::collections::HashMap;

use crate::objects::Kind;
use crate::state;
use crate::thread::{PASSIVE, call_driver};
use crate::verifier::{Rule, bugcheck};
use crate::wdf_device::{DeviceInit, delete, new_init};
use crate::*;

#[derive(Default)]
pub struct Pnp {
    pub loaded: bool,
    /// Filter devices in a low-power state (D1-D3 after a sleep, or stopped), and their
    /// state: what the next D0Entry reports as the previous state.
    in_dx: HashMap<usize, WDF_POWER_DEVICE_STATE>,
    /// Devices surprise-removed (ibbus released them then).
    surprise_removed: std::collections::HashSet<usize>,
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
    crate::al::register_ca(ca_of(device));
    d0_entry(device, _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3Final)
}

fn ca_of(device: usize) -> usize {
    state::lock()
        .devices
        .devices
        .get(&device)
        .map_or(0, |d| d.init.hca)
}

fn d0_entry(device: usize, previous: WDF_POWER_DEVICE_STATE) -> NTSTATUS {
    state::lock().pnp.in_dx.remove(&device);
    let Some(d0_entry) = callbacks(device).EvtDeviceD0Entry else {
        return STATUS_SUCCESS;
    };
    call_driver("EvtDeviceD0Entry", PASSIVE, || {
        // SAFETY: the driver's D0Entry with its device and the state it leaves.
        unsafe { d0_entry(device as WDFDEVICE, previous) }
    })
}

/// EvtDeviceD0Exit to `target`, unless the device is already out of D0.
fn d0_exit(device: usize, target: WDF_POWER_DEVICE_STATE) {
    if state::lock().pnp.in_dx.insert(device, target).is_some() {
        return;
    }
    if let Some(d0_exit) = callbacks(device).EvtDeviceD0Exit {
        call_driver("EvtDeviceD0Exit", PASSIVE, || {
            // SAFETY: the driver's D0Exit with its device and the state it goes to.
            unsafe { d0_exit(device as WDFDEVICE, target) }
        });
    }
}

/// A system sleep (S3, device D3) or hibernation (S4, `hibernate`: the device IRP for D3
/// too; KMDF reports WdfPowerDevicePrepareForHibernation only to a device on the
/// hibernation path, which an HCA is not): EvtDeviceD0Exit, then the Dx IRP down to
/// ibbus, which deregisters the CA (`__device_power_down_workItem`).
pub fn sleep(device: usize, hibernate: bool) {
    d0_exit(device, _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3);
    let why = if hibernate { "hibernation" } else { "sleep" };
    crate::al::deregister_ca(ca_of(device), why);
}

/// Resume: the D0 IRP down first, ibbus registers the CA, then EvtDeviceD0Entry from D3.
pub fn wake(device: usize) -> NTSTATUS {
    crate::al::register_ca(ca_of(device));
    d0_entry(device, _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3)
}

/// Resource rebalance: IRP_MN_QUERY_STOP_DEVICE and IRP_MN_STOP_DEVICE (D3Final, then the
/// stop down to ibbus, which deregisters the CA), then IRP_MN_START_DEVICE again (down
/// first, then EvtDeviceD0Entry from D3Final).
pub fn rebalance(device: usize) -> NTSTATUS {
    d0_exit(device, _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3Final);
    crate::al::deregister_ca(ca_of(device), "stop");
    crate::al::register_ca(ca_of(device));
    d0_entry(device, _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3Final)
}

/// IRP_MN_SURPRISE_REMOVAL: EvtDeviceSurpriseRemoval first, then (a device in D0) D3Final,
/// then the IRP down to ibbus (which deregisters the CA). A device already in Dx (it
/// never came back from a sleep) gets only the callback. The remove IRP follows
/// ([`remove`]).
pub fn surprise_remove(device: usize) {
    state::lock().pnp.surprise_removed.insert(device);
    if let Some(surprise) = callbacks(device).EvtDeviceSurpriseRemoval {
        call_driver("EvtDeviceSurpriseRemoval", PASSIVE, || {
            // SAFETY: the driver's surprise-removal callback with its device.
            unsafe { surprise(device as WDFDEVICE) }
        });
    }
    d0_exit(device, _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3Final);
    crate::al::deregister_ca(ca_of(device), "surprise removal");
}

/// The HCA's hardware stops (a card pulled, a device failure) before its surprise
/// removal: the CA completes nothing it is sent until ibbus deregisters it.
pub fn hardware_gone(device: usize) {
    crate::al::hardware_gone(ca_of(device));
}

/// Removal (orderly, or the remove IRP after a surprise removal): EvtDeviceD0Exit to
/// D3Final if the device is in D0, the IRP down to ibbus (which waits for every
/// reference on its interfaces before it deregisters the CA), then the device's deletion
/// (its cleanup callback).
pub fn remove(device: usize) {
    let ca = ca_of(device);
    d0_exit(device, _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3Final);
    // After a surprise removal ibbus's remove stops nothing again (bus_pnp.c:319-324
    // `fdo_remove_device`, `last_pnp_state`): the CA was deregistered then.
    if !state::lock().pnp.surprise_removed.contains(&device) {
        crate::al::deregister_ca(ca, "removal");
    }
    {
        let mut guard = state::lock();
        guard
            .objects
            .get_kind(device, Kind::Device, "the PnP manager (remove)");
        guard.pnp.in_dx.remove(&device);
        guard.pnp.surprise_removed.remove(&device);
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
    let links: Vec<String> = state::lock().devices.links.keys().cloned().collect();
    if !links.is_empty() {
        bugcheck(
            Rule::LeakAtUnload,
            format_args!(
                "symbolic link(s) left at unload: {links:?} (the next load's IoCreateSymbolicLink collides)"
            ),
        );
    }
    let token_information = state::lock().io.token_information.len();
    if token_information > 0 {
        bugcheck(
            Rule::LeakAtUnload,
            format_args!(
                "{token_information} SeQueryInformationToken block(s) never given to ExFreePool"
            ),
        );
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
