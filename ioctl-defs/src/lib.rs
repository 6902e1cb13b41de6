//! The ibcm IOCTL ABI, shared by the driver (`driver/endpoint`, the KMDF binding) and the
//! user library.
//!
//! Rules (design.md, "The IOCTL ABI"):
//! - Codes are `CTL_CODE(FILE_DEVICE_INFINIBAND, 0x800 + n, METHOD_BUFFERED,
//!   FILE_READ_DATA | FILE_WRITE_DATA)`: a handle opened without read and write access
//!   cannot issue them.
//! - Records are flat `#[repr(C)]`, little-endian (every Windows target), with explicit
//!   padding named `reserved*` that must be zero, fixed inline arrays with a length field
//!   for private data and ARI, and no pointers. Each input record starts with its `size`.
//! - Endpoint handles are per file handle: `index | generation << 32`, never global.
//! - Conversion to and from bytes goes through `zerocopy`: no `unsafe` here; [`convert`]
//!   turns records into the IBA values they carry and back.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

extern crate alloc;

pub mod convert;

/// How the issuer of an IOCTL learns that it finished: called exactly once with the
/// request's NTSTATUS and the output bytes it reported (METHOD_BUFFERED: the system
/// buffer's first `Information` bytes), with no lock held. It takes the buffer, as the I/O
/// manager hands the caller its system buffer. Shared (`Arc`), so a caller's completion
/// slot or event queue is the hook itself, with nothing allocated per request to wrap it.
pub trait CompletionHook: Send + Sync {
    /// The request completed with `status`; `output` holds the bytes it reported.
    fn completed(self: alloc::sync::Arc<Self>, status: i32, output: alloc::vec::Vec<u8>);
}

/// The IBA values the records carry (paths, QP attributes, CM parameters, wire enums).
pub use ibcm_iba as iba;

/// The ABI version this crate describes; the VERSION handshake must name it.
pub const ABI_VERSION: u32 = 2;

/// GET_EVENTs one handle may have pending on its event channel (`ANY_ENDPOINT`) at once:
/// each holds an IRP and its system buffer, so a handle's pending requests are bounded
/// (one per endpoint, and these). A reader needs one; a pool of threads a few.
pub const MAX_CHANNEL_GET_EVENTS: u32 = 64;

/// The handle a GET_EVENT names to read the file's event channel (no endpoint has it:
/// endpoint handles carry a generation >= 1).
pub const ANY_ENDPOINT: u64 = 0;

/// `FILE_DEVICE_INFINIBAND` (devioctl.h).
pub const FILE_DEVICE_INFINIBAND: u32 = 0x3B;
/// `METHOD_BUFFERED`: the I/O manager copies input and output through a system buffer,
/// so the driver never touches a user address.
pub const METHOD_BUFFERED: u32 = 0;
/// `FILE_READ_DATA`.
pub const FILE_READ_DATA: u32 = 1;
/// `FILE_WRITE_DATA`.
pub const FILE_WRITE_DATA: u32 = 2;

/// `CTL_CODE` of devioctl.h.
pub const fn ctl_code(device_type: u32, function: u32, method: u32, access: u32) -> u32 {
    (device_type << 16) | (access << 14) | (function << 2) | method
}

/// The code of ibcm IOCTL number `n`.
pub const fn ibcm_ioctl(n: u32) -> u32 {
    ctl_code(
        FILE_DEVICE_INFINIBAND,
        0x800 + n,
        METHOD_BUFFERED,
        FILE_READ_DATA | FILE_WRITE_DATA,
    )
}

