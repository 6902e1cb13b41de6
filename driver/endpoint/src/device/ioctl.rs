//! The IOCTLs: each input record validated completely before anything changes (every
//! malformed input completes with a precise NTSTATUS), then carried out on the engine.

use alloc::vec::Vec;

use ibcm_cep::{CepId, CmManager, Instant, QpState};
use ibcm_ioctl::{
    ABI_VERSION, ANY_ENDPOINT, AprIn, ConnectIn, CountersIn, CountersOut, CreateIn, CreateOut,
    EventRecord, FormatRepIn, GetQpAttrIn, HandleIn, LapIn, ListenIn, MAX_CHANNEL_GET_EVENTS,
    MAX_EVENTS_PER_REQUEST, MraIn, PrivateDataIn, QpAttrOut, QpTransitionsOut, RejIn, SidrRepIn,
    SidrReqIn, VersionIn, VersionOut, code, event_type, flags, limits, status,
};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::platform::{Platform, Request};
use crate::records::{
    Status, mtu_from_abi, path_from_abi, qp_attr_to_abi, qp_state_from_abi, query_to_abi, require,
    status_of, transport_from_abi, used,
};
use crate::trace::DispatchPoint;

use super::{
    Awaited, EVENT_HEADROOM, Endpoint, FIFO_DEPTH, Fifo, FileId, Inner, MAX_BACKLOG, Owner,
};

pub(super) type Outcome = Result<usize, Status>;

/// A batch that holds `n` values without growing, for the entry points that run before
/// the next PASSIVE_LEVEL one. A batch that is not empty leaves with the running entry
/// point's flush (`take_flush` puts a spare in its place), so only an empty one matters;
/// it is replaced rather than grown, which would copy its old capacity for nothing.
pub(super) fn room<T>(v: &mut Vec<T>, n: usize) {
    if v.is_empty()
        && v.capacity() < n
        && let Some(fresh) = batch(n)
    {
        *v = fresh;
    }
}

/// An empty vector with room for `n`, or `None` when memory runs out.
pub(super) fn batch<T>(n: usize) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    Some(v)
}

pub(super) fn input<T: FromBytes + KnownLayout + Immutable>(
    bytes: &[u8],
    size: u32,
) -> Result<T, Status> {
    let record = T::read_from_bytes(bytes).map_err(|_| status::INFO_LENGTH_MISMATCH)?;
    let declared = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes);
    if declared != Some(size) {
        return Err(status::REVISION_MISMATCH);
    }
    Ok(record)
}

pub(super) fn output<R: Request, T: IntoBytes + Immutable>(request: &mut R, value: &T) -> Outcome {
    let bytes = value.as_bytes();
    if request.output_len() < bytes.len() {
        return Err(status::BUFFER_TOO_SMALL);
    }
    request.write_output(0, bytes);
    Ok(bytes.len())
}

