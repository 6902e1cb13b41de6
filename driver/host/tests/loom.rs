//! Loom models of the GET_EVENT hand-off in the dispatch layer: an event arriving (a MAD
//! on the receive path, or a timer expiry), a GET_EVENT pending on the endpoint, that
//! request's cancellation, and the file handle closing, run as 2-3 loom threads over a
//! connection set up single-threaded beforehand.
//!
//! `ibcm_endpoint::Device` runs on a loom platform: its lock is a `loom::sync::Mutex`, and
//! its requests record how they end (completed with a status, or dropped without a
//! completion) in a loom-safe log. In every interleaving:
//!
//! - every request completes exactly once, never with the device lock held, and is never
//!   dropped uncompleted;
//! - a GET_EVENT completed with SUCCESS carries the event, on its endpoint;
//! - a cancelled request carries nothing, and the event it did not take goes to the next
//!   GET_EVENT (unless the handle closed and the endpoint with it);
//! - no event is delivered twice.
//!
//! Run with `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p ibcm-host
//! --test loom --release`; `LOOM_MAX_PREEMPTIONS` overrides the preemption bound.
#![cfg(loom)]

mod loom_model;
use loom_model::model;

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use ibcm_cep::{CmConfig, Instant, MadAddress, Transmit};
use ibcm_endpoint::{Device, FileId, Lock, Platform, Request};
use ibcm_host::node_address;
use ibcm_ioctl::{
    ABI_VERSION, ConnectIn, CreateIn, CreateOut, EventRecord, HandleIn, PathAbi, VersionIn, code,
    event_type, status,
};
use ibcm_mad::{CmMad, CmMessage, Failover, MAD_SIZE, MadHeader, MessageKind, Rej, RejReason, Rep};
use loom::sync::{Arc, Mutex};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

loom::thread_local! {
    /// Device locks held by this (loom) thread.
    static LOCKS_HELD: Cell<usize> = Cell::new(0);
}

/// The device lock: a loom mutex that counts its holders per thread.
struct ModelLock<T>(Mutex<T>);

impl<T> Lock<T> for ModelLock<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut guard = self.0.lock().unwrap();
        LOCKS_HELD.with(|c| c.set(c.get() + 1));
        let r = f(&mut guard);
        LOCKS_HELD.with(|c| c.set(c.get() - 1));
        r
    }
}

/// How a request ended.
#[derive(Debug, Clone)]
enum Fate {
    Completed {
        status: i32,
        information: usize,
        output: Vec<u8>,
        under_lock: bool,
    },
    /// Dropped without ever being completed (a leak: the user's thread would hang).
    Dropped,
}

#[derive(Debug, Clone)]
struct Entry {
    key: u64,
    fate: Fate,
}

type Log = Arc<Mutex<Vec<Entry>>>;

/// A request: an output buffer of the caller's length, and the log it reports to.
struct ModelRequest {
    key: u64,
    output: Vec<u8>,
    log: Log,
    completed: bool,
}

impl Request for ModelRequest {
    fn output_len(&self) -> usize {
        self.output.len()
    }

    fn write_output(&mut self, offset: usize, bytes: &[u8]) {
        let end = offset + bytes.len();
        let len = self.output.len();
        match self.output.get_mut(offset..end) {
            Some(dst) => dst.copy_from_slice(bytes),
            None => panic!("request {}: write to {end} past {len}", self.key),
        }
    }

    fn key(&self) -> u64 {
        self.key
    }
}

impl Drop for ModelRequest {
    fn drop(&mut self) {
        if !self.completed {
            self.log.lock().unwrap().push(Entry {
                key: self.key,
                fate: Fate::Dropped,
            });
        }
    }
}

/// The platform: a clock, the timer's deadline and the MADs posted sit outside loom's
/// view (the model's properties are about requests); completions go to the loom log.
#[derive(Clone)]
struct ModelPlatform {
    log: Log,
    clock: std::sync::Arc<AtomicU64>,
    next_key: std::sync::Arc<AtomicU64>,
    sent: std::sync::Arc<std::sync::Mutex<Vec<Transmit>>>,
    timer: std::sync::Arc<std::sync::Mutex<Option<Instant>>>,
}

