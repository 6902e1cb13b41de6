//! Physical memory as far as AL's MAD buffers and the HCA's DMA reach it: pages the
//! simulation maps (AL's MAD pool, `core/al/kernel/al_mad_pool.c`, nonpaged) get physical
//! addresses, and `MmGetPhysicalAddress` / `MmGetVirtualForPhysical` translate between
//! the two for them. `MmGetPhysicalAddress` runs at any IRQL for a valid nonpaged address
//! (ntddk.h, learn.microsoft.com); `MmGetVirtualForPhysical` is exported but not
//! documented, and is allowed at <= DISPATCH_LEVEL, the IRQL the verbs hook calls it at.
//! An address of no mapped page translates to 0 / NULL.

use std::collections::HashMap;

use crate::state;
use crate::thread::{DISPATCH, KernelCode, require_irql};
use crate::*;

/// `PAGE_SIZE` on x64.
pub const PAGE_SIZE: usize = 4096;
/// Where the simulation's physical pages start (any address apart from virtual ones).
const FIRST_PAGE: u64 = 0x0001_2340_0000;

#[derive(Default)]
pub struct Physical {
    /// Virtual page -> physical page.
    to_physical: HashMap<usize, u64>,
    /// Physical page -> virtual page.
    to_virtual: HashMap<u64, usize>,
    next: u64,
}

/// A run of `pages` nonpaged, physically contiguous pages (AL's pool memory): its
/// virtual address, mapped until [`Pages`] drops.
pub struct Pages {
    va: *mut u8,
    pages: usize,
}

// SAFETY: the pages are the simulation's own allocation, written only by the simulated
// HCA (DMA) and read by AL's stand-in, both under their own bookkeeping.
unsafe impl Send for Pages {}

impl Pages {
    /// Allocates and maps `pages` pages.
    pub fn new(pages: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(pages * PAGE_SIZE, PAGE_SIZE)
            .unwrap_or_else(|_| unreachable!("a page-aligned layout"));
        // SAFETY: a non-zero size.
        let va = unsafe { std::alloc::alloc_zeroed(layout) };
        if va.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        let mut guard = state::lock();
        let p = &mut guard.physical;
        let first = FIRST_PAGE + p.next * PAGE_SIZE as u64;
        p.next += pages as u64 + 1;
        for i in 0..pages {
            let v = va as usize + i * PAGE_SIZE;
            let pa = first + (i * PAGE_SIZE) as u64;
            p.to_physical.insert(v, pa);
            p.to_virtual.insert(pa, v);
        }
        Self { va, pages }
    }

    /// The virtual address of byte `offset`.
    pub fn va(&self, offset: usize) -> usize {
        self.va as usize + offset
    }

    /// The physical address of byte `offset`.
    pub fn pa(&self, offset: usize) -> u64 {
        physical_of(self.va(offset)).unwrap_or(0)
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        let mut guard = state::lock();
        for i in 0..self.pages {
            let v = self.va as usize + i * PAGE_SIZE;
            if let Some(pa) = guard.physical.to_physical.remove(&v) {
                guard.physical.to_virtual.remove(&pa);
            }
        }
        drop(guard);
        let layout = std::alloc::Layout::from_size_align(self.pages * PAGE_SIZE, PAGE_SIZE)
            .unwrap_or_else(|_| unreachable!("as in new"));
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.va, layout) };
    }
}

fn physical_of(va: usize) -> Option<u64> {
    let page = va & !(PAGE_SIZE - 1);
    let pa = *state::lock().physical.to_physical.get(&page)?;
    Some(pa + (va - page) as u64)
}

fn virtual_of(pa: u64) -> Option<usize> {
    let page = pa & !(PAGE_SIZE as u64 - 1);
    let va = *state::lock().physical.to_virtual.get(&page)?;
    Some(va + (pa - page) as usize)
}

/// The HCA's DMA write of `bytes` at physical address `pa` (page by page). False if a
/// page is not mapped (nothing is written past it).
pub fn dma_write(pa: u64, bytes: &[u8]) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        let at = pa + done as u64;
        let Some(va) = virtual_of(at) else {
            return false;
        };
        let room = PAGE_SIZE - (at as usize % PAGE_SIZE);
        let n = room.min(bytes.len() - done);
        // SAFETY: `va .. va + n` lies in one mapped page of the simulation's own.
        unsafe { std::ptr::copy_nonoverlapping(bytes[done..].as_ptr(), va as *mut u8, n) };
        done += n;
    }
    true
}

/// Reads `len` bytes at virtual address `va` of mapped pages (AL reading its buffer).
pub fn read(va: usize, len: usize) -> Vec<u8> {
    // SAFETY: callers pass buffers inside their own `Pages`.
    unsafe { std::slice::from_raw_parts(va as *const u8, len) }.to_vec()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn MmGetVirtualForPhysical(PhysicalAddress: PHYSICAL_ADDRESS) -> PVOID {
    let _k = KernelCode::enter();
    require_irql("MmGetVirtualForPhysical", DISPATCH);
    // SAFETY: `LARGE_INTEGER`'s `QuadPart` is the whole value.
    let pa = unsafe { PhysicalAddress.QuadPart };
    u64::try_from(pa)
        .ok()
        .and_then(virtual_of)
        .map_or(core::ptr::null_mut(), |va| va as PVOID)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn MmGetPhysicalAddress(BaseAddress: PVOID) -> PHYSICAL_ADDRESS {
    let _k = KernelCode::enter();
    let pa = physical_of(BaseAddress as usize).unwrap_or(0);
    PHYSICAL_ADDRESS {
        QuadPart: pa as i64,
    }
}
