//! `ibcm cmtime --peer-reboot`'s table and JSON ([`ibcm_cli::reboot`]).

use ibcm_cli::reboot::{Leftovers, RebootReport};

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

fn leftovers(l: &Leftovers) -> String {
    format!(
        "{}, {}, {}, {}",
        l.ceps, l.timer_entries, l.handles, l.endpoints_at_close
    )
}

/// Prints the report; true if it is clean ([`RebootReport::clean`]).
pub(crate) fn print(r: &RebootReport) -> bool {
    let n = r.connections;
    println!();
    println!(
        "peer reboot: {n} connections up, then node 0 (the client) reboots: a fresh driver on \
         the same port and CA GUID, its connections gone without a word; its application \
         reconnects every one from the same QPN, node 1 (the survivor) ends the stale ones"
    );
    let row = |what: &str, measured: String, ideal: String| {
        println!("{what:<52} {measured:>16} {ideal:>16}");
    };
    row("", "measured".into(), "ideal".into());
    row(
        "established before the reboot",
        r.established_before.to_string(),
        n.to_string(),
    );
    row(
        "stale connections the survivor ended (once each)",
        r.stale_ended.to_string(),
        n.to_string(),
    );
    row(
        "time until it had ended them all (out of timewait)",
        ms(r.stale_ended_ns),
        String::new(),
    );
    row(
        "REJ sent by the survivor; REJ(StaleConn) seen",
        format!("{}; {}", r.survivor_rej_sent, r.stale_rejects),
        format!(">= {n}; equal"),
    );
    row(
        "DREQ sent by the survivor; DREP it received",
        format!("{}; {}", r.survivor_dreq_sent, r.survivor_drep_received),
        format!("{n}; {n}"),
    );
    row(
        "rebooted node: REJ, DREQ received; DREP sent",
        format!(
            "{}, {}; {}",
            r.rebooted_rej_received, r.rebooted_dreq_received, r.rebooted_drep_sent
        ),
        String::new(),
    );
    row(
        "reconnected (established on both sides)",
        r.reconnected.to_string(),
        n.to_string(),
    );
    row(
        "time until all reconnected",
        ms(r.reconnected_ns),
        String::new(),
    );
    row(
        "reconnects retried; most attempts",
        format!("{}; {}", r.retried, r.most_attempts),
        String::new(),
    );
    row(
        "failures; stalls",
        format!("{}; {}", r.failures.values().sum::<usize>(), r.stalls),
        "0; 0".into(),
    );
    for (reason, count) in &r.failures {
        println!("  {count} x {reason}");
    }
    println!("left after the teardown (CEPs, timer entries, handles, endpoints at close):");
    row(
        "  node 1, the survivor",
        leftovers(&r.survivor_left),
        "0, 0, 0, 0".into(),
    );
    row(
        "  node 0, rebooted",
        leftovers(&r.rebooted_left),
        "0, 0, 0, 0".into(),
    );
    println!(
        "verifier: {}",
        if r.violations.is_empty() {
            "clean".to_string()
        } else {
            format!("{:?}", r.violations)
        }
    );
    r.clean()
}

fn leftovers_json(l: &Leftovers) -> serde_json::Value {
    serde_json::json!({
        "ceps": l.ceps,
        "timer_entries": l.timer_entries,
        "handles": l.handles,
        "endpoints_at_close": l.endpoints_at_close,
    })
}

/// The report as one JSON object.
pub(crate) fn json(r: &RebootReport) -> serde_json::Value {
    serde_json::json!({
        "connections": r.connections,
        "established_before": r.established_before,
        "stale_ended": r.stale_ended,
        "stale_ended_ms": r.stale_ended_ns as f64 / 1e6,
        "reconnected": r.reconnected,
        "reconnected_ms": r.reconnected_ns as f64 / 1e6,
        "stale_rejects_seen": r.stale_rejects,
        "retried": r.retried,
        "most_attempts": r.most_attempts,
        "survivor": {
            "rej_sent": r.survivor_rej_sent,
            "dreq_sent": r.survivor_dreq_sent,
            "drep_received": r.survivor_drep_received,
            "left": leftovers_json(&r.survivor_left),
        },
        "rebooted": {
            "rej_received": r.rebooted_rej_received,
            "dreq_received": r.rebooted_dreq_received,
            "drep_sent": r.rebooted_drep_sent,
            "left": leftovers_json(&r.rebooted_left),
        },
        "failures": r.failures,
        "stalls": r.stalls,
        "violations": r.violations,
        "clean": r.clean(),
    })
}
