//! Compiles the C test clients against ibcm's header of the iba_cm ABI: `c/client.c` (a
//! WinVerbs/ndfltr-like client) and the replays of WinVerbs (`c/winverbs.c`) and ndfltr
//! (`c/ndfltr.c`) with what they share (`c/replay.c`). The crate is test-only; nothing
//! here runs for the driver.

fn main() {
    const SOURCES: [&str; 4] = ["c/client.c", "c/replay.c", "c/winverbs.c", "c/ndfltr.c"];
    for s in SOURCES {
        println!("cargo:rerun-if-changed={s}");
    }
    println!("cargo:rerun-if-changed=c/replay.h");
    println!("cargo:rerun-if-changed=../include/ib_cm_ifc_min.h");
    cc::Build::new()
        .files(SOURCES)
        .include("../include")
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("ibcm_iba_cm_client");
}