impl ModelPlatform {
    fn new() -> Self {
        Self {
            log: Arc::new(Mutex::new(Vec::new())),
            clock: std::sync::Arc::new(AtomicU64::new(1_000_000)),
            next_key: std::sync::Arc::new(AtomicU64::new(1)),
            sent: std::sync::Arc::default(),
            timer: std::sync::Arc::default(),
        }
    }

    fn request(&self, output_len: usize) -> ModelRequest {
        ModelRequest {
            key: self.next_key.fetch_add(1, Ordering::Relaxed),
            output: vec![0; output_len],
            log: self.log.clone(),
            completed: false,
        }
    }

    fn entries(&self) -> Vec<Entry> {
        self.log.lock().unwrap().clone()
    }

    fn fates(&self, key: u64) -> Vec<Fate> {
        self.entries()
            .into_iter()
            .filter(|e| e.key == key)
            .map(|e| e.fate)
            .collect()
    }
}

impl Platform for ModelPlatform {
    type Request = ModelRequest;
    type Lock<T> = ModelLock<T>;

    fn new_lock<T>(value: T) -> ModelLock<T> {
        ModelLock(Mutex::new(value))
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.clock.load(Ordering::Acquire))
    }

    fn send(&self, transmit: &Transmit) {
        self.sent.lock().unwrap().push(transmit.clone());
    }

    fn complete(&self, mut request: ModelRequest, status: i32, information: usize) {
        request.completed = true;
        let under_lock = LOCKS_HELD.with(Cell::get) != 0;
        let entry = Entry {
            key: request.key,
            fate: Fate::Completed {
                status,
                information,
                output: std::mem::take(&mut request.output),
                under_lock,
            },
        };
        self.log.lock().unwrap().push(entry);
    }

    fn set_timer(&self, deadline: Option<Instant>) {
        *self.timer.lock().unwrap() = deadline;
    }
}

/// The `(event_type, handle)` of each record a GET_EVENT completion returned.
fn records(output: &[u8], information: usize) -> Vec<(u32, u64)> {
    assert_eq!(
        information % EventRecord::SIZE as usize,
        0,
        "partial record"
    );
    output[..information]
        .chunks(EventRecord::SIZE as usize)
        .map(|c| {
            let r = EventRecord::read_from_bytes(c).unwrap();
            (r.event_type, r.handle)
        })
        .collect()
}

fn handle_in(h: u64) -> HandleIn {
    HandleIn {
        size: HandleIn::SIZE,
        reserved: 0,
        handle: h,
    }
}

/// The device of node 0 with one versioned file, one endpoint in REQ_SENT towards node 1,
/// and the REQ it sent, all set up before any model thread starts.
struct World {
    device: Arc<Device<ModelPlatform>>,
    platform: ModelPlatform,
    file: FileId,
    ep: u64,
    /// The REQ's LocalCommID and TransactionID.
    comm_id: u32,
    tid: u64,
}

impl World {
    fn new(max_cm_retries: u8) -> Self {
        let platform = ModelPlatform::new();
        let config = CmConfig::new(ibcm_host::node_guid(0), [7; 32]);
        let device = Arc::new(Device::new(platform.clone(), config));
        let file = device
            .open(ibcm_endpoint::Caller::Administrator)
            .expect("memory for a handle");
        let mut w = Self {
            device,
            platform,
            file,
            ep: 0,
            comm_id: 0,
            tid: 0,
        };
        let v = VersionIn {
            size: VersionIn::SIZE,
            abi_version: ABI_VERSION,
        };
        w.ioctl_ok(code::VERSION, v.as_bytes(), 16);
        let c = CreateIn {
            size: CreateIn::SIZE,
            reserved: 0,
        };
        let out = w.ioctl_ok(code::CREATE, c.as_bytes(), CreateOut::SIZE as usize);
        w.ep = CreateOut::read_from_bytes(&out).unwrap().handle;

        let (a, b) = (node_address(0), node_address(1));
        let mut p = PathAbi::new_zeroed();
        p.slid = a.lid;
        p.dlid = b.lid;
        p.sgid = a.gid;
        p.dgid = b.gid;
        p.rate = 16;
        p.packet_life_time = 14;
        p.subnet_local = 1;
        let mut c = ConnectIn::new_zeroed();
        c.size = ConnectIn::SIZE;
        c.handle = w.ep;
        c.service_id = 0x1234;
        c.qpn = 0x101;
        c.pkey = 0xffff;
        c.port = 1;
        c.path_mtu = 5;
        c.responder_resources = 2;
        c.initiator_depth = 2;
        c.remote_cm_response_timeout = 16;
        c.local_cm_response_timeout = 16;
        c.retry_count = 7;
        c.rnr_retry_count = 7;
        c.max_cm_retries = max_cm_retries;
        c.primary = p;
        w.ioctl_ok(code::CONNECT, c.as_bytes(), 0);

        let sent = std::mem::take(&mut *w.platform.sent.lock().unwrap());
        let [req] = sent.as_slice() else {
            panic!("CONNECT sent {} MADs", sent.len())
        };
        let parsed = CmMad::parse(&req.mad).unwrap();
        let CmMessage::Req(r) = parsed.message else {
            panic!("CONNECT sent {:?}", parsed.message.attribute_id())
        };
        w.comm_id = r.local_comm_id;
        w.tid = parsed.header.transaction_id;
        w
    }

