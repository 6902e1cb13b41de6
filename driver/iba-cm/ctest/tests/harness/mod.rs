//! The harness of the C scenarios: two host nodes on a fabric in virtual time, each with
//! an `iba_cm` instance whose interface a C client (`c/client.c`) got from
//! `answer_query`, and safe wrappers of the client's functions.
//!
//! The C calls a WinVerbs or ndfltr would make at DISPATCH_LEVEL (under its queue spin
//! lock) run inside the verifier's `at_dispatch`, which counts every allocation as a
//! violation and flags a wait, private data or not (the engine keeps it in blocks made at
//! PASSIVE_LEVEL); the client's callbacks run inside it too (the backend's
//! `at_dispatch`). `destroy_id` and `send_drep` run at PASSIVE_LEVEL, as theirs
//! (`Cep::drep_at_dispatch` makes the latter at DISPATCH_LEVEL).

#![allow(dead_code)]

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ibcm_endpoint::Device;
use ibcm_host::verifier::{Violation, at_dispatch, is_at_dispatch};
use ibcm_host::{Fabric, HostPlatform, Node, node_address, node_guid};
use ibcm_iba_cm::abi::{
    Be16, Be32, IbPathRec, IbQpMod, IbaCmEvent, InfinibandInterfaceCm, NtStatus,
};
use ibcm_iba_cm::{Backend, Config, Registered};

/// The C client's endpoint (opaque).
#[repr(C)]
pub struct RawCep {
    _private: [u8; 0],
}

#[repr(C)]
pub struct HostOps {
    ctx: *mut c_void,
    is_dispatch: extern "C" fn(*mut c_void) -> i32,
}

/// One event as the C client logged it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Logged {
    pub event_type: i32,
    pub qpn: u32,
    pub qkey: u32,
    pub rej_reason: u16,
    pub alt_dlid: u16,
    pub resp_res: u8,
    pub init_depth: u8,
    pub pdata_len: u8,
    pub pdata0: u8,
    pub ari_len: u8,
    pub ari0: u8,
    pub service_timeout: u8,
    pub status: u8,
    pub at_dispatch: u8,
    pub reserved: [u8; 3],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CepStats {
    pub nlog: i32,
    pub notifications: i32,
    pub bad_notifications: i32,
    pub recursions: i32,
    pub callbacks_after_destroy: i32,
    pub notifications_not_at_dispatch: i32,
}

