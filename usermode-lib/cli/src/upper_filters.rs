//! The HCA devnode's `UpperFilters` list with ibcm in it or out of it: what `ibcm install`
//! and `ibcm uninstall` write (Windows: `install_windows.rs`; elsewhere on a list given on
//! the command line).
//!
//! Why an install step beyond the INF: WinOF's base INF writes the list whole
//! (`FLG_ADDREG_TYPE_MULTI_SZ` without append) and ships in two variants for the same PCI
//! IDs, `"ibbus","ndfltr","WinVerbs","WinMad"` (`hw/mlx4/kernel/bus/drv/mlx4_bus.inx:278-279`
//! @913bc0ce) and `"ibbus","WinVerbs","WinMad"` (`mlx4_bus_win8.inx:91`); other packages may
//! have added filters of their own. An extension INF can only write the list whole (naming a
//! service that may not exist, and wiping the others') or append at its end (above every CM
//! client, not directly above ibbus). So the list is edited where it is: ibcm goes right
//! after `ibbus`, every other entry stays, in its order; removal takes ibcm out and leaves
//! the rest as it was.
//!
//! Service names compare case-insensitively (the service database does; WinOF's own INFs
//! write both `WinVerbs` and `winverbs`).
#![forbid(unsafe_code)]

use std::fmt;

/// ibcm's service name (`inf/ibcm.inx` `AddService = ibcm`).
pub const IBCM: &str = "ibcm";
/// The IB bus driver / access layer filter ibcm must sit directly above: it queries IBAL
/// in-stack from it (`driver/kmdf/ibal.rs`).
pub const IBBUS: &str = "ibbus";

fn is(entry: &str, service: &str) -> bool {
    entry.eq_ignore_ascii_case(service)
}

/// Where ibcm is in a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// No `ibbus` in the list: not a WinOF HCA stack (or a broken one); left alone.
    NoIbbus,
    /// ibcm is not in the list.
    Absent,
    /// ibcm is directly above ibbus, once.
    AboveIbbus,
    /// ibcm is in the list, but not (only) directly above ibbus.
    Misplaced,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoIbbus => "no ibbus in UpperFilters (not a WinOF HCA stack)",
            Self::Absent => "not installed (ibcm is not in UpperFilters)",
            Self::AboveIbbus => "installed (directly above ibbus)",
            Self::Misplaced => "misplaced (in UpperFilters, but not only directly above ibbus)",
        })
    }
}

/// Where ibcm is in `list` (lowest filter first).
pub fn placement<S: AsRef<str>>(list: &[S]) -> Placement {
    let Some(bus) = list.iter().position(|e| is(e.as_ref(), IBBUS)) else {
        return Placement::NoIbbus;
    };
    let count = list.iter().filter(|e| is(e.as_ref(), IBCM)).count();
    match count {
        0 => Placement::Absent,
        1 if list.get(bus + 1).is_some_and(|e| is(e.as_ref(), IBCM)) => Placement::AboveIbbus,
        _ => Placement::Misplaced,
    }
}

/// The list with ibcm directly above the first `ibbus` and nowhere else; every other entry
/// kept, in its order. `None` when the list has no `ibbus` (nothing is written then: a
/// filter below the bus driver would find no IBAL). Idempotent.
pub fn with_ibcm<S: AsRef<str>>(list: &[S]) -> Option<Vec<String>> {
    let mut out = without_ibcm(list);
    let bus = out.iter().position(|e| is(e, IBBUS))?;
    out.insert(bus + 1, IBCM.to_string());
    Some(out)
}

/// The list without any ibcm entry; every other entry kept, in its order.
pub fn without_ibcm<S: AsRef<str>>(list: &[S]) -> Vec<String> {
    list.iter()
        .map(AsRef::as_ref)
        .filter(|e| !is(e, IBCM))
        .map(str::to_string)
        .collect()
}

/// A `REG_MULTI_SZ` value (UTF-16 code units, as `SetupDiGetDeviceRegistryProperty`
/// returns it) as its strings: each ends at a NUL, the list at an empty string; a value
/// cut short (no final NUL) still yields its last string. Unpaired surrogates become
/// U+FFFD (a service name is ASCII).
pub fn decode_multi_sz(units: &[u16]) -> Vec<String> {
    let mut out = Vec::new();
    for s in units.split(|&u| u == 0) {
        if s.is_empty() {
            break;
        }
        out.push(String::from_utf16_lossy(s));
    }
    out
}

