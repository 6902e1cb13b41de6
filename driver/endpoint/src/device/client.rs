//! The kernel-client CM interface: what another driver (a WinVerbs or NetworkDirect kernel
//! provider) calls, shaped like WinOF's `iba_cm_interface` so providers can move over.
//!
//! Guarantees (each tested on the host):
//! - At most one callback per endpoint runs at a time; events arrive in order and none is
//!   lost. Callbacks of different endpoints may run in parallel.
//! - A callback may call any downcall on its own endpoint, including [`destroy_id`]
//!   (deferred until the callback returns).
//! - A non-zero return from a callback destroys the endpoint after the callback has
//!   returned and its reference is dropped (WinOF's al_cm.c freed the id first).
//! - [`destroy_id`] is synchronous: when it returns, no callback runs or will run. It waits
//!   only for a callback already running on another thread, never for the network.
//! - An endpoint created by a listen gets no callback until it is retrieved
//!   ([`get_request`], [`get_request_ex`]); events that arrive before are queued for it.
//! - Device removal reaches every endpoint once, through the same serialized path. After
//!   it no endpoint can be created and every downcall but `destroy_id` and the retrieval
//!   of requests fails with `InvalidState { state: Removed }`.
//!
//! Callbacks run with no lock held, on whichever thread produced the event: the receive
//! path or timer DPC (DISPATCH_LEVEL) or a downcall's thread. Like `iba_cm` callbacks they
//! must not block.
//!
//! [`destroy_id`]: Device::destroy_id
//! [`get_request`]: Device::get_request
//! [`get_request_ex`]: Device::get_request_ex

use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;

use ibcm_cep::{
    CepId, CmError, CmManager, ConnectParams, Event, Instant, ListenParams, PathRecord,
    PreparedRep, QpAttributes, QpState, RejectParams, RepParams, SidrParams, SidrReplyParams,
};

use super::{Device, Inner, Owner, Table};
use crate::platform::{Lock, Platform};

/// A kernel client's endpoint: index and generation in the client table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(u64);

impl ClientId {
    /// The raw value, for a C-ABI handle.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Rebuilds an id from [`ClientId::raw`]; every downcall checks it (index and
    /// generation), so a stale or forged value names no endpoint.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }
}

/// What a callback receives: the event and, for a REQ or SIDR_REQ on a listen, the new
/// endpoint (retrieve it with `get_request`).
#[derive(Debug, Clone, Copy)]
pub struct ClientEvent {
    /// The event, with its typed payload.
    pub event: Event,
    /// The endpoint a REQ or SIDR_REQ created.
    pub new_id: Option<ClientId>,
}

/// A client's callback. Return 0 to keep the endpoint, non-zero to destroy it.
pub type Callback<P> = Arc<dyn Fn(&Device<P>, ClientId, &ClientEvent) -> i32 + Send + Sync>;

pub(crate) struct ClientEp<P: Platform> {
    pub cep: CepId,
    callback: Option<Callback<P>>,
    queue: VecDeque<ClientEvent>,
    /// The thread running this endpoint's callback, if one is.
    delivering: Option<u64>,
    /// Events wait until the endpoint is retrieved from its listen.
    retrieved: bool,
    destroy_requested: bool,
    /// Requests created by this listen, not yet retrieved.
    requests: VecDeque<(ClientId, Event)>,
}

pub(crate) struct Clients<P: Platform> {
    pub table: Table<ClientEp<P>>,
    /// Endpoints that received events since the last delivery pass.
    pub ready: Vec<u64>,
    /// Threads inside a callback: a downcall made from a callback delivers nothing
    /// itself (no nesting); the thread's outer delivery loop picks the events up. Never
    /// grown under the lock ([`Clients::enter_delivery`]).
    delivering_threads: Vec<u64>,
    /// Identities inside a callback or a callback-free downcall that found no room in
    /// `delivering_threads`: while any is, no delivery starts anywhere.
    unrecorded: usize,
    /// Event queues built ahead (at PASSIVE_LEVEL) for endpoints that REQs create at
    /// DISPATCH_LEVEL, so the receive path allocates nothing.
    spares: Vec<VecDeque<ClientEvent>>,
    /// Fixed mode ([`Device::reserve_clients`]): every downcall but `destroy_id` may come
    /// at DISPATCH_LEVEL (WinOF's `iba_cm` contract), so downcalls never grow anything;
    /// they fail with `NoResources` when the room made ahead is used up.
    fixed: bool,
    /// Fixed mode: the backlog every listen gets.
    fixed_backlog: usize,
    /// Fixed mode: (event queue, request queue) pairs with room for `fixed_backlog`, one
    /// per listen.
    listen_spares: Vec<ListenQueues>,
}

/// A listen's event queue and request queue, built ahead in fixed mode.
type ListenQueues = (VecDeque<ClientEvent>, VecDeque<(ClientId, Event)>);

