//! One CM instance: the backend, the id pool, the registry the C functions find it in,
//! and the reference count of the interface handed out.

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::any::TypeId;
use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use ibcm_cep::{CmError, RejectParams};
use ibcm_endpoint::{Callback, ClientEvent, ClientId, Device, Lock, Platform};
use ibcm_mad::RejReason;

use crate::abi::{
    Be32, INFINIBAND_INTERFACE_CM_VERSION, IbPathRec, IbaCmEvent, IbaCmId, InfinibandInterfaceCm,
    Interface, event_type, nt_success, pdata, rdma_cm,
};
use crate::convert::{Scratch, event_to_abi};

/// What a CM instance needs from the platform it runs on.
pub trait Backend: Send + Sync + 'static {
    /// The dispatch layer's platform.
    type Platform: Platform + 'static;
    /// The dispatch layer (the whole host's CM).
    fn device(&self) -> &Device<Self::Platform>;
    /// Runs `f` at DISPATCH_LEVEL: `KeRaiseIrql(DISPATCH_LEVEL)` .. `KeLowerIrql` on
    /// Windows (a no-op when already there); the verifier's DISPATCH_LEVEL on the host.
    /// Every client callback runs inside it.
    fn at_dispatch(&self, f: &mut dyn FnMut());
    /// Whether the caller runs at PASSIVE_LEVEL (`KeGetCurrentIrql() == PASSIVE_LEVEL`):
    /// only then does `destroy_id` top the pools up.
    fn at_passive(&self) -> bool;
    /// Asks for [`Registered::deliver`] to run soon at DISPATCH_LEVEL (`KeInsertQueueDpc`
    /// of a DPC made at start; it must not allocate).
    fn schedule_delivery(&self);
    /// The local port whose GID table holds `gid` (AL's `__format_path_av` does the same
    /// lookup), or `None`.
    fn port_of_gid(&self, gid: &[u8; 16]) -> Option<u8>;
    /// The index of `pkey` in `port`'s P_Key table (for `ib_qp_mod_t.pkey_index` and the
    /// REQ event); 0 if absent.
    fn pkey_index(&self, port: u8, pkey: u16) -> u16;
    /// This CA's GUID (the REQ event's `local_ca_guid`).
    fn ca_guid(&self) -> u64;
    /// The CA and that CA's own port number behind a dispatch-layer port. One CM serves
    /// every port of every CA, so the platform numbers the ports host-wide; `ib_qp_mod_t`
    /// and the REQ/SIDR_REQ events carry the CA's port number and GUID (AL's
    /// `al_cep_get_*_attr`, `__format_req_event`: the CEP's own CA and port). The
    /// default is a single CA whose ports are the dispatch layer's.
    fn ca_port(&self, port: u8) -> (u64, u8) {
        (self.ca_guid(), port)
    }
    /// The last reference to the interface was dropped after [`Registered::begin_removal`]
    /// (signal the event the removal waits on). At any IRQL <= DISPATCH_LEVEL.
    fn released(&self) {}
}

/// The bounds of an instance, all preallocated at [`Registered::new`] (PASSIVE_LEVEL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `iba_cm_id`s alive at once (listens and requests' ids included).
    pub ids: usize,
    /// Listens at once.
    pub listens: usize,
    /// Requests a listen holds before they are pulled (more are dropped silently, so the
    /// peer retries).
    pub backlog: u32,
    /// Entry points that may run at once: the CPU count (`KeQueryActiveProcessorCountEx`).
    pub concurrency: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            ids: 4096,
            listens: 64,
            backlog: 128,
            concurrency: 16,
        }
    }
}

/// Instances at once in a process (one on Windows: one CM for the host; the tests run
/// two nodes, several tests at once).
pub const MAX_INSTANCES: usize = 16;

/// Where the C functions find the instances: `create_id` has no context argument, so each
/// instance gets its own `create_id` (monomorphised on its registry index); the other
/// functions find the instance whose id pool holds the id pointer.
static REGISTRY: [AtomicPtr<Header>; MAX_INSTANCES] =
    [const { AtomicPtr::new(null_mut()) }; MAX_INSTANCES];

