//! The binary interface of WinOF's `iba_cm` 1.1 (`inc/kernel/iba/ib_cm_ifc.h`, with the AL
//! types it uses from `inc/iba/ib_types.h` and `inc/iba/ib_al.h`), laid out as MSVC lays
//! it out for x64, written from the header's declarations.
//!
//! - Plain structures are `#[repr(C)]`: on x64, MSVC and the SysV ABI place these field
//!   types (fixed-width integers, pointers, `int`-sized C enums, `NTSTATUS` = `LONG` =
//!   32 bits) at the same offsets, so the Linux tests check the Windows layout.
//! - `ib_path_rec_t` is declared inside `cl_packon.h` (`#pragma pack(1)`) with
//!   `__declspec(align(8))`: byte-packed members, 8-byte aligned type. Every member sits
//!   at its natural offset anyway, so `#[repr(C, align(8))]` is the same layout.
//! - `ib_gid_t` and `ib_grh_t` are byte-packed (alignment 1): `ib_grh_t` is
//!   `#[repr(C, packed)]`, a GID is `[u8; 16]`.
//! - `net16_t`/`net32_t`/`net64_t` hold big-endian values: [`Be16`], [`Be32`], [`Be64`].
//! - C enums are `int`: `i32`, never a Rust enum (a client may store any value).
//! - Function pointers use the default calling convention of the target, `extern "C"`:
//!   on x86_64-pc-windows-msvc that is the Microsoft x64 convention the header's pointers
//!   have (x64 has one C calling convention; `__stdcall`/`__cdecl` are ignored there).
//!
//! Every size, alignment and field offset is asserted at compile time below.

use core::ffi::c_void;
use core::mem::{align_of, offset_of, size_of};

/// `NTSTATUS` (`LONG`).
pub type NtStatus = i32;

/// NTSTATUS values this interface returns (ntstatus.h).
pub mod status {
    use super::NtStatus;
    /// STATUS_SUCCESS.
    pub const SUCCESS: NtStatus = 0;
    /// STATUS_UNSUCCESSFUL.
    pub const UNSUCCESSFUL: NtStatus = 0xC000_0001_u32 as i32;
    /// STATUS_INVALID_HANDLE.
    pub const INVALID_HANDLE: NtStatus = 0xC000_0008_u32 as i32;
    /// STATUS_INVALID_PARAMETER.
    pub const INVALID_PARAMETER: NtStatus = 0xC000_000D_u32 as i32;
    /// STATUS_INSUFFICIENT_RESOURCES.
    pub const INSUFFICIENT_RESOURCES: NtStatus = 0xC000_009A_u32 as i32;
    /// STATUS_NOT_SUPPORTED.
    pub const NOT_SUPPORTED: NtStatus = 0xC000_00BB_u32 as i32;
    /// STATUS_INVALID_DEVICE_STATE.
    pub const INVALID_DEVICE_STATE: NtStatus = 0xC000_0184_u32 as i32;
    /// STATUS_DEVICE_REMOVED.
    pub const DEVICE_REMOVED: NtStatus = 0xC000_02B6_u32 as i32;
    /// STATUS_NO_MORE_ENTRIES (a warning: `NT_SUCCESS` is false).
    pub const NO_MORE_ENTRIES: NtStatus = 0x8000_001A_u32 as i32;
    /// STATUS_ADDRESS_ALREADY_EXISTS.
    pub const ADDRESS_ALREADY_EXISTS: NtStatus = 0xC000_020A_u32 as i32;
}

/// `NT_SUCCESS(status)`: 0 ..= 0x7FFFFFFF.
pub const fn nt_success(status: NtStatus) -> bool {
    status >= 0
}

macro_rules! big_endian {
    ($(#[$m:meta])* $name:ident($ty:ty)) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub struct $name(pub $ty);

        impl $name {
            /// From a host-order value.
            pub const fn new(host: $ty) -> Self {
                Self(host.to_be())
            }
            /// The host-order value.
            pub const fn get(self) -> $ty {
                <$ty>::from_be(self.0)
            }
        }
    };
}

big_endian!(
    /// `net16_t`: a 16-bit value stored big-endian.
    Be16(u16)
);
big_endian!(
    /// `net32_t`: a 32-bit value stored big-endian.
    Be32(u32)
);
big_endian!(
    /// `net64_t`: a 64-bit value stored big-endian.
    Be64(u64)
);

/// `GUID_INFINIBAND_INTERFACE_CM` {6A11D060-8957-49e6-BE2A-01EDF1BD22B3}, as the
/// `GUID` structure (`Data1` u32, `Data2` u16, `Data3` u16, `Data4` [u8; 8]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guid {
    /// Data1.
    pub data1: u32,
    /// Data2.
    pub data2: u16,
    /// Data3.
    pub data3: u16,
    /// Data4.
    pub data4: [u8; 8],
}

