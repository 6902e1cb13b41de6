//! A small KMDF driver that breaks one rule on demand, to show each of the simulated
//! verifier's rules firing on a WDF call (the binding keeps them all). It makes a control
//! device with a parallel default queue; its EvtIoDeviceControl does the fault the IOCTL
//! code names.

use std::sync::atomic::{AtomicPtr, Ordering};

use ibcm_ntos::*;

/// The faults, by IOCTL code.
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum Fault {
    CompleteTwice = 1,
    CompleteWhileCancelable,
    UnmarkNotCancelable,
    MarkTwice,
    InformationPastBuffer,
    TouchAfterCompletion,
    DeleteRequest,
    DereferenceTooOften,
    CompleteUnderSpinLock,
    WrongContextType,
    RegistryAtDispatch,
    WaitLockReleasedByNonOwner,
    RundownReleasedTooOften,
    LowerIrqlUpwards,
    TimerDeletedTwice,
    RundownNeverReleased,
    LocksInBothOrders,
    OuterLockReleasedFirst,
}

/// A context type the driver declares but gives no object.
struct Unused;
struct SyncInfo(WDF_OBJECT_CONTEXT_TYPE_INFO);
// SAFETY: read-only after its constant initialisation.
unsafe impl Sync for SyncInfo {}

static UNUSED_CONTEXT: SyncInfo = SyncInfo(WDF_OBJECT_CONTEXT_TYPE_INFO {
    Size: size_of::<WDF_OBJECT_CONTEXT_TYPE_INFO>() as u32,
    ContextName: c"Unused".as_ptr(),
    ContextSize: size_of::<Unused>(),
    UniqueType: &raw const UNUSED_CONTEXT.0,
    EvtDriverGetUniqueContextType: None,
});

static DRIVER: AtomicPtr<core::ffi::c_void> = AtomicPtr::new(core::ptr::null_mut());
static DEVICE: AtomicPtr<core::ffi::c_void> = AtomicPtr::new(core::ptr::null_mut());

/// `\Device\bad`.
pub const NAME: &str = r"\Device\bad";

fn attributes(parent: WDFOBJECT) -> WDF_OBJECT_ATTRIBUTES {
    WDF_OBJECT_ATTRIBUTES {
        Size: size_of::<WDF_OBJECT_ATTRIBUTES>() as u32,
        ExecutionLevel: _WDF_EXECUTION_LEVEL::WdfExecutionLevelInheritFromParent,
        SynchronizationScope: _WDF_SYNCHRONIZATION_SCOPE::WdfSynchronizationScopeInheritFromParent,
        ParentObject: parent,
        ..WDF_OBJECT_ATTRIBUTES::default()
    }
}

fn unicode(units: &[u16]) -> UNICODE_STRING {
    UNICODE_STRING {
        Length: (units.len() * 2) as u16,
        MaximumLength: (units.len() * 2) as u16,
        Buffer: units.as_ptr().cast_mut(),
    }
}

