//! The 22 functions of `iba_cm_interface`, in the header's order, each a trampoline onto
//! the dispatch layer's kernel-client calls with AL's semantics (`core/al/kernel/al_cm.c`).
//!
//! Calling convention: `extern "C"`, which on x86_64-pc-windows-msvc is the one x64
//! convention the header's function pointers use.
//!
//! Every function checks what C can get wrong before anything changes: a pointer that is
//! not an id of this CM (compared with the pool's bounds, never read) is
//! STATUS_INVALID_HANDLE; a null required pointer, a byte count with a null buffer, an
//! out-of-range code is STATUS_INVALID_PARAMETER. Downcalls run inside
//! `Device::without_client_callbacks` (the caller may hold the spin lock its callback
//! takes), and ask for a deferred delivery when they leave events ready.

use core::ffi::c_void;

use ibcm_cep::{CmError, ConnectParams, Event, ListenParams, PathRecord, RepParams};
use ibcm_cep::{QpAttributes, RejectParams, SidrParams, SidrReplyParams};
use ibcm_endpoint::{ClientId, Device, status_of};
use ibcm_mad::{AprStatus, Failover, Mtu, RejReason, SidrStatus};

use crate::abi::{
    Be16, Be64, IbPathRec, IbQpMod, IbaCmApr, IbaCmCallback, IbaCmEvent, IbaCmEventData, IbaCmId,
    IbaCmInterface, IbaCmLap, IbaCmRep, IbaCmReq, IbaCmSidrRep, IbaCmSidrReq, IbaCmSidrReqEvent,
    NtStatus, event_type, pdata, rdma_cm, status,
};
use crate::convert::transport_from_qp_type;
use crate::convert::{path_from_abi, path_to_abi, qp_mod, qp_state_from_abi, req_event};
use crate::instance::{Backend, Instance, find_id, instance_at, read_callback};
use crate::slots::{PostCheck, SidrStore, Use};

type Res<T> = Result<T, NtStatus>;

fn nt(r: Res<()>) -> NtStatus {
    match r {
        Ok(()) => status::SUCCESS,
        Err(s) => s,
    }
}

/// The instance, slot use and endpoint of a live id.
fn lookup<B: Backend>(p_id: *mut IbaCmId) -> Res<(&'static Instance<B>, Use, ClientId)> {
    let (inst, u, meta) = find_id::<B>(p_id).ok_or(status::INVALID_HANDLE)?;
    let client = meta.client.ok_or(status::INVALID_HANDLE)?;
    Ok((inst, u, client))
}

/// Runs a downcall on a live id: no callback on this thread meanwhile, a deferred
/// delivery asked for if it left events ready.
fn op<B: Backend, T>(
    p_id: *mut IbaCmId,
    f: impl FnOnce(&Instance<B>, &Device<B::Platform>, Use, ClientId) -> Res<T>,
) -> Res<T> {
    let (inst, u, client) = lookup::<B>(p_id)?;
    let d = inst.device();
    let r = d.without_client_callbacks(|| f(inst, d, u, client));
    inst.after_downcall();
    r
}

fn cm<T>(r: Result<T, CmError>) -> Res<T> {
    r.map_err(status_of)
}

/// The bytes of a (pointer, length) pair; a null pointer only with length 0.
///
/// # Safety
///
/// A non-null `p` is valid for reads of `len` bytes for the call (the header's contract).
unsafe fn bytes<'a>(p: *const c_void, len: u8) -> Res<&'a [u8]> {
    match (p.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(status::INVALID_PARAMETER),
        // SAFETY: per the contract.
        (false, n) => Ok(unsafe { core::slice::from_raw_parts(p.cast::<u8>(), usize::from(n)) }),
    }
}

/// A copy of a required input structure.
///
/// # Safety
///
/// A non-null `p` points to an initialised `T` (the header's contract).
unsafe fn read<T: Copy>(p: *const T) -> Res<T> {
    if p.is_null() {
        return Err(status::INVALID_PARAMETER);
    }
    // SAFETY: per the contract; unaligned, as C callers may pack their structures.
    Ok(unsafe { p.read_unaligned() })
}

/// Writes through a required output pointer.
///
/// # Safety
///
/// A non-null `p` is valid for a write of `T`.
unsafe fn write<T>(p: *mut T, value: T) -> Res<()> {
    if p.is_null() {
        return Err(status::INVALID_PARAMETER);
    }
    // SAFETY: per the contract; `T` is plain data (nothing to drop).
    unsafe { p.write_unaligned(value) };
    Ok(())
}