impl<P: Platform> ClientEp<P> {
    /// Heap bytes of its queues.
    pub(super) fn heap_bytes(&self) -> usize {
        self.queue.capacity() * core::mem::size_of::<ClientEvent>()
            + self.requests.capacity() * core::mem::size_of::<(ClientId, Event)>()
    }
}

impl<P: Platform> Clients<P> {
    /// Records `me` as inside a callback or a callback-free downcall (under the lock, at
    /// up to DISPATCH_LEVEL: nothing is allocated). Past the room `reserve_clients` made,
    /// the identity is only counted, and while any such is, no delivery starts on any
    /// thread: a callback never runs where it must not, it waits for the next delivery.
    /// Whether `me` was recorded, for [`Self::leave_delivery`].
    fn enter_delivery(&mut self, me: u64) -> bool {
        if self.delivering_threads.len() < self.delivering_threads.capacity() {
            self.delivering_threads.push(me);
            true
        } else {
            self.unrecorded += 1;
            false
        }
    }

    /// Undoes [`Self::enter_delivery`].
    fn leave_delivery(&mut self, me: u64, recorded: bool) {
        if !recorded {
            self.unrecorded = self.unrecorded.saturating_sub(1);
        } else if let Some(pos) = self.delivering_threads.iter().position(|t| *t == me) {
            self.delivering_threads.swap_remove(pos);
        }
    }

    /// Whether `me` may not start a delivery: it is inside one (or a callback-free
    /// downcall), or an identity that could not be recorded is.
    fn delivery_blocked(&self, me: u64) -> bool {
        self.unrecorded > 0 || self.delivering_threads.contains(&me)
    }

    /// Heap bytes of the queues built ahead, and of the lists of threads and spares.
    pub(super) fn spare_bytes(&self) -> usize {
        self.spares
            .iter()
            .map(|q| q.capacity() * core::mem::size_of::<ClientEvent>())
            .sum::<usize>()
            + self.spares.capacity() * core::mem::size_of::<VecDeque<ClientEvent>>()
            + self.delivering_threads.capacity() * core::mem::size_of::<u64>()
    }
}

/// Events a client endpoint's queue holds without growing.
const QUEUE_DEPTH: usize = 8;

impl<P: Platform> Clients<P> {
    pub const fn new() -> Self {
        Self {
            table: Table::new(),
            ready: Vec::new(),
            delivering_threads: Vec::new(),
            unrecorded: 0,
            spares: Vec::new(),
            fixed: false,
            fixed_backlog: 0,
            listen_spares: Vec::new(),
        }
    }

    /// Grows, at PASSIVE_LEVEL, what the receive path may need: `requests` new
    /// endpoints, and room in the ready list for every endpoint's queue.
    /// Out of memory, the room stays short (each step is fallible): the receive path then
    /// refuses what finds none.
    fn prepare(&mut self, requests: usize) {
        let _ = self.table.try_reserve(requests);
        if self.spares.len() < requests
            && self
                .spares
                .try_reserve(requests - self.spares.len())
                .is_ok()
        {
            while self.spares.len() < requests {
                let mut queue = VecDeque::new();
                if queue.try_reserve_exact(QUEUE_DEPTH).is_err() {
                    break;
                }
                self.spares.push(queue);
            }
        }
        let want = (self.table.live + requests) * QUEUE_DEPTH;
        let _ = self
            .ready
            .try_reserve(want.saturating_sub(self.ready.len()));
        let _ = self.delivering_threads.try_reserve(8);
    }

    fn new_endpoint(
        cep: CepId,
        callback: Option<Callback<P>>,
        queue: VecDeque<ClientEvent>,
    ) -> ClientEp<P> {
        ClientEp {
            cep,
            retrieved: callback.is_some(),
            callback,
            queue,
            delivering: None,
            destroy_requested: false,
            requests: VecDeque::new(),
        }
    }
}

/// The marker in [`Owner::file`] for a kernel client's CEP (file handles are never 0).
pub(crate) const CLIENT_FILE: u64 = 0;

impl<P: Platform> Inner<P> {
    /// Queues an event for a kernel client's endpoint.
    pub(crate) fn queue_client(&mut self, handle: u64, event: ClientEvent) {
        if let Some(ep) = self.clients.table.get_mut(handle) {
            ep.queue.push_back(event);
            self.clients.ready.push(handle);
        }
    }

