//! KMDF's callback order for a filter device that is not the power policy owner, and where
//! the IRP reaches the driver below (ibbus), from microsoft/Windows-Driver-Frameworks
//! `src/framework/shared/irphandlers/pnp/`: `fxpkgfdo.cpp`, `fxpkgpnp.cpp`, `fdopower.cpp`,
//! `pnpstatemachine.cpp`, `powerstatemachine.cpp`, `notpowerpolicyownerstatemachine.cpp`,
//! `selfmanagediostatemachine.cpp`. ibcm's filter sits directly above ibbus, and the
//! drivers above it (WinVerbs, WinMad, ndfltr) see each IRP that travels down before it,
//! and each that completes upwards after it.

use ibcm_lifecycle::{Callback, PowerTarget};

use super::world::World;

fn hang(w: &mut World, hca: usize, result: Result<(), &'static str>) -> bool {
    if let Err(why) = result {
        w.hung = Some(format!(
            "HCA {hca}: ibbus waits for ibcm's reference: {why}"
        ));
        return true;
    }
    false
}

/// Kernel clients above ibcm (WinVerbs): their D0Exit runs before ibcm's on the way down
/// and releases their `iba_cm` reference (`wv_driver.c:662-672`); their D0Entry runs after
/// ibcm's on the way up and queries again (`wv_driver.c:554`).
fn clients_d0_exit(w: &mut World, hca: usize) {
    if w.stacks[hca].in_verdict || w.stacks[hca].published {
        w.iba_cm_refs = w.iba_cm_refs.saturating_sub(1);
    }
}

fn clients_d0_entry(w: &mut World, hca: usize) {
    if w.stacks[hca].published {
        w.iba_cm_refs += 1;
    }
}

/// IRP_MN_START_DEVICE on a new device: the framework sends it down first and resumes in
/// its completion routine (`fxpkgfdo.cpp:1062` sets `_PnpStartDeviceCompletionRoutine`,
/// :1473-1508 posts `PnpEventStartDeviceComplete`), so ibbus's `fdo_start` has registered
/// the CA; then `PowerD0Starting` calls EvtDeviceD0Entry (`powerstatemachine.cpp:2234-2263`)
/// and the self-managed I/O machine starts (`powerstatemachine.cpp:2448`), which calls
/// EvtDeviceSelfManagedIoInit the first time (`selfmanagediostatemachine.cpp:377`).
pub fn start(w: &mut World, hca: usize) {
    w.device_add(hca);
    let slot = w.stacks[hca].hook_slot;
    w.stacks[hca].ibbus.start(slot);
    w.callback(hca, Callback::D0Entry);
    w.callback(hca, Callback::SelfManagedIoInit);
    clients_d0_entry(w, hca);
    w.check();
}

/// A device IRP for D1-D3 (S3 sleep, S4 hibernation): `LowerDevicePower` runs the power
/// machine first (`fdopower.cpp:405-416`): `PowerGotoDx` suspends self-managed I/O
/// (`powerstatemachine.cpp:2884-2906`, `selfmanagediostatemachine.cpp:432`), then
/// `PowerGotoDxIoStoppedCommon` calls EvtDeviceD0Exit (:2974-3098); only then is the IRP
/// sent down (`PowerReleasePendingDeviceIrp`, `fdopower.cpp:491-496`) to ibbus's
/// `__device_power_down_workItem`.
pub fn sleep(w: &mut World, hca: usize, shutdown: bool) {
    if w.hung.is_some() {
        return;
    }
    clients_d0_exit(w, hca);
    w.callback(hca, Callback::SelfManagedIoSuspend);
    w.callback(hca, Callback::D0Exit(PowerTarget::Sleep));
    let r = w.stacks[hca].ibbus.power_down(shutdown);
    if hang(w, hca, r) {
        return;
    }
    w.check();
}

/// The device IRP for D0 on resume: `RaiseDevicePower` sends it down first
/// (`fdopower.cpp:358-370`); ibbus completes it after `__register_ca`; the completion
/// routine (`fdopower.cpp:375-399`) runs the power machine: `PowerWaking` calls
/// EvtDeviceD0Entry (`powerstatemachine.cpp:3518-3544`), then `PowerStartSelfManagedIo`
/// (:3285-3316) calls EvtDeviceSelfManagedIoRestart (`selfmanagediostatemachine.cpp:469`).
pub fn wake(w: &mut World, hca: usize) {
    if w.hung.is_some() {
        return;
    }
    let slot = w.stacks[hca].hook_slot;
    w.stacks[hca].ibbus.power_up(slot);
    w.callback(hca, Callback::D0Entry);
    w.callback(hca, Callback::SelfManagedIoRestart);
    clients_d0_entry(w, hca);
    w.check();
}

