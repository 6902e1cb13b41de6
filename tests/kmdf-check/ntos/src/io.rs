//! The I/O manager as user mode and kernel components reach the control device: opens
//! with a token (the SDDL access check, the create IRP with its security context), IOCTLs
//! (METHOD_BUFFERED: one system buffer), cancellation from any thread, cleanup and close,
//! and the System log the driver writes with IoWriteErrorLogEntry.

use std::collections::HashMap;
use std::time::Duration;

use crate::objects::Kind;
use crate::security::{GENERIC_READ, GENERIC_WRITE, Token, granted};
use crate::state::{self, changed};
use crate::thread::{DISPATCH, KernelCode, PASSIVE, call_driver, require_irql};
use crate::verifier::{Rule, bugcheck};
use crate::wdf_device::{delete, dereference};
use crate::*;

/// An IRP as the binding reads it: the IRP, its one stack location, the create's security
/// context and access state (`Parameters.Create.SecurityContext->AccessState`).
#[repr(C)]
pub struct IrpBlock {
    pub irp: _IRP,
    pub stack: _IO_STACK_LOCATION,
    pub security: _IO_SECURITY_CONTEXT,
    pub access: _ACCESS_STATE,
}

pub struct RequestInfo {
    pub irp: Box<IrpBlock>,
    pub buffer: Vec<u8>,
    pub input_len: usize,
    pub output_len: usize,
    pub file: usize,
    pub queue: usize,
    pub marked: Option<PFN_WDF_REQUEST_CANCEL>,
    pub cancel_requested: bool,
    pub cancel_taken: bool,
    /// The cancel routine is about to run or has run (KMDF's FXREQUEST_FLAG_CANCELLED,
    /// set just before the call, fxioqueue.cpp:4910).
    pub cancel_invoked: bool,
    pub completed: bool,
    pub result: Option<(NTSTATUS, Vec<u8>)>,
}

pub struct FileInfo {
    pub device: usize,
    /// Requests of this file not completed (each keeps the file object referenced, so
    /// IRP_MJ_CLOSE comes after the last).
    pub outstanding: usize,
    /// Bound to the completion port ([`bind_completion_port`]).
    pub port_bound: bool,
}

#[derive(Default)]
pub struct Io {
    pub requests: HashMap<usize, RequestInfo>,
    pub files: HashMap<usize, FileInfo>,
    pub tokens: HashMap<usize, Box<Token>>,
    /// What `SeQueryInformationToken` returned, until `ExFreePool`.
    pub token_information: HashMap<usize, Box<[u64]>>,
    pub subject_locks: HashMap<usize, i32>,
    pub error_log: Vec<(NTSTATUS, Vec<String>)>,
    pub error_log_entries: HashMap<usize, Vec<u8>>,
    pub pnp_irps: PnpIrps,
    /// The completion port: requests of bound files, completed, in completion order.
    pub port: std::collections::VecDeque<usize>,
}

/// Who opens, and how.
#[derive(Clone, Copy, Debug)]
pub struct Open {
    /// UserMode (1) or KernelMode (0).
    pub user_mode: bool,
    /// A kernel component opening for a user (`SL_FORCE_ACCESS_CHECK`).
    pub force_access_check: bool,
    /// The process's token.
    pub primary: Token,
    /// An impersonation token and its level (`SECURITY_IMPERSONATION_LEVEL`).
    pub client: Option<(Token, i32)>,
    /// The access asked for (generic rights).
    pub desired: u32,
}

impl Open {
    /// A process of `token` opening for read and write, as the user library does.
    pub fn user(token: Token) -> Self {
        Self {
            user_mode: true,
            force_access_check: false,
            primary: token,
            client: None,
            desired: GENERIC_READ | GENERIC_WRITE,
        }
    }

    /// A kernel component opening on its own behalf (SYSTEM's thread).
    pub fn kernel() -> Self {
        Self {
            user_mode: false,
            force_access_check: false,
            primary: Token::SYSTEM,
            client: None,
            desired: GENERIC_READ | GENERIC_WRITE,
        }
    }
}

