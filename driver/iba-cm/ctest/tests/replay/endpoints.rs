//! The replays of WinVerbs (`c/winverbs.c`) and ndfltr (`c/ndfltr.c`) as safe Rust
//! endpoints over any `iba_cm` table: the test's CM on the simulated fabric
//! (`driver/iba-cm/ctest`) or the KMDF binding in the simulated Windows kernel
//! (`tests/kmdf-check/scenarios`). What runs a callback "at DISPATCH_LEVEL" is the
//! [`Host`]'s hooks: each test harness brings its own.

#![allow(dead_code)]

use std::ffi::c_void;
use std::sync::Arc;

use ibcm_host::verifier::{Ledger, at_dispatch, is_at_dispatch};
use ibcm_iba_cm::abi::{
    IbPathRec, IbQpMod, IbQpRtr, IbQpRts, IbaCmReqEvent, InfinibandInterfaceCm, NtStatus,
};

/// `replay_host` (c/replay.h).
#[repr(C)]
struct ReplayHost {
    ctx: *const c_void,
    is_dispatch: extern "C" fn(*const c_void) -> i32,
    at_dispatch: extern "C" fn(*const c_void, extern "C" fn(*mut c_void), *mut c_void),
}

/// `is_dispatch` of replay.h: whether the calling thread runs at DISPATCH_LEVEL.
pub type IsDispatch = extern "C" fn(*const c_void) -> i32;
/// `at_dispatch` of replay.h: runs `fn(arg)` at DISPATCH_LEVEL on the calling thread.
pub type AtDispatch = extern "C" fn(*const c_void, extern "C" fn(*mut c_void), *mut c_void);

/// What one side's replayed endpoints call: its `iba_cm` table and its IRQL hooks.
pub struct Host {
    raw: Box<ReplayHost>,
    /// What the hooks' context points into, kept alive as long as the host.
    _context: Box<dyn Send + Sync>,
    ifc: *const InfinibandInterfaceCm,
}

// SAFETY: the table and the interface it points to are written once, before any thread
// sees the host, and only read afterwards; the hooks' context is thread-safe.
unsafe impl Send for Host {}
// SAFETY: as above.
unsafe impl Sync for Host {}

extern "C" fn ledger_is_dispatch(_: *const c_void) -> i32 {
    i32::from(is_at_dispatch())
}

extern "C" fn ledger_at_dispatch(
    ledger: *const c_void,
    f: extern "C" fn(*mut c_void),
    arg: *mut c_void,
) {
    // SAFETY: the ledger `Host::on_ledger` was given, kept alive by the host.
    let ledger = unsafe { &*ledger.cast::<Ledger>() };
    at_dispatch(ledger, || f(arg));
}

