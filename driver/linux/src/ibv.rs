//! libibverbs' C ABI, as much of it as [`verbs`](crate::verbs) and
//! [`port_events`](crate::port_events) call: about 30 functions and the structures they
//! take, written here instead of generated, and libibverbs itself loaded when a device is
//! first opened (`dlopen("libibverbs.so.1")`, each function by its symbol version, as
//! NCCL loads it).
//!
//! Why not a bindings crate: rdma-sys runs bindgen (libclang) over the installed
//! rdma-core headers at build time and links librdmacm, none of whose functions ibcm
//! calls; `sideway` builds a vendored rdma-core stub with cmake and clang. Either makes
//! a C toolchain and rdma-core's -dev packages a condition of building the CLI, and the
//! binary then needs libibverbs.so.1 to start at all, even for the simulated fabric.
//! Here nothing is needed to build, and libibverbs (Debian's `libibverbs1`) only to open
//! a device.
//!
//! The layouts are those of rdma-core's `<infiniband/verbs.h>` (stable ABI since
//! libibverbs 1.1, the `IBVERBS_1.1` symbol versions named below). Structures that
//! libibverbs allocates and ibcm only reads (`ibv_context`, `ibv_qp`, `ibv_cq`) are
//! declared up to the last field read. C enums are plain integers and their values
//! constants: a value the library returns that no constant names stays a value. The
//! `verbs_h_layout` test compiles a C program against the installed header (when
//! libibverbs-dev is there; CI installs it) and compares every size, offset and
//! constant.
//!
//! Four calls of verbs.h are inline functions that dispatch through the context's
//! operation table (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`): [`post_send`], [`post_recv`], [`poll_cq`] and
//! [`req_notify_cq`] do the same. `ibv_query_port` is inline too; the exported
//! `IBVERBS_1.1` function it falls back to fills the fields read here (state, MTUs).
#![allow(non_camel_case_types)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::io;
use std::sync::OnceLock;

/// A device of the list (opaque).
#[repr(C)]
pub(crate) struct ibv_device {
    _opaque: [u8; 0],
}

/// A protection domain (opaque).
#[repr(C)]
pub(crate) struct ibv_pd {
    _opaque: [u8; 0],
}

/// An address handle (opaque): where a UD send goes.
#[repr(C)]
pub(crate) struct ibv_ah {
    _opaque: [u8; 0],
}

/// A shared receive queue (opaque; never created here).
#[repr(C)]
pub(crate) struct ibv_srq {
    _opaque: [u8; 0],
}

/// `union ibv_gid`: 16 bytes, 8-aligned (its other arm is two `__be64`).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union ibv_gid {
    pub raw: [u8; 16],
    global: [u64; 2],
}

/// `struct ibv_context_ops`: the provider's operation table. Only the four data-path
/// operations verbs.h calls inline are named; the other slots keep their places.
#[repr(C)]
pub(crate) struct ibv_context_ops {
    _before_poll_cq: [*mut c_void; 11],
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    _before_post_send: [*mut c_void; 12],
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    _after_post_recv: [*mut c_void; 5],
}

