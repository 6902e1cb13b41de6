//! `ibcm status`: the driver's STATUS record (HCAs, ports, which CM answers WinVerbs and
//! ndfltr, the QP1 route and why) and its COUNTERS, for an administrator (text) or a script
//! (JSON). The codes are decoded here with the driver's own meanings:
//! `ibcm_qp1_hook::NoRoute::from_code` and `Table::from_code` (what the KMDF binding
//! records), `ibcm_ioctl::status_report`.
#![forbid(unsafe_code)]

use std::fmt::Write as _;

use ibcm_ioctl::status_report::{
    CM_AL_HOST_VERDICT, CM_AL_NO_ROUTE, CM_AL_NOT_READY, CM_AL_SWITCHED_OFF, CM_IBCM, MAX_HCAS,
    MAX_PORTS, ROUTE_NONE, ROUTE_ORDINARY, ROUTE_STEERING,
};
use ibcm_ioctl::{CountersOut, HcaStatus, PortStatus, StatusOut};
use ibcm_qp1_hook::{NoRoute, NotInstalled, Table};
use serde_json::{Value, json};

/// The counters' attributes, by index (attribute ID - 0x10; 11 = ClassPortInfo).
pub const ATTRIBUTES: [&str; 12] = [
    "REQ",
    "MRA",
    "REJ",
    "REP",
    "RTU",
    "DREQ",
    "DREP",
    "SIDR_REQ",
    "SIDR_REP",
    "LAP",
    "APR",
    "ClassPortInfo",
];

/// Which CM answers the HCA's CM query, and why when it is AL's.
pub fn cm(h: &HcaStatus) -> (&'static str, Option<&'static str>) {
    match h.cm {
        CM_IBCM => ("ibcm", None),
        CM_AL_NO_ROUTE => ("AL's CM", Some("ibcm has no QP1 route on this HCA")),
        CM_AL_NOT_READY => ("AL's CM", Some("ibcm's CM has no port yet")),
        CM_AL_SWITCHED_OFF => (
            "AL's CM",
            Some("ibcm is switched off (Parameters\\Disabled, as read at the latest HCA start)"),
        ),
        CM_AL_HOST_VERDICT => (
            "AL's CM",
            Some(
                "the host's one CM is AL's: another HCA had no QP1 route or no ibcm when the \
                 first CM query came (WinVerbs keeps one CM for every HCA)",
            ),
        ),
        _ => ("unknown", None),
    }
}

/// A route code's name.
pub fn route(code: u8) -> &'static str {
    match code {
        ROUTE_ORDINARY => "ordinary CM MAD service",
        ROUTE_STEERING => "QP1 steering (verbs hook)",
        ROUTE_NONE => "none",
        _ => "unknown",
    }
}

/// Why an HCA has no route (None with a route or an unknown code).
pub fn no_route(h: &HcaStatus) -> Option<&'static str> {
    (h.route == ROUTE_NONE)
        .then(|| NoRoute::from_code(h.no_route).map(NoRoute::reason))
        .flatten()
}

/// What became of ibbus's verbs table.
pub fn verbs_table(h: &HcaStatus) -> &'static str {
    match Table::from_code(h.verbs_table) {
        Table::NotSeen => "not seen (no hook slot, or ibbus's query did not pass ibcm)",
        Table::Patched => "patched (QP1 steering possible)",
        Table::Left(NotInstalled::Failed) => "left as it came: the query failed",
        Table::Left(NotInstalled::NotIbbus) => "left as it came: only other drivers' queries",
        Table::Left(NotInstalled::UnknownVersion) => {
            "left as it came: a verbs interface version ibcm does not know"
        }
        Table::PatchRefused => "left as it came: an entry missing or differing",
    }
}

fn hcas(s: &StatusOut) -> &[HcaStatus] {
    &s.hcas[..(s.hca_count as usize).min(MAX_HCAS)]
}

fn ports(s: &StatusOut) -> &[PortStatus] {
    &s.ports[..(s.port_count as usize).min(MAX_PORTS)]
}