/// A path the client gave, and the local port of its source GID.
fn local_path<B: Backend>(inst: &Instance<B>, p: &IbPathRec) -> Res<(PathRecord, u8)> {
    let port = inst
        .backend
        .port_of_gid(&p.sgid)
        .ok_or(status::INVALID_PARAMETER)?;
    Ok((path_from_abi(p), port))
}

/// `a` with its ports as their CA numbers them ([`Backend::ca_port`]): the client hands
/// the `ib_qp_mod_t` straight to its CA's modify-QP.
fn ca_local<B: Backend>(inst: &Instance<B>, a: &QpAttributes) -> QpAttributes {
    let local = |port: u8| inst.backend.ca_port(port).1;
    let mut a = *a;
    a.port = a.port.map(local);
    if let Some(av) = a.primary.as_mut() {
        av.port = local(av.port);
    }
    if let Some(av) = a.alternate.as_mut() {
        av.port = local(av.port);
    }
    a
}

// ---- 0 create_id ----------------------------------------------------------------------

/// `create_id(callback, context, pp_id)`: AL's `cm_create_id`.
unsafe extern "C" fn create_id<B: Backend, const N: usize>(
    callback: Option<IbaCmCallback>,
    context: *mut c_void,
    pp_id: *mut *mut IbaCmId,
) -> NtStatus {
    if pp_id.is_null() {
        return status::INVALID_PARAMETER;
    }
    let Some(inst) = instance_at::<B>(N) else {
        return status::DEVICE_REMOVED;
    };
    if inst.removing() {
        return status::DEVICE_REMOVED;
    }
    let Some(u) = inst.take_slot() else {
        return status::INSUFFICIENT_RESOURCES;
    };
    let p = inst.id_ptr(u);
    // SAFETY: a slot just taken from the free list: no client holds it yet.
    unsafe {
        p.write(IbaCmId {
            context,
            callback,
            cid: inst.next_cid(),
        });
    }
    let Some(cb) = inst.callback(u.index) else {
        inst.free_use(u);
        return status::INSUFFICIENT_RESOURCES;
    };
    let d = inst.device();
    match d.without_client_callbacks(|| d.create_id(cb)) {
        Ok(client) => {
            inst.set_meta(u, |m| m.client = Some(client));
            // SAFETY: checked non-null; the caller's out pointer.
            unsafe { pp_id.write(p) };
            status::SUCCESS
        }
        Err(e) => {
            inst.free_use(u);
            status_of(e)
        }
    }
}

// ---- 1 destroy_id ---------------------------------------------------------------------

/// `destroy_id(p_id)`: AL's `cm_destroy_id`: synchronous (PASSIVE_LEVEL); from the id's
/// own callback, finished when the callback returns.
unsafe extern "C" fn destroy_id<B: Backend>(p_id: *mut IbaCmId) {
    // A pointer of a use that ended (destroyed, or freed by its callback's error return)
    // names a dead slot: nothing happens.
    let Some((inst, u, meta)) = find_id::<B>(p_id) else {
        return;
    };
    let d = inst.device();
    if let Some(client) = meta.client {
        d.without_client_callbacks(|| d.destroy_id(client));
    }
    // Only this use: a callback's error return may have freed it meanwhile, and another
    // `create_id` taken the slot.
    inst.free_use(u);
    if inst.backend.at_passive() {
        // The top-up is a dispatch-layer entry point too: what it finds ready waits for
        // the deferred delivery, as for every other function (no callback of another id
        // runs inside the caller's destroy_id).
        d.without_client_callbacks(|| inst.replenish());
    }
    inst.after_downcall();
}

// ---- 2 listen -------------------------------------------------------------------------

/// The engine compares one contiguous range of the REQ private data; an RDMA-CM mask
/// selects up to two (the always-compared version bytes 0..2 and the fields, Annex A11:
/// source port 2..4, source IP 4..20, destination IP 20..36). The longer run goes to the
/// engine, so that listens on one service ID that differ there are told apart on
/// arrival; the other is checked per request (`PostCheck`).
fn rdma_cm_ranges(mask: u8) -> ((u8, u8), [(u8, u8); 2]) {
    let fields = [
        (true, 0u8, 2u8),
        (mask & rdma_cm::CMP_SRC_PORT != 0, 2, 4),
        (mask & rdma_cm::CMP_SRC_IP != 0, 4, 20),
        (mask & rdma_cm::CMP_DST_IP != 0, 20, 36),
    ];
    let mut runs = [(0u8, 0u8); 4];
    let mut n = 0usize;
    for (on, start, end) in fields {
        if !on {
            continue;
        }
        match n.checked_sub(1).and_then(|i| runs.get_mut(i)) {
            Some(last) if last.1 == start => last.1 = end,
            _ => {
                if let Some(r) = runs.get_mut(n) {
                    *r = (start, end);
                }
                n += 1;
            }
        }
    }
    let runs = runs.get(..n).unwrap_or(&[]);
    let longest = runs
        .iter()
        .copied()
        .max_by_key(|(s, e)| e - s)
        .unwrap_or((0, 2));
    let mut post = [(0u8, 0u8); 2];
    for (slot, r) in post
        .iter_mut()
        .zip(runs.iter().copied().filter(|r| *r != longest))
    {
        *slot = r;
    }
    (longest, post)
}