/// IOCTL codes.
pub mod code {
    use super::ibcm_ioctl;
    /// [`VersionIn`](super::VersionIn) -> [`VersionOut`](super::VersionOut).
    pub const VERSION: u32 = ibcm_ioctl(0);
    /// [`CreateIn`](super::CreateIn) -> [`CreateOut`](super::CreateOut).
    pub const CREATE: u32 = ibcm_ioctl(1);
    /// [`HandleIn`](super::HandleIn).
    pub const DESTROY: u32 = ibcm_ioctl(2);
    /// [`ListenIn`](super::ListenIn).
    pub const LISTEN: u32 = ibcm_ioctl(3);
    /// [`HandleIn`](super::HandleIn): stops a listen; the endpoint returns to idle.
    pub const CANCEL_LISTEN: u32 = ibcm_ioctl(4);
    /// [`ConnectIn`](super::ConnectIn): sends the REQ. Without an output buffer it
    /// completes at once and the answer comes through GET_EVENT. With one (NetworkDirect's
    /// `Connect`), it completes when the attempt is answered: with the REP_RECEIVED
    /// [`EventRecord`](super::EventRecord), followed by the
    /// [`QpTransitionsOut`](super::QpTransitionsOut) if the buffer holds both; or with the
    /// REJECTED, TIMEOUT or DEVICE_REMOVAL record that ended the attempt (peer to peer:
    /// or the REQ_RECEIVED record of the crossing REQ that made this side passive). Other
    /// events (an MRA) still go to GET_EVENT. One answer is awaited per endpoint at a time.
    pub const CONNECT: u32 = ibcm_ioctl(5);
    /// [`FormatRepIn`](super::FormatRepIn) -> [`QpTransitionsOut`](super::QpTransitionsOut):
    /// pre-REP.
    pub const FORMAT_REP: u32 = ibcm_ioctl(6);
    /// [`HandleIn`](super::HandleIn): sends the REP formatted by FORMAT_REP. Without an
    /// output buffer it completes at once. With one (NetworkDirect's `Accept`), it
    /// completes when the REP is answered: with the RTU_RECEIVED
    /// [`EventRecord`](super::EventRecord), or the DREQ_RECEIVED one (the RTU was lost but
    /// the peer is connected), or the REJECTED, TIMEOUT or DEVICE_REMOVAL record.
    pub const SEND_REP: u32 = ibcm_ioctl(7);
    /// [`PrivateDataIn`](super::PrivateDataIn).
    pub const RTU: u32 = ibcm_ioctl(8);
    /// [`RejIn`](super::RejIn).
    pub const REJ: u32 = ibcm_ioctl(9);
    /// [`MraIn`](super::MraIn).
    pub const MRA: u32 = ibcm_ioctl(10);
    /// [`PrivateDataIn`](super::PrivateDataIn) (at most 220 bytes).
    pub const DREQ: u32 = ibcm_ioctl(11);
    /// [`PrivateDataIn`](super::PrivateDataIn).
    pub const DREP: u32 = ibcm_ioctl(12);
    /// [`GetQpAttrIn`](super::GetQpAttrIn) -> [`QpAttrOut`](super::QpAttrOut).
    pub const GET_QP_ATTR: u32 = ibcm_ioctl(13);
    /// [`HandleIn`](super::HandleIn) -> [`QueryOut`](super::QueryOut).
    pub const QUERY: u32 = ibcm_ioctl(14);
    /// [`HandleIn`](super::HandleIn): the QP saw traffic before the RTU.
    pub const ESTABLISHED: u32 = ibcm_ioctl(15);
    /// [`HandleIn`](super::HandleIn) -> `[EventRecord]`: pends until an event arrives;
    /// completes with as many queued events as the output buffer holds. Naming
    /// [`ANY_ENDPOINT`](super::ANY_ENDPOINT) reads the file's event channel: the events of
    /// every endpoint of the file that has no GET_EVENT of its own pending, each endpoint's
    /// in order, each record naming its endpoint in `handle`. An event goes to its
    /// endpoint's own pending GET_EVENT first; one already queued goes to whichever
    /// GET_EVENT asks first. The channel lets an idle connection hold no request (no IRP,
    /// no system buffer) while it waits for its next event. An endpoint has one GET_EVENT
    /// pending at a time (a second fails with STATUS_INVALID_DEVICE_STATE), a handle's
    /// channel at most [`MAX_CHANNEL_GET_EVENTS`](super::MAX_CHANNEL_GET_EVENTS) (past
    /// them, STATUS_QUOTA_EXCEEDED).
    pub const GET_EVENT: u32 = ibcm_ioctl(16);
    /// [`CountersIn`](super::CountersIn) -> [`CountersOut`](super::CountersOut).
    pub const COUNTERS: u32 = ibcm_ioctl(17);
    /// [`LapIn`](super::LapIn): proposes an alternate path on an established connection.
    pub const LAP: u32 = ibcm_ioctl(18);
    /// [`AprIn`](super::AprIn) -> [`QpAttrOut`](super::QpAttrOut): pre-APR; for status
    /// success, the RTS attributes with the alternate path and migration state REARM.
    pub const PREPARE_APR: u32 = ibcm_ioctl(19);
    /// [`HandleIn`](super::HandleIn): sends the APR formatted by PREPARE_APR.
    pub const SEND_APR: u32 = ibcm_ioctl(20);
    /// [`SidrReqIn`](super::SidrReqIn): sends a SIDR_REQ.
    pub const SIDR_REQ: u32 = ibcm_ioctl(21);
    /// [`SidrRepIn`](super::SidrRepIn): answers a SIDR_REQ.
    pub const SIDR_REP: u32 = ibcm_ioctl(22);
    /// [`HandleIn`](super::HandleIn): the QP migrated to its alternate path.
    pub const MIGRATE: u32 = ibcm_ioctl(23);
    /// [`HandleIn`](super::HandleIn) -> [`QpTransitionsOut`](super::QpTransitionsOut): the
    /// INIT, RTR and RTS attributes at once, as the active side needs them once the REP
    /// arrived (one call where GET_QP_ATTR takes three).
    pub const GET_QP_TRANSITIONS: u32 = ibcm_ioctl(24);
    /// [`StatusIn`](super::StatusIn) -> [`StatusOut`](super::StatusOut): the HCAs and
    /// ports ibcm serves, which CM answers WinVerbs' and ndfltr's query on each HCA, and
    /// each port's QP1 route (`ibcm status`); the platform fills it
    /// (`Platform::fabric_status`), with no lock of the dispatch layer held.
    pub const STATUS: u32 = ibcm_ioctl(25);

    /// Every code, in order.
    pub const ALL: [u32; 26] = [
        VERSION,
        CREATE,
        DESTROY,
        LISTEN,
        CANCEL_LISTEN,
        CONNECT,
        FORMAT_REP,
        SEND_REP,
        RTU,
        REJ,
        MRA,
        DREQ,
        DREP,
        GET_QP_ATTR,
        QUERY,
        ESTABLISHED,
        GET_EVENT,
        COUNTERS,
        LAP,
        PREPARE_APR,
        SEND_APR,
        SIDR_REQ,
        SIDR_REP,
        MIGRATE,
        GET_QP_TRANSITIONS,
        STATUS,
    ];
}

/// Whether the driver may hold a request of `code` with an output buffer of `output_len`
/// bytes past its dispatch routine: GET_EVENT waits for an event, and CONNECT and
/// SEND_REP with an output buffer wait for the peer's answer (NetworkDirect's `Connect`
/// and `Accept`). Every other request is completed in EvtIoDeviceControl, so a caller
/// may issue it and wait for it on its own thread, off the completion port, as WinVerbs'
/// blocking calls do (core/winverbs/user/wv_base.cpp, WvDeviceIoControl without an
/// OVERLAPPED).
pub const fn may_pend(code: u32, output_len: usize) -> bool {
    code == code::GET_EVENT || (output_len > 0 && (code == code::CONNECT || code == code::SEND_REP))
}