fn new_request(
    device: usize,
    file: usize,
    queue: usize,
    user_mode: bool,
    input: &[u8],
    output_len: usize,
) -> usize {
    let attributes = state::lock()
        .devices
        .devices
        .get(&device)
        .and_then(|d| d.init.request_attributes);
    let mut attributes = attributes;
    let pointer = attributes
        .as_mut()
        .map_or(core::ptr::null_mut(), |a| a as *mut _);
    let mut guard = state::lock();
    let handle = guard
        .objects
        .create(Kind::Request, pointer, device, "the I/O manager");
    // SAFETY: plain C structures: all-zero is their initial state.
    let mut irp: Box<IrpBlock> = Box::new(unsafe { core::mem::zeroed() });
    irp.irp.RequestorMode = if user_mode { 1 } else { 0 };
    let stack = &raw mut irp.stack;
    irp.irp
        .Tail
        .Overlay
        .__bindgen_anon_2
        .__bindgen_anon_1
        .CurrentStackLocation = stack;
    let mut buffer = vec![0u8; input.len().max(output_len)];
    buffer[..input.len()].copy_from_slice(input);
    guard.io.requests.insert(
        handle,
        RequestInfo {
            irp,
            buffer,
            input_len: input.len(),
            output_len,
            file,
            queue,
            marked: None,
            cancel_requested: false,
            cancel_taken: false,
            cancel_invoked: false,
            completed: false,
            result: None,
        },
    );
    if let Some(f) = guard.io.files.get_mut(&file) {
        f.outstanding += 1;
    }
    handle
}

/// The device behind `\DosDevices\Global\ibcm` (or any name).
pub fn device_named(name: &str) -> Option<usize> {
    let guard = state::lock();
    let name = guard.devices.links.get(name).map_or(name, String::as_str);
    guard.devices.names.get(name).copied()
}

