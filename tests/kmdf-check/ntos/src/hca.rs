//! The HCA's function driver below ibbus (mlx4_bus, lucasz93/WinOFED
//! `hw/mlx4/kernel/bus/drv/drv.c` `__start_card`): it answers `GUID_RDMA_INTERFACE_VERBS`
//! through `WdfDeviceAddQueryInterface` with its verbs table (`inc/kernel/rdma/verbs.h`
//! `RDMA_INTERFACE_VERBS`, `inc/iba/ib_ci.h` `ci_interface_t`), and implements the verbs
//! AL's special-QP service calls through it: CQs, QP1, receives, polls. QP1's receives
//! are carried by the simulated fabric: a MAD that reaches a port lands in the QP's next
//! posted receive ([`arrive`]), written by DMA at the receive's physical address, and
//! its completion goes on the receive CQ.
//!
//! The declarations are this file's own reading of the WinOF headers (lucasz93/WinOFED
//! @913bc0c), not the binding's, so a wrong offset in either shows.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::mem::{offset_of, size_of};

use crate::physical;
use crate::sched::run_at_dispatch;
use crate::state;
use crate::thread::{DISPATCH, KernelCode, PASSIVE, require_irql};
use crate::verifier::{Rule, bugcheck};
use crate::*;

pub type Handle = *mut c_void;

/// `ib_api_status_t` (ib_types.h:9490-9508).
pub const IB_SUCCESS: i32 = 0;
pub const IB_INSUFFICIENT_RESOURCES: i32 = 1;
pub const IB_INVALID_PARAMETER: i32 = 3;
pub const IB_NOT_FOUND: i32 = 5;
pub const IB_INVALID_QP_STATE: i32 = 13;
pub const IB_RESOURCE_BUSY: i32 = 17;
/// `ib_qp_type_t` `IB_QPT_QP0`, `IB_QPT_QP1` (ib_types.h).
pub const IB_QPT_QP0: i32 = 4;
pub const IB_QPT_QP1: i32 = 5;
/// `ib_qp_state_t` (ib_types.h:10491-10499).
pub const IB_QPS_RESET: u32 = 0x01;
pub const IB_QPS_INIT: u32 = 0x02;
pub const IB_QPS_RTR: u32 = 0x04;
pub const IB_QPS_RTS: u32 = 0x08;
pub const IB_QPS_ERROR: u32 = 0x100;
/// `ib_wc_status_t` (ib_types.h:11312-11316).
pub const IB_WCS_SUCCESS: i32 = 0;
pub const IB_WCS_LOCAL_LEN_ERR: i32 = 1;
pub const IB_WCS_WR_FLUSHED_ERR: i32 = 4;
/// `ib_wc_type_t` `IB_WC_RECV` (ib_types.h:11466).
pub const IB_WC_RECV: i32 = 1 << 7;
/// `VERBS_VERSION` (ib_ci.h:74-79): `ci_interface_t::version`.
pub const VERBS_VERSION: u32 = 0x0002_0007;
/// `RDMA_INTERFACE_VERBS_VERSION` = `VerbsVersion(2, 7)` (verbs.h:51): the header's.
pub const RDMA_INTERFACE_VERBS_VERSION: u16 = 0x0207;
/// A UD receive starts with room for the GRH (IBA 11.4.1.2, ib_types.h `ib_grh_t`).
pub const GRH_SIZE: usize = 40;
pub const MAD_SIZE: usize = 256;

/// `GUID_RDMA_INTERFACE_VERBS` {F0EBAE86-EDB5-4B40-A10A-44D5DB3B964E} (verbs.h:76).
pub const GUID_RDMA_INTERFACE_VERBS: (u32, u16, u16, [u8; 8]) = (
    0xf0eb_ae86,
    0xedb5,
    0x4b40,
    [0xa1, 0x0a, 0x44, 0xd5, 0xdb, 0x3b, 0x96, 0x4e],
);

