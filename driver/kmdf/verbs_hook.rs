//! The QP1 verbs hook on a stock WinOF host (issue #19): the verbs table ibbus obtains
//! through the HCA's stack gets seven entries of ours, thin thunks around the HCA's own
//! that run the bookkeeping of the portable crate `ibcm-qp1-hook` (which decides
//! everything: which tables, which QPs, which MADs).
//!
//! - The table: ibbus sends `IRP_MN_QUERY_INTERFACE` for `GUID_RDMA_INTERFACE_VERBS` from
//!   the top of the HCA's stack (`core/bus/kernel/bus_pnp.c`: `__get_ifc`,
//!   `IoGetAttachedDeviceReference`); our filter sits directly above ibbus, sets
//!   [`query_interface_completed`] as the IRP's completion routine, and there, once mlx4
//!   filled the buffer (`hw/mlx4/kernel/bus/drv/drv.c`: `WdfDeviceAddQueryInterface`),
//!   replaces `create_spl_qp`, `post_recv`, `poll_cq`, `poll_cq_array`, `modify_qp`,
//!   `destroy_qp` and `destroy_cq` in that buffer if [`ibcm_qp1_hook::install`] says so.
//!   AL copies the table after the IRP returns (`core/al/kernel/al_ci_ca.c`), so it only
//!   ever calls the thunks.
//! - One thunk set per slot: CI entry points carry no context (`inc/iba/ib_ci.h`), so a
//!   thunk finds its HCA by being that slot's function (`const S`), and the slot holds the
//!   HCA's own entries and that HCA's hook. [`MAX_HCAS`] slots.
//! - Memory: a slot's [`VerbsHook`] is allocated at [`reserve`] (PASSIVE_LEVEL, filter
//!   device add), from nonpaged pool (the driver's allocator), and kept until [`unload`]:
//!   a thunk may be running on another CPU when its device goes, so a slot's hook is
//!   never freed while the image is loaded (a later device reuses it). Each QP1's map is
//!   made at `create_spl_qp` (PASSIVE) and freed at `destroy_qp` (PASSIVE).
//! - Locks: each port's state is under a KSPIN_LOCK ([`KmdfLock`]); the steering decision
//!   under the slot's steering lock, which nests the engine's lock inside it (the only
//!   nesting; the engine never calls into the hook). No lock is held across a call into
//!   the HCA.
//! - Receive buffers: AL posts each QP1 receive as one segment of GRH + MAD whose `vaddr`
//!   is a **physical** address (`core/al/kernel/al_mad_pool.c`: `grh_ds.vaddr =
//!   cl_get_physaddr(mad_buf)`; AL's special QP's memory region registers all of physical
//!   memory, `ib_reg_phys` over 0..2^64). The thunk maps it back with
//!   `MmGetVirtualForPhysical` at `post_recv`: AL's MAD buffers are nonpaged pool and never
//!   span a page (`al_mad_pool.c` asserts `ADDRESS_AND_SIZE_TO_SPAN_PAGES(mad_buf,
//!   MAD_BLOCK_GRH_SIZE) == 1`), so the page's system mapping is the buffer's and stays
//!   valid while AL owns the element (posted until polled). A segment that is not that
//!   (several segments, short, unmapped, crossing a page) is not recorded: its completion
//!   passes untouched. Reading AL's element through `wr_id` instead would tie us to AL's
//!   private `al_mad_element_t` layout; `MmMapIoSpace` may not map RAM and cannot run at
//!   DISPATCH_LEVEL.
//!
//! Declarations are the `#[repr(C)]` parts of `inc/iba/ib_ci.h`, `inc/iba/ib_types.h` and
//! `inc/kernel/rdma/verbs.h` (lucasz93/WinOFED @913bc0ce) this file reads, with their
//! 64-bit sizes asserted.

use alloc::boxed::Box;
use core::ffi::c_void;
use core::mem::{offset_of, size_of};
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering};

use ibcm_endpoint::Lock as _;
use ibcm_qp1_hook::method::RECEIVE_SIZE;
use ibcm_qp1_hook::version::{CI_VERBS_VERSION, RDMA_INTERFACE_VERBS_VERSION};
use ibcm_qp1_hook::{
    Hook, Install, Memory, NotTracked, PrivateMethod, Qp1, Steer, Table, VerbsQuery, WorkCompletion,
};
use wdk_sys::ntddk::{MmGetPhysicalAddress, MmGetVirtualForPhysical};
use wdk_sys::{
    GUID, INTERFACE, NT_SUCCESS, NTSTATUS, PDEVICE_OBJECT, PHYSICAL_ADDRESS, PIRP, PVOID,
    STATUS_SUCCESS,
};

use crate::host;
use crate::platform::KmdfLock;
use crate::wdf;

// ---------------------------------------------------------------------------------------
// WinOF declarations
// ---------------------------------------------------------------------------------------

/// `ib_api_status_t` (ib_types.h): `IB_SUCCESS` first; `IB_ERROR` for "not called".
type IbApiStatus = i32;
const IB_SUCCESS: IbApiStatus = 0;
const IB_ERROR: IbApiStatus = 43;
/// Every `ib_*_handle_t` is an opaque pointer (ib_ci.h).
type Handle = *mut c_void;
/// `PAGE_SIZE` on x64 (AL's one-page rule is stated against it).
const PAGE_SIZE: usize = 4096;
/// `SL_PENDING_RETURNED` (wdm.h), what `IoMarkIrpPending` sets in the stack location.
const SL_PENDING_RETURNED: u8 = 0x01;
/// `STATUS_CONTINUE_COMPLETION` (wdm.h: defined as `STATUS_SUCCESS`): the completion
/// routine lets the IRP go on up.
const STATUS_CONTINUE_COMPLETION: NTSTATUS = STATUS_SUCCESS;

