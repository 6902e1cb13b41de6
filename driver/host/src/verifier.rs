//! What Driver Verifier would catch, checked on the host: each request completed exactly
//! once, never after its cancellation was honoured, never with a lock held, never writing
//! past the caller's output length; every request accounted for; no allocation at
//! DISPATCH_LEVEL. A broken rule is recorded as a [`Violation`]; tests assert there are
//! none.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A request was completed twice.
    DoubleCompletion {
        /// The request.
        key: u64,
    },
    /// A request was completed while a lock was held.
    CompletedUnderLock {
        /// The request.
        key: u64,
    },
    /// A request whose cancellation was requested completed with another status after
    /// the cancel routine had run.
    CompletedAfterCancel {
        /// The request.
        key: u64,
    },
    /// A write past the caller's output buffer.
    OutputOverflow {
        /// The request.
        key: u64,
        /// End of the write.
        end: usize,
        /// Output buffer length.
        len: usize,
    },
    /// A completion reported more output bytes than were written or fit.
    BadInformation {
        /// The request.
        key: u64,
    },
    /// A request was never completed by the time its file closed or the device unloaded.
    Leaked {
        /// The request.
        key: u64,
    },
    /// Memory was allocated at DISPATCH_LEVEL (receive path or timer).
    DispatchAllocation {
        /// Allocations made.
        count: u64,
    },
    /// An endpoint outlived its file.
    EndpointLeak {
        /// Endpoints left.
        count: usize,
    },
}

thread_local! {
    static LOCKS_HELD: Cell<usize> = const { Cell::new(0) };
}

/// Counts a lock acquisition on this thread (the host lock calls it).
pub(crate) fn lock_acquired() {
    LOCKS_HELD.with(|c| c.set(c.get() + 1));
}

/// Counts a lock release on this thread.
pub(crate) fn lock_released() {
    LOCKS_HELD.with(|c| c.set(c.get().saturating_sub(1)));
}

/// Locks held by this thread.
pub fn locks_held() -> usize {
    LOCKS_HELD.with(Cell::get)
}

