//! Where the engine's output goes, under the lock: each event to its CEP's owner (a user
//! endpoint's waiting GET_EVENT, its FIFO, or a kernel client), each MAD to the send
//! batch; then the flush that leaves the lock with the batches.

use alloc::vec::Vec;

use ibcm_cep::grow::shrink_queue;
use ibcm_cep::{CepId, Event};
use ibcm_ioctl::{EventRecord, MAX_EVENTS_PER_REQUEST, QpTransitionsOut, event_type, status};
use zerocopy::IntoBytes;

use crate::platform::{Platform, Request};
use crate::records::{Status, event_to_abi};

use super::{
    Awaited, CHILD_DEPTH, DISPATCH_BATCH, EVENT_HEADROOM, Endpoint, Fifo, File, FileId, Flush,
    Inner, Owner, Refused, SPARE_BATCHES, batch, forget_waiting, qp_transitions, room,
};

impl<P: Platform> Inner<P> {
    pub(super) fn file(&mut self, file: FileId) -> Result<&mut File<P::Request>, Status> {
        self.files.get_mut(file.0).ok_or(status::INVALID_HANDLE)
    }

    pub(super) fn endpoint(
        &mut self,
        file: FileId,
        handle: u64,
    ) -> Result<&mut Endpoint<P::Request>, Status> {
        self.file(file)?
            .endpoints
            .get_mut(handle)
            .ok_or(status::INVALID_HANDLE)
    }

    /// Whether a DISPATCH_LEVEL entry point finds an event record and a private-data
    /// block for every event it may deliver (else it holds back: pool.rs).
    pub(super) fn has_dispatch_room(&self) -> bool {
        self.records.has_dispatch_room() && self.pdata.has_dispatch_room()
    }

    /// Whether the record pool or the private-data blocks run low: time to ask for
    /// PASSIVE_LEVEL work, before an entry point finds no room.
    pub(super) fn running_low(&self) -> bool {
        self.records.running_low() || self.pdata.running_low()
    }

    pub(super) fn cep_of(&mut self, file: FileId, handle: u64) -> Result<CepId, Status> {
        Ok(self.endpoint(file, handle)?.cep)
    }

    /// The CEP of the endpoint an IOCTL names (PASSIVE_LEVEL), after making room in its
    /// FIFO for the events that may arrive at DISPATCH_LEVEL before it is named again.
    pub(super) fn touch(&mut self, file: FileId, handle: u64) -> Result<CepId, Status> {
        self.grow_fifo(file, handle, EVENT_HEADROOM)
    }

    /// Room in an endpoint's FIFO for `n` more events (PASSIVE_LEVEL); its CEP.
    pub(super) fn grow_fifo(
        &mut self,
        file: FileId,
        handle: u64,
        n: usize,
    ) -> Result<CepId, Status> {
        let ep = self
            .files
            .get_mut(file.0)
            .ok_or(status::INVALID_HANDLE)?
            .endpoints
            .get_mut(handle)
            .ok_or(status::INVALID_HANDLE)?;
        // Its records come from the pool (grown with them), so this allocates nothing.
        ep.events.grow(n);
        Ok(ep.cep)
    }

    pub(super) fn set_owner(&mut self, cep: CepId, owner: Owner) {
        let _ = self.cm.set_owner(cep, Some([owner.file, owner.endpoint]));
    }

    pub(super) fn owner(&self, cep: CepId) -> Option<Owner> {
        self.cm
            .owner(cep)
            .map(|[file, endpoint]| Owner { file, endpoint })
    }

    pub(super) fn clear_owner(&mut self, cep: CepId) {
        let _ = self.cm.set_owner(cep, None);
    }

    /// Grows, at PASSIVE_LEVEL, everything a burst of REQs on this file's listens could
    /// need at DISPATCH_LEVEL: spare endpoints, table slots, owner entries, engine slots.
    /// The engine also gets room for a burst over every live CEP at once: a REP or DREP
    /// for each connecting or disconnecting CEP (peer-table entries, timers, events). The
    /// batches are bounded: a DISPATCH_LEVEL entry point sends and completes at most
    /// [`DISPATCH_BATCH`] MADs and requests.
    pub(super) fn prepare_for_requests(&mut self, file: FileId, extra: usize) {
        let Some(f) = self.files.get_mut(file.0) else {
            return;
        };
        let want = f.backlog + extra;
        if f.endpoints.trim(want) {
            // The channel's queue needs room for the endpoints left, no more.
            let most = f.endpoints.live + f.spares.len().max(want);
            shrink_queue(&mut f.ready, most);
        }
        // Out of memory, the room stays short: a REQ that finds none at DISPATCH_LEVEL
        // is refused (the engine rejects it), as over a full backlog.
        let _ = f.endpoints.try_reserve(want);
        if f.spares.len() < want && f.spares.try_reserve(want - f.spares.len()).is_ok() {
            while f.spares.len() < want {
                f.spares.push(Endpoint::new(
                    CepId::from_raw(0),
                    Fifo::with_room(CHILD_DEPTH),
                ));
            }
        }
        let _ = f.reserve_ready(0);
        self.prepare_batches();
        // The engine: room for the burst, and for every live CEP to take its peer
        // entries and timers (a REP or DREP for each connecting or disconnecting CEP).
        let _ = self.cm.prepare_for(want);
    }

