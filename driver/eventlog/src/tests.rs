//! The table against `ibcm.mc`, the message choice, the insertion strings.

extern crate std;

use std::string::{String, ToString};
use std::vec::Vec;

use super::*;

const MC: &str = include_str!("../ibcm.mc");

/// One `MessageId=` block of the `.mc` file: its header keys and its text (lines joined by
/// one space, up to the line holding a single `.`).
struct McMessage {
    id: u16,
    severity: String,
    facility: String,
    symbol: String,
    text: String,
}

fn parse_number(v: &str) -> u32 {
    match v.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).unwrap(),
        None => v.parse().unwrap(),
    }
}

/// The `.mc` header's `Name=0xN:SYMBOL` pairs of `key=( ... )`.
fn names(key: &str) -> Vec<(String, u32)> {
    let start = MC.find(&std::format!("{key}=(")).unwrap() + key.len() + 2;
    let end = start + MC[start..].find(')').unwrap();
    MC[start..end]
        .split_whitespace()
        .map(|entry| {
            let (name, rest) = entry.split_once('=').unwrap();
            let value = rest.split(':').next().unwrap();
            (name.to_string(), parse_number(value))
        })
        .collect()
}

fn messages() -> Vec<McMessage> {
    let mut out = Vec::new();
    let mut lines = MC.lines();
    while let Some(line) = lines.next() {
        let Some(id) = line.strip_prefix("MessageId=") else {
            continue;
        };
        let mut m = McMessage {
            id: parse_number(id.trim()) as u16,
            severity: String::new(),
            facility: String::new(),
            symbol: String::new(),
            text: String::new(),
        };
        for line in lines.by_ref() {
            let (key, value) = line.split_once('=').unwrap();
            match key {
                "Severity" => m.severity = value.to_string(),
                "Facility" => m.facility = value.to_string(),
                "SymbolicName" => m.symbol = value.to_string(),
                "Language" => break,
                other => panic!("unexpected key {other}"),
            }
        }
        let text: Vec<&str> = lines.by_ref().take_while(|l| *l != ".").collect();
        m.text = text.join(" ");
        out.push(m);
    }
    out
}

#[test]
fn every_message_is_the_one_in_ibcm_mc() {
    let severities = names("SeverityNames");
    let facilities = names("FacilityNames");
    let mc = messages();
    assert_eq!(mc.len(), ALL.len(), "a message on one side only");
    for (ours, theirs) in ALL.iter().zip(&mc) {
        assert_eq!(ours.symbol, theirs.symbol);
        assert_eq!(ours.id, theirs.id, "{}", ours.symbol);
        assert_eq!(ours.text, theirs.text, "{}", ours.symbol);
        let severity = severities
            .iter()
            .find(|(n, _)| *n == theirs.severity)
            .unwrap()
            .1;
        assert_eq!(ours.severity as u32, severity, "{}", ours.symbol);
        let facility = facilities
            .iter()
            .find(|(n, _)| *n == theirs.facility)
            .unwrap()
            .1;
        assert_eq!(facility, FACILITY_IBCM, "{}", ours.symbol);
        // What mc -c makes of the block: severity, customer bit, facility, id.
        let code = (severity << 30) | (1 << 29) | (facility << 16) | u32::from(theirs.id);
        assert_eq!(ours.code(), code, "{}", ours.symbol);
    }
}

#[test]
fn each_text_uses_exactly_its_insertion_strings() {
    for m in ALL {
        for n in 2..=1 + m.strings {
            assert!(m.text.contains(&std::format!("%{n}")), "{}: %{n}", m.symbol);
        }
        let beyond = std::format!("%{}", 2 + m.strings);
        assert!(!m.text.contains(&beyond), "{}: {beyond}", m.symbol);
        // A lone "." line would end the .mc text early; "%" other than an insert is
        // an mc escape.
        assert!(
            !m.text.contains("%%") && !m.text.contains(" . "),
            "{}",
            m.symbol
        );
    }
}