    /// An IOCTL that must complete at once with SUCCESS; its output.
    fn ioctl_ok(&self, code: u32, input: &[u8], output_len: usize) -> Vec<u8> {
        let request = self.platform.request(output_len);
        let key = request.key;
        self.device.dispatch(self.file, request, code, input);
        match self.platform.fates(key).as_slice() {
            [
                Fate::Completed {
                    status: status::SUCCESS,
                    output,
                    ..
                },
            ] => output.clone(),
            other => panic!("IOCTL {code:#x}: {other:?}"),
        }
    }

    /// A GET_EVENT request on the endpoint with room for `n` records (not yet issued).
    fn get_event_request(&self, n: usize) -> ModelRequest {
        self.platform.request(n * EventRecord::SIZE as usize)
    }

    fn dispatch_get_event(&self, request: ModelRequest) {
        self.device.dispatch(
            self.file,
            request,
            code::GET_EVENT,
            handle_in(self.ep).as_bytes(),
        );
    }

    /// Node 1's address as the receive path reports it.
    fn peer(&self) -> MadAddress {
        node_address(1)
    }

    /// A REJ from node 1 answering the REQ: the endpoint gets REJECTED.
    fn rej(&self) -> [u8; MAD_SIZE] {
        let mut mad = [0; MAD_SIZE];
        CmMad {
            header: MadHeader::send(self.tid),
            message: CmMessage::Rej(Rej {
                local_comm_id: 0x5151,
                remote_comm_id: self.comm_id,
                message_rejected: MessageKind::Req,
                reason: RejReason::ConsumerDefined,
                ari: &[],
                private_data: b"no",
            }),
        }
        .emit(&mut mad)
        .unwrap();
        mad
    }

    /// A REP from node 1 accepting the REQ: the endpoint gets REP_RECEIVED and stays.
    fn rep(&self) -> [u8; MAD_SIZE] {
        let mut mad = [0; MAD_SIZE];
        CmMad {
            header: MadHeader::send(self.tid),
            message: CmMessage::Rep(Rep {
                local_comm_id: 0x5151,
                remote_comm_id: self.comm_id,
                local_qkey: 0,
                local_qpn: 0x202,
                local_eecn: 0,
                vendor_id: 0,
                starting_psn: 0x10,
                responder_resources: 2,
                initiator_depth: 2,
                target_ack_delay: 10,
                failover_accepted: Failover::NotSupported,
                end_to_end_flow_control: false,
                rnr_retry_count: 7,
                srq: false,
                local_ca_guid: ibcm_host::node_guid(1),
                private_data: b"yes",
            }),
        }
        .emit(&mut mad)
        .unwrap();
        mad
    }

    /// Moves the clock to the armed deadline, so that the next timer expiry is due.
    fn advance_to_timer(&self) {
        let at = self.platform.timer.lock().unwrap().expect("timer armed");
        self.platform
            .clock
            .fetch_max(at.as_nanos(), Ordering::AcqRel);
    }

    /// Cleanup and close, as the I/O manager sends them when the last handle goes.
    fn close(&self) {
        self.device.cleanup(self.file);
        self.device.close(self.file);
    }