    /// Room for [`DISPATCH_BATCH`] MADs and completions in the batches and in every
    /// spare batch, so that a timer pass or a receive at DISPATCH_LEVEL finds room
    /// whichever batch it gets; event records and endpoints' private-data blocks for
    /// what it delivers (pool.rs, pdata.rs); and free blocks in the engine's private-data
    /// pool for the kernel clients' downcalls at DISPATCH_LEVEL (PASSIVE_LEVEL; the pool
    /// gives memory back where connections end, `trim_private_data`). Out of memory, some
    /// stay short: a batch without room is replaced at the next call.
    pub(super) fn prepare_batches(&mut self) {
        self.records.prepare();
        // Out of memory, DISPATCH_LEVEL entry points hold back (`has_dispatch_room`).
        let _ = self.pdata.prepare();
        // Out of memory: the downcalls that find no block fail with NoResources.
        let _ = self.cm.prepare_private_data();
        // A batch is made with room for DISPATCH_BATCH or none (an empty stand-in), and
        // `finish` keeps only batches with room: only missing ones need making.
        room(&mut self.tx, DISPATCH_BATCH);
        while self.spare_tx.len() < SPARE_BATCHES {
            let Some(batch) = batch(DISPATCH_BATCH) else {
                break;
            };
            self.spare_tx.push(batch);
        }
        room(&mut self.done, DISPATCH_BATCH);
        while self.spare_done.len() < SPARE_BATCHES {
            let Some(batch) = batch(DISPATCH_BATCH) else {
                break;
            };
            self.spare_done.push(batch);
        }
    }

    /// Moves the engine's output into the batches and the endpoints' queues.
    pub(super) fn drain(&mut self) {
        loop {
            while let Some(t) = self.cm.poll_transmit() {
                if !self.removed {
                    self.tx.push(t);
                }
            }
            // Routing may send (a REQ refused for want of room is rejected).
            let Some((cep, event)) = self.cm.poll_event() else {
                break;
            };
            self.route(cep, &event);
        }
    }

    pub(super) fn route(&mut self, cep: CepId, event: &Event) {
        match event {
            // A peer-to-peer CEP that turned passive reports the REQ on itself.
            Event::ReqReceived(req) if req.listen != cep => {
                self.route_request(cep, req.listen, event);
                return;
            }
            Event::SidrReqReceived(req) => {
                self.route_request(cep, req.listen, event);
                return;
            }
            _ => {}
        }
        let Some(o) = self.owner(cep) else { return };
        if o.file == super::client::CLIENT_FILE {
            self.queue_client(
                o.endpoint,
                super::client::ClientEvent {
                    event: *event,
                    new_id: None,
                },
            );
            return;
        }
        let record = event_to_abi(event, o.endpoint, 0);
        self.deliver(FileId(o.file), o.endpoint, &record);
    }

