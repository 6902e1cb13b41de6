//! The WDF device: creation (EvtDriverDeviceAdd), its context (which owns the portable
//! [`ibcm_endpoint::Device`]), file objects, the default queue and cancellation.
//!
//! Every request goes to [`Device::dispatch`] unexamined: this module retrieves the buffers,
//! makes the request cancelable and hands it over. The only statuses chosen here are the
//! framework's own failures (a buffer it cannot map, a request cancelled before it could be
//! marked cancelable), `STATUS_DEVICE_NOT_READY` for a create while no CA is bound (there is
//! no dispatch layer to ask yet), `STATUS_INVALID_DEVICE_REQUEST` for an IOCTL sent without
//! a file object, and `STATUS_INSUFFICIENT_RESOURCES` when the input copy cannot be
//! allocated.

use alloc::vec::Vec;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use ibcm_cep::Instant;
use ibcm_endpoint::{Device, FileId, Lock};
use wdk_sys::{
    _WDF_FILEOBJECT_CLASS, _WDF_IO_QUEUE_DISPATCH_TYPE, _WDF_TRI_STATE, GUID, NT_SUCCESS, NTSTATUS,
    PVOID, PWDFDEVICE_INIT, STATUS_DEVICE_NOT_READY, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_DEVICE_REQUEST, STATUS_SUCCESS, ULONG, WDF_DPC_CONFIG, WDF_FILEOBJECT_CONFIG,
    WDF_IO_QUEUE_CONFIG, WDF_NO_OBJECT_ATTRIBUTES, WDF_PNPPOWER_EVENT_CALLBACKS, WDF_TIMER_CONFIG,
    WDF_WORKITEM_CONFIG, WDFDEVICE, WDFDPC, WDFFILEOBJECT, WDFOBJECT, WDFQUEUE, WDFREQUEST,
    WDFTIMER, WDFWAITLOCK, WDFWORKITEM,
};

use crate::platform::{
    KmdfLock, KmdfPlatform, KmdfRequest, REQUEST_CONTEXT, RequestContext, complete_request,
};
use crate::wdf::{self, context_type};
use crate::{client, ibal};

/// The device interface user mode opens (`ibcm_ioctl::DEVICE_INTERFACE_GUID`).
static IBCM_DEVICE_INTERFACE: GUID = wdf::guid(ibcm_ioctl::DEVICE_INTERFACE_GUID);

/// The one timer's state, under its own lock so that arming is ordered with retirement.
struct TimerState {
    /// The deadline the WDFTIMER is started for, until it fires.
    armed: Option<Instant>,
    /// The device is going away: never start the timer again.
    retired: bool,
}

/// The device context (`WdfDeviceCreate` attributes): everything the binding keeps per
/// device. Written once in [`add`] right after `WdfDeviceCreate`; the WDF handles are filled
/// in before the device starts and are read-only afterwards; everything else is atomic or
/// behind a lock. Dropped in the device's `EvtCleanupCallback`.
pub struct DeviceState {
    /// The WDFDEVICE.
    pub device: WDFDEVICE,
    /// The one timer of the dispatch layer.
    timer: WDFTIMER,
    /// The DPC that drains the receive ring.
    pub receive_dpc: WDFDPC,
    /// The work item that binds to IBAL when its interface arrives.
    pub bind_work_item: WDFWORKITEM,
    /// Serialises binding and unbinding (PASSIVE_LEVEL only; never taken by IBAL callbacks).
    pub binding_lock: WDFWAITLOCK,
    /// The dispatch layer, created when the first port of the bound CA is reported (its
    /// configuration needs the CA's attributes); freed in the cleanup callback.
    core: AtomicPtr<Device<KmdfPlatform>>,
    timer_state: KmdfLock<TimerState>,
    next_key: AtomicU64,
    /// The IBAL binding.
    pub ibal: ibal::IbalState,
}

context_type!(DEVICE_STATE, DeviceState);

/// The file context: the dispatch layer's handle for this open.
pub struct FileContext {
    file: Option<FileId>,
}

context_type!(FILE_CONTEXT, FileContext);

