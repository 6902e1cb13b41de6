//! The `ibcm` command line's workings, as a library so the benches and the end-to-end
//! tests drive exactly what the CLI runs:
//!
//! - [`sim`]: the simulated fabric the commands run on (real or virtual time), and the
//!   [`sim::Pump`] they wait through (the fabric, or the real device on Windows).
//! - [`admin`]: what `ibcm off` / `ibcm on`, `install` and `uninstall` say and ask
//!   before they change a host (the kill switch, the HCA restart).
//! - [`cmtime`]: connection setup and teardown timed step by step (rdma-core `cmtime`).
//! - [`plot`]: cmtime's figures as SVG (`--plot`).
//! - [`reboot`]: `cmtime --peer-reboot`, a peer that reboots with N connections up.
//! - [`exchange`]: ucmatose-style `listen` / `connect` exchanges.
//! - [`rocev2`]: the same over RoCEv2 on a real interface, as a peer for Linux `rdma_cm`.
//! - [`status`]: `ibcm status`'s report (text and JSON) of the driver's STATUS and
//!   COUNTERS.
//! - [`host_report`]: `ibcm status` on a Windows host: every HCA devnode, with or without
//!   ibcm, and which CM serves its clients (the decisions; Windows only reads the facts).
//! - [`upper_filters`]: the HCA's `UpperFilters` with ibcm directly above ibbus, or
//!   without it (`ibcm install` / `ibcm uninstall`); `install_windows` edits the
//!   devnodes with it.
//! - [`rc`] (feature `devices`, Linux): connections that carry data, on a real RDMA device.
//! - [`perftest`] (feature `devices`, Linux): perftest's rdma_cm mode on such connections.
//! - [`udaddy`] (feature `devices`, Linux): udaddy's datagrams on a UD QP found with SIDR.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod cmtime;
pub mod exchange;
pub mod host_report;
#[cfg(windows)]
pub mod install_windows;
#[cfg(all(target_os = "linux", feature = "devices"))]
pub mod perftest;
pub mod plot;
#[cfg(all(target_os = "linux", feature = "devices"))]
pub mod rc;
pub mod reboot;
#[cfg(target_os = "linux")]
pub mod rocev2;
pub mod sim;
pub mod status;
#[cfg(all(target_os = "linux", feature = "devices"))]
pub mod udaddy;
pub mod upper_filters;
