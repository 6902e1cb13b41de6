//! The binding of one filter device to the WinOF access layer (IBAL) of its HCA: query
//! it in-stack, open it, follow its ports, and move CM MADs between QP1 and the host's
//! dispatch layer.
//!
//! - Finding IBAL: ibcm is an upper filter directly above ibbus on the HCA's stack, so
//!   `WdfFdoQueryForInterface(GUID_IB_AL_INTERFACE, AL_INTERFACE_VERSION)` goes down to the
//!   bus driver, which answers it (`core/bus/kernel/bus_pnp.c` `__query_al_ifc`), as WinMad
//!   queries it from its own filter device (`core/winmad/kernel/wm_driver.c`
//!   `WmPowerD0Entry`, which also checks the returned version). The interface names the
//!   HCA (`ib_al_ifc_t::ca_guid`); that CA is bound. Done at every EvtDeviceD0Entry
//!   (after the D0 IRP completed below: ibbus has registered the CA), undone at every
//!   EvtDeviceD0Exit and at EvtDeviceSurpriseRemoval (`filter.rs`, `ibcm_lifecycle`).
//! - Following ports: `ib_reg_pnp(IB_PNP_PORT | IB_PNP_FLAG_REG_SYNC)`; per port of the bound
//!   CA a host port number (`ibcm_endpoint::PortNumbers`), a QP1 alias
//!   (`ib_get_spl_qp(IB_QPT_QP1_ALIAS)`) and a MAD service for the CM class (0x07),
//!   version 2, unsolicited methods Send and Get (ClassPortInfo) — WinOF's own CEP manager
//!   does the same (`al_cm_cep.c`: `__init_data_svc`). A port whose MAD service is
//!   registered is a working QP1 route; the filter answers `GUID_INFINIBAND_INTERFACE_CM`
//!   only while it has one (or QP1 steering is installed). The CM itself is made with the
//!   first port of any CA (`Host::ensure_cm`).
//! - Receive (DISPATCH_LEVEL): the MAD and its source address (with the host port number)
//!   are copied into the host's bounded ring, the element goes back to its pool, and the
//!   host's receive DPC hands the ring to `Device::receive_batch`. A full ring drops the
//!   MAD (the CM retries).
//! - Send: the host port number names the port (`PortTable`); `ib_get_mad`, the address
//!   into the element (AL builds the address vector when `h_av` is NULL, as WinOF's
//!   `__format_mad_av` relies on), `ib_send_mad`; the element returns to its pool in the
//!   send-completion callback.
//! - Unbinding (D0Exit, surprise removal, the device's cleanup; PASSIVE_LEVEL), in the
//!   order of `ibcm_lifecycle::UNBIND`: clear the steering, unpublish every port (wait for
//!   its sends, `Device::remove_port`), `ib_close_al` (destroys everything and waits for
//!   callbacks), release the interface. ibbus waits for every interface reference before
//!   it deregisters the CA (`bus_pnp.c:790-829`), at each D3 for sleep, stop and surprise
//!   removal; KMDF runs these callbacks before it passes those IRPs down to ibbus.
//!
//! Declarations are the `#[repr(C)]` parts of the WinOF headers this file uses
//! (lucasz93/WinOFED @913bc0ce): `inc/kernel/iba/ib_al_ifc.h` (`ib_al_ifc_t`),
//! `inc/iba/ib_al.h` (MAD element, MAD service, PnP) and `inc/iba/ib_types.h` (QP creation,
//! port and CA attributes, GRH). Kernel IBAL is built with `CL_KERNEL`, so `AL_API` is
//! empty: the C calling convention.

use alloc::vec::Vec;
use core::cell::UnsafeCell;
use core::ffi::{c_char, c_void};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use ibcm_cep::{CmConfig, MadAddress, MadOwner, Transmit};
use ibcm_endpoint::Lock;
use ibcm_lifecycle::{Teardown, UNBIND};
use ibcm_mad::{CM_CLASS, CM_CLASS_VERSION, MAD_SIZE};
use ibcm_qp1_hook::route::{self, FIRST};
use ibcm_qp1_hook::{HcaRoute, HookState, NoRoute, PrivateMethod, Registration};
use wdk_sys::ntddk::{
    ExAcquireRundownProtection, ExInitializeRundownProtection, ExReleaseRundownProtection,
    ExWaitForRundownProtectionRelease,
};
use wdk_sys::{EX_RUNDOWN_REF, GUID, INTERFACE, NT_SUCCESS, NTSTATUS, PVOID, WDFDEVICE};

use crate::host::{Host, HostPort, PortAttributes, host};
use crate::platform::KmdfLock;
use crate::verbs_hook::{self, IbQpCreate, SlotId};
use crate::{event_log, wdf};

// ---------------------------------------------------------------------------------------
// WinOF declarations
// ---------------------------------------------------------------------------------------

/// `ib_api_status_t` (ib_types.h): an enum, `IB_SUCCESS` first.
type IbApiStatus = i32;
const IB_SUCCESS: IbApiStatus = 0;
const IB_NOT_FOUND: IbApiStatus = 5;
const IB_ERROR: IbApiStatus = 43;

/// Every `ib_*_handle_t` and `ib_pool_key_t` is a pointer to an opaque AL object (ib_al.h).
type Handle = *mut c_void;

/// `AL_INTERFACE_VERSION` (ib_al_ifc.h); `__query_al_ifc` refuses any other version.
const AL_INTERFACE_VERSION: u16 = 19;
/// `GUID_IB_AL_INTERFACE` {96234E89-496F-4dfb-AA90-FCE82BCEC8A8} (ib_al_ifc.h).
static GUID_IB_AL_INTERFACE: GUID = wdf::guid((
    0x9623_4e89,
    0x496f,
    0x4dfb,
    [0xaa, 0x90, 0xfc, 0xe8, 0x2b, 0xce, 0xc8, 0xa8],
));

/// `IB_PNP_PORT`, `IB_PNP_FLAG_REG_SYNC` (ib_al.h `ib_pnp_class_t`).
const IB_PNP_PORT: u32 = 0x0000_0002;
const IB_PNP_FLAG_REG_SYNC: u32 = 0x4000_0000;
/// `ib_pnp_event_t` values (ib_al.h).
const IB_PNP_PORT_ADD: u32 = IB_PNP_PORT | 0x0000_1000;
const IB_PNP_PORT_REMOVE: u32 = IB_PNP_PORT | 0x0000_2000;
/// The port's link went Active / down (`IB_PNP_EVENT_ACTIVE` / `_DOWN`, ib_al.h); AL
/// reports them from its port-attribute poll (al_pnp.c `__pnp_check_ports`: a missed down
/// is reported before the new state).
const IB_PNP_PORT_ACTIVE: u32 = IB_PNP_PORT | 0x0002_0000;
const IB_PNP_PORT_DOWN: u32 = IB_PNP_PORT | 0x0004_0000;
/// The link states on the way up, and a LID change: their records carry the port's
/// attributes as they are now (al_pnp.c:486-497).
const IB_PNP_PORT_INIT: u32 = IB_PNP_PORT | 0x0000_8000;
const IB_PNP_PORT_ARMED: u32 = IB_PNP_PORT | 0x0001_0000;
const IB_PNP_LID_CHANGE: u32 = IB_PNP_PORT | 0x0040_0000;
const IB_PNP_PKEY_CHANGE: u32 = IB_PNP_PORT | 0x0008_0000;
/// `ib_link_states_t` Active (ib_types.h:2039): a port added below it starts down.
const IB_LINK_ACTIVE: u8 = 4;
const IB_PNP_GID_CHANGE: u32 = IB_PNP_PORT | 0x0020_0000;
/// `IB_PDT_ALIAS` (ib_types.h `ib_pd_type_t`), as WinOF's CM allocates for QP1 aliases.
const IB_PDT_ALIAS: i32 = 1;
/// `IB_QPT_QP1_ALIAS` (ib_types.h `ib_qp_type_t`).
const IB_QPT_QP1_ALIAS: i32 = 10;
/// `IB_MAD_SVC_DEFAULT` (ib_al.h `ib_mad_svc_type_t`).
const IB_MAD_SVC_DEFAULT: i32 = 0;
/// `IB_MAX_METHODS` (ib_types.h).
const IB_MAX_METHODS: usize = 128;
/// `IB_SEND_OPT_SIGNALED` (ib_types.h).
const IB_SEND_OPT_SIGNALED: u32 = 0x0000_0004;
/// `IB_QP1`: QPN 1, network order (ib_types.h).
const IB_QP1: u32 = 1u32.to_be();
/// `IB_QP1_WELL_KNOWN_Q_KEY`, network order (ib_types.h).
const IB_QP1_WELL_KNOWN_Q_KEY: u32 = 0x8001_0000u32.to_be();
/// Send queue depth of the QP1 alias: WinOF's `CEP_MAD_SQ_DEPTH` (al_cm_cep.c); the
/// receive side of an alias is AL's, so its depth and SGEs are ignored.
const QP1_SQ_DEPTH: u32 = 128;

/// `ib_grh_t` (ib_types.h), packed.
#[repr(C, packed)]
struct IbGrh {
    ver_class_flow: u32,
    resv1: u16,
    resv2: u8,
    hop_limit: u8,
    src_gid: [u8; 16],
    dest_gid: [u8; 16],
}