/// Each registered instance's id pool, `[start, end)` addresses, kept beside the registry
/// so that finding an id's instance compares addresses only and reads no header but the
/// one whose pool holds the id (alive while its client holds its reference): another
/// instance may be going away meanwhile. Set after the registry entry, cleared before.
static POOLS: [(AtomicUsize, AtomicUsize); MAX_INSTANCES] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_INSTANCES];

/// The part of an instance the non-generic code reads (the reference callbacks, the
/// pointer checks). First field of [`Instance`].
#[repr(C)]
pub(crate) struct Header {
    type_id: TypeId,
    slots_base: usize,
    references: AtomicUsize,
    removing: AtomicBool,
    released: unsafe fn(*const Header),
}

/// An id of the pool. `#[repr(C)]` with the client's `iba_cm_id` first: the client's
/// pointer is the slot's.
#[repr(C)]
pub(crate) struct IdSlot {
    /// Written by the client (`context`, `callback`) at any time: only ever accessed
    /// through raw pointers, never by reference.
    pub id: UnsafeCell<IbaCmId>,
    /// The path and private data a SIDR_REQ from `get_request` points to; written only by
    /// the `get_request` that took this (free, so unshared) slot.
    pub sidr: UnsafeCell<SidrStore>,
}

/// What a SIDR_REQ event from `get_request` points to.
#[repr(C)]
pub(crate) struct SidrStore {
    pub path: IbPathRec,
    pub pdata: [u8; pdata::SIDR_REQ],
}

/// What the pool knows of a slot (under the pool lock).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Meta {
    pub live: bool,
    /// Counts the slot's uses: a stale free (a callback's error return after the id was
    /// destroyed and its slot reused) frees nothing.
    pub generation: u32,
    pub client: Option<ClientId>,
    pub listen: bool,
    /// RDMA-CM listen: header ranges the engine does not compare, checked per REQ.
    pub post_check: Option<PostCheck>,
}

/// The header bytes an RDMA-CM listen compares beyond what the engine's one contiguous
/// compare covers: up to two ranges of the 36-byte header (see `listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PostCheck {
    pub header: [u8; rdma_cm::HEADER_SIZE],
    pub ranges: [(u8, u8); 2],
}

impl PostCheck {
    /// Whether a REQ's private data matches.
    pub(crate) fn matches(&self, private_data: &[u8]) -> bool {
        self.ranges.iter().all(|&(start, end)| {
            let r = usize::from(start)..usize::from(end);
            private_data.get(r.clone()) == self.header.get(r)
        })
    }
}

pub(crate) struct Pool {
    pub free: Vec<u32>,
    pub meta: Vec<Meta>,
    /// Compare buffers for listens (the engine keeps the one a listen takes).
    pub compare: Vec<Vec<u8>>,
}

/// One CM instance.
#[repr(C)]
pub(crate) struct Instance<B: Backend> {
    header: Header,
    pub backend: B,
    pub config: Config,
    pub slots: Box<[IdSlot]>,
    pub pool: <B::Platform as Platform>::Lock<Pool>,
    /// One callback per slot, made here (cloning one is a reference count, not an
    /// allocation).
    pub callbacks: Vec<Callback<B::Platform>>,
    next_cid: AtomicU32,
    index: usize,
}

// SAFETY: the slots' cells are shared with C clients by design (the iba_cm contract: the
// client writes `context`/`callback` of its own id and reads `cid`); this crate accesses
// them only through raw pointers (volatile reads of what the client may write), and the
// rest of the instance is atomics, the backend (Send + Sync) and the platform's lock.
unsafe impl<B: Backend> Sync for Instance<B> {}
// SAFETY: as above; nothing in an instance is tied to a thread.
unsafe impl<B: Backend> Send for Instance<B> {}

impl<B: Backend> Instance<B> {
    pub(crate) fn device(&self) -> &Device<B::Platform> {
        self.backend.device()
    }

    pub(crate) fn header_ptr(&self) -> *mut c_void {
        (&raw const self.header).cast_mut().cast()
    }

    pub(crate) fn removing(&self) -> bool {
        self.header.removing.load(Ordering::Acquire)
    }

    /// The client pointer of slot `index`.
    pub(crate) fn id_ptr(&self, index: usize) -> *mut IbaCmId {
        self.slots.get(index).map_or(null_mut(), |s| s.id.get())
    }

