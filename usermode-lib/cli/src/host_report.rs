//! `ibcm status` on a host, read-only: every HCA devnode — with ibcm in its stack or not —
//! its `UpperFilters`, whether ibcm is loaded in its stack, its QP1 route, and which CM
//! serves WinVerbs and ndfltr there. The decisions are made here from plain facts
//! (the Windows side, `install_windows::devnodes`, only reads them), so they are tested
//! on every platform.
//!
//! Who serves whom (`driver/lifecycle/src/host_cm.rs`, WinOF `lucasz93/WinOFED`):
//! - ndfltr asks its HCA's stack and keeps a table per device
//!   (`core/ndfltr/kernel/nd_driver.cpp:737-744`): ibcm's where ibcm is loaded in that
//!   stack and answers, AL's elsewhere.
//! - WinVerbs keeps **one** table for every HCA, the first one any HCA's query returned
//!   (`core/winverbs/kernel/wv_driver.c:554-575`). When ibcm answered, an HCA without ibcm
//!   in its stack has WinVerbs connections through a CM that has no QP1 route there: they
//!   fail. This report names that case.
#![forbid(unsafe_code)]

use std::fmt::Write as _;

use ibcm_ioctl::status_report::{CM_AL_SWITCHED_OFF, CM_IBCM, ROUTE_NONE};
use ibcm_ioctl::{CountersOut, StatusOut};
use serde_json::{Value, json};

use crate::status;
use crate::upper_filters::{self, Placement};

/// The PCI device IDs (vendor 15B3, Mellanox) ibcm's INF installs on: those of WinOF's
/// `mlx4_bus_win8.inx:48-84` @913bc0ce (`tests/inf.rs` checks the INF's models are these).
pub const SUPPORTED_DEVICE_IDS: [&str; 37] = [
    "6340", "634A", "6354", "6368", "6372", "6732", "6778", "673C", "6746", "6750", "675A", "6764",
    "676E", "6341", "634B", "6733", "673D", "6369", "6751", "6765", "1000", "1001", "1002", "1003",
    "1004", "1005", "1006", "1007", "1008", "1009", "100A", "100B", "100C", "100D", "100E", "100F",
    "1010",
];

/// Whether any of a devnode's hardware IDs (`PCI\VEN_15B3&DEV_1003&SUBSYS_...`) names a
/// supported HCA.
pub fn supported_hca<S: AsRef<str>>(hardware_ids: &[S]) -> bool {
    hardware_ids.iter().any(|id| {
        let id = id.as_ref().to_ascii_uppercase();
        let Some(rest) = id.strip_prefix(r"PCI\VEN_15B3&DEV_") else {
            return false;
        };
        let (dev, tail) = rest.split_at(rest.len().min(4));
        (tail.is_empty() || tail.starts_with('&')) && SUPPORTED_DEVICE_IDS.contains(&dev)
    })
}

/// Whether a devnode's driver stack (`DEVPKEY_Device_Stack`: the driver objects from the
/// top down, `\Driver\ibcm`, `\Driver\ibbus`, ...) holds ibcm's filter.
pub fn ibcm_in_stack<S: AsRef<str>>(stack: &[S]) -> bool {
    stack.iter().any(|d| {
        let d = d.as_ref();
        let name = d.rsplit('\\').next().unwrap_or(d);
        name.eq_ignore_ascii_case(upper_filters::IBCM)
    })
}

/// One devnode, as read.
#[derive(Debug, Clone, Default)]
pub struct Devnode {
    /// The device instance ID.
    pub instance_id: String,
    /// The device description.
    pub description: String,
    /// Its hardware IDs.
    pub hardware_ids: Vec<String>,
    /// Its `UpperFilters`, lowest first (empty when it has none).
    pub upper_filters: Vec<String>,
    /// Its driver stack (`DEVPKEY_Device_Stack`), when it could be read (a started device).
    pub stack: Option<Vec<String>>,
}

/// What the host says, as read: the devnodes, the kill switch's value, the driver's status
/// (`None` with why: no `\\.\ibcm`, ibcm loaded nowhere).
pub struct Host {
    /// The HCA devnodes (a supported hardware ID, or ibbus in `UpperFilters`).
    pub devnodes: Vec<Devnode>,
    /// `Parameters\Disabled`, when present.
    pub switch: Option<u32>,
    /// The driver's STATUS and COUNTERS, or why they could not be read.
    pub driver: Result<(StatusOut, CountersOut), String>,
}

/// Which CM a client gets on one HCA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// The client is not in this HCA's stack.
    NotInStack,
    /// ibcm's CM, which can serve this HCA.
    Ibcm,
    /// ibcm's CM, which has no QP1 route on this HCA (ibcm is not in its stack): the
    /// client's connections here fail.
    IbcmWithoutRoute,
    /// WinOF's own CM (AL's).
    Al,
    /// Not known: the stack could not be read.
    Unknown,
}

