//! Counting the driver's allocations: the verifier's rule that nothing allocates at
//! DISPATCH_LEVEL, and the driver's bytes per node ([`Node::count_driver_bytes`]).
//!
//! The counter is allocation-counter's, whose `#[global_allocator]` replaces the
//! allocator of the whole program that links it. A library does not do that to its
//! users (a provider with an allocator of its own would lose it), so the counting is the
//! feature `count-allocations`, which the project's own tests and the `ibcm` CLI turn on
//! and the user library never does. Without it nothing is counted: [`measure`] sees no
//! allocation and [`opt_out`] only runs its closure.
//!
//! [`Node::count_driver_bytes`]: crate::Node::count_driver_bytes

/// What [`measure`] saw its closure allocate, on this thread.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counted {
    /// Allocations made.
    pub count_total: u64,
    /// Bytes still allocated at the end (negative: more freed than allocated).
    pub bytes_current: i64,
}

/// Runs `f`, counting what it allocates on this thread.
#[cfg(feature = "count-allocations")]
pub(crate) fn measure(f: impl FnOnce()) -> Counted {
    let info = allocation_counter::measure(f);
    Counted {
        count_total: info.count_total,
        bytes_current: info.bytes_current,
    }
}

/// Runs `f` (nothing is counted in this build).
#[cfg(not(feature = "count-allocations"))]
pub(crate) fn measure(f: impl FnOnce()) -> Counted {
    f();
    Counted::default()
}

/// Runs `f` without counting what it allocates: the harness's own bookkeeping.
#[cfg(feature = "count-allocations")]
pub(crate) fn opt_out(f: impl FnOnce()) {
    allocation_counter::opt_out(f);
}

/// Runs `f` (nothing is counted in this build).
#[cfg(not(feature = "count-allocations"))]
pub(crate) fn opt_out(f: impl FnOnce()) {
    f();
}
