//! [`Platform`] for the kernel. Each method is one translation (REVIEW.md maps them to the
//! host platform's):
//!
//! | Platform            | here                                                        |
//! |---------------------|-------------------------------------------------------------|
//! | `Request`           | WDFREQUEST + its retrieved output buffer, cancelable        |
//! | `Lock<T>`           | KSPIN_LOCK (`KeAcquireSpinLockRaiseToDpc`/`KeReleaseSpinLock`) |
//! | `now`               | `KeQueryInterruptTimePrecise` (100 ns units) x 100          |
//! | `send`              | [`ibal::send`]: `get_mad` + `send_mad` on the port's QP1 alias |
//! | `complete`          | `WdfRequestUnmarkCancelable` + `WdfRequestCompleteWithInformation` |
//! | `set_timer`         | one WDFTIMER, `WdfTimerStart` with a relative due time      |
//! | `current_thread`    | `PsGetCurrentThreadId`                                      |
//! | `relax`             | `KeDelayExecutionThread` (PASSIVE) / `KeStallExecutionProcessor` |
//! | `tracer`            | `ibcm_etw::ETW`: TraceLogging provider `ibcm` |

use core::cell::UnsafeCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use ibcm_cep::{Instant, Transmit};
use ibcm_endpoint::{FileId, Lock, Platform, Request};
use wdk_sys::ntddk::{
    KeAcquireSpinLockRaiseToDpc, KeDelayExecutionThread, KeGetCurrentIrql,
    KeQueryInterruptTimePrecise, KeReleaseSpinLock, KeStallExecutionProcessor,
    PsGetCurrentThreadId,
};
use wdk_sys::{
    _MODE, APC_LEVEL, KPROCESSOR_MODE, KSPIN_LOCK, LARGE_INTEGER, NTSTATUS, STATUS_CANCELLED,
    ULONG_PTR, WDFREQUEST,
};

use crate::host::Host;
use crate::ibal;

/// A lock around the dispatch layer's state: a KSPIN_LOCK held at DISPATCH_LEVEL.
///
/// Not a WDFSPINLOCK: [`Platform::new_lock`] cannot fail and has no parent object, while
/// `WdfSpinLockCreate` allocates a framework object that can fail and must be parented and
/// deleted. A KSPIN_LOCK is a `ULONG_PTR` inside this structure: nothing to allocate, fail
/// or delete; Driver Verifier checks it the same way (its IRQL, its release).
pub struct KmdfLock<T> {
    lock: UnsafeCell<KSPIN_LOCK>,
    value: UnsafeCell<T>,
}

// SAFETY: (P1) `value` is reached only through `with`, which holds the spin lock: one thread
// at a time has access, so sharing the lock between threads only needs `T: Send`.
unsafe impl<T: Send> Sync for KmdfLock<T> {}
// SAFETY: (P2) the lock owns its value; moving it to another thread moves the value.
unsafe impl<T: Send> Send for KmdfLock<T> {}

impl<T> KmdfLock<T> {
    /// A lock around `value`. `KeInitializeSpinLock` stores 0 (wdm.h `KzInitializeSpinLock`);
    /// a free KSPIN_LOCK holds no pointer, so moving this structure before first use is fine.
    pub const fn new(value: T) -> Self {
        Self {
            lock: UnsafeCell::new(0),
            value: UnsafeCell::new(value),
        }
    }
}

impl<T> Lock<T> for KmdfLock<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: (P3) the lock is an initialised KSPIN_LOCK that lives as long as `self`, in
        // nonpaged memory (pool or WDF context); every caller runs at IRQL <= DISPATCH_LEVEL
        // (the dispatch layer, the DPCs and the IBAL callbacks).
        let old_irql = unsafe { KeAcquireSpinLockRaiseToDpc(self.lock.get()) };
        // SAFETY: (P4) the spin lock is held: this is the only reference to the value until
        // it is released below.
        let value = unsafe { &mut *self.value.get() };
        let result = f(value);
        // SAFETY: (P5) this thread acquired the lock above at `old_irql`.
        unsafe { KeReleaseSpinLock(self.lock.get(), old_irql) };
        result
    }
}

