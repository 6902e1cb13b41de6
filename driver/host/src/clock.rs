//! Time for host nodes: virtual (advanced by the fabric, for deterministic tests) or real
//! (monotonic, for runs with real threads).

use std::sync::atomic::{AtomicU64, Ordering};

use ibcm_cep::Instant;

/// A shared clock.
#[derive(Debug)]
pub struct Clock {
    real: Option<std::time::Instant>,
    virtual_ns: AtomicU64,
}

impl Clock {
    /// Virtual time starting at `ns`.
    pub fn virtual_at(ns: u64) -> Self {
        Self {
            real: None,
            virtual_ns: AtomicU64::new(ns),
        }
    }

    /// Real monotonic time, starting now at 1 ms.
    pub fn real() -> Self {
        Self {
            real: Some(std::time::Instant::now()),
            virtual_ns: AtomicU64::new(1_000_000),
        }
    }

    /// Whether the clock follows real time.
    pub fn is_real(&self) -> bool {
        self.real.is_some()
    }

    /// Now.
    pub fn now(&self) -> Instant {
        let base = self.virtual_ns.load(Ordering::Acquire);
        match self.real {
            Some(start) => {
                Instant::from_nanos(base.saturating_add(start.elapsed().as_nanos() as u64))
            }
            None => Instant::from_nanos(base),
        }
    }

    /// Moves virtual time forward to `at` (never backwards; no effect on a real clock).
    pub fn advance_to(&self, at: Instant) {
        if self.real.is_none() {
            self.virtual_ns.fetch_max(at.as_nanos(), Ordering::AcqRel);
        }
    }
}
