//! What wdk-sys leaves to the driver: structure sizes (`WDF_STRUCTURE_SIZE`), the non-zero
//! defaults of `WDF_OBJECT_ATTRIBUTES_INIT`, typed object contexts
//! (`WDF_DECLARE_CONTEXT_TYPE`) and GUID literals (reference/windows-drivers-rs.md §1.6,
//! §1.7; windows-drivers-rs issues #242 and #330).

use wdk_sys::{
    _WDF_EXECUTION_LEVEL, _WDF_SYNCHRONIZATION_SCOPE, GUID, PCWDF_OBJECT_CONTEXT_TYPE_INFO, ULONG,
    UNICODE_STRING, WDF_OBJECT_ATTRIBUTES, WDF_OBJECT_CONTEXT_TYPE_INFO, WDFOBJECT,
};

/// `WDF_STRUCTURE_SIZE(T)`: the size of a WDF configuration structure, checked to fit the
/// `ULONG` `Size` field (the echo sample's `*_SIZE` constants do the same).
pub const fn size_of_ulong<T>() -> ULONG {
    let size = core::mem::size_of::<T>();
    assert!(size <= ULONG::MAX as usize);
    size as ULONG
}

/// A `WDF_OBJECT_CONTEXT_TYPE_INFO` in a `static`: what `WDF_DECLARE_CONTEXT_TYPE` emits.
/// Declare one with [`context_type!`].
#[repr(transparent)]
pub struct ContextType(pub WDF_OBJECT_CONTEXT_TYPE_INFO);

// SAFETY: (W1) the structure is never written after its constant initialisation; the
// framework only reads it (it takes a `PCWDF_OBJECT_CONTEXT_TYPE_INFO`), so sharing it
// between threads is sound although it holds raw pointers.
unsafe impl Sync for ContextType {}

impl ContextType {
    /// The pointer WDF identifies the context type by (`UniqueType`, as
    /// `WDF_GET_CONTEXT_TYPE_INFO` reads it).
    pub const fn unique(&self) -> PCWDF_OBJECT_CONTEXT_TYPE_INFO {
        self.0.UniqueType
    }
}

/// Declares `static $name: ContextType` for the context structure `$ty`
/// (`WDF_DECLARE_CONTEXT_TYPE_WITH_NAME`; the samples' `wdf_object_context.rs` does the same
/// with a `paste`-based macro). Placed in `.data` like the C macro does
/// (wdfobject.h `WDF_DECLARE_TYPE_AND_GLOBALS`: `__declspec(allocate(".data"))`).
macro_rules! context_type {
    ($name:ident, $ty:ty) => {
        // SAFETY: (W3) `.data` is the default writable data section; nothing else is placed
        // under this static's symbol.
        #[unsafe(link_section = ".data")]
        pub static $name: $crate::wdf::ContextType =
            $crate::wdf::ContextType(wdk_sys::WDF_OBJECT_CONTEXT_TYPE_INFO {
                Size: $crate::wdf::size_of_ulong::<wdk_sys::WDF_OBJECT_CONTEXT_TYPE_INFO>(),
                ContextName: concat!(stringify!($ty), "\0").as_ptr().cast(),
                ContextSize: core::mem::size_of::<$ty>(),
                UniqueType: (&raw const $name).cast(),
                EvtDriverGetUniqueContextType: None,
            });
    };
}
pub(crate) use context_type;

/// `WDF_OBJECT_ATTRIBUTES_INIT` (+ `_SET_CONTEXT_TYPE`): both execution level and
/// synchronization scope inherit from the parent (zero would mean *invalid*), with the
/// given parent (null: the framework's default parent) and context type.
pub fn attributes(
    parent: WDFOBJECT,
    context: Option<&'static ContextType>,
) -> WDF_OBJECT_ATTRIBUTES {
    WDF_OBJECT_ATTRIBUTES {
        Size: size_of_ulong::<WDF_OBJECT_ATTRIBUTES>(),
        ExecutionLevel: _WDF_EXECUTION_LEVEL::WdfExecutionLevelInheritFromParent,
        SynchronizationScope: _WDF_SYNCHRONIZATION_SCOPE::WdfSynchronizationScopeInheritFromParent,
        ParentObject: parent,
        ContextTypeInfo: match context {
            Some(c) => c.unique(),
            None => core::ptr::null(),
        },
        ..WDF_OBJECT_ATTRIBUTES::default()
    }
}

/// The context of type `info` of a framework object (`WdfObjectGet_<type>`).
///
/// # Safety
///
/// `handle` is a live framework object whose attributes named `info` as context type, and
/// `T` is the type `info` was declared for.
pub unsafe fn context<T>(handle: WDFOBJECT, info: &'static ContextType) -> *mut T {
    // SAFETY: (W2) per this function's contract the handle is live and carries a context of
    // this type; WdfObjectGetTypedContextWorker is callable at any IRQL <= DISPATCH_LEVEL.
    let raw = unsafe {
        wdk_sys::call_unsafe_wdf_function_binding!(
            WdfObjectGetTypedContextWorker,
            handle,
            info.unique()
        )
    };
    raw.cast()
}

/// A GUID from the `(Data1, Data2, Data3, Data4)` tuples of `ibcm-ioctl`.
pub const fn guid(g: (u32, u16, u16, [u8; 8])) -> GUID {
    GUID {
        Data1: g.0,
        Data2: g.1,
        Data3: g.2,
        Data4: g.3,
    }
}

/// An ASCII string as a UTF-16 array of exactly its length (for the static
/// `UNICODE_STRING`s of device names, links and SDDL; no terminator: `Length` says it).
pub const fn utf16<const N: usize>(s: &str) -> [u16; N] {
    let bytes = s.as_bytes();
    assert!(bytes.len() == N);
    let mut out = [0u16; N];
    let mut i = 0;
    while i < N {
        assert!(bytes[i].is_ascii());
        out[i] = bytes[i] as u16;
        i += 1;
    }
    out
}

/// A UNICODE_STRING over a UTF-16 array (the callee only reads it; the caller keeps the
/// array alive for the call).
pub fn unicode(chars: &[u16]) -> UNICODE_STRING {
    let bytes = u16::try_from(core::mem::size_of_val(chars)).unwrap_or(0);
    UNICODE_STRING {
        Length: bytes,
        MaximumLength: bytes,
        Buffer: chars.as_ptr().cast_mut(),
    }
}