unsafe extern "C" {
    fn cep_new(ifc: *const InfinibandInterfaceCm, host: *const HostOps) -> *mut RawCep;
    fn cep_free(c: *mut RawCep);
    fn cep_set_fail_on(c: *mut RawCep, t: i32);
    fn cep_set_destroy_on(c: *mut RawCep, t: i32);
    fn cep_get_stats(c: *const RawCep, out: *mut CepStats);
    fn cep_get_log(c: *const RawCep, i: i32, out: *mut Logged) -> i32;
    fn cep_has_id(c: *const RawCep) -> i32;
    fn cep_count(c: *mut RawCep, t: i32) -> i32;
    fn cep_cid(c: *const RawCep) -> u32;
    fn cep_id_ptr(c: *const RawCep) -> *mut c_void;
    fn cep_listen(c: *mut RawCep, sid: u64, buf: *const u8, len: u8, off: u8) -> NtStatus;
    fn cep_cancel_listen(c: *mut RawCep) -> NtStatus;
    fn cep_create(c: *mut RawCep) -> NtStatus;
    fn cep_connect(
        c: *mut RawCep,
        sid: u64,
        primary: *const IbPathRec,
        alt: *const IbPathRec,
        qpn: u32,
        pdata: *const u8,
        len: u8,
        resp_res: u8,
        init_depth: u8,
        retries: u8,
        timeout: u8,
    ) -> NtStatus;
    fn cep_get_request(l: *mut RawCep, child: *mut RawCep, ev: *mut IbaCmEvent) -> NtStatus;
    fn cep_get_request_ex(l: *mut RawCep, child: *mut RawCep, ev: *mut IbaCmEvent) -> NtStatus;
    fn cep_probe_inherit(
        l: *mut RawCep,
        child: *mut RawCep,
        ev: *mut IbaCmEvent,
        context: *mut *mut c_void,
        same: *mut i32,
    ) -> NtStatus;
    fn cep_accept(c: *mut RawCep, qpn: u32, pd: *const u8, len: u8, rr: u8, id: u8) -> NtStatus;
    fn cep_format_rep(
        c: *mut RawCep,
        qpn: u32,
        pd: *const u8,
        len: u8,
        rr: u8,
        id: u8,
        init: *mut IbQpMod,
    ) -> NtStatus;
    fn cep_send_formatted_rep(c: *mut RawCep) -> NtStatus;
    fn cep_rtu(c: *mut RawCep, pd: *const u8, len: u8) -> NtStatus;
    fn cep_dreq(c: *mut RawCep, pd: *const u8, len: u8) -> NtStatus;
    fn cep_drep(c: *mut RawCep, pd: *const u8, len: u8) -> NtStatus;
    fn cep_rej(
        c: *mut RawCep,
        reason: u16,
        ari: *const u8,
        alen: u8,
        pd: *const u8,
        len: u8,
    ) -> NtStatus;
    fn cep_mra(c: *mut RawCep, timeout: u8) -> NtStatus;
    fn cep_lap(c: *mut RawCep, alt: *const IbPathRec, pd: *const u8, len: u8) -> NtStatus;
    fn cep_apr(c: *mut RawCep, status: u8, pd: *const u8, len: u8) -> NtStatus;
    fn cep_sidr_req(
        c: *mut RawCep,
        sid: u64,
        path: *const IbPathRec,
        pd: *const u8,
        len: u8,
        timeout_ms: u32,
        retries: u8,
    ) -> NtStatus;
    fn cep_sidr_rep(
        c: *mut RawCep,
        qpn: u32,
        qkey: u32,
        status: u8,
        pd: *const u8,
        len: u8,
    ) -> NtStatus;
    fn cep_qp_attr(c: *mut RawCep, state: u32, attr: *mut IbQpMod) -> NtStatus;
    fn cep_established(c: *mut RawCep) -> NtStatus;
    fn cep_destroy(c: *mut RawCep);
    fn ifc_reference(ifc: *const InfinibandInterfaceCm);
    fn ifc_dereference(ifc: *const InfinibandInterfaceCm);
    fn ifc_bad_calls(ifc: *const InfinibandInterfaceCm, out: *mut NtStatus) -> i32;
}

extern "C" fn host_is_dispatch(_: *mut c_void) -> i32 {
    i32::from(is_at_dispatch())
}

/// The host's backend of one node.
pub struct TestBackend {
    pub node: Arc<Node>,
    pub index: usize,
    pub pending: AtomicBool,
    pub released: AtomicBool,
    /// Callbacks entered with an ibcm (host) lock held on their thread.
    pub under_lock: std::sync::atomic::AtomicUsize,
    /// The CA port number behind the node's (host-wide) port 1, 0 for the same number: a
    /// host whose CM serves several CAs numbers ports host-wide (`Backend::ca_port`).
    pub ca_port_of_1: std::sync::atomic::AtomicU8,
}

impl Backend for TestBackend {
    type Platform = HostPlatform;

    fn device(&self) -> &Device<HostPlatform> {
        &self.node.device
    }

