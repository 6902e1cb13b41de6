//! ibbus's access layer (AL) as the filter reaches it: `WdfFdoQueryForInterface`
//! (`GUID_IB_AL_INTERFACE`, version 19, a reference taken whether or not the CA is
//! registered, bus_pnp.c:1211-1250), and the AL entries the binding calls: open/close,
//! the CA and its alias PD, port PnP with `IB_PNP_FLAG_REG_SYNC` (callbacks on AL's own
//! PnP thread), the QP1 alias, the CM MAD service, MAD elements, sends and receives.
//!
//! QP1 traffic: a MAD sent to a LID of one of the simulation's ports arrives on that port
//! (two ports, or one port to itself, carry a connection); anything else is captured in
//! [`sent`]. Completions run on the processor thread at DISPATCH_LEVEL, as AL's do.
//!
//! The declarations mirror the WinOF headers (lucasz93/WinOFED `inc/kernel/iba/ib_al_ifc.h`,
//! `inc/iba/ib_al.h`, `inc/iba/ib_types.h`), as the binding's own do.

use std::collections::HashMap;
use std::ffi::c_void;

use crate::sched::run_at_dispatch;
use crate::state::{self, changed};
use crate::thread::{DISPATCH, KernelCode, PASSIVE, call_driver, require_irql};
use crate::verifier::{Rule, bugcheck};
use crate::*;

type Handle = *mut c_void;
const IB_SUCCESS: i32 = 0;
const IB_INSUFFICIENT_RESOURCES: i32 = 1;
const IB_INVALID_PARAMETER: i32 = 3;
/// `IB_ERROR` (ib_types.h, as the binding's ibal.rs has it): what the simulation returns
/// where AL returns a more precise failure (the binding only tells IB_SUCCESS apart).
const IB_ERROR: i32 = 43;
/// `IB_MAD_METHOD_SEND` (ib_types.h).
const IB_MAD_METHOD_SEND: usize = 0x03;
const AL_INTERFACE_VERSION: u16 = 19;
/// `GUID_IB_AL_INTERFACE` {96234E89-496F-4dfb-AA90-FCE82BCEC8A8}.
const GUID_IB_AL_INTERFACE: (u32, u16, u16, [u8; 8]) = (
    0x9623_4e89,
    0x496f,
    0x4dfb,
    [0xaa, 0x90, 0xfc, 0xe8, 0x2b, 0xce, 0xc8, 0xa8],
);
const IB_PNP_PORT_ADD: u32 = 0x0000_0002 | 0x0000_1000;
const IB_PNP_PORT_REMOVE: u32 = 0x0000_0002 | 0x0000_2000;
const IB_PNP_PORT_ACTIVE: u32 = 0x0000_0002 | 0x0002_0000;
const CM_CLASS: u8 = 0x07;
const MAD_SIZE: usize = 256;

#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct IbGrh {
    ver_class_flow: u32,
    resv1: u16,
    resv2: u8,
    hop_limit: u8,
    src_gid: [u8; 16],
    dest_gid: [u8; 16],
}

#[repr(C)]
pub struct IbMadElement {
    p_next: *mut IbMadElement,
    context1: *const c_void,
    context2: *const c_void,
    p_mad_buf: *mut c_void,
    size: u32,
    immediate_data: u32,
    remote_qp: u32,
    h_av: Handle,
    send_opt: u32,
    remote_qkey: u32,
    resp_expected: i32,
    timeout_ms: u32,
    retry_cnt: u32,
    rmpp_version: u8,
    status: i32,
    grh_valid: i32,
    p_grh: *mut IbGrh,
    recv_opt: u32,
    remote_lid: u16,
    remote_sl: u8,
    pkey_index: u16,
    path_bits: u8,
    send_context1: *mut c_void,
    send_context2: *mut c_void,
}

type MadCompletion = Option<unsafe extern "C" fn(Handle, *mut c_void, *mut IbMadElement)>;

#[repr(C)]
#[derive(Clone, Copy)]
struct IbMadSvc {
    mad_svc_context: *mut c_void,
    pfn_mad_send_cb: MadCompletion,
    pfn_mad_recv_cb: MadCompletion,
    support_unsol: i32,
    mgmt_class: u8,
    mgmt_version: u8,
    method_array: [i32; 128],
    svc_type: i32,
}

#[repr(C)]
struct IbPnpRec {
    pnp_event: u32,
    h_pnp: Handle,
    h_ioc_event: Handle,
    pnp_context: *mut c_void,
    context: *mut c_void,
    guid: u64,
    ca_guid: u64,
}

#[repr(C)]
struct IbPnpPortRec {
    pnp_rec: IbPnpRec,
    p_ca_attr: *const IbCaAttr,
    p_port_attr: *const IbPortAttr,
}

type PnpCallback = Option<unsafe extern "C" fn(*mut IbPnpRec) -> i32>;

#[repr(C)]
struct IbPnpReq {
    pnp_class: u32,
    pnp_context: *const c_void,
    pfn_pnp_cb: PnpCallback,
}

#[repr(C)]
struct IbPortAttr {
    port_guid: u64,
    port_num: u8,
    mtu: u8,
    transport: i32,
    max_msg_size: u64,
    lid: u16,
    lmc: u8,
    active_width: u8,
    max_vls: u16,
    sm_lid: u16,
    sm_sl: u8,
    link_state: u8,
    init_type_reply: u8,
    subnet_timeout: u8,
    active_speed: u8,
    phys_state: u8,
    ext_active_speed: u8,
    link_encoding: u8,
    cap: [i32; 26],
    pkey_ctr: u16,
    qkey_ctr: u16,
    num_gids: u16,
    num_pkeys: u16,
    p_gid_table: *const [u8; 16],
    p_pkey_table: *const u16,
}

