//! One CM instance: the backend, the id pool, the registry the C functions find it in,
//! and the reference count of the interface handed out.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::any::TypeId;
use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use ibcm_cep::{CmError, RejectParams};
use ibcm_endpoint::{Callback, ClientEvent, ClientId, Device, Lock, Platform};
use ibcm_mad::{RejReason, Transport};

use crate::abi::{
    Be32, INFINIBAND_INTERFACE_CM_VERSION, IbaCmEvent, IbaCmId, InfinibandInterfaceCm, Interface,
    event_type, nt_success, pdata,
};
use crate::convert::{Scratch, event_to_abi};
use crate::slots::{CELLS, Chunk, MAX_CHUNKS, Meta, Pool, SidrStore, Use, chunk_span, locate};

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

/// The bounds of an instance, preallocated at [`Registered::new`] (PASSIVE_LEVEL); the id
/// pool also grows at PASSIVE_LEVEL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `iba_cm_id`s that can be created (listens and requests' ids included) between two
    /// PASSIVE_LEVEL top-ups ([`Registered::replenish`]): the pool's first chunk. The pool
    /// doubles at a top-up that finds fewer than half of them free, so a client that
    /// leaks ids runs out only when memory does, as under AL.
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

/// Each registered instance's id pool, per chunk `[start, end)` addresses, kept beside the
/// registry so that finding an id's instance compares addresses only and reads no header
/// but the one whose pool holds the id (alive while its client holds its reference):
/// another instance may be going away meanwhile. Chunks are published in order, after the
/// registry entry, and cleared before it.
static POOLS: [[(AtomicUsize, AtomicUsize); MAX_CHUNKS]; MAX_INSTANCES] =
    [const { [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_CHUNKS] }; MAX_INSTANCES];

/// The part of an instance the non-generic code reads (the reference callbacks, the
/// pointer checks). First field of [`Instance`].
#[repr(C)]
pub(crate) struct Header {
    type_id: TypeId,
    references: AtomicUsize,
    removing: AtomicBool,
    released: unsafe fn(*const Header),
}

/// One CM instance.
#[repr(C)]
pub(crate) struct Instance<B: Backend> {
    header: Header,
    pub backend: B,
    pub config: Config,
    /// The id pool's chunks, published in order (see [`crate::slots`]); freed only when
    /// the instance is.
    chunks: [AtomicPtr<Chunk<B::Platform>>; MAX_CHUNKS],
    /// A growth is under way (one at a time).
    growing: AtomicBool,
    pub pool: <B::Platform as Platform>::Lock<Pool>,
    next_cid: AtomicU32,
    index: usize,
}

