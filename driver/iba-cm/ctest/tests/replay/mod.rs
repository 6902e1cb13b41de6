//! The replays of WinVerbs and ndfltr (`endpoints.rs`) on a side of the harness's
//! [`World`](super::harness::World).
//!
//! The replays run their IOCTL paths at PASSIVE_LEVEL and take their queue spin lock
//! through the host's `at_dispatch` (the verifier's DISPATCH_LEVEL), so every iba_cm call
//! they make under that lock is checked as one at DISPATCH_LEVEL, and the ones they make
//! without it (`get_qp_attr` in WinVerbs' accept, `send_drep` after the lock, `destroy_id`)
//! run at PASSIVE_LEVEL as theirs do.

mod endpoints;

use std::ffi::c_void;
use std::sync::Arc;

use ibcm_host::verifier::{Ledger, at_dispatch, is_at_dispatch};

pub use endpoints::*;

use super::harness::Side;

extern "C" fn host_is_dispatch(_: *const c_void) -> i32 {
    i32::from(is_at_dispatch())
}

extern "C" fn host_at_dispatch(
    ledger: *const c_void,
    f: extern "C" fn(*mut c_void),
    arg: *mut c_void,
) {
    // SAFETY: the ledger of the side the endpoint was made on, kept alive by `Host`.
    let ledger = unsafe { &*ledger.cast::<Ledger>() };
    at_dispatch(ledger, || f(arg));
}

impl Host {
    /// A host on `side`: its `iba_cm` table, and its verifier ledger for the IRQL.
    pub fn new(side: &Side) -> Self {
        let ledger = Arc::clone(&side.node.platform.ledger);
        let ctx: *const c_void = Arc::as_ptr(&ledger).cast();
        Self::from_hooks(
            &raw const *side.ifc,
            ctx,
            host_is_dispatch,
            host_at_dispatch,
            Box::new(ledger),
        )
    }
}