/// `ib_ca_attr_t`'s leading fields up to `local_ack_delay` (what a CA attribute record
/// carries before its port array), plus room.
#[repr(C)]
#[derive(Default)]
struct IbCaAttr {
    ca_guid: u64,
    vend_id: u32,
    dev_id: u16,
    revision: u16,
    fw_ver: u64,
    size: u32,
    words: [u32; 8],
    init_region_size: u64,
    init_windows: u32,
    max_addr_handles: u64,
    max_partitions: u32,
    atomicity: i32,
    max_qp_resp_res: u8,
    max_resp_res: u8,
    max_qp_init_depth: u8,
    /// `max_ipv6_qps` .. `max_sq_desc_sz` (ib_types.h: 13 `uint32_t`).
    more: [u32; 13],
    local_ack_delay: u8,
    tail: [u64; 32],
}

// Where ib_types.h puts them on x64 (the binding asserts the same offsets).
const _: () = assert!(core::mem::offset_of!(IbCaAttr, max_qp_resp_res) == 96);
const _: () = assert!(core::mem::offset_of!(IbCaAttr, local_ack_delay) == 152);

#[repr(C)]
struct IbAlIfc {
    wdm: INTERFACE,
    sync_destroy: *const c_void,
    open_ca: *const c_void,
    query_ca_to_close_ca: [*const c_void; 4],
    alloc_pd: *const c_void,
    dealloc_pd_to_create_qp: [*const c_void; 6],
    get_spl_qp: *const c_void,
    query_qp_modify_qp: [*const c_void; 2],
    destroy_qp: *const c_void,
    create_cq_to_post_recv: [*const c_void; 17],
    send_mad: *const c_void,
    cancel_mad_to_dereg_mad_pool: [*const c_void; 32],
    get_mad: *const c_void,
    put_mad: *const c_void,
    init_dgrm_svc: *const c_void,
    reg_mad_svc: *const c_void,
    reg_svc_to_cancel_query: [*const c_void; 4],
    reg_pnp: *const c_void,
    dereg_pnp_to_ci_call: [*const c_void; 5],
    open_al: *const c_void,
    close_al: *const c_void,
    get_err_str_to_post_srq_recv: [*const c_void; 16],
    ca_guid: u64,
    to_ntstatus_to_open_al_trk: [*const c_void; 16],
}
const _: () = assert!(size_of::<IbAlIfc>() == 960);
const _: () = assert!(size_of::<IbMadElement>() == 128);
const _: () = assert!(size_of::<IbPortAttr>() == 168);

/// One simulated port.
#[derive(Clone, Debug)]
pub struct PortConfig {
    pub port_num: u8,
    pub lid: u16,
    pub gid: [u8; 16],
    pub pkeys: Vec<u16>,
}

/// One simulated CA (an HCA ibbus registered).
#[derive(Clone, Debug)]
pub struct CaConfig {
    /// Host order.
    pub ca_guid: u64,
    pub ports: Vec<PortConfig>,
    /// AL's own CM holds the CM class's Send method on every port, as on a stock WinOF
    /// host (al_cm_cep.c:2451-2456 registers it; al_mad.c:664-672 lets one client have an
    /// unsolicited method): ibcm's ordinary registration fails there.
    pub al_cm_holds_send: bool,
    /// The HCA's verbs table is simulated (`crate::hca`): ibbus queries it through the
    /// filter at each registration, AL's special-QP service runs QP1 through it
    /// (`crate::spl_qp`), and MADs to the CA's ports arrive in QP1's posted receives
    /// before AL's MAD dispatcher hands them on. Without it, MADs go straight to the
    /// MAD service on the port.
    pub verbs: bool,
}

/// A MAD on the simulated wire.
#[derive(Clone, Debug)]
pub struct Wire {
    pub from_lid: u16,
    pub to_lid: u16,
    pub mad: Vec<u8>,
}

/// A MAD service description moved to the processor thread.
#[derive(Clone, Copy)]
struct SendSvc(IbMadSvc);
// SAFETY: the service's context is the driver's port, valid while the service lives; the
// callbacks are plain functions.
unsafe impl Send for SendSvc {}
impl SendSvc {
    fn get(self) -> IbMadSvc {
        self.0
    }
}

struct Service {
    port_lid: u16,
    /// The CA (index into `Al::cas`).
    ca: usize,
    /// The QP's context (`ib_get_spl_qp`'s `qp_context`): what its destroy callback gets
    /// (al_common.c:799 `p_obj->context`, al_qp.c:638).
    qp_context: usize,
    svc: IbMadSvc,
    /// No service, or the QP is gone: nothing is delivered to it.
    destroyed: bool,
    /// `ib_destroy_qp` was called (a second call is refused, al_qp.c:1045-1048).
    destroy_called: bool,
}

/// A MAD element out of AL's pool: the driver's, or posted for a send (then AL's until
/// the send completes: ib_al.h `ib_send_mad` notes).
struct Element {
    block: Box<(IbMadElement, [u8; MAD_SIZE], IbGrh)>,
    in_flight: bool,
}

#[derive(Default)]
pub struct Al {
    pub cas: Vec<CaConfig>,
    /// References on each CA's interface (`InterfaceReference` / `Dereference`).
    pub references: HashMap<usize, i64>,
    next: usize,
    /// Open AL instances: their MAD services.
    services: HashMap<usize, Service>,
    instances: HashMap<usize, Vec<usize>>,
    /// MAD elements the driver holds, or has posted.
    elements: HashMap<usize, Element>,
    /// QP destroy callbacks not yet run (`ib_close_al` waits for them).
    destroys_pending: usize,
    pub sent: Vec<Wire>,
    /// CAs ibbus has deregistered (powered down, stopped, removed): their ports are not
    /// reported to a PnP registration. ibbus still answers the interface query for them
    /// and takes its reference (bus_pnp.c:1211-1250).
    deregistered: std::collections::HashSet<usize>,
    /// CAs whose hardware is gone (surprise removal of a card): a send posted on them is
    /// never completed by the HCA; it completes (flushed) only when ibbus deregisters the
    /// CA and QP1 is destroyed.
    hardware_gone: std::collections::HashSet<usize>,
    /// Those sends: (CA, element, MAD service).
    stuck: Vec<(usize, usize, usize, SendSvc)>,
    /// `ib_close_al`s that ended their wait by AL's forced destruction.
    forced_destroys: usize,
    /// Port registrations (`ib_reg_pnp`): AL instance, PnP context, callback; until
    /// `ib_close_al`. A CA registered later has its ports reported to each.
    registrations: Vec<(usize, usize, PnpCallback)>,
    /// The contexts a registration kept for ports (its callback returned IB_SUCCESS to
    /// IB_PNP_PORT_ADD): (AL instance, CA, port number) -> context. AL reports the removal
    /// of those ports only (al_pnp.c `__pnp_process_remove_port`).
    port_contexts: HashMap<(usize, usize, u8), usize>,
    /// CM Sends AL's own CM received (it holds Send: `al_cm_holds_send`).
    pub al_cm_received: Vec<Wire>,
    /// Received MADs no client registered for (AL's dispatcher drops them).
    pub unclaimed: Vec<Wire>,
}

