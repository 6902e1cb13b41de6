//! The kernel primitives the host's [`Platform`](ibcm_endpoint::Platform) (`host.rs`
//! `KmdfPlatform`) is made of; this file imports nothing of the binding:
//!
//! | Platform            | here                                                        |
//! |---------------------|-------------------------------------------------------------|
//! | `Request`           | [`KmdfRequest`]: WDFREQUEST + its retrieved output buffer, cancelable |
//! | `Lock<T>`           | [`KmdfLock`]: KSPIN_LOCK (`KeAcquireSpinLockRaiseToDpc`/`KeReleaseSpinLock`) |
//! | `now`               | [`interrupt_time_100ns`]: `KeQueryInterruptTimePrecise` (100 ns units) |
//! | `complete`          | `WdfRequestUnmarkCancelable` + `WdfRequestCompleteWithInformation` |
//! | `current_thread`    | [`current_thread`]: processor index at DISPATCH_LEVEL, else tagged `PsGetCurrentThreadId` |
//! | `relax`             | [`relax`]: `KeDelayExecutionThread` (PASSIVE) / `KeStallExecutionProcessor` |

use core::cell::UnsafeCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use ibcm_endpoint::{FileId, Lock, Request};
use wdk_sys::ntddk::{
    KeAcquireSpinLockRaiseToDpc, KeDelayExecutionThread, KeGetCurrentIrql,
    KeGetCurrentProcessorNumberEx, KeQueryInterruptTimePrecise, KeReleaseSpinLock,
    KeStallExecutionProcessor, PsGetCurrentThreadId,
};
use wdk_sys::{
    _MODE, APC_LEVEL, DISPATCH_LEVEL, KPROCESSOR_MODE, KSPIN_LOCK, LARGE_INTEGER, NTSTATUS,
    STATUS_CANCELLED, ULONG_PTR, WDFREQUEST,
};

/// Marks a thread identity taken below DISPATCH_LEVEL ([`current_thread`]).
const PASSIVE_THREAD: u64 = 1 << 63;

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
    pub fn complete(self, status: NTSTATUS, information: usize) {
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

/// Interrupt time in 100 ns units: monotonic, system-wide, callable at any IRQL.
/// `KeQueryInterruptTime` is a macro over KUSER_SHARED_DATA on x64 (wdm.h), so bindgen has no
/// symbol for it; the `Precise` variant is an ntoskrnl export (Windows 8.1+).
pub fn interrupt_time_100ns() -> u64 {
    let mut qpc: u64 = 0;
    // SAFETY: (P13) `qpc` is a valid out pointer; the routine runs at any IRQL.
    unsafe { KeQueryInterruptTimePrecise(&raw mut qpc) }
}

/// `Platform::current_thread`: who is running here, for `destroy_id`'s own-callback and
/// delivering-thread checks.
pub fn current_thread() -> u64 {
    // SAFETY: (P14) KeGetCurrentIrql has no preconditions.
    let irql = unsafe { KeGetCurrentIrql() };
    if u32::from(irql) >= DISPATCH_LEVEL {
        // Nothing else runs on this processor until the level drops, so the processor
        // is the identity. Not the thread ID: every DPC that interrupted an idle
        // processor runs in its idle thread, ID 0 on every processor.
        // SAFETY: (P18) callable at any IRQL; a null out pointer asks for no group.
        let index = unsafe { KeGetCurrentProcessorNumberEx(core::ptr::null_mut()) };
        u64::from(index)
    } else {
        // Below DISPATCH_LEVEL the thread may move between processors: its ID, tagged
        // so it never equals a processor's identity (IDs are below 2^32).
        // SAFETY: (P19) PsGetCurrentThreadId has no preconditions (any IRQL).
        let id = unsafe { PsGetCurrentThreadId() };
        (id as u64) | PASSIVE_THREAD
    }
}

/// `Platform::relax`: a short pause in a wait loop.
pub fn relax() {
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
