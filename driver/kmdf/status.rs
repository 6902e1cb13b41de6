//! STATUS (`ibcm status`) on Windows: `Platform::fabric_status` for the kernel. Each
//! filter device (one per HCA) holds a slot, claimed at add and given back at cleanup
//! (both under the driver's wait lock), and records its HCA's facts there once IBAL is
//! bound (its route, the reason without one, the verbs table's fate). STATUS reads the
//! slots' atomics only: it never touches a filter device, takes no wait lock (a request
//! waiting on it could hold up the control device's deletion, which runs under that
//! lock), and runs at any IRQL. The ports are the host port table's live ports (under its
//! spin lock, `ibal::port_status`). Which CM a CM query would get now is
//! `ibcm_iba_cm::decide_query`'s answer for the query WinVerbs and ndfltr send
//! (`wv_driver.c:554-574`, `nd_driver.cpp:737-752`: version 1.1, the whole interface).

use core::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

use ibcm_endpoint::Lock as _;
use ibcm_iba_cm::abi::{
    GUID_INFINIBAND_INTERFACE_CM, INFINIBAND_INTERFACE_CM_VERSION, InfinibandInterfaceCm,
};
use ibcm_iba_cm::{PassDown, QueryDecision, decide_query};
use ibcm_ioctl::status_report::{
    CM_AL_HOST_VERDICT, CM_AL_NO_ROUTE, CM_AL_NOT_READY, CM_AL_SWITCHED_OFF, CM_IBCM, ROUTE_NONE,
    ROUTE_ORDINARY, ROUTE_STEERING,
};
use ibcm_ioctl::{HcaStatus, StatusOut};
use ibcm_qp1_hook::{HcaRoute, Table};

use crate::host::{self, Cm, Host};
use crate::{ibal, kill_switch};

/// Filter devices STATUS knows of at once (StatusOut describes the first
/// `status_report::MAX_HCAS`; more than this many HCAs go uncounted).
const SLOTS: usize = 32;

/// One filter device's facts. `owner` identifies the filter (its context's address,
/// compared, never read through; 0: free); the other fields are written by that filter
/// only.
struct Slot {
    owner: AtomicUsize,
    ca_guid: AtomicU64,
    route: AtomicU8,
    no_route: AtomicU8,
    verbs_table: AtomicU8,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    owner: AtomicUsize::new(0),
    ca_guid: AtomicU64::new(0),
    route: AtomicU8::new(ROUTE_NONE),
    no_route: AtomicU8::new(0),
    verbs_table: AtomicU8::new(0),
};

static FILTERS: [Slot; SLOTS] = [EMPTY; SLOTS];

/// The identity of a filter device's slot: its context's address.
pub fn owner<T>(filter: &T) -> usize {
    core::ptr::from_ref(filter) as usize
}

/// A filter device was added (under the driver's wait lock): it takes a free slot.
pub fn register(owner: usize) {
    if let Some(slot) = FILTERS
        .iter()
        .find(|s| s.owner.load(Ordering::Acquire) == 0)
    {
        slot.ca_guid.store(0, Ordering::Relaxed);
        slot.route.store(ROUTE_NONE, Ordering::Relaxed);
        slot.no_route.store(0, Ordering::Relaxed);
        slot.verbs_table.store(0, Ordering::Relaxed);
        slot.owner.store(owner, Ordering::Release);
    }
}

/// The filter's HCA is bound (D0Entry): its CA (host order), route and verbs table's
/// fate.
pub fn record(owner: usize, ca_guid: u64, route: HcaRoute, table: Table) {
    let Some(slot) = FILTERS
        .iter()
        .find(|s| s.owner.load(Ordering::Acquire) == owner)
    else {
        return;
    };
    let (route, no_route) = match route {
        HcaRoute::Ordinary => (ROUTE_ORDINARY, 0),
        HcaRoute::Steering => (ROUTE_STEERING, 0),
        HcaRoute::None(why) => (ROUTE_NONE, why.code()),
    };
    slot.ca_guid.store(ca_guid, Ordering::Relaxed);
    slot.route.store(route, Ordering::Relaxed);
    slot.no_route.store(no_route, Ordering::Relaxed);
    slot.verbs_table.store(table.code(), Ordering::Release);
}

/// A filter device is going (under the driver's wait lock): its slot is free again.
pub fn unregister(owner: usize) {
    for slot in &FILTERS {
        let _ = slot
            .owner
            .compare_exchange(owner, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// `Platform::fabric_status`: the HCAs (the slots) and the live ports.
pub fn fill(out: &mut StatusOut) {
    let cm_ready = host::host()
        .and_then(Host::cm)
        .and_then(Cm::iba_cm)
        .is_some();
    // The host-wide verdict (`ibcm_lifecycle::HostCm`): WinVerbs keeps the first CM
    // table it got for every HCA, so one HCA without a QP1 route, or without ibcm,
    // sends all to AL.
    let (routed, without_ibcm) = host::host().map_or((false, 0), |h| {
        h.verdict(|v| (v.would_answer(), v.without_ibcm()))
    });
    out.hcas_without_ibcm = without_ibcm;
    let switched_off = kill_switch::switched_off();
    for slot in FILTERS
        .iter()
        .filter(|s| s.owner.load(Ordering::Acquire) != 0)
    {
        if let Some(h) = out.hcas.get_mut(out.hca_count as usize) {
            *h = hca(slot, cm_ready, routed, switched_off);
        }
        out.hca_count += 1;
    }
    if let Some(host) = host::host() {
        host.ports.with(|t| {
            for (_, port) in t.live() {
                if let Some(p) = out.ports.get_mut(out.port_count as usize) {
                    *p = ibal::port_status(port);
                }
                out.port_count += 1;
            }
        });
    }
}

fn hca(slot: &Slot, cm_ready: bool, routed: bool, switched_off: bool) -> HcaStatus {
    let decision = decide_query(
        &GUID_INFINIBAND_INTERFACE_CM,
        INFINIBAND_INTERFACE_CM_VERSION,
        core::mem::size_of::<InfinibandInterfaceCm>() as u16,
        cm_ready,
        routed,
    );
    let route = slot.route.load(Ordering::Relaxed);
    // As the filter's query path decides (filter.rs): the switch first, then the verdict.
    let cm = match decision {
        _ if switched_off => CM_AL_SWITCHED_OFF,
        QueryDecision::Answer => CM_IBCM,
        QueryDecision::PassDown(PassDown::NoQp1Route) if route != ROUTE_NONE => CM_AL_HOST_VERDICT,
        QueryDecision::PassDown(PassDown::NoQp1Route) => CM_AL_NO_ROUTE,
        QueryDecision::PassDown(_) => CM_AL_NOT_READY,
    };
    HcaStatus {
        ca_guid: slot.ca_guid.load(Ordering::Relaxed),
        cm,
        route,
        no_route: slot.no_route.load(Ordering::Relaxed),
        verbs_table: slot.verbs_table.load(Ordering::Relaxed),
        reserved: 0,
    }
}