/// CreateFile on `name` (a device name or a symbolic link): the I/O manager's access
/// check, then the driver's EvtDeviceFileCreate. The file handle on success.
pub fn open(name: &str, who: Open) -> Result<usize, NTSTATUS> {
    let _k = KernelCode::enter();
    let Some(device) = device_named(name) else {
        return Err(STATUS_OBJECT_NAME_NOT_FOUND);
    };
    let (sddl, finished, exclusive, file_attributes, create) = {
        let guard = state::lock();
        let Some(d) = guard.devices.devices.get(&device) else {
            return Err(STATUS_NO_SUCH_DEVICE);
        };
        (
            d.init.sddl.clone(),
            d.finished_initializing,
            d.init.exclusive,
            d.init.file_attributes,
            d.init.file_config.and_then(|c| c.EvtDeviceFileCreate),
        )
    };
    let deleted = state::lock()
        .objects
        .live
        .get(&device)
        .is_none_or(|o| o.delete_pending || o.deleting);
    if !finished || deleted {
        // DO_DEVICE_INITIALIZING, or the device object deleted: no create reaches it.
        return Err(STATUS_NO_SUCH_DEVICE);
    }
    if who.user_mode || who.force_access_check {
        let token = who.client.map_or(who.primary, |(t, _)| t);
        let allowed = sddl.as_deref().map_or(0, |s| granted(s, token));
        if who.desired & !allowed != 0 {
            return Err(STATUS_ACCESS_DENIED);
        }
    }
    if exclusive && state::lock().io.files.values().any(|f| f.device == device) {
        return Err(STATUS_ACCESS_DENIED);
    }
    let mut attributes = file_attributes;
    let pointer = attributes
        .as_mut()
        .map_or(core::ptr::null_mut(), |a| a as *mut _);
    let file = {
        let mut guard = state::lock();
        let file = guard
            .objects
            .create(Kind::File, pointer, device, "the I/O manager (create)");
        // The file object holds its device (~FxDevice waits for the last one).
        guard.objects.get(device, "create").references += 1;
        guard.io.files.insert(
            file,
            FileInfo {
                device,
                outstanding: 0,
                port_bound: false,
            },
        );
        file
    };
    let request = new_request(device, file, 0, who.user_mode, &[], 0);
    let primary = who.primary.leak();
    let client = who.client.map(|(t, level)| (t.leak(), level));
    {
        let mut guard = state::lock();
        let Some(r) = guard.io.requests.get_mut(&request) else {
            unreachable!("made above")
        };
        let block = &mut *r.irp;
        block.stack.MajorFunction = IRP_MJ_CREATE as u8;
        block.stack.Flags = if who.force_access_check {
            SL_FORCE_ACCESS_CHECK as u8
        } else {
            0
        };
        block.access.SubjectSecurityContext = SECURITY_SUBJECT_CONTEXT {
            ClientToken: client.map_or(core::ptr::null_mut(), |c| c.0),
            ImpersonationLevel: client.map_or(0, |c| c.1),
            PrimaryToken: primary,
            ProcessAuditId: core::ptr::null_mut(),
        };
        block.security.AccessState = &raw mut block.access;
        block.security.DesiredAccess = who.desired;
        block.stack.Parameters.Create = _IO_STACK_LOCATION__bindgen_ty_1__bindgen_ty_1 {
            SecurityContext: &raw mut block.security,
            Options: 0,
            __bindgen_padding_0: [0; 4],
            FileAttributes: 0,
            ShareAccess: 0,
            __bindgen_padding_1: [0; 4],
            EaLength: 0,
        };
    }
    let Some(create) = create else {
        bugcheck(
            Rule::Simulation,
            format_args!("the control device has no EvtDeviceFileCreate"),
        );
    };
    call_driver("EvtDeviceFileCreate", PASSIVE, || {
        // SAFETY: the driver's create callback with its device, the request and the file.
        unsafe {
            create(
                device as WDFDEVICE,
                request as WDFREQUEST,
                file as WDFFILEOBJECT,
            )
        }
    });
    let (status, _) = wait(request);
    let locked = state::lock().io.subject_locks.values().any(|c| *c != 0);
    if locked {
        bugcheck(
            Rule::SubjectContext,
            format_args!("the create returned with its subject context locked"),
        );
    }
    if NT_SUCCESS(status) {
        Ok(file)
    } else {
        // A failed create: no cleanup or close reaches the driver.
        state::lock().io.files.remove(&file);
        delete(file, "the I/O manager (failed create)");
        dereference(device, "the I/O manager (failed create)");
        Err(status)
    }
}

/// DeviceIoControl on `file` (METHOD_BUFFERED): the request, presented to the driver's
/// EvtIoDeviceControl in the caller's thread. Returns the request (an IRP the caller may
/// wait for or cancel).
pub fn ioctl(file: usize, code: u32, input: &[u8], output_len: usize) -> usize {
    ioctl_as(file, code, input, output_len, PASSIVE, true)
}

/// [`ioctl`] from a caller at `level` (a kernel component may send at DISPATCH_LEVEL; the
/// parallel queue presents the request in the caller's context), in user or kernel mode.
/// After IRP_MJ_CLEANUP an IRP may still come: a thread inside DeviceIoControl holds the
/// file object, not the handle.
pub fn ioctl_as(
    file: usize,
    code: u32,
    input: &[u8],
    output_len: usize,
    level: u8,
    user_mode: bool,
) -> usize {
    let _k = KernelCode::enter();
    let device = {
        let guard = state::lock();
        match guard.io.files.get(&file) {
            Some(f) => f.device,
            None => bugcheck(
                Rule::Simulation,
                format_args!("ioctl on a file that is not open"),
            ),
        }
    };
    let queue = state::lock()
        .devices
        .devices
        .get(&device)
        .and_then(|d| d.default_queue);
    let Some((queue, Some(callback))) = queue else {
        bugcheck(
            Rule::Simulation,
            format_args!("the device has no default queue for IOCTLs"),
        );
    };
    let request = new_request(device, file, queue, user_mode, input, output_len);
    call_driver("EvtIoDeviceControl", level, || {
        // SAFETY: the driver's queue callback with its queue and a presented request.
        unsafe {
            callback(
                queue as WDFQUEUE,
                request as WDFREQUEST,
                output_len,
                input.len(),
                code,
            )
        }
    });
    request
}

