//! Parses arbitrary bytes as a CM MAD. Whatever `parse` accepts must emit into a fresh
//! buffer and re-parse to the same value; nothing may panic.
#![no_main]

use ibcm_mad::{CmMad, MAD_SIZE};
use libfuzzer_sys::fuzz_target;

include!("asan_options.rs");

fuzz_target!(|data: &[u8]| {
    let Ok(first) = CmMad::parse(data) else {
        return;
    };
    let mut buf = [0u8; MAD_SIZE];
    if let Err(e) = first.emit(&mut buf) {
        panic!("parsed MAD fails to emit: {e:?}\n{first:?}");
    }
    match CmMad::parse(&buf) {
        Ok(second) => assert_eq!(second, first, "re-parse differs"),
        Err(e) => panic!("emitted MAD fails to parse: {e:?}\n{first:?}"),
    }
    // Emit is deterministic and ignores what the buffer held.
    let mut again = [0xA5u8; MAD_SIZE];
    assert_eq!(first.emit(&mut again), Ok(()));
    assert_eq!(again, buf, "emit depends on the buffer's previous contents");
});
