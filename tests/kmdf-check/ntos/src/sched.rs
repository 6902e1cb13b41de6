//! What runs on the simulation's own threads: DPCs and timers at DISPATCH_LEVEL on one
//! processor thread, in order (AL's completions too), and work items at PASSIVE_LEVEL on a
//! system worker thread.

use std::collections::{HashMap, VecDeque};
use std::sync::Once;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::state::{self, changed};
use crate::thread::{self, DISPATCH, PASSIVE, call_driver, require_irql};
use crate::verifier::{Rule, bugcheck};
use crate::{PFN_WDF_DPC, PFN_WDF_TIMER, PFN_WDF_WORKITEM};

/// A job for the processor thread.
pub enum Job {
    Dpc(usize),
    Timer(usize),
    /// Kernel code that calls the driver itself (AL's completion callbacks).
    Call(Box<dyn FnOnce() + Send>),
}

pub struct Callback<F> {
    pub function: F,
    pub queued: bool,
    pub running: Option<ThreadId>,
}

#[derive(Default)]
pub struct Sched {
    pub dpcs: HashMap<usize, Callback<PFN_WDF_DPC>>,
    pub timers: HashMap<usize, (Callback<PFN_WDF_TIMER>, Option<Instant>)>,
    pub work_items: HashMap<usize, Callback<PFN_WDF_WORKITEM>>,
    pub dispatch: VecDeque<Job>,
    pub passive: VecDeque<usize>,
}

static START: Once = Once::new();

/// Starts the processor and worker threads (once).
pub fn start() {
    START.call_once(|| {
        std::thread::Builder::new()
            .name("processor".into())
            .spawn(processor_loop)
            .unwrap_or_else(|e| bugcheck(Rule::Simulation, format_args!("spawn: {e}")));
        std::thread::Builder::new()
            .name("worker".into())
            .spawn(worker_loop)
            .unwrap_or_else(|e| bugcheck(Rule::Simulation, format_args!("spawn: {e}")));
    });
}

fn processor_loop() {
    let me = std::thread::current().id();
    loop {
        let mut guard = state::lock();
        let now = Instant::now();
        let job = if let Some(job) = guard.sched.dispatch.pop_front() {
            Some(job)
        } else {
            let due = guard
                .sched
                .timers
                .iter()
                .filter_map(|(h, (_, due))| due.filter(|d| *d <= now).map(|d| (d, *h)))
                .min();
            due.map(|(_, h)| Job::Timer(h))
        };
        let Some(job) = job else {
            let next = guard.sched.timers.values().filter_map(|(_, d)| *d).min();
            let wait = next.map_or(Duration::from_millis(50), |d| {
                d.saturating_duration_since(now)
                    .min(Duration::from_millis(50))
            });
            drop(state::wait_for(guard, wait));
            continue;
        };
        match job {
            Job::Dpc(h) => {
                let Some(dpc) = guard.sched.dpcs.get_mut(&h) else {
                    continue;
                };
                if !dpc.queued {
                    continue;
                }
                dpc.queued = false;
                dpc.running = Some(me);
                let function = dpc.function;
                drop(guard);
                if let Some(f) = function {
                    call_driver("EvtDpcFunc", DISPATCH, || {
                        // SAFETY: the driver's DPC routine with its live DPC object.
                        unsafe { f(h as _) }
                    });
                }
                let mut guard = state::lock();
                if let Some(dpc) = guard.sched.dpcs.get_mut(&h) {
                    dpc.running = None;
                }
            }
            Job::Timer(h) => {
                let Some((timer, due)) = guard.sched.timers.get_mut(&h) else {
                    continue;
                };
                *due = None;
                timer.running = Some(me);
                let function = timer.function;
                drop(guard);
                if let Some(f) = function {
                    call_driver("EvtTimerFunc", DISPATCH, || {
                        // SAFETY: the driver's timer routine with its live timer object.
                        unsafe { f(h as _) }
                    });
                }
                let mut guard = state::lock();
                if let Some((timer, _)) = guard.sched.timers.get_mut(&h) {
                    timer.running = None;
                }
            }
            Job::Call(f) => {
                drop(guard);
                thread::set_irql(DISPATCH);
                f();
                thread::set_irql(PASSIVE);
            }
        }
        changed();
    }
}

fn worker_loop() {
    let me = std::thread::current().id();
    loop {
        let mut guard = state::lock();
        let Some(h) = guard.sched.passive.pop_front() else {
            drop(state::wait_for(guard, Duration::from_millis(50)));
            continue;
        };
        let Some(item) = guard.sched.work_items.get_mut(&h) else {
            continue;
        };
        item.queued = false;
        item.running = Some(me);
        let function = item.function;
        drop(guard);
        if let Some(f) = function {
            call_driver("EvtWorkItem", PASSIVE, || {
                // SAFETY: the driver's work item routine with its live work item.
                unsafe { f(h as _) }
            });
        }
        let mut guard = state::lock();
        if let Some(item) = guard.sched.work_items.get_mut(&h) {
            item.running = None;
        }
        drop(guard);
        changed();
    }
}

