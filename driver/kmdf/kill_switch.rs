//! The kill switch (`Parameters\Disabled`, read by parameters.rs; docs/windows.md "Turning
//! ibcm off"), as the driver read it at the latest HCA start.
//!
//! One reading for the host: while it is on, no HCA that starts binds (no AL objects, no
//! MAD service, no QP1 steering) and every CM query on every HCA goes down to AL's CM,
//! since WinVerbs keeps one `iba_cm` table for all of them (`wv_driver.c:554-575`). A flip
//! takes effect at the HCAs' next start; an HCA bound before keeps its binding until then
//! (`ibcm off` restarts every HCA). STATUS reports this reading, not the registry's value.

use core::sync::atomic::{AtomicBool, Ordering};

use crate::{event_log, parameters};

static SWITCHED_OFF: AtomicBool = AtomicBool::new(false);

/// EvtDeviceD0Entry, before the HCA binds (PASSIVE_LEVEL): reads `Disabled`.
pub fn read_at_start() {
    let off = parameters::switched_off();
    SWITCHED_OFF.store(off, Ordering::Release);
    if off {
        event_log::switched_off();
    }
}

/// Whether ibcm is switched off (as read at the latest HCA start).
pub fn switched_off() -> bool {
    SWITCHED_OFF.load(Ordering::Acquire)
}
