//! ibcm's QP1 verbs hook on a stock WinOF host (issue #19): the bookkeeping the binding's
//! thunks around the HCA's verbs run, so ibcm receives its CM MADs on QP1 beside AL's own
//! CM.
//!
//! AL's CM holds the CM class's unsolicited Send on every port's GSI dispatcher and AL has
//! no switch to stop it (winof-deployment.md §2), so ibcm cannot register for it. Instead
//! ibcm's upper filter, directly above ibbus, patches a few entries of the verbs table
//! ibbus obtains with `GUID_RDMA_INTERFACE_VERBS` ([`version`]): `create_spl_qp`,
//! `post_recv`, `poll_cq`, `poll_cq_array`, `modify_qp`, `destroy_qp`, `destroy_cq`. For
//! each port's QP1 the hook remembers which buffer each posted receive uses; when one of
//! them completes holding a CM Send that ibcm's engine owns (`CmManager::owner_of`, fed
//! in as a [`Steer`]), it rewrites the MAD's method byte to a [`PrivateMethod`] `M` before
//! AL sees the completion. AL's dispatcher then hands the MAD to the MAD service ibcm
//! registered for `{M, Get}` on a QP1 alias, whose callback [`claim`](Hook::claim)s the
//! hook's ticket and [`restore`]s Send before the engine parses it. AL's own traffic
//! (IPoIB-CM, SRP, AL's comm IDs) is never written to.
//!
//! Layout: [`version`] (whether a table is hooked), [`method`] (remap and restore),
//! [`receives`] (`wr_id` -> buffer, bounded, preallocated), [`tickets`] (proof of a remap),
//! [`port`] (one QP1's state and counters), [`hook`] (the verbs' bookkeeping per HCA),
//! [`route`] (which registration each port tries, and the route the HCA reports).
//! Nothing here allocates at DISPATCH_LEVEL: each QP1's room is made at `create_spl_qp`
//! (PASSIVE_LEVEL). Nothing is unsafe; the binding (`driver/kmdf/verbs_hook.rs`) owns the
//! pointers.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod hook;
pub mod method;
pub mod port;
pub mod receives;
pub mod route;
mod sync;
pub mod tickets;
pub mod version;

pub use hook::{
    Handle, Hook, IB_QPS_RESET, IB_QPT_QP1, IB_WCS_SUCCESS, IB_WCS_WR_FLUSHED_ERR, Lock, Memory,
    NotTracked, Steer, WorkCompletion,
};
pub use method::{Delivered, PrivateMethod, Refused, restore};
pub use port::{Counters, Qp1};
pub use route::{
    HcaRoute, HookState, NoRoute, Registration, Table, after_failure, steering_in_place,
};
pub use version::{Install, NotInstalled, VerbsQuery, install};
