//! The one CM of the host: a driver-global shared by every filter device.
//!
//! ibcm attaches one filter device per HCA (`filter.rs`); all of them feed one
//! [`ibcm_endpoint::Device`] (the dispatch layer and its engine) and one `iba_cm` instance
//! ([`ibcm_iba_cm::Registered`]), so that listens span all ports of all CAs and user mode
//! sees one device whatever the number of HCAs (WinOF's WinVerbs, WinMad and ndfltr keep
//! one global list of HCAs and one control device the same way: `wm_driver.c`
//! `WmPowerD0Entry`/`WmPowerD0Exit`).
//!
//! - [`Host`] lives in the context of the control device (`control.rs`), which is created
//!   with the first filter device and deleted when the last one goes (a control device
//!   gets no PnP notifications, and the driver cannot unload while it exists). Its WDF
//!   children (the one timer, the receive DPC, the delivery DPC, the replenish work item)
//!   are the control device's. [`HOST`] points to it while it exists.
//! - The dispatch layer and the `iba_cm` instance ([`Cm`]) are made when the first port of
//!   any CA is reported (the engine's configuration needs a CA's attributes; the first
//!   CA's GUID becomes the CM's identity in REQ/REP `local_ca_guid`), and torn down with
//!   the last filter: `begin_removal`, wait (PASSIVE) until every client dereferenced,
//!   drop the instance (it destroys the ids left), `Device::remove`.
//! - Ports are numbered host-wide ([`ibcm_endpoint::PortNumbers`]); [`PortTable`] maps a
//!   number to the IBAL port that serves it, for the send path and for
//!   `Backend::port_of_gid` / `pkey_index` / `ca_port`.
//!
//! Every filter-count change is serialised by the driver's wait lock ([`with_filters`]).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use ibcm_cep::{CmConfig, Instant, Transmit};
use ibcm_endpoint::{Device, Lock, MAX_HOST_PORTS, Platform, PortNumbers, ReceiveRing};
use ibcm_iba_cm::{Backend, Config, Registered};
use ibcm_lifecycle::HostCm;
use wdk_sys::ntddk::{
    KeGetCurrentIrql, KeInitializeEvent, KeLowerIrql, KeQueryActiveProcessorCountEx, KeSetEvent,
    KeWaitForSingleObject, KfRaiseIrql,
};
use wdk_sys::{
    _EVENT_TYPE, _KWAIT_REASON, _MODE, ALL_PROCESSOR_GROUPS, DISPATCH_LEVEL, KEVENT, KIRQL,
    LARGE_INTEGER, NTSTATUS, PASSIVE_LEVEL, STATUS_INSUFFICIENT_RESOURCES, STATUS_TIMEOUT,
    WDFDEVICE, WDFDPC, WDFOBJECT, WDFTIMER, WDFWAITLOCK, WDFWORKITEM,
};

use alloc::vec::Vec;

use crate::event_log;
use crate::platform::{self, KmdfLock, KmdfRequest, interrupt_time_100ns};
use crate::wdf::context_type;

/// Serialises filter-device add and cleanup (the filter count, the control device's
/// creation and deletion). A WDFWAITLOCK whose parent is the driver (created in
/// DriverEntry, PASSIVE_LEVEL only).
static FILTER_LOCK: AtomicPtr<core::ffi::c_void> = AtomicPtr::new(core::ptr::null_mut());

/// The number of filter devices, under [`FILTER_LOCK`].
struct FilterCount(core::cell::UnsafeCell<usize>);
// SAFETY: (H30) only reached through `with_filters`, which holds the wait lock.
unsafe impl Sync for FilterCount {}
static FILTER_COUNT: FilterCount = FilterCount(core::cell::UnsafeCell::new(0));

/// DriverEntry: the driver's wait lock, before any device can be added.
pub fn set_filter_lock(lock: WDFWAITLOCK) {
    FILTER_LOCK.store(lock.cast(), Ordering::Release);
}

/// Runs `f` on the filter count with the driver's wait lock held (PASSIVE_LEVEL). Never
/// waits for the network or for clients inside.
pub fn with_filters<R>(f: impl FnOnce(&mut usize) -> R) -> R {
    let lock: WDFWAITLOCK = FILTER_LOCK.load(Ordering::Acquire).cast();
    // SAFETY: (H31) the wait lock was created in DriverEntry before any device could be
    // added and lives as long as the driver; PASSIVE_LEVEL; a null timeout waits without
    // limit (and so always succeeds).
    let _acquired = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(WdfWaitLockAcquire, lock, core::ptr::null_mut())
    };
    // SAFETY: (H32) the wait lock is held: this is the only reference to the count.
    let result = f(unsafe { &mut *FILTER_COUNT.0.get() });
    // SAFETY: (H33) acquired above by this thread.
    unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfWaitLockRelease, lock) };
    result
}

