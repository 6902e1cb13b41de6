//! `ibcm.sys`, the KMDF binding of the ibcm CEP manager.
//!
//! Everything that decides behaviour lives in the portable crates under `driver/`; this crate
//! only translates WDF and IBAL callbacks into calls on them. It exists on Windows only: on
//! every other host the crate is empty (see `build.rs`).
#![cfg(windows)]
#![no_std]

extern crate alloc;

#[cfg(not(test))]
extern crate wdk_panic;

#[cfg(not(test))]
#[global_allocator]
static GLOBAL_ALLOCATOR: wdk_alloc::WdkAllocator = wdk_alloc::WdkAllocator;
