//! Stand-in for wdk-sys 0.5.2: exactly the items the ibcm KMDF binding uses, in bindgen's
//! conventions (enums as modules of constants with `Type`, `Default` structs, callbacks as
//! `Option<unsafe extern "C" fn>`, `call_unsafe_wdf_function_binding!` calling the WDF
//! function minus `DriverGlobals`). Signatures and fields transcribed from the KMDF 1.33
//! headers (wdfdriver.h, wdfdevice.h, wdfcontrol.h, wdffdo.h, wdfio.h, wdfrequest.h,
//! wdftimer.h, wdfdpc.h, wdfworkitem.h, wdfsync.h, wdfobject.h, wdffileobject.h) and
//! wdm.h/ntddk.h. Layout-irrelevant fields are omitted where the binding never names them.
#![no_std]
#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    clippy::all
)]

use core::ffi::c_void;

pub type CHAR = i8;
pub type CCHAR = i8;
pub type CSHORT = i16;
pub type UCHAR = u8;
pub type BOOLEAN = u8;
pub type USHORT = u16;
pub type ULONG = u32;
pub type LONG = i32;
pub type LONGLONG = i64;
pub type ULONG64 = u64;
pub type ULONG_PTR = u64;
pub type SIZE_T = ULONG_PTR;
pub type POOL_FLAGS = ULONG64;
pub const POOL_FLAG_NON_PAGED: u64 = 0x40;
pub type KIRQL = UCHAR;
pub type KPRIORITY = LONG;
pub type KPROCESSOR_MODE = CCHAR;
pub type NTSTATUS = LONG;
pub type PVOID = *mut c_void;
pub type HANDLE = *mut c_void;
pub type PCCH = *const CHAR;
pub type WCHAR = u16;
pub type KSPIN_LOCK = ULONG_PTR;
pub type PKSPIN_LOCK = *mut KSPIN_LOCK;

pub const PASSIVE_LEVEL: u32 = 0;
pub const APC_LEVEL: u32 = 1;
pub const DISPATCH_LEVEL: u32 = 2;
pub const IRP_MJ_CREATE: u32 = 0;
pub const IRP_MJ_PNP: u32 = 27;
pub const IRP_MN_QUERY_INTERFACE: u32 = 8;
pub const IO_NO_INCREMENT: u32 = 0;
pub const FILE_DEVICE_SECURE_OPEN: u32 = 256;
pub const ALL_PROCESSOR_GROUPS: u32 = 65535;

pub const STATUS_SUCCESS: NTSTATUS = 0;
pub const STATUS_TIMEOUT: NTSTATUS = 0x0000_0102;
pub const STATUS_CANCELLED: NTSTATUS = 0xC000_0120_u32 as i32;
pub const STATUS_DEVICE_NOT_READY: NTSTATUS = 0xC000_00A3_u32 as i32;
pub const STATUS_INSUFFICIENT_RESOURCES: NTSTATUS = 0xC000_009A_u32 as i32;
pub const STATUS_INVALID_DEVICE_REQUEST: NTSTATUS = 0xC000_0010_u32 as i32;

#[allow(clippy::missing_const_for_fn)]
pub const fn NT_SUCCESS(status: NTSTATUS) -> bool {
    status >= 0
}

#[repr(C)]
#[derive(Debug, Default, Copy, Clone)]
pub struct _GUID {
    pub Data1: u32,
    pub Data2: u16,
    pub Data3: u16,
    pub Data4: [u8; 8],
}
pub type GUID = _GUID;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _UNICODE_STRING {
    pub Length: USHORT,
    pub MaximumLength: USHORT,
    pub Buffer: *mut WCHAR,
}
pub type UNICODE_STRING = _UNICODE_STRING;
pub type PCUNICODE_STRING = *const UNICODE_STRING;
pub type PUNICODE_STRING = *mut UNICODE_STRING;

#[repr(C)]
#[derive(Copy, Clone)]
pub union _LARGE_INTEGER {
    pub QuadPart: LONGLONG,
}
pub type LARGE_INTEGER = _LARGE_INTEGER;
pub type PLARGE_INTEGER = *mut LARGE_INTEGER;
/// ntdef.h `PROCESSOR_NUMBER`.
#[repr(C)]
#[derive(Debug, Default, Copy, Clone)]
pub struct _PROCESSOR_NUMBER {
    pub Group: USHORT,
    pub Number: UCHAR,
    pub Reserved: UCHAR,
}
pub type PROCESSOR_NUMBER = _PROCESSOR_NUMBER;
pub type PPROCESSOR_NUMBER = *mut _PROCESSOR_NUMBER;
/// wdm.h `typedef LARGE_INTEGER PHYSICAL_ADDRESS`.
pub type PHYSICAL_ADDRESS = LARGE_INTEGER;

/// wdm.h `IO_ERROR_LOG_PACKET` (the driver-filled error log entry, strings after it).
#[repr(C)]
#[derive(Copy, Clone)]
pub struct _IO_ERROR_LOG_PACKET {
    pub MajorFunctionCode: UCHAR,
    pub RetryCount: UCHAR,
    pub DumpDataSize: USHORT,
    pub NumberOfStrings: USHORT,
    pub StringOffset: USHORT,
    pub EventCategory: USHORT,
    pub ErrorCode: NTSTATUS,
    pub UniqueErrorValue: ULONG,
    pub FinalStatus: NTSTATUS,
    pub SequenceNumber: ULONG,
    pub IoControlCode: ULONG,
    pub DeviceOffset: LARGE_INTEGER,
    pub DumpData: [ULONG; 1],
}
pub type IO_ERROR_LOG_PACKET = _IO_ERROR_LOG_PACKET;

