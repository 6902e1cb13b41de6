//! The control device: user mode's one door to the host's CM, whatever the number of
//! HCAs. Its context is the [`Host`] (`host.rs`); it owns the file objects, the parallel
//! default queue, cancellation, and the host's timer, DPCs and work item.
//!
//! Created with the first filter device and deleted when the last one goes
//! (`filter.rs`), as WinOF's WinMad does (`wm_driver.c` `WmCreateControlDevice` /
//! `WmPowerD0Exit`): `WdfControlDeviceInitAllocate` with an explicit SDDL,
//! `FILE_DEVICE_SECURE_OPEN`, a name of its own (`\Device\ibcm<N>`, [`DeviceName`]), the
//! symbolic link `\DosDevices\Global\ibcm` to it (user mode opens `\\.\ibcm`: a control
//! device cannot have a device interface), made and deleted here with
//! `IoCreateSymbolicLink`/`IoDeleteSymbolicLink`, and `WdfControlFinishInitializing`.
//!
//! Every request goes to [`Device::dispatch`](ibcm_endpoint::Device::dispatch) unexamined: this module retrieves the buffers,
//! makes the request cancelable and hands it over. The only statuses chosen here are the
//! framework's own failures (a buffer it cannot map, a request cancelled before it could be
//! marked cancelable), `STATUS_DEVICE_NOT_READY` for a create while no port was reported
//! (there is no dispatch layer to ask yet), `STATUS_INVALID_DEVICE_REQUEST` for an IOCTL
//! sent without a file object, and `STATUS_INSUFFICIENT_RESOURCES` when the input copy
//! cannot be allocated.

use alloc::vec::Vec;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering};

use ibcm_endpoint::{Caller, FileId, oversized_input};
use wdk_sys::ntddk::{
    ExFreePool, IoCreateSymbolicLink, IoDeleteSymbolicLink, SeLockSubjectContext,
    SeQueryInformationToken, SeTokenIsAdmin, SeTokenIsRestricted, SeUnlockSubjectContext,
};
use wdk_sys::{
    _MODE, _SECURITY_IMPERSONATION_LEVEL, _TOKEN_INFORMATION_CLASS, _WDF_FILEOBJECT_CLASS,
    _WDF_IO_QUEUE_DISPATCH_TYPE, _WDF_TRI_STATE, FILE_DEVICE_SECURE_OPEN, IRP_MJ_CREATE,
    NT_SUCCESS, NTSTATUS, PACCESS_TOKEN, PVOID, PWDFDEVICE_INIT, SECURITY_SUBJECT_CONTEXT,
    SL_FORCE_ACCESS_CHECK, STATUS_DEVICE_NOT_READY, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_DEVICE_REQUEST, STATUS_SUCCESS, TOKEN_USER, ULONG, UNICODE_STRING,
    WDF_DPC_CONFIG, WDF_FILEOBJECT_CONFIG, WDF_IO_QUEUE_CONFIG, WDF_NO_OBJECT_ATTRIBUTES,
    WDF_TIMER_CONFIG, WDF_WORKITEM_CONFIG, WDFDEVICE, WDFDRIVER, WDFFILEOBJECT, WDFOBJECT,
    WDFQUEUE, WDFREQUEST, WDFTIMER,
};

use crate::host::{self, HOST, HOST_CONTEXT, Host, Upcalls};
use crate::platform::{KmdfRequest, REQUEST_CONTEXT, RequestContext, complete_request};
use crate::wdf::{self, context_type};

/// The next control device's instance number (its name's suffix).
static INSTANCE: AtomicU32 = AtomicU32::new(0);

/// `\Device\ibcm<N>`, N the instance number (0 at the first creation after load). Each
/// control device has a name of its own, so the next one can be made while the previous
/// one still exists under its name: the last HCA's teardown, which waits for kernel
/// clients to drop ibcm's `iba_cm`, runs before that device is deleted (a new HCA starting
/// meanwhile gets a new host at once). A stale `\\.\ibcm` handle keeps only the WDF
/// object: `WdfObjectDelete` deletes the WDM device, and with it the name, at once
/// (fxdevice.cpp:1262-1279), but a `WdfDeviceCreateSymbolicLink` link would live until
/// the last IRP_MJ_CLOSE (fxdevicekm.cpp:362-377) and keep `\\.\ibcm` from any new device;
/// so the link is this module's own, deleted when the host is unpublished, and always
/// names the newest device. User mode never sees the suffix.
struct DeviceName {
    units: [u16; DEVICE_NAME_PREFIX.len() + 10],
    len: usize,
}

