//! How a node's platform tells whoever runs the node (the fabric's real-time thread, a
//! RoCEv2 port's transmit thread, ib_umad's port thread) that it has a MAD to send or a
//! new timer deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ibcm_cep::Instant;

/// How a timer-only runner is woken: it waits on files of its own (ib_umad's port thread
/// polls the umad file, the device's async events and an eventfd), and this raises the
/// one that wakes it (writes the eventfd). Raised, it stays readable until the runner
/// reads it, so a raise between the runner's last look and its wait is not lost.
pub type Raise = Box<dyn Fn() + Send + Sync>;

/// Wakes the real-time runner when a node has something to send or re-arms its timer.
pub struct Wake {
    /// Signalled and not yet consumed by the runner. `notify` sets it outside the lock, so
    /// that every MAD sent while the runner is busy (or, in virtual time, never waits)
    /// costs one atomic swap rather than a lock; `timer_set` sets it under the lock.
    signalled: AtomicBool,
    /// A timer-only runner's sleep: the deadline it sleeps until, `None` while it runs
    /// (it reads the timer again before it sleeps).
    lock: Mutex<Option<Instant>>,
    cv: Condvar,
    /// A timer-only runner's wake ([`Wake::timer_only`]); `None`: the runner carries the
    /// node's MADs (a MAD queued wakes it) and sleeps on the condvar.
    raise: Option<Raise>,
}

impl core::fmt::Debug for Wake {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Wake")
            .field("signalled", &self.signalled)
            .field("carries_sends", &self.raise.is_none())
            .finish_non_exhaustive()
    }
}

impl Default for Wake {
    fn default() -> Self {
        Self::carrying_sends()
    }
}

impl Wake {
    /// For a runner that carries its node's MADs (the fabric's real-time thread, a RoCEv2
    /// port's transmit thread): every MAD queued and every timer change wakes it, from
    /// its sleep in [`wait`](Self::wait).
    pub fn carrying_sends() -> Self {
        Self::new(None)
    }

    /// For a runner that only runs its node's timer and PASSIVE_LEVEL work, the MADs
    /// written by the threads that queue them (ib_umad's callers), and that waits on
    /// files of its own ([`sleep_for_timer`](Self::sleep_for_timer)), woken by `raise`: a
    /// MAD queued does not wake it, and a timer re-armed wakes it only when due before
    /// the deadline it sleeps until. Each wake is a context switch there and back; a
    /// connection re-arms the timer twice (its REP's, then its RTU's).
    pub fn timer_only(raise: Raise) -> Self {
        Self::new(Some(raise))
    }

    fn new(raise: Option<Raise>) -> Self {
        Self {
            signalled: AtomicBool::new(false),
            lock: Mutex::new(None),
            cv: Condvar::new(),
            raise,
        }
    }