/// `GUID_RDMA_INTERFACE_VERBS` {F0EBAE86-EDB5-4B40-A10A-44D5DB3B964E}
/// (`inc/kernel/rdma/verbs.h`).
static GUID_RDMA_INTERFACE_VERBS: GUID = wdf::guid((
    0xf0eb_ae86,
    0xedb5,
    0x4b40,
    [0xa1, 0x0a, 0x44, 0xd5, 0xdb, 0x3b, 0x96, 0x4e],
));

/// `ib_local_ds_t` (ib_types.h).
#[repr(C)]
struct IbLocalDs {
    vaddr: u64,
    length: u32,
    lkey: u32,
}

/// `ib_recv_wr_t` (ib_types.h); `TO_LONG_PTR` members are pointers on x64.
#[repr(C)]
struct IbRecvWr {
    p_next: *mut IbRecvWr,
    wr_id: u64,
    num_ds: u32,
    ds_array: *mut IbLocalDs,
}

/// `ib_wc_t` (ib_types.h): the union `recv` is 20 bytes (`_wc_ud`), 4-aligned.
#[repr(C)]
struct IbWc {
    p_next: *mut IbWc,
    wr_id: u64,
    wc_type: i32,
    length: u32,
    vendor_specific: u64,
    status: i32,
    recv: [u32; 5],
}

/// The leading members of `ib_qp_attr_t` (ib_types.h), up to `rq_depth`: all this file
/// reads of the created QP's attributes.
#[repr(C)]
struct IbQpAttrHead {
    h_pd: Handle,
    qp_type: i32,
    access_ctrl: u32,
    pkey_index: u16,
    sq_max_inline: u32,
    sq_depth: u32,
    rq_depth: u32,
}

/// The leading member of `ib_qp_mod_t` (ib_types.h): the requested state.
#[repr(C)]
struct IbQpModHead {
    req_state: u32,
}

/// A verb this file does not call: only its slot's size matters.
type Verb = Option<unsafe extern "C" fn()>;

/// `ci_create_spl_qp` (ib_ci.h:998).
type CiCreateSplQp = unsafe extern "C" fn(
    h_pd: Handle,
    port_num: u8,
    qp_context: *const c_void,
    pfn_async_event_cb: Verb,
    p_create_attr: *mut IbQpCreate,
    p_qp_attr: *mut IbQpAttrHead,
    ph_qp: *mut Handle,
) -> IbApiStatus;
/// `ci_modify_qp` (ib_ci.h:1070).
type CiModifyQp = unsafe extern "C" fn(
    h_qp: Handle,
    p_modify_attr: *const IbQpModHead,
    p_qp_attr: *mut c_void,
    p_umv_buf: *mut c_void,
) -> IbApiStatus;
/// `ci_destroy_qp` (ib_ci.h:1217).
type CiDestroyQp = unsafe extern "C" fn(h_qp: Handle, timewait: u64) -> IbApiStatus;
/// `ci_destroy_cq` (ib_ci.h:1527).
type CiDestroyCq = unsafe extern "C" fn(h_cq: Handle) -> IbApiStatus;
/// `ci_post_recv` (ib_ci.h:2593).
type CiPostRecv = unsafe extern "C" fn(
    h_qp: Handle,
    p_recv_wr: *mut IbRecvWr,
    pp_failed: *mut *mut IbRecvWr,
) -> IbApiStatus;
/// `ci_poll_cq` (ib_ci.h:2680).
type CiPollCq = unsafe extern "C" fn(
    h_cq: Handle,
    pp_free_wclist: *mut *mut IbWc,
    pp_done_wclist: *mut *mut IbWc,
) -> IbApiStatus;
/// `ci_poll_cq_array` (ib_ci.h:2722).
type CiPollCqArray =
    unsafe extern "C" fn(h_cq: Handle, p_num_entries: *mut i32, wc: *mut IbWc) -> IbApiStatus;

/// Index of each verb in `ci_interface_t`'s function pointers, counted from `open_ca`
/// (ib_ci.h:3254-3424, 65 entries from `open_ca` to `register_mdl`).
const CREATE_SPL_QP: usize = 20;
const MODIFY_QP: usize = 21;
const DESTROY_QP: usize = 23;
const DESTROY_CQ: usize = 29;
const POST_RECV: usize = 46;
const POLL_CQ: usize = 49;
const POLL_CQ_ARRAY: usize = 55;
const VERBS: usize = 65;

/// `ci_interface_t` (ib_ci.h:3254).
#[repr(C)]
struct CiInterface {
    guid: u64,
    p_hca_obj: *mut c_void,
    driver_id: GUID,
    vend_id: u32,
    dev_id: u16,
    dev_revision: u16,
    libname: [u8; 32],
    version: u32,
    verbs: [Verb; VERBS],
}

/// `RDMA_INTERFACE_VERBS` (`inc/kernel/rdma/verbs.h`).
#[repr(C)]
struct RdmaInterfaceVerbs {
    header: INTERFACE,
    verbs: CiInterface,
    post_event: Verb,
}

const _: () = {
    assert!(size_of::<IbLocalDs>() == 16);
    assert!(size_of::<IbRecvWr>() == 32);
    assert!(size_of::<IbWc>() == 56);
    assert!(offset_of!(IbWc, status) == 32);
    assert!(offset_of!(IbQpAttrHead, rq_depth) == 28);
    assert!(offset_of!(CiInterface, verbs) == 80);
    assert!(size_of::<CiInterface>() == 600);
    assert!(size_of::<RdmaInterfaceVerbs>() == 640);
};

// ---------------------------------------------------------------------------------------
// Slots
// ---------------------------------------------------------------------------------------