/// The interface type of `iba_cm`.
pub const GUID_INFINIBAND_INTERFACE_CM: Guid = Guid {
    data1: 0x6A11_D060,
    data2: 0x8957,
    data3: 0x49E6,
    data4: [0xBE, 0x2A, 0x01, 0xED, 0xF1, 0xBD, 0x22, 0xB3],
};

/// `IbaCmVersion(major, minor)` = `major << 8 | minor`.
pub const fn iba_cm_version(major: u8, minor: u8) -> u16 {
    (major as u16) << 8 | minor as u16
}

/// `INFINIBAND_INTERFACE_CM_VERSION` = `IbaCmVersion(1, 1)`.
pub const INFINIBAND_INTERFACE_CM_VERSION: u16 = iba_cm_version(1, 1);

/// Private-data sizes (IBA Vol 1 ch. 12, Tables 99-117; ib_types.h `IB_*_PDATA_SIZE`).
pub mod pdata {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// LAP.
    pub const LAP: usize = 168;
    /// APR.
    pub const APR: usize = 148;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
    /// ARI of a REJ, additional information of an APR or SIDR_REP.
    pub const ARI: usize = 72;
}

/// `ib_qp_type_t` values the CM carries (REQ TransportServiceType, IBA Table 99).
pub mod qp_type {
    /// IB_QPT_RELIABLE_CONN.
    pub const RELIABLE_CONN: i32 = 0;
    /// IB_QPT_UNRELIABLE_CONN.
    pub const UNRELIABLE_CONN: i32 = 1;
    /// IB_QPT_RELIABLE_DGRM.
    pub const RELIABLE_DGRM: i32 = 2;
}

/// `ib_qp_state_t` values (a bit each).
pub mod qp_state {
    /// IB_QPS_RESET.
    pub const RESET: u32 = 0x01;
    /// IB_QPS_INIT.
    pub const INIT: u32 = 0x02;
    /// IB_QPS_RTR.
    pub const RTR: u32 = 0x04;
    /// IB_QPS_RTS.
    pub const RTS: u32 = 0x08;
}

/// `ib_access_t` bits.
pub mod access {
    /// IB_AC_RDMA_READ.
    pub const RDMA_READ: u32 = 0x01;
    /// IB_AC_RDMA_WRITE.
    pub const RDMA_WRITE: u32 = 0x02;
    /// IB_AC_ATOMIC.
    pub const ATOMIC: u32 = 0x04;
    /// IB_AC_LOCAL_WRITE.
    pub const LOCAL_WRITE: u32 = 0x08;
}

/// `ib_qp_opts_t` bits.
pub mod qp_opts {
    /// IB_MOD_QP_ALTERNATE_AV.
    pub const ALTERNATE_AV: u32 = 0x0001;
    /// IB_MOD_QP_APM_STATE.
    pub const APM_STATE: u32 = 0x0004;
}

/// `ib_apm_state_t` values.
pub mod apm_state {
    /// IB_APM_MIGRATED.
    pub const MIGRATED: i32 = 1;
    /// IB_APM_REARM.
    pub const REARM: i32 = 2;
}

/// `iba_cm_event_type` values.
pub mod event_type {
    /// The REQ timed out (no REP).
    pub const REQ_ERROR: i32 = 0;
    /// A REQ arrived (on a listen: a zeroed notification; from `get_request`: the REQ).
    pub const REQ_RECEIVED: i32 = 1;
    /// The REP timed out (no RTU).
    pub const REP_ERROR: i32 = 2;
    /// A REP arrived.
    pub const REP_RECEIVED: i32 = 3;
    /// An RTU arrived.
    pub const RTU_RECEIVED: i32 = 4;
    /// The DREQ timed out (no DREP).
    pub const DREQ_ERROR: i32 = 5;
    /// A DREQ arrived.
    pub const DREQ_RECEIVED: i32 = 6;
    /// A DREP arrived.
    pub const DREP_RECEIVED: i32 = 7;
    /// A REJ arrived.
    pub const REJ_RECEIVED: i32 = 8;
    /// An MRA arrived.
    pub const MRA_RECEIVED: i32 = 9;
    /// The LAP timed out (no APR).
    pub const LAP_ERROR: i32 = 10;
    /// A LAP arrived.
    pub const LAP_RECEIVED: i32 = 11;
    /// An APR arrived.
    pub const APR_RECEIVED: i32 = 12;
    /// The SIDR_REQ timed out (no SIDR_REP).
    pub const SIDR_REQ_ERROR: i32 = 13;
    /// A SIDR_REQ arrived (as REQ_RECEIVED for a listen).
    pub const SIDR_REQ_RECEIVED: i32 = 14;
    /// A SIDR_REP arrived.
    pub const SIDR_REP_RECEIVED: i32 = 15;
}

