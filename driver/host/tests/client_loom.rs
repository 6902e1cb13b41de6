//! Loom models of the kernel-client callback protocol (client.rs): the per-endpoint
//! `delivering` claim that serializes callbacks, the synchronous `destroy_id` (waiting for a
//! callback running on another thread, deferred when called from the endpoint's own
//! callback), destroy by a non-zero return, events queued for a request nobody retrieved
//! yet, and device removal.
//!
//! `ibcm_endpoint::Device` runs on a loom platform: its lock is a `loom::sync::Mutex`, its
//! `current_thread` is a per-loom-thread key and its `relax` a loom yield. Each model sets
//! up, single-threaded, an active endpoint `x` on node A whose REQ node B has answered with
//! an MRA and a REP (real MADs from a second device), then runs 2-3 loom threads: the
//! receive path delivering those MADs (each receive ends in a delivery pass), another
//! delivery pass (the timer DPC with nothing due, or a downcall on another endpoint), and
//! `destroy_id`. In every interleaving:
//!
//! - at most one callback of an endpoint is in flight;
//! - no callback is entered after `destroy_id` returned, after the endpoint's callback
//!   returned non-zero, or after it called `destroy_id` on itself;
//! - each endpoint's events come in protocol order, none twice (and, with no destroy, none
//!   lost);
//! - `destroy_id` returns, and the endpoint is gone at the end;
//! - a request's endpoint gets the event that arrived before (or while) it was retrieved,
//!   exactly once;
//! - device removal reaches every endpoint exactly once, as its last event;
//! - the timer ends up armed to the engine's next deadline however the batches of two
//!   overlapping entry points go out (arming is a loom step of its own here, as KeSetTimer
//!   runs after the device lock is released).
//!
//! Run with `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p ibcm-host
//! --test client_loom --release`; `LOOM_MAX_PREEMPTIONS` overrides the preemption bound.
#![cfg(loom)]

mod loom_model;
use loom_model::model;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

use ibcm_cep::pair::Pair;
use ibcm_cep::{CmConfig, ConnectParams, Event, Instant, MadAddress, Transmit};
use ibcm_endpoint::{Callback, ClientEvent, ClientId, Device, Lock, Platform, Request};
use ibcm_host::{node_address, node_guid};
use loom::sync::{Arc, Mutex};

// ---- the loom platform ----------------------------------------------------------------

/// Thread keys, handed out once per loom thread (0 is never a key).
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

loom::thread_local! {
    static KEY: Cell<u64> = Cell::new(0);
}

fn thread_key() -> u64 {
    KEY.with(|k| {
        if k.get() == 0 {
            k.set(NEXT_KEY.fetch_add(1, SeqCst));
        }
        k.get()
    })
}

/// The device lock: a loom mutex.
struct ModelLock<T>(Mutex<T>);

impl<T> Lock<T> for ModelLock<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }
}

/// No IOCTLs here: a request type the platform never sees.
struct NoRequest;

impl Request for NoRequest {
    fn output_len(&self) -> usize {
        0
    }
    fn write_output(&mut self, _: usize, _: &[u8]) {}
    fn key(&self) -> u64 {
        0
    }
}

/// The MADs a device posts and the clock sit outside loom's view (the models are about the
/// callback protocol).
#[derive(Clone)]
struct ModelPlatform {
    sent: std::sync::Arc<std::sync::Mutex<Vec<Transmit>>>,
    /// The deadline the one timer is armed to: a loom mutex, so that arming is a step
    /// of its own (KeSetTimer runs with no lock held, after the device lock is released).
    timer: Arc<Mutex<Option<Instant>>>,
}

impl Default for ModelPlatform {
    fn default() -> Self {
        Self {
            sent: std::sync::Arc::default(),
            timer: Arc::new(Mutex::new(None)),
        }
    }
}

impl ModelPlatform {
    fn armed(&self) -> Option<Instant> {
        *self.timer.lock().unwrap()
    }

    fn take_sent(&self) -> Vec<Transmit> {
        std::mem::take(&mut *self.sent.lock().unwrap())
    }
}