/// `ib_mad_element_t` (ib_al.h). `TO_LONG_PTR` members are unions padded to 64 bits: a
/// pointer on x64.
#[repr(C)]
struct IbMadElement {
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

/// `ib_pfn_mad_comp_cb_t` (ib_al.h).
type MadCompletion = Option<
    unsafe extern "C" fn(h_mad_svc: Handle, context: *mut c_void, element: *mut IbMadElement),
>;

/// `ib_mad_svc_t` (ib_al.h).
#[repr(C)]
struct IbMadSvc {
    mad_svc_context: *mut c_void,
    pfn_mad_send_cb: MadCompletion,
    pfn_mad_recv_cb: MadCompletion,
    support_unsol: i32,
    mgmt_class: u8,
    mgmt_version: u8,
    method_array: [i32; IB_MAX_METHODS],
    svc_type: i32,
}

/// `ib_pnp_rec_t` (ib_al.h).
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

/// `ib_pnp_port_rec_t` (ib_al.h).
#[repr(C)]
struct IbPnpPortRec {
    pnp_rec: IbPnpRec,
    p_ca_attr: *const IbCaAttr,
    p_port_attr: *const IbPortAttr,
}

/// `ib_pfn_pnp_cb_t` (ib_al.h).
type PnpCallback = Option<unsafe extern "C" fn(record: *mut IbPnpRec) -> IbApiStatus>;

/// `ib_pnp_req_t` (ib_al.h).
#[repr(C)]
struct IbPnpReq {
    pnp_class: u32,
    pnp_context: *const c_void,
    pfn_pnp_cb: PnpCallback,
}

/// `ib_port_attr_t` (ib_types.h); `cap` is `ib_port_cap_t`, 26 `boolean_t`.
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

/// The leading fields of `ib_ca_attr_t` (ib_types.h), up to `local_ack_delay`; only read
/// through AL's pointer, never allocated here.
#[repr(C)]
struct IbCaAttr {
    ca_guid: u64,
    vend_id: u32,
    dev_id: u16,
    revision: u16,
    fw_ver: u64,
    size: u32,
    max_qps: u32,
    max_wrs: u32,
    max_sges: u32,
    max_rd_sges: u32,
    max_cqs: u32,
    max_cqes: u32,
    max_pds: u32,
    init_regions: u32,
    init_region_size: u64,
    init_windows: u32,
    max_addr_handles: u64,
    max_partitions: u32,
    atomicity: i32,
    max_qp_resp_res: u8,
    max_resp_res: u8,
    max_qp_init_depth: u8,
    max_ipv6_qps: u32,
    max_ether_qps: u32,
    max_mcast_grps: u32,
    max_mcast_qps: u32,
    max_qps_per_mcast_grp: u32,
    max_fmr: u32,
    max_map_per_fmr: u32,
    max_srq: u32,
    max_srq_wrs: u32,
    max_srq_sges: u32,
    bf_reg_size: u32,
    bf_regs_per_page: u32,
    max_sq_desc_sz: u32,
    local_ack_delay: u8,
}

// The members this file reads, where ib_types.h puts them on x64.
const _: () = assert!(core::mem::offset_of!(IbCaAttr, max_qp_resp_res) == 96);
const _: () = assert!(core::mem::offset_of!(IbCaAttr, local_ack_delay) == 152);

type OpenAl = unsafe extern "C" fn(ph_al: *mut Handle) -> IbApiStatus;
type CloseAl = unsafe extern "C" fn(h_al: Handle) -> IbApiStatus;
type OpenCa = unsafe extern "C" fn(
    h_al: Handle,
    ca_guid: u64,
    ca_event_cb: *const c_void,
    ca_context: *const c_void,
    ph_ca: *mut Handle,
) -> IbApiStatus;
type AllocPd = unsafe extern "C" fn(
    h_ca: Handle,
    pd_type: i32,
    pd_context: *const c_void,
    ph_pd: *mut Handle,
) -> IbApiStatus;
type GetSplQp = unsafe extern "C" fn(
    h_pd: Handle,
    port_guid: u64,
    p_qp_create: *mut IbQpCreate,
    qp_context: *const c_void,
    qp_event_cb: *const c_void,
    p_pool_key: *mut Handle,
    ph_qp: *mut Handle,
) -> IbApiStatus;
type DestroyCallback = Option<unsafe extern "C" fn(context: *mut c_void)>;
type DestroyQp = unsafe extern "C" fn(h_qp: Handle, destroy_cb: DestroyCallback) -> IbApiStatus;
type RegMadSvc = unsafe extern "C" fn(
    h_qp: Handle,
    p_mad_svc: *const IbMadSvc,
    ph_mad_svc: *mut Handle,
) -> IbApiStatus;
type SendMad = unsafe extern "C" fn(
    h_mad_svc: Handle,
    p_mad_element_list: *mut IbMadElement,
    pp_mad_failure: *mut *mut IbMadElement,
) -> IbApiStatus;
type GetMad = unsafe extern "C" fn(
    file: *mut c_char,
    line: i32,
    pool_key: Handle,
    buf_size: usize,
    pp_mad_element: *mut *mut IbMadElement,
) -> IbApiStatus;
type PutMad = unsafe extern "C" fn(
    file: *mut c_char,
    line: i32,
    p_mad_element_list: *const IbMadElement,
) -> IbApiStatus;
type RegPnp = unsafe extern "C" fn(
    h_al: Handle,
    p_pnp_req: *const IbPnpReq,
    ph_pnp: *mut Handle,
) -> IbApiStatus;

/// `ib_al_ifc_t` (ib_al_ifc.h), complete: `__query_al_ifc` refuses a buffer smaller than the
/// structure. The entries this binding calls are typed; the others are placeholders of the
/// same size (every member is a function pointer, or `ib_net64_t ca_guid`).
#[repr(C)]
struct IbAlIfc {
    wdm: INTERFACE,
    sync_destroy: *const c_void,
    open_ca: Option<OpenCa>,
    query_ca_to_close_ca: [*const c_void; 4],
    alloc_pd: Option<AllocPd>,
    dealloc_pd_to_create_qp: [*const c_void; 6],
    get_spl_qp: Option<GetSplQp>,
    query_qp_modify_qp: [*const c_void; 2],
    destroy_qp: Option<DestroyQp>,
    create_cq_to_post_recv: [*const c_void; 17],
    send_mad: Option<SendMad>,
    cancel_mad_to_dereg_mad_pool: [*const c_void; 32],
    get_mad: Option<GetMad>,
    put_mad: Option<PutMad>,
    init_dgrm_svc: *const c_void,
    reg_mad_svc: Option<RegMadSvc>,
    reg_svc_to_cancel_query: [*const c_void; 4],
    reg_pnp: Option<RegPnp>,
    dereg_pnp_to_ci_call: [*const c_void; 5],
    open_al: Option<OpenAl>,
    close_al: Option<CloseAl>,
    get_err_str_to_post_srq_recv: [*const c_void; 16],
    ca_guid: u64,
    to_ntstatus_to_open_al_trk: [*const c_void; 16],
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    // 32-byte INTERFACE + 116 pointer-sized members (ib_al_ifc.h).
    assert!(core::mem::size_of::<IbAlIfc>() == 960);
    assert!(core::mem::size_of::<IbMadElement>() == 128);
    assert!(core::mem::size_of::<IbMadSvc>() == 552);
    assert!(core::mem::size_of::<IbQpCreate>() == 56);
    assert!(core::mem::size_of::<IbPnpRec>() == 56);
    assert!(core::mem::size_of::<IbPortAttr>() == 168);
    assert!(core::mem::size_of::<IbGrh>() == 40);
};

impl IbAlIfc {
    const fn empty() -> Self {
        let null = core::ptr::null();
        Self {
            wdm: INTERFACE {
                Size: 0,
                Version: 0,
                Context: core::ptr::null_mut(),
                InterfaceReference: None,
                InterfaceDereference: None,
            },
            sync_destroy: null,
            open_ca: None,
            query_ca_to_close_ca: [null; 4],
            alloc_pd: None,
            dealloc_pd_to_create_qp: [null; 6],
            get_spl_qp: None,
            query_qp_modify_qp: [null; 2],
            destroy_qp: None,
            create_cq_to_post_recv: [null; 17],
            send_mad: None,
            cancel_mad_to_dereg_mad_pool: [null; 32],
            get_mad: None,
            put_mad: None,
            init_dgrm_svc: null,
            reg_mad_svc: None,
            reg_svc_to_cancel_query: [null; 4],
            reg_pnp: None,
            dereg_pnp_to_ci_call: [null; 5],
            open_al: None,
            close_al: None,
            get_err_str_to_post_srq_recv: [null; 16],
            ca_guid: 0,
            to_ntstatus_to_open_al_trk: [null; 16],
        }
    }
}

/// The AL entry points this binding calls, checked present once at bind time.
#[derive(Clone, Copy)]
struct Al {
    open_al: OpenAl,
    close_al: CloseAl,
    open_ca: OpenCa,
    alloc_pd: AllocPd,
    get_spl_qp: GetSplQp,
    destroy_qp: DestroyQp,
    reg_mad_svc: RegMadSvc,
    reg_pnp: RegPnp,
    get_mad: GetMad,
    put_mad: PutMad,
    send_mad: SendMad,
}

impl Al {
    fn from_interface(ifc: &IbAlIfc) -> Option<Self> {
        Some(Self {
            open_al: ifc.open_al?,
            close_al: ifc.close_al?,
            open_ca: ifc.open_ca?,
            alloc_pd: ifc.alloc_pd?,
            get_spl_qp: ifc.get_spl_qp?,
            destroy_qp: ifc.destroy_qp?,
            reg_mad_svc: ifc.reg_mad_svc?,
            reg_pnp: ifc.reg_pnp?,
            get_mad: ifc.get_mad?,
            put_mad: ifc.put_mad?,
            send_mad: ifc.send_mad?,
        })
    }

