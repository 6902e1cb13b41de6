//! The filter device: one per HCA, an upper filter directly above ibbus on the HCA's
//! device stack (`ibcm install` puts "ibcm" right after "ibbus" in the HCA's
//! `UpperFilters`, `usermode-lib/cli/src/upper_filters.rs`). This file owns every callback
//! of the filter device; what each one does to the HCA's binding is decided by the
//! portable lifecycle ([`ibcm_lifecycle::Hca`]).
//!
//! - `WdfFdoInitSetFilter`: the framework passes every request this device has no queue
//!   for down the stack, and this device has no queue and no file object configuration:
//!   every IRP but the preprocessed `IRP_MN_QUERY_INTERFACE` goes down untouched
//!   (creates included). It is not the power policy owner.
//! - `FILE_DEVICE_SECURE_OPEN` on the device; its security descriptor is the devnode's
//!   (whatever the base driver's INF set: ibcm's INF leaves the devnode alone).
//!   An explicit SDDL through `WdfDeviceInitAssignSDDLString` needs a named device object,
//!   and a filter in a PnP stack is unnamed (the PDO carries the name).
//! - `WdfDeviceInitAssignWdmIrpPreprocessCallback(IRP_MJ_PNP, IRP_MN_QUERY_INTERFACE)`: the
//!   query for `GUID_INFINIBAND_INTERFACE_CM` that WinVerbs and ndfltr send from above
//!   (`WdfFdoQueryForInterface` starts at the top of the stack) reaches this device before
//!   ibbus. [`ibcm_iba_cm::answer`] decides, with the host-wide verdict
//!   (`ibcm_lifecycle::HostCm`: WinVerbs keeps one `iba_cm` table for every HCA); this
//!   routine fills the caller's buffer and completes the IRP, or skips its stack location
//!   and hands it back to the framework, which sends it down
//!   (`WdfDeviceWdmDispatchPreprocessedIrp`). Each CM query is logged (ETW
//!   `CmInterfaceQuery`, and DbgPrint); one passed down also to the System log.
//! - The same preprocess routine sets the QP1 verbs hook's completion routine
//!   (`verbs_hook::query_interface_completed`) on `GUID_RDMA_INTERFACE_VERBS` queries when
//!   this device holds a hook slot (reserved at device add, released at its cleanup) and
//!   the kill switch is off (read again at ibbus's query), and passes them down; ibbus
//!   sends that query at every start and every power-up (`bus_pnp.c:566, 1721` ->
//!   `__register_ca`), so the table is patched again each time.
//! - Lifecycle (`ibcm_lifecycle::Mapping::Power`): `EvtDeviceD0Entry` binds this HCA's
//!   IBAL (`ibal.rs`; the control device is created first if it is missing);
//!   `EvtDeviceD0Exit` (sleep, hibernation, stop, removal) and `EvtDeviceSurpriseRemoval`
//!   unbind it, before KMDF passes the IRP down to ibbus, which waits for every reference
//!   on its interfaces before it deregisters the CA (`bus_pnp.c:790-829`). The device's
//!   cleanup callback unbinds if still bound, frees the hook slot and counts the filter
//!   out of the host; the last one tears the host's CM down and deletes the control
//!   device.

use core::sync::atomic::{AtomicUsize, Ordering};

use ibcm_endpoint::Lock as _;
use ibcm_iba_cm::abi::{GUID_INFINIBAND_INTERFACE_CM, Guid, InfinibandInterfaceCm};
use ibcm_iba_cm::{PassDown, QueryDecision, answer, decide_query};
use ibcm_lifecycle::{Callback, Hca, Mapping, PowerTarget, Step};
use ibcm_qp1_hook::{PrivateMethod, Table};
use wdk_sys::ntddk::IofCompleteRequest;
use wdk_sys::{
    _IO_STATUS_BLOCK__bindgen_ty_1, _WDF_POWER_DEVICE_STATE, FILE_DEVICE_SECURE_OPEN,
    IO_NO_INCREMENT, IO_STATUS_BLOCK, IRP_MJ_PNP, IRP_MN_QUERY_INTERFACE, NT_SUCCESS, NTSTATUS,
    PIRP, PWDFDEVICE_INIT, STATUS_SUCCESS, WDF_PNPPOWER_EVENT_CALLBACKS, WDF_POWER_DEVICE_STATE,
    WDFDEVICE, WDFDRIVER, WDFOBJECT,
};