/// `\Device\ibcm`.
static DEVICE_NAME_PREFIX: [u16; 12] = wdf::utf16("\\Device\\ibcm");

impl DeviceName {
    fn new(instance: u32) -> Self {
        let mut units = [0u16; DEVICE_NAME_PREFIX.len() + 10];
        let mut digits = itoa::Buffer::new();
        let name = DEVICE_NAME_PREFIX
            .iter()
            .copied()
            .chain(digits.format(instance).bytes().map(u16::from));
        // A u32 has at most 10 digits: the whole name fits.
        let mut len = 0;
        for (unit, from) in units.iter_mut().zip(name) {
            *unit = from;
            len += 1;
        }
        Self { units, len }
    }

    fn units(&self) -> &[u16] {
        self.units.get(..self.len).unwrap_or(&self.units)
    }
}

/// `\DosDevices\Global\ibcm` (user mode: `\\.\ibcm`, `ibcm_ioctl::DEVICE_PATH`).
static SYMBOLIC_LINK: [u16; 23] = wdf::utf16("\\DosDevices\\Global\\ibcm");
/// Who may open the control device: SYSTEM all, Administrators read/write/execute,
/// everyone read/write, restricted code read: `SDDL_DEVOBJ_SYS_ALL_ADM_RWX_WORLD_RW_RES_R`
/// (wdmsec.h), what WinVerbs, WinMad and ndfltr give their control devices
/// (`wv_driver.c:456`, `wm_driver.c:218`, `nd_driver.cpp:628`). Unprivileged RDMA
/// applications must reach the CM, as they reach WinVerbs; the IOCTL ABI confines each
/// handle to its own endpoints (design.md "The IOCTL ABI").
static SDDL: [u16; 57] = wdf::utf16("D:P(A;;GA;;;SY)(A;;GRGWGX;;;BA)(A;;GRGW;;;WD)(A;;GR;;;RC)");

/// The file context: the dispatch layer's handle for this open.
pub struct FileContext {
    file: Option<FileId>,
}

context_type!(FILE_CONTEXT, FileContext);

/// The host of the control device.
///
/// # Safety
///
/// `device` is the live control device made by [`create`] (its context is initialised);
/// the reference is used only inside one of its callbacks.
unsafe fn host_of<'a>(device: WDFDEVICE) -> &'a Host {
    // SAFETY: (C5) per this function's contract.
    unsafe { host::host_of(device as WDFOBJECT) }
}

/// The host of the control device that owns a queue.
///
/// # Safety
///
/// `queue` is a live queue of the control device; as [`host_of`].
unsafe fn host_of_queue<'a>(queue: WDFQUEUE) -> &'a Host {
    // SAFETY: (C7) per the contract the queue is live; WdfIoQueueGetDevice runs at
    // IRQL <= DISPATCH_LEVEL.
    let device = unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfIoQueueGetDevice, queue) };
    // SAFETY: (C8) the control device owns the queue.
    unsafe { host_of(device) }
}

/// Creates the control device and its host, and publishes the host in [`HOST`]
/// (PASSIVE_LEVEL, the driver's wait lock held, from the first filter device's add).
pub fn create(driver: WDFDRIVER, upcalls: Upcalls) -> Result<(), NTSTATUS> {
    let sddl = wdf::unicode(&SDDL);
    // SAFETY: (C9) PASSIVE_LEVEL; the driver handle is the framework's; the SDDL string
    // is copied by the framework.
    let mut init = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfControlDeviceInitAllocate,
            driver,
            &raw const sddl
        )
    };
    if init.is_null() {
        return Err(STATUS_INSUFFICIENT_RESOURCES);
    }
    let name = DeviceName::new(INSTANCE.fetch_add(1, Ordering::Relaxed));
    match create_with(&mut init, &name, upcalls) {
        Ok(()) => Ok(()),
        Err(status) => {
            if !init.is_null() {
                // SAFETY: (C10) WdfDeviceCreate did not take the structure (it nulls the
                // pointer when it does); it is freed once (wm_driver.c does the same).
                unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfDeviceInitFree, init) };
            }
            Err(status)
        }
    }
}