extern "C" fn run_boxed(arg: *mut c_void) {
    // SAFETY: `Host::at_dispatch` passes its closure slot, live for the call.
    let f = unsafe { &mut *arg.cast::<Option<Box<dyn FnOnce() + '_>>>() };
    if let Some(f) = f.take() {
        f();
    }
}

impl Host {
    /// A host over the table `ifc` (kept alive by the caller for the host's life), with
    /// the IRQL hooks and their context (`ctx` points into `context`).
    pub fn from_hooks(
        ifc: *const InfinibandInterfaceCm,
        ctx: *const c_void,
        is_dispatch: IsDispatch,
        at_dispatch: AtDispatch,
        context: Box<dyn Send + Sync>,
    ) -> Self {
        Self {
            raw: Box::new(ReplayHost {
                ctx,
                is_dispatch,
                at_dispatch,
            }),
            _context: context,
            ifc,
        }
    }

    /// A host over `ifc` on a driver/host node: its verifier ledger says what IRQL a
    /// thread runs at, and `at_dispatch` raises through it.
    pub fn on_ledger(ifc: *const InfinibandInterfaceCm, ledger: Arc<Ledger>) -> Self {
        let ctx: *const c_void = Arc::as_ptr(&ledger).cast();
        Self::from_hooks(
            ifc,
            ctx,
            ledger_is_dispatch,
            ledger_at_dispatch,
            Box::new(ledger),
        )
    }

    fn ptr(&self) -> *const ReplayHost {
        &raw const *self.raw
    }

    /// Runs `f` at DISPATCH_LEVEL through the host's hook.
    fn at_dispatch<R>(&self, f: impl FnOnce() -> R) -> R {
        let mut result = None;
        {
            let mut slot: Option<Box<dyn FnOnce() + '_>> = Some(Box::new(|| result = Some(f())));
            (self.raw.at_dispatch)(self.raw.ctx, run_boxed, (&raw mut slot).cast());
        }
        result.expect("the hook ran the function")
    }

    /// `destroy_id` on a pointer the test kept (stale or not), at PASSIVE_LEVEL.
    pub fn raw_destroy_id(&self, id: *mut c_void) {
        // SAFETY: the side's interface; the pointer is only compared by the CM.
        unsafe { raw_destroy_id(self.ifc, id) }
    }

    /// `send_mra` with private data on an id pointer, at DISPATCH_LEVEL.
    pub fn raw_send_mra(&self, id: *mut c_void, timeout: u8, pdata: &[u8]) -> NtStatus {
        self.at_dispatch(|| {
            // SAFETY: as above; `pdata` outlives the call.
            unsafe { raw_send_mra(self.ifc, id, timeout, pdata.as_ptr(), pdata.len() as u8) }
        })
    }

    /// `send_dreq` on an id pointer, at DISPATCH_LEVEL.
    pub fn raw_send_dreq(&self, id: *mut c_void) -> NtStatus {
        // SAFETY: as above.
        self.at_dispatch(|| unsafe { raw_send_dreq(self.ifc, id) })
    }
}

/// The provider's QP: what it handed to its CA's modify-QP.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FakeQp {
    pub qpn: u32,
    pub srq: i32,
    pub modified: u32,
    pub init: IbQpMod,
    pub rtr: IbQpMod,
    pub rts: IbQpMod,
    pub errored: i32,
}

impl FakeQp {
    pub fn new(qpn: u32) -> Box<Self> {
        Box::new(Self {
            qpn,
            srq: 0,
            modified: 0,
            init: IbQpMod::zeroed(),
            rtr: IbQpMod::zeroed(),
            rts: IbQpMod::zeroed(),
            errored: 0,
        })
    }

    /// The RTR attributes it was given.
    pub fn rtr(&self) -> IbQpRtr {
        // SAFETY: the RTR member, the one an RTR transition fills (all-integer fields).
        unsafe { self.rtr.state.rtr }
    }

    /// The RTS attributes it was given.
    pub fn rts(&self) -> IbQpRts {
        // SAFETY: the RTS member, as above.
        unsafe { self.rts.state.rts }
    }
}

/// One event a replayed callback saw.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    pub event_type: i32,
    pub qpn: u32,
    pub starting_psn: u32,
    pub rej_reason: u16,
    pub at_dispatch: u8,
    pub pdata_len: u8,
    pub pdata0: u8,
    pub pdata_last: u8,
    pub resp_res: u8,
    pub init_depth: u8,
    pub flow_ctrl: u8,
    pub rnr_retry_cnt: u8,
    pub target_ack_delay: u8,
    pub failover_accepted: u8,
    pub service_timeout: u8,
    pub reserved: [u8; 3],
}

#[repr(C)]
struct RawWv {
    _private: [u8; 0],
}

#[repr(C)]
struct RawNd {
    _private: [u8; 0],
}

/// WinVerbs' `WV_IO_CONNECT_PARAM` as the CM sees it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct WvParam {
    pub data: [u8; 56],
    pub data_length: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
}

impl WvParam {
    pub fn new(data: &[u8], rr: u8, id: u8, retry: u8, rnr: u8) -> Self {
        let mut d = [0u8; 56];
        d[..data.len()].copy_from_slice(data);
        Self {
            data: d,
            data_length: data.len() as u8,
            responder_resources: rr,
            initiator_depth: id,
            retry_count: retry,
            rnr_retry_count: rnr,
        }
    }
}

/// What ndfltr's NDFLTR_CONNECT / NDFLTR_ACCEPT carry to the CM.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NdParam {
    pub data: [u8; 56],
    pub data_length: u8,
    pub inbound: u8,
    pub outbound: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub rnr_nak_timeout: u8,
}