impl Platform for ModelPlatform {
    type Request = NoRequest;
    type Lock<T> = ModelLock<T>;

    fn new_lock<T>(value: T) -> ModelLock<T> {
        ModelLock(Mutex::new(value))
    }
    fn now(&self) -> Instant {
        Instant::from_nanos(1_000_000)
    }
    fn send(&self, transmit: &Transmit) {
        self.sent.lock().unwrap().push(transmit.clone());
    }
    fn complete(&self, _: NoRequest, _: i32, _: usize) {}
    fn set_timer(&self, deadline: Option<Instant>) {
        *self.timer.lock().unwrap() = deadline;
    }
    fn current_thread(&self) -> u64 {
        thread_key()
    }
    fn relax(&self) {
        loom::thread::yield_now();
    }
}

type Dev = Device<ModelPlatform>;

// ---- what the callbacks record ------------------------------------------------------

const MRA: u8 = 1;
const REP: u8 = 2;
const REJ: u8 = 3;
const REMOVAL: u8 = 4;
const OTHER: u8 = 9;

fn code(e: &Event) -> u8 {
    match e {
        Event::MraReceived { .. } => MRA,
        Event::RepReceived(_) => REP,
        Event::Rejected { .. } => REJ,
        Event::DeviceRemoval => REMOVAL,
        _ => OTHER,
    }
}

/// What the endpoint's callback does with its first event.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnFirst {
    Keep,
    /// Returns non-zero.
    Return1,
    /// Calls `destroy_id` on itself (deferred until it returns).
    DestroySelf,
}

/// One endpoint as the model sees it. Plain (not loom) atomics: a flag set right after
/// `destroy_id` returns is set before the thread can be preempted again, so "destroy has
/// returned" and "the flag is set" are one step for loom.
#[derive(Default)]
struct Watch {
    in_cb: AtomicBool,
    /// `destroy_id` returned (another thread), or was called in the callback itself.
    destroyed: AtomicBool,
    nonzero: AtomicBool,
    /// The callback was handed to the driver (get_request_ex / set_callback).
    installed: AtomicBool,
    events: std::sync::Mutex<Vec<u8>>,
}

impl Watch {
    fn events(&self) -> Vec<u8> {
        self.events.lock().unwrap().clone()
    }
}

fn callback(watch: &std::sync::Arc<Watch>, on_first: OnFirst) -> Callback<ModelPlatform> {
    let w = std::sync::Arc::clone(watch);
    std::sync::Arc::new(move |dev: &Dev, id: ClientId, ev: &ClientEvent| {
        assert!(w.installed.load(SeqCst), "callback before it was installed");
        assert!(
            !w.in_cb.swap(true, SeqCst),
            "two callbacks of one endpoint in flight"
        );
        assert!(
            !w.destroyed.load(SeqCst),
            "callback entered after destroy_id"
        );
        assert!(
            !w.nonzero.load(SeqCst),
            "callback entered after a non-zero return"
        );
        let c = code(&ev.event);
        let first = {
            let mut e = w.events.lock().unwrap();
            if let Some(&last) = e.last() {
                assert!(c > last, "event {c} after {last}: {:?}", *e);
            }
            e.push(c);
            e.len() == 1
        };
        // A scheduling point inside the callback: another thread may run meanwhile.
        loom::thread::yield_now();
        let verdict = match on_first {
            OnFirst::Return1 if first => 1,
            OnFirst::DestroySelf if first => {
                dev.destroy_id(id);
                w.destroyed.store(true, SeqCst);
                0
            }
            _ => 0,
        };
        if verdict != 0 {
            w.nonzero.store(true, SeqCst);
        }
        w.in_cb.store(false, SeqCst);
        verdict
    })
}

/// `destroy_id` from another thread: when it returns no callback runs, and none follows.
fn destroy(dev: &Dev, id: ClientId, w: &Watch) {
    dev.destroy_id(id);
    assert!(
        !w.in_cb.load(SeqCst),
        "a callback runs after destroy_id returned"
    );
    w.destroyed.store(true, SeqCst);
}