/// The request's completion, if it completed.
pub fn result(request: usize) -> Option<(NTSTATUS, Vec<u8>)> {
    state::lock()
        .io
        .requests
        .get(&request)
        .and_then(|r| r.result.clone())
}

/// Waits for the request's completion (a request never completed fails the run).
pub fn wait(request: usize) -> (NTSTATUS, Vec<u8>) {
    let what = || format!("request {request:#x} to complete");
    let guard = state::lock();
    let (guard, _) = state::wait_until(guard, None, &what, |s| {
        s.io.requests.get(&request).is_some_and(|r| r.completed)
    });
    guard
        .io
        .requests
        .get(&request)
        .and_then(|r| r.result.clone())
        .unwrap_or((STATUS_SUCCESS, Vec::new()))
}

/// Waits at most `limit` for the request's completion.
pub fn wait_for(request: usize, limit: Duration) -> Option<(NTSTATUS, Vec<u8>)> {
    let what = || format!("request {request:#x} to complete");
    let guard = state::lock();
    let (guard, done) = state::wait_until(guard, Some(limit), &what, |s| {
        s.io.requests.get(&request).is_some_and(|r| r.completed)
    });
    if !done {
        return None;
    }
    guard
        .io
        .requests
        .get(&request)
        .and_then(|r| r.result.clone())
}

/// How long a claimed cancellation waits before its routine runs: KMDF hands it to the
/// queue's dispatcher (CancelForDriver -> DispatchInternalEvents), and a completion from
/// another thread in that window must not happen (the window is kept wide so a scenario
/// that races cancellation with completion reaches it).
const CANCEL_DISPATCH_DELAY: Duration = Duration::from_millis(2);

/// IoCancelIrp from this thread: the driver's cancel routine runs (at DISPATCH_LEVEL)
/// if the request is cancelable; otherwise the IRP is marked and a later
/// WdfRequestMarkCancelableEx returns STATUS_CANCELLED.
pub fn cancel(request: usize) {
    let routine = {
        let _k = KernelCode::enter();
        let mut guard = state::lock();
        let Some(r) = guard.io.requests.get_mut(&request) else {
            return;
        };
        if r.completed {
            return;
        }
        r.cancel_requested = true;
        r.irp.irp.Cancel = 1;
        let routine = match r.marked {
            Some(routine) if !r.cancel_taken => {
                r.cancel_taken = true;
                routine
            }
            _ => None,
        };
        // KMDF holds the queue's reference on the request until the cancel routine
        // returns ("we are responsible for this final dereference after calling into the
        // driver", fxioqueue.cpp CancelForDriver): a request completed inside the routine
        // stays valid until it returns.
        if routine.is_some() {
            guard.objects.get(request, "IoCancelIrp").references += 1;
        }
        routine
    };
    if let Some(routine) = routine {
        // The window between the cancel being claimed and the routine being called is
        // real on Windows (CancelForDriver queues it for the dispatcher): a completion in
        // it is "Completing Cancelable WDFREQUEST" (fxrequest.cpp:399-427).
        std::thread::sleep(CANCEL_DISPATCH_DELAY);
        if let Some(r) = state::lock().io.requests.get_mut(&request) {
            r.cancel_invoked = true;
        }
        call_driver("EvtRequestCancel", DISPATCH, || {
            // SAFETY: the driver's cancel routine with its cancelable request.
            unsafe { routine(request as WDFREQUEST) }
        });
        dereference(request, "IoCancelIrp");
    }
}

/// CloseHandle: IRP_MJ_CLEANUP (EvtFileCleanup) at once; IRP_MJ_CLOSE (EvtFileClose) once
/// every request of the file completed; then the file object goes.
pub fn close(file: usize) {
    cleanup(file);
    close_after_cleanup(file);
}