fn create_with(
    init: &mut PWDFDEVICE_INIT,
    name: &DeviceName,
    upcalls: Upcalls,
) -> Result<(), NTSTATUS> {
    let device_init = *init;
    // SAFETY: (C11) `device_init` is the allocated structure, valid until WdfDeviceCreate;
    // non-exclusive: several processes open the CM at once.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(WdfDeviceInitSetExclusive, device_init, 0);
    }
    // SAFETY: (C12) as C11; OR'ed into the characteristics: opens of names below the
    // device (`\\.\ibcm\x`) get the device's security check too.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetCharacteristics,
            device_init,
            FILE_DEVICE_SECURE_OPEN,
            1
        );
    }
    let name = wdf::unicode(name.units());
    // SAFETY: (C13) as C11; the name is copied.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitAssignName,
            device_init,
            &raw const name
        )
    })?;

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
    // SAFETY: (C14) as C11; both structures outlive the call.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetFileObjectConfig,
            device_init,
            &raw mut file_config,
            &raw mut file_attributes
        );
    }
    let mut request_attributes = wdf::attributes(core::ptr::null_mut(), Some(&REQUEST_CONTEXT));
    // SAFETY: (C15) as C11.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetRequestAttributes,
            device_init,
            &raw mut request_attributes
        );
    }

    let mut device_attributes = wdf::attributes(core::ptr::null_mut(), Some(&HOST_CONTEXT));
    device_attributes.EvtCleanupCallback = Some(evt_control_cleanup);
    let mut device: WDFDEVICE = core::ptr::null_mut();
    // SAFETY: (C16) as C11; on success the framework takes the structure (and nulls
    // `*init`) and writes the handle.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceCreate,
            init,
            &raw mut device_attributes,
            &raw mut device
        )
    })?;
    // SAFETY: (C17) the device was just created with a Host context.
    let host = unsafe { wdf::context::<Host>(device as WDFOBJECT, &HOST_CONTEXT) };
    // SAFETY: (C18) the context is framework memory sized and aligned for Host, not yet
    // initialised; writing it now, before anything can fail, means the cleanup callback
    // always drops an initialised value.
    unsafe { host.write(Host::new(device, upcalls)) };
    // SAFETY: (C19) just initialised; nothing else can reach it before it is published
    // below (the device takes no request before WdfControlFinishInitializing).
    let host = unsafe { &mut *host };
    let created = create_objects(device, host).and_then(|()| create_link(&name));
    if let Err(status) = created {
        // SAFETY: (C20) our device, never published; deleting runs the cleanup callback,
        // which drops the host.
        unsafe {
            wdk_sys::call_unsafe_wdf_function_binding!(WdfObjectDelete, device as WDFOBJECT);
        }
        return Err(status);
    }
    HOST.store(host, Ordering::Release);
    // SAFETY: (C21) the control device is fully set up; this lets it take creates.
    unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfControlFinishInitializing, device) };
    Ok(())
}

