//! The filter device: one per HCA, an upper filter directly above ibbus on the HCA's
//! device stack (`ibcm install` puts "ibcm" right after "ibbus" in the HCA's
//! `UpperFilters`, `usermode-lib/cli/src/upper_filters.rs`).
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
//!   ibbus. [`ibcm_iba_cm::answer`] decides; this routine fills the caller's buffer and
//!   completes the IRP, or skips its stack location and hands it back to the framework,
//!   which sends it down (`WdfDeviceWdmDispatchPreprocessedIrp`). Each CM query is logged
//!   (ETW `CmInterfaceQuery`, and DbgPrint); one passed down also to the System log.
//! - The same preprocess routine sets the QP1 verbs hook's completion routine
//!   (`verbs_hook::query_interface_completed`) on `GUID_RDMA_INTERFACE_VERBS` queries when
//!   this device holds a hook slot (reserved at device add, released at its cleanup),
//!   and passes them down; the completion routine decides whether to patch the table.
//! - Self-managed I/O init / cleanup bind and unbind this HCA's IBAL (`ibal.rs`); the
//!   device's cleanup callback counts it out of the host and, for the last one, tears the
//!   host's CM down and deletes the control device.

use core::sync::atomic::{AtomicBool, Ordering};

use ibcm_iba_cm::abi::{Guid, InfinibandInterfaceCm};
use ibcm_iba_cm::{PassDown, answer};
use ibcm_qp1_hook::PrivateMethod;
use wdk_sys::ntddk::IofCompleteRequest;
use wdk_sys::{
    _IO_STATUS_BLOCK__bindgen_ty_1, FILE_DEVICE_SECURE_OPEN, IO_NO_INCREMENT, IO_STATUS_BLOCK,
    IRP_MJ_PNP, IRP_MN_QUERY_INTERFACE, NT_SUCCESS, NTSTATUS, PIO_STACK_LOCATION, PIRP,
    PWDFDEVICE_INIT, SL_INVOKE_ON_CANCEL, SL_INVOKE_ON_ERROR, SL_INVOKE_ON_SUCCESS, STATUS_SUCCESS,
    WDF_PNPPOWER_EVENT_CALLBACKS, WDFDEVICE, WDFDRIVER, WDFOBJECT,
};

use crate::host::{self, Cm, Host};
use crate::ibal::{self, FilterIbal};
use crate::verbs_hook::{self, SlotId};
use crate::wdf::{self, context_type};
use crate::{control, driver, event_log, status};

/// The filter device's context.
pub struct FilterState {
    /// The WDFDEVICE.
    pub device: WDFDEVICE,
    /// This HCA's IBAL binding.
    pub ibal: FilterIbal,
    /// This HCA's QP1 verbs-hook slot (None: every slot taken or no memory at device
    /// add; then the verbs query passes through untouched and there is no steering).
    pub hook_slot: Option<SlotId>,
    /// QP1 steering is in place on this HCA (`ibcm_qp1_hook::steering_in_place`: some
    /// port has ibcm's `{M, Get}` MAD service and the slot's steering decision is set;
    /// written by `ibal.rs`): a QP1 route even without a CM MAD service for Send.
    pub steering_installed: AtomicBool,
    /// Counted in the driver's filter count (its cleanup counts it out).
    counted: AtomicBool,
}

context_type!(FILTER_STATE, FilterState);

impl FilterState {
    /// Whether ibcm can reach the wire from this HCA: a registered CM MAD service on some
    /// port, or QP1 steering.
    pub fn qp1_route(&self) -> bool {
        self.ibal.routed() || self.steering_installed.load(Ordering::Acquire)
    }

    /// The route this HCA got (for the log), from what `ibal.rs` recorded.
    pub fn route(&self) -> ibcm_qp1_hook::HcaRoute {
        self.ibal
            .route(self.steering_installed.load(Ordering::Acquire))
    }
}

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