    /// A REQ or SIDR_REQ created `cep` under a client's listen: the new endpoint is
    /// created unretrieved (no callback, events queued), and the listen is told.
    pub(crate) fn client_request(&mut self, cep: CepId, listen: u64, event: &Event) {
        if self.clients.fixed {
            // DISPATCH_LEVEL with only the room made ahead: without a spare queue, a
            // table slot and room in the listen's queues the REQ is refused (the engine
            // rejects it), never allocated for.
            let listen_room = self.clients.table.get(listen).is_some_and(|l| {
                l.requests.len() < l.requests.capacity() && l.queue.len() < l.queue.capacity()
            });
            if !listen_room || self.clients.spares.is_empty() || !self.clients.table.can_insert() {
                let now = self.now;
                let _ = self.cm.destroy(now, cep);
                return;
            }
        }
        let queue = self.clients.spares.pop().unwrap_or_default();
        // DISPATCH_LEVEL: a table that cannot take it (memory short) refuses the REQ.
        let child = match self
            .clients
            .table
            .try_insert(Clients::<P>::new_endpoint(cep, None, queue))
        {
            Ok(child) => child,
            Err(ep) => {
                // A spare's queue goes back where it came from (the room is still there).
                if ep.queue.capacity() > 0
                    && self.clients.spares.len() < self.clients.spares.capacity()
                {
                    self.clients.spares.push(ep.queue);
                }
                let now = self.now;
                let _ = self.cm.destroy(now, cep);
                return;
            }
        };
        self.set_owner(
            cep,
            Owner {
                file: CLIENT_FILE,
                endpoint: child,
            },
        );
        if let Some(l) = self.clients.table.get_mut(listen) {
            l.requests.push_back((ClientId(child), *event));
        }
        self.queue_client(
            listen,
            ClientEvent {
                event: *event,
                new_id: Some(ClientId(child)),
            },
        );
    }

    /// Device removal for kernel clients: endpoints the engine did not tell (idle,
    /// listening) get DEVICE_REMOVAL here, so each hears of it exactly once.
    pub(crate) fn remove_clients(&mut self) {
        let handles: Vec<u64> = self.clients.table.handles().collect();
        for h in handles {
            let told = self
                .clients
                .table
                .get(h)
                .and_then(|ep| self.cm.state(ep.cep).ok())
                == Some(ibcm_cep::StateName::Removed);
            if !told {
                self.queue_client(
                    h,
                    ClientEvent {
                        event: Event::DeviceRemoval,
                        new_id: None,
                    },
                );
            }
        }
    }
}

impl<P: Platform> Device<P> {
    /// `create_id`: a new idle endpoint whose events go to `callback`.
    pub fn create_id(&self, callback: Callback<P>) -> Result<ClientId, CmError> {
        self.run(|i| {
            // An endpoint created after removal would never hear of it.
            not_removed(i)?;
            if i.clients.fixed {
                return create_fixed(i, callback);
            }
            let mut queue = VecDeque::new();
            queue
                .try_reserve_exact(QUEUE_DEPTH)
                .map_err(|_| CmError::NoResources)?;
            let cep = i.cm.create()?;
            i.clients.prepare(0);
            let id = match i.clients.table.try_insert(Clients::<P>::new_endpoint(
                cep,
                Some(callback),
                queue,
            )) {
                Ok(id) => id,
                Err(_) => {
                    let now = i.now;
                    let _ = i.cm.destroy(now, cep);
                    return Err(CmError::NoResources);
                }
            };
            i.clients.prepare(1);
            i.set_owner(
                cep,
                Owner {
                    file: CLIENT_FILE,
                    endpoint: id,
                },
            );
            Ok(ClientId(id))
        })
    }

    /// `destroy_id`: synchronous. From inside the endpoint's own callback the destroy is
    /// deferred until the callback returns; from elsewhere it waits for a running callback
    /// to return. The connection is torn down by the engine in the background (it never
    /// waits for the network); no callback runs after this returns.
    pub fn destroy_id(&self, id: ClientId) {
        let me = self.platform.current_thread();
        loop {
            let wait = self.inner.with(|i| {
                let Some(ep) = i.clients.table.get_mut(id.0) else {
                    return false;
                };
                ep.destroy_requested = true;
                match ep.delivering {
                    Some(t) if t == me => false, // deferred: the deliverer destroys it
                    Some(_) => true,
                    None => false,
                }
            });
            if !wait {
                break;
            }
            self.platform.relax();
        }
        let now = self.platform.now();
        self.run(|i| {
            let deliverer_is_me = i
                .clients
                .table
                .get(id.0)
                .and_then(|ep| ep.delivering)
                .is_some_and(|t| t == me);
            if !deliverer_is_me {
                destroy_client(i, now, id);
                // PASSIVE_LEVEL: private-data blocks nobody uses go back.
                i.cm.trim_private_data();
            }
        });
    }

    /// `listen`.
    pub fn listen_id(&self, id: ClientId, params: ListenParams) -> Result<(), CmError> {
        let backlog = params.backlog as usize;
        self.run(|i| {
            let cep = i.clients.table.get(id.0).ok_or(CmError::UnknownCep)?.cep;
            not_removed(i)?;
            if i.clients.fixed {
                return listen_fixed(i, id, cep, params);
            }
            // Room for the backlog's requests first (fallibly: nothing listens yet).
            if let Some(ep) = i.clients.table.get_mut(id.0) {
                let no = |_| CmError::NoResources;
                ep.requests.try_reserve(backlog).map_err(no)?;
                ep.queue.try_reserve(backlog).map_err(no)?;
            }
            i.cm.listen(cep, params)?;
            i.clients.prepare(backlog);
            let _ = i.cm.reserve(backlog);
            i.prepare_batches();
            Ok(())
        })
    }