// SAFETY: the raw pointers are the driver's contexts and the simulation's own boxes,
// reached only under the simulation's lock.
unsafe impl Send for Al {}

/// The CAs ibbus will answer for (before the filters start). None is registered with AL
/// until its stack starts (`pnp::start`, or [`register_ca`] for an HCA without ibcm):
/// ibbus registers a CA in `fdo_start` (bus_pnp.c:566 `__register_ca`).
pub fn set_cas(cas: Vec<CaConfig>) {
    let mut guard = state::lock();
    guard.al.deregistered = (0..cas.len()).collect();
    guard.al.cas = cas;
}

/// The MADs sent to no simulated port.
pub fn sent() -> Vec<Wire> {
    state::lock().al.sent.clone()
}

/// Takes the MADs sent to no simulated port (a peer outside the simulation delivers them).
pub fn take_sent() -> Vec<Wire> {
    std::mem::take(&mut state::lock().al.sent)
}

/// ibbus deregisters CA `index` (`__device_power_down_workItem`, `fdo_stop_device` from
/// a stop, a surprise removal or a removal): it first waits for every reference on its interfaces
/// (bus_pnp.c:790-829); one the filter keeps is a wait that never ends. Then
/// `ib_deregister_ca` destroys what is left on the CA: a QP1 alias of the filter's still
/// open is destroyed by force (the lifecycle model's `forced`).
pub fn deregister_ca(index: usize, why: &str) {
    let held = references(index);
    if held != 0 {
        bugcheck(
            Rule::WaitNeverReturns,
            format_args!(
                "ibbus waits at the {why} of CA {index} for {held} AL interface reference(s) the filter keeps (bus_pnp.c:790-829)"
            ),
        );
    }
    let open = state::lock()
        .al
        .services
        .values()
        .filter(|s| s.ca == index && !s.destroyed)
        .count();
    if open > 0 {
        bugcheck(
            Rule::AlForcedDestroy,
            format_args!(
                "ibbus deregisters CA {index} with {open} QP1 alias(es) of the filter's still open: ib_deregister_ca destroys them by force (al_common.c sync_destroy_obj)"
            ),
        );
    }
    report_ports_removed(index);
    // ib_deregister_ca destroys AL's special QPs on the CA (QP1 through the verbs table).
    crate::spl_qp::deregister(index);
    let stuck = {
        let mut guard = state::lock();
        guard.al.deregistered.insert(index);
        let (flushed, kept) = std::mem::take(&mut guard.al.stuck)
            .into_iter()
            .partition(|(ca, ..)| *ca == index);
        guard.al.stuck = kept;
        flushed
    };
    for (_, element, svc, sender) in stuck {
        complete_send(element, svc, sender);
    }
}

/// The HCA behind CA `index` stops (a card pulled, a device failure): what it was sent is
/// never completed (`deregister_ca` flushes it).
pub fn hardware_gone(index: usize) {
    state::lock().al.hardware_gone.insert(index);
    crate::hca::set_gone(index, true);
}

/// The `ib_close_al`s that AL ended by forcing the destruction (sends in flight on a CA
/// whose hardware is gone).
pub fn forced_destroys() -> usize {
    state::lock().al.forced_destroys
}

/// Runs `f` on AL's PnP thread (al_init.c: one "AL_PNP" async thread delivers every PnP
/// callback, at PASSIVE_LEVEL) and waits for it: false when no thread could be made.
fn on_pnp_thread(f: impl FnOnce() + Send + 'static) -> bool {
    match std::thread::Builder::new().name("al-pnp".into()).spawn(f) {
        Ok(t) => {
            let _ = t.join();
            true
        }
        Err(_) => false,
    }
}

/// ibbus registers CA `index` (`fdo_start`, power-up: `__register_ca`). AL reports its
/// ports to every port registration (al_pnp.c `__pnp_process_add_ca` ->
/// `__pnp_port_notify`), on its PnP thread.
pub fn register_ca(index: usize) {
    let (ca, registrations) = {
        let mut guard = state::lock();
        guard.al.hardware_gone.remove(&index);
        if !guard.al.deregistered.remove(&index) {
            return;
        }
        let Some(ca) = guard.al.cas.get(index).cloned() else {
            return;
        };
        (ca, guard.al.registrations.clone())
    };
    crate::hca::set_gone(index, false);
    // `__register_ca`: the verbs query through the stack, then AL's QP1 service, then the
    // CA's ports to every port registration.
    crate::spl_qp::register(index);
    on_pnp_thread(move || {
        for (h_al, context, callback) in registrations {
            for port in &ca.ports {
                report_port(h_al, context, callback, &ca, port);
            }
        }
    });
}

/// CM Sends AL's own CM received (left to it by the verbs hook, or never steered).
pub fn al_cm_received() -> Vec<Wire> {
    state::lock().al.al_cm_received.clone()
}

/// Received MADs AL's dispatcher found no client for.
pub fn unclaimed() -> Vec<Wire> {
    state::lock().al.unclaimed.clone()
}

