//! Per-thread state: the IRQL, the spin locks held, whose code runs (the driver's or the
//! kernel's, for pool tracking), and the processor number. Every OS thread is a processor
//! of its own, so two threads at DISPATCH_LEVEL run at once as on two CPUs.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::verifier::{Rule, bugcheck};

pub const PASSIVE: u8 = 0;
pub const APC: u8 = 1;
pub const DISPATCH: u8 = 2;

/// Processors the simulation reports (`KeQueryActiveProcessorCountEx`); every thread that
/// enters the driver gets one of these numbers.
pub const PROCESSORS: u32 = 64;

static NEXT_PROCESSOR: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static IRQL: Cell<u8> = const { Cell::new(PASSIVE) };
    static IN_DRIVER: Cell<bool> = const { Cell::new(false) };
    /// A processor thread: DPCs on it run in the idle thread, whose ID is 0 on every
    /// processor (why the binding names a DISPATCH_LEVEL caller by its processor).
    static IDLE_THREAD: Cell<bool> = const { Cell::new(false) };
    static PROCESSOR: Cell<u32> = const { Cell::new(u32::MAX) };
    /// Spin locks this thread holds: (address, the IRQL it was acquired from).
    static HELD: RefCell<Vec<(usize, u8)>> = const { RefCell::new(Vec::new()) };
}

pub fn irql() -> u8 {
    IRQL.with(Cell::get)
}

pub fn set_irql(level: u8) {
    IRQL.with(|c| c.set(level));
}

/// This thread's processor number (assigned at first use, never reused).
pub fn processor() -> u32 {
    PROCESSOR.with(|p| {
        if p.get() == u32::MAX {
            let n = NEXT_PROCESSOR.fetch_add(1, Ordering::Relaxed);
            if n >= PROCESSORS {
                bugcheck(
                    Rule::Simulation,
                    format_args!("more than {PROCESSORS} threads entered the driver"),
                );
            }
            p.set(n);
        }
        p.get()
    })
}

/// Marks this thread as a processor's idle thread (see `IDLE_THREAD`).
pub fn set_idle_thread() {
    IDLE_THREAD.with(|c| c.set(true));
}

/// Whether this thread is a processor's idle thread.
pub fn is_idle_thread() -> bool {
    IDLE_THREAD.with(Cell::get)
}

/// Whether the driver's code is running on this thread now (its allocations are pool).
pub fn in_driver() -> bool {
    IN_DRIVER.with(Cell::get)
}

/// Spin locks held by this thread.
pub fn held_locks() -> usize {
    HELD.with(|h| h.borrow().len())
}

pub fn push_held(lock: usize, old: u8) {
    HELD.with(|h| h.borrow_mut().push((lock, old)));
}

/// The IRQL `lock` was acquired from, if this thread holds it (and forgets it).
pub fn pop_held(lock: usize) -> Option<u8> {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        let i = h.iter().position(|(l, _)| *l == lock)?;
        Some(h.remove(i).1)
    })
}

/// The spin locks this thread holds, outermost first.
pub fn held() -> Vec<usize> {
    HELD.with(|h| h.borrow().iter().map(|(l, _)| *l).collect())
}

pub fn holds(lock: usize) -> bool {
    HELD.with(|h| h.borrow().iter().any(|(l, _)| *l == lock))
}

/// Marks the kernel's own code for the length of a kernel function the driver called.
pub struct KernelCode {
    was_driver: bool,
}

impl KernelCode {
    pub fn enter() -> Self {
        let was_driver = IN_DRIVER.with(|c| c.replace(false));
        Self { was_driver }
    }
}

impl Drop for KernelCode {
    fn drop(&mut self) {
        IN_DRIVER.with(|c| c.set(self.was_driver));
    }
}

/// Calls into the driver at `level` (a callback, DriverEntry, an AL callback): the IRQL is
/// set for the call, and on return it and the spin locks held must be as they were
/// (Driver Verifier checks both when a callback returns: a DPC or work item returning at
/// another IRQL, or with a lock held, is bug check 0xC4/0xD1 material).
pub fn call_driver<R>(what: &str, level: u8, f: impl FnOnce() -> R) -> R {
    let before = irql();
    if level < before {
        bugcheck(
            Rule::Simulation,
            format_args!("{what} called at IRQL {level} from IRQL {before}"),
        );
    }
    let locks = held_locks();
    set_irql(level);
    processor();
    let was_driver = IN_DRIVER.with(|c| c.replace(true));
    let result = f();
    IN_DRIVER.with(|c| c.set(was_driver));
    let after = irql();
    if after != level {
        bugcheck(
            Rule::IrqlNotRestored,
            format_args!("{what} returned at IRQL {after}, entered at {level}"),
        );
    }
    if held_locks() != locks {
        bugcheck(
            Rule::SpinLockHeldOnReturn,
            format_args!(
                "{what} returned holding {} spin lock(s)",
                held_locks() - locks
            ),
        );
    }
    set_irql(before);
    result
}

/// The IRQL rule of a kernel function: callable at `max` or below.
pub fn require_irql(function: &str, max: u8) {
    let now = irql();
    if now > max {
        bugcheck(
            Rule::IrqlTooHigh,
            format_args!("{function} called at IRQL {now}; its maximum is {max}"),
        );
    }
}