    pub(crate) fn next_cid(&self) -> Be32 {
        loop {
            let c = self.next_cid.fetch_add(1, Ordering::Relaxed);
            if c != 0 {
                return Be32::new(c);
            }
        }
    }

    /// Takes a free slot (no allocation: the free list was made with room for all).
    pub(crate) fn take_slot(&self) -> Option<usize> {
        self.pool.with(|p| {
            let index = p.free.pop()? as usize;
            if let Some(m) = p.meta.get_mut(index) {
                *m = Meta {
                    live: true,
                    generation: m.generation.wrapping_add(1),
                    ..Meta::default()
                };
            }
            Some(index)
        })
    }

    /// Gives a slot back.
    pub(crate) fn free_slot(&self, index: usize) {
        self.free_use(index, None);
    }

    /// Gives a slot back if it is still in the use `generation` names (any use if `None`).
    pub(crate) fn free_use(&self, index: usize, generation: Option<u32>) {
        self.pool.with(|p| {
            if let Some(m) = p.meta.get_mut(index)
                && m.live
                && generation.is_none_or(|g| g == m.generation)
            {
                *m = Meta {
                    generation: m.generation,
                    ..Meta::default()
                };
                // Room for every slot was made at creation.
                p.free.push(index as u32);
            }
        });
    }

    pub(crate) fn meta(&self, index: usize) -> Option<Meta> {
        self.pool
            .with(|p| p.meta.get(index).copied())
            .filter(|m| m.live)
    }

    pub(crate) fn set_meta(&self, index: usize, f: impl FnOnce(&mut Meta)) {
        self.pool.with(|p| {
            if let Some(m) = p.meta.get_mut(index) {
                f(m);
            }
        });
    }

    /// Free ids.
    pub(crate) fn free_ids(&self) -> usize {
        self.pool.with(|p| p.free.len())
    }

    /// Tops the pools up (PASSIVE_LEVEL): the dispatch layer's room, the compare buffers.
    pub(crate) fn replenish(&self) {
        let c = self.config;
        let _ = self
            .device()
            .reserve_clients(c.ids, c.listens, c.backlog, c.concurrency);
        // Compare buffers are made outside the lock (allocation under a spin lock is what
        // this crate avoids), then put in.
        let missing = self
            .pool
            .with(|p| c.listens.saturating_sub(p.compare.len()));
        for _ in 0..missing {
            let mut buf = Vec::new();
            if buf.try_reserve_exact(pdata::REQ).is_err() {
                break;
            }
            let back = self.pool.with(|p| {
                if p.compare.len() < p.compare.capacity() {
                    p.compare.push(buf);
                    None
                } else {
                    Some(buf)
                }
            });
            drop(back);
        }
    }

    /// Asks for a delivery if a downcall left events ready.
    pub(crate) fn after_downcall(&self) {
        if self.device().client_callbacks_pending() {
            self.backend.schedule_delivery();
        }
    }

    /// The dispatch layer's callback for slot `index`: AL's `cm_cep_handler` (a
    /// connection) or `cm_listen_handler` (a listen).
    fn deliver(&self, index: usize, event: &ClientEvent) -> i32 {
        let Some(meta) = self.meta(index) else {
            return 0;
        };
        let p_id = self.id_ptr(index);
        if meta.listen {
            if let Some(child) = event.new_id {
                if !self.request_passes(&meta, &event.event) {
                    self.refuse(child);
                    return 0;
                }
                let mut ev = IbaCmEvent::zeroed(event_type::REQ_RECEIVED);
                // The listen's return value is ignored (al_cm.c:101-111).
                let _ = self.call_client(p_id, &mut ev);
            }
            return 0;
        }
        let mut scratch = Scratch::new();
        let Some(mut ev) = event_to_abi(&event.event, &mut scratch) else {
            return 0;
        };
        let status = self.call_client(p_id, &mut ev);
        if nt_success(status) {
            return 0;
        }
        // al_cm.c:90-95: the id is destroyed and freed; the dispatch layer destroys the
        // endpoint once this returns, and delivers nothing more to it.
        self.free_use(index, Some(meta.generation));
        1
    }

