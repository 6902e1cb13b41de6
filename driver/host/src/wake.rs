//! How a node's platform tells whoever runs the node (the fabric's real-time thread, a
//! RoCEv2 port's transmit thread, ib_umad's timer thread) that it has a MAD to send or a
//! new timer deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ibcm_cep::Instant;

/// Wakes the real-time runner when a node has something to send or re-arms its timer.
#[derive(Debug)]
pub struct Wake {
    /// Signalled and not yet consumed by the runner. `notify` sets it outside the lock, so
    /// that every MAD sent while the runner is busy (or, in virtual time, never waits)
    /// costs one atomic swap rather than a lock; `timer_set` sets it under the lock.
    signalled: AtomicBool,
    /// A timer-only runner's sleep: the deadline it sleeps until, `None` while it runs
    /// (it reads the timer again before it sleeps).
    lock: Mutex<Option<Instant>>,
    cv: Condvar,
    /// Whether the runner carries the node's MADs (a MAD queued wakes it).
    carries_sends: bool,
}

impl Default for Wake {
    fn default() -> Self {
        Self::carrying_sends()
    }
}

impl Wake {
    /// For a runner that carries its node's MADs (the fabric's real-time thread, a RoCEv2
    /// port's transmit thread): every MAD queued and every timer change wakes it.
    pub fn carrying_sends() -> Self {
        Self::new(true)
    }

    /// For a runner that only runs its node's timer and PASSIVE_LEVEL work, the MADs
    /// written by the threads that queue them (ib_umad's callers): a MAD queued does not
    /// wake it, and a timer re-armed wakes it only when due before the deadline it sleeps
    /// until ([`wait_for_timer`](Self::wait_for_timer)). Each wake is a context switch
    /// there and back; a connection re-arms the timer twice (its REP's, then its RTU's).
    pub fn timer_only() -> Self {
        Self::new(false)
    }

    fn new(carries_sends: bool) -> Self {
        Self {
            signalled: AtomicBool::new(false),
            lock: Mutex::new(None),
            cv: Condvar::new(),
            carries_sends,
        }
    }