/// `struct ibv_context`, up to `async_fd` (libibverbs allocates it; the rest is its own).
#[repr(C)]
pub(crate) struct ibv_context {
    device: *mut ibv_device,
    pub ops: ibv_context_ops,
    cmd_fd: c_int,
    pub async_fd: c_int,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub(crate) struct ibv_comp_channel {
    context: *mut ibv_context,
    pub fd: c_int,
    refcnt: c_int,
}

/// `struct ibv_cq`, up to `cqe`.
#[repr(C)]
pub(crate) struct ibv_cq {
    pub context: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
    handle: u32,
    cqe: c_int,
}

/// `struct ibv_qp`, up to `qp_type`.
#[repr(C)]
pub(crate) struct ibv_qp {
    pub context: *mut ibv_context,
    qp_context: *mut c_void,
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    handle: u32,
    pub qp_num: u32,
    state: u32,
    qp_type: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub(crate) struct ibv_mr {
    context: *mut ibv_context,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_device_attr`.
#[repr(C)]
pub(crate) struct ibv_device_attr {
    fw_ver: [c_char; 64],
    node_guid: u64,
    sys_image_guid: u64,
    max_mr_size: u64,
    page_size_cap: u64,
    vendor_id: u32,
    vendor_part_id: u32,
    hw_ver: u32,
    max_qp: c_int,
    pub max_qp_wr: c_int,
    device_cap_flags: c_uint,
    max_sge: c_int,
    max_sge_rd: c_int,
    max_cq: c_int,
    pub max_cqe: c_int,
    max_mr: c_int,
    max_pd: c_int,
    max_qp_rd_atom: c_int,
    max_ee_rd_atom: c_int,
    max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    max_ee_init_rd_atom: c_int,
    atomic_cap: u32,
    max_ee: c_int,
    max_rdd: c_int,
    max_mw: c_int,
    max_raw_ipv6_qp: c_int,
    max_raw_ethy_qp: c_int,
    max_mcast_grp: c_int,
    max_mcast_qp_attach: c_int,
    max_total_mcast_qp_attach: c_int,
    max_ah: c_int,
    max_fmr: c_int,
    max_map_per_fmr: c_int,
    max_srq: c_int,
    max_srq_wr: c_int,
    max_srq_sge: c_int,
    max_pkeys: u16,
    local_ca_ack_delay: u8,
    phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (the exported `ibv_query_port` fills its older prefix).
#[repr(C)]
pub(crate) struct ibv_port_attr {
    pub state: u32,
    max_mtu: u32,
    pub active_mtu: u32,
    gid_tbl_len: c_int,
    port_cap_flags: u32,
    max_msg_sz: u32,
    bad_pkey_cntr: u32,
    qkey_viol_cntr: u32,
    pkey_tbl_len: u16,
    lid: u16,
    sm_lid: u16,
    lmc: u8,
    max_vl_num: u8,
    sm_sl: u8,
    subnet_timeout: u8,
    init_type_reply: u8,
    active_width: u8,
    active_speed: u8,
    phys_state: u8,
    link_layer: u8,
    flags: u8,
    port_cap_flags2: u16,
}

/// `struct ibv_gid_entry`.
#[repr(C)]
pub(crate) struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    ndev_ifindex: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
pub(crate) struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    max_inline_data: u32,
}

/// `struct ibv_global_route`.
#[repr(C)]
pub(crate) struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
pub(crate) struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
pub(crate) struct ibv_qp_attr {
    pub qp_state: u32,
    cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    rate_limit: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub(crate) struct ibv_qp_init_attr {
    qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    sq_sig_all: c_int,
}

/// `struct ibv_sge`.
#[repr(C)]
pub(crate) struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `rdma` arm of `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_rdma_wr {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// The `ud` arm of `ibv_send_wr.wr`: a UD send's destination.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_ud_wr {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// `ibv_send_wr.wr`: the `rdma` and `ud` arms are used; `atomic` is the largest (32
/// bytes).
#[repr(C)]
pub(crate) union ibv_send_wr_wr {
    pub rdma: ibv_rdma_wr,
    pub ud: ibv_ud_wr,
    atomic: [u64; 4],
}

/// `struct ibv_send_wr`. The XRC arm and the memory-window/TSO union at its end are
/// never used here: kept as their sizes.
#[repr(C)]
pub(crate) struct ibv_send_wr {
    pub wr_id: u64,
    next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    /// `__be32`: in network order.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    xrc_remote_srqn: u32,
    bind_mw_or_tso: [u64; 6],
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub(crate) struct ibv_recv_wr {
    pub wr_id: u64,
    next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    vendor_err: u32,
    pub byte_len: u32,
    /// `__be32` (the union with `invalidated_rkey`): in network order.
    pub imm_data: u32,
    qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

/// `struct ibv_grh`: the 40 bytes a UD receive gets before the payload (on RoCEv2 over
/// IPv4, the IPv4 header in its last 20 bytes).
#[repr(C)]
pub(crate) struct ibv_grh {
    version_tclass_flow: u32,
    paylen: u16,
    next_hdr: u8,
    hop_limit: u8,
    sgid: ibv_gid,
    dgid: ibv_gid,
}

/// `ibv_async_event.element`: which object the event is about.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union ibv_async_event_element {
    object: *mut c_void,
    pub port_num: c_int,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub(crate) struct ibv_async_event {
    pub element: ibv_async_event_element,
    pub event_type: u32,
}

/// A zeroed value of one of the plain-data structures above, as verbs.h's callers make
/// them (`= {}`): integers, raw pointers, unions of those and `Option`s of function
/// pointers, for all of which all-zero bytes are a valid value (0, null, `None`).
pub(crate) fn zeroed<T: PlainData>() -> T {
    // SAFETY: `PlainData` is implemented only for the structures of this module, whose
    // fields are all integers, raw pointers, unions of those or `Option<fn>`.
    unsafe { std::mem::zeroed() }
}

/// The structures [`zeroed`] may make.
pub(crate) trait PlainData {}
impl PlainData for ibv_device_attr {}
impl PlainData for ibv_port_attr {}
impl PlainData for ibv_gid_entry {}
impl PlainData for ibv_qp_attr {}
impl PlainData for ibv_qp_init_attr {}
impl PlainData for ibv_send_wr {}
impl PlainData for ibv_recv_wr {}
impl PlainData for ibv_wc {}
impl PlainData for ibv_async_event {}
impl PlainData for ibv_ah_attr {}
impl<T: PlainData, const N: usize> PlainData for [T; N] {}

// enum ibv_port_state
pub(crate) const IBV_PORT_ACTIVE: u32 = 4;
// enum ibv_gid_type
pub(crate) const IBV_GID_TYPE_ROCE_V2: u32 = 2;
// enum ibv_access_flags
pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub(crate) const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
// enum ibv_qp_type
pub(crate) const IBV_QPT_RC: u32 = 2;
pub(crate) const IBV_QPT_UD: u32 = 4;
// enum ibv_qp_state
pub(crate) const IBV_QPS_RESET: u32 = 0;
pub(crate) const IBV_QPS_INIT: u32 = 1;
pub(crate) const IBV_QPS_RTR: u32 = 2;
pub(crate) const IBV_QPS_RTS: u32 = 3;
pub(crate) const IBV_QPS_ERR: u32 = 6;
// enum ibv_mig_state
pub(crate) const IBV_MIG_MIGRATED: u32 = 0;
pub(crate) const IBV_MIG_REARM: u32 = 1;
// enum ibv_wr_opcode
pub(crate) const IBV_WR_RDMA_WRITE: u32 = 0;
pub(crate) const IBV_WR_SEND: u32 = 2;
pub(crate) const IBV_WR_SEND_WITH_IMM: u32 = 3;
pub(crate) const IBV_WR_RDMA_READ: u32 = 4;
// enum ibv_send_flags
pub(crate) const IBV_SEND_SIGNALED: c_uint = 1 << 1;
// enum ibv_wc_flags
pub(crate) const IBV_WC_GRH: c_uint = 1 << 0;
pub(crate) const IBV_WC_WITH_IMM: c_uint = 1 << 1;
// enum ibv_wc_opcode
pub(crate) const IBV_WC_SEND: u32 = 0;
pub(crate) const IBV_WC_RECV: u32 = 128;
// enum ibv_event_type
pub(crate) const IBV_EVENT_DEVICE_FATAL: u32 = 8;
pub(crate) const IBV_EVENT_PORT_ACTIVE: u32 = 9;
pub(crate) const IBV_EVENT_PORT_ERR: u32 = 10;
pub(crate) const IBV_EVENT_PKEY_CHANGE: u32 = 12;
pub(crate) const IBV_EVENT_GID_CHANGE: u32 = 18;
// enum ibv_qp_attr_mask
pub(crate) const IBV_QP_STATE: c_int = 1 << 0;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_QKEY: c_int = 1 << 6;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub(crate) const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub(crate) const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub(crate) const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub(crate) const IBV_QP_PATH_MIG_STATE: c_int = 1 << 18;
pub(crate) const IBV_QP_CAP: c_int = 1 << 19;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;

/// Declares the exported functions: each one's symbol version, name and C signature
/// (verbs.h), as a field of [`Verbs`] filled by [`Verbs::load`].
macro_rules! exports {
    ($( $version:literal $name:ident ( $($arg:ty),* ) $(-> $ret:ty)?; )*) => {
        /// libibverbs' exported functions, resolved once.
        pub(crate) struct Verbs {
            $( pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
        }

        impl Verbs {
            /// Resolves every function in `lib` (a `dlopen` handle) by name and version.
            fn load(lib: *mut c_void) -> Result<Self, String> {
                Ok(Self {
                    $( $name: {
                        let sym = symbol(
                            lib,
                            concat!(stringify!($name), "\0"),
                            concat!($version, "\0"),
                        )?;
                        // SAFETY: `sym` is the address of the function of this name and
                        // version in libibverbs, whose C signature (verbs.h) is the
                        // field's type.
                        unsafe {
                            std::mem::transmute::<
                                *mut c_void,
                                unsafe extern "C" fn($($arg),*) $(-> $ret)?,
                            >(sym)
                        }
                    }, )*
                })
            }
        }
    };
}

exports! {
    "IBVERBS_1.1" ibv_get_device_list(*mut c_int) -> *mut *mut ibv_device;
    "IBVERBS_1.1" ibv_free_device_list(*mut *mut ibv_device);
    "IBVERBS_1.1" ibv_get_device_name(*mut ibv_device) -> *const c_char;
    "IBVERBS_1.1" ibv_open_device(*mut ibv_device) -> *mut ibv_context;
    "IBVERBS_1.1" ibv_close_device(*mut ibv_context) -> c_int;
    "IBVERBS_1.1" ibv_get_async_event(*mut ibv_context, *mut ibv_async_event) -> c_int;
    "IBVERBS_1.1" ibv_ack_async_event(*mut ibv_async_event);
    "IBVERBS_1.1" ibv_query_device(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    "IBVERBS_1.1" ibv_query_port(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
    "IBVERBS_1.1" ibv_query_pkey(*mut ibv_context, u8, c_int, *mut u16) -> c_int;
    "IBVERBS_1.11" _ibv_query_gid_table(*mut ibv_context, *mut ibv_gid_entry, usize, u32, usize) -> isize;
    "IBVERBS_1.1" ibv_alloc_pd(*mut ibv_context) -> *mut ibv_pd;
    "IBVERBS_1.1" ibv_dealloc_pd(*mut ibv_pd) -> c_int;
    "IBVERBS_1.1" ibv_reg_mr(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    "IBVERBS_1.1" ibv_dereg_mr(*mut ibv_mr) -> c_int;
    "IBVERBS_1.0" ibv_create_comp_channel(*mut ibv_context) -> *mut ibv_comp_channel;
    "IBVERBS_1.0" ibv_destroy_comp_channel(*mut ibv_comp_channel) -> c_int;
    "IBVERBS_1.1" ibv_create_cq(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
    "IBVERBS_1.1" ibv_destroy_cq(*mut ibv_cq) -> c_int;
    "IBVERBS_1.1" ibv_get_cq_event(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
    "IBVERBS_1.1" ibv_ack_cq_events(*mut ibv_cq, c_uint);
    "IBVERBS_1.1" ibv_create_qp(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    "IBVERBS_1.1" ibv_query_qp(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
    "IBVERBS_1.1" ibv_modify_qp(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    "IBVERBS_1.1" ibv_destroy_qp(*mut ibv_qp) -> c_int;
    "IBVERBS_1.1" ibv_create_ah(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah;
    "IBVERBS_1.1" ibv_create_ah_from_wc(*mut ibv_pd, *mut ibv_wc, *mut ibv_grh, u8) -> *mut ibv_ah;
    "IBVERBS_1.1" ibv_destroy_ah(*mut ibv_ah) -> c_int;
    "IBVERBS_1.1" ibv_wc_status_str(u32) -> *const c_char;
}

/// The runtime library's file name (the soname of libibverbs 1.x, Debian's `libibverbs1`).
const LIBRARY: &CStr = c"libibverbs.so.1";

/// One function of `lib` by name and symbol version (`dlvsym`).
fn symbol(
    lib: *mut c_void,
    name: &'static str,
    version: &'static str,
) -> Result<*mut c_void, String> {
    let (Ok(n), Ok(v)) = (
        CStr::from_bytes_with_nul(name.as_bytes()),
        CStr::from_bytes_with_nul(version.as_bytes()),
    ) else {
        return Err(format!("{name}: not a C string"));
    };
    // SAFETY: `lib` is a handle dlopen returned and never closed; both strings are
    // NUL-terminated.
    let sym = unsafe { libc::dlvsym(lib, n.as_ptr(), v.as_ptr()) };
    if sym.is_null() {
        return Err(format!(
            "{} has no {}@{}: rdma-core 30 or later is needed",
            LIBRARY.to_string_lossy(),
            n.to_string_lossy(),
            v.to_string_lossy()
        ));
    }
    Ok(sym)
}

/// libibverbs' functions, loaded on first use and kept for the life of the process (the
/// library is never unloaded: its providers hold threads and state of their own).
pub(crate) fn verbs() -> io::Result<&'static Verbs> {
    static VERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();
    VERBS
        .get_or_init(|| {
            // RTLD_LAZY, as a program linked against libibverbs loads it (rping): libnl's
            // 700 PLT entries (it is not linked with -z now, unlike libibverbs) are bound
            // when called, not all at once here (ld.so's relocations for a client: 1,200
            // with RTLD_NOW, 590 lazily). Every function used is looked up below (dlvsym),
            // so a missing one still fails here.
            // SAFETY: a NUL-terminated file name; libibverbs' initialisers are safe to run
            // on any thread.
            let lib = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_LAZY) };
            if lib.is_null() {
                return Err(format!(
                    "cannot load {}: install rdma-core's libibverbs (Debian: apt-get install \
                     libibverbs1 ibverbs-providers)",
                    LIBRARY.to_string_lossy()
                ));
            }
            Verbs::load(lib)
        })
        .as_ref()
        .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e.clone()))
}

/// The operation table of `context`.
///
/// # Safety
/// `context` is an open context.
unsafe fn ops<'a>(context: *mut ibv_context) -> &'a ibv_context_ops {
    // SAFETY: the caller's: an open context, alive while its objects are.
    unsafe { &(*context).ops }
}

/// verbs.h's inline `ibv_poll_cq`.
///
/// # Safety
/// `cq` is alive; `wc` holds `n` entries.
pub(crate) unsafe fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is alive (the caller's); its context outlives it.
    let context = unsafe { (*cq).context };
    // SAFETY: the CQ's context is open.
    match unsafe { ops(context) }.poll_cq {
        // SAFETY: the provider's own operation, with the caller's valid arguments.
        Some(f) => unsafe { f(cq, n, wc) },
        None => -libc::EOPNOTSUPP,
    }
}

/// verbs.h's inline `ibv_req_notify_cq`.
///
/// # Safety
/// `cq` is alive.
pub(crate) unsafe fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: `cq` is alive (the caller's); its context outlives it.
    let context = unsafe { (*cq).context };
    // SAFETY: the CQ's context is open.
    match unsafe { ops(context) }.req_notify_cq {
        // SAFETY: the provider's own operation, with the caller's valid arguments.
        Some(f) => unsafe { f(cq, solicited_only) },
        None => libc::EOPNOTSUPP,
    }
}

/// verbs.h's inline `ibv_post_send`.
///
/// # Safety
/// `qp` is alive; `wr` and its scatter list are valid for the call.
pub(crate) unsafe fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: `qp` is alive (the caller's); its context outlives it.
    let context = unsafe { (*qp).context };
    // SAFETY: the QP's context is open.
    match unsafe { ops(context) }.post_send {
        // SAFETY: the provider's own operation, with the caller's valid arguments.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// verbs.h's inline `ibv_post_recv`.
///
/// # Safety
/// `qp` is alive; `wr` and its scatter list are valid for the call.
pub(crate) unsafe fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is alive (the caller's); its context outlives it.
    let context = unsafe { (*qp).context };
    // SAFETY: the QP's context is open.
    match unsafe { ops(context) }.post_recv {
        // SAFETY: the provider's own operation, with the caller's valid arguments.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// (what, the value here): each compared with the C compiler's over verbs.h.
    fn layout() -> Vec<(String, String, u64)> {
        let mut v: Vec<(String, String, u64)> = Vec::new();
        macro_rules! size {
            ($($t:ident),*) => {$(
                v.push((
                    format!("sizeof {}", stringify!($t)),
                    format!("sizeof(struct {})", stringify!($t)),
                    size_of::<$t>() as u64,
                ));
            )*};
        }
        macro_rules! offset {
            ($t:ident: $($f:ident),*) => {$(
                v.push((
                    format!("offsetof {}.{}", stringify!($t), stringify!($f)),
                    format!("offsetof(struct {}, {})", stringify!($t), stringify!($f)),
                    offset_of!($t, $f) as u64,
                ));
            )*};
        }
        macro_rules! constant {
            ($($c:ident),*) => {$(
                v.push((stringify!($c).to_string(), stringify!($c).to_string(), $c as u64));
            )*};
        }
        size!(
            ibv_comp_channel,
            ibv_mr,
            ibv_device_attr,
            ibv_port_attr,
            ibv_gid_entry,
            ibv_qp_cap,
            ibv_global_route,
            ibv_ah_attr,
            ibv_qp_attr,
            ibv_qp_init_attr,
            ibv_sge,
            ibv_send_wr,
            ibv_recv_wr,
            ibv_wc,
            ibv_async_event,
            ibv_context_ops,
            ibv_grh
        );
        v.push((
            "sizeof ibv_gid".into(),
            "sizeof(union ibv_gid)".into(),
            size_of::<ibv_gid>() as u64,
        ));
        offset!(ibv_context: ops, async_fd);
        offset!(ibv_context_ops: poll_cq, req_notify_cq, post_send, post_recv);
        offset!(ibv_comp_channel: fd);
        offset!(ibv_cq: context);
        offset!(ibv_qp: context, qp_num);
        offset!(ibv_mr: lkey, rkey);
        offset!(ibv_device_attr: max_qp_init_rd_atom, max_pkeys, phys_port_cnt);
        offset!(ibv_port_attr: state, active_mtu, link_layer, port_cap_flags2);
        offset!(ibv_gid_entry: gid, gid_index, port_num, gid_type);
        offset!(ibv_qp_cap: max_send_wr, max_recv_wr, max_send_sge, max_recv_sge);
        offset!(ibv_global_route: dgid, flow_label, sgid_index, hop_limit, traffic_class);
        offset!(ibv_ah_attr: grh, dlid, sl, src_path_bits, static_rate, is_global, port_num);
        offset!(ibv_qp_attr: qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, max_rd_atomic,
            max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            rate_limit);
        offset!(ibv_qp_init_attr: send_cq, recv_cq, cap, qp_type);
        offset!(ibv_sge: addr, length, lkey);
        offset!(ibv_send_wr: wr_id, sg_list, num_sge, opcode, send_flags, imm_data, wr);
        offset!(ibv_recv_wr: wr_id, sg_list, num_sge);
        offset!(ibv_wc: wr_id, status, opcode, byte_len, imm_data, src_qp, wc_flags,
            dlid_path_bits);
        offset!(ibv_grh: paylen, hop_limit, sgid, dgid);
        offset!(ibv_async_event: element, event_type);
        v.push((
            "offsetof ibv_send_wr.wr.rdma.rkey".into(),
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)".into(),
            (offset_of!(ibv_send_wr, wr) + offset_of!(ibv_rdma_wr, rkey)) as u64,
        ));
        for (field, ours) in [
            ("ah", offset_of!(ibv_ud_wr, ah)),
            ("remote_qpn", offset_of!(ibv_ud_wr, remote_qpn)),
            ("remote_qkey", offset_of!(ibv_ud_wr, remote_qkey)),
        ] {
            v.push((
                format!("offsetof ibv_send_wr.wr.ud.{field}"),
                format!("offsetof(struct ibv_send_wr, wr.ud.{field})"),
                (offset_of!(ibv_send_wr, wr) + ours) as u64,
            ));
        }
        v.push((
            "offsetof ibv_send_wr.qp_type".into(),
            "offsetof(struct ibv_send_wr, qp_type)".into(),
            offset_of!(ibv_send_wr, xrc_remote_srqn) as u64,
        ));
        v.push((
            "offsetof ibv_send_wr.bind_mw".into(),
            "offsetof(struct ibv_send_wr, bind_mw)".into(),
            offset_of!(ibv_send_wr, bind_mw_or_tso) as u64,
        ));
        constant!(
            IBV_PORT_ACTIVE,
            IBV_GID_TYPE_ROCE_V2,
            IBV_ACCESS_LOCAL_WRITE,
            IBV_ACCESS_REMOTE_WRITE,
            IBV_ACCESS_REMOTE_READ,
            IBV_QPT_RC,
            IBV_QPT_UD,
            IBV_QPS_RESET,
            IBV_QPS_INIT,
            IBV_QPS_RTR,
            IBV_QPS_RTS,
            IBV_QPS_ERR,
            IBV_MIG_MIGRATED,
            IBV_MIG_REARM,
            IBV_WR_RDMA_WRITE,
            IBV_WR_SEND,
            IBV_WR_SEND_WITH_IMM,
            IBV_WR_RDMA_READ,
            IBV_SEND_SIGNALED,
            IBV_WC_GRH,
            IBV_WC_WITH_IMM,
            IBV_WC_SEND,
            IBV_WC_RECV,
            IBV_EVENT_DEVICE_FATAL,
            IBV_EVENT_PORT_ACTIVE,
            IBV_EVENT_PORT_ERR,
            IBV_EVENT_PKEY_CHANGE,
            IBV_EVENT_GID_CHANGE,
            IBV_QP_STATE,
            IBV_QP_ACCESS_FLAGS,
            IBV_QP_PKEY_INDEX,
            IBV_QP_PORT,
            IBV_QP_QKEY,
            IBV_QP_AV,
            IBV_QP_PATH_MTU,
            IBV_QP_TIMEOUT,
            IBV_QP_RETRY_CNT,
            IBV_QP_RNR_RETRY,
            IBV_QP_RQ_PSN,
            IBV_QP_MAX_QP_RD_ATOMIC,
            IBV_QP_MIN_RNR_TIMER,
            IBV_QP_SQ_PSN,
            IBV_QP_MAX_DEST_RD_ATOMIC,
            IBV_QP_PATH_MIG_STATE,
            IBV_QP_CAP,
            IBV_QP_DEST_QPN
        );
        v
    }

    /// Every size, offset and constant above against the installed verbs.h, compiled by
    /// the C compiler (`$CC`, else `cc`). Without libibverbs-dev there is nothing to
    /// compare with: the test says so and passes, unless IBCM_VERBS_H=required (CI sets
    /// it, and installs libibverbs-dev).
    #[test]
    fn verbs_h_layout() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        let required = std::env::var("IBCM_VERBS_H").is_ok_and(|v| v == "required");
        if !header.exists() {
            assert!(
                !required,
                "IBCM_VERBS_H=required and {} is missing",
                header.display()
            );
            eprintln!(
                "verbs_h_layout: {} missing (libibverbs-dev): not compared",
                header.display()
            );
            return;
        }
        let rows = layout();
        let mut c = String::from(
            "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
        );
        for (name, expr, _) in &rows {
            c.push_str(&format!(
                "  printf(\"%s=%llu\\n\", \"{name}\", (unsigned long long)({expr}));\n"
            ));
        }
        c.push_str("  return 0;\n}\n");
        let dir = std::env::temp_dir().join(format!("ibcm-verbs-h-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir"); // ok: test
        let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
        std::fs::write(&src, c).expect("write layout.c"); // ok: test
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let built = std::process::Command::new(&cc)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .status()
            .expect("run the C compiler"); // ok: test
        assert!(built.success(), "{cc} failed on {}", src.display());
        let out = std::process::Command::new(&exe)
            .output()
            .expect("run layout"); // ok: test
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&out.stdout);
        let mut wrong = Vec::new();
        for (name, _, ours) in &rows {
            let theirs = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse::<u64>().ok());
            if theirs != Some(*ours) {
                wrong.push(format!("{name}: verbs.h {theirs:?}, here {ours}"));
            }
        }
        assert!(
            wrong.is_empty(),
            "layouts differ from verbs.h:\n{}",
            wrong.join("\n")
        );
    }
}
