//! A simulated Windows kernel that `driver/kmdf` (the KMDF binding of ibcm.sys) runs on, on
//! Linux: the functions the binding imports, with their documented semantics, and Driver
//! Verifier's and KMDF Verifier's rules as assertions that stop the process at the first
//! broken one (`verifier::bugcheck`), as a bug check would.
//!
//! The binding is built unchanged (`../binding-sim`): this crate stands where `wdk-sys` and
//! `wdk` stand in ibcm.sys. It re-exports the stand-ins' items (`../wdk-sys`, transcribed
//! from the WDK headers; the genuine WDK check compares their layouts with the real
//! bindings, which stays that check's job) and defines, `#[no_mangle]`, every function they
//! declare, plus `BCryptGenRandom`.
//!
//! What runs where:
//! - Threads are processors: each OS thread has its own IRQL ([`thread`]) and processor
//!   number. The simulation's own threads run DPCs and timers at DISPATCH_LEVEL
//!   ([`sched`]), work items at PASSIVE_LEVEL, and AL's PnP and completion callbacks
//!   ([`al`]).
//! - Tests drive it as Windows would: [`pnp`] (DriverEntry, device add, D0Entry/D0Exit,
//!   removal, unload), [`io`] (opens with a token, IOCTLs, cancellation, cleanup, close),
//!   [`al`] (ibbus's access layer with CAs, ports and QP1 MADs).
//!
//! Where the simulation is weaker than Windows is listed in README.md beside this crate.
#![allow(non_snake_case, clippy::missing_safety_doc)]

pub use wdk_sys_standin::*;

pub mod al;
pub mod hca;
pub mod io;
mod ke;
mod lockorder;
mod objects;
pub mod physical;
pub mod pnp;
pub mod pool;
pub mod registry;
mod sched;
pub mod security;
pub mod spl_qp;
pub mod state;
pub mod thread;
pub mod verifier;
mod verifier_sources;
mod wdf_device;
mod wdf_request;

/// ntstatus.h values the stand-ins do not declare (the binding never names them).
pub const STATUS_OBJECT_NAME_NOT_FOUND: NTSTATUS = 0xC000_0034_u32 as i32;
pub const STATUS_OBJECT_NAME_COLLISION: NTSTATUS = 0xC000_0035_u32 as i32;
pub const STATUS_ACCESS_DENIED: NTSTATUS = 0xC000_0022_u32 as i32;
pub const STATUS_BUFFER_TOO_SMALL: NTSTATUS = 0xC000_0023_u32 as i32;
pub const STATUS_NO_SUCH_DEVICE: NTSTATUS = 0xC000_000E_u32 as i32;
pub const STATUS_NOT_SUPPORTED: NTSTATUS = 0xC000_00BB_u32 as i32;
