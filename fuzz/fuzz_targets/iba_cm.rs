//! Call-sequence fuzzing of the iba_cm 1.1 C ABI (`driver/iba-cm`): two host nodes of a
//! [`Fabric`] in virtual time, each with an `iba_cm` instance whose interface the harness
//! got from `answer_query`, driven, as a C client would drive it, through the
//! `INFINIBAND_INTERFACE_CM` table's `extern "C"` function pointers, by an arbitrary
//! sequence of
//! - calls of every function (`create_id`, `listen`, `cancel_listen`, `get_request(_ex)`,
//!   `send_req`, `send_rep`, `format_rep` + `send_formatted_rep`, `send_rtu`, `send_rej`,
//!   `send_mra`, `send_dreq`, `send_drep`, `send_lap`, `send_apr`, `send_sidr_req`,
//!   `send_sidr_rep`, `get_qp_attr`, `migrate`, `established`, `destroy_id`) with valid
//!   pointers and arbitrary values, on the ids the harness holds or on a pointer that is no
//!   id; at PASSIVE_LEVEL or (every function but `destroy_id`) at DISPATCH_LEVEL;
//! - reactions armed on an id and run from inside its next callbacks: any of those calls
//!   on the id itself, `destroy_id` of it, an error return (which destroys the id, AL's
//!   al_cm.c:90-95), both;
//! - rewrites of an id's `callback` (to another function or none) and `context`;
//! - interface references and dereferences, the deferred delivery (the DPC), fabric
//!   steps and virtual-time skips of up to about 69 s, so that every CM timeout fires;
//! - scenarios: a listen, a REQ, `get_request`, the REP and so on up to a chosen stage,
//!   through the same calls (so that one operation reaches a deep state).
//!
//! Checked, besides "never panics":
//! - no verifier violation on either node (an allocation or a wait at DISPATCH_LEVEL,
//!   on the receive path, the timer, a DISPATCH_LEVEL call or a callback);
//! - callbacks run at DISPATCH_LEVEL, with no ibcm lock held, never inside a downcall of
//!   this thread, one at a time per id (never re-entered), only for ids the client got
//!   (`create_id`, `get_request`) and never after their `destroy_id` returned or their
//!   callback returned an error; the function called is the one the id holds now (read
//!   afresh), `context` is what the client last wrote;
//! - a listen's callback gets zeroed REQ_RECEIVED notifications only, and no more
//!   requests are pulled than it was told of (while it had a callback); `get_request`
//!   gives the new id the listen's callback and the listen id as context,
//!   `get_request_ex` the given ones, and an event of the listen's service;
//! - every event is one the id can get given what it sent (REP_RECEIVED, REQ_ERROR after
//!   a REQ; RTU_RECEIVED, REP_ERROR after a REP; DREP_RECEIVED, DREQ_ERROR after a DREQ;
//!   APR_RECEIVED, LAP_ERROR after a LAP; SIDR_REP_RECEIVED, SIDR_REQ_ERROR after a
//!   SIDR_REQ), at most one answer per message sent; and the peer agrees (the fabric has
//!   no faults here): a REP_RECEIVED names a QPN whose id sent a REP, an RTU_RECEIVED
//!   comes from an id that sent an RTU, a DREQ_RECEIVED from one that sent a DREQ or was
//!   destroyed;
//! - a pointer that is no id gets STATUS_INVALID_HANDLE from every function (or
//!   STATUS_INVALID_PARAMETER, for arguments checked before the id).
//!
//! At the end every id still held is destroyed and the fabric runs dry; then neither node
//! holds an id, a dispatch-layer endpoint, a CEP, a peer-map or timer entry, an armed
//! timer or a MAD, the interface holds only the harness's reference, and no rule was
//! broken.
//!
//! Levels: calls with private data (or an ARI) run at DISPATCH_LEVEL and from callbacks
//! like every other: the engine keeps private data in blocks grown at PASSIVE_LEVEL, so
//! a downcall that finds none left gets STATUS_INSUFFICIENT_RESOURCES, never an
//! allocation (the ctest `private_data_at_dispatch_allocates_nothing`).
//!
//! Cost: two nodes and their CM instances cost more than most inputs, so one world serves
//! [`WORLD_USES`] inputs; after each, the checks above are its full reset. At most
//! [`MAX_OPS`] operations run per input. `IBCM_FUZZ_FRESH=1` gives every input a new
//! world, `IBA_CM_FUZZ_TRACE=1` prints every operation; on a failure the inputs the world served before are written to
//! `history-<pid>-NNN` for replay (as for `ioctl`).
#![no_main]

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use ibcm_endpoint::Device;
use ibcm_host::verifier::{at_dispatch, is_at_dispatch, locks_held};
use ibcm_host::{Fabric, HostPlatform, Node, node_address, node_guid};
use ibcm_iba_cm::abi::{
    Be16, Be32, Be64, IbPathRec, IbQpMod, IbaCmApr, IbaCmCallback, IbaCmEvent, IbaCmId,
    IbaCmInterface, IbaCmLap, IbaCmRep, IbaCmReq, IbaCmSidrRep, IbaCmSidrReq, NtStatus, event_type,
    qp_state, status,
};
use ibcm_iba_cm::{Backend, Config, Registered};
use libfuzzer_sys::fuzz_target;

include!("asan_options.rs");

/// The instances' bounds: small, so that the pools run out within an input.
const CONFIG: Config = Config {
    ids: 16,
    listens: 4,
    backlog: 4,
    concurrency: 4,
};
/// Ids the harness keeps a record of per input (the rest are not made).
const RECORDS: usize = 96;
/// Reactions armed per id at once.
const REACTIONS: usize = 4;
/// Service IDs the calls pick from: two plain, one RDMA-CM (TCP port 0x1234).
const SERVICES: [u64; 3] = [0x1000, 0x1001, 0x0106_1234];
/// Private data, ARI and additional information: an RDMA-CM header (version 0, IPv4)
/// followed by a counting pattern.
static PD: [u8; 256] = {
    let mut b = [0u8; 256];
    let mut i = 2;
    while i < 256 {
        b[i] = i as u8;
        i += 1;
    }
    b[1] = 0x40;
    b
};

// ---- the backend -------------------------------------------------------------------------

struct FuzzBackend {
    node: Arc<Node>,
    index: usize,
    pending: AtomicBool,
    /// Callbacks entered with an ibcm (host) lock held on their thread.
    under_lock: AtomicUsize,
}

impl Backend for FuzzBackend {
    type Platform = HostPlatform;

    fn device(&self) -> &Device<HostPlatform> {
        &self.node.device
    }

    fn at_dispatch(&self, f: &mut dyn FnMut()) {
        if locks_held() != 0 {
            self.under_lock.fetch_add(1, Ordering::Relaxed);
        }
        at_dispatch(&self.node.platform.ledger, f);
    }

    fn at_passive(&self) -> bool {
        !is_at_dispatch()
    }