/// Destroys an endpoint: the engine tears the connection down in the background, the
/// endpoint's pending requests complete with STATUS_CANCELLED, and REQ-created endpoints
/// the user never heard of (queued on a listen) go with it.
pub(super) fn destroy_endpoint<P: Platform>(
    i: &mut Inner<P>,
    now: Instant,
    file: FileId,
    handle: u64,
) -> Result<(), Status> {
    // Room first (fallibly, changing nothing): its requests' completions, the MADs the
    // engine sends for it and for the REQs it queued (a REJ each).
    let (requests, queued) = {
        let ep = i.endpoint(file, handle)?;
        (ep.pending.len() + 1, ep.events.len())
    };
    if i.done.try_reserve(requests).is_err()
        || i.tx.try_reserve(2 * (1 + queued)).is_err()
        || i.lingering.try_reserve(1).is_err()
    {
        return Err(status::INSUFFICIENT_RESOURCES);
    }
    let f = i.file(file)?;
    let ep = f.endpoints.remove(handle).ok_or(status::INVALID_HANDLE)?;
    for key in ep
        .pending
        .iter()
        .chain(ep.answer.as_ref().map(|(r, _)| r))
        .map(Request::key)
    {
        f.leave_waiting(handle, key);
    }
    let caller = f.caller;
    i.users.endpoint_removed(caller, ep.backlog);
    i.users.events_read(caller, ep.events.len());
    {
        let f = i.file(file)?;
        f.queued = f.queued.saturating_sub(ep.events.len());
        if ep.backlog != 0 {
            f.backlog = f.backlog.saturating_sub(ep.backlog as usize);
            f.listens = f.listens.saturating_sub(1);
        }
    }
    // REQ-created endpoints the user never heard of go with it.
    // Walked by its links, the next read before each destroy (which frees only the
    // child's records; these are released after the walk).
    let mut next = i.records.nth(&ep.events, 0);
    while let Some(index) = next {
        next = i.records.after(&ep.events, index);
        let child = i
            .records
            .get(index)
            .filter(|r| {
                (r.event_type == event_type::REQ_RECEIVED
                    || r.event_type == event_type::SIDR_REQ_RECEIVED)
                    && r.new_handle != 0
            })
            .map(|r| r.new_handle);
        if let Some(child) = child {
            let _ = destroy_endpoint(i, now, file, child);
        }
    }
    i.records.release(&ep.events);
    i.pdata.release(ep.private_data);
    if ep.ready {
        // Off the channel's queue: its room is for live endpoints.
        i.file(file)?.ready.retain(|&h| h != handle);
    }
    for r in ep.pending.into_iter().chain(ep.answer.map(|(r, _)| r)) {
        i.done.push((r, status::CANCELLED, 0));
    }
    i.clear_owner(ep.cep);
    let _ = i.cm.destroy(now, ep.cep);
    i.linger(caller, ep.cep);
    // PASSIVE_LEVEL (DESTROY, cleanup): private-data blocks nobody uses go back.
    i.cm.trim_private_data();
    i.pdata.trim();
    Ok(())
}

pub(super) fn check_reserved(ok: bool) -> Result<(), Status> {
    require(ok)
}

/// One IOCTL, under the lock: the request is completed (queued on `done`) or, for a
/// request `ibcm_ioctl::may_pend` names (a GET_EVENT with nothing to report, a CONNECT or
/// SEND_REP with an output buffer awaiting the peer's answer), left pending on its
/// endpoint.
pub(super) fn ioctl<P: Platform>(
    i: &mut Inner<P>,
    now: Instant,
    file: FileId,
    mut request: P::Request,
    code: u32,
    bytes: &[u8],
) {
    // PASSIVE_LEVEL: free private-data blocks for this IOCTL, whatever kernel clients
    // took at DISPATCH_LEVEL since the last one (a check when they are there).
    let _ = i.cm.prepare_private_data();
    let mut extra = 0;
    // Only what `may_pend` names may be held past this routine: the library waits for
    // every other request on its caller's thread, off the completion port.
    let failed = if !ibcm_ioctl::may_pend(code, request.output_len()) {
        match operation(i, now, file, &mut request, code, bytes) {
            Ok(n) => {
                i.done.push((request, status::SUCCESS, n));
                None
            }
            Err(st) => Some((request, st)),
        }
    } else if code == code::GET_EVENT {
        match get_event(i, file, request, bytes) {
            Ok(records) => {
                extra = records;
                None
            }
            Err(failed) => Some(failed),
        }
    } else {
        // CONNECT or SEND_REP with an output buffer: completed by the peer's answer.
        answered_operation(i, now, file, request, code, bytes).err()
    };
    if let Some((request, st)) = failed {
        if st == status::QUOTA_EXCEEDED {
            i.quota_exceeded += 1;
        }
        i.trace.point(DispatchPoint::IoctlFailed {
            file,
            code,
            status: st,
        });
        i.done.push((request, st, 0));
    }
    // PASSIVE_LEVEL: whatever the IOCTL changed (a connection started, a REP sent, a
    // timewait entered), the DISPATCH_LEVEL paths find room for what follows, and a
    // GET_EVENT's room for the REQs it may deliver.
    i.prepare_for_requests(file, extra);
}