impl NdParam {
    pub fn new(data: &[u8], inbound: u8, outbound: u8, retry: u8, rnr: u8) -> Self {
        let mut d = [0u8; 56];
        d[..data.len()].copy_from_slice(data);
        Self {
            data: d,
            data_length: data.len() as u8,
            inbound,
            outbound,
            retry_count: retry,
            rnr_retry_count: rnr,
            rnr_nak_timeout: 12,
        }
    }
}

unsafe extern "C" {
    fn raw_destroy_id(ifc: *const InfinibandInterfaceCm, id: *mut c_void);
    fn raw_send_mra(
        ifc: *const InfinibandInterfaceCm,
        id: *mut c_void,
        timeout: u8,
        p: *const u8,
        len: u8,
    ) -> NtStatus;
    fn raw_send_dreq(ifc: *const InfinibandInterfaceCm, id: *mut c_void) -> NtStatus;

    fn wv_ep_new(ifc: *const InfinibandInterfaceCm, host: *const ReplayHost, t: u16) -> *mut RawWv;
    fn wv_ep_release_memory(ep: *mut RawWv);
    fn wv_ep_bind(ep: *mut RawWv, ip: u32, port: u16) -> NtStatus;
    fn wv_ep_set_route(ep: *mut RawWv, route: *const IbPathRec) -> NtStatus;
    fn wv_ep_connect(
        ep: *mut RawWv,
        qp: *const FakeQp,
        peer_ip: u32,
        peer_port: u16,
        param: *const WvParam,
        psn: u32,
    ) -> NtStatus;
    fn wv_ep_accept(ep: *mut RawWv, qp: *mut FakeQp, param: *const WvParam, psn: u32) -> NtStatus;
    fn wv_ep_reject(ep: *mut RawWv, data: *const u8, len: u8) -> NtStatus;
    fn wv_ep_disconnect(ep: *mut RawWv) -> NtStatus;
    fn wv_ep_listen(ep: *mut RawWv, backlog: i32) -> NtStatus;
    fn wv_ep_get_request(listen: *mut RawWv, ep: *mut RawWv) -> NtStatus;
    fn wv_ep_free(ep: *mut RawWv);
    fn wv_ep_state(ep: *const RawWv) -> i32;
    fn wv_ep_id(ep: *const RawWv) -> *mut c_void;
    fn wv_ep_pending(ep: *const RawWv) -> i32;
    fn wv_ep_completions(ep: *const RawWv) -> i32;
    fn wv_ep_last_status(ep: *const RawWv) -> NtStatus;
    fn wv_ep_recursions(ep: *const RawWv) -> i32;
    fn wv_ep_ids_created(ep: *const RawWv) -> i32;
    fn wv_ep_connect_param(ep: *const RawWv, out: *mut WvParam);
    fn wv_ep_req_event(ep: *const RawWv, out: *mut IbaCmReqEvent);
    fn wv_ep_seen(ep: *const RawWv, i: i32, out: *mut Seen) -> i32;

    fn nd_ep_new(
        ifc: *const InfinibandInterfaceCm,
        host: *const ReplayHost,
        t: i32,
        psn: u32,
    ) -> *mut RawNd;
    fn nd_ep_release_memory(ep: *mut RawNd);
    fn nd_ep_bind(ep: *mut RawNd, ip: u32, port: u16) -> NtStatus;
    fn nd_ep_connect(
        ep: *mut RawNd,
        qp: *mut FakeQp,
        peer_ip: u32,
        peer_port: u16,
        route: *const IbPathRec,
        param: *const NdParam,
    ) -> NtStatus;
    fn nd_ep_complete_connect(ep: *mut RawNd, rnr_nak_timeout: u8) -> NtStatus;
    fn nd_ep_get_connection_request(listener: *mut RawNd, ep: *mut RawNd) -> NtStatus;
    fn nd_ep_accept(ep: *mut RawNd, qp: *mut FakeQp, param: *const NdParam) -> NtStatus;
    fn nd_ep_reject(ep: *mut RawNd, param: *const NdParam) -> NtStatus;
    fn nd_ep_disconnect(ep: *mut RawNd) -> NtStatus;
    fn nd_ep_listen(ep: *mut RawNd) -> NtStatus;
    fn nd_ep_remove_handler(ep: *mut RawNd);
    fn nd_ep_destructor(ep: *mut RawNd);
    fn nd_ep_state(ep: *const RawNd) -> i32;
    fn nd_ep_id(ep: *const RawNd) -> *mut c_void;
    fn nd_ep_pending(ep: *const RawNd) -> i32;
    fn nd_ep_completions(ep: *const RawNd) -> i32;
    fn nd_ep_last_status(ep: *const RawNd) -> NtStatus;
    fn nd_ep_recursions(ep: *const RawNd) -> i32;
    fn nd_ep_flushes(ep: *const RawNd) -> i32;
    fn nd_ep_local_port(ep: *const RawNd) -> u16;
    fn nd_ep_read_limits(ep: *const RawNd, inbound: *mut u8, outbound: *mut u8);
    fn nd_ep_seen(ep: *const RawNd, i: i32, out: *mut Seen) -> i32;
}