    /// `ib_put_mad` (the kernel macro passes the caller's file and line for tracking).
    ///
    /// # Safety
    ///
    /// `element` is a MAD element AL handed to this driver and not yet returned.
    unsafe fn put_mad(&self, element: *const IbMadElement, line: u32) {
        // SAFETY: (I1) per the contract the element is ours to return; the file name is a
        // NUL-terminated static that AL only reads.
        let _status =
            unsafe { (self.put_mad)(c"ibal.rs".as_ptr().cast_mut(), line as i32, element) };
    }
}

// ---------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------

/// CA ports whose steering state a filter keeps (the verbs hook tracks 1..=4).
const STEERED_PORTS: usize = 4;

/// The IBAL side of one filter device (its context).
pub struct FilterIbal {
    /// The binding, while bound.
    binding: AtomicPtr<Binding>,
    /// Ports of this HCA with ibcm's ordinary CM MAD service, {Send, Get} (a working QP1
    /// route).
    routed_ports: AtomicUsize,
    /// Ports of this HCA with ibcm's private-method service {M, Get} (steered by the verbs
    /// hook once the decision is set).
    steered_ports: AtomicUsize,
    /// The host port number of each steered CA port (index = CA port - 1), 0 while that
    /// port is not steered: the steering decision's translation, read at DISPATCH_LEVEL
    /// without a lock.
    steered_host_port: [AtomicU8; STEERED_PORTS],
    /// The slot's steering decision is set (`verbs_hook::set_steering`).
    steering_set: AtomicBool,
    /// Why the last port without a route has none (`NoRoute::code`), 0 if none failed.
    no_route: AtomicU8,
    /// The bound CA (network order as AL reports it), 0 before binding: for the log.
    pub ca_guid: AtomicU64,
    /// This HCA's QP1 verbs-hook slot (None: every slot taken or no memory at device
    /// add; then the verbs query passes through untouched and there is no steering).
    pub hook_slot: Option<SlotId>,
    /// QP1 steering is in place on this HCA (`ibcm_qp1_hook::steering_in_place`: some
    /// port has ibcm's `{M, Get}` MAD service and the slot's steering decision is set): a
    /// QP1 route even without a CM MAD service for Send.
    steering_installed: AtomicBool,
    /// How this binding was counted in the host's CM verdict (`HostCm::bound`): 0 not
    /// counted, 1 with a QP1 route, 2 without, [`VERDICT_NO_CA`] as an HCA with no CA.
    in_verdict: AtomicU8,
}

/// `FilterIbal::in_verdict` of an HCA ibbus has no CA for (`HostCm::no_ca`).
const VERDICT_NO_CA: u8 = 3;

impl FilterIbal {
    pub const fn new(hook_slot: Option<SlotId>) -> Self {
        Self {
            binding: AtomicPtr::new(core::ptr::null_mut()),
            routed_ports: AtomicUsize::new(0),
            steered_ports: AtomicUsize::new(0),
            steered_host_port: [const { AtomicU8::new(0) }; STEERED_PORTS],
            steering_set: AtomicBool::new(false),
            no_route: AtomicU8::new(0),
            ca_guid: AtomicU64::new(0),
            hook_slot,
            steering_installed: AtomicBool::new(false),
            in_verdict: AtomicU8::new(0),
        }
    }

    /// Whether ibcm can reach the wire from this HCA: a registered CM MAD service on some
    /// port, or QP1 steering.
    pub fn qp1_route(&self) -> bool {
        self.routed() || self.steering_installed.load(Ordering::Acquire)
    }

    /// The route this HCA got (for the log).
    pub fn hca_route(&self) -> HcaRoute {
        self.route(self.steering_installed.load(Ordering::Acquire))
    }

    /// Whether some port of this HCA has a registered CM MAD service for Send.
    pub fn routed(&self) -> bool {
        self.routed_ports.load(Ordering::Acquire) > 0
    }

    /// The HCA's route from what was recorded (`steering_installed`: the filter's flag).
    pub fn route(&self, steering_installed: bool) -> HcaRoute {
        HcaRoute::of(
            self.routed_ports.load(Ordering::Acquire),
            self.steered_ports.load(Ordering::Acquire),
            steering_installed,
            NoRoute::from_code(self.no_route.load(Ordering::Acquire)),
        )
    }

    /// The host port number of a steered CA port.
    fn steered_host_port(&self, ca_port: u8) -> Option<u8> {
        let slot = self
            .steered_host_port
            .get(usize::from(ca_port).checked_sub(1)?)?;
        Some(slot.load(Ordering::Acquire)).filter(|&n| n != 0)
    }

    fn record_no_route(&self, why: NoRoute) {
        self.no_route.store(why.code(), Ordering::Release);
    }
}

/// Sets the filter's `steering_installed` from what is recorded
/// (`ibcm_qp1_hook::steering_in_place`).
fn update_steering_installed(filter: &FilterIbal) {
    let in_place = route::steering_in_place(
        filter.steered_ports.load(Ordering::Acquire),
        filter.steering_set.load(Ordering::Acquire),
    );
    filter.steering_installed.store(in_place, Ordering::Release);
}

/// The verbs hook's steering decision (`verbs_hook::Decide`), at DISPATCH_LEVEL from the
/// hook's `poll_cq` thunk, inside the slot's steering lock: the CA port's host number,
/// then `Device::owner_of` under the device lock (the only lock nesting: steering →
/// engine). Allocates nothing. `context` is the filter's `FilterIbal` address
/// (`set_steering` in `port_added`), valid until `clear_steering` in `unbind`.
fn decide(context: usize, ca_port: u8, mad: &[u8]) -> bool {
    let filter = core::ptr::with_exposed_provenance::<FilterIbal>(context);
    // SAFETY: (I106) the address `port_added` registered for this filter's slot; the
    // steering is cleared (`unbind`, under the slot's steering lock, which this runs
    // inside) before the filter's context is dropped.
    let filter = unsafe { &*filter };
    let Some(host_port) = filter.steered_host_port(ca_port) else {
        return false;
    };
    host()
        .and_then(Host::core)
        .is_some_and(|device| device.owner_of(host_port, mad) == MadOwner::Ours)
}

/// One binding to IBAL: the interface, the AL instance, the CA's alias PD and its ports.
struct Binding {
    host: NonNull<Host>,
    filter: NonNull<FilterIbal>,
    al: Al,
    /// The queried interface (kept for `InterfaceDereference`).
    ifc: IbAlIfc,
    h_al: Handle,
    h_pd: Handle,
    /// The bound CA, network order as AL reports it.
    ca_guid: u64,
    /// This CA's ports with a MAD service. Ports are heap objects whose address is their
    /// AL context; freed by `port_destroyed` or after `ib_close_al`.
    ports: KmdfLock<Vec<NonNull<Port>>>,
    /// Ports parked by `unbind` (sends the HCA never completed), and [`PARKED`] once
    /// `unbind` is done with the binding: the last parked port's late completion frees it.
    parked: AtomicUsize,
    /// Other CAs' ports AL reported to this registration, (port GUID, CA GUID), network
    /// order: each counts its CA in the host's table (`ibcm_lifecycle::HostCm`) until AL
    /// removes the port or `unbind` closes the registration.
    foreign: KmdfLock<Vec<(u64, u64)>>,
}

/// The AL context of another CA's port (any non-null value no [`Port`] can have): its
/// later events, the removal among them, come with it. AL reports them for every port
/// whose PORT_ADD the callback accepted (al_pnp.c:375-393 `pnp_get_context`, 1015-1019),
/// and the marker tells them from this binding's own ports' events.
static FOREIGN_PORT: u8 = 0;

fn foreign_port_context() -> *mut c_void {
    (&raw const FOREIGN_PORT).cast_mut().cast()
}

/// The mark on a counter of [`Port::posted`] or [`Binding::parked`]: its owner is closed and
/// waits only for what the count says.
const PARKED: usize = 1 << (usize::BITS - 1);

impl Binding {
    fn host(&self) -> &Host {
        // SAFETY: (I3) every binding is undone (in its filter's removal) before the last
        // filter device goes, and the host only goes after the last one.
        unsafe { self.host.as_ref() }
    }