/// CONNECT or SEND_REP with an output buffer: carried out, then left pending on its
/// endpoint until the answer arrives (see `code::CONNECT`, `code::SEND_REP`).
pub(super) fn answered_operation<P: Platform>(
    i: &mut Inner<P>,
    now: Instant,
    file: FileId,
    mut request: P::Request,
    code: u32,
    bytes: &[u8],
) -> Result<(), (P::Request, Status)> {
    let size = EventRecord::SIZE as usize;
    if request.output_len() < size {
        return Err((request, status::BUFFER_TOO_SMALL));
    }
    let awaited = if code == code::CONNECT {
        Awaited::Rep {
            transitions: request.output_len() >= size + QpTransitionsOut::SIZE as usize,
        }
    } else {
        Awaited::Rtu
    };
    let handle = if code == code::CONNECT {
        input::<ConnectIn>(bytes, ConnectIn::SIZE).map(|c| c.handle)
    } else {
        handle_in(bytes)
    };
    // One answer awaited per endpoint: refused before anything is sent, as is one there
    // is no room to enter where the cancel routine finds it.
    if let Ok(h) = handle
        && i.endpoint(file, h).is_ok_and(|ep| ep.answer.is_some())
    {
        return Err((request, status::INVALID_DEVICE_STATE));
    }
    if i.files
        .get_mut(file.0)
        .is_some_and(|f| f.waiting.try_reserve(1).is_err())
    {
        return Err((request, status::INSUFFICIENT_RESOURCES));
    }
    if let Err(st) = operation(i, now, file, &mut request, code, bytes) {
        return Err((request, st));
    }
    // The operation succeeded, so the handle named an endpoint of this file.
    let key = request.key();
    match handle.and_then(|h| i.endpoint(file, h).map(|ep| (h, ep))) {
        Ok((h, ep)) => {
            ep.answer = Some((request, awaited));
            if let Ok(f) = i.file(file) {
                f.enter_waiting(h, key);
            }
            Ok(())
        }
        Err(st) => Err((request, st)),
    }
}

/// The INIT, RTR and RTS attributes of `cep` (GET_QP_TRANSITIONS, an answered CONNECT).
pub(super) fn qp_transitions(cm: &CmManager, cep: CepId) -> Result<QpTransitionsOut, Status> {
    let attr = |state| cm.qp_attributes(cep, state).map_err(status_of);
    Ok(QpTransitionsOut {
        size: QpTransitionsOut::SIZE,
        reserved: 0,
        init: qp_attr_to_abi(&attr(QpState::Init)?),
        rtr: qp_attr_to_abi(&attr(QpState::Rtr)?),
        rts: qp_attr_to_abi(&attr(QpState::Rts)?),
    })
}

/// GET_EVENT: completes at once with the queued events, or pends until one arrives (on
/// its endpoint, or on the file's channel for [`ANY_ENDPOINT`]). Returns how many records
/// the request holds.
pub(super) fn get_event<P: Platform>(
    i: &mut Inner<P>,
    file: FileId,
    request: P::Request,
    bytes: &[u8],
) -> Result<usize, (P::Request, Status)> {
    let h = match check_get_event(i, file, &request, bytes) {
        Ok(h) => h,
        Err(st) => return Err((request, st)),
    };
    let capacity =
        (request.output_len() / EventRecord::SIZE as usize).min(MAX_EVENTS_PER_REQUEST as usize);
    if h == ANY_ENDPOINT {
        let Ok(f) = i.file(file) else {
            return Err((request, status::INVALID_HANDLE));
        };
        // Each pending one holds an IRP and its system buffer: a handle has at most
        // MAX_CHANNEL_GET_EVENTS on its channel.
        if f.channel.len() >= MAX_CHANNEL_GET_EVENTS as usize {
            return Err((request, status::QUOTA_EXCEEDED));
        }
        if f.channel.try_reserve(1).is_err() {
            return Err((request, status::INSUFFICIENT_RESOURCES));
        }
        i.fill_channel(file, request);
        return Ok(capacity);
    }
    if let Err(st) = i.grow_fifo(file, h, EVENT_HEADROOM) {
        return Err((request, st));
    }
    let Some(f) = i.files.get_mut(file.0) else {
        return Err((request, status::INVALID_HANDLE));
    };
    let Some(ep) = f.endpoints.get_mut(h) else {
        return Err((request, status::INVALID_HANDLE));
    };
    // A connection has one GET_EVENT at a time (code::GET_EVENT): a second while one is
    // pending is refused, so an endpoint holds at most one request of each kind.
    if !ep.pending.is_empty() {
        return Err((request, status::INVALID_DEVICE_STATE));
    }
    if ep.pending.try_reserve_exact(1).is_err() {
        return Err((request, status::INSUFFICIENT_RESOURCES));
    }
    if ep.events.is_empty() {
        // Entered where the cancel routine finds it (room first: nothing changed yet).
        if f.waiting.try_reserve(1).is_err() {
            return Err((request, status::INSUFFICIENT_RESOURCES));
        }
        let key = request.key();
        if let Some(ep) = f.endpoints.get_mut(h) {
            ep.pending.push_back(request);
        }
        f.enter_waiting(h, key);
    } else {
        i.fill(file, h, request);
    }
    Ok(capacity)
}