/// `WV_ENDPOINT_STATE`, in the replay's order.
pub mod wv {
    pub const IDLE: i32 = 0;
    pub const ADDRESS_BOUND: i32 = 1;
    pub const LISTENING: i32 = 2;
    pub const QUEUED: i32 = 3;
    pub const ROUTE_RESOLVED: i32 = 4;
    pub const PASSIVE_CONNECT: i32 = 5;
    pub const ACTIVE_CONNECT: i32 = 6;
    pub const CONNECTED: i32 = 7;
    pub const ACTIVE_DISCONNECT: i32 = 8;
    pub const PASSIVE_DISCONNECT: i32 = 9;
    pub const DISCONNECTED: i32 = 10;
    pub const DESTROYING: i32 = 11;
    /// WinVerbs' `EpType` for TCP-like endpoints (`RDMA_PS_TCP`): its service IDs are
    /// RDMA CM ones (0x0106 << 16 | port).
    pub const EP_TYPE_TCP: u16 = 0x0106;
}

/// `ND_ENDPOINT::STATE`, in the replay's order.
pub mod nd {
    pub const IDLE: i32 = 0;
    pub const ADDRESS_BOUND: i32 = 1;
    pub const LISTENING: i32 = 2;
    pub const QUEUED: i32 = 3;
    pub const REQ_RECEIVED: i32 = 4;
    pub const REP_SENT: i32 = 5;
    pub const RESOLVING: i32 = 6;
    pub const REQ_SENT: i32 = 7;
    pub const REP_RECEIVED: i32 = 8;
    pub const CONNECTED: i32 = 9;
    pub const ACTIVE_DISCONNECT: i32 = 10;
    pub const PASSIVE_DISCONNECT: i32 = 11;
    pub const DISCONNECTED: i32 = 12;
    pub const DESTROYING: i32 = 13;
    pub const CONNECTOR: i32 = 0;
    pub const LISTENER: i32 = 2;
}

/// A WinVerbs endpoint (`WV_ENDPOINT`).
pub struct WvEp {
    raw: *mut RawWv,
    host: Arc<Host>,
}

// SAFETY: the tests drive an endpoint from one thread at a time; callbacks on the
// fabric's thread take the endpoint's spin lock for what they change.
unsafe impl Send for WvEp {}

impl Drop for WvEp {
    fn drop(&mut self) {
        // SAFETY: made by wv_ep_new; its id was destroyed by `free` (or is leaked with
        // the CM, as WinVerbs leaks it).
        unsafe { wv_ep_release_memory(self.raw) };
    }
}

macro_rules! get {
    ($f:ident, $raw:expr) => {
        // SAFETY: a live endpoint.
        unsafe { $f($raw) }
    };
}

impl WvEp {
    pub fn new(host: &Arc<Host>) -> Self {
        // SAFETY: the host and the side's interface outlive the endpoint.
        let raw = unsafe { wv_ep_new(host.ifc, host.ptr(), wv::EP_TYPE_TCP) };
        assert!(!raw.is_null());
        Self {
            raw,
            host: Arc::clone(host),
        }
    }

    pub fn bind(&self, ip: [u8; 4], port: u16) -> NtStatus {
        // SAFETY: a live endpoint.
        unsafe { wv_ep_bind(self.raw, u32::from_ne_bytes(ip), port.to_be()) }
    }

    pub fn set_route(&self, route: &IbPathRec) -> NtStatus {
        // SAFETY: a live endpoint; the route is copied.
        unsafe { wv_ep_set_route(self.raw, route) }
    }

