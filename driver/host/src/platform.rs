//! The host platform: a lock that the verifier can see, requests with bounded output
//! buffers and a ledger, a clock, a timer and an outbox of MADs.

use std::sync::{Arc, Mutex, PoisonError};

use ibcm_cep::{Instant, Transmit};
use ibcm_endpoint::{Lock, Platform, Request};

use crate::verifier::{Completion, Ledger, Violation, lock_acquired, lock_released};

/// A number unique to the running thread.
fn thread_key() -> u64 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static KEY: u64 = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    KEY.with(|k| *k)
}

/// A mutex standing in for a WDF spin lock; it tells the verifier when it is held.
#[derive(Debug, Default)]
pub struct HostLock<T>(Mutex<T>);

impl<T> Lock<T> for HostLock<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lock_acquired();
        let r = f(&mut guard);
        lock_released();
        r
    }
}

/// A request from a (modelled) user-mode caller: its output buffer has exactly the
/// length the caller gave.
#[derive(Debug)]
pub struct HostRequest {
    key: u64,
    output: Vec<u8>,
    ledger: Arc<Ledger>,
}

impl HostRequest {
    /// The request's key in the ledger.
    pub fn key_value(&self) -> u64 {
        self.key
    }
}

impl Request for HostRequest {
    fn output_len(&self) -> usize {
        self.output.len()
    }

    fn write_output(&mut self, offset: usize, bytes: &[u8]) {
        let end = offset.saturating_add(bytes.len());
        match self.output.get_mut(offset..end) {
            Some(dst) => dst.copy_from_slice(bytes),
            None => self.ledger.violate(Violation::OutputOverflow {
                key: self.key,
                end,
                len: self.output.len(),
            }),
        }
    }

    fn key(&self) -> u64 {
        self.key
    }
}

/// Called once with a request's completion (no lock held): how an in-process user library
/// learns that its request finished.
pub type CompletionHook = Box<dyn FnOnce(&Completion) + Send>;

/// The host platform of one node.
#[derive(Clone)]
pub struct HostPlatform {
    /// Every request's fate, and every broken rule.
    pub ledger: Arc<Ledger>,
    clock: Arc<crate::clock::Clock>,
    outbox: Arc<Mutex<Vec<Transmit>>>,
    timer: Arc<Mutex<Option<Instant>>>,
    hooks: Arc<Mutex<std::collections::HashMap<u64, CompletionHook>>>,
    wake: Arc<crate::fabric::Wake>,
}

impl core::fmt::Debug for HostPlatform {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HostPlatform")
            .field("timer", &self.timer())
            .finish_non_exhaustive()
    }
}

impl HostPlatform {
    /// A platform reading time from `clock` and waking `wake` when it has work.
    pub fn new(clock: Arc<crate::clock::Clock>, wake: Arc<crate::fabric::Wake>) -> Self {
        Self {
            ledger: Arc::new(Ledger::default()),
            clock,
            outbox: Arc::new(Mutex::new(Vec::new())),
            timer: Arc::new(Mutex::new(None)),
            hooks: Arc::new(Mutex::new(std::collections::HashMap::new())),
            wake,
        }
    }

    /// Wakes the fabric's runner thread.
    pub fn wake(&self) {
        self.wake.notify();
    }

    /// Calls `hook` when request `key` completes (install before dispatching it).
    pub fn on_completion(&self, key: u64, hook: CompletionHook) {
        self.hooks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, hook);
    }

    /// A request of `file` with an output buffer of `output_len` bytes.
    pub fn request(&self, file: u64, output_len: usize) -> HostRequest {
        HostRequest {
            key: self.ledger.issue(file),
            output: vec![0; output_len],
            ledger: Arc::clone(&self.ledger),
        }
    }

    /// Takes the MADs posted since the last call.
    pub fn take_sent(&self) -> Vec<Transmit> {
        std::mem::take(&mut *self.outbox.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The deadline the timer is armed to.
    pub fn timer(&self) -> Option<Instant> {
        *self.timer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Platform for HostPlatform {
    type Request = HostRequest;
    type Lock<T> = HostLock<T>;

    fn new_lock<T>(value: T) -> HostLock<T> {
        HostLock(Mutex::new(value))
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn send(&self, transmit: &Transmit) {
        self.outbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(transmit.clone());
        self.wake.notify();
    }

    fn complete(&self, request: HostRequest, status: i32, information: usize) {
        let HostRequest { key, output, .. } = request;
        let completion = Completion {
            status,
            information,
            output,
        };
        let hook = self
            .hooks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
        if let Some(hook) = hook {
            hook(&completion);
        }
        self.ledger.complete(key, completion);
    }

    fn current_thread(&self) -> u64 {
        thread_key()
    }

    fn relax(&self) {
        std::thread::yield_now();
    }

    fn set_timer(&self, deadline: Option<Instant>) {
        *self.timer.lock().unwrap_or_else(PoisonError::into_inner) = deadline;
        self.wake.notify();
    }
}
