//! `ibcm off` / `ibcm on`: the kill switch, the `Disabled` value of the service's
//! `Parameters` (driver/kmdf/parameters.rs). With it set, ibcm stays in each HCA's stack
//! but binds nothing and answers no CM query, so AL's CM serves every client. The driver
//! reads it at each HCA's start and WinVerbs takes its CM interface once, so the command
//! says so and offers to restart the HCAs ([`ibcm_cli::admin`] words it and asks).

use clap::Args;

use crate::Failure;

#[derive(Args, Debug)]
pub struct SwitchArgs {
    /// Restart every HCA now without asking (the switch applies at each HCA's start).
    #[arg(long)]
    yes: bool,
    /// Only set the value: it applies at each HCA's next start, or at the next boot.
    #[arg(long, conflicts_with = "yes")]
    no_restart: bool,
}

/// Runs `ibcm off` (`off`) or `ibcm on`.
#[cfg(windows)]
pub fn command(off: bool, a: &SwitchArgs) -> Result<bool, Failure> {
    use std::io::IsTerminal as _;

    use ibcm_cli::admin::{
        PARAMETERS_KEY, RESTART_INTERRUPTS, SWITCH_VALUE, confirm, switch_takes_effect,
        switched_off,
    };
    use ibcm_cli::install_windows::{self, Restart};

    let before = install_windows::switch_value().map_err(|e| {
        Failure(format!(
            "cannot read HKLM\\{PARAMETERS_KEY}\\{SWITCH_VALUE}: {e}"
        ))
    })?;
    install_windows::set_switch(off).map_err(|e| {
        Failure(format!(
            "cannot write HKLM\\{PARAMETERS_KEY}\\{SWITCH_VALUE} (run as Administrator): {e}"
        ))
    })?;
    println!(
        "HKLM\\{PARAMETERS_KEY}\\{SWITCH_VALUE} = {} (was {}): ibcm is {}",
        u32::from(off),
        before.map_or("absent".to_string(), |v| v.to_string()),
        if off { "off" } else { "on" }
    );
    if switched_off(before) == off {
        println!("(no change)");
    }
    println!("{}", switch_takes_effect(off));
    if a.no_restart {
        return Ok(true);
    }
    let hcas =
        install_windows::hcas().map_err(|e| Failure(format!("cannot list the devices: {e}")))?;
    if hcas.is_empty() {
        println!("no HCA (a device with ibbus in its UpperFilters) is present: nothing to restart");
        return Ok(true);
    }
    println!("{RESTART_INTERRUPTS}");
    println!("Restart the {} HCA(s) now? [y/N]", hcas.len());
    let stdin = std::io::stdin();
    if !confirm(a.yes, stdin.is_terminal(), &mut stdin.lock()) {
        println!("not restarted: the change applies at each HCA's next start or at reboot");
        return Ok(true);
    }
    let mut ok = true;
    for hca in hcas {
        match install_windows::restart(&hca.instance_id) {
            Ok(Restart::Done) => println!("{} ({}): restarted", hca.description, hca.instance_id),
            Ok(Restart::RebootNeeded) => println!(
                "{} ({}): could not be restarted now: reboot to apply",
                hca.description, hca.instance_id
            ),
            Err(e) => {
                println!(
                    "{} ({}): restart failed: {e}",
                    hca.description, hca.instance_id
                );
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// Runs `ibcm off` or `ibcm on`: the switch is the Windows driver's.
#[cfg(not(windows))]
pub fn command(_off: bool, _a: &SwitchArgs) -> Result<bool, Failure> {
    Err(Failure(
        "the switch is a registry value of the Windows driver (HKLM\\SYSTEM\\CurrentControlSet\\\
         Services\\ibcm\\Parameters\\Disabled); there is none on this host"
            .into(),
    ))
}