/// Entries of `ci_interface_t` from `open_ca` (ib_ci.h:3288-3423, counted): the ones
/// the simulated HCA fills. The rest stay NULL (AL's special-QP service calls none).
pub const CREATE_SPL_QP: usize = 20;
pub const MODIFY_QP: usize = 21;
pub const DESTROY_QP: usize = 23;
pub const CREATE_CQ: usize = 25;
pub const DESTROY_CQ: usize = 29;
pub const POST_RECV: usize = 46;
pub const POLL_CQ: usize = 49;
pub const ENABLE_CQ_NOTIFY: usize = 50;
pub const POLL_CQ_ARRAY: usize = 55;
/// `open_ca` .. `register_mdl`.
pub const VERBS: usize = 65;

/// `ci_interface_t` (ib_ci.h:3254-3424).
#[repr(C)]
pub struct CiInterface {
    pub guid: u64,
    pub p_hca_obj: *mut c_void,
    pub driver_id: GUID,
    pub vend_id: u32,
    pub dev_id: u16,
    pub dev_revision: u16,
    pub libname: [u8; 32],
    pub version: u32,
    pub verbs: [*const c_void; VERBS],
}

/// `RDMA_INTERFACE_VERBS` (verbs.h:53-59).
#[repr(C)]
pub struct RdmaInterfaceVerbs {
    pub header: INTERFACE,
    pub verbs: CiInterface,
    pub post_event: *const c_void,
}

/// `ib_local_ds_t` (ib_types.h:10918).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbLocalDs {
    pub vaddr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `ib_recv_wr_t` (ib_types.h:11225).
#[repr(C)]
pub struct IbRecvWr {
    pub p_next: *mut IbRecvWr,
    pub wr_id: u64,
    pub num_ds: u32,
    pub ds_array: *mut IbLocalDs,
}

/// `ib_wc_t` (ib_types.h) with the `recv.ud` arm of its union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbWc {
    pub p_next: *mut IbWc,
    pub wr_id: u64,
    pub wc_type: i32,
    pub length: u32,
    pub vendor_specific: u64,
    pub status: i32,
    pub recv_opt: u32,
    pub immediate_data: u32,
    pub remote_qp: u32,
    pub pkey_index: u16,
    pub remote_lid: u16,
    pub remote_sl: u8,
    pub path_bits: u8,
}

/// `ib_qp_create_t` (ib_types.h:10575).
#[repr(C)]
pub struct IbQpCreate {
    pub qp_type: i32,
    pub sq_max_inline: u32,
    pub sq_depth: u32,
    pub rq_depth: u32,
    pub sq_sge: u32,
    pub rq_sge: u32,
    pub h_sq_cq: Handle,
    pub h_rq_cq: Handle,
    pub h_srq: Handle,
    pub sq_signaled: i32,
}

/// `ib_qp_attr_t` (ib_types.h:10684): its head, and room for the rest the HCA does not
/// write here.
#[repr(C)]
pub struct IbQpAttr {
    pub h_pd: Handle,
    pub qp_type: i32,
    pub access_ctrl: u32,
    pub pkey_index: u16,
    pub sq_max_inline: u32,
    pub sq_depth: u32,
    pub rq_depth: u32,
    pub rest: [u64; 40],
}

/// `ib_qp_mod_t` (ib_types.h:10778): `req_state`, and room for the state's union.
#[repr(C)]
pub struct IbQpMod {
    pub req_state: u32,
    pub rest: [u32; 31],
}

const _: () = {
    assert!(offset_of!(CiInterface, verbs) == 80);
    assert!(size_of::<RdmaInterfaceVerbs>() == 640);
    assert!(size_of::<IbRecvWr>() == 32);
    assert!(size_of::<IbWc>() == 56);
    assert!(offset_of!(IbWc, status) == 32);
    assert!(offset_of!(IbQpAttr, rq_depth) == 28);
};

/// `ci_completion_cb_t` (ib_ci.h): the CQ's owner is told a completion is there.
pub type CompletionCb = unsafe extern "C" fn(cq_context: *mut c_void);

struct Cqe {
    qp: usize,
    wc: IbWc,
}

struct Cq {
    ca: usize,
    context: usize,
    completion: Option<CompletionCb>,
    armed: bool,
    entries: VecDeque<Cqe>,
}

struct Qp {
    ca: usize,
    port_num: u8,
    qp_type: i32,
    recv_cq: usize,
    send_cq: usize,
    state: u32,
    rq_depth: u32,
    /// Posted receives: (wr_id, segments).
    receives: VecDeque<(u64, Vec<IbLocalDs>)>,
    /// Receives the HCA is writing now ([`arrive`]): `ci_destroy_qp` returns only once
    /// none is left (the hardware quiesces a QP before its buffers may be freed).
    dma: u32,
}