impl DeviceState {
    fn new(device: WDFDEVICE) -> Self {
        Self {
            device,
            timer: core::ptr::null_mut(),
            receive_dpc: core::ptr::null_mut(),
            bind_work_item: core::ptr::null_mut(),
            binding_lock: core::ptr::null_mut(),
            core: AtomicPtr::new(core::ptr::null_mut()),
            timer_state: KmdfLock::new(TimerState {
                armed: None,
                retired: false,
            }),
            next_key: AtomicU64::new(1),
            ibal: ibal::IbalState::new(),
        }
    }

    /// The dispatch layer, once a CA is bound.
    pub fn core(&self) -> Option<&Device<KmdfPlatform>> {
        let core = self.core.load(Ordering::Acquire);
        // SAFETY: (D1) a non-null pointer was published by `install_core` from a Box and is
        // freed only in the device's cleanup callback, after every callback that can reach
        // this state has stopped (file objects, queues, timer, DPC and IBAL are gone).
        unsafe { core.as_ref() }
    }

    /// Publishes the dispatch layer (first call wins; a later one drops its argument).
    pub fn install_core(&self, device: Device<KmdfPlatform>) {
        let boxed = alloc::boxed::Box::into_raw(alloc::boxed::Box::new(device));
        let installed = self.core.compare_exchange(
            core::ptr::null_mut(),
            boxed,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if installed.is_err() {
            // SAFETY: (D2) `boxed` came from Box::into_raw above and was not published.
            drop(unsafe { alloc::boxed::Box::from_raw(boxed) });
        }
    }

    /// The platform handle of this state (for `Device::new`).
    pub fn platform(&self) -> KmdfPlatform {
        KmdfPlatform::new(NonNull::from(self))
    }

    /// `Platform::set_timer`. The dispatch layer computes the deadline under its lock but
    /// calls this after releasing it, so two threads may call in either order; to never
    /// lose a deadline, the timer fires at the earliest deadline asked for since it last
    /// fired. A later or absent deadline does not stop it: an early expiry is harmless,
    /// because `timer_expired` re-arms the timer from the engine's actual next deadline.
    pub fn arm_timer(&self, deadline: Option<Instant>, now: Instant) {
        let Some(deadline) = deadline else { return };
        self.timer_state.with(|t| {
            if t.retired || t.armed.is_some_and(|armed| armed <= deadline) {
                return;
            }
            t.armed = Some(deadline);
            // Relative due time: negative, in 100 ns units, at least one unit.
            let due = (deadline.nanos_since(now) / 100).max(1);
            let due = -i64::try_from(due).unwrap_or(i64::MAX);
            // SAFETY: (D3) the timer was created in `add` and lives as long as the device;
            // WdfTimerStart runs at IRQL <= DISPATCH_LEVEL and does not call back
            // synchronously, so holding the spin lock across it is fine.
            let _already_queued = unsafe {
                wdk_sys::call_unsafe_wdf_function_binding!(WdfTimerStart, self.timer, due)
            };
        });
    }

    /// Stops the timer for good (PASSIVE_LEVEL: waits for a running callback).
    fn retire_timer(&self) {
        self.timer_state.with(|t| {
            t.retired = true;
            t.armed = None;
        });
        if self.timer.is_null() {
            return;
        }
        // SAFETY: (D4) the timer is live (a child of the device, which is being removed but
        // not yet deleted); Wait = TRUE is allowed at PASSIVE_LEVEL, and no callback re-arms
        // it once `retired` is set.
        let _was_queued =
            unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfTimerStop, self.timer, 1) };
    }

    fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }
}

/// The state of a device.
///
/// # Safety
///
/// `device` is a live WDFDEVICE created by [`add`] (whose context is initialised); the
/// reference is used only while the framework keeps the device alive (inside one of its
/// callbacks).
pub unsafe fn state_of<'a>(device: WDFDEVICE) -> &'a DeviceState {
    // SAFETY: (D5) per this function's contract, the device carries an initialised
    // DeviceState context.
    let state = unsafe { wdf::context::<DeviceState>(device as WDFOBJECT, &DEVICE_STATE) };
    // SAFETY: (D6) the context was written in `add` before the device could start, and is
    // dropped only in the device's cleanup callback.
    unsafe { &*state }
}