/// wdm.h `INTERFACE`.
pub type PINTERFACE_REFERENCE = Option<unsafe extern "C" fn(Context: PVOID)>;
pub type PINTERFACE_DEREFERENCE = Option<unsafe extern "C" fn(Context: PVOID)>;
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _INTERFACE {
    pub Size: USHORT,
    pub Version: USHORT,
    pub Context: PVOID,
    pub InterfaceReference: PINTERFACE_REFERENCE,
    pub InterfaceDereference: PINTERFACE_DEREFERENCE,
}
pub type INTERFACE = _INTERFACE;
pub type PINTERFACE = *mut INTERFACE;

/// wdm.h `EX_RUNDOWN_REF`.
#[repr(C)]
#[derive(Copy, Clone)]
pub union _EX_RUNDOWN_REF__bindgen_ty_1 {
    pub Count: ULONG_PTR,
    pub Ptr: PVOID,
}
#[repr(C)]
#[derive(Copy, Clone)]
pub struct _EX_RUNDOWN_REF {
    pub __bindgen_anon_1: _EX_RUNDOWN_REF__bindgen_ty_1,
}
impl Default for _EX_RUNDOWN_REF {
    fn default() -> Self {
        Self {
            __bindgen_anon_1: _EX_RUNDOWN_REF__bindgen_ty_1 { Count: 0 },
        }
    }
}
pub type EX_RUNDOWN_REF = _EX_RUNDOWN_REF;
pub type PEX_RUNDOWN_REF = *mut EX_RUNDOWN_REF;

/// wdm.h `KEVENT` (`DISPATCHER_HEADER Header`; its inner unions elided).
#[repr(C)]
#[derive(Debug, Default, Copy, Clone)]
pub struct _DISPATCHER_HEADER {
    pub Lock: LONG,
    pub SignalState: LONG,
    pub WaitListHead: [PVOID; 2],
}
#[repr(C)]
#[derive(Debug, Default, Copy, Clone)]
pub struct _KEVENT {
    pub Header: _DISPATCHER_HEADER,
}
pub type KEVENT = _KEVENT;
pub type PRKEVENT = *mut KEVENT;

pub mod _EVENT_TYPE {
    pub type Type = i32;
    pub const NotificationEvent: Type = 0;
    pub const SynchronizationEvent: Type = 1;
}
pub use self::_EVENT_TYPE::Type as EVENT_TYPE;
pub mod _KWAIT_REASON {
    pub type Type = i32;
    pub const Executive: Type = 0;
}
pub use self::_KWAIT_REASON::Type as KWAIT_REASON;
pub mod _MODE {
    pub type Type = i32;
    pub const KernelMode: Type = 0;
    pub const UserMode: Type = 1;
}
pub mod _SECURITY_IMPERSONATION_LEVEL {
    pub type Type = i32;
    pub const SecurityAnonymous: Type = 0;
    pub const SecurityImpersonation: Type = 2;
}
pub use self::_SECURITY_IMPERSONATION_LEVEL::Type as SECURITY_IMPERSONATION_LEVEL;
pub type PACCESS_TOKEN = PVOID;
pub type ACCESS_MASK = ULONG;
/// winnt.h/wdm.h `KEY_READ`: (STANDARD_RIGHTS_READ | KEY_QUERY_VALUE |
/// KEY_ENUMERATE_SUB_KEYS | KEY_NOTIFY) & ~SYNCHRONIZE.
pub const KEY_READ: u32 = 131097;
/// wdm.h `SECURITY_SUBJECT_CONTEXT`.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _SECURITY_SUBJECT_CONTEXT {
    pub ClientToken: PACCESS_TOKEN,
    pub ImpersonationLevel: SECURITY_IMPERSONATION_LEVEL,
    pub PrimaryToken: PACCESS_TOKEN,
    pub ProcessAuditId: PVOID,
}
pub type SECURITY_SUBJECT_CONTEXT = _SECURITY_SUBJECT_CONTEXT;
pub type PSECURITY_SUBJECT_CONTEXT = *mut _SECURITY_SUBJECT_CONTEXT;
/// winnt.h `PSID` (a SID's length is in its header: 8 bytes and 4 per sub-authority).
pub type PSID = PVOID;
/// winnt.h `SID_AND_ATTRIBUTES`.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _SID_AND_ATTRIBUTES {
    pub Sid: PSID,
    pub Attributes: ULONG,
}
pub type SID_AND_ATTRIBUTES = _SID_AND_ATTRIBUTES;
/// winnt.h `TOKEN_USER`.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _TOKEN_USER {
    pub User: SID_AND_ATTRIBUTES,
}
pub type TOKEN_USER = _TOKEN_USER;
/// winnt.h `TOKEN_INFORMATION_CLASS`.
pub mod _TOKEN_INFORMATION_CLASS {
    pub type Type = i32;
    pub const TokenUser: Type = 1;
}
pub use self::_TOKEN_INFORMATION_CLASS::Type as TOKEN_INFORMATION_CLASS;
/// wdm.h `LUID`.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _LUID {
    pub LowPart: ULONG,
    pub HighPart: LONG,
}
pub type LUID = _LUID;
/// wdm.h `ACCESS_STATE`: its fields in wdm.h's order up to the one the binding names.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct _ACCESS_STATE {
    pub OperationID: LUID,
    pub SecurityEvaluated: BOOLEAN,
    pub GenerateAudit: BOOLEAN,
    pub GenerateOnClose: BOOLEAN,
    pub PrivilegesAllocated: BOOLEAN,
    pub Flags: ULONG,
    pub RemainingDesiredAccess: ACCESS_MASK,
    pub PreviouslyGrantedAccess: ACCESS_MASK,
    pub OriginalDesiredAccess: ACCESS_MASK,
    pub SubjectSecurityContext: SECURITY_SUBJECT_CONTEXT,
}
pub type PACCESS_STATE = *mut _ACCESS_STATE;
/// wdm.h `SECURITY_QUALITY_OF_SERVICE` (opaque here).
#[repr(C)]
pub struct _SECURITY_QUALITY_OF_SERVICE {
    _unused: [u8; 0],
}
pub type PSECURITY_QUALITY_OF_SERVICE = *mut _SECURITY_QUALITY_OF_SERVICE;
/// wdm.h `IO_SECURITY_CONTEXT`.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _IO_SECURITY_CONTEXT {
    pub SecurityQos: PSECURITY_QUALITY_OF_SERVICE,
    pub AccessState: PACCESS_STATE,
    pub DesiredAccess: ACCESS_MASK,
    pub FullCreateOptions: ULONG,
}
pub type PIO_SECURITY_CONTEXT = *mut _IO_SECURITY_CONTEXT;
/// wdm.h `SL_FORCE_ACCESS_CHECK`: an IRP_MJ_CREATE's stack location flag.
pub const SL_FORCE_ACCESS_CHECK: u32 = 1;

