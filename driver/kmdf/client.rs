//! The kernel-client interface: what another driver (a WinVerbs or NetworkDirect kernel
//! provider) obtains with `IRP_MN_QUERY_INTERFACE` on our device, shaped like WinOF's
//! `INFINIBAND_INTERFACE_CM` (`inc/kernel/iba/ib_cm_ifc.h`): the `INTERFACE` header, then a
//! table of C functions. Each function is a trampoline onto the client calls of
//! [`ibcm_endpoint::Device`] (`device/client.rs` documents the guarantees: one callback per
//! endpoint at a time, in order; synchronous `destroy_id`; a non-zero callback return
//! destroys the endpoint).
//!
//! - Interface type: [`IBCM_CLIENT_INTERFACE_GUID`], a GUID of its own kept here (it is a
//!   kernel contract, not part of the user-mode IOCTL ABI in `ibcm-ioctl`); version
//!   [`IBCM_CLIENT_INTERFACE_VERSION`] = 1.0 in iba_cm's `IbaCmVersion(major, minor)`
//!   encoding. The framework answers the query (`WdfDeviceAddQueryInterface`); a client
//!   checks `InterfaceHeader.Version` and calls `InterfaceDereference` when done, before our
//!   device is removed (it should watch our device with a target-device-change
//!   notification). `Context` is the device; the reference callbacks are no-ops, as
//!   `WdfDeviceInterfaceReferenceNoOp`.
//! - Endpoints are `IbcmHandle`s: opaque pointers, like iba_cm's `iba_cm_id*`. A handle is
//!   the client's from `create_id`/`get_request`/`get_request_ex` until `destroy_id`, or until
//!   a callback on it returns non-zero (the dispatch layer then destroys the endpoint and the
//!   handle with it). Do not do both.
//! - Calls are made at PASSIVE_LEVEL (they may allocate and wait), like iba_cm's.
//! - Callbacks run at IRQL <= DISPATCH_LEVEL with no lock held, like iba_cm's; they may call
//!   any function of this interface on their own endpoint.
//! - Parameters are converted field by field with total conversions; the dispatch layer
//!   validates them (a failed call changes nothing) and its `CmError` becomes an NTSTATUS
//!   with `ibcm_endpoint::status_of`. The only checks here are of the C calling convention:
//!   null pointers where a value is required, a byte count with a null buffer, and a QP state
//!   code outside the three the ABI defines.
//! - Event and QP-attribute records are flat `#[repr(C)]` structures: every `Option` of the
//!   engine's types becomes a validity bit, every enum its wire code; event types reuse the
//!   numbering of `ibcm_ioctl::event_type`.

use alloc::sync::Arc;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};

use ibcm_cep::{
    AddressVector, CmError, ConnectParams, Event, ListenParams, MadAddress, MigrationState,
    PathRecord, PreparedRep, QpAttributes, QpState, RejectParams, RepParams, SidrParams,
    SidrReplyParams,
};
use ibcm_endpoint::{Callback, ClientEvent, ClientId, Device, Lock, status_of};
use ibcm_ioctl::{event_type, qp_state};
use ibcm_mad::{AprStatus, Failover, Mtu, Rate, RejReason, SidrStatus, Transport};
use wdk_sys::{
    GUID, INTERFACE, NTSTATUS, PVOID, STATUS_DEVICE_NOT_READY, STATUS_INSUFFICIENT_RESOURCES,
    STATUS_INVALID_HANDLE, STATUS_INVALID_PARAMETER, STATUS_NO_MORE_ENTRIES, STATUS_SUCCESS,
    WDF_QUERY_INTERFACE_CONFIG, WDFDEVICE,
};

use crate::device::DeviceState;
use crate::platform::{KmdfLock, KmdfPlatform};
use crate::wdf;

/// The interface type: {94845fc5-a733-4d16-8a61-4ca4ba293668}.
pub static IBCM_CLIENT_INTERFACE_GUID: GUID = wdf::guid((
    0x9484_5fc5,
    0xa733,
    0x4d16,
    [0x8a, 0x61, 0x4c, 0xa4, 0xba, 0x29, 0x36, 0x68],
));

/// Version 1.0: `major << 8 | minor` (ib_cm_ifc.h `IbaCmVersion`).
pub const IBCM_CLIENT_INTERFACE_VERSION: u16 = 1 << 8;

/// A client's endpoint. Opaque to the client.
pub struct ClientHandle {
    /// The dispatch layer's identifier, known once the endpoint exists (set by the creating
    /// call, or by the first callback if it comes first).
    id: KmdfLock<Option<ClientId>>,
    /// The client's reference was released (by `destroy_id` or a non-zero callback return).
    released: AtomicBool,
}

/// The endpoint handle clients hold.
pub type IbcmHandle = *const ClientHandle;

/// A client's callback: its context, the endpoint, the event. Return 0 to keep the
/// endpoint, non-zero to have it destroyed (the handle is then invalid).
pub type IbcmCallback =
    unsafe extern "C" fn(client_context: PVOID, handle: IbcmHandle, event: *const IbcmEvent) -> i32;

/// A path (`ibcm_cep::PathRecord`); `rate` is the IBA rate code.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbcmPath {
    pub slid: u16,
    pub dlid: u16,
    pub flow_label: u32,
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub sl: u8,
    pub rate: u8,
    pub packet_life_time: u8,
    pub subnet_local: u8,
    pub reserved: [u8; 2],
}

/// A MAD address (`ibcm_cep::MadAddress`): the requester of a SIDR_REQ.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbcmAddress {
    pub lid: u16,
    pub pkey: u16,
    pub gid: [u8; 16],
    pub port: u8,
    pub sl: u8,
    pub grh: u8,
    pub reserved: u8,
}

/// `listen` parameters (`ibcm_cep::ListenParams`); `port` 0 listens on every port,
/// `compare_len` 0 compares no private data.
#[repr(C)]
pub struct IbcmListen {
    pub service_id: u64,
    pub service_mask: u64,
    pub compare: *const u8,
    pub backlog: u32,
    pub port: u8,
    pub compare_offset: u8,
    pub compare_len: u8,
    pub reserved: u8,
}

/// `send_req` parameters (`ibcm_cep::ConnectParams`). `alternate` is used when
/// `has_alternate` is 1, `starting_psn` when `psn_given` is 1; the transport is
/// TransportServiceType and ExtendedTransportType as on the wire.
#[repr(C)]
pub struct IbcmReq {
    pub service_id: u64,
    pub primary: IbcmPath,
    pub alternate: IbcmPath,
    pub private_data: *const u8,
    pub qpn: u32,
    pub starting_psn: u32,
    pub pkey: u16,
    pub port: u8,
    pub has_alternate: u8,
    pub psn_given: u8,
    pub transport_service_type: u8,
    pub extended_transport: u8,
    pub path_mtu: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub remote_cm_response_timeout: u8,
    pub local_cm_response_timeout: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub max_cm_retries: u8,
    pub srq: u8,
    pub flow_control: u8,
    pub private_data_len: u8,
    pub reserved: [u8; 2],
}

