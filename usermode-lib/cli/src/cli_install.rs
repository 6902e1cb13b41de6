//! `ibcm install` / `ibcm uninstall`: ibcm into or out of each HCA's `UpperFilters`,
//! directly above ibbus, every other filter kept in its order
//! ([`ibcm_cli::upper_filters`] decides the list).
//!
//! On Windows the HCA devnodes are edited and restarted (`install_windows.rs`); with
//! `--list`, or off Windows, the edit runs on the list given and prints the result (the
//! host stub: what would be written).

use clap::Args;
use ibcm_cli::upper_filters::{self, IBCM};

use crate::Failure;

#[derive(Args, Debug)]
pub struct FilterArgs {
    /// Work on this UpperFilters list (comma-separated, lowest filter first) and print
    /// the list that would be written, instead of the HCA devnodes (the only mode off
    /// Windows).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    list: Option<Vec<String>>,
    /// Write the devnodes' lists without restarting the HCAs (the change applies at their
    /// next start or at reboot).
    #[arg(long)]
    no_restart: bool,
    /// Restart the HCAs without asking (a restart interrupts their IPoIB and RDMA traffic).
    #[arg(long, conflicts_with = "no_restart")]
    yes: bool,
    /// Report each HCA's UpperFilters and what would be written; write nothing, restart
    /// nothing.
    #[arg(long, conflicts_with_all = ["yes", "no_restart", "list"])]
    check: bool,
}

/// Which way the list is edited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Install,
    Uninstall,
}

impl Action {
    /// The list to write, or None when `list` is already as wanted.
    fn edit(self, list: &[String]) -> Result<Option<Vec<String>>, Failure> {
        let wanted = match self {
            Self::Install => upper_filters::with_ibcm(list).ok_or_else(|| {
                Failure(format!(
                    "UpperFilters {} names no ibbus: ibcm must sit directly above ibbus, \
                     so nothing is written",
                    show(list)
                ))
            })?,
            Self::Uninstall => upper_filters::without_ibcm(list),
        };
        Ok((wanted != list).then_some(wanted))
    }
}

fn show(list: &[String]) -> String {
    format!("[{}]", list.join(", "))
}

/// Runs `ibcm install` (`Action::Install`) or `ibcm uninstall`.
pub fn command(action: Action, a: &FilterArgs) -> Result<bool, Failure> {
    match &a.list {
        Some(list) => {
            let list: Vec<String> = list.iter().map(|s| s.trim().to_string()).collect();
            println!("UpperFilters: {}", show(&list));
            println!("  ibcm: {}", upper_filters::placement(&list));
            match action.edit(&list)? {
                Some(new) => println!("would write: {}", show(&new)),
                None => println!("unchanged"),
            }
            Ok(true)
        }
        None => devnodes(action, a),
    }
}

#[cfg(windows)]
fn devnodes(action: Action, a: &FilterArgs) -> Result<bool, Failure> {
    use std::io::IsTerminal as _;

    use ibcm_cli::admin::{RESTART_INTERRUPTS, confirm};
    use ibcm_cli::install_windows::{self, Restart};
    if action == Action::Install && !a.check && !install_windows::service_installed(IBCM) {
        return Err(Failure(format!(
            "the `{IBCM}` service is not installed: install the driver package first \
             (`pnputil /add-driver ibcm_driver.inf /install`); a filter whose service is \
             missing keeps the HCA from starting"
        )));
    }
    let hcas =
        install_windows::hcas().map_err(|e| Failure(format!("cannot list the devices: {e}")))?;
    if hcas.is_empty() {
        return Err(Failure(
            "no device has ibbus in its UpperFilters: is WinOF's mlx4_bus installed?".into(),
        ));
    }
    // What each HCA gets, decided before anything is written.
    let mut ok = true;
    let mut edits = Vec::new();
    for hca in &hcas {
        println!("{} ({})", hca.description, hca.instance_id);
        println!("  UpperFilters: {}", show(&hca.upper_filters));
        match action.edit(&hca.upper_filters) {
            Ok(Some(new)) => {
                println!(
                    "  {}: {}",
                    if a.check { "would write" } else { "to write" },
                    show(&new)
                );
                edits.push((hca, new));
            }
            Ok(None) => println!(
                "  unchanged: {}",
                upper_filters::placement(&hca.upper_filters)
            ),
            Err(Failure(msg)) => {
                println!("  skipped: {msg}");
                ok = false;
            }
        }
    }
    if a.check {
        // --check reports; an HCA that needs an edit is what it reports (exit status 1).
        return Ok(ok && edits.is_empty());
    }
    if edits.is_empty() {
        return Ok(ok);
    }
    if !a.no_restart {
        println!("{RESTART_INTERRUPTS}");
        println!("Write and restart {} HCA(s) now? [y/N]", edits.len());
        let stdin = std::io::stdin();
        if !confirm(a.yes, stdin.is_terminal(), &mut stdin.lock()) {
            println!(
                "nothing written (--yes to agree without a terminal; --no-restart to write \
                 the lists for the next start)"
            );
            return Ok(false);
        }
    }
    for (hca, new) in edits {
        let done = if a.no_restart {
            install_windows::write(&hca.instance_id, &new)
                .map(|()| "written; applies when the HCA next starts")
        } else {
            install_windows::write_and_restart(&hca.instance_id, &new).map(|r| match r {
                Restart::Done => "restarted with the new list",
                Restart::RebootNeeded => {
                    "written; the HCA could not be restarted now: reboot to apply"
                }
            })
        };
        match done {
            Ok(what) => println!("{} ({}): {what}", hca.description, hca.instance_id),
            Err(e) => {
                println!("{} ({}): failed: {e}", hca.description, hca.instance_id);
                ok = false;
            }
        }
    }
    Ok(ok)
}

#[cfg(not(windows))]
fn devnodes(_action: Action, _a: &FilterArgs) -> Result<bool, Failure> {
    Err(Failure(format!(
        "the HCA devnodes exist on Windows only; give --list (e.g. --list \
         ibbus,ndfltr,WinVerbs,WinMad) to see what `{IBCM}` would write"
    )))
}