/// `listen(p_id, service_id, p_compare_buf, compare_len, compare_offset)`: AL's
/// `cm_listen` (all ports) with `al_cep_listen`'s rules: for an RDMA-CM service ID with a
/// compare buffer, the buffer is an RDMA-CM header (>= 36 bytes, version 0, IP version 4
/// or 6) and `compare_offset` is the `IB_REQ_CM_RDMA_CMP_*` mask; otherwise
/// `compare_len` bytes at `compare_offset`, clipped to the 92-byte REQ private data as
/// `__lookup_listen` clips them.
unsafe extern "C" fn listen<B: Backend>(
    p_id: *mut IbaCmId,
    service_id: Be64,
    p_compare_buf: *mut c_void,
    compare_len: u8,
    compare_offset: u8,
) -> NtStatus {
    // SAFETY: the header's contract for the compare buffer.
    let buf = match unsafe { bytes(p_compare_buf, compare_len) } {
        Ok(b) => (!p_compare_buf.is_null()).then_some(b),
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |inst, d, u, client| {
        let sid = service_id.get();
        let mut post = None;
        let (offset, compared) = match buf {
            None => (0, None),
            Some(b) if rdma_cm::is_rdma_cm_sid(sid) => {
                let header: [u8; rdma_cm::HEADER_SIZE] = b
                    .get(..rdma_cm::HEADER_SIZE)
                    .and_then(|h| h.try_into().ok())
                    .ok_or(status::INVALID_PARAMETER)?;
                let ipv = header.get(1).copied().unwrap_or(0);
                if header.first() != Some(&rdma_cm::VERSION)
                    || (ipv != rdma_cm::IPV4 && ipv != rdma_cm::IPV6)
                {
                    return Err(status::INVALID_PARAMETER);
                }
                let ((start, end), ranges) = rdma_cm_ranges(compare_offset);
                post = Some(PostCheck { header, ranges });
                let run = b.get(usize::from(start)..usize::from(end)).unwrap_or(&[]);
                (start, Some(run))
            }
            Some(b) => {
                let off = usize::from(compare_offset);
                let room = pdata::REQ
                    .checked_sub(off)
                    .ok_or(status::INVALID_PARAMETER)?;
                (
                    compare_offset,
                    Some(b.get(..b.len().min(room)).unwrap_or(&[])),
                )
            }
        };
        let compare = match compared {
            None => None,
            Some(bytes) => {
                let mut v = inst
                    .take_compare_buffer()
                    .ok_or(status::INSUFFICIENT_RESOURCES)?;
                v.clear();
                // Within the capacity (92) the buffer was made with: no allocation.
                v.extend_from_slice(bytes);
                Some((offset, v))
            }
        };
        let params = ListenParams {
            service_id: sid,
            service_mask: u64::MAX,
            port: None,
            compare,
            backlog: inst.config.backlog,
        };
        // A listen before the engine's: a REQ may reach the id (on another CPU) as soon as
        // the engine listens, and must find it a listen.
        let was = inst.meta(u);
        inst.set_meta(u, |m| {
            m.listen = true;
            m.post_check = post;
        });
        let r = cm(d.listen_id(client, params));
        if r.is_err() {
            inst.set_meta(u, |m| {
                m.listen = was.is_some_and(|w| w.listen);
                m.post_check = was.and_then(|w| w.post_check);
            });
        }
        r
    }))
}

// ---- 3 get_request, 21 get_request_ex ---------------------------------------------------