/// `format_rep`/`send_rep` parameters (`ibcm_cep::RepParams`).
#[repr(C)]
pub struct IbcmRep {
    pub private_data: *const u8,
    pub qpn: u32,
    pub starting_psn: u32,
    pub psn_given: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry_count: u8,
    pub failover_accepted: u8,
    pub flow_control: u8,
    pub srq: u8,
    pub private_data_len: u8,
}

/// `send_sidr_req` parameters (`ibcm_cep::SidrParams`).
#[repr(C)]
pub struct IbcmSidrReq {
    pub service_id: u64,
    pub path: IbcmPath,
    pub private_data: *const u8,
    pub pkey: u16,
    pub port: u8,
    pub timeout: u8,
    pub max_retries: u8,
    pub private_data_len: u8,
    pub reserved: [u8; 2],
}

/// `send_sidr_rep` parameters (`ibcm_cep::SidrReplyParams`).
#[repr(C)]
pub struct IbcmSidrRep {
    pub info: *const u8,
    pub private_data: *const u8,
    pub qpn: u32,
    pub qkey: u32,
    pub status: u8,
    pub info_len: u8,
    pub private_data_len: u8,
    pub reserved: u8,
}

/// An address vector (`ibcm_cep::AddressVector`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbcmAv {
    pub path: IbcmPath,
    pub port: u8,
    pub ack_timeout: u8,
    pub reserved: [u8; 6],
}

/// Bits of [`IbcmQpAttr::valid`]: one per optional field of `ibcm_cep::QpAttributes`.
pub mod qp_valid {
    pub const PORT: u32 = 1;
    pub const PKEY: u32 = 1 << 1;
    pub const ACCESS_FLAGS: u32 = 1 << 2;
    pub const PATH_MTU: u32 = 1 << 3;
    pub const DEST_QPN: u32 = 1 << 4;
    pub const RQ_PSN: u32 = 1 << 5;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 6;
    pub const PRIMARY: u32 = 1 << 7;
    pub const ALTERNATE: u32 = 1 << 8;
    pub const SQ_PSN: u32 = 1 << 9;
    pub const TIMEOUT: u32 = 1 << 10;
    pub const RETRY_COUNT: u32 = 1 << 11;
    pub const RNR_RETRY: u32 = 1 << 12;
    pub const MAX_RD_ATOMIC: u32 = 1 << 13;
    pub const PATH_MIG_STATE: u32 = 1 << 14;
}

/// QP attributes of one transition (`ibcm_cep::QpAttributes`). `state` is an
/// `ibcm_ioctl::qp_state` code; `path_mig_state` 0 is REARM, 1 MIGRATED.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbcmQpAttr {
    pub valid: u32,
    pub state: u32,
    pub port: u8,
    pub path_mtu: u8,
    pub max_dest_rd_atomic: u8,
    pub timeout: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
    pub path_mig_state: u8,
    pub pkey: u16,
    pub reserved: u16,
    pub access_flags: u32,
    pub dest_qpn: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub primary: IbcmAv,
    pub alternate: IbcmAv,
}

/// One event (`ibcm_cep::Event`), flat: the fields its `event_type` names are set, the rest
/// are zero.
///
/// - REQ_RECEIVED: port, service_id, remote_ca_guid, remote_qpn, pkey, primary, alternate
///   (has_alternate), path_mtu, transport, peer_responder_resources, peer_initiator_depth,
///   rnr_retry_count, srq, private data. Take the new endpoint with `get_request`.
/// - REP_RECEIVED: remote_ca_guid, remote_qpn, remote_psn, peer read limits,
///   failover_accepted, srq, private data.
/// - RTU/DREQ/DREP_RECEIVED: private data. MRA_RECEIVED: service_timeout.
/// - REJECTED: reason, message, ari, private data. TIMEOUT: attribute.
/// - LAP_RECEIVED: alternate, private data. APR_RECEIVED: reason (AP status), ari (info),
///   private data.
/// - SIDR_REQ_RECEIVED: port, service_id, pkey, source, private data.
/// - SIDR_REP_RECEIVED: reason (SIDR status), remote_qpn (QPN), qkey, ari (info), private
///   data.
/// - DEVICE_REMOVAL, TIMEWAIT_EXIT: nothing else.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbcmEvent {
    pub event_type: u32,
    pub remote_qpn: u32,
    pub remote_ca_guid: u64,
    pub service_id: u64,
    pub remote_psn: u32,
    pub qkey: u32,
    pub primary: IbcmPath,
    pub alternate: IbcmPath,
    pub source: IbcmAddress,
    pub reason: u16,
    pub attribute: u16,
    pub pkey: u16,
    pub port: u8,
    pub message: u8,
    pub path_mtu: u8,
    pub transport_service_type: u8,
    pub extended_transport: u8,
    pub peer_responder_resources: u8,
    pub peer_initiator_depth: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub failover_accepted: u8,
    pub service_timeout: u8,
    pub has_alternate: u8,
    pub ari_len: u8,
    pub private_data_len: u8,
    pub ari: [u8; 72],
    pub private_data: [u8; 224],
}