    /// Calls the client's callback (read afresh from its id) at DISPATCH_LEVEL.
    fn call_client(&self, p_id: *mut IbaCmId, ev: &mut IbaCmEvent) -> i32 {
        let Some(callback) = read_callback(p_id) else {
            return 0;
        };
        let mut status = 0;
        self.backend.at_dispatch(&mut || {
            // SAFETY: the client's function, called as the header declares it, with its id
            // and an event that outlives the call.
            status = unsafe { callback(p_id, ev) };
        });
        status
    }

    /// Whether a REQ or SIDR_REQ passes a listen's RDMA-CM post-check.
    pub(crate) fn request_passes(&self, meta: &Meta, event: &ibcm_cep::Event) -> bool {
        let Some(check) = &meta.post_check else {
            return true;
        };
        match event {
            ibcm_cep::Event::ReqReceived(r) => check.matches(r.private_data.as_slice()),
            ibcm_cep::Event::SidrReqReceived(r) => check.matches(r.private_data.as_slice()),
            _ => true,
        }
    }

    /// Refuses a request no listen takes: REJ "invalid service ID" (IBA 12.6.7, Table
    /// 112 code 8), as AL's `__req_handler` does when `__lookup_listen` finds none; then
    /// the endpoint goes (it has no callback: nothing is waited for).
    pub(crate) fn refuse(&self, child: ClientId) {
        self.reject(child, RejReason::InvalidServiceId);
    }

    /// Rejects a request with `reason` and lets its endpoint go.
    pub(crate) fn reject(&self, child: ClientId, reason: RejReason) {
        let d = self.device();
        let _ = d.send_rej(
            child,
            &RejectParams {
                reason,
                ari: &[],
                private_data: &[],
            },
        );
        d.destroy_id(child);
    }
}

/// The `callback` field of an id of a live instance, read afresh.
pub(crate) fn read_callback(p_id: *mut IbaCmId) -> Option<crate::abi::IbaCmCallback> {
    // SAFETY: `p_id` is a slot of a live instance (callers found it with `find_id` or made
    // it); this takes the field's address, no reference.
    let field = unsafe { &raw const (*p_id).callback };
    // SAFETY: as above; the client may write the field at any time, so it is read
    // volatile, by value.
    unsafe { field.read_volatile() }
}

/// A registered CM instance: what the Windows binding keeps in its device context and
/// hands out in answer to `IRP_MN_QUERY_INTERFACE`.
pub struct Registered<B: Backend> {
    inner: Box<Instance<B>>,
}

impl<B: Backend> core::fmt::Debug for Registered<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Registered")
            .field("index", &self.inner.index)
            .field("references", &self.references())
            .finish_non_exhaustive()
    }
}

/// Drops one reference, through `Header::released` when it was the last one during removal.
fn dereference(h: &Header) {
    let mut n = h.references.load(Ordering::Acquire);
    loop {
        if n == 0 {
            // More dereferences than references: a client bug, ignored.
            return;
        }
        match h
            .references
            .compare_exchange(n, n - 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => break,
            Err(now) => n = now,
        }
    }
    if n == 1 && h.removing.load(Ordering::Acquire) {
        // SAFETY: the function this header was made with, given the header it belongs to.
        unsafe { (h.released)(h) };
    }
}

/// The registered header `context` names, if it names one (compared, never read first).
fn registered_header(context: *mut c_void) -> Option<&'static Header> {
    if context.is_null() {
        return None;
    }
    let found = REGISTRY
        .iter()
        .any(|e| e.load(Ordering::Acquire).cast::<c_void>() == context);
    if !found {
        return None;
    }
    // SAFETY: a registered header stays alive until `Registered` drops, which first waits
    // for every reference to be dropped; a client calls the reference callbacks only while
    // it holds one. Only the header `context` names is read.
    Some(unsafe { &*context.cast::<Header>() })
}

/// `InterfaceReference`.
pub(crate) unsafe extern "C" fn interface_reference(context: *mut c_void) {
    if let Some(h) = registered_header(context) {
        h.references.fetch_add(1, Ordering::AcqRel);
    }
}

/// `InterfaceDereference`.
pub(crate) unsafe extern "C" fn interface_dereference(context: *mut c_void) {
    if let Some(h) = registered_header(context) {
        dereference(h);
    }
}

