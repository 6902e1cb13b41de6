//! The kill switch (`Parameters\Disabled`, read by parameters.rs; docs/windows.md "Turning
//! ibcm off"), as the driver read it at the latest HCA start.
//!
//! One reading for the host: while it is on, no HCA that starts binds (no AL objects, no
//! MAD service, no QP1 steering, ibbus's verbs table left as the HCA filled it) and every
//! CM query on every HCA goes down to AL's CM,
//! since WinVerbs keeps one `iba_cm` table for all of them (`wv_driver.c:554-575`). A flip
//! takes effect at the HCAs' next start; an HCA bound before keeps its binding until then
//! (`ibcm off` restarts every HCA). STATUS reports this reading, not the registry's value.

use core::sync::atomic::{AtomicBool, Ordering};

use crate::{event_log, parameters};

static SWITCHED_OFF: AtomicBool = AtomicBool::new(false);

/// EvtDeviceD0Entry, before the HCA binds, and ibbus's verbs query just before it
/// (PASSIVE_LEVEL): reads `Disabled`.
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

/// A verbs query reaches the filter's preprocess routine (PASSIVE_LEVEL): ibbus's
/// (`from_ibbus`, its `InterfaceSpecificData`) is made at the HCA's start and resume,
/// before EvtDeviceD0Entry (bus_pnp.c:448, 566, 1721), so the switch is read for it now;
/// while it is on the query passes untouched and AL's QP1 runs on the HCA's own verbs,
/// none of ibcm's code in its path. Another driver's query reads nothing new.
pub fn at_verbs_query(from_ibbus: bool) -> bool {
    if from_ibbus {
        read_at_start();
    }
    switched_off()
}