/// The port of a CA with simulated verbs, registered, whose LID is `lid`.
fn verbs_port(al: &Al, lid: u16) -> Option<(usize, u8)> {
    al.cas.iter().enumerate().find_map(|(i, c)| {
        if !c.verbs || al.deregistered.contains(&i) {
            return None;
        }
        c.ports
            .iter()
            .find(|p| p.lid == lid)
            .map(|p| (i, p.port_num))
    })
}

/// AL's MAD dispatcher on a MAD received on QP1 of the port with LID `port_lid`
/// (al_mad.c `__mad_disp_recv_done`: an unsolicited request goes to the client that
/// registered its class and method): a CM Send while AL's CM holds Send goes to AL's
/// CM; else the port's MAD service registered for the class and the method; else it is
/// dropped.
pub(crate) fn dispatch_received(ca: usize, port_lid: u16, from_lid: u16, mad: &[u8]) {
    let class = mad.get(1).copied().unwrap_or(0);
    let method = usize::from(mad.get(3).copied().unwrap_or(0) & 0x7f);
    let wire = Wire {
        from_lid,
        to_lid: port_lid,
        mad: mad.to_vec(),
    };
    let mut guard = state::lock();
    let al_cm = guard.al.cas.get(ca).is_some_and(|c| c.al_cm_holds_send);
    if class == CM_CLASS && method == IB_MAD_METHOD_SEND && al_cm {
        guard.al.al_cm_received.push(wire);
        drop(guard);
        changed();
        return;
    }
    let target = guard
        .al
        .services
        .iter()
        .find(|(_, s)| {
            !s.destroyed
                && s.port_lid == port_lid
                && s.svc.mgmt_class == class
                && s.svc.method_array.get(method).is_some_and(|m| *m != 0)
        })
        .map(|(h, s)| (*h, s.svc));
    match target {
        Some((h, svc)) => {
            drop(guard);
            deliver(h, svc, from_lid, mad);
        }
        None => {
            guard.al.unclaimed.push(wire);
            drop(guard);
            changed();
        }
    }
}

/// AL's timeout for a synchronous destroy (al_common.c `sync_destroy_obj`), shortened:
/// what matters is that it ends in a forced destruction.
const AL_DESTROY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// References held on CA `index`'s interface.
pub fn references(index: usize) -> i64 {
    state::lock()
        .al
        .references
        .get(&index)
        .copied()
        .unwrap_or(0)
}

fn new_handle(al: &mut Al) -> usize {
    al.next += 1;
    0xA1_0000_0000 + al.next * 0x40
}

unsafe extern "C" fn interface_reference(context: PVOID) {
    *state::lock()
        .al
        .references
        .entry(context as usize)
        .or_default() += 1;
}

unsafe extern "C" fn interface_dereference(context: PVOID) {
    let mut guard = state::lock();
    let r = guard.al.references.entry(context as usize).or_default();
    *r -= 1;
    if *r < 0 {
        drop(guard);
        bugcheck(
            Rule::InterfaceReference,
            format_args!("the AL interface of CA {context:p} released more often than taken"),
        );
    }
    drop(guard);
    changed();
}

/// `WdfFdoQueryForInterface` on filter `device` of CA `ca`: ibbus's `__query_al_ifc`.
pub fn query(
    ca: usize,
    interface_type: &GUID,
    interface: PINTERFACE,
    size: u16,
    version: u16,
) -> NTSTATUS {
    let g = (
        interface_type.Data1,
        interface_type.Data2,
        interface_type.Data3,
        interface_type.Data4,
    );
    if g != GUID_IB_AL_INTERFACE {
        return STATUS_NOT_SUPPORTED;
    }
    if version != AL_INTERFACE_VERSION {
        return STATUS_NOT_SUPPORTED;
    }
    if usize::from(size) < size_of::<IbAlIfc>() {
        // bus_pnp.c:1225-1231.
        return STATUS_BUFFER_TOO_SMALL;
    }
    // An HCA with no InfiniBand port: ibbus took no verbs and registered no CA
    // (bus_pnp.c:566-569, "non-operational mode"); its answer names CA GUID 0 (:1246).
    let ca_guid = state::lock()
        .al
        .cas
        .get(ca)
        .map(|c| if c.ports.is_empty() { 0 } else { c.ca_guid });
    let Some(ca_guid) = ca_guid else {
        return STATUS_NOT_SUPPORTED;
    };
    let null = core::ptr::null();
    let ifc = IbAlIfc {
        wdm: INTERFACE {
            Size: size_of::<IbAlIfc>() as u16,
            Version: AL_INTERFACE_VERSION,
            Context: ca as PVOID,
            InterfaceReference: Some(interface_reference),
            InterfaceDereference: Some(interface_dereference),
        },
        sync_destroy: null,
        open_ca: open_ca as *const c_void,
        query_ca_to_close_ca: [null; 4],
        alloc_pd: alloc_pd as *const c_void,
        dealloc_pd_to_create_qp: [null; 6],
        get_spl_qp: get_spl_qp as *const c_void,
        query_qp_modify_qp: [null; 2],
        destroy_qp: destroy_qp as *const c_void,
        create_cq_to_post_recv: [null; 17],
        send_mad: send_mad as *const c_void,
        cancel_mad_to_dereg_mad_pool: [null; 32],
        get_mad: get_mad as *const c_void,
        put_mad: put_mad as *const c_void,
        init_dgrm_svc: null,
        reg_mad_svc: reg_mad_svc as *const c_void,
        reg_svc_to_cancel_query: [null; 4],
        reg_pnp: reg_pnp as *const c_void,
        dereg_pnp_to_ci_call: [null; 5],
        open_al: open_al as *const c_void,
        close_al: close_al as *const c_void,
        get_err_str_to_post_srq_recv: [null; 16],
        ca_guid: ca_guid.to_be(),
        to_ntstatus_to_open_al_trk: [null; 16],
    };
    // SAFETY: the caller's buffer holds a whole ib_al_ifc_t (checked above).
    unsafe { interface.cast::<IbAlIfc>().write(ifc) };
    *state::lock().al.references.entry(ca).or_default() += 1;
    STATUS_SUCCESS
}