/// The host's CM while the control device exists (null otherwise). Written under the
/// driver's wait lock; read anywhere (the pointee outlives every filter device's binding,
/// see [`Host`]).
pub static HOST: AtomicPtr<Host> = AtomicPtr::new(core::ptr::null_mut());

context_type!(HOST_CONTEXT, Host);

/// The host of a control device.
///
/// # Safety
///
/// `device` is a live control device made by `control::create` (its context is
/// initialised), or the parent of one of its timers, DPCs or work items during their
/// callbacks; the reference is used only inside one of its callbacks.
pub unsafe fn host_of<'a>(device: WDFOBJECT) -> &'a Host {
    // SAFETY: (H34) per this function's contract, the device carries an initialised Host.
    let host = unsafe { crate::wdf::context::<Host>(device, &HOST_CONTEXT) };
    // SAFETY: (H35) written in `control::create` before the device could take a request or
    // run a callback, and dropped only in its cleanup callback, after its children (timer,
    // DPCs, work item) are gone.
    unsafe { &*host }
}

/// The host whose control device is `dpc`'s parent: not [`host`], since an unpublished
/// host's DPC may still run while a new host is published.
///
/// # Safety
///
/// `dpc` is one of a host's DPCs, during its callback.
unsafe fn host_of_dpc<'a>(dpc: WDFDPC) -> &'a Host {
    // SAFETY: (H40) the DPC is live during its callback (the contract); any IRQL.
    let parent = unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfDpcGetParentObject, dpc) };
    // SAFETY: (H41) its parent is the control device that made it (`control.rs`).
    unsafe { host_of(parent) }
}

/// The host whose control device is `work_item`'s parent (as [`host_of_dpc`]).
///
/// # Safety
///
/// `work_item` is a host's work item, during its callback.
unsafe fn host_of_work_item<'a>(work_item: WDFWORKITEM) -> &'a Host {
    // SAFETY: (H42) the work item is live during its callback (the contract).
    let parent = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(WdfWorkItemGetParentObject, work_item)
    };
    // SAFETY: (H43) as H41.
    unsafe { host_of(parent) }
}

/// The host, if it exists.
pub fn host<'a>() -> Option<&'a Host> {
    let host = HOST.load(Ordering::Acquire);
    // SAFETY: (H1) a non-null pointer is the context of the live control device, published
    // after initialisation and cleared (under the driver's wait lock) before the control
    // device is deleted, which happens only after every filter device unbound from IBAL:
    // no callback that reads it outlives it.
    unsafe { host.as_ref() }
}

/// MADs handed to the dispatch layer per DPC run before it requeues itself, in batches of
/// `RECEIVE_BATCH` (a DPC should stay well under 100 us; design.md "Concurrency and IRQL":
/// a batch of 16 takes 6-10 us at 1e5 connections, `ibcm cmtime --dpc-times`).
const DPC_BATCH: usize = 32;

/// How often the removal wait says what it waits for, in seconds.
const REMOVAL_LOG_PERIOD_S: u64 = 10;
/// [`REMOVAL_LOG_PERIOD_S`] in the 100 ns units of a kernel timeout.
const REMOVAL_LOG_PERIOD_100NS: i64 = 10 * 10_000_000;

/// Receive ring capacity: MADs waiting for the receive DPC, preallocated.
pub const RING_CAPACITY: usize = 1024;

/// The one timer's state, under its own lock so that arming is ordered with retirement.
struct TimerState {
    /// The deadline the WDFTIMER is started for, until it fires.
    armed: Option<Instant>,
    /// The host is going away: never start the timer again.
    retired: bool,
}

/// What translating addresses needs from a port's attributes (AL's port record, copied by
/// `ibal.rs`); refreshed on P_Key and GID changes.
pub struct PortAttributes {
    /// The P_Key table, host order, by index.
    pub pkeys: Vec<u16>,
    /// The GID table; index 0 is the source GID of sends with a GRH.
    pub gids: Vec<[u8; 16]>,
}

impl PortAttributes {
    /// The source GID of sends with a GRH (GID index 0).
    pub fn source_gid(&self) -> [u8; 16] {
        self.gids.first().copied().unwrap_or([0; 16])
    }

    /// The exact P_Key's index (WinOF's CM `__get_pkey_index`).
    pub fn pkey_index(&self, pkey: u16) -> Option<u16> {
        self.pkeys
            .iter()
            .position(|p| *p == pkey)
            .and_then(|i| u16::try_from(i).ok())
    }
}

/// The host's part of a published port: its number and address tables. It is the first
/// field of `ibal::Port` (`#[repr(C)]`), which the send path gets back from it.
pub struct HostPort {
    /// The host port number (what the dispatch layer calls the port).
    pub number: u8,
    /// The port's P_Key and GID tables.
    pub attributes: KmdfLock<PortAttributes>,
}