    /// A REQ created `cep` under `listen`: the new endpoint joins the listen's file, and
    /// the event is queued on the listen's endpoint, naming the new handle.
    pub(super) fn route_request(&mut self, cep: CepId, listen: CepId, event: &Event) {
        let Some(lo) = self.owner(listen) else {
            return;
        };
        if lo.file == super::client::CLIENT_FILE {
            self.client_request(cep, lo.endpoint, event);
            return;
        }
        // DISPATCH_LEVEL: the REQ takes a spare endpoint, a table slot and room in the
        // listen's FIFO, all made at PASSIVE_LEVEL. Without them it is refused (the engine
        // rejects it) rather than allocated for: a peer cycling REQs and REJs cannot grow
        // the file while its owner does not read its events.
        let (quotas, users) = (self.quotas, &self.users);
        let Some(file) = self.files.get_mut(lo.file) else {
            return;
        };
        let listen_room = file
            .endpoints
            .get(lo.endpoint)
            .is_some_and(|l| l.events.has_room());
        // A user's handle at its endpoint quota, or all users' at their budget, takes no
        // more (policy.rs).
        let room = listen_room && file.has_endpoint_room(&quotas, users);
        let spare = if room && file.endpoints.can_insert() {
            file.spares.pop()
        } else {
            None
        };
        let Some(mut ep) = spare else {
            let now = self.now;
            let _ = self.cm.destroy(now, cep);
            return;
        };
        ep.cep = cep;
        if let Event::ReqReceived(ibcm_cep::ReqInfo { private_data, .. })
        | Event::SidrReqReceived(ibcm_cep::SidrReqInfo { private_data, .. }) = event
        {
            // A spare endpoint holds no block: one is taken only for private data.
            self.pdata
                .keep(&mut ep.private_data, private_data.as_slice());
        }
        let handle = match file.endpoints.try_insert(ep) {
            Ok(handle) => handle,
            Err(mut ep) => {
                // Room was checked (`can_insert`); should it be missing, the REQ is refused
                // and the endpoint goes back a spare, which holds no block.
                self.pdata.release(core::mem::take(&mut ep.private_data));
                file.spares.push(ep);
                let now = self.now;
                let _ = self.cm.destroy(now, cep);
                return;
            }
        };
        let caller = file.caller;
        self.users.endpoint_added(caller);
        self.set_owner(
            cep,
            Owner {
                file: lo.file,
                endpoint: handle,
            },
        );
        let record = event_to_abi(event, lo.endpoint, handle);
        self.deliver(FileId(lo.file), lo.endpoint, &record);
    }

    /// Gives a record to a waiting GET_EVENT (the endpoint's own, else one on its file's
    /// channel), or queues it (copied once, to where it goes).
    pub(super) fn deliver(&mut self, file: FileId, endpoint: u64, record: &EventRecord) {
        let Some(File {
            caller,
            endpoints,
            channel,
            ready,
            queued,
            waiting: pending_index,
            ..
        }) = self.files.get_mut(file.0)
        else {
            return;
        };
        let Some(ep) = endpoints.get_mut(endpoint) else {
            return;
        };
        if record.new_handle == 0 && record.private_data_len > 0 {
            let n = usize::from(record.private_data_len);
            let data = record.private_data.get(..n).unwrap_or(&[]);
            self.pdata.keep(&mut ep.private_data, data);
        }
        if ep
            .answer
            .as_ref()
            .is_some_and(|(_, awaited)| awaited.answered_by(record.event_type))
            && let Some((mut request, awaited)) = ep.answer.take()
        {
            forget_waiting(pending_index, endpoint, request.key());
            // The CONNECT or SEND_REP that waits for this answer takes it.
            let cep = ep.cep;
            request.write_output(0, record.as_bytes());
            let mut n = EventRecord::SIZE as usize;
            if let Awaited::Rep { transitions: true } = awaited
                && record.event_type == event_type::REP_RECEIVED
                && let Ok(t) = qp_transitions(&self.cm, cep)
            {
                request.write_output(n, t.as_bytes());
                n += QpTransitionsOut::SIZE as usize;
            }
            self.done.push((request, status::SUCCESS, n));
            return;
        }
        // Nothing queued before it and a GET_EVENT waits (the usual case): the record
        // goes straight to its buffer, which holds one at least (checked at dispatch).
        let waiting = if !ep.events.is_empty() {
            None
        } else if let Some(request) = ep.pending.pop_front() {
            forget_waiting(pending_index, endpoint, request.key());
            Some(request)
        } else if ready.is_empty() {
            channel.pop_front()
        } else {
            None
        };
        if let Some(mut request) = waiting {
            request.write_output(0, record.as_bytes());
            self.handed_over(file, record);
            self.done
                .push((request, status::SUCCESS, EventRecord::SIZE as usize));
            return;
        }
        let Some(index) = self.records.put(record) else {
            return;
        };
        self.records.push_back(&mut ep.events, index);
        // One more record queued unread on the file, and of all users' (policy.rs: the
        // events quota).
        *queued += 1;
        self.users.events_queued(*caller, 1);
        if let Some(request) = ep.pending.pop_front() {
            forget_waiting(pending_index, endpoint, request.key());
            self.fill(file, endpoint, request);
            return;
        }
        // Room for every endpoint was made at PASSIVE_LEVEL.
        if !ep.ready && ready.len() < ready.capacity() {
            ep.ready = true;
            ready.push_back(endpoint);
        }
        if let Some(request) = channel.pop_front() {
            self.fill_channel(file, request);
        }
    }