/// The state of the device that owns a queue.
///
/// # Safety
///
/// `queue` is a live queue of a device created by [`add`]; as [`state_of`].
unsafe fn state_of_queue<'a>(queue: WDFQUEUE) -> &'a DeviceState {
    // SAFETY: (D7) per the contract the queue is live; WdfIoQueueGetDevice runs at
    // IRQL <= DISPATCH_LEVEL.
    let device = unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfIoQueueGetDevice, queue) };
    // SAFETY: (D8) the device owns the queue, so it is live and was created by `add`.
    unsafe { state_of(device) }
}

/// EvtDriverDeviceAdd: creates the device, its objects, its interface and its queue.
pub fn add(mut device_init: PWDFDEVICE_INIT) -> NTSTATUS {
    let mut pnp_power = WDF_PNPPOWER_EVENT_CALLBACKS {
        Size: wdf::size_of_ulong::<WDF_PNPPOWER_EVENT_CALLBACKS>(),
        EvtDeviceSelfManagedIoInit: Some(evt_self_managed_io_init),
        EvtDeviceSelfManagedIoCleanup: Some(evt_self_managed_io_cleanup),
        ..WDF_PNPPOWER_EVENT_CALLBACKS::default()
    };
    // SAFETY: (D9) `device_init` is the framework's, valid until WdfDeviceCreate.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetPnpPowerEventCallbacks,
            device_init,
            &raw mut pnp_power
        );
    }

    // WDF_FILEOBJECT_CONFIG_INIT, plus a context holding the dispatch layer's FileId.
    let mut file_config = WDF_FILEOBJECT_CONFIG {
        Size: wdf::size_of_ulong::<WDF_FILEOBJECT_CONFIG>(),
        EvtDeviceFileCreate: Some(evt_file_create),
        EvtFileClose: Some(evt_file_close),
        EvtFileCleanup: Some(evt_file_cleanup),
        AutoForwardCleanupClose: _WDF_TRI_STATE::WdfUseDefault,
        FileObjectClass: _WDF_FILEOBJECT_CLASS::WdfFileObjectWdfCannotUseFsContexts,
    };
    let mut file_attributes = wdf::attributes(core::ptr::null_mut(), Some(&FILE_CONTEXT));
    // SAFETY: (D10) as D9; both structures outlive the call.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetFileObjectConfig,
            device_init,
            &raw mut file_config,
            &raw mut file_attributes
        );
    }

    let mut request_attributes = wdf::attributes(core::ptr::null_mut(), Some(&REQUEST_CONTEXT));
    // SAFETY: (D11) as D9.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetRequestAttributes,
            device_init,
            &raw mut request_attributes
        );
    }

    let mut device_attributes = wdf::attributes(core::ptr::null_mut(), Some(&DEVICE_STATE));
    device_attributes.EvtCleanupCallback = Some(evt_device_cleanup);
    let mut device: WDFDEVICE = core::ptr::null_mut();
    // SAFETY: (D12) as D9; on success the framework takes `device_init` and writes the
    // handle.
    let status = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceCreate,
            &raw mut device_init,
            &raw mut device_attributes,
            &raw mut device
        )
    };
    if !NT_SUCCESS(status) {
        return status;
    }
    // SAFETY: (D13) the device was just created with a DeviceState context.
    let state = unsafe { wdf::context::<DeviceState>(device as WDFOBJECT, &DEVICE_STATE) };
    // SAFETY: (D14) the context is framework memory sized and aligned for DeviceState, not
    // yet initialised; writing it now, before anything can fail, means the cleanup callback
    // always drops an initialised value.
    unsafe { state.write(DeviceState::new(device)) };
    // SAFETY: (D15) just initialised; no callback can reach it before this function returns
    // (the device has not started), so this is the only reference.
    let state = unsafe { &mut *state };
    match create_objects(device, state) {
        Ok(()) => STATUS_SUCCESS,
        Err(status) => status,
    }
}