/// HCAs hooked at once.
pub const MAX_HCAS: usize = 8;
/// `ib_qp_create_t` (ib_types.h): the HCA's `create_spl_qp` here, AL's `create_qp` in
/// `ibal.rs`.
#[repr(C)]
pub(crate) struct IbQpCreate {
    pub(crate) qp_type: i32,
    pub(crate) sq_max_inline: u32,
    pub(crate) sq_depth: u32,
    pub(crate) rq_depth: u32,
    pub(crate) sq_sge: u32,
    pub(crate) rq_sge: u32,
    pub(crate) h_sq_cq: Handle,
    pub(crate) h_rq_cq: Handle,
    pub(crate) h_srq: Handle,
    pub(crate) sq_signaled: i32,
}

/// Ports per HCA the hook tracks (ConnectX HCAs have one or two).
const MAX_PORTS: u8 = 4;

/// A posted receive's buffer: the system address of its GRH + MAD.
#[derive(Debug, Clone, Copy)]
pub struct ReceiveVa(usize);

/// The hook of one HCA.
pub type VerbsHook = Hook<ReceiveVa, KmdfLock<Option<Qp1<ReceiveVa>>>>;

impl<T> ibcm_qp1_hook::Lock<T> for KmdfLock<T> {
    fn new(value: T) -> Self {
        KmdfLock::new(value)
    }
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        ibcm_endpoint::Lock::with(self, f)
    }
}

/// The steering decision: `owner_of` of the engine the filter runs, reached through a
/// plain function and a context the filter registers with [`set_steering`].
pub type Decide = fn(context: usize, port: u8, mad: &[u8]) -> bool;

/// One HCA's slot.
struct Slot {
    /// A filter device holds the slot ([`reserve`] .. [`release`]).
    taken: AtomicBool,
    /// The slot's hook, from the first [`reserve`] until [`unload`].
    hook: AtomicPtr<VerbsHook>,
    /// The HCA's own entries, by index into `ci_interface_t::verbs`; written before the
    /// thunks are placed in the table.
    original: [AtomicPtr<c_void>; VERBS],
    /// The decision, while the filter's engine runs.
    steering: KmdfLock<Option<(Decide, usize)>>,
    /// What became of ibbus's verbs table ([`Table::code`]), since [`reserve`].
    table: AtomicU8,
    /// The CA ibbus's verbs query named (`ci_interface_t::guid`, network order; 0 before
    /// one): the host's CM verdict expects it (`ibcm_lifecycle::HostCm::expected`) until
    /// [`release`].
    ca_guid: AtomicU64,
}

static SLOTS: [Slot; MAX_HCAS] = [const {
    Slot {
        taken: AtomicBool::new(false),
        hook: AtomicPtr::new(ptr::null_mut()),
        original: [const { AtomicPtr::new(ptr::null_mut()) }; VERBS],
        steering: KmdfLock::new(None),
        table: AtomicU8::new(0),
        ca_guid: AtomicU64::new(0),
    }
}; MAX_HCAS];

/// A slot's thunks.
struct Thunks {
    create_spl_qp: CiCreateSplQp,
    post_recv: CiPostRecv,
    poll_cq: CiPollCq,
    poll_cq_array: CiPollCqArray,
    modify_qp: CiModifyQp,
    destroy_qp: CiDestroyQp,
    destroy_cq: CiDestroyCq,
}

const fn thunks<const S: usize>() -> Thunks {
    Thunks {
        create_spl_qp: create_spl_qp::<S>,
        post_recv: post_recv::<S>,
        poll_cq: poll_cq::<S>,
        poll_cq_array: poll_cq_array::<S>,
        modify_qp: modify_qp::<S>,
        destroy_qp: destroy_qp::<S>,
        destroy_cq: destroy_cq::<S>,
    }
}

static THUNKS: [Thunks; MAX_HCAS] = [
    thunks::<0>(),
    thunks::<1>(),
    thunks::<2>(),
    thunks::<3>(),
    thunks::<4>(),
    thunks::<5>(),
    thunks::<6>(),
    thunks::<7>(),
];

/// A slot a filter device holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotId(usize);

impl SlotId {
    /// The context of [`query_interface_completed`] for this slot: its index as a
    /// pointer's value (nothing is pointed to).
    pub fn completion_context(self) -> PVOID {
        ptr::without_provenance_mut(self.0)
    }
}

/// Filter device add (PASSIVE_LEVEL): a free slot with its hook (made now if the slot
/// never had one). None: every slot is taken or no memory; the device then passes the
/// verbs query through unhooked.
pub fn reserve(method: PrivateMethod) -> Option<SlotId> {
    let index = SLOTS.iter().position(|s| {
        s.taken
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    })?;
    let slot = &SLOTS[index];
    slot.table.store(Table::NotSeen.code(), Ordering::Release);
    if slot.hook.load(Ordering::Acquire).is_null() {
        let Some(hook) = VerbsHook::new(MAX_PORTS, method) else {
            slot.taken.store(false, Ordering::Release);
            return None;
        };
        slot.hook
            .store(Box::into_raw(Box::new(hook)), Ordering::Release);
    }
    Some(SlotId(index))
}

/// Filter device removal (PASSIVE_LEVEL, after the remove IRP went down: ibbus has
/// deregistered the CA and AL calls no verb of it): the slot is free again. Its hook
/// stays (see the module's documentation).
pub fn release(id: SlotId) {
    clear_steering(id);
    if let Some(slot) = SLOTS.get(id.0) {
        // The remove IRP went down before this: ibbus deregistered the CA and released its
        // copy of the table (bus_pnp.c:777-784), so no call comes through the old entries.
        // Forgetting them lets the next HCA in this slot (another driver, or the same one
        // reloaded at another address) be patched rather than refused as "differs".
        for original in &slot.original {
            original.store(ptr::null_mut(), Ordering::Release);
        }
        let ca_guid = slot.ca_guid.swap(0, Ordering::AcqRel);
        if ca_guid != 0
            && let Some(host) = host::host()
        {
            host.verdict(|v| v.unexpected(ca_guid));
        }
        slot.taken.store(false, Ordering::Release);
    }
}