/// NTSTATUS values the driver completes requests with (ntstatus.h).
pub mod status {
    /// STATUS_SUCCESS.
    pub const SUCCESS: i32 = 0;
    /// STATUS_PENDING (a GET_EVENT waiting for an event).
    pub const PENDING: i32 = 0x0000_0103;
    /// STATUS_INFO_LENGTH_MISMATCH: the input buffer is not the record's size.
    pub const INFO_LENGTH_MISMATCH: i32 = 0xC000_0004_u32 as i32;
    /// STATUS_INVALID_HANDLE: no endpoint of this file has the handle.
    pub const INVALID_HANDLE: i32 = 0xC000_0008_u32 as i32;
    /// STATUS_INVALID_PARAMETER: a field is out of range or a reserved field is set.
    pub const INVALID_PARAMETER: i32 = 0xC000_000D_u32 as i32;
    /// STATUS_INVALID_DEVICE_REQUEST: an unknown IOCTL code.
    pub const INVALID_DEVICE_REQUEST: i32 = 0xC000_0010_u32 as i32;
    /// STATUS_BUFFER_TOO_SMALL: the output buffer cannot hold the answer.
    pub const BUFFER_TOO_SMALL: i32 = 0xC000_0023_u32 as i32;
    /// STATUS_REVISION_MISMATCH: the VERSION handshake names another ABI.
    pub const REVISION_MISMATCH: i32 = 0xC000_0059_u32 as i32;
    /// STATUS_INSUFFICIENT_RESOURCES.
    pub const INSUFFICIENT_RESOURCES: i32 = 0xC000_009A_u32 as i32;
    /// STATUS_CANCELLED: the request was cancelled, or its endpoint destroyed.
    pub const CANCELLED: i32 = 0xC000_0120_u32 as i32;
    /// STATUS_INVALID_DEVICE_STATE: the endpoint's state does not allow the operation.
    pub const INVALID_DEVICE_STATE: i32 = 0xC000_0184_u32 as i32;
    /// STATUS_ADDRESS_ALREADY_EXISTS: a listen exists that could take the same REQs
    /// (same service ID under both masks, a port and compare data both can match).
    pub const ADDRESS_ALREADY_EXISTS: i32 = 0xC000_020A_u32 as i32;
    /// STATUS_ACCESS_DENIED: the operation needs an administrator's handle (a listen with
    /// a partial service mask, a QPN bound to another handle's connection).
    pub const ACCESS_DENIED: i32 = 0xC000_0022_u32 as i32;
    /// STATUS_QUOTA_EXCEEDED: the handle holds its quota of endpoints, listens, backlog
    /// or queued event records, or all users' handles together hold their budget of
    /// endpoints, listens or backlog (docs/security.md, "Quotas").
    pub const QUOTA_EXCEEDED: i32 = 0xC000_0044_u32 as i32;
    /// STATUS_FILE_CLOSED: the handle's cleanup ran (IRP_MJ_CLEANUP); it takes no more
    /// IOCTLs.
    pub const FILE_CLOSED: i32 = 0xC000_0128_u32 as i32;
    /// STATUS_DEVICE_REMOVED: the port or HCA is gone.
    pub const DEVICE_REMOVED: i32 = 0xC000_02B6_u32 as i32;
    /// STATUS_DEVICE_NOT_READY: the local port named is down (not Active); try again
    /// once it is back.
    pub const DEVICE_NOT_READY: i32 = 0xC000_00A3_u32 as i32;
    /// STATUS_IO_TIMEOUT: a request went unanswered (event status).
    pub const IO_TIMEOUT: i32 = 0xC000_00B5_u32 as i32;
    /// STATUS_CONNECTION_REFUSED: the peer rejected (event status).
    pub const CONNECTION_REFUSED: i32 = 0xC000_0236_u32 as i32;
}

/// The Win32 path of ibcm's control device, the one device user mode opens whatever the
/// number of HCAs: the driver creates `\Device\ibcm` with the symbolic link
/// `\DosDevices\Global\ibcm` (`driver/kmdf/control.rs`).
pub const DEVICE_PATH: &str = r"\\.\ibcm";

/// Maximum private data: REQ 92, REP 196, REJ 148 (+ 72 ARI), MRA 222, RTU 224,
/// DREQ 220, DREP 224 (IBA Tables 106-113).
pub mod limits {
    /// REQ private data.
    pub const REQ_PRIVATE_DATA: usize = 92;
    /// REP private data.
    pub const REP_PRIVATE_DATA: usize = 196;
    /// REJ private data.
    pub const REJ_PRIVATE_DATA: usize = 148;
    /// REJ additional rejection information.
    pub const REJ_ARI: usize = 72;
    /// MRA private data.
    pub const MRA_PRIVATE_DATA: usize = 222;
    /// RTU and DREP private data.
    pub const RTU_PRIVATE_DATA: usize = 224;
    /// DREQ private data.
    pub const DREQ_PRIVATE_DATA: usize = 220;
    /// The largest private data of any message.
    pub const PRIVATE_DATA: usize = 224;
}