/// The RDMA-CM IP service IDs and compare bits (IBA Annex A11; ib_types.h
/// `IB_REQ_CM_RDMA_*`).
pub mod rdma_cm {
    /// Offset of the consumer private data in the RDMA-CM REQ header
    /// (`FIELD_OFFSET(ib_cm_rdma_req_t, pdata)`).
    pub const HEADER_SIZE: usize = 36;
    /// Compare the source port (header bytes 2..4).
    pub const CMP_SRC_PORT: u8 = 0x01;
    /// Compare the source IP (bytes 4..20).
    pub const CMP_SRC_IP: u8 = 0x02;
    /// Compare the destination IP (bytes 20..36).
    pub const CMP_DST_IP: u8 = 0x04;
    /// The header's version byte (major 0, minor 0).
    pub const VERSION: u8 = 0x00;
    /// IP version 4 (in bits 4-7 of byte 1).
    pub const IPV4: u8 = 0x40;
    /// IP version 6.
    pub const IPV6: u8 = 0x60;

    /// Whether a (host-order) service ID is an RDMA-CM IP service ID
    /// 0x0000_0000_01PP_pppp (`ib_cm_is_rdma_cm_sid` on the net64 value).
    pub const fn is_rdma_cm_sid(service_id: u64) -> bool {
        service_id >> 24 == 0x01
    }
}

/// `ib_path_rec_t` (64 bytes, byte-packed, 8-aligned): the SA PathRecord (IBA 15.2.5.16).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbPathRec {
    /// Service ID (for QoS).
    pub service_id: Be64,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Source GID.
    pub sgid: [u8; 16],
    /// Destination LID.
    pub dlid: Be16,
    /// Source LID.
    pub slid: Be16,
    /// RawTraffic (bit 31), FlowLabel (bits 27..8), HopLimit (bits 7..0).
    pub hop_flow_raw: Be32,
    /// Traffic class.
    pub tclass: u8,
    /// Reversible (bit 7), NumbPath.
    pub num_path: u8,
    /// P_Key.
    pub pkey: Be16,
    /// QoS class (bits 15..4), SL (bits 3..0).
    pub qos_class_sl: Be16,
    /// MTU selector (bits 7..6), MTU code.
    pub mtu: u8,
    /// Rate selector, rate code.
    pub rate: u8,
    /// Packet life time selector, packet life time (IB time).
    pub pkt_life: u8,
    /// Preference.
    pub preference: u8,
    /// Reserved.
    pub resv2: [u8; 6],
}

/// `ib_grh_t` (40 bytes, byte-packed).
#[repr(C, packed)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbGrh {
    /// IP version (bits 31..28), traffic class (27..20), flow label (19..0).
    pub ver_class_flow: Be32,
    /// Reserved.
    pub resv1: u16,
    /// Reserved.
    pub resv2: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub src_gid: [u8; 16],
    /// Destination GID.
    pub dest_gid: [u8; 16],
}

/// `ib_av_attr_t.conn`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbAvConn {
    /// Path MTU code.
    pub path_mtu: u8,
    /// Local ACK timeout (IB time).
    pub local_ack_timeout: u8,
    /// Transport retry count.
    pub seq_err_retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry_cnt: u8,
}

/// `ib_av_attr_t` (56 bytes, 4-aligned): an address vector.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbAvAttr {
    /// Local port.
    pub port_num: u8,
    /// Service level.
    pub sl: u8,
    /// Destination LID.
    pub dlid: Be16,
    /// `boolean_t`: the GRH is used.
    pub grh_valid: i32,
    /// The GRH.
    pub grh: IbGrh,
    /// Static rate code.
    pub static_rate: u8,
    /// Source path bits.
    pub path_bits: u8,
    /// Connection attributes.
    pub conn: IbAvConn,
}

/// `ib_qp_mod_t.state.init`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbQpInit {
    /// Port.
    pub primary_port: u8,
    /// Q_Key.
    pub qkey: Be32,
    /// P_Key index.
    pub pkey_index: u16,
    /// `ib_access_t`.
    pub access_ctrl: u32,
}

/// `ib_qp_mod_t.state.rtr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbQpRtr {
    /// Receive PSN.
    pub rq_psn: Be32,
    /// The peer's QPN.
    pub dest_qp: Be32,
    /// Primary address vector.
    pub primary_av: IbAvAttr,
    /// Responder resources (max_dest_rd_atomic).
    pub resp_res: u8,
    /// Minimum RNR NAK timer code.
    pub rnr_nak_timeout: u8,
    /// `ib_qp_opts_t`.
    pub opts: u32,
    /// Alternate address vector (`opts` & ALTERNATE_AV).
    pub alternate_av: IbAvAttr,
    /// Q_Key.
    pub qkey: Be32,
    /// P_Key index.
    pub pkey_index: u16,
    /// `ib_access_t`.
    pub access_ctrl: u32,
    /// Send queue depth.
    pub sq_depth: u32,
    /// Receive queue depth.
    pub rq_depth: u32,
}