/// The host's child objects, the symbolic link and the default queue.
fn create_objects(device: WDFDEVICE, host: &mut Host) -> Result<(), NTSTATUS> {
    host.init_in_place()?;

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
    // SAFETY: (C22) configuration and attributes outlive the call; the device is live and
    // is the parent (a timer's parent must be a device or a queue).
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfTimerCreate,
            &raw mut timer_config,
            &raw mut attributes,
            &raw mut host.timer
        )
    })?;

    for (routine, handle) in [
        (
            host::evt_receive_dpc as unsafe extern "C" fn(_),
            &raw mut host.receive_dpc,
        ),
        (host::evt_delivery_dpc, &raw mut host.delivery_dpc),
        (host::evt_timer_dpc, &raw mut host.timer_dpc),
    ] {
        let mut dpc_config = WDF_DPC_CONFIG {
            Size: wdf::size_of_ulong::<WDF_DPC_CONFIG>(),
            EvtDpcFunc: Some(routine),
            AutomaticSerialization: 0,
        };
        let mut attributes = wdf::attributes(device as WDFOBJECT, None);
        // SAFETY: (C23) as C22; `handle` points into the host being set up.
        check(unsafe {
            wdk_sys::call_unsafe_wdf_function_binding!(
                WdfDpcCreate,
                &raw mut dpc_config,
                &raw mut attributes,
                handle
            )
        })?;
    }

    let mut work_item_config = WDF_WORKITEM_CONFIG {
        Size: wdf::size_of_ulong::<WDF_WORKITEM_CONFIG>(),
        EvtWorkItemFunc: Some(host::evt_replenish_work_item),
        AutomaticSerialization: 0,
    };
    let mut attributes = wdf::attributes(device as WDFOBJECT, None);
    // SAFETY: (C24) as C22.
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfWorkItemCreate,
            &raw mut work_item_config,
            &raw mut attributes,
            &raw mut host.replenish_work_item
        )
    })?;

    // WDF_IO_QUEUE_CONFIG_INIT_DEFAULT_QUEUE(parallel). A control device is not power
    // managed (its queues must not be: there is no power policy owner).
    let mut queue_config = WDF_IO_QUEUE_CONFIG {
        Size: wdf::size_of_ulong::<WDF_IO_QUEUE_CONFIG>(),
        DispatchType: _WDF_IO_QUEUE_DISPATCH_TYPE::WdfIoQueueDispatchParallel,
        PowerManaged: _WDF_TRI_STATE::WdfFalse,
        DefaultQueue: 1,
        EvtIoDeviceControl: Some(evt_io_device_control),
        ..WDF_IO_QUEUE_CONFIG::default()
    };
    queue_config.Settings.Parallel.NumberOfPresentedRequests = ULONG::MAX;
    // SAFETY: (C26) as C22; the queue handle is not needed (WdfDeviceGetDefaultQueue).
    check(unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfIoQueueCreate,
            device,
            &raw mut queue_config,
            WDF_NO_OBJECT_ATTRIBUTES,
            core::ptr::null_mut()
        )
    })
}

/// `\DosDevices\Global\ibcm` to the new device's name (PASSIVE_LEVEL, the driver's wait
/// lock held: the previous device's link was deleted when it was unpublished).
fn create_link(name: &UNICODE_STRING) -> Result<(), NTSTATUS> {
    let mut link = wdf::unicode(&SYMBOLIC_LINK);
    let mut target = *name;
    // SAFETY: (C25) PASSIVE_LEVEL; both strings outlive the call, which copies them.
    check(unsafe { IoCreateSymbolicLink(&raw mut link, &raw mut target) })
}

fn check(status: NTSTATUS) -> Result<(), NTSTATUS> {
    if NT_SUCCESS(status) {
        Ok(())
    } else {
        Err(status)
    }
}

/// Unpublishes the host (PASSIVE_LEVEL, the driver's wait lock held, the last filter
/// device is going): no filter binds to it and no new open reaches it (its link goes; a
/// handle opened before stays), so the next filter makes a new control device at once.
/// The host, for [`host::teardown`] and then [`delete`].
pub fn unpublish<'a>() -> Option<&'a Host> {
    let host = HOST.swap(core::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: (C27) a published host is the context of the live control device, which only
    // [`delete`] deletes, after this.
    let host = unsafe { host.as_ref() }?;
    let mut link = wdf::unicode(&SYMBOLIC_LINK);
    // SAFETY: (C34) PASSIVE_LEVEL; the link this module made for the published device
    // (`create_link`), deleted once: the host is unpublished above.
    let status = unsafe { IoDeleteSymbolicLink(&raw mut link) };
    if !NT_SUCCESS(status) {
        wdk::println!("ibcm: IoDeleteSymbolicLink: {status:#010x}");
    }
    Some(host)
}

/// Deletes an unpublished host's control device (PASSIVE_LEVEL, after
/// `host::teardown`). The host goes with the device's context once no file of it is
/// left (KMDF's ControlDeviceDelete).
pub fn delete(host: &Host) {
    // SAFETY: (C28) the control device is live and ours, deleted once (its host was
    // unpublished once); wm_driver.c `WmPowerD0Exit` deletes its control device the same
    // way when its last HCA goes.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(WdfObjectDelete, host.control as WDFOBJECT);
    }
}