unsafe extern "C" fn open_al(ph_al: *mut Handle) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ib_open_al", PASSIVE);
    let mut guard = state::lock();
    let h = new_handle(&mut guard.al);
    guard.al.instances.insert(h, Vec::new());
    // SAFETY: the caller's out pointer.
    unsafe { *ph_al = h as Handle };
    IB_SUCCESS
}

unsafe extern "C" fn open_ca(
    h_al: Handle,
    _ca_guid: u64,
    _cb: *const c_void,
    _ctx: *const c_void,
    ph_ca: *mut Handle,
) -> i32 {
    // SAFETY: the caller's out pointer; the CA handle is the AL instance's.
    unsafe { *ph_ca = h_al };
    IB_SUCCESS
}

unsafe extern "C" fn alloc_pd(
    h_ca: Handle,
    _t: i32,
    _ctx: *const c_void,
    ph_pd: *mut Handle,
) -> i32 {
    // SAFETY: as above.
    unsafe { *ph_pd = h_ca };
    IB_SUCCESS
}

/// The PnP registration: every port of the CA the instance serves, on AL's PnP thread,
/// before `ib_reg_pnp` returns (IB_PNP_FLAG_REG_SYNC).
unsafe extern "C" fn reg_pnp(h_al: Handle, p_pnp_req: *const IbPnpReq, ph_pnp: *mut Handle) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ib_reg_pnp", PASSIVE);
    // SAFETY: the caller's request, read now.
    let request = unsafe { &*p_pnp_req };
    let (context, callback) = (request.pnp_context as usize, request.pfn_pnp_cb);
    // SAFETY: the caller's out pointer.
    unsafe { *ph_pnp = h_al };
    let (cas, deregistered) = {
        let mut guard = state::lock();
        guard
            .al
            .registrations
            .push((h_al as usize, context, callback));
        (guard.al.cas.clone(), guard.al.deregistered.clone())
    };
    // AL reports the ports of every registered CA; the binding keeps its own CA's.
    let h_al = h_al as usize;
    let reported = on_pnp_thread(move || {
        for (index, ca) in cas.iter().enumerate() {
            if deregistered.contains(&index) {
                continue;
            }
            for port in &ca.ports {
                report_port(h_al, context, callback, ca, port);
            }
        }
    });
    if reported {
        IB_SUCCESS
    } else {
        IB_INSUFFICIENT_RESOURCES
    }
}

fn report_port(
    h_al: usize,
    context: usize,
    callback: PnpCallback,
    ca: &CaConfig,
    port: &PortConfig,
) {
    let status = port_event(context, callback, ca, port, IB_PNP_PORT_ADD, 0);
    // `__pnp_notify_user`: IB_SUCCESS keeps the context the callback set; any other
    // status frees it (no later event for the port).
    if let Some((status, kept)) = status
        && status == IB_SUCCESS
    {
        let mut guard = state::lock();
        let index = guard.al.cas.iter().position(|c| c.ca_guid == ca.ca_guid);
        if let Some(index) = index {
            guard
                .al
                .port_contexts
                .insert((h_al, index, port.port_num), kept);
        }
    }
}

/// Calls `callback` with a port record of `event` for `port` of `ca` as it is now, with
/// the registration's `pnp_context` and the port's `context`: (status, the context the
/// callback left).
fn port_event(
    pnp_context: usize,
    callback: PnpCallback,
    ca: &CaConfig,
    port: &PortConfig,
    event: u32,
    context: usize,
) -> Option<(i32, usize)> {
    let cb = callback?;
    let ca_attr = Box::new(IbCaAttr {
        ca_guid: ca.ca_guid.to_be(),
        max_qp_resp_res: 16,
        max_resp_res: 16,
        max_qp_init_depth: 16,
        local_ack_delay: 15,
        ..IbCaAttr::default()
    });
    let pkeys: Vec<u16> = port.pkeys.iter().map(|p| p.to_be()).collect();
    let gids = [port.gid];
    // SAFETY: plain C structure, all-zero is valid.
    let mut attr: IbPortAttr = unsafe { core::mem::zeroed() };
    attr.port_guid = (ca.ca_guid + u64::from(port.port_num)).to_be();
    attr.port_num = port.port_num;
    attr.lid = port.lid.to_be();
    attr.link_state = 4;
    attr.num_gids = 1;
    attr.num_pkeys = pkeys.len() as u16;
    attr.p_gid_table = gids.as_ptr();
    attr.p_pkey_table = pkeys.as_ptr();
    let mut record = IbPnpPortRec {
        pnp_rec: IbPnpRec {
            pnp_event: event,
            h_pnp: core::ptr::null_mut(),
            h_ioc_event: core::ptr::null_mut(),
            pnp_context: pnp_context as *mut c_void,
            context: context as *mut c_void,
            guid: attr.port_guid,
            // AL clears the record and sets only `guid` (the port's) for port events
            // (al_pnp.c:461 `cl_memclr`, :500-502): the CA is `p_ca_attr->ca_guid`.
            ca_guid: 0,
        },
        p_ca_attr: &*ca_attr,
        p_port_attr: &attr,
    };
    let status = call_driver("ib_pfn_pnp_cb_t (port event)", PASSIVE, || {
        // SAFETY: the driver's PnP callback with a port record valid for the call.
        unsafe { cb((&raw mut record).cast()) }
    });
    Some((status, record.pnp_rec.context as usize))
}