/// Fills the event `get_request` returns for a request's id.
///
/// # Safety
///
/// `slot_sidr` is the SIDR storage of a slot just taken (unshared); `p_event` was checked
/// non-null and is the caller's.
unsafe fn request_event<B: Backend>(
    inst: &Instance<B>,
    index: usize,
    event: &Event,
    p_event: *mut IbaCmEvent,
) -> Res<()> {
    let ev = match event {
        Event::ReqReceived(r) => {
            let pkey_index = inst.backend.pkey_index(r.port, r.pkey);
            let (ca_guid, port_num) = inst.backend.ca_port(r.port);
            IbaCmEvent {
                event_type: event_type::REQ_RECEIVED,
                data: IbaCmEventData {
                    req: req_event(r, ca_guid, port_num, pkey_index),
                },
            }
        }
        Event::SidrReqReceived(r) => {
            let (ca_guid, port_num) = inst.backend.ca_port(r.port);
            let path = PathRecord {
                slid: 0,
                dlid: r.source.lid,
                sgid: [0; 16],
                dgid: r.source.gid,
                flow_label: 0,
                traffic_class: 0,
                hop_limit: if r.source.grh { 0xFF } else { 0 },
                sl: r.source.sl,
                rate: ibcm_mad::Rate::from(0),
                packet_life_time: 0,
                subnet_local: !r.source.grh,
            };
            let mut pd = [0u8; pdata::SIDR_REQ];
            let src = r.private_data.as_slice();
            let n = src.len().min(pd.len());
            if let (Some(d), Some(s)) = (pd.get_mut(..n), src.get(..n)) {
                d.copy_from_slice(s);
            }
            let storage = inst.sidr_store(index).ok_or(status::INVALID_HANDLE)?;
            // SAFETY: the slot was just taken from the free list (per the contract).
            unsafe {
                storage.write(SidrStore {
                    path: path_to_abi(&path, r.pkey, Mtu::from(0)),
                    pdata: pd,
                });
            }
            // SAFETY: a field of the storage just written (no reference is made).
            let p_path = unsafe { &raw mut (*storage).path };
            // SAFETY: as above.
            let p_pdata = unsafe { &raw mut (*storage).pdata };
            IbaCmEvent {
                event_type: event_type::SIDR_REQ_RECEIVED,
                data: IbaCmEventData {
                    sidr_req: IbaCmSidrReqEvent {
                        sidr_req: IbaCmSidrReq {
                            service_id: Be64::new(r.service_id),
                            p_path,
                            p_pdata: p_pdata.cast(),
                            pdata_len: pdata::SIDR_REQ as u8,
                            max_cm_retries: 0,
                            timeout: 0,
                        },
                        ca_guid: Be64::new(ca_guid),
                        pkey_index: inst.backend.pkey_index(r.port, r.pkey),
                        port_num,
                    },
                },
            }
        }
        _ => return Err(status::INVALID_DEVICE_STATE),
    };
    // SAFETY: per the contract.
    unsafe { write(p_event, ev) }
}

/// AL's `cm_get_request_ex`: the next request of a listen, its id given `callback` and
/// `context` before any of its events can be delivered.
fn take_request<B: Backend>(
    p_listen: *mut IbaCmId,
    given: Option<(Option<IbaCmCallback>, *mut c_void)>,
    pp_id: *mut *mut IbaCmId,
    p_event: *mut IbaCmEvent,
) -> NtStatus {
    if pp_id.is_null() || p_event.is_null() {
        return status::INVALID_PARAMETER;
    }
    let (inst, lu, listen) = match lookup::<B>(p_listen) {
        Ok(v) => v,
        Err(s) => return s,
    };
    let Some(meta) = inst.meta(lu).filter(|m| m.listen) else {
        return status::INVALID_DEVICE_STATE;
    };
    let (callback, context) = given.unwrap_or_else(|| {
        // The listen's callback, with the listen id as context (al_cm.c:147-150).
        (read_callback(p_listen), p_listen.cast())
    });
    let d = inst.device();
    let result = d.without_client_callbacks(|| {
        loop {
            let Some(u) = inst.take_slot() else {
                // AL destroys the request and fails (al_cm.c cm_get_request_ex): REJ
                // "insufficient resources" (IBA Table 112 code 3).
                return match d.get_request(listen) {
                    Some((child, _)) => {
                        inst.reject(child, RejReason::NoResources);
                        status::INSUFFICIENT_RESOURCES
                    }
                    None => status::NO_MORE_ENTRIES,
                };
            };
            let Some((child, event)) = d.get_request(listen) else {
                inst.free_use(u);
                return status::NO_MORE_ENTRIES;
            };
            if let Err(reason) = inst.request_verdict(&meta, &event) {
                inst.reject(child, reason);
                inst.free_use(u);
                continue;
            }
            let p = inst.id_ptr(u);
            // SAFETY: a slot just taken from the free list: no client holds it yet.
            unsafe {
                p.write(IbaCmId {
                    context,
                    callback,
                    cid: inst.next_cid(),
                });
            }
            // SAFETY: the slot was just taken; `p_event` checked non-null.
            if let Err(s) = unsafe { request_event(inst, u.index, &event, p_event) } {
                inst.refuse(child);
                inst.free_use(u);
                return s;
            }
            inst.set_meta(u, |m| m.client = Some(child));
            let Some(cb) = inst.callback(u.index) else {
                inst.refuse(child);
                inst.free_use(u);
                return status::INSUFFICIENT_RESOURCES;
            };
            if d.set_callback(child, cb).is_err() {
                // The request went meanwhile (the peer gave up, the listen closed).
                inst.free_use(u);
                continue;
            }
            // SAFETY: checked non-null; the caller's out pointer.
            unsafe { pp_id.write(p) };
            return status::SUCCESS;
        }
    });
    inst.after_downcall();
    result
}