/// The HCAs' verbs state.
#[derive(Default)]
pub struct Hca {
    next: usize,
    cqs: HashMap<usize, Cq>,
    qps: HashMap<usize, Qp>,
    /// References on each CA's verbs interface (`__ref_hca_ifc` / `__deref_hca_ifc`).
    references: HashMap<usize, i64>,
    /// MADs that reached a QP1 with no receive posted (a UD QP drops them).
    pub dropped: usize,
    /// CAs whose hardware stopped: nothing arrives.
    gone: std::collections::HashSet<usize>,
    /// CAs whose driver (and AL) are of another build: their `ci_interface_t::version`.
    versions: HashMap<usize, u32>,
    /// CAs whose driver was reloaded at another address: other entry points.
    reloaded: std::collections::HashSet<usize>,
}

/// CA `ca`'s HCA driver is unloaded and loaded again at another address (an update, or
/// the image placed elsewhere): from its next answer on, its verbs table's entry points
/// differ from the ones it gave before.
pub fn reload_driver(ca: usize) {
    state::lock().hca.reloaded.insert(ca);
}

/// CA `ca`'s HCA driver, and the AL beside it, are of a build whose verbs version is
/// `version` (Mellanox's binary builds may differ from the open headers,
/// winof-deployment.md §5): the table says so, and AL of that build accepts it.
pub fn set_verbs_version(ca: usize, version: u32) {
    state::lock().hca.versions.insert(ca, version);
}

/// The `ci_interface_t::version` CA `ca`'s HCA driver and AL are built with.
pub fn verbs_version(ca: usize) -> u32 {
    state::lock()
        .hca
        .versions
        .get(&ca)
        .copied()
        .unwrap_or(VERBS_VERSION)
}

fn new_handle(h: &mut Hca) -> usize {
    h.next += 1;
    0xC1_0000_0000 + h.next * 0x80
}

/// The CA an `h_pd` / `h_ca` of the simulation stands for (AL's stand-in passes the CA
/// index + 1 as its handles on the HCA).
pub fn handle_of_ca(ca: usize) -> Handle {
    (ca + 1) as Handle
}

fn ca_of_handle(h: Handle) -> Option<usize> {
    (h as usize).checked_sub(1).filter(|c| *c < 64)
}

/// References held on CA `ca`'s verbs interface.
pub fn references(ca: usize) -> i64 {
    state::lock().hca.references.get(&ca).copied().unwrap_or(0)
}

/// MADs dropped at a QP1 without a posted receive.
pub fn dropped() -> usize {
    state::lock().hca.dropped
}

/// The card of CA `ca` stops (or starts again): nothing arrives while stopped.
pub fn set_gone(ca: usize, gone: bool) {
    let mut guard = state::lock();
    if gone {
        guard.hca.gone.insert(ca);
    } else {
        guard.hca.gone.remove(&ca);
    }
}

unsafe extern "C" fn reference(context: PVOID) {
    *state::lock()
        .hca
        .references
        .entry(context as usize)
        .or_default() += 1;
}

unsafe extern "C" fn dereference(context: PVOID) {
    let mut guard = state::lock();
    let r = guard.hca.references.entry(context as usize).or_default();
    *r -= 1;
    if *r < 0 {
        drop(guard);
        bugcheck(
            Rule::InterfaceReference,
            format_args!("the verbs interface of CA {context:p} released more often than taken"),
        );
    }
}