/// The port behind each host port number.
pub struct PortTable {
    /// The numbering (never reused for another CA's port while the CM lives).
    pub numbers: PortNumbers,
    /// The live port of each number (index = number - 1), null while none.
    ports: [*mut HostPort; MAX_HOST_PORTS],
}

// SAFETY: (H2) the table only stores port pointers; ports are heap objects whose lifetime
// is managed by `ibal.rs` (unpublished here before they are freed), and the table is only
// reached under its spin lock.
unsafe impl Send for PortTable {}

impl PortTable {
    const fn new() -> Self {
        Self {
            numbers: PortNumbers::new(),
            ports: [core::ptr::null_mut(); MAX_HOST_PORTS],
        }
    }

    /// The live port numbered `number`.
    pub fn port(&self, number: u8) -> Option<NonNull<HostPort>> {
        let index = usize::from(number).checked_sub(1)?;
        NonNull::new(*self.ports.get(index)?)
    }

    /// Publishes `port` as `number` (its number was assigned by `numbers`).
    pub fn publish(&mut self, number: u8, port: NonNull<HostPort>) {
        if let Some(slot) = usize::from(number)
            .checked_sub(1)
            .and_then(|i| self.ports.get_mut(i))
        {
            *slot = port.as_ptr();
        }
    }

    /// Unpublishes `number`: no new send finds it; its number translates no more.
    pub fn unpublish(&mut self, number: u8) {
        if let Some(slot) = usize::from(number)
            .checked_sub(1)
            .and_then(|i| self.ports.get_mut(i))
        {
            *slot = core::ptr::null_mut();
        }
        self.numbers.deactivate(number);
    }

    /// Every live port, for a lookup that visits them under the lock.
    pub fn live(&self) -> impl Iterator<Item = (u8, NonNull<HostPort>)> + '_ {
        self.ports.iter().enumerate().filter_map(|(i, p)| {
            let number = u8::try_from(i + 1).ok()?;
            Some((number, NonNull::new(*p)?))
        })
    }
}

/// The dispatch layer and the `iba_cm` instance over it. Boxed: the backend points to the
/// `Device` and the instance's callbacks to the instance.
pub struct Cm {
    /// The `iba_cm` instance (a `Box` from `ensure_cm`; null if it could not be made, or
    /// after `teardown`).
    iba_cm: AtomicPtr<Registered<KmdfBackend>>,
    /// The dispatch layer; freed with the host (`free_cm`), after the control device's
    /// files are gone.
    pub device: alloc::boxed::Box<Device<KmdfPlatform>>,
}

impl Cm {
    /// The `iba_cm` instance.
    pub fn iba_cm(&self) -> Option<&Registered<KmdfBackend>> {
        let r = self.iba_cm.load(Ordering::Acquire);
        // SAFETY: (H25) published by `ensure_cm` from a Box, freed in `teardown` only
        // after the delivery DPC and work item were retired and every client reference
        // dropped; the query-interface preprocess cannot run then (the last filter device
        // is being deleted).
        unsafe { r.as_ref() }
    }
}

/// What the host calls in the layers above it, given by the control device's creation
/// (the host knows nothing of IBAL or of filter devices).
#[derive(Clone, Copy)]
pub struct Upcalls {
    /// `Platform::send`: `ibal::send`.
    pub send: fn(&Host, &Transmit),
    /// `Platform::fabric_status`: `status::fill`.
    pub fabric_status: fn(&mut ibcm_ioctl::StatusOut),
}

/// The host's CM state: the control device's context (see the module documentation).
pub struct Host {
    /// The control device.
    pub control: WDFDEVICE,
    upcalls: Upcalls,
    /// The one timer of the dispatch layer.
    pub timer: WDFTIMER,
    /// Drains the receive ring.
    pub receive_dpc: WDFDPC,
    /// Runs `Registered::deliver` (`Backend::schedule_delivery`).
    pub delivery_dpc: WDFDPC,
    /// Runs the next timer pass at once when one pass left timers due
    /// ([`Self::arm_timer`] with a deadline already passed).
    pub timer_dpc: WDFDPC,
    /// Runs `Registered::replenish` at PASSIVE_LEVEL.
    pub replenish_work_item: WDFWORKITEM,
    /// The CM, once a port was reported; freed in [`free_cm`].
    cm: AtomicPtr<Cm>,
    timer_state: KmdfLock<TimerState>,
    next_key: AtomicU64,
    /// Host ports.
    pub ports: KmdfLock<PortTable>,
    /// Whether ibcm answers CM queries, host-wide (`ibcm_lifecycle::HostCm`).
    verdict: KmdfLock<HostCm>,
    /// Received MADs for the receive DPC (no allocation, no lock held while the device
    /// runs; `ibcm_endpoint::ReceiveRing`).
    pub ring: ReceiveRing<KmdfPlatform>,
    /// Being torn down: the DPCs do not requeue, the timer is not started again.
    pub retired: AtomicBool,
    /// Signalled by `Backend::released` once the last `iba_cm` reference is dropped after
    /// `begin_removal` (NotificationEvent).
    released: core::cell::UnsafeCell<KEVENT>,
    /// MADs dropped on receive (ring full, unknown P_Key index) and on send (no such port,
    /// P_Key or MAD element): for the debugger.
    pub dropped_receives: AtomicU64,
    pub dropped_sends: AtomicU64,
    /// MADs a steered port's `{M, Get}` service refused (`ibcm_qp1_hook::restore`: method
    /// `M` without the hook's ticket, another method): for the debugger.
    pub refused_receives: AtomicU64,
}