/// DriverEntry: the driver and its control device.
pub unsafe extern "system" fn driver_entry(
    driver: PDRIVER_OBJECT,
    path: PCUNICODE_STRING,
) -> NTSTATUS {
    let mut config = WDF_DRIVER_CONFIG {
        Size: size_of::<WDF_DRIVER_CONFIG>() as u32,
        ..WDF_DRIVER_CONFIG::default()
    };
    let mut handle: WDFDRIVER = core::ptr::null_mut();
    // SAFETY: DriverEntry's arguments; the out pointer and configuration outlive the call.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDriverCreate,
            driver,
            path,
            WDF_NO_OBJECT_ATTRIBUTES,
            &raw mut config,
            &raw mut handle
        )
    };
    assert_eq!(status, 0);
    DRIVER.store(handle.cast(), Ordering::Release);
    let sddl: Vec<u16> = "D:P(A;;GA;;;WD)".encode_utf16().collect();
    let sddl = unicode(&sddl);
    // SAFETY: PASSIVE_LEVEL, the driver just made.
    let mut init = unsafe {
        call_unsafe_wdf_function_binding!(WdfControlDeviceInitAllocate, handle, &raw const sddl)
    };
    let name: Vec<u16> = NAME.encode_utf16().collect();
    let name = unicode(&name);
    // SAFETY: the init just allocated.
    let _ = unsafe {
        call_unsafe_wdf_function_binding!(WdfDeviceInitAssignName, init, &raw const name)
    };
    let mut files = WDF_FILEOBJECT_CONFIG {
        Size: size_of::<WDF_FILEOBJECT_CONFIG>() as u32,
        EvtDeviceFileCreate: Some(file_create),
        EvtFileClose: None,
        EvtFileCleanup: None,
        AutoForwardCleanupClose: _WDF_TRI_STATE::WdfUseDefault,
        FileObjectClass: _WDF_FILEOBJECT_CLASS::WdfFileObjectWdfCannotUseFsContexts,
    };
    // SAFETY: as above.
    unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceInitSetFileObjectConfig,
            init,
            &raw mut files,
            WDF_NO_OBJECT_ATTRIBUTES
        )
    };
    let mut device: WDFDEVICE = core::ptr::null_mut();
    // SAFETY: as above; the framework takes the init.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceCreate,
            &raw mut init,
            WDF_NO_OBJECT_ATTRIBUTES,
            &raw mut device
        )
    };
    assert_eq!(status, 0);
    DEVICE.store(device.cast(), Ordering::Release);
    let mut queue = WDF_IO_QUEUE_CONFIG {
        Size: size_of::<WDF_IO_QUEUE_CONFIG>() as u32,
        DispatchType: _WDF_IO_QUEUE_DISPATCH_TYPE::WdfIoQueueDispatchParallel,
        PowerManaged: _WDF_TRI_STATE::WdfFalse,
        DefaultQueue: 1,
        EvtIoDeviceControl: Some(device_control),
        ..WDF_IO_QUEUE_CONFIG::default()
    };
    // SAFETY: the live device.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfIoQueueCreate,
            device,
            &raw mut queue,
            WDF_NO_OBJECT_ATTRIBUTES,
            core::ptr::null_mut()
        )
    };
    assert_eq!(status, 0);
    // SAFETY: the device is set up.
    unsafe { call_unsafe_wdf_function_binding!(WdfControlFinishInitializing, device) };
    0
}

unsafe extern "C" fn file_create(_device: WDFDEVICE, request: WDFREQUEST, _file: WDFFILEOBJECT) {
    // SAFETY: the presented create request, completed once.
    unsafe { call_unsafe_wdf_function_binding!(WdfRequestCompleteWithInformation, request, 0, 0) };
}

fn complete(request: WDFREQUEST) {
    // SAFETY: the request presented to this driver.
    unsafe { call_unsafe_wdf_function_binding!(WdfRequestCompleteWithInformation, request, 0, 0) };
}

unsafe extern "C" fn cancel(_request: WDFREQUEST) {}