    fn sleep(&self) -> MutexGuard<'_, Option<Instant>> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the runner from its sleep.
    fn wake_runner(&self) {
        match &self.raise {
            Some(raise) => raise(),
            None => self.cv.notify_one(),
        }
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
            // orders it after a runner that checked the flag and is about to wait on the
            // condvar, so the notification reaches it (a raised file needs no such
            // order: it stays readable).
            if self.raise.is_none() {
                drop(self.sleep());
            }
            self.wake_runner();
        }
    }

    /// A MAD was queued: the runner is signalled if it carries MADs.
    pub fn sent(&self) {
        if self.raise.is_none() {
            self.notify();
        }
    }

    /// The node's timer is now `deadline`: the runner is signalled if it carries MADs (its
    /// sleep does not follow the timer), or if it sleeps past `deadline`. A timer-only
    /// runner that sleeps until an earlier deadline, or runs, finds it when it reads the
    /// timer; a disarmed timer wakes nobody (the runner wakes at its old deadline, finds
    /// nothing due and sleeps again).
    pub fn timer_set(&self, deadline: Option<Instant>) {
        if self.raise.is_none() {
            self.notify();
            return;
        }
        let Some(deadline) = deadline else {
            return;
        };
        // Under the lock the runner holds from reading the timer until it has published
        // the deadline it sleeps until: either it reads this deadline, or its deadline is
        // here.
        let sleep = self.sleep();
        if sleep.is_some_and(|until| deadline < until) {
            self.signalled.store(true, Ordering::Release);
            drop(sleep);
            self.wake_runner();
        }
    }

    /// Waits up to `timeout` for a [`notify`](Self::notify): the sleep between rounds of a
    /// runner that carries MADs. A timer-only runner sleeps in
    /// [`sleep_for_timer`](Self::sleep_for_timer), which `timer_set` knows the deadline of.
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
    /// `wait` then waits on the runner's files, the raised one among them, for the time
    /// until that deadline, at most `longest`, zero when the timer is due (the files are
    /// still looked at). The runner reads the raised file when `wait` finds it readable,
    /// and does its work after this returns: a signal from then on raises it again.
    pub fn sleep_for_timer(
        &self,
        longest: Duration,
        read: impl FnOnce() -> (Instant, Option<Instant>),
        wait: impl FnOnce(Duration),
    ) {
        let mut sleep = self.sleep();
        let (now, armed) = read();
        let cap = now.add_nanos(u64::try_from(longest.as_nanos()).unwrap_or(u64::MAX));
        let until = armed.map_or(cap, |t| t.min(cap));
        let timeout = until.nanos_since(now);
        if timeout > 0 {
            *sleep = Some(until);
        }
        drop(sleep);
        wait(Duration::from_nanos(timeout));
        *self.sleep() = None;
        self.signalled.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc::{Receiver, channel};

    fn ms(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000_000)
    }

    /// A timer-only wake whose raised file is a channel (it stays readable until read, as
    /// an eventfd does), and the count of raises.
    fn raised() -> (Arc<Wake>, Receiver<()>, Arc<AtomicUsize>) {
        let (tx, rx) = channel();
        let raises = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&raises);
        let wake = Wake::timer_only(Box::new(move || {
            count.fetch_add(1, Ordering::Relaxed);
            let _ = tx.send(());
        }));
        (Arc::new(wake), rx, raises)
    }

    /// The runner's wait: the raised file, read when readable, for at most `timeout`.
    fn wait_on(file: &Receiver<()>, timeout: Duration) {
        if file.recv_timeout(timeout).is_ok() {
            while file.try_recv().is_ok() {}
        }
    }

    /// Sleeps `wake`'s runner with no timer armed, up to 30 s, waiting on `file`; returns
    /// how long it slept.
    fn sleep_without_timer(wake: &Wake, file: &Receiver<()>) -> std::time::Duration {
        let start = std::time::Instant::now();
        wake.sleep_for_timer(
            Duration::from_secs(30),
            || (ms(0), None),
            |t| wait_on(file, t),
        );
        start.elapsed()
    }

    /// Runs `then` on another thread once `wake`'s runner sleeps (published its deadline).
    fn once_asleep(
        wake: &Arc<Wake>,
        then: impl FnOnce(&Wake) + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let other = Arc::clone(wake);
        std::thread::spawn(move || {
            let begun = std::time::Instant::now();
            while other.sleep().is_none() && begun.elapsed() < Duration::from_secs(5) {
                std::thread::yield_now();
            }
            then(&other);
        })
    }

    /// A timer-only runner is not woken by a MAD queued, nor by a deadline at or after the
    /// one it sleeps until, and is woken by an earlier one.
    #[test]
    fn a_timer_only_runner_wakes_for_an_earlier_deadline_only() {
        let (wake, _file, raises) = raised();
        *wake.sleep() = Some(ms(100));
        wake.sent();
        wake.timer_set(Some(ms(100)));
        wake.timer_set(Some(ms(150)));
        wake.timer_set(None);
        assert!(!wake.signalled.load(Ordering::Acquire));
        assert_eq!(raises.load(Ordering::Relaxed), 0);
        wake.timer_set(Some(ms(99)));
        assert!(wake.signalled.load(Ordering::Acquire));
        assert_eq!(raises.load(Ordering::Relaxed), 1);
    }

    /// While the runner runs (it reads the timer before it sleeps), a deadline set wakes
    /// nobody.
    #[test]
    fn a_running_timer_only_runner_is_not_signalled() {
        let (wake, _file, raises) = raised();
        wake.timer_set(Some(ms(1)));
        assert!(!wake.signalled.load(Ordering::Acquire));
        assert_eq!(raises.load(Ordering::Relaxed), 0);
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

    /// The wait is until the timer, capped at `longest`, and zero when the timer is due;
    /// the runner is awake again once it returns.
    #[test]
    fn the_sleep_lasts_until_the_timer_or_the_cap() {
        let (wake, _file, _) = raised();
        let mut waits = Vec::new();
        for (now, armed) in [
            (ms(10), Some(ms(10))),
            (ms(10), Some(ms(5))),
            (ms(10), Some(ms(25))),
            (ms(0), None),
            (ms(0), Some(ms(30_000))),
        ] {
            wake.sleep_for_timer(
                Duration::from_millis(50),
                || (now, armed),
                |t| waits.push(t),
            );
            assert!(wake.sleep().is_none(), "awake again");
        }
        let ms = Duration::from_millis;
        assert_eq!(waits, [ms(0), ms(0), ms(15), ms(50), ms(50)]);
    }

    /// An earlier deadline set from another thread while the runner sleeps raises its
    /// file and ends the sleep.
    #[test]
    fn an_earlier_deadline_ends_the_sleep() {
        let (wake, file, raises) = raised();
        let setter = once_asleep(&wake, |w| w.timer_set(Some(ms(1))));
        let start = std::time::Instant::now();
        wake.sleep_for_timer(
            Duration::from_secs(30),
            || (ms(0), Some(ms(30_000))),
            |t| wait_on(&file, t),
        );
        setter
            .join()
            .unwrap_or_else(|_| unreachable!("the setter does not panic"));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "woken by the earlier deadline"
        );
        assert_eq!(raises.load(Ordering::Relaxed), 1);
        assert!(!wake.signalled.load(Ordering::Acquire), "consumed");
    }

    /// The timer is read under the lock `timer_set` takes, and the deadline published
    /// before it is let go: a deadline set by another thread while the runner decides how
    /// long to sleep ends the sleep (seen failing, asleep for the whole cap, with the
    /// timer read before the lock is taken).
    #[test]
    fn a_deadline_set_while_the_runner_reads_the_timer_wakes_it() {
        let (wake, file, _) = raised();
        let other = Arc::clone(&wake);
        let start = std::time::Instant::now();
        let mut setter = None;
        wake.sleep_for_timer(
            Duration::from_secs(30),
            || {
                setter = Some(std::thread::spawn(move || other.timer_set(Some(ms(1)))));
                std::thread::sleep(Duration::from_millis(20));
                (ms(0), None)
            },
            |t| wait_on(&file, t),
        );
        if let Some(s) = setter {
            s.join()
                .unwrap_or_else(|_| unreachable!("the setter does not panic"));
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "woken by the deadline set"
        );
    }

    /// Passive work and stopping reach a timer-only runner at once, not at its cap, and a
    /// notify while it runs is raised again after it slept: none is lost.
    #[test]
    fn notify_wakes_a_timer_only_runner() {
        let (wake, file, raises) = raised();
        let notifier = once_asleep(&wake, Wake::notify);
        let slept = sleep_without_timer(&wake, &file);
        notifier
            .join()
            .unwrap_or_else(|_| unreachable!("the notifier does not panic"));
        assert!(slept < Duration::from_secs(10), "woken by notify");
        // Consumed on waking: the next notify, made while the runner works, raises again.
        wake.notify();
        assert_eq!(raises.load(Ordering::Relaxed), 2);
        assert!(
            sleep_without_timer(&wake, &file) < Duration::from_secs(10),
            "not lost"
        );
    }
}
