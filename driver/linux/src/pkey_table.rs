//! The umad port's P_Key table (`/sys/class/infiniband/DEV/ports/N/pkeys/I`), read entry
//! by entry as far as the lookups need: a send looks up its partition (the default one is
//! a full member at index 0 on RoCE, one read), a receive the entry its header's index
//! names. Reading the whole table at start cost 64 sysfs reads, milliseconds before the
//! first REQ on a slow machine, for entries nothing asks about.
//!
//! The entries are read in order and kept; the table ends at the first entry that cannot
//! be read, or at [`PKEY_TABLE_MAX`].

use std::sync::{Mutex, PoisonError};

/// Entries read at most (the table's size on rxe, `RXE_MAX_PKEYS`).
pub(crate) const PKEY_TABLE_MAX: usize = 64;

/// Reads entry `index` of the table; `None` past its end.
type ReadEntry = Box<dyn Fn(usize) -> Option<u16> + Send + Sync>;

/// The P_Key table, read as far as needed.
pub(crate) struct PkeyTable {
    read: ReadEntry,
    known: Mutex<Known>,
}

/// The entries read so far, from index 0.
#[derive(Default)]
struct Known {
    entries: Vec<u16>,
    /// Every entry is read: the table ended.
    complete: bool,
}

impl PkeyTable {
    /// The table of `device`'s `port` in sysfs.
    pub(crate) fn sysfs(device: &str, port: u8) -> Self {
        let base = format!("/sys/class/infiniband/{device}/ports/{port}/pkeys");
        Self::new(Box::new(move |i| {
            std::fs::read_to_string(format!("{base}/{i}"))
                .ok()
                .and_then(|s| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        }))
    }

    /// The table whose entries `read` gives.
    pub(crate) fn new(read: ReadEntry) -> Self {
        Self {
            read,
            known: Mutex::new(Known::default()),
        }
    }

    /// Reads entries until `enough` holds for those read, or the table ends.
    fn read_until(&self, known: &mut Known, enough: impl Fn(&[u16]) -> bool) {
        while !known.complete && !enough(&known.entries) {
            match (known.entries.len() < PKEY_TABLE_MAX)
                .then(|| (self.read)(known.entries.len()))
                .flatten()
            {
                Some(pkey) => known.entries.push(pkey),
                None => known.complete = true,
            }
        }
    }

    /// The index of `pkey`'s partition, as Linux's CM finds it for a path
    /// ([`find_cached_pkey`]), so the table is read past a limited member until a full one
    /// or its end; `None` if the port is not in the partition. An empty table (sysfs
    /// unreadable) gives index 0, the default partition's.
    pub(crate) fn index_of(&self, pkey: u16) -> Option<u16> {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let full = |k: &u16| k & 0x7fff == pkey & 0x7fff && k & 0x8000 != 0;
        self.read_until(&mut known, |entries| entries.iter().any(full));
        if known.entries.is_empty() {
            return Some(0);
        }
        find_cached_pkey(known.entries.iter().copied(), pkey).and_then(|i| u16::try_from(i).ok())
    }

    /// Forgets the entries read: the port's P_Key table changed (`IBV_EVENT_PKEY_CHANGE`).
    pub(crate) fn forget(&self) {
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = Known::default();
    }

    /// Entry `index`; `None` past the table's end.
    pub(crate) fn at(&self, index: usize) -> Option<u16> {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        self.read_until(&mut known, |entries| entries.len() > index);
        known.entries.get(index).copied()
    }
}

/// The index of `pkey`'s partition in `table` (read lazily, in order), by Linux's rule
/// for a path's P_Key (drivers/infiniband/core/cache.c, ib_find_cached_pkey, which cm.c
/// cm_init_av_by_path calls): the same partition is the low 15 bits; the first full member
/// (bit 15 set) ends the search; without one, the last limited member found. `None` if
/// the partition is not in the table.
pub(crate) fn find_cached_pkey(table: impl IntoIterator<Item = u16>, pkey: u16) -> Option<usize> {
    let mut limited = None;
    for (i, k) in table.into_iter().enumerate() {
        if k & 0x7fff == pkey & 0x7fff {
            if k & 0x8000 != 0 {
                return Some(i);
            }
            limited = Some(i);
        }
    }
    limited
}

#[cfg(test)]
mod tests {
    use super::{PKEY_TABLE_MAX, PkeyTable, find_cached_pkey};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A table of `entries` and the count of entries read from it.
    fn table(entries: &'static [u16]) -> (PkeyTable, Arc<AtomicUsize>) {
        let reads = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&reads);
        let t = PkeyTable::new(Box::new(move |i| {
            r.fetch_add(1, Ordering::Relaxed);
            entries.get(i).copied()
        }));
        (t, reads)
    }