/// The SM brought port `port_num` of CA `index` up with the P_Key table `pkeys`, which it
/// programmed while the port was below Armed: AL's poll reports IB_PNP_PORT_ACTIVE with
/// the port's attributes as they are now (al_pnp.c `__pnp_check_ports`, :486-497) to each
/// registration that kept a context for the port, and no IB_PNP_PKEY_CHANGE (tables are
/// compared only between Armed/Active states, :1433-1440).
pub fn port_active(index: usize, port_num: u8, pkeys: Vec<u16>) {
    let (ca, port, targets) = {
        let mut guard = state::lock();
        let Some(ca) = guard.al.cas.get_mut(index) else {
            return;
        };
        let Some(port) = ca.ports.iter_mut().find(|p| p.port_num == port_num) else {
            return;
        };
        port.pkeys = pkeys;
        let port = port.clone();
        let ca = ca.clone();
        let targets: Vec<(usize, PnpCallback, usize)> = guard
            .al
            .port_contexts
            .iter()
            .filter(|((_, c, p), _)| *c == index && *p == port_num)
            .filter_map(|((h_al, ..), context)| {
                let (_, pnp_context, callback) =
                    guard.al.registrations.iter().find(|(h, ..)| h == h_al)?;
                Some((*pnp_context, *callback, *context))
            })
            .collect();
        (ca, port, targets)
    };
    on_pnp_thread(move || {
        for (pnp_context, callback, context) in targets {
            port_event(
                pnp_context,
                callback,
                &ca,
                &port,
                IB_PNP_PORT_ACTIVE,
                context,
            );
        }
    });
}

/// AL removes CA `index`'s ports (ibbus deregisters it): IB_PNP_PORT_REMOVE to every
/// registration that kept a context for one, on AL's PnP thread
/// (`__pnp_process_remove_port`: port record with `guid` only, no attributes).
fn report_ports_removed(index: usize) {
    let (removed, registrations) = {
        let mut guard = state::lock();
        let keys: Vec<_> = guard
            .al
            .port_contexts
            .keys()
            .filter(|(_, ca, _)| *ca == index)
            .copied()
            .collect();
        let removed: Vec<_> = keys
            .into_iter()
            .filter_map(|k| guard.al.port_contexts.remove(&k).map(|c| (k, c)))
            .collect();
        (removed, guard.al.registrations.clone())
    };
    let Some(ca_guid) = state::lock().al.cas.get(index).map(|c| c.ca_guid) else {
        return;
    };
    on_pnp_thread(move || {
        for ((h_al, _, port_num), context) in removed {
            let Some((_, pnp_context, Some(cb))) =
                registrations.iter().find(|(h, ..)| *h == h_al).copied()
            else {
                continue;
            };
            let mut record = IbPnpPortRec {
                pnp_rec: IbPnpRec {
                    pnp_event: IB_PNP_PORT_REMOVE,
                    h_pnp: core::ptr::null_mut(),
                    h_ioc_event: core::ptr::null_mut(),
                    pnp_context: pnp_context as *mut c_void,
                    context: context as *mut c_void,
                    guid: (ca_guid + u64::from(port_num)).to_be(),
                    ca_guid: 0,
                },
                p_ca_attr: core::ptr::null(),
                p_port_attr: core::ptr::null(),
            };
            call_driver("ib_pfn_pnp_cb_t (IB_PNP_PORT_REMOVE)", PASSIVE, || {
                // SAFETY: the driver's PnP callback with a port record valid for the
                // call.
                unsafe { cb((&raw mut record).cast()) }
            });
        }
    });
}

unsafe extern "C" fn get_spl_qp(
    h_pd: Handle,
    port_guid: u64,
    _create: *mut c_void,
    qp_context: *const c_void,
    _cb: *const c_void,
    p_pool_key: *mut Handle,
    ph_qp: *mut Handle,
) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ib_get_spl_qp", PASSIVE);
    let mut guard = state::lock();
    let cas = guard.al.cas.clone();
    let found = cas
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            c.ports
                .iter()
                .map(move |p| (c.ca_guid + u64::from(p.port_num), p.lid, i))
        })
        .find(|(g, _, _)| g.to_be() == port_guid)
        .map(|(_, lid, ca)| (lid, ca));
    let Some((lid, ca)) = found else {
        return IB_INVALID_PARAMETER;
    };
    let qp = new_handle(&mut guard.al);
    guard.al.services.insert(
        qp,
        Service {
            port_lid: lid,
            ca,
            qp_context: qp_context as usize,
            // SAFETY: all-zero is a valid (empty) service until ib_reg_mad_svc fills it.
            svc: unsafe { core::mem::zeroed() },
            destroyed: true,
            destroy_called: false,
        },
    );
    if let Some(v) = guard.al.instances.get_mut(&(h_pd as usize)) {
        v.push(qp);
    }
    // SAFETY: the caller's out pointers.
    unsafe { *p_pool_key = qp as Handle };
    // SAFETY: as above.
    unsafe { *ph_qp = qp as Handle };
    IB_SUCCESS
}

unsafe extern "C" fn reg_mad_svc(
    h_qp: Handle,
    p_mad_svc: *const IbMadSvc,
    ph_mad_svc: *mut Handle,
) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ib_reg_mad_svc", PASSIVE);
    // SAFETY: the caller's service description, copied.
    let svc = unsafe { *p_mad_svc };
    if svc.mgmt_class != CM_CLASS || svc.mgmt_version != 2 {
        return IB_INVALID_PARAMETER;
    }
    let mut guard = state::lock();
    let Some(ca) = guard.al.services.get(&(h_qp as usize)).map(|s| s.ca) else {
        return IB_INVALID_PARAMETER;
    };
    let send = svc
        .method_array
        .get(IB_MAD_METHOD_SEND)
        .is_some_and(|m| *m != 0);
    if send && guard.al.cas.get(ca).is_some_and(|c| c.al_cm_holds_send) {
        // "Other client already registered for Un-Solicited Method" (al_mad.c:664-672).
        return IB_ERROR;
    }
    let Some(s) = guard.al.services.get_mut(&(h_qp as usize)) else {
        return IB_INVALID_PARAMETER;
    };
    s.svc = svc;
    s.destroyed = false;
    // SAFETY: the caller's out pointer.
    unsafe { *ph_mad_svc = h_qp };
    IB_SUCCESS
}