/// The `released` hook of an instance of `B`.
///
/// # Safety
///
/// `h` is the header of a live `Instance<B>`.
unsafe fn released<B: Backend>(h: *const Header) {
    // SAFETY: per the contract, `h` is the first field of a live `Instance<B>`
    // (`#[repr(C)]`).
    let inst = unsafe { &*h.cast::<Instance<B>>() };
    inst.backend.released();
}

/// The instance of `B` whose pool holds `p_id`, and the slot's index (the pointer is only
/// compared with the pools' bounds, never read).
pub(crate) fn find_id<B: Backend>(p_id: *mut IbaCmId) -> Option<(&'static Instance<B>, usize)> {
    let addr = p_id as usize;
    let size = core::mem::size_of::<IdSlot>();
    for (entry, (start, end)) in REGISTRY.iter().zip(&POOLS) {
        let (start, end) = (start.load(Ordering::Acquire), end.load(Ordering::Acquire));
        if addr < start || addr >= end || !(addr - start).is_multiple_of(size) {
            continue;
        }
        let h = entry.load(Ordering::Acquire);
        if h.is_null() {
            continue;
        }
        // SAFETY: the instance whose pool holds the id: alive while the client that holds
        // the id holds its reference (the interface contract).
        let header = unsafe { &*h };
        if header.type_id != TypeId::of::<B>() || header.slots_base != start {
            continue;
        }
        // SAFETY: the header is the first field of a live `Instance<B>` (its type id says
        // `B`).
        let inst = unsafe { &*h.cast::<Instance<B>>() };
        return Some((inst, (addr - start) / size));
    }
    None
}

/// The instance of `B` at registry index `n` (for `create_id`).
pub(crate) fn instance_at<B: Backend>(n: usize) -> Option<&'static Instance<B>> {
    let h = REGISTRY.get(n)?.load(Ordering::Acquire);
    if h.is_null() {
        return None;
    }
    // SAFETY: registered headers are alive (see `registered_header`).
    let header = unsafe { &*h };
    if header.type_id != TypeId::of::<B>() {
        return None;
    }
    // SAFETY: as in `find_id`.
    Some(unsafe { &*h.cast::<Instance<B>>() })
}