/// wdm.h `IO_STATUS_BLOCK`.
#[repr(C)]
#[derive(Copy, Clone)]
pub union _IO_STATUS_BLOCK__bindgen_ty_1 {
    pub Status: NTSTATUS,
    pub Pointer: PVOID,
}
#[repr(C)]
#[derive(Copy, Clone)]
pub struct _IO_STATUS_BLOCK {
    pub __bindgen_anon_1: _IO_STATUS_BLOCK__bindgen_ty_1,
    pub Information: ULONG_PTR,
}
pub type IO_STATUS_BLOCK = _IO_STATUS_BLOCK;

/// wdm.h `IO_STACK_LOCATION`: `Parameters.Create` and `Parameters.QueryInterface` only
/// (bindgen names their structs `_IO_STACK_LOCATION__bindgen_ty_1__bindgen_ty_1` and
/// `_IO_STACK_LOCATION__bindgen_ty_1__bindgen_ty_26`, the 1st and 26th anonymous arms).
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _IO_STACK_LOCATION__bindgen_ty_1__bindgen_ty_1 {
    pub SecurityContext: PIO_SECURITY_CONTEXT,
    pub Options: ULONG,
    pub __bindgen_padding_0: [u8; 4usize],
    pub FileAttributes: USHORT,
    pub ShareAccess: USHORT,
    pub __bindgen_padding_1: [u8; 4usize],
    pub EaLength: ULONG,
}
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _IO_STACK_LOCATION__bindgen_ty_1__bindgen_ty_26 {
    pub InterfaceType: *const GUID,
    pub Size: USHORT,
    pub Version: USHORT,
    pub Interface: PINTERFACE,
    pub InterfaceSpecificData: PVOID,
}
#[repr(C)]
#[derive(Copy, Clone)]
pub union _IO_STACK_LOCATION__bindgen_ty_1 {
    pub Create: _IO_STACK_LOCATION__bindgen_ty_1__bindgen_ty_1,
    pub QueryInterface: _IO_STACK_LOCATION__bindgen_ty_1__bindgen_ty_26,
    pub Others: [PVOID; 4],
}
#[repr(C)]
#[derive(Copy, Clone)]
pub struct _IO_STACK_LOCATION {
    pub MajorFunction: UCHAR,
    pub MinorFunction: UCHAR,
    pub Flags: UCHAR,
    pub Control: UCHAR,
    pub Parameters: _IO_STACK_LOCATION__bindgen_ty_1,
    pub DeviceObject: PDEVICE_OBJECT,
    pub FileObject: PVOID,
    pub CompletionRoutine: PIO_COMPLETION_ROUTINE,
    pub Context: PVOID,
}
pub type IO_STACK_LOCATION = _IO_STACK_LOCATION;
pub type PIO_STACK_LOCATION = *mut _IO_STACK_LOCATION;

/// wdm.h `IRP`: the fields the binding names, on the bindgen paths real wdk-sys users
/// spell (`Tail.Overlay.__bindgen_anon_2.__bindgen_anon_1.CurrentStackLocation`).
#[repr(C)]
#[derive(Copy, Clone)]
pub union _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_2__bindgen_ty_1 {
    pub CurrentStackLocation: *mut _IO_STACK_LOCATION,
    pub PacketType: ULONG,
}
#[repr(C)]
#[derive(Copy, Clone)]
pub struct _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_2 {
    pub ListEntry: [PVOID; 2],
    pub __bindgen_anon_1: _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_2__bindgen_ty_1,
}
#[repr(C)]
#[derive(Copy, Clone)]
pub union _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_1 {
    pub DriverContext: [PVOID; 4],
}
#[repr(C)]
#[derive(Copy, Clone)]
pub struct _IRP__bindgen_ty_4__bindgen_ty_1 {
    pub __bindgen_anon_1: _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_1,
    pub Thread: PVOID,
    pub AuxiliaryBuffer: *mut CHAR,
    pub __bindgen_anon_2: _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_2,
    pub OriginalFileObject: PVOID,
}
#[repr(C)]
#[derive(Copy, Clone)]
pub union _IRP__bindgen_ty_4 {
    pub Overlay: _IRP__bindgen_ty_4__bindgen_ty_1,
    pub CompletionKey: PVOID,
}
#[repr(C)]
#[derive(Copy, Clone)]
pub struct _IRP {
    pub Type: CSHORT,
    pub Size: USHORT,
    pub Flags: ULONG,
    pub IoStatus: IO_STATUS_BLOCK,
    pub RequestorMode: KPROCESSOR_MODE,
    pub PendingReturned: BOOLEAN,
    pub StackCount: CHAR,
    pub CurrentLocation: CHAR,
    pub Cancel: BOOLEAN,
    pub CancelIrql: KIRQL,
    pub Tail: _IRP__bindgen_ty_4,
}
pub type IRP = _IRP;
pub type PIRP = *mut _IRP;

