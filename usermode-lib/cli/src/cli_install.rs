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
    use ibcm_cli::install_windows::{self, Restart};
    if action == Action::Install && !install_windows::service_installed(IBCM) {
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
    let mut ok = true;
    for hca in hcas {
        println!("{} ({})", hca.description, hca.instance_id);
        println!("  UpperFilters: {}", show(&hca.upper_filters));
        let new = match action.edit(&hca.upper_filters) {
            Ok(Some(new)) => new,
            Ok(None) => {
                println!(
                    "  unchanged: {}",
                    upper_filters::placement(&hca.upper_filters)
                );
                continue;
            }
            Err(Failure(msg)) => {
                println!("  skipped: {msg}");
                ok = false;
                continue;
            }
        };
        println!("  writing:      {}", show(&new));
        if a.no_restart {
            match install_windows::write(&hca.instance_id, &new) {
                Ok(()) => println!("  written; applies when the HCA next starts"),
                Err(e) => {
                    println!("  failed: {e}");
                    ok = false;
                }
            }
            continue;
        }
        match install_windows::write_and_restart(&hca.instance_id, &new) {
            Ok(Restart::Done) => println!("  restarted with the new list"),
            Ok(Restart::RebootNeeded) => {
                println!("  written; the HCA could not be restarted now: reboot to apply")
            }
            Err(e) => {
                println!("  failed: {e}");
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
