//! One HCA's filter device: its phase, what it holds, and the steps each KMDF callback
//! asks of the binding.
//!
//! What the binding holds while bound ([`Holdings`]): one reference on ibbus's
//! `GUID_IB_AL_INTERFACE` (`WdfFdoQueryForInterface`, counted in ibbus's `n_ifc_ref`:
//! `bus_pnp.c:1073-1074` `al_ref_ifc`); AL objects on the CA (the AL handle, the CA, an
//! alias PD, the PnP registration, per port a QP1 alias and a MAD service); the CA's ports
//! published in the host CM's port table (sends go out through them); the verbs hook's
//! steering decision for the HCA's slot. Held from device add to the device's cleanup:
//! the verbs-hook slot (the thunks in ibbus's table and their receive tracking live as long
//! as ibbus's copy of the table, which ibbus re-queries through the filter at every
//! power-up: `bus_pnp.c:1721` -> `__register_ca` -> `__get_ifc`, :448-451) and the
//! filter's place in the host's filter count (the host CM lives while any filter does).
//!
//! Unbinding ([`UNBIND`]) tells the host CM that the HCA's ports are gone
//! (`Device::remove_port` per port: every connection and kernel-client id bound to one of
//! them gets DEVICE_REMOVAL and its timers stop, `driver/cep/tests/migration_sidr_p2p.rs`
//! `remove_port_ends_every_cep_on_it`); the host CM, its listens and the other HCAs' ports
//! stay.

/// Which KMDF callbacks bind and unbind the HCA's IBAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// `EvtDeviceD0Entry` binds; `EvtDeviceD0Exit`, `EvtDeviceSurpriseRemoval` and the
    /// device's cleanup unbind (as WinMad, `wm_driver.c:387, 465`, and WinVerbs,
    /// `wv_driver.c:554, 662-672`).
    Power,
    /// Before issue #27: `EvtDeviceSelfManagedIoInit` binds, `...Cleanup` (run only at
    /// IRP_MN_REMOVE_DEVICE, `pnpstatemachine.cpp:2020`) unbinds. The tests show the
    /// models failing it; the binding never uses it.
    SelfManagedIo,
}

/// The device power state a D0Exit goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerTarget {
    /// D1..D3 for a system sleep or hibernation (`PowerGotoDxIoStoppedCommon`,
    /// `powerstatemachine.cpp:2974-3098`): the device comes back with a D0Entry.
    Sleep,
    /// `WdfPowerDeviceD3Final`: stop, removal or surprise removal
    /// (`PowerGotoD3Stopped`, `powerstatemachine.cpp:2517-2631`).
    D3Final,
}

/// The filter device's KMDF callbacks, as the binding forwards them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callback {
    /// `EvtDeviceD0Entry` (start, resume, restart after a stop).
    D0Entry,
    /// `EvtDeviceSelfManagedIoInit` (first start only).
    SelfManagedIoInit,
    /// `EvtDeviceSelfManagedIoRestart` (after every later D0Entry).
    SelfManagedIoRestart,
    /// `EvtDeviceSelfManagedIoSuspend` (before every D0Exit).
    SelfManagedIoSuspend,
    /// `EvtDeviceD0Exit`.
    D0Exit(PowerTarget),
    /// `EvtDeviceSurpriseRemoval` (before the IRP goes down to ibbus).
    SurpriseRemoval,
    /// `EvtDeviceSelfManagedIoCleanup` (IRP_MN_REMOVE_DEVICE, before the IRP goes down).
    SelfManagedIoCleanup,
    /// The device's `EvtCleanupCallback` (after the remove IRP went down:
    /// `fxpkgfdo.cpp:1247-1262` `ProcessRemoveDeviceOverload`, then `DeleteDevice`).
    Cleanup,
}

/// What the binding does, in the order given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create the control device (and the host CM) if it does not exist: it may have
    /// failed before (a handle of the previous instance still open).
    EnsureControlDevice,
    /// Query IBAL down the stack, open AL, the CA and an alias PD, register for port PnP
    /// (each port: a host number, a QP1 alias, a MAD service, published, steering set).
    /// A failure leaves the HCA unbound and logged; the HCA's start never fails for it.
    Bind,
    /// Undo [`Step::Bind`], in the order of [`UNBIND`]; idempotent.
    Unbind,
    /// Free the HCA's verbs-hook slot for another HCA (its thunks stay in the image).
    ReleaseHookSlot,
    /// Count the filter out of the host; the last one tears the host CM down.
    CountOut,
}