unsafe extern "C" fn destroy_qp(
    h_qp: Handle,
    destroy_cb: Option<unsafe extern "C" fn(*mut c_void)>,
) -> i32 {
    let _k = KernelCode::enter();
    let context = {
        let mut guard = state::lock();
        let Some(s) = guard.al.services.get_mut(&(h_qp as usize)) else {
            return IB_INVALID_PARAMETER;
        };
        if s.destroy_called {
            return IB_ERROR;
        }
        s.destroyed = true;
        s.destroy_called = true;
        let context = s.qp_context;
        if destroy_cb.is_some() {
            guard.al.destroys_pending += 1;
        }
        context
    };
    if let Some(cb) = destroy_cb {
        // AL destroys asynchronously and calls back from its worker thread at
        // PASSIVE_LEVEL once the QP's callbacks are over (al_common.c:441-448, 764-800).
        let worker = std::thread::Builder::new()
            .name("al-destroy".into())
            .spawn(move || {
                let guard = state::lock();
                let what =
                    || "the QP's completions to finish before its destroy callback".to_string();
                let (guard, _) = state::wait_until(guard, None, &what, |s| {
                    s.sched.dispatch.is_empty() && s.sched.calls_running == 0
                });
                drop(guard);
                call_driver("ib_pfn_destroy_cb_t", PASSIVE, || {
                    // SAFETY: the driver's destroy callback with the QP's own context.
                    unsafe { cb(context as *mut c_void) }
                });
                state::lock().al.destroys_pending -= 1;
                changed();
            });
        if worker.is_err() {
            bugcheck(
                Rule::Simulation,
                format_args!("AL's destroy worker could not start"),
            );
        }
    }
    IB_SUCCESS
}

/// `ib_close_al`: every MAD service of the instance goes; callbacks are over when it
/// returns; no element of the driver's may be left out.
unsafe extern "C" fn close_al(h_al: Handle) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ib_close_al", PASSIVE);
    // Let the processor thread finish what it queued (completions of this instance).
    let guard = state::lock();
    let what = || "AL's completions to drain before ib_close_al returns".to_string();
    // ... and what is running, and the destroy callbacks of QPs destroyed before: AL's
    // synchronous destroy waits for every reference (al_common.c:543-600).
    let (guard, _) = state::wait_until(guard, None, &what, |s| {
        s.sched.dispatch.is_empty() && s.sched.calls_running == 0 && s.al.destroys_pending == 0
    });
    // A send in flight holds a reference on its MAD service: the synchronous destroy
    // waits for it, up to AL's timeout, then forces the destruction.
    let mine = guard
        .al
        .instances
        .get(&(h_al as usize))
        .cloned()
        .unwrap_or_default();
    let what = || "the instance's sends in flight before ib_close_al destroys it".to_string();
    let (mut guard_after, drained) =
        state::wait_until(guard, Some(AL_DESTROY_TIMEOUT), &what, |s| {
            !s.al.stuck.iter().any(|(_, _, svc, _)| mine.contains(svc))
        });
    if !drained {
        // "Forcing object destruction" (al_common.c sync_destroy_obj): the instance goes
        // with its sends still out; their completions come later, when ibbus deregisters
        // the CA and QP1 is flushed, to the services' contexts as given.
        guard_after.al.forced_destroys += 1;
        let stuck = guard_after.al.stuck.len();
        drop(guard_after);
        crate::state::dbg_print(format_args!(
            "AL: ib_close_al forced the destruction with {stuck} send(s) in flight"
        ));
        guard_after = state::lock();
    }
    let mut guard = guard_after;
    guard
        .al
        .registrations
        .retain(|(instance, ..)| *instance != h_al as usize);
    guard
        .al
        .port_contexts
        .retain(|(instance, ..), _| *instance != h_al as usize);
    let qps = guard
        .al
        .instances
        .remove(&(h_al as usize))
        .unwrap_or_default();
    for qp in qps {
        if let Some(s) = guard.al.services.get_mut(&qp) {
            s.destroyed = true;
        }
    }
    // In flight, an element is AL's (a forced destruction leaves some out).
    let held = guard.al.elements.values().filter(|e| !e.in_flight).count();
    if held > 0 {
        drop(guard);
        bugcheck(
            Rule::MadElement,
            format_args!("ib_close_al with {held} MAD element(s) still held by the driver"),
        );
    }
    IB_SUCCESS
}

unsafe extern "C" fn get_mad(
    _file: *mut i8,
    _line: i32,
    pool_key: Handle,
    buf_size: usize,
    pp: *mut *mut IbMadElement,
) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ib_get_mad", DISPATCH);
    if buf_size > MAD_SIZE {
        return IB_INVALID_PARAMETER;
    }
    let element = new_element(pool_key as usize);
    // SAFETY: the caller's out pointer.
    unsafe { *pp = element };
    IB_SUCCESS
}

fn new_element(pool: usize) -> *mut IbMadElement {
    let mut guard = state::lock();
    // SAFETY: plain C structures; all-zero is valid.
    let mut b: Box<(IbMadElement, [u8; MAD_SIZE], IbGrh)> =
        Box::new(unsafe { core::mem::zeroed() });
    b.0.p_mad_buf = b.1.as_mut_ptr().cast();
    b.0.p_grh = &raw mut b.2;
    b.0.size = MAD_SIZE as u32;
    b.0.context1 = pool as *const c_void;
    let p = &raw mut b.0;
    guard.al.elements.insert(
        p as usize,
        Element {
            block: b,
            in_flight: false,
        },
    );
    p
}

unsafe extern "C" fn put_mad(_file: *mut i8, _line: i32, p: *const IbMadElement) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ib_put_mad", DISPATCH);
    let mut guard = state::lock();
    match guard.al.elements.get(&(p as usize)) {
        None => {
            drop(guard);
            bugcheck(
                Rule::MadElement,
                format_args!("ib_put_mad of {p:p}, not an element the driver holds"),
            );
        }
        Some(e) if e.in_flight => {
            drop(guard);
            bugcheck(
                Rule::MadElement,
                format_args!(
                    "ib_put_mad of {p:p} while its send is in flight (AL's until the send completes)"
                ),
            );
        }
        Some(_) => {
            guard.al.elements.remove(&(p as usize));
        }
    }
    IB_SUCCESS
}