/// The control device's EvtCleanupCallback: frees the CM and drops the host.
unsafe extern "C" fn evt_control_cleanup(object: WDFOBJECT) {
    // SAFETY: (C29) the object is the control device being deleted; its context was
    // initialised in `create_with` right after creation.
    let host = unsafe { wdf::context::<Host>(object, &HOST_CONTEXT) };
    // SAFETY: (C30) no callback can reach the host any more (its files, queue, timer,
    // DPCs and work item are gone, and it is unpublished), so this is the only reference.
    host::free_cm(unsafe { &*host });
    // SAFETY: (C31) initialised in `create_with`, dropped exactly once here; WDF frees the
    // memory.
    unsafe { core::ptr::drop_in_place(host) };
}

/// EvtTimerFunc (DISPATCH_LEVEL).
unsafe extern "C" fn evt_timer(timer: WDFTIMER) {
    // SAFETY: (C32) the timer is live during its callback; its parent is the control
    // device.
    let parent =
        unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfTimerGetParentObject, timer) };
    // SAFETY: (C33) the parent is the control device made by `create`.
    let host = unsafe { host_of(parent as WDFDEVICE) };
    host.timer_fired();
    if let Some(core) = host.core() {
        core.timer_expired();
    }
}

/// EvtDeviceFileCreate: a new handle of the dispatch layer.
unsafe extern "C" fn evt_file_create(
    device: WDFDEVICE,
    request: WDFREQUEST,
    file_object: WDFFILEOBJECT,
) {
    // SAFETY: (D30) the framework passes the control device, which is live during its
    // callbacks.
    let host = unsafe { host_of(device) };
    let opened = host.core().map(|core| core.open(caller_of(request)));
    let (file, status) = match opened {
        Some(Ok(file)) => (Some(file), STATUS_SUCCESS),
        Some(Err(status)) => (None, status),
        None => (None, STATUS_DEVICE_NOT_READY),
    };
    // SAFETY: (D31) the file object was created with a FileContext (file object attributes).
    let context = unsafe { wdf::context::<FileContext>(file_object as WDFOBJECT, &FILE_CONTEXT) };
    // SAFETY: (D32) framework memory for FileContext, written once before any other callback
    // of this file object (cleanup and close follow a successful create only).
    unsafe { context.write(FileContext { file }) };
    complete_request(request, status, 0);
}

