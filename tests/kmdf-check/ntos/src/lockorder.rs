//! Driver Verifier's deadlock detection for spin locks: the order in which each thread
//! nests its locks is recorded (an edge from every lock it holds to the one it takes), and
//! taking a lock that some earlier nesting held *inside* one this thread holds now is a
//! potential deadlock, reported at once, whether or not the two threads ever met
//! ("Deadlock Detection": lock hierarchy violations). Locks are known by address; a lock
//! whose memory is freed (pool or a WDF context) is forgotten, so a later lock at the same
//! address starts clean.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::verifier::{Rule, bugcheck};

static GRAPH: Mutex<Option<HashMap<usize, HashSet<usize>>>> = Mutex::new(None);

/// `lock` is about to be taken while `held` are held (outermost first).
pub fn acquiring(lock: usize, held: &[usize]) {
    let mut guard = GRAPH.lock().unwrap_or_else(|e| e.into_inner());
    let graph = guard.get_or_insert_with(HashMap::new);
    for h in held {
        if reaches(graph, lock, *h) {
            drop(guard);
            bugcheck(
                Rule::SpinLockOrder,
                format_args!(
                    "spin lock {lock:#x} taken while holding {h:#x}, but {h:#x} was taken while holding {lock:#x} before: two threads nesting them so can deadlock"
                ),
            );
        }
    }
    for h in held {
        graph.entry(*h).or_default().insert(lock);
    }
}

/// Whether `to` is reachable from `from` along recorded nestings.
fn reaches(graph: &HashMap<usize, HashSet<usize>>, from: usize, to: usize) -> bool {
    let mut seen = HashSet::new();
    let mut stack = vec![from];
    while let Some(n) = stack.pop() {
        if n == to {
            return true;
        }
        if !seen.insert(n) {
            continue;
        }
        if let Some(next) = graph.get(&n) {
            stack.extend(next.iter().copied());
        }
    }
    false
}

/// Memory at `[start, start + len)` was freed: locks in it are forgotten.
pub fn forget(start: usize, len: usize) {
    let mut guard = GRAPH.lock().unwrap_or_else(|e| e.into_inner());
    let Some(graph) = guard.as_mut() else { return };
    let gone = |a: &usize| *a >= start && *a < start + len;
    graph.retain(|k, _| !gone(k));
    for targets in graph.values_mut() {
        targets.retain(|t| !gone(t));
    }
}