/// EvtDriverDeviceAdd: one filter device on the HCA stack (PASSIVE_LEVEL).
pub fn add(driver: WDFDRIVER, mut device_init: PWDFDEVICE_INIT) -> NTSTATUS {
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
        return status;
    }
    let mut pnp_power = WDF_PNPPOWER_EVENT_CALLBACKS {
        Size: wdf::size_of_ulong::<WDF_PNPPOWER_EVENT_CALLBACKS>(),
        EvtDeviceSelfManagedIoInit: Some(evt_self_managed_io_init),
        EvtDeviceSelfManagedIoCleanup: Some(evt_self_managed_io_cleanup),
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
        return status;
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
            device,
            ibal: FilterIbal::new(),
            hook_slot,
            steering_installed: AtomicBool::new(false),
            counted: AtomicBool::new(false),
        });
    }
    // SAFETY: (F10) just initialised.
    let state = unsafe { &*state };
    driver::with_filter_lock(|count| {
        if *count == 0
            && let Err(status) = control::create(driver)
        {
            // The HCA stack must not fail because of ibcm: this filter passes every CM
            // query down (no CM), and user mode finds no device.
            wdk::println!("ibcm: the control device could not be created: {status:#010x}");
        }
        *count += 1;
        state.counted.store(true, Ordering::Release);
        status::register(state);
    });
    STATUS_SUCCESS
}

/// EvtDeviceSelfManagedIoInit (PASSIVE_LEVEL, once, after the stack below started): bind
/// this HCA's IBAL. Never fails the HCA's start.
unsafe extern "C" fn evt_self_managed_io_init(device: WDFDEVICE) -> NTSTATUS {
    // SAFETY: (F11) the framework passes one of this driver's filter devices.
    let filter = unsafe { filter_of(device) };
    ibal::bind(filter);
    status::record(filter);
    STATUS_SUCCESS
}

/// EvtDeviceSelfManagedIoCleanup (PASSIVE_LEVEL, once, at removal or surprise removal):
/// unbind this HCA's IBAL.
unsafe extern "C" fn evt_self_managed_io_cleanup(device: WDFDEVICE) {
    // SAFETY: (F12) as F11.
    let filter = unsafe { filter_of(device) };
    ibal::unbind(filter);
}

/// The filter device's EvtCleanupCallback (PASSIVE_LEVEL, the device is being deleted):
/// unbind if still bound, count the filter out; the last one tears the host's CM down
/// and deletes the control device.
unsafe extern "C" fn evt_filter_cleanup(object: WDFOBJECT) {
    // SAFETY: (F13) the object is the filter device being deleted; its context was
    // initialised in `add` right after creation.
    let state = unsafe { wdf::context::<FilterState>(object, &FILTER_STATE) };
    // SAFETY: (F14) no callback of the device runs any more; this is the only reference.
    let filter = unsafe { &*state };
    ibal::unbind(filter);
    // The remove IRP went down before the device is deleted: ibbus has deregistered the
    // CA, AL calls no verb of it, and the slot may serve the next HCA (its hook stays
    // until unload).
    if let Some(slot) = filter.hook_slot {
        verbs_hook::release(slot);
    }
    if filter.counted.swap(false, Ordering::AcqRel) {
        driver::with_filter_lock(|count| {
            *count = count.saturating_sub(1);
            status::unregister(filter);
            if *count == 0 {
                if let Some(host) = host::host() {
                    host::teardown(host);
                }
                control::delete();
            }
        });
    }
    // SAFETY: (F15) initialised in `add`, dropped exactly once here; WDF frees the memory.
    unsafe { core::ptr::drop_in_place(state) };
}

/// `IoGetCurrentIrpStackLocation` (wdm.h, `__forceinline`: not in the bindings).
///
/// # Safety
///
/// `irp` is a live IRP owned by the caller.
unsafe fn current_stack_location(irp: PIRP) -> PIO_STACK_LOCATION {
    // SAFETY: (F16) per the contract the IRP is live; a copy of its `Tail` union.
    let tail = unsafe { (*irp).Tail };
    // SAFETY: (F27) an IRP being dispatched uses the `Overlay` arm of `Tail` (wdm.h).
    let overlay = unsafe { tail.Overlay };
    // SAFETY: (F28) ... and its `CurrentStackLocation` arm: the field the wdm.h inline
    // reads (`Irp->Tail.Overlay.CurrentStackLocation`).
    unsafe {
        overlay
            .__bindgen_anon_2
            .__bindgen_anon_1
            .CurrentStackLocation
    }
}