/// Queues kernel code for the processor thread.
pub fn run_at_dispatch(f: impl FnOnce() + Send + 'static) {
    state::lock()
        .sched
        .dispatch
        .push_back(Job::Call(Box::new(f)));
    changed();
}

/// Waits (PASSIVE_LEVEL) until the callback of `handle` in `table` is not running, for
/// `function`; a wait from that callback itself is a deadlock.
fn wait_not_running(
    function: &str,
    handle: usize,
    running: impl Fn(&mut state::State) -> Option<ThreadId>,
    queued: impl Fn(&mut state::State) -> bool,
) {
    require_irql(function, PASSIVE);
    let me = std::thread::current().id();
    let mut guard = state::lock();
    if running(&mut guard) == Some(me) {
        drop(guard);
        bugcheck(
            Rule::WaitNeverReturns,
            format_args!(
                "{function} with Wait = TRUE from the callback of {handle:#x} itself (it waits for itself)"
            ),
        );
    }
    let what = || format!("{function}: the callback of {handle:#x} to finish");
    let (_guard, _) = state::wait_until(guard, None, &what, |s| running(s).is_none() && !queued(s));
}

pub fn dpc_cancel(dpc: usize, wait: bool) -> bool {
    let was_queued = {
        let mut guard = state::lock();
        let entry = guard.sched.dpcs.get_mut(&dpc);
        let Some(entry) = entry else { return false };
        let was = entry.queued;
        entry.queued = false;
        was
    };
    if wait {
        wait_not_running(
            "WdfDpcCancel",
            dpc,
            |s| s.sched.dpcs.get(&dpc).and_then(|d| d.running),
            |_| false,
        );
    }
    was_queued
}

pub fn dpc_enqueue(dpc: usize) -> bool {
    let mut guard = state::lock();
    let Some(entry) = guard.sched.dpcs.get_mut(&dpc) else {
        return false;
    };
    if entry.queued {
        return false;
    }
    entry.queued = true;
    guard.sched.dispatch.push_back(Job::Dpc(dpc));
    drop(guard);
    changed();
    true
}

pub fn timer_start(timer: usize, due: Duration) -> bool {
    let mut guard = state::lock();
    let Some((_, at)) = guard.sched.timers.get_mut(&timer) else {
        return false;
    };
    let was = at.is_some();
    *at = Some(Instant::now() + due);
    drop(guard);
    changed();
    was
}

pub fn timer_stop(timer: usize, wait: bool) -> bool {
    let was = {
        let mut guard = state::lock();
        let Some((_, at)) = guard.sched.timers.get_mut(&timer) else {
            return false;
        };
        at.take().is_some()
    };
    if wait {
        wait_not_running(
            "WdfTimerStop",
            timer,
            |s| s.sched.timers.get(&timer).and_then(|(t, _)| t.running),
            |_| false,
        );
    }
    was
}

pub fn work_item_enqueue(item: usize) {
    let mut guard = state::lock();
    let Some(entry) = guard.sched.work_items.get_mut(&item) else {
        return;
    };
    if entry.queued {
        return;
    }
    entry.queued = true;
    guard.sched.passive.push_back(item);
    drop(guard);
    changed();
}

pub fn work_item_flush(item: usize) {
    wait_not_running(
        "WdfWorkItemFlush",
        item,
        |s| s.sched.work_items.get(&item).and_then(|w| w.running),
        |s| s.sched.work_items.get(&item).is_some_and(|w| w.queued),
    );
}

/// An object of the scheduler's is being deleted: as KMDF's dispose does, it is taken off
/// the queue and its running callback is waited for (fxtimer.cpp:501-554, fxdpc.cpp:387-412,
/// fxworkitem.cpp:448-505); a timer deleted from its own callback would deadlock
/// (fxtimer.cpp:518-525).
pub fn dispose(handle: usize) {
    let me = std::thread::current().id();
    let mut guard = state::lock();
    let s = &mut guard.sched;
    if let Some(d) = s.dpcs.get_mut(&handle) {
        d.queued = false;
    }
    if let Some((t, due)) = s.timers.get_mut(&handle) {
        *due = None;
        if t.running == Some(me) {
            drop(guard);
            bugcheck(
                Rule::CallbackOutlivesObject,
                format_args!("the timer {handle:#x} is deleted from its own callback"),
            );
        }
    }
    if let Some(w) = s.work_items.get_mut(&handle) {
        w.queued = false;
    }
    let what = || format!("the callback of {handle:#x} to finish before its deletion");
    let (mut guard, _) = state::wait_until(guard, None, &what, |s| {
        let sc = &s.sched;
        let running = sc
            .dpcs
            .get(&handle)
            .and_then(|d| d.running)
            .or(sc.timers.get(&handle).and_then(|(t, _)| t.running))
            .or(sc.work_items.get(&handle).and_then(|w| w.running));
        running.is_none() || running == Some(me)
    });
    guard.sched.dpcs.remove(&handle);
    guard.sched.timers.remove(&handle);
    guard.sched.work_items.remove(&handle);
}
