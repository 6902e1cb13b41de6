//! The panic handler: a panic stops the machine with ibcm's own bug check code.
//!
//! The engine and the dispatch layer never panic on any input and allocate fallibly on
//! every kernel path (issue #30), so a panic is a bug of ibcm's. wdk-panic's handler is
//! `loop {}`: a panic at DISPATCH_LEVEL under the CM's spin lock would spin every CPU
//! that needs the lock (a hang, or bug check 0x133 DPC_WATCHDOG_VIOLATION naming no one).
//! `KeBugCheckEx` (any IRQL, does not return) names ibcm and the place instead.

use wdk_sys::ULONG_PTR;
use wdk_sys::ntddk::KeBugCheckEx;

/// ibcm's bug check code (docs/security.md). Parameters: 1 the panic's source line,
/// 2 its column, 3 the address of the source file's name (in ibcm.sys's image), 4 the
/// name's length.
pub const IBCM_BUGCHECK: u32 = 0xE1BC_0001;

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let (line, column, file) = info
        .location()
        .map_or((0, 0, ""), |l| (l.line(), l.column(), l.file()));
    // SAFETY: (P1) KeBugCheckEx may be called at any IRQL and never returns; its
    // parameters are plain numbers (the file name's address is only recorded in the dump).
    unsafe {
        KeBugCheckEx(
            IBCM_BUGCHECK,
            line as ULONG_PTR,
            column as ULONG_PTR,
            file.as_ptr() as ULONG_PTR,
            file.len() as ULONG_PTR,
        )
    }
}
