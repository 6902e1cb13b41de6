//! ibbus's verbs query and AL's special-QP service for QP1, as they drive the HCA's verbs
//! table (lucasz93/WinOFED):
//!
//! - ibbus, at every registration of the CA (`fdo_start` and power-up, bus_pnp.c:566,
//!   1721), queries `GUID_RDMA_INTERFACE_VERBS` from the top of the HCA's stack
//!   (`__register_ca` -> `__get_ifc`, bus_pnp.c:358-430: `IoGetAttachedDeviceReference`,
//!   `Size = sizeof(RDMA_INTERFACE_VERBS)`, `Version = VerbsVersion(2, 7)`,
//!   `InterfaceSpecificData` = its FDO extension): the IRP passes the filter, whose
//!   completion routine sees the HCA's answer before ibbus does. A version other than the
//!   requested one is released and refused (bus_pnp.c:413-421); AL refuses a
//!   `ci_interface_t::version` other than `VERBS_VERSION` (al_mgr.c:282-289). AL then
//!   keeps its copy of the table (`ib_register_ca`, al_ci_ca.c) and calls only that.
//! - AL's special-QP service per port (al_smi.c `create_spl_qp_svc`, 547-870): a send
//!   and a receive CQ (`create_cq`), QP1 (`create_spl_qp`), INIT/RTR/RTS (`modify_qp`,
//!   al_qp.c `init_dgrm_svc`), receives posted up to the depth (`spl_qp_svc_post_recvs`,
//!   3397-3445: one GRH + MAD segment whose `vaddr` is the buffer's **physical** address,
//!   al_mad_pool.c `cl_get_physaddr`), and the receive CQ armed.
//! - Receive completions (`spl_qp_comp`, 2725-2865, DISPATCH_LEVEL): QP1's receive CQ is
//!   polled one completion at a time (`poll_cq` with one free entry), each element
//!   replaced by a fresh receive, the MAD read from the buffer *after* the poll returns
//!   and handed to the MAD dispatcher (`al::dispatch_received`); an error completion
//!   resets QP1 (`spl_qp_svc_reset_cb`, 3500-3600: RESET, receives returned, INIT/RTR/RTS,
//!   receives posted). [`set_poll`] makes the service poll with `poll_cq_array` instead,
//!   the table's other poll entry, as a verbs client other than AL may.
//! - Deregistration (`ib_deregister_ca`, al_smi.c:960-1020): `destroy_qp`, then both
//!   CQs' `destroy_cq`; ibbus then releases the interface (bus_pnp.c:777-784).
//!
//! [`set_shape`] and [`reset`] let a scenario post receives that are not in AL's shape.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;

use crate::hca::{
    self, CREATE_CQ, CREATE_SPL_QP, DESTROY_CQ, DESTROY_QP, ENABLE_CQ_NOTIFY, GRH_SIZE, Handle,
    IB_QPS_INIT, IB_QPS_RESET, IB_QPS_RTR, IB_QPS_RTS, IB_QPT_QP0, IB_QPT_QP1, IB_SUCCESS,
    IB_WCS_SUCCESS, IB_WCS_WR_FLUSHED_ERR, IbLocalDs, IbQpAttr, IbQpCreate, IbQpMod, IbRecvWr,
    IbWc, MAD_SIZE, MODIFY_QP, POLL_CQ, POLL_CQ_ARRAY, POST_RECV, RdmaInterfaceVerbs,
};
use crate::physical::{PAGE_SIZE, Pages};
use crate::state;
use crate::thread::{DISPATCH, PASSIVE, call_driver};
use crate::verifier::{Rule, bugcheck};
use crate::*;

/// QP1's receive depth (AL's `max_qp_depth` is larger; a small one makes reposts wrap).
const DEPTH: u32 = 16;
/// `MAD_BLOCK_GRH_SIZE`: GRH + MAD, AL's receive segment (al_mad_pool.c).
const RECEIVE_SIZE: usize = GRH_SIZE + MAD_SIZE;
/// Completions `poll_cq_array` asks for at once.
const ARRAY_ROOM: usize = 4;
/// ibbus's FDO extension as `InterfaceSpecificData` (any non-NULL value).
const IBBUS_EXTENSION: usize = 0xB05E_0000;