    #[test]
    fn the_default_partition_takes_one_read() {
        let (t, reads) = table(&[0xffff, 0, 0, 0, 0x8002]);
        assert_eq!(t.index_of(0xffff), Some(0));
        assert_eq!(t.index_of(0x7fff), Some(0));
        assert_eq!(t.at(0), Some(0xffff));
        assert_eq!(reads.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_limited_member_reads_on_for_a_full_one() {
        let (t, reads) = table(&[0x0002, 0xffff, 0x8002, 0x0003]);
        assert_eq!(t.index_of(0x8002), Some(2));
        assert_eq!(reads.load(Ordering::Relaxed), 3);
        // Only limited: the whole table is read, the limited entry is the answer.
        assert_eq!(t.index_of(0x0003), Some(3));
        assert_eq!(t.index_of(0x8004), None);
        assert_eq!(reads.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_receive_reads_up_to_its_index() {
        let (t, reads) = table(&[0xffff, 0x8001, 0x8002]);
        assert_eq!(t.at(1), Some(0x8001));
        assert_eq!(reads.load(Ordering::Relaxed), 2);
        assert_eq!(t.at(7), None);
        assert_eq!(t.at(2), Some(0x8002));
        assert_eq!(reads.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn an_unreadable_table_is_the_default_partition_at_0() {
        let (t, _) = table(&[]);
        assert_eq!(t.index_of(0xffff), Some(0));
        assert_eq!(t.at(0), None);
    }

    #[test]
    fn a_table_ends_at_its_size() {
        let t = PkeyTable::new(Box::new(|_| Some(0x0001)));
        assert_eq!(t.at(PKEY_TABLE_MAX), None);
        // Limited members only: the last one (ib_find_cached_pkey's partial_ix).
        assert_eq!(t.index_of(0x8001), u16::try_from(PKEY_TABLE_MAX - 1).ok());
    }

    /// ib_find_cached_pkey: a full member first, else the last limited member; the
    /// membership bit of the P_Key asked for does not matter.
    #[test]
    fn the_pkey_index_is_linuxs() {
        let table = [0xffff, 0x0001, 0x8002, 0x0002, 0x0001, 0x0003, 0x8003];
        let find = |pkey| find_cached_pkey(table, pkey);
        assert_eq!(find(0xffff), Some(0));
        assert_eq!(find(0x7fff), Some(0));
        assert_eq!(find(0x8002), Some(2));
        assert_eq!(find(0x0002), Some(2));
        assert_eq!(find(0x8001), Some(4));
        assert_eq!(find(0x0001), Some(4));
        assert_eq!(find(0x0003), Some(6));
        assert_eq!(find(0x8004), None);
        assert_eq!(find_cached_pkey([], 0xffff), None);
    }

    /// After a PKEY_CHANGE the table is read again: an index found before may now name
    /// another partition.
    #[test]
    fn a_forgotten_table_is_read_again() {
        use std::sync::Mutex;
        let now = Arc::new(Mutex::new(vec![0xffff, 0x8001]));
        let read = Arc::clone(&now);
        let t = PkeyTable::new(Box::new(move |i| read.lock().unwrap().get(i).copied()));
        assert_eq!(t.at(1), Some(0x8001));
        assert_eq!(t.index_of(0x8001), Some(1));
        *now.lock().unwrap() = vec![0xffff, 0x8005, 0x8001];
        t.forget();
        assert_eq!(t.at(1), Some(0x8005));
        assert_eq!(t.index_of(0x8001), Some(2));
    }
}
