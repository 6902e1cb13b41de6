//! Stand-in for `wdk` 0.5: only `println!` (DbgPrint through core::fmt).
#![no_std]
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {{
        let _ = ::core::format_args!($($arg)*);
    }};
}