/// The layout of the receives a port's service posts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// AL's: one segment of GRH + MAD inside one page.
    AlMad,
    /// GRH and MAD in two segments.
    TwoSegments,
    /// A whole GRH + MAD segment followed by another segment.
    ExtraSegment,
    /// One GRH + MAD segment that crosses a page boundary (physically contiguous pages).
    CrossingPage,
    /// One segment shorter than GRH + MAD (the HCA completes it with a length error).
    Short,
}

/// Which poll entry the service uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// `poll_cq` with one free entry (AL's `spl_qp_comp`).
    List,
    /// `poll_cq_array` with room for [`ARRAY_ROOM`].
    Array,
}

/// A posted receive: AL's MAD element with its buffer.
struct Element {
    wr_id: u64,
    pages: Pages,
    /// (offset into `pages`, length) per segment.
    segments: Vec<(usize, u32)>,
}

impl Element {
    fn new(wr_id: u64, shape: Shape) -> Self {
        let (pages, segments) = match shape {
            Shape::AlMad => (1, vec![(0x100, RECEIVE_SIZE as u32)]),
            Shape::TwoSegments => (1, vec![(0, GRH_SIZE as u32), (0x200, MAD_SIZE as u32)]),
            Shape::ExtraSegment => (1, vec![(0x100, RECEIVE_SIZE as u32), (0x800, 64)]),
            Shape::CrossingPage => (2, vec![(PAGE_SIZE - 100, RECEIVE_SIZE as u32)]),
            Shape::Short => (1, vec![(0x100, 200)]),
        };
        Self {
            wr_id,
            pages: Pages::new(pages),
            segments,
        }
    }

    fn data_segments(&self) -> Vec<IbLocalDs> {
        self.segments
            .iter()
            .map(|&(offset, length)| IbLocalDs {
                vaddr: self.pages.pa(offset),
                length,
                lkey: 0,
            })
            .collect()
    }

    /// The first `length` received bytes, gathered from the segments.
    fn read(&self, length: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for &(offset, len) in &self.segments {
            let n = (len as usize).min(length - out.len());
            out.extend(crate::physical::read(self.pages.va(offset), n));
            if out.len() == length {
                break;
            }
        }
        out
    }
}

/// One port's special-QP service.
struct Service {
    ca: usize,
    port_num: u8,
    qp_type: i32,
    port_lid: u16,
    qp: usize,
    send_cq: usize,
    recv_cq: usize,
    /// `recv_queue`: the elements posted and not completed.
    posted: Vec<Element>,
    active: bool,
    shape: Shape,
    poll: Poll,
}

#[derive(Default)]
pub struct SplQp {
    /// AL's copy of each CA's verbs table (`al_ci_ca_t::verbs`).
    tables: HashMap<usize, Box<RdmaInterfaceVerbs>>,
    /// Services by id (their receive CQ's context).
    services: HashMap<usize, Service>,
    next: usize,
    next_wr_id: u64,
    /// `wr_id`s of elements back in AL's pool: the next receives reuse them, last freed
    /// first, as AL's pool hands out the element it got back (`wr_id` is its address).
    free_wr_ids: Vec<u64>,
    /// The last verbs query's status per CA.
    pub query_status: HashMap<usize, NTSTATUS>,
    /// Completions of each status AL saw on QP1's receive CQs.
    pub completions: HashMap<i32, usize>,
    /// QP1 resets done.
    pub resets: usize,
}

/// QP1 resets AL has done (after an error completion, or [`reset`]).
pub fn resets() -> usize {
    state::lock().spl.resets
}

/// The status of the last verbs query ibbus made for CA `ca` (None: none made).
pub fn query_status(ca: usize) -> Option<NTSTATUS> {
    state::lock().spl.query_status.get(&ca).copied()
}

/// Receive completions AL polled with `status` (`ib_wc_status_t`).
pub fn completions(status: i32) -> usize {
    state::lock()
        .spl
        .completions
        .get(&status)
        .copied()
        .unwrap_or(0)
}

/// Receives posted on the QP1 of CA `ca`'s port `port_num` (None: no service).
pub fn posted(ca: usize, port_num: u8) -> Option<usize> {
    state::lock()
        .spl
        .services
        .values()
        .find(|s| s.ca == ca && s.port_num == port_num && s.qp_type == IB_QPT_QP1)
        .map(|s| s.posted.len())
}