/// The strings as a `REG_MULTI_SZ` value: each NUL-terminated, then one more NUL.
pub fn encode_multi_sz<S: AsRef<str>>(list: &[S]) -> Vec<u16> {
    let mut out = Vec::new();
    for s in list {
        out.extend(s.as_ref().encode_utf16());
        out.push(0);
    }
    out.push(0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `hw/mlx4/kernel/bus/drv/mlx4_bus.inx:278-279` @913bc0ce (`[MLX4BUS.HwReg]`).
    const MLX4_BUS: [&str; 4] = ["ibbus", "ndfltr", "WinVerbs", "WinMad"];
    /// `hw/mlx4/kernel/bus/drv/mlx4_bus_win8.inx:91` @913bc0ce: no ndfltr (its Services
    /// section, l.121-125, installs none).
    const MLX4_BUS_WIN8: [&str; 3] = ["ibbus", "WinVerbs", "WinMad"];

    #[test]
    fn both_base_lists_get_ibcm_directly_above_ibbus_and_keep_the_rest() {
        assert_eq!(
            with_ibcm(&MLX4_BUS).unwrap(),
            ["ibbus", "ibcm", "ndfltr", "WinVerbs", "WinMad"]
        );
        // The list the old INF wrote whole would name ndfltr, which this base never
        // installs: the edit keeps the list's own entries only.
        assert_eq!(
            with_ibcm(&MLX4_BUS_WIN8).unwrap(),
            ["ibbus", "ibcm", "WinVerbs", "WinMad"]
        );
        assert_eq!(placement(&MLX4_BUS), Placement::Absent);
        assert_eq!(
            placement(&with_ibcm(&MLX4_BUS_WIN8).unwrap()),
            Placement::AboveIbbus
        );
    }

    #[test]
    fn foreign_filters_keep_their_place_and_order() {
        // Above the CM clients, below ibbus, and between them.
        let above = ["ibbus", "WinVerbs", "WinMad", "vendor_qos", "vendor_trace"];
        assert_eq!(
            with_ibcm(&above).unwrap(),
            [
                "ibbus",
                "ibcm",
                "WinVerbs",
                "WinMad",
                "vendor_qos",
                "vendor_trace"
            ]
        );
        let below = ["vendor_low", "ibbus", "ndfltr", "WinVerbs", "WinMad"];
        assert_eq!(
            with_ibcm(&below).unwrap(),
            [
                "vendor_low",
                "ibbus",
                "ibcm",
                "ndfltr",
                "WinVerbs",
                "WinMad"
            ]
        );
        let between = ["ibbus", "vendor_mid", "WinVerbs", "WinMad"];
        assert_eq!(
            with_ibcm(&between).unwrap(),
            ["ibbus", "ibcm", "vendor_mid", "WinVerbs", "WinMad"]
        );
        for list in [&above[..], &below[..], &between[..]] {
            assert_eq!(without_ibcm(&with_ibcm(list).unwrap()), list);
        }
    }

    #[test]
    fn install_is_idempotent_and_uninstall_restores_the_list() {
        for base in [&MLX4_BUS[..], &MLX4_BUS_WIN8[..]] {
            let once = with_ibcm(base).unwrap();
            assert_eq!(with_ibcm(&once).unwrap(), once);
            assert_eq!(without_ibcm(&once), base);
            assert_eq!(
                without_ibcm(base),
                base,
                "uninstall without ibcm changes nothing"
            );
        }
    }

    #[test]
    fn a_misplaced_or_doubled_ibcm_is_moved_directly_above_ibbus() {
        // The old INF's list written by hand in another order, or ibcm twice, in any case.
        let misplaced = ["ibbus", "ndfltr", "WinVerbs", "WinMad", "IBCM"];
        assert_eq!(placement(&misplaced), Placement::Misplaced);
        assert_eq!(
            with_ibcm(&misplaced).unwrap(),
            ["ibbus", "ibcm", "ndfltr", "WinVerbs", "WinMad"]
        );
        let doubled = ["ibbus", "ibcm", "WinVerbs", "ibcm", "WinMad"];
        assert_eq!(placement(&doubled), Placement::Misplaced);
        assert_eq!(
            with_ibcm(&doubled).unwrap(),
            ["ibbus", "ibcm", "WinVerbs", "WinMad"]
        );
        let below = ["ibcm", "ibbus", "WinVerbs"];
        assert_eq!(placement(&below), Placement::Misplaced);
        assert_eq!(with_ibcm(&below).unwrap(), ["ibbus", "ibcm", "WinVerbs"]);
    }

    #[test]
    fn service_names_compare_case_insensitively() {
        let list = ["IBBUS", "winverbs", "winmad"];
        assert_eq!(
            with_ibcm(&list).unwrap(),
            ["IBBUS", "ibcm", "winverbs", "winmad"]
        );
        assert_eq!(placement(&["IbBus", "IbCm"]), Placement::AboveIbbus);
    }

    #[test]
    fn a_list_without_ibbus_is_never_written() {
        assert_eq!(with_ibcm(&["WinVerbs", "WinMad"]), None);
        assert_eq!(with_ibcm::<&str>(&[]), None);
        assert_eq!(placement(&["ibcm", "WinVerbs"]), Placement::NoIbbus);
        // Uninstall still takes a stray ibcm out (it would name a service being deleted).
        assert_eq!(without_ibcm(&["ibcm", "WinVerbs"]), ["WinVerbs"]);
    }

    #[test]
    fn multi_sz_round_trips_and_tolerates_a_missing_terminator() {
        let list = with_ibcm(&MLX4_BUS).unwrap();
        let units = encode_multi_sz(&list);
        assert_eq!(units.iter().filter(|&&u| u == 0).count(), list.len() + 1);
        assert_eq!(&units[units.len() - 2..], [0, 0]);
        assert_eq!(decode_multi_sz(&units), list);
        // Cut short by a writer that forgot the final NULs.
        let short: Vec<u16> = "ibbus\0WinVerbs".encode_utf16().collect();
        assert_eq!(decode_multi_sz(&short), ["ibbus", "WinVerbs"]);
        assert!(decode_multi_sz(&[]).is_empty());
        assert!(decode_multi_sz(&[0, 0]).is_empty());
        assert_eq!(encode_multi_sz::<&str>(&[]), [0]);
    }
}