// SAFETY: (H3) the WDF handles are written once before the host is published and are
// read-only afterwards; everything else is atomic, behind a lock, or (the KEVENT) only
// touched through the kernel's own synchronised routines.
unsafe impl Sync for Host {}
// SAFETY: (H4) as H3.
unsafe impl Send for Host {}

impl Host {
    /// A host for `control` that calls `upcalls` (its WDF children are filled in by
    /// `control::create`).
    pub fn new(control: WDFDEVICE, upcalls: Upcalls) -> Self {
        Self {
            control,
            upcalls,
            timer: core::ptr::null_mut(),
            receive_dpc: core::ptr::null_mut(),
            delivery_dpc: core::ptr::null_mut(),
            timer_dpc: core::ptr::null_mut(),
            replenish_work_item: core::ptr::null_mut(),
            cm: AtomicPtr::new(core::ptr::null_mut()),
            timer_state: KmdfLock::new(TimerState {
                armed: None,
                retired: false,
            }),
            next_key: AtomicU64::new(1),
            ports: KmdfLock::new(PortTable::new()),
            verdict: KmdfLock::new(HostCm::new()),
            ring: ReceiveRing::new(),
            retired: AtomicBool::new(false),
            released: core::cell::UnsafeCell::new(KEVENT::default()),
            dropped_receives: AtomicU64::new(0),
            dropped_sends: AtomicU64::new(0),
            refused_receives: AtomicU64::new(0),
        }
    }