#[test]
fn codes_are_distinct_and_in_the_customer_space() {
    for (i, a) in ALL.iter().enumerate() {
        assert_eq!(a.id as usize, i + 1);
        assert_ne!(a.code() & CUSTOMER, 0);
        assert_eq!((a.code() >> 16) & 0xFFF, FACILITY_IBCM);
    }
    assert_eq!(CM_QUERY_NO_QP1_ROUTE.code(), 0xA1CB_0001);
    assert_eq!(CM_QUERY_PASSED_DOWN.code(), 0x61CB_0004);
}

#[test]
fn a_query_passed_down_gets_the_message_of_the_hcas_reason() {
    use NotInstalled::*;
    let none = HcaRoute::None;
    // The verbs table of an unknown layout: the hook could not be installed.
    assert_eq!(
        for_pass_down(
            PassDown::NoQp1Route,
            none(NoRoute::TableLeft(UnknownVersion))
        ),
        Some((
            CM_QUERY_VERBS_UNKNOWN,
            NoRoute::TableLeft(UnknownVersion).reason()
        ))
    );
    // The ordinary and the private MAD service both refused.
    assert_eq!(
        for_pass_down(
            PassDown::NoQp1Route,
            none(NoRoute::PrivateRegistrationFailed)
        )
        .unwrap()
        .0,
        CM_QUERY_MAD_SERVICE_REFUSED
    );
    for other in [
        NoRoute::NotBound,
        NoRoute::NoHookSlot,
        NoRoute::TableNotSeen,
        NoRoute::TableLeft(Failed),
        NoRoute::TableLeft(NotIbbus),
        NoRoute::PatchRefused,
        NoRoute::NoQp1Seen,
        NoRoute::PortSetup,
    ] {
        let (m, reason) = for_pass_down(PassDown::NoQp1Route, none(other)).unwrap();
        assert_eq!(m, CM_QUERY_NO_QP1_ROUTE, "{other:?}");
        assert_eq!(reason, other.reason());
    }
    // Version, size, no CM yet, removal: the query's own reason.
    for why in [
        PassDown::Version(0x0100),
        PassDown::TooSmall(16),
        PassDown::NoCm,
        PassDown::Removing,
        PassDown::SwitchedOff,
    ] {
        assert_eq!(
            for_pass_down(why, HcaRoute::Ordinary),
            Some((CM_QUERY_PASSED_DOWN, why.reason()))
        );
    }
    // Other interfaces (AL's, the verbs) are routine: no entry.
    assert_eq!(
        for_pass_down(PassDown::OtherInterface, none(NoRoute::NotBound)),
        None
    );
}