/// The function table (after the `INTERFACE` header). The first argument of every function
/// is `InterfaceHeader.Context`.
#[repr(C)]
pub struct IbcmClientCm {
    pub create_id: unsafe extern "C" fn(PVOID, IbcmCallback, PVOID, *mut IbcmHandle) -> NTSTATUS,
    pub destroy_id: unsafe extern "C" fn(PVOID, IbcmHandle),
    pub listen: unsafe extern "C" fn(PVOID, IbcmHandle, *const IbcmListen) -> NTSTATUS,
    pub cancel_listen: unsafe extern "C" fn(PVOID, IbcmHandle) -> NTSTATUS,
    pub get_request:
        unsafe extern "C" fn(PVOID, IbcmHandle, *mut IbcmHandle, *mut IbcmEvent) -> NTSTATUS,
    pub get_request_ex: unsafe extern "C" fn(
        PVOID,
        IbcmHandle,
        IbcmCallback,
        PVOID,
        *mut IbcmHandle,
        *mut IbcmEvent,
    ) -> NTSTATUS,
    pub set_callback: unsafe extern "C" fn(PVOID, IbcmHandle, IbcmCallback, PVOID) -> NTSTATUS,
    pub send_req: unsafe extern "C" fn(PVOID, IbcmHandle, *const IbcmReq) -> NTSTATUS,
    pub send_req_peer: unsafe extern "C" fn(PVOID, IbcmHandle, *const IbcmReq) -> NTSTATUS,
    pub format_rep: unsafe extern "C" fn(
        PVOID,
        IbcmHandle,
        *const IbcmRep,
        *mut IbcmQpAttr,
        *mut IbcmQpAttr,
        *mut IbcmQpAttr,
    ) -> NTSTATUS,
    pub send_formatted_rep: unsafe extern "C" fn(PVOID, IbcmHandle) -> NTSTATUS,
    pub send_rep: unsafe extern "C" fn(
        PVOID,
        IbcmHandle,
        *const IbcmRep,
        *mut IbcmQpAttr,
        *mut IbcmQpAttr,
        *mut IbcmQpAttr,
    ) -> NTSTATUS,
    pub send_rtu: unsafe extern "C" fn(PVOID, IbcmHandle, *const u8, u8) -> NTSTATUS,
    pub send_dreq: unsafe extern "C" fn(PVOID, IbcmHandle, *const u8, u8) -> NTSTATUS,
    pub send_drep: unsafe extern "C" fn(PVOID, IbcmHandle, *const u8, u8) -> NTSTATUS,
    pub send_rej:
        unsafe extern "C" fn(PVOID, IbcmHandle, u16, *const u8, u8, *const u8, u8) -> NTSTATUS,
    pub send_mra: unsafe extern "C" fn(PVOID, IbcmHandle, u8, *const u8, u8) -> NTSTATUS,
    pub send_lap:
        unsafe extern "C" fn(PVOID, IbcmHandle, *const IbcmPath, *const u8, u8) -> NTSTATUS,
    pub send_apr: unsafe extern "C" fn(
        PVOID,
        IbcmHandle,
        u8,
        *const u8,
        u8,
        *const u8,
        u8,
        *mut IbcmQpAttr,
    ) -> NTSTATUS,
    pub send_sidr_req: unsafe extern "C" fn(PVOID, IbcmHandle, *const IbcmSidrReq) -> NTSTATUS,
    pub send_sidr_rep: unsafe extern "C" fn(PVOID, IbcmHandle, *const IbcmSidrRep) -> NTSTATUS,
    pub get_qp_attr: unsafe extern "C" fn(PVOID, IbcmHandle, u32, *mut IbcmQpAttr) -> NTSTATUS,
    pub migrate: unsafe extern "C" fn(PVOID, IbcmHandle) -> NTSTATUS,
    pub established: unsafe extern "C" fn(PVOID, IbcmHandle) -> NTSTATUS,
}

/// What the query returns: `INTERFACE` then the table.
#[repr(C)]
pub struct IbcmClientInterface {
    pub header: INTERFACE,
    pub cm: IbcmClientCm,
}

/// Exposes the interface on the device (device add, PASSIVE_LEVEL). The framework keeps a
/// copy of the structure and hands it to every query (the toaster bus sample passes a stack
/// structure the same way).
pub fn add_interface(device: WDFDEVICE, state: NonNull<DeviceState>) -> Result<(), NTSTATUS> {
    let mut interface = IbcmClientInterface {
        header: INTERFACE {
            Size: core::mem::size_of::<IbcmClientInterface>() as u16,
            Version: IBCM_CLIENT_INTERFACE_VERSION,
            Context: state.as_ptr().cast(),
            InterfaceReference: Some(interface_reference),
            InterfaceDereference: Some(interface_dereference),
        },
        cm: IbcmClientCm {
            create_id,
            destroy_id,
            listen,
            cancel_listen,
            get_request,
            get_request_ex,
            set_callback,
            send_req,
            send_req_peer,
            format_rep,
            send_formatted_rep,
            send_rep,
            send_rtu,
            send_dreq,
            send_drep,
            send_rej,
            send_mra,
            send_lap,
            send_apr,
            send_sidr_req,
            send_sidr_rep,
            get_qp_attr,
            migrate,
            established,
        },
    };
    // WDF_QUERY_INTERFACE_CONFIG_INIT(interface, GUID, no EvtDeviceProcessQueryInterfaceRequest).
    let mut config = WDF_QUERY_INTERFACE_CONFIG {
        Size: wdf::size_of_ulong::<WDF_QUERY_INTERFACE_CONFIG>(),
        Interface: (&raw mut interface).cast::<INTERFACE>(),
        InterfaceType: &raw const IBCM_CLIENT_INTERFACE_GUID,
        SendQueryToParentStack: 0,
        EvtDeviceProcessQueryInterfaceRequest: None,
        ImportInterface: 0,
    };
    // SAFETY: (C1) the device is live (device add); the configuration and the interface it
    // points to outlive the call, which copies the interface.
    let status = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfDeviceAddQueryInterface,
            device,
            &raw mut config
        )
    };
    if wdk_sys::NT_SUCCESS(status) {
        Ok(())
    } else {
        Err(status)
    }
}

unsafe extern "C" fn interface_reference(_context: PVOID) {}

unsafe extern "C" fn interface_dereference(_context: PVOID) {}

// ---------------------------------------------------------------------------------------
// Helpers of the C calling convention
// ---------------------------------------------------------------------------------------

/// The dispatch layer behind an interface context.
///
/// # Safety
///
/// `context` is the `Context` of an interface this driver handed out, whose device has not
/// been removed (the client contract).
unsafe fn layer<'a>(context: PVOID) -> Result<&'a Device<KmdfPlatform>, NTSTATUS> {
    if context.is_null() {
        return Err(STATUS_INVALID_PARAMETER);
    }
    // SAFETY: (C2) per the contract, the device state, alive while the device is.
    let state = unsafe { &*context.cast::<DeviceState>() };
    state.core().ok_or(STATUS_DEVICE_NOT_READY)
}

/// The endpoint of a handle.
///
/// # Safety
///
/// `handle` is null or a handle the client owns (see the module docs).
unsafe fn id_of(handle: IbcmHandle) -> Result<ClientId, NTSTATUS> {
    // SAFETY: (C3) per the contract, a live handle or null.
    let handle = unsafe { handle.as_ref() }.ok_or(STATUS_INVALID_HANDLE)?;
    handle.id.with(|id| *id).ok_or(STATUS_INVALID_HANDLE)
}

/// The bytes of a (pointer, length) pair; a null pointer is allowed with length 0 only.
///
/// # Safety
///
/// A non-null `data` is valid for reads of `len` bytes for the call.
unsafe fn bytes<'a>(data: *const u8, len: u8) -> Result<&'a [u8], NTSTATUS> {
    match (data.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(STATUS_INVALID_PARAMETER),
        // SAFETY: (C4) per the contract.
        (false, len) => Ok(unsafe { core::slice::from_raw_parts(data, usize::from(len)) }),
    }
}