/// The device's child objects, its interfaces and its default queue.
fn create_objects(device: WDFDEVICE, state: &mut DeviceState) -> Result<(), NTSTATUS> {
    ibal::init_rundown(&state.ibal);
    state.ibal.reserve_ring()?;

    // WDF_TIMER_CONFIG_INIT, without automatic serialization: the dispatch layer locks.
    let mut timer_config = WDF_TIMER_CONFIG {
        Size: wdf::size_of_ulong::<WDF_TIMER_CONFIG>(),
        EvtTimerFunc: Some(evt_timer),
        Period: 0,
        AutomaticSerialization: 0,
        TolerableDelay: 0,
        ..WDF_TIMER_CONFIG::default()
    };
    let mut attributes = wdf::attributes(device as WDFOBJECT, None);
    // SAFETY: (D16) configuration and attributes outlive the call; the device is live.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfTimerCreate,
            &raw mut timer_config,
            &raw mut attributes,
            &raw mut state.timer
        )
    })?;

    let mut dpc_config = WDF_DPC_CONFIG {
        Size: wdf::size_of_ulong::<WDF_DPC_CONFIG>(),
        EvtDpcFunc: Some(ibal::evt_receive_dpc),
        AutomaticSerialization: 0,
    };
    let mut attributes = wdf::attributes(device as WDFOBJECT, None);
    // SAFETY: (D17) as D16.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDpcCreate,
            &raw mut dpc_config,
            &raw mut attributes,
            &raw mut state.receive_dpc
        )
    })?;

    let mut work_item_config = WDF_WORKITEM_CONFIG {
        Size: wdf::size_of_ulong::<WDF_WORKITEM_CONFIG>(),
        EvtWorkItemFunc: Some(ibal::evt_bind_work_item),
        AutomaticSerialization: 0,
    };
    let mut attributes = wdf::attributes(device as WDFOBJECT, None);
    // SAFETY: (D18) as D16.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfWorkItemCreate,
            &raw mut work_item_config,
            &raw mut attributes,
            &raw mut state.bind_work_item
        )
    })?;

    let mut attributes = wdf::attributes(device as WDFOBJECT, None);
    // SAFETY: (D19) as D16.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfWaitLockCreate,
            &raw mut attributes,
            &raw mut state.binding_lock
        )
    })?;

    // SAFETY: (D20) the GUID is a static; no reference string.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceCreateDeviceInterface,
            device,
            &raw const IBCM_DEVICE_INTERFACE,
            core::ptr::null()
        )
    })?;

    // WDF_IO_QUEUE_CONFIG_INIT_DEFAULT_QUEUE(parallel). Not power managed: a software device
    // whose requests never need the hardware powered (reference §1.8).
    let mut queue_config = WDF_IO_QUEUE_CONFIG {
        Size: wdf::size_of_ulong::<WDF_IO_QUEUE_CONFIG>(),
        DispatchType: _WDF_IO_QUEUE_DISPATCH_TYPE::WdfIoQueueDispatchParallel,
        PowerManaged: _WDF_TRI_STATE::WdfFalse,
        DefaultQueue: 1,
        EvtIoDeviceControl: Some(evt_io_device_control),
        ..WDF_IO_QUEUE_CONFIG::default()
    };
    queue_config.Settings.Parallel.NumberOfPresentedRequests = ULONG::MAX;
    // SAFETY: (D21) as D16; the queue handle is not needed (WdfDeviceGetDefaultQueue).
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfIoQueueCreate,
            device,
            &raw mut queue_config,
            WDF_NO_OBJECT_ATTRIBUTES,
            core::ptr::null_mut()
        )
    })?;

    client::add_interface(device, NonNull::from(&*state))
}

fn check(status: NTSTATUS) -> Result<(), NTSTATUS> {
    if NT_SUCCESS(status) {
        Ok(())
    } else {
        Err(status)
    }
}

/// EvtDeviceSelfManagedIoInit: start listening for the IBAL interface.
unsafe extern "C" fn evt_self_managed_io_init(device: WDFDEVICE) -> NTSTATUS {
    // SAFETY: (D22) the framework passes one of this driver's started devices.
    let state = unsafe { state_of(device) };
    ibal::start(state)
}

