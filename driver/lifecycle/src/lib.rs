//! The Windows lifecycle of ibcm's filter on each HCA (issue #27): what the filter holds
//! in each PnP/power state of its HCA, and what it does on each KMDF callback, as a
//! portable state machine. The KMDF binding (`driver/kmdf/filter.rs`) only forwards its
//! callbacks to [`Hca::on`] and carries out the [`Step`]s it returns; the tests in
//! `tests/` drive the same machine through models of KMDF's callback order, of ibbus's
//! power and PnP handlers and of AL's object destruction, each written from the sources
//! with file:line citations.
//!
//! Why the binding is undone at every power-down: ibbus waits, without a timeout in
//! release builds, for every reference on its interfaces before it deregisters the CA
//! (`core/bus/kernel/bus_pnp.c:790-829` `__wait_for_clients_to_exit`), on every D3 for
//! sleep or hibernation (`__device_power_down_workItem`, :1853-1918) and when it stops
//! (`fdo_stop_device`, :896, called from IRP_MN_STOP_DEVICE and IRP_MN_SURPRISE_REMOVAL:
//! `core/complib/kernel/cl_pnp_po.c:536-557, 759-786`). A filter above ibbus sees those
//! IRPs first; KMDF calls its `EvtDeviceD0Exit` before it passes a Dx IRP down
//! (`fdopower.cpp:405-416, 491-496`), and `EvtDeviceSurpriseRemoval` and
//! `EvtDeviceD0Exit(WdfPowerDeviceD3Final)` before it passes a stop or surprise-removal
//! IRP down (`pnpstatemachine.cpp:2521-2565, 2756-2787`), but `EvtDeviceSelfManagedIoCleanup`
//! only at IRP_MN_REMOVE_DEVICE (`pnpstatemachine.cpp:2020`). WinOF's own filters query at
//! D0Entry and release at D0Exit (`core/winmad/kernel/wm_driver.c:387, 465`;
//! `core/winverbs/kernel/wv_driver.c:662-672`); so does ibcm ([`Mapping::Power`]).
//! [`Mapping::SelfManagedIo`] is the mapping before this issue, kept so the tests can show
//! the models failing it.
//!
//! [`host_cm`] decides, host-wide, whether ibcm answers the CM interface query: WinVerbs
//! keeps one `iba_cm` table for every HCA (`wv_driver.c:575-576`).
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod hca;
pub mod host_cm;

pub use hca::{Callback, Hca, Holdings, Mapping, Phase, Plan, PowerTarget, Step, Teardown, UNBIND};
pub use host_cm::HostCm;