    /// Checks the properties every interleaving must have, once all threads are done.
    /// `expected` is the event type produced on the endpoint; `cancelled` the request the
    /// user cancelled, if any; `open` whether the handle is still open.
    fn check(self, expected: u32, cancelled: Option<u64>, open: bool) {
        let mut delivered = 0;
        // The follow-up GET_EVENT, cancelled by the close below if it pends.
        let mut follow_up = None;
        if open {
            // Nothing is in flight any more: the requests issued so far have all ended,
            // the first one with the event unless it was cancelled.
            for key in 4..self.platform.next_key.load(Ordering::Relaxed) {
                match self.platform.fates(key).as_slice() {
                    [Fate::Completed { .. }] => {}
                    other => {
                        panic!("request {key} outstanding once every thread returned: {other:?}")
                    }
                }
            }
            // The next GET_EVENT takes whatever the first one did not.
            let next = self.get_event_request(4);
            let next_key = next.key;
            follow_up = Some(next_key);
            self.dispatch_get_event(next);
            let now = self.platform.fates(next_key);
            assert!(now.len() <= 1, "GET_EVENT {next_key}: {now:?}");
            self.close();
            assert_eq!(self.device.endpoint_count(self.file), 0);
        }
        assert_eq!(self.device.file_count(), 0, "the file outlived close");

        let entries = self.platform.entries();
        let mut keys: Vec<u64> = entries.iter().map(|e| e.key).collect();
        keys.sort_unstable();
        let issued = self.platform.next_key.load(Ordering::Relaxed);
        assert_eq!(
            keys,
            (1..issued).collect::<Vec<_>>(),
            "every request ends exactly once: {entries:#?}"
        );
        for Entry { key, fate } in &entries {
            let Fate::Completed {
                status: st,
                information,
                output,
                under_lock,
            } = fate
            else {
                panic!("request {key} dropped without completion: {entries:#?}");
            };
            assert!(!under_lock, "request {key} completed under the lock");
            assert!(*information <= output.len(), "request {key}: {information}");
            if *st != status::SUCCESS {
                assert_eq!(*information, 0, "request {key} failed with output");
            }
        }
        // GET_EVENTs are the requests issued after the setup's three IOCTLs.
        for Entry { key, fate } in entries.iter().filter(|e| e.key > 3) {
            let Fate::Completed {
                status: st,
                information,
                output,
                ..
            } = fate
            else {
                unreachable!()
            };
            match *st {
                status::SUCCESS => {
                    let got = records(output, *information);
                    assert!(!got.is_empty(), "GET_EVENT {key} SUCCESS without an event");
                    for (t, h) in got {
                        assert_eq!(h, self.ep, "GET_EVENT {key}: record of another endpoint");
                        assert_eq!(t, expected, "GET_EVENT {key}: event {t}");
                        delivered += 1;
                    }
                }
                status::CANCELLED => assert!(
                    !open || cancelled == Some(*key) || follow_up == Some(*key),
                    "GET_EVENT {key} cancelled, but the user cancelled {cancelled:?}"
                ),
                // A GET_EVENT issued after the handle closed: its endpoint is gone, or the
                // handle's cleanup ran (issue 30: no IOCTL after cleanup).
                status::INVALID_HANDLE | status::FILE_CLOSED => {
                    assert!(!open, "GET_EVENT {key}: no endpoint");
                }
                other => panic!("GET_EVENT {key}: status {other:#x}"),
            }
        }
        if open {
            assert_eq!(delivered, 1, "event lost or duplicated: {entries:#?}");
        } else {
            assert!(delivered <= 1, "event delivered twice: {entries:#?}");
        }
    }
}

/// A GET_EVENT is pending when a REJ arrives on the receive path while the user cancels
/// the request: it completes once, with the event or cancelled, and in the latter case the
/// next GET_EVENT gets the event.
#[test]
fn received_event_vs_cancel_of_pending_get_event() {
    model("received_event_vs_cancel_of_pending_get_event", || {
        let w = World::new(3);
        let mad = w.rej();
        let waiting = w.get_event_request(1);
        let key = waiting.key;
        w.dispatch_get_event(waiting);
        assert!(w.platform.fates(key).is_empty(), "GET_EVENT did not pend");

        let (d, file) = (w.device.clone(), w.file);
        let cancel = loom::thread::spawn(move || d.cancel(file, key));
        let (d, src) = (w.device.clone(), w.peer());
        let receive = loom::thread::spawn(move || d.receive(&src, &mad));
        cancel.join().unwrap();
        receive.join().unwrap();
        w.check(event_type::REJECTED, Some(key), true);
    });
}