pub(super) fn check_get_event<P: Platform>(
    i: &mut Inner<P>,
    file: FileId,
    request: &P::Request,
    bytes: &[u8],
) -> Result<u64, Status> {
    if !i.file(file)?.versioned {
        return Err(status::INVALID_DEVICE_STATE);
    }
    let h = handle_in(bytes)?;
    if h != ANY_ENDPOINT {
        i.endpoint(file, h)?;
    }
    if request.output_len() < EventRecord::SIZE as usize {
        return Err(status::BUFFER_TOO_SMALL);
    }
    Ok(h)
}

/// Every IOCTL but GET_EVENT: `Ok(n)` completes with SUCCESS and `n` output bytes.
pub(super) fn operation<P: Platform>(
    i: &mut Inner<P>,
    now: Instant,
    file: FileId,
    request: &mut P::Request,
    code: u32,
    bytes: &[u8],
) -> Result<usize, Status> {
    let versioned = i.file(file)?.versioned;
    if code == code::VERSION {
        let v: VersionIn = input(bytes, VersionIn::SIZE)?;
        if v.abi_version != ABI_VERSION {
            return Err(status::REVISION_MISMATCH);
        }
        let out = VersionOut {
            size: VersionOut::SIZE,
            abi_version: ABI_VERSION,
            event_record_size: EventRecord::SIZE,
            max_events_per_request: MAX_EVENTS_PER_REQUEST,
        };
        let n = output(request, &out)?;
        i.file(file)?.versioned = true;
        return Ok(n);
    }
    if !code::ALL.contains(&code) {
        return Err(status::INVALID_DEVICE_REQUEST);
    }
    // The handshake comes first: a caller of another ABI must not reach the records.
    if !versioned {
        return Err(status::INVALID_DEVICE_STATE);
    }
    match code {
        code::CREATE => {
            let c: CreateIn = input(bytes, CreateIn::SIZE)?;
            check_reserved(c.reserved == 0)?;
            if request.output_len() < CreateOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            i.quota_create(file)?;
            let f = i.file(file)?;
            let no_memory = |_| status::INSUFFICIENT_RESOURCES;
            f.reserve_ready(1).map_err(no_memory)?;
            // A retired chunk's slot before a fresh one (the table's end stays put).
            f.endpoints.try_reserve(1).map_err(no_memory)?;
            let events = Fifo::with_room(FIFO_DEPTH);
            let cep = i.cm.create().map_err(status_of)?;
            let f = i.file(file)?;
            let caller = f.caller;
            let handle = match f.endpoints.try_insert(Endpoint::new(cep, events)) {
                Ok(handle) => handle,
                Err(_) => {
                    let _ = i.cm.destroy(now, cep);
                    return Err(status::INSUFFICIENT_RESOURCES);
                }
            };
            i.users.endpoint_added(caller);
            i.set_owner(
                cep,
                Owner {
                    file: file.0,
                    endpoint: handle,
                },
            );
            let out = CreateOut {
                size: CreateOut::SIZE,
                reserved: 0,
                handle,
            };
            Ok(output(request, &out)?)
        }
        code::DESTROY => {
            let h = handle_in(bytes)?;
            destroy_endpoint(i, now, file, h)?;
            Ok(0)
        }
        code::LISTEN => {
            let l: ListenIn = input(bytes, ListenIn::SIZE)?;
            check_reserved(l.reserved == 0 && l.reserved1 == 0 && l.reserved2 == [0; 4])?;
            require((1..=MAX_BACKLOG).contains(&l.backlog))?;
            let compare = used(&l.compare, l.compare_len, limits::REQ_PRIVATE_DATA)?;
            require(usize::from(l.compare_offset) + compare.len() <= limits::REQ_PRIVATE_DATA)?;
            let old = i.endpoint(file, l.handle)?.backlog;
            let (quotas, users) = (i.quotas, &i.users);
            let f = i.files.get_mut(file.0).ok_or(status::INVALID_HANDLE)?;
            f.may_listen(l.service_mask)?;
            f.quota_listen(&quotas, users, l.backlog, old)?;
            let cep = i.touch(file, l.handle)?;
            // Room for the backlog's REQs in its FIFO before the engine listens.
            let depth = l.backlog as usize;
            i.grow_fifo(file, l.handle, depth)?;
            let mut buf = Vec::new();
            buf.try_reserve_exact(compare.len())
                .map_err(|_| status::INSUFFICIENT_RESOURCES)?;
            buf.extend_from_slice(compare);
            let params = ibcm_cep::ListenParams {
                service_id: l.service_id,
                service_mask: l.service_mask,
                port: (l.port != 0).then_some(l.port),
                compare: (!compare.is_empty()).then_some((l.compare_offset, buf)),
                backlog: l.backlog,
            };
            i.cm.listen(cep, params).map_err(status_of)?;
            let ep = i.endpoint(file, l.handle)?;
            ep.backlog = l.backlog;
            let f = i.file(file)?;
            f.backlog = f.backlog.saturating_sub(old as usize) + depth;
            f.listens += u32::from(old == 0);
            let caller = f.caller;
            i.users.listen(caller, old, l.backlog);
            i.prepare_for_requests(file, 0);
            Ok(0)
        }
        code::CANCEL_LISTEN => {
            let h = handle_in(bytes)?;
            let cep = i.touch(file, h)?;
            if i.cm.state(cep).map_err(status_of)? != ibcm_cep::StateName::Listen {
                return Err(status::INVALID_DEVICE_STATE);
            }
            // A listen is ended by destroying its CEP; the endpoint gets a fresh one.
            let fresh = i.cm.create().map_err(status_of)?;
            let _ = i.cm.destroy(now, cep);
            i.clear_owner(cep);
            let ep = i.endpoint(file, h)?;
            ep.cep = fresh;
            let old = core::mem::replace(&mut ep.backlog, 0);
            let f = i.file(file)?;
            f.backlog = f.backlog.saturating_sub(old as usize);
            f.listens = f.listens.saturating_sub(u32::from(old != 0));
            let caller = f.caller;
            i.users.listen(caller, old, 0);
            // REQs and SIDR_REQs nobody retrieved go with the listen (one at a time: no
            // list of them is allocated).
            let mut k = 0;
            loop {
                let Inner {
                    files,
                    records,
                    users,
                    ..
                } = &mut *i;
                let Some(f) = files.get_mut(file.0) else {
                    break;
                };
                let Some(ep) = f.endpoints.get_mut(h) else {
                    break;
                };
                let Some(index) = records.nth(&ep.events, k) else {
                    break;
                };
                let child = records.get(index).map_or(0, |r| r.new_handle);
                if child == 0 {
                    k += 1;
                    continue;
                }
                let _ = records.remove_nth(&mut ep.events, k);
                let _ = records.take(index);
                f.queued = f.queued.saturating_sub(1);
                users.events_read(f.caller, 1);
                let _ = destroy_endpoint(i, now, file, child);
            }
            i.set_owner(
                fresh,
                Owner {
                    file: file.0,
                    endpoint: h,
                },
            );
            Ok(0)
        }
        code::CONNECT => {
            let c: ConnectIn = input(bytes, ConnectIn::SIZE)?;
            check_reserved(c.reserved == 0 && c.reserved1 == [0; 3])?;
            require(c.flags & !flags::ALL == 0)?;
            let primary = path_from_abi(&c.primary)?;
            let alternate = if c.flags & flags::ALTERNATE_PATH != 0 {
                Some(path_from_abi(&c.alternate)?)
            } else {
                require(c.alternate == ibcm_ioctl::PathAbi::new_zeroed())?;
                None
            };
            let private_data = used(
                &c.private_data,
                c.private_data_len,
                limits::REQ_PRIVATE_DATA,
            )?;
            let params = ibcm_cep::ConnectParams {
                service_id: c.service_id,
                port: c.port,
                pkey: c.pkey,
                qpn: c.qpn,
                transport: transport_from_abi(c.transport)?,
                starting_psn: (c.flags & flags::PSN_GIVEN != 0).then_some(c.starting_psn),
                primary_path: primary,
                alternate_path: alternate,
                path_mtu: mtu_from_abi(c.path_mtu)?,
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                remote_cm_response_timeout: c.remote_cm_response_timeout,
                local_cm_response_timeout: c.local_cm_response_timeout,
                retry_count: c.retry_count,
                rnr_retry_count: c.rnr_retry_count,
                max_cm_retries: c.max_cm_retries,
                srq: c.flags & flags::SRQ != 0,
                flow_control: c.flags & flags::FLOW_CONTROL != 0,
                private_data,
            };
            let (quotas, users) = (i.quotas, &i.users);
            let f = i.files.get(file.0).ok_or(status::INVALID_HANDLE)?;
            f.may_use_path(&primary)?;
            if let Some(alternate) = &alternate {
                f.may_use_path(alternate)?;
            }
            f.quota_events(&quotas, users)?;
            f.may_name_qpn(&i.cm, file.0, (c.port, c.qpn))?;
            let cep = i.touch(file, c.handle)?;
            // An endpoint that cannot connect says so first (the engine's state check).
            // The alternate path may leave from another port of the CA: the engine's
            // `connect` places it (`check_alternate_source`).
            if i.cm.state(cep).map_err(status_of)? == ibcm_cep::StateName::Idle {
                i.cm.check_source(c.port, &primary).map_err(status_of)?;
            }
            // The REP (or REJ, or timeout) comes at DISPATCH_LEVEL: room for it now.
            i.prepare_for_requests(file, 0);
            if c.flags & flags::PEER_TO_PEER != 0 {
                i.cm.connect_peer(now, cep, &params).map_err(status_of)?;
            } else {
                i.cm.connect(now, cep, &params).map_err(status_of)?;
            }
            Ok(0)
        }
        code::FORMAT_REP => {
            let r: FormatRepIn = input(bytes, FormatRepIn::SIZE)?;
            check_reserved(r.reserved == 0 && r.reserved1 == [0; 3])?;
            require(r.flags & !(flags::PSN_GIVEN | flags::SRQ | flags::FLOW_CONTROL) == 0)?;
            require(r.failover_accepted <= 2)?;
            if request.output_len() < QpTransitionsOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            let private_data = used(
                &r.private_data,
                r.private_data_len,
                limits::REP_PRIVATE_DATA,
            )?;
            let params = ibcm_cep::RepParams {
                qpn: r.qpn,
                starting_psn: (r.flags & flags::PSN_GIVEN != 0).then_some(r.starting_psn),
                responder_resources: r.responder_resources,
                initiator_depth: r.initiator_depth,
                rnr_retry_count: r.rnr_retry_count,
                failover_accepted: ibcm_mad::Failover::from(r.failover_accepted),
                flow_control: r.flags & flags::FLOW_CONTROL != 0,
                srq: r.flags & flags::SRQ != 0,
                private_data,
            };
            let cep = i.touch(file, r.handle)?;
            let port = i.cm.query(cep).map_err(status_of)?.port;
            let f = i.files.get(file.0).ok_or(status::INVALID_HANDLE)?;
            f.may_name_qpn(&i.cm, file.0, (port, r.qpn))?;
            let prepared = i.cm.prepare_rep(cep, &params).map_err(status_of)?;
            let out = QpTransitionsOut {
                size: QpTransitionsOut::SIZE,
                reserved: 0,
                init: qp_attr_to_abi(&prepared.init),
                rtr: qp_attr_to_abi(&prepared.rtr),
                rts: qp_attr_to_abi(&prepared.rts),
            };
            Ok(output(request, &out)?)
        }
        code::SEND_REP => {
            let cep = i.touch(file, handle_in(bytes)?)?;
            i.cm.send_rep(now, cep).map_err(status_of)?;
            Ok(0)
        }
        code::RTU | code::DREQ | code::DREP => {
            let p: PrivateDataIn = input(bytes, PrivateDataIn::SIZE)?;
            check_reserved(p.reserved == 0 && p.reserved1 == [0; 7])?;
            let max = if code == code::DREQ {
                limits::DREQ_PRIVATE_DATA
            } else {
                limits::RTU_PRIVATE_DATA
            };
            let data = used(&p.private_data, p.private_data_len, max)?;
            let cep = i.touch(file, p.handle)?;
            match code {
                code::RTU => i.cm.rtu(cep, data),
                code::DREQ => i.cm.disconnect(now, cep, data),
                _ => i.cm.drep(now, cep, data),
            }
            .map_err(status_of)?;
            Ok(0)
        }
        code::REJ => {
            let r: RejIn = input(bytes, RejIn::SIZE)?;
            check_reserved(r.reserved == 0 && r.reserved1 == 0 && r.reserved2 == [0; 4])?;
            let ari = used(&r.ari, r.ari_len, limits::REJ_ARI)?;
            let data = used(
                &r.private_data,
                r.private_data_len,
                limits::REJ_PRIVATE_DATA,
            )?;
            let cep = i.touch(file, r.handle)?;
            let params = ibcm_cep::RejectParams {
                reason: ibcm_mad::RejReason::from(r.reason),
                ari,
                private_data: data,
            };
            i.cm.reject(now, cep, &params).map_err(status_of)?;
            Ok(0)
        }
        code::MRA => {
            let m: MraIn = input(bytes, MraIn::SIZE)?;
            check_reserved(m.reserved == 0 && m.reserved1 == [0; 6] && m.reserved2 == [0; 2])?;
            let data = used(
                &m.private_data,
                m.private_data_len,
                limits::MRA_PRIVATE_DATA,
            )?;
            let cep = i.touch(file, m.handle)?;
            i.cm.mra(cep, m.service_timeout, data).map_err(status_of)?;
            Ok(0)
        }
        code::GET_QP_ATTR => {
            let q: GetQpAttrIn = input(bytes, GetQpAttrIn::SIZE)?;
            check_reserved(q.reserved == 0 && q.reserved1 == 0)?;
            let state = qp_state_from_abi(q.qp_state)?;
            if request.output_len() < QpAttrOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            let cep = i.touch(file, q.handle)?;
            let attr = i.cm.qp_attributes(cep, state).map_err(status_of)?;
            let out = QpAttrOut {
                size: QpAttrOut::SIZE,
                reserved: 0,
                attr: qp_attr_to_abi(&attr),
            };
            Ok(output(request, &out)?)
        }
        code::GET_QP_TRANSITIONS => {
            let h = handle_in(bytes)?;
            if request.output_len() < QpTransitionsOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            let cep = i.touch(file, h)?;
            let out = qp_transitions(&i.cm, cep)?;
            Ok(output(request, &out)?)
        }
        code::QUERY => {
            let h = handle_in(bytes)?;
            let ep = i.endpoint(file, h)?;
            let (cep, kept) = (ep.cep, ep.private_data);
            let info = i.cm.query(cep).map_err(status_of)?;
            let out = query_to_abi(&info, i.pdata.get(kept));
            Ok(output(request, &out)?)
        }
        code::ESTABLISHED => {
            let cep = i.touch(file, handle_in(bytes)?)?;
            i.cm.established(cep).map_err(status_of)?;
            Ok(0)
        }
        code::LAP => {
            let l: LapIn = input(bytes, LapIn::SIZE)?;
            check_reserved(l.reserved == 0 && l.reserved1 == [0; 7])?;
            let path = path_from_abi(&l.alternate)?;
            let data = used(&l.private_data, l.private_data_len, 168)?;
            i.files
                .get(file.0)
                .ok_or(status::INVALID_HANDLE)?
                .may_use_path(&path)?;
            let cep = i.touch(file, l.handle)?;
            i.cm.lap(now, cep, &path, data).map_err(status_of)?;
            Ok(0)
        }
        code::PREPARE_APR => {
            let a: AprIn = input(bytes, AprIn::SIZE)?;
            check_reserved(a.reserved == 0 && a.reserved1 == [0; 5] && a.reserved2 == [0; 4])?;
            require(a.status <= 13)?;
            let info = used(&a.info, a.info_len, 72)?;
            let data = used(&a.private_data, a.private_data_len, 148)?;
            if request.output_len() < QpAttrOut::SIZE as usize {
                return Err(status::BUFFER_TOO_SMALL);
            }
            let cep = i.touch(file, a.handle)?;
            let rts =
                i.cm.prepare_apr(cep, ibcm_mad::AprStatus::from(a.status), info, data)
                    .map_err(status_of)?;
            let mut out = QpAttrOut::new_zeroed();
            out.size = QpAttrOut::SIZE;
            if let Some(rts) = rts {
                out.attr = qp_attr_to_abi(&rts);
            }
            Ok(output(request, &out)?)
        }
        code::SEND_APR => {
            let cep = i.touch(file, handle_in(bytes)?)?;
            i.cm.send_apr(cep).map_err(status_of)?;
            Ok(0)
        }
        code::MIGRATE => {
            let cep = i.touch(file, handle_in(bytes)?)?;
            i.cm.migrate(cep).map_err(status_of)?;
            Ok(0)
        }
        code::SIDR_REQ => {
            let r: SidrReqIn = input(bytes, SidrReqIn::SIZE)?;
            check_reserved(r.reserved == 0 && r.reserved1 == [0; 2])?;
            let path = path_from_abi(&r.path)?;
            let data = used(&r.private_data, r.private_data_len, 216)?;
            let params = ibcm_cep::SidrParams {
                service_id: r.service_id,
                port: r.port,
                pkey: r.pkey,
                path,
                timeout: r.timeout,
                max_retries: r.max_retries,
                private_data: data,
            };
            let (quotas, users) = (i.quotas, &i.users);
            i.files
                .get(file.0)
                .ok_or(status::INVALID_HANDLE)?
                .quota_events(&quotas, users)?;
            i.cm.check_source(r.port, &params.path).map_err(status_of)?;
            let cep = i.touch(file, r.handle)?;
            i.cm.sidr_request(now, cep, &params).map_err(status_of)?;
            Ok(0)
        }
        code::SIDR_REP => {
            let r: SidrRepIn = input(bytes, SidrRepIn::SIZE)?;
            check_reserved(r.reserved == 0 && r.reserved1 == [0; 5])?;
            require(r.status <= 5)?;
            let info = used(&r.info, r.info_len, 72)?;
            let data = used(&r.private_data, r.private_data_len, 136)?;
            let params = ibcm_cep::SidrReplyParams {
                status: ibcm_mad::SidrStatus::from(r.status),
                qpn: r.qpn,
                qkey: r.qkey,
                info,
                private_data: data,
            };
            let cep = i.touch(file, r.handle)?;
            i.cm.sidr_reply(now, cep, &params).map_err(status_of)?;
            Ok(0)
        }
        code::COUNTERS => {
            let c: CountersIn = input(bytes, CountersIn::SIZE)?;
            check_reserved(c.reserved == 0)?;
            let k = i.cm.counters();
            let out = CountersOut {
                size: CountersOut::SIZE,
                reserved: 0,
                sent: k.sent,
                retries: k.retries,
                received: k.received,
                duplicates: k.duplicates,
                malformed: k.malformed,
                unmatched: k.unmatched,
                backlog_drops: k.backlog_drops,
                forged: k.forged,
                quota_exceeded: i.quota_exceeded,
            };
            Ok(output(request, &out)?)
        }
        _ => Err(status::INVALID_DEVICE_REQUEST),
    }
}

pub(super) fn handle_in(bytes: &[u8]) -> Result<u64, Status> {
    let h: HandleIn = input(bytes, HandleIn::SIZE)?;
    check_reserved(h.reserved == 0)?;
    Ok(h.handle)
}