/// Per-request context (the control device's `WdfDeviceInitSetRequestAttributes`): what the cancel routine and the
/// completion need to agree on who completes the request.
///
/// The hand-off is the echo sample's cancel-ownership count (DriverSync `queue.rs`
/// `RequestContext::cancel_completion_ownership_count`): `parties` starts at 2 (the dispatch
/// layer's completion and the cancel routine); once `WdfRequestUnmarkCancelable` has
/// returned `STATUS_CANCELLED`, whichever of the two decrements it to 0 completes the
/// request, with the status the dispatch layer chose.
pub struct RequestContext {
    /// Completion owners left (see above).
    pub parties: AtomicI32,
    /// The cancel routine has run: the dispatching thread re-issues the cancel after
    /// `Device::dispatch` returns (the request may have been pended after the cancel routine
    /// looked for it).
    pub cancelled: AtomicBool,
    /// The status the dispatch layer completed with.
    pub status: AtomicI32,
    /// The output bytes the dispatch layer completed with.
    pub information: AtomicUsize,
    /// The file the request arrived on.
    pub file: FileId,
    /// [`Request::key`].
    pub key: u64,
}

crate::wdf::context_type!(REQUEST_CONTEXT, RequestContext);

/// A request the dispatch layer owns: the WDFREQUEST, its context and its output buffer
/// (retrieved once with `WdfRequestRetrieveOutputBuffer`; for METHOD_BUFFERED it is the
/// system buffer, valid until completion).
pub struct KmdfRequest {
    handle: WDFREQUEST,
    context: NonNull<RequestContext>,
    output: *mut u8,
    output_len: usize,
    key: u64,
}

impl KmdfRequest {
    /// Wraps a request whose context is initialised and which was marked cancelable.
    ///
    /// # Safety
    ///
    /// `handle` is a request presented to this driver and not completed; `context` is its
    /// initialised [`RequestContext`]; `output` is null or valid for writes of `output_len`
    /// bytes until the request completes.
    pub unsafe fn new(
        handle: WDFREQUEST,
        context: NonNull<RequestContext>,
        output: *mut u8,
        output_len: usize,
        key: u64,
    ) -> Self {
        Self {
            handle,
            context,
            output,
            output_len,
            key,
        }
    }

    /// Completes the request once both the dispatch layer and (if it ran) the cancel
    /// routine have let go of it.
    fn complete(self, status: NTSTATUS, information: usize) {
        // SAFETY: (P6) the context lives until the request is completed, which happens at
        // the earliest below.
        let context = unsafe { self.context.as_ref() };
        context.status.store(status, Ordering::Relaxed);
        context.information.store(information, Ordering::Relaxed);
        // SAFETY: (P7) the request was marked cancelable at dispatch and is not completed;
        // WdfRequestUnmarkCancelable runs at IRQL <= DISPATCH_LEVEL.
        let unmarked = unsafe {
            wdk_sys::call_unsafe_wdf_function_binding!(WdfRequestUnmarkCancelable, self.handle)
        };
        if unmarked != STATUS_CANCELLED {
            // The cancel routine will not run: this thread owns the request.
            complete_request(self.handle, status, information);
            return;
        }
        // The cancel routine has run or will run (echo sample: "STATUS_CANCELLED, claimed
        // completion ownership"): the last of the two completes.
        if context.parties.fetch_sub(1, Ordering::AcqRel) == 1 {
            complete_request(self.handle, status, information);
        }
    }
}

impl Request for KmdfRequest {
    fn output_len(&self) -> usize {
        self.output_len
    }

    fn write_output(&mut self, offset: usize, bytes: &[u8]) {
        let fits = offset
            .checked_add(bytes.len())
            .is_some_and(|end| end <= self.output_len);
        if !fits {
            wdk::println!(
                "ibcm: refused an output write past the buffer ({offset} + {} > {})",
                bytes.len(),
                self.output_len
            );
            return;
        }
        if bytes.is_empty() {
            return;
        }
        // SAFETY: (P8) `offset` < `offset + len` <= the buffer's length (checked above), so
        // the pointer stays inside the output buffer.
        let destination = unsafe { self.output.add(offset) };
        // SAFETY: (P18) the range lies inside the output buffer, which is valid for writes
        // until completion (KmdfRequest::new); `bytes` is the dispatch layer's own memory
        // (input was copied before dispatch), so they do not overlap.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), destination, bytes.len()) };
    }

    fn key(&self) -> u64 {
        self.key
    }
}