/// A required input structure.
///
/// # Safety
///
/// A non-null `p` points to an initialised `T` for the call.
unsafe fn input<'a, T>(p: *const T) -> Result<&'a T, NTSTATUS> {
    // SAFETY: (C5) per the contract.
    unsafe { p.as_ref() }.ok_or(STATUS_INVALID_PARAMETER)
}

/// Writes a result through a required output pointer.
///
/// # Safety
///
/// A non-null `p` is valid for a write of `T`.
unsafe fn output<T>(p: *mut T, value: T) -> Result<(), NTSTATUS> {
    if p.is_null() {
        return Err(STATUS_INVALID_PARAMETER);
    }
    // SAFETY: (C6) per the contract; `T` is plain data, so nothing is dropped.
    unsafe { p.write(value) };
    Ok(())
}

fn engine(result: Result<(), CmError>) -> Result<(), NTSTATUS> {
    result.map_err(status_of)
}

fn nt(result: Result<(), NTSTATUS>) -> NTSTATUS {
    match result {
        Ok(()) => STATUS_SUCCESS,
        Err(status) => status,
    }
}

/// A new handle whose reference is the client's (released by `destroy_id` or a non-zero
/// callback return).
fn new_handle(id: Option<ClientId>) -> NonNull<ClientHandle> {
    let handle = Arc::new(ClientHandle {
        id: KmdfLock::new(id),
        released: AtomicBool::new(false),
    });
    // SAFETY: (C7) Arc::into_raw never returns null.
    unsafe { NonNull::new_unchecked(Arc::into_raw(handle).cast_mut()) }
}

/// Releases the client's reference once.
///
/// # Safety
///
/// `handle` is alive (the client's reference or another one holds it).
unsafe fn release(handle: NonNull<ClientHandle>) {
    // SAFETY: (C8) per the contract.
    let released = unsafe { handle.as_ref() }
        .released
        .swap(true, Ordering::AcqRel);
    if !released {
        // SAFETY: (C9) the client's reference, from Arc::into_raw in `new_handle`, released
        // exactly once (the flag above).
        unsafe { Arc::decrement_strong_count(handle.as_ptr().cast_const()) };
    }
}

/// Another reference to a live handle, for a callback to hold.
///
/// # Safety
///
/// `handle` is alive.
unsafe fn share(handle: NonNull<ClientHandle>) -> Arc<ClientHandle> {
    let raw = handle.as_ptr().cast_const();
    // SAFETY: (C10) the handle came from Arc::into_raw and is alive.
    unsafe { Arc::increment_strong_count(raw) };
    // SAFETY: (C11) takes the reference added above.
    unsafe { Arc::from_raw(raw) }
}

/// The dispatch layer's callback for a client callback: it records the endpoint's
/// identifier, converts the event and calls the client with a handle it keeps alive.
fn callback(
    handle: Arc<ClientHandle>,
    function: IbcmCallback,
    client_context: PVOID,
) -> Callback<KmdfPlatform> {
    let client_context = client_context as usize;
    Arc::new(
        move |_device: &Device<KmdfPlatform>, id: ClientId, event: &ClientEvent| -> i32 {
            handle.id.with(|slot| *slot = Some(id));
            let record = event_to_c(&event.event);
            // SAFETY: (C12) the client's function with the context it gave; the handle is kept
            // alive by this closure; the record outlives the call.
            let verdict = unsafe {
                function(
                    client_context as PVOID,
                    Arc::as_ptr(&handle),
                    &raw const record,
                )
            };
            if verdict != 0 {
                // The dispatch layer destroys the endpoint after this returns: the client's
                // reference goes with it.
                // SAFETY: (C13) this closure's reference keeps the handle alive.
                unsafe { release(NonNull::from(&*handle)) };
            }
            verdict
        },
    )
}

// ---------------------------------------------------------------------------------------
// The functions
// ---------------------------------------------------------------------------------------

unsafe extern "C" fn create_id(
    context: PVOID,
    function: IbcmCallback,
    client_context: PVOID,
    out: *mut IbcmHandle,
) -> NTSTATUS {
    if out.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: (C14) the client contract (module docs).
    let core = match unsafe { layer(context) } {
        Ok(core) => core,
        Err(status) => return status,
    };
    let handle = new_handle(None);
    // SAFETY: (C15) just created: the client's reference holds it.
    let shared = unsafe { share(handle) };
    match core.create_id(callback(shared, function, client_context)) {
        Ok(id) => {
            // SAFETY: (C16) alive (see C15).
            unsafe { handle.as_ref() }.id.with(|slot| *slot = Some(id));
            // SAFETY: (C17) checked non-null; the client's out pointer.
            unsafe { out.write(handle.as_ptr().cast_const()) };
            STATUS_SUCCESS
        }
        Err(e) => {
            // SAFETY: (C18) the client never saw the handle.
            unsafe { release(handle) };
            status_of(e)
        }
    }
}

unsafe extern "C" fn destroy_id(context: PVOID, handle: IbcmHandle) {
    let Some(owned) = NonNull::new(handle.cast_mut()) else {
        return;
    };
    // SAFETY: (C19) the client contract: the context is an interface's.
    let layer = unsafe { layer(context) };
    // SAFETY: (C85) the client contract: the handle is the client's.
    let id = unsafe { id_of(handle) };
    if let (Ok(core), Ok(id)) = (layer, id) {
        core.destroy_id(id);
    }
    // SAFETY: (C20) as C19; `destroy_id` returned, so no callback of it runs any more.
    unsafe { release(owned) };
}

unsafe extern "C" fn listen(
    context: PVOID,
    handle: IbcmHandle,
    params: *const IbcmListen,
) -> NTSTATUS {
    // SAFETY: (C21) the client contract for every pointer argument.
    nt(unsafe { listen_inner(context, handle, params) })
}

/// # Safety
///
/// The client contract.
unsafe fn listen_inner(
    context: PVOID,
    handle: IbcmHandle,
    params: *const IbcmListen,
) -> Result<(), NTSTATUS> {
    // SAFETY: (C22) the client contract.
    let core = unsafe { layer(context) }?;
    // SAFETY: (C23) as C22.
    let id = unsafe { id_of(handle) }?;
    // SAFETY: (C24) as C22.
    let p = unsafe { input(params) }?;
    // SAFETY: (C25) as C22.
    let compare = unsafe { bytes(p.compare, p.compare_len) }?;
    let mut buffer = alloc::vec::Vec::new();
    buffer
        .try_reserve_exact(compare.len())
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    buffer.extend_from_slice(compare);
    let params = ListenParams {
        service_id: p.service_id,
        service_mask: p.service_mask,
        port: (p.port != 0).then_some(p.port),
        compare: (!buffer.is_empty()).then_some((p.compare_offset, buffer)),
        backlog: p.backlog,
    };
    engine(core.listen_id(id, params))
}