// SAFETY: the slots' cells are shared with C clients by design (the iba_cm contract: the
// client writes `context`/`callback` of its own id and reads `cid`); this crate accesses
// them only through raw pointers (volatile reads of what the client may write), and the
// rest of the instance is atomics, chunks published once and read-only afterwards, the
// backend (Send + Sync) and the platform's lock.
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

    /// Chunk `k`, if it was published.
    fn chunk(&self, k: usize) -> Option<&Chunk<B::Platform>> {
        let p = self.chunks.get(k)?.load(Ordering::Acquire);
        // SAFETY: a published chunk is never changed and lives as long as the instance.
        unsafe { p.as_ref() }
    }

    /// The chunk holding slot `index`, and the slot's index in it.
    fn slot(&self, index: usize) -> Option<(&Chunk<B::Platform>, usize)> {
        let (k, local) = locate(self.config.ids, index)?;
        Some((self.chunk(k)?, local))
    }

    /// The client pointer of use `u`.
    pub(crate) fn id_ptr(&self, u: Use) -> *mut IbaCmId {
        self.slot(u.index)
            .and_then(|(c, local)| c.cells.get(local * CELLS + u.cell()))
            .map_or(null_mut(), UnsafeCell::get)
    }

    /// The SIDR_REQ storage of slot `index`.
    pub(crate) fn sidr_store(&self, index: usize) -> Option<*mut SidrStore> {
        let (c, local) = self.slot(index)?;
        c.sidr.get(local).map(UnsafeCell::get)
    }

    /// The dispatch layer's callback of slot `index`.
    pub(crate) fn callback(&self, index: usize) -> Option<Callback<B::Platform>> {
        let (c, local) = self.slot(index)?;
        c.callbacks.get(local).cloned()
    }

    pub(crate) fn next_cid(&self) -> Be32 {
        loop {
            let c = self.next_cid.fetch_add(1, Ordering::Relaxed);
            if c != 0 {
                return Be32::new(c);
            }
        }
    }

    /// Fewer free ids than this asks for PASSIVE_LEVEL work, which grows the pool.
    fn low_water(&self) -> usize {
        (self.config.ids / 2).max(1)
    }

    /// Takes the oldest free slot (no allocation: the free list has room for all). When
    /// few are left, asks for the PASSIVE_LEVEL work that grows the pool (on Windows the
    /// work item that runs [`Registered::replenish`]).
    pub(crate) fn take_slot(&self) -> Option<Use> {
        let (u, free) = self.pool.with(|p| (p.take(), p.free.len()));
        if free < self.low_water() {
            self.device().platform().request_passive_work();
        }
        u
    }

    /// Takes a compare buffer for a listen (no allocation). When fewer than half the
    /// configured listens' worth are left, asks for the PASSIVE_LEVEL work that makes
    /// more, as [`Self::take_slot`] does for ids: WinVerbs and ndfltr listen under their
    /// own spin locks (wv_ep.c:1232-1245, nd_ep.cpp:2105-2129), where AL allocates per
    /// listen, so a burst of listens must not find the pool empty for want of a refill.
    pub(crate) fn take_compare_buffer(&self) -> Option<Vec<u8>> {
        let (buf, left) = self.pool.with(|p| (p.compare.pop(), p.compare.len()));
        if left < (self.config.listens / 2).max(1) {
            self.device().platform().request_passive_work();
        }
        buf
    }

    /// Gives `u`'s slot back if `u` is still its use (a stale free, such as a callback's
    /// error return racing `destroy_id`, frees nothing).
    pub(crate) fn free_use(&self, u: Use) {
        self.pool.with(|p| p.release(u));
    }

    /// The meta of `u` if `u` is its slot's live use.
    pub(crate) fn meta(&self, u: Use) -> Option<Meta> {
        self.pool.with(|p| p.live_mut(u).map(|m| *m))
    }

    /// The live use of slot `index` and its meta.
    pub(crate) fn live(&self, index: usize) -> Option<(Use, Meta)> {
        self.pool.with(|p| {
            let m = *p.meta(index)?;
            m.live.then_some((
                Use {
                    index,
                    generation: m.generation,
                },
                m,
            ))
        })
    }

    /// Changes `u`'s meta if `u` is its slot's live use.
    pub(crate) fn set_meta(&self, u: Use, f: impl FnOnce(&mut Meta)) {
        self.pool.with(|p| {
            if let Some(m) = p.live_mut(u) {
                f(m);
            }
        });
    }

    /// Free ids and ids in all.
    pub(crate) fn id_counts(&self) -> (usize, usize) {
        self.pool.with(|p| (p.free.len(), p.slots()))
    }

    /// Publishes chunk `k`'s addresses for [`find_id`] (once registered).
    fn publish(&self, k: usize) {
        let (Some(chunk), Some(entries)) = (self.chunk(k), POOLS.get(self.index)) else {
            return;
        };
        if let Some((start, end)) = entries.get(k) {
            end.store(chunk.end(), Ordering::Release);
            start.store(chunk.base(), Ordering::Release);
        }
    }

    /// Adds chunk `k` of `len` slots starting at slot `first` (PASSIVE_LEVEL); `false` if
    /// memory runs out.
    fn add_chunk(&self, k: usize, first: usize, len: usize) -> bool {
        // The callbacks name the instance by address: it is boxed, so it stays put.
        let at = self as *const Self as usize;
        let Some(chunk) = Chunk::new(first, len, |index| -> Callback<B::Platform> {
            Arc::new(
                move |_: &Device<B::Platform>, id: ClientId, event: &ClientEvent| -> i32 {
                    // SAFETY: the instance outlives every endpoint it made: dropping
                    // `Registered` destroys them all (synchronously) before freeing it.
                    let inst = unsafe { &*(at as *const Instance<B>) };
                    inst.deliver(index, id, event)
                },
            )
        }) else {
            return false;
        };
        // Room in the free list for every slot, and the chunk's metas, made outside the
        // lock (allocation under a spin lock is what this crate avoids).
        let mut free = VecDeque::new();
        let mut meta = Vec::new();
        if free.try_reserve_exact(first + len).is_err() || meta.try_reserve_exact(len).is_err() {
            return false;
        }
        meta.resize(len, Meta::default());
        let Some(slot) = self.chunks.get(k) else {
            return false;
        };
        slot.store(Box::into_raw(Box::new(chunk)), Ordering::Release);
        self.publish(k);
        // The chunk's cells are findable but dead until their metas are in.
        let old = self.pool.with(|p| {
            // Within the capacity made above: no allocation.
            free.extend(p.free.drain(..));
            free.extend((first..first + len).map(|i| i as u32));
            // Room for MAX_CHUNKS chunks was made at creation.
            p.meta.push(meta);
            core::mem::replace(&mut p.free, free)
        });
        drop(old);
        true
    }

    /// Grows the id pool (PASSIVE_LEVEL) by doubling it when fewer than half of
    /// `Config::ids` are free.
    fn grow(&self) {
        if self.growing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (free, slots, chunks) = self.pool.with(|p| (p.free.len(), p.slots(), p.meta.len()));
        if free < self.low_water() && chunks < MAX_CHUNKS {
            let (first, len) = chunk_span(self.config.ids, chunks);
            if first == slots {
                let _ = self.add_chunk(chunks, first, len);
            }
        }
        self.growing.store(false, Ordering::Release);
    }

    /// Tops the pools up (PASSIVE_LEVEL): the ids, the dispatch layer's room, the compare
    /// buffers.
    pub(crate) fn replenish(&self) {
        self.grow();
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
    fn deliver(&self, index: usize, id: ClientId, event: &ClientEvent) -> i32 {
        let Some((u, meta)) = self.live(index).filter(|(_, m)| m.client == Some(id)) else {
            return 0;
        };
        let p_id = self.id_ptr(u);
        if meta.listen {
            if let Some(child) = event.new_id {
                if let Err(reason) = self.request_verdict(&meta, &event.event) {
                    self.reject(child, reason);
                    return 0;
                }
                let mut ev = IbaCmEvent::zeroed(event_type::REQ_RECEIVED);
                // The listen's return value is ignored (al_cm.c:101-111).
                let _ = self.call_client(id, p_id, &mut ev);
            }
            return 0;
        }
        let mut scratch = Scratch::new();
        let Some(mut ev) = event_to_abi(&event.event, &mut scratch) else {
            return 0;
        };
        let status = self.call_client(id, p_id, &mut ev);
        if nt_success(status) {
            return 0;
        }
        // al_cm.c:90-95: the id is destroyed and freed; the dispatch layer destroys the
        // endpoint once this returns, and delivers nothing more to it.
        self.free_use(u);
        1
    }

    /// Calls the client's callback (read afresh from its id) at DISPATCH_LEVEL, as the
    /// deliverer of endpoint `id` under its raised identity (`Device::as_deliverer`): a
    /// `destroy_id` from inside it is deferred, whatever level the delivery began at.
    fn call_client(&self, id: ClientId, p_id: *mut IbaCmId, ev: &mut IbaCmEvent) -> i32 {
        let Some(callback) = read_callback(p_id) else {
            return 0;
        };
        let mut status = 0;
        let device = self.backend.device();
        self.backend.at_dispatch(&mut || {
            status = device.as_deliverer(id, || {
                // SAFETY: the client's function, called as the header declares it, with
                // its id and an event that outlives the call.
                unsafe { callback(p_id, ev) }
            });
        });
        status
    }

    /// Whether a request may reach the client, or the REJ reason it gets instead. A REQ
    /// of a transport other than RC or UC: "invalid transport type" (IBA Table 112 code
    /// 9), as AL's `__req_handler` answers before any listen lookup (al_cm_cep.c:1106-1113):
    /// no iba_cm client has an XRC QP to answer with, and a REP for an RC QP in XRC form
    /// would leave the peer "connected" to a QP that refuses its opcodes. Then the
    /// listen's check of the private data the engine did not compare: "invalid service
    /// ID" when it fails.
    pub(crate) fn request_verdict(
        &self,
        meta: &Meta,
        event: &ibcm_cep::Event,
    ) -> Result<(), RejReason> {
        if let ibcm_cep::Event::ReqReceived(r) = event
            && !matches!(r.transport, Transport::Rc | Transport::Uc)
        {
            return Err(RejReason::InvalidTransportType);
        }
        let Some(check) = &meta.post_check else {
            return Ok(());
        };
        let passes = match event {
            ibcm_cep::Event::ReqReceived(r) => check.matches(r.private_data.as_slice()),
            ibcm_cep::Event::SidrReqReceived(r) => check.matches(r.private_data.as_slice()),
            _ => true,
        };
        if passes {
            Ok(())
        } else {
            Err(RejReason::InvalidServiceId)
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

/// The instance of `B` whose pool holds `p_id`, and the live use of the slot whose
/// current address `p_id` is, with its meta: `None` for a pointer of no pool, and for the
/// pointer of a use that ended (a stale pointer meets a dead slot; see [`crate::slots`]).
/// The pointer is only compared with the pools' bounds, never read.
pub(crate) fn find_id<B: Backend>(p_id: *mut IbaCmId) -> Option<(&'static Instance<B>, Use, Meta)> {
    let addr = p_id as usize;
    let size = core::mem::size_of::<UnsafeCell<IbaCmId>>();
    for (n, (entry, chunks)) in REGISTRY.iter().zip(&POOLS).enumerate() {
        for (k, (start, end)) in chunks.iter().enumerate() {
            let (start, end) = (start.load(Ordering::Acquire), end.load(Ordering::Acquire));
            if start == 0 {
                // Chunks are published in order.
                break;
            }
            if addr < start || addr >= end || !(addr - start).is_multiple_of(size) {
                continue;
            }
            let h = entry.load(Ordering::Acquire);
            if h.is_null() {
                return None;
            }
            // SAFETY: the instance whose pool holds the id: alive while the client that
            // holds the id holds its reference (the interface contract).
            let header = unsafe { &*h };
            if header.type_id != TypeId::of::<B>() {
                return None;
            }
            // SAFETY: the header is the first field of a live `Instance<B>` (its type id
            // says `B`).
            let inst = unsafe { &*h.cast::<Instance<B>>() };
            if inst.index != n || inst.chunk(k).map(Chunk::base) != Some(start) {
                return None;
            }
            let cell = (addr - start) / size;
            let index = chunk_span(inst.config.ids, k).0 + cell / CELLS;
            let (u, meta) = inst.live(index)?;
            return (u.cell() == cell % CELLS).then_some((inst, u, meta));
        }
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
        let mut meta = Vec::new();
        meta.try_reserve_exact(MAX_CHUNKS).map_err(no)?;
        let mut compare = Vec::new();
        compare.try_reserve_exact(config.listens).map_err(no)?;
        let pool = <B::Platform as Platform>::new_lock(Pool {
            ids: config.ids,
            free: VecDeque::new(),
            meta,
            compare,
        });
        let mut inner = Box::new(Instance {
            header: Header {
                type_id: TypeId::of::<B>(),
                references: AtomicUsize::new(0),
                removing: AtomicBool::new(false),
                released: released::<B>,
            },
            backend,
            config,
            chunks: core::array::from_fn(|_| AtomicPtr::new(null_mut())),
            growing: AtomicBool::new(false),
            pool,
            next_cid: AtomicU32::new(1),
            index: MAX_INSTANCES,
        });
        if config.ids == 0 || !inner.add_chunk(0, 0, config.ids) {
            return Err(CmError::NoResources);
        }
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
        for k in 0..MAX_CHUNKS {
            inner.publish(k);
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
        let (free, all) = self.inner.id_counts();
        all - free
    }

    /// Ids the pool holds, in use or free (it grows at PASSIVE_LEVEL, never shrinks).
    pub fn ids_allocated(&self) -> usize {
        self.inner.id_counts().1
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
        for index in 0..self.inner.id_counts().1 {
            if let Some((u, meta)) = self.inner.live(index) {
                if let Some(c) = meta.client {
                    self.inner.device().destroy_id(c);
                }
                self.inner.free_use(u);
            }
        }
        if let Some(chunks) = POOLS.get(self.inner.index) {
            for (start, end) in chunks {
                start.store(0, Ordering::Release);
                end.store(0, Ordering::Release);
            }
        }
        if let Some(e) = REGISTRY.get(self.inner.index) {
            e.store(null_mut(), Ordering::Release);
        }
    }
}

impl<B: Backend> Drop for Instance<B> {
    /// Frees the chunks (unregistered by then, or never registered).
    fn drop(&mut self) {
        for c in &self.chunks {
            let p = c.swap(null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: made by `Box::into_raw` in `add_chunk`, taken out once here.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}