    /// Initialises what must be initialised in place (the context's final address) and
    /// preallocates the receive ring (PASSIVE_LEVEL).
    pub fn init_in_place(&self) -> Result<(), NTSTATUS> {
        // SAFETY: (H5) the event lives in the control device's context (nonpaged, final
        // address) and nothing waits on it yet; PASSIVE_LEVEL.
        unsafe {
            KeInitializeEvent(self.released.get(), _EVENT_TYPE::NotificationEvent, 0);
        }
        self.ring
            .reserve(RING_CAPACITY)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)
    }

    /// The CM, once a port was reported.
    pub fn cm(&self) -> Option<&Cm> {
        let cm = self.cm.load(Ordering::Acquire);
        // SAFETY: (H6) a non-null pointer was published by `ensure_cm` from a Box and is
        // freed only in `free_cm`, from the control device's cleanup callback: every
        // filter device unbound (no IBAL callback), the DPCs and the timer are retired,
        // and no file or request of the control device is left.
        unsafe { cm.as_ref() }
    }

    /// The dispatch layer, once a port was reported.
    pub fn core(&self) -> Option<&Device<KmdfPlatform>> {
        self.cm().map(|cm| &*cm.device)
    }

    /// Makes the CM from the first reported CA's attributes (PASSIVE_LEVEL, AL's PnP
    /// thread). `config` comes from `ibal::port_added`. A later call keeps the first CM.
    pub fn ensure_cm(&self, mut config: CmConfig) -> Result<(), NTSTATUS> {
        if self.cm().is_some() {
            return Ok(());
        }
        let parameters = crate::parameters::read();
        if let Some(ms) = parameters.max_request_wait_ms {
            config.max_request_wait_ns = Some(u64::from(ms) * 1_000_000);
        }
        if let Some(held) = parameters.max_held_requests {
            config.held_requests_per_listen = held;
        }
        let device = alloc::boxed::Box::new(Device::new(self.platform(), config));
        device.set_quotas(parameters.quotas);
        let backend = KmdfBackend {
            host: NonNull::from(self),
            device: NonNull::from(&*device),
            ca_guid: config.ca_guid,
        };
        // Config::concurrency: the CPUs that may run entry points at once
        // (REVIEW.md §6: the dispatch layer keeps that many spare send batches).
        // SAFETY: (H7) no preconditions; any IRQL.
        let cpus = unsafe { KeQueryActiveProcessorCountEx(ALL_PROCESSOR_GROUPS as u16) };
        let config = Config {
            concurrency: (cpus as usize).max(1),
            ..Config::default()
        };
        let iba_cm = match Registered::new(backend, config) {
            Ok(iba_cm) => alloc::boxed::Box::into_raw(alloc::boxed::Box::new(iba_cm)),
            Err(error) => {
                // The IOCTL interface still works; kernel clients get AL's CM.
                wdk::println!("ibcm: the iba_cm instance could not be made: {error:?}");
                core::ptr::null_mut()
            }
        };
        let cm = alloc::boxed::Box::into_raw(alloc::boxed::Box::new(Cm {
            iba_cm: AtomicPtr::new(iba_cm),
            device,
        }));
        let installed = self.cm.compare_exchange(
            core::ptr::null_mut(),
            cm,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if installed.is_err() {
            // Another HCA's port made the CM first.
            // SAFETY: (H8) `cm` came from Box::into_raw above and was not published.
            release(unsafe { alloc::boxed::Box::from_raw(cm) });
        }
        Ok(())
    }

    /// Runs `f` on the host-wide CM verdict and what it is decided from
    /// (`ibcm_lifecycle::HostCm`), under its spin lock (<= DISPATCH_LEVEL). GUIDs in it
    /// are in network order, as AL and ibbus give them.
    pub fn verdict<R>(&self, f: impl FnOnce(&mut HostCm) -> R) -> R {
        self.verdict.with(f)
    }

    /// The platform handle of this host (for `Device::new`).
    pub fn platform(&self) -> KmdfPlatform {
        KmdfPlatform::new(NonNull::from(self))
    }

    /// `Platform::set_timer`. The dispatch layer computes the deadline under its lock but
    /// calls this after releasing it, so two threads may call in either order; to never
    /// lose a deadline, the timer fires at the earliest deadline asked for since it last
    /// fired. A later or absent deadline does not stop it: an early expiry is harmless,
    /// because `timer_expired` re-arms the timer from the engine's actual next deadline.
    pub fn arm_timer(&self, deadline: Option<Instant>, now: Instant) {
        let Some(deadline) = deadline else { return };
        self.timer_state.with(|t| {
            if t.retired || t.armed.is_some_and(|armed| armed <= deadline) {
                return;
            }
            t.armed = Some(deadline);
            // A deadline already passed: the engine left timers due after a bounded pass
            // (`CmManager::handle_timeout`, 8 at most). A WDFTIMER would run the next pass
            // only at the next clock tick (15.6 ms by default), so 10^4 deadlines falling
            // due together (a port flap, a mass teardown's timewait exits) would take
            // 1250 ticks, about 20 s; the DPC runs it as soon as this DPC returns, as the
            // receive DPC drains its ring.
            if deadline <= now && !self.timer_dpc.is_null() {
                // SAFETY: (H9b) a live child of the control device; WdfDpcEnqueue is
                // callable at IRQL <= DISPATCH_LEVEL, allocates nothing and does not call
                // back synchronously.
                let _newly_queued = unsafe {
                    wdk_sys::call_unsafe_wdf_function_binding!(WdfDpcEnqueue, self.timer_dpc)
                };
                return;
            }
            // Relative due time: negative, in 100 ns units, at least one unit.
            let due = (deadline.nanos_since(now) / 100).max(1);
            let due = -i64::try_from(due).unwrap_or(i64::MAX);
            // SAFETY: (H9) the timer was created with the control device and lives as long
            // as the host; WdfTimerStart runs at IRQL <= DISPATCH_LEVEL and does not call
            // back synchronously, so holding the spin lock across it is fine.
            let _already_queued = unsafe {
                wdk_sys::call_unsafe_wdf_function_binding!(WdfTimerStart, self.timer, due)
            };
        });
    }

    /// The timer fired (EvtTimerFunc): it is no longer armed.
    pub fn timer_fired(&self) {
        self.timer_state.with(|t| t.armed = None);
    }

    /// A request key (never a recycled handle value).
    pub fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// Stops the timer and both DPCs for good and waits for the replenish work item
    /// (PASSIVE_LEVEL: each wait is for a running callback).
    fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        self.timer_state.with(|t| {
            t.retired = true;
            t.armed = None;
        });
        if !self.timer.is_null() {
            // SAFETY: (H10) the timer is a live child of the control device; Wait = TRUE is
            // allowed at PASSIVE_LEVEL, and nothing re-arms it once `retired` is set.
            let _was_queued =
                unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfTimerStop, self.timer, 1) };
        }
        for dpc in [self.receive_dpc, self.delivery_dpc, self.timer_dpc] {
            if dpc.is_null() {
                continue;
            }
            // The first cancel waits for a running DPC, which may have requeued itself
            // before `retired` was set; the second removes that one.
            for _ in 0..2 {
                // SAFETY: (H11) a live child of the control device; Wait = TRUE at
                // PASSIVE_LEVEL.
                let _was_queued =
                    unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfDpcCancel, dpc, 1) };
            }
        }
        if !self.replenish_work_item.is_null() {
            // SAFETY: (H12) a live child of the control device; PASSIVE_LEVEL.
            unsafe {
                wdk_sys::call_unsafe_wdf_function_binding!(
                    WdfWorkItemFlush,
                    self.replenish_work_item
                );
            }
        }
    }

    /// Waits (PASSIVE_LEVEL, outside the driver's wait lock) until `Backend::released`
    /// signalled the event, saying every [`REMOVAL_LOG_PERIOD_100NS`] how many references
    /// are left (DbgPrint), as ibbus's debug build does for its own clients
    /// (`bus_pnp.c:817-820`). The clients that hold a reference are drivers above ibcm in
    /// the HCA stacks, removed before ibcm's last filter device (WinVerbs dereferences in
    /// its D0Exit, ndfltr right after the query: `nd_driver.cpp` NdPowerD0Entry); a wait
    /// that does not end names the driver that leaked one.
    fn wait_released(&self, iba_cm: &Registered<KmdfBackend>) {
        let mut waited: u32 = 0;
        loop {
            let mut timeout = LARGE_INTEGER {
                QuadPart: -REMOVAL_LOG_PERIOD_100NS,
            };
            // SAFETY: (H13) the event was initialised in `init_in_place`; PASSIVE_LEVEL; a
            // kernel-mode, non-alertable wait with a relative timeout that outlives the call.
            let status = unsafe {
                KeWaitForSingleObject(
                    self.released.get().cast(),
                    _KWAIT_REASON::Executive,
                    _MODE::KernelMode as i8,
                    0,
                    &raw mut timeout,
                )
            };
            if status != STATUS_TIMEOUT {
                return;
            }
            waited = waited.saturating_add(1);
            if waited == 1 {
                // Once, when the wait is long enough for an administrator to notice.
                event_log::removal_waiting(iba_cm.references());
            }
            wdk::println!(
                "ibcm: removal waits for {} iba_cm reference(s) of kernel clients ({} s)",
                iba_cm.references(),
                u64::from(waited) * REMOVAL_LOG_PERIOD_S
            );
        }
    }

    /// `Backend::released`.
    fn signal_released(&self) {
        // SAFETY: (H14) initialised event; KeSetEvent with Wait = FALSE is callable at
        // IRQL <= DISPATCH_LEVEL.
        let _previous = unsafe { KeSetEvent(self.released.get(), 0, 0) };
    }
}