    /// `cancel_listen`: the endpoint stops listening and returns to idle; requests not
    /// retrieved yet are refused.
    pub fn cancel_listen(&self, id: ClientId) -> Result<(), CmError> {
        let now = self.platform.now();
        self.run(|i| {
            let ep = i.clients.table.get_mut(id.0).ok_or(CmError::UnknownCep)?;
            let old = ep.cep;
            if i.cm.state(old)? != ibcm_cep::StateName::Listen {
                return Err(CmError::InvalidState {
                    state: i.cm.state(old)?,
                });
            }
            let fresh = i.cm.create()?;
            if let Some(ep) = i.clients.table.get_mut(id.0) {
                ep.cep = fresh;
                ep.queue.retain(|e| e.new_id.is_none());
            }
            // One at a time, so that nothing is collected (this may run at DISPATCH_LEVEL).
            while let Some((child, _)) = i
                .clients
                .table
                .get_mut(id.0)
                .and_then(|ep| ep.requests.pop_front())
            {
                destroy_client(i, now, child);
            }
            let _ = i.cm.destroy(now, old);
            i.clear_owner(old);
            i.set_owner(
                fresh,
                Owner {
                    file: CLIENT_FILE,
                    endpoint: id.0,
                },
            );
            Ok(())
        })
    }

    /// `get_request`: the next request a listen received (the new endpoint and its REQ or
    /// SIDR_REQ event). The endpoint gets callbacks only once one is installed with
    /// [`set_callback`](Self::set_callback); use [`get_request_ex`](Self::get_request_ex)
    /// to do both atomically.
    pub fn get_request(&self, listen: ClientId) -> Option<(ClientId, Event)> {
        self.take_request(listen, None)
    }

    /// `get_request_ex`: [`get_request`](Self::get_request) that installs the new
    /// endpoint's callback atomically: events queued for it are delivered to `callback`,
    /// in order, starting now.
    pub fn get_request_ex(
        &self,
        listen: ClientId,
        callback: Callback<P>,
    ) -> Option<(ClientId, Event)> {
        self.take_request(listen, Some(callback))
    }

    fn take_request(
        &self,
        listen: ClientId,
        callback: Option<Callback<P>>,
    ) -> Option<(ClientId, Event)> {
        let me = self.platform.current_thread();
        self.run(|i| {
            // From a callback (the receive path: DISPATCH_LEVEL) grow nothing; the spare
            // queue this request used comes back when an endpoint is destroyed.
            if !i.clients.fixed && !i.clients.delivery_blocked(me) {
                let backlog = i
                    .clients
                    .table
                    .get(listen.0)
                    .map_or(0, |l| l.requests.capacity());
                i.clients.prepare(backlog);
                let _ = i.cm.reserve(backlog);
                i.prepare_batches();
            }
            loop {
                let (child, event) = i.clients.table.get_mut(listen.0)?.requests.pop_front()?;
                // A request whose endpoint was destroyed before anyone took it is skipped.
                let Some(ep) = i.clients.table.get_mut(child.0) else {
                    continue;
                };
                let cep = ep.cep;
                if callback.is_some() {
                    ep.callback = callback;
                    ep.retrieved = true;
                    i.clients.ready.push(child.0);
                }
                let _ = i.cm.take_request(cep);
                return Some((child, event));
            }
        })
    }

    /// Installs (or replaces) an endpoint's callback; queued events then flow to it.
    pub fn set_callback(&self, id: ClientId, callback: Callback<P>) -> Result<(), CmError> {
        self.run(|i| {
            let ep = i.clients.table.get_mut(id.0).ok_or(CmError::UnknownCep)?;
            ep.callback = Some(callback);
            ep.retrieved = true;
            i.clients.ready.push(id.0);
            Ok(())
        })
    }

    fn client_op<T>(
        &self,
        id: ClientId,
        f: impl FnOnce(&mut CmManager, CepId, Instant) -> Result<T, CmError>,
    ) -> Result<T, CmError> {
        let now = self.platform.now();
        let me = self.platform.current_thread();
        let (result, low) = self.run(|i| {
            let result = client_downcall(i, id, me, now, f);
            // DISPATCH_LEVEL took private-data blocks: PASSIVE_LEVEL work tops them up
            // before they run out (a downcall that finds none fails with NoResources).
            (result, i.cm.private_data_low())
        });
        if low {
            self.platform.request_passive_work();
        }
        result
    }

    /// `send_req`.
    pub fn send_req(&self, id: ClientId, p: &ConnectParams<'_>) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, now| cm.connect(now, cep, p))
    }

