//! Compiles the C test client (`c/client.c`) against ibcm's header of the iba_cm ABI. The
//! crate is test-only; nothing here runs for the driver.

fn main() {
    println!("cargo:rerun-if-changed=c/client.c");
    println!("cargo:rerun-if-changed=../include/ib_cm_ifc_min.h");
    cc::Build::new()
        .file("c/client.c")
        .include("../include")
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("ibcm_iba_cm_client");
}