#[repr(C)]
pub struct _DRIVER_OBJECT {
    _unused: [u8; 0],
}
pub type PDRIVER_OBJECT = *mut _DRIVER_OBJECT;
/// wdm.h `DEVICE_OBJECT` (opaque here: the binding never reads it).
#[repr(C)]
pub struct _DEVICE_OBJECT {
    _unused: [u8; 0],
}
pub type PDEVICE_OBJECT = *mut _DEVICE_OBJECT;
/// wdm.h `IO_COMPLETION_ROUTINE` / `PIO_COMPLETION_ROUTINE`.
pub type PIO_COMPLETION_ROUTINE = Option<
    unsafe extern "C" fn(DeviceObject: PDEVICE_OBJECT, Irp: PIRP, Context: PVOID) -> NTSTATUS,
>;
/// wdm.h `IoSetCompletionRoutine`'s `Control` bits.
pub const SL_INVOKE_ON_CANCEL: u32 = 0x20;
pub const SL_INVOKE_ON_SUCCESS: u32 = 0x40;
pub const SL_INVOKE_ON_ERROR: u32 = 0x80;

// ---- WDF handles (DECLARE_HANDLE) ----
macro_rules! handle {
    ($($h:ident $s:ident),*) => {$(
        #[repr(C)]
        #[derive(Debug, Copy, Clone)]
        pub struct $s { pub unused: i32 }
        pub type $h = *mut $s;
    )*};
}
handle!(WDFDRIVER WDFDRIVER__, WDFDEVICE WDFDEVICE__, WDFQUEUE WDFQUEUE__, WDFREQUEST WDFREQUEST__,
    WDFFILEOBJECT WDFFILEOBJECT__, WDFTIMER WDFTIMER__, WDFDPC WDFDPC__, WDFWORKITEM WDFWORKITEM__,
    WDFWAITLOCK WDFWAITLOCK__, WDFKEY WDFKEY__);
pub type WDFOBJECT = *mut c_void;
#[repr(C)]
pub struct WDFDEVICE_INIT {
    _unused: [u8; 0],
}
pub type PWDFDEVICE_INIT = *mut WDFDEVICE_INIT;

pub mod _WDF_EXECUTION_LEVEL {
    pub type Type = i32;
    pub const WdfExecutionLevelInvalid: Type = 0;
    pub const WdfExecutionLevelInheritFromParent: Type = 1;
}
pub use self::_WDF_EXECUTION_LEVEL::Type as WDF_EXECUTION_LEVEL;
pub mod _WDF_SYNCHRONIZATION_SCOPE {
    pub type Type = i32;
    pub const WdfSynchronizationScopeInvalid: Type = 0;
    pub const WdfSynchronizationScopeInheritFromParent: Type = 1;
}
pub use self::_WDF_SYNCHRONIZATION_SCOPE::Type as WDF_SYNCHRONIZATION_SCOPE;
pub mod _WDF_TRI_STATE {
    pub type Type = i32;
    pub const WdfFalse: Type = 0;
    pub const WdfTrue: Type = 1;
    pub const WdfUseDefault: Type = 2;
}
pub use self::_WDF_TRI_STATE::Type as WDF_TRI_STATE;
pub mod _WDF_FILEOBJECT_CLASS {
    pub type Type = i32;
    pub const WdfFileObjectWdfCannotUseFsContexts: Type = 4;
}
pub use self::_WDF_FILEOBJECT_CLASS::Type as WDF_FILEOBJECT_CLASS;
pub mod _WDF_IO_QUEUE_DISPATCH_TYPE {
    pub type Type = i32;
    pub const WdfIoQueueDispatchParallel: Type = 2;
}
pub use self::_WDF_IO_QUEUE_DISPATCH_TYPE::Type as WDF_IO_QUEUE_DISPATCH_TYPE;

// ---- callbacks ----
pub type PFN_WDF_OBJECT_CONTEXT_CLEANUP = Option<unsafe extern "C" fn(Object: WDFOBJECT)>;
pub type PFN_WDF_OBJECT_CONTEXT_DESTROY = Option<unsafe extern "C" fn(Object: WDFOBJECT)>;
pub type PFN_WDF_DRIVER_DEVICE_ADD =
    Option<unsafe extern "C" fn(Driver: WDFDRIVER, DeviceInit: PWDFDEVICE_INIT) -> NTSTATUS>;
pub type PFN_WDF_DRIVER_UNLOAD = Option<unsafe extern "C" fn(Driver: WDFDRIVER)>;
pub type PFN_WDF_DEVICE_FILE_CREATE =
    Option<unsafe extern "C" fn(Device: WDFDEVICE, Request: WDFREQUEST, FileObject: WDFFILEOBJECT)>;
pub type PFN_WDF_FILE_CLOSE = Option<unsafe extern "C" fn(FileObject: WDFFILEOBJECT)>;
pub type PFN_WDF_FILE_CLEANUP = Option<unsafe extern "C" fn(FileObject: WDFFILEOBJECT)>;
pub type PFN_WDF_IO_QUEUE_IO_DEVICE_CONTROL = Option<
    unsafe extern "C" fn(
        Queue: WDFQUEUE,
        Request: WDFREQUEST,
        OutputBufferLength: usize,
        InputBufferLength: usize,
        IoControlCode: ULONG,
    ),
>;
pub type PFN_WDF_IO_QUEUE_IO_DEFAULT =
    Option<unsafe extern "C" fn(Queue: WDFQUEUE, Request: WDFREQUEST)>;
pub type PFN_WDF_REQUEST_CANCEL = Option<unsafe extern "C" fn(Request: WDFREQUEST)>;
pub type PFN_WDF_TIMER = Option<unsafe extern "C" fn(Timer: WDFTIMER)>;
pub type PFN_WDF_DPC = Option<unsafe extern "C" fn(Dpc: WDFDPC)>;
pub type PFN_WDF_WORKITEM = Option<unsafe extern "C" fn(WorkItem: WDFWORKITEM)>;
pub type PFN_WDF_DEVICE_SELF_MANAGED_IO_INIT =
    Option<unsafe extern "C" fn(Device: WDFDEVICE) -> NTSTATUS>;