    /// `format_rep`: pre-REP, returning the INIT/RTR/RTS attributes; the read limits
    /// read as AL reads them ([`ibcm_cep::CmManager::prepare_rep_as_al`]).
    pub fn format_rep(&self, id: ClientId, p: &RepParams<'_>) -> Result<PreparedRep, CmError> {
        self.client_op(id, |cm, cep, _| cm.prepare_rep_as_al(cep, p))
    }

    /// `send_formatted_rep`.
    pub fn send_formatted_rep(&self, id: ClientId) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, now| cm.send_rep(now, cep))
    }

    /// `send_rep`: format (as [`Self::format_rep`]) and send in one step.
    pub fn send_rep(&self, id: ClientId, p: &RepParams<'_>) -> Result<PreparedRep, CmError> {
        self.client_op(id, |cm, cep, now| {
            let prepared = cm.prepare_rep_as_al(cep, p)?;
            cm.send_rep(now, cep)?;
            Ok(prepared)
        })
    }

    /// `send_rtu`.
    pub fn send_rtu(&self, id: ClientId, private_data: &[u8]) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, _| cm.rtu(cep, private_data))
    }

    /// `send_dreq`.
    pub fn send_dreq(&self, id: ClientId, private_data: &[u8]) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, now| cm.disconnect(now, cep, private_data))
    }

    /// `send_drep`.
    pub fn send_drep(&self, id: ClientId, private_data: &[u8]) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, now| cm.drep(now, cep, private_data))
    }

    /// `send_rej`.
    pub fn send_rej(&self, id: ClientId, p: &RejectParams<'_>) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, now| cm.reject(now, cep, p))
    }

    /// `send_mra`.
    pub fn send_mra(
        &self,
        id: ClientId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, _| cm.mra(cep, service_timeout, private_data))
    }

    /// `send_lap`.
    pub fn send_lap(
        &self,
        id: ClientId,
        alternate: &PathRecord,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, now| cm.lap(now, cep, alternate, private_data))
    }

    /// `send_apr`: answers a LAP; for status Success returns the RTS attributes with the
    /// alternate path loaded (REARM).
    pub fn send_apr(
        &self,
        id: ClientId,
        status: ibcm_mad::AprStatus,
        info: &[u8],
        private_data: &[u8],
    ) -> Result<Option<QpAttributes>, CmError> {
        self.client_op(id, |cm, cep, _| {
            let rts = cm.prepare_apr(cep, status, info, private_data)?;
            cm.send_apr(cep)?;
            Ok(rts)
        })
    }

    /// `send_sidr_req`.
    pub fn send_sidr_req(&self, id: ClientId, p: &SidrParams<'_>) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, now| cm.sidr_request(now, cep, p))
    }

    /// `send_sidr_rep`.
    pub fn send_sidr_rep(&self, id: ClientId, p: &SidrReplyParams<'_>) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, now| cm.sidr_reply(now, cep, p))
    }

    /// `get_qp_attr`.
    pub fn get_qp_attr(&self, id: ClientId, state: QpState) -> Result<QpAttributes, CmError> {
        self.client_op(id, |cm, cep, _| cm.qp_attributes(cep, state))
    }

    /// `migrate`.
    pub fn migrate(&self, id: ClientId) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, _| cm.migrate(cep))
    }

    /// `established`.
    pub fn established(&self, id: ClientId) -> Result<(), CmError> {
        self.client_op(id, |cm, cep, _| cm.established(cep))
    }

    /// The engine's view of an endpoint (state, read limits, paths).
    pub fn query_id(&self, id: ClientId) -> Result<ibcm_cep::CepInfo, CmError> {
        self.client_op(id, |cm, cep, _| cm.query(cep))
    }

    /// Fixed mode, for callers that call in at DISPATCH_LEVEL (WinOF's `iba_cm`): makes
    /// room (PASSIVE_LEVEL) for `ids` more kernel-client endpoints, `listens` listens of
    /// `backlog` each and what their connections need in the engine, and from then on no
    /// kernel-client downcall grows anything: one that finds no room fails with
    /// `NoResources` and changes nothing, a REQ that finds none is refused. Call again (at
    /// PASSIVE_LEVEL: after a `destroy_id`, from a work item) to top the room up; it costs
    /// little when the room is there. Fails only if memory runs out.
    ///
    /// `concurrency` is how many entry points may run at once (the CPU count): each keeps
    /// a send batch out while it posts, and at DISPATCH_LEVEL the next one must find a
    /// spare batch made ahead (about 39 KB each) rather than allocate one.
    pub fn reserve_clients(
        &self,
        ids: usize,
        listens: usize,
        backlog: u32,
        concurrency: usize,
    ) -> Result<(), CmError> {
        let now = self.platform.now();
        self.run(|i| {
            // What teardown left unused goes back before the room is made again.
            i.cm.trim_private_data();
            let backlog = backlog as usize;
            let c = &mut i.clients;
            c.fixed = true;
            c.fixed_backlog = backlog;
            let live = c.table.live;
            c.table.try_reserve(ids).map_err(|_| CmError::NoResources)?;
            if c.spares.capacity() < ids {
                c.spares
                    .try_reserve(ids - c.spares.len())
                    .map_err(|_| CmError::NoResources)?;
            }
            while c.spares.len() < ids {
                let mut queue = VecDeque::new();
                queue
                    .try_reserve_exact(QUEUE_DEPTH)
                    .map_err(|_| CmError::NoResources)?;
                c.spares.push(queue);
            }
            if c.listen_spares.capacity() < listens {
                c.listen_spares
                    .try_reserve(listens - c.listen_spares.len())
                    .map_err(|_| CmError::NoResources)?;
            }
            while c.listen_spares.len() < listens {
                let (mut requests, mut queue) = (VecDeque::new(), VecDeque::new());
                requests
                    .try_reserve_exact(backlog)
                    .map_err(|_| CmError::NoResources)?;
                queue
                    .try_reserve_exact(backlog)
                    .map_err(|_| CmError::NoResources)?;
                c.listen_spares.push((requests, queue));
            }
            let ready = (live + ids) * QUEUE_DEPTH + listens * backlog;
            c.ready
                .try_reserve(ready.saturating_sub(c.ready.len()))
                .map_err(|_| CmError::NoResources)?;
            // Threads inside a callback or a downcall that delivers nothing at once.
            c.delivering_threads
                .try_reserve(64)
                .map_err(|_| CmError::NoResources)?;
            let ceps = live + ids + listens * backlog;
            let burst = ceps + i.cm.live_ceps();
            if i.cm.room() < burst {
                i.cm.reserve(burst.saturating_mul(2))?;
            }
            i.prepare_batches();
            // Spare batches for `concurrency` entry points with their batches out at once
            // (`take_flush`); `finish` keeps as many as the spare lists have room for.
            let want = concurrency.max(super::SPARE_BATCHES);
            if i.spare_tx.capacity() < want {
                i.spare_tx
                    .try_reserve_exact(want - i.spare_tx.len())
                    .map_err(|_| CmError::NoResources)?;
            }
            while i.spare_tx.len() < want {
                let batch = super::batch(super::DISPATCH_BATCH).ok_or(CmError::NoResources)?;
                i.spare_tx.push(batch);
            }
            if i.spare_done.capacity() < want {
                i.spare_done
                    .try_reserve_exact(want - i.spare_done.len())
                    .map_err(|_| CmError::NoResources)?;
            }
            while i.spare_done.len() < want {
                let batch = super::batch(super::DISPATCH_BATCH).ok_or(CmError::NoResources)?;
                i.spare_done.push(batch);
            }
            // The engine's listen table grows by one at each listen: warm it to hold
            // `listens` more, on service IDs of the reserved IBA range, under the lock (no
            // REQ can see them).
            let mut warm = 0u64;
            while warm < listens as u64 {
                let cep = i.cm.create()?;
                let _ = i.cm.listen(
                    cep,
                    ListenParams {
                        service_id: 0xFFFF_FFFF_0000_0000 | warm,
                        service_mask: u64::MAX,
                        port: None,
                        compare: None,
                        backlog: 0,
                    },
                );
                warm += 1;
                let _ = i.cm.destroy(now, cep);
            }
            // Room in the listen table for `listens` more than are live: the warming above
            // left room for one (listen, destroy, next), and each top-up gives back room
            // for `listens` more listens' queues (listen_fixed refuses beyond the table).
            i.cm.reserve_listens(listens)?;
            Ok(())
        })
    }

    /// Delivers the kernel-client events that are ready: the deferred delivery of events
    /// a downcall made ready inside [`without_client_callbacks`](Self::without_client_callbacks)
    /// (a DPC on Windows). Callbacks run on this thread, with no lock held.
    pub fn deliver_client_callbacks(&self) {
        self.deliver_callbacks();
    }

    /// Runs `f` (downcalls) so that no callback runs on this thread meanwhile: a caller
    /// that holds its own spin lock across a downcall (WinVerbs, ndfltr) must not be
    /// called back under it. Events made ready meanwhile wait for the next delivery (the
    /// receive path, the timer, [`deliver_client_callbacks`](Self::deliver_client_callbacks));
    /// [`client_callbacks_pending`](Self::client_callbacks_pending) says whether any do.
    pub fn without_client_callbacks<T>(&self, f: impl FnOnce() -> T) -> T {
        let me = self.platform.current_thread();
        let recorded = self.inner.with(|i| i.clients.enter_delivery(me));
        let value = f();
        self.inner.with(|i| i.clients.leave_delivery(me, recorded));
        value
    }

    /// Runs `f`, the callback of endpoint `id` that a delivery is running, under the
    /// identity the callback has now. A delivery takes its identity at the level it
    /// began (below DISPATCH_LEVEL: the thread), but a binding calls its clients raised
    /// (iba_cm's callbacks run at DISPATCH_LEVEL, as AL's do), where the identity is the
    /// processor; a `destroy_id` of its own id or a downcall from inside the callback
    /// must still know itself as the deliverer, or the destroy would wait for the very
    /// callback it runs in (review of issue 27, H1). While raised, no other context can
    /// take this processor's identity: a DPC on it waits for the raise to end.
    pub fn as_deliverer<T>(&self, id: ClientId, f: impl FnOnce() -> T) -> T {
        let me = self.platform.current_thread();
        let was = self.inner.with(|i| {
            let ep = i.clients.table.get_mut(id.0)?;
            let was = ep.delivering.filter(|t| *t != me)?;
            ep.delivering = Some(me);
            Some((was, i.clients.enter_delivery(me)))
        });
        let value = f();
        if let Some((was, recorded)) = was {
            self.inner.with(|i| {
                i.clients.leave_delivery(me, recorded);
                if let Some(ep) = i.clients.table.get_mut(id.0)
                    && ep.delivering == Some(me)
                {
                    ep.delivering = Some(was);
                }
            });
        }
        value
    }

    /// Whether kernel-client events wait for a delivery.
    pub fn client_callbacks_pending(&self) -> bool {
        self.inner.with(|i| !i.clients.ready.is_empty())
    }

    /// Kernel-client endpoints alive.
    pub fn client_count(&self) -> usize {
        self.inner.with(|i| i.clients.table.live)
    }

    /// Delivers queued events to their callbacks, one callback per endpoint at a time,
    /// with no lock held. Runs after every entry point has flushed.
    pub(super) fn deliver_callbacks(&self) {
        let me = self.platform.current_thread();
        loop {
            // Claim one endpoint with an event to deliver.
            let claim = self.inner.with(|i| {
                if i.clients.delivery_blocked(me)
                    || i.clients.delivering_threads.len() == i.clients.delivering_threads.capacity()
                {
                    // Inside a delivery, or no room to record this one (nothing grows
                    // under the lock): the events stay ready for the next delivery.
                    return None;
                }
                while let Some(h) = i.clients.ready.pop() {
                    let Some(ep) = i.clients.table.get_mut(h) else {
                        continue;
                    };
                    if ep.delivering.is_some() || !ep.retrieved || ep.destroy_requested {
                        continue;
                    }
                    let Some(cb) = ep.callback.clone() else {
                        continue;
                    };
                    let Some(event) = ep.queue.pop_front() else {
                        continue;
                    };
                    ep.delivering = Some(me);
                    i.clients.delivering_threads.push(me);
                    return Some((h, cb, event));
                }
                None
            });
            let Some((h, cb, event)) = claim else { return };
            let id = ClientId(h);
            let mut next = Some((cb, event));
            while let Some((cb, event)) = next.take() {
                let verdict = cb(self, id, &event);
                drop(cb);
                next = self.inner.with(|i| {
                    let ep = i.clients.table.get_mut(h)?;
                    if verdict != 0 || ep.destroy_requested {
                        ep.delivering = None;
                        ep.destroy_requested = true;
                        return None;
                    }
                    let more = ep.queue.pop_front();
                    match (more, ep.callback.clone()) {
                        (Some(e), Some(cb)) => Some((cb, e)),
                        (Some(e), None) => {
                            ep.queue.push_front(e);
                            ep.delivering = None;
                            None
                        }
                        (None, _) => {
                            ep.delivering = None;
                            None
                        }
                    }
                });
            }
            // A destroy asked for from inside the callback, or by its return value.
            let destroy = self.inner.with(|i| {
                i.clients.leave_delivery(me, true);
                i.clients
                    .table
                    .get(h)
                    .is_some_and(|ep| ep.destroy_requested && ep.delivering.is_none())
            });
            if destroy {
                let now = self.platform.now();
                self.run(|i| destroy_client(i, now, id));
            }
        }
    }
}