/// EvtDeviceSelfManagedIoCleanup: unbind from IBAL, then stop the timer and the DPC for
/// good. File objects may still close later (surprise removal); the dispatch layer lives
/// until the cleanup callback and answers them without the network.
unsafe extern "C" fn evt_self_managed_io_cleanup(device: WDFDEVICE) {
    // SAFETY: (D23) as D22.
    let state = unsafe { state_of(device) };
    ibal::stop(state);
    state.retire_timer();
    ibal::retire_receive_dpc(state);
}

/// The device's EvtCleanupCallback: drops the dispatch layer and the state.
unsafe extern "C" fn evt_device_cleanup(object: WDFOBJECT) {
    // SAFETY: (D24) the object is the device being deleted; its context was initialised in
    // `add` right after creation.
    let state = unsafe { wdf::context::<DeviceState>(object, &DEVICE_STATE) };
    // SAFETY: (D25) no callback can reach the state any more (every child object, file and
    // queue of the device is gone), so this is the only reference.
    let core = unsafe { &*state }
        .core
        .swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !core.is_null() {
        // SAFETY: (D26) published by `install_core` from Box::into_raw, taken out above.
        drop(unsafe { alloc::boxed::Box::from_raw(core) });
    }
    // SAFETY: (D27) initialised in `add`, dropped exactly once here; WDF frees the memory.
    unsafe { core::ptr::drop_in_place(state) };
}

/// EvtTimerFunc (DISPATCH_LEVEL).
unsafe extern "C" fn evt_timer(timer: WDFTIMER) {
    // SAFETY: (D28) the timer is live during its callback; its parent is the device.
    let parent =
        unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfTimerGetParentObject, timer) };
    // SAFETY: (D29) the parent is a device created by `add`.
    let state = unsafe { state_of(parent as WDFDEVICE) };
    state.timer_state.with(|t| t.armed = None);
    if let Some(core) = state.core() {
        core.timer_expired();
    }
}

/// EvtDeviceFileCreate: a new handle of the dispatch layer.
unsafe extern "C" fn evt_file_create(
    device: WDFDEVICE,
    request: WDFREQUEST,
    file_object: WDFFILEOBJECT,
) {
    // SAFETY: (D30) as D22.
    let state = unsafe { state_of(device) };
    let file = state.core().map(Device::open);
    // SAFETY: (D31) the file object was created with a FileContext (file object attributes).
    let context = unsafe { wdf::context::<FileContext>(file_object as WDFOBJECT, &FILE_CONTEXT) };
    // SAFETY: (D32) framework memory for FileContext, written once before any other callback
    // of this file object (cleanup and close follow a successful create only).
    unsafe { context.write(FileContext { file }) };
    let status = if file.is_some() {
        STATUS_SUCCESS
    } else {
        STATUS_DEVICE_NOT_READY
    };
    complete_request(request, status, 0);
}

/// The dispatch layer's handle of a file object (None for a null file object).
///
/// # Safety
///
/// `file_object` is null or a live file object of a device created by [`add`] whose create
/// callback has run.
unsafe fn file_of(file_object: WDFFILEOBJECT) -> Option<FileId> {
    if file_object.is_null() {
        return None;
    }
    // SAFETY: (D33) per the contract, file objects of this device carry a FileContext.
    let context = unsafe { wdf::context::<FileContext>(file_object as WDFOBJECT, &FILE_CONTEXT) };
    // SAFETY: (D34) written in evt_file_create before the request that opened the file was
    // completed, hence before any I/O, cleanup or close on it.
    unsafe { (*context).file }
}

/// The state of the device a file object was opened on.
///
/// # Safety
///
/// `file_object` is a live file object of a device created by [`add`]; as [`state_of`].
unsafe fn state_of_file<'a>(file_object: WDFFILEOBJECT) -> &'a DeviceState {
    // SAFETY: (D35) per the contract the file object is live.
    let device =
        unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfFileObjectGetDevice, file_object) };
    // SAFETY: (D36) the file object belongs to a device created by `add`.
    unsafe { state_of(device) }
}

