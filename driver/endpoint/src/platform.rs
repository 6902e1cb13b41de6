//! The boundary every platform implements: the KMDF binding on Windows, `driver/host` on
//! Linux. The dispatch layer calls these only with its state lock released.

use ibcm_cep::{Instant, Transmit};

/// A request from user mode (a WDFREQUEST on Windows): the dispatch layer owns it from
/// the moment it is handed in until it passes it to [`Platform::complete`].
pub trait Request {
    /// Bytes the caller's output buffer holds.
    fn output_len(&self) -> usize;
    /// Writes `bytes` at `offset` of the output buffer. The dispatch layer never writes
    /// past [`output_len`](Self::output_len); a platform should still refuse (and report)
    /// such a write.
    fn write_output(&mut self, offset: usize, bytes: &[u8]);
    /// Identifies the request for [`Device::cancel`](crate::Device::cancel).
    fn key(&self) -> u64;
}

/// A lock around the dispatch layer's state: a WDF spin lock in the kernel, a mutex on
/// the host, a loom mutex in model checks.
pub trait Lock<T> {
    /// Runs `f` with the state locked.
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

/// What the dispatch layer needs from the platform.
pub trait Platform {
    /// The request token.
    type Request: Request;
    /// The lock type.
    type Lock<T>: Lock<T>;
    /// Wraps the state in a lock.
    fn new_lock<T>(value: T) -> Self::Lock<T>;
    /// The current time.
    fn now(&self) -> Instant;
    /// Posts a MAD on QP1.
    fn send(&self, transmit: &Transmit);
    /// Completes a request with an NTSTATUS and the number of output bytes written.
    fn complete(&self, request: Self::Request, status: i32, information: usize);
    /// Arms the one timer to `deadline` (or disarms it). Called with no state lock held,
    /// but under a lock of its own (one [`new_lock`](Self::new_lock)) that keeps
    /// overlapping entry points from arming it out of order.
    fn set_timer(&self, deadline: Option<Instant>);
    /// Identifies the running thread (KeGetCurrentThread): how a kernel client's
    /// destroy learns that it is called from inside that client's own callback. A
    /// platform that serves kernel clients must override it.
    fn current_thread(&self) -> u64 {
        0
    }
    /// Where trace points go (the engine's and the dispatch layer's), asked once when
    /// the device is added; `None` (the default): nowhere, at the cost of one branch each.
    fn tracer(&self) -> Option<&'static dyn crate::DispatchTracer> {
        None
    }
    /// Asks for [`Device::passive_work`](crate::Device::passive_work) to run soon at
    /// PASSIVE_LEVEL (a work item), from a DISPATCH_LEVEL path that found the event-record
    /// pool short. The default does nothing: the next IOCTL grows the pool as well.
    fn request_passive_work(&self) {}
    /// Lets another thread run while `destroy_id` waits for a callback on another thread
    /// to return (a short delay at PASSIVE_LEVEL).
    fn relax(&self) {}
    /// IOCTLs refused over a quota and MADs dropped as forged since the last call: where an
    /// administrator hears of a hostile or runaway caller (the KMDF binding: an ETW event
    /// each time, the System log at a limited rate). Called with no lock of the dispatch
    /// layer held, at the entry point's IRQL (up to DISPATCH_LEVEL). The default does
    /// nothing: COUNTERS has the totals.
    fn refused(&self, refused: crate::Refused) {
        let _ = refused;
    }
    /// Fills STATUS's HCAs and ports (`out.hca_count`, `out.port_count` and the arrays;
    /// the dispatch layer set `size`). Called with no lock of the dispatch layer held, at
    /// the IOCTL caller's IRQL. The default reports none.
    fn fabric_status(&self, out: &mut ibcm_ioctl::StatusOut) {
        let _ = out;
    }
}
