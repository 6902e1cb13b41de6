//! Stand-in for `wdk-alloc`: `WdkAllocator` (ExAllocatePool2 in the real crate).
#![no_std]
use core::alloc::{GlobalAlloc, Layout};
pub struct WdkAllocator;
// SAFETY: stand-in; never runs.
unsafe impl GlobalAlloc for WdkAllocator {
    unsafe fn alloc(&self, _layout: Layout) -> *mut u8 {
        core::ptr::null_mut()
    }
    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
}
