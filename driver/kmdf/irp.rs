//! The IRP stack-location inlines of wdm.h that the bindings do not carry
//! (`__forceinline`): the current location, skipping it, and copying it to the next one
//! with a completion routine. For the filter's preprocess routine and the control
//! device's create.

use wdk_sys::{
    PIO_STACK_LOCATION, PIRP, SL_INVOKE_ON_CANCEL, SL_INVOKE_ON_ERROR, SL_INVOKE_ON_SUCCESS,
};

/// `IoGetCurrentIrpStackLocation` (wdm.h, `__forceinline`: not in the bindings).
///
/// # Safety
///
/// `irp` is a live IRP owned by the caller.
pub unsafe fn current_stack_location(irp: PIRP) -> PIO_STACK_LOCATION {
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
pub unsafe fn skip_current_irp_stack_location(irp: PIRP) {
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
pub unsafe fn copy_to_next_with_completion(
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