/// `create_id` in fixed mode: only the room made ahead, or `NoResources`.
fn create_fixed<P: Platform>(i: &mut Inner<P>, callback: Callback<P>) -> Result<ClientId, CmError> {
    // Room in the engine for this CEP and what every live one may still add.
    if i.cm.room() <= i.cm.live_ceps() || !i.clients.table.can_insert() {
        return Err(CmError::NoResources);
    }
    let Some(queue) = i.clients.spares.pop() else {
        return Err(CmError::NoResources);
    };
    let cep = match i.cm.create() {
        Ok(cep) => cep,
        Err(e) => {
            i.clients.spares.push(queue);
            return Err(e);
        }
    };
    let id =
        match i
            .clients
            .table
            .try_insert(Clients::<P>::new_endpoint(cep, Some(callback), queue))
        {
            Ok(id) => id,
            Err(ep) => {
                // Its queue came off the spares, whose room stays.
                i.clients.spares.push(ep.queue);
                let now = i.now;
                let _ = i.cm.destroy(now, cep);
                return Err(CmError::NoResources);
            }
        };
    i.set_owner(
        cep,
        Owner {
            file: CLIENT_FILE,
            endpoint: id,
        },
    );
    Ok(ClientId(id))
}

/// A downcall on a client endpoint's CEP, under the lock.
fn client_downcall<P: Platform, T>(
    i: &mut Inner<P>,
    id: ClientId,
    me: u64,
    now: Instant,
    f: impl FnOnce(&mut CmManager, CepId, Instant) -> Result<T, CmError>,
) -> Result<T, CmError> {
    let cep = i.clients.table.get(id.0).ok_or(CmError::UnknownCep)?.cep;
    // After removal nothing is sent and no timer runs: an idle CEP would connect into the
    // void and never hear back. Only destroy works (as for IOCTLs).
    not_removed(i)?;
    // PASSIVE_LEVEL: room for what the answers to every live CEP's downcalls bring at
    // DISPATCH_LEVEL (peer lookups, timers, events): reserving for this one alone is used
    // up by the others in flight. From a callback (the receive path: DISPATCH_LEVEL) or in
    // fixed mode (any IRQL) grow nothing: the engine then stores private data only in the
    // blocks made ahead, or fails with NoResources.
    if !i.clients.fixed && !i.clients.delivering_threads.contains(&me) {
        let live = i.cm.live_ceps();
        if i.cm.room() < live + 1 {
            let _ = i.cm.reserve((live + 1).saturating_mul(2));
        }
        i.prepare_batches();
        i.clients.prepare(0);
    }
    f(&mut i.cm, cep, now)
}