/// `PowerGotoD3Stopped` (`powerstatemachine.cpp:2517-2631`): self-managed I/O suspended
/// (:2562), EvtDeviceD0Exit(WdfPowerDeviceD3Final) (:2631). The not-power-policy-owner
/// machine gets there from `PwrPolStop` and `PwrPolSurpriseRemove` alike
/// (`notpowerpolicyownerstatemachine.cpp:49-53` in D0, :74-78 in Dx; `NotPowerPolOwnerStopping` :437-454
/// posts `PowerImplicitD3`).
fn go_d3_final(w: &mut World, hca: usize) {
    w.callback(hca, Callback::SelfManagedIoSuspend);
    w.callback(hca, Callback::D0Exit(PowerTarget::D3Final));
}

/// Resource rebalance: IRP_MN_QUERY_STOP_DEVICE (`fxpkgpnp.cpp:2034-2079`, the machine's
/// `PnpEventQueryStopPending` passes it down, `pnpstatemachine.cpp:1896`; ibbus skips it),
/// then IRP_MN_STOP_DEVICE (`fxpkgpnp.cpp:2129-2159`): `PnpEventStartedStopping` stops
/// power policy (`pnpstatemachine.cpp:2597-2626`), the device goes to D3Final, then
/// `PnpEventStopped` releases the hardware and sends the IRP down
/// (`pnpstatemachine.cpp:2521-2565`) to ibbus's stop. Then IRP_MN_START_DEVICE again:
/// `PnpEventStoppedWaitForStartCompletion` sends it down first (:2568-2594), ibbus's
/// `fdo_start` registers the CA, `PnpEventStartingFromStopped` (:2471) powers up:
/// D0Entry, then self-managed I/O restart.
pub fn rebalance(w: &mut World, hca: usize) {
    if w.hung.is_some() {
        return;
    }
    clients_d0_exit(w, hca);
    go_d3_final(w, hca);
    let r = w.stacks[hca].ibbus.stop();
    if hang(w, hca, r) {
        return;
    }
    w.check();
    let slot = w.stacks[hca].hook_slot;
    w.stacks[hca].ibbus.start(slot);
    w.callback(hca, Callback::D0Entry);
    w.callback(hca, Callback::SelfManagedIoRestart);
    clients_d0_entry(w, hca);
    w.check();
}

/// IRP_MN_SURPRISE_REMOVAL (`fxpkgpnp.cpp:2550-2577`) of a device in D0:
/// `PnpEventSurpriseRemoveIoStarted` calls EvtDeviceSurpriseRemoval first
/// (`pnpstatemachine.cpp:2756-2787`, :2779), `PnpEventFailedIoStarting` sends
/// `PwrPolSurpriseRemove` (:2826-2847): D3Final; `PnpEventFailed` (:2877) flushes self-managed I/O
/// (:2895 `PnpCleanupForRemove(FALSE)`); `PnpEventFailedPowerPolicyRemoved` (:2906)
/// sends the IRP
/// down (:2932 `PnpFinishProcessingIrp(FALSE)`). A device already in Dx (it never came
/// back from sleep) gets only the callback (`PnpEventFailedSurpriseRemoved` :2991-3035 for
/// a failed one; the power machine has nothing to power down).
pub fn surprise_remove(w: &mut World, hca: usize, in_d0: bool) {
    if w.hung.is_some() {
        return;
    }
    if in_d0 {
        clients_d0_exit(w, hca);
    }
    w.callback(hca, Callback::SurpriseRemoval);
    if in_d0 {
        go_d3_final(w, hca);
    }
    let r = w.stacks[hca].ibbus.surprise_remove();
    if hang(w, hca, r) {
        return;
    }
    w.check();
    remove_irp(w, hca);
}

/// IRP_MN_REMOVE_DEVICE (`fxpkgpnp.cpp:2459-2540`): the machine runs to
/// `PnpEventRemovedCommonCode`, which calls EvtDeviceSelfManagedIoCleanup
/// (`pnpstatemachine.cpp:2020`); then `ProcessRemoveDeviceOverload` sends the IRP down and
/// deletes the device (`fxpkgfdo.cpp:1247-1262`): the device's EvtCleanupCallback runs
/// after ibbus handled the removal.
fn remove_irp(w: &mut World, hca: usize) {
    w.callback(hca, Callback::SelfManagedIoCleanup);
    let r = w.stacks[hca].ibbus.remove();
    if hang(w, hca, r) {
        return;
    }
    w.callback(hca, Callback::Cleanup);
    w.check();
}

/// An orderly removal (disable, uninstall) of a device in D0: IRP_MN_QUERY_REMOVE_DEVICE
/// passes down (`PnpEventQueryRemovePending`, `pnpstatemachine.cpp:1647`), then
/// IRP_MN_REMOVE_DEVICE: `PnpEventStartedRemoving` (:2422) stops power policy (D3Final),
/// `PnpEventRemovingDisableInterfaces` releases the hardware (:2296-2325), then as
/// [`remove_irp`].
pub fn remove(w: &mut World, hca: usize) {
    if w.hung.is_some() {
        return;
    }
    clients_d0_exit(w, hca);
    go_d3_final(w, hca);
    remove_irp(w, hca);
}