    fn filter(&self) -> &FilterIbal {
        // SAFETY: (I102) the binding is freed in `unbind`, before its filter's context.
        unsafe { self.filter.as_ref() }
    }
}

/// One port of a bound CA. `#[repr(C)]` with the host's part first: the host's port table
/// keeps a pointer to that part, and [`send`] gets the port back from it.
#[repr(C)]
pub struct Port {
    /// The host number and address tables (what the host's port table points to).
    host: HostPort,
    /// The CA's own port number (the verbs hook's port).
    ca_port: u8,
    /// The private method of the port's MAD service when it is `{M, Get}` (steered);
    /// None for `{Send, Get}`. Written before each registration attempt, read-only once
    /// a service exists.
    private: Option<PrivateMethod>,
    binding: NonNull<Binding>,
    /// Written by `ib_get_spl_qp` before any callback can run; read-only afterwards.
    qp: Handle,
    pool_key: Handle,
    mad_svc: AtomicPtr<c_void>,
    /// Rundown protection of this port for the send path (unpublishing waits on it).
    sends: UnsafeCell<EX_RUNDOWN_REF>,
    /// Sends posted to AL and not yet returned through `mad_sent`, with [`PARKED`] once
    /// `unbind` closed AL while some were out: a card that stopped completes none until
    /// ibbus deregisters the CA, after AL's forced destruction ended `ib_close_al`'s wait
    /// (al_common.c `sync_destroy_obj`); the port (the send's context) must outlive them.
    posted: AtomicUsize,
}

impl Port {
    fn binding(&self) -> &Binding {
        // SAFETY: (I4) ports are destroyed (synchronously by ib_close_al, or earlier by their
        // own removal) before their binding is freed.
        unsafe { self.binding.as_ref() }
    }
}

/// Copies the P_Key and GID tables of AL's port record (PASSIVE_LEVEL: allocates).
///
/// # Safety
///
/// `attr` is AL's port attribute record of a PnP callback.
unsafe fn attributes_of(attr: &IbPortAttr) -> Option<PortAttributes> {
    let count = usize::from(attr.num_pkeys);
    let mut pkeys = Vec::new();
    pkeys.try_reserve_exact(count).ok()?;
    if count > 0 && !attr.p_pkey_table.is_null() {
        // SAFETY: (I5) AL's record holds `num_pkeys` table entries behind the pointer.
        let table = unsafe { core::slice::from_raw_parts(attr.p_pkey_table, count) };
        pkeys.extend(table.iter().map(|pkey| u16::from_be(*pkey)));
    }
    let count = usize::from(attr.num_gids);
    let mut gids = Vec::new();
    gids.try_reserve_exact(count).ok()?;
    if count > 0 && !attr.p_gid_table.is_null() {
        // SAFETY: (I6) the GID table holds `num_gids` entries.
        let table = unsafe { core::slice::from_raw_parts(attr.p_gid_table, count) };
        gids.extend_from_slice(table);
    }
    Some(PortAttributes { pkeys, gids })
}

// ---------------------------------------------------------------------------------------
// Binding IBAL (PASSIVE_LEVEL, the filter's D0Entry, D0Exit, surprise removal, cleanup)
// ---------------------------------------------------------------------------------------

/// EvtDeviceD0Entry's part: query IBAL down the stack and bind its CA, log the route the
/// HCA got, and count it in the host's CM verdict. A filter that cannot bind counts as an
/// HCA without a QP1 route; its start never fails for it.
pub fn bind(device: WDFDEVICE, filter: &FilterIbal) {
    let registered = bind_ca(device, filter);
    let Some(host) = host() else {
        log_route(filter);
        return;
    };
    if !registered {
        // No CA: nothing for WinVerbs or ibcm on this HCA; it leaves the verdict alone.
        filter.in_verdict.store(VERDICT_NO_CA, Ordering::Release);
        host.verdict(|v| v.no_ca(true));
        event_log::hcas_without_ibcm(host);
        return;
    }
    log_route(filter);
    // The host's CM verdict counts this HCA (`ibcm_lifecycle::HostCm`), bound or not: an
    // HCA whose binding failed has no QP1 route either, and WinVerbs would use the host's
    // one table on it too.
    let routed = filter.qp1_route();
    filter
        .in_verdict
        .store(if routed { 1 } else { 2 }, Ordering::Release);
    let ca_guid = filter.ca_guid.load(Ordering::Relaxed);
    if host.verdict(|v| v.bound(ca_guid, routed)) {
        let ca = u64::from_be(ca_guid);
        wdk::println!(
            "ibcm: CA {ca:#018x} has no QP1 route, but kernel clients already use ibcm's CM: their connections on it fail"
        );
    }
    // Once this filter is counted, a CA reported to any filter may be known to lack ibcm.
    event_log::hcas_without_ibcm(host);
}

/// The route this HCA got, once its existing ports were reported (`IB_PNP_FLAG_REG_SYNC`):
/// ETW `Qp1Route` and DbgPrint. Ordinary registration, QP1 steering, or none (AL's CM
/// serves the HCA's clients) with the reason.
fn log_route(filter: &FilterIbal) {
    let route = filter.hca_route();
    let ca_guid = filter.ca_guid.load(Ordering::Relaxed);
    ibcm_etw::qp1_route(ca_guid, route.is_route(), route.name(), route.reason());
    let ca = u64::from_be(ca_guid);
    if route.is_route() {
        wdk::println!("ibcm: CA {ca:#018x}: QP1 route: {}", route.name());
    } else {
        wdk::println!(
            "ibcm: CA {ca:#018x}: QP1 route: {}: {}",
            route.name(),
            route.reason()
        );
    }
}

/// Binds the HCA's CA. False when ibbus has no CA for the HCA: it found no InfiniBand
/// port and runs without the access layer (`bus_pnp.c:566-569`: "IBAL is started in
/// non-operational mode"), and answers the interface query with CA GUID 0 (`:1246`, the
/// verbs it never took).
fn bind_ca(device: WDFDEVICE, filter: &FilterIbal) -> bool {
    let Some(host) = host() else {
        wdk::println!("ibcm: no control device: this HCA is not bound (AL's CM serves it)");
        event_log::hca_skipped(0, "ibcm's control device could not be created", 0);
        return true;
    };
    if !filter.binding.load(Ordering::Acquire).is_null() {
        return true;
    }
    let mut ifc = IbAlIfc::empty();
    // SAFETY: (I19) PASSIVE_LEVEL; the device is our started filter device; the buffer is
    // a whole ib_al_ifc_t, as `__query_al_ifc` requires, and outlives the (synchronous)
    // query.
    let status = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfFdoQueryForInterface,
            device,
            &raw const GUID_IB_AL_INTERFACE,
            (&raw mut ifc).cast::<INTERFACE>(),
            core::mem::size_of::<IbAlIfc>() as u16,
            AL_INTERFACE_VERSION,
            core::ptr::null_mut()
        )
    };
    if !NT_SUCCESS(status) {
        wdk::println!("ibcm: IBAL interface query failed: {status:#010x}");
        event_log::hca_skipped(
            0,
            "the query for ibbus's access-layer interface failed",
            status,
        );
        return true;
    }
    if ifc.wdm.Version != AL_INTERFACE_VERSION {
        // As WinMad: the version must be the one asked for.
        wdk::println!(
            "ibcm: IBAL interface version {} is not {AL_INTERFACE_VERSION}",
            ifc.wdm.Version
        );
        event_log::hca_skipped(
            ifc.ca_guid,
            "ibbus's access-layer interface is not version 19",
            0,
        );
        release_interface(&ifc);
        return true;
    }
    if ifc.ca_guid == 0 {
        wdk::println!(
            "ibcm: ibbus has no CA for this HCA (no InfiniBand port): nothing to serve on it"
        );
        release_interface(&ifc);
        return false;
    }
    let Some(al) = Al::from_interface(&ifc) else {
        release_interface(&ifc);
        return true;
    };
    let ca_guid = ifc.ca_guid;
    let (h_al, h_pd) = match open_al(&al, ca_guid) {
        Ok(handles) => handles,
        Err(status) => {
            wdk::println!("ibcm: opening IBAL failed: {status}");
            event_log::hca_skipped(
                ca_guid,
                "opening the access layer, the CA or its PD failed",
                0,
            );
            release_interface(&ifc);
            return true;
        }
    };
    filter.ca_guid.store(ca_guid, Ordering::Relaxed);
    let binding = alloc::boxed::Box::into_raw(alloc::boxed::Box::new(Binding {
        host: NonNull::from(host),
        filter: NonNull::from(filter),
        al,
        ifc,
        h_al,
        h_pd,
        ca_guid,
        ports: KmdfLock::new(Vec::new()),
        parked: AtomicUsize::new(0),
        foreign: KmdfLock::new(Vec::new()),
    }));
    filter.binding.store(binding, Ordering::Release);
    let request = IbPnpReq {
        pnp_class: IB_PNP_PORT | IB_PNP_FLAG_REG_SYNC,
        pnp_context: binding.cast_const().cast(),
        pfn_pnp_cb: Some(pnp_callback),
    };
    let mut h_pnp: Handle = core::ptr::null_mut();
    // SAFETY: (I20) AL is open; the request outlives the call; the context (the binding)
    // outlives the registration, which ib_close_al ends. With REG_SYNC the existing ports
    // are reported before this returns.
    let status = unsafe { (al.reg_pnp)(h_al, &raw const request, &raw mut h_pnp) };
    if status != IB_SUCCESS {
        wdk::println!("ibcm: ib_reg_pnp failed: {status}");
        event_log::hca_skipped(
            ca_guid,
            "the access layer refused ibcm's port notifications",
            0,
        );
        unbind(filter);
    }
    true
}

/// `ib_open_al`, `ib_open_ca` for the interface's CA and an alias PD on it.
fn open_al(al: &Al, ca_guid: u64) -> Result<(Handle, Handle), IbApiStatus> {
    let mut h_al: Handle = core::ptr::null_mut();
    // SAFETY: (I21) valid out pointer; PASSIVE_LEVEL.
    let status = unsafe { (al.open_al)(&raw mut h_al) };
    if status != IB_SUCCESS {
        return Err(status);
    }
    let mut h_ca: Handle = core::ptr::null_mut();
    // SAFETY: (I22) AL is open; no CA event callback; valid out pointer.
    let status = unsafe {
        (al.open_ca)(
            h_al,
            ca_guid,
            core::ptr::null(),
            core::ptr::null(),
            &raw mut h_ca,
        )
    };
    let mut h_pd: Handle = core::ptr::null_mut();
    let status = if status == IB_SUCCESS {
        // SAFETY: (I23) the CA is open; valid out pointer.
        unsafe { (al.alloc_pd)(h_ca, IB_PDT_ALIAS, core::ptr::null(), &raw mut h_pd) }
    } else {
        status
    };
    if status != IB_SUCCESS {
        // SAFETY: (I24) AL is open and no callback of it is running (nothing registered);
        // closing destroys the CA handle opened above.
        let _closed = unsafe { (al.close_al)(h_al) };
        return Err(status);
    }
    Ok((h_al, h_pd))
}