unsafe extern "C" fn cancel_listen(context: PVOID, handle: IbcmHandle) -> NTSTATUS {
    // SAFETY: (C26) the client contract.
    nt(unsafe { with_id(context, handle) }.and_then(|(core, id)| engine(core.cancel_listen(id))))
}

/// The dispatch layer and the endpoint of a call.
///
/// # Safety
///
/// The client contract.
unsafe fn with_id<'a>(
    context: PVOID,
    handle: IbcmHandle,
) -> Result<(&'a Device<KmdfPlatform>, ClientId), NTSTATUS> {
    // SAFETY: (C27) the client contract.
    let core = unsafe { layer(context) }?;
    // SAFETY: (C28) as C27.
    let id = unsafe { id_of(handle) }?;
    Ok((core, id))
}

unsafe extern "C" fn get_request(
    context: PVOID,
    listen: IbcmHandle,
    out: *mut IbcmHandle,
    event: *mut IbcmEvent,
) -> NTSTATUS {
    if out.is_null() || event.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: (C29) the client contract.
    let (core, listen) = match unsafe { with_id(context, listen) } {
        Ok(found) => found,
        Err(status) => return status,
    };
    let Some((child, request)) = core.get_request(listen) else {
        return STATUS_NO_MORE_ENTRIES;
    };
    let handle = new_handle(Some(child));
    // SAFETY: (C30) both checked non-null; the client's out pointers.
    unsafe { out.write(handle.as_ptr().cast_const()) };
    // SAFETY: (C31) as C30.
    unsafe { event.write(event_to_c(&request)) };
    STATUS_SUCCESS
}

unsafe extern "C" fn get_request_ex(
    context: PVOID,
    listen: IbcmHandle,
    function: IbcmCallback,
    client_context: PVOID,
    out: *mut IbcmHandle,
    event: *mut IbcmEvent,
) -> NTSTATUS {
    if out.is_null() || event.is_null() {
        return STATUS_INVALID_PARAMETER;
    }
    // SAFETY: (C32) the client contract.
    let (core, listen) = match unsafe { with_id(context, listen) } {
        Ok(found) => found,
        Err(status) => return status,
    };
    // The handle exists before the call: queued events may reach the callback before the
    // call returns.
    let handle = new_handle(None);
    // SAFETY: (C33) just created: the client's reference holds it.
    let shared = unsafe { share(handle) };
    let Some((child, request)) =
        core.get_request_ex(listen, callback(shared, function, client_context))
    else {
        // SAFETY: (C34) the client never saw the handle.
        unsafe { release(handle) };
        return STATUS_NO_MORE_ENTRIES;
    };
    // SAFETY: (C35) alive: the client's reference (released only by the client after it
    // receives the handle, or by a callback's non-zero return, after which the closure's
    // reference still holds it).
    unsafe { handle.as_ref() }
        .id
        .with(|slot| *slot = Some(child));
    // SAFETY: (C36) both checked non-null; the client's out pointers.
    unsafe { out.write(handle.as_ptr().cast_const()) };
    // SAFETY: (C37) as C36.
    unsafe { event.write(event_to_c(&request)) };
    STATUS_SUCCESS
}

unsafe extern "C" fn set_callback(
    context: PVOID,
    handle: IbcmHandle,
    function: IbcmCallback,
    client_context: PVOID,
) -> NTSTATUS {
    // SAFETY: (C38) the client contract.
    let (core, id) = match unsafe { with_id(context, handle) } {
        Ok(found) => found,
        Err(status) => return status,
    };
    let Some(owned) = NonNull::new(handle.cast_mut()) else {
        return STATUS_INVALID_HANDLE;
    };
    // SAFETY: (C39) the client's handle is alive (client contract).
    let shared = unsafe { share(owned) };
    nt(engine(core.set_callback(
        id,
        callback(shared, function, client_context),
    )))
}

unsafe extern "C" fn send_req(context: PVOID, handle: IbcmHandle, req: *const IbcmReq) -> NTSTATUS {
    // SAFETY: (C40) the client contract.
    nt(unsafe { send_req_inner(context, handle, req, false) })
}

unsafe extern "C" fn send_req_peer(
    context: PVOID,
    handle: IbcmHandle,
    req: *const IbcmReq,
) -> NTSTATUS {
    // SAFETY: (C41) the client contract.
    nt(unsafe { send_req_inner(context, handle, req, true) })
}

/// # Safety
///
/// The client contract.
unsafe fn send_req_inner(
    context: PVOID,
    handle: IbcmHandle,
    req: *const IbcmReq,
    peer: bool,
) -> Result<(), NTSTATUS> {
    // SAFETY: (C42) the client contract.
    let (core, id) = unsafe { with_id(context, handle) }?;
    // SAFETY: (C43) as C42.
    let r = unsafe { input(req) }?;
    // SAFETY: (C44) as C42.
    let private_data = unsafe { bytes(r.private_data, r.private_data_len) }?;
    let params = ConnectParams {
        service_id: r.service_id,
        port: r.port,
        pkey: r.pkey,
        qpn: r.qpn,
        transport: Transport::from_wire(r.transport_service_type, r.extended_transport),
        starting_psn: (r.psn_given != 0).then_some(r.starting_psn),
        primary_path: path_from_c(&r.primary),
        alternate_path: (r.has_alternate != 0).then(|| path_from_c(&r.alternate)),
        path_mtu: Mtu::from(r.path_mtu),
        responder_resources: r.responder_resources,
        initiator_depth: r.initiator_depth,
        remote_cm_response_timeout: r.remote_cm_response_timeout,
        local_cm_response_timeout: r.local_cm_response_timeout,
        retry_count: r.retry_count,
        rnr_retry_count: r.rnr_retry_count,
        max_cm_retries: r.max_cm_retries,
        srq: r.srq != 0,
        flow_control: r.flow_control != 0,
        private_data,
    };
    if peer {
        engine(core.send_req_peer(id, &params))
    } else {
        engine(core.send_req(id, &params))
    }
}

/// # Safety
///
/// The client contract.
unsafe fn rep_params<'a>(rep: *const IbcmRep) -> Result<RepParams<'a>, NTSTATUS> {
    // SAFETY: (C45) the client contract.
    let r = unsafe { input(rep) }?;
    // SAFETY: (C46) as C45.
    let private_data = unsafe { bytes(r.private_data, r.private_data_len) }?;
    Ok(RepParams {
        qpn: r.qpn,
        starting_psn: (r.psn_given != 0).then_some(r.starting_psn),
        responder_resources: r.responder_resources,
        initiator_depth: r.initiator_depth,
        rnr_retry_count: r.rnr_retry_count,
        failover_accepted: Failover::from(r.failover_accepted),
        flow_control: r.flow_control != 0,
        srq: r.srq != 0,
        private_data,
    })
}

