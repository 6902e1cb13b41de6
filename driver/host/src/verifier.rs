//! What Driver Verifier would catch, checked on the host: each request completed exactly
//! once, never after its cancellation was honoured, never with a lock held, never writing
//! past the caller's output length; every request accounted for; no allocation at
//! DISPATCH_LEVEL. A broken rule is recorded as a [`Violation`]; tests assert there are
//! none.

use std::cell::Cell;
use std::sync::Mutex;

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
    /// A thread waited (for another thread, [`Platform::relax`]) at DISPATCH_LEVEL.
    ///
    /// [`Platform::relax`]: ibcm_endpoint::Platform::relax
    WaitAtDispatch,
}

thread_local! {
    static LOCKS_HELD: Cell<usize> = const { Cell::new(0) };
    /// Lock acquisitions on this thread so far.
    static LOCK_HOLDS: Cell<u64> = const { Cell::new(0) };
    /// [`at_dispatch`] calls this thread is inside.
    static DISPATCH_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread runs at (modelled) DISPATCH_LEVEL, inside [`at_dispatch`].
pub fn is_at_dispatch() -> bool {
    DISPATCH_DEPTH.with(Cell::get) > 0
}

/// Counts a lock acquisition on this thread (the host lock calls it).
pub(crate) fn lock_acquired() {
    LOCKS_HELD.with(|c| c.set(c.get() + 1));
    LOCK_HOLDS.with(|c| c.set(c.get() + 1));
}

/// Lock acquisitions this thread has made so far (how many holds an entry point split
/// its work into).
pub fn lock_holds() -> u64 {
    LOCK_HOLDS.with(Cell::get)
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
///
/// Nested calls are fine (a callback at DISPATCH_LEVEL that takes a spin lock); a wait
/// meanwhile ([`Platform::relax`](ibcm_endpoint::Platform::relax)) is a
/// [`Violation::WaitAtDispatch`].
pub fn at_dispatch<T>(ledger: &Ledger, f: impl FnOnce() -> T) -> T {
    let mut value = None;
    DISPATCH_DEPTH.with(|d| d.set(d.get() + 1));
    let info = crate::counting::measure(|| value = Some(f()));
    DISPATCH_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    if info.count_total > 0 {
        ledger.violate(Violation::DispatchAllocation {
            count: info.count_total,
        });
    }
    match value {
        Some(v) => v,
        // `measure` runs its closure exactly once.
        None => unreachable!("counting::measure did not run the closure"),
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

/// One request's place in the ledger: its entry while the ledger tracks it, and the
/// generation its key names.
#[derive(Debug, Default)]
struct Slot {
    generation: u32,
    entry: Option<Entry>,
}

/// Every tracked request, in slots reused once a request's completion went to its
/// caller: a key is `generation << 32 | index + 1`, so a completion finds its entry by
/// index (the ledger sits on every IOCTL, so it must cost little next to the dispatch it
/// checks), and a key whose slot has moved to a later generation was completed before.
#[derive(Debug, Default)]
struct Book {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl Book {
    fn key(index: usize, generation: u32) -> u64 {
        (u64::from(generation) << 32) | (index as u64 + 1)
    }

    /// The slot a key names, and the generation it names.
    fn slot(&mut self, key: u64) -> Option<(&mut Slot, u32)> {
        let index = ((key & 0xffff_ffff) as usize).checked_sub(1)?;
        Some((self.slots.get_mut(index)?, (key >> 32) as u32))
    }

    /// The entry of `key`, if the ledger still tracks that request.
    fn entry(&mut self, key: u64) -> Option<&mut Entry> {
        let (slot, generation) = self.slot(key)?;
        if slot.generation == generation {
            slot.entry.as_mut()
        } else {
            None
        }
    }

    /// Whether `key` named a request whose completion went to its caller.
    fn is_retired(&mut self, key: u64) -> bool {
        self.slot(key)
            .is_some_and(|(slot, generation)| generation < slot.generation)
    }

    fn issue(&mut self, file: u64) -> u64 {
        let entry = Entry {
            file,
            ..Entry::default()
        };
        if let Some(index) = self.free.pop()
            && let Some(slot) = self.slots.get_mut(index as usize)
        {
            slot.entry = Some(entry);
            return Self::key(index as usize, slot.generation);
        }
        // The verifier's own bookkeeping, not the driver's: not counted.
        crate::counting::opt_out(|| {
            self.slots.push(Slot {
                generation: 0,
                entry: Some(entry),
            });
            // Room in the free list for every slot: retiring (on a completion, maybe at
            // DISPATCH_LEVEL) never allocates.
            self.free
                .reserve(self.slots.len().saturating_sub(self.free.len()));
        });
        Self::key(self.slots.len() - 1, 0)
    }

    /// Forgets `key`'s request (its completion went to its caller).
    fn retire(&mut self, key: u64) {
        if let Some((slot, _)) = self.slot(key) {
            slot.entry = None;
            slot.generation = slot.generation.wrapping_add(1);
            // Room was made when the slot was added.
            self.free.push((key & 0xffff_ffff) as u32 - 1);
        }
    }
}

/// The ledger of every request issued on a host device.
#[derive(Debug, Default)]
pub struct Ledger {
    book: Mutex<Book>,
    violations: Mutex<Vec<Violation>>,
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
        self.book().issue(file)
    }

    pub(crate) fn cancel_requested(&self, key: u64) {
        if let Some(e) = self.book().entry(key) {
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
        let Some(e) = book.entry(key) else {
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
            None => book.retire(key),
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
        self.book().entry(key).and_then(|e| e.completion.clone())
    }

    /// Requests of `file` not completed yet.
    pub fn outstanding(&self, file: u64) -> Vec<u64> {
        self.book()
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.entry
                    .as_ref()
                    .is_some_and(|e| e.file == file && e.completion.is_none())
            })
            .map(|(i, s)| Book::key(i, s.generation))
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