// ---- the set-up -----------------------------------------------------------------------

fn connect_params(pd: &[u8]) -> ConnectParams<'_> {
    let mut p = Pair::connect_params(7, 0x101);
    let (a, b) = (node_address(0), node_address(1));
    p.primary_path.slid = a.lid;
    p.primary_path.dlid = b.lid;
    p.primary_path.sgid = a.gid;
    p.primary_path.dgid = b.gid;
    p.private_data = pd;
    p
}

fn one(sent: Vec<Transmit>) -> [u8; 256] {
    let [t] = sent.as_slice() else {
        panic!("{} MADs sent, want 1", sent.len())
    };
    t.mad
}

/// Node A with an active endpoint `x` (REQ sent), node B with a listen and the request's
/// endpoint (unretrieved), and the MADs B answered with: an MRA, then a REP.
struct World {
    a: Arc<Dev>,
    pa: ModelPlatform,
    b: Arc<Dev>,
    x: ClientId,
    wx: std::sync::Arc<Watch>,
    listen: ClientId,
    mra: [u8; 256],
    rep: [u8; 256],
}

impl World {
    /// `answer`: whether B answers (MRA, REP); otherwise the request stays unretrieved.
    fn new(on_first: OnFirst, answer: bool) -> Self {
        let (pa, pb) = (ModelPlatform::default(), ModelPlatform::default());
        let a = Arc::new(Device::new(
            pa.clone(),
            CmConfig::new(node_guid(0), [1; 32]),
        ));
        let b = Arc::new(Device::new(
            pb.clone(),
            CmConfig::new(node_guid(1), [2; 32]),
        ));
        let quiet: Callback<ModelPlatform> =
            std::sync::Arc::new(|_: &Dev, _: ClientId, _: &ClientEvent| 0);
        let listen = b.create_id(quiet).unwrap();
        b.listen_id(listen, Pair::listen_params(7, 4)).unwrap();
        let wx = std::sync::Arc::new(Watch::default());
        wx.installed.store(true, SeqCst);
        let x = a.create_id(callback(&wx, on_first)).unwrap();
        a.send_req(x, &connect_params(b"model")).unwrap();
        let req = one(pa.take_sent());
        b.receive(&node_address(0), &req);
        let (mut mra, mut rep) = ([0; 256], [0; 256]);
        if answer {
            let (child, _) = b.get_request(listen).expect("the REQ reached the listen");
            b.send_mra(child, 20, b"").unwrap();
            mra = one(pb.take_sent());
            b.send_rep(child, &Pair::rep_params(0x202)).unwrap();
            rep = one(pb.take_sent());
        }
        Self {
            a,
            pa,
            b,
            x,
            wx,
            listen,
            mra,
            rep,
        }
    }

    fn from_b() -> MadAddress {
        node_address(1)
    }
}

/// The events `x` got must be a strictly ordered subset of MRA, REP (checked in the
/// callback); at the end `x` is gone from node A and nothing runs.
fn check_destroyed(w: &World) {
    assert_eq!(w.a.client_count(), 0, "x survived its destroy");
    assert!(!w.wx.in_cb.load(SeqCst));
    let e = w.wx.events();
    assert!(e.iter().all(|&c| c == MRA || c == REP), "{e:?}");
}

// ---- the models ---------------------------------------------------------------------

/// The receive path delivers MRA then REP to `x` while another thread destroys it and the
/// timer DPC runs a delivery pass of its own.
#[test]
fn delivery_vs_destroy_vs_timer_pass() {
    model("delivery_vs_destroy_vs_timer_pass", || {
        let w = World::new(OnFirst::Keep, true);
        let (a, mra, rep) = (w.a.clone(), w.mra, w.rep);
        let receive = loom::thread::spawn(move || {
            a.receive(&World::from_b(), &mra);
            a.receive(&World::from_b(), &rep);
        });
        let (a, x, wx) = (w.a.clone(), w.x, w.wx.clone());
        let destroyer = loom::thread::spawn(move || destroy(&a, x, &wx));
        w.a.timer_expired();
        receive.join().unwrap();
        destroyer.join().unwrap();
        check_destroyed(&w);
    });
}