/// `get_request(p_listen_id, pp_id, p_event)`: AL's `cm_get_request`.
unsafe extern "C" fn get_request<B: Backend>(
    p_listen_id: *mut IbaCmId,
    pp_id: *mut *mut IbaCmId,
    p_event: *mut IbaCmEvent,
) -> NtStatus {
    take_request::<B>(p_listen_id, None, pp_id, p_event)
}

/// `get_request_ex(p_listen_id, callback, context, pp_id, p_event)`.
unsafe extern "C" fn get_request_ex<B: Backend>(
    p_listen_id: *mut IbaCmId,
    callback: Option<IbaCmCallback>,
    context: *mut c_void,
    pp_id: *mut *mut IbaCmId,
    p_event: *mut IbaCmEvent,
) -> NtStatus {
    take_request::<B>(p_listen_id, Some((callback, context)), pp_id, p_event)
}

// ---- 4 send_req ---------------------------------------------------------------------

/// `send_req(p_id, p_req)`: AL's `cm_send_req` (pre-REQ + send). The starting PSN is
/// taken modulo 2^24 as AL's `conn_req_set_starting_psn` does (WinVerbs passes a 32-bit
/// random value); the local port is the one whose GID is the primary path's SGID.
unsafe extern "C" fn send_req<B: Backend>(p_id: *mut IbaCmId, p_req: *mut IbaCmReq) -> NtStatus {
    // SAFETY: the header's contract for every pointer argument.
    let r = match unsafe { read(p_req) } {
        Ok(r) => r,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |inst, d, _, client| {
        // SAFETY: as above.
        let primary = unsafe { read(r.p_primary_path) }?;
        let alternate = if r.p_alt_path.is_null() {
            None
        } else {
            // SAFETY: as above.
            Some(path_from_abi(&unsafe { read(r.p_alt_path) }?))
        };
        // SAFETY: as above.
        let private_data = unsafe { bytes(r.p_pdata, r.pdata_len) }?;
        let transport = transport_from_qp_type(r.qp_type).ok_or(status::INVALID_PARAMETER)?;
        let (primary_path, port) = local_path(inst, &primary)?;
        let p = ConnectParams {
            service_id: r.service_id.get(),
            port,
            pkey: primary.pkey.get(),
            qpn: r.qpn.get(),
            transport,
            starting_psn: Some(r.starting_psn.get() & 0x00FF_FFFF),
            primary_path,
            alternate_path: alternate,
            path_mtu: Mtu::from(primary.mtu & 0x3F),
            responder_resources: r.resp_res,
            initiator_depth: r.init_depth,
            remote_cm_response_timeout: r.remote_resp_timeout,
            local_cm_response_timeout: r.local_resp_timeout,
            retry_count: r.retry_cnt,
            rnr_retry_count: r.rnr_retry_cnt,
            max_cm_retries: r.max_cm_retries,
            srq: r.srq != 0,
            flow_control: r.flow_ctrl != 0,
            private_data,
        };
        cm(d.send_req(client, &p))
    }))
}

// ---- 5 send_rep, 19 format_rep, 20 send_formatted_rep ----------------------------------

/// The REP parameters of an `iba_cm_rep`.
///
/// # Safety
///
/// The header's contract for `r`'s private-data pointer.
unsafe fn rep_params<'a>(r: &IbaCmRep) -> Res<RepParams<'a>> {
    Ok(RepParams {
        qpn: r.qpn.get(),
        starting_psn: Some(r.starting_psn.get() & 0x00FF_FFFF),
        responder_resources: r.resp_res,
        initiator_depth: r.init_depth,
        rnr_retry_count: r.rnr_retry_cnt,
        failover_accepted: Failover::from(r.failover_accepted),
        flow_control: r.flow_ctrl != 0,
        srq: r.srq != 0,
        // SAFETY: per the contract.
        private_data: unsafe { bytes(r.p_pdata, r.pdata_len) }?,
    })
}

