//! What the administrator's commands say and ask before they touch a host: the kill switch
//! (`ibcm off` / `ibcm on`), and the HCA restart that `install`, `uninstall` and the switch
//! need. Portable and tested; the Windows side (`install_windows.rs`) only reads and writes.
#![forbid(unsafe_code)]

use std::io::BufRead;

/// The service key's `Parameters`, under HKLM (what the driver's
/// `WdfDriverOpenParametersRegistryKey` opens, driver/kmdf/parameters.rs).
pub const PARAMETERS_KEY: &str = r"SYSTEM\CurrentControlSet\Services\ibcm\Parameters";
/// The kill switch's REG_DWORD value: non-zero = ibcm off.
pub const SWITCH_VALUE: &str = "Disabled";

/// What restarting an HCA interrupts, said before any restart.
pub const RESTART_INTERRUPTS: &str = "Restarting an HCA stops its device stack for a few \
seconds: IPoIB interfaces on it go down (TCP connections and SMB sessions over them may \
break), and every WinVerbs, NetworkDirect and ibcm connection on it ends (applications see \
it disconnected).";

/// When a change of the switch takes effect, as `ibcm off` / `ibcm on` say it.
pub fn switch_takes_effect(off: bool) -> String {
    let what = if off {
        "ibcm stays in each HCA's stack but binds nothing and answers no CM query: AL's CM \
         serves every client"
    } else {
        "ibcm serves the HCAs again (where it is in their UpperFilters)"
    };
    format!(
        "{what}. The driver reads the value at each HCA's start, and WinVerbs takes its CM \
         interface once, when it starts on the first HCA (wv_driver.c:554-575): the change \
         applies to a running host only once every HCA has restarted (or at the next boot)."
    )
}

/// The answer to a yes/no question: `yes` (`--yes`) answers it; otherwise `answer` is
/// read (a line of stdin) when `interactive`, and only "y" or "yes" agree. Without a
/// terminal and without `--yes` the answer is no: a script must say `--yes`.
pub fn confirm(yes: bool, interactive: bool, answer: &mut dyn BufRead) -> bool {
    if yes {
        return true;
    }
    if !interactive {
        return false;
    }
    let mut line = String::new();
    if answer.read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// The switch's state from the registry value (`None`: the value is absent).
pub fn switched_off(value: Option<u32>) -> bool {
    value.is_some_and(|v| v != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_yes_or_an_explicit_answer_agrees() {
        assert!(confirm(true, false, &mut "".as_bytes()), "--yes");
        assert!(
            !confirm(false, false, &mut "y\n".as_bytes()),
            "no terminal: only --yes agrees"
        );
        for yes in ["y\n", "Y\n", "yes\n", " YES \r\n"] {
            assert!(confirm(false, true, &mut yes.as_bytes()), "{yes:?}");
        }
        for no in ["\n", "n\n", "no\n", "yess\n", ""] {
            assert!(!confirm(false, true, &mut no.as_bytes()), "{no:?}");
        }
    }

    #[test]
    fn the_switch_is_off_only_when_the_value_is_set_and_not_zero() {
        assert!(!switched_off(None));
        assert!(!switched_off(Some(0)));
        assert!(switched_off(Some(1)));
        assert!(switched_off(Some(0xFFFF_FFFF)));
    }

    #[test]
    fn the_switch_says_when_it_applies() {
        for off in [true, false] {
            let s = switch_takes_effect(off);
            assert!(
                s.contains("each HCA's start") && s.contains("WinVerbs"),
                "{s}"
            );
        }
        assert!(switch_takes_effect(true).contains("AL's CM serves every client"));
        // The driver reads the same key and value (driver/kmdf/parameters.rs,
        // driver/eventlog's SWITCH_VALUE names it for the System log).
        let parameters = include_str!("../../../driver/kmdf/parameters.rs");
        assert!(parameters.contains(&format!("wdf::utf16(\"{SWITCH_VALUE}\")")));
        let eventlog = include_str!("../../../driver/eventlog/src/lib.rs");
        assert!(eventlog.contains(&format!(r"HKLM\{PARAMETERS_KEY}\{SWITCH_VALUE}")));
    }
}