/// `ib_qp_mod_t.state.rts`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbQpRts {
    /// Send PSN.
    pub sq_psn: Be32,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry_cnt: u8,
    /// Local ACK timeout (IB time).
    pub local_ack_timeout: u8,
    /// Initiator depth (max_rd_atomic).
    pub init_depth: u8,
    /// `ib_qp_opts_t`.
    pub opts: u32,
    /// Minimum RNR NAK timer code.
    pub rnr_nak_timeout: u8,
    /// `ib_qp_state_t`.
    pub current_state: u32,
    /// Q_Key.
    pub qkey: Be32,
    /// `ib_access_t`.
    pub access_ctrl: u32,
    /// Responder resources.
    pub resp_res: u8,
    /// Primary address vector.
    pub primary_av: IbAvAttr,
    /// Alternate address vector.
    pub alternate_av: IbAvAttr,
    /// Send queue depth.
    pub sq_depth: u32,
    /// Receive queue depth.
    pub rq_depth: u32,
    /// `ib_apm_state_t`.
    pub apm_state: i32,
    /// Port.
    pub primary_port: u8,
    /// P_Key index.
    pub pkey_index: u16,
}

/// `ib_qp_mod_t.state.sqd`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbQpSqd {
    /// `boolean_t`.
    pub sqd_event: i32,
}

/// `ib_qp_mod_t.state`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union IbQpModState {
    /// RESET -> INIT.
    pub init: IbQpInit,
    /// INIT -> RTR.
    pub rtr: IbQpRtr,
    /// RTR -> RTS.
    pub rts: IbQpRts,
    /// RTS -> SQD.
    pub sqd: IbQpSqd,
}

/// `ib_qp_mod_t` (164 bytes, 4-aligned): what `ib_modify_qp` takes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbQpMod {
    /// `ib_qp_state_t`: the state to move to.
    pub req_state: u32,
    /// The attributes of that transition.
    pub state: IbQpModState,
}

impl IbQpMod {
    /// All zero (as AL's `cl_memclr` before filling).
    pub const fn zeroed() -> Self {
        Self {
            req_state: 0,
            state: IbQpModState {
                rts: IbQpRts {
                    sq_psn: Be32(0),
                    retry_cnt: 0,
                    rnr_retry_cnt: 0,
                    local_ack_timeout: 0,
                    init_depth: 0,
                    opts: 0,
                    rnr_nak_timeout: 0,
                    current_state: 0,
                    qkey: Be32(0),
                    access_ctrl: 0,
                    resp_res: 0,
                    primary_av: ZERO_AV,
                    alternate_av: ZERO_AV,
                    sq_depth: 0,
                    rq_depth: 0,
                    apm_state: 0,
                    primary_port: 0,
                    pkey_index: 0,
                },
            },
        }
    }
}

const ZERO_AV: IbAvAttr = IbAvAttr {
    port_num: 0,
    sl: 0,
    dlid: Be16(0),
    grh_valid: 0,
    grh: IbGrh {
        ver_class_flow: Be32(0),
        resv1: 0,
        resv2: 0,
        hop_limit: 0,
        src_gid: [0; 16],
        dest_gid: [0; 16],
    },
    static_rate: 0,
    path_bits: 0,
    conn: IbAvConn {
        path_mtu: 0,
        local_ack_timeout: 0,
        seq_err_retry_cnt: 0,
        rnr_retry_cnt: 0,
    },
};

/// A client's callback: `NTSTATUS (*callback)(iba_cm_id *p_id, iba_cm_event *p_event)`.
pub type IbaCmCallback = unsafe extern "C" fn(*mut IbaCmId, *mut IbaCmEvent) -> NtStatus;

/// `iba_cm_id` (24 bytes): the client's handle, which it may write (`context`,
/// `callback`) and read (`cid`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmId {
    /// The client's context.
    pub context: *mut c_void,
    /// The client's callback, read afresh at every delivery.
    pub callback: Option<IbaCmCallback>,
    /// The connection identifier (unique among live ids).
    pub cid: Be32,
}

/// `iba_cm_req` (64 bytes): `send_req`'s parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmReq {
    /// Service ID.
    pub service_id: Be64,
    /// Primary path (required).
    pub p_primary_path: *mut IbPathRec,
    /// Alternate path (or null).
    pub p_alt_path: *mut IbPathRec,
    /// Local QPN.
    pub qpn: Be32,
    /// `ib_qp_type_t`.
    pub qp_type: i32,
    /// Starting PSN.
    pub starting_psn: Be32,
    /// Private data.
    pub p_pdata: *const c_void,
    /// Private data length (<= 92).
    pub pdata_len: u8,
    /// Max CM retries.
    pub max_cm_retries: u8,
    /// Responder resources.
    pub resp_res: u8,
    /// Initiator depth.
    pub init_depth: u8,
    /// Remote CM response timeout.
    pub remote_resp_timeout: u8,
    /// End-to-end flow control.
    pub flow_ctrl: u8,
    /// Local CM response timeout.
    pub local_resp_timeout: u8,
    /// RNR retry count.
    pub rnr_retry_cnt: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// SRQ.
    pub srq: u8,
}