/// The readable report of one device (`name`): each HCA with its ports, then the counters.
pub fn text(name: &str, s: &StatusOut, c: &CountersOut) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{name}: {} HCA(s), {} port(s)",
        s.hca_count, s.port_count
    );
    for h in hcas(s) {
        let _ = writeln!(o, "HCA 0x{:016x}", h.ca_guid);
        let (who, why) = cm(h);
        match why {
            Some(why) => {
                let _ = writeln!(o, "  CM for WinVerbs and ndfltr: {who} ({why})");
            }
            None => {
                let _ = writeln!(o, "  CM for WinVerbs and ndfltr: {who}");
            }
        }
        match no_route(h) {
            Some(why) => {
                let _ = writeln!(o, "  QP1 route: none: {why}");
            }
            None => {
                let _ = writeln!(o, "  QP1 route: {}", route(h.route));
            }
        }
        let _ = writeln!(o, "  verbs table: {}", verbs_table(h));
        for p in ports(s).iter().filter(|p| p.ca_guid == h.ca_guid) {
            let _ = write!(
                o,
                "  port {} (host port {}): {}",
                p.ca_port,
                p.host_port,
                route(p.route)
            );
            if p.route == ROUTE_STEERING {
                let _ = write!(o, ", private method {}", p.private_method);
            }
            o.push('\n');
        }
    }
    if s.hca_count as usize > MAX_HCAS || s.port_count as usize > MAX_PORTS {
        let _ = writeln!(
            o,
            "(the first {MAX_HCAS} HCAs and {MAX_PORTS} ports are described)"
        );
    }
    let _ = writeln!(
        o,
        "counters:\n  {:<14} {:>10} {:>10} {:>10} {:>10}",
        "attribute", "sent", "retries", "received", "duplicates"
    );
    for (i, attr) in ATTRIBUTES.iter().enumerate() {
        let (sent, r, v, d) = (c.sent[i], c.retries[i], c.received[i], c.duplicates[i]);
        if sent + r + v + d != 0 {
            let _ = writeln!(o, "  {attr:<14} {sent:>10} {r:>10} {v:>10} {d:>10}");
        }
    }
    let _ = writeln!(
        o,
        "  malformed {}, unmatched {}, backlog drops {}",
        c.malformed, c.unmatched, c.backlog_drops
    );
    o
}

/// The same as JSON (one object per device).
pub fn json(name: &str, s: &StatusOut, c: &CountersOut) -> Value {
    let hcas: Vec<Value> = hcas(s)
        .iter()
        .map(|h| {
            let (who, why) = cm(h);
            json!({
                "ca_guid": format!("0x{:016x}", h.ca_guid),
                "cm": who,
                "cm_reason": why,
                "route": route(h.route),
                "route_reason": no_route(h),
                "verbs_table": verbs_table(h),
            })
        })
        .collect();
    let ports: Vec<Value> = ports(s)
        .iter()
        .map(|p| {
            json!({
                "ca_guid": format!("0x{:016x}", p.ca_guid),
                "ca_port": p.ca_port,
                "host_port": p.host_port,
                "route": route(p.route),
                "private_method": (p.route == ROUTE_STEERING).then_some(p.private_method),
            })
        })
        .collect();
    json!({
        "device": name,
        "hca_count": s.hca_count,
        "hcas_without_ibcm": s.hcas_without_ibcm,
        "port_count": s.port_count,
        "hcas": hcas,
        "ports": ports,
        "counters": counters_json(c),
    })
}

