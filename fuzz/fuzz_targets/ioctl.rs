//! IOCTL-sequence fuzzing of the whole driver on the host platform: two nodes of a
//! [`Fabric`] in virtual time, a few file handles on each, driven by an arbitrary sequence
//! of
//! - IOCTLs: a file, a code (one of `code::ALL` or any u32), an input (arbitrary bytes, or
//!   a well-formed record of the code with arbitrary field values naming a handle the file
//!   learned, another file's handle or any u64) and an output length; a short form
//!   issues a well-formed record of a known code on one of the file's own handles;
//! - cancels of a random outstanding request;
//! - close and reopen of a file (with or without the VERSION handshake);
//! - fabric steps and time advances (up to about a minute of virtual time at once);
//! - scenarios: a listen on one node and a connect from the other, carried through the
//!   same IOCTL records to a chosen stage (REQ taken, REP formatted or sent, MRA, REJ,
//!   RTU, DREQ, DREP), so that the arbitrary operations around them meet endpoints in
//!   every state.
//!
//! Nothing may panic. After the sequence, and again after every file is closed and the
//! fabric has run long enough for every retry and timewait to end:
//! - the verifier saw no violation on either node (double or late completions, completions
//!   under the lock, output overflows, leaked requests or endpoints, allocations at
//!   DISPATCH_LEVEL);
//! - every request the harness issued has completed;
//! - no CEP is left in either engine.
//!
//! Cost: two new nodes cost more than most inputs (their batches, tables and pools), so
//! a fabric serves [`FABRIC_USES`] inputs in a row: after an input, once the checks above
//! passed, [`quiescent`] asserts that it holds nothing the input left (no file, CEP,
//! peer-map or timer entry, armed timer, MAD, violation). Each input opens its own files
//! (three per node, each after the VERSION handshake) and closes them. Requests carry a
//! completion hook, so the ledger checks each completion and then forgets the request
//! (its size stays that of the requests in flight). The sequence stops where the input
//! ends (it used to run on to 256 operations of zeroes), or after [`MAX_OPS`] operations:
//! an operation costs about 20 us under ASan and compare tracing (a scenario or a time
//! advance more), so a full-length input (4 KB, 256 operations before the cap) ran at
//! about 120-200 execs/s. Depth comes from the corpus and the scenarios (one operation
//! carries a connection to any stage), not from long inputs.
//!
//! Reproducing: a failing input ran on a fabric that may have served earlier inputs, so
//! the panic hook writes those to `history-<pid>-NNN` in the current directory and says
//! how to replay them (in order, on one fabric, as the fuzzer ran them). With
//! `IBCM_FUZZ_FRESH=1` every input gets a new fabric. `IOCTL_FUZZ_TRACE=1` prints every
//! completion.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use ibcm_endpoint::FileId;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use ibcm_host::{CompletionHook, Fabric, Node, file_key, node_address};
use ibcm_ioctl::{
    ABI_VERSION, ConnectIn, CountersIn, CountersOut, CreateIn, CreateOut, EventRecord, FormatRepIn,
    GetQpAttrIn, HandleIn, ListenIn, MraIn, PathAbi, PrivateDataIn, QpAttrOut, QpTransitionsOut,
    QueryOut, RejIn, VersionIn, VersionOut, code, event_type, status,
};
use libfuzzer_sys::fuzz_target;
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

include!("asan_options.rs");

/// File handles per node.
const FILES: usize = 3;
const EV: usize = EventRecord::SIZE as usize;
/// Services the records pick from, so that connects meet listens.
const SERVICES: [u64; 3] = [0x1000, 0x1001, 0x2_0000_1000];

#[derive(Arbitrary, Debug)]
enum Code {
    Known(u8),
    Raw(u32),
}