/// The verbs query reaching the HCA's FDO for CA `ca`: what KMDF does for an interface
/// added with `WdfDeviceAddQueryInterface` and no import (fxpkgpnp.cpp:1763-1783): the
/// registered interface is copied if its `Size` fits the query's and its `Version` is not
/// above the requested one, else STATUS_INVALID_BUFFER_SIZE; then it is referenced.
pub fn answer_verbs_query(
    ca: usize,
    ca_guid: u64,
    interface: PINTERFACE,
    size: u16,
    version: u16,
) -> NTSTATUS {
    const STATUS_INVALID_BUFFER_SIZE: NTSTATUS = 0xC000_0206_u32 as i32;
    if usize::from(size) < size_of::<RdmaInterfaceVerbs>() || version < RDMA_INTERFACE_VERBS_VERSION
    {
        return STATUS_INVALID_BUFFER_SIZE;
    }
    if interface.is_null() {
        return STATUS_INVALID_BUFFER_SIZE;
    }
    let verbs = own_entries(ca);
    let table = RdmaInterfaceVerbs {
        header: INTERFACE {
            Size: size_of::<RdmaInterfaceVerbs>() as u16,
            Version: RDMA_INTERFACE_VERBS_VERSION,
            Context: ca as PVOID,
            InterfaceReference: Some(reference),
            InterfaceDereference: Some(dereference),
        },
        verbs: CiInterface {
            guid: ca_guid.to_be(),
            p_hca_obj: handle_of_ca(ca),
            // SAFETY: all-zero is a valid GUID.
            driver_id: unsafe { core::mem::zeroed() },
            vend_id: 0x02c9,
            dev_id: 0x1003,
            dev_revision: 0,
            libname: [0; 32],
            version: verbs_version(ca),
            verbs,
        },
        post_event: core::ptr::null(),
    };
    // SAFETY: the querier's buffer holds `size` >= sizeof(RDMA_INTERFACE_VERBS) bytes.
    unsafe { interface.cast::<RdmaInterfaceVerbs>().write(table) };
    *state::lock().hca.references.entry(ca).or_default() += 1;
    STATUS_SUCCESS
}

/// The entries CA `ca`'s HCA driver fills in its verbs table (NULL where it has none).
pub fn own_entries(ca: usize) -> [*const c_void; VERBS] {
    let mut verbs = [core::ptr::null::<c_void>(); VERBS];
    verbs[CREATE_SPL_QP] = create_spl_qp as *const c_void;
    verbs[MODIFY_QP] = modify_qp as *const c_void;
    verbs[DESTROY_QP] = destroy_qp as *const c_void;
    verbs[CREATE_CQ] = create_cq as *const c_void;
    verbs[DESTROY_CQ] = destroy_cq as *const c_void;
    verbs[POST_RECV] = post_recv as *const c_void;
    verbs[POLL_CQ] = poll_cq as *const c_void;
    verbs[ENABLE_CQ_NOTIFY] = enable_cq_notify as *const c_void;
    verbs[POLL_CQ_ARRAY] = poll_cq_array as *const c_void;
    if state::lock().hca.reloaded.contains(&ca) {
        verbs[CREATE_SPL_QP] = reloaded::create_spl_qp as *const c_void;
        verbs[MODIFY_QP] = reloaded::modify_qp as *const c_void;
        verbs[DESTROY_QP] = reloaded::destroy_qp as *const c_void;
        verbs[DESTROY_CQ] = reloaded::destroy_cq as *const c_void;
        verbs[POST_RECV] = reloaded::post_recv as *const c_void;
        verbs[POLL_CQ] = reloaded::poll_cq as *const c_void;
        verbs[POLL_CQ_ARRAY] = reloaded::poll_cq_array as *const c_void;
    }
    verbs
}

/// `ci_create_cq` (ib_ci.h:1267).
unsafe extern "C" fn create_cq(
    h_ca: Handle,
    cq_context: *const c_void,
    _async: *const c_void,
    completion: Option<CompletionCb>,
    p_size: *mut u32,
    ph_cq: *mut Handle,
    _umv: *mut c_void,
) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ci_create_cq", PASSIVE);
    let Some(ca) = ca_of_handle(h_ca) else {
        return IB_INVALID_PARAMETER;
    };
    let mut guard = state::lock();
    let h = new_handle(&mut guard.hca);
    guard.hca.cqs.insert(
        h,
        Cq {
            ca,
            context: cq_context as usize,
            completion,
            armed: false,
            entries: VecDeque::new(),
        },
    );
    // SAFETY: the caller's out pointer.
    unsafe { *ph_cq = h as Handle };
    // SAFETY: the caller's size, in and out.
    let size = unsafe { &mut *p_size };
    *size = (*size).max(1);
    IB_SUCCESS
}