/// Tears the CM down (PASSIVE_LEVEL, the last filter device is going, every binding to
/// IBAL is already gone): no further `iba_cm` answer, wait for every client's
/// dereference, retire the timer, DPCs and work item, drop the `iba_cm` instance (it
/// destroys the ids clients left), then `Device::remove` (every endpoint hears of the
/// removal, pending IOCTLs complete with `STATUS_DEVICE_REMOVED`, and the dispatch layer
/// answers later ones without the network). The dispatch layer itself is freed with the
/// control device's context ([`free_cm`]), when no file of it is left.
pub fn teardown(host: &Host) {
    if let Some(iba_cm) = host.cm().and_then(Cm::iba_cm) {
        iba_cm.begin_removal();
        host.wait_released(iba_cm);
    }
    host.retire();
    let Some(cm) = host.cm() else { return };
    let iba_cm = cm.iba_cm.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !iba_cm.is_null() {
        // SAFETY: (H15) from Box::into_raw in `ensure_cm`, unpublished above; nothing
        // reaches it any more (see H25).
        drop(unsafe { alloc::boxed::Box::from_raw(iba_cm) });
    }
    cm.device.remove();
}

/// Frees the CM (the control device's EvtCleanupCallback: no file, request, DPC or timer
/// of it is left).
pub fn free_cm(host: &Host) {
    let cm = host.cm.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !cm.is_null() {
        // SAFETY: (H26) from Box::into_raw in `ensure_cm`; unpublished above, and nothing
        // can reach the host any more (see the caller).
        release(unsafe { alloc::boxed::Box::from_raw(cm) });
    }
}

/// Drops a CM nothing reaches any more: the `iba_cm` instance first (if `teardown` has
/// not dropped it: it destroys the ids clients left through the device), then the
/// dispatch layer.
fn release(cm: alloc::boxed::Box<Cm>) {
    let iba_cm = cm.iba_cm.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !iba_cm.is_null() {
        // SAFETY: (H27) from Box::into_raw in `ensure_cm`, unpublished above; the caller
        // guarantees nothing else reaches this CM.
        drop(unsafe { alloc::boxed::Box::from_raw(iba_cm) });
    }
    drop(cm);
}

