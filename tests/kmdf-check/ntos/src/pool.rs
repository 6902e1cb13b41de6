//! Pool: the driver's allocations (through its global allocator, driver/kmdf/pool.rs's
//! ExAllocatePool2 or ExAllocatePoolWithTag and ExFreePool on Windows) tracked while the
//! driver's code runs, freed
//! blocks poisoned, and a leak report at unload (Driver Verifier's Pool Tracking,
//! bug check 0xC4 with P1 = 0x62).
//!
//! The test binary installs [`TrackingAllocator`] as its global allocator: allocations made
//! while driver code runs on a thread ([`crate::thread::call_driver`], minus the kernel
//! functions it calls) are the driver's pool; a free of a tracked block is a free of pool,
//! whoever frees it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;

pub struct TrackingAllocator;

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Live pool blocks: address -> size.
static POOL: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

fn untracked<R>(f: impl FnOnce() -> R) -> Option<R> {
    BUSY.with(|b| {
        if b.replace(true) {
            return None;
        }
        let r = f();
        b.set(false);
        Some(r)
    })
}

// SAFETY: forwards to the system allocator; the bookkeeping never touches the blocks
// except to poison a freed one, which is still owned until `System.dealloc`.
unsafe impl GlobalAlloc for TrackingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && crate::thread::in_driver() {
            untracked(|| {
                let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
                pool.get_or_insert_with(HashMap::new)
                    .insert(p as usize, layout.size());
            });
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let tracked = untracked(|| {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            pool.as_mut()
                .and_then(|p| p.remove(&(ptr as usize)))
                .is_some()
        });
        if tracked == Some(true) {
            untracked(|| crate::lockorder::forget(ptr as usize, layout.size()));
            // Special pool would fault on a later use; ASan reports it; poisoned either way.
            // SAFETY: the block is still the caller's, `layout.size()` bytes.
            unsafe { std::ptr::write_bytes(ptr, 0xDF, layout.size()) };
        }
        // SAFETY: the caller's block and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The driver's live pool: (blocks, bytes).
pub fn outstanding() -> (usize, usize) {
    untracked(|| {
        let pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        pool.as_ref()
            .map_or((0, 0), |p| (p.len(), p.values().sum()))
    })
    .unwrap_or((0, 0))
}

/// `MmGetSystemRoutineAddress` (wdm.h): the simulation exports no routine by name (the
/// binding's own pool is the test binary's allocator here, `driver/kmdf/pool.rs` is not
/// built), so every lookup finds nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MmGetSystemRoutineAddress(
    _SystemRoutineName: crate::PUNICODE_STRING,
) -> crate::PVOID {
    core::ptr::null_mut()
}

/// `ExFreePool` (wdm.h): frees what `SeQueryInformationToken` returned (the binding's
/// own pool is the test binary's allocator here: `driver/kmdf/pool.rs` is not built).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ExFreePool(P: crate::PVOID) {
    let _k = crate::thread::KernelCode::enter();
    if !crate::security::free_token_information(P as usize) {
        crate::verifier::bugcheck(
            crate::verifier::Rule::Simulation,
            format_args!("ExFreePool({P:p}): not a block the simulated kernel handed out"),
        );
    }
}