/// `iba_cm_req_event` (280 bytes): a REQ, inline.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmReqEvent {
    /// Service ID.
    pub service_id: Be64,
    /// Primary path, from this side's point of view.
    pub primary_path: IbPathRec,
    /// Alternate path (all zero if none).
    pub alt_path: IbPathRec,
    /// The peer's QPN.
    pub qpn: Be32,
    /// `ib_qp_type_t`.
    pub qp_type: i32,
    /// The peer's starting PSN.
    pub starting_psn: Be32,
    /// REQ private data.
    pub pdata: [u8; pdata::REQ],
    /// Max CM retries.
    pub max_cm_retries: u8,
    /// This side's responder resources: the peer's initiator depth.
    pub resp_res: u8,
    /// This side's initiator depth: the peer's responder resources.
    pub init_depth: u8,
    /// Remote CM response timeout.
    pub remote_resp_timeout: u8,
    /// End-to-end flow control.
    pub flow_ctrl: u8,
    /// Local CM response timeout.
    pub local_resp_timeout: u8,
    /// RNR retry count.
    pub rnr_retry_cnt: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// SRQ.
    pub srq: u8,
    /// This CA's GUID.
    pub local_ca_guid: Be64,
    /// The peer's CA GUID.
    pub remote_ca_guid: Be64,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port.
    pub port_num: u8,
}

/// `iba_cm_rep` (24 bytes): `send_rep`/`format_rep`'s parameters, and the REP event's body.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmRep {
    /// QPN.
    pub qpn: Be32,
    /// Starting PSN.
    pub starting_psn: Be32,
    /// Private data.
    pub p_pdata: *const c_void,
    /// Private data length (<= 196).
    pub pdata_len: u8,
    /// `ib_cm_failover_t`.
    pub failover_accepted: u8,
    /// Responder resources.
    pub resp_res: u8,
    /// Initiator depth.
    pub init_depth: u8,
    /// End-to-end flow control.
    pub flow_ctrl: u8,
    /// RNR retry count.
    pub rnr_retry_cnt: u8,
    /// SRQ.
    pub srq: u8,
}

/// `iba_cm_rep_event` (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmRepEvent {
    /// The REP (from this side's point of view for resp_res/init_depth).
    pub rep: IbaCmRep,
    /// The peer's CA GUID.
    pub ca_guid: Be64,
    /// Target ACK delay.
    pub target_ack_delay: u8,
}

/// `iba_cm_pdata` (16 bytes): RTU, DREQ and DREP events.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmPdata {
    /// Private data (valid during the callback).
    pub p_pdata: *mut c_void,
    /// Its length.
    pub pdata_len: u8,
}

/// `iba_cm_rej_event` (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmRejEvent {
    /// ARI (valid during the callback).
    pub ari: *mut c_void,
    /// Private data (valid during the callback).
    pub p_pdata: *mut c_void,
    /// `ib_rej_status_t` (net16).
    pub reason: Be16,
    /// ARI length.
    pub ari_length: u8,
    /// Private data length.
    pub pdata_len: u8,
}

/// `iba_cm_mra_event` (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmMraEvent {
    /// Private data.
    pub p_pdata: *mut c_void,
    /// Its length.
    pub pdata_len: u8,
    /// Service timeout.
    pub service_timeout: u8,
}

/// `iba_cm_lap` (24 bytes): `send_lap`'s parameters and the LAP event.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmLap {
    /// The alternate path.
    pub p_alt_path: *mut IbPathRec,
    /// Private data.
    pub p_pdata: *mut c_void,
    /// Its length.
    pub pdata_len: u8,
    /// Remote CM response timeout.
    pub remote_resp_timeout: u8,
}

/// `iba_cm_apr` (24 bytes): `send_apr`'s parameters and the APR event.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmApr {
    /// Private data.
    pub p_pdata: *mut c_void,
    /// `ib_apr_info_t *` (72 bytes of additional information).
    pub p_info: *mut c_void,
    /// Private data length.
    pub pdata_len: u8,
    /// Additional information length.
    pub info_length: u8,
    /// `ib_apr_status_t`.
    pub status: u8,
}

/// `iba_cm_sidr_req` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmSidrReq {
    /// Service ID.
    pub service_id: Be64,
    /// The path.
    pub p_path: *mut IbPathRec,
    /// Private data.
    pub p_pdata: *mut c_void,
    /// Its length.
    pub pdata_len: u8,
    /// Retries.
    pub max_cm_retries: u8,
    /// Timeout, in milliseconds.
    pub timeout: u32,
}

/// `iba_cm_sidr_req_event` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmSidrReqEvent {
    /// The request.
    pub sidr_req: IbaCmSidrReq,
    /// This CA's GUID.
    pub ca_guid: Be64,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port.
    pub port_num: u8,
}