/// Two receive paths (the MRA on one CPU, the REP on another) each deliver while a third
/// thread destroys `x`.
#[test]
fn two_producers_vs_destroy() {
    model("two_producers_vs_destroy", || {
        let w = World::new(OnFirst::Keep, true);
        let (a, mra) = (w.a.clone(), w.mra);
        let t1 = loom::thread::spawn(move || a.receive(&World::from_b(), &mra));
        let (a, rep) = (w.a.clone(), w.rep);
        let t2 = loom::thread::spawn(move || a.receive(&World::from_b(), &rep));
        destroy(&w.a, w.x, &w.wx);
        t1.join().unwrap();
        t2.join().unwrap();
        check_destroyed(&w);
    });
}

/// The first callback returns non-zero while the next event is being produced and
/// delivered elsewhere: nothing is delivered after it, and the driver destroys `x`.
#[test]
fn nonzero_return_vs_next_event() {
    model("nonzero_return_vs_next_event", || {
        let w = World::new(OnFirst::Return1, true);
        let (a, mra) = (w.a.clone(), w.mra);
        let t1 = loom::thread::spawn(move || a.receive(&World::from_b(), &mra));
        let (a, rep) = (w.a.clone(), w.rep);
        let t2 = loom::thread::spawn(move || a.receive(&World::from_b(), &rep));
        t1.join().unwrap();
        t2.join().unwrap();
        let e = w.wx.events();
        assert_eq!(e.len(), 1, "after the non-zero return: {e:?}");
        check_destroyed(&w);
    });
}

/// The callback destroys its own endpoint (deferred) while another thread calls
/// `destroy_id` on it too: both return, one callback at most.
#[test]
fn destroy_in_own_callback_vs_destroy() {
    model("destroy_in_own_callback_vs_destroy", || {
        let w = World::new(OnFirst::DestroySelf, true);
        let (a, mra, rep) = (w.a.clone(), w.mra, w.rep);
        let receive = loom::thread::spawn(move || {
            a.receive(&World::from_b(), &mra);
            a.receive(&World::from_b(), &rep);
        });
        // Not `destroy()`: when the callback destroys first, its own flag is already set.
        let (a, x) = (w.a.clone(), w.x);
        let destroyer = loom::thread::spawn(move || a.destroy_id(x));
        receive.join().unwrap();
        destroyer.join().unwrap();
        assert!(w.wx.events().len() <= 1, "{:?}", w.wx.events());
        check_destroyed(&w);
    });
}

/// With no destroy, two delivery passes racing (the receive path and the timer DPC) lose
/// nothing and reorder nothing: `x` gets exactly MRA, REP.
#[test]
fn no_event_lost_between_delivery_passes() {
    model("no_event_lost_between_delivery_passes", || {
        let w = World::new(OnFirst::Keep, true);
        let (a, mra, rep) = (w.a.clone(), w.mra, w.rep);
        let receive = loom::thread::spawn(move || {
            a.receive(&World::from_b(), &mra);
            a.receive(&World::from_b(), &rep);
        });
        let a = w.a.clone();
        let timer = loom::thread::spawn(move || a.timer_expired());
        receive.join().unwrap();
        timer.join().unwrap();
        assert_eq!(w.wx.events(), vec![MRA, REP]);
        w.a.destroy_id(w.x);
        assert_eq!(w.a.client_count(), 0);
    });
}