fn release_interface(ifc: &IbAlIfc) {
    if let Some(dereference) = ifc.wdm.InterfaceDereference {
        // SAFETY: (I28) balances the reference `__query_al_ifc` took for this copy.
        unsafe { dereference(ifc.wdm.Context) };
    }
}

/// Unbinds (PASSIVE_LEVEL; the filter's D0Exit, surprise removal or cleanup callback, or a
/// failed bind; idempotent): every port of this CA is unpublished from the host and
/// its sends waited for, then `ib_close_al` destroys the PnP registration, the PD, the
/// CA, every QP1 alias and MAD service, waiting for their callbacks; the interface is
/// released. Connections and kernel-client ids on these ports hear DEVICE_REMOVAL
/// (`Device::remove_port`); the host's CM stays for the other HCAs.
pub fn unbind(filter: &FilterIbal) {
    match (filter.in_verdict.swap(0, Ordering::AcqRel), host()) {
        (0, _) | (_, None) => {}
        (VERDICT_NO_CA, Some(host)) => host.verdict(|v| v.no_ca(false)),
        (counted, Some(host)) => {
            let ca_guid = filter.ca_guid.load(Ordering::Relaxed);
            host.verdict(|v| v.unbound(ca_guid, counted == 1));
        }
    }
    let binding = filter.binding.swap(core::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: (I36) published by `bind` and freed only below (the swap above makes this
    // the only unbind of it).
    let Some(bound) = (unsafe { binding.as_ref() }) else {
        return;
    };
    // The order is `ibcm_lifecycle::UNBIND` (the model tests drive it): nothing of AL is
    // used after `ib_close_al`, and ibbus's reference goes last.
    let mut ports = Vec::new();
    for part in UNBIND {
        match part {
            Teardown::ClearSteering => {
                // No steering decision runs with this filter or its ports after this:
                // every MAD goes to AL (before the ports go, and before the engine can).
                if let Some(slot) = filter.hook_slot {
                    verbs_hook::clear_steering(slot);
                }
                filter.steering_set.store(false, Ordering::Release);
                filter.steered_ports.store(0, Ordering::Release);
                for entry in &filter.steered_host_port {
                    entry.store(0, Ordering::Release);
                }
                update_steering_installed(filter);
            }
            Teardown::UnpublishPorts => {
                ports = bound.ports.with(core::mem::take);
                for port in &ports {
                    // SAFETY: (I105) the port is live until its QP is destroyed (below or
                    // by AL).
                    unpublish(bound.host(), unsafe { port.as_ref() });
                }
            }
            Teardown::CloseAl => {
                // SAFETY: (I37) not called from an AL callback; destroys the PnP
                // registration, the PD, the CA, every QP1 alias and MAD service, waiting
                // for their callbacks (a PnP callback running now finds its port already
                // unpublished and the binding still alive).
                let _closed = unsafe { (bound.al.close_al)(bound.h_al) };
                filter.routed_ports.store(0, Ordering::Release);
                // The registration is gone: its reports of other CAs' ports with it.
                for (_, ca_guid) in bound.foreign.with(core::mem::take) {
                    bound.host().verdict(|v| v.ca_report_withdrawn(ca_guid));
                }
                let mut parked = 0u32;
                for port in core::mem::take(&mut ports) {
                    bound.parked.fetch_add(1, Ordering::AcqRel);
                    // SAFETY: (I113) live until freed below or by its last send.
                    let posted = unsafe { port.as_ref() }
                        .posted
                        .fetch_or(PARKED, Ordering::AcqRel);
                    if posted == 0 {
                        bound.parked.fetch_sub(1, Ordering::AcqRel);
                        // SAFETY: (I38) the port came from Box::into_raw in `port_added`;
                        // its QP is gone with the AL instance and no send of it is out, so
                        // no callback refers to it.
                        drop(unsafe { alloc::boxed::Box::from_raw(port.as_ptr()) });
                    } else {
                        parked += 1;
                    }
                }
                if parked > 0 {
                    // AL's wait ended without them: the HCA stopped completing sends.
                    wdk::println!(
                        "ibcm: CA {:#018x}: {parked} port(s) with sends the HCA never completed outlive ib_close_al; each is freed at its last late completion",
                        u64::from_be(bound.ca_guid)
                    );
                }
            }
            Teardown::ReleaseInterface => release_interface(&bound.ifc),
        }
    }
    if bound.parked.fetch_or(PARKED, Ordering::AcqRel) == 0 {
        // SAFETY: (I41) from Box::into_raw in `bind`; unpublished above, every callback
        // that could reach it has ended with ib_close_al, and no port of it is parked.
        drop(unsafe { alloc::boxed::Box::from_raw(binding) });
    }
}

/// Takes a port out of the host's table, waits for the sends that found it, and tells
/// the dispatch layer (PASSIVE_LEVEL): every connection on the port gets DEVICE_REMOVAL
/// now (user endpoints through their events, kernel clients through their callbacks)
/// instead of ending by its timers.
fn unpublish(host: &Host, port: &Port) {
    host.ports.with(|t| t.unpublish(port.host.number));
    // SAFETY: (I99) PASSIVE_LEVEL; the port is unpublished, so no new send can acquire the
    // protection (sends acquire it under the table lock): this waits for the ones in
    // flight. Never re-initialised.
    unsafe { ExWaitForRundownProtectionRelease(port.sends.get()) };
    if let Some(cm) = host.cm() {
        cm.device.remove_port(port.host.number);
    }
}

// ---------------------------------------------------------------------------------------
// Ports (IBAL PnP callbacks, PASSIVE_LEVEL, AL's PnP thread)
// ---------------------------------------------------------------------------------------

/// `ib_pfn_pnp_cb_t` for the port registration.
unsafe extern "C" fn pnp_callback(record: *mut IbPnpRec) -> IbApiStatus {
    // SAFETY: (I42) AL's record, valid for the callback.
    let event = unsafe { (*record).pnp_event };
    // SAFETY: (I43) as I42.
    let context = unsafe { (*record).context };
    // SAFETY: (I44) as I42.
    let pnp_context = unsafe { (*record).pnp_context };
    // SAFETY: (I96) the PnP context is the binding registered in `bind`, alive until
    // ib_close_al has returned, which waits for this callback.
    let binding = unsafe { &*pnp_context.cast::<Binding>() };
    if context == foreign_port_context() {
        // SAFETY: (I117) as I42.
        let port_guid = unsafe { (*record).guid };
        return foreign_port_event(binding, event, port_guid);
    }
    match event {
        // SAFETY: (I45) port events carry an ib_pnp_port_rec_t.
        IB_PNP_PORT_ADD => unsafe { port_added(binding, record.cast::<IbPnpPortRec>()) },
        // SAFETY: (I46) the context is null or the port `port_added` stored.
        IB_PNP_PORT_REMOVE => unsafe { port_removed(binding, context.cast::<Port>()) },
        IB_PNP_PORT_DOWN | IB_PNP_PORT_ACTIVE => {
            if event == IB_PNP_PORT_ACTIVE {
                // The SM programs the tables while the port is below Armed, and AL reports
                // P_Key and GID changes only between Armed/Active states (al_pnp.c:1433-1440):
                // what the port got on its way up comes with this record, not as a change.
                // SAFETY: (I118) as I47.
                unsafe { port_changed(record.cast::<IbPnpPortRec>(), context.cast::<Port>()) };
            }
            // SAFETY: (I109) the context is null or the port `port_added` stored, live
            // while its QP exists (this is one of its events).
            unsafe { port_link(binding, context.cast::<Port>(), event == IB_PNP_PORT_ACTIVE) };
            IB_SUCCESS
        }
        IB_PNP_PKEY_CHANGE | IB_PNP_GID_CHANGE | IB_PNP_PORT_INIT | IB_PNP_PORT_ARMED
        | IB_PNP_LID_CHANGE => {
            // SAFETY: (I47) as I45 and I46.
            unsafe { port_changed(record.cast::<IbPnpPortRec>(), context.cast::<Port>()) };
            IB_SUCCESS
        }
        _ => IB_SUCCESS,
    }
}

/// IB_PNP_PORT_ADD: a host port number, a QP1 alias and a CM MAD service on the port; the
/// host's CM is created with the first port of any CA (its configuration comes from that
/// CA's attributes).
///
/// # Safety
///
/// `record` is AL's port record of an IB_PNP_PORT_ADD callback for this binding.
unsafe fn port_added(binding: &Binding, record: *mut IbPnpPortRec) -> IbApiStatus {
    // SAFETY: (I48) per the contract the record is valid for the callback.
    let port_record = unsafe { &*record };
    if port_record.p_ca_attr.is_null() || port_record.p_port_attr.is_null() {
        return IB_NOT_FOUND;
    }
    // SAFETY: (I49) checked non-null; AL's attributes, valid for the callback.
    let ca = unsafe { &*port_record.p_ca_attr };
    // SAFETY: (I50) as I49.
    let attr = unsafe { &*port_record.p_port_attr };
    // The CA is the attributes' (`ib_pnp_rec_t::ca_guid` is 0 in port events: AL clears
    // the record and sets only `guid`, the port's, al_pnp.c:461, 500-502).
    if ca.ca_guid != binding.ca_guid {
        // SAFETY: (I114) as I48.
        return unsafe { foreign_port_added(binding, record, ca.ca_guid) };
    }
    let host = binding.host();
    let setup_failed = || binding.filter().record_no_route(NoRoute::PortSetup);
    if host.core().is_none() {
        let Some(seed) = random_seed() else {
            setup_failed();
            return IB_ERROR;
        };
        let mut config = CmConfig::new(u64::from_be(ca.ca_guid), seed);
        config.ca_ack_delay = ca.local_ack_delay;
        config.max_responder_resources = ca.max_qp_resp_res;
        config.max_initiator_depth = ca.max_qp_init_depth;
        if host.ensure_cm(config).is_err() {
            setup_failed();
            return IB_ERROR;
        }
    }
    let Some(number) = host
        .ports
        .with(|t| t.numbers.assign(binding.ca_guid, attr.port_num))
    else {
        wdk::println!(
            "ibcm: no host port number left for port {} (more than {} ports)",
            attr.port_num,
            ibcm_endpoint::MAX_HOST_PORTS
        );
        setup_failed();
        return IB_ERROR;
    };
    // REQs and REPs on this port name this CA, not the first CA bound (issue 25).
    if let Some(core) = host.core() {
        core.set_port_ca_guid(number, u64::from_be(binding.ca_guid));
    }
    // SAFETY: (I51) AL's port attributes of this callback.
    let Some(attributes) = (unsafe { attributes_of(attr) }) else {
        host.ports.with(|t| t.numbers.deactivate(number));
        setup_failed();
        return IB_ERROR;
    };
    let port = alloc::boxed::Box::into_raw(alloc::boxed::Box::new(Port {
        host: HostPort {
            number,
            attributes: KmdfLock::new(attributes),
        },
        ca_port: attr.port_num,
        private: None,
        binding: NonNull::from(binding),
        qp: core::ptr::null_mut(),
        pool_key: core::ptr::null_mut(),
        mad_svc: AtomicPtr::new(core::ptr::null_mut()),
        sends: UnsafeCell::new(EX_RUNDOWN_REF::default()),
        posted: AtomicUsize::new(0),
    }));
    // SAFETY: (I52) the port was just allocated; nothing else refers to it yet.
    let port_sends = unsafe { (*port).sends.get() };
    // SAFETY: (I97) the rundown reference is in the port's final (heap) place, unused yet.
    unsafe { ExInitializeRundownProtection(port_sends) };
    let mut create = IbQpCreate {
        qp_type: IB_QPT_QP1_ALIAS,
        sq_max_inline: 0,
        sq_depth: QP1_SQ_DEPTH,
        rq_depth: 1,
        sq_sge: 1,
        rq_sge: 1,
        h_sq_cq: core::ptr::null_mut(),
        h_rq_cq: core::ptr::null_mut(),
        h_srq: core::ptr::null_mut(),
        sq_signaled: 1,
    };
    let mut pool_key: Handle = core::ptr::null_mut();
    let mut qp: Handle = core::ptr::null_mut();
    // SAFETY: (I53) the PD is the binding's; valid out pointers; the port is the QP's context
    // (given back to `port_destroyed`); no QP event callback.
    let status = unsafe {
        (binding.al.get_spl_qp)(
            binding.h_pd,
            attr.port_guid,
            &raw mut create,
            port.cast_const().cast(),
            core::ptr::null(),
            &raw mut pool_key,
            &raw mut qp,
        )
    };
    if status != IB_SUCCESS {
        wdk::println!(
            "ibcm: ib_get_spl_qp failed on port {}: {status}",
            attr.port_num
        );
        // SAFETY: (I54) from Box::into_raw above; no QP refers to it.
        drop(unsafe { alloc::boxed::Box::from_raw(port) });
        host.ports.with(|t| t.numbers.deactivate(number));
        setup_failed();
        return status;
    }
    // SAFETY: (I55) nothing else refers to the port until its MAD service exists (the QP
    // has no callbacks before that).
    unsafe { (*port).qp = qp };
    // SAFETY: (I98) as I55.
    unsafe { (*port).pool_key = pool_key };
    let filter = binding.filter();
    // The ordinary registration first, then (AL's CM holds Send) the private method if
    // the verbs hook can steer this port (`ibcm_qp1_hook::route` decides).
    let mut registration = FIRST;
    let mad_svc = loop {
        let private = match registration {
            Registration::Ordinary => None,
            Registration::Private(m) => Some(m),
        };
        // SAFETY: (I107) as I55: no service of the port exists (none registered yet, or
        // the previous attempt failed).
        unsafe { (*port).private = private };
        match register_cm_service(binding, qp, port, registration) {
            Ok(mad_svc) => break mad_svc,
            Err(status) => {
                let hook = HookState {
                    method: filter.hook_slot.and_then(verbs_hook::method),
                    table: filter
                        .hook_slot
                        .map_or(ibcm_qp1_hook::Table::NotSeen, verbs_hook::table),
                    qp1_tracked: filter
                        .hook_slot
                        .is_some_and(|s| verbs_hook::qp1_tracked(s, attr.port_num)),
                };
                match route::after_failure(registration, &hook) {
                    Ok(next) => {
                        wdk::println!(
                            "ibcm: ib_reg_mad_svc(CM {{Send, Get}}) failed on port {}: {status}; AL's CM holds Send: trying {next:?} with QP1 steering",
                            attr.port_num
                        );
                        registration = next;
                    }
                    Err(why) => {
                        // Without a route on any port of this HCA the filter passes CM
                        // queries down (`PassDown::NoQp1Route`, logged with this reason).
                        wdk::println!(
                            "ibcm: no QP1 route on port {} ({registration:?} failed: {status}): {}",
                            attr.port_num,
                            why.reason()
                        );
                        filter.record_no_route(why);
                        host.ports.with(|t| t.numbers.deactivate(number));
                        // SAFETY: (I57) the QP is ours; `port_destroyed` frees the port
                        // once AL is done.
                        let _destroyed =
                            unsafe { (binding.al.destroy_qp)(qp, Some(port_destroyed)) };
                        return status;
                    }
                }
            }
        }
    };
    // SAFETY: (I58) the port is live (owned by this function until published below).
    unsafe { (*port).mad_svc.store(mad_svc, Ordering::Release) };
    // SAFETY: (I59) `port` is non-null (from Box::into_raw).
    let port_ptr = unsafe { NonNull::new_unchecked(port) };
    let published = binding.ports.with(|ports| {
        if ports.try_reserve(1).is_ok() {
            ports.push(port_ptr);
            true
        } else {
            false
        }
    });
    if !published {
        setup_failed();
        host.ports.with(|t| t.numbers.deactivate(number));
        // SAFETY: (I60) as I57.
        let _destroyed = unsafe { (binding.al.destroy_qp)(qp, Some(port_destroyed)) };
        return IB_ERROR;
    }
    host.ports
        .with(|t| t.publish(number, port_ptr.cast::<HostPort>()));
    match registration {
        Registration::Ordinary => {
            filter.routed_ports.fetch_add(1, Ordering::AcqRel);
        }
        Registration::Private(_) => start_steering(filter, attr.port_num, number),
    }
    // A port added while its link is not Active starts down: AL follows the ADD with a
    // DOWN only for a link in DOWN (al_pnp.c:628-633); one in INIT or ARMED gets INIT /
    // ARMED (al_pnp.c:636-650), which are no link events here, and ACTIVE only once it
    // gets there (al_pnp.c:653-656, 1411-1425).
    if attr.link_state < IB_LINK_ACTIVE
        && let Some(cm) = host.cm()
    {
        cm.device.port_down(number);
    }
    // SAFETY: (I61) the record is valid for the callback; AL keeps the context for the
    // port's later events (ib_pnp_rec_t `context`).
    unsafe { (*record).pnp_rec.context = port.cast() };
    IB_SUCCESS
}

/// `ib_reg_mad_svc` for the CM class on the port's QP1 alias with `registration`'s
/// unsolicited methods (`ib_mad_svc_t`, the port as its context). PASSIVE_LEVEL.
fn register_cm_service(
    binding: &Binding,
    qp: Handle,
    port: *mut Port,
    registration: Registration,
) -> Result<Handle, IbApiStatus> {
    let mut methods = [0i32; IB_MAX_METHODS];
    for m in registration.methods() {
        if let Some(slot) = methods.get_mut(usize::from(m)) {
            *slot = 1;
        }
    }
    let service = IbMadSvc {
        mad_svc_context: port.cast(),
        pfn_mad_send_cb: Some(mad_sent),
        pfn_mad_recv_cb: Some(mad_received),
        support_unsol: 1,
        mgmt_class: CM_CLASS,
        mgmt_version: CM_CLASS_VERSION,
        method_array: methods,
        svc_type: IB_MAD_SVC_DEFAULT,
    };
    // A fresh out pointer per attempt: a failed registration writes a dangling handle
    // into it (`al_mad.c` `reg_mad_svc`, winof-deployment.md §2).
    let mut mad_svc: Handle = core::ptr::null_mut();
    // SAFETY: (I56) the QP is the port's live QP1 alias; the service description and the
    // out pointer outlive the call.
    let status = unsafe { (binding.al.reg_mad_svc)(qp, &raw const service, &raw mut mad_svc) };
    if status == IB_SUCCESS {
        Ok(mad_svc)
    } else {
        Err(status)
    }
}

/// A port's `{M, Get}` service is registered and published: record the CA port's host
/// number for the decision, set the slot's steering (once per binding) and the filter's
/// `steering_installed`. Until this runs every MAD of the port goes to AL.
fn start_steering(filter: &FilterIbal, ca_port: u8, host_port: u8) {
    let Some(slot) = filter.hook_slot else {
        return;
    };
    if let Some(entry) = usize::from(ca_port)
        .checked_sub(1)
        .and_then(|i| filter.steered_host_port.get(i))
    {
        entry.store(host_port, Ordering::Release);
    }
    filter.steered_ports.fetch_add(1, Ordering::AcqRel);
    if !filter.steering_set.load(Ordering::Acquire) {
        let context = core::ptr::from_ref(filter).expose_provenance();
        let set = verbs_hook::set_steering(slot, decide, context);
        filter.steering_set.store(set, Ordering::Release);
    }
    update_steering_installed(filter);
}

/// Ends a port's steering (its removal): the decision answers "AL's" for it from now on.
fn stop_steering(filter: &FilterIbal, ca_port: u8) {
    if let Some(entry) = usize::from(ca_port)
        .checked_sub(1)
        .and_then(|i| filter.steered_host_port.get(i))
    {
        entry.store(0, Ordering::Release);
    }
    let _previous = filter
        .steered_ports
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    update_steering_installed(filter);
}

/// IB_PNP_PORT_ADD of another CA's port: the host counts its CA (one no ibcm filter can
/// bind turns the host's CM verdict to AL's and is named in the System log,
/// `ibcm_lifecycle::HostCm`), and the port is accepted with the marker context, so that
/// its removal comes back marked. Without room to follow it, it is declined (AL then
/// drops the port's context record and reports nothing more of it).
///
/// # Safety
///
/// `record` is AL's record of the callback.
unsafe fn foreign_port_added(
    binding: &Binding,
    record: *mut IbPnpPortRec,
    ca_guid: u64,
) -> IbApiStatus {
    // SAFETY: (I115) the record is valid for the callback.
    let port_guid = unsafe { (*record).pnp_rec.guid };
    let followed = binding.foreign.with(|foreign| {
        if foreign.try_reserve(1).is_ok() {
            foreign.push((port_guid, ca_guid));
            true
        } else {
            false
        }
    });
    if !followed {
        return IB_NOT_FOUND;
    }
    let host = binding.host();
    host.verdict(|v| v.ca_reported(ca_guid));
    event_log::hcas_without_ibcm(host);
    // SAFETY: (I116) as I115; AL keeps the context for the port's later events.
    unsafe { (*record).pnp_rec.context = foreign_port_context() };
    IB_SUCCESS
}

/// An event of another CA's port (its context is the marker): its removal withdraws the
/// host's report of its CA; link and attribute changes are not ibcm's.
fn foreign_port_event(binding: &Binding, event: u32, port_guid: u64) -> IbApiStatus {
    if event == IB_PNP_PORT_REMOVE {
        let removed = binding.foreign.with(|foreign| {
            let at = foreign.iter().position(|(port, _)| *port == port_guid)?;
            Some(foreign.swap_remove(at).1)
        });
        if let Some(ca_guid) = removed {
            binding.host().verdict(|v| v.ca_report_withdrawn(ca_guid));
        }
    }
    IB_SUCCESS
}

/// IB_PNP_PORT_REMOVE: unpublish the port (its host number translates no more), wait for
/// its sends, tell the dispatch layer (its connections get DEVICE_REMOVAL), destroy its
/// QP (and MAD service); the port is freed when AL reports the QP destroyed.
///
/// # Safety
///
/// `port` is null or a port `port_added` stored as this event's context.
unsafe fn port_removed(binding: &Binding, port: *mut Port) -> IbApiStatus {
    if port.is_null() {
        return IB_SUCCESS;
    }
    let known = binding.ports.with(|ports| {
        let before = ports.len();
        ports.retain(|p| p.as_ptr() != port);
        ports.len() != before
    });
    if !known {
        // Already taken by `unbind` (which unpublishes and frees it).
        return IB_SUCCESS;
    }
    // SAFETY: (I62) the port is live until its QP's destroy callback.
    let port_ref = unsafe { &*port };
    unpublish(binding.host(), port_ref);
    let filter = binding.filter();
    if port_ref.private.is_some() {
        stop_steering(filter, port_ref.ca_port);
    } else {
        filter.routed_ports.fetch_sub(1, Ordering::AcqRel);
    }
    // SAFETY: (I63) as I62.
    let qp = unsafe { (*port).qp };
    // SAFETY: (I64) the QP is the port's; asynchronous destruction (WinOF's CM does the
    // same from its PnP callback) calls `port_destroyed` when callbacks are over.
    let _destroyed = unsafe { (binding.al.destroy_qp)(qp, Some(port_destroyed)) };
    IB_SUCCESS
}

/// IB_PNP_PORT_DOWN / IB_PNP_PORT_ACTIVE (PASSIVE_LEVEL): the dispatch layer stops
/// sending from a port that went down and refuses connects from it; its handshakes run
/// out their retries and its established connections are told only if it is still down
/// when their QPs would have given up (the engine's link.rs); ACTIVE lifts it. HCA
/// removal sends DOWN then REMOVE (al_pnp.c:1022-1036): the DOWN ends nothing, the
/// REMOVE gives each connection its one DEVICE_REMOVAL.
///
/// # Safety
/// `port` is null or a port `port_added` stored for this binding, live for the call.
unsafe fn port_link(binding: &Binding, port: *mut Port, up: bool) {
    if port.is_null() {
        return;
    }
    // As `port_removed`: a port `unbind` already took (an event racing UnpublishPorts)
    // has no host number any more, and must not mark one down.
    let known = binding
        .ports
        .with(|ports| ports.iter().any(|p| p.as_ptr() == port));
    if !known {
        return;
    }
    // SAFETY: (I110) per the contract; a member of the binding's ports.
    let port = unsafe { &*port };
    if let Some(cm) = binding.host().cm() {
        if up {
            cm.device.port_up(port.host.number);
        } else {
            cm.device.port_down(port.host.number);
        }
    }
}

/// P_Key or GID table change, or a port event whose record carries the port's attributes
/// as they are now (INIT, ARMED, ACTIVE, LID change): refresh the port's translation
/// tables.
///
/// # Safety
///
/// As [`port_removed`]; `record` is AL's port record of this callback.
unsafe fn port_changed(record: *mut IbPnpPortRec, port: *mut Port) {
    // SAFETY: (I65) per the contract.
    let attr = unsafe { (*record).p_port_attr };
    if port.is_null() || attr.is_null() {
        return;
    }
    // SAFETY: (I66) AL's attributes, valid for the callback.
    let attr = unsafe { &*attr };
    // SAFETY: (I100) as I66.
    let Some(fresh) = (unsafe { attributes_of(attr) }) else {
        return;
    };
    // SAFETY: (I67) the port is live (its QP exists: this is one of its events).
    let port = unsafe { &*port };
    let stale = port.host.attributes.with(|a| core::mem::replace(a, fresh));
    drop(stale);
}

/// `ib_pfn_destroy_cb_t` of a port's QP: frees the port.
unsafe extern "C" fn port_destroyed(context: *mut c_void) {
    // SAFETY: (I68) the QP context is the port from Box::into_raw in `port_added`; AL calls
    // this once, after the QP's last callback.
    drop(unsafe { alloc::boxed::Box::from_raw(context.cast::<Port>()) });
}

/// 32 bytes from the system RNG for the engine's seed (PASSIVE_LEVEL).
fn random_seed() -> Option<[u8; 32]> {
    /// `BCRYPT_USE_SYSTEM_PREFERRED_RNG` (bcrypt.h): no algorithm handle, PASSIVE_LEVEL only.
    const BCRYPT_USE_SYSTEM_PREFERRED_RNG: u32 = 0x0000_0002;
    // Kernel-mode callers link cng.lib (BCryptGenRandom documentation).
    #[link(name = "cng")]
    unsafe extern "system" {
        fn BCryptGenRandom(algorithm: PVOID, buffer: *mut u8, length: u32, flags: u32) -> NTSTATUS;
    }
    let mut seed = [0u8; 32];
    // SAFETY: (I69) PASSIVE_LEVEL (AL's PnP thread); the buffer is valid for 32 bytes.
    let status = unsafe {
        BCryptGenRandom(
            core::ptr::null_mut(),
            seed.as_mut_ptr(),
            32,
            BCRYPT_USE_SYSTEM_PREFERRED_RNG,
        )
    };
    NT_SUCCESS(status).then_some(seed)
}

// ---------------------------------------------------------------------------------------
// MADs (DISPATCH_LEVEL)
// ---------------------------------------------------------------------------------------

/// Receive completion: copy, return the element, queue for the DPC.
unsafe extern "C" fn mad_received(
    _h_mad_svc: Handle,
    context: *mut c_void,
    element: *mut IbMadElement,
) {
    // SAFETY: (I70) the service context is the port, alive while its QP has callbacks.
    let port = unsafe { &*context.cast::<Port>() };
    let binding = port.binding();
    let host = binding.host();
    // SAFETY: (I71) AL's received element, ours until put back below.
    let e = unsafe { &*element };
    let mut mad = [0u8; MAD_SIZE];
    let len = (e.size as usize).min(MAD_SIZE);
    if len > 0 && !e.p_mad_buf.is_null() {
        // SAFETY: (I72) the element's buffer holds `size` bytes of MAD.
        let bytes = unsafe { core::slice::from_raw_parts(e.p_mad_buf.cast::<u8>(), len) };
        mad[..len].copy_from_slice(bytes);
    }
    // A steered port's `{M, Get}` service: a MAD with `M` is ibcm's only if the hook
    // remapped it (its ticket), and gets Send back; a Get passes; anything else (`M` sent
    // on the wire) is dropped (`ibcm_qp1_hook::restore` decides).
    let restored = port.private.is_none_or(|m| {
        let from_hook = binding
            .filter()
            .hook_slot
            .is_some_and(|slot| verbs_hook::claim(slot, port.ca_port, &mad[..len]));
        ibcm_qp1_hook::restore(&mut mad[..len], m, from_hook).is_ok()
    });
    let gid = if e.grh_valid != 0 && !e.p_grh.is_null() {
        // SAFETY: (I73) with `grh_valid` the element's GRH buffer holds the received GRH
        // (packed: read unaligned).
        let grh = unsafe { core::ptr::read_unaligned(e.p_grh) };
        grh.src_gid
    } else {
        [0; 16]
    };
    let pkey = port
        .host
        .attributes
        .with(|a| a.pkeys.get(usize::from(e.pkey_index)).copied());
    let source = pkey.map(|pkey| MadAddress {
        port: port.host.number,
        lid: u16::from_be(e.remote_lid),
        gid,
        grh: e.grh_valid != 0,
        sl: e.remote_sl,
        pkey,
    });
    // SAFETY: (I74) the element came from AL in this callback and is not used afterwards.
    unsafe { binding.al.put_mad(element, line!()) };
    if !restored {
        host.refused_receives.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let queued = source.is_some_and(|source| host.ring.push(source, &mad));
    if !queued {
        host.dropped_receives.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // SAFETY: (I75) the DPC is a live child of the control device (which outlives every
    // binding); callable at DISPATCH_LEVEL.
    let _newly_queued =
        unsafe { wdk_sys::call_unsafe_wdf_function_binding!(WdfDpcEnqueue, host.receive_dpc) };
}

/// Send completion: the element goes back to its pool (the CM retries on its own timers).
unsafe extern "C" fn mad_sent(
    _h_mad_svc: Handle,
    context: *mut c_void,
    element: *mut IbMadElement,
) {
    // SAFETY: (I76) as I70; a parked port lives until this, its last send, returns.
    let port = unsafe { &*context.cast::<Port>() };
    // SAFETY: (I77) the completed send element is returned to this callback's owner.
    unsafe { port.binding().al.put_mad(element, line!()) };
    if port.posted.fetch_sub(1, Ordering::AcqRel) == PARKED | 1 {
        // SAFETY: (I109) the port's last send of a parked port: nothing else refers to it.
        unsafe { free_parked(context.cast::<Port>()) };
    }
}

/// Frees a parked port whose last send returned, then its binding if it was the last
/// parked port of a binding `unbind` is done with.
///
/// # Safety
///
/// `port` came from `Box::into_raw` in `port_added`, was parked by `unbind`, and nothing
/// refers to it any more.
unsafe fn free_parked(port: *mut Port) {
    // SAFETY: (I110) per the contract.
    let port = unsafe { alloc::boxed::Box::from_raw(port) };
    let binding = port.binding;
    drop(port);
    // SAFETY: (I111) a binding with a parked port is not freed before that port.
    if unsafe { binding.as_ref() }
        .parked
        .fetch_sub(1, Ordering::AcqRel)
        == PARKED | 1
    {
        // SAFETY: (I112) `unbind` is done with it and this was its last parked port.
        drop(unsafe { alloc::boxed::Box::from_raw(binding.as_ptr()) });
    }
}

/// `Platform::send`: one MAD on QP1 of the host port `transmit.dest.port`. Drops the MAD
/// (and counts it) when there is no such port, no such P_Key or no MAD element: the
/// engine's retries cover a lost MAD.
pub fn send(host: &Host, transmit: &Transmit) {
    let port = host.ports.with(|t| {
        // A published host port is the first field of a live `Port` (`#[repr(C)]`,
        // published by `port_added` as `port_ptr.cast::<HostPort>()`).
        t.port(transmit.dest.port)
            .map(NonNull::cast::<Port>)
            .filter(|p| {
                // SAFETY: (I85) published ports are live (unpublishing precedes freeing).
                let port_sends = unsafe { p.as_ref() }.sends.get();
                // SAFETY: (I101) acquiring under the table lock means the port cannot be
                // unpublished and waited for in between; IRQL <= DISPATCH_LEVEL.
                let acquired = unsafe { ExAcquireRundownProtection(port_sends) };
                acquired != 0
            })
    });
    let Some(port) = port else {
        host.dropped_sends.fetch_add(1, Ordering::Relaxed);
        return;
    };
    // SAFETY: (I87) protected by the port's rundown protection acquired above.
    let port_ref = unsafe { port.as_ref() };
    let sent = post(port_ref.binding(), port_ref, transmit);
    // SAFETY: (I88) acquired in the table lookup above.
    unsafe { ExReleaseRundownProtection(port_ref.sends.get()) };
    if !sent {
        host.dropped_sends.fetch_add(1, Ordering::Relaxed);
    }
}

/// `ib_get_mad`, address, `ib_send_mad`.
fn post(binding: &Binding, port: &Port, transmit: &Transmit) -> bool {
    let dest = &transmit.dest;
    let (pkey_index, source_gid) = port.host.attributes.with(|a| {
        // The exact P_Key, as WinOF's CM (`__get_pkey_index`).
        let index = a.pkeys.iter().position(|pkey| *pkey == dest.pkey);
        (index, a.source_gid())
    });
    let Some(pkey_index) = pkey_index.and_then(|i| u16::try_from(i).ok()) else {
        return false;
    };
    let mut element: *mut IbMadElement = core::ptr::null_mut();
    // SAFETY: (I89) the pool key is the port's QP1 alias pool, live under the port's
    // protection; valid out pointer; callable at DISPATCH_LEVEL.
    let status = unsafe {
        (binding.al.get_mad)(
            c"ibal.rs".as_ptr().cast_mut(),
            line!() as i32,
            port.pool_key,
            MAD_SIZE,
            &raw mut element,
        )
    };
    if status != IB_SUCCESS || element.is_null() {
        return false;
    }
    // SAFETY: (I90) AL handed this element to us; nothing else refers to it until it is
    // sent or put back.
    let e = unsafe { &mut *element };
    if e.p_mad_buf.is_null() || (dest.grh && e.p_grh.is_null()) {
        // SAFETY: (I91) ours, unused.
        unsafe { binding.al.put_mad(element, line!()) };
        return false;
    }
    // SAFETY: (I92) the element's buffer was allocated for MAD_SIZE bytes (get_mad above).
    unsafe {
        core::ptr::copy_nonoverlapping(transmit.mad.as_ptr(), e.p_mad_buf.cast::<u8>(), MAD_SIZE);
    }
    // The address, as WinOF's `__format_mad_av` fills it: AL builds the address vector.
    e.context1 = core::ptr::null();
    e.context2 = core::ptr::null();
    e.remote_qp = IB_QP1;
    e.remote_qkey = IB_QP1_WELL_KNOWN_Q_KEY;
    e.h_av = core::ptr::null_mut();
    e.send_opt = IB_SEND_OPT_SIGNALED;
    e.resp_expected = 0;
    e.timeout_ms = 0;
    e.retry_cnt = 0;
    e.rmpp_version = 0;
    e.remote_lid = dest.lid.to_be();
    e.remote_sl = dest.sl;
    e.path_bits = 0;
    e.pkey_index = pkey_index;
    e.grh_valid = i32::from(dest.grh);
    if dest.grh {
        // IP version 6; the address carries no traffic class, flow label or hop limit:
        // 0, 0 and 255 (what Linux uses for a GRH built from a received one).
        let grh = IbGrh {
            ver_class_flow: (6u32 << 28).to_be(),
            resv1: 0,
            resv2: 0,
            hop_limit: 0xff,
            src_gid: source_gid,
            dest_gid: dest.gid,
        };
        // SAFETY: (I93) the element's GRH buffer (checked non-null) holds an ib_grh_t.
        unsafe { core::ptr::write_unaligned(e.p_grh, grh) };
    }
    let mad_svc = port.mad_svc.load(Ordering::Acquire);
    // Counted before the post: its completion may run before `send_mad` returns.
    port.posted.fetch_add(1, Ordering::AcqRel);
    // SAFETY: (I94) the MAD service is the port's, live under its protection; the element
    // is filled in; callable at DISPATCH_LEVEL.
    let status = unsafe { (binding.al.send_mad)(mad_svc, element, core::ptr::null_mut()) };
    if status != IB_SUCCESS {
        // Not parked: `unbind` waits for this send path (the port's rundown) first.
        port.posted.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: (I95) not sent, so still ours.
        unsafe { binding.al.put_mad(element, line!()) };
        return false;
    }
    true
}

/// A live port as STATUS reports it (`status.rs`; under the host port table's lock, which
/// keeps the port alive).
pub fn port_status(port: NonNull<HostPort>) -> ibcm_ioctl::PortStatus {
    use ibcm_ioctl::status_report::{ROUTE_ORDINARY, ROUTE_STEERING};
    // SAFETY: (I108) the caller holds the port table's lock: a published port is not
    // freed before it is unpublished under that lock, and a published host port is the
    // first field of a live `Port` (`#[repr(C)]`, published by `port_added`).
    let port = unsafe { port.cast::<Port>().as_ref() };
    let (route, private_method) = match port.private {
        None => (ROUTE_ORDINARY, 0),
        Some(m) => (ROUTE_STEERING, m.get()),
    };
    ibcm_ioctl::PortStatus {
        ca_guid: u64::from_be(port.binding().ca_guid),
        ca_port: port.ca_port,
        host_port: port.host.number,
        route,
        private_method,
        reserved: 0,
    }
}