/// The entries of AL's copy of CA `ca`'s verbs table (None: AL has none).
pub fn al_entries(ca: usize) -> Option<[*const c_void; hca::VERBS]> {
    state::lock().spl.tables.get(&ca).map(|t| t.verbs.verbs)
}

/// Which poll entry CA `ca`'s services use from now on.
pub fn set_poll(ca: usize, poll: Poll) {
    for s in state::lock().spl.services.values_mut() {
        if s.ca == ca {
            s.poll = poll;
        }
    }
}

/// The shape of the receives CA `ca`'s port `port_num` posts from now on (see [`reset`]).
pub fn set_shape(ca: usize, port_num: u8, shape: Shape) {
    for s in state::lock().spl.services.values_mut() {
        if s.ca == ca && s.port_num == port_num && s.qp_type == IB_QPT_QP1 {
            s.shape = shape;
        }
    }
}

/// A verbs entry of AL's copy of CA `ca`'s table as a `T`.
fn entry<T: Copy>(ca: usize, index: usize) -> Option<T> {
    const { assert!(size_of::<T>() == size_of::<*const c_void>()) };
    let f = state::lock()
        .spl
        .tables
        .get(&ca)
        .and_then(|t| t.verbs.verbs.get(index).copied())?;
    if f.is_null() {
        return None;
    }
    // SAFETY: entry `index` of a `ci_interface_t` is a function of type `T` (the callers
    // name the entry's C type).
    Some(unsafe { core::mem::transmute_copy::<*const c_void, T>(&f) })
}

type CreateCq = unsafe extern "C" fn(
    Handle,
    *const c_void,
    *const c_void,
    Option<hca::CompletionCb>,
    *mut u32,
    *mut Handle,
    *mut c_void,
) -> i32;
type CreateSplQp = unsafe extern "C" fn(
    Handle,
    u8,
    *const c_void,
    *const c_void,
    *mut IbQpCreate,
    *mut IbQpAttr,
    *mut Handle,
) -> i32;
type ModifyQp = unsafe extern "C" fn(Handle, *const IbQpMod, *mut c_void, *mut c_void) -> i32;
type DestroyQp = unsafe extern "C" fn(Handle, u64) -> i32;
type DestroyCq = unsafe extern "C" fn(Handle) -> i32;
type PostRecv = unsafe extern "C" fn(Handle, *mut IbRecvWr, *mut *mut IbRecvWr) -> i32;
type PollCq = unsafe extern "C" fn(Handle, *mut *mut IbWc, *mut *mut IbWc) -> i32;
type PollCqArray = unsafe extern "C" fn(Handle, *mut i32, *mut IbWc) -> i32;
type EnableCqNotify = unsafe extern "C" fn(Handle, i32) -> i32;

/// Calls a table entry as AL does: through the pointer it copied, which is the filter's
/// thunk where the hook patched it (so the call is the driver's code), at `level`.
fn call<T: Copy, R>(
    ca: usize,
    index: usize,
    what: &str,
    level: u8,
    f: impl FnOnce(T) -> R,
) -> Option<R> {
    let verb = entry::<T>(ca, index)?;
    Some(call_driver(what, level, || f(verb)))
}