/// Who opens the handle (policy of the dispatch layer, issue #30): an administrator if
/// the create came from kernel mode on a component's own behalf, or if the subject the
/// I/O manager captured for the open holds a token that is an elevated member of
/// Administrators (`SeTokenIsAdmin`); else a user.
///
/// - A kernel-mode create with `SL_FORCE_ACCESS_CHECK` in its stack location (a component
///   opening the name for a user, `IoCreateFile` with `IO_FORCE_ACCESS_CHECK` or
///   `OBJ_FORCE_ACCESS_CHECK`) is judged as a user-mode one, as the IRP_MJ_CREATE
///   contract asks (review-30 A6).
/// - The token is the one of `Parameters.Create.SecurityContext->AccessState`'s subject
///   context, which the I/O manager captured for this open, not the current thread's.
/// - An impersonation token below `SecurityImpersonation` (identification or anonymous),
///   and a restricted token (`SeTokenIsRestricted`), never count as an administrator's.
///
/// EvtDeviceFileCreate runs at PASSIVE_LEVEL in the opener's thread: the control device
/// has no queue for creates, so the framework calls it from the IRP_MJ_CREATE dispatch
/// routine.
fn caller_of(request: WDFREQUEST) -> Caller {
    // SAFETY: (D58) the create request is presented to this callback and not completed.
    let mode =
        unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfRequestGetRequestorMode, request) };
    // SAFETY: (D62) as D58: the request's IRP, live until the request is completed.
    let irp = unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfRequestWdmGetIrp, request) };
    if irp.is_null() {
        return Caller::User;
    }
    // SAFETY: (D63) the IRP is live; KMDF calls EvtDeviceFileCreate from its
    // IRP_MJ_CREATE dispatch with the IRP as it arrived (fxpkggeneral.cpp:1164-1173, 1301;
    // it copies the stack location only on paths that pass the create down, :1391), so
    // the current location is this device's.
    let stack = unsafe { crate::irp::current_stack_location(irp) };
    if stack.is_null() {
        return Caller::User;
    }
    // SAFETY: (D64) the stack location of a live IRP.
    let major = unsafe { (*stack).MajorFunction };
    if u32::from(major) != IRP_MJ_CREATE {
        return Caller::User;
    }
    // SAFETY: (D71) as D64.
    let flags = u32::from(unsafe { (*stack).Flags });
    if i32::from(mode) == _MODE::KernelMode && flags & SL_FORCE_ACCESS_CHECK == 0 {
        return Caller::Administrator;
    }
    // SAFETY: (D65) as D64; a copy of the `Parameters` union.
    let parameters = unsafe { (*stack).Parameters };
    // SAFETY: (D70) an IRP_MJ_CREATE's stack location holds the `Create` arm (wdm.h).
    let security = unsafe { parameters.Create }.SecurityContext;
    if security.is_null() {
        return Caller::User;
    }
    // SAFETY: (D66) the I/O manager's security context of this create, valid for the
    // create's dispatch.
    let access = unsafe { (*security).AccessState };
    if access.is_null() {
        return Caller::User;
    }
    // SAFETY: (D67) the access state's captured subject context, a place in the access
    // state, which lives as long as the create's dispatch.
    let subject = unsafe { &raw mut (*access).SubjectSecurityContext };
    // SAFETY: (D68) PASSIVE_LEVEL; a captured subject context; unlocked below.
    unsafe { SeLockSubjectContext(subject) };
    // SAFETY: (D69) the subject context is locked: its tokens stay as they are.
    let captured: SECURITY_SUBJECT_CONTEXT = unsafe { *subject };
    let (client, level, primary) = (
        captured.ClientToken,
        captured.ImpersonationLevel,
        captured.PrimaryToken,
    );
    // SeQuerySubjectContextToken (ntifs.h, a macro): the impersonation token if there is
    // one, else the process's; an identification-level one cannot act for its owner.
    let token = if client.is_null() {
        Some(primary)
    } else {
        (level >= _SECURITY_IMPERSONATION_LEVEL::SecurityImpersonation).then_some(client)
    };
    // A restricted token (a sandbox made from an administrator's) is not the
    // administrator's own, though SeTokenIsAdmin alone would count it.
    let admin = token.filter(|t| !t.is_null()).is_some_and(|t| {
        // SAFETY: (D60) a token of the locked subject context, referenced by it.
        let restricted = unsafe { SeTokenIsRestricted(t) } != 0;
        // SAFETY: (D72) as D60.
        !restricted && unsafe { SeTokenIsAdmin(t) } != 0
    });
    // An ordinary user's account: the token's user SID (one account, one key, for the
    // per-account budgets). A token whose user cannot be read leaves the handle an
    // account of its own.
    let caller = if admin {
        Caller::Administrator
    } else {
        token
            .filter(|t| !t.is_null())
            // SAFETY: (D73) as D60.
            .and_then(|t| unsafe { account_of(t) })
            .unwrap_or(Caller::User)
    };
    // SAFETY: (D61) unlocks what D68 locked, once.
    unsafe { SeUnlockSubjectContext(subject) };
    caller
}