/// `WdfRequestCompleteWithInformation`.
pub fn complete_request(request: WDFREQUEST, status: NTSTATUS, information: usize) {
    // SAFETY: (P9) callers own the request (the cancel hand-off above, or a request never
    // handed to the dispatch layer) and complete it exactly once, at IRQL <= DISPATCH_LEVEL.
    unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfRequestCompleteWithInformation,
            request,
            status,
            information as ULONG_PTR
        );
    }
}

/// The platform of the host's CM: a pointer to the [`Host`] (the control device's WDF
/// context), which outlives the [`ibcm_endpoint::Device`] that holds this value.
#[derive(Clone, Copy)]
pub struct KmdfPlatform {
    host: NonNull<Host>,
}

// SAFETY: (P10) the pointee is the control device's context, which lives until that
// device's cleanup callback, which first drops the `ibcm_endpoint::Device` (the only
// holder of this value); everything reached through it is either immutable after
// creation or internally locked.
unsafe impl Send for KmdfPlatform {}
// SAFETY: (P11) as P10.
unsafe impl Sync for KmdfPlatform {}

impl KmdfPlatform {
    /// The platform of the host `host`.
    pub fn new(host: NonNull<Host>) -> Self {
        Self { host }
    }

    fn host(&self) -> &Host {
        // SAFETY: (P12) see P10: the host outlives every use of this platform.
        unsafe { self.host.as_ref() }
    }
}

/// Interrupt time in 100 ns units: monotonic, system-wide, callable at any IRQL.
/// `KeQueryInterruptTime` is a macro over KUSER_SHARED_DATA on x64 (wdm.h), so bindgen has no
/// symbol for it; the `Precise` variant is an ntoskrnl export (Windows 8.1+).
pub fn interrupt_time_100ns() -> u64 {
    let mut qpc: u64 = 0;
    // SAFETY: (P13) `qpc` is a valid out pointer; the routine runs at any IRQL.
    unsafe { KeQueryInterruptTimePrecise(&raw mut qpc) }
}

impl Platform for KmdfPlatform {
    type Request = KmdfRequest;
    type Lock<T> = KmdfLock<T>;

    fn new_lock<T>(value: T) -> KmdfLock<T> {
        KmdfLock::new(value)
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(interrupt_time_100ns().saturating_mul(100))
    }

    fn tracer(&self) -> Option<&'static dyn ibcm_endpoint::DispatchTracer> {
        Some(&ibcm_etw::ETW)
    }

    fn request_passive_work(&self) {
        // The host's work item runs `Device::passive_work` (host.rs).
        self.host().queue_passive_work();
    }

    fn send(&self, transmit: &Transmit) {
        ibal::send(self.host(), transmit);
    }

    fn complete(&self, request: KmdfRequest, status: i32, information: usize) {
        request.complete(status, information);
    }

    fn set_timer(&self, deadline: Option<Instant>) {
        self.host().arm_timer(deadline, self.now());
    }

    fn current_thread(&self) -> u64 {
        // SAFETY: (P14) PsGetCurrentThreadId has no preconditions (any IRQL). KeGetCurrentThread
        // is `__forceinline` on x64 (wdm.h) and so absent from the bindings; the thread ID
        // identifies a live thread as uniquely, which is all `destroy_id` needs.
        let id = unsafe { PsGetCurrentThreadId() };
        id as u64
    }

    fn relax(&self) {
        // SAFETY: (P15) KeGetCurrentIrql has no preconditions.
        let irql = unsafe { KeGetCurrentIrql() };
        if u32::from(irql) < APC_LEVEL {
            // 50 us, relative (negative), in 100 ns units.
            let mut interval = LARGE_INTEGER { QuadPart: -500 };
            // SAFETY: (P16) below APC_LEVEL a kernel-mode, non-alertable wait is allowed;
            // `interval` is a valid pointer for the call.
            let _ = unsafe {
                KeDelayExecutionThread(_MODE::KernelMode as KPROCESSOR_MODE, 0, &raw mut interval)
            };
        } else {
            // SAFETY: (P17) a short busy wait is allowed at any IRQL.
            unsafe { KeStallExecutionProcessor(10) };
        }
    }

    fn fabric_status(&self, out: &mut ibcm_ioctl::StatusOut) {
        crate::status::fill(out);
    }
}
