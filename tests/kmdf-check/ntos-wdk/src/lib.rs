//! `wdk::println!` for driver/kmdf on the simulated kernel: DbgPrint into the
//! simulation's debugger log (`ibcm_ntos::state::dbg_print`).
#![no_std]

#[doc(hidden)]
pub use ibcm_ntos::state::dbg_print as __dbg_print;

#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {
        $crate::__dbg_print(::core::format_args!($($arg)*))
    };
}