impl<B: Backend> Registered<B> {
    /// Makes an instance (PASSIVE_LEVEL): the id pool, the compare buffers, the dispatch
    /// layer's room ([`Device::reserve_clients`]), and registers it. Fails with
    /// `NoResources` if memory runs out or [`MAX_INSTANCES`] are registered.
    pub fn new(backend: B, config: Config) -> Result<Self, CmError> {
        let no = |_| CmError::NoResources;
        let mut slots = Vec::new();
        slots.try_reserve_exact(config.ids).map_err(no)?;
        for _ in 0..config.ids {
            slots.push(IdSlot {
                id: UnsafeCell::new(IbaCmId {
                    context: null_mut(),
                    callback: None,
                    cid: Be32(0),
                }),
                sidr: UnsafeCell::new(SidrStore {
                    path: IbPathRec::default(),
                    pdata: [0; pdata::SIDR_REQ],
                }),
            });
        }
        let slots = slots.into_boxed_slice();
        let mut free = Vec::new();
        free.try_reserve_exact(config.ids).map_err(no)?;
        free.extend((0..config.ids as u32).rev());
        let mut meta = Vec::new();
        meta.try_reserve_exact(config.ids).map_err(no)?;
        meta.resize(config.ids, Meta::default());
        let mut compare = Vec::new();
        compare.try_reserve_exact(config.listens).map_err(no)?;
        let pool = <B::Platform as Platform>::new_lock(Pool {
            free,
            meta,
            compare,
        });
        let slots_base = slots.as_ptr() as usize;
        let mut inner = Box::new(Instance {
            header: Header {
                type_id: TypeId::of::<B>(),
                slots_base,
                references: AtomicUsize::new(0),
                removing: AtomicBool::new(false),
                released: released::<B>,
            },
            backend,
            config,
            slots,
            pool,
            callbacks: Vec::new(),
            next_cid: AtomicU32::new(1),
            index: MAX_INSTANCES,
        });
        // The callbacks name the instance by address: it is boxed, so it stays put.
        let at = &raw const *inner as usize;
        let mut callbacks = Vec::new();
        callbacks.try_reserve_exact(config.ids).map_err(no)?;
        for index in 0..config.ids {
            let cb: Callback<B::Platform> = Arc::new(
                move |_: &Device<B::Platform>, _: ClientId, event: &ClientEvent| -> i32 {
                    // SAFETY: the instance outlives every endpoint it made: dropping
                    // `Registered` destroys them all (synchronously) before freeing it.
                    let inst = unsafe { &*(at as *const Instance<B>) };
                    inst.deliver(index, event)
                },
            );
            callbacks.push(cb);
        }
        inner.callbacks = callbacks;
        inner.replenish();
        let header = (&raw mut inner.header).cast::<Header>();
        let index = REGISTRY
            .iter()
            .position(|e| {
                e.compare_exchange(null_mut(), header, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            })
            .ok_or(CmError::NoResources)?;
        inner.index = index;
        if let Some((start, end)) = POOLS.get(index) {
            end.store(
                slots_base + config.ids * core::mem::size_of::<IdSlot>(),
                Ordering::Release,
            );
            start.store(slots_base, Ordering::Release);
        }
        Ok(Self { inner })
    }

    /// The answer to `IRP_MN_QUERY_INTERFACE` for `GUID_INFINIBAND_INTERFACE_CM`: the
    /// filled interface, already referenced for the caller (as the query's contract
    /// wants), when `version` is exactly 1.1 and `size` holds it and the instance is not
    /// being removed; `None` otherwise (pass the query down).
    pub fn answer_query(&self, version: u16, size: u16) -> Option<InfinibandInterfaceCm> {
        let full = core::mem::size_of::<InfinibandInterfaceCm>();
        if version != INFINIBAND_INTERFACE_CM_VERSION || usize::from(size) < full {
            return None;
        }
        if self.inner.removing() {
            return None;
        }
        self.inner.header.references.fetch_add(1, Ordering::AcqRel);
        Some(InfinibandInterfaceCm {
            interface_header: Interface {
                size: full as u16,
                version: INFINIBAND_INTERFACE_CM_VERSION,
                context: self.inner.header_ptr(),
                interface_reference: Some(interface_reference),
                interface_dereference: Some(interface_dereference),
            },
            cm: crate::ffi::table::<B>(self.inner.index),
        })
    }

    /// References held by clients.
    pub fn references(&self) -> usize {
        self.inner.header.references.load(Ordering::Acquire)
    }

    /// Ids in use.
    pub fn ids_in_use(&self) -> usize {
        self.inner.config.ids - self.inner.free_ids()
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The deferred delivery (a DPC's routine, DISPATCH_LEVEL): runs the callbacks of the
    /// events downcalls made ready.
    pub fn deliver(&self) {
        self.inner.device().deliver_client_callbacks();
    }

    /// Tops the pools up (PASSIVE_LEVEL, e.g. from a work item).
    pub fn replenish(&self) {
        self.inner.replenish();
    }

    /// Starts removal: no further query is answered; [`Backend::released`] runs when the
    /// last reference goes. Removal completes when this is dropped.
    pub fn begin_removal(&self) {
        self.inner.header.removing.store(true, Ordering::Release);
        if self.references() == 0 {
            self.inner.backend.released();
        }
    }
}

impl<B: Backend> Drop for Registered<B> {
    /// Removal (PASSIVE_LEVEL): waits until every reference is dropped, destroys the ids
    /// clients left, unregisters, frees.
    fn drop(&mut self) {
        self.inner.header.removing.store(true, Ordering::Release);
        while self.references() > 0 {
            self.inner.device().platform().relax();
        }
        for index in 0..self.inner.config.ids {
            if let Some(Meta {
                client: Some(c), ..
            }) = self.inner.meta(index)
            {
                self.inner.device().destroy_id(c);
                self.inner.free_slot(index);
            }
        }
        if let Some((start, end)) = POOLS.get(self.inner.index) {
            start.store(0, Ordering::Release);
            end.store(0, Ordering::Release);
        }
        if let Some(e) = REGISTRY.get(self.inner.index) {
            e.store(null_mut(), Ordering::Release);
        }
    }
}