pub type PFN_WDF_DEVICE_SELF_MANAGED_IO_CLEANUP = Option<unsafe extern "C" fn(Device: WDFDEVICE)>;
/// wdfdevice.h `WDF_POWER_DEVICE_STATE`.
pub mod _WDF_POWER_DEVICE_STATE {
    pub type Type = i32;
    pub const WdfPowerDeviceInvalid: Type = 0;
    pub const WdfPowerDeviceD0: Type = 1;
    pub const WdfPowerDeviceD1: Type = 2;
    pub const WdfPowerDeviceD2: Type = 3;
    pub const WdfPowerDeviceD3: Type = 4;
    pub const WdfPowerDeviceD3Final: Type = 5;
    pub const WdfPowerDevicePrepareForHibernation: Type = 6;
    pub const WdfPowerDeviceMaximum: Type = 7;
}
pub use self::_WDF_POWER_DEVICE_STATE::Type as WDF_POWER_DEVICE_STATE;
/// wdfdevice.h `EVT_WDF_DEVICE_D0_ENTRY`.
pub type PFN_WDF_DEVICE_D0_ENTRY = Option<
    unsafe extern "C" fn(Device: WDFDEVICE, PreviousState: WDF_POWER_DEVICE_STATE) -> NTSTATUS,
>;
/// wdfdevice.h `EVT_WDF_DEVICE_D0_EXIT`.
pub type PFN_WDF_DEVICE_D0_EXIT = Option<
    unsafe extern "C" fn(Device: WDFDEVICE, TargetState: WDF_POWER_DEVICE_STATE) -> NTSTATUS,
>;
/// wdfdevice.h `EVT_WDF_DEVICE_SURPRISE_REMOVAL`.
pub type PFN_WDF_DEVICE_SURPRISE_REMOVAL = Option<unsafe extern "C" fn(Device: WDFDEVICE)>;
pub type PFN_WDFDEVICE_WDM_IRP_PREPROCESS =
    Option<unsafe extern "C" fn(Device: WDFDEVICE, Irp: PIRP) -> NTSTATUS>;
pub type PFN_GET_UNIQUE_CONTEXT_TYPE =
    Option<unsafe extern "C" fn() -> PCWDF_OBJECT_CONTEXT_TYPE_INFO>;

// ---- structures ----
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _WDF_OBJECT_CONTEXT_TYPE_INFO {
    pub Size: ULONG,
    pub ContextName: *const CHAR,
    pub ContextSize: usize,
    pub UniqueType: PCWDF_OBJECT_CONTEXT_TYPE_INFO,
    pub EvtDriverGetUniqueContextType: PFN_GET_UNIQUE_CONTEXT_TYPE,
}
pub type WDF_OBJECT_CONTEXT_TYPE_INFO = _WDF_OBJECT_CONTEXT_TYPE_INFO;
pub type PCWDF_OBJECT_CONTEXT_TYPE_INFO = *const _WDF_OBJECT_CONTEXT_TYPE_INFO;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _WDF_OBJECT_ATTRIBUTES {
    pub Size: ULONG,
    pub EvtCleanupCallback: PFN_WDF_OBJECT_CONTEXT_CLEANUP,
    pub EvtDestroyCallback: PFN_WDF_OBJECT_CONTEXT_DESTROY,
    pub ExecutionLevel: WDF_EXECUTION_LEVEL,
    pub SynchronizationScope: WDF_SYNCHRONIZATION_SCOPE,
    pub ParentObject: WDFOBJECT,
    pub ContextSizeOverride: usize,
    pub ContextTypeInfo: PCWDF_OBJECT_CONTEXT_TYPE_INFO,
}
impl Default for _WDF_OBJECT_ATTRIBUTES {
    fn default() -> Self {
        // SAFETY: bindgen's Default for structs with pointers: all-zero.
        unsafe { core::mem::zeroed() }
    }
}
pub type WDF_OBJECT_ATTRIBUTES = _WDF_OBJECT_ATTRIBUTES;
pub type PWDF_OBJECT_ATTRIBUTES = *mut WDF_OBJECT_ATTRIBUTES;
pub const WDF_NO_OBJECT_ATTRIBUTES: PWDF_OBJECT_ATTRIBUTES = core::ptr::null_mut();

