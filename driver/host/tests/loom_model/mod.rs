//! The loom model runner both loom suites (loom.rs, client_loom.rs) use.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The stack of the thread a model runs on.
const MODEL_STACK: usize = 1 << 20;

/// Runs `f` in every interleaving loom explores (at most 3 preemptions unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise) and reports how many there were.
pub fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    let runs = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&runs);
    let f = Arc::new(f);
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        // The nodes are built on the model's own thread: loom's default coroutine stack
        // (32 KiB) no longer holds them since the engine's state grew (issue 29's port state).
        let f = Arc::clone(&f);
        loom::thread::Builder::new()
            .stack_size(MODEL_STACK)
            .spawn(move || f())
            .expect("the model's thread")
            .join()
            .expect("the model's thread panicked");
    });
    println!(
        "{name}: {} interleavings (preemption bound {:?})",
        runs.load(Ordering::Relaxed),
        builder.preemption_bound
    );
}