/// The hand-off itself: a GET_EVENT issued while a REJ arrives completes with the event,
/// whichever runs first.
#[test]
fn get_event_vs_received_event() {
    model("get_event_vs_received_event", || {
        let w = World::new(3);
        let mad = w.rej();
        let waiting = w.get_event_request(1);

        let (d, file, ep) = (w.device.clone(), w.file, w.ep);
        let user = loom::thread::spawn(move || {
            d.dispatch(file, waiting, code::GET_EVENT, handle_in(ep).as_bytes());
        });
        let (d, src) = (w.device.clone(), w.peer());
        let receive = loom::thread::spawn(move || d.receive(&src, &mad));
        user.join().unwrap();
        receive.join().unwrap();
        w.check(event_type::REJECTED, None, true);
    });
}

/// The user issues GET_EVENT (batched: room for 4 records) and then cancels it, while a
/// REP arrives: whichever order, one completion, and the event reaches the user once.
#[test]
fn get_event_then_cancel_vs_received_event() {
    model("get_event_then_cancel_vs_received_event", || {
        let w = World::new(3);
        let mad = w.rep();
        let waiting = w.get_event_request(4);
        let key = waiting.key;

        let (d, file, ep) = (w.device.clone(), w.file, w.ep);
        let user = loom::thread::spawn(move || {
            d.dispatch(file, waiting, code::GET_EVENT, handle_in(ep).as_bytes());
            d.cancel(file, key);
        });
        let (d, src) = (w.device.clone(), w.peer());
        let receive = loom::thread::spawn(move || d.receive(&src, &mad));
        user.join().unwrap();
        receive.join().unwrap();
        w.check(event_type::REP_RECEIVED, Some(key), true);
    });
}

/// A pending GET_EVENT, the timer expiring (the REQ's last retry runs out: TIMEOUT), the
/// request's cancellation and the handle closing, all at once.
#[test]
fn timer_event_vs_cancel_vs_close() {
    model("timer_event_vs_cancel_vs_close", || {
        let w = World::new(0);
        w.advance_to_timer();
        let waiting = w.get_event_request(1);
        let key = waiting.key;
        w.dispatch_get_event(waiting);
        assert!(w.platform.fates(key).is_empty(), "GET_EVENT did not pend");

        let (d, file) = (w.device.clone(), w.file);
        let cancel = loom::thread::spawn(move || d.cancel(file, key));
        let d = w.device.clone();
        let timer = loom::thread::spawn(move || d.timer_expired());
        let (d, file) = (w.device.clone(), w.file);
        let close = loom::thread::spawn(move || {
            d.cleanup(file);
            d.close(file);
        });
        cancel.join().unwrap();
        timer.join().unwrap();
        close.join().unwrap();
        w.check(event_type::TIMEOUT, Some(key), false);
    });
}

/// A GET_EVENT issued while a REJ arrives and the handle closes: it gets the event, is
/// cancelled by cleanup, or finds the handle gone; never lost, never twice.
#[test]
fn get_event_vs_received_event_vs_close() {
    model("get_event_vs_received_event_vs_close", || {
        let w = World::new(3);
        let mad = w.rej();
        let waiting = w.get_event_request(1);

        let (d, file, ep) = (w.device.clone(), w.file, w.ep);
        let user = loom::thread::spawn(move || {
            d.dispatch(file, waiting, code::GET_EVENT, handle_in(ep).as_bytes());
        });
        let (d, src) = (w.device.clone(), w.peer());
        let receive = loom::thread::spawn(move || d.receive(&src, &mad));
        let (d, file) = (w.device.clone(), w.file);
        let close = loom::thread::spawn(move || {
            d.cleanup(file);
            d.close(file);
        });
        user.join().unwrap();
        receive.join().unwrap();
        close.join().unwrap();
        w.check(event_type::REJECTED, None, false);
    });
}