    /// `psn` in host order (WinVerbs' RtlRandomEx value, net32 as it passes it).
    pub fn connect(&self, qp: &FakeQp, ip: [u8; 4], port: u16, p: &WvParam, psn: u32) -> NtStatus {
        // SAFETY: a live endpoint; the arguments outlive the call.
        unsafe {
            wv_ep_connect(
                self.raw,
                qp,
                u32::from_ne_bytes(ip),
                port.to_be(),
                p,
                psn.to_be(),
            )
        }
    }

    pub fn accept(&self, qp: &mut FakeQp, p: &WvParam, psn: u32) -> NtStatus {
        // SAFETY: as above.
        unsafe { wv_ep_accept(self.raw, qp, p, psn.to_be()) }
    }

    pub fn reject(&self, data: &[u8]) -> NtStatus {
        // SAFETY: as above.
        unsafe { wv_ep_reject(self.raw, data.as_ptr(), data.len() as u8) }
    }

    pub fn disconnect(&self) -> NtStatus {
        get!(wv_ep_disconnect, self.raw)
    }

    pub fn listen(&self, backlog: i32) -> NtStatus {
        // SAFETY: a live endpoint.
        unsafe { wv_ep_listen(self.raw, backlog) }
    }

    /// `WvEpGetRequest` of `ep` on this listen.
    pub fn get_request(&self, ep: &WvEp) -> NtStatus {
        // SAFETY: two live endpoints.
        unsafe { wv_ep_get_request(self.raw, ep.raw) }
    }

    /// `WvEpFree`.
    pub fn free(&self) {
        get!(wv_ep_free, self.raw);
    }

    pub fn state(&self) -> i32 {
        get!(wv_ep_state, self.raw)
    }
    pub fn id(&self) -> *mut c_void {
        get!(wv_ep_id, self.raw)
    }
    pub fn pending(&self) -> i32 {
        get!(wv_ep_pending, self.raw)
    }
    pub fn completions(&self) -> i32 {
        get!(wv_ep_completions, self.raw)
    }
    pub fn last_status(&self) -> NtStatus {
        get!(wv_ep_last_status, self.raw)
    }
    pub fn recursions(&self) -> i32 {
        get!(wv_ep_recursions, self.raw)
    }
    pub fn ids_created(&self) -> i32 {
        get!(wv_ep_ids_created, self.raw)
    }

    /// `Attributes.Param.Connect`.
    pub fn param(&self) -> WvParam {
        let mut p = WvParam::new(&[], 0, 0, 0, 0);
        // SAFETY: a live endpoint and an output of the C layout.
        unsafe { wv_ep_connect_param(self.raw, &mut p) };
        p
    }

    /// The last REQ event `get_request` gave this (passive) endpoint.
    pub fn req_event(&self) -> IbaCmReqEvent {
        // SAFETY: all-zero bytes are a valid `iba_cm_req_event` (integers and arrays).
        let mut e: IbaCmReqEvent = unsafe { std::mem::zeroed() };
        // SAFETY: a live endpoint and an output of the C layout.
        unsafe { wv_ep_req_event(self.raw, &mut e) };
        e
    }

    pub fn seen(&self) -> Vec<Seen> {
        let mut out = Vec::new();
        for i in 0.. {
            let mut s = Seen::default();
            // SAFETY: a live endpoint and an output of the C layout.
            if unsafe { wv_ep_seen(self.raw, i, &mut s) } == 0 {
                break;
            }
            out.push(s);
        }
        out
    }

    pub fn types(&self) -> Vec<i32> {
        self.seen().iter().map(|s| s.event_type).collect()
    }
}

/// An ndfltr endpoint (`ND_ENDPOINT`).
pub struct NdEp {
    raw: *mut RawNd,
    host: Arc<Host>,
}

// SAFETY: as for `WvEp`.
unsafe impl Send for NdEp {}

impl Drop for NdEp {
    fn drop(&mut self) {
        // SAFETY: made by nd_ep_new.
        unsafe { nd_ep_release_memory(self.raw) };
    }
}

