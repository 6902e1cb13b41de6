//! Build script of the KMDF driver package.
//!
//! Build scripts run on the host, so `cfg(windows)` here means "building on Windows": only
//! there is the WDK present and `wdk-build` usable. Elsewhere the package is an empty cdylib
//! and this script does nothing (reference/windows-drivers-rs.md §2.4).

fn main() {
    #[cfg(windows)]
    if let Err(error) = wdk_build::configure_wdk_binary_build() {
        panic!("WDK configuration failed: {error:?}");
    }
    #[cfg(windows)]
    message_table::link();
}

/// ibcm's System-log message table (`driver/eventlog/ibcm.mc`, the event source's
/// `EventMessageFile` in `inf/ibcm.inx`) as a resource of the image: `mc.exe -c -U` (the
/// customer bit, Unicode texts) writes the `.rc` and its `.bin`, `rc.exe` compiles them to
/// a `.res`, and the linker takes the `.res` as an input (link.exe and lld-link convert
/// it). The SDK tools are found where the WDK install puts them: `WindowsSdkBinPath` /
/// `Version_Number` (windows-drivers-rs's install-wdk action), the Windows Kits
/// directory, or PATH.
#[cfg(windows)]
mod message_table {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    const MC: &str = "driver/eventlog/ibcm.mc";

    pub fn link() {
        println!("cargo:rerun-if-changed={MC}");
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        let mc = Path::new(env!("CARGO_MANIFEST_DIR")).join(MC);
        run(Command::new(tool("mc.exe"))
            .args(["-c", "-U", "-h"])
            .arg(&out)
            .arg("-r")
            .arg(&out)
            .arg(&mc));
        let res = out.join("ibcm_messages.res");
        run(Command::new(tool("rc.exe"))
            .current_dir(&out)
            .arg("/nologo")
            .arg("/fo")
            .arg(&res)
            .arg(out.join("ibcm.rc")));
        println!("cargo:rustc-link-arg={}", res.display());
    }

    fn run(command: &mut Command) {
        let status = command
            .status()
            .unwrap_or_else(|e| panic!("{command:?}: {e}"));
        assert!(status.success(), "{command:?}: {status}");
    }

    /// The x64 host tool `name` of the Windows SDK.
    fn tool(name: &str) -> PathBuf {
        let version = std::env::var("Version_Number").ok();
        let mut roots = Vec::new();
        if let Ok(sdk) = std::env::var("WindowsSdkBinPath") {
            roots.push(PathBuf::from(sdk));
        }
        roots.push(PathBuf::from(r"C:\Program Files (x86)\Windows Kits\10\bin"));
        for root in &roots {
            if let Some(v) = &version {
                let candidate = root.join(v).join("x64").join(name);
                if candidate.is_file() {
                    return candidate;
                }
            }
            // The newest versioned directory that has it.
            let mut versions: Vec<PathBuf> = std::fs::read_dir(root)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("x64").join(name))
                .filter(|p| p.is_file())
                .collect();
            versions.sort();
            if let Some(newest) = versions.pop() {
                return newest;
            }
        }
        PathBuf::from(name)
    }
}
