//! Indices found in a port's tables (its P_Key and GID tables), kept until the port says
//! the table changed, as the kernel's CM takes both from the core's caches instead of the
//! device (drivers/infiniband/core/cache.c: `ib_find_cached_pkey`,
//! `rdma_find_gid_by_port`, refreshed on the port's PKEY_CHANGE and GID_CHANGE events).
//!
//! A lookup runs without the lock (a GID table query is an ioctl), so a change told while
//! it ran must not leave the old table's answer behind: every [`PortIndices::forget`]
//! bumps a generation, and a lookup keeps its answer only if the generation it started
//! under is still current.

use std::io;
use std::sync::{Mutex, PoisonError};

/// The indices found so far, by (port, key).
pub(crate) struct PortIndices<K, V> {
    inner: Mutex<Inner<K, V>>,
}

struct Inner<K, V> {
    found: Vec<((u8, K), V)>,
    /// Bumped by every `forget`.
    generation: u64,
}

impl<K: Copy + PartialEq, V: Copy> PortIndices<K, V> {
    /// Nothing found yet.
    pub(crate) const fn new() -> Self {
        Self {
            inner: Mutex::new(Inner {
                found: Vec::new(),
                generation: 0,
            }),
        }
    }

    /// The index of `key` on `port`: the one found before, else `find`'s (kept unless the
    /// port's table changed while `find` ran; an error is not kept).
    pub(crate) fn get(
        &self,
        port: u8,
        key: K,
        find: impl FnOnce() -> io::Result<V>,
    ) -> io::Result<V> {
        let generation = {
            let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(&(_, index)) = inner.found.iter().find(|(k, _)| *k == (port, key)) {
                return Ok(index);
            }
            inner.generation
        };
        let index = find()?;
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.generation == generation && !inner.found.iter().any(|(k, _)| *k == (port, key)) {
            inner.found.push(((port, key), index));
        }
        Ok(index)
    }

    /// Forgets what was found on `port`: its table changed.
    pub(crate) fn forget(&self, port: u8) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.found.retain(|((p, _), _)| *p != port);
        inner.generation += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::PortIndices;
    use std::cell::Cell;
    use std::io;

    #[test]
    fn an_index_is_looked_up_once() {
        let cache = PortIndices::<u16, u16>::new();
        let lookups = Cell::new(0);
        let find = |i| {
            lookups.set(lookups.get() + 1);
            Ok(i)
        };
        assert_eq!(cache.get(1, 0xffff, || find(0)).ok(), Some(0));
        assert_eq!(cache.get(1, 0xffff, || find(9)).ok(), Some(0));
        assert_eq!(lookups.get(), 1);
        // Another key, another port: looked up.
        assert_eq!(cache.get(1, 0x8001, || find(3)).ok(), Some(3));
        assert_eq!(cache.get(2, 0xffff, || find(5)).ok(), Some(5));
        assert_eq!(lookups.get(), 3);
    }

    #[test]
    fn a_changed_port_is_looked_up_again_and_only_it() {
        let cache = PortIndices::<[u8; 16], u8>::new();
        let gid = [7u8; 16];
        assert_eq!(cache.get(1, gid, || Ok(3)).ok(), Some(3));
        assert_eq!(cache.get(2, gid, || Ok(4)).ok(), Some(4));
        cache.forget(1);
        // The table moved the GID: the new index, not the old one.
        assert_eq!(cache.get(1, gid, || Ok(5)).ok(), Some(5));
        assert_eq!(cache.get(2, gid, || Ok(6)).ok(), Some(4));
    }

    #[test]
    fn a_lookup_that_raced_a_change_is_not_kept() {
        let cache = PortIndices::<u16, u16>::new();
        // The change is told while the lookup reads the old table.
        let raced = cache.get(1, 0xffff, || {
            cache.forget(1);
            Ok(2)
        });
        assert_eq!(raced.ok(), Some(2));
        assert_eq!(cache.get(1, 0xffff, || Ok(6)).ok(), Some(6));
    }

    #[test]
    fn a_failed_lookup_is_not_kept() {
        let cache = PortIndices::<u16, u16>::new();
        let failed = cache.get(1, 0x1234, || Err(io::Error::other("no such P_Key")));
        assert!(failed.is_err());
        assert_eq!(cache.get(1, 0x1234, || Ok(1)).ok(), Some(1));
    }
}