/// Driver unload (PASSIVE_LEVEL, no device left, so no table of ours is in use): frees
/// every slot's hook.
pub fn unload() {
    for slot in &SLOTS {
        let hook = slot.hook.swap(ptr::null_mut(), Ordering::AcqRel);
        if !hook.is_null() {
            // SAFETY: (V1) from Box::into_raw in `reserve`; no thunk runs once every
            // device is gone, and the pointer was swapped out, so this is the last use.
            drop(unsafe { Box::from_raw(hook) });
        }
    }
}

/// The filter's engine exists and ibcm's `{M, Get}` service is registered: steer with
/// `decide(context, ..)` (`Device::owner_of == Ours` under the engine's lock).
/// ≤ DISPATCH_LEVEL. False if the slot does not exist (nothing is steered).
pub fn set_steering(id: SlotId, decide: Decide, context: usize) -> bool {
    let Some(slot) = SLOTS.get(id.0) else {
        return false;
    };
    slot.steering.with(|s| *s = Some((decide, context)));
    true
}

/// The private method of the slot's hook (None without a hook).
pub fn method(id: SlotId) -> Option<PrivateMethod> {
    SLOTS.get(id.0).and_then(slot_hook).map(VerbsHook::method)
}

/// What became of ibbus's verbs table on the slot's HCA.
pub fn table(id: SlotId) -> Table {
    SLOTS.get(id.0).map_or(Table::NotSeen, |s| {
        Table::from_code(s.table.load(Ordering::Acquire))
    })
}

/// Whether the slot's hook tracks the QP1 of the HCA's port `port` (AL's `create_spl_qp`
/// came through the thunk and was tracked).
pub fn qp1_tracked(id: SlotId, port: u8) -> bool {
    SLOTS
        .get(id.0)
        .and_then(slot_hook)
        .is_some_and(|h| h.counters(port).is_some())
}

/// Whether `guid` is `GUID_RDMA_INTERFACE_VERBS` (the query the filter's preprocess sets
/// [`query_interface_completed`] on).
pub fn is_verbs_query(guid: &GUID) -> bool {
    same_guid(guid)
}

/// Records a completed verbs query's outcome in slot `index` ([`Table::after`]).
fn record_table(index: usize, outcome: Table, from_ibbus: bool) {
    if let Some(slot) = SLOTS.get(index) {
        let before = Table::from_code(slot.table.load(Ordering::Acquire));
        slot.table
            .store(before.after(outcome, from_ibbus).code(), Ordering::Release);
    }
}

/// The filter's engine goes: when this returns no decision runs with its context, and
/// every MAD goes to AL. ≤ DISPATCH_LEVEL.
pub fn clear_steering(id: SlotId) {
    if let Some(slot) = SLOTS.get(id.0) {
        slot.steering.with(|s| *s = None);
    }
}

/// ibcm's MAD-service receive callback on a MAD with the private method, on its copy of
/// the MAD: whether the hook of this slot remapped it (feed to
/// [`ibcm_qp1_hook::restore`]).
pub fn claim(id: SlotId, port: u8, mad: &[u8]) -> bool {
    SLOTS
        .get(id.0)
        .and_then(slot_hook)
        .is_some_and(|h| h.claim(port, mad))
}

fn slot_hook(slot: &Slot) -> Option<&VerbsHook> {
    let hook = slot.hook.load(Ordering::Acquire);
    // SAFETY: (V2) null or from Box::into_raw in `reserve`, freed only by `unload` when no
    // thunk or device can run.
    unsafe { hook.as_ref() }
}

/// The steering decision of a slot.
struct SlotSteer<'a>(&'a Slot);

impl Steer for SlotSteer<'_> {
    fn is_ours(&self, port: u8, mad: &[u8]) -> bool {
        self.0
            .steering
            .with(|s| s.is_some_and(|(decide, context)| decide(context, port, mad)))
    }
}

/// The received bytes of a recorded buffer.
struct SystemMemory;

impl Memory for SystemMemory {
    type Buffer = ReceiveVa;
    fn received(&mut self, buffer: ReceiveVa, length: u32) -> Option<&mut [u8]> {
        let len = usize::try_from(length).ok()?.min(RECEIVE_SIZE);
        // SAFETY: (V3) `buffer` is the system address of a posted receive's GRH + MAD
        // (RECEIVE_SIZE bytes within one nonpaged page, checked at `post_recv`); its
        // receive has completed, so the HCA is done with it, and AL reads it only after
        // `poll_cq` returns: this is the only reference while the thunk runs.
        Some(unsafe { core::slice::from_raw_parts_mut(buffer.0 as *mut u8, len) })
    }
}