use crate::control;
use crate::host::{self, Cm, Host, Upcalls};
use crate::ibal::{self, FilterIbal};
use crate::irp::{
    copy_to_next_with_completion, current_stack_location, skip_current_irp_stack_location,
};
use crate::platform::KmdfLock;
use crate::verbs_hook;
use crate::wdf::{self, context_type};
use crate::{event_log, kill_switch, status};

/// The filter device's context.
pub struct FilterState {
    /// The driver (for the control device's creation).
    driver: WDFDRIVER,
    /// The WDFDEVICE.
    device: WDFDEVICE,
    /// This HCA's IBAL binding and verbs-hook slot.
    ibal: FilterIbal,
    /// Where the device is in its life and what it holds (`ibcm_lifecycle`). The callbacks
    /// of one device are serialised by KMDF's PnP/power state machine; the lock only
    /// keeps the state machine's own update atomic.
    lifecycle: KmdfLock<Hca>,
}

context_type!(FILTER_STATE, FilterState);

/// The state of a filter device.
///
/// # Safety
///
/// `device` is a live filter device created by [`add`] (its context is initialised); the
/// reference is used only inside one of its callbacks.
unsafe fn filter_of<'a>(device: WDFDEVICE) -> &'a FilterState {
    // SAFETY: (F1) per the contract, the device carries an initialised FilterState.
    let state = unsafe { wdf::context::<FilterState>(device as WDFOBJECT, &FILTER_STATE) };
    // SAFETY: (F2) written in `add` right after WdfDeviceCreate, dropped only in the
    // device's cleanup callback.
    unsafe { &*state }
}

/// EvtDriverDeviceAdd: one filter device on the HCA stack (PASSIVE_LEVEL). Never fails the
/// HCA's stack: a filter that cannot attach returns STATUS_SUCCESS without a device and
/// the HCA starts without ibcm (logged). KMDF would turn a filter's failure without a
/// device into success too (`fxdriverkm.cpp:80-97`), but only once `WdfFdoInitSetFilter`
/// ran; this says so in the log either way.
pub fn add(driver: WDFDRIVER, device_init: PWDFDEVICE_INIT) -> NTSTATUS {
    if let Err((what, status)) = attach(driver, device_init) {
        wdk::println!(
            "ibcm: not attached to this HCA ({what}: {status:#010x}); it starts without ibcm"
        );
    }
    STATUS_SUCCESS
}