/// EvtFileCleanup (IRP_MJ_CLEANUP): the dispatch layer destroys the handle's endpoints and
/// completes its pending requests.
unsafe extern "C" fn evt_file_cleanup(file_object: WDFFILEOBJECT) {
    // SAFETY: (D51) the framework passes a live file object of this device, after a
    // successful create.
    let state = unsafe { state_of_file(file_object) };
    // SAFETY: (D52) as D51.
    let file = unsafe { file_of(file_object) };
    if let (Some(core), Some(file)) = (state.core(), file) {
        core.cleanup(file);
    }
}

/// EvtFileClose (IRP_MJ_CLOSE).
unsafe extern "C" fn evt_file_close(file_object: WDFFILEOBJECT) {
    // SAFETY: (D53) as D51.
    let state = unsafe { state_of_file(file_object) };
    // SAFETY: (D54) as D51.
    let file = unsafe { file_of(file_object) };
    if let (Some(core), Some(file)) = (state.core(), file) {
        let _known = core.close(file);
    }
}

/// EvtIoDeviceControl: every IOCTL goes to [`Device::dispatch`]; this only retrieves the
/// buffers and makes the request cancelable.
unsafe extern "C" fn evt_io_device_control(
    queue: WDFQUEUE,
    request: WDFREQUEST,
    output_len: usize,
    input_len: usize,
    code: ULONG,
) {
    // SAFETY: (D55) the framework presents requests of this device's default queue.
    let state = unsafe { state_of_queue(queue) };
    // SAFETY: (D37) the request is live; WdfRequestGetFileObject returns its file object (of
    // this device) or null for a request sent without one.
    let file_object =
        unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfRequestGetFileObject, request) };
    // SAFETY: (D56) null or a live file object of this device, opened successfully (I/O
    // only follows a completed create).
    let file = unsafe { file_of(file_object) };
    let Some(file) = file else {
        // Sent without a file object (a kernel sender that did not open a handle): there is
        // no dispatch-layer handle to run it on.
        complete_request(request, STATUS_INVALID_DEVICE_REQUEST, 0);
        return;
    };
    // An open file implies a dispatch layer (creates fail without one).
    let Some(core) = state.core() else {
        complete_request(request, STATUS_DEVICE_NOT_READY, 0);
        return;
    };
    // METHOD_BUFFERED: input and output share the system buffer, and the dispatch layer
    // writes output while it holds the input slice, so the input is copied first.
    let input = match retrieve_input(request, input_len) {
        Ok(input) => input,
        Err(status) => {
            complete_request(request, status, 0);
            return;
        }
    };
    let (output, output_len) = match retrieve_output(request, output_len) {
        Ok(output) => output,
        Err(status) => {
            complete_request(request, status, 0);
            return;
        }
    };
    let key = state.next_key();
    // SAFETY: (D38) requests of this device carry a RequestContext (request attributes).
    let context = unsafe { wdf::context::<RequestContext>(request as WDFOBJECT, &REQUEST_CONTEXT) };
    let Some(context) = NonNull::new(context) else {
        complete_request(request, STATUS_INSUFFICIENT_RESOURCES, 0);
        return;
    };
    // SAFETY: (D39) framework memory for RequestContext, initialised before the request is
    // marked cancelable (the cancel routine reads it).
    unsafe {
        context.as_ptr().write(RequestContext {
            parties: AtomicI32::new(2),
            cancelled: AtomicBool::new(false),
            status: AtomicI32::new(0),
            information: AtomicUsize::new(0),
            file,
            key,
        });
    }
    // Keep the request object (and its context) alive until the post-dispatch check below,
    // whoever completes it meanwhile.
    reference(request);
    // SAFETY: (D40) the request is presented to this driver, not completed, not yet
    // cancelable; the cancel routine is this module's.
    let marked = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfRequestMarkCancelableEx,
            request,
            Some(evt_request_cancel)
        )
    };
    if !NT_SUCCESS(marked) {
        // Already cancelled (echo sample: "complete the request with an error when unable to
        // mark it cancelable"); the dispatch layer never saw it.
        complete_request(request, marked, 0);
        dereference(request);
        return;
    }
    // SAFETY: (D41) the request is marked cancelable and not completed, its context is
    // initialised, and `output` is its output buffer (or null with length 0).
    let wrapped = unsafe { KmdfRequest::new(request, context, output, output_len, key) };
    core.dispatch(file, wrapped, code, &input);
    // The cancel routine may have looked for the request before the dispatch layer pended
    // it; cancelling again by key is a no-op for a request that is no longer pending.
    // SAFETY: (D42) the reference taken above keeps the context alive.
    if unsafe { context.as_ref() }.cancelled.load(Ordering::SeqCst) {
        core.cancel(file, key);
    }
    dereference(request);
}