impl Serving {
    /// The words of the report.
    pub fn describe(self) -> &'static str {
        match self {
            Self::NotInStack => "not in this HCA's stack",
            Self::Ibcm => "ibcm",
            Self::IbcmWithoutRoute => {
                "ibcm's CM, which cannot reach this HCA's QP1 (ibcm is not in its stack): \
                 connections on this HCA fail; run `ibcm install` and restart the HCAs"
            }
            Self::Al => "AL's CM (WinOF's own)",
            Self::Unknown => "unknown (the device's stack could not be read)",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::NotInStack => "not_in_stack",
            Self::Ibcm => "ibcm",
            Self::IbcmWithoutRoute => "ibcm_without_route",
            Self::Al => "al",
            Self::Unknown => "unknown",
        }
    }
}

/// The report's decisions for one devnode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    /// Where ibcm is in `UpperFilters`.
    pub placement: Placement,
    /// Whether ibcm is loaded in the devnode's stack (None: stack not readable).
    pub ibcm_loaded: Option<bool>,
    /// The QP1 route, in words.
    pub qp1_route: String,
    /// The CM WinVerbs uses on this HCA.
    pub winverbs: Serving,
    /// The CM ndfltr uses on this HCA.
    pub ndfltr: Serving,
}

/// Whether ibcm answers the host's CM queries: the driver's verdict (any HCA it serves
/// answered, `CM_IBCM`; one verdict for the host). The driver reads the switch at each
/// HCA's start, so its report, not the registry's value, says what holds now.
pub fn ibcm_answers(host: &Host) -> bool {
    host.driver
        .as_ref()
        .is_ok_and(|(s, _)| driver_hcas(s).iter().any(|h| h.cm == CM_IBCM))
}

/// The kill switch: as the registry holds it and as the driver last read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// On as far as both know (or the driver cannot be asked and the value is clear).
    On,
    /// Off: the driver read it set (or cannot be asked and the value is set).
    Off,
    /// Set in the registry, read clear by the driver: ibcm serves until the HCAs restart.
    OffAtNextStart,
    /// Cleared in the registry, read set by the driver: AL's CM serves until the HCAs
    /// restart.
    OnAtNextStart,
}

/// The switch of `host` (the driver's reading: any HCA it reports `CM_AL_SWITCHED_OFF`).
pub fn switch(host: &Host) -> Switch {
    let value = host.switch.is_some_and(|v| v != 0);
    let read = host.driver.as_ref().ok().and_then(|(s, _)| {
        let hcas = driver_hcas(s);
        (!hcas.is_empty()).then(|| hcas.iter().any(|h| h.cm == CM_AL_SWITCHED_OFF))
    });
    match (value, read.unwrap_or(value)) {
        (false, false) => Switch::On,
        (true, true) => Switch::Off,
        (true, false) => Switch::OffAtNextStart,
        (false, true) => Switch::OnAtNextStart,
    }
}

impl Switch {
    /// Whether AL's CM serves every client now because of it.
    pub fn off_now(self) -> bool {
        matches!(self, Self::Off | Self::OnAtNextStart)
    }

    /// The report's words.
    pub fn describe(self) -> &'static str {
        match self {
            Self::On => "switched on",
            Self::Off => "switched OFF (Parameters\\Disabled is set): AL's CM serves every client",
            Self::OffAtNextStart => {
                "switched on until the HCAs restart: Parameters\\Disabled is set, and the \
                 driver reads it at each HCA's start (`ibcm off` offers the restart)"
            }
            Self::OnAtNextStart => {
                "switched OFF until the HCAs restart: Parameters\\Disabled was cleared, and \
                 the driver reads it at each HCA's start (`ibcm on` offers the restart)"
            }
        }
    }
}

fn driver_hcas(s: &StatusOut) -> &[ibcm_ioctl::HcaStatus] {
    &s.hcas[..(s.hca_count as usize).min(s.hcas.len())]
}