fn attach(
    driver: WDFDRIVER,
    mut device_init: PWDFDEVICE_INIT,
) -> Result<(), (&'static str, NTSTATUS)> {
    // SAFETY: (F3) `device_init` is the framework's, valid until WdfDeviceCreate.
    unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfFdoInitSetFilter, device_init) };
    // SAFETY: (F4) as F3; OR'ed into the stack's characteristics.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetCharacteristics,
            device_init,
            FILE_DEVICE_SECURE_OPEN,
            1
        );
    }
    let mut minor = [IRP_MN_QUERY_INTERFACE as u8];
    // SAFETY: (F5) as F3; the minor-function array is copied by the framework.
    let status = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitAssignWdmIrpPreprocessCallback,
            device_init,
            Some(evt_preprocess_query_interface),
            IRP_MJ_PNP as u8,
            minor.as_mut_ptr(),
            1
        )
    };
    if !NT_SUCCESS(status) {
        return Err(("WdfDeviceInitAssignWdmIrpPreprocessCallback", status));
    }
    let mut pnp_power = WDF_PNPPOWER_EVENT_CALLBACKS {
        Size: wdf::size_of_ulong::<WDF_PNPPOWER_EVENT_CALLBACKS>(),
        EvtDeviceD0Entry: Some(evt_d0_entry),
        EvtDeviceD0Exit: Some(evt_d0_exit),
        EvtDeviceSurpriseRemoval: Some(evt_surprise_removal),
        ..WDF_PNPPOWER_EVENT_CALLBACKS::default()
    };
    // SAFETY: (F6) as F3; the structure is copied.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetPnpPowerEventCallbacks,
            device_init,
            &raw mut pnp_power
        );
    }
    let mut attributes = wdf::attributes(core::ptr::null_mut(), Some(&FILTER_STATE));
    attributes.EvtCleanupCallback = Some(evt_filter_cleanup);
    let mut device: WDFDEVICE = core::ptr::null_mut();
    // SAFETY: (F7) as F3; on success the framework takes `device_init` and writes the
    // handle (on failure it frees it: a filter's init belongs to the framework).
    let status = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceCreate,
            &raw mut device_init,
            &raw mut attributes,
            &raw mut device
        )
    };
    if !NT_SUCCESS(status) {
        return Err(("WdfDeviceCreate", status));
    }
    // A hook slot for this HCA (PASSIVE_LEVEL; its hook is allocated now, never at
    // DISPATCH_LEVEL). Before the device can receive a PnP IRP: ibbus queries the verbs
    // when its FDO starts, from the top of the stack through this device.
    let hook_slot = verbs_hook::reserve(PrivateMethod::DEFAULT);
    if hook_slot.is_none() {
        wdk::println!("ibcm: no QP1 verbs-hook slot for this HCA (all taken or no memory)");
    }
    // SAFETY: (F8) the device was just created with a FilterState context.
    let state = unsafe { wdf::context::<FilterState>(device as WDFOBJECT, &FILTER_STATE) };
    // SAFETY: (F9) framework memory sized and aligned for FilterState, not yet initialised;
    // written before anything else can reach it (the device has not started).
    unsafe {
        state.write(FilterState {
            driver,
            device,
            ibal: FilterIbal::new(hook_slot),
            lifecycle: KmdfLock::new(Hca::added(Mapping::Power, hook_slot.is_some())),
        });
    }
    host::with_filters(|count| {
        *count += 1;
        if hook_slot.is_none() {
            BLIND_FILTERS.fetch_add(1, Ordering::Relaxed);
        }
        ensure_control_device(driver, *count);
        // SAFETY: (F10) initialised just above; the device is not started yet.
        status::register(status::owner(unsafe { &*state }));
    });
    Ok(())
}

/// Filter devices without a hook slot: they do not see ibbus's verbs query complete, so
/// the host's CM verdict cannot learn their CAs from it (`ibcm_lifecycle::HostCm`).
/// Changed under the driver's wait lock.
static BLIND_FILTERS: AtomicUsize = AtomicUsize::new(0);

/// Creates the control device (and the host with it) if none is published (PASSIVE_LEVEL,
/// the driver's wait lock held). Each control device has a name of its own, so this does
/// not wait for a previous one that a teardown or a stale handle still keeps; should it
/// fail (no memory), the filter passes every CM query down, and the next D0Entry of any
/// HCA tries again (`Step::EnsureControlDevice`).
///
/// The host's CM verdict learns the `filters` that exist: a CA the access layer reports
/// while every one of them is bound has no ibcm (`ibcm_lifecycle::HostCm`).
fn ensure_control_device(driver: WDFDRIVER, filters: usize) {
    let blind = BLIND_FILTERS.load(Ordering::Relaxed);
    if host::host().is_none() {
        let upcalls = Upcalls {
            send: ibal::send,
            fabric_status: status::fill,
        };
        if let Err(status) = control::create(driver, upcalls) {
            wdk::println!("ibcm: the control device could not be created: {status:#010x}");
        }
    }
    if let Some(host) = host::host() {
        host.verdict(|v| v.filters(filters, blind));
    }
}