#[derive(Arbitrary, Debug)]
enum HandleChoice {
    /// One this file learned (CREATE, REQ_RECEIVED).
    Own(u8),
    /// One another file (on either node) learned.
    Other(u8),
    /// Any value.
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
struct Record {
    handle: HandleChoice,
    /// Small numbers the sane record draws its fields from.
    knobs: [u8; 8],
    /// Arbitrary bytes laid over the record after its `size` field.
    raw: Option<Vec<u8>>,
    /// Zero the reserved fields after the overlay.
    clear_reserved: bool,
}

#[derive(Arbitrary, Debug)]
enum Input {
    Bytes(Vec<u8>),
    Record(Record),
}

#[derive(Arbitrary, Debug)]
enum OutLen {
    /// The code's output record size (GET_EVENT: `n` records).
    Fit(u8),
    Raw(u16),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Ioctl {
        node: bool,
        file: u8,
        code: Code,
        input: Input,
        out: OutLen,
    },
    /// A well-formed record of a known code naming one of the file's own handles, with
    /// an output buffer that fits (the short form of `Ioctl`, so that sequences reach
    /// deep states sooner).
    Call {
        node: bool,
        file: u8,
        code: u8,
        handle: u8,
        knobs: [u8; 8],
    },
    Cancel {
        node: bool,
        which: u16,
    },
    Reopen {
        node: bool,
        file: u8,
        handshake: bool,
    },
    Step(u8),
    Advance(u8),
    Scenario {
        /// The connecting node.
        node: bool,
        /// Connecting file, listening file.
        files: (u8, u8),
        service: u8,
        /// How far to carry the connection.
        stage: u8,
        /// A variation: MRA, REJ instead of REP, which side disconnects, backlog.
        twist: u8,
    },
}

#[derive(Debug)]
struct Outstanding {
    key: u64,
    slot: usize,
    code: u32,
}

/// A completed request, as its completion hook handed it over.
#[derive(Debug)]
struct Done {
    key: u64,
    status: i32,
    /// The bytes the request reported (`information` of them: the ledger checked that
    /// they were written).
    output: Vec<u8>,
}

/// Where the completions of one node's requests go.
#[derive(Default)]
struct Completions(Mutex<Vec<Done>>);

/// The completion hook of one request: it hands the completion to the harness by key.
/// With a hook the ledger checks the completion and then forgets the request, so that a
/// node serving many inputs keeps a ledger as short as its requests in flight.
struct Hook {
    key: AtomicU64,
    sink: Arc<Completions>,
}

impl CompletionHook for Hook {
    fn completed(self: Arc<Self>, status: i32, output: Vec<u8>) {
        let key = self.key.load(Ordering::Relaxed);
        self.sink
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Done {
                key,
                status,
                output,
            });
    }
}

struct Harness {
    fabric: Fabric,
    files: [[FileId; FILES]; 2],
    /// Handles each file learned.
    handles: [[Vec<u64>; FILES]; 2],
    /// Requests not completed yet, per node.
    outstanding: [Vec<Outstanding>; 2],
    /// Every file opened for this input, per node (closed ones too), for the ledger check.
    opened: [Vec<FileId>; 2],
    /// Each node's completions, not yet reaped.
    completions: [Arc<Completions>; 2],
    /// Output buffers of completed requests, for the next requests.
    buffers: Vec<Vec<u8>>,
    /// `IOCTL_FUZZ_TRACE` is set: print each completion.
    trace: bool,
}

fn path(from: usize, to: usize) -> PathAbi {
    let (a, b) = (node_address(from), node_address(to));
    let mut p = PathAbi::new_zeroed();
    p.slid = a.lid;
    p.dlid = b.lid;
    p.sgid = a.gid;
    p.dgid = b.gid;
    p.rate = 16;
    p.packet_life_time = 14;
    p.subnet_local = 1;
    p
}

fn output_size(c: u32) -> usize {
    (match c {
        code::VERSION => VersionOut::SIZE,
        code::CREATE => CreateOut::SIZE,
        code::FORMAT_REP | code::GET_QP_TRANSITIONS => QpTransitionsOut::SIZE,
        code::GET_QP_ATTR => QpAttrOut::SIZE,
        code::QUERY => QueryOut::SIZE,
        code::GET_EVENT => EventRecord::SIZE,
        code::COUNTERS => CountersOut::SIZE,
        _ => 0,
    }) as usize
}

/// An output buffer that fits code `c`, varied by `k` where the code takes several: a
/// GET_EVENT of 1 to 4 records; a CONNECT (0: completes at once; 1 or 2 records: waits
/// for the answer, 2 with the QP transitions) or SEND_REP (0 or 1) with or without its
/// answer.
fn fit(c: u32, k: u8) -> usize {
    match c {
        code::GET_EVENT => EV * (1 + usize::from(k % 4)),
        code::CONNECT => EV * usize::from(k % 3),
        code::SEND_REP => EV * usize::from(k % 2),
        _ => output_size(c),
    }
}

