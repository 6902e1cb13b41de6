//! Compiles the C replays of WinVerbs (`winverbs.c`) and ndfltr (`ndfltr.c`) of
//! `driver/iba-cm/ctest`, against ibcm's header of the `iba_cm` ABI, for the scenarios
//! that run them against the binding (`tests/kernel_clients`).

fn main() {
    const CTEST: &str = "../../../driver/iba-cm/ctest/c";
    const SOURCES: [&str; 3] = ["replay.c", "winverbs.c", "ndfltr.c"];
    let sources: Vec<String> = SOURCES.iter().map(|s| format!("{CTEST}/{s}")).collect();
    for s in &sources {
        println!("cargo:rerun-if-changed={s}");
    }
    println!("cargo:rerun-if-changed={CTEST}/replay.h");
    println!("cargo:rerun-if-changed=../../../driver/iba-cm/include/ib_cm_ifc_min.h");
    cc::Build::new()
        .files(&sources)
        .include("../../../driver/iba-cm/include")
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("ibcm_iba_cm_replays");
}