/// `listen` in fixed mode: the listen gets queues with room for the fixed backlog (made
/// ahead), or fails with `NoResources`.
fn listen_fixed<P: Platform>(
    i: &mut Inner<P>,
    id: ClientId,
    cep: CepId,
    mut params: ListenParams,
) -> Result<(), CmError> {
    let backlog = i.clients.fixed_backlog;
    params.backlog = backlog as u32;
    // The engine's listen table has room only for what reserve_clients made.
    if i.cm.listen_room() == 0 {
        return Err(CmError::NoResources);
    }
    let has_room = i
        .clients
        .table
        .get(id.0)
        .is_some_and(|ep| ep.queue.capacity() >= backlog && ep.requests.capacity() >= backlog);
    if !has_room && i.clients.listen_spares.is_empty() {
        return Err(CmError::NoResources);
    }
    i.cm.listen(cep, params)?;
    if has_room {
        return Ok(());
    }
    let (Some(ep), Some((mut queue, requests))) =
        (i.clients.table.get_mut(id.0), i.clients.listen_spares.pop())
    else {
        return Ok(());
    };
    // Events already queued move over (the new queue has room for them: an idle id has
    // at most a few).
    while queue.len() < queue.capacity()
        && let Some(e) = ep.queue.pop_front()
    {
        queue.push_back(e);
    }
    let old = core::mem::replace(&mut ep.queue, queue);
    ep.requests = requests;
    if old.capacity() >= QUEUE_DEPTH && i.clients.spares.len() < i.clients.spares.capacity() {
        i.clients.spares.push(old);
    }
    Ok(())
}