    fn schedule_delivery(&self) {
        self.pending.store(true, Ordering::Release);
    }

    fn port_of_gid(&self, gid: &[u8; 16]) -> Option<u8> {
        (*gid == self.node.address.gid).then_some(1)
    }

    fn pkey_index(&self, _port: u8, pkey: u16) -> u16 {
        if pkey | 0x8000 == 0xFFFF { 0 } else { 1 }
    }

    fn ca_guid(&self) -> u64 {
        node_guid(self.index)
    }
}

/// Two nodes, their CM instances and the interface each handed out (one reference).
struct World {
    fabric: Fabric,
    cms: [Option<Registered<FuzzBackend>>; 2],
    tables: [IbaCmInterface; 2],
    /// The `InterfaceReference`/`InterfaceDereference` pair and context of each.
    refs: [(
        unsafe extern "C" fn(*mut c_void),
        unsafe extern "C" fn(*mut c_void),
        *mut c_void,
    ); 2],
}

impl World {
    fn new() -> Self {
        let fabric = Fabric::new(2, 1);
        let mut cms = [None, None];
        let mut tables = Vec::new();
        let mut refs = Vec::new();
        for (i, slot) in cms.iter_mut().enumerate() {
            let backend = FuzzBackend {
                node: Arc::clone(&fabric.nodes[i]),
                index: i,
                pending: AtomicBool::new(false),
                under_lock: AtomicUsize::new(0),
            };
            let cm = Registered::new(backend, CONFIG).expect("an instance");
            let ifc = cm.answer_query(0x0101, 208).expect("the interface");
            tables.push(ifc.cm);
            let h = ifc.interface_header;
            refs.push((
                h.interface_reference.expect("InterfaceReference"),
                h.interface_dereference.expect("InterfaceDereference"),
                h.context,
            ));
            *slot = Some(cm);
        }
        Self {
            fabric,
            cms,
            tables: [tables[0], tables[1]],
            refs: [refs[0], refs[1]],
        }
    }

    fn cm(&self, n: usize) -> &Registered<FuzzBackend> {
        self.cms[n].as_ref().expect("not removed")
    }

    /// The deferred deliveries, as the DPCs would run them.
    fn deliver(&self, n: usize) {
        let cm = self.cm(n);
        if cm.backend().pending.swap(false, Ordering::AcqRel) {
            at_dispatch(&self.fabric.nodes[n].platform.ledger, || cm.deliver());
        }
    }

    fn deliver_all(&self) {
        self.deliver(0);
        self.deliver(1);
    }

    fn run(&mut self, ns: u64) {
        self.deliver_all();
        self.fabric.run_for(ns);
        self.deliver_all();
    }

    fn check_rules(&self, when: &str) {
        for n in 0..2 {
            let v = self.fabric.nodes[n].violations();
            assert!(v.is_empty(), "{when}: node {n} violations {v:?}");
            let under = self.cm(n).backend().under_lock.load(Ordering::Relaxed);
            assert_eq!(under, 0, "{when}: node {n}: callbacks under an ibcm lock");
        }
    }

