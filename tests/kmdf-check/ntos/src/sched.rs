//! What runs on the simulation's own threads: DPCs, timers and AL's completions at
//! DISPATCH_LEVEL on [`PROCESSORS`] processor threads (each a CPU's DPC queue draining: a
//! DPC queued again while it runs may run at once on another processor, as on Windows,
//! where each processor has its own DPC queue), and work items at PASSIVE_LEVEL on a
//! system worker thread.

use std::collections::{HashMap, VecDeque};
use std::sync::Once;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::state::{self, changed};
use crate::thread::{self, DISPATCH, PASSIVE, call_driver, require_irql};
use crate::verifier::{Rule, bugcheck};
use crate::{PFN_WDF_DPC, PFN_WDF_TIMER, PFN_WDF_WORKITEM};

/// Processor threads running DPCs, timers and AL completions.
pub const PROCESSORS: usize = 3;

/// A job for a processor thread.
pub enum Job {
    Dpc(usize),
    Timer(usize),
    /// Kernel code that calls the driver itself (AL's completion callbacks).
    Call(Box<dyn FnOnce() + Send>),
}

pub struct Callback<F> {
    pub function: F,
    pub queued: bool,
    /// The threads running it now (a DPC queued again while it runs may run on two).
    pub running: Vec<ThreadId>,
}

impl<F> Callback<F> {
    pub fn new(function: F) -> Self {
        Self {
            function,
            queued: false,
            running: Vec::new(),
        }
    }
}

#[derive(Default)]
pub struct Sched {
    pub dpcs: HashMap<usize, Callback<PFN_WDF_DPC>>,
    pub timers: HashMap<usize, (Callback<PFN_WDF_TIMER>, Option<Instant>)>,
    pub work_items: HashMap<usize, Callback<PFN_WDF_WORKITEM>>,
    pub dispatch: VecDeque<Job>,
    pub passive: VecDeque<usize>,
    /// Jobs taken by a processor and not finished (AL's close waits for its own).
    pub calls_running: usize,
}

static START: Once = Once::new();

/// Starts the processor and worker threads (once).
pub fn start() {
    START.call_once(|| {
        for n in 0..PROCESSORS {
            spawn(&format!("processor-{n}"), processor_loop);
        }
        spawn("worker", worker_loop);
    });
}

fn spawn(name: &str, f: fn()) {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .unwrap_or_else(|e| bugcheck(Rule::Simulation, format_args!("spawn: {e}")));
}

fn end_run(running: &mut Vec<ThreadId>, me: ThreadId) {
    if let Some(i) = running.iter().position(|t| *t == me) {
        running.swap_remove(i);
    }
}

fn processor_loop() {
    thread::set_idle_thread();
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
                dpc.running.push(me);
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
                    end_run(&mut dpc.running, me);
                }
            }
            Job::Timer(h) => {
                let Some((timer, due)) = guard.sched.timers.get_mut(&h) else {
                    continue;
                };
                *due = None;
                timer.running.push(me);
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
                    end_run(&mut timer.running, me);
                }
            }
            Job::Call(f) => {
                guard.sched.calls_running += 1;
                drop(guard);
                thread::set_irql(DISPATCH);
                f();
                thread::set_irql(PASSIVE);
                state::lock().sched.calls_running -= 1;
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
        item.running.push(me);
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
            end_run(&mut item.running, me);
        }
        drop(guard);
        changed();
    }
}

/// Queues kernel code for a processor thread.
pub fn run_at_dispatch(f: impl FnOnce() + Send + 'static) {
    state::lock()
        .sched
        .dispatch
        .push_back(Job::Call(Box::new(f)));
    changed();
}