/// Overlays `raw` after the size field, then (optionally) zeroes the reserved ranges.
fn finish<T: IntoBytes + FromBytes + Immutable + KnownLayout>(
    mut r: T,
    rec: &Record,
    reserved: &[(usize, usize)],
) -> Vec<u8> {
    let bytes = r.as_mut_bytes();
    if let Some(raw) = &rec.raw {
        for (d, s) in bytes.iter_mut().skip(4).zip(raw) {
            *d = *s;
        }
        if rec.clear_reserved {
            for &(off, len) in reserved {
                bytes[off..off + len].fill(0);
            }
        }
    }
    bytes.to_vec()
}

macro_rules! span {
    ($t:ty, $($f:ident).+) => {{
        let r = <$t>::new_zeroed();
        (core::mem::offset_of!($t, $($f).+), core::mem::size_of_val(&r.$($f).+))
    }};
}

/// A well-formed record of `c` whose fields come from `rec`'s knobs (and overlay).
fn record(c: u32, node: usize, handle: u64, rec: &Record) -> Vec<u8> {
    let k = rec.knobs;
    let service = SERVICES[usize::from(k[0]) % SERVICES.len()];
    match c {
        code::VERSION => finish(
            VersionIn {
                size: VersionIn::SIZE,
                abi_version: if k[1] == 0xff { 2 } else { ABI_VERSION },
            },
            rec,
            &[],
        ),
        code::CREATE => finish(
            CreateIn {
                size: CreateIn::SIZE,
                reserved: 0,
            },
            rec,
            &[span!(CreateIn, reserved)],
        ),
        code::COUNTERS => finish(
            CountersIn {
                size: CountersIn::SIZE,
                reserved: 0,
            },
            rec,
            &[span!(CountersIn, reserved)],
        ),
        code::LISTEN => {
            let mut l = ListenIn::new_zeroed();
            l.size = ListenIn::SIZE;
            l.handle = handle;
            l.service_id = service;
            l.service_mask = if k[1] & 1 == 0 { u64::MAX } else { !0xff };
            l.backlog = u32::from(k[2] % 6);
            l.port = k[1] >> 7;
            l.compare_offset = k[3] % 96;
            l.compare_len = k[4] % 8;
            l.compare.fill(k[5] & 3);
            finish(
                l,
                rec,
                &[
                    span!(ListenIn, reserved),
                    span!(ListenIn, reserved1),
                    span!(ListenIn, reserved2),
                ],
            )
        }
        code::CONNECT => {
            let mut cn = ConnectIn::new_zeroed();
            cn.size = ConnectIn::SIZE;
            cn.handle = handle;
            cn.service_id = service;
            cn.qpn = 0x100 + u32::from(k[1]);
            cn.starting_psn = u32::from(k[2]) << 8;
            cn.flags = u32::from(k[3] & 0x1f);
            cn.pkey = 0xffff;
            cn.port = 1;
            cn.transport = k[4] % 5;
            cn.path_mtu = 1 + k[4] % 6;
            cn.responder_resources = k[5] % 5;
            cn.initiator_depth = k[5] % 3;
            // Short timeouts so that retries and timewait happen within a fuzz run.
            cn.remote_cm_response_timeout = 8 + k[6] % 12;
            cn.local_cm_response_timeout = 8 + k[6] % 12;
            cn.retry_count = 7;
            cn.rnr_retry_count = 7;
            cn.max_cm_retries = k[6] >> 5;
            cn.primary = path(node, 1 - node);
            cn.primary.packet_life_time = 8 + k[7] % 10;
            if cn.flags & ibcm_ioctl::flags::ALTERNATE_PATH != 0 {
                cn.alternate = path(node, 1 - node);
            }
            cn.private_data_len = k[7] % 94;
            cn.private_data.fill(k[7]);
            finish(
                cn,
                rec,
                &[
                    span!(ConnectIn, reserved),
                    span!(ConnectIn, reserved1),
                    span!(ConnectIn, primary.reserved),
                    span!(ConnectIn, alternate.reserved),
                ],
            )
        }
        code::FORMAT_REP => {
            let mut r = FormatRepIn::new_zeroed();
            r.size = FormatRepIn::SIZE;
            r.handle = handle;
            r.qpn = 0x200 + u32::from(k[1]);
            r.starting_psn = u32::from(k[2]);
            r.flags = u32::from(k[3] & 0xd);
            r.responder_resources = k[5] % 4;
            r.initiator_depth = k[5] % 3;
            r.rnr_retry_count = k[6] % 9;
            r.failover_accepted = k[6] % 4;
            r.private_data_len = k[7] % 198;
            finish(
                r,
                rec,
                &[span!(FormatRepIn, reserved), span!(FormatRepIn, reserved1)],
            )
        }
        code::RTU | code::DREQ | code::DREP => {
            let mut p = PrivateDataIn::new_zeroed();
            p.size = PrivateDataIn::SIZE;
            p.handle = handle;
            p.private_data_len = k[7] % 226;
            p.private_data.fill(k[6]);
            finish(
                p,
                rec,
                &[
                    span!(PrivateDataIn, reserved),
                    span!(PrivateDataIn, reserved1),
                ],
            )
        }
        code::REJ => {
            let mut r = RejIn::new_zeroed();
            r.size = RejIn::SIZE;
            r.handle = handle;
            r.reason = u16::from(k[1] % 34);
            r.ari_len = k[2] % 74;
            r.private_data_len = k[7] % 150;
            finish(
                r,
                rec,
                &[
                    span!(RejIn, reserved),
                    span!(RejIn, reserved1),
                    span!(RejIn, reserved2),
                ],
            )
        }
        code::MRA => {
            let mut m = MraIn::new_zeroed();
            m.size = MraIn::SIZE;
            m.handle = handle;
            m.service_timeout = k[1] % 33;
            m.private_data_len = k[7] % 224;
            finish(
                m,
                rec,
                &[
                    span!(MraIn, reserved),
                    span!(MraIn, reserved1),
                    span!(MraIn, reserved2),
                ],
            )
        }
        code::GET_QP_ATTR => finish(
            GetQpAttrIn {
                size: GetQpAttrIn::SIZE,
                reserved: 0,
                handle,
                qp_state: u32::from(k[1] % 5),
                reserved1: 0,
            },
            rec,
            &[span!(GetQpAttrIn, reserved), span!(GetQpAttrIn, reserved1)],
        ),
        _ => finish(
            HandleIn {
                size: HandleIn::SIZE,
                reserved: 0,
                handle,
            },
            rec,
            &[span!(HandleIn, reserved)],
        ),
    }
}