macro_rules! zeroed_default {
    ($($t:ty),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                // SAFETY: bindgen's Default: all-zero.
                unsafe { core::mem::zeroed() }
            }
        }
    )*};
}

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _WDF_DRIVER_CONFIG {
    pub Size: ULONG,
    pub EvtDriverDeviceAdd: PFN_WDF_DRIVER_DEVICE_ADD,
    pub EvtDriverUnload: PFN_WDF_DRIVER_UNLOAD,
    pub DriverInitFlags: ULONG,
    pub DriverPoolTag: ULONG,
}
pub type WDF_DRIVER_CONFIG = _WDF_DRIVER_CONFIG;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _WDF_FILEOBJECT_CONFIG {
    pub Size: ULONG,
    pub EvtDeviceFileCreate: PFN_WDF_DEVICE_FILE_CREATE,
    pub EvtFileClose: PFN_WDF_FILE_CLOSE,
    pub EvtFileCleanup: PFN_WDF_FILE_CLEANUP,
    pub AutoForwardCleanupClose: WDF_TRI_STATE,
    pub FileObjectClass: WDF_FILEOBJECT_CLASS,
}
pub type WDF_FILEOBJECT_CONFIG = _WDF_FILEOBJECT_CONFIG;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _WDF_IO_QUEUE_CONFIG__bindgen_ty_1__bindgen_ty_1 {
    pub NumberOfPresentedRequests: ULONG,
}
#[repr(C)]
#[derive(Copy, Clone)]
pub union _WDF_IO_QUEUE_CONFIG__bindgen_ty_1 {
    pub Parallel: _WDF_IO_QUEUE_CONFIG__bindgen_ty_1__bindgen_ty_1,
}
#[repr(C)]
#[derive(Copy, Clone)]
pub struct _WDF_IO_QUEUE_CONFIG {
    pub Size: ULONG,
    pub DispatchType: WDF_IO_QUEUE_DISPATCH_TYPE,
    pub PowerManaged: WDF_TRI_STATE,
    pub AllowZeroLengthRequests: BOOLEAN,
    pub DefaultQueue: BOOLEAN,
    pub EvtIoDefault: PFN_WDF_IO_QUEUE_IO_DEFAULT,
    pub EvtIoRead: PVOID,
    pub EvtIoWrite: PVOID,
    pub EvtIoDeviceControl: PFN_WDF_IO_QUEUE_IO_DEVICE_CONTROL,
    pub EvtIoInternalDeviceControl: PVOID,
    pub EvtIoStop: PVOID,
    pub EvtIoResume: PVOID,
    pub EvtIoCanceledOnQueue: PVOID,
    pub Settings: _WDF_IO_QUEUE_CONFIG__bindgen_ty_1,
    pub Driver: WDFDRIVER,
}
pub type WDF_IO_QUEUE_CONFIG = _WDF_IO_QUEUE_CONFIG;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _WDF_TIMER_CONFIG {
    pub Size: ULONG,
    pub EvtTimerFunc: PFN_WDF_TIMER,
    pub Period: ULONG,
    pub AutomaticSerialization: BOOLEAN,
    pub TolerableDelay: ULONG,
    pub UseHighResolutionTimer: BOOLEAN,
}
pub type WDF_TIMER_CONFIG = _WDF_TIMER_CONFIG;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _WDF_DPC_CONFIG {
    pub Size: ULONG,
    pub EvtDpcFunc: PFN_WDF_DPC,
    pub AutomaticSerialization: BOOLEAN,
}
pub type WDF_DPC_CONFIG = _WDF_DPC_CONFIG;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _WDF_WORKITEM_CONFIG {
    pub Size: ULONG,
    pub EvtWorkItemFunc: PFN_WDF_WORKITEM,
    pub AutomaticSerialization: BOOLEAN,
}
pub type WDF_WORKITEM_CONFIG = _WDF_WORKITEM_CONFIG;

#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct _WDF_PNPPOWER_EVENT_CALLBACKS {
    pub Size: ULONG,
    pub EvtDeviceD0Entry: PFN_WDF_DEVICE_D0_ENTRY,
    pub EvtDeviceD0EntryPostInterruptsEnabled: PVOID,
    pub EvtDeviceD0Exit: PFN_WDF_DEVICE_D0_EXIT,
    pub EvtDeviceD0ExitPreInterruptsDisabled: PVOID,
    pub EvtDevicePrepareHardware: PVOID,
    pub EvtDeviceReleaseHardware: PVOID,
    pub EvtDeviceSelfManagedIoCleanup: PFN_WDF_DEVICE_SELF_MANAGED_IO_CLEANUP,
    pub EvtDeviceSelfManagedIoFlush: PVOID,
    pub EvtDeviceSelfManagedIoInit: PFN_WDF_DEVICE_SELF_MANAGED_IO_INIT,
    pub EvtDeviceSelfManagedIoSuspend: PVOID,
    pub EvtDeviceSelfManagedIoRestart: PVOID,
    pub EvtDeviceSurpriseRemoval: PFN_WDF_DEVICE_SURPRISE_REMOVAL,
    pub EvtDeviceQueryRemove: PVOID,
    pub EvtDeviceQueryStop: PVOID,
    pub EvtDeviceUsageNotification: PVOID,
    pub EvtDeviceRelationsQuery: PVOID,
    pub EvtDeviceUsageNotificationEx: PVOID,
}
pub type WDF_PNPPOWER_EVENT_CALLBACKS = _WDF_PNPPOWER_EVENT_CALLBACKS;
zeroed_default!(
    _WDF_DRIVER_CONFIG,
    _WDF_IO_QUEUE_CONFIG,
    _WDF_TIMER_CONFIG,
    _WDF_PNPPOWER_EVENT_CALLBACKS
);