    fn at_dispatch(&self, f: &mut dyn FnMut()) {
        // Every client callback runs here: none may run under the dispatch layer's lock.
        if ibcm_host::verifier::locks_held() != 0 {
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
        // The default partition at index 0, as a subnet manager sets it.
        if pkey | 0x8000 == 0xFFFF { 0 } else { 1 }
    }

    fn ca_guid(&self) -> u64 {
        node_guid(self.index)
    }

    fn ca_port(&self, port: u8) -> (u64, u8) {
        let mapped = self.ca_port_of_1.load(Ordering::Relaxed);
        if port == 1 && mapped != 0 {
            (node_guid(self.index) ^ 0xCA, mapped)
        } else {
            (node_guid(self.index), port)
        }
    }

    fn released(&self) {
        self.released.store(true, Ordering::Release);
    }
}

/// One node's CM and the interface its C client holds.
pub struct Side {
    pub node: Arc<Node>,
    pub cm: Option<Registered<TestBackend>>,
    pub ifc: Box<InfinibandInterfaceCm>,
    pub host: Box<HostOps>,
    pub index: usize,
}

pub const CONFIG: Config = Config {
    ids: 32,
    listens: 4,
    backlog: 8,
    concurrency: 16,
};

impl Side {
    pub fn new(node: &Arc<Node>, index: usize) -> Self {
        let backend = TestBackend {
            node: Arc::clone(node),
            index,
            pending: AtomicBool::new(false),
            released: AtomicBool::new(false),
            under_lock: std::sync::atomic::AtomicUsize::new(0),
            ca_port_of_1: std::sync::atomic::AtomicU8::new(0),
        };
        let cm = Registered::new(backend, CONFIG).expect("an instance");
        let ifc = Box::new(cm.answer_query(0x0101, 208).expect("the interface"));
        Self {
            node: Arc::clone(node),
            cm: Some(cm),
            ifc,
            host: Box::new(HostOps {
                ctx: std::ptr::null_mut(),
                is_dispatch: host_is_dispatch,
            }),
            index,
        }
    }

    pub fn cm(&self) -> &Registered<TestBackend> {
        self.cm.as_ref().expect("not removed")
    }

    /// A new C endpoint on this side's interface.
    pub fn cep(&self) -> Cep {
        // SAFETY: the interface and host table outlive the endpoint (the side owns them
        // and the test frees endpoints first).
        let raw = unsafe { cep_new(&raw const *self.ifc, &raw const *self.host) };
        assert!(!raw.is_null());
        Cep {
            raw,
            ledger: Arc::clone(&self.node.platform.ledger),
        }
    }

    /// The deferred delivery, as the DPC would run it.
    pub fn deliver(&self) {
        if let Some(cm) = &self.cm
            && cm.backend().pending.swap(false, Ordering::AcqRel)
        {
            at_dispatch(&self.node.platform.ledger, || cm.deliver());
        }
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.node.violations()
    }

    pub fn ids_in_use(&self) -> usize {
        self.cm().ids_in_use()
    }

    /// Drops the client's reference (IRP_MN_QUERY_INTERFACE's) and removes the CM.
    pub fn remove(&mut self) {
        // SAFETY: the interface this side holds.
        unsafe { ifc_dereference(&raw const *self.ifc) };
        drop(self.cm.take());
    }

    pub fn reference(&self) {
        // SAFETY: the interface this side holds.
        unsafe { ifc_reference(&raw const *self.ifc) };
    }

    pub fn dereference(&self) {
        // SAFETY: the interface this side holds.
        unsafe { ifc_dereference(&raw const *self.ifc) };
    }

    pub fn bad_calls(&self) -> Vec<NtStatus> {
        let mut out = [0; 16];
        // SAFETY: room for the 16 statuses the C function writes at most.
        let n = unsafe { ifc_bad_calls(&raw const *self.ifc, out.as_mut_ptr()) };
        out[..n as usize].to_vec()
    }
}

impl Drop for Side {
    /// A scenario that failed half-way still lets the CM go (removal waits for the
    /// client's reference).
    fn drop(&mut self) {
        if self.cm.is_some() {
            self.remove();
        }
    }
}

/// Two nodes and their CMs.
pub struct World {
    pub fabric: Fabric,
    pub a: Side,
    pub b: Side,
}

impl World {
    pub fn new(seed: u64) -> Self {
        let fabric = Fabric::new(2, seed);
        let a = Side::new(&fabric.nodes[0], 0);
        let b = Side::new(&fabric.nodes[1], 1);
        Self { fabric, a, b }
    }