/// The system address of a receive work request's buffer, if it is one segment of at
/// least GRH + MAD in one page (see the module's documentation).
///
/// # Safety
///
/// `wr` is a valid `ib_recv_wr_t` whose `ds_array` holds `num_ds` segments.
unsafe fn receive_va(wr: &IbRecvWr) -> Option<ReceiveVa> {
    if wr.num_ds != 1 || wr.ds_array.is_null() {
        return None;
    }
    // SAFETY: (V4) per the contract, one segment.
    let ds = unsafe { &*wr.ds_array };
    if (ds.length as usize) < RECEIVE_SIZE {
        return None;
    }
    let physical = PHYSICAL_ADDRESS {
        QuadPart: i64::try_from(ds.vaddr).ok()?,
    };
    // SAFETY: (V5) callable at <= DISPATCH_LEVEL; a physical address not mapped in system
    // space gives NULL.
    let va = unsafe { MmGetVirtualForPhysical(physical) } as usize;
    if va == 0 || va % PAGE_SIZE + RECEIVE_SIZE > PAGE_SIZE {
        return None;
    }
    // `MmGetVirtualForPhysical` answers from the PFN database and may give an address
    // that is not (or no longer) this page's system mapping: the buffer is written only
    // if both its first and its last byte translate back to the posted physical bytes.
    let last = RECEIVE_SIZE - 1;
    let round_trip = |offset: usize| {
        let expected = ds.vaddr.checked_add(offset as u64);
        // SAFETY: (V41) callable at <= DISPATCH_LEVEL for any nonpaged system address;
        // `va + offset` lies in the page checked above, which the PFN database maps.
        let back = unsafe { MmGetPhysicalAddress((va + offset) as PVOID) };
        // SAFETY: (V42) `PHYSICAL_ADDRESS` is `LARGE_INTEGER`: `QuadPart` is the whole value.
        let back = unsafe { back.QuadPart };
        expected.is_some_and(|e| u64::try_from(back).ok() == Some(e))
    };
    (round_trip(0) && round_trip(last)).then_some(ReceiveVa(va))
}

/// The HCA's own entry `index` of slot `S` as a `T`.
///
/// # Safety
///
/// `T` is the C type of `ci_interface_t` entry `index`.
unsafe fn original<T: Copy>(slot: &Slot, index: usize) -> Option<T> {
    const { assert!(size_of::<T>() == size_of::<*mut c_void>()) };
    let f = slot.original.get(index)?.load(Ordering::Acquire);
    if f.is_null() {
        return None;
    }
    // SAFETY: (V6) `f` was read from the HCA's table entry `index` (`patch`), whose type
    // is `T` per the contract; function pointers and data pointers have one size here.
    Some(unsafe { core::mem::transmute_copy::<*mut c_void, T>(&f) })
}

// ---------------------------------------------------------------------------------------
// The table patch (the query's completion routine)
// ---------------------------------------------------------------------------------------

/// `IO_COMPLETION_ROUTINE` of ibbus's `IRP_MN_QUERY_INTERFACE` for
/// `GUID_RDMA_INTERFACE_VERBS`, set by the filter's preprocess callback
/// (`IoCopyCurrentIrpStackLocationToNext`, `IoSetCompletionRoutine(.., context = slot
/// index](SlotId) as the pointer's value, TRUE, TRUE, TRUE)`,
/// `WdfDeviceWdmDispatchPreprocessedIrp`). Runs at
/// <= DISPATCH_LEVEL; allocates nothing.
///
/// # Safety
///
/// Called by the I/O manager for an IRP whose current stack location is that query, with
/// the context the filter gave.
pub unsafe extern "C" fn query_interface_completed(
    _device: PDEVICE_OBJECT,
    irp: PIRP,
    context: PVOID,
) -> NTSTATUS {
    // SAFETY: (V7) the I/O manager's IRP, valid for this call.
    let irp = unsafe { &mut *irp };
    // SAFETY: (V8) an IRP in a driver's hands uses the `Overlay` arm of `Tail` (wdm.h).
    let overlay = unsafe { irp.Tail.Overlay };
    // SAFETY: (V9) as V8: the current stack location (wdm.h
    // `IoGetCurrentIrpStackLocation`), in a completion routine its own.
    let stack = unsafe {
        overlay
            .__bindgen_anon_2
            .__bindgen_anon_1
            .CurrentStackLocation
    };
    // SAFETY: (V10) as V9: a valid stack location of this IRP, ours while this runs.
    let stack = unsafe { &mut *stack };
    if irp.PendingReturned != 0 {
        // What `IoMarkIrpPending` does: a routine that lets completion go on propagates
        // the pending state.
        stack.Control |= SL_PENDING_RETURNED;
    }
    // SAFETY: (V40) the preprocess callback set this routine on a query-interface IRP:
    // `QueryInterface` is the arm of `Parameters` in use.
    let q = unsafe { stack.Parameters.QueryInterface };
    // SAFETY: (V11) the IRP's status, written by the driver that completed it.
    let irp_status = unsafe { irp.IoStatus.__bindgen_anon_1.Status };
    let succeeded = NT_SUCCESS(irp_status);
    // SAFETY: (V12) the preprocess callback only sets this routine for a query whose
    // InterfaceType is a valid GUID pointer.
    let ours = unsafe { q.InterfaceType.as_ref() }.is_some_and(same_guid);
    let layout = size_of::<RdmaInterfaceVerbs>() as u16;
    let table = q.Interface.cast::<RdmaInterfaceVerbs>();
    let from_ibbus = !q.InterfaceSpecificData.is_null();
    if !ours {
        return STATUS_CONTINUE_COMPLETION;
    }
    if succeeded && from_ibbus {
        // SAFETY: (V41) a successful query filled `Size` bytes of the querier's buffer
        // (`Interface`, null: none), which it keeps until the IRP returns to it.
        if let Some(ca_guid) = unsafe { ca_guid_of(q.Interface.cast::<u8>(), q.Size) } {
            expect_ca(context.addr(), ca_guid);
        }
    }
    // The table is read only when the query succeeded into a buffer of the whole layout;
    // otherwise its versions are 0, which `install` never hooks (it reports the failure,
    // another driver's query or the unknown layout, in its own order).
    let table = if succeeded && q.Size >= layout {
        // SAFETY: (V13) a successful query filled `Size` >= sizeof(RDMA_INTERFACE_VERBS)
        // bytes of the querier's buffer (null: none), which it keeps until the IRP
        // returns to it.
        unsafe { table.as_mut() }
    } else {
        None
    };
    let query = VerbsQuery {
        succeeded,
        requested_version: q.Version,
        size: q.Size,
        from_ibbus,
        header_version: table.as_ref().map_or(0, |t| t.header.Version),
        verbs_version: table.as_ref().map_or(0, |t| t.verbs.version),
    };
    let patched = |table: Option<&mut RdmaInterfaceVerbs>| {
        table.is_some_and(|t| patch(context.addr(), &mut t.verbs))
    };
    let outcome = match ibcm_qp1_hook::install(&query, layout) {
        Install::Hook if patched(table) => Table::Patched,
        Install::Hook => {
            wdk::println!(
                "ibcm: verbs hook not installed: a required entry is missing or the slot's HCA entries differ"
            );
            Table::PatchRefused
        }
        Install::NotInstalled(why) => {
            if from_ibbus {
                wdk::println!(
                    "ibcm: ibbus's verbs table left as it came: {why:?} (status {status:#010x}, Size {size}, requested version {requested:#06x}, header version {header:#06x}, verbs version {verbs:#010x}; hooked: Size >= {layout}, {want_header:#06x}, {want_verbs:#010x})",
                    status = irp_status,
                    size = query.size,
                    requested = query.requested_version,
                    header = query.header_version,
                    verbs = query.verbs_version,
                    want_header = RDMA_INTERFACE_VERBS_VERSION,
                    want_verbs = CI_VERBS_VERSION,
                );
            }
            Table::Left(why)
        }
    };
    record_table(context.addr(), outcome, from_ibbus);
    STATUS_CONTINUE_COMPLETION
}