/// `send_rep(p_id, p_rep)`: AL's `cm_send_rep` (pre-REP + send). Unlike AL, responder
/// resources beyond the CA's are refused, not lowered (design: never silently adjust).
unsafe extern "C" fn send_rep<B: Backend>(p_id: *mut IbaCmId, p_rep: *mut IbaCmRep) -> NtStatus {
    // SAFETY: the header's contract.
    let r = match unsafe { read(p_rep) } {
        Ok(r) => r,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |_, d, _, client| {
        // SAFETY: as above.
        let p = unsafe { rep_params(&r) }?;
        cm(d.send_rep(client, &p)).map(drop)
    }))
}

/// `format_rep(p_id, p_rep, p_init)`: AL's `cm_format_rep` (pre-REP), the INIT
/// attributes written to `p_init` when it is not null.
unsafe extern "C" fn format_rep<B: Backend>(
    p_id: *mut IbaCmId,
    p_rep: *mut IbaCmRep,
    p_init: *mut IbQpMod,
) -> NtStatus {
    // SAFETY: the header's contract.
    let r = match unsafe { read(p_rep) } {
        Ok(r) => r,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |inst, d, _, client| {
        // SAFETY: as above.
        let p = unsafe { rep_params(&r) }?;
        let prepared = cm(d.format_rep(client, &p))?;
        if !p_init.is_null() {
            let init = &prepared.init;
            let index = inst
                .backend
                .pkey_index(init.port.unwrap_or(0), init.pkey.unwrap_or(0xFFFF));
            // SAFETY: non-null; the caller's out structure.
            unsafe { write(p_init, qp_mod(&ca_local(inst, init), index)) }?;
        }
        Ok(())
    }))
}

/// `send_formatted_rep(p_id)`: AL's `cm_send_formatted_rep`.
unsafe extern "C" fn send_formatted_rep<B: Backend>(p_id: *mut IbaCmId) -> NtStatus {
    nt(op::<B, _>(p_id, |_, d, _, client| {
        cm(d.send_formatted_rep(client))
    }))
}

// ---- 6 send_rtu, 7 send_dreq, 8 send_drep ----------------------------------------------

/// `send_rtu(p_id, p_pdata, pdata_len)`.
unsafe extern "C" fn send_rtu<B: Backend>(
    p_id: *mut IbaCmId,
    p_pdata: *const c_void,
    pdata_len: u8,
) -> NtStatus {
    // SAFETY: the header's contract.
    let pd = match unsafe { bytes(p_pdata, pdata_len) } {
        Ok(b) => b,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |_, d, _, client| {
        cm(d.send_rtu(client, pd))
    }))
}

/// `send_dreq(p_id, p_pdata, pdata_len)`.
unsafe extern "C" fn send_dreq<B: Backend>(
    p_id: *mut IbaCmId,
    p_pdata: *const c_void,
    pdata_len: u8,
) -> NtStatus {
    // SAFETY: the header's contract.
    let pd = match unsafe { bytes(p_pdata, pdata_len) } {
        Ok(b) => b,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |_, d, _, client| {
        cm(d.send_dreq(client, pd))
    }))
}

/// `send_drep(p_id, p_pdata, pdata_len)`.
unsafe extern "C" fn send_drep<B: Backend>(
    p_id: *mut IbaCmId,
    p_pdata: *const c_void,
    pdata_len: u8,
) -> NtStatus {
    // SAFETY: the header's contract.
    let pd = match unsafe { bytes(p_pdata, pdata_len) } {
        Ok(b) => b,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |_, d, _, client| {
        cm(d.send_drep(client, pd))
    }))
}

// ---- 9 send_rej, 10 send_mra --------------------------------------------------------

/// `send_rej(p_id, status, p_ari, ari_len, p_pdata, pdata_len)`: `status` is an
/// `ib_rej_status_t`, net16 (IBA Table 112).
unsafe extern "C" fn send_rej<B: Backend>(
    p_id: *mut IbaCmId,
    reason: Be16,
    p_ari: *const c_void,
    ari_len: u8,
    p_pdata: *const c_void,
    pdata_len: u8,
) -> NtStatus {
    // SAFETY: the header's contract.
    let ari = match unsafe { bytes(p_ari, ari_len) } {
        Ok(b) => b,
        Err(s) => return s,
    };
    // SAFETY: as above.
    let pd = match unsafe { bytes(p_pdata, pdata_len) } {
        Ok(b) => b,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |_, d, _, client| {
        cm(d.send_rej(
            client,
            &RejectParams {
                reason: RejReason::from(reason.get()),
                ari,
                private_data: pd,
            },
        ))
    }))
}

/// `send_mra(p_id, service_timeout, p_pdata, pdata_len)`.
unsafe extern "C" fn send_mra<B: Backend>(
    p_id: *mut IbaCmId,
    service_timeout: u8,
    p_pdata: *const c_void,
    pdata_len: u8,
) -> NtStatus {
    // SAFETY: the header's contract.
    let pd = match unsafe { bytes(p_pdata, pdata_len) } {
        Ok(b) => b,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |_, d, _, client| {
        cm(d.send_mra(client, service_timeout, pd))
    }))
}