/// `ci_create_spl_qp` (ib_ci.h:998).
unsafe extern "C" fn create_spl_qp(
    h_pd: Handle,
    port_num: u8,
    _qp_context: *const c_void,
    _async: *const c_void,
    p_create_attr: *mut IbQpCreate,
    p_qp_attr: *mut IbQpAttr,
    ph_qp: *mut Handle,
) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ci_create_spl_qp", PASSIVE);
    let Some(ca) = ca_of_handle(h_pd) else {
        return IB_INVALID_PARAMETER;
    };
    // SAFETY: the caller's attributes.
    let create = unsafe { &*p_create_attr };
    let mut guard = state::lock();
    let (send_cq, recv_cq) = (create.h_sq_cq as usize, create.h_rq_cq as usize);
    let bound = |cq: usize| guard.hca.cqs.get(&cq).is_some_and(|c| c.ca == ca);
    if !bound(send_cq) || !bound(recv_cq) {
        return IB_INVALID_PARAMETER;
    }
    let h = new_handle(&mut guard.hca);
    guard.hca.qps.insert(
        h,
        Qp {
            ca,
            port_num,
            qp_type: create.qp_type,
            recv_cq,
            send_cq,
            state: IB_QPS_RESET,
            rq_depth: create.rq_depth,
            receives: VecDeque::new(),
            dma: 0,
        },
    );
    // SAFETY: the caller's attributes out, when given (the head only is written).
    if let Some(attr) = unsafe { p_qp_attr.as_mut() } {
        attr.h_pd = h_pd;
        attr.qp_type = create.qp_type;
        attr.sq_depth = create.sq_depth;
        attr.rq_depth = create.rq_depth;
    }
    // SAFETY: the caller's out pointer.
    unsafe { *ph_qp = h as Handle };
    IB_SUCCESS
}

/// Removes `qp`'s completions from `cq` (mlx4 `mlx4_ib_cq_clean`).
fn clean(hca: &mut Hca, cq: usize, qp: usize) {
    if let Some(c) = hca.cqs.get_mut(&cq) {
        c.entries.retain(|e| e.qp != qp);
    }
}

/// `ci_modify_qp` (ib_ci.h:1070): RESET drops the receives and cleans their completions
/// (`__mlx4_ib_modify_qp`); ERROR flushes the receives to the CQ.
unsafe extern "C" fn modify_qp(
    h_qp: Handle,
    p_modify_attr: *const IbQpMod,
    _p_qp_attr: *mut c_void,
    _umv: *mut c_void,
) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ci_modify_qp", DISPATCH);
    // SAFETY: the caller's modify attributes.
    let req = unsafe { (*p_modify_attr).req_state };
    let mut guard = state::lock();
    let hca = &mut guard.hca;
    let Some(qp) = hca.qps.get_mut(&(h_qp as usize)) else {
        return IB_INVALID_PARAMETER;
    };
    let allowed = match req {
        IB_QPS_RESET | IB_QPS_ERROR => true,
        IB_QPS_INIT => matches!(qp.state, IB_QPS_RESET | IB_QPS_INIT),
        IB_QPS_RTR => qp.state == IB_QPS_INIT,
        IB_QPS_RTS => matches!(qp.state, IB_QPS_RTR | IB_QPS_RTS),
        _ => false,
    };
    if !allowed {
        return IB_INVALID_QP_STATE;
    }
    qp.state = req;
    let recv_cq = qp.recv_cq;
    match req {
        IB_QPS_RESET => {
            qp.receives.clear();
            clean(hca, recv_cq, h_qp as usize);
        }
        IB_QPS_ERROR => {
            let flushed: Vec<u64> = qp.receives.drain(..).map(|(w, _)| w).collect();
            for wr_id in flushed {
                push(
                    hca,
                    recv_cq,
                    h_qp as usize,
                    wr_id,
                    IB_WCS_WR_FLUSHED_ERR,
                    0,
                    0,
                );
            }
        }
        _ => {}
    }
    IB_SUCCESS
}