// ---- wdm.h / ntddk.h routines ----
pub mod ntddk {
    use super::*;
    unsafe extern "C" {
        pub fn KeAcquireSpinLockRaiseToDpc(SpinLock: PKSPIN_LOCK) -> KIRQL;
        pub fn KeReleaseSpinLock(SpinLock: PKSPIN_LOCK, NewIrql: KIRQL);
        pub fn KeDelayExecutionThread(
            WaitMode: KPROCESSOR_MODE,
            Alertable: BOOLEAN,
            Interval: PLARGE_INTEGER,
        ) -> NTSTATUS;
        pub fn KeGetCurrentIrql() -> KIRQL;
        pub fn KeQueryInterruptTimePrecise(QpcTimeStamp: *mut ULONG64) -> ULONG64;
        pub fn KeStallExecutionProcessor(MicroSeconds: ULONG);
        pub fn PsGetCurrentThreadId() -> HANDLE;
        pub fn KeInitializeEvent(Event: PRKEVENT, Type: EVENT_TYPE, State: BOOLEAN);
        pub fn KeSetEvent(Event: PRKEVENT, Increment: KPRIORITY, Wait: BOOLEAN) -> LONG;
        pub fn KeWaitForSingleObject(
            Object: PVOID,
            WaitReason: KWAIT_REASON,
            WaitMode: KPROCESSOR_MODE,
            Alertable: BOOLEAN,
            Timeout: PLARGE_INTEGER,
        ) -> NTSTATUS;
        pub fn KeQueryActiveProcessorCountEx(GroupNumber: USHORT) -> ULONG;
        pub fn ExInitializeRundownProtection(RunRef: PEX_RUNDOWN_REF);
        pub fn ExAcquireRundownProtection(RunRef: PEX_RUNDOWN_REF) -> BOOLEAN;
        pub fn ExReleaseRundownProtection(RunRef: PEX_RUNDOWN_REF);
        pub fn ExWaitForRundownProtectionRelease(RunRef: PEX_RUNDOWN_REF);
        pub fn IofCompleteRequest(Irp: PIRP, PriorityBoost: CCHAR);
        pub fn MmGetVirtualForPhysical(PhysicalAddress: PHYSICAL_ADDRESS) -> PVOID;
        pub fn MmGetPhysicalAddress(BaseAddress: PVOID) -> PHYSICAL_ADDRESS;
        pub fn KfRaiseIrql(NewIrql: KIRQL) -> KIRQL;
        pub fn KeLowerIrql(NewIrql: KIRQL);
        pub fn KeGetCurrentProcessorNumberEx(ProcNumber: PPROCESSOR_NUMBER) -> ULONG;
        pub fn KeBugCheckEx(
            BugCheckCode: ULONG,
            BugCheckParameter1: ULONG_PTR,
            BugCheckParameter2: ULONG_PTR,
            BugCheckParameter3: ULONG_PTR,
            BugCheckParameter4: ULONG_PTR,
        ) -> !;
        pub fn SeLockSubjectContext(SubjectContext: PSECURITY_SUBJECT_CONTEXT);
        pub fn SeUnlockSubjectContext(SubjectContext: PSECURITY_SUBJECT_CONTEXT);
        pub fn SeTokenIsRestricted(Token: PACCESS_TOKEN) -> BOOLEAN;
        pub fn SeTokenIsAdmin(Token: PACCESS_TOKEN) -> BOOLEAN;
        pub fn IoAllocateErrorLogEntry(IoObject: PVOID, EntrySize: UCHAR) -> PVOID;
        pub fn IoWriteErrorLogEntry(ElEntry: PVOID);
        pub fn IoCreateSymbolicLink(
            SymbolicLinkName: PUNICODE_STRING,
            DeviceName: PUNICODE_STRING,
        ) -> NTSTATUS;
        pub fn IoDeleteSymbolicLink(SymbolicLinkName: PUNICODE_STRING) -> NTSTATUS;
        pub fn MmGetSystemRoutineAddress(SystemRoutineName: PUNICODE_STRING) -> PVOID;
        pub fn SeQueryInformationToken(
            Token: PACCESS_TOKEN,
            TokenInformationClass: TOKEN_INFORMATION_CLASS,
            TokenInformation: *mut PVOID,
        ) -> NTSTATUS;
        pub fn ExFreePool(P: PVOID);
    }
}