/// A REJ arrives for a request nobody retrieved yet while B retrieves it (with
/// `get_request_ex`, or `get_request` then `set_callback`): its endpoint gets the REJ
/// exactly once, and only once its callback is installed.
fn retrieval_vs_queued_event(ex: bool) {
    let w = World::new(OnFirst::Keep, false);
    // A gives up: its destroy sends REJ(Timeout) to B's unretrieved request.
    w.a.destroy_id(w.x);
    let rej = one(w.pa.take_sent());
    let wc = std::sync::Arc::new(Watch::default());
    let (b, listen, wc2) = (w.b.clone(), w.listen, wc.clone());
    let retriever = loom::thread::spawn(move || {
        let cb = callback(&wc2, OnFirst::Keep);
        if ex {
            wc2.installed.store(true, SeqCst);
            b.get_request_ex(listen, cb).expect("the request").0
        } else {
            let (child, _) = b.get_request(listen).expect("the request");
            wc2.installed.store(true, SeqCst);
            b.set_callback(child, cb).unwrap();
            child
        }
    });
    let b = w.b.clone();
    let receive = loom::thread::spawn(move || b.receive(&node_address(0), &rej));
    let child = retriever.join().unwrap();
    receive.join().unwrap();
    assert_eq!(wc.events(), vec![REJ], "the REJ queued before retrieval");
    w.b.destroy_id(child);
    w.b.destroy_id(w.listen);
    assert_eq!(w.b.client_count(), 0);
}

#[test]
fn get_request_ex_vs_queued_event() {
    model("get_request_ex_vs_queued_event", || {
        retrieval_vs_queued_event(true)
    });
}

#[test]
fn get_request_then_set_callback_vs_queued_event() {
    model("get_request_then_set_callback_vs_queued_event", || {
        retrieval_vs_queued_event(false)
    });
}

/// Device removal while the REP is delivered and an idle endpoint exists: each endpoint
/// hears of the removal exactly once, as its last event.
#[test]
fn removal_vs_delivery() {
    model("removal_vs_delivery", || {
        let w = World::new(OnFirst::Keep, true);
        let wy = std::sync::Arc::new(Watch::default());
        wy.installed.store(true, SeqCst);
        let y = w.a.create_id(callback(&wy, OnFirst::Keep)).unwrap();
        let (a, rep) = (w.a.clone(), w.rep);
        let receive = loom::thread::spawn(move || a.receive(&World::from_b(), &rep));
        let a = w.a.clone();
        let remover = loom::thread::spawn(move || a.remove());
        receive.join().unwrap();
        remover.join().unwrap();
        for (name, watch) in [("x", &w.wx), ("y", &wy)] {
            let e = watch.events();
            assert_eq!(
                e.iter().filter(|&&c| c == REMOVAL).count(),
                1,
                "{name}: {e:?}"
            );
            assert_eq!(e.last(), Some(&REMOVAL), "{name}: {e:?}");
        }
        // After removal no endpoint can be created, and only destroy works.
        let quiet: Callback<ModelPlatform> =
            std::sync::Arc::new(|_: &Dev, _: ClientId, _: &ClientEvent| 0);
        assert!(w.a.create_id(quiet).is_err());
        assert!(w.a.send_rtu(w.x, b"").is_err());
        w.a.destroy_id(w.x);
        w.a.destroy_id(y);
        assert_eq!(w.a.client_count(), 0);
    });
}

/// A downcall that starts a timer (the REQ's retry timer) while the timer DPC runs with
/// nothing due: whichever order their batches go out in, the timer ends up armed to the
/// engine's next deadline (a stale "nothing to wait for" must not disarm it, or the REQ is
/// never retried and never times out).
#[test]
fn timer_rearm_vs_idle_timer_pass() {
    model("timer_rearm_vs_idle_timer_pass", || {
        let pa = ModelPlatform::default();
        let a = Arc::new(Device::new(
            pa.clone(),
            CmConfig::new(node_guid(0), [1; 32]),
        ));
        let wx = std::sync::Arc::new(Watch::default());
        wx.installed.store(true, SeqCst);
        let x = a.create_id(callback(&wx, OnFirst::Keep)).unwrap();
        assert_eq!(pa.armed(), None);
        let a2 = a.clone();
        let dpc = loom::thread::spawn(move || a2.timer_expired());
        a.send_req(x, &connect_params(b"model")).unwrap();
        dpc.join().unwrap();
        let want = a.with_engine(|cm| cm.poll_timeout());
        assert!(want.is_some(), "the REQ has a retry timer");
        assert_eq!(pa.armed(), want, "the timer was left stale");
    });
}