/// `ci_destroy_qp` (ib_ci.h:1217): no work request of the QP completes after it.
unsafe extern "C" fn destroy_qp(h_qp: Handle, _timewait: u64) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ci_destroy_qp", PASSIVE);
    let guard = state::lock();
    let what = || "the HCA's DMA into QP1's receives before ci_destroy_qp returns".to_string();
    let (mut guard, _) = state::wait_until(guard, None, &what, |s| {
        s.hca.qps.get(&(h_qp as usize)).is_none_or(|q| q.dma == 0)
    });
    let hca = &mut guard.hca;
    let Some(qp) = hca.qps.remove(&(h_qp as usize)) else {
        return IB_INVALID_PARAMETER;
    };
    clean(hca, qp.recv_cq, h_qp as usize);
    clean(hca, qp.send_cq, h_qp as usize);
    IB_SUCCESS
}

/// `ci_destroy_cq` (ib_ci.h:1527): refused while a QP is bound to it.
unsafe extern "C" fn destroy_cq(h_cq: Handle) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ci_destroy_cq", PASSIVE);
    let mut guard = state::lock();
    let cq = h_cq as usize;
    if guard
        .hca
        .qps
        .values()
        .any(|q| q.recv_cq == cq || q.send_cq == cq)
    {
        return IB_RESOURCE_BUSY;
    }
    match guard.hca.cqs.remove(&cq) {
        Some(_) => IB_SUCCESS,
        None => IB_INVALID_PARAMETER,
    }
}

/// `ci_post_recv` (ib_ci.h:2593): more than the receive queue holds is refused at the
/// first request past it (`*pp_failed`, `IB_INSUFFICIENT_RESOURCES`).
unsafe extern "C" fn post_recv(
    h_qp: Handle,
    p_recv_wr: *mut IbRecvWr,
    pp_failed: *mut *mut IbRecvWr,
) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ci_post_recv", DISPATCH);
    let mut guard = state::lock();
    let Some(qp) = guard.hca.qps.get_mut(&(h_qp as usize)) else {
        return IB_INVALID_PARAMETER;
    };
    if qp.state == IB_QPS_RESET {
        return IB_INVALID_QP_STATE;
    }
    let mut wr = p_recv_wr;
    while !wr.is_null() {
        // SAFETY: the caller's NULL-terminated chain.
        let w = unsafe { &*wr };
        if qp.receives.len() >= qp.rq_depth as usize {
            if !pp_failed.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *pp_failed = wr };
            }
            return IB_INSUFFICIENT_RESOURCES;
        }
        let segments = if w.ds_array.is_null() {
            Vec::new()
        } else {
            // SAFETY: the request names `num_ds` segments.
            unsafe { std::slice::from_raw_parts(w.ds_array, w.num_ds as usize) }.to_vec()
        };
        qp.receives.push_back((w.wr_id, segments));
        wr = w.p_next;
    }
    IB_SUCCESS
}

fn next_entry(h_cq: Handle) -> Option<IbWc> {
    state::lock()
        .hca
        .cqs
        .get_mut(&(h_cq as usize))
        .and_then(|c| c.entries.pop_front())
        .map(|e| e.wc)
}

/// `ci_poll_cq` (ib_ci.h:2680; mlx4 `mlnx_poll_cq`, hca/direct.c): moves completions into
/// the free list's entries, which become the done list; `IB_NOT_FOUND` when none.
unsafe extern "C" fn poll_cq(
    h_cq: Handle,
    pp_free_wclist: *mut *mut IbWc,
    pp_done_wclist: *mut *mut IbWc,
) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ci_poll_cq", DISPATCH);
    // SAFETY: the caller's list pointers.
    if pp_free_wclist.is_null() || pp_done_wclist.is_null() || unsafe { *pp_free_wclist }.is_null()
    {
        return IB_INVALID_PARAMETER;
    }
    if !state::lock().hca.cqs.contains_key(&(h_cq as usize)) {
        return IB_INVALID_PARAMETER;
    }
    let mut done: *mut IbWc = core::ptr::null_mut();
    let mut tail: *mut *mut IbWc = &raw mut done;
    loop {
        // SAFETY: as above.
        let free = unsafe { *pp_free_wclist };
        if free.is_null() {
            break;
        }
        let Some(wc) = next_entry(h_cq) else {
            break;
        };
        // SAFETY: `free` is the caller's free entry, not yet on the done list.
        let entry = unsafe { &mut *free };
        let next_free = entry.p_next;
        *entry = IbWc {
            p_next: core::ptr::null_mut(),
            ..wc
        };
        // SAFETY: the caller's free-list head.
        unsafe { *pp_free_wclist = next_free };
        // SAFETY: `tail` is `done` or the previous done entry's `p_next`.
        unsafe { *tail = free };
        tail = &raw mut entry.p_next;
    }
    // SAFETY: the caller's out pointer.
    unsafe { *pp_done_wclist = done };
    if done.is_null() {
        IB_NOT_FOUND
    } else {
        IB_SUCCESS
    }
}

