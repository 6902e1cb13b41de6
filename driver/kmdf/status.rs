//! STATUS (`ibcm status`) on Windows: `Platform::fabric_status` for the kernel. The HCAs
//! are the filter devices (registered here under the driver's wait lock at add, taken out
//! under it at cleanup, so a registered filter is alive while the lock is held); the ports
//! are the host port table's live ports (read under its lock, `ibal::port_status`). Which
//! CM a CM query would get now is `ibcm_iba_cm::decide_query`'s answer for the query
//! WinVerbs and ndfltr send (`wv_driver.c:554-574`, `nd_driver.cpp:737-752`: version 1.1,
//! the whole interface).

use core::sync::atomic::{AtomicPtr, Ordering};

use ibcm_endpoint::Lock as _;
use ibcm_iba_cm::abi::{
    GUID_INFINIBAND_INTERFACE_CM, INFINIBAND_INTERFACE_CM_VERSION, InfinibandInterfaceCm,
};
use ibcm_iba_cm::{PassDown, QueryDecision, decide_query};
use ibcm_ioctl::status_report::{
    CM_AL_NO_ROUTE, CM_AL_NOT_READY, CM_IBCM, ROUTE_NONE, ROUTE_ORDINARY, ROUTE_STEERING,
};
use ibcm_ioctl::{HcaStatus, StatusOut};
use ibcm_qp1_hook::{HcaRoute, Table};
use wdk_sys::PASSIVE_LEVEL;
use wdk_sys::ntddk::KeGetCurrentIrql;

use crate::filter::FilterState;
use crate::host::{self, Cm, Host};
use crate::{driver, ibal, verbs_hook};

/// Filter devices STATUS knows of at once (StatusOut describes the first
/// `status_report::MAX_HCAS`; more than this many HCAs go uncounted).
const SLOTS: usize = 32;

/// The registered filter devices; written and read only under the driver's wait lock.
static FILTERS: [AtomicPtr<FilterState>; SLOTS] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; SLOTS];

/// A filter device was added (under the driver's wait lock).
pub fn register(filter: &FilterState) {
    let ptr = core::ptr::from_ref(filter).cast_mut();
    if let Some(slot) = FILTERS.iter().find(|s| s.load(Ordering::Relaxed).is_null()) {
        slot.store(ptr, Ordering::Relaxed);
    }
}

/// A filter device is going (under the driver's wait lock, before its state is dropped).
pub fn unregister(filter: &FilterState) {
    let ptr = core::ptr::from_ref(filter).cast_mut();
    for slot in &FILTERS {
        let _ = slot.compare_exchange(
            ptr,
            core::ptr::null_mut(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}

/// `Platform::fabric_status`: the HCAs (PASSIVE_LEVEL only: the wait lock; a caller at
/// DISPATCH_LEVEL gets the ports alone) and the ports.
pub fn fill(out: &mut StatusOut) {
    // SAFETY: (S1) reads the current IRQL; callable at any IRQL.
    let irql = unsafe { KeGetCurrentIrql() };
    if u32::from(irql) == PASSIVE_LEVEL {
        driver::with_filter_lock(|_| {
            for slot in &FILTERS {
                let ptr = slot.load(Ordering::Relaxed);
                // SAFETY: (S2) registered filters are unregistered under this lock before
                // their state is dropped: the pointee is alive while the lock is held.
                let Some(filter) = (unsafe { ptr.as_ref() }) else {
                    continue;
                };
                if let Some(h) = out.hcas.get_mut(out.hca_count as usize) {
                    *h = hca(filter);
                }
                out.hca_count += 1;
            }
        });
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

fn hca(filter: &FilterState) -> HcaStatus {
    let (route, no_route) = match filter.route() {
        HcaRoute::Ordinary => (ROUTE_ORDINARY, 0),
        HcaRoute::Steering => (ROUTE_STEERING, 0),
        HcaRoute::None(why) => (ROUTE_NONE, why.code()),
    };
    let cm_ready = host::host()
        .and_then(Host::cm)
        .and_then(Cm::iba_cm)
        .is_some();
    let decision = decide_query(
        &GUID_INFINIBAND_INTERFACE_CM,
        INFINIBAND_INTERFACE_CM_VERSION,
        core::mem::size_of::<InfinibandInterfaceCm>() as u16,
        cm_ready,
        filter.qp1_route(),
    );
    let cm = match decision {
        QueryDecision::Answer => CM_IBCM,
        QueryDecision::PassDown(PassDown::NoQp1Route) => CM_AL_NO_ROUTE,
        QueryDecision::PassDown(_) => CM_AL_NOT_READY,
    };
    HcaStatus {
        ca_guid: u64::from_be(filter.ibal.ca_guid.load(Ordering::Relaxed)),
        cm,
        route,
        no_route,
        verbs_table: filter
            .hook_slot
            .map_or(Table::NotSeen, verbs_hook::table)
            .code(),
        reserved: 0,
    }
}