/// Waits (PASSIVE_LEVEL) until `handle`'s callback runs nowhere and (`queued`) is not
/// queued; a wait from that callback itself is a deadlock (fxtimer.cpp:678-686,
/// fxworkitem.cpp:508-531).
fn wait_not_running(
    function: &str,
    handle: usize,
    running: impl Fn(&state::State) -> Vec<ThreadId>,
    queued: impl Fn(&state::State) -> bool,
) {
    require_irql(function, PASSIVE);
    let me = std::thread::current().id();
    let guard = state::lock();
    if running(&guard).contains(&me) {
        drop(guard);
        bugcheck(
            Rule::WaitNeverReturns,
            format_args!(
                "{function} with Wait = TRUE from the callback of {handle:#x} itself (it waits for itself)"
            ),
        );
    }
    let what = || format!("{function}: the callback of {handle:#x} to finish");
    let (_guard, _) =
        state::wait_until(guard, None, &what, |s| running(s).is_empty() && !queued(s));
}

/// An enqueue on an object being deleted (fxworkitem.cpp:307-311: "already deleted").
fn check_not_deleting(guard: &state::State, handle: usize, function: &str) {
    if guard.objects.live.get(&handle).is_some_and(|o| o.deleting) {
        bugcheck(
            Rule::CallbackOutlivesObject,
            format_args!("{function} on {handle:#x}, whose deletion has begun"),
        );
    }
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
            |s| {
                s.sched
                    .dpcs
                    .get(&dpc)
                    .map(|d| d.running.clone())
                    .unwrap_or_default()
            },
            |_| false,
        );
    }
    was_queued
}

pub fn dpc_enqueue(dpc: usize) -> bool {
    let mut guard = state::lock();
    check_not_deleting(&guard, dpc, "WdfDpcEnqueue");
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
            |s| {
                s.sched
                    .timers
                    .get(&timer)
                    .map(|(t, _)| t.running.clone())
                    .unwrap_or_default()
            },
            |_| false,
        );
    }
    was
}

pub fn work_item_enqueue(item: usize) {
    let mut guard = state::lock();
    check_not_deleting(&guard, item, "WdfWorkItemEnqueue");
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
        |s| {
            s.sched
                .work_items
                .get(&item)
                .map(|w| w.running.clone())
                .unwrap_or_default()
        },
        |s| s.sched.work_items.get(&item).is_some_and(|w| w.queued),
    );
}

/// A timer, DPC or work item is being deleted. As KMDF's dispose: a timer is stopped
/// (fxtimer.cpp:501-554), a queued DPC still runs (KeFlushQueuedDpcs, fxdpc.cpp:387-412)
/// and a queued work item too (fxworkitem.cpp:448-505), and every running callback is
/// waited for; a timer deleted from its own callback would deadlock (fxtimer.cpp:518-525),
/// a work item deleting itself is not waited for.
pub fn dispose(handle: usize) {
    let me = std::thread::current().id();
    let mut guard = state::lock();
    if let Some((t, due)) = guard.sched.timers.get_mut(&handle) {
        *due = None;
        if t.running.contains(&me) {
            drop(guard);
            bugcheck(
                Rule::CallbackOutlivesObject,
                format_args!("the timer {handle:#x} is deleted from its own callback"),
            );
        }
    }
    let what = || format!("the callback of {handle:#x} to run and finish before its deletion");
    let (mut guard, _) = state::wait_until(guard, None, &what, |s| {
        let sc = &s.sched;
        let busy =
            |running: &Vec<ThreadId>, queued: bool| queued || running.iter().any(|t| *t != me);
        let dpc = sc
            .dpcs
            .get(&handle)
            .is_some_and(|d| busy(&d.running, d.queued));
        let timer = sc
            .timers
            .get(&handle)
            .is_some_and(|(t, _)| busy(&t.running, false));
        let work = sc
            .work_items
            .get(&handle)
            .is_some_and(|w| busy(&w.running, w.queued) && !w.running.contains(&me));
        !(dpc || timer || work)
    });
    guard.sched.dpcs.remove(&handle);
    guard.sched.timers.remove(&handle);
    guard.sched.work_items.remove(&handle);
}