/// One part of [`Step::Unbind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Teardown {
    /// Clear the slot's steering decision: no `poll_cq` thunk asks the engine about this
    /// HCA's MADs any more (they go to AL).
    ClearSteering,
    /// Per port: out of the host's port table, wait for sends in flight (rundown), then
    /// `Device::remove_port` (its connections and kernel-client ids hear DEVICE_REMOVAL).
    UnpublishPorts,
    /// `ib_close_al`: the PnP registration, the PD, the CA, every QP1 alias and MAD
    /// service, waiting for their callbacks.
    CloseAl,
    /// `InterfaceDereference` of the AL interface: ibbus's wait may end.
    ReleaseInterface,
}

/// The order of [`Step::Unbind`]: nothing of AL is used after `ib_close_al`, and the
/// interface reference goes last, so that ibbus deregisters the CA only once every AL
/// object of ibcm on it is gone (AL would otherwise destroy them by force after a timeout,
/// `core/al/al_common.c:610-660`, and ibcm's later `ib_close_al` would use freed objects).
pub const UNBIND: [Teardown; 4] = [
    Teardown::ClearSteering,
    Teardown::UnpublishPorts,
    Teardown::CloseAl,
    Teardown::ReleaseInterface,
];

/// Where the filter device is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Added, not started (or stopped: released its hardware, waiting for a start).
    Added,
    /// In D0.
    Working,
    /// In a low-power state (sleep, hibernation) or D3Final before a stop or removal.
    LowPower,
    /// Surprise removed: never in D0 again; waiting for IRP_MN_REMOVE_DEVICE.
    SurpriseRemoved,
    /// Removed and deleted (after [`Callback::Cleanup`]).
    Deleted,
}

/// What the filter holds for its HCA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holdings {
    /// The AL interface reference, the AL objects, the published ports and the steering
    /// decision (all made by [`Step::Bind`], all undone by [`Step::Unbind`]).
    pub bound: bool,
    /// The verbs-hook slot.
    pub hook_slot: bool,
    /// A place in the host's filter count.
    pub counted: bool,
}

/// The steps one callback asks for (at most four).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    steps: [Option<Step>; 4],
    next: usize,
}

impl Plan {
    const NONE: Self = Self {
        steps: [None; 4],
        next: 0,
    };

    fn push(&mut self, step: Step) {
        if let Some(slot) = self.steps.iter_mut().find(|s| s.is_none()) {
            *slot = Some(step);
        }
    }
}

impl Iterator for Plan {
    type Item = Step;
    fn next(&mut self) -> Option<Step> {
        let step = self.steps.get(self.next).copied().flatten()?;
        self.next += 1;
        Some(step)
    }
}

/// One HCA's filter device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hca {
    mapping: Mapping,
    phase: Phase,
    holdings: Holdings,
}