macro_rules! record {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty,)* } size $size:expr) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
        pub struct $name { $($(#[$fm])* pub $f: $t,)* }
        const _: () = assert!(core::mem::size_of::<$name>() == $size);
        impl $name {
            /// The record's size, as its `size` field must say.
            pub const SIZE: u32 = $size;
        }
    };
}

record! {
    /// VERSION input: the ABI the caller speaks.
    pub struct VersionIn {
        /// `size_of::<VersionIn>()`.
        pub size: u32,
        /// Must be [`ABI_VERSION`].
        pub abi_version: u32,
    } size 8
}

record! {
    /// VERSION output.
    pub struct VersionOut {
        /// `size_of::<VersionOut>()`.
        pub size: u32,
        /// The driver's ABI version.
        pub abi_version: u32,
        /// Size of one [`EventRecord`].
        pub event_record_size: u32,
        /// Most events one GET_EVENT returns.
        pub max_events_per_request: u32,
    } size 16
}

record! {
    /// CREATE input.
    pub struct CreateIn {
        /// `size_of::<CreateIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
    } size 8
}

record! {
    /// CREATE output.
    pub struct CreateOut {
        /// `size_of::<CreateOut>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The new endpoint.
        pub handle: u64,
    } size 16
}

record! {
    /// Input of the operations that only name an endpoint (DESTROY, CANCEL_LISTEN,
    /// SEND_REP, QUERY, ESTABLISHED, GET_EVENT).
    pub struct HandleIn {
        /// `size_of::<HandleIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint.
        pub handle: u64,
    } size 16
}

record! {
    /// LISTEN input.
    pub struct ListenIn {
        /// `size_of::<ListenIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint (idle).
        pub handle: u64,
        /// Service ID.
        pub service_id: u64,
        /// Service ID bits that must match.
        pub service_mask: u64,
        /// REQs waiting to be retrieved before new ones are dropped (1..=4096).
        pub backlog: u32,
        /// Port number, 0 for any.
        pub port: u8,
        /// Offset of the compare bytes in the REQ private data.
        pub compare_offset: u8,
        /// Number of compare bytes (0: no compare); offset + length <= 92.
        pub compare_len: u8,
        /// Zero.
        pub reserved1: u8,
        /// Compare bytes.
        pub compare: [u8; 92],
        /// Zero.
        pub reserved2: [u8; 4],
    } size 136
}

record! {
    /// A path record (from this side's point of view).
    pub struct PathAbi {
        /// Local LID.
        pub slid: u16,
        /// Remote LID.
        pub dlid: u16,
        /// Flow label (20 bits).
        pub flow_label: u32,
        /// Local GID.
        pub sgid: [u8; 16],
        /// Remote GID.
        pub dgid: [u8; 16],
        /// Traffic class.
        pub traffic_class: u8,
        /// Hop limit.
        pub hop_limit: u8,
        /// Service level (4 bits).
        pub sl: u8,
        /// Static rate code (6 bits).
        pub rate: u8,
        /// Packet life time (5 bits).
        pub packet_life_time: u8,
        /// 1 if the remote port is on the local subnet, else 0.
        pub subnet_local: u8,
        /// Zero.
        pub reserved: [u8; 2],
    } size 48
}

/// Flags of [`ConnectIn::flags`] and [`FormatRepIn::flags`].
pub mod flags {
    /// `starting_psn` is given (otherwise the driver picks a random PSN).
    pub const PSN_GIVEN: u32 = 1;
    /// CONNECT: `alternate` holds an alternate path.
    pub const ALTERNATE_PATH: u32 = 1 << 1;
    /// The QP uses an SRQ.
    pub const SRQ: u32 = 1 << 2;
    /// End-to-end flow control.
    pub const FLOW_CONTROL: u32 = 1 << 3;
    /// CONNECT: peer-to-peer (the peer's crossing REQ for the service settles who answers).
    pub const PEER_TO_PEER: u32 = 1 << 4;
    /// Every defined flag.
    pub const ALL: u32 = PSN_GIVEN | ALTERNATE_PATH | SRQ | FLOW_CONTROL | PEER_TO_PEER;
}

/// Transport codes of [`ConnectIn::transport`].
pub mod transport {
    /// Reliable Connected.
    pub const RC: u8 = 0;
    /// Unreliable Connected.
    pub const UC: u8 = 1;
    /// Reliable Datagram.
    pub const RD: u8 = 2;
    /// XRC.
    pub const XRC: u8 = 3;
}

record! {
    /// CONNECT input: the REQ.
    pub struct ConnectIn {
        /// `size_of::<ConnectIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint (idle).
        pub handle: u64,
        /// Service ID.
        pub service_id: u64,
        /// Local QPN (24 bits).
        pub qpn: u32,
        /// Starting PSN (24 bits), if `flags` has PSN_GIVEN.
        pub starting_psn: u32,
        /// [`flags`].
        pub flags: u32,
        /// Partition key.
        pub pkey: u16,
        /// Local port.
        pub port: u8,
        /// [`transport`] code.
        pub transport: u8,
        /// Path MTU code (1..=5).
        pub path_mtu: u8,
        /// Responder resources.
        pub responder_resources: u8,
        /// Initiator depth.
        pub initiator_depth: u8,
        /// RemoteCMResponseTimeout (5 bits).
        pub remote_cm_response_timeout: u8,
        /// LocalCMResponseTimeout (5 bits).
        pub local_cm_response_timeout: u8,
        /// Retry count (3 bits).
        pub retry_count: u8,
        /// RNR retry count (3 bits).
        pub rnr_retry_count: u8,
        /// Max CM retries (4 bits).
        pub max_cm_retries: u8,
        /// Bytes of `private_data` used (<= 92).
        pub private_data_len: u8,
        /// Zero.
        pub reserved1: [u8; 3],
        /// Primary path.
        pub primary: PathAbi,
        /// Alternate path (if `flags` has ALTERNATE_PATH; else zero).
        pub alternate: PathAbi,
        /// REQ private data.
        pub private_data: [u8; 92],
    } size 240
}

record! {
    /// FORMAT_REP input: the REP (pre-REP).
    pub struct FormatRepIn {
        /// `size_of::<FormatRepIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint (a retrieved connection request).
        pub handle: u64,
        /// Local QPN (24 bits).
        pub qpn: u32,
        /// Starting PSN (24 bits), if `flags` has PSN_GIVEN.
        pub starting_psn: u32,
        /// [`flags`] (ALTERNATE_PATH not allowed).
        pub flags: u32,
        /// Responder resources.
        pub responder_resources: u8,
        /// Initiator depth (<= the peer's responder resources).
        pub initiator_depth: u8,
        /// RNR retry count for the peer (3 bits).
        pub rnr_retry_count: u8,
        /// FailoverAccepted (0 accepted, 1 not supported, 2 rejected).
        pub failover_accepted: u8,
        /// Bytes of `private_data` used (<= 196).
        pub private_data_len: u8,
        /// Zero.
        pub reserved1: [u8; 3],
        /// REP private data.
        pub private_data: [u8; 196],
    } size 232
}

record! {
    /// An address vector.
    pub struct AvAbi {
        /// The path.
        pub path: PathAbi,
        /// Local port.
        pub port: u8,
        /// Local ACK timeout (5 bits).
        pub ack_timeout: u8,
        /// Zero.
        pub reserved: [u8; 6],
    } size 56
}

/// Bits of [`QpAttrAbi::mask`]: which fields are set.
pub mod qp_mask {
    /// port, pkey, access_flags.
    pub const INIT: u32 = 1;
    /// path_mtu, dest_qpn, rq_psn, max_dest_rd_atomic, primary.
    pub const RTR: u32 = 1 << 1;
    /// sq_psn, timeout, retry_count, rnr_retry, max_rd_atomic.
    pub const RTS: u32 = 1 << 2;
    /// alternate.
    pub const ALTERNATE: u32 = 1 << 3;
    /// path_mig_state.
    pub const PATH_MIG_STATE: u32 = 1 << 4;
}

/// QP states of [`GetQpAttrIn::qp_state`] and [`QpAttrAbi::state`].
pub mod qp_state {
    /// INIT.
    pub const INIT: u32 = 1;
    /// RTR.
    pub const RTR: u32 = 2;
    /// RTS.
    pub const RTS: u32 = 3;
}

record! {
    /// QP attributes of one transition.
    pub struct QpAttrAbi {
        /// [`qp_mask`] bits.
        pub mask: u32,
        /// [`qp_state`].
        pub state: u32,
        /// Port.
        pub port: u8,
        /// Path MTU code.
        pub path_mtu: u8,
        /// Max destination RDMA reads/atomics.
        pub max_dest_rd_atomic: u8,
        /// Local ACK timeout.
        pub timeout: u8,
        /// Retry count.
        pub retry_count: u8,
        /// RNR retry count.
        pub rnr_retry: u8,
        /// Max RDMA reads/atomics issued.
        pub max_rd_atomic: u8,
        /// 0 REARM, 1 MIGRATED.
        pub path_mig_state: u8,
        /// Partition key.
        pub pkey: u16,
        /// Zero.
        pub reserved: u16,
        /// `IB_ACCESS_*` flags.
        pub access_flags: u32,
        /// Destination QPN.
        pub dest_qpn: u32,
        /// Receive PSN.
        pub rq_psn: u32,
        /// Send PSN.
        pub sq_psn: u32,
        /// Zero.
        pub reserved1: u32,
        /// Primary address vector.
        pub primary: AvAbi,
        /// Alternate address vector.
        pub alternate: AvAbi,
    } size 152
}

record! {
    /// FORMAT_REP and GET_QP_TRANSITIONS output: the QP transitions to make (before
    /// SEND_REP on the passive side, before RTU on the active side).
    pub struct QpTransitionsOut {
        /// `size_of::<QpTransitionsOut>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// Reset -> INIT.
        pub init: QpAttrAbi,
        /// INIT -> RTR.
        pub rtr: QpAttrAbi,
        /// RTR -> RTS.
        pub rts: QpAttrAbi,
    } size 464
}

record! {
    /// GET_QP_ATTR input.
    pub struct GetQpAttrIn {
        /// `size_of::<GetQpAttrIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint.
        pub handle: u64,
        /// [`qp_state`].
        pub qp_state: u32,
        /// Zero.
        pub reserved1: u32,
    } size 24
}

record! {
    /// GET_QP_ATTR output.
    pub struct QpAttrOut {
        /// `size_of::<QpAttrOut>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The attributes.
        pub attr: QpAttrAbi,
    } size 160
}

record! {
    /// RTU, DREQ and DREP input: private data only.
    pub struct PrivateDataIn {
        /// `size_of::<PrivateDataIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint.
        pub handle: u64,
        /// Bytes of `private_data` used (RTU/DREP <= 224, DREQ <= 220).
        pub private_data_len: u8,
        /// Zero.
        pub reserved1: [u8; 7],
        /// Private data.
        pub private_data: [u8; 224],
    } size 248
}

record! {
    /// REJ input.
    pub struct RejIn {
        /// `size_of::<RejIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint.
        pub handle: u64,
        /// Reason (IBA Table 109).
        pub reason: u16,
        /// Bytes of `ari` used (<= 72).
        pub ari_len: u8,
        /// Bytes of `private_data` used (<= 148).
        pub private_data_len: u8,
        /// Zero.
        pub reserved1: u32,
        /// Additional rejection information.
        pub ari: [u8; 72],
        /// Private data.
        pub private_data: [u8; 148],
        /// Zero.
        pub reserved2: [u8; 4],
    } size 248
}

record! {
    /// MRA input.
    pub struct MraIn {
        /// `size_of::<MraIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint.
        pub handle: u64,
        /// ServiceTimeout (5 bits).
        pub service_timeout: u8,
        /// Bytes of `private_data` used (<= 222).
        pub private_data_len: u8,
        /// Zero.
        pub reserved1: [u8; 6],
        /// Private data.
        pub private_data: [u8; 222],
        /// Zero.
        pub reserved2: [u8; 2],
    } size 248
}

/// Endpoint states of [`QueryOut::state`] (the CEP states of IBA 12.9.6).
pub mod ep_state {
    /// Idle.
    pub const IDLE: u32 = 0;
    /// Listening.
    pub const LISTEN: u32 = 1;
    /// REQ sent.
    pub const REQ_SENT: u32 = 2;
    /// REQ sent, MRA received.
    pub const MRA_REQ_RCVD: u32 = 3;
    /// REQ received.
    pub const REQ_RCVD: u32 = 4;
    /// REQ received, MRA sent.
    pub const MRA_REQ_SENT: u32 = 5;
    /// REP formatted, not sent.
    pub const REP_PREPARED: u32 = 6;
    /// REP sent.
    pub const REP_SENT: u32 = 7;
    /// REP sent, MRA received.
    pub const MRA_REP_RCVD: u32 = 8;
    /// REP received.
    pub const REP_RCVD: u32 = 9;
    /// REP received, MRA sent.
    pub const MRA_REP_SENT: u32 = 10;
    /// Established.
    pub const ESTABLISHED: u32 = 11;
    /// DREQ sent.
    pub const DREQ_SENT: u32 = 12;
    /// DREQ received.
    pub const DREQ_RCVD: u32 = 13;
    /// Timewait.
    pub const TIMEWAIT: u32 = 14;
    /// The port or HCA was removed.
    pub const REMOVED: u32 = 15;
    /// SIDR_REQ sent.
    pub const SIDR_REQ_SENT: u32 = 16;
    /// SIDR_REQ received.
    pub const SIDR_REQ_RCVD: u32 = 17;
    /// SIDR_REP sent (remembered to answer repeats).
    pub const SIDR_REP_SENT: u32 = 18;
}

record! {
    /// QUERY output.
    pub struct QueryOut {
        /// `size_of::<QueryOut>()`.
        pub size: u32,
        /// [`ep_state`].
        pub state: u32,
        /// The peer's CA GUID.
        pub remote_ca_guid: u64,
        /// Timewait duration in ns.
        pub timewait_ns: u64,
        /// Local QPN.
        pub local_qpn: u32,
        /// Remote QPN.
        pub remote_qpn: u32,
        /// 1 if this side sent the REQ.
        pub active: u8,
        /// Local port.
        pub port: u8,
        /// The peer's responder resources (bounds this side's initiator depth).
        pub peer_responder_resources: u8,
        /// The peer's initiator depth.
        pub peer_initiator_depth: u8,
        /// 1 if `alternate` is set.
        pub has_alternate: u8,
        /// Bytes of `private_data` used.
        pub private_data_len: u8,
        /// Zero.
        pub reserved: [u8; 2],
        /// Primary path.
        pub primary: PathAbi,
        /// Alternate path.
        pub alternate: PathAbi,
        /// The private data of the last message received.
        pub private_data: [u8; 224],
    } size 360
}

/// Event types of [`EventRecord::event_type`].
pub mod event_type {
    /// A REQ reached a listen: `new_handle` is the new endpoint (already owned by this
    /// file), reported on the listen's endpoint.
    pub const REQ_RECEIVED: u32 = 1;
    /// REP received (active side).
    pub const REP_RECEIVED: u32 = 2;
    /// RTU received: established (passive side).
    pub const RTU_RECEIVED: u32 = 3;
    /// MRA received.
    pub const MRA_RECEIVED: u32 = 4;
    /// REJ received: `reason`, `message`, `ari`, private data.
    pub const REJECTED: u32 = 5;
    /// A request went unanswered: `message` is its attribute ID.
    pub const TIMEOUT: u32 = 6;
    /// DREQ received.
    pub const DREQ_RECEIVED: u32 = 7;
    /// DREP received.
    pub const DREP_RECEIVED: u32 = 8;
    /// Timewait over: the QP may be reused.
    pub const TIMEWAIT_EXIT: u32 = 9;
    /// The port or HCA was removed.
    pub const DEVICE_REMOVAL: u32 = 10;
    /// LAP received: `alternate` is the proposed path; answer with PREPARE_APR/SEND_APR.
    pub const LAP_RECEIVED: u32 = 11;
    /// APR received: `reason` is the AP status, `ari` the additional info.
    pub const APR_RECEIVED: u32 = 12;
    /// SIDR_REQ reached a listen: `new_handle` answers it with SIDR_REP; `primary` holds
    /// the requester's LID and GID.
    pub const SIDR_REQ_RECEIVED: u32 = 13;
    /// SIDR_REP received: `reason` is the SIDR status, `remote_qpn` the QPN, `remote_psn`
    /// the Q_Key, `ari` the additional info.
    pub const SIDR_REP_RECEIVED: u32 = 14;
}

record! {
    /// One event, as GET_EVENT returns it (several may follow each other in one output
    /// buffer).
    pub struct EventRecord {
        /// `size_of::<EventRecord>()`.
        pub size: u32,
        /// [`event_type`].
        pub event_type: u32,
        /// The endpoint the event belongs to.
        pub handle: u64,
        /// REQ_RECEIVED: the new endpoint.
        pub new_handle: u64,
        /// The peer's CA GUID.
        pub remote_ca_guid: u64,
        /// REQ_RECEIVED: the service ID.
        pub service_id: u64,
        /// NTSTATUS summary: SUCCESS, CONNECTION_REFUSED, IO_TIMEOUT, DEVICE_REMOVED.
        pub status: i32,
        /// The peer's QPN.
        pub remote_qpn: u32,
        /// The peer's starting PSN.
        pub remote_psn: u32,
        /// REJECTED: reason.
        pub reason: u16,
        /// REJECTED: message rejected (0 REQ, 1 REP, 2 other); TIMEOUT: attribute low byte.
        pub message: u8,
        /// REJECTED: bytes of `ari` used.
        pub ari_len: u8,
        /// Bytes of `private_data` used.
        pub private_data_len: u8,
        /// The port.
        pub port: u8,
        /// The peer's responder resources.
        pub peer_responder_resources: u8,
        /// The peer's initiator depth.
        pub peer_initiator_depth: u8,
        /// MRA_RECEIVED: service timeout.
        pub service_timeout: u8,
        /// REQ_RECEIVED: path MTU code.
        pub path_mtu: u8,
        /// REQ_RECEIVED: [`transport`] code.
        pub transport: u8,
        /// RNR retry count the peer asks for.
        pub rnr_retry_count: u8,
        /// 1 if the peer uses an SRQ.
        pub srq: u8,
        /// REP_RECEIVED: FailoverAccepted.
        pub failover_accepted: u8,
        /// REQ_RECEIVED: partition key.
        pub pkey: u16,
        /// 1 if `alternate` is set.
        pub has_alternate: u8,
        /// Zero.
        pub reserved: [u8; 3],
        /// REQ_RECEIVED: primary path (this side's view).
        pub primary: PathAbi,
        /// REQ_RECEIVED: alternate path.
        pub alternate: PathAbi,
        /// REJECTED: additional rejection information.
        pub ari: [u8; 72],
        /// Private data of the message.
        pub private_data: [u8; 224],
    } size 464
}

record! {
    /// COUNTERS input.
    pub struct CountersIn {
        /// `size_of::<CountersIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
    } size 8
}

record! {
    /// COUNTERS output: per attribute (index = attribute ID - 0x10; 11 = ClassPortInfo).
    pub struct CountersOut {
        /// `size_of::<CountersOut>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// MADs sent.
        pub sent: [u64; 12],
        /// MADs re-sent after a timeout.
        pub retries: [u64; 12],
        /// MADs received.
        pub received: [u64; 12],
        /// Duplicates received.
        pub duplicates: [u64; 12],
        /// MADs that failed to parse.
        pub malformed: u64,
        /// MADs for no endpoint or in the wrong state.
        pub unmatched: u64,
        /// REQs dropped over a listen's backlog.
        pub backlog_drops: u64,
        /// Messages naming a connection by its comm ID from an address the connection
        /// does not use: dropped as forged (docs/security.md, "A node").
        pub forged: u64,
        /// IOCTLs refused with STATUS_QUOTA_EXCEEDED (docs/security.md, "Quotas"); REQs
        /// refused over a user's quota or budget are not counted here.
        pub quota_exceeded: u64,
    } size 432
}

record! {
    /// STATUS input.
    pub struct StatusIn {
        /// `size_of::<StatusIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
    } size 8
}

/// What STATUS reports: the values of [`HcaStatus`] and [`PortStatus`] fields.
pub mod status_report {
    /// HCAs in one [`StatusOut`](super::StatusOut) (more are counted, not described).
    pub const MAX_HCAS: usize = 8;
    /// Ports in one [`StatusOut`](super::StatusOut).
    pub const MAX_PORTS: usize = 16;

    /// `HcaStatus::cm`: ibcm answers the query for `GUID_INFINIBAND_INTERFACE_CM` 1.1.
    pub const CM_IBCM: u8 = 1;
    /// `HcaStatus::cm`: AL's CM answers (ibcm passes the query down): no QP1 route on
    /// the HCA (`HcaStatus::no_route` says why).
    pub const CM_AL_NO_ROUTE: u8 = 2;
    /// `HcaStatus::cm`: AL's CM answers: ibcm's CM has no port yet (or is being
    /// removed).
    pub const CM_AL_NOT_READY: u8 = 3;
    /// `HcaStatus::cm`: AL's CM answers: ibcm was switched off (`Parameters\Disabled`)
    /// when the driver last read the switch, at an HCA's start.
    pub const CM_AL_SWITCHED_OFF: u8 = 4;
    /// `HcaStatus::cm`: AL's CM answers on every HCA although this one has a QP1 route:
    /// the host's one verdict (WinVerbs keeps one CM for all HCAs) is AL's, because
    /// another HCA had no QP1 route, or no ibcm in its stack, when the first CM query
    /// came (`StatusOut::hcas_without_ibcm` counts the latter).
    pub const CM_AL_HOST_VERDICT: u8 = 5;

    /// `HcaStatus::route` / `PortStatus::route`: none (AL's CM gets the CM MADs).
    pub const ROUTE_NONE: u8 = 0;
    /// The ordinary CM MAD service ({Send, Get} on the port's QP1 alias).
    pub const ROUTE_ORDINARY: u8 = 1;
    /// QP1 steering by the verbs hook ({M, Get} with a private method M).
    pub const ROUTE_STEERING: u8 = 2;
}

record! {
    /// One HCA in [`StatusOut`].
    pub struct HcaStatus {
        /// The CA GUID (host order; 0 while IBAL is not bound).
        pub ca_guid: u64,
        /// Which CM answers WinVerbs' and ndfltr's query now (`status_report::CM_*`).
        pub cm: u8,
        /// The HCA's QP1 route (`status_report::ROUTE_*`).
        pub route: u8,
        /// Without a route, why: `ibcm_qp1_hook::NoRoute::code` (0 with a route).
        pub no_route: u8,
        /// What became of ibbus's verbs table: `ibcm_qp1_hook::Table::code`.
        pub verbs_table: u8,
        /// Zero.
        pub reserved: u32,
    } size 16
}

record! {
    /// One port in [`StatusOut`].
    pub struct PortStatus {
        /// The CA GUID (host order).
        pub ca_guid: u64,
        /// The CA's port number.
        pub ca_port: u8,
        /// ibcm's host-wide port number (what paths and QP attributes name).
        pub host_port: u8,
        /// The port's QP1 route (`status_report::ROUTE_*`).
        pub route: u8,
        /// With steering, the private method M (0 otherwise).
        pub private_method: u8,
        /// Zero.
        pub reserved: u32,
    } size 16
}

record! {
    /// STATUS output. `hca_count` / `port_count` may exceed the arrays: the rest are
    /// not described.
    pub struct StatusOut {
        /// `size_of::<StatusOut>()`.
        pub size: u32,
        /// HCAs the access layer reports that have no ibcm in their device stack (an
        /// older driver writes zero here).
        pub hcas_without_ibcm: u32,
        /// HCAs ibcm's filter is on.
        pub hca_count: u32,
        /// Ports ibcm has bound.
        pub port_count: u32,
        /// The first [`status_report::MAX_HCAS`] HCAs.
        pub hcas: [HcaStatus; status_report::MAX_HCAS],
        /// The first [`status_report::MAX_PORTS`] ports.
        pub ports: [PortStatus; status_report::MAX_PORTS],
    } size 400
}

record! {
    /// LAP input.
    pub struct LapIn {
        /// `size_of::<LapIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint (established).
        pub handle: u64,
        /// The alternate path to load.
        pub alternate: PathAbi,
        /// Bytes of `private_data` used (<= 168).
        pub private_data_len: u8,
        /// Zero.
        pub reserved1: [u8; 7],
        /// Private data.
        pub private_data: [u8; 168],
    } size 240
}

record! {
    /// PREPARE_APR input.
    pub struct AprIn {
        /// `size_of::<AprIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint (a LAP received).
        pub handle: u64,
        /// AP status (IBA Table 117).
        pub status: u8,
        /// Bytes of `info` used (<= 72).
        pub info_len: u8,
        /// Bytes of `private_data` used (<= 148).
        pub private_data_len: u8,
        /// Zero.
        pub reserved1: [u8; 5],
        /// Additional information.
        pub info: [u8; 72],
        /// Private data.
        pub private_data: [u8; 148],
        /// Zero.
        pub reserved2: [u8; 4],
    } size 248
}

record! {
    /// SIDR_REQ input.
    pub struct SidrReqIn {
        /// `size_of::<SidrReqIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint (idle).
        pub handle: u64,
        /// The service to resolve.
        pub service_id: u64,
        /// Partition key.
        pub pkey: u16,
        /// Local port.
        pub port: u8,
        /// Responder timeout (5 bits).
        pub timeout: u8,
        /// Retries (4 bits).
        pub max_retries: u8,
        /// Bytes of `private_data` used (<= 216).
        pub private_data_len: u8,
        /// Zero.
        pub reserved1: [u8; 2],
        /// The path to the responder.
        pub path: PathAbi,
        /// Private data.
        pub private_data: [u8; 216],
    } size 296
}

record! {
    /// SIDR_REP input.
    pub struct SidrRepIn {
        /// `size_of::<SidrRepIn>()`.
        pub size: u32,
        /// Zero.
        pub reserved: u32,
        /// The endpoint (a SIDR_REQ received).
        pub handle: u64,
        /// The service's UD QPN (24 bits).
        pub qpn: u32,
        /// The service's Q_Key.
        pub qkey: u32,
        /// SIDR status (IBA Table 121).
        pub status: u8,
        /// Bytes of `info` used (<= 72).
        pub info_len: u8,
        /// Bytes of `private_data` used (<= 136).
        pub private_data_len: u8,
        /// Zero.
        pub reserved1: [u8; 5],
        /// Additional information.
        pub info: [u8; 72],
        /// Private data.
        pub private_data: [u8; 136],
    } size 240
}

/// The most events one GET_EVENT returns (its output buffer may hold fewer).
pub const MAX_EVENTS_PER_REQUEST: u32 = 64;

/// A record read from an input buffer: exact length, `size` field equal to the record's
/// size. Reserved fields are checked by the caller, which knows them.
pub fn read_record<T: FromBytes + KnownLayout + Immutable>(input: &[u8]) -> Option<T> {
    T::read_from_bytes(input).ok()
}

/// The largest input record of any IOCTL: a longer input buffer is refused
/// (STATUS_INFO_LENGTH_MISMATCH) before it is copied into nonpaged pool.
pub const MAX_INPUT_SIZE: usize = {
    let sizes = [
        VersionIn::SIZE,
        CreateIn::SIZE,
        HandleIn::SIZE,
        ListenIn::SIZE,
        ConnectIn::SIZE,
        FormatRepIn::SIZE,
        GetQpAttrIn::SIZE,
        PrivateDataIn::SIZE,
        RejIn::SIZE,
        MraIn::SIZE,
        CountersIn::SIZE,
        LapIn::SIZE,
        AprIn::SIZE,
        SidrReqIn::SIZE,
        SidrRepIn::SIZE,
    ];
    let mut max = 0;
    let mut i = 0;
    while i < sizes.len() {
        if sizes[i] > max {
            max = sizes[i];
        }
        i += 1;
    }
    max as usize
};

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;
    use zerocopy::FromZeros;

    #[test]
    fn ioctl_codes_follow_ctl_code() {
        // CTL_CODE(0x3B, 0x800, METHOD_BUFFERED, FILE_READ_DATA|FILE_WRITE_DATA):
        // 0x3B << 16 | 3 << 14 | 0x800 << 2 | 0 = 0x003BE000 (WinVerbs uses the same base).
        assert_eq!(code::VERSION, 0x003B_E000);
        assert_eq!(code::CREATE, 0x003B_E004);
        assert_eq!(code::COUNTERS, 0x003B_E044);
        assert_eq!(code::MIGRATE, 0x003B_E05C);
        assert_eq!(code::STATUS, 0x003B_E064);
        for (n, c) in code::ALL.iter().enumerate() {
            assert_eq!(*c, 0x003B_E000 + 4 * n as u32);
        }
    }

    #[test]
    fn offsets_are_fixed() {
        assert_eq!(offset_of!(ListenIn, compare), 40);
        assert_eq!(offset_of!(ConnectIn, primary), 52);
        assert_eq!(offset_of!(ConnectIn, alternate), 100);
        assert_eq!(offset_of!(ConnectIn, private_data), 148);
        assert_eq!(offset_of!(FormatRepIn, private_data), 36);
        assert_eq!(offset_of!(QpAttrAbi, primary), 40);
        assert_eq!(offset_of!(QueryOut, primary), 40);
        assert_eq!(offset_of!(EventRecord, primary), 72);
        assert_eq!(offset_of!(EventRecord, private_data), 240);
        assert_eq!(offset_of!(RejIn, ari), 24);
        assert_eq!(offset_of!(MraIn, private_data), 24);
        assert_eq!(offset_of!(CountersOut, malformed), 392);
        assert_eq!(offset_of!(StatusOut, hcas), 16);
        assert_eq!(offset_of!(StatusOut, ports), 144);
        assert_eq!(offset_of!(PortStatus, route), 10);
    }

    #[test]
    fn records_round_trip_through_bytes() {
        let mut e = EventRecord::new_zeroed();
        e.size = EventRecord::SIZE;
        e.event_type = event_type::REJECTED;
        e.private_data[223] = 7;
        let bytes = e.as_bytes();
        assert_eq!(bytes.len(), 464);
        assert_eq!(read_record::<EventRecord>(bytes), Some(e));
        assert_eq!(read_record::<EventRecord>(&bytes[..463]), None);
    }
}