/// ibbus registers CA `ca` (`__register_ca`): the verbs query through the HCA's stack,
/// then AL's QP1 service on each port. Nothing for a CA whose verbs are not simulated.
pub fn register(ca: usize) {
    let config = state::lock().al.cas.get(ca).cloned();
    let Some(config) = config.filter(|c| c.verbs) else {
        return;
    };
    // SAFETY: plain C structure: all-zero is a valid (empty) table.
    let mut table: Box<RdmaInterfaceVerbs> = Box::new(unsafe { core::mem::zeroed() });
    let g = hca::GUID_RDMA_INTERFACE_VERBS;
    let guid = GUID {
        Data1: g.0,
        Data2: g.1,
        Data3: g.2,
        Data4: g.3,
    };
    let interface = (&raw mut *table).cast::<INTERFACE>();
    let size = size_of::<RdmaInterfaceVerbs>() as u16;
    let version = hca::RDMA_INTERFACE_VERBS_VERSION;
    let top = crate::io::filter_of_ca(ca);
    let status = match top {
        Some(device) => crate::io::query_interface_with(
            device,
            &guid,
            interface,
            size,
            version,
            IBBUS_EXTENSION as PVOID,
        ),
        None => hca::answer_verbs_query(ca, config.ca_guid, interface, size, version),
    };
    state::lock().spl.query_status.insert(ca, status);
    if !NT_SUCCESS(status) {
        crate::state::dbg_print(format_args!(
            "ibbus: __register_ca: GUID_RDMA_INTERFACE_VERBS failed: {status:#x}"
        ));
        return;
    }
    let release = |t: &RdmaInterfaceVerbs| {
        if let Some(deref) = t.header.InterfaceDereference {
            // SAFETY: the HCA's dereference with its own context.
            unsafe { deref(t.header.Context) };
        }
    };
    if table.header.Version != version || table.verbs.version != hca::verbs_version(ca) {
        // bus_pnp.c:413-421; al_mgr.c:282-289 (AL's own build's version).
        release(&table);
        return;
    }
    state::lock().spl.tables.insert(ca, table);
    // `spl_qp0_agent_pnp_cb` and `spl_qp1_agent_pnp_cb` on each port's IB_PNP_PORT_ADD:
    // QP0's service, then QP1's (al_smi.c:451-495, `spl_qp_agent_pnp`). Nothing arrives on QP0 here; its verbs pass the hook untracked.
    for port in &config.ports {
        for qp_type in [IB_QPT_QP0, IB_QPT_QP1] {
            create_service(ca, port.port_num, port.lid, qp_type);
        }
    }
}

/// `create_spl_qp_svc` for QP0 or QP1 of CA `ca`'s port `port_num` (PASSIVE_LEVEL).
fn create_service(ca: usize, port_num: u8, port_lid: u16, qp_type: i32) {
    let id = {
        let mut guard = state::lock();
        guard.spl.next += 1;
        0x5B10_0000 + guard.spl.next
    };
    let h_ca = hca::handle_of_ca(ca);
    let cq = |what: &str, context: usize| {
        let mut size = DEPTH;
        let mut h: Handle = core::ptr::null_mut();
        let status = call::<CreateCq, _>(ca, CREATE_CQ, what, PASSIVE, |f| {
            // SAFETY: the HCA's create_cq with AL's out pointers.
            unsafe {
                f(
                    h_ca,
                    context as *const c_void,
                    core::ptr::null(),
                    Some(completion),
                    &raw mut size,
                    &raw mut h,
                    core::ptr::null_mut(),
                )
            }
        });
        (status == Some(IB_SUCCESS)).then_some(h as usize)
    };
    let (Some(send_cq), Some(recv_cq)) = (
        cq("ci_create_cq (send)", 0),
        cq("ci_create_cq (receive)", id),
    ) else {
        bugcheck(
            Rule::Simulation,
            format_args!("AL could not create QP1's CQs"),
        );
    };
    let mut create = IbQpCreate {
        qp_type,
        sq_max_inline: 0,
        sq_depth: DEPTH,
        rq_depth: DEPTH,
        sq_sge: 1,
        rq_sge: 1,
        h_sq_cq: send_cq as Handle,
        h_rq_cq: recv_cq as Handle,
        h_srq: core::ptr::null_mut(),
        sq_signaled: 1,
    };
    // SAFETY: plain C structure.
    let mut attr: IbQpAttr = unsafe { core::mem::zeroed() };
    let mut qp: Handle = core::ptr::null_mut();
    let status = call::<CreateSplQp, _>(ca, CREATE_SPL_QP, "ci_create_spl_qp", PASSIVE, |f| {
        // SAFETY: AL's arguments: its PD on the CA, the port, its attributes and outputs.
        unsafe {
            f(
                h_ca,
                port_num,
                id as *const c_void,
                core::ptr::null(),
                &raw mut create,
                &raw mut attr,
                &raw mut qp,
            )
        }
    });
    if status != Some(IB_SUCCESS) || attr.rq_depth < DEPTH {
        bugcheck(
            Rule::Simulation,
            format_args!(
                "AL could not create QP{} on port {port_num}: {status:?}",
                qp_type - IB_QPT_QP0
            ),
        );
    }
    state::lock().spl.services.insert(
        id,
        Service {
            ca,
            port_num,
            qp_type,
            port_lid,
            qp: qp as usize,
            send_cq,
            recv_cq,
            posted: Vec::new(),
            active: true,
            shape: Shape::AlMad,
            poll: Poll::List,
        },
    );
    ready(id);
}