// ---- 11 send_lap, 12 send_apr -------------------------------------------------------

/// `send_lap(p_id, p_lap)`: the alternate path is required; `remote_resp_timeout` is not
/// used (the engine times the LAP from the connection's timeouts).
unsafe extern "C" fn send_lap<B: Backend>(p_id: *mut IbaCmId, p_lap: *mut IbaCmLap) -> NtStatus {
    // SAFETY: the header's contract.
    let lap = match unsafe { read(p_lap) } {
        Ok(l) => l,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |_, d, _, client| {
        // SAFETY: as above.
        let alt = path_from_abi(&unsafe { read(lap.p_alt_path) }?);
        // SAFETY: as above.
        let pd = unsafe { bytes(lap.p_pdata.cast_const(), lap.pdata_len) }?;
        cm(d.send_lap(client, &alt, pd))
    }))
}

/// `send_apr(p_id, p_apr)`: AL's `cm_send_apr` (pre-APR + send).
unsafe extern "C" fn send_apr<B: Backend>(p_id: *mut IbaCmId, p_apr: *mut IbaCmApr) -> NtStatus {
    // SAFETY: the header's contract.
    let apr = match unsafe { read(p_apr) } {
        Ok(a) => a,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |_, d, _, client| {
        // SAFETY: as above.
        let info = unsafe { bytes(apr.p_info.cast_const(), apr.info_length) }?;
        // SAFETY: as above.
        let pd = unsafe { bytes(apr.p_pdata.cast_const(), apr.pdata_len) }?;
        cm(d.send_apr(client, AprStatus::from(apr.status), info, pd)).map(drop)
    }))
}

// ---- 13 send_sidr_req, 14 send_sidr_rep ---------------------------------------------

/// `send_sidr_req(p_id, p_req)` (AL's kernel CM: STATUS_NOT_SUPPORTED). `timeout` is in
/// milliseconds; it becomes the smallest IB time that is at least as long.
unsafe extern "C" fn send_sidr_req<B: Backend>(
    p_id: *mut IbaCmId,
    p_req: *mut IbaCmSidrReq,
) -> NtStatus {
    // SAFETY: the header's contract.
    let r = match unsafe { read(p_req) } {
        Ok(r) => r,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |inst, d, _, client| {
        // SAFETY: as above.
        let abi_path = unsafe { read(r.p_path) }?;
        // SAFETY: as above.
        let pd = unsafe { bytes(r.p_pdata.cast_const(), r.pdata_len) }?;
        let (path, port) = local_path(inst, &abi_path)?;
        let p = SidrParams {
            service_id: r.service_id.get(),
            port,
            pkey: abi_path.pkey.get(),
            path,
            timeout: ibcm_mad::ib_time_from_ns_ceil(u64::from(r.timeout) * 1_000_000),
            max_retries: r.max_cm_retries,
            private_data: pd,
        };
        cm(d.send_sidr_req(client, &p))
    }))
}

/// `send_sidr_rep(p_id, p_rep)`.
unsafe extern "C" fn send_sidr_rep<B: Backend>(
    p_id: *mut IbaCmId,
    p_rep: *mut IbaCmSidrRep,
) -> NtStatus {
    // SAFETY: the header's contract.
    let r = match unsafe { read(p_rep) } {
        Ok(r) => r,
        Err(s) => return s,
    };
    nt(op::<B, _>(p_id, |_, d, _, client| {
        // SAFETY: as above.
        let info = unsafe { bytes(r.p_info.cast_const(), r.info_len) }?;
        // SAFETY: as above.
        let pd = unsafe { bytes(r.p_pdata.cast_const(), r.pdata_len) }?;
        let p = SidrReplyParams {
            status: SidrStatus::from(r.status),
            qpn: r.qpn.get(),
            qkey: r.qkey.get(),
            info,
            private_data: pd,
        };
        cm(d.send_sidr_rep(client, &p))
    }))
}

// ---- 15 get_qp_attr -----------------------------------------------------------------

