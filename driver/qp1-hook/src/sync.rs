//! The atomics of the hook's handle filter: core's, or loom's under `--cfg loom` so the
//! loom models see them.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicUsize, Ordering};
