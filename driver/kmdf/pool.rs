//! The image's global allocator: nonpaged, no-execute pool, tag `rust` (as wdk-alloc's).
//!
//! `ExAllocatePool2` exists only from Windows 10 2004 on; imported, it would keep the image
//! from loading on Windows Server 2019 and Windows 10 1803-1909, which the WDF side
//! supports (KMDF 1.25, `minimum-kmdf-version-minor`). So it is looked up at DriverEntry
//! (`MmGetSystemRoutineAddress`) and used when the kernel has it; otherwise, and before the
//! lookup, `ExAllocatePoolWithTag(NonPagedPoolNx)`, which every supported kernel exports
//! ("When developing drivers for version of Windows prior to Windows 10, version 2004",
//! learn.microsoft.com .../kernel/updating-deprecated-exallocatepool-calls). The allocator
//! never hands out zeroed memory as a promise (`GlobalAlloc::alloc` need not), so the two
//! are interchangeable; `alloc_zeroed` zeroes either way.
//!
//! Alignment: pool blocks are 16-byte aligned on x64 (`MEMORY_ALLOCATION_ALIGNMENT`); a
//! layout asking more gets null (an allocation failure), never misaligned memory.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, Ordering};

use wdk_sys::ntddk::{ExFreePool, MmGetSystemRoutineAddress};
use wdk_sys::{POOL_FLAG_NON_PAGED, POOL_FLAGS, PVOID, SIZE_T, ULONG};

use crate::wdf;

/// `rust`, stored little-endian so that poolmon and WinDbg show it in this order.
const TAG: ULONG = u32::from_ne_bytes(*b"rust");
/// wdm.h `POOL_TYPE::NonPagedPoolNx`.
const NON_PAGED_POOL_NX: i32 = 512;
/// x64 `MEMORY_ALLOCATION_ALIGNMENT` (wdm.h).
const POOL_ALIGNMENT: usize = 16;

static EX_ALLOCATE_POOL2_NAME: [u16; 15] = wdf::utf16("ExAllocatePool2");

/// wdm.h `ExAllocatePool2`'s signature.
type ExAllocatePool2Fn = unsafe extern "system" fn(POOL_FLAGS, SIZE_T, ULONG) -> PVOID;

/// `ExAllocatePool2`, once looked up (null: not yet, or the kernel has none).
static EX_ALLOCATE_POOL2: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

// wdk-sys leaves the deprecated allocators out of its bindings (wdk-build bindgen
// blocklist); ntoskrnl.lib, already linked, exports it on every Windows ibcm supports.
unsafe extern "system" {
    /// wdm.h `ExAllocatePoolWithTag` (IRQL <= DISPATCH_LEVEL for nonpaged pool).
    fn ExAllocatePoolWithTag(pool_type: i32, number_of_bytes: SIZE_T, tag: ULONG) -> PVOID;
}

/// Looks `ExAllocatePool2` up (DriverEntry, PASSIVE_LEVEL, before anything allocates).
pub fn resolve() {
    let mut name = wdf::unicode(&EX_ALLOCATE_POOL2_NAME);
    // SAFETY: (P1) PASSIVE_LEVEL (DriverEntry); the name is a valid UNICODE_STRING over a
    // static buffer, which the routine only reads.
    let routine = unsafe { MmGetSystemRoutineAddress(&raw mut name) };
    EX_ALLOCATE_POOL2.store(routine, Ordering::Release);
}

/// The allocator (`#[global_allocator]` in lib.rs): IRQL <= DISPATCH_LEVEL.
pub struct KernelPool;

// SAFETY: (P2) `alloc` returns null or a block of at least `layout.size()` bytes aligned
// to 16 (refusing larger alignments), owned by the caller until `dealloc`; nothing here
// unwinds.
unsafe impl GlobalAlloc for KernelPool {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() > POOL_ALIGNMENT {
            return core::ptr::null_mut();
        }
        let size = layout.size() as SIZE_T;
        let pool2 = EX_ALLOCATE_POOL2.load(Ordering::Acquire);
        let block = if pool2.is_null() {
            // SAFETY: (P3) nonpaged pool at IRQL <= DISPATCH_LEVEL (the allocator's
            // contract); any size (0 included) is accepted.
            unsafe { ExAllocatePoolWithTag(NON_PAGED_POOL_NX, size, TAG) }
        } else {
            // SAFETY: (P4) the address MmGetSystemRoutineAddress gave for
            // "ExAllocatePool2" is that routine, of this signature (wdm.h).
            let allocate = unsafe { core::mem::transmute::<PVOID, ExAllocatePool2Fn>(pool2) };
            // SAFETY: (P5) as P3, with POOL_FLAG_NON_PAGED (nonpaged, no-execute).
            unsafe { allocate(POOL_FLAG_NON_PAGED, size, TAG) }
        };
        block.cast()
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: (P6) `ptr` came from `alloc` (either routine: both allocate from pool,
        // freed by ExFreePool), at IRQL <= DISPATCH_LEVEL.
        unsafe { ExFreePool(ptr.cast()) };
    }
}