/// `ci_interface_t::guid` of a filled `RDMA_INTERFACE_VERBS` of `size` bytes at
/// `interface`, whatever the rest of its layout (ibbus's own check is only the header's
/// version, bus_pnp.c:417-427): the CA ibbus is about to register. None if the buffer is
/// null or too short to hold it, or the GUID is 0.
///
/// # Safety
///
/// `interface` is null or the start of `size` readable bytes.
unsafe fn ca_guid_of(interface: *const u8, size: u16) -> Option<u64> {
    const AT: usize = offset_of!(RdmaInterfaceVerbs, verbs) + offset_of!(CiInterface, guid);
    if interface.is_null() || usize::from(size) < AT + size_of::<u64>() {
        return None;
    }
    // SAFETY: (V42) `AT < size`: inside the buffer (the contract).
    let at = unsafe { interface.add(AT) };
    // SAFETY: (V43) `AT + 8 <= size` readable bytes from `interface` (the contract); read
    // unaligned, whatever the querier's alignment.
    let guid = unsafe { at.cast::<u64>().read_unaligned() };
    (guid != 0).then_some(guid)
}

/// Slot `index`'s HCA is CA `ca_guid`, as ibbus's verbs query said before ibbus registers
/// it with AL (`__register_ca`: `__get_ifc`, then `ib_register_ca`): the host's CM
/// verdict knows the CA is ibcm's before any filter can hear of it. <= DISPATCH_LEVEL
/// (a completion routine).
fn expect_ca(index: usize, ca_guid: u64) {
    if let Some(slot) = SLOTS.get(index) {
        slot.ca_guid.store(ca_guid, Ordering::Release);
        if let Some(host) = host::host() {
            host.verdict(|v| v.expected(ca_guid));
        }
    }
}

fn same_guid(g: &GUID) -> bool {
    let r = &GUID_RDMA_INTERFACE_VERBS;
    (g.Data1, g.Data2, g.Data3, g.Data4) == (r.Data1, r.Data2, r.Data3, r.Data4)
}

/// Saves the HCA's entries in slot `index` and puts the slot's thunks in their place.
/// False (the table untouched) if the slot already serves a table whose entries differ
/// (a late call through the old table must not reach another driver), or a required
/// entry is missing.
fn patch(index: usize, verbs: &mut CiInterface) -> bool {
    let (Some(slot), Some(t)) = (SLOTS.get(index), THUNKS.get(index)) else {
        return false;
    };
    let hooked: [(usize, *const ()); 7] = [
        (CREATE_SPL_QP, t.create_spl_qp as *const ()),
        (MODIFY_QP, t.modify_qp as *const ()),
        (DESTROY_QP, t.destroy_qp as *const ()),
        (DESTROY_CQ, t.destroy_cq as *const ()),
        (POST_RECV, t.post_recv as *const ()),
        (POLL_CQ, t.poll_cq as *const ()),
        (POLL_CQ_ARRAY, t.poll_cq_array as *const ()),
    ];
    let entry = |verbs: &CiInterface, i: usize| {
        verbs
            .verbs
            .get(i)
            .copied()
            .flatten()
            .map_or(ptr::null_mut(), |f| f as *const () as *mut c_void)
    };
    let required = [CREATE_SPL_QP, MODIFY_QP, DESTROY_QP, POST_RECV, POLL_CQ];
    if required.iter().any(|&i| entry(verbs, i).is_null()) {
        return false;
    }
    let differs = hooked.iter().any(|&(i, _)| {
        let saved = slot.original[i].load(Ordering::Acquire);
        !saved.is_null() && saved != entry(verbs, i)
    });
    if differs {
        return false;
    }
    for (i, thunk) in hooked {
        let original = entry(verbs, i);
        let Some(v) = verbs.verbs.get_mut(i).filter(|_| !original.is_null()) else {
            // An optional entry the HCA leaves NULL stays NULL.
            continue;
        };
        slot.original[i].store(original, Ordering::Release);
        // SAFETY: (V14) `thunk` is the slot's thunk for entry `i`, of that entry's C type
        // (`Thunks`): a non-null function pointer.
        *v = Some(unsafe { core::mem::transmute::<*const (), unsafe extern "C" fn()>(thunk) });
    }
    true
}