/// INIT, RTR, RTS (`init_dgrm_svc`), receives posted, the receive CQ armed.
fn ready(id: usize) {
    let Some((ca, qp, recv_cq)) = service(id).map(|s| (s.0, s.1, s.3)) else {
        return;
    };
    for state in [IB_QPS_INIT, IB_QPS_RTR, IB_QPS_RTS] {
        modify(ca, qp, state);
    }
    // Under AL's spin lock (al_smi.c:3397): DISPATCH_LEVEL.
    let before = crate::thread::irql();
    crate::thread::set_irql(DISPATCH);
    post_receives(id);
    crate::thread::set_irql(before);
    rearm(ca, recv_cq);
}

/// (ca, qp, send CQ, receive CQ) of a service.
fn service(id: usize) -> Option<(usize, usize, usize, usize)> {
    state::lock()
        .spl
        .services
        .get(&id)
        .map(|s| (s.ca, s.qp, s.send_cq, s.recv_cq))
}

fn modify(ca: usize, qp: usize, req_state: u32) {
    let attr = IbQpMod {
        req_state,
        rest: [0; 31],
    };
    let status = call::<ModifyQp, _>(ca, MODIFY_QP, "ci_modify_qp", PASSIVE, |f| {
        // SAFETY: the QP and AL's modify attributes.
        unsafe {
            f(
                qp as Handle,
                &raw const attr,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            )
        }
    });
    if status != Some(IB_SUCCESS) {
        bugcheck(
            Rule::Simulation,
            format_args!("AL's modify_qp of QP1 to {req_state:#x}: {status:?}"),
        );
    }
}

fn rearm(ca: usize, cq: usize) {
    let _ = call::<EnableCqNotify, _>(ca, ENABLE_CQ_NOTIFY, "ci_enable_cq_notify", DISPATCH, |f| {
        // SAFETY: the CQ.
        unsafe { f(cq as Handle, 0) }
    });
}

/// `spl_qp_svc_post_recvs` (under AL's spin lock: DISPATCH_LEVEL): elements up to the
/// depth, each queued on the service before it is posted.
fn post_receives(id: usize) {
    loop {
        let made = {
            let mut guard = state::lock();
            // AL's wr_id is its element's address (al_smi.c:3419).
            let wr_id = match guard.spl.free_wr_ids.pop() {
                Some(w) => w,
                None => {
                    guard.spl.next_wr_id += 1;
                    0xFFFF_A000_0000_0000 + guard.spl.next_wr_id * 0x140
                }
            };
            let Some(s) = guard.spl.services.get_mut(&id) else {
                return;
            };
            if !s.active || s.posted.len() >= DEPTH as usize {
                return;
            }
            let shape = s.shape;
            let (ca, qp) = (s.ca, s.qp);
            drop(guard);
            let element = Element::new(wr_id, shape);
            let mut ds = element.data_segments();
            let mut guard = state::lock();
            let Some(s) = guard.spl.services.get_mut(&id) else {
                return;
            };
            s.posted.push(element);
            (ca, qp, wr_id, ds.as_mut_ptr(), ds.len(), ds)
        };
        let (ca, qp, wr_id, ds_ptr, num_ds, _ds) = made;
        let mut wr = IbRecvWr {
            p_next: core::ptr::null_mut(),
            wr_id,
            num_ds: num_ds as u32,
            ds_array: ds_ptr,
        };
        let status = call::<PostRecv, _>(ca, POST_RECV, "ci_post_recv", DISPATCH, |f| {
            // SAFETY: QP1 and AL's one-request chain (no failed-request pointer, as AL).
            unsafe { f(qp as Handle, &raw mut wr, core::ptr::null_mut()) }
        });
        if status != Some(IB_SUCCESS) {
            if let Some(s) = state::lock().spl.services.get_mut(&id) {
                s.posted.retain(|e| e.wr_id != wr_id);
                put_back([wr_id]);
            }
            return;
        }
    }
}

