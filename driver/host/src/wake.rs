//! How a node's platform tells whoever runs the node (the fabric's real-time thread, a
//! RoCEv2 port's transmit thread) that it has a MAD to send or a new timer deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Wakes the real-time runner when a node has something to send or re-arms its timer.
#[derive(Debug, Default)]
pub struct Wake {
    /// Signalled and not yet consumed by the runner. Set outside the lock, so that every
    /// MAD sent while the runner is busy (or, in virtual time, never waits) costs one
    /// atomic swap rather than a lock.
    signalled: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Wake {
    /// Signals the runner.
    pub fn notify(&self) {
        // Already signalled (the runner is busy, or in virtual time never waits): a load,
        // not a read-modify-write of the shared line.
        if self.signalled.load(Ordering::Acquire) {
            return;
        }
        if !self.signalled.swap(true, Ordering::AcqRel) {
            // The first signal since the runner last woke: passing through the lock
            // orders it after a runner that checked the flag and is about to wait, so the
            // notification reaches it.
            drop(self.lock.lock().unwrap_or_else(PoisonError::into_inner));
            self.cv.notify_one();
        }
    }

    /// Waits up to `timeout` for a [`notify`](Self::notify) (a transmit/timer thread's
    /// sleep between rounds).
    pub fn wait(&self, timeout: Duration) {
        let guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self
            .cv
            .wait_timeout_while(guard, timeout, |()| !self.signalled.load(Ordering::Acquire))
            .unwrap_or_else(PoisonError::into_inner);
        self.signalled.store(false, Ordering::Release);
    }
}