// ---------------------------------------------------------------------------------------
// Thunks (AL calls them; each calls the HCA's own entry)
// ---------------------------------------------------------------------------------------

/// `create_spl_qp` (PASSIVE_LEVEL, AL's `create_spl_qp_svc`): call through; on success
/// track a QP1 with its receive CQ and depth.
unsafe extern "C" fn create_spl_qp<const S: usize>(
    h_pd: Handle,
    port_num: u8,
    qp_context: *const c_void,
    pfn_async_event_cb: Verb,
    p_create_attr: *mut IbQpCreate,
    p_qp_attr: *mut IbQpAttrHead,
    ph_qp: *mut Handle,
) -> IbApiStatus {
    let slot = &SLOTS[S];
    // SAFETY: (V15) entry CREATE_SPL_QP is a `ci_create_spl_qp`.
    let Some(call) = (unsafe { original::<CiCreateSplQp>(slot, CREATE_SPL_QP) }) else {
        return IB_ERROR;
    };
    // SAFETY: (V16) AL's arguments, passed on unchanged to the HCA's entry.
    let status = unsafe {
        call(
            h_pd,
            port_num,
            qp_context,
            pfn_async_event_cb,
            p_create_attr,
            p_qp_attr,
            ph_qp,
        )
    };
    let Some(hook) = slot_hook(slot) else {
        return status;
    };
    if status != IB_SUCCESS || p_create_attr.is_null() || ph_qp.is_null() {
        return status;
    }
    // SAFETY: (V17) the HCA succeeded: the caller's attributes are valid.
    let create = unsafe { &*p_create_attr };
    // SAFETY: (V41) as V17: the HCA wrote the new QP's handle.
    let qp = unsafe { *ph_qp };
    // SAFETY: (V18) as V17; `p_qp_attr` is the HCA's output when not null.
    let created_depth = unsafe { p_qp_attr.as_ref() }.map_or(0, |a| a.rq_depth);
    let depth = create.rq_depth.max(created_depth);
    let tracked = hook.create_spl_qp(
        port_num,
        create.qp_type as u32,
        qp as usize,
        create.h_rq_cq as usize,
        depth,
    );
    match tracked {
        Ok(()) | Err(NotTracked::NotQp1) => {}
        Err(why) => wdk::println!("ibcm: QP1 of port {port_num} not hooked: {why:?}"),
    }
    status
}

/// A receive chain as (`wr_id`, buffer).
struct RecvChain(*mut IbRecvWr);

impl Iterator for RecvChain {
    type Item = (u64, Option<ReceiveVa>);
    fn next(&mut self) -> Option<Self::Item> {
        // SAFETY: (V19) AL's chain, valid during `post_recv`, NULL-terminated.
        let wr = unsafe { self.0.as_ref() }?;
        self.0 = wr.p_next;
        // SAFETY: (V20) AL's work request names `num_ds` segments.
        Some((wr.wr_id, unsafe { receive_va(wr) }))
    }
}

/// `post_recv` (<= DISPATCH_LEVEL, AL's `spl_qp_svc_post_recvs` under its spin lock):
/// record, call through, release what the HCA did not take.
unsafe extern "C" fn post_recv<const S: usize>(
    h_qp: Handle,
    p_recv_wr: *mut IbRecvWr,
    pp_failed: *mut *mut IbRecvWr,
) -> IbApiStatus {
    let slot = &SLOTS[S];
    // SAFETY: (V21) entry POST_RECV is a `ci_post_recv`.
    let Some(call) = (unsafe { original::<CiPostRecv>(slot, POST_RECV) }) else {
        return IB_ERROR;
    };
    let hook = slot_hook(slot).filter(|h| h.is_qp1(h_qp as usize));
    let tracked = hook.is_some_and(|h| h.post_recv(h_qp as usize, RecvChain(p_recv_wr)));
    let mut failed: *mut IbRecvWr = ptr::null_mut();
    // SAFETY: (V22) AL's arguments, with our own out pointer for the failed request.
    let status = unsafe { call(h_qp, p_recv_wr, &raw mut failed) };
    if !pp_failed.is_null() {
        // SAFETY: (V23) AL's out pointer, when it gave one.
        unsafe { *pp_failed = failed };
    }
    if status != IB_SUCCESS && tracked {
        let from = if failed.is_null() { p_recv_wr } else { failed };
        if let Some(h) = hook {
            h.post_recv_failed(h_qp as usize, RecvChain(from).map(|(wr_id, _)| wr_id));
        }
    }
    status
}

/// A done list as work completions.
struct WcList(*mut IbWc);

impl Iterator for WcList {
    type Item = WorkCompletion;
    fn next(&mut self) -> Option<WorkCompletion> {
        // SAFETY: (V24) the HCA's done list, valid until `poll_cq` returns, NULL-terminated
        // (mlx4 `bus/ib/cq.c`).
        let wc = unsafe { self.0.as_ref() }?;
        self.0 = wc.p_next;
        Some(completion(wc))
    }
}

fn completion(wc: &IbWc) -> WorkCompletion {
    WorkCompletion {
        wr_id: wc.wr_id,
        status: wc.status as u32,
        length: wc.length,
    }
}