/// The platform of the host's CM: a pointer to the [`Host`] (the control device's WDF
/// context), which outlives the [`ibcm_endpoint::Device`] that holds this value.
#[derive(Clone, Copy)]
pub struct KmdfPlatform {
    host: NonNull<Host>,
}

// SAFETY: (P10) the pointee is the control device's context, which lives until that
// device's cleanup callback, which first drops the `ibcm_endpoint::Device` (the only
// holder of this value); everything reached through it is either immutable after
// creation or internally locked.
unsafe impl Send for KmdfPlatform {}
// SAFETY: (P11) as P10.
unsafe impl Sync for KmdfPlatform {}

impl KmdfPlatform {
    /// The platform of the host `host`.
    pub fn new(host: NonNull<Host>) -> Self {
        Self { host }
    }

    fn host(&self) -> &Host {
        // SAFETY: (P12) see P10: the host outlives every use of this platform.
        unsafe { self.host.as_ref() }
    }
}

impl Platform for KmdfPlatform {
    type Request = KmdfRequest;
    type Lock<T> = KmdfLock<T>;

    fn refused(&self, refused: ibcm_endpoint::Refused) {
        ibcm_etw::refused(refused.quota_exceeded, refused.forged);
        event_log::refused(refused, interrupt_time_100ns());
    }

    fn new_lock<T>(value: T) -> KmdfLock<T> {
        KmdfLock::new(value)
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(interrupt_time_100ns().saturating_mul(100))
    }

    fn tracer(&self) -> Option<&'static dyn ibcm_endpoint::DispatchTracer> {
        Some(&ibcm_etw::ETW)
    }

    fn request_passive_work(&self) {
        // The host's work item runs `Device::passive_work`.
        self.host().queue_passive_work();
    }

    fn send(&self, transmit: &Transmit) {
        // `ibal::send`, given at the host's creation (`control.rs`).
        let host = self.host();
        (host.upcalls.send)(host, transmit);
    }

    fn fabric_status(&self, out: &mut ibcm_ioctl::StatusOut) {
        // `status::fill`, given at the host's creation (`control.rs`).
        (self.host().upcalls.fabric_status)(out);
    }

    fn complete(&self, request: KmdfRequest, status: i32, information: usize) {
        request.complete(status, information);
    }

    fn set_timer(&self, deadline: Option<Instant>) {
        self.host().arm_timer(deadline, self.now());
    }

    fn current_thread(&self) -> u64 {
        platform::current_thread()
    }

    fn relax(&self) {
        platform::relax();
    }
}

/// The `iba_cm` backend: the host's dispatch layer and what IBAL told us about ports.
pub struct KmdfBackend {
    host: NonNull<Host>,
    device: NonNull<Device<KmdfPlatform>>,
    ca_guid: u64,
}

// SAFETY: (H16) both pointees outlive the `Registered` holding this backend (it is dropped
// first in `teardown`), and are Sync themselves.
unsafe impl Send for KmdfBackend {}
// SAFETY: (H17) as H16.
unsafe impl Sync for KmdfBackend {}

impl KmdfBackend {
    fn host(&self) -> &Host {
        // SAFETY: (H18) see H16.
        unsafe { self.host.as_ref() }
    }
}

impl Backend for KmdfBackend {
    type Platform = KmdfPlatform;

    fn device(&self) -> &Device<KmdfPlatform> {
        // SAFETY: (H19) see H16.
        unsafe { self.device.as_ref() }
    }

    fn at_dispatch(&self, f: &mut dyn FnMut()) {
        // `KeRaiseIrql(DISPATCH_LEVEL, &old)` is wdm.h's macro over `KfRaiseIrql` (an
        // ntoskrnl export); `KeLowerIrql` puts the caller's level back. A raise, not a
        // lock: Driver Verifier sees no lock in the hierarchy.
        // SAFETY: (H20) callers run at IRQL <= DISPATCH_LEVEL, so this raises (or stays).
        let old_irql = unsafe { KfRaiseIrql(DISPATCH_LEVEL as KIRQL) };
        f();
        // SAFETY: (H21) lowers back to the level this thread had before the raise above.
        unsafe { KeLowerIrql(old_irql) };
    }

    fn at_passive(&self) -> bool {
        // SAFETY: (H22) no preconditions.
        let irql = unsafe { KeGetCurrentIrql() };
        u32::from(irql) == PASSIVE_LEVEL
    }