fn file_config(file: usize) -> (usize, WDF_FILEOBJECT_CONFIG) {
    let device = state::lock().io.files.get(&file).map(|f| f.device);
    let Some(device) = device else {
        bugcheck(Rule::Simulation, format_args!("file {file:#x} is not open"));
    };
    let config = state::lock()
        .devices
        .devices
        .get(&device)
        .and_then(|d| d.init.file_config);
    let config = config.unwrap_or_else(|| {
        bugcheck(
            Rule::Simulation,
            format_args!("no file object configuration"),
        )
    });
    (device, config)
}

/// The last handle of the file object closed: IRP_MJ_CLEANUP (EvtFileCleanup).
pub fn cleanup(file: usize) {
    let _k = KernelCode::enter();
    let (_, config) = file_config(file);
    if let Some(cleanup) = config.EvtFileCleanup {
        call_driver("EvtFileCleanup", PASSIVE, || {
            // SAFETY: the driver's cleanup callback with its open file object.
            unsafe { cleanup(file as WDFFILEOBJECT) }
        });
    }
}

/// The file object's last reference gone: IRP_MJ_CLOSE (EvtFileClose), which comes once
/// every request of the file completed (a request left pending is a close that never
/// comes); then the file object goes.
pub fn close_after_cleanup(file: usize) {
    let _k = KernelCode::enter();
    let (device, config) = file_config(file);
    let guard = state::lock();
    let what =
        || format!("IRP_MJ_CLOSE: every request of file {file:#x} to complete after its cleanup");
    let (guard, _) = state::wait_until(guard, None, &what, |s| {
        s.io.files.get(&file).is_none_or(|f| f.outstanding == 0)
    });
    drop(guard);
    if let Some(close) = config.EvtFileClose {
        call_driver("EvtFileClose", PASSIVE, || {
            // SAFETY: the driver's close callback with the file object.
            unsafe { close(file as WDFFILEOBJECT) }
        });
    }
    state::lock().io.files.remove(&file);
    delete(file, "the I/O manager (close)");
    dereference(device, "the I/O manager (close)");
    crate::wdf_device::after_last_close(device);
}

/// The System log entries the driver wrote: (ErrorCode, insertion strings).
pub fn system_log() -> Vec<(NTSTATUS, Vec<String>)> {
    state::lock().io.error_log.clone()
}