impl Hca {
    /// A filter device just added (`EvtDriverDeviceAdd`), holding a verbs-hook slot or not,
    /// counted in the host.
    pub const fn added(mapping: Mapping, hook_slot: bool) -> Self {
        Self {
            mapping,
            phase: Phase::Added,
            holdings: Holdings {
                bound: false,
                hook_slot,
                counted: true,
            },
        }
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// What the filter holds now.
    pub fn holdings(&self) -> Holdings {
        self.holdings
    }

    /// One callback: the new phase and the steps the binding carries out, in order.
    pub fn on(&mut self, callback: Callback) -> Plan {
        let mut plan = Plan::NONE;
        self.phase = match (callback, self.phase) {
            (_, Phase::Deleted) => return plan,
            (Callback::Cleanup, _) => {
                self.unbind(&mut plan);
                if self.holdings.hook_slot {
                    self.holdings.hook_slot = false;
                    plan.push(Step::ReleaseHookSlot);
                }
                if self.holdings.counted {
                    self.holdings.counted = false;
                    plan.push(Step::CountOut);
                }
                Phase::Deleted
            }
            (Callback::SurpriseRemoval, _) => {
                if self.mapping == Mapping::Power {
                    self.unbind(&mut plan);
                }
                Phase::SurpriseRemoved
            }
            (_, Phase::SurpriseRemoved) => {
                // KMDF powers a surprise-removed device down once more (D0Exit D3Final)
                // and calls its self-managed I/O cleanup; it never comes back to D0.
                if callback == Callback::SelfManagedIoCleanup {
                    self.unbind(&mut plan);
                }
                Phase::SurpriseRemoved
            }
            (Callback::D0Entry, _) => {
                if self.mapping == Mapping::Power {
                    self.bind(&mut plan);
                }
                Phase::Working
            }
            (Callback::SelfManagedIoInit, phase) => {
                if self.mapping == Mapping::SelfManagedIo {
                    self.bind(&mut plan);
                }
                phase
            }
            (Callback::D0Exit(_), _) => {
                if self.mapping == Mapping::Power {
                    self.unbind(&mut plan);
                }
                Phase::LowPower
            }
            (Callback::SelfManagedIoCleanup, phase) => {
                self.unbind(&mut plan);
                phase
            }
            (Callback::SelfManagedIoRestart | Callback::SelfManagedIoSuspend, phase) => phase,
        };
        plan
    }

    fn bind(&mut self, plan: &mut Plan) {
        if self.holdings.bound {
            return;
        }
        self.holdings.bound = true;
        if self.mapping == Mapping::Power {
            plan.push(Step::EnsureControlDevice);
        }
        plan.push(Step::Bind);
    }

    fn unbind(&mut self, plan: &mut Plan) {
        if self.holdings.bound {
            self.holdings.bound = false;
            plan.push(Step::Unbind);
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    fn steps(hca: &mut Hca, callback: Callback) -> Vec<Step> {
        hca.on(callback).collect()
    }

    #[test]
    fn power_mapping_binds_at_d0_entry_and_unbinds_at_every_d0_exit() {
        let mut hca = Hca::added(Mapping::Power, true);
        assert_eq!(
            steps(&mut hca, Callback::D0Entry),
            [Step::EnsureControlDevice, Step::Bind]
        );
        assert!(steps(&mut hca, Callback::SelfManagedIoInit).is_empty());
        assert!(hca.holdings().bound);
        assert!(steps(&mut hca, Callback::SelfManagedIoSuspend).is_empty());
        assert_eq!(
            steps(&mut hca, Callback::D0Exit(PowerTarget::Sleep)),
            [Step::Unbind]
        );
        assert_eq!(hca.phase(), Phase::LowPower);
        assert_eq!(
            steps(&mut hca, Callback::D0Entry),
            [Step::EnsureControlDevice, Step::Bind]
        );
        assert_eq!(steps(&mut hca, Callback::SurpriseRemoval), [Step::Unbind]);
        assert!(steps(&mut hca, Callback::D0Exit(PowerTarget::D3Final)).is_empty());
        assert!(steps(&mut hca, Callback::D0Entry).is_empty(), "never again");
        assert!(steps(&mut hca, Callback::SelfManagedIoCleanup).is_empty());
        assert_eq!(
            steps(&mut hca, Callback::Cleanup),
            [Step::ReleaseHookSlot, Step::CountOut]
        );
        assert_eq!(hca.phase(), Phase::Deleted);
        assert!(steps(&mut hca, Callback::Cleanup).is_empty());
        assert_eq!(
            hca.holdings(),
            Holdings {
                bound: false,
                hook_slot: false,
                counted: false
            }
        );
    }

    #[test]
    fn cleanup_of_a_bound_device_unbinds_first() {
        let mut hca = Hca::added(Mapping::Power, false);
        let _ = steps(&mut hca, Callback::D0Entry);
        assert_eq!(
            steps(&mut hca, Callback::Cleanup),
            [Step::Unbind, Step::CountOut]
        );
    }

    #[test]
    fn old_mapping_binds_once_and_holds_through_power_changes() {
        let mut hca = Hca::added(Mapping::SelfManagedIo, true);
        assert!(steps(&mut hca, Callback::D0Entry).is_empty());
        assert_eq!(steps(&mut hca, Callback::SelfManagedIoInit), [Step::Bind]);
        assert!(steps(&mut hca, Callback::D0Exit(PowerTarget::Sleep)).is_empty());
        assert!(hca.holdings().bound);
        assert!(steps(&mut hca, Callback::SurpriseRemoval).is_empty());
        assert_eq!(
            steps(&mut hca, Callback::SelfManagedIoCleanup),
            [Step::Unbind]
        );
    }
}