/// The receive CQ's handler (`ci_completion_cb_t`, DISPATCH_LEVEL): `spl_qp_comp`.
unsafe extern "C" fn completion(context: *mut c_void) {
    let id = context as usize;
    let Some((ca, recv_cq, poll)) = state::lock()
        .spl
        .services
        .get(&id)
        .filter(|s| s.active)
        .map(|s| (s.ca, s.recv_cq, s.poll))
    else {
        return;
    };
    loop {
        let polled = match poll {
            Poll::List => poll_one(ca, recv_cq),
            Poll::Array => poll_array(ca, recv_cq),
        };
        if polled.is_empty() {
            break;
        }
        for wc in polled {
            received(id, &wc);
        }
    }
    rearm(ca, recv_cq);
}

fn poll_one(ca: usize, cq: usize) -> Vec<IbWc> {
    // SAFETY: plain C structure.
    let mut wc: IbWc = unsafe { core::mem::zeroed() };
    let mut free: *mut IbWc = &raw mut wc;
    let mut done: *mut IbWc = core::ptr::null_mut();
    let status = call::<PollCq, _>(ca, POLL_CQ, "ci_poll_cq", DISPATCH, |f| {
        // SAFETY: the CQ and AL's one-entry free list.
        unsafe { f(cq as Handle, &raw mut free, &raw mut done) }
    });
    if status == Some(IB_SUCCESS) && done == &raw mut wc {
        vec![wc]
    } else {
        Vec::new()
    }
}

fn poll_array(ca: usize, cq: usize) -> Vec<IbWc> {
    // SAFETY: plain C structures.
    let mut wcs: [IbWc; ARRAY_ROOM] = unsafe { core::mem::zeroed() };
    let mut n = ARRAY_ROOM as i32;
    let status = call::<PollCqArray, _>(ca, POLL_CQ_ARRAY, "ci_poll_cq_array", DISPATCH, |f| {
        // SAFETY: the CQ and AL's array of ARRAY_ROOM entries.
        unsafe { f(cq as Handle, &raw mut n, wcs.as_mut_ptr()) }
    });
    if status != Some(IB_SUCCESS) {
        return Vec::new();
    }
    wcs[..usize::try_from(n).unwrap_or(0).min(ARRAY_ROOM)].to_vec()
}

/// One receive completion: the element leaves the queue, a fresh one is posted, the MAD
/// goes to the dispatcher (read now: after the poll, as AL reads it).
fn received(id: usize, wc: &IbWc) {
    let taken = {
        let mut guard = state::lock();
        *guard.spl.completions.entry(wc.status).or_default() += 1;
        let Some(s) = guard.spl.services.get_mut(&id) else {
            return;
        };
        let Some(i) = s.posted.iter().position(|e| e.wr_id == wc.wr_id) else {
            drop(guard);
            bugcheck(
                Rule::Simulation,
                format_args!(
                    "QP1 completed wr_id {:#x}, which AL never posted (a completion changed on its way)",
                    wc.wr_id
                ),
            );
        };
        (s.posted.swap_remove(i), s.ca, s.port_lid)
    };
    let (element, ca, port_lid) = taken;
    post_receives(id);
    match wc.status {
        IB_WCS_SUCCESS => {
            let bytes = element.read((wc.length as usize).min(RECEIVE_SIZE));
            put_back([element.wr_id]);
            drop(element);
            if let Some(mad) = bytes.get(GRH_SIZE..) {
                crate::al::dispatch_received(ca, port_lid, u16::from_be(wc.remote_lid), mad);
            }
        }
        IB_WCS_WR_FLUSHED_ERR => put_back([element.wr_id]),
        _ => {
            put_back([element.wr_id]);
            // spl_qp_comp: an error completion resets the service (on AL's async thread).
            let worker = std::thread::Builder::new()
                .name("al-spl-qp-reset".into())
                .spawn(move || reset_service(id));
            if worker.is_err() {
                bugcheck(
                    Rule::Simulation,
                    format_args!("AL's reset worker could not start"),
                );
            }
        }
    }
}

/// Elements back in AL's pool (`ib_put_mad`).
fn put_back(wr_ids: impl IntoIterator<Item = u64>) {
    let wr_ids: Vec<u64> = wr_ids.into_iter().collect();
    state::lock().spl.free_wr_ids.extend(wr_ids);
}