/// Forwards one callback to the lifecycle and carries out its steps (PASSIVE_LEVEL).
fn on(filter: &FilterState, callback: Callback) {
    let plan = filter.lifecycle.with(|hca| hca.on(callback));
    for step in plan {
        match step {
            Step::EnsureControlDevice => {
                host::with_filters(|count| ensure_control_device(filter.driver, *count));
            }
            Step::Bind if kill_switch::switched_off() => {
                wdk::println!("ibcm: switched off: this HCA is not bound, AL's CM serves it");
            }
            Step::Bind => ibal::bind(filter.device, &filter.ibal),
            Step::Unbind => ibal::unbind(&filter.ibal),
            Step::ReleaseHookSlot => {
                // The remove IRP went down before the device is deleted: ibbus has
                // deregistered the CA and released its verbs table; the slot may serve
                // the next HCA (its hook stays until unload).
                if let Some(slot) = filter.ibal.hook_slot {
                    verbs_hook::release(slot);
                }
            }
            Step::CountOut => count_out(),
        }
    }
}

/// The filter leaves the host; the last one unpublishes the host under the driver's wait
/// lock (a filter added after that makes a new host at once, and none can bind to this
/// one: a filter binds only while it is counted), then tears its CM down, which waits for
/// kernel clients' references, outside the lock, so other HCAs' add and cleanup are not
/// held up, and deletes its control device.
fn count_out() {
    let unpublished = host::with_filters(|count| {
        *count = count.saturating_sub(1);
        if *count == 0 {
            control::unpublish()
        } else {
            if let Some(host) = host::host() {
                let blind = BLIND_FILTERS.load(Ordering::Relaxed);
                host.verdict(|v| v.filters(*count, blind));
            }
            None
        }
    });
    if let Some(host) = unpublished {
        host::teardown(host);
        control::delete(host);
    }
}

/// EvtDeviceD0Entry (PASSIVE_LEVEL: start, resume, restart after a stop; after the D0 IRP
/// completed below, so ibbus has registered the CA, `fdopower.cpp:358-399`): bind.
/// Never fails the HCA's power-up.
unsafe extern "C" fn evt_d0_entry(
    device: WDFDEVICE,
    _previous: WDF_POWER_DEVICE_STATE,
) -> NTSTATUS {
    // SAFETY: (F11) the framework passes one of this driver's filter devices.
    let filter = unsafe { filter_of(device) };
    kill_switch::read_at_start();
    on(filter, Callback::D0Entry);
    status::record(
        status::owner(filter),
        u64::from_be(filter.ibal.ca_guid.load(Ordering::Relaxed)),
        filter.ibal.hca_route(),
        filter
            .ibal
            .hook_slot
            .map_or(Table::NotSeen, verbs_hook::table),
    );
    STATUS_SUCCESS
}

/// EvtDeviceD0Exit (PASSIVE_LEVEL, before KMDF passes the Dx IRP down to ibbus,
/// `fdopower.cpp:405-416, 491-496`; also before a stop or removal, target D3Final):
/// unbind, so ibbus finds no reference of ibcm's when it waits for its clients.
unsafe extern "C" fn evt_d0_exit(device: WDFDEVICE, target: WDF_POWER_DEVICE_STATE) -> NTSTATUS {
    // SAFETY: (F12) as F11.
    let filter = unsafe { filter_of(device) };
    let target = if target == _WDF_POWER_DEVICE_STATE::WdfPowerDeviceD3Final {
        PowerTarget::D3Final
    } else {
        PowerTarget::Sleep
    };
    on(filter, Callback::D0Exit(target));
    STATUS_SUCCESS
}

