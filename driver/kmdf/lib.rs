//! `ibcm.sys`, the KMDF binding of the ibcm CEP manager.
//!
//! Everything that decides behaviour lives in the portable crates under `driver/`; this crate
//! only translates WDF and IBAL callbacks into calls on them. It exists on Windows only: on
//! every other host the crate is empty (see `build.rs`).
//!
//! Map of the binding (REVIEW.md has the IRQL and ownership tables):
//! - [`driver`]: `DriverEntry` and `EvtDriverDeviceAdd`.
//! - [`device`]: the root-enumerated WDF device: its context (which owns the portable
//!   [`ibcm_endpoint::Device`]), file objects, the parallel default queue, cancellation.
//! - [`platform`]: [`ibcm_endpoint::Platform`] for the kernel: requests, the spin lock, the
//!   clock, the one timer, the current thread.
//! - [`ibal`]: the WinOF access layer (IBAL): interface query, PnP, the QP1 MAD service per
//!   port, and the receive ring drained by a DPC.
//! - [`client`]: the kernel-client interface other drivers query with
//!   `IRP_MN_QUERY_INTERFACE`.
//! - [`verbs_hook`]: the QP1 verbs hook on a stock WinOF host (issue #19): the verbs-table
//!   patch on ibbus's `GUID_RDMA_INTERFACE_VERBS` query and the thunks around the HCA's
//!   entries, over `ibcm_qp1_hook`.
//! - [`wdf`]: structure sizes, object attributes and typed contexts (wdk-sys has no
//!   `WDF_*_INIT` helpers or `WDF_DECLARE_CONTEXT_TYPE`).
//!
//! Every `unsafe` block holds one unsafe operation and carries a numbered `SAFETY:` comment
//! (the workspace forbids `undocumented_unsafe_blocks` and `multiple_unsafe_ops_per_block`).
#![cfg(windows)]
#![no_std]

extern crate alloc;

#[cfg(not(test))]
extern crate wdk_panic;

#[cfg(not(test))]
#[global_allocator]
static GLOBAL_ALLOCATOR: wdk_alloc::WdkAllocator = wdk_alloc::WdkAllocator;

mod client;
mod device;
mod driver;
mod ibal;
mod platform;
mod verbs_hook;
mod wdf;

use wdk_sys::{NTSTATUS, PCUNICODE_STRING, PDRIVER_OBJECT};

/// The driver's entry point. The image entry point is `FxDriverEntry` (WdfDriverEntry.lib),
/// which calls the symbol named `DriverEntry` (reference/windows-drivers-rs.md §1.5).
///
/// # Safety
///
/// Called once by the I/O manager at PASSIVE_LEVEL with a valid driver object and registry
/// path.
// SAFETY: (L1) no other symbol of this image is exported as `DriverEntry`.
#[unsafe(export_name = "DriverEntry")]
pub unsafe extern "system" fn driver_entry(
    driver: PDRIVER_OBJECT,
    registry_path: PCUNICODE_STRING,
) -> NTSTATUS {
    driver::entry(driver, registry_path)
}
