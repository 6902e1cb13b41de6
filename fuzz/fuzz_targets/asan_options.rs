// AddressSanitizer defaults for every target (`include!`d by each): the `ASAN_OPTIONS`
// environment variable still overrides them.
//
// - detect_stack_use_after_return=0: ASan's fake stack gives every call with a large
//   frame (MADs, event records, ~256-500 bytes each on these paths) a heap-allocated
//   frame; it costs these targets about a third of their time, and it looks for a bug
//   (a reference to a dead stack frame) that safe Rust cannot have: the project's crates
//   have no unsafe code.
// - quarantine_size_mb=16: freed memory is kept out of reuse for 16 MB of frees, not
//   256, so a use after free is still caught within an input (an input frees far less),
//   while the allocator reuses warm memory instead of faulting in fresh pages.
// (Defined in every build: without ASan nothing reads it.)
#[unsafe(no_mangle)]
pub extern "C" fn __asan_default_options() -> *const std::ffi::c_char {
    c"detect_stack_use_after_return=0:quarantine_size_mb=16".as_ptr()
}