    /// The full reset check: nothing an input left behind.
    fn quiescent(&self) {
        self.check_rules("quiescent");
        for (n, node) in self.fabric.nodes.iter().enumerate() {
            let cm = self.cm(n);
            assert_eq!(cm.ids_in_use(), 0, "node {n}: ids left");
            assert_eq!(cm.references(), 1, "node {n}: interface references");
            assert_eq!(node.device.client_count(), 0, "node {n}: endpoints left");
            let engine = node
                .device
                .with_engine(|e| (e.live_ceps(), e.peer_map_entries(), e.timer_entries()));
            assert_eq!(
                engine,
                (0, 0, 0),
                "node {n}: CEPs, peer or timer entries left"
            );
            assert_eq!(node.platform.timer(), None, "node {n}: the timer is armed");
            let sent = node.platform.take_sent();
            assert!(sent.is_empty(), "node {n}: MADs left in the outbox");
            node.platform.recycle_sent(sent);
            assert!(
                !cm.backend().pending.load(Ordering::Acquire),
                "node {n}: delivery due"
            );
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for n in 0..2 {
            let (_, deref, ctx) = self.refs[n];
            // SAFETY: drops the reference `answer_query` took, with the context it gave.
            unsafe { deref(ctx) };
            drop(self.cms[n].take());
        }
    }
}

// ---- the input -------------------------------------------------------------------------

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Cb {
    Main,
    Alt,
    None,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Ctx {
    Null,
    Record,
    Junk(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Target {
    /// The n-th live id of the record table.
    Live(u8),
    /// A pointer that is no id of either CM.
    Bogus,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum PathKnob {
    /// The path to the other node.
    Good,
    /// One field changed.
    Edited { field: u8, value: u16 },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Compare {
    /// The bytes PD holds at the offset (a REQ carrying PD matches), else arbitrary.
    matching: bool,
    bytes: [u8; 8],
    len: u8,
    offset: u8,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Call {
    Listen {
        sid: u8,
        compare: Option<Compare>,
    },
    CancelListen,
    GetRequest {
        ex: Option<(Cb, Ctx)>,
    },
    SendReq {
        sid: u8,
        knobs: [u8; 8],
        alt: bool,
        qp_type: u8,
        pdata: u8,
        path: PathKnob,
    },
    SendRep {
        knobs: [u8; 6],
        pdata: u8,
    },
    FormatRep {
        knobs: [u8; 6],
        pdata: u8,
        init: bool,
    },
    SendFormattedRep,
    SendRtu {
        pdata: u8,
    },
    SendDreq {
        pdata: u8,
    },
    SendDrep {
        pdata: u8,
    },
    SendRej {
        reason: u16,
        ari: u8,
        pdata: u8,
    },
    SendMra {
        timeout: u8,
        pdata: u8,
    },
    SendLap {
        pdata: u8,
        path: PathKnob,
    },
    SendApr {
        status: u8,
        info: u8,
        pdata: u8,
    },
    SendSidrReq {
        sid: u8,
        timeout_ms: u16,
        retries: u8,
        pdata: u8,
        path: PathKnob,
    },
    SendSidrRep {
        status: u8,
        qkey: u32,
        info: u8,
        pdata: u8,
    },
    GetQpAttr {
        state: u8,
    },
    Migrate,
    Established,
    SetCallback(Cb),
    SetContext(Ctx),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Reaction {
    Nothing,
    Call(Call),
    Destroy,
    Fail,
    DestroyThenFail,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Create {
        node: bool,
        cb: Cb,
        ctx: Ctx,
    },
    Call {
        target: Target,
        call: Call,
        dispatch: bool,
    },
    Destroy(u8),
    Arm {
        target: u8,
        reactions: [Reaction; 2],
    },
    Deliver(bool),
    Step,
    Run(u8),
    Reference {
        node: bool,
        take: bool,
    },
    Scenario {
        node: bool,
        sid: u8,
        stage: u8,
        twist: u8,
    },
}

// ---- the client's state ---------------------------------------------------------------------

/// What the harness knows of one id it got.
#[derive(Clone, Copy)]
struct Rec {
    node: usize,
    p_id: *mut IbaCmId,
    /// Got and not destroyed (by `destroy_id` or an error return).
    live: bool,
    /// Destroyed (its peer may see a DREQ).
    ended: bool,
    /// `listen` succeeded and no `cancel_listen` since.
    listening: bool,
    service: u64,
    /// The record of the listen it came from.
    from_listen: Option<usize>,
    sidr_request: bool,
    qpn: u32,
    /// The peer's QPN (from the REQ or REP event).
    peer_qpn: Option<u32>,
    in_callback: bool,
    /// The callback and context the id holds (as the client last wrote them).
    cb: Cb,
    context: *mut c_void,
    /// A listen ran without a callback at some point (notifications were not seen).
    blind: bool,
    pulled: u32,
    sent: Sent,
    got: [u16; 16],
    reactions: [Option<Reaction>; REACTIONS],
}

/// Messages an id sent (successful calls).
#[derive(Clone, Copy, Default)]
struct Sent {
    req: u16,
    rep: u16,
    rtu: u16,
    dreq: u16,
    lap: u16,
    sidr: u16,
}

struct State {
    tables: [IbaCmInterface; 2],
    recs: Vec<Rec>,
    /// The harness's own interface references beyond `answer_query`'s, per node.
    extra_refs: [usize; 2],
    /// A pointer that is no id (inside the harness, never given to a CM as one it made).
    bogus: Box<IbaCmId>,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
    /// Downcalls this thread is inside: a callback must never come from one.
    static IN_DOWNCALL: Cell<u32> = const { Cell::new(0) };
}

fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    STATE.with(|s| f(s.borrow_mut().as_mut().expect("an input runs")))
}

fn cb_fn(cb: Cb) -> Option<IbaCmCallback> {
    match cb {
        Cb::Main => Some(cb_main),
        Cb::Alt => Some(cb_alt),
        Cb::None => None,
    }
}

fn ctx_ptr(ctx: Ctx, rec: usize) -> *mut c_void {
    match ctx {
        Ctx::Null => null_mut(),
        // Any stable, unique value: the record's index, offset (the CM never reads it).
        Ctx::Record => (0x1_0000 + rec) as *mut c_void,
        Ctx::Junk(v) => usize::from(v) as *mut c_void,
    }
}

/// Runs a downcall, counted (a callback meanwhile is a failure).
fn downcall<T>(f: impl FnOnce() -> T) -> T {
    IN_DOWNCALL.with(|c| c.set(c.get() + 1));
    let v = f();
    IN_DOWNCALL.with(|c| c.set(c.get() - 1));
    v
}

fn path(from: usize, to: usize, knob: PathKnob) -> IbPathRec {
    let (s, d) = (node_address(from), node_address(to));
    let mut p = IbPathRec {
        sgid: s.gid,
        dgid: d.gid,
        slid: Be16::new(s.lid),
        dlid: Be16::new(d.lid),
        hop_flow_raw: Be32::new(0),
        pkey: Be16::new(0xFFFF),
        mtu: 0x80 | 4,
        rate: 0x80 | 3,
        pkt_life: 0x80 | 10,
        ..IbPathRec::default()
    };
    if let PathKnob::Edited { field, value } = knob {
        let b = value as u8;
        match field % 10 {
            0 => p.dlid = Be16::new(value),
            1 => p.slid = Be16::new(value),
            2 => p.pkey = Be16::new(value),
            3 => p.mtu = b,
            4 => p.rate = b,
            5 => p.pkt_life = b,
            6 => p.sgid[usize::from(b % 16)] ^= (value >> 8) as u8 | 1,
            7 => p.dgid[usize::from(b % 16)] ^= (value >> 8) as u8 | 1,
            8 => p.hop_flow_raw = Be32::new(u32::from(value) << 8 | u32::from(b)),
            _ => p.qos_class_sl = Be16::new(value),
        }
    }
    p
}

fn pd(len: u8) -> (*const c_void, u8) {
    if len == 0 {
        (std::ptr::null(), 0)
    } else {
        (PD.as_ptr().cast(), len)
    }
}

/// Whether a status is one the functions document.
fn known(s: NtStatus) -> bool {
    [
        status::SUCCESS,
        status::UNSUCCESSFUL,
        status::INVALID_HANDLE,
        status::INVALID_PARAMETER,
        status::INSUFFICIENT_RESOURCES,
        status::NOT_SUPPORTED,
        status::INVALID_DEVICE_STATE,
        status::DEVICE_REMOVED,
        status::NO_MORE_ENTRIES,
        status::ADDRESS_ALREADY_EXISTS,
    ]
    .contains(&s)
}

impl State {
    fn new(tables: [IbaCmInterface; 2]) -> Self {
        Self {
            tables,
            recs: Vec::with_capacity(RECORDS),
            extra_refs: [0; 2],
            bogus: Box::new(IbaCmId {
                context: null_mut(),
                callback: None,
                cid: Be32(0),
            }),
        }
    }

    fn live_nth(&self, i: u8) -> Option<usize> {
        let n = self.recs.iter().filter(|r| r.live).count();
        if n == 0 {
            return None;
        }
        let want = usize::from(i) % n;
        self.recs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.live)
            .nth(want)
            .map(|(k, _)| k)
    }

    fn find(&self, p_id: *mut IbaCmId) -> Option<usize> {
        self.recs.iter().position(|r| r.live && r.p_id == p_id)
    }

    fn new_rec(&self, node: usize, p_id: *mut IbaCmId, cb: Cb, context: *mut c_void) -> Rec {
        Rec {
            node,
            p_id,
            live: true,
            ended: false,
            listening: false,
            service: 0,
            from_listen: None,
            sidr_request: false,
            qpn: 0x10_0000 + self.recs.len() as u32,
            peer_qpn: None,
            in_callback: false,
            cb,
            context,
            blind: cb == Cb::None,
            pulled: 0,
            sent: Sent::default(),
            got: [0; 16],
            reactions: [None; REACTIONS],
        }
    }

    /// The record of the id on node `node` whose QPN is `qpn`.
    fn by_qpn(&self, node: usize, qpn: u32) -> Option<&Rec> {
        self.recs.iter().find(|r| r.node == node && r.qpn == qpn)
    }
}

// ---- callbacks ---------------------------------------------------------------------------

unsafe extern "C" fn cb_main(p_id: *mut IbaCmId, p_event: *mut IbaCmEvent) -> NtStatus {
    callback(Cb::Main, p_id, p_event)
}

unsafe extern "C" fn cb_alt(p_id: *mut IbaCmId, p_event: *mut IbaCmEvent) -> NtStatus {
    callback(Cb::Alt, p_id, p_event)
}

/// What a callback does after its checks.
enum Then {
    Return(NtStatus),
    React(Reaction),
}

/// A callback: the checks, then the reaction armed on the id, if any. Allocates nothing
/// (it runs at DISPATCH_LEVEL, where the verifier counts every allocation).
fn callback(which: Cb, p_id: *mut IbaCmId, p_event: *mut IbaCmEvent) -> NtStatus {
    assert!(is_at_dispatch(), "a callback below DISPATCH_LEVEL");
    assert_eq!(locks_held(), 0, "a callback with an ibcm lock held");
    assert_eq!(
        IN_DOWNCALL.with(Cell::get),
        0,
        "a callback from inside a downcall"
    );
    assert!(!p_event.is_null(), "a callback without an event");
    // SAFETY: the CM passes an event valid for the callback's duration.
    let ev = unsafe { &*p_event };
    let (index, then) = with_state(|s| {
        let Some(index) = s.find(p_id) else {
            panic!("a callback for an id the client does not hold (destroyed or never got)");
        };
        let r = s.recs[index];
        assert!(!r.in_callback, "a callback re-entered for one id");
        assert_eq!(
            r.cb, which,
            "the callback called is not the one the id holds"
        );
        // SAFETY: a live id of the CM: its fields are readable (the client's own id).
        let context = unsafe { (&raw const (*p_id).context).read_volatile() };
        assert_eq!(context, r.context, "the id's context changed");
        let t = ev.event_type;
        assert!((0..16).contains(&t), "event type {t}");
        check_event(s, index, ev);
        let r = &mut s.recs[index];
        r.got[t as usize] += 1;
        r.in_callback = true;
        let then = match r.reactions.iter_mut().find_map(Option::take) {
            Some(reaction) => Then::React(reaction),
            None => Then::Return(status::SUCCESS),
        };
        (index, then)
    });
    let result = match then {
        Then::Return(s) => s,
        Then::React(Reaction::Nothing) => status::SUCCESS,
        Then::React(Reaction::Call(call)) => {
            perform(index, call, true, true);
            status::SUCCESS
        }
        Then::React(Reaction::Destroy) => {
            destroy(index);
            status::SUCCESS
        }
        Then::React(Reaction::Fail) => {
            let listen = with_state(|s| s.recs[index].listening);
            if !listen {
                // The CM destroys the id (al_cm.c:90-95): the client forgets it.
                end(index);
            }
            status::UNSUCCESSFUL
        }
        Then::React(Reaction::DestroyThenFail) => {
            destroy(index);
            status::UNSUCCESSFUL
        }
    };
    with_state(|s| s.recs[index].in_callback = false);
    result
}

/// The event checks of one callback.
fn check_event(s: &State, index: usize, ev: &IbaCmEvent) {
    let r = &s.recs[index];
    let t = ev.event_type;
    let answered = |n: u16, kinds: &[i32]| {
        let got: u16 = kinds.iter().map(|&k| r.got[k as usize]).sum();
        assert!(
            got < n,
            "event {t}: more answers ({}) than messages sent ({n})",
            got + 1
        );
    };
    match t {
        event_type::REQ_RECEIVED | event_type::SIDR_REQ_RECEIVED => {
            assert!(
                r.listening,
                "a request notification on an id that does not listen"
            );
            assert_eq!(
                t,
                event_type::REQ_RECEIVED,
                "a listen's notification is REQ_RECEIVED"
            );
            // SAFETY: the union's raw view covers every byte of the event data.
            let raw = unsafe { ev.data.raw };
            assert!(
                raw.iter().all(|&w| w == 0),
                "a listen's notification is zeroed"
            );
        }
        event_type::REP_RECEIVED => {
            answered(
                r.sent.req,
                &[event_type::REP_RECEIVED, event_type::REQ_ERROR],
            );
            // SAFETY: the REP member of a REP_RECEIVED event.
            let qpn = unsafe { ev.data.rep.rep.qpn }.get();
            let peer = s.by_qpn(1 - r.node, qpn);
            assert!(
                peer.is_some_and(|p| p.sent.rep > 0),
                "a REP naming QPN {qpn:#x}, which sent no REP"
            );
        }
        event_type::REQ_ERROR => {
            answered(
                r.sent.req,
                &[event_type::REP_RECEIVED, event_type::REQ_ERROR],
            );
        }
        event_type::RTU_RECEIVED | event_type::REP_ERROR => {
            answered(
                r.sent.rep,
                &[event_type::RTU_RECEIVED, event_type::REP_ERROR],
            );
            if t == event_type::RTU_RECEIVED {
                let peer = r.peer_qpn.and_then(|q| s.by_qpn(1 - r.node, q));
                assert!(
                    peer.is_none_or(|p| p.sent.rtu > 0),
                    "an RTU from an id that sent none"
                );
            }
        }
        event_type::DREP_RECEIVED | event_type::DREQ_ERROR => {
            answered(
                r.sent.dreq,
                &[event_type::DREP_RECEIVED, event_type::DREQ_ERROR],
            );
        }
        event_type::DREQ_RECEIVED => {
            assert!(
                r.sent.req > 0 || r.from_listen.is_some(),
                "a DREQ on an id never connected"
            );
            let peer = r.peer_qpn.and_then(|q| s.by_qpn(1 - r.node, q));
            assert!(
                peer.is_none_or(|p| p.sent.dreq > 0 || p.ended),
                "a DREQ from an id that sent none and lives"
            );
        }
        event_type::APR_RECEIVED | event_type::LAP_ERROR => {
            answered(
                r.sent.lap,
                &[event_type::APR_RECEIVED, event_type::LAP_ERROR],
            );
        }
        event_type::SIDR_REP_RECEIVED | event_type::SIDR_REQ_ERROR => {
            answered(
                r.sent.sidr,
                &[event_type::SIDR_REP_RECEIVED, event_type::SIDR_REQ_ERROR],
            );
        }
        event_type::MRA_RECEIVED => {
            assert!(
                r.sent.req + r.sent.rep + r.sent.lap > 0,
                "an MRA on an id that sent no REQ, REP or LAP"
            );
        }
        event_type::REJ_RECEIVED | event_type::LAP_RECEIVED => {
            assert!(
                r.sent.req > 0 || r.from_listen.is_some(),
                "event {t} on an id never in a connection"
            );
        }
        _ => unreachable!("checked 0..16"),
    }
}

// ---- calls -------------------------------------------------------------------------------

/// Forgets an id the CM destroyed.
fn end(index: usize) {
    with_state(|s| {
        let r = &mut s.recs[index];
        r.live = false;
        r.ended = true;
        r.listening = false;
    });
}

/// `destroy_id` of a held id (PASSIVE_LEVEL, or from its own callback).
fn destroy(index: usize) {
    let (table, p_id) = with_state(|s| (s.tables[s.recs[index].node], s.recs[index].p_id));
    let f = table.destroy_id.expect("destroy_id");
    // SAFETY: an id this client holds, destroyed once (the record is forgotten below).
    downcall(|| unsafe { f(p_id) });
    end(index);
}

/// `create_id` on `node`.
fn create(node: usize, cb: Cb, ctx: Ctx) -> Option<usize> {
    let (table, index) = with_state(|s| (s.tables[node], s.recs.len()));
    if index >= RECORDS {
        return None;
    }
    let context = ctx_ptr(ctx, index);
    let mut p: *mut IbaCmId = null_mut();
    let f = table.create_id.expect("create_id");
    // SAFETY: a valid out pointer; the callback is one of this file's `extern "C"` fns.
    let st = downcall(|| unsafe { f(cb_fn(cb), context, &raw mut p) });
    assert!(known(st), "create_id: status {st:#x}");
    if st != status::SUCCESS {
        assert_eq!(st, status::INSUFFICIENT_RESOURCES, "create_id");
        return None;
    }
    assert!(!p.is_null(), "create_id succeeded without an id");
    with_state(|s| {
        assert!(s.find(p).is_none(), "create_id gave out an id already held");
        let rec = s.new_rec(node, p, cb, context);
        s.recs.push(rec);
    });
    Some(index)
}

/// Runs one call on record `index` (or on the bogus pointer if `None`). `dispatch`: at
/// DISPATCH_LEVEL (always inside a callback: `nested`).
fn perform_on(index: Option<usize>, node: usize, call: Call, dispatch: bool, nested: bool) {
    if index.is_some_and(|i| !with_state(|s| s.recs[i].live)) {
        // Destroyed meanwhile (from a callback): the client no longer holds it.
        return;
    }
    let (table, p_id, rec) = with_state(|s| match index {
        Some(i) => (s.tables[s.recs[i].node], s.recs[i].p_id, Some(s.recs[i])),
        None => (s.tables[node], &raw mut *s.bogus, None),
    });
    let node = rec.map_or(node, |r| r.node);
    let at_dispatch_level = nested || dispatch;
    let run = |f: &mut dyn FnMut() -> NtStatus| -> NtStatus {
        if at_dispatch_level && !is_at_dispatch() {
            let ledger = with_world_ledger(node);
            at_dispatch(&ledger, || downcall(&mut *f))
        } else {
            downcall(f)
        }
    };
    let qpn = rec.map_or(0x42, |r| r.qpn);
    let st: NtStatus = match call {
        Call::Listen { sid, compare } => {
            let service = SERVICES[usize::from(sid) % SERVICES.len()];
            let mut buf = [0u8; 64];
            let (p, len, off) = match compare {
                None => (null_mut(), 0, 0),
                Some(c) => {
                    let off = usize::from(c.offset % 96);
                    for (i, b) in buf.iter_mut().enumerate() {
                        *b = if c.matching {
                            PD.get(off + i).copied().unwrap_or(0)
                        } else {
                            c.bytes[i % 8]
                        };
                    }
                    (buf.as_mut_ptr().cast(), c.len % 65, c.offset)
                }
            };
            let f = table.listen.expect("listen");
            // SAFETY: a buffer of 64 bytes, `len` <= 64.
            let st = run(&mut || unsafe { f(p_id, Be64::new(service), p, len, off) });
            if st == status::SUCCESS
                && let Some(i) = index
            {
                with_state(|s| {
                    let r = &mut s.recs[i];
                    r.listening = true;
                    r.service = service;
                });
            }
            st
        }
        Call::CancelListen => {
            let f = table.cancel_listen.expect("cancel_listen");
            // SAFETY: an id of this client (or a pointer that is none).
            let st = run(&mut || unsafe { f(p_id) });
            if st == status::SUCCESS
                && let Some(i) = index
            {
                with_state(|s| s.recs[i].listening = false);
            }
            st
        }
        Call::GetRequest { ex } => get_request(index, table, p_id, ex, &run),
        Call::SendReq {
            sid,
            knobs,
            alt,
            qp_type,
            pdata,
            path: knob,
        } => {
            let primary = path(node, 1 - node, knob);
            let alternate = path(node, 1 - node, PathKnob::Good);
            let (p, len) = pd(pdata);
            let mut req = IbaCmReq {
                service_id: Be64::new(SERVICES[usize::from(sid) % SERVICES.len()]),
                p_primary_path: (&raw const primary).cast_mut(),
                p_alt_path: if alt {
                    (&raw const alternate).cast_mut()
                } else {
                    null_mut()
                },
                qpn: Be32::new(qpn),
                qp_type: match qp_type % 4 {
                    0 | 1 => 0,
                    2 => 1,
                    _ => i32::from(qp_type),
                },
                starting_psn: Be32::new(u32::from_le_bytes([knobs[0], knobs[1], 7, 9])),
                p_pdata: p,
                pdata_len: len,
                max_cm_retries: knobs[2] % 16,
                resp_res: knobs[3] % 8,
                init_depth: knobs[4] % 8,
                remote_resp_timeout: knobs[5] % 32,
                flow_ctrl: knobs[6] & 1,
                local_resp_timeout: knobs[6] >> 3,
                rnr_retry_cnt: knobs[7] & 7,
                retry_cnt: knobs[7] >> 5,
                srq: knobs[6] >> 7 & 1,
            };
            let f = table.send_req.expect("send_req");
            // SAFETY: the request and what it points to live for the call.
            let st = run(&mut || unsafe { f(p_id, &raw mut req) });
            sent(index, st, |s| s.req += 1);
            st
        }
        Call::SendRep { knobs, pdata } | Call::FormatRep { knobs, pdata, .. } => {
            let (p, len) = pd(pdata);
            let mut rep = IbaCmRep {
                qpn: Be32::new(qpn),
                starting_psn: Be32::new(u32::from(knobs[0]) << 8 | 5),
                p_pdata: p,
                pdata_len: len,
                failover_accepted: knobs[1] % 4,
                resp_res: knobs[2] % 8,
                init_depth: knobs[3] % 8,
                flow_ctrl: knobs[4] & 1,
                rnr_retry_cnt: knobs[4] >> 5,
                srq: knobs[5] & 1,
            };
            if let Call::FormatRep { init, .. } = call {
                let mut m = IbQpMod::zeroed();
                let p_init: *mut IbQpMod = if init { &raw mut m } else { null_mut() };
                let f = table.format_rep.expect("format_rep");
                // SAFETY: the REP, its private data and the INIT output live for the call.
                run(&mut || unsafe { f(p_id, &raw mut rep, p_init) })
            } else {
                let f = table.send_rep.expect("send_rep");
                // SAFETY: the REP and its private data live for the call.
                let st = run(&mut || unsafe { f(p_id, &raw mut rep) });
                sent(index, st, |s| s.rep += 1);
                st
            }
        }
        Call::SendFormattedRep => {
            let f = table.send_formatted_rep.expect("send_formatted_rep");
            // SAFETY: an id of this client (or a pointer that is none).
            let st = run(&mut || unsafe { f(p_id) });
            sent(index, st, |s| s.rep += 1);
            st
        }
        Call::SendRtu { pdata } | Call::SendDreq { pdata } | Call::SendDrep { pdata } => {
            let (p, len) = pd(pdata);
            let f = match call {
                Call::SendRtu { .. } => table.send_rtu,
                Call::SendDreq { .. } => table.send_dreq,
                _ => table.send_drep,
            }
            .expect("send_rtu/dreq/drep");
            // SAFETY: the private data lives for the call.
            let st = run(&mut || unsafe { f(p_id, p, len) });
            match call {
                Call::SendRtu { .. } => sent(index, st, |s| s.rtu += 1),
                Call::SendDreq { .. } => sent(index, st, |s| s.dreq += 1),
                _ => {}
            }
            st
        }
        Call::SendRej { reason, ari, pdata } => {
            let (a, alen) = pd(ari);
            let (p, len) = pd(pdata);
            let f = table.send_rej.expect("send_rej");
            // SAFETY: the ARI and private data live for the call.
            run(&mut || unsafe { f(p_id, Be16::new(reason % 40), a, alen, p, len) })
        }
        Call::SendMra { timeout, pdata } => {
            let (p, len) = pd(pdata);
            let f = table.send_mra.expect("send_mra");
            // SAFETY: the private data lives for the call.
            run(&mut || unsafe { f(p_id, timeout, p, len) })
        }
        Call::SendLap { pdata, path: knob } => {
            let mut alt = path(node, 1 - node, knob);
            let (p, len) = pd(pdata);
            let mut lap = IbaCmLap {
                p_alt_path: &raw mut alt,
                p_pdata: p.cast_mut(),
                pdata_len: len,
                remote_resp_timeout: 16,
            };
            let f = table.send_lap.expect("send_lap");
            // SAFETY: the LAP and what it points to live for the call.
            let st = run(&mut || unsafe { f(p_id, &raw mut lap) });
            sent(index, st, |s| s.lap += 1);
            st
        }
        Call::SendApr {
            status: code,
            info,
            pdata,
        } => {
            let (i, ilen) = pd(info);
            let (p, len) = pd(pdata);
            let mut apr = IbaCmApr {
                p_pdata: p.cast_mut(),
                p_info: i.cast_mut(),
                pdata_len: len,
                info_length: ilen,
                status: code % 16,
            };
            let f = table.send_apr.expect("send_apr");
            // SAFETY: the APR and what it points to live for the call.
            run(&mut || unsafe { f(p_id, &raw mut apr) })
        }
        Call::SendSidrReq {
            sid,
            timeout_ms,
            retries,
            pdata,
            path: knob,
        } => {
            let mut route = path(node, 1 - node, knob);
            let (p, len) = pd(pdata);
            let mut req = IbaCmSidrReq {
                service_id: Be64::new(SERVICES[usize::from(sid) % SERVICES.len()]),
                p_path: &raw mut route,
                p_pdata: p.cast_mut(),
                pdata_len: len,
                max_cm_retries: retries % 16,
                timeout: u32::from(timeout_ms),
            };
            let f = table.send_sidr_req.expect("send_sidr_req");
            // SAFETY: the request and what it points to live for the call.
            let st = run(&mut || unsafe { f(p_id, &raw mut req) });
            sent(index, st, |s| s.sidr += 1);
            st
        }
        Call::SendSidrRep {
            status: code,
            qkey,
            info,
            pdata,
        } => {
            let (i, ilen) = pd(info);
            let (p, len) = pd(pdata);
            let mut rep = IbaCmSidrRep {
                qpn: Be32::new(qpn),
                qkey: Be32::new(qkey),
                p_pdata: p.cast_mut(),
                p_info: i.cast_mut(),
                pdata_len: len,
                info_len: ilen,
                status: code % 8,
            };
            let f = table.send_sidr_rep.expect("send_sidr_rep");
            // SAFETY: the reply and what it points to live for the call.
            run(&mut || unsafe { f(p_id, &raw mut rep) })
        }
        Call::GetQpAttr { state } => {
            let s = match state % 5 {
                0 => qp_state::INIT,
                1 => qp_state::RTR,
                2 => qp_state::RTS,
                3 => qp_state::RESET,
                _ => u32::from(state),
            };
            let mut m = IbQpMod::zeroed();
            let f = table.get_qp_attr.expect("get_qp_attr");
            // SAFETY: the output lives for the call.
            run(&mut || unsafe { f(p_id, s, &raw mut m) })
        }
        Call::Migrate | Call::Established => {
            let f = match call {
                Call::Migrate => table.migrate,
                _ => table.established,
            }
            .expect("migrate/established");
            // SAFETY: an id of this client (or a pointer that is none).
            run(&mut || unsafe { f(p_id) })
        }
        Call::SetCallback(cb) => {
            if let Some(i) = index {
                with_state(|s| {
                    let r = &mut s.recs[i];
                    r.cb = cb;
                    r.blind |= cb == Cb::None;
                });
                // SAFETY: the client writes its own id's callback (the header's contract:
                // read afresh at every delivery).
                unsafe { (&raw mut (*p_id).callback).write_volatile(cb_fn(cb)) };
            }
            status::SUCCESS
        }
        Call::SetContext(ctx) => {
            if let Some(i) = index {
                let c = ctx_ptr(ctx, i);
                with_state(|s| s.recs[i].context = c);
                // SAFETY: the client writes its own id's context.
                unsafe { (&raw mut (*p_id).context).write_volatile(c) };
            }
            status::SUCCESS
        }
    };
    // Not from a callback: printing allocates, which DISPATCH_LEVEL forbids.
    if trace() && !nested {
        let v = with_world_ledger(node).violations();
        eprintln!(
            "iba_cm:   {call:?} on {index:?} (nested {nested}, dispatch {at_dispatch_level}): {st:#x} {v:?}"
        );
    }
    assert!(known(st), "{call:?}: status {st:#x}");
    if index.is_none() && !matches!(call, Call::SetCallback(_) | Call::SetContext(_)) {
        // The arguments are checked first (STATUS_INVALID_PARAMETER), then the id.
        assert!(
            st == status::INVALID_HANDLE || st == status::INVALID_PARAMETER,
            "{call:?} on a pointer that is no id: {st:#x}"
        );
    }
}

fn perform(index: usize, call: Call, dispatch: bool, nested: bool) {
    perform_on(Some(index), 0, call, dispatch, nested);
}

/// Counts a message a successful call sent.
fn sent(index: Option<usize>, st: NtStatus, f: impl FnOnce(&mut Sent)) {
    if st == status::SUCCESS
        && let Some(i) = index
    {
        with_state(|s| f(&mut s.recs[i].sent));
    }
}

fn get_request(
    index: Option<usize>,
    table: IbaCmInterface,
    p_listen: *mut IbaCmId,
    ex: Option<(Cb, Ctx)>,
    run: &dyn Fn(&mut dyn FnMut() -> NtStatus) -> NtStatus,
) -> NtStatus {
    let (room, new_index, listen) = with_state(|s| {
        (
            s.recs.len() < RECORDS,
            s.recs.len(),
            index.map(|i| s.recs[i]),
        )
    });
    if !room {
        // The harness could not hold the id: do not take it.
        return status::SUCCESS;
    }
    let mut p: *mut IbaCmId = null_mut();
    let mut ev = IbaCmEvent::zeroed(-1);
    let st = match ex {
        None => {
            let f = table.get_request.expect("get_request");
            // SAFETY: valid out pointers.
            run(&mut || unsafe { f(p_listen, &raw mut p, &raw mut ev) })
        }
        Some((cb, ctx)) => {
            let context = ctx_ptr(ctx, new_index);
            let f = table.get_request_ex.expect("get_request_ex");
            // SAFETY: valid out pointers; the callback is one of this file's.
            run(&mut || unsafe { f(p_listen, cb_fn(cb), context, &raw mut p, &raw mut ev) })
        }
    };
    if st != status::SUCCESS {
        return st;
    }
    let Some(l) = listen else {
        panic!("get_request on a pointer that is no id succeeded");
    };
    assert!(!p.is_null(), "get_request succeeded without an id");
    let (cb, context) = match ex {
        None => (l.cb, p_listen.cast()),
        Some((cb, ctx)) => (cb, ctx_ptr(ctx, new_index)),
    };
    // SAFETY: the id get_request just gave this client.
    let (got_cb, got_ctx) = unsafe {
        (
            (&raw const (*p).callback).read_volatile(),
            (&raw const (*p).context).read_volatile(),
        )
    };
    assert_eq!(got_ctx, context, "get_request: the new id's context");
    assert_eq!(
        got_cb.map(|f| f as usize),
        cb_fn(cb).map(|f| f as usize),
        "get_request: the new id's callback"
    );
    let t = ev.event_type;
    let (service, peer_qpn) = match t {
        // SAFETY: the REQ member of a REQ_RECEIVED event.
        event_type::REQ_RECEIVED => unsafe {
            (ev.data.req.service_id.get(), Some(ev.data.req.qpn.get()))
        },
        // SAFETY: the SIDR_REQ member of a SIDR_REQ_RECEIVED event.
        event_type::SIDR_REQ_RECEIVED => unsafe {
            (ev.data.sidr_req.sidr_req.service_id.get(), None)
        },
        _ => panic!("get_request: event type {t}"),
    };
    assert!(
        l.listening,
        "get_request succeeded on an id that does not listen"
    );
    assert_eq!(
        service, l.service,
        "get_request: a request for another service"
    );
    with_state(|s| {
        assert!(
            s.find(p).is_none(),
            "get_request gave out an id already held"
        );
        let li = index.expect("a listen");
        let lr = &mut s.recs[li];
        lr.pulled += 1;
        let notified = u32::from(lr.got[event_type::REQ_RECEIVED as usize]);
        assert!(
            lr.blind || lr.pulled <= notified,
            "more requests pulled ({}) than notified ({notified})",
            lr.pulled,
        );
        let mut rec = s.new_rec(l.node, p, cb, context);
        rec.from_listen = Some(li);
        rec.sidr_request = t == event_type::SIDR_REQ_RECEIVED;
        rec.peer_qpn = peer_qpn;
        s.recs.push(rec);
    });
    st
}

thread_local! {
    /// The ledgers of the current world's nodes (for calls at DISPATCH_LEVEL).
    static LEDGERS: RefCell<Vec<Arc<ibcm_host::verifier::Ledger>>> = const { RefCell::new(Vec::new()) };
}

fn with_world_ledger(node: usize) -> Arc<ibcm_host::verifier::Ledger> {
    LEDGERS.with(|l| Arc::clone(&l.borrow()[node]))
}

// ---- the sequence ------------------------------------------------------------------------

struct Harness {
    world: World,
}

impl Harness {
    fn apply(&mut self, op: Op) {
        if trace() {
            eprintln!("iba_cm: {op:?}");
        }
        match op {
            Op::Create { node, cb, ctx } => {
                create(usize::from(node), cb, ctx);
            }
            Op::Call {
                target,
                call,
                dispatch,
            } => match target {
                Target::Live(i) => {
                    if let Some(index) = with_state(|s| s.live_nth(i)) {
                        perform(index, call, dispatch, false);
                    }
                }
                Target::Bogus => perform_on(None, usize::from(dispatch), call, dispatch, false),
            },
            Op::Destroy(i) => {
                if let Some(index) = with_state(|s| s.live_nth(i)) {
                    destroy(index);
                }
            }
            Op::Arm { target, reactions } => with_state(|s| {
                if let Some(index) = s.live_nth(target) {
                    let slots = &mut s.recs[index].reactions;
                    for r in reactions {
                        if let Some(slot) = slots.iter_mut().find(|x| x.is_none()) {
                            *slot = Some(r);
                        }
                    }
                }
            }),
            Op::Deliver(node) => self.world.deliver(usize::from(node)),
            Op::Step => {
                self.world.deliver_all();
                self.world.fabric.step();
                self.world.deliver_all();
            }
            Op::Run(k) => {
                // Up to 2^36 ns (about 69 s): past CM timeouts and timewait.
                self.world.run(1u64 << (k % 37));
            }
            Op::Reference { node, take } => {
                let n = usize::from(node);
                let (reference, dereference, ctx) = self.world.refs[n];
                let held = with_state(|s| s.extra_refs[n]);
                if take {
                    // SAFETY: the interface's own function and context.
                    unsafe { reference(ctx) };
                    with_state(|s| s.extra_refs[n] += 1);
                } else if held > 0 {
                    // SAFETY: drops a reference this harness took.
                    unsafe { dereference(ctx) };
                    with_state(|s| s.extra_refs[n] -= 1);
                }
                assert_eq!(
                    self.world.cm(n).references(),
                    1 + with_state(|s| s.extra_refs[n])
                );
            }
            Op::Scenario {
                node,
                sid,
                stage,
                twist,
            } => self.scenario(usize::from(node), sid, stage, twist),
        }
        self.world.check_rules("after an operation");
    }

    /// A listen on the other node, a connection from `node` carried to `stage`.
    fn scenario(&mut self, node: usize, sid: u8, stage: u8, twist: u8) {
        const SETTLE: u64 = 1 << 22;
        let other = 1 - node;
        let sid = sid % 2;
        let Some(listen) = create(other, Cb::Main, Ctx::Record) else {
            return;
        };
        perform(listen, Call::Listen { sid, compare: None }, true, false);
        let Some(a) = create(node, Cb::Main, Ctx::Record) else {
            return;
        };
        if twist & 1 != 0 {
            let call = Call::SendSidrReq {
                sid,
                timeout_ms: 100,
                retries: 2,
                pdata: 0,
                path: PathKnob::Good,
            };
            perform(a, call, true, false);
            self.world.run(SETTLE);
            let before = with_state(|s| s.recs.len());
            perform(listen, Call::GetRequest { ex: None }, true, false);
            if stage % 2 == 1 && with_state(|s| s.recs.len()) > before {
                let call = Call::SendSidrRep {
                    status: 0,
                    qkey: 0x1111,
                    info: 0,
                    pdata: 0,
                };
                perform(before, call, true, false);
                self.world.run(SETTLE);
            }
            return;
        }
        let req = Call::SendReq {
            sid,
            knobs: [1, 2, 3, 2, 2, 16, 0x80, 0x27],
            alt: twist & 2 != 0,
            qp_type: 0,
            pdata: 0,
            path: PathKnob::Good,
        };
        perform(a, req, true, false);
        self.world.run(SETTLE);
        let before = with_state(|s| s.recs.len());
        perform(listen, Call::GetRequest { ex: None }, true, false);
        if with_state(|s| s.recs.len()) == before {
            return;
        }
        let p = before;
        let stage = stage % 8;
        if stage == 0 {
            return;
        }
        if twist & 4 != 0 {
            perform(
                p,
                Call::SendMra {
                    timeout: 20,
                    pdata: 0,
                },
                true,
                false,
            );
        }
        if stage == 1 {
            perform(
                p,
                Call::SendRej {
                    reason: 28,
                    ari: 0,
                    pdata: 0,
                },
                true,
                false,
            );
            self.world.run(SETTLE);
            return;
        }
        let knobs = [9, 0, 2, 2, 0x20, 0];
        if twist & 8 != 0 {
            let call = Call::FormatRep {
                knobs,
                pdata: 0,
                init: true,
            };
            perform(p, call, true, false);
            perform(p, Call::SendFormattedRep, true, false);
        } else {
            perform(p, Call::SendRep { knobs, pdata: 0 }, true, false);
        }
        self.world.run(SETTLE);
        if stage == 2 {
            return;
        }
        perform(a, Call::SendRtu { pdata: 0 }, true, false);
        self.world.run(SETTLE);
        if stage == 3 {
            return;
        }
        if stage == 4 {
            let lap = Call::SendLap {
                pdata: 0,
                path: PathKnob::Good,
            };
            perform(a, lap, true, false);
            self.world.run(SETTLE);
            let apr = Call::SendApr {
                status: 0,
                info: 0,
                pdata: 0,
            };
            perform(p, apr, true, false);
            self.world.run(SETTLE);
            return;
        }
        let (from, to) = if twist & 16 != 0 { (p, a) } else { (a, p) };
        perform(from, Call::SendDreq { pdata: 0 }, true, false);
        self.world.run(SETTLE);
        if stage == 5 {
            return;
        }
        perform(to, Call::SendDrep { pdata: 0 }, false, false);
        self.world.run(SETTLE);
    }

    /// Destroys every id still held, runs the fabric dry, checks that nothing is left.
    fn finish(&mut self) {
        loop {
            let next = with_state(|s| s.recs.iter().rposition(|r| r.live));
            let Some(index) = next else { break };
            destroy(index);
        }
        let extra = with_state(|s| std::mem::take(&mut s.extra_refs));
        for (n, k) in extra.into_iter().enumerate() {
            let (_, dereference, ctx) = self.world.refs[n];
            for _ in 0..k {
                // SAFETY: drops the references this harness took.
                unsafe { dereference(ctx) };
            }
        }
        self.world.check_rules("after every id was destroyed");
        let mut steps = 0u32;
        loop {
            self.world.deliver_all();
            if !self.world.fabric.step() {
                break;
            }
            steps += 1;
            assert!(steps < 1_000_000, "the fabric never goes quiet");
        }
        self.world.deliver_all();
        with_state(|s| {
            assert!(
                s.recs.iter().all(|r| !r.in_callback),
                "a callback never returned"
            );
        });
        self.world.quiescent();
    }
}

// ---- reuse and replay --------------------------------------------------------------------

/// Inputs one world serves before a new one replaces it (`IBCM_FUZZ_FRESH=1`: one).
const WORLD_USES: usize = 128;
/// A world whose clock passed this is replaced.
const CLOCK_LIMIT_NS: u64 = 1 << 56;
/// Operations run per input; the rest of a longer input is ignored (as for `ioctl`:
/// depth comes from the corpus and the scenarios).
const MAX_OPS: usize = 24;

/// The inputs the current world served, this one included: the first `len` of `inputs`,
/// whose buffers are kept for the next world's (memory kept from one input to the next is
/// allocated once, so that libFuzzer's leak check does not run after every input).
#[derive(Default)]
struct History {
    inputs: Vec<Vec<u8>>,
    len: usize,
}

impl History {
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
    static WORLD: RefCell<Option<(World, usize)>> = const { RefCell::new(None) };
    static HISTORY: RefCell<History> = RefCell::new(History::default());
}

fn uses() -> usize {
    static USES: OnceLock<usize> = OnceLock::new();
    *USES.get_or_init(|| {
        if std::env::var_os("IBCM_FUZZ_FRESH").is_some_and(|v| v == "1") {
            1
        } else {
            WORLD_USES
        }
    })
}

/// `IBA_CM_FUZZ_TRACE=1`: print every operation.
fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("IBA_CM_FUZZ_TRACE").is_some())
}

fn max_ops() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("IBCM_FUZZ_MAX_OPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MAX_OPS)
    })
}

/// On a failure, writes the inputs the world served before the failing one.
fn install_history_hook() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = HISTORY.try_with(|h| {
                let Ok(h) = h.try_borrow() else { return };
                let h = &h.inputs[..h.len];
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
                    "iba_cm: this input ran on a world that served {earlier} input(s) before it; \
                     replay them first: iba_cm {} <crash file> (or IBCM_FUZZ_FRESH=1)",
                    names.join(" ")
                );
            });
            previous(info);
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    install_history_hook();
    let reused = WORLD.with(|w| w.borrow_mut().take());
    let (world, served) = match reused {
        Some((w, served)) if served < uses() && w.fabric.now().as_nanos() < CLOCK_LIMIT_NS => {
            (w, served)
        }
        old => {
            drop(old);
            HISTORY.with(|h| h.borrow_mut().len = 0);
            (World::new(), 0)
        }
    };
    HISTORY.with(|h| h.borrow_mut().push(data));
    LEDGERS.with(|l| {
        let mut l = l.borrow_mut();
        l.clear();
        for n in &world.fabric.nodes {
            l.push(Arc::clone(&n.platform.ledger));
        }
    });
    STATE.with(|s| *s.borrow_mut() = Some(State::new(world.tables)));
    let mut h = Harness { world };
    let mut u = Unstructured::new(data);
    for _ in 0..max_ops() {
        if u.is_empty() {
            break;
        }
        let Ok(op) = Op::arbitrary(&mut u) else { break };
        h.apply(op);
    }
    h.finish();
    STATE.with(|s| *s.borrow_mut() = None);
    WORLD.with(|w| *w.borrow_mut() = Some((h.world, served + 1)));
});
