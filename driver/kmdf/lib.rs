//! `ibcm.sys`, the KMDF binding of the ibcm CEP manager.
//!
//! Everything that decides behaviour lives in the portable crates under `driver/`; this crate
//! only translates WDF and IBAL callbacks into calls on them. It exists on Windows only: on
//! every other host the crate is empty (see `build.rs`).
//!
//! Map of the binding (REVIEW.md has the IRQL and ownership tables). Layered: each file
//! imports only files below it (driver -> filter -> {control, ibal, verbs_hook} -> host ->
//! platform, and ibal -> verbs_hook; `wdf` helpers everywhere).
//! - [`driver`]: `DriverEntry`, `EvtDriverDeviceAdd`, `EvtDriverUnload`.
//! - [`filter`]: one upper filter device per HCA, directly above ibbus; owns every callback
//!   of it: the `IRP_MN_QUERY_INTERFACE` preprocess (ibcm's `iba_cm` or pass down,
//!   [`ibcm_iba_cm::answer`] with the host-wide verdict), and the lifecycle (D0Entry,
//!   D0Exit, surprise removal, cleanup) mapped onto [`ibcm_lifecycle::Hca`].
//! - [`control`]: the control device user mode opens (`\\.\ibcm`), whatever the number of
//!   HCAs: file objects, the parallel default queue, cancellation, the timer.
//! - [`ibal`]: the WinOF access layer (IBAL) of one HCA, queried in-stack: PnP, the QP1 MAD
//!   service per port, receive into the host's ring, send.
//! - [`verbs_hook`]: the QP1 verbs hook on a stock WinOF host (issue #19): the verbs-table
//!   patch on ibbus's `GUID_RDMA_INTERFACE_VERBS` query and the thunks around the HCA's
//!   entries, over `ibcm_qp1_hook`.
//! - [`host`]: the one CM of the host (the portable [`ibcm_endpoint::Device`] and the
//!   [`ibcm_iba_cm::Registered`] instance), shared by every filter device; its
//!   [`ibcm_endpoint::Platform`]; host-wide port numbers; the `iba_cm` backend; the receive
//!   and delivery DPCs; the driver's wait lock and filter count.
//! - [`platform`]: kernel primitives: requests, the spin lock, the clock, the running
//!   context's identity.
//! - [`parameters`]: the service key's `Parameters` (the quotas of users' handles, each
//!   and all together, the longest wait the CM asks of a REQ's sender, the kill switch).
//! - [`kill_switch`]: the kill switch as read at the latest HCA start (filter and STATUS
//!   read it).
//! - `panic`: the panic handler (bug check `IBCM_BUGCHECK` instead of a spin).
//! - [`event_log`]: System-log entries (source `ibcm`) for what an administrator must
//!   see: a CM query left to AL's CM, an HCA skipped or without ibcm, removal waiting
//!   on clients, the switch, refusals.
//! - [`status`]: STATUS (`ibcm status`): the filter devices' HCAs and the live ports.
//! - [`wdf`]: structure sizes, object attributes and typed contexts (wdk-sys has no
//!   `WDF_*_INIT` helpers or `WDF_DECLARE_CONTEXT_TYPE`).
//!
//! Every `unsafe` block holds one unsafe operation and carries a numbered `SAFETY:` comment
//! (the workspace forbids `undocumented_unsafe_blocks` and `multiple_unsafe_ops_per_block`).
#![cfg(windows)]
#![no_std]

extern crate alloc;

// Both belong to the image; built for the host against the simulated kernel
// (tests/kmdf-check/binding-sim), the test binary brings its own.
#[cfg(not(ibcm_kernel_sim))]
mod panic;

#[cfg(not(ibcm_kernel_sim))]
mod pool;

#[cfg(not(ibcm_kernel_sim))]
#[global_allocator]
static GLOBAL_ALLOCATOR: pool::KernelPool = pool::KernelPool;

mod control;
mod driver;
mod event_log;
mod filter;
mod host;
mod ibal;
mod irp;
mod kill_switch;
mod parameters;
mod platform;
mod status;
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
    #[cfg(not(ibcm_kernel_sim))]
    pool::resolve();
    driver::entry(driver, registry_path)
}