/// The account of `token`'s user: `SeQueryInformationToken(TokenUser)` (PASSIVE_LEVEL),
/// the SID's bytes, the pool block freed.
///
/// # Safety
///
/// `token` is a token of a locked subject context (referenced by it).
unsafe fn account_of(token: PACCESS_TOKEN) -> Option<Caller> {
    let mut information: PVOID = core::ptr::null_mut();
    // SAFETY: (D74) PASSIVE_LEVEL; a referenced token; valid out pointer. The block it
    // returns is freed below.
    let status = unsafe {
        SeQueryInformationToken(
            token,
            _TOKEN_INFORMATION_CLASS::TokenUser,
            &raw mut information,
        )
    };
    if !NT_SUCCESS(status) || information.is_null() {
        return None;
    }
    // SAFETY: (D75) a TokenUser query's block starts with a TOKEN_USER (ntifs.h).
    let sid = unsafe { (*information.cast::<TOKEN_USER>()).User.Sid };
    let caller = (!sid.is_null())
        .then(|| {
            // SAFETY: (D76) the user's SID, in the block: its second byte is
            // SubAuthorityCount (winnt.h `SID`: Revision, SubAuthorityCount,
            // IdentifierAuthority[6], SubAuthority[]).
            let count_at = unsafe { sid.cast::<u8>().add(1) };
            // SAFETY: (D79) as D76.
            let count = unsafe { count_at.read() };
            // SID_MAX_SUB_AUTHORITIES (winnt.h); what RtlLengthSid computes, without the
            // import (8 bytes, and 4 per sub-authority).
            (count <= 15).then(|| {
                let length = 8 + 4 * usize::from(count);
                // SAFETY: (D77) the SID's `length` bytes, in the block until it is freed
                // below.
                let bytes = unsafe { core::slice::from_raw_parts(sid.cast::<u8>(), length) };
                Caller::of_account_sid(bytes)
            })
        })
        .flatten();
    // SAFETY: (D78) the block SeQueryInformationToken allocated, freed once.
    unsafe { ExFreePool(information) };
    caller
}

/// The dispatch layer's handle of a file object (None for a null file object).
///
/// # Safety
///
/// `file_object` is null or a live file object of the control device whose create
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

/// The host of the control device a file object was opened on.
///
/// # Safety
///
/// `file_object` is a live file object of the control device; as [`host_of`].
unsafe fn host_of_file<'a>(file_object: WDFFILEOBJECT) -> &'a Host {
    // SAFETY: (D35) per the contract the file object is live.
    let device =
        unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfFileObjectGetDevice, file_object) };
    // SAFETY: (D36) the file object belongs to the control device.
    unsafe { host_of(device) }
}

/// EvtFileCleanup (IRP_MJ_CLEANUP): the dispatch layer destroys the handle's endpoints and
/// completes its pending requests.
unsafe extern "C" fn evt_file_cleanup(file_object: WDFFILEOBJECT) {
    // SAFETY: (D51) the framework passes a live file object of this device, after a
    // successful create.
    let host = unsafe { host_of_file(file_object) };
    // SAFETY: (D52) as D51.
    let file = unsafe { file_of(file_object) };
    if let (Some(core), Some(file)) = (host.core(), file) {
        core.cleanup(file);
    }
}

/// EvtFileClose (IRP_MJ_CLOSE).
unsafe extern "C" fn evt_file_close(file_object: WDFFILEOBJECT) {
    // SAFETY: (D53) as D51.
    let host = unsafe { host_of_file(file_object) };
    // SAFETY: (D54) as D51.
    let file = unsafe { file_of(file_object) };
    if let (Some(core), Some(file)) = (host.core(), file) {
        let _known = core.close(file);
    }
}

/// EvtIoDeviceControl: every IOCTL goes to [`Device::dispatch`](ibcm_endpoint::Device::dispatch); this only retrieves the
/// buffers and makes the request cancelable.
unsafe extern "C" fn evt_io_device_control(
    queue: WDFQUEUE,
    request: WDFREQUEST,
    output_len: usize,
    input_len: usize,
    code: ULONG,
) {
    // SAFETY: (D55) the framework presents requests of this device's default queue.
    let host = unsafe { host_of_queue(queue) };
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
    let Some(core) = host.core() else {
        complete_request(request, STATUS_DEVICE_NOT_READY, 0);
        return;
    };
    // An input longer than any record is refused before it is copied into nonpaged pool.
    if let Some(status) = oversized_input(code, input_len) {
        complete_request(request, status, 0);
        return;
    }
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
    let key = host.next_key();
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
    // SAFETY: (D57) the queue that presented the request is the control device's.
    let host = unsafe { host_of_queue(queue) };
    if let Some(core) = host.core() {
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
            c"control.rs".as_ptr()
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
            c"control.rs".as_ptr()
        );
    }
}