impl Harness {
    /// The harness on `fabric`, which holds no file, CEP, request or MAD (see
    /// [`quiescent`]): three files per node, each after the VERSION handshake.
    fn new(fabric: Fabric, completions: [Arc<Completions>; 2], trace: bool) -> Self {
        let files = [0, 1].map(|n| [(); FILES].map(|()| fabric.nodes[n].open()));
        let opened = [files[0].to_vec(), files[1].to_vec()];
        let mut h = Self {
            fabric,
            files,
            handles: Default::default(),
            outstanding: Default::default(),
            opened,
            completions,
            buffers: Vec::new(),
            trace,
        };
        for n in 0..2 {
            for s in 0..FILES {
                h.handshake(n, s);
            }
        }
        h
    }

    fn node(&self, n: usize) -> &Node {
        &self.fabric.nodes[n]
    }

    fn handshake(&mut self, n: usize, s: usize) {
        let v = VersionIn {
            size: VersionIn::SIZE,
            abi_version: ABI_VERSION,
        };
        let done = self.call(n, s, code::VERSION, v.as_bytes(), 16);
        assert_eq!(done.map(|d| d.status), Some(status::SUCCESS), "VERSION");
    }

    fn learn(&mut self, n: usize, s: usize, c: u32, output: &[u8]) {
        match c {
            code::CREATE => {
                if let Ok(o) = CreateOut::read_from_bytes(output) {
                    self.handles[n][s].push(o.handle);
                }
            }
            code::GET_EVENT => {
                for chunk in output.chunks_exact(EV) {
                    let e = EventRecord::read_from_bytes(chunk).expect("record");
                    assert_eq!(e.size, EventRecord::SIZE);
                    if e.event_type == event_type::REQ_RECEIVED {
                        self.handles[n][s].push(e.new_handle);
                    }
                }
            }
            _ => {}
        }
    }