/// `get_qp_attr(p_id, state, p_attr)`: IB_QPS_INIT, IB_QPS_RTR or IB_QPS_RTS.
unsafe extern "C" fn get_qp_attr<B: Backend>(
    p_id: *mut IbaCmId,
    state: u32,
    p_attr: *mut IbQpMod,
) -> NtStatus {
    let Some(state) = qp_state_from_abi(state) else {
        return status::INVALID_PARAMETER;
    };
    if p_attr.is_null() {
        return status::INVALID_PARAMETER;
    }
    nt(op::<B, _>(p_id, |inst, d, _, client| {
        let a = cm(d.get_qp_attr(client, state))?;
        let index = inst
            .backend
            .pkey_index(a.port.unwrap_or(0), a.pkey.unwrap_or(0xFFFF));
        // SAFETY: checked non-null; the caller's out structure.
        unsafe { write(p_attr, qp_mod(&ca_local(inst, &a), index)) }
    }))
}

// ---- 16 migrate, 17 established, 18 cancel_listen -----------------------------------

/// `migrate(p_id)`.
unsafe extern "C" fn migrate<B: Backend>(p_id: *mut IbaCmId) -> NtStatus {
    nt(op::<B, _>(p_id, |_, d, _, client| cm(d.migrate(client))))
}

/// `established(p_id)`.
unsafe extern "C" fn established<B: Backend>(p_id: *mut IbaCmId) -> NtStatus {
    nt(op::<B, _>(
        p_id,
        |_, d, _, client| cm(d.established(client)),
    ))
}

/// `cancel_listen(p_id)`: the id is idle again; requests not pulled are refused.
unsafe extern "C" fn cancel_listen<B: Backend>(p_id: *mut IbaCmId) -> NtStatus {
    nt(op::<B, _>(p_id, |inst, d, u, client| {
        cm(d.cancel_listen(client))?;
        inst.set_meta(u, |m| {
            m.listen = false;
            m.post_check = None;
        });
        Ok(())
    }))
}

// ---- the table ------------------------------------------------------------------------

fn create_fn<B: Backend>(n: usize) -> Option<crate::abi::CreateIdFn> {
    macro_rules! pick {
        ($($i:literal)*) => {
            match n {
                $( $i => Some(create_id::<B, $i> as crate::abi::CreateIdFn), )*
                _ => None,
            }
        };
    }
    pick!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
}

const _: () = assert!(crate::instance::MAX_INSTANCES == 16);

/// The function table of the instance at registry index `n`.
pub(crate) fn table<B: Backend>(n: usize) -> IbaCmInterface {
    IbaCmInterface {
        create_id: create_fn::<B>(n),
        destroy_id: Some(destroy_id::<B>),
        listen: Some(listen::<B>),
        get_request: Some(get_request::<B>),
        send_req: Some(send_req::<B>),
        send_rep: Some(send_rep::<B>),
        send_rtu: Some(send_rtu::<B>),
        send_dreq: Some(send_dreq::<B>),
        send_drep: Some(send_drep::<B>),
        send_rej: Some(send_rej::<B>),
        send_mra: Some(send_mra::<B>),
        send_lap: Some(send_lap::<B>),
        send_apr: Some(send_apr::<B>),
        send_sidr_req: Some(send_sidr_req::<B>),
        send_sidr_rep: Some(send_sidr_rep::<B>),
        get_qp_attr: Some(get_qp_attr::<B>),
        migrate: Some(migrate::<B>),
        established: Some(established::<B>),
        cancel_listen: Some(cancel_listen::<B>),
        format_rep: Some(format_rep::<B>),
        send_formatted_rep: Some(send_formatted_rep::<B>),
        get_request_ex: Some(get_request_ex::<B>),
    }
}

#[cfg(test)]
mod tests {
    use super::rdma_cm_ranges;

    #[test]
    fn rdma_cm_masks_split_into_an_engine_run_and_a_post_check() {
        // Annex A11 header: version/IPv 0..2, source port 2..4, source IP 4..20,
        // destination IP 20..36.
        assert_eq!(rdma_cm_ranges(0), ((0, 2), [(0, 0), (0, 0)]));
        assert_eq!(rdma_cm_ranges(1), ((0, 4), [(0, 0), (0, 0)]));
        assert_eq!(rdma_cm_ranges(2), ((4, 20), [(0, 2), (0, 0)]));
        assert_eq!(rdma_cm_ranges(3), ((0, 20), [(0, 0), (0, 0)]));
        assert_eq!(rdma_cm_ranges(4), ((20, 36), [(0, 2), (0, 0)]));
        assert_eq!(rdma_cm_ranges(5), ((20, 36), [(0, 4), (0, 0)]));
        assert_eq!(rdma_cm_ranges(6), ((4, 36), [(0, 2), (0, 0)]));
        assert_eq!(rdma_cm_ranges(7), ((0, 36), [(0, 0), (0, 0)]));
        // Bits beyond the three defined are ignored, as AL ignores them.
        assert_eq!(rdma_cm_ranges(0xF8 | 4), rdma_cm_ranges(4));
    }
}