/// # Safety
///
/// The client contract.
unsafe fn write_prepared(
    prepared: &PreparedRep,
    init: *mut IbcmQpAttr,
    rtr: *mut IbcmQpAttr,
    rts: *mut IbcmQpAttr,
) -> Result<(), NTSTATUS> {
    // SAFETY: (C47) the client contract.
    unsafe { output(init, qp_attr_to_c(&prepared.init)) }?;
    // SAFETY: (C48) as C47.
    unsafe { output(rtr, qp_attr_to_c(&prepared.rtr)) }?;
    // SAFETY: (C49) as C47.
    unsafe { output(rts, qp_attr_to_c(&prepared.rts)) }
}

unsafe extern "C" fn format_rep(
    context: PVOID,
    handle: IbcmHandle,
    rep: *const IbcmRep,
    init: *mut IbcmQpAttr,
    rtr: *mut IbcmQpAttr,
    rts: *mut IbcmQpAttr,
) -> NTSTATUS {
    // SAFETY: (C50) the client contract.
    nt(unsafe { rep_inner(context, handle, rep, [init, rtr, rts], false) })
}

unsafe extern "C" fn send_rep(
    context: PVOID,
    handle: IbcmHandle,
    rep: *const IbcmRep,
    init: *mut IbcmQpAttr,
    rtr: *mut IbcmQpAttr,
    rts: *mut IbcmQpAttr,
) -> NTSTATUS {
    // SAFETY: (C51) the client contract.
    nt(unsafe { rep_inner(context, handle, rep, [init, rtr, rts], true) })
}

/// `format_rep` (pre-REP) or `send_rep` (format and send).
///
/// # Safety
///
/// The client contract.
unsafe fn rep_inner(
    context: PVOID,
    handle: IbcmHandle,
    rep: *const IbcmRep,
    [init, rtr, rts]: [*mut IbcmQpAttr; 3],
    send: bool,
) -> Result<(), NTSTATUS> {
    if init.is_null() || rtr.is_null() || rts.is_null() {
        return Err(STATUS_INVALID_PARAMETER);
    }
    // SAFETY: (C52) the client contract.
    let (core, id) = unsafe { with_id(context, handle) }?;
    // SAFETY: (C53) as C52.
    let params = unsafe { rep_params(rep) }?;
    let prepared = if send {
        core.send_rep(id, &params)
    } else {
        core.format_rep(id, &params)
    }
    .map_err(status_of)?;
    // SAFETY: (C54) as C52.
    unsafe { write_prepared(&prepared, init, rtr, rts) }
}

unsafe extern "C" fn send_formatted_rep(context: PVOID, handle: IbcmHandle) -> NTSTATUS {
    // SAFETY: (C55) the client contract.
    nt(unsafe { with_id(context, handle) }
        .and_then(|(core, id)| engine(core.send_formatted_rep(id))))
}

/// RTU, DREQ or DREP with private data.
#[derive(Clone, Copy)]
enum PrivateDataMessage {
    Rtu,
    Dreq,
    Drep,
}

/// # Safety
///
/// The client contract.
unsafe fn private_data_inner(
    context: PVOID,
    handle: IbcmHandle,
    data: *const u8,
    len: u8,
    message: PrivateDataMessage,
) -> Result<(), NTSTATUS> {
    // SAFETY: (C56) the client contract.
    let (core, id) = unsafe { with_id(context, handle) }?;
    // SAFETY: (C57) as C56.
    let data = unsafe { bytes(data, len) }?;
    engine(match message {
        PrivateDataMessage::Rtu => core.send_rtu(id, data),
        PrivateDataMessage::Dreq => core.send_dreq(id, data),
        PrivateDataMessage::Drep => core.send_drep(id, data),
    })
}

unsafe extern "C" fn send_rtu(
    context: PVOID,
    handle: IbcmHandle,
    data: *const u8,
    len: u8,
) -> NTSTATUS {
    // SAFETY: (C58) the client contract.
    nt(unsafe { private_data_inner(context, handle, data, len, PrivateDataMessage::Rtu) })
}

unsafe extern "C" fn send_dreq(
    context: PVOID,
    handle: IbcmHandle,
    data: *const u8,
    len: u8,
) -> NTSTATUS {
    // SAFETY: (C59) the client contract.
    nt(unsafe { private_data_inner(context, handle, data, len, PrivateDataMessage::Dreq) })
}

unsafe extern "C" fn send_drep(
    context: PVOID,
    handle: IbcmHandle,
    data: *const u8,
    len: u8,
) -> NTSTATUS {
    // SAFETY: (C60) the client contract.
    nt(unsafe { private_data_inner(context, handle, data, len, PrivateDataMessage::Drep) })
}

unsafe extern "C" fn send_rej(
    context: PVOID,
    handle: IbcmHandle,
    reason: u16,
    ari: *const u8,
    ari_len: u8,
    data: *const u8,
    len: u8,
) -> NTSTATUS {
    // SAFETY: (C61) the client contract.
    nt(unsafe { send_rej_inner(context, handle, reason, (ari, ari_len), (data, len)) })
}

/// # Safety
///
/// The client contract.
unsafe fn send_rej_inner(
    context: PVOID,
    handle: IbcmHandle,
    reason: u16,
    (ari, ari_len): (*const u8, u8),
    (data, len): (*const u8, u8),
) -> Result<(), NTSTATUS> {
    // SAFETY: (C62) the client contract.
    let (core, id) = unsafe { with_id(context, handle) }?;
    // SAFETY: (C63) as C62.
    let ari = unsafe { bytes(ari, ari_len) }?;
    // SAFETY: (C64) as C62.
    let private_data = unsafe { bytes(data, len) }?;
    let params = RejectParams {
        reason: RejReason::from(reason),
        ari,
        private_data,
    };
    engine(core.send_rej(id, &params))
}

unsafe extern "C" fn send_mra(
    context: PVOID,
    handle: IbcmHandle,
    service_timeout: u8,
    data: *const u8,
    len: u8,
) -> NTSTATUS {
    // SAFETY: (C65) the client contract.
    let result = unsafe { with_id(context, handle) }.and_then(|(core, id)| {
        // SAFETY: (C66) as C65.
        let data = unsafe { bytes(data, len) }?;
        engine(core.send_mra(id, service_timeout, data))
    });
    nt(result)
}

unsafe extern "C" fn send_lap(
    context: PVOID,
    handle: IbcmHandle,
    alternate: *const IbcmPath,
    data: *const u8,
    len: u8,
) -> NTSTATUS {
    // SAFETY: (C67) the client contract.
    let result = unsafe { with_id(context, handle) }.and_then(|(core, id)| {
        // SAFETY: (C68) as C67.
        let path = unsafe { input(alternate) }?;
        // SAFETY: (C69) as C67.
        let data = unsafe { bytes(data, len) }?;
        engine(core.send_lap(id, &path_from_c(path), data))
    });
    nt(result)
}