/// EvtDeviceSurpriseRemoval (PASSIVE_LEVEL, before KMDF passes IRP_MN_SURPRISE_REMOVAL
/// down, `pnpstatemachine.cpp:2756-2787`): unbind.
unsafe extern "C" fn evt_surprise_removal(device: WDFDEVICE) {
    // SAFETY: (F36a) as F11.
    let filter = unsafe { filter_of(device) };
    on(filter, Callback::SurpriseRemoval);
}

/// The filter device's EvtCleanupCallback (PASSIVE_LEVEL, the device is being deleted,
/// after the remove IRP went down: `fxpkgfdo.cpp:1247-1262`): unbind if still bound, free
/// the hook slot, count the filter out.
unsafe extern "C" fn evt_filter_cleanup(object: WDFOBJECT) {
    // SAFETY: (F13) the object is the filter device being deleted; its context was
    // initialised in `add` right after creation.
    let state = unsafe { wdf::context::<FilterState>(object, &FILTER_STATE) };
    // SAFETY: (F14) no callback of the device runs any more; this is the only reference.
    let filter = unsafe { &*state };
    host::with_filters(|_| {
        status::unregister(status::owner(filter));
        if filter.ibal.hook_slot.is_none() {
            BLIND_FILTERS.fetch_sub(1, Ordering::Relaxed);
        }
    });
    on(filter, Callback::Cleanup);
    // SAFETY: (F15) initialised in `add`, dropped exactly once here; WDF frees the memory.
    unsafe { core::ptr::drop_in_place(state) };
}