    /// Issues an IOCTL and tracks it; its key.
    fn issue(&mut self, n: usize, s: usize, c: u32, bytes: &[u8], out: usize) -> u64 {
        let file = self.files[n][s];
        let hook = Arc::new(Hook {
            key: AtomicU64::new(0),
            sink: Arc::clone(&self.completions[n]),
        });
        let buffer = self.buffers.pop().unwrap_or_default();
        let node = &self.fabric.nodes[n];
        let request = node.platform.request_with_hook(
            file_key(file),
            buffer,
            out,
            Arc::clone(&hook) as Arc<dyn CompletionHook>,
        );
        let key = request.key_value();
        hook.key.store(key, Ordering::Relaxed);
        self.outstanding[n].push(Outstanding {
            key,
            slot: s,
            code: c,
        });
        node.device.dispatch(file, request, c, bytes);
        key
    }

    /// Moves completed requests out of `outstanding`, learning from their output; the
    /// completion of `want`, if it is among them. With `IOCTL_FUZZ_TRACE` set, prints
    /// each completion (code, status, bytes).
    fn reap_for(&mut self, want: Option<u64>) -> Option<Done> {
        let mut found = None;
        for n in 0..2 {
            let done = std::mem::take(
                &mut *self.completions[n]
                    .0
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            for d in done {
                let Some(i) = self.outstanding[n].iter().position(|o| o.key == d.key) else {
                    panic!(
                        "node {n}: a completion of request {:#x}, not outstanding",
                        d.key
                    );
                };
                let o = self.outstanding[n].swap_remove(i);
                if self.trace {
                    eprintln!(
                        "trace node {n} file {} code {:#x} status {:#x} bytes {}",
                        o.slot,
                        o.code,
                        d.status,
                        d.output.len()
                    );
                }
                if d.status == status::SUCCESS {
                    self.learn(n, o.slot, o.code, &d.output);
                }
                if want == Some(d.key) {
                    found = Some(d);
                } else {
                    self.buffers.push(d.output);
                }
            }
        }
        found
    }

    fn reap(&mut self) {
        self.reap_for(None);
    }

    /// Issues an IOCTL, tracks it, and returns its completion if it completed at once.
    fn call(&mut self, n: usize, s: usize, c: u32, bytes: &[u8], out: usize) -> Option<Done> {
        let key = self.issue(n, s, c, bytes, out);
        self.reap_for(Some(key))
    }

    /// Creates an endpoint; its handle, if it worked.
    fn create(&mut self, n: usize, s: usize) -> Option<u64> {
        let c = CreateIn {
            size: CreateIn::SIZE,
            reserved: 0,
        };
        let done = self.call(n, s, code::CREATE, c.as_bytes(), CreateOut::SIZE as usize)?;
        (done.status == status::SUCCESS)
            .then(|| CreateOut::read_from_bytes(&done.output).ok())
            .flatten()
            .map(|o| o.handle)
    }

    /// The records of the next events of an endpoint (GET_EVENT, left pending if none).
    fn events(&mut self, n: usize, s: usize, handle: u64) -> Vec<EventRecord> {
        let h = HandleIn {
            size: HandleIn::SIZE,
            reserved: 0,
            handle,
        };
        let Some(done) = self.call(n, s, code::GET_EVENT, h.as_bytes(), 4 * EV) else {
            return Vec::new();
        };
        done.output
            .chunks_exact(EV)
            .filter_map(|c| EventRecord::read_from_bytes(c).ok())
            .collect()
    }

    fn scenario(&mut self, n: usize, fa: usize, fb: usize, service: u8, stage: u8, twist: u8) {
        let m = 1 - n;
        let knobs = [service, twist, 1 + twist % 4, 0, 0, 2, 0x40, twist];
        let rec = |handle| Record {
            handle: HandleChoice::Raw(handle),
            knobs,
            raw: None,
            clear_reserved: true,
        };
        let Some(listen) = self.create(m, fb) else {
            return;
        };
        let l = record(code::LISTEN, m, listen, &rec(listen));
        self.call(m, fb, code::LISTEN, &l, 0);
        let Some(active) = self.create(n, fa) else {
            return;
        };
        let mut connect =
            ConnectIn::read_from_bytes(&record(code::CONNECT, n, active, &rec(active)))
                .expect("record");
        connect.flags = 0;
        connect.transport = 0;
        connect.path_mtu = 4;
        connect.alternate = PathAbi::new_zeroed();
        self.call(n, fa, code::CONNECT, connect.as_bytes(), 0);
        if stage == 0 {
            return;
        }
        self.fabric.run_for(50_000);
        self.reap();
        let child = self
            .events(m, fb, listen)
            .iter()
            .find(|e| e.event_type == event_type::REQ_RECEIVED)
            .map(|e| e.new_handle);
        let Some(child) = child else { return };
        let pd = |handle: u64, len: u8| {
            let mut p = PrivateDataIn::new_zeroed();
            p.size = PrivateDataIn::SIZE;
            p.handle = handle;
            p.private_data_len = len;
            p
        };
        match (stage, twist % 4) {
            (1, _) => return,
            (_, 1) => {
                let mut mra = MraIn::new_zeroed();
                mra.size = MraIn::SIZE;
                mra.handle = child;
                mra.service_timeout = 10;
                self.call(m, fb, code::MRA, mra.as_bytes(), 0);
            }
            (_, 2) => {
                let mut rej = RejIn::new_zeroed();
                rej.size = RejIn::SIZE;
                rej.handle = child;
                rej.reason = 28;
                self.call(m, fb, code::REJ, rej.as_bytes(), 0);
                return;
            }
            _ => {}
        }
        let mut rep = FormatRepIn::new_zeroed();
        rep.size = FormatRepIn::SIZE;
        rep.handle = child;
        rep.qpn = 0x300 + u32::from(twist);
        rep.responder_resources = 0;
        rep.initiator_depth = 0;
        rep.rnr_retry_count = 7;
        rep.private_data_len = twist % 8;
        self.call(
            m,
            fb,
            code::FORMAT_REP,
            rep.as_bytes(),
            QpTransitionsOut::SIZE as usize,
        );
        if stage == 2 {
            return;
        }
        let h = |handle| HandleIn {
            size: HandleIn::SIZE,
            reserved: 0,
            handle,
        };
        self.call(m, fb, code::SEND_REP, h(child).as_bytes(), 0);
        if stage == 3 {
            return;
        }
        self.fabric.run_for(50_000);
        self.reap();
        self.events(n, fa, active);
        if stage == 4 {
            return;
        }
        self.call(n, fa, code::RTU, pd(active, twist % 16).as_bytes(), 0);
        self.fabric.run_for(50_000);
        self.reap();
        if stage == 5 {
            return;
        }
        let (dn, ds, dh, pn, ps, ph) = if twist & 0x10 == 0 {
            (n, fa, active, m, fb, child)
        } else {
            (m, fb, child, n, fa, active)
        };
        self.call(dn, ds, code::DREQ, pd(dh, 0).as_bytes(), 0);
        if stage == 6 {
            return;
        }
        self.fabric.run_for(50_000);
        self.reap();
        self.events(pn, ps, ph);
        self.call(pn, ps, code::DREP, pd(ph, twist % 32).as_bytes(), 0);
        self.fabric.run_for(50_000);
        self.reap();
    }

    fn pick_handle(&self, n: usize, s: usize, choice: &HandleChoice) -> u64 {
        match *choice {
            HandleChoice::Own(i) => {
                let own = &self.handles[n][s];
                if own.is_empty() {
                    0
                } else {
                    own[usize::from(i) % own.len()]
                }
            }
            HandleChoice::Other(i) => {
                let all: Vec<u64> = self.handles.iter().flatten().flatten().copied().collect();
                if all.is_empty() {
                    1 | 1 << 32
                } else {
                    all[usize::from(i) % all.len()]
                }
            }
            HandleChoice::Raw(h) => h,
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Ioctl {
                node,
                file,
                code: c,
                input,
                out,
            } => {
                let n = usize::from(node);
                let s = usize::from(file) % FILES;
                let c = match c {
                    Code::Known(i) => code::ALL[usize::from(i) % code::ALL.len()],
                    Code::Raw(c) => c,
                };
                let bytes = match &input {
                    Input::Bytes(b) => b.clone(),
                    Input::Record(rec) => {
                        let h = self.pick_handle(n, s, &rec.handle);
                        record(c, n, h, rec)
                    }
                };
                let out = match out {
                    OutLen::Fit(k) => fit(c, k),
                    OutLen::Raw(l) => usize::from(l % 4096),
                };
                self.issue(n, s, c, &bytes, out);
                self.reap();
            }
            Op::Call {
                node,
                file,
                code: c,
                handle,
                knobs,
            } => {
                let n = usize::from(node);
                let s = usize::from(file) % FILES;
                let c = code::ALL[usize::from(c) % code::ALL.len()];
                let rec = Record {
                    handle: HandleChoice::Own(handle),
                    knobs,
                    raw: None,
                    clear_reserved: true,
                };
                let h = self.pick_handle(n, s, &rec.handle);
                let bytes = record(c, n, h, &rec);
                self.call(n, s, c, &bytes, fit(c, knobs[0]));
            }
            Op::Cancel { node, which } => {
                let n = usize::from(node);
                if self.outstanding[n].is_empty() {
                    return;
                }
                let o = &self.outstanding[n][usize::from(which) % self.outstanding[n].len()];
                let (key, file) = (o.key, self.files[n][o.slot]);
                self.node(n).cancel(file, key);
                self.reap();
            }
            Op::Reopen {
                node,
                file,
                handshake,
            } => {
                let n = usize::from(node);
                let s = usize::from(file) % FILES;
                self.node(n).close(self.files[n][s]);
                self.reap();
                assert!(
                    self.outstanding[n].iter().all(|o| o.slot != s),
                    "close left a request of the file pending"
                );
                self.handles[n][s].clear();
                let f = self.node(n).open();
                self.files[n][s] = f;
                self.opened[n].push(f);
                if handshake {
                    self.handshake(n, s);
                }
            }
            Op::Step(k) => {
                for _ in 0..=k % 16 {
                    if !self.fabric.step() {
                        break;
                    }
                }
                self.reap();
            }
            Op::Scenario {
                node,
                files: (a, b),
                service,
                stage,
                twist,
            } => {
                let n = usize::from(node);
                self.scenario(
                    n,
                    usize::from(a) % FILES,
                    usize::from(b) % FILES,
                    service,
                    stage % 8,
                    twist,
                );
            }
            Op::Advance(k) => {
                // Up to 2^36 ns (about 69 s): past CM timeouts and timewait.
                self.fabric.run_for(1u64 << (k % 37));
                self.reap();
            }
        }
    }

    fn check(&self, when: &str) {
        for n in 0..2 {
            let v = self.node(n).violations();
            assert!(v.is_empty(), "{when}: node {n} violations {v:?}");
        }
    }
}

/// Asserts that a fabric holds nothing an input left behind: no file, CEP, peer-map or
/// timer entry in either engine, no timer armed, no MAD in flight or in an outbox, no
/// violation. A fabric in this state behaves, for the next input, as a new one, but for
/// the values it draws (comm IDs, PSNs, generations) and the room it has grown.
///
/// (That no MAD is on the link and no timer armed is what ended the dry run: `step`
/// found nothing to do.)
fn quiescent(fabric: &Fabric) {
    for (n, node) in fabric.nodes.iter().enumerate() {
        assert_eq!(node.device.file_count(), 0, "node {n}: files left");
        let engine = node
            .device
            .with_engine(|cm| (cm.live_ceps(), cm.peer_map_entries(), cm.timer_entries()));
        assert_eq!(
            engine,
            (0, 0, 0),
            "node {n}: CEPs, peer-map or timer entries left"
        );
        assert_eq!(node.platform.timer(), None, "node {n}: the timer is armed");
        let sent = node.platform.take_sent();
        assert!(sent.is_empty(), "node {n}: MADs left in the outbox");
        node.platform.recycle_sent(sent);
        let v = node.violations();
        assert!(v.is_empty(), "node {n}: violations {v:?}");
    }
}

/// Inputs one fabric serves before a new one replaces it (`IBCM_FUZZ_FRESH=1`: one). Two
/// new nodes cost about half a millisecond here (their batches, tables and pools); a
/// fabric that has run dry after an input ([`quiescent`]) serves the next as well.
const FABRIC_USES: usize = 128;
/// A fabric whose clock passed this is replaced (an input moves it by 2^44 ns at most).
const CLOCK_LIMIT_NS: u64 = 1 << 56;

struct Reused {
    fabric: Fabric,
    completions: [Arc<Completions>; 2],
}

/// The inputs the current fabric served, this one included: the first `len` of
/// `inputs`, whose buffers are kept for the next fabric's inputs. (libFuzzer runs a leak
/// check after an input that allocated more than it freed: memory kept from one input to
/// the next is allocated once, not per input.)
#[derive(Default)]
struct History {
    inputs: Vec<Vec<u8>>,
    len: usize,
}

impl History {
    fn served(&self) -> &[Vec<u8>] {
        &self.inputs[..self.len]
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    fn push(&mut self, data: &[u8]) {
        if self.len == self.inputs.len() {
            self.inputs.push(Vec::with_capacity(4096));
        }
        let slot = &mut self.inputs[self.len];
        slot.clear();
        slot.extend_from_slice(data);
        self.len += 1;
    }
}

thread_local! {
    static FABRIC: RefCell<Option<Reused>> = const { RefCell::new(None) };
    static HISTORY: RefCell<History> = RefCell::new(History::default());
}

fn uses() -> usize {
    static USES: OnceLock<usize> = OnceLock::new();
    *USES.get_or_init(|| {
        if std::env::var_os("IBCM_FUZZ_FRESH").is_some_and(|v| v == "1") {
            1
        } else {
            FABRIC_USES
        }
    })
}

/// On a failure, writes the inputs the fabric served before the failing one, so that the
/// failure can be replayed: `ioctl history-<pid>-000 ... <crash file>` runs them in order
/// on one fabric, as the fuzzer did.
fn install_history_hook() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = HISTORY.try_with(|h| {
                let Ok(h) = h.try_borrow() else { return };
                let h = h.served();
                let earlier = h.len().saturating_sub(1);
                if earlier == 0 {
                    return;
                }
                let pid = std::process::id();
                let mut names = Vec::new();
                for (i, input) in h[..earlier].iter().enumerate() {
                    let name = format!("history-{pid}-{i:03}");
                    if std::fs::write(&name, input).is_ok() {
                        names.push(name);
                    }
                }
                eprintln!(
                    "ioctl: this input ran on a fabric that served {earlier} input(s) before it; \
                     replay them first: ioctl {} <crash file> (or IBCM_FUZZ_FRESH=1 for a \
                     fabric per input)",
                    names.join(" ")
                );
            });
            previous(info);
        }));
    });
}