unsafe extern "C" fn send_mad(
    h_mad_svc: Handle,
    p: *mut IbMadElement,
    failure: *mut *mut IbMadElement,
) -> i32 {
    let _k = KernelCode::enter();
    require_irql("ib_send_mad", DISPATCH);
    let mut guard = state::lock();
    match guard.al.elements.get(&(p as usize)) {
        Some(e) if !e.in_flight => {}
        _ => {
            drop(guard);
            bugcheck(
                Rule::MadElement,
                format_args!(
                    "ib_send_mad of {p:p}, not an element the driver holds (or already posted)"
                ),
            );
        }
    }
    let service = guard.al.services.get(&(h_mad_svc as usize));
    let Some(service) = service.filter(|s| !s.destroyed) else {
        // Not posted: the element stays the caller's, named as the failed one.
        if !failure.is_null() {
            // SAFETY: the caller's out pointer.
            unsafe { *failure = p };
        }
        return IB_INVALID_PARAMETER;
    };
    let from = service.port_lid;
    let sender = service.svc;
    let ca = service.ca;
    let element_ptr = p as usize;
    let Some(element) = guard.al.elements.get_mut(&element_ptr) else {
        unreachable!("checked above")
    };
    element.in_flight = true;
    let to = u16::from_be(element.block.0.remote_lid);
    let mad = element.block.1.to_vec();
    let svc_handle = h_mad_svc as usize;
    if guard.al.hardware_gone.contains(&ca) {
        guard
            .al
            .stuck
            .push((ca, element_ptr, svc_handle, SendSvc(sender)));
        return IB_SUCCESS;
    }
    if let Some((ca, port_num)) = verbs_port(&guard.al, to) {
        drop(guard);
        complete_send(element_ptr, svc_handle, SendSvc(sender));
        crate::hca::arrive(ca, port_num, from, &mad);
        return IB_SUCCESS;
    }
    let target = guard
        .al
        .services
        .iter()
        .find(|(_, s)| !s.destroyed && s.port_lid == to)
        .map(|(h, s)| (*h, s.svc, s.port_lid));
    if target.is_none() {
        guard.al.sent.push(Wire {
            from_lid: from,
            to_lid: to,
            mad: mad.clone(),
        });
    }
    drop(guard);
    complete_send(element_ptr, svc_handle, SendSvc(sender));
    if let Some((h, svc, _)) = target {
        deliver(h, svc, from, &mad);
    }
    IB_SUCCESS
}

/// A send's completion on the processor thread: the element is the driver's again.
fn complete_send(element_ptr: usize, svc_handle: usize, sender: SendSvc) {
    run_at_dispatch(move || {
        let sender = sender.get();
        if let Some(e) = state::lock().al.elements.get_mut(&element_ptr) {
            e.in_flight = false;
        }
        if let Some(cb) = sender.pfn_mad_send_cb {
            call_driver("pfn_mad_send_cb", DISPATCH, || {
                // SAFETY: the driver's send completion with its element.
                unsafe {
                    cb(
                        svc_handle as Handle,
                        sender.mad_svc_context,
                        element_ptr as *mut IbMadElement,
                    )
                }
            });
        }
    });
}

/// A received MAD for the service `h` (on the processor thread).
fn deliver(h: usize, svc: IbMadSvc, from_lid: u16, mad: &[u8]) {
    let element = new_element(h) as usize;
    {
        let mut guard = state::lock();
        if let Some(e) = guard.al.elements.get_mut(&element).map(|e| &mut e.block) {
            e.1[..mad.len().min(MAD_SIZE)].copy_from_slice(&mad[..mad.len().min(MAD_SIZE)]);
            e.0.remote_lid = from_lid.to_be();
            e.0.remote_qp = 1u32.to_be();
            e.0.pkey_index = 0;
        }
    }
    let svc = SendSvc(svc);
    run_at_dispatch(move || {
        let svc = svc.get();
        if let Some(cb) = svc.pfn_mad_recv_cb {
            call_driver("pfn_mad_recv_cb", DISPATCH, || {
                // SAFETY: the driver's receive completion with a received element.
                unsafe {
                    cb(
                        h as Handle,
                        svc.mad_svc_context,
                        element as *mut IbMadElement,
                    )
                }
            });
        }
    });
}

/// Delivers `mad` from `from_lid` to the service on the port with LID `to_lid` (a peer
/// outside the simulation's ports).
pub fn receive(to_lid: u16, from_lid: u16, mad: &[u8]) -> bool {
    let port = verbs_port(&state::lock().al, to_lid);
    if let Some((ca, port_num)) = port {
        return crate::hca::arrive(ca, port_num, from_lid, mad);
    }
    let target = {
        let guard = state::lock();
        guard
            .al
            .services
            .iter()
            .find(|(_, s)| !s.destroyed && s.port_lid == to_lid)
            .map(|(h, s)| (*h, s.svc))
    };
    match target {
        Some((h, svc)) => {
            deliver(h, svc, from_lid, mad);
            true
        }
        None => false,
    }
}

/// The number of MAD elements the driver holds now.
pub fn elements_held() -> usize {
    state::lock().al.elements.len()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfFdoQueryForInterface(
    Fdo: WDFDEVICE,
    InterfaceType: *const GUID,
    Interface: PINTERFACE,
    Size: USHORT,
    Version: USHORT,
    _InterfaceSpecificData: PVOID,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfFdoQueryForInterface", PASSIVE);
    let ca = {
        let mut guard = state::lock();
        guard.objects.get_kind(
            Fdo as usize,
            crate::objects::Kind::Device,
            "WdfFdoQueryForInterface",
        );
        guard
            .devices
            .devices
            .get(&(Fdo as usize))
            .map(|d| d.init.hca)
    };
    let Some(ca) = ca else {
        return STATUS_NOT_SUPPORTED;
    };
    // SAFETY: the caller's GUID.
    query(ca, unsafe { &*InterfaceType }, Interface, Size, Version)
}