    /// Completes a GET_EVENT on the file's channel with the queued records of its ready
    /// endpoints, oldest endpoint first, as many as its buffer holds; with none queued it
    /// stays pending on the channel.
    pub(super) fn fill_channel(&mut self, file: FileId, mut request: P::Request) {
        let size = EventRecord::SIZE as usize;
        let capacity = (request.output_len() / size).min(MAX_EVENTS_PER_REQUEST as usize);
        let mut written = 0usize;
        while written < capacity {
            let Some(f) = self.files.get_mut(file.0) else {
                break;
            };
            let Some(&handle) = f.ready.front() else {
                break;
            };
            // An endpoint stays on the list until its FIFO is empty: destroyed, or read
            // by its own GET_EVENT meanwhile, it goes.
            let (next, leaves) = match f.endpoints.get_mut(handle) {
                Some(ep) => {
                    let next = self.records.pop_front(&mut ep.events);
                    ep.ready = !ep.events.is_empty();
                    (next, !ep.ready)
                }
                None => (None, true),
            };
            if leaves {
                f.ready.pop_front();
            }
            let Some(record) = next.and_then(|index| self.records.take(index)) else {
                continue;
            };
            f.queued = f.queued.saturating_sub(1);
            self.users.events_read(f.caller, 1);
            request.write_output(written * size, record.as_bytes());
            written += 1;
            self.handed_over(file, &record);
        }
        if written > 0 {
            self.done.push((request, status::SUCCESS, written * size));
        } else if let Some(f) = self.files.get_mut(file.0) {
            // Room for one was made at dispatch, or it came off this queue.
            f.channel.push_front(request);
        }
    }

    /// Completes `request` with as many queued records of the endpoint as its buffer holds.
    pub(super) fn fill(&mut self, file: FileId, endpoint: u64, mut request: P::Request) {
        let capacity = (request.output_len() / EventRecord::SIZE as usize)
            .min(MAX_EVENTS_PER_REQUEST as usize);
        let mut written = 0usize;
        while written < capacity {
            let Inner { files, records, .. } = &mut *self;
            let Some(record) = files
                .get_mut(file.0)
                .and_then(|f| f.endpoints.get_mut(endpoint))
                .and_then(|ep| records.pop_front(&mut ep.events))
                .and_then(|index| records.take(index))
            else {
                break;
            };
            if let Some(f) = self.files.get_mut(file.0) {
                f.queued = f.queued.saturating_sub(1);
                self.users.events_read(f.caller, 1);
            }
            request.write_output(written * EventRecord::SIZE as usize, record.as_bytes());
            written += 1;
            self.handed_over(file, &record);
        }
        self.done.push((
            request,
            status::SUCCESS,
            written * EventRecord::SIZE as usize,
        ));
    }

    /// A record reached the user: a REQ's new endpoint is now known to them, and leaves
    /// the listen's backlog.
    pub(super) fn handed_over(&mut self, file: FileId, record: &EventRecord) {
        if (record.event_type == event_type::REQ_RECEIVED
            || record.event_type == event_type::SIDR_REQ_RECEIVED)
            && record.new_handle != 0
            && let Ok(child) = self.cep_of(file, record.new_handle)
        {
            let _ = self.cm.take_request(child);
        }
    }

    pub(super) fn take_flush(&mut self) -> Flush<P::Request> {
        // The batches go out with no lock held; an entry point running meanwhile (the
        // receive path, DISPATCH_LEVEL, on another CPU) must still find room without
        // allocating: an empty batch stays, a MAD batch is replaced by a spare.
        let tx = if self.tx.is_empty() {
            Vec::new()
        } else {
            let spare = self.spare_tx.pop().unwrap_or_default();
            core::mem::replace(&mut self.tx, spare)
        };
        let forged = self.cm.counters().forged;
        let refused = Refused {
            quota_exceeded: self.quota_exceeded - self.refused_told.quota_exceeded,
            forged: forged.saturating_sub(self.refused_told.forged),
        };
        let refused = (refused != Refused::default()).then(|| {
            self.refused_told = Refused {
                quota_exceeded: self.quota_exceeded,
                forged,
            };
            refused
        });
        Flush {
            refused,
            tx,
            done: if self.done.is_empty() {
                Vec::new()
            } else {
                let spare = self.spare_done.pop().unwrap_or_default();
                core::mem::replace(&mut self.done, spare)
            },
            timer: {
                let deadline = if self.removed {
                    None
                } else {
                    // While the record pool is short, no pass before `room_retry`.
                    let engine = self.cm.poll_timeout();
                    match self.room_retry {
                        Some(retry) => engine.map(|d| d.max(retry)),
                        None => engine,
                    }
                };
                let changed = self.deadline != Some(deadline);
                self.deadline = Some(deadline);
                changed.then_some(deadline)
            },
            seq: {
                self.flushes += 1;
                self.flushes
            },
            callbacks: !self.clients.ready.is_empty(),
        }
    }
}