/// The decisions for `node` on `host`.
pub fn node_report(host: &Host, node: &Devnode) -> NodeReport {
    let filters = &node.upper_filters;
    let has = |name: &str| filters.iter().any(|f| f.eq_ignore_ascii_case(name));
    let loaded = node.stack.as_ref().map(|s| ibcm_in_stack(s));
    let answers = ibcm_answers(host);
    let switched_off = switch(host).off_now();
    let loaded_nodes = host
        .devnodes
        .iter()
        .filter(|n| n.stack.as_ref().is_some_and(|s| ibcm_in_stack(s)))
        .count();
    let qp1_route = match loaded {
        None => "unknown (the device's stack could not be read)".to_string(),
        Some(false) => "none: ibcm is not in this HCA's stack".to_string(),
        Some(true) if switched_off => "none: ibcm is switched off".to_string(),
        Some(true) => match &host.driver {
            Err(why) => format!("unknown: {why}"),
            // One HCA in ibcm's stack and one in the driver's report: they are the same.
            Ok((s, _)) if loaded_nodes == 1 && driver_hcas(s).len() == 1 => {
                let h = &driver_hcas(s)[0];
                match status::no_route(h) {
                    Some(why) if h.route == ROUTE_NONE => format!("none: {why}"),
                    _ => status::route(h.route).to_string(),
                }
            }
            Ok(_) => "ibcm's: see the driver's HCAs below (by CA GUID)".to_string(),
        },
    };
    let winverbs = match (has("WinVerbs"), loaded, answers) {
        (false, _, _) => Serving::NotInStack,
        (true, _, false) => Serving::Al,
        (true, Some(true), true) => Serving::Ibcm,
        (true, Some(false), true) => Serving::IbcmWithoutRoute,
        (true, None, true) => Serving::Unknown,
    };
    let ndfltr = match (has("ndfltr"), loaded, answers) {
        (false, _, _) => Serving::NotInStack,
        (true, Some(true), true) => Serving::Ibcm,
        (true, None, true) => Serving::Unknown,
        (true, _, _) => Serving::Al,
    };
    NodeReport {
        placement: upper_filters::placement(filters),
        ibcm_loaded: loaded,
        qp1_route,
        winverbs,
        ndfltr,
    }
}

fn show(list: &[String]) -> String {
    format!("[{}]", list.join(", "))
}

/// The report for an administrator.
pub fn text(host: &Host) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "ibcm on this host (installed driver): {}",
        switch(host).describe()
    );
    if let Ok((s, _)) = &host.driver
        && s.hcas_without_ibcm > 0
    {
        let _ = writeln!(
            o,
            "the driver knows {} HCA(s) without ibcm in its stack (System log, event 9 or 10)",
            s.hcas_without_ibcm
        );
    }
    if host.devnodes.is_empty() {
        let _ = writeln!(
            o,
            "no HCA devnode (a supported Mellanox PCI ID, or ibbus in UpperFilters) is present"
        );
    }
    for node in &host.devnodes {
        let r = node_report(host, node);
        let _ = writeln!(o, "{} ({})", node.description, node.instance_id);
        let _ = writeln!(o, "  UpperFilters: {}", show(&node.upper_filters));
        let _ = writeln!(o, "  ibcm in UpperFilters: {}", r.placement);
        let loaded = match r.ibcm_loaded {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown (the device's stack could not be read)",
        };
        let _ = writeln!(o, "  ibcm loaded in its stack: {loaded}");
        let _ = writeln!(o, "  QP1 route: {}", r.qp1_route);
        let _ = writeln!(o, "  CM for WinVerbs: {}", r.winverbs.describe());
        let _ = writeln!(o, "  CM for ndfltr: {}", r.ndfltr.describe());
    }
    match &host.driver {
        Ok((s, c)) => o.push_str(&status::text("driver", s, c)),
        Err(why) => {
            let _ = writeln!(o, "driver: {why}");
        }
    }
    o
}

/// The same as JSON: `simulated` is false (a simulated run says true, main.rs).
pub fn json(host: &Host) -> Value {
    let devnodes: Vec<Value> = host
        .devnodes
        .iter()
        .map(|node| {
            let r = node_report(host, node);
            json!({
                "instance_id": node.instance_id,
                "description": node.description,
                "hardware_ids": node.hardware_ids,
                "supported_id": supported_hca(&node.hardware_ids),
                "upper_filters": node.upper_filters,
                "ibcm_in_upper_filters": matches!(r.placement, Placement::AboveIbbus | Placement::Misplaced),
                "placement": r.placement.to_string(),
                "ibcm_loaded": r.ibcm_loaded,
                "stack": node.stack,
                "qp1_route": r.qp1_route,
                "winverbs_cm": r.winverbs.key(),
                "ndfltr_cm": r.ndfltr.key(),
            })
        })
        .collect();
    let driver = match &host.driver {
        Ok((s, c)) => status::json("device", s, c),
        Err(why) => json!({ "error": why }),
    };
    json!({
        "simulated": false,
        "switched_off": switch(host).off_now(),
        "switch_value": host.switch,
        "switch_pending_restart": matches!(switch(host), Switch::OffAtNextStart | Switch::OnAtNextStart),
        "ibcm_answers_cm_queries": ibcm_answers(host),
        "devnodes": devnodes,
        "driver": driver,
    })
}

#[cfg(test)]
mod tests;