unsafe extern "C" fn device_control(
    _queue: WDFQUEUE,
    request: WDFREQUEST,
    _out: usize,
    _in: usize,
    code: ULONG,
) {
    let device: WDFDEVICE = DEVICE.load(Ordering::Acquire).cast();
    match code {
        c if c == Fault::CompleteTwice as u32 => {
            complete(request);
            complete(request);
        }
        c if c == Fault::CompleteWhileCancelable as u32 => {
            // SAFETY: the presented request; the fault follows.
            let _ = unsafe {
                call_unsafe_wdf_function_binding!(WdfRequestMarkCancelableEx, request, Some(cancel))
            };
            complete(request);
        }
        c if c == Fault::UnmarkNotCancelable as u32 => {
            // SAFETY: the presented request, never marked: the fault.
            let _ =
                unsafe { call_unsafe_wdf_function_binding!(WdfRequestUnmarkCancelable, request) };
        }
        c if c == Fault::MarkTwice as u32 => {
            for _ in 0..2 {
                // SAFETY: the presented request; the second mark is the fault.
                let _ = unsafe {
                    call_unsafe_wdf_function_binding!(
                        WdfRequestMarkCancelableEx,
                        request,
                        Some(cancel)
                    )
                };
            }
        }
        c if c == Fault::InformationPastBuffer as u32 => {
            // SAFETY: the presented request; 4096 bytes reported of a 16-byte buffer.
            unsafe {
                call_unsafe_wdf_function_binding!(
                    WdfRequestCompleteWithInformation,
                    request,
                    0,
                    4096
                )
            };
        }
        c if c == Fault::TouchAfterCompletion as u32 => {
            complete(request);
            // SAFETY: the fault: a completed request.
            let _ = unsafe { call_unsafe_wdf_function_binding!(WdfRequestGetFileObject, request) };
        }
        c if c == Fault::DeleteRequest as u32 => {
            // SAFETY: the fault: a request the framework delivered.
            unsafe { call_unsafe_wdf_function_binding!(WdfObjectDelete, request as WDFOBJECT) };
        }
        c if c == Fault::DereferenceTooOften as u32 => {
            // SAFETY: the fault: a dereference without a reference.
            unsafe {
                call_unsafe_wdf_function_binding!(
                    WdfObjectDereferenceActual,
                    request as WDFOBJECT,
                    core::ptr::null_mut(),
                    0,
                    c"bad".as_ptr()
                )
            };
        }
        c if c == Fault::CompleteUnderSpinLock as u32 => {
            let mut lock: KSPIN_LOCK = 0;
            // SAFETY: a spin lock on this stack.
            let _old = unsafe { ntddk::KeAcquireSpinLockRaiseToDpc(&raw mut lock) };
            complete(request);
        }
        c if c == Fault::WrongContextType as u32 => {
            // SAFETY: the fault: the device has no context of this type.
            let _ = unsafe {
                call_unsafe_wdf_function_binding!(
                    WdfObjectGetTypedContextWorker,
                    device as WDFOBJECT,
                    &raw const UNUSED_CONTEXT.0
                )
            };
        }
        c if c == Fault::RegistryAtDispatch as u32 => {
            let driver: WDFDRIVER = DRIVER.load(Ordering::Acquire).cast();
            let mut key: WDFKEY = core::ptr::null_mut();
            // SAFETY: raises to DISPATCH_LEVEL; the fault follows.
            let _old = unsafe { ntddk::KfRaiseIrql(2) };
            // SAFETY: the fault: a PASSIVE_LEVEL function at DISPATCH_LEVEL.
            let _ = unsafe {
                call_unsafe_wdf_function_binding!(
                    WdfDriverOpenParametersRegistryKey,
                    driver,
                    KEY_READ,
                    WDF_NO_OBJECT_ATTRIBUTES,
                    &raw mut key
                )
            };
        }
        c if c == Fault::WaitLockReleasedByNonOwner as u32 => {
            let mut lock: WDFWAITLOCK = core::ptr::null_mut();
            // SAFETY: a wait lock parented to the driver.
            let _ = unsafe {
                call_unsafe_wdf_function_binding!(
                    WdfWaitLockCreate,
                    WDF_NO_OBJECT_ATTRIBUTES,
                    &raw mut lock
                )
            };
            // SAFETY: the fault: never acquired.
            unsafe { call_unsafe_wdf_function_binding!(WdfWaitLockRelease, lock) };
        }
        c if c == Fault::RundownReleasedTooOften as u32 => {
            let mut rundown = EX_RUNDOWN_REF::default();
            // SAFETY: a rundown reference on this stack.
            unsafe { ntddk::ExInitializeRundownProtection(&raw mut rundown) };
            // SAFETY: the fault: released without an acquire.
            unsafe { ntddk::ExReleaseRundownProtection(&raw mut rundown) };
        }
        c if c == Fault::LowerIrqlUpwards as u32 => {
            // SAFETY: the fault: "lowering" to DISPATCH_LEVEL from PASSIVE_LEVEL.
            unsafe { ntddk::KeLowerIrql(2) };
        }
        c if c == Fault::TimerDeletedTwice as u32 => {
            let mut config = WDF_TIMER_CONFIG {
                Size: size_of::<WDF_TIMER_CONFIG>() as u32,
                EvtTimerFunc: Some(timer),
                ..WDF_TIMER_CONFIG::default()
            };
            let mut attributes = attributes(device as WDFOBJECT);
            let mut t: WDFTIMER = core::ptr::null_mut();
            // SAFETY: a timer parented to the device.
            let _ = unsafe {
                call_unsafe_wdf_function_binding!(
                    WdfTimerCreate,
                    &raw mut config,
                    &raw mut attributes,
                    &raw mut t
                )
            };
            for _ in 0..2 {
                // SAFETY: the second delete is the fault: a deleted handle.
                unsafe { call_unsafe_wdf_function_binding!(WdfObjectDelete, t as WDFOBJECT) };
            }
        }
        c if c == Fault::RundownNeverReleased as u32 => {
            let mut rundown = EX_RUNDOWN_REF::default();
            // SAFETY: a rundown reference on this stack.
            unsafe { ntddk::ExInitializeRundownProtection(&raw mut rundown) };
            // SAFETY: acquired and never released: the wait below never ends.
            let _ = unsafe { ntddk::ExAcquireRundownProtection(&raw mut rundown) };
            // SAFETY: PASSIVE_LEVEL; the fault.
            unsafe { ntddk::ExWaitForRundownProtectionRelease(&raw mut rundown) };
        }
        c if c == Fault::LocksInBothOrders as u32 => {
            let (mut a, mut b): (KSPIN_LOCK, KSPIN_LOCK) = (0, 0);
            for (first, second) in [(&raw mut a, &raw mut b), (&raw mut b, &raw mut a)] {
                // SAFETY: spin locks on this stack; the second round's order is the fault.
                let old = unsafe { ntddk::KeAcquireSpinLockRaiseToDpc(first) };
                // SAFETY: as above.
                let inner = unsafe { ntddk::KeAcquireSpinLockRaiseToDpc(second) };
                // SAFETY: released in reverse order at the IRQLs they were taken from.
                unsafe { ntddk::KeReleaseSpinLock(second, inner) };
                // SAFETY: as above.
                unsafe { ntddk::KeReleaseSpinLock(first, old) };
            }
            complete(request);
        }
        c if c == Fault::OuterLockReleasedFirst as u32 => {
            let (mut a, mut b): (KSPIN_LOCK, KSPIN_LOCK) = (0, 0);
            // SAFETY: spin locks on this stack.
            let old = unsafe { ntddk::KeAcquireSpinLockRaiseToDpc(&raw mut a) };
            // SAFETY: as above.
            let _inner = unsafe { ntddk::KeAcquireSpinLockRaiseToDpc(&raw mut b) };
            // SAFETY: the fault: the outer lock released to PASSIVE_LEVEL first.
            unsafe { ntddk::KeReleaseSpinLock(&raw mut a, old) };
        }
        _ => complete(request),
    }
}

unsafe extern "C" fn timer(_timer: WDFTIMER) {}

/// Loads the bad driver, opens its device and sends the fault's IOCTL.
pub fn provoke(fault: Fault) {
    assert_eq!(ibcm_ntos::pnp::load(driver_entry), 0);
    let file = ibcm_ntos::io::open(NAME, ibcm_ntos::io::Open::kernel()).expect("opens");
    let request = ibcm_ntos::io::ioctl(file, fault as u32, &[], 16);
    let _ = ibcm_ntos::io::wait_for(request, std::time::Duration::from_secs(2));
}