/// The WDM preprocess routine for `IRP_MJ_PNP` / `IRP_MN_QUERY_INTERFACE` (PASSIVE_LEVEL,
/// PnP IRPs are sent at PASSIVE_LEVEL).
unsafe extern "C" fn evt_preprocess_query_interface(device: WDFDEVICE, irp: PIRP) -> NTSTATUS {
    // SAFETY: (F18) the framework passes one of this driver's filter devices.
    let filter = unsafe { filter_of(device) };
    // SAFETY: (F19) the framework hands this routine the IRP it received; it is ours until
    // completed or given back.
    let stack = unsafe { current_stack_location(irp) };
    // SAFETY: (F20) the IRP's current stack location, valid while the IRP is ours.
    let parameters = unsafe { (*stack).Parameters };
    // SAFETY: (F36) the stack location of an IRP_MN_QUERY_INTERFACE carries
    // `Parameters.QueryInterface` (wdm.h), set by the sender.
    let query = unsafe { parameters.QueryInterface };
    // SAFETY: (F43) null or the sender's GUID, valid for the IRP's lifetime.
    let requested = unsafe { query.InterfaceType.as_ref() };
    if let (Some(slot), Some(guid)) = (filter.ibal.hook_slot, requested)
        && verbs_hook::is_verbs_query(guid)
        && !kill_switch::at_verbs_query(!query.InterfaceSpecificData.is_null())
    {
        // ibbus's (and WinVerbs', WinMad's, ndfltr's) verbs query: down to the HCA with
        // the hook's completion routine, which decides whether this table is patched.
        // SAFETY: (F44) the IRP is ours (F19) and goes down now; the framework added a
        // stack location for this preprocess routine, so one is below ours.
        unsafe {
            copy_to_next_with_completion(
                irp,
                Some(verbs_hook::query_interface_completed),
                slot.completion_context(),
            );
        }
        // SAFETY: (F45) as F26.
        return unsafe {
            wdk_sys::call_unsafe_wdf_function_binding!(
                WdfDeviceWdmDispatchPreprocessedIrp,
                device,
                irp
            )
        };
    }
    let interface_type = if query.InterfaceType.is_null() {
        None
    } else {
        // SAFETY: (F21) non-null: the sender's GUID, valid for the IRP's lifetime.
        let g = unsafe { *query.InterfaceType };
        Some(Guid {
            data1: g.Data1,
            data2: g.Data2,
            data3: g.Data3,
            data4: g.Data4,
        })
    };
    // A null buffer can hold nothing: the C convention check, as `Size` 0.
    let size = if query.Interface.is_null() {
        0
    } else {
        query.Size
    };
    let host = host::host();
    let iba_cm = host.and_then(Host::cm).and_then(Cm::iba_cm);
    let decision = match &interface_type {
        Some(guid) if *guid == GUID_INFINIBAND_INTERFACE_CM && kill_switch::switched_off() => {
            Err(PassDown::SwitchedOff)
        }
        Some(guid) => {
            // The QP1 route is the host's verdict (`ibcm_lifecycle::HostCm`), asked only
            // for a query that would otherwise be answered: the first one decides for
            // every HCA, as WinVerbs keeps the first table it got for all of them.
            let route = match decide_query(guid, query.Version, size, iba_cm.is_some(), true) {
                QueryDecision::Answer => host.is_some_and(|h| h.verdict(|v| v.answer())),
                QueryDecision::PassDown(_) => false,
            };
            answer(iba_cm, guid, query.Version, size, route)
        }
        None => Err(PassDown::OtherInterface),
    };
    // Network order as AL reports it (0 before IBAL is bound).
    let ca_guid = filter.ibal.ca_guid.load(Ordering::Relaxed);
    let ca = u64::from_be(ca_guid);
    match decision {
        Ok(interface) => {
            // SAFETY: (F22) `Interface` is non-null and the caller's buffer of `Size` >=
            // sizeof(INFINIBAND_INTERFACE_CM) bytes (checked by `answer`); written
            // unaligned, whatever the caller's alignment.
            unsafe {
                query
                    .Interface
                    .cast::<InfinibandInterfaceCm>()
                    .write_unaligned(interface);
            }
            ibcm_etw::cm_interface_query(ca_guid, query.Version, query.Size, true, "answered");
            wdk::println!("ibcm: answered GUID_INFINIBAND_INTERFACE_CM 1.1 (CA {ca:#018x})");
            let io_status = IO_STATUS_BLOCK {
                __bindgen_anon_1: _IO_STATUS_BLOCK__bindgen_ty_1 {
                    Status: STATUS_SUCCESS,
                },
                Information: 0,
            };
            // SAFETY: (F23) the IRP is ours (see F19).
            unsafe { (*irp).IoStatus = io_status };
            // SAFETY: (F24) completes the IRP once, without passing it down (the bus
            // driver's own answer, `bus_pnp.c` `__query_cm_ifc`, completes it the same
            // way); IoCompleteRequest is a macro over IofCompleteRequest.
            unsafe { IofCompleteRequest(irp, IO_NO_INCREMENT as i8) };
            STATUS_SUCCESS
        }
        Err(why) => {
            if why.is_cm_query() {
                // No QP1 route: the HCA's own reason (which registration failed, what
                // the verbs hook lacked) says more than "no route".
                let reason = match why {
                    PassDown::NoQp1Route if filter.ibal.qp1_route() => {
                        "the host's CM verdict is AL's (an HCA had no QP1 route at the first CM query)"
                    }
                    PassDown::NoQp1Route => filter.ibal.hca_route().reason(),
                    _ => why.reason(),
                };
                ibcm_etw::cm_interface_query(ca_guid, query.Version, query.Size, false, reason);
                event_log::cm_query_passed_down(ca_guid, why, filter.ibal.hca_route());
                wdk::println!(
                    "ibcm: passed GUID_INFINIBAND_INTERFACE_CM down to AL's CM (CA {ca:#018x}): {reason}"
                );
            }
            // SAFETY: (F25) the IRP is ours and goes down unchanged (the preprocess
            // contract: skip or copy the stack location before handing it back).
            unsafe { skip_current_irp_stack_location(irp) };
            // SAFETY: (F26) the device is the one the IRP was sent to; the framework sends
            // it to the next lower driver and returns its status.
            unsafe {
                wdk_sys::call_unsafe_wdf_function_binding!(
                    WdfDeviceWdmDispatchPreprocessedIrp,
                    device,
                    irp
                )
            }
        }
    }
}