unsafe extern "C" fn send_apr(
    context: PVOID,
    handle: IbcmHandle,
    status: u8,
    info: *const u8,
    info_len: u8,
    data: *const u8,
    len: u8,
    rts: *mut IbcmQpAttr,
) -> NTSTATUS {
    // SAFETY: (C70) the client contract.
    let result = unsafe { with_id(context, handle) }.and_then(|(core, id)| {
        if rts.is_null() {
            return Err(STATUS_INVALID_PARAMETER);
        }
        // SAFETY: (C71) as C70.
        let info = unsafe { bytes(info, info_len) }?;
        // SAFETY: (C72) as C70.
        let data = unsafe { bytes(data, len) }?;
        let attributes = core
            .send_apr(id, AprStatus::from(status), info, data)
            .map_err(status_of)?;
        // No attributes (a non-success status): `valid` is 0.
        let record = attributes.as_ref().map(qp_attr_to_c).unwrap_or_default();
        // SAFETY: (C73) checked non-null above; the client's out pointer.
        unsafe { output(rts, record) }
    });
    nt(result)
}

unsafe extern "C" fn send_sidr_req(
    context: PVOID,
    handle: IbcmHandle,
    req: *const IbcmSidrReq,
) -> NTSTATUS {
    // SAFETY: (C74) the client contract.
    let result = unsafe { with_id(context, handle) }.and_then(|(core, id)| {
        // SAFETY: (C75) as C74.
        let r = unsafe { input(req) }?;
        // SAFETY: (C76) as C74.
        let private_data = unsafe { bytes(r.private_data, r.private_data_len) }?;
        let params = SidrParams {
            service_id: r.service_id,
            port: r.port,
            pkey: r.pkey,
            path: path_from_c(&r.path),
            timeout: r.timeout,
            max_retries: r.max_retries,
            private_data,
        };
        engine(core.send_sidr_req(id, &params))
    });
    nt(result)
}

unsafe extern "C" fn send_sidr_rep(
    context: PVOID,
    handle: IbcmHandle,
    rep: *const IbcmSidrRep,
) -> NTSTATUS {
    // SAFETY: (C77) the client contract.
    let result = unsafe { with_id(context, handle) }.and_then(|(core, id)| {
        // SAFETY: (C78) as C77.
        let r = unsafe { input(rep) }?;
        // SAFETY: (C79) as C77.
        let info = unsafe { bytes(r.info, r.info_len) }?;
        // SAFETY: (C80) as C77.
        let private_data = unsafe { bytes(r.private_data, r.private_data_len) }?;
        let params = SidrReplyParams {
            status: SidrStatus::from(r.status),
            qpn: r.qpn,
            qkey: r.qkey,
            info,
            private_data,
        };
        engine(core.send_sidr_rep(id, &params))
    });
    nt(result)
}

unsafe extern "C" fn get_qp_attr(
    context: PVOID,
    handle: IbcmHandle,
    state: u32,
    attr: *mut IbcmQpAttr,
) -> NTSTATUS {
    // SAFETY: (C81) the client contract.
    let result = unsafe { with_id(context, handle) }.and_then(|(core, id)| {
        let state = match state {
            qp_state::INIT => QpState::Init,
            qp_state::RTR => QpState::Rtr,
            qp_state::RTS => QpState::Rts,
            _ => return Err(STATUS_INVALID_PARAMETER),
        };
        let attributes = core.get_qp_attr(id, state).map_err(status_of)?;
        // SAFETY: (C82) as C81.
        unsafe { output(attr, qp_attr_to_c(&attributes)) }
    });
    nt(result)
}

unsafe extern "C" fn migrate(context: PVOID, handle: IbcmHandle) -> NTSTATUS {
    // SAFETY: (C83) the client contract.
    nt(unsafe { with_id(context, handle) }.and_then(|(core, id)| engine(core.migrate(id))))
}

unsafe extern "C" fn established(context: PVOID, handle: IbcmHandle) -> NTSTATUS {
    // SAFETY: (C84) the client contract.
    nt(unsafe { with_id(context, handle) }.and_then(|(core, id)| engine(core.established(id))))
}

// ---------------------------------------------------------------------------------------
// Records (total, field by field)
// ---------------------------------------------------------------------------------------

fn path_from_c(p: &IbcmPath) -> PathRecord {
    PathRecord {
        slid: p.slid,
        dlid: p.dlid,
        sgid: p.sgid,
        dgid: p.dgid,
        flow_label: p.flow_label,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        sl: p.sl,
        rate: Rate::from(p.rate),
        packet_life_time: p.packet_life_time,
        subnet_local: p.subnet_local != 0,
    }
}

fn path_to_c(p: &PathRecord) -> IbcmPath {
    IbcmPath {
        slid: p.slid,
        dlid: p.dlid,
        flow_label: p.flow_label,
        sgid: p.sgid,
        dgid: p.dgid,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        sl: p.sl,
        rate: u8::from(p.rate),
        packet_life_time: p.packet_life_time,
        subnet_local: u8::from(p.subnet_local),
        reserved: [0; 2],
    }
}

fn address_to_c(a: &MadAddress) -> IbcmAddress {
    IbcmAddress {
        lid: a.lid,
        pkey: a.pkey,
        gid: a.gid,
        port: a.port,
        sl: a.sl,
        grh: u8::from(a.grh),
        reserved: 0,
    }
}

fn av_to_c(av: &AddressVector) -> IbcmAv {
    IbcmAv {
        path: path_to_c(&av.path),
        port: av.port,
        ack_timeout: av.ack_timeout,
        reserved: [0; 6],
    }
}

fn qp_state_to_c(state: QpState) -> u32 {
    match state {
        QpState::Init => qp_state::INIT,
        QpState::Rtr => qp_state::RTR,
        QpState::Rts => qp_state::RTS,
    }
}

