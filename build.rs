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
}