/// `ERROR_LOG_MAXIMUM_SIZE` (wdm.h).
const ERROR_LOG_MAXIMUM_SIZE: usize = 240;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn IoAllocateErrorLogEntry(_IoObject: PVOID, EntrySize: UCHAR) -> PVOID {
    let _k = KernelCode::enter();
    require_irql("IoAllocateErrorLogEntry", DISPATCH);
    let size = usize::from(EntrySize);
    if size > ERROR_LOG_MAXIMUM_SIZE || size < size_of::<IO_ERROR_LOG_PACKET>() {
        return core::ptr::null_mut();
    }
    let mut entry = vec![0u8; size];
    let p = entry.as_mut_ptr();
    state::lock().io.error_log_entries.insert(p as usize, entry);
    p.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn IoWriteErrorLogEntry(ElEntry: PVOID) {
    let _k = KernelCode::enter();
    require_irql("IoWriteErrorLogEntry", DISPATCH);
    let mut guard = state::lock();
    let Some(entry) = guard.io.error_log_entries.remove(&(ElEntry as usize)) else {
        drop(guard);
        bugcheck(
            Rule::Simulation,
            format_args!("IoWriteErrorLogEntry of an entry IoAllocateErrorLogEntry did not give"),
        );
    };
    // SAFETY: the entry starts with the packet the driver filled in.
    let packet: IO_ERROR_LOG_PACKET = unsafe { core::ptr::read_unaligned(entry.as_ptr().cast()) };
    let mut strings = Vec::new();
    let mut offset = usize::from(packet.StringOffset);
    for _ in 0..packet.NumberOfStrings {
        let mut units = Vec::new();
        while offset + 1 < entry.len() {
            let u = u16::from_le_bytes([entry[offset], entry[offset + 1]]);
            offset += 2;
            if u == 0 {
                break;
            }
            units.push(u);
        }
        strings.push(String::from_utf16_lossy(&units));
    }
    guard.io.error_log.push((packet.ErrorCode, strings));
    drop(guard);
    changed();
}

/// An `IRP_MJ_PNP` / `IRP_MN_QUERY_INTERFACE` IRP on its way down a two-location stack:
/// `locations[1]` the filter's (where it enters), `locations[0]` ibbus's below it (wdm.h:
/// `IoGetNextIrpStackLocation` is `CurrentStackLocation - 1`).
#[repr(C)]
struct PnpIrp {
    irp: _IRP,
    locations: [_IO_STACK_LOCATION; 2],
    completed: bool,
}

/// Live PnP IRPs by address.
#[derive(Default)]
pub struct PnpIrps(HashMap<usize, Box<PnpIrp>>);

// SAFETY: the IRPs' pointers point into their own boxes, reached under the lock.
unsafe impl Send for PnpIrps {}

/// What answered a query below the filter (ibbus's `__query_cm_ifc` answers the CM GUID
/// with AL's CM; the simulation marks the interface it writes with this version).
pub const AL_CM_MARK: u16 = 0xA1A1;

/// `IRP_MN_QUERY_INTERFACE` sent to the filter device `device` from above (a client's
/// `WdfFdoQueryForInterface`, which starts at the top of the stack): the filter's
/// preprocess routine answers it or passes it down, where ibbus answers the CM GUID with
/// AL's CM (marked [`AL_CM_MARK`]) and nothing else. Returns the IRP's status.
pub fn query_interface(
    device: usize,
    guid: &GUID,
    interface: PINTERFACE,
    size: u16,
    version: u16,
) -> NTSTATUS {
    query_interface_with(
        device,
        guid,
        interface,
        size,
        version,
        core::ptr::null_mut(),
    )
}

/// The filter device on CA `ca`'s stack (the top of the stack ibbus queries from,
/// `IoGetAttachedDeviceReference`), if one was added.
pub fn filter_of_ca(ca: usize) -> Option<usize> {
    let guard = state::lock();
    guard
        .devices
        .devices
        .iter()
        .find(|(_, d)| d.init.hca == ca && !d.init.control && d.init.preprocess.is_some())
        .map(|(h, _)| *h)
}

/// [`query_interface`] with `InterfaceSpecificData` (ibbus passes its FDO extension,
/// bus_pnp.c:400).
pub fn query_interface_with(
    device: usize,
    guid: &GUID,
    interface: PINTERFACE,
    size: u16,
    version: u16,
    specific: PVOID,
) -> NTSTATUS {
    let preprocess = state::lock()
        .devices
        .devices
        .get(&device)
        .and_then(|d| d.init.preprocess);
    let Some(preprocess) = preprocess else {
        bugcheck(
            Rule::Simulation,
            format_args!("the device has no IRP_MN_QUERY_INTERFACE preprocess"),
        );
    };
    // SAFETY: plain C structures: all-zero is their initial state.
    let mut block: Box<PnpIrp> = Box::new(unsafe { core::mem::zeroed() });
    block.irp.StackCount = 2;
    block.irp.CurrentLocation = 2;
    block.irp.IoStatus.__bindgen_anon_1.Status = STATUS_NOT_SUPPORTED;
    for l in &mut block.locations {
        l.MajorFunction = IRP_MJ_PNP as u8;
        l.MinorFunction = IRP_MN_QUERY_INTERFACE as u8;
    }
    block.locations[1].Parameters.QueryInterface =
        _IO_STACK_LOCATION__bindgen_ty_1__bindgen_ty_26 {
            InterfaceType: guid,
            Size: size,
            Version: version,
            Interface: interface,
            InterfaceSpecificData: specific,
        };
    let current = &raw mut block.locations[1];
    block
        .irp
        .Tail
        .Overlay
        .__bindgen_anon_2
        .__bindgen_anon_1
        .CurrentStackLocation = current;
    let irp = &raw mut block.irp;
    state::lock().io.pnp_irps.0.insert(irp as usize, block);
    let status = call_driver("EvtDeviceWdmIrpPreprocess", PASSIVE, || {
        // SAFETY: the driver's preprocess routine with its device and a live IRP.
        unsafe { preprocess(device as WDFDEVICE, irp) }
    });
    let block = state::lock().io.pnp_irps.0.remove(&(irp as usize));
    let Some(block) = block else {
        unreachable!("inserted above")
    };
    if !block.completed {
        bugcheck(
            Rule::RequestCompleted,
            format_args!("the query-interface IRP was neither completed nor passed down"),
        );
    }
    // SAFETY: the status arm of the IO_STATUS_BLOCK union, set at completion.
    let irp_status = unsafe { block.irp.IoStatus.__bindgen_anon_1.Status };
    if irp_status != status {
        bugcheck(
            Rule::Simulation,
            format_args!(
                "the preprocess routine returned {status:#x}, the IRP completed with {irp_status:#x}"
            ),
        );
    }
    status
}

/// Completes a PnP IRP of the simulation once.
fn complete_pnp(irp: PIRP, function: &str) {
    let mut guard = state::lock();
    let Some(block) = guard.io.pnp_irps.0.get_mut(&(irp as usize)) else {
        drop(guard);
        bugcheck(
            Rule::Simulation,
            format_args!("{function} on an IRP the simulation did not send"),
        );
    };
    if block.completed {
        drop(guard);
        bugcheck(
            Rule::RequestCompleted,
            format_args!("{function}: the IRP is already completed (DoubleCompletion)"),
        );
    }
    block.completed = true;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn IofCompleteRequest(Irp: PIRP, _PriorityBoost: CCHAR) {
    let _k = KernelCode::enter();
    require_irql("IofCompleteRequest", DISPATCH);
    if crate::thread::held_locks() > 0 {
        bugcheck(
            Rule::CompleteUnderLock,
            format_args!("IofCompleteRequest with a spin lock held"),
        );
    }
    complete_pnp(Irp, "IofCompleteRequest");
}

/// The framework sends the preprocessed IRP to the next lower driver (`IoCallDriver`:
/// the lower driver's location is `CurrentStackLocation - 1`, what the filter skipped
/// back to or copied into). ibbus answers the CM GUID with AL's CM and completes the rest
/// unanswered; a completion routine the filter set in ibbus's location runs then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfDeviceWdmDispatchPreprocessedIrp(
    Device: WDFDEVICE,
    Irp: PIRP,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfDeviceWdmDispatchPreprocessedIrp", DISPATCH);
    state::lock().objects.get_kind(
        Device as usize,
        Kind::Device,
        "WdfDeviceWdmDispatchPreprocessedIrp",
    );
    let (lower, top) = {
        let mut guard = state::lock();
        let Some(block) = guard.io.pnp_irps.0.get_mut(&(Irp as usize)) else {
            drop(guard);
            bugcheck(
                Rule::Simulation,
                format_args!(
                    "WdfDeviceWdmDispatchPreprocessedIrp on an IRP the simulation did not send"
                ),
            );
        };
        (&raw mut block.locations[0], &raw mut block.locations[1])
    };
    // SAFETY: the live IRP the simulation sent (checked above), handed back by the
    // preprocess routine.
    let irp = unsafe { &mut *Irp };
    let tail = irp.Tail;
    // SAFETY: a dispatched IRP uses the `Overlay` arm of `Tail` (wdm.h).
    let overlay = unsafe { tail.Overlay };
    // SAFETY: ... and its `CurrentStackLocation` arm.
    let current = unsafe {
        overlay
            .__bindgen_anon_2
            .__bindgen_anon_1
            .CurrentStackLocation
    };
    // IoCallDriver: the lower driver gets `CurrentStackLocation - 1`: the filter's own
    // location after IoSkipCurrentIrpStackLocation, the next one after
    // IoCopyCurrentIrpStackLocationToNext; anything else was not prepared for it.
    let below = current.wrapping_sub(1);
    if below != lower && below != top {
        bugcheck(
            Rule::Simulation,
            format_args!(
                "the IRP handed back has no stack location for the lower driver (IoSkipCurrentIrpStackLocation or IoCopyCurrentIrpStackLocationToNext first)"
            ),
        );
    }
    // SAFETY: the lower driver's location of the live IRP (checked above).
    let location = unsafe { *below };
    // SAFETY: an IRP_MN_QUERY_INTERFACE location carries `Parameters.QueryInterface`.
    let query = unsafe { location.Parameters.QueryInterface };
    // SAFETY: the sender's GUID.
    let guid = unsafe { *query.InterfaceType };
    let cm = (guid.Data1, guid.Data2, guid.Data3) == (0x6A11_D060, 0x8957, 0x49E6);
    let verbs =
        (guid.Data1, guid.Data2, guid.Data3, guid.Data4) == crate::hca::GUID_RDMA_INTERFACE_VERBS;
    let ca = state::lock()
        .devices
        .devices
        .get(&(Device as usize))
        .map(|d| d.init.hca);
    let ca_guid = ca.and_then(|ca| {
        state::lock()
            .al
            .cas
            .get(ca)
            .map(|c| (ca, c.ca_guid, c.verbs))
    });
    let status = if verbs {
        // ibbus passes it down (fdo_query_interface); the HCA's FDO answers it
        // (drv.c `__start_card`, WdfDeviceAddQueryInterface).
        match ca_guid {
            Some((ca, guid, true)) => {
                crate::hca::answer_verbs_query(ca, guid, query.Interface, query.Size, query.Version)
            }
            _ => STATUS_NOT_SUPPORTED,
        }
    } else if cm && !query.Interface.is_null() {
        // SAFETY: the sender's INTERFACE buffer; only the header is written, marked.
        unsafe {
            (*query.Interface).Version = AL_CM_MARK;
        }
        STATUS_SUCCESS
    } else {
        STATUS_NOT_SUPPORTED
    };
    irp.IoStatus.__bindgen_anon_1 = _IO_STATUS_BLOCK__bindgen_ty_1 { Status: status };
    complete_pnp(Irp, "the lower driver's completion");
    if let Some(routine) = location.CompletionRoutine {
        call_driver("IO_COMPLETION_ROUTINE", PASSIVE, || {
            // SAFETY: the filter's completion routine with its context, as the I/O
            // manager calls it while the IRP completes upwards.
            let _ = unsafe { routine(Device.cast(), Irp, location.Context) };
        });
    }
    status
}

/// A device's security as the I/O manager holds it: (SDDL, characteristics, exclusive).
pub fn device_security(name: &str) -> Option<(Option<String>, u32, bool)> {
    let device = device_named(name)?;
    let guard = state::lock();
    let d = guard.devices.devices.get(&device)?;
    Some((
        d.init.sddl.clone(),
        d.init.characteristics,
        d.init.exclusive,
    ))
}

/// Binds `file` to the simulation's completion port (`CreateIoCompletionPort` on an
/// overlapped handle): each of its requests, once completed, is queued for
/// [`dequeue_completion`] and leaves the simulation's books there.
pub fn bind_completion_port(file: usize) {
    if let Some(f) = state::lock().io.files.get_mut(&file) {
        f.port_bound = true;
    }
}

/// `GetQueuedCompletionStatus`: the next completed request of a bound file, its status
/// and output, waiting up to `limit`.
pub fn dequeue_completion(limit: Duration) -> Option<(usize, NTSTATUS, Vec<u8>)> {
    let what = || "a completion packet".to_string();
    let guard = state::lock();
    let (mut guard, queued) =
        state::wait_until(guard, Some(limit), &what, |s| !s.io.port.is_empty());
    if !queued {
        return None;
    }
    let request = guard.io.port.pop_front()?;
    let (status, output) = guard
        .io
        .requests
        .remove(&request)
        .and_then(|r| r.result)
        .unwrap_or((STATUS_CANCELLED, Vec::new()));
    Some((request, status, output))
}