/// `iba_cm_sidr_rep` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmSidrRep {
    /// QPN.
    pub qpn: Be32,
    /// Q_Key.
    pub qkey: Be32,
    /// Private data.
    pub p_pdata: *mut c_void,
    /// Additional information.
    pub p_info: *mut c_void,
    /// Private data length.
    pub pdata_len: u8,
    /// Additional information length.
    pub info_len: u8,
    /// `ib_sidr_status_t`.
    pub status: u8,
}

/// `iba_cm_event.data`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union IbaCmEventData {
    /// REQ.
    pub req: IbaCmReqEvent,
    /// REP.
    pub rep: IbaCmRepEvent,
    /// RTU.
    pub rtu: IbaCmPdata,
    /// DREQ.
    pub dreq: IbaCmPdata,
    /// DREP.
    pub drep: IbaCmPdata,
    /// REJ.
    pub rej: IbaCmRejEvent,
    /// MRA.
    pub mra: IbaCmMraEvent,
    /// LAP.
    pub lap: IbaCmLap,
    /// APR.
    pub apr: IbaCmApr,
    /// SIDR_REQ.
    pub sidr_req: IbaCmSidrReqEvent,
    /// SIDR_REP.
    pub sidr_rep: IbaCmSidrRep,
    /// The union's bytes.
    pub raw: [u64; 35],
}

/// `iba_cm_event` (288 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbaCmEvent {
    /// `iba_cm_event_type`.
    pub event_type: i32,
    /// The event's data.
    pub data: IbaCmEventData,
}

impl IbaCmEvent {
    /// An all-zero event of `event_type`.
    pub const fn zeroed(event_type: i32) -> Self {
        Self {
            event_type,
            data: IbaCmEventData { raw: [0; 35] },
        }
    }
}

/// `PINTERFACE_REFERENCE` / `PINTERFACE_DEREFERENCE`.
pub type InterfaceReference = unsafe extern "C" fn(*mut c_void);

/// The WDM `INTERFACE` header (32 bytes on x64).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Interface {
    /// Size of the whole interface structure.
    pub size: u16,
    /// Version.
    pub version: u16,
    /// The context passed to the reference callbacks.
    pub context: *mut c_void,
    /// Takes a reference.
    pub interface_reference: Option<InterfaceReference>,
    /// Drops a reference.
    pub interface_dereference: Option<InterfaceReference>,
}

/// `create_id`.
pub type CreateIdFn =
    unsafe extern "C" fn(Option<IbaCmCallback>, *mut c_void, *mut *mut IbaCmId) -> NtStatus;
/// `destroy_id`.
pub type DestroyIdFn = unsafe extern "C" fn(*mut IbaCmId);
/// `listen`.
pub type ListenFn = unsafe extern "C" fn(*mut IbaCmId, Be64, *mut c_void, u8, u8) -> NtStatus;
/// `get_request`.
pub type GetRequestFn =
    unsafe extern "C" fn(*mut IbaCmId, *mut *mut IbaCmId, *mut IbaCmEvent) -> NtStatus;
/// `send_req`.
pub type SendReqFn = unsafe extern "C" fn(*mut IbaCmId, *mut IbaCmReq) -> NtStatus;
/// `send_rep`.
pub type SendRepFn = unsafe extern "C" fn(*mut IbaCmId, *mut IbaCmRep) -> NtStatus;
/// `send_rtu`, `send_dreq`, `send_drep`.
pub type SendPdataFn = unsafe extern "C" fn(*mut IbaCmId, *const c_void, u8) -> NtStatus;
/// `send_rej`.
pub type SendRejFn =
    unsafe extern "C" fn(*mut IbaCmId, Be16, *const c_void, u8, *const c_void, u8) -> NtStatus;
/// `send_mra`.
pub type SendMraFn = unsafe extern "C" fn(*mut IbaCmId, u8, *const c_void, u8) -> NtStatus;
/// `send_lap`.
pub type SendLapFn = unsafe extern "C" fn(*mut IbaCmId, *mut IbaCmLap) -> NtStatus;
/// `send_apr`.
pub type SendAprFn = unsafe extern "C" fn(*mut IbaCmId, *mut IbaCmApr) -> NtStatus;
/// `send_sidr_req`.
pub type SendSidrReqFn = unsafe extern "C" fn(*mut IbaCmId, *mut IbaCmSidrReq) -> NtStatus;
/// `send_sidr_rep`.
pub type SendSidrRepFn = unsafe extern "C" fn(*mut IbaCmId, *mut IbaCmSidrRep) -> NtStatus;
/// `get_qp_attr`.
pub type GetQpAttrFn = unsafe extern "C" fn(*mut IbaCmId, u32, *mut IbQpMod) -> NtStatus;
/// `migrate`, `established`, `cancel_listen`, `send_formatted_rep`.
pub type IdFn = unsafe extern "C" fn(*mut IbaCmId) -> NtStatus;
/// `format_rep`.
pub type FormatRepFn = unsafe extern "C" fn(*mut IbaCmId, *mut IbaCmRep, *mut IbQpMod) -> NtStatus;
/// `get_request_ex`.
pub type GetRequestExFn = unsafe extern "C" fn(
    *mut IbaCmId,
    Option<IbaCmCallback>,
    *mut c_void,
    *mut *mut IbaCmId,
    *mut IbaCmEvent,
) -> NtStatus;