/// Downcalls other than destroy fail once the device is removed.
fn not_removed<P: Platform>(i: &Inner<P>) -> Result<(), CmError> {
    if i.removed {
        return Err(CmError::InvalidState {
            state: ibcm_cep::StateName::Removed,
        });
    }
    Ok(())
}

/// Removes a client endpoint and destroys its CEP (and its unretrieved requests').
fn destroy_client<P: Platform>(i: &mut Inner<P>, now: Instant, id: ClientId) {
    let Some(mut ep) = i.clients.table.remove(id.0) else {
        return;
    };
    // Popped in place: a listen's request queue keeps its room (fixed mode reuses it).
    while let Some((child, _)) = ep.requests.pop_front() {
        destroy_client(i, now, child);
    }
    // A listen's queues go back to the listen spares (fixed mode).
    let backlog = i.clients.fixed_backlog;
    if i.clients.fixed
        && backlog > 0
        && ep.queue.capacity() >= backlog
        && ep.requests.capacity() >= backlog
        && i.clients.listen_spares.len() < i.clients.listen_spares.capacity()
    {
        ep.queue.clear();
        ep.requests.clear();
        let pair = (
            core::mem::take(&mut ep.queue),
            core::mem::take(&mut ep.requests),
        );
        i.clients.listen_spares.push(pair);
    }
    // Its queue becomes a spare for the next REQ (within the room already reserved).
    if i.clients.spares.len() < i.clients.spares.capacity() && ep.queue.capacity() >= QUEUE_DEPTH {
        ep.queue.clear();
        i.clients.spares.push(core::mem::take(&mut ep.queue));
    }
    i.clear_owner(ep.cep);
    let _ = i.cm.destroy(now, ep.cep);
}