    fn sleep(&self) -> MutexGuard<'_, Option<Instant>> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

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
            drop(self.sleep());
            self.cv.notify_one();
        }
    }

    /// A MAD was queued: the runner is signalled if it carries MADs.
    pub fn sent(&self) {
        if self.carries_sends {
            self.notify();
        }
    }

    /// The node's timer is now `deadline`: the runner is signalled if it carries MADs (its
    /// sleep does not follow the timer), or if it sleeps past `deadline`. A timer-only
    /// runner that sleeps until an earlier deadline, or runs, finds it when it reads the
    /// timer; a disarmed timer wakes nobody (the runner wakes at its old deadline, finds
    /// nothing due and sleeps again).
    pub fn timer_set(&self, deadline: Option<Instant>) {
        if self.carries_sends {
            self.notify();
            return;
        }
        let Some(deadline) = deadline else {
            return;
        };
        // Under the lock the runner holds from reading the timer until it waits: either
        // it reads this deadline, or it already sleeps and its deadline is here.
        let sleep = self.sleep();
        if sleep.is_some_and(|until| deadline < until) {
            self.signalled.store(true, Ordering::Release);
            drop(sleep);
            self.cv.notify_one();
        }
    }

    /// Waits up to `timeout` for a [`notify`](Self::notify): the sleep between rounds of a
    /// runner that carries MADs. A timer-only runner sleeps in
    /// [`wait_for_timer`](Self::wait_for_timer), which `timer_set` knows the deadline of.
    pub fn wait(&self, timeout: Duration) {
        let guard = self.sleep();
        let _ = self
            .cv
            .wait_timeout_while(guard, timeout, |_| !self.signalled.load(Ordering::Acquire))
            .unwrap_or_else(PoisonError::into_inner);
        self.signalled.store(false, Ordering::Release);
    }

    /// A timer-only runner's sleep: `read` gives the time and the timer's deadline, both
    /// read under the lock [`timer_set`](Self::timer_set) takes (so a deadline set
    /// meanwhile is not missed, and waiting for the lock does not lengthen the sleep);
    /// sleeps until that deadline, at most `longest`, or until signalled. Returns at once
    /// when the timer is due.
    pub fn wait_for_timer(
        &self,
        longest: Duration,
        read: impl FnOnce() -> (Instant, Option<Instant>),
    ) {
        let mut sleep = self.sleep();
        let (now, armed) = read();
        let cap = now.add_nanos(u64::try_from(longest.as_nanos()).unwrap_or(u64::MAX));
        let until = armed.map_or(cap, |t| t.min(cap));
        let wait = until.nanos_since(now);
        if wait == 0 {
            return;
        }
        *sleep = Some(until);
        let (mut sleep, _) = self
            .cv
            .wait_timeout_while(sleep, Duration::from_nanos(wait), |_| {
                !self.signalled.load(Ordering::Acquire)
            })
            .unwrap_or_else(PoisonError::into_inner);
        *sleep = None;
        self.signalled.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000_000)
    }

    /// A timer-only runner is not woken by a MAD queued, nor by a deadline at or after the
    /// one it sleeps until, and is woken by an earlier one.
    #[test]
    fn a_timer_only_runner_wakes_for_an_earlier_deadline_only() {
        let wake = Wake::timer_only();
        *wake.sleep() = Some(ms(100));
        wake.sent();
        wake.timer_set(Some(ms(100)));
        wake.timer_set(Some(ms(150)));
        wake.timer_set(None);
        assert!(!wake.signalled.load(Ordering::Acquire));
        wake.timer_set(Some(ms(99)));
        assert!(wake.signalled.load(Ordering::Acquire));
    }

    /// While the runner runs (it reads the timer before it sleeps), a deadline set wakes
    /// nobody.
    #[test]
    fn a_running_timer_only_runner_is_not_signalled() {
        let wake = Wake::timer_only();
        wake.timer_set(Some(ms(1)));
        assert!(!wake.signalled.load(Ordering::Acquire));
    }

    /// A runner that carries MADs is woken by every MAD and every timer change.
    #[test]
    fn a_runner_carrying_sends_wakes_for_each() {
        let wake = Wake::carrying_sends();
        wake.sent();
        assert!(wake.signalled.swap(false, Ordering::AcqRel));
        wake.timer_set(None);
        assert!(wake.signalled.swap(false, Ordering::AcqRel));
    }

    /// The sleep ends at the timer, is capped at `longest`, and is skipped when the timer
    /// is due; an earlier deadline set from another thread ends it.
    #[test]
    fn wait_for_timer_sleeps_until_the_timer_or_an_earlier_one() {
        let wake = std::sync::Arc::new(Wake::timer_only());
        let start = std::time::Instant::now();
        wake.wait_for_timer(Duration::from_secs(5), || (ms(10), Some(ms(10))));
        wake.wait_for_timer(Duration::from_secs(5), || (ms(10), Some(ms(5))));
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "a due timer does not sleep"
        );
        let start = std::time::Instant::now();
        wake.wait_for_timer(Duration::from_millis(20), || (ms(0), None));
        assert!(start.elapsed() >= Duration::from_millis(20), "capped sleep");
        let other = std::sync::Arc::clone(&wake);
        let setter = std::thread::spawn(move || {
            let begun = std::time::Instant::now();
            while other.sleep().is_none() && begun.elapsed() < Duration::from_secs(5) {
                std::thread::yield_now();
            }
            other.timer_set(Some(ms(1)));
        });
        let start = std::time::Instant::now();
        wake.wait_for_timer(Duration::from_secs(30), || (ms(0), Some(ms(30_000))));
        setter
            .join()
            .unwrap_or_else(|_| unreachable!("the setter does not panic"));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "woken by the earlier deadline"
        );
        assert!(wake.sleep().is_none(), "awake again");
    }

    /// The timer is read under the lock `timer_set` takes: a deadline set by another
    /// thread while the runner decides how long to sleep ends the sleep (seen failing,
    /// asleep for the whole cap, with the timer read before the lock is taken).
    #[test]
    fn a_deadline_set_while_the_runner_reads_the_timer_wakes_it() {
        let wake = std::sync::Arc::new(Wake::timer_only());
        let other = std::sync::Arc::clone(&wake);
        let start = std::time::Instant::now();
        let mut setter = None;
        wake.wait_for_timer(Duration::from_secs(30), || {
            setter = Some(std::thread::spawn(move || other.timer_set(Some(ms(1)))));
            std::thread::sleep(Duration::from_millis(20));
            (ms(0), None)
        });
        if let Some(s) = setter {
            s.join()
                .unwrap_or_else(|_| unreachable!("the setter does not panic"));
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "woken by the deadline set"
        );
    }

    /// Passive work and stopping reach a timer-only runner at once, not at its cap.
    #[test]
    fn notify_wakes_a_timer_only_runner() {
        let wake = std::sync::Arc::new(Wake::timer_only());
        let other = std::sync::Arc::clone(&wake);
        let notifier = std::thread::spawn(move || {
            let begun = std::time::Instant::now();
            while other.sleep().is_none() && begun.elapsed() < Duration::from_secs(5) {
                std::thread::yield_now();
            }
            other.notify();
        });
        let start = std::time::Instant::now();
        wake.wait_for_timer(Duration::from_secs(30), || (ms(0), None));
        notifier
            .join()
            .unwrap_or_else(|_| unreachable!("the notifier does not panic"));
        assert!(start.elapsed() < Duration::from_secs(10), "woken by notify");
    }
}