impl NdEp {
    pub fn new(host: &Arc<Host>, kind: i32, psn: u32) -> Self {
        // SAFETY: the host and the side's interface outlive the endpoint.
        let raw = unsafe { nd_ep_new(host.ifc, host.ptr(), kind, psn.to_be()) };
        assert!(!raw.is_null());
        Self {
            raw,
            host: Arc::clone(host),
        }
    }

    pub fn bind(&self, ip: [u8; 4], port: u16) -> NtStatus {
        // SAFETY: a live endpoint.
        unsafe { nd_ep_bind(self.raw, u32::from_ne_bytes(ip), port.to_be()) }
    }

    pub fn connect(
        &self,
        qp: &mut FakeQp,
        ip: [u8; 4],
        port: u16,
        route: &IbPathRec,
        p: &NdParam,
    ) -> NtStatus {
        // SAFETY: a live endpoint; the QP outlives the connection (the test keeps it).
        unsafe { nd_ep_connect(self.raw, qp, u32::from_ne_bytes(ip), port.to_be(), route, p) }
    }

    pub fn complete_connect(&self, rnr_nak_timeout: u8) -> NtStatus {
        // SAFETY: a live endpoint.
        unsafe { nd_ep_complete_connect(self.raw, rnr_nak_timeout) }
    }

    /// `NdEpGetConnectionRequest` of `ep` on this listener.
    pub fn get_connection_request(&self, ep: &NdEp) -> NtStatus {
        // SAFETY: two live endpoints.
        unsafe { nd_ep_get_connection_request(self.raw, ep.raw) }
    }

    pub fn accept(&self, qp: &mut FakeQp, p: &NdParam) -> NtStatus {
        // SAFETY: as in `connect`.
        unsafe { nd_ep_accept(self.raw, qp, p) }
    }

    pub fn reject(&self, p: &NdParam) -> NtStatus {
        // SAFETY: a live endpoint.
        unsafe { nd_ep_reject(self.raw, p) }
    }

    pub fn disconnect(&self) -> NtStatus {
        get!(nd_ep_disconnect, self.raw)
    }
    pub fn listen(&self) -> NtStatus {
        get!(nd_ep_listen, self.raw)
    }
    /// `ND_ENDPOINT::RemoveHandler` (HCA removal).
    pub fn remove_handler(&self) {
        get!(nd_ep_remove_handler, self.raw);
    }
    /// `ND_ENDPOINT::~ND_ENDPOINT`.
    pub fn destructor(&self) {
        get!(nd_ep_destructor, self.raw);
    }
    pub fn state(&self) -> i32 {
        get!(nd_ep_state, self.raw)
    }
    pub fn id(&self) -> *mut c_void {
        get!(nd_ep_id, self.raw)
    }
    pub fn pending(&self) -> i32 {
        get!(nd_ep_pending, self.raw)
    }
    pub fn completions(&self) -> i32 {
        get!(nd_ep_completions, self.raw)
    }
    pub fn last_status(&self) -> NtStatus {
        get!(nd_ep_last_status, self.raw)
    }
    pub fn recursions(&self) -> i32 {
        get!(nd_ep_recursions, self.raw)
    }
    pub fn flushes(&self) -> i32 {
        get!(nd_ep_flushes, self.raw)
    }
    pub fn local_port(&self) -> u16 {
        u16::from_be(get!(nd_ep_local_port, self.raw))
    }
    /// `m_ReadLimits` (inbound, outbound).
    pub fn read_limits(&self) -> (u8, u8) {
        let (mut i, mut o) = (0, 0);
        // SAFETY: a live endpoint.
        unsafe { nd_ep_read_limits(self.raw, &mut i, &mut o) };
        (i, o)
    }

    pub fn seen(&self) -> Vec<Seen> {
        let mut out = Vec::new();
        for i in 0.. {
            let mut s = Seen::default();
            // SAFETY: a live endpoint and an output of the C layout.
            if unsafe { nd_ep_seen(self.raw, i, &mut s) } == 0 {
                break;
            }
            out.push(s);
        }
        out
    }

    pub fn types(&self) -> Vec<i32> {
        self.seen().iter().map(|s| s.event_type).collect()
    }
}

/// The RDMA CM service ID of a TCP port (ib_types.h:12957-12962, wv_ep.c:332-336).
pub fn rdma_cm_sid(port: u16) -> u64 {
    0x0000_0000_0106_0000 | u64::from(port)
}