/// `ci_poll_cq_array` (ib_ci.h:2722; mlx4 `mlnx_poll_cq_array`): fills up to
/// `*p_num_entries` entries and says how many; `IB_NOT_FOUND` (count untouched) when
/// none.
unsafe extern "C" fn poll_cq_array(h_cq: Handle, p_num_entries: *mut i32, wc: *mut IbWc) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ci_poll_cq_array", DISPATCH);
    if p_num_entries.is_null() || wc.is_null() {
        return IB_INVALID_PARAMETER;
    }
    // SAFETY: the caller's count.
    let room = usize::try_from(unsafe { *p_num_entries }).unwrap_or(0);
    let mut n = 0;
    while n < room {
        let Some(entry) = next_entry(h_cq) else {
            break;
        };
        // SAFETY: the caller's array holds `room` > `n` entries.
        let slot = unsafe { wc.add(n) };
        // SAFETY: as above.
        unsafe { slot.write(entry) };
        n += 1;
    }
    if n == 0 {
        return IB_NOT_FOUND;
    }
    // SAFETY: as above.
    unsafe { *p_num_entries = n as i32 };
    IB_SUCCESS
}

/// `ci_enable_cq_notify` (ib_ci.h:2772): the next completion calls the CQ's handler (a
/// completion already there does too: the simulation does not lose it).
unsafe extern "C" fn enable_cq_notify(h_cq: Handle, _solicited: i32) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ci_enable_cq_notify", DISPATCH);
    let mut guard = state::lock();
    let Some(cq) = guard.hca.cqs.get_mut(&(h_cq as usize)) else {
        return IB_INVALID_PARAMETER;
    };
    cq.armed = true;
    let pending = !cq.entries.is_empty();
    drop(guard);
    if pending {
        notify(h_cq as usize);
    }
    IB_SUCCESS
}

/// An armed CQ's handler runs (the HCA's interrupt DPC, DISPATCH_LEVEL); disarms it.
fn notify(cq: usize) {
    let target = {
        let mut guard = state::lock();
        let Some(c) = guard.hca.cqs.get_mut(&cq).filter(|c| c.armed) else {
            return;
        };
        c.armed = false;
        c.completion.map(|f| (f, c.context))
    };
    if let Some((f, context)) = target {
        // SAFETY: the CQ owner's handler with its context, on a processor at
        // DISPATCH_LEVEL.
        run_at_dispatch(move || unsafe { f(context as *mut c_void) });
    }
}

fn push(hca: &mut Hca, cq: usize, qp: usize, wr_id: u64, status: i32, length: u32, from: u16) {
    if let Some(c) = hca.cqs.get_mut(&cq) {
        c.entries.push_back(Cqe {
            qp,
            wc: IbWc {
                p_next: core::ptr::null_mut(),
                wr_id,
                wc_type: IB_WC_RECV,
                length,
                vendor_specific: 0,
                status,
                recv_opt: 0,
                immediate_data: 0,
                remote_qp: 1u32.to_be(),
                pkey_index: 0,
                remote_lid: from.to_be(),
                remote_sl: 0,
                path_bits: 0,
            },
        });
    }
}