// ---- WDF functions (PFN_WDF*, minus DriverGlobals) ----
#[doc(hidden)]
pub mod wdf_fns {
    use super::*;
    unsafe extern "C" {
        pub fn WdfDriverCreate(
            DriverObject: PDRIVER_OBJECT,
            RegistryPath: PCUNICODE_STRING,
            DriverAttributes: PWDF_OBJECT_ATTRIBUTES,
            DriverConfig: *mut WDF_DRIVER_CONFIG,
            Driver: *mut WDFDRIVER,
        ) -> NTSTATUS;
        pub fn WdfControlDeviceInitAllocate(
            Driver: WDFDRIVER,
            SDDLString: *const UNICODE_STRING,
        ) -> PWDFDEVICE_INIT;
        pub fn WdfControlFinishInitializing(Device: WDFDEVICE);
        pub fn WdfDeviceCreate(
            DeviceInit: *mut PWDFDEVICE_INIT,
            DeviceAttributes: PWDF_OBJECT_ATTRIBUTES,
            Device: *mut WDFDEVICE,
        ) -> NTSTATUS;
        pub fn WdfDeviceCreateSymbolicLink(
            Device: WDFDEVICE,
            SymbolicLinkName: PCUNICODE_STRING,
        ) -> NTSTATUS;
        pub fn WdfDeviceInitAssignName(
            DeviceInit: PWDFDEVICE_INIT,
            DeviceName: PCUNICODE_STRING,
        ) -> NTSTATUS;
        pub fn WdfDeviceInitAssignWdmIrpPreprocessCallback(
            DeviceInit: PWDFDEVICE_INIT,
            EvtDeviceWdmIrpPreprocess: PFN_WDFDEVICE_WDM_IRP_PREPROCESS,
            MajorFunction: UCHAR,
            MinorFunctions: *mut UCHAR,
            NumMinorFunctions: ULONG,
        ) -> NTSTATUS;
        pub fn WdfDeviceInitFree(DeviceInit: PWDFDEVICE_INIT);
        pub fn WdfDeviceInitSetCharacteristics(
            DeviceInit: PWDFDEVICE_INIT,
            DeviceCharacteristics: ULONG,
            OrInValues: BOOLEAN,
        );
        pub fn WdfDeviceInitSetExclusive(DeviceInit: PWDFDEVICE_INIT, IsExclusive: BOOLEAN);
        pub fn WdfDeviceInitSetFileObjectConfig(
            DeviceInit: PWDFDEVICE_INIT,
            FileObjectConfig: *mut WDF_FILEOBJECT_CONFIG,
            FileObjectAttributes: PWDF_OBJECT_ATTRIBUTES,
        );
        pub fn WdfDeviceInitSetPnpPowerEventCallbacks(
            DeviceInit: PWDFDEVICE_INIT,
            PnpPowerEventCallbacks: *mut WDF_PNPPOWER_EVENT_CALLBACKS,
        );
        pub fn WdfDeviceInitSetRequestAttributes(
            DeviceInit: PWDFDEVICE_INIT,
            RequestAttributes: PWDF_OBJECT_ATTRIBUTES,
        );
        pub fn WdfDeviceWdmDispatchPreprocessedIrp(Device: WDFDEVICE, Irp: PIRP) -> NTSTATUS;
        pub fn WdfDpcCancel(Dpc: WDFDPC, Wait: BOOLEAN) -> BOOLEAN;
        pub fn WdfDpcCreate(
            Config: *mut WDF_DPC_CONFIG,
            Attributes: PWDF_OBJECT_ATTRIBUTES,
            Dpc: *mut WDFDPC,
        ) -> NTSTATUS;
        pub fn WdfDpcEnqueue(Dpc: WDFDPC) -> BOOLEAN;
        pub fn WdfFdoInitSetFilter(DeviceInit: PWDFDEVICE_INIT);
        pub fn WdfFdoQueryForInterface(
            Fdo: WDFDEVICE,
            InterfaceType: *const GUID,
            Interface: PINTERFACE,
            Size: USHORT,
            Version: USHORT,
            InterfaceSpecificData: PVOID,
        ) -> NTSTATUS;
        pub fn WdfFileObjectGetDevice(FileObject: WDFFILEOBJECT) -> WDFDEVICE;
        pub fn WdfIoQueueCreate(
            Device: WDFDEVICE,
            Config: *mut WDF_IO_QUEUE_CONFIG,
            QueueAttributes: PWDF_OBJECT_ATTRIBUTES,
            Queue: *mut WDFQUEUE,
        ) -> NTSTATUS;
        pub fn WdfIoQueueGetDevice(Queue: WDFQUEUE) -> WDFDEVICE;
        pub fn WdfObjectDelete(Object: WDFOBJECT);
        pub fn WdfObjectReferenceActual(Handle: WDFOBJECT, Tag: PVOID, Line: LONG, File: PCCH);
        pub fn WdfObjectDereferenceActual(Handle: WDFOBJECT, Tag: PVOID, Line: LONG, File: PCCH);
        pub fn WdfObjectGetTypedContextWorker(
            Handle: WDFOBJECT,
            TypeInfo: PCWDF_OBJECT_CONTEXT_TYPE_INFO,
        ) -> PVOID;
        pub fn WdfRequestCompleteWithInformation(
            Request: WDFREQUEST,
            Status: NTSTATUS,
            Information: ULONG_PTR,
        );
        pub fn WdfRequestGetFileObject(Request: WDFREQUEST) -> WDFFILEOBJECT;
        pub fn WdfRequestGetIoQueue(Request: WDFREQUEST) -> WDFQUEUE;
        pub fn WdfRequestGetRequestorMode(Request: WDFREQUEST) -> KPROCESSOR_MODE;
        pub fn WdfRequestWdmGetIrp(Request: WDFREQUEST) -> PIRP;
        pub fn WdfDriverOpenParametersRegistryKey(
            Driver: WDFDRIVER,
            DesiredAccess: ACCESS_MASK,
            KeyAttributes: PWDF_OBJECT_ATTRIBUTES,
            Key: *mut WDFKEY,
        ) -> NTSTATUS;
        pub fn WdfRegistryQueryULong(
            Key: WDFKEY,
            ValueName: PCUNICODE_STRING,
            Value: *mut ULONG,
        ) -> NTSTATUS;
        pub fn WdfRegistryClose(Key: WDFKEY);
        pub fn WdfRequestMarkCancelableEx(
            Request: WDFREQUEST,
            EvtRequestCancel: PFN_WDF_REQUEST_CANCEL,
        ) -> NTSTATUS;
        pub fn WdfRequestRetrieveInputBuffer(
            Request: WDFREQUEST,
            MinimumRequiredLength: usize,
            Buffer: *mut PVOID,
            Length: *mut usize,
        ) -> NTSTATUS;
        pub fn WdfRequestRetrieveOutputBuffer(
            Request: WDFREQUEST,
            MinimumRequiredSize: usize,
            Buffer: *mut PVOID,
            Length: *mut usize,
        ) -> NTSTATUS;
        pub fn WdfRequestUnmarkCancelable(Request: WDFREQUEST) -> NTSTATUS;
        pub fn WdfTimerCreate(
            Config: *mut WDF_TIMER_CONFIG,
            Attributes: PWDF_OBJECT_ATTRIBUTES,
            Timer: *mut WDFTIMER,
        ) -> NTSTATUS;
        pub fn WdfTimerGetParentObject(Timer: WDFTIMER) -> WDFOBJECT;
        pub fn WdfDpcGetParentObject(Dpc: WDFDPC) -> WDFOBJECT;
        pub fn WdfWorkItemGetParentObject(WorkItem: WDFWORKITEM) -> WDFOBJECT;
        pub fn WdfTimerStart(Timer: WDFTIMER, DueTime: LONGLONG) -> BOOLEAN;
        pub fn WdfTimerStop(Timer: WDFTIMER, Wait: BOOLEAN) -> BOOLEAN;
        pub fn WdfWaitLockAcquire(Lock: WDFWAITLOCK, Timeout: *mut LONGLONG) -> NTSTATUS;
        pub fn WdfWaitLockCreate(
            LockAttributes: PWDF_OBJECT_ATTRIBUTES,
            Lock: *mut WDFWAITLOCK,
        ) -> NTSTATUS;
        pub fn WdfWaitLockRelease(Lock: WDFWAITLOCK);
        pub fn WdfWorkItemCreate(
            Config: *mut WDF_WORKITEM_CONFIG,
            Attributes: PWDF_OBJECT_ATTRIBUTES,
            WorkItem: *mut WDFWORKITEM,
        ) -> NTSTATUS;
        pub fn WdfWorkItemEnqueue(WorkItem: WDFWORKITEM);
        pub fn WdfWorkItemFlush(WorkItem: WDFWORKITEM);
    }
}

/// wdk-sys's macro: calls the framework function (through the function table in the real
/// crate) with the driver globals prepended; an `unsafe` call either way.
#[macro_export]
macro_rules! call_unsafe_wdf_function_binding {
    ($name:ident $(, $arg:expr)* $(,)?) => {
        $crate::wdf_fns::$name($($arg),*)
    };
}