/// `spl_qp_svc_reset_cb` (PASSIVE_LEVEL): RESET, the receives returned to the pool,
/// INIT/RTR/RTS, receives posted, the CQ armed.
fn reset_service(id: usize) {
    // AL's async processing (`gp_async_proc_mgr`) runs one item at a time.
    static ASYNC_PROC: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ASYNC_PROC.lock().unwrap_or_else(|e| e.into_inner());
    let Some((ca, qp, _, _)) = service(id) else {
        return;
    };
    // `spl_qp_svc_reset`: the service leaves SPL_QP_ACTIVE (completions are not handled),
    // and the reset waits until no completion handler uses it (al_smi.c:3493-3494, 3530-3534).
    if let Some(s) = state::lock().spl.services.get_mut(&id) {
        s.active = false;
    }
    idle("QP1's completion handlers before AL resets the special QP");
    modify(ca, qp, IB_QPS_RESET);
    let returned = state::lock().spl.services.get_mut(&id).map(|s| {
        s.active = true;
        std::mem::take(&mut s.posted)
    });
    put_back(returned.iter().flatten().map(|e| e.wr_id));
    drop(returned);
    ready(id);
    state::lock().spl.resets += 1;
}

/// Resets QP1 of CA `ca`'s port `port_num` as AL does after an error completion (its
/// receives then take the port's [`set_shape`]).
pub fn reset(ca: usize, port_num: u8) {
    let id = state::lock()
        .spl
        .services
        .iter()
        .find(|(_, s)| s.ca == ca && s.port_num == port_num && s.qp_type == IB_QPT_QP1)
        .map(|(id, _)| *id);
    if let Some(id) = id {
        reset_service(id);
    }
}

/// Waits until no completion handler runs or is queued.
fn idle(what: &str) {
    let guard = state::lock();
    let what = || what.to_string();
    drop(state::wait_until(guard, None, &what, |s| {
        s.sched.dispatch.is_empty() && s.sched.calls_running == 0
    }));
}

/// ibbus deregisters CA `ca` (`ib_deregister_ca`, then the interface released): each
/// port's service goes (no completion handler runs after), QP1 and its CQs destroyed
/// through the table.
pub fn deregister(ca: usize) {
    let ids: Vec<usize> = {
        let mut guard = state::lock();
        let ids: Vec<usize> = guard
            .spl
            .services
            .iter()
            .filter(|(_, s)| s.ca == ca)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some(s) = guard.spl.services.get_mut(id) {
                s.active = false;
            }
        }
        ids
    };
    // The service's in-use count: a completion handler running ends first.
    idle("QP1's completion handlers before AL destroys the special QP");
    for id in ids {
        let Some((_, qp, send_cq, recv_cq)) = service(id) else {
            continue;
        };
        let destroyed = call::<DestroyQp, _>(ca, DESTROY_QP, "ci_destroy_qp", PASSIVE, |f| {
            // SAFETY: QP1, destroyed once.
            unsafe { f(qp as Handle, 0) }
        });
        let mut cqs = Vec::new();
        for cq in [send_cq, recv_cq] {
            cqs.push(call::<DestroyCq, _>(
                ca,
                DESTROY_CQ,
                "ci_destroy_cq",
                PASSIVE,
                |f| {
                    // SAFETY: a CQ of the service, no QP bound to it any more.
                    unsafe { f(cq as Handle) }
                },
            ));
        }
        if destroyed != Some(IB_SUCCESS) || cqs.iter().any(|s| *s != Some(IB_SUCCESS)) {
            bugcheck(
                Rule::Simulation,
                format_args!("AL's destruction of QP1: {destroyed:?}, CQs {cqs:?}"),
            );
        }
        // The receive elements go back to the pool (al_smi.c:1018, the free routine).
        let gone = state::lock().spl.services.remove(&id);
        put_back(gone.iter().flat_map(|s| s.posted.iter().map(|e| e.wr_id)));
        drop(gone);
    }
    let table = state::lock().spl.tables.remove(&ca);
    if let Some(t) = table
        && let Some(deref) = t.header.InterfaceDereference
    {
        // SAFETY: the HCA's dereference with its own context (bus_pnp.c:777-784).
        unsafe { deref(t.header.Context) };
    }
}