    /// Runs the fabric for `ns` of virtual time, with the deferred deliveries.
    pub fn run(&mut self, ns: u64) {
        self.a.deliver();
        self.b.deliver();
        self.fabric.run_for(ns);
        self.a.deliver();
        self.b.deliver();
    }

    /// The end of every scenario: everything destroyed, timewait over, nothing leaked,
    /// no rule broken.
    pub fn finish(mut self) {
        self.run(60_000_000_000);
        for s in [&self.a, &self.b] {
            assert_eq!(s.violations(), vec![], "node {}", s.index);
            let under_lock = s.cm().backend().under_lock.load(Ordering::Relaxed);
            assert_eq!(
                under_lock, 0,
                "callbacks under an ibcm lock on node {}",
                s.index
            );
            assert_eq!(s.ids_in_use(), 0, "ids left on node {}", s.index);
            assert_eq!(s.node.device.client_count(), 0);
            assert_eq!(s.node.device.with_engine(|cm| cm.live_ceps()), 0);
        }
        self.a.remove();
        self.b.remove();
    }
}

/// An IB path record from node `from` to node `to` (SA encoding).
pub fn path(from: usize, to: usize) -> IbPathRec {
    let (s, d) = (node_address(from), node_address(to));
    IbPathRec {
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
    }
}

/// A C endpoint.
pub struct Cep {
    raw: *mut RawCep,
    ledger: Arc<ibcm_host::verifier::Ledger>,
}

// SAFETY: every C function that changes an endpoint or reads what its callbacks write
// takes the endpoint's lock (`cep_count`); the unlocked readers (`stats`, `log`) are used
// only once the other threads are done.
unsafe impl Send for Cep {}
// SAFETY: as above.
unsafe impl Sync for Cep {}

// SAFETY: the interface table and host table a side hands its C client are written once,
// before any thread sees the side, and only read afterwards.
unsafe impl Sync for Side {}

impl Drop for Cep {
    fn drop(&mut self) {
        // SAFETY: made by cep_new; its id (if any) was destroyed by the test.
        unsafe { cep_free(self.raw) };
    }
}

fn ptr(b: &[u8]) -> *const u8 {
    if b.is_empty() {
        std::ptr::null()
    } else {
        b.as_ptr()
    }
}

impl Cep {
    /// Runs `f` at DISPATCH_LEVEL (the C client's spin lock is taken inside it).
    fn dispatch<T>(&self, f: impl FnOnce() -> T) -> T {
        at_dispatch(&self.ledger, f)
    }

    pub fn raw(&self) -> *mut RawCep {
        self.raw
    }

    pub fn stats(&self) -> CepStats {
        let mut s = CepStats::default();
        // SAFETY: a live endpoint and an output structure of the C layout.
        unsafe { cep_get_stats(self.raw, &raw mut s) };
        s
    }

    pub fn log(&self) -> Vec<Logged> {
        let mut out = Vec::new();
        for i in 0.. {
            let mut l = Logged::default();
            // SAFETY: as in `stats`.
            if unsafe { cep_get_log(self.raw, i, &raw mut l) } == 0 {
                break;
            }
            out.push(l);
        }
        out
    }

    pub fn types(&self) -> Vec<i32> {
        self.log().iter().map(|l| l.event_type).collect()
    }

    /// Events of type `t` so far (under the endpoint's lock).
    pub fn count(&self, t: i32) -> i32 {
        // SAFETY: a live endpoint.
        unsafe { cep_count(self.raw, t) }
    }

    pub fn has_id(&self) -> bool {
        // SAFETY: a live endpoint.
        unsafe { cep_has_id(self.raw) != 0 }
    }

    pub fn cid(&self) -> u32 {
        // SAFETY: a live endpoint.
        unsafe { cep_cid(self.raw) }
    }

