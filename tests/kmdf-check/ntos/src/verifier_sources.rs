//! The source of each rule: the WDK page (learn.microsoft.com title) or KMDF's own
//! verifier (microsoft/Windows-Driver-Frameworks @b6191d95, paths under src/framework/).

use crate::verifier::Rule;

pub fn source(rule: Rule) -> &'static str {
    match rule {
        Rule::IrqlTooHigh => {
            "each function's documented maximum IRQL (its WDK page; KMDF checks PASSIVE_LEVEL ones with FxVerifierCheckIrqlLevel, shared/inc/private/common/fxverifier.h:178-222, e.g. fxdeviceapi.cpp:895, fxtimerapi.cpp:286-291, fxworkitemapi.cpp:256-259, fxwaitlockapi.cpp:140-146, fxregistryapi.cpp:1145, fxdevicefdoapi.cpp:372)"
        }
        Rule::IrqlNotRestored => {
            "KMDF enhanced verifier VerifyIrqlExit (shared/enhancedverif/km/vfprivkm.hpp:44-62: 'Irql at entry of event is not same as at exit', WDF_VERIFIER_IRQL_MISMATCH)"
        }
        Rule::SpinLockHeldOnReturn => {
            "SpinLock rule (wdm): every lock acquired in a dispatch or cancel routine is released before it returns (0xC4/0x00040009)"
        }
        Rule::SpinLockReleaseIrql => {
            "KeReleaseSpinLock macro (wdm.h): 'NewIrql must be the OldIrql returned by KeAcquireSpinLock'; rule IrqlKeReleaseSpinLock"
        }
        Rule::SpinLockRecursive => {
            "SpinLock rule (wdm): 'nested calls to acquire locks for the same resources violate this rule' (0xC4/0x00040009); Driver Verifier Deadlock Detection"
        }
        Rule::SpinLockNotHeld => {
            "KeReleaseSpinLock macro (wdm.h): releases a spin lock the caller acquired; Driver Verifier's spin lock checks (bug check 0xC4) on a release by a non-owner"
        }
        Rule::SpinLockOrder => {
            "Driver Verifier Deadlock Detection: a lock hierarchy violation (two locks taken in both orders) is bug check 0xC4 with P1 = 0x1001, reported without the deadlock happening"
        }
        Rule::SpinLockWatchdog => {
            "Bug Check 0x133: DPC_WATCHDOG_VIOLATION (time at DISPATCH_LEVEL or above)"
        }
        Rule::WaitAtDispatch => {
            "KeWaitForSingleObject function (wdm.h): with Timeout NULL or non-zero the caller runs at IRQL <= APC_LEVEL; rule IrqlKeWaitForMultipleObjects"
        }
        Rule::WaitNeverReturns => {
            "Bug Check 0x9F: DRIVER_POWER_STATE_FAILURE (P1 = 3, an IRP blocked too long); KMDF waits without end for a running callback (fxworkitem.cpp:534-561), and deadlocks on a wait from its own callback (fxtimer.cpp:678-686, fxworkitem.cpp:508-531)"
        }
        Rule::IrqlChange => {
            "KeRaiseIrql macro (wdm.h): 'if the new IRQL is less than the current IRQL, a bug check occurs'; KeLowerIrql function (wdm.h); rules IrqlKeRaiseLower"
        }
        Rule::RequestCompleted => {
            "KMDF FxRequest::VerifyRequestIsNotCompleted (shared/core/fxrequest.cpp:2933-2958, 'WDFREQUEST is already completed'), called from every accessor (fxrequest.cpp:268-2445, fxrequestapi.cpp:2555-2562); DoubleCompletion rule (kmdf)"
        }
        Rule::RequestCompletedCancelable => {
            "KMDF fxrequest.cpp:399-427: 'Completing Cancelable WDFREQUEST. Call WdfRequestUnmarkCancelable before WdfRequestComplete.'"
        }
        Rule::RequestMarkedTwice => {
            "KMDF FxRequest::VerifyRequestIsNotCancelable (fxrequest.cpp:2851-2876, via fxioqueue.cpp:2071-2114)"
        }
        Rule::RequestNotCancelable => {
            "KMDF FxRequest::VerifyRequestIsCancelable (fxrequest.cpp:2824-2848: 'WDFREQUEST is not cancelable')"
        }
        Rule::RequestInformation => {
            "I/O verification: a METHOD_BUFFERED IRP completed with IoStatus.Information larger than its output buffer (the I/O manager would copy past the caller's buffer)"
        }
        Rule::InvalidHandle => {
            "KMDF FxObjectHandleGetPtr/FxObjectHandleGetPtrQI (fxhandle.h:300-358, handleapi.cpp:407-453, WDF_INVALID_HANDLE); a deleted handle is only an ASSERT there (fxhandle.h:344): the simulation checks it always, as special pool would catch the freed object"
        }
        Rule::ContextType => {
            "stricter than KMDF: WdfObjectGetTypedContextWorker returns NULL for a type the object lacks (handleapi.cpp:592-605, 'not a failure'); the driver would dereference it, so the simulation stops there"
        }
        Rule::ReferenceUnderflow => {
            "KMDF tag tracker (shared/object/fxtagtracker.cpp:253-275 'releasing … that was not acquired'; fxobject.cpp:124-150 'freed using WdfObjectDereference, not WdfObjectDelete')"
        }
        Rule::ObjectDelete => {
            "KMDF WdfObjectDelete (fxobjectapi.cpp:305-317, IsNoDeleteDDI: FDOs fxdevicekm.cpp:59-62, file objects fxfileobject.cpp:55, default queues fxpkgio.cpp:536-539); WdfObjectDelete function (wdfobject.h): a control device is deleted at PASSIVE_LEVEL"
        }
        Rule::LeakAtUnload => {
            "Driver Verifier Pool Tracking: bug check 0xC4 (P1 = 0x62) when a driver unloads with allocations not freed; every framework object and registry key closed before"
        }
        Rule::CallbackOutlivesObject => {
            "KMDF fxtimer.cpp:590-597 ('Calling WdfTimerStart when the timer object is running down will lead to a crash'), fxtimer.cpp:518-525 (deleted from its own callback), fxworkitem.cpp:307-311 (enqueued after delete); timers, DPCs and work items are stopped and flushed at dispose (fxtimer.cpp:501-554, fxdpc.cpp:387-412, fxworkitem.cpp:448-505)"
        }
        Rule::InterfaceReference => {
            "ibbus waits for every AL interface reference before it deregisters a CA (bus_pnp.c:790-829); INTERFACE (wdm.h): InterfaceDereference balances the reference the query took"
        }
        Rule::Rundown => {
            "ExReleaseRundownProtection function (wdm.h): releases a protection acquired with ExAcquireRundownProtection; ExInitializeRundownProtection before use"
        }
        Rule::WaitLock => {
            "KMDF FxVerifierLock (shared/object/fxverifierlock.cpp:176-187 recursive acquire WDF_RECURSIVE_LOCK, :320-326 release by a non-owner)"
        }
        Rule::SubjectContext => {
            "SeLockSubjectContext / SeUnlockSubjectContext (ntifs.h): each lock is released by the matching unlock, at PASSIVE_LEVEL"
        }
        Rule::MadElement => {
            "WinOF AL ib_get_mad / ib_put_mad / ib_send_mad (ib_al.h): an element is the caller's from get (or a receive callback) until it is put back or sent, exactly once"
        }
        Rule::AlForcedDestroy => {
            "WinOF AL sync_destroy_obj (core/al/al_common.c): waits for the object's references with a timeout, then 'Forcing object destruction' (ref_cnt = 0); a send in flight holds a reference on its MAD service (al_mad.c)"
        }
        Rule::CompleteUnderLock => {
            "IofCompleteRequest function (wdm.h): 'Never call IoCompleteRequest while holding a spin lock'; design.md 'Data flow'"
        }
        Rule::Simulation => "the simulation (tests/kmdf-check/ntos/README.md)",
    }
}