/// EvtRequestCancel, for a request marked cancelable in [`evt_io_device_control`].
unsafe extern "C" fn evt_request_cancel(request: WDFREQUEST) {
    // SAFETY: (D43) the request is not completed while this routine holds one of its two
    // completion parties (RequestContext::parties).
    let context = unsafe { wdf::context::<RequestContext>(request as WDFOBJECT, &REQUEST_CONTEXT) };
    // SAFETY: (D44) initialised in evt_io_device_control before the request was marked
    // cancelable.
    let context = unsafe { &*context };
    context.cancelled.store(true, Ordering::SeqCst);
    // SAFETY: (D45) the request is live (see D43) and was presented by this device's queue.
    let queue =
        unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfRequestGetIoQueue, request) };
    // SAFETY: (D57) the queue that presented the request belongs to a device of this driver.
    let state = unsafe { state_of_queue(queue) };
    if let Some(core) = state.core() {
        core.cancel(context.file, context.key);
    }
    if context.parties.fetch_sub(1, Ordering::AcqRel) == 1 {
        complete_request(
            request,
            context.status.load(Ordering::Relaxed),
            context.information.load(Ordering::Relaxed),
        );
    }
}

/// A copy of the input buffer (empty when there is none).
fn retrieve_input(request: WDFREQUEST, len: usize) -> Result<Vec<u8>, NTSTATUS> {
    if len == 0 {
        // WdfRequestRetrieveInputBuffer fails on a zero-length buffer; there is nothing to copy.
        return Ok(Vec::new());
    }
    let mut buffer: PVOID = core::ptr::null_mut();
    let mut length: usize = 0;
    // SAFETY: (D46) the request is presented to this driver and not completed; both out
    // pointers are valid.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfRequestRetrieveInputBuffer,
            request,
            0,
            &raw mut buffer,
            &raw mut length
        )
    })?;
    let mut copy = Vec::new();
    copy.try_reserve_exact(length)
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    // SAFETY: (D47) the framework returned a buffer valid for `length` bytes until the
    // request completes; it is read here, before the request is handed on.
    let bytes = unsafe { core::slice::from_raw_parts(buffer.cast::<u8>(), length) };
    copy.extend_from_slice(bytes);
    Ok(copy)
}

/// The output buffer and its length (null and 0 when there is none).
fn retrieve_output(request: WDFREQUEST, len: usize) -> Result<(*mut u8, usize), NTSTATUS> {
    if len == 0 {
        return Ok((core::ptr::null_mut(), 0));
    }
    let mut buffer: PVOID = core::ptr::null_mut();
    let mut length: usize = 0;
    // SAFETY: (D48) as D46.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfRequestRetrieveOutputBuffer,
            request,
            0,
            &raw mut buffer,
            &raw mut length
        )
    })?;
    Ok((buffer.cast::<u8>(), length))
}

/// `WdfObjectReference(request)` (`WdfObjectReferenceActual` with this file's tag and line).
fn reference(request: WDFREQUEST) {
    // SAFETY: (D49) the request is live (presented, not completed); balanced by
    // `dereference` on every path of evt_io_device_control.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfObjectReferenceActual,
            request as WDFOBJECT,
            core::ptr::null_mut(),
            line!() as i32,
            c"device.rs".as_ptr()
        );
    }
}

/// `WdfObjectDereference(request)`.
fn dereference(request: WDFREQUEST) {
    // SAFETY: (D50) balances the reference taken in `reference`.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfObjectDereferenceActual,
            request as WDFOBJECT,
            core::ptr::null_mut(),
            line!() as i32,
            c"device.rs".as_ptr()
        );
    }
}