/// `poll_cq` (<= DISPATCH_LEVEL, AL's `spl_qp_comp`): call through; on QP1's receive CQ
/// walk the done list (completions untouched, buffers of ibcm's MADs remapped).
unsafe extern "C" fn poll_cq<const S: usize>(
    h_cq: Handle,
    pp_free_wclist: *mut *mut IbWc,
    pp_done_wclist: *mut *mut IbWc,
) -> IbApiStatus {
    let slot = &SLOTS[S];
    // SAFETY: (V25) entry POLL_CQ is a `ci_poll_cq`.
    let Some(call) = (unsafe { original::<CiPollCq>(slot, POLL_CQ) }) else {
        return IB_ERROR;
    };
    // SAFETY: (V26) AL's arguments, passed on unchanged.
    let status = unsafe { call(h_cq, pp_free_wclist, pp_done_wclist) };
    let hook = slot_hook(slot).filter(|h| h.is_qp1_recv_cq(h_cq as usize));
    if let Some(hook) = hook
        && status == IB_SUCCESS
        && !pp_done_wclist.is_null()
    {
        // SAFETY: (V27) the HCA wrote the done list's head.
        let done = unsafe { *pp_done_wclist };
        hook.poll_cq(
            h_cq as usize,
            &mut SystemMemory,
            &SlotSteer(slot),
            WcList(done),
        );
    }
    status
}

/// `poll_cq_array` (<= DISPATCH_LEVEL): as `poll_cq`, over the filled entries.
unsafe extern "C" fn poll_cq_array<const S: usize>(
    h_cq: Handle,
    p_num_entries: *mut i32,
    wc: *mut IbWc,
) -> IbApiStatus {
    let slot = &SLOTS[S];
    // SAFETY: (V28) entry POLL_CQ_ARRAY is a `ci_poll_cq_array`.
    let Some(call) = (unsafe { original::<CiPollCqArray>(slot, POLL_CQ_ARRAY) }) else {
        return IB_ERROR;
    };
    // SAFETY: (V29) the caller's entry count, read before the HCA overwrites it.
    let room = unsafe { p_num_entries.as_ref() }.copied().unwrap_or(0);
    // SAFETY: (V30) the caller's arguments, passed on unchanged.
    let status = unsafe { call(h_cq, p_num_entries, wc) };
    let hook = slot_hook(slot).filter(|h| h.is_qp1_recv_cq(h_cq as usize));
    if let Some(hook) = hook
        && status == IB_SUCCESS
        && !wc.is_null()
    {
        // SAFETY: (V31) as V29, now the number the HCA filled (at most the room).
        let filled = unsafe { p_num_entries.as_ref() }.copied().unwrap_or(0);
        let n = usize::try_from(filled.min(room)).unwrap_or(0);
        // SAFETY: (V32) the caller's array holds `room` >= `n` entries, the first `n`
        // filled by the HCA.
        let entries = unsafe { core::slice::from_raw_parts(wc, n) };
        hook.poll_cq(
            h_cq as usize,
            &mut SystemMemory,
            &SlotSteer(slot),
            entries.iter().map(completion),
        );
    }
    status
}

/// `modify_qp` (<= DISPATCH_LEVEL; AL's QP1 reset runs at PASSIVE): call through; a QP1
/// moved to RESET forgets its receives.
unsafe extern "C" fn modify_qp<const S: usize>(
    h_qp: Handle,
    p_modify_attr: *const IbQpModHead,
    p_qp_attr: *mut c_void,
    p_umv_buf: *mut c_void,
) -> IbApiStatus {
    let slot = &SLOTS[S];
    // SAFETY: (V33) entry MODIFY_QP is a `ci_modify_qp`.
    let Some(call) = (unsafe { original::<CiModifyQp>(slot, MODIFY_QP) }) else {
        return IB_ERROR;
    };
    // SAFETY: (V34) the caller's arguments, passed on unchanged.
    let status = unsafe { call(h_qp, p_modify_attr, p_qp_attr, p_umv_buf) };
    // SAFETY: (V35) the caller's modify attributes, read after the HCA accepted them.
    let state = unsafe { p_modify_attr.as_ref() }.map(|m| m.req_state);
    if let (Some(hook), Some(state)) = (slot_hook(slot), state)
        && status == IB_SUCCESS
    {
        hook.modify_qp(h_qp as usize, state);
    }
    status
}

/// `destroy_qp` (PASSIVE_LEVEL): call through; on success forget the QP1 (frees its map).
unsafe extern "C" fn destroy_qp<const S: usize>(h_qp: Handle, timewait: u64) -> IbApiStatus {
    let slot = &SLOTS[S];
    // SAFETY: (V36) entry DESTROY_QP is a `ci_destroy_qp`.
    let Some(call) = (unsafe { original::<CiDestroyQp>(slot, DESTROY_QP) }) else {
        return IB_ERROR;
    };
    // SAFETY: (V37) the caller's arguments, passed on unchanged.
    let status = unsafe { call(h_qp, timewait) };
    if let Some(hook) = slot_hook(slot)
        && status == IB_SUCCESS
        && let Some(last) = hook.destroy_qp(h_qp as usize)
    {
        wdk::println!("ibcm: QP1 destroyed: {last:?}");
    }
    status
}

/// `destroy_cq` (PASSIVE_LEVEL): call through; on success forget a QP1 whose receive CQ
/// it was.
unsafe extern "C" fn destroy_cq<const S: usize>(h_cq: Handle) -> IbApiStatus {
    let slot = &SLOTS[S];
    // SAFETY: (V38) entry DESTROY_CQ is a `ci_destroy_cq`.
    let Some(call) = (unsafe { original::<CiDestroyCq>(slot, DESTROY_CQ) }) else {
        return IB_ERROR;
    };
    // SAFETY: (V39) the caller's argument, passed on unchanged.
    let status = unsafe { call(h_cq) };
    if let Some(hook) = slot_hook(slot)
        && status == IB_SUCCESS
        && let Some(last) = hook.destroy_cq(h_cq as usize)
    {
        wdk::println!("ibcm: QP1 forgotten with its receive CQ: {last:?}");
    }
    status
}
