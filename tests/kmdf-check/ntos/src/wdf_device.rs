//! The framework's objects other than requests: the driver, device initialisation and
//! devices (control and filter), names and symbolic links, the default queue, timers,
//! DPCs, work items, wait locks, registry keys, references, contexts and deletion.

use std::collections::HashMap;
use std::time::Duration;

use crate::objects::Kind;
use crate::state::{self, changed};
use crate::thread::{self, DISPATCH, KernelCode, PASSIVE, call_driver, require_irql};
use crate::verifier::{Rule, bugcheck};
use crate::{sched, *};

/// What `WdfControlDeviceInitAllocate` or the framework's device add hands the driver.
#[derive(Default)]
pub struct DeviceInit {
    pub control: bool,
    pub filter: bool,
    pub sddl: Option<String>,
    pub name: Option<String>,
    pub characteristics: u32,
    pub exclusive: bool,
    pub file_config: Option<WDF_FILEOBJECT_CONFIG>,
    pub file_attributes: Option<WDF_OBJECT_ATTRIBUTES>,
    pub request_attributes: Option<WDF_OBJECT_ATTRIBUTES>,
    pub pnp_power: Option<WDF_PNPPOWER_EVENT_CALLBACKS>,
    pub preprocess: PFN_WDFDEVICE_WDM_IRP_PREPROCESS,
    /// The HCA a filter's device add is for.
    pub hca: usize,
}

/// A device the driver created.
pub struct DeviceInfo {
    pub init: DeviceInit,
    pub symbolic_link: Option<String>,
    pub default_queue: Option<(usize, PFN_WDF_IO_QUEUE_IO_DEVICE_CONTROL)>,
    pub finished_initializing: bool,
}

/// Device names and links in the object namespace, and the devices by handle.
#[derive(Default)]
pub struct Devices {
    pub inits: HashMap<usize, DeviceInit>,
    pub next_init: usize,
    pub devices: HashMap<usize, DeviceInfo>,
    pub names: HashMap<String, usize>,
    /// Symbolic links made with `IoCreateSymbolicLink`: the link and the name it points
    /// to, resolved at each open (the object manager's reparse).
    pub links: HashMap<String, String>,
    pub driver: usize,
    pub device_add: PFN_WDF_DRIVER_DEVICE_ADD,
    pub unload: PFN_WDF_DRIVER_UNLOAD,
    /// Wait locks: owner thread's processor number.
    pub wait_locks: HashMap<usize, Option<u32>>,
    /// Open registry keys.
    pub keys: HashMap<usize, ()>,
}

/// A UNICODE_STRING as a Rust string.
pub fn string(s: PCUNICODE_STRING) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: the caller's UNICODE_STRING.
    let s = unsafe { *s };
    if s.Buffer.is_null() {
        return String::new();
    }
    // SAFETY: `Length` bytes of UTF-16 at `Buffer`.
    let units = unsafe { std::slice::from_raw_parts(s.Buffer, usize::from(s.Length) / 2) };
    String::from_utf16_lossy(units)
}

fn check_size(function: &str, size: ULONG, expected: usize) {
    if size as usize != expected {
        bugcheck(
            Rule::Simulation,
            format_args!("{function}: configuration Size {size}, expected {expected}"),
        );
    }
}

fn with_init<R>(init: PWDFDEVICE_INIT, function: &str, f: impl FnOnce(&mut DeviceInit) -> R) -> R {
    let mut guard = state::lock();
    match guard.devices.inits.get_mut(&(init as usize)) {
        Some(i) => f(i),
        None => {
            drop(guard);
            bugcheck(
                Rule::InvalidHandle,
                format_args!("{function}: {init:p} is not a live WDFDEVICE_INIT"),
            )
        }
    }
}