/// `iba_cm_interface` (22 function pointers, 176 bytes), in the header's order.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IbaCmInterface {
    /// 0.
    pub create_id: Option<CreateIdFn>,
    /// 1.
    pub destroy_id: Option<DestroyIdFn>,
    /// 2.
    pub listen: Option<ListenFn>,
    /// 3.
    pub get_request: Option<GetRequestFn>,
    /// 4.
    pub send_req: Option<SendReqFn>,
    /// 5.
    pub send_rep: Option<SendRepFn>,
    /// 6.
    pub send_rtu: Option<SendPdataFn>,
    /// 7.
    pub send_dreq: Option<SendPdataFn>,
    /// 8.
    pub send_drep: Option<SendPdataFn>,
    /// 9.
    pub send_rej: Option<SendRejFn>,
    /// 10.
    pub send_mra: Option<SendMraFn>,
    /// 11.
    pub send_lap: Option<SendLapFn>,
    /// 12.
    pub send_apr: Option<SendAprFn>,
    /// 13.
    pub send_sidr_req: Option<SendSidrReqFn>,
    /// 14.
    pub send_sidr_rep: Option<SendSidrRepFn>,
    /// 15.
    pub get_qp_attr: Option<GetQpAttrFn>,
    /// 16.
    pub migrate: Option<IdFn>,
    /// 17.
    pub established: Option<IdFn>,
    /// 18.
    pub cancel_listen: Option<IdFn>,
    /// 19.
    pub format_rep: Option<FormatRepFn>,
    /// 20.
    pub send_formatted_rep: Option<IdFn>,
    /// 21.
    pub get_request_ex: Option<GetRequestExFn>,
}

/// `INFINIBAND_INTERFACE_CM` (208 bytes on x64): what `IRP_MN_QUERY_INTERFACE` fills.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct InfinibandInterfaceCm {
    /// The `INTERFACE` header.
    pub interface_header: Interface,
    /// The functions.
    pub cm: IbaCmInterface,
}

// ---- the layout, asserted --------------------------------------------------------------

macro_rules! layout {
    ($t:ty, size $size:expr, align $align:expr $(, $field:ident @ $off:expr)* $(,)?) => {
        const _: () = assert!(size_of::<$t>() == $size);
        const _: () = assert!(align_of::<$t>() == $align);
        $( const _: () = assert!(offset_of!($t, $field) == $off); )*
    };
}

layout!(Guid, size 16, align 4, data1 @ 0, data2 @ 4, data3 @ 6, data4 @ 8);
layout!(IbPathRec, size 64, align 8,
    service_id @ 0, dgid @ 8, sgid @ 24, dlid @ 40, slid @ 42, hop_flow_raw @ 44,
    tclass @ 48, num_path @ 49, pkey @ 50, qos_class_sl @ 52, mtu @ 54, rate @ 55,
    pkt_life @ 56, preference @ 57, resv2 @ 58);
layout!(IbGrh, size 40, align 1,
    ver_class_flow @ 0, resv1 @ 4, resv2 @ 6, hop_limit @ 7, src_gid @ 8, dest_gid @ 24);
layout!(IbAvConn, size 4, align 1,
    path_mtu @ 0, local_ack_timeout @ 1, seq_err_retry_cnt @ 2, rnr_retry_cnt @ 3);
layout!(IbAvAttr, size 56, align 4,
    port_num @ 0, sl @ 1, dlid @ 2, grh_valid @ 4, grh @ 8, static_rate @ 48,
    path_bits @ 49, conn @ 50);
layout!(IbQpInit, size 16, align 4, primary_port @ 0, qkey @ 4, pkey_index @ 8, access_ctrl @ 12);
layout!(IbQpRtr, size 148, align 4,
    rq_psn @ 0, dest_qp @ 4, primary_av @ 8, resp_res @ 64, rnr_nak_timeout @ 65,
    opts @ 68, alternate_av @ 72, qkey @ 128, pkey_index @ 132, access_ctrl @ 136,
    sq_depth @ 140, rq_depth @ 144);
layout!(IbQpRts, size 160, align 4,
    sq_psn @ 0, retry_cnt @ 4, rnr_retry_cnt @ 5, local_ack_timeout @ 6, init_depth @ 7,
    opts @ 8, rnr_nak_timeout @ 12, current_state @ 16, qkey @ 20, access_ctrl @ 24,
    resp_res @ 28, primary_av @ 32, alternate_av @ 88, sq_depth @ 144, rq_depth @ 148,
    apm_state @ 152, primary_port @ 156, pkey_index @ 158);
