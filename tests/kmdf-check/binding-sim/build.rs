//! Builds driver/kmdf for the host: `cfg(windows)` (the binding exists) and
//! `cfg(ibcm_kernel_sim)` (no panic handler, no global allocator: the test binary brings
//! both) for this crate alone. `ibal.rs` links `cng` for BCryptGenRandom as a kernel driver
//! does; here the simulated kernel defines it, so an empty `libcng.a` satisfies the link.
fn main() {
    println!("cargo::rustc-cfg=windows");
    println!("cargo::rustc-cfg=ibcm_kernel_sim");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(std::path::Path::new(&out).join("libcng.a"), b"!<arch>\n")
        .expect("OUT_DIR is writable");
    println!("cargo::rustc-link-search=native={out}");
    println!("cargo::rerun-if-changed=build.rs");
}