    pub fn id_ptr(&self) -> *mut c_void {
        // SAFETY: a live endpoint.
        unsafe { cep_id_ptr(self.raw) }
    }

    pub fn fail_on(&self, t: i32) {
        // SAFETY: a live endpoint.
        unsafe { cep_set_fail_on(self.raw, t) };
    }

    pub fn destroy_on(&self, t: i32) {
        // SAFETY: a live endpoint.
        unsafe { cep_set_destroy_on(self.raw, t) };
    }

    pub fn listen(&self, sid: u64, compare: Option<&[u8]>, offset: u8) -> NtStatus {
        let (p, n) = compare.map_or((std::ptr::null(), 0), |c| (c.as_ptr(), c.len() as u8));
        // SAFETY: the buffer lives for the call.
        self.dispatch(|| unsafe { cep_listen(self.raw, sid, p, n, offset) })
    }

    pub fn cancel_listen(&self) -> NtStatus {
        // SAFETY: a live endpoint.
        self.dispatch(|| unsafe { cep_cancel_listen(self.raw) })
    }

    pub fn create(&self) -> NtStatus {
        // SAFETY: a live endpoint.
        self.dispatch(|| unsafe { cep_create(self.raw) })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &self,
        sid: u64,
        primary: &IbPathRec,
        alt: Option<&IbPathRec>,
        qpn: u32,
        pdata: &[u8],
        resp_res: u8,
        init_depth: u8,
    ) -> NtStatus {
        let alt = alt.map_or(std::ptr::null(), |a| a as *const IbPathRec);
        self.dispatch(|| {
            // SAFETY: every pointer lives for the call.
            unsafe {
                cep_connect(
                    self.raw,
                    sid,
                    primary,
                    alt,
                    qpn,
                    ptr(pdata),
                    pdata.len() as u8,
                    resp_res,
                    init_depth,
                    3,
                    16,
                )
            }
        })
    }

    pub fn get_request(&self, child: &Cep, ev: &mut IbaCmEvent) -> NtStatus {
        // SAFETY: live endpoints and an event of the C layout.
        self.dispatch(|| unsafe { cep_get_request(self.raw, child.raw, ev) })
    }

    pub fn get_request_ex(&self, child: &Cep, ev: &mut IbaCmEvent) -> NtStatus {
        // SAFETY: as above.
        self.dispatch(|| unsafe { cep_get_request_ex(self.raw, child.raw, ev) })
    }

    /// get_request's inherited (context, same callback as the listen's).
    pub fn probe_inherit(&self, child: &Cep, ev: &mut IbaCmEvent) -> (NtStatus, *mut c_void, bool) {
        let mut ctx = std::ptr::null_mut();
        let mut same = 0;
        let s = self.dispatch(|| {
            // SAFETY: as above.
            unsafe { cep_probe_inherit(self.raw, child.raw, ev, &raw mut ctx, &raw mut same) }
        });
        (s, ctx, same != 0)
    }

    pub fn accept(&self, qpn: u32, pdata: &[u8], resp_res: u8, init_depth: u8) -> NtStatus {
        self.dispatch(|| {
            // SAFETY: the buffer lives for the call.
            unsafe {
                cep_accept(
                    self.raw,
                    qpn,
                    ptr(pdata),
                    pdata.len() as u8,
                    resp_res,
                    init_depth,
                )
            }
        })
    }

    pub fn format_rep(
        &self,
        qpn: u32,
        pdata: &[u8],
        resp_res: u8,
        init_depth: u8,
        init: &mut IbQpMod,
    ) -> NtStatus {
        self.dispatch(|| {
            // SAFETY: the buffer and the output live for the call.
            unsafe {
                cep_format_rep(
                    self.raw,
                    qpn,
                    ptr(pdata),
                    pdata.len() as u8,
                    resp_res,
                    init_depth,
                    init,
                )
            }
        })
    }