layout!(IbQpSqd, size 4, align 4, sqd_event @ 0);
layout!(IbQpModState, size 160, align 4, init @ 0, rtr @ 0, rts @ 0, sqd @ 0);
layout!(IbQpMod, size 164, align 4, req_state @ 0, state @ 4);
layout!(IbaCmId, size 24, align 8, context @ 0, callback @ 8, cid @ 16);
layout!(IbaCmReq, size 64, align 8,
    service_id @ 0, p_primary_path @ 8, p_alt_path @ 16, qpn @ 24, qp_type @ 28,
    starting_psn @ 32, p_pdata @ 40, pdata_len @ 48, max_cm_retries @ 49, resp_res @ 50,
    init_depth @ 51, remote_resp_timeout @ 52, flow_ctrl @ 53, local_resp_timeout @ 54,
    rnr_retry_cnt @ 55, retry_cnt @ 56, srq @ 57);
layout!(IbaCmReqEvent, size 280, align 8,
    service_id @ 0, primary_path @ 8, alt_path @ 72, qpn @ 136, qp_type @ 140,
    starting_psn @ 144, pdata @ 148, max_cm_retries @ 240, resp_res @ 241,
    init_depth @ 242, remote_resp_timeout @ 243, flow_ctrl @ 244, local_resp_timeout @ 245,
    rnr_retry_cnt @ 246, retry_cnt @ 247, srq @ 248, local_ca_guid @ 256,
    remote_ca_guid @ 264, pkey_index @ 272, port_num @ 274);
layout!(IbaCmRep, size 24, align 8,
    qpn @ 0, starting_psn @ 4, p_pdata @ 8, pdata_len @ 16, failover_accepted @ 17,
    resp_res @ 18, init_depth @ 19, flow_ctrl @ 20, rnr_retry_cnt @ 21, srq @ 22);
layout!(IbaCmRepEvent, size 40, align 8, rep @ 0, ca_guid @ 24, target_ack_delay @ 32);
layout!(IbaCmPdata, size 16, align 8, p_pdata @ 0, pdata_len @ 8);
layout!(IbaCmRejEvent, size 24, align 8,
    ari @ 0, p_pdata @ 8, reason @ 16, ari_length @ 18, pdata_len @ 19);
layout!(IbaCmMraEvent, size 16, align 8, p_pdata @ 0, pdata_len @ 8, service_timeout @ 9);
layout!(IbaCmLap, size 24, align 8,
    p_alt_path @ 0, p_pdata @ 8, pdata_len @ 16, remote_resp_timeout @ 17);
layout!(IbaCmApr, size 24, align 8,
    p_pdata @ 0, p_info @ 8, pdata_len @ 16, info_length @ 17, status @ 18);
layout!(IbaCmSidrReq, size 32, align 8,
    service_id @ 0, p_path @ 8, p_pdata @ 16, pdata_len @ 24, max_cm_retries @ 25,
    timeout @ 28);
layout!(IbaCmSidrReqEvent, size 48, align 8,
    sidr_req @ 0, ca_guid @ 32, pkey_index @ 40, port_num @ 42);
layout!(IbaCmSidrRep, size 32, align 8,
    qpn @ 0, qkey @ 4, p_pdata @ 8, p_info @ 16, pdata_len @ 24, info_len @ 25, status @ 26);
layout!(IbaCmEventData, size 280, align 8,
    req @ 0, rep @ 0, rtu @ 0, dreq @ 0, drep @ 0, rej @ 0, mra @ 0, lap @ 0, apr @ 0,
    sidr_req @ 0, sidr_rep @ 0, raw @ 0);
layout!(IbaCmEvent, size 288, align 8, event_type @ 0, data @ 8);
layout!(Interface, size 32, align 8,
    size @ 0, version @ 2, context @ 8, interface_reference @ 16, interface_dereference @ 24);
layout!(IbaCmInterface, size 176, align 8,
    create_id @ 0, destroy_id @ 8, listen @ 16, get_request @ 24, send_req @ 32,
    send_rep @ 40, send_rtu @ 48, send_dreq @ 56, send_drep @ 64, send_rej @ 72,
    send_mra @ 80, send_lap @ 88, send_apr @ 96, send_sidr_req @ 104, send_sidr_rep @ 112,
    get_qp_attr @ 120, migrate @ 128, established @ 136, cancel_listen @ 144,
    format_rep @ 152, send_formatted_rep @ 160, get_request_ex @ 168);
layout!(InfinibandInterfaceCm, size 208, align 8, interface_header @ 0, cm @ 32);
layout!(Be16, size 2, align 2);
layout!(Be32, size 4, align 4);
layout!(Be64, size 8, align 8);