/// Operations run per input (`IBCM_FUZZ_MAX_OPS` overrides it); the rest of a longer
/// input is ignored. See the module documentation for the choice.
const MAX_OPS: usize = 16;

fn max_ops() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("IBCM_FUZZ_MAX_OPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MAX_OPS)
    })
}

fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("IOCTL_FUZZ_TRACE").is_some())
}

fuzz_target!(|data: &[u8]| {
    install_history_hook();
    let reused = FABRIC.with(|f| f.borrow_mut().take());
    let reused = match reused {
        Some(r)
            if HISTORY.with(|h| h.borrow().len) < uses()
                && r.fabric.now().as_nanos() < CLOCK_LIMIT_NS =>
        {
            r
        }
        _ => {
            HISTORY.with(|h| h.borrow_mut().clear());
            Reused {
                fabric: Fabric::new(2, 1),
                completions: Default::default(),
            }
        }
    };
    HISTORY.with(|h| h.borrow_mut().push(data));
    let mut h = Harness::new(reused.fabric, reused.completions, trace());

    let mut u = Unstructured::new(data);
    for _ in 0..max_ops() {
        if u.is_empty() {
            break;
        }
        let Ok(op) = Op::arbitrary(&mut u) else { break };
        h.apply(op);
    }
    h.check("after the sequence");

    // Close everything; every request must complete.
    for n in 0..2 {
        for s in 0..FILES {
            h.node(n).close(h.files[n][s]);
        }
    }
    h.reap();
    for n in 0..2 {
        assert!(
            h.outstanding[n].is_empty(),
            "node {n}: requests never completed {:?}",
            h.outstanding[n]
        );
        for f in &h.opened[n] {
            let left = h.node(n).platform.ledger.outstanding(file_key(*f));
            assert!(left.is_empty(), "node {n}: ledger has {left:?} outstanding");
        }
        assert_eq!(h.node(n).device.file_count(), 0);
    }
    h.check("after closing every file");

    // Let every retry, REJ, DREQ and timewait run out.
    let mut steps = 0u32;
    while h.fabric.step() {
        steps += 1;
        assert!(steps < 1_000_000, "the fabric never goes quiet");
    }
    h.check("after the fabric ran dry");
    for n in 0..2 {
        let live = h.node(n).device.with_engine(|cm| cm.live_ceps());
        assert_eq!(
            live, 0,
            "node {n}: {live} CEP(s) left after every file closed"
        );
    }
    assert!(
        h.completions.iter().all(|c| c
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()),
        "a completion after every file closed"
    );
    quiescent(&h.fabric);
    let Harness {
        fabric,
        completions,
        ..
    } = h;
    FABRIC.with(|f| {
        *f.borrow_mut() = Some(Reused {
            fabric,
            completions,
        })
    });
});
