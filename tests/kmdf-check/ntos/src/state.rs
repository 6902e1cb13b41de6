//! The simulation's global state: one lock and one condition variable that every wait
//! rechecks, the debugger log, and hang detection for waits.

use std::collections::HashMap;
use std::fmt::Arguments;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::objects::Objects;
use crate::verifier::{Rule, bugcheck};

/// How long a wait may last before the simulation calls it a wait that never returns
/// (Windows' bug check 0x9F, DRIVER_POWER_STATE_FAILURE, fires after 10 minutes of a
/// power IRP held; the simulation's scenarios finish in seconds). `IBCM_SIM_HANG_S`
/// overrides it.
pub fn hang_limit() -> Duration {
    let set = HANG_LIMIT_S.load(std::sync::atomic::Ordering::Relaxed);
    if set != 0 {
        return Duration::from_secs(set);
    }
    let seconds = std::env::var("IBCM_SIM_HANG_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    Duration::from_secs(seconds)
}

static HANG_LIMIT_S: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Sets the hang limit for this process (a scenario that shows a wait never returning).
pub fn set_hang_limit(limit: Duration) {
    HANG_LIMIT_S.store(limit.as_secs().max(1), std::sync::atomic::Ordering::Relaxed);
}

/// Everything the kernel keeps, under one lock.
#[derive(Default)]
pub struct State {
    pub objects: Objects,
    pub sched: crate::sched::Sched,
    pub log: Vec<String>,
    /// KEVENTs by address: (signalled, synchronization event).
    pub events: HashMap<usize, (bool, bool)>,
    /// EX_RUNDOWN_REFs by address: (protections held, rundown started).
    pub rundowns: HashMap<usize, (u64, bool)>,
    /// Time spent in timed-out waits per event, for hang detection.
    pub waited: HashMap<usize, Duration>,
    pub registry: crate::registry::Registry,
    pub devices: crate::wdf_device::Devices,
    pub io: crate::io::Io,
    pub pnp: crate::pnp::Pnp,
    pub al: crate::al::Al,
    pub hca: crate::hca::Hca,
    pub spl: crate::spl_qp::SplQp,
    pub physical: crate::physical::Physical,
}

// SAFETY: the raw pointers inside (driver contexts, IRP blocks, copied configurations) are
// only reached under the lock; the simulation is the kernel, shared by every processor.
unsafe impl Send for State {}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static CHANGED: Condvar = Condvar::new();

/// The state, locked (made at first use).
pub fn lock() -> Guard {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = Some(State::default());
    }
    Guard(guard)
}

pub struct Guard(MutexGuard<'static, Option<State>>);

impl std::ops::Deref for Guard {
    type Target = State;
    fn deref(&self) -> &State {
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("made in lock()"))
    }
}

impl std::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut State {
        self.0
            .as_mut()
            .unwrap_or_else(|| unreachable!("made in lock()"))
    }
}

/// Wakes every waiter to recheck its condition.
pub fn changed() {
    CHANGED.notify_all();
}

/// Waits until `done` holds, rechecking at each change, for at most `limit` (then
/// returns the guard with `false`). `what` names the wait in the hang report.
pub fn wait_until(
    mut guard: Guard,
    limit: Option<Duration>,
    what: &dyn Fn() -> String,
    mut done: impl FnMut(&mut State) -> bool,
) -> (Guard, bool) {
    let start = Instant::now();
    let hang = hang_limit();
    loop {
        if done(&mut guard) {
            return (guard, true);
        }
        let waited = start.elapsed();
        if let Some(limit) = limit
            && waited >= limit
        {
            return (guard, false);
        }
        if waited >= hang {
            drop(guard);
            bugcheck(
                Rule::WaitNeverReturns,
                format_args!("waited {} s for {}", waited.as_secs(), what()),
            );
        }
        let step = Duration::from_millis(50);
        let inner = guard.0;
        let (inner, _) = CHANGED
            .wait_timeout(inner, step)
            .unwrap_or_else(|e| e.into_inner());
        guard = Guard(inner);
    }
}

/// Waits for a change, at most `limit`.
pub fn wait_for(guard: Guard, limit: Duration) -> Guard {
    let (inner, _) = CHANGED
        .wait_timeout(guard.0, limit)
        .unwrap_or_else(|e| e.into_inner());
    Guard(inner)
}

/// DbgPrint.
pub fn dbg_print(args: Arguments<'_>) {
    let _kernel = crate::thread::KernelCode::enter();
    let line = args.to_string();
    if std::env::var_os("IBCM_SIM_DBGPRINT").is_some() {
        eprintln!("[dbg] {line}");
    }
    lock().log.push(line);
}

/// The debugger log's last `n` lines.
pub fn debug_log_tail(n: usize) -> Vec<String> {
    match STATE.try_lock() {
        Ok(guard) => guard
            .as_ref()
            .map(|s| s.log.iter().rev().take(n).rev().cloned().collect())
            .unwrap_or_default(),
        Err(_) => vec!["(the simulation's lock is held: log not available)".into()],
    }
}