/// The message counters as JSON: per attribute (sent, retries, received, duplicates),
/// then the malformed, unmatched and backlog-dropped MADs.
pub fn counters_json(c: &CountersOut) -> Value {
    let attributes: serde_json::Map<String, Value> = ATTRIBUTES
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let v = json!({
                "sent": c.sent[i],
                "retries": c.retries[i],
                "received": c.received[i],
                "duplicates": c.duplicates[i],
            });
            (a.to_string(), v)
        })
        .collect();
    json!({
        "attributes": attributes,
        "malformed": c.malformed,
        "unmatched": c.unmatched,
        "backlog_drops": c.backlog_drops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    /// Two HCAs as the KMDF binding reports a stock WinOF host: one steered, one whose
    /// verbs table was of an unknown version (no route, AL's CM answers).
    fn two_hcas() -> StatusOut {
        let mut s = StatusOut::new_zeroed();
        s.size = StatusOut::SIZE;
        s.hca_count = 2;
        s.hcas[0] = HcaStatus {
            ca_guid: 0x0002_c903_00a1_b2c3,
            cm: CM_IBCM,
            route: ROUTE_STEERING,
            no_route: 0,
            verbs_table: Table::Patched.code(),
            reserved: 0,
        };
        let why = NoRoute::TableLeft(NotInstalled::UnknownVersion);
        s.hcas[1] = HcaStatus {
            ca_guid: 0x0002_c903_00a1_b2d0,
            cm: CM_AL_NO_ROUTE,
            route: ROUTE_NONE,
            no_route: why.code(),
            verbs_table: Table::Left(NotInstalled::UnknownVersion).code(),
            reserved: 0,
        };
        s.port_count = 1;
        s.ports[0] = PortStatus {
            ca_guid: 0x0002_c903_00a1_b2c3,
            ca_port: 1,
            host_port: 1,
            route: ROUTE_STEERING,
            private_method: 126,
            reserved: 0,
        };
        s
    }

    fn counters() -> CountersOut {
        let mut c = CountersOut::new_zeroed();
        c.sent[0] = 3;
        c.received[3] = 3;
        c.unmatched = 2;
        c
    }

    #[test]
    fn the_text_names_the_cm_the_route_and_its_reason_per_hca() {
        let t = text("device", &two_hcas(), &counters());
        let expected = "\
device: 2 HCA(s), 1 port(s)
HCA 0x0002c90300a1b2c3
  CM for WinVerbs and ndfltr: ibcm
  QP1 route: QP1 steering (verbs hook)
  verbs table: patched (QP1 steering possible)
  port 1 (host port 1): QP1 steering (verbs hook), private method 126
HCA 0x0002c90300a1b2d0
  CM for WinVerbs and ndfltr: AL's CM (ibcm has no QP1 route on this HCA)
  QP1 route: none: AL's CM holds CM Send and the verbs interface version is unknown
  verbs table: left as it came: a verbs interface version ibcm does not know
counters:
  attribute            sent    retries   received duplicates
  REQ                     3          0          0          0
  REP                     0          0          3          0
  malformed 0, unmatched 2, backlog drops 0
";
        assert_eq!(t, expected);
    }

    #[test]
    fn the_json_carries_the_same_facts() {
        let j = json("device", &two_hcas(), &counters());
        assert_eq!(j["hca_count"], 2);
        assert_eq!(j["hcas"][0]["cm"], "ibcm");
        assert_eq!(j["hcas"][0]["cm_reason"], Value::Null);
        assert_eq!(j["hcas"][1]["cm"], "AL's CM");
        assert_eq!(j["hcas"][1]["route"], "none");
        assert_eq!(
            j["hcas"][1]["route_reason"],
            "AL's CM holds CM Send and the verbs interface version is unknown"
        );
        assert_eq!(j["ports"][0]["private_method"], 126);
        assert_eq!(j["counters"]["attributes"]["REQ"]["sent"], 3);
        assert_eq!(j["counters"]["unmatched"], 2);
    }

    #[test]
    fn counts_beyond_the_arrays_are_reported_not_read() {
        let mut s = two_hcas();
        s.hca_count = 40;
        s.port_count = 99;
        let t = text("device", &s, &counters());
        assert!(t.starts_with("device: 40 HCA(s), 99 port(s)\n"));
        assert!(t.contains("(the first 8 HCAs and 16 ports are described)"));
        assert_eq!(
            json("device", &s, &counters())["hcas"]
                .as_array()
                .unwrap()
                .len(),
            MAX_HCAS
        );
    }
}