/// Runs `f` at (modelled) DISPATCH_LEVEL, the level of the receive path and the timer
/// DPC: an allocation made by this thread meanwhile is a [`Violation::DispatchAllocation`].
pub fn at_dispatch<T>(ledger: &Ledger, f: impl FnOnce() -> T) -> T {
    let mut value = None;
    let info = allocation_counter::measure(|| value = Some(f()));
    if info.count_total > 0 {
        ledger.violate(Violation::DispatchAllocation {
            count: info.count_total,
        });
    }
    match value {
        Some(v) => v,
        // `measure` runs its closure exactly once.
        None => unreachable!("allocation_counter::measure did not run the closure"),
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// NTSTATUS.
    pub status: i32,
    /// Output bytes reported.
    pub information: usize,
    /// The bytes written to the output buffer (a prefix; gaps zeroed).
    pub output: Vec<u8>,
}

#[derive(Debug, Default)]
struct Entry {
    file: u64,
    cancel_requested: bool,
    completion: Option<Completion>,
}

/// Hashes a request key (keys are sequential) with one multiplication: the ledger sits
/// on every IOCTL, so it must cost little next to the dispatch it checks.
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, key: u64) {
        self.0 = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[derive(Debug, Default)]
struct Book {
    entries: HashMap<u64, Entry, std::hash::BuildHasherDefault<KeyHasher>>,
    /// Bit `key` set: the request completed, its completion went to a hook, and its entry
    /// was dropped (so a long in-process run keeps one bit per request, not a buffer).
    retired: Vec<u64>,
}

impl Book {
    fn is_retired(&self, key: u64) -> bool {
        let (word, bit) = ((key / 64) as usize, key % 64);
        self.retired.get(word).is_some_and(|w| w & (1 << bit) != 0)
    }

    fn retire(&mut self, key: u64) {
        let (word, bit) = ((key / 64) as usize, key % 64);
        if self.retired.len() <= word {
            // The verifier's own bookkeeping, not the driver's: not counted.
            allocation_counter::opt_out(|| self.retired.resize(word + 1, 0));
        }
        if let Some(w) = self.retired.get_mut(word) {
            *w |= 1 << bit;
        }
    }
}

/// The ledger of every request issued on a host device.
#[derive(Debug, Default)]
pub struct Ledger {
    book: Mutex<Book>,
    violations: Mutex<Vec<Violation>>,
    next_key: AtomicUsize,
}

impl Ledger {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn violate(&self, v: Violation) {
        self.violations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(v);
    }

    pub(crate) fn issue(&self, file: u64) -> u64 {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed) as u64 + 1;
        self.book().entries.insert(
            key,
            Entry {
                file,
                ..Entry::default()
            },
        );
        key
    }

    pub(crate) fn cancel_requested(&self, key: u64) {
        if let Some(e) = self.book().entries.get_mut(&key) {
            e.cancel_requested = true;
        }
    }

    /// Self-test hook: records a completion of `key` exactly as the platform does when it
    /// completes a request. A [`HostRequest`](crate::HostRequest) is consumed by its
    /// completion and cannot be duplicated, so without this the verifier's own tests could
    /// not show that [`Violation::DoubleCompletion`] fires. Not for driver code.
    #[doc(hidden)]
    pub fn complete_for_test(&self, key: u64, completion: Completion) {
        self.complete(key, completion);
    }

    /// Records a completion and keeps it for [`completion`](Self::completion).
    pub(crate) fn complete(&self, key: u64, completion: Completion) {
        let (status, information, len) = (
            completion.status,
            completion.information,
            completion.output.len(),
        );
        self.record(key, status, information, len, Some(completion));
    }

    /// Records a completion whose caller takes it (through a completion hook): the rules
    /// are checked as for any completion, then the entry is dropped and only the fact
    /// that `key` completed is kept. [`completion`](Self::completion) then answers `None`
    /// for it.
    pub(crate) fn complete_and_forget(
        &self,
        key: u64,
        status: i32,
        information: usize,
        len: usize,
    ) {
        self.record(key, status, information, len, None);
    }

    fn record(
        &self,
        key: u64,
        status: i32,
        information: usize,
        len: usize,
        retain: Option<Completion>,
    ) {
        if locks_held() != 0 {
            self.violate(Violation::CompletedUnderLock { key });
        }
        let mut book = self.book();
        let Some(e) = book.entries.get_mut(&key) else {
            let twice = book.is_retired(key);
            drop(book);
            if twice {
                self.violate(Violation::DoubleCompletion { key });
            }
            return;
        };
        if e.completion.is_some() {
            drop(book);
            self.violate(Violation::DoubleCompletion { key });
            return;
        }
        let after_cancel = e.cancel_requested && status != ibcm_ioctl::status::CANCELLED;
        match retain {
            Some(c) => e.completion = Some(c),
            None => {
                book.entries.remove(&key);
                book.retire(key);
            }
        }
        drop(book);
        if after_cancel {
            // Allowed only if the request completed normally before the cancel routine
            // ran; the host marks cancel_requested just before calling it, so any
            // non-CANCELLED completion after that point is a race the driver lost.
            self.violate(Violation::CompletedAfterCancel { key });
        }
        if information > len {
            self.violate(Violation::BadInformation { key });
        }
    }

    /// How a request ended, if it has.
    pub fn completion(&self, key: u64) -> Option<Completion> {
        self.book()
            .entries
            .get(&key)
            .and_then(|e| e.completion.clone())
    }

    /// Requests of `file` not completed yet.
    pub fn outstanding(&self, file: u64) -> Vec<u64> {
        self.book()
            .entries
            .iter()
            .filter(|(_, e)| e.file == file && e.completion.is_none())
            .map(|(k, _)| *k)
            .collect()
    }

    /// Records every outstanding request of `file` as leaked.
    pub(crate) fn account_file(&self, file: u64) {
        for key in self.outstanding(file) {
            self.violate(Violation::Leaked { key });
        }
    }

    /// Every rule broken so far.
    pub fn violations(&self) -> Vec<Violation> {
        self.violations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
