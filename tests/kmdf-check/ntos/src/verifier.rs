//! Driver Verifier's and KMDF Verifier's rules, each with the source it follows, and the
//! bug check that stops the process at the first broken one.
//!
//! A rule breaks inside `extern "C"` frames that cannot unwind, so the report (the rule,
//! what broke it, its source, and the backtrace through the binding) goes to stderr and
//! the process aborts, as Windows stops at a bug check. Scenario runners start each
//! scenario in its own process (`../scenarios`), so one failure names its scenario.

use std::fmt::Arguments;
use std::io::Write as _;

/// One rule of the simulated verifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A function called above the IRQL its documentation allows.
    IrqlTooHigh,
    /// A callback returned at another IRQL than it was called at.
    IrqlNotRestored,
    /// A callback returned holding a spin lock.
    SpinLockHeldOnReturn,
    /// `KeReleaseSpinLock` with an IRQL other than the one the acquire returned.
    SpinLockReleaseIrql,
    /// A spin lock acquired again by the thread that holds it (a deadlock on Windows).
    SpinLockRecursive,
    /// A spin lock released by a thread that does not hold it.
    SpinLockNotHeld,
    /// Two spin locks nested in both orders (a potential deadlock).
    SpinLockOrder,
    /// A spin lock held so long that another processor spun on it past the watchdog.
    SpinLockWatchdog,
    /// A wait at DISPATCH_LEVEL or above.
    WaitAtDispatch,
    /// A wait that would never return.
    WaitNeverReturns,
    /// IRQL raised to a lower level, or lowered to a higher one.
    IrqlChange,
    /// A request completed twice, or touched after its completion.
    RequestCompleted,
    /// A request completed while it is still marked cancelable.
    RequestCompletedCancelable,
    /// `WdfRequestMarkCancelableEx` on a request already cancelable.
    RequestMarkedTwice,
    /// `WdfRequestUnmarkCancelable` on a request that is not cancelable.
    RequestNotCancelable,
    /// A request completed with more output than its buffer.
    RequestInformation,
    /// A WDF handle used after its object was deleted, or never created.
    InvalidHandle,
    /// A context type asked of an object that was not created with it.
    ContextType,
    /// An object's references dropped below zero.
    ReferenceUnderflow,
    /// `WdfObjectDelete` on an object the driver may not delete.
    ObjectDelete,
    /// Pool or a framework object left at unload.
    LeakAtUnload,
    /// A timer, DPC or work item still queued when its object is deleted.
    CallbackOutlivesObject,
    /// An interface reference released more often than taken, or kept at removal.
    InterfaceReference,
    /// Rundown protection released more often than acquired.
    Rundown,
    /// A wait lock released by a thread that does not hold it, or acquired twice.
    WaitLock,
    /// A subject context unlocked without a lock, or left locked.
    SubjectContext,
    /// A MAD element used against AL's rules (returned twice, leaked at close).
    MadElement,
    /// ibbus deregistered a CA with a QP1 alias of the filter's still open on it:
    /// `ib_deregister_ca` destroys it by force.
    AlForcedDestroy,
    /// ibcm's own rule (design.md, "Concurrency and IRQL"): never complete a request or
    /// call a client while holding a lock.
    CompleteUnderLock,
    /// The simulation itself was misused, or the driver called something it does not
    /// simulate.
    Simulation,
}

impl Rule {
    /// The rule's name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Rule::IrqlTooHigh => "IRQL_TOO_HIGH",
            Rule::IrqlNotRestored => "IRQL_NOT_RESTORED",
            Rule::SpinLockHeldOnReturn => "SPIN_LOCK_HELD_ON_RETURN",
            Rule::SpinLockReleaseIrql => "SPIN_LOCK_RELEASE_IRQL",
            Rule::SpinLockRecursive => "SPIN_LOCK_RECURSIVE",
            Rule::SpinLockNotHeld => "SPIN_LOCK_NOT_HELD",
            Rule::SpinLockWatchdog => "SPIN_LOCK_WATCHDOG",
            Rule::SpinLockOrder => "SPIN_LOCK_ORDER",
            Rule::WaitAtDispatch => "WAIT_AT_DISPATCH",
            Rule::WaitNeverReturns => "WAIT_NEVER_RETURNS",
            Rule::IrqlChange => "IRQL_CHANGE",
            Rule::RequestCompleted => "REQUEST_COMPLETED",
            Rule::RequestCompletedCancelable => "REQUEST_COMPLETED_CANCELABLE",
            Rule::RequestMarkedTwice => "REQUEST_MARKED_TWICE",
            Rule::RequestNotCancelable => "REQUEST_NOT_CANCELABLE",
            Rule::RequestInformation => "REQUEST_INFORMATION",
            Rule::InvalidHandle => "INVALID_HANDLE",
            Rule::ContextType => "CONTEXT_TYPE",
            Rule::ReferenceUnderflow => "REFERENCE_UNDERFLOW",
            Rule::ObjectDelete => "OBJECT_DELETE",
            Rule::LeakAtUnload => "LEAK_AT_UNLOAD",
            Rule::CallbackOutlivesObject => "CALLBACK_OUTLIVES_OBJECT",
            Rule::InterfaceReference => "INTERFACE_REFERENCE",
            Rule::Rundown => "RUNDOWN",
            Rule::WaitLock => "WAIT_LOCK",
            Rule::SubjectContext => "SUBJECT_CONTEXT",
            Rule::MadElement => "MAD_ELEMENT",
            Rule::AlForcedDestroy => "AL_FORCED_DESTROY",
            Rule::CompleteUnderLock => "COMPLETE_UNDER_LOCK",
            Rule::Simulation => "SIMULATION",
        }
    }

    /// Where the rule comes from.
    pub fn source(self) -> &'static str {
        crate::verifier_sources::source(self)
    }
}

/// Stops the process: the rule, what broke it, its source and the backtrace.
pub fn bugcheck(rule: Rule, detail: Arguments<'_>) -> ! {
    let backtrace = std::backtrace::Backtrace::force_capture();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "\n*** VERIFIER {}: {detail}\n    rule: {}\n    backtrace:\n{backtrace}",
        rule.name(),
        rule.source()
    );
    let _ = writeln!(err, "*** debugger log (DbgPrint), last lines:");
    for line in crate::state::debug_log_tail(20) {
        let _ = writeln!(err, "    {line}");
    }
    let _ = err.flush();
    std::process::abort()
}
