//! The replays of WinVerbs and ndfltr (`endpoints.rs`) on a side of the harness's
//! [`World`](super::harness::World).
//!
//! The replays run their IOCTL paths at PASSIVE_LEVEL and take their queue spin lock
//! through the host's `at_dispatch` (the verifier's DISPATCH_LEVEL), so every iba_cm call
//! they make under that lock is checked as one at DISPATCH_LEVEL, and the ones they make
//! without it (`get_qp_attr` in WinVerbs' accept, `send_drep` after the lock, `destroy_id`)
//! run at PASSIVE_LEVEL as theirs do.

mod endpoints;

use std::sync::Arc;

pub use endpoints::*;

use super::harness::Side;

impl Host {
    /// A host on `side`: its `iba_cm` table, and its verifier ledger for the IRQL.
    pub fn new(side: &Side) -> Self {
        Self::on_ledger(&raw const *side.ifc, Arc::clone(&side.node.platform.ledger))
    }
}