/// A MAD from LID `from_lid` reaches port `port_num` of CA `ca`: it lands in QP1's
/// oldest posted receive (GRH room first, IBA 11.4.1.2), scattered over the receive's
/// segments by DMA, and its completion goes on QP1's receive CQ (a receive too short
/// for it completes with `IB_WCS_LOCAL_LEN_ERR`). False if the port has no QP1 ready to
/// receive, or no receive posted (the MAD is dropped, as a UD QP drops it).
pub fn arrive(ca: usize, port_num: u8, from_lid: u16, mad: &[u8]) -> bool {
    let mut guard = state::lock();
    let hca = &mut guard.hca;
    if hca.gone.contains(&ca) {
        return false;
    }
    let Some((&h, qp)) = hca.qps.iter_mut().find(|(_, q)| {
        q.ca == ca
            && q.port_num == port_num
            && q.qp_type == IB_QPT_QP1
            && q.state & (IB_QPS_RTR | IB_QPS_RTS) != 0
    }) else {
        return false;
    };
    let Some((wr_id, segments)) = qp.receives.pop_front() else {
        hca.dropped += 1;
        return false;
    };
    qp.dma += 1;
    let recv_cq = qp.recv_cq;
    drop(guard);
    let mut message = vec![0u8; GRH_SIZE];
    message.extend_from_slice(&mad[..mad.len().min(MAD_SIZE)]);
    message.resize(GRH_SIZE + MAD_SIZE, 0);
    let room: usize = segments.iter().map(|s| s.length as usize).sum();
    let status = if room < message.len() {
        IB_WCS_LOCAL_LEN_ERR
    } else {
        // The GRH's room is not written (no GRH on a LID-routed MAD); the rest is.
        let mut at = 0;
        for s in &segments {
            let end = (at + s.length as usize).min(message.len());
            if end > GRH_SIZE.max(at) {
                let from = GRH_SIZE.max(at);
                if !physical::dma_write(s.vaddr + (from - at) as u64, &message[from..end]) {
                    bugcheck(
                        Rule::Simulation,
                        format_args!("the HCA's DMA to physical {:#x}: no such page", s.vaddr),
                    );
                }
            }
            at = end;
        }
        IB_WCS_SUCCESS
    };
    let length = if status == IB_WCS_SUCCESS {
        message.len() as u32
    } else {
        0
    };
    let mut guard = state::lock();
    push(&mut guard.hca, recv_cq, h, wr_id, status, length, from_lid);
    if let Some(qp) = guard.hca.qps.get_mut(&h) {
        qp.dma -= 1;
    }
    drop(guard);
    state::changed();
    notify(recv_cq);
    true
}

/// The same verbs at other addresses ([`reload_driver`]).
mod reloaded {
    use super::*;

    pub unsafe extern "C" fn create_spl_qp(
        h_pd: Handle,
        port_num: u8,
        qp_context: *const c_void,
        cb: *const c_void,
        p_create_attr: *mut IbQpCreate,
        p_qp_attr: *mut IbQpAttr,
        ph_qp: *mut Handle,
    ) -> i32 {
        // SAFETY: the caller's arguments, passed on.
        unsafe {
            super::create_spl_qp(
                h_pd,
                port_num,
                qp_context,
                cb,
                p_create_attr,
                p_qp_attr,
                ph_qp,
            )
        }
    }

    pub unsafe extern "C" fn modify_qp(
        h_qp: Handle,
        p_modify_attr: *const IbQpMod,
        p_qp_attr: *mut c_void,
        umv: *mut c_void,
    ) -> i32 {
        // SAFETY: as above.
        unsafe { super::modify_qp(h_qp, p_modify_attr, p_qp_attr, umv) }
    }

    pub unsafe extern "C" fn destroy_qp(h_qp: Handle, timewait: u64) -> i32 {
        // SAFETY: as above.
        unsafe { super::destroy_qp(h_qp, timewait) }
    }

    pub unsafe extern "C" fn destroy_cq(h_cq: Handle) -> i32 {
        // SAFETY: as above.
        unsafe { super::destroy_cq(h_cq) }
    }

    pub unsafe extern "C" fn post_recv(
        h_qp: Handle,
        p_recv_wr: *mut IbRecvWr,
        pp_failed: *mut *mut IbRecvWr,
    ) -> i32 {
        // SAFETY: as above.
        unsafe { super::post_recv(h_qp, p_recv_wr, pp_failed) }
    }

    pub unsafe extern "C" fn poll_cq(
        h_cq: Handle,
        pp_free: *mut *mut IbWc,
        pp_done: *mut *mut IbWc,
    ) -> i32 {
        // SAFETY: as above.
        unsafe { super::poll_cq(h_cq, pp_free, pp_done) }
    }

    pub unsafe extern "C" fn poll_cq_array(h_cq: Handle, p_num: *mut i32, wc: *mut IbWc) -> i32 {
        // SAFETY: as above.
        unsafe { super::poll_cq_array(h_cq, p_num, wc) }
    }
}