    pub fn send_formatted_rep(&self) -> NtStatus {
        // SAFETY: a live endpoint.
        self.dispatch(|| unsafe { cep_send_formatted_rep(self.raw) })
    }

    pub fn rtu(&self, pdata: &[u8]) -> NtStatus {
        // SAFETY: the buffer lives for the call.
        self.dispatch(|| unsafe { cep_rtu(self.raw, ptr(pdata), pdata.len() as u8) })
    }

    pub fn dreq(&self, pdata: &[u8]) -> NtStatus {
        // SAFETY: the buffer lives for the call.
        self.dispatch(|| unsafe { cep_dreq(self.raw, ptr(pdata), pdata.len() as u8) })
    }

    /// PASSIVE_LEVEL.
    pub fn drep(&self, pdata: &[u8]) -> NtStatus {
        // SAFETY: the buffer lives for the call.
        unsafe { cep_drep(self.raw, ptr(pdata), pdata.len() as u8) }
    }

    /// `send_drep` at DISPATCH_LEVEL (callable there, as every call but `destroy_id`;
    /// WinVerbs happens to make it at PASSIVE_LEVEL).
    pub fn drep_at_dispatch(&self, pdata: &[u8]) -> NtStatus {
        // SAFETY: the buffer lives for the call.
        self.dispatch(|| unsafe { cep_drep(self.raw, ptr(pdata), pdata.len() as u8) })
    }

    pub fn rej(&self, reason: u16, ari: &[u8], pdata: &[u8]) -> NtStatus {
        self.dispatch(|| {
            // SAFETY: the buffers live for the call.
            unsafe {
                cep_rej(
                    self.raw,
                    reason,
                    ptr(ari),
                    ari.len() as u8,
                    ptr(pdata),
                    pdata.len() as u8,
                )
            }
        })
    }

    pub fn mra(&self, timeout: u8) -> NtStatus {
        // SAFETY: a live endpoint.
        self.dispatch(|| unsafe { cep_mra(self.raw, timeout) })
    }

    pub fn lap(&self, alt: &IbPathRec, pdata: &[u8]) -> NtStatus {
        // SAFETY: the path and buffer live for the call.
        self.dispatch(|| unsafe { cep_lap(self.raw, alt, ptr(pdata), pdata.len() as u8) })
    }

    pub fn apr(&self, status: u8, pdata: &[u8]) -> NtStatus {
        // SAFETY: the buffer lives for the call.
        self.dispatch(|| unsafe { cep_apr(self.raw, status, ptr(pdata), pdata.len() as u8) })
    }

    pub fn sidr_req(&self, sid: u64, path: &IbPathRec, pdata: &[u8], timeout_ms: u32) -> NtStatus {
        self.dispatch(|| {
            // SAFETY: the path and buffer live for the call.
            unsafe {
                cep_sidr_req(
                    self.raw,
                    sid,
                    path,
                    ptr(pdata),
                    pdata.len() as u8,
                    timeout_ms,
                    2,
                )
            }
        })
    }

    pub fn sidr_rep(&self, qpn: u32, qkey: u32, status: u8, pdata: &[u8]) -> NtStatus {
        self.dispatch(|| {
            // SAFETY: the buffer lives for the call.
            unsafe { cep_sidr_rep(self.raw, qpn, qkey, status, ptr(pdata), pdata.len() as u8) }
        })
    }

    pub fn qp_attr(&self, state: u32) -> (NtStatus, IbQpMod) {
        let mut m = IbQpMod::zeroed();
        // SAFETY: an output of the C layout.
        let s = self.dispatch(|| unsafe { cep_qp_attr(self.raw, state, &raw mut m) });
        (s, m)
    }

    pub fn established(&self) -> NtStatus {
        // SAFETY: a live endpoint.
        self.dispatch(|| unsafe { cep_established(self.raw) })
    }

    /// PASSIVE_LEVEL.
    pub fn destroy(&self) {
        // SAFETY: a live endpoint.
        unsafe { cep_destroy(self.raw) };
    }
}