#[test]
fn insertion_strings_fit_the_entry_and_fill_every_placeholder() {
    // x64 IO_ERROR_LOG_PACKET: DumpData at 40 (wdm.h `_IO_ERROR_LOG_PACKET`), no dump data.
    let budget = ERROR_LOG_MAXIMUM_SIZE - 40;
    let guid = ca_guid(0x0002_c903_00a1_b2c3_u64.to_be());
    assert_eq!(guid, "0x0002c90300a1b2c3");
    // Every reason the driver logs fits whole beside a CA GUID.
    for code in 1..=10 {
        let reason = NoRoute::from_code(code).unwrap().reason();
        let (units, n) = insertion_strings(&[&guid, reason], budget);
        assert_eq!(n, 2);
        assert_eq!(units.len(), guid.len() + reason.len() + 2, "{reason}");
        assert!(units.len() * 2 <= budget);
    }
    let (units, n) = insertion_strings(&[SWITCH_VALUE], budget);
    assert_eq!(
        (n, units.len()),
        (1, SWITCH_VALUE.len() + 1),
        "the path fits whole"
    );
    // Too long: every string is kept (no %4 left unfilled), the short ones whole, the
    // long one cut with the marker, all inside the entry.
    let long = "x".repeat(500);
    let (units, n) = insertion_strings(&[&guid, &long, "kept"], budget);
    assert_eq!(n, 3, "no string dropped");
    assert!(units.len() * 2 <= budget);
    let parts: Vec<&[u16]> = units.split(|&u| u == 0).collect();
    assert_eq!(
        parts.len(),
        4,
        "three strings and the tail after the last NUL"
    );
    assert_eq!(String::from_utf16(parts[0]).unwrap(), guid);
    assert_eq!(String::from_utf16(parts[2]).unwrap(), "kept");
    assert_eq!(parts[1].last(), Some(&CUT_MARKER), "the cut one says so");
    assert_eq!(
        units.len() * 2,
        budget,
        "the cut string takes all the room left"
    );
    // Two long strings share the room evenly.
    let (units, n) = insertion_strings(&[&long, &long], budget);
    assert_eq!(n, 2);
    let parts: Vec<&[u16]> = units.split(|&u| u == 0).collect();
    assert_eq!(parts[0].len(), parts[1].len());
    assert!(parts[0].ends_with(&[CUT_MARKER]) && parts[1].ends_with(&[CUT_MARKER]));
    // No room for even a marker and a NUL per string: the later ones go, never a
    // string without its NUL.
    assert_eq!(insertion_strings(&["a"], 1), (Vec::new(), 0));
    assert_eq!(insertion_strings(&["ab"], 4), (std::vec![CUT_MARKER, 0], 1));
    assert_eq!(
        insertion_strings(&["ab", "c"], 6),
        (std::vec![u16::from(b'a'), u16::from(b'b'), 0], 1)
    );
    assert_eq!(
        insertion_strings(&["a", "c"], 8),
        (std::vec![u16::from(b'a'), 0, u16::from(b'c'), 0], 2)
    );
}

#[test]
fn each_message_is_written_once_per_hca_and_reason() {
    let logged = Logged::new();
    let a = 0x0002_c903_0000_1000_u64.to_be();
    let b = 0x0002_c903_0000_2000_u64.to_be();
    let reason = NoRoute::NoQp1Seen.reason();
    assert!(logged.first(a, &CM_QUERY_NO_QP1_ROUTE, reason));
    // The same HCA, message and reason again (every resume, the other port): counted.
    assert!(!logged.first(a, &CM_QUERY_NO_QP1_ROUTE, reason));
    assert!(!logged.first(a, &CM_QUERY_NO_QP1_ROUTE, reason));
    assert_eq!(logged.suppressed(), 2);
    // Another HCA, another reason, another message: each written once.
    assert!(logged.first(b, &CM_QUERY_NO_QP1_ROUTE, reason));
    assert!(logged.first(a, &CM_QUERY_NO_QP1_ROUTE, NoRoute::PortSetup.reason()));
    assert!(logged.first(a, &CM_QUERY_PASSED_DOWN, reason));
    // Once every slot is taken, new entries are counted, not written.
    let full = Logged::new();
    for i in 0..Logged::SLOTS as u64 {
        assert!(full.first(i, &HCA_SKIPPED, "x"));
    }
    assert!(!full.first(u64::MAX, &HCA_SKIPPED, "x"));
    assert_eq!(full.suppressed(), 1);
}

/// docs/security.md's table of event IDs lists every message with its level, in id order:
/// an administrator looks an entry up there.
#[test]
fn the_administrators_table_lists_every_message() {
    let doc = include_str!("../../../docs/security.md");
    let rows: Vec<(u16, &str)> = doc
        .lines()
        .filter_map(|l| {
            let mut cells = l.strip_prefix('|')?.split('|').map(str::trim);
            let id = cells.next()?.parse().ok()?;
            Some((id, cells.next()?))
        })
        .collect();
    let want: Vec<(u16, &str)> = ALL
        .iter()
        .map(|m| {
            let level = match m.severity {
                Severity::Informational => "Information",
                Severity::Warning => "Warning",
                Severity::Error => "Error",
            };
            (m.id, level)
        })
        .collect();
    assert_eq!(rows, want, "docs/security.md's System log table");
}