fn qp_attr_to_c(a: &QpAttributes) -> IbcmQpAttr {
    let mut r = IbcmQpAttr {
        state: qp_state_to_c(a.state),
        ..IbcmQpAttr::default()
    };
    if let Some(port) = a.port {
        r.valid |= qp_valid::PORT;
        r.port = port;
    }
    if let Some(pkey) = a.pkey {
        r.valid |= qp_valid::PKEY;
        r.pkey = pkey;
    }
    if let Some(flags) = a.access_flags {
        r.valid |= qp_valid::ACCESS_FLAGS;
        r.access_flags = flags;
    }
    if let Some(mtu) = a.path_mtu {
        r.valid |= qp_valid::PATH_MTU;
        r.path_mtu = u8::from(mtu);
    }
    if let Some(qpn) = a.dest_qpn {
        r.valid |= qp_valid::DEST_QPN;
        r.dest_qpn = qpn;
    }
    if let Some(psn) = a.rq_psn {
        r.valid |= qp_valid::RQ_PSN;
        r.rq_psn = psn;
    }
    if let Some(depth) = a.max_dest_rd_atomic {
        r.valid |= qp_valid::MAX_DEST_RD_ATOMIC;
        r.max_dest_rd_atomic = depth;
    }
    if let Some(av) = &a.primary {
        r.valid |= qp_valid::PRIMARY;
        r.primary = av_to_c(av);
    }
    if let Some(av) = &a.alternate {
        r.valid |= qp_valid::ALTERNATE;
        r.alternate = av_to_c(av);
    }
    if let Some(psn) = a.sq_psn {
        r.valid |= qp_valid::SQ_PSN;
        r.sq_psn = psn;
    }
    if let Some(timeout) = a.timeout {
        r.valid |= qp_valid::TIMEOUT;
        r.timeout = timeout;
    }
    if let Some(count) = a.retry_count {
        r.valid |= qp_valid::RETRY_COUNT;
        r.retry_count = count;
    }
    if let Some(count) = a.rnr_retry {
        r.valid |= qp_valid::RNR_RETRY;
        r.rnr_retry = count;
    }
    if let Some(depth) = a.max_rd_atomic {
        r.valid |= qp_valid::MAX_RD_ATOMIC;
        r.max_rd_atomic = depth;
    }
    if let Some(state) = a.path_mig_state {
        r.valid |= qp_valid::PATH_MIG_STATE;
        r.path_mig_state = match state {
            MigrationState::Rearm => 0,
            MigrationState::Migrated => 1,
        };
    }
    r
}

fn copy_into(dst: &mut [u8], len: &mut u8, src: &[u8]) {
    let n = src.len().min(dst.len());
    if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
        d.copy_from_slice(s);
    }
    *len = u8::try_from(n).unwrap_or(u8::MAX);
}

fn event_to_c(event: &Event) -> IbcmEvent {
    let mut r = IbcmEvent {
        event_type: 0,
        remote_qpn: 0,
        remote_ca_guid: 0,
        service_id: 0,
        remote_psn: 0,
        qkey: 0,
        primary: IbcmPath::default(),
        alternate: IbcmPath::default(),
        source: IbcmAddress::default(),
        reason: 0,
        attribute: 0,
        pkey: 0,
        port: 0,
        message: 0,
        path_mtu: 0,
        transport_service_type: 0,
        extended_transport: 0,
        peer_responder_resources: 0,
        peer_initiator_depth: 0,
        rnr_retry_count: 0,
        srq: 0,
        failover_accepted: 0,
        service_timeout: 0,
        has_alternate: 0,
        ari_len: 0,
        private_data_len: 0,
        ari: [0; 72],
        private_data: [0; 224],
    };
    match event {
        Event::ReqReceived(req) => {
            r.event_type = event_type::REQ_RECEIVED;
            r.port = req.port;
            r.service_id = req.service_id;
            r.remote_ca_guid = req.remote_ca_guid;
            r.remote_qpn = req.remote_qpn;
            r.pkey = req.pkey;
            r.primary = path_to_c(&req.primary_path);
            if let Some(alternate) = &req.alternate_path {
                r.has_alternate = 1;
                r.alternate = path_to_c(alternate);
            }
            r.path_mtu = u8::from(req.path_mtu);
            (r.transport_service_type, r.extended_transport) = req.transport.to_wire();
            r.peer_responder_resources = req.peer_responder_resources;
            r.peer_initiator_depth = req.peer_initiator_depth;
            r.rnr_retry_count = req.rnr_retry_count;
            r.srq = u8::from(req.srq);
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                req.private_data.as_slice(),
            );
        }
        Event::RepReceived(rep) => {
            r.event_type = event_type::REP_RECEIVED;
            r.remote_ca_guid = rep.remote_ca_guid;
            r.remote_qpn = rep.remote_qpn;
            r.remote_psn = rep.remote_psn;
            r.peer_responder_resources = rep.peer_responder_resources;
            r.peer_initiator_depth = rep.peer_initiator_depth;
            r.failover_accepted = u8::from(rep.failover_accepted);
            r.srq = u8::from(rep.srq);
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                rep.private_data.as_slice(),
            );
        }
        Event::RtuReceived(data) => {
            r.event_type = event_type::RTU_RECEIVED;
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                data.as_slice(),
            );
        }
        Event::MraReceived { service_timeout } => {
            r.event_type = event_type::MRA_RECEIVED;
            r.service_timeout = *service_timeout;
        }
        Event::Rejected {
            reason,
            message,
            ari,
            ari_len,
            private_data,
        } => {
            r.event_type = event_type::REJECTED;
            r.reason = u16::from(*reason);
            r.message = u8::from(*message);
            r.ari = *ari;
            r.ari_len = *ari_len;
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                private_data.as_slice(),
            );
        }
        Event::Timeout { message } => {
            r.event_type = event_type::TIMEOUT;
            r.attribute = u16::from(*message);
        }
        Event::DreqReceived(data) => {
            r.event_type = event_type::DREQ_RECEIVED;
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                data.as_slice(),
            );
        }
        Event::DrepReceived(data) => {
            r.event_type = event_type::DREP_RECEIVED;
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                data.as_slice(),
            );
        }
        Event::LapReceived {
            alternate_path,
            private_data,
        } => {
            r.event_type = event_type::LAP_RECEIVED;
            r.has_alternate = 1;
            r.alternate = path_to_c(alternate_path);
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                private_data.as_slice(),
            );
        }
        Event::AprReceived {
            status,
            info,
            info_len,
            private_data,
        } => {
            r.event_type = event_type::APR_RECEIVED;
            r.reason = u16::from(u8::from(*status));
            r.ari = *info;
            r.ari_len = *info_len;
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                private_data.as_slice(),
            );
        }
        Event::SidrReqReceived(req) => {
            r.event_type = event_type::SIDR_REQ_RECEIVED;
            r.port = req.port;
            r.service_id = req.service_id;
            r.pkey = req.pkey;
            r.source = address_to_c(&req.source);
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                req.private_data.as_slice(),
            );
        }
        Event::SidrRepReceived(rep) => {
            r.event_type = event_type::SIDR_REP_RECEIVED;
            r.reason = u16::from(u8::from(rep.status));
            r.remote_qpn = rep.qpn;
            r.qkey = rep.qkey;
            r.ari = rep.info;
            r.ari_len = rep.info_len;
            copy_into(
                &mut r.private_data,
                &mut r.private_data_len,
                rep.private_data.as_slice(),
            );
        }
        Event::DeviceRemoval => r.event_type = event_type::DEVICE_REMOVAL,
        Event::TimewaitExit => r.event_type = event_type::TIMEWAIT_EXIT,
    }
    r
}