    fn schedule_delivery(&self) {
        let host = self.host();
        if host.retired.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: (H23) a live child of the control device; callable at DISPATCH_LEVEL;
        // allocates nothing.
        let _newly_queued =
            unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfDpcEnqueue, host.delivery_dpc) };
    }

    fn port_of_gid(&self, gid: &[u8; 16]) -> Option<u8> {
        // AL's `__format_path_av` looks the path's SGID up in the port's GID table the same
        // way.
        self.host()
            .ports
            .with(|t| {
                t.live().find(|(_, p)| {
                    // SAFETY: (H34) published ports are live (unpublishing, under this
                    // lock, precedes freeing).
                    let port = unsafe { p.as_ref() };
                    port.attributes.with(|a| a.gids.contains(gid))
                })
            })
            .map(|(number, _)| number)
    }

    fn pkey_index(&self, port: u8, pkey: u16) -> u16 {
        self.host()
            .ports
            .with(|t| {
                t.port(port).and_then(|p| {
                    // SAFETY: (H35) as H34.
                    let port = unsafe { p.as_ref() };
                    port.attributes.with(|a| a.pkey_index(pkey))
                })
            })
            .unwrap_or(0)
    }

    fn ca_guid(&self) -> u64 {
        self.ca_guid
    }

    fn ca_port(&self, port: u8) -> (u64, u8) {
        self.host()
            .ports
            .with(|t| t.numbers.ca_port(port))
            .map_or((self.ca_guid, port), |(ca, local)| {
                (u64::from_be(ca), local)
            })
    }

    fn released(&self) {
        self.host().signal_released();
    }
}

/// EvtDpcFunc of the host's receive DPC: hands up to [`DPC_BATCH`] received MADs to the
/// dispatch layer in batches (`Device::receive_batch`), then requeues itself if more wait.
pub unsafe extern "C" fn evt_receive_dpc(dpc: WDFDPC) {
    // SAFETY: (H36) the framework passes its live DPC.
    let host = unsafe { host_of_dpc(dpc) };
    let Some(core) = host.core() else {
        // No dispatch layer: nothing can take the MADs.
        let dropped = host.ring.len() as u64;
        host.dropped_receives.fetch_add(dropped, Ordering::Relaxed);
        return;
    };
    let more = host.ring.drain(core, DPC_BATCH);
    if more && !host.retired.load(Ordering::Acquire) {
        // SAFETY: (I80) the DPC is live during its own callback; DISPATCH_LEVEL.
        let _newly_queued =
            unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfDpcEnqueue, dpc) };
    }
}

/// The timer DPC (EvtDpcFunc, DISPATCH_LEVEL): a timer pass queued at once because the
/// last one left timers due; the pass re-arms (the timer, or this DPC again).
pub unsafe extern "C" fn evt_timer_dpc(dpc: WDFDPC) {
    // SAFETY: (H37) as H36.
    let host = unsafe { host_of_dpc(dpc) };
    host.timer_fired();
    if let Some(core) = host.core() {
        core.timer_expired();
    }
}

/// The delivery DPC (EvtDpcFunc, DISPATCH_LEVEL): the callbacks downcalls made ready;
/// then the pools are topped up at PASSIVE_LEVEL from the work item (a no-op enqueue if it
/// is already queued).
pub unsafe extern "C" fn evt_delivery_dpc(dpc: WDFDPC) {
    // SAFETY: (H38) as H36.
    let host = unsafe { host_of_dpc(dpc) };
    let Some(iba_cm) = host.cm().and_then(Cm::iba_cm) else {
        return;
    };
    iba_cm.deliver();
    host.queue_passive_work();
}

impl Host {
    /// Queues the work item (a no-op if it is already queued); callable at DISPATCH_LEVEL
    /// and allocates nothing.
    pub fn queue_passive_work(&self) {
        if self.retired.load(Ordering::Acquire) || self.replenish_work_item.is_null() {
            return;
        }
        // SAFETY: (H24) a live child of the control device (not null, not retired);
        // WdfWorkItemEnqueue is callable at DISPATCH_LEVEL.
        unsafe {
            wdk_sys::call_unsafe_wdf_function_binding!(
                WdfWorkItemEnqueue,
                self.replenish_work_item
            );
        }
    }
}

/// The work item (PASSIVE_LEVEL): tops the `iba_cm` pools up after `destroy_id`s at
/// DISPATCH_LEVEL (REVIEW.md §6, step 4), and does the dispatch layer's PASSIVE_LEVEL work
/// a DISPATCH_LEVEL path asked for (`Platform::request_passive_work`: the event-record and
/// private-data pools, the slab after a peak).
pub unsafe extern "C" fn evt_replenish_work_item(work_item: WDFWORKITEM) {
    // SAFETY: (H39) the framework passes its live work item.
    let host = unsafe { host_of_work_item(work_item) };
    let Some(cm) = host.cm() else {
        return;
    };
    if let Some(iba_cm) = cm.iba_cm() {
        iba_cm.replenish();
    }
    cm.device.passive_work();
}