/// A new WDFDEVICE_INIT (the framework's, for a filter's device add, or a control device's).
pub fn new_init(init: DeviceInit) -> PWDFDEVICE_INIT {
    let mut guard = state::lock();
    guard.devices.next_init += 1;
    let handle = 0x1411_0000_0000 + guard.devices.next_init * 0x40;
    guard.devices.inits.insert(handle, init);
    handle as PWDFDEVICE_INIT
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDriverCreate(
    _DriverObject: PDRIVER_OBJECT,
    _RegistryPath: PCUNICODE_STRING,
    DriverAttributes: PWDF_OBJECT_ATTRIBUTES,
    DriverConfig: *mut WDF_DRIVER_CONFIG,
    Driver: *mut WDFDRIVER,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfDriverCreate", PASSIVE);
    // SAFETY: the driver's configuration.
    let config = unsafe { *DriverConfig };
    check_size(
        "WdfDriverCreate",
        config.Size,
        size_of::<WDF_DRIVER_CONFIG>(),
    );
    let mut guard = state::lock();
    if guard.devices.driver != 0 {
        drop(guard);
        bugcheck(
            Rule::Simulation,
            format_args!("WdfDriverCreate called twice"),
        );
    }
    let handle = guard
        .objects
        .create(Kind::Driver, DriverAttributes, 0, "WdfDriverCreate");
    guard.devices.driver = handle;
    guard.devices.device_add = config.EvtDriverDeviceAdd;
    guard.devices.unload = config.EvtDriverUnload;
    if !Driver.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe { *Driver = handle as WDFDRIVER };
    }
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfControlDeviceInitAllocate(
    Driver: WDFDRIVER,
    SDDLString: *const UNICODE_STRING,
) -> PWDFDEVICE_INIT {
    let _k = KernelCode::enter();
    require_irql("WdfControlDeviceInitAllocate", PASSIVE);
    state::lock().objects.get_kind(
        Driver as usize,
        Kind::Driver,
        "WdfControlDeviceInitAllocate",
    );
    if SDDLString.is_null() {
        bugcheck(
            Rule::Simulation,
            format_args!("WdfControlDeviceInitAllocate without an SDDL string"),
        );
    }
    new_init(DeviceInit {
        control: true,
        sddl: Some(string(SDDLString)),
        ..DeviceInit::default()
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceInitFree(DeviceInit: PWDFDEVICE_INIT) {
    let _k = KernelCode::enter();
    let removed = state::lock().devices.inits.remove(&(DeviceInit as usize));
    match removed {
        Some(i) if i.control => {}
        Some(_) => bugcheck(
            Rule::Simulation,
            format_args!(
                "WdfDeviceInitFree on the framework's own WDFDEVICE_INIT (only control device inits are the driver's to free)"
            ),
        ),
        None => bugcheck(
            Rule::InvalidHandle,
            format_args!("WdfDeviceInitFree({DeviceInit:p}): not a live WDFDEVICE_INIT"),
        ),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceInitSetExclusive(
    DeviceInit: PWDFDEVICE_INIT,
    IsExclusive: BOOLEAN,
) {
    let _k = KernelCode::enter();
    with_init(DeviceInit, "WdfDeviceInitSetExclusive", |i| {
        i.exclusive = IsExclusive != 0
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceInitSetCharacteristics(
    DeviceInit: PWDFDEVICE_INIT,
    DeviceCharacteristics: ULONG,
    OrInValues: BOOLEAN,
) {
    let _k = KernelCode::enter();
    with_init(DeviceInit, "WdfDeviceInitSetCharacteristics", |i| {
        i.characteristics = if OrInValues != 0 {
            i.characteristics | DeviceCharacteristics
        } else {
            DeviceCharacteristics
        };
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceInitAssignName(
    DeviceInit: PWDFDEVICE_INIT,
    DeviceName: PCUNICODE_STRING,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    let name = string(DeviceName);
    with_init(DeviceInit, "WdfDeviceInitAssignName", |i| {
        i.name = Some(name)
    });
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceInitSetFileObjectConfig(
    DeviceInit: PWDFDEVICE_INIT,
    FileObjectConfig: *mut WDF_FILEOBJECT_CONFIG,
    FileObjectAttributes: PWDF_OBJECT_ATTRIBUTES,
) {
    let _k = KernelCode::enter();
    // SAFETY: the driver's structures, copied.
    let config = unsafe { *FileObjectConfig };
    check_size(
        "WdfDeviceInitSetFileObjectConfig",
        config.Size,
        size_of::<WDF_FILEOBJECT_CONFIG>(),
    );
    // SAFETY: as above (null: none).
    let attributes = unsafe { FileObjectAttributes.as_ref() }.copied();
    with_init(DeviceInit, "WdfDeviceInitSetFileObjectConfig", |i| {
        i.file_config = Some(config);
        i.file_attributes = attributes;
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceInitSetRequestAttributes(
    DeviceInit: PWDFDEVICE_INIT,
    RequestAttributes: PWDF_OBJECT_ATTRIBUTES,
) {
    let _k = KernelCode::enter();
    // SAFETY: the driver's attributes, copied.
    let attributes = unsafe { RequestAttributes.as_ref() }.copied();
    with_init(DeviceInit, "WdfDeviceInitSetRequestAttributes", |i| {
        i.request_attributes = attributes
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceInitSetPnpPowerEventCallbacks(
    DeviceInit: PWDFDEVICE_INIT,
    PnpPowerEventCallbacks: *mut WDF_PNPPOWER_EVENT_CALLBACKS,
) {
    let _k = KernelCode::enter();
    // SAFETY: the driver's structure, copied.
    let callbacks = unsafe { *PnpPowerEventCallbacks };
    check_size(
        "WdfDeviceInitSetPnpPowerEventCallbacks",
        callbacks.Size,
        size_of::<WDF_PNPPOWER_EVENT_CALLBACKS>(),
    );
    with_init(DeviceInit, "WdfDeviceInitSetPnpPowerEventCallbacks", |i| {
        i.pnp_power = Some(callbacks)
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceInitAssignWdmIrpPreprocessCallback(
    DeviceInit: PWDFDEVICE_INIT,
    EvtDeviceWdmIrpPreprocess: PFN_WDFDEVICE_WDM_IRP_PREPROCESS,
    MajorFunction: UCHAR,
    _MinorFunctions: *mut UCHAR,
    _NumMinorFunctions: ULONG,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    if u32::from(MajorFunction) != IRP_MJ_PNP {
        bugcheck(
            Rule::Simulation,
            format_args!("preprocess callbacks other than IRP_MJ_PNP are not simulated"),
        );
    }
    with_init(
        DeviceInit,
        "WdfDeviceInitAssignWdmIrpPreprocessCallback",
        |i| i.preprocess = EvtDeviceWdmIrpPreprocess,
    );
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfFdoInitSetFilter(DeviceInit: PWDFDEVICE_INIT) {
    let _k = KernelCode::enter();
    with_init(DeviceInit, "WdfFdoInitSetFilter", |i| i.filter = true);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceCreate(
    DeviceInit: *mut PWDFDEVICE_INIT,
    DeviceAttributes: PWDF_OBJECT_ATTRIBUTES,
    Device: *mut WDFDEVICE,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfDeviceCreate", PASSIVE);
    // SAFETY: the driver's pointer to its init pointer.
    let init_handle = unsafe { *DeviceInit } as usize;
    let mut guard = state::lock();
    let Some(init) = guard.devices.inits.remove(&init_handle) else {
        drop(guard);
        bugcheck(
            Rule::InvalidHandle,
            format_args!("WdfDeviceCreate: {init_handle:#x} is not a live WDFDEVICE_INIT"),
        );
    };
    if let Some(name) = &init.name
        && guard.devices.names.contains_key(name)
    {
        // The name is taken (a device not yet destroyed); the init stays the caller's.
        guard.devices.inits.insert(init_handle, init);
        return STATUS_OBJECT_NAME_COLLISION;
    }
    let driver = guard.devices.driver;
    let handle = guard
        .objects
        .create(Kind::Device, DeviceAttributes, driver, "WdfDeviceCreate");
    if let Some(name) = &init.name {
        guard.devices.names.insert(name.clone(), handle);
    }
    guard.devices.devices.insert(
        handle,
        DeviceInfo {
            init,
            symbolic_link: None,
            default_queue: None,
            finished_initializing: false,
        },
    );
    // SAFETY: the caller's pointers: the framework takes the init and nulls it.
    unsafe { *DeviceInit = core::ptr::null_mut() };
    // SAFETY: as above.
    unsafe { *Device = handle as WDFDEVICE };
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfControlFinishInitializing(Device: WDFDEVICE) {
    let _k = KernelCode::enter();
    let mut guard = state::lock();
    guard.objects.get_kind(
        Device as usize,
        Kind::Device,
        "WdfControlFinishInitializing",
    );
    match guard.devices.devices.get_mut(&(Device as usize)) {
        Some(d) if d.init.control => d.finished_initializing = true,
        _ => {
            drop(guard);
            bugcheck(
                Rule::Simulation,
                format_args!(
                    "WdfControlFinishInitializing on a device that is not a control device"
                ),
            );
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceCreateSymbolicLink(
    Device: WDFDEVICE,
    SymbolicLinkName: PCUNICODE_STRING,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfDeviceCreateSymbolicLink", PASSIVE);
    let link = string(SymbolicLinkName);
    let mut guard = state::lock();
    guard
        .objects
        .get_kind(Device as usize, Kind::Device, "WdfDeviceCreateSymbolicLink");
    if guard.devices.names.contains_key(&link) || guard.devices.links.contains_key(&link) {
        return STATUS_OBJECT_NAME_COLLISION;
    }
    guard.devices.names.insert(link.clone(), Device as usize);
    if let Some(d) = guard.devices.devices.get_mut(&(Device as usize)) {
        d.symbolic_link = Some(link);
    }
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfIoQueueCreate(
    Device: WDFDEVICE,
    Config: *mut WDF_IO_QUEUE_CONFIG,
    QueueAttributes: PWDF_OBJECT_ATTRIBUTES,
    Queue: *mut WDFQUEUE,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfIoQueueCreate", DISPATCH);
    // SAFETY: the driver's configuration.
    let config = unsafe { *Config };
    check_size(
        "WdfIoQueueCreate",
        config.Size,
        size_of::<WDF_IO_QUEUE_CONFIG>(),
    );
    if config.DefaultQueue == 0
        || config.DispatchType != _WDF_IO_QUEUE_DISPATCH_TYPE::WdfIoQueueDispatchParallel
    {
        bugcheck(
            Rule::Simulation,
            format_args!("only a parallel default queue is simulated"),
        );
    }
    let mut guard = state::lock();
    let handle = guard.objects.create(
        Kind::Queue,
        QueueAttributes,
        Device as usize,
        "WdfIoQueueCreate",
    );
    let device = guard.devices.devices.get_mut(&(Device as usize));
    if let Some(d) = device {
        if d.init.control && config.PowerManaged != _WDF_TRI_STATE::WdfFalse {
            drop(guard);
            bugcheck(
                Rule::Simulation,
                format_args!(
                    "a control device's queue must not be power managed (it has no power policy owner)"
                ),
            );
        }
        d.default_queue = Some((handle, config.EvtIoDeviceControl));
    }
    if !Queue.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe { *Queue = handle as WDFQUEUE };
    }
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfIoQueueGetDevice(Queue: WDFQUEUE) -> WDFDEVICE {
    let _k = KernelCode::enter();
    let mut guard = state::lock();
    guard
        .objects
        .get_kind(Queue as usize, Kind::Queue, "WdfIoQueueGetDevice")
        .parent as WDFDEVICE
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfFileObjectGetDevice(FileObject: WDFFILEOBJECT) -> WDFDEVICE {
    let _k = KernelCode::enter();
    let mut guard = state::lock();
    guard
        .objects
        .get_kind(FileObject as usize, Kind::File, "WdfFileObjectGetDevice")
        .parent as WDFDEVICE
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDpcGetParentObject(Dpc: WDFDPC) -> WDFOBJECT {
    let _k = KernelCode::enter();
    let mut guard = state::lock();
    guard
        .objects
        .get_kind(Dpc as usize, Kind::Dpc, "WdfDpcGetParentObject")
        .parent as WDFOBJECT
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfWorkItemGetParentObject(WorkItem: WDFWORKITEM) -> WDFOBJECT {
    let _k = KernelCode::enter();
    let mut guard = state::lock();
    guard
        .objects
        .get_kind(
            WorkItem as usize,
            Kind::WorkItem,
            "WdfWorkItemGetParentObject",
        )
        .parent as WDFOBJECT
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfTimerGetParentObject(Timer: WDFTIMER) -> WDFOBJECT {
    let _k = KernelCode::enter();
    let mut guard = state::lock();
    guard
        .objects
        .get_kind(Timer as usize, Kind::Timer, "WdfTimerGetParentObject")
        .parent as WDFOBJECT
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfObjectGetTypedContextWorker(
    Handle: WDFOBJECT,
    TypeInfo: PCWDF_OBJECT_CONTEXT_TYPE_INFO,
) -> PVOID {
    let _k = KernelCode::enter();
    require_irql("WdfObjectGetTypedContextWorker", DISPATCH + 1);
    // SAFETY: the driver's static type info.
    let unique = unsafe { (*TypeInfo).UniqueType } as usize;
    state::lock()
        .objects
        .context(Handle as usize, unique, "WdfObjectGetTypedContextWorker")
        .cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfObjectReferenceActual(
    Handle: WDFOBJECT,
    _Tag: PVOID,
    _Line: LONG,
    _File: PCCH,
) {
    let _k = KernelCode::enter();
    require_irql("WdfObjectReferenceActual", DISPATCH);
    state::lock()
        .objects
        .get(Handle as usize, "WdfObjectReferenceActual")
        .references += 1;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfObjectDereferenceActual(
    Handle: WDFOBJECT,
    _Tag: PVOID,
    _Line: LONG,
    _File: PCCH,
) {
    let _k = KernelCode::enter();
    require_irql("WdfObjectDereferenceActual", DISPATCH);
    dereference(Handle as usize, "WdfObjectDereferenceActual");
}

/// Drops one reference of `handle`; the last one ends an object whose deletion started.
pub fn dereference(handle: usize, function: &str) {
    let mut guard = state::lock();
    let o = guard.objects.get(handle, function);
    o.references -= 1;
    if o.references < 0 {
        let kind = o.kind;
        drop(guard);
        bugcheck(
            Rule::ReferenceUnderflow,
            format_args!("{function}: the {kind:?} {handle:#x} has no reference left to drop"),
        );
    }
    drop(guard);
    finish(handle);
}

/// Ends `handle` (and then its parents) if nothing holds it any more.
pub fn finish(mut handle: usize) {
    loop {
        let finished = state::lock().objects.finish(handle);
        let Some(f) = finished else { return };
        let parent = f.parent;
        on_destroyed(f.handle);
        f.run();
        changed();
        handle = parent;
    }
}

/// What goes with an object's memory (~FxDevice: the name and the symbolic link).
fn on_destroyed(handle: usize) {
    let mut guard = state::lock();
    if let Some(d) = guard.devices.devices.remove(&handle) {
        // Only this device's: a deferred deletion let go of its name early, and another
        // device may hold it now.
        for name in [d.init.name, d.symbolic_link].into_iter().flatten() {
            if guard.devices.names.get(&name) == Some(&handle) {
                guard.devices.names.remove(&name);
            }
        }
    }
    guard.devices.wait_locks.remove(&handle);
    guard.devices.keys.remove(&handle);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfObjectDelete(Object: WDFOBJECT) {
    let _k = KernelCode::enter();
    require_irql("WdfObjectDelete", DISPATCH);
    let handle = Object as usize;
    let kind = state::lock().objects.get(handle, "WdfObjectDelete").kind;
    match kind {
        Kind::Device => {
            let control = state::lock()
                .devices
                .devices
                .get(&handle)
                .is_some_and(|d| d.init.control);
            if !control {
                bugcheck(
                    Rule::ObjectDelete,
                    format_args!(
                        "WdfObjectDelete on a PnP device {handle:#x} (FDOs and filters are deleted by the framework)"
                    ),
                );
            }
            require_irql("WdfObjectDelete (control device)", PASSIVE);
        }
        Kind::Driver | Kind::File | Kind::Request | Kind::Queue => {
            bugcheck(
                Rule::ObjectDelete,
                format_args!("WdfObjectDelete on a {kind:?} the driver may not delete"),
            );
        }
        _ => {}
    }
    if kind == Kind::Device && defer_control_delete(handle) {
        return;
    }
    delete(handle, "WdfObjectDelete");
}

/// WdfObjectDelete on a control device with open handles (fxdevice.cpp:1262-1279): the
/// WDM device object is deleted now, so no new create reaches it and its name goes
/// (IoDeleteDevice makes a named device object temporary), but "the actual destruction of
/// the device [waits] until the last open handle has been closed": the queue, timers,
/// DPCs, work items, the symbolic link (deleted only at destruction, fxdevicekm.cpp:363)
/// and the cleanup callback wait for the last IRP_MJ_CLOSE
/// (fxpkggeneral.cpp:1790-1836, 1979-1980 ControlDeviceDelete). True if deferred.
fn defer_control_delete(device: usize) -> bool {
    let mut guard = state::lock();
    if !guard.io.files.values().any(|f| f.device == device) {
        return false;
    }
    guard.objects.get(device, "WdfObjectDelete").delete_pending = true;
    let name = guard
        .devices
        .devices
        .get(&device)
        .and_then(|d| d.init.name.clone());
    if let Some(name) = name {
        guard.devices.names.remove(&name);
    }
    true
}

/// The last handle of a control device whose deletion was deferred closed: its
/// destruction happens now.
pub fn after_last_close(device: usize) {
    let pending = {
        let guard = state::lock();
        let open = guard.io.files.values().any(|f| f.device == device);
        !open
            && guard
                .objects
                .live
                .get(&device)
                .is_some_and(|o| o.delete_pending)
    };
    if pending {
        delete(device, "ControlDeviceDelete");
    }
}

/// Deletes `handle` and its children, children first: each one's cleanup callback, a
/// timer's, DPC's or work item's flush, then its end once no reference holds it.
pub fn delete(handle: usize, function: &str) {
    let order = {
        let mut guard = state::lock();
        guard.objects.get(handle, function);
        guard.objects.subtree(handle)
    };
    for h in order {
        let (kind, cleanup) = {
            let mut guard = state::lock();
            let kind = guard.objects.live.get(&h).map(|o| o.kind);
            (kind, guard.objects.begin_delete(h))
        };
        if matches!(kind, Some(Kind::Timer | Kind::Dpc | Kind::WorkItem)) {
            sched::dispose(h);
        }
        if let Some(Some(cleanup)) = cleanup {
            call_driver("EvtCleanupCallback", thread::irql(), || {
                // SAFETY: the driver's cleanup callback with its object.
                unsafe { cleanup(h as WDFOBJECT) }
            });
        }
        finish(h);
    }
}

fn parent_of(attributes: PWDF_OBJECT_ATTRIBUTES, function: &str) -> usize {
    // SAFETY: the driver's attributes (null: none).
    let parent = unsafe { attributes.as_ref() }.map_or(0, |a| a.ParentObject as usize);
    let mut guard = state::lock();
    let kind = (parent != 0).then(|| guard.objects.get(parent, function).kind);
    if !matches!(kind, Some(Kind::Device | Kind::Queue)) {
        drop(guard);
        bugcheck(
            Rule::Simulation,
            format_args!("{function}: the parent must be a device or a queue"),
        );
    }
    parent
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfTimerCreate(
    Config: *mut WDF_TIMER_CONFIG,
    Attributes: PWDF_OBJECT_ATTRIBUTES,
    Timer: *mut WDFTIMER,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfTimerCreate", DISPATCH);
    // SAFETY: the driver's configuration.
    let config = unsafe { *Config };
    check_size("WdfTimerCreate", config.Size, size_of::<WDF_TIMER_CONFIG>());
    if config.Period != 0 {
        bugcheck(
            Rule::Simulation,
            format_args!("periodic timers are not simulated"),
        );
    }
    let parent = parent_of(Attributes, "WdfTimerCreate");
    let mut guard = state::lock();
    let handle = guard
        .objects
        .create(Kind::Timer, Attributes, parent, "WdfTimerCreate");
    guard
        .sched
        .timers
        .insert(handle, (sched::Callback::new(config.EvtTimerFunc), None));
    // SAFETY: the caller's out pointer.
    unsafe { *Timer = handle as WDFTIMER };
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfTimerStart(Timer: WDFTIMER, DueTime: LONGLONG) -> BOOLEAN {
    let _k = KernelCode::enter();
    require_irql("WdfTimerStart", DISPATCH);
    let deleting = state::lock()
        .objects
        .get_kind(Timer as usize, Kind::Timer, "WdfTimerStart")
        .deleting;
    if deleting {
        bugcheck(
            Rule::CallbackOutlivesObject,
            format_args!("WdfTimerStart on a timer that is running down"),
        );
    }
    if DueTime > 0 {
        bugcheck(
            Rule::Simulation,
            format_args!("absolute due times are not simulated"),
        );
    }
    BOOLEAN::from(sched::timer_start(
        Timer as usize,
        Duration::from_nanos(DueTime.unsigned_abs() * 100),
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfTimerStop(Timer: WDFTIMER, Wait: BOOLEAN) -> BOOLEAN {
    let _k = KernelCode::enter();
    require_irql("WdfTimerStop", if Wait != 0 { PASSIVE } else { DISPATCH });
    state::lock()
        .objects
        .get_kind(Timer as usize, Kind::Timer, "WdfTimerStop");
    BOOLEAN::from(sched::timer_stop(Timer as usize, Wait != 0))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDpcCreate(
    Config: *mut WDF_DPC_CONFIG,
    Attributes: PWDF_OBJECT_ATTRIBUTES,
    Dpc: *mut WDFDPC,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfDpcCreate", DISPATCH);
    // SAFETY: the driver's configuration.
    let config = unsafe { *Config };
    check_size("WdfDpcCreate", config.Size, size_of::<WDF_DPC_CONFIG>());
    let parent = parent_of(Attributes, "WdfDpcCreate");
    let mut guard = state::lock();
    let handle = guard
        .objects
        .create(Kind::Dpc, Attributes, parent, "WdfDpcCreate");
    guard
        .sched
        .dpcs
        .insert(handle, sched::Callback::new(config.EvtDpcFunc));
    // SAFETY: the caller's out pointer.
    unsafe { *Dpc = handle as WDFDPC };
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDpcEnqueue(Dpc: WDFDPC) -> BOOLEAN {
    let _k = KernelCode::enter();
    state::lock()
        .objects
        .get_kind(Dpc as usize, Kind::Dpc, "WdfDpcEnqueue");
    BOOLEAN::from(sched::dpc_enqueue(Dpc as usize))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDpcCancel(Dpc: WDFDPC, Wait: BOOLEAN) -> BOOLEAN {
    let _k = KernelCode::enter();
    if Wait != 0 {
        require_irql("WdfDpcCancel (Wait = TRUE)", PASSIVE);
    }
    state::lock()
        .objects
        .get_kind(Dpc as usize, Kind::Dpc, "WdfDpcCancel");
    BOOLEAN::from(sched::dpc_cancel(Dpc as usize, Wait != 0))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfWorkItemCreate(
    Config: *mut WDF_WORKITEM_CONFIG,
    Attributes: PWDF_OBJECT_ATTRIBUTES,
    WorkItem: *mut WDFWORKITEM,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfWorkItemCreate", DISPATCH);
    // SAFETY: the driver's configuration.
    let config = unsafe { *Config };
    check_size(
        "WdfWorkItemCreate",
        config.Size,
        size_of::<WDF_WORKITEM_CONFIG>(),
    );
    let parent = parent_of(Attributes, "WdfWorkItemCreate");
    let mut guard = state::lock();
    let handle = guard
        .objects
        .create(Kind::WorkItem, Attributes, parent, "WdfWorkItemCreate");
    guard
        .sched
        .work_items
        .insert(handle, sched::Callback::new(config.EvtWorkItemFunc));
    // SAFETY: the caller's out pointer.
    unsafe { *WorkItem = handle as WDFWORKITEM };
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfWorkItemEnqueue(WorkItem: WDFWORKITEM) {
    let _k = KernelCode::enter();
    require_irql("WdfWorkItemEnqueue", DISPATCH);
    state::lock()
        .objects
        .get_kind(WorkItem as usize, Kind::WorkItem, "WdfWorkItemEnqueue");
    sched::work_item_enqueue(WorkItem as usize);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfWorkItemFlush(WorkItem: WDFWORKITEM) {
    let _k = KernelCode::enter();
    require_irql("WdfWorkItemFlush", PASSIVE);
    state::lock()
        .objects
        .get_kind(WorkItem as usize, Kind::WorkItem, "WdfWorkItemFlush");
    sched::work_item_flush(WorkItem as usize);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfWaitLockCreate(
    LockAttributes: PWDF_OBJECT_ATTRIBUTES,
    Lock: *mut WDFWAITLOCK,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfWaitLockCreate", DISPATCH);
    let mut guard = state::lock();
    let driver = guard.devices.driver;
    let handle = guard
        .objects
        .create(Kind::WaitLock, LockAttributes, driver, "WdfWaitLockCreate");
    guard.devices.wait_locks.insert(handle, None);
    // SAFETY: the caller's out pointer.
    unsafe { *Lock = handle as WDFWAITLOCK };
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfWaitLockAcquire(Lock: WDFWAITLOCK, Timeout: *mut LONGLONG) -> NTSTATUS {
    let _k = KernelCode::enter();
    // SAFETY: the caller's timeout (null: none).
    let timeout = unsafe { Timeout.as_ref() }.copied();
    require_irql(
        "WdfWaitLockAcquire",
        if timeout == Some(0) {
            DISPATCH
        } else {
            PASSIVE
        },
    );
    if timeout.is_some_and(|t| t != 0) {
        bugcheck(
            Rule::Simulation,
            format_args!("WdfWaitLockAcquire with a timeout is not simulated"),
        );
    }
    let me = thread::processor();
    let handle = Lock as usize;
    let mut guard = state::lock();
    guard
        .objects
        .get_kind(handle, Kind::WaitLock, "WdfWaitLockAcquire");
    if guard.devices.wait_locks.get(&handle).copied().flatten() == Some(me) {
        drop(guard);
        bugcheck(
            Rule::WaitLock,
            format_args!("wait lock {handle:#x} acquired again by its owner"),
        );
    }
    if timeout == Some(0)
        && guard
            .devices
            .wait_locks
            .get(&handle)
            .copied()
            .flatten()
            .is_some()
    {
        return STATUS_TIMEOUT;
    }
    let what = || format!("wait lock {handle:#x}");
    let (mut guard, _) = state::wait_until(guard, None, &what, |s| {
        s.devices
            .wait_locks
            .get(&handle)
            .copied()
            .flatten()
            .is_none()
    });
    guard.devices.wait_locks.insert(handle, Some(me));
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfWaitLockRelease(Lock: WDFWAITLOCK) {
    let _k = KernelCode::enter();
    require_irql("WdfWaitLockRelease", DISPATCH);
    let me = thread::processor();
    let handle = Lock as usize;
    let mut guard = state::lock();
    guard
        .objects
        .get_kind(handle, Kind::WaitLock, "WdfWaitLockRelease");
    if guard.devices.wait_locks.get(&handle).copied().flatten() != Some(me) {
        drop(guard);
        bugcheck(
            Rule::WaitLock,
            format_args!("wait lock {handle:#x} released by a thread that does not hold it"),
        );
    }
    guard.devices.wait_locks.insert(handle, None);
    drop(guard);
    changed();
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDriverOpenParametersRegistryKey(
    Driver: WDFDRIVER,
    DesiredAccess: ACCESS_MASK,
    KeyAttributes: PWDF_OBJECT_ATTRIBUTES,
    Key: *mut WDFKEY,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfDriverOpenParametersRegistryKey", PASSIVE);
    if DesiredAccess & !KEY_READ != 0 {
        bugcheck(
            Rule::Simulation,
            format_args!("the Parameters key is opened for more than KEY_READ"),
        );
    }
    let mut guard = state::lock();
    guard.objects.get_kind(
        Driver as usize,
        Kind::Driver,
        "WdfDriverOpenParametersRegistryKey",
    );
    if !guard.registry.exists {
        return STATUS_OBJECT_NAME_NOT_FOUND;
    }
    let handle = guard.objects.create(
        Kind::Key,
        KeyAttributes,
        Driver as usize,
        "WdfDriverOpenParametersRegistryKey",
    );
    guard.devices.keys.insert(handle, ());
    // SAFETY: the caller's out pointer.
    unsafe { *Key = handle as WDFKEY };
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRegistryQueryULong(
    Key: WDFKEY,
    ValueName: PCUNICODE_STRING,
    Value: *mut ULONG,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfRegistryQueryULong", PASSIVE);
    let name = string(ValueName);
    let mut guard = state::lock();
    guard
        .objects
        .get_kind(Key as usize, Kind::Key, "WdfRegistryQueryULong");
    match guard.registry.values.get(&name) {
        Some(v) => {
            // SAFETY: the caller's out pointer.
            unsafe { *Value = *v };
            guard.registry.read.push(name);
            STATUS_SUCCESS
        }
        None => STATUS_OBJECT_NAME_NOT_FOUND,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRegistryClose(Key: WDFKEY) {
    let _k = KernelCode::enter();
    require_irql("WdfRegistryClose", PASSIVE);
    state::lock()
        .objects
        .get_kind(Key as usize, Kind::Key, "WdfRegistryClose");
    delete(Key as usize, "WdfRegistryClose");
}

/// `IoCreateSymbolicLink` (wdm.h; PASSIVE_LEVEL): a link to a name, which need not exist
/// yet; a link that exists already is STATUS_OBJECT_NAME_COLLISION.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IoCreateSymbolicLink(
    SymbolicLinkName: PUNICODE_STRING,
    DeviceName: PUNICODE_STRING,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("IoCreateSymbolicLink", PASSIVE);
    let (link, target) = (string(SymbolicLinkName), string(DeviceName));
    let mut guard = state::lock();
    if guard.devices.names.contains_key(&link) || guard.devices.links.contains_key(&link) {
        return STATUS_OBJECT_NAME_COLLISION;
    }
    guard.devices.links.insert(link, target);
    STATUS_SUCCESS
}

/// `IoDeleteSymbolicLink` (wdm.h; PASSIVE_LEVEL): removes a link `IoCreateSymbolicLink`
/// made; handles opened through it stay open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn IoDeleteSymbolicLink(SymbolicLinkName: PUNICODE_STRING) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("IoDeleteSymbolicLink", PASSIVE);
    let link = string(SymbolicLinkName);
    match state::lock().devices.links.remove(&link) {
        Some(_) => STATUS_SUCCESS,
        None => STATUS_OBJECT_NAME_NOT_FOUND,
    }
}