/// `IoSkipCurrentIrpStackLocation` (wdm.h, `__forceinline`): the next driver gets this
/// driver's stack location (`Irp->CurrentLocation++;
/// Irp->Tail.Overlay.CurrentStackLocation++`).
///
/// # Safety
///
/// `irp` is a live IRP owned by the caller, about to be passed down.
unsafe fn skip_current_irp_stack_location(irp: PIRP) {
    // SAFETY: (F17) per the contract the IRP is live; a place, not a read.
    let location = unsafe { &raw mut (*irp).CurrentLocation };
    // SAFETY: (F29) a field of the live IRP, owned by the caller.
    let current = unsafe { location.read() };
    // SAFETY: (F30) as F29.
    unsafe { location.write(current.wrapping_add(1)) };
    // SAFETY: (F31) as F17.
    let tail = unsafe { &raw mut (*irp).Tail };
    // SAFETY: (F32) the live IRP's `Tail`; the `Overlay` arm is the one in use (F27).
    let overlay = unsafe { &raw mut (*tail).Overlay };
    // SAFETY: (F33) as F32, for the `CurrentStackLocation` arm (F28).
    let stack = unsafe {
        &raw mut (*overlay)
            .__bindgen_anon_2
            .__bindgen_anon_1
            .CurrentStackLocation
    };
    // SAFETY: (F34) a field of the live IRP, owned by the caller.
    let current = unsafe { stack.read() };
    // SAFETY: (F35) as F34; one past ours is the next lower driver's location, which the
    // I/O manager allocated (StackCount covers the whole stack), so the pointer stays in
    // the IRP's stack locations.
    unsafe { stack.write(current.wrapping_add(1)) };
}

/// `IoCopyCurrentIrpStackLocationToNext` then `IoSetCompletionRoutine(irp, routine,
/// context, TRUE, TRUE, TRUE)` (wdm.h, both `__forceinline`): the next lower location
/// (`CurrentStackLocation - 1`) gets this one's contents up to `CompletionRoutine`, then
/// the routine, its context and `SL_INVOKE_ON_SUCCESS | SL_INVOKE_ON_ERROR |
/// SL_INVOKE_ON_CANCEL` as its `Control`.
///
/// # Safety
///
/// `irp` is a live IRP owned by the caller, about to be passed down; the stack has a
/// location below the current one (the framework added one for the preprocess routine,
/// and ibbus's is below it).
unsafe fn copy_to_next_with_completion(
    irp: PIRP,
    routine: wdk_sys::PIO_COMPLETION_ROUTINE,
    context: wdk_sys::PVOID,
) {
    // SAFETY: (F37) per the contract the IRP is live and ours.
    let current = unsafe { current_stack_location(irp) };
    // SAFETY: (F38) one below the current location is the next lower driver's, allocated
    // by the I/O manager (the contract): in bounds of the IRP's stack locations.
    let next = unsafe { current.sub(1) };
    // SAFETY: (F39) both locations belong to the live IRP and are distinct; the next one
    // is not in use until the IRP is passed down. Copied whole (the wdm.h macro copies up
    // to `CompletionRoutine`; the two fields after it are overwritten below).
    unsafe { core::ptr::copy_nonoverlapping(current, next, 1) };
    // SAFETY: (F40) the next location, as F39 (`IoCopyCurrentIrpStackLocationToNext`
    // clears `Control`; `IoSetCompletionRoutine` then sets the invoke bits).
    unsafe {
        (*next).Control = (SL_INVOKE_ON_SUCCESS | SL_INVOKE_ON_ERROR | SL_INVOKE_ON_CANCEL) as u8;
    }
    // SAFETY: (F41) as F40.
    unsafe { (*next).CompletionRoutine = routine };
    // SAFETY: (F42) as F40.
    unsafe { (*next).Context = context };
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
    if let (Some(slot), Some(guid)) = (filter.hook_slot, requested)
        && verbs_hook::is_verbs_query(guid)
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
    let iba_cm = host::host().and_then(Host::cm).and_then(Cm::iba_cm);
    let decision = match &interface_type {
        Some(guid) => answer(iba_cm, guid, query.Version, size, filter.qp1_route()),
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
                    PassDown::NoQp1Route => filter.route().reason(),
                    _ => why.reason(),
                };
                ibcm_etw::cm_interface_query(ca_guid, query.Version, query.Size, false, reason);
                event_log::cm_query_passed_down(ca_guid, why, filter.route());
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
