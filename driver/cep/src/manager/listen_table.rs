//! The listen table: every listen of the manager, indexed so that a LISTEN's overlap check
//! and a received REQ's (or SIDR_REQ's) lookup cost O(1) in the common case rather than a
//! scan of every listen under the CM's lock (review-30 A5: 64 listens a handle and many
//! handles make 10^5-10^6 listens, milliseconds a scan at DISPATCH_LEVEL).
//!
//! - Listens whose service mask is all ones (every non-administrator's: policy.rs
//!   `may_listen`) are found by service ID, as WinOF AL keys its listen map by exact
//!   service ID (al_cm_cep.c:4430-4441) and Linux `cm_find_listen` (cm.c) looks REQs up by
//!   exact ID: a map from the ID to the first listen on it, the others on the same ID (other
//!   ports, other compares) chained behind it.
//! - Listens with a partial mask (administrators' wildcards, few) are kept in a list
//!   scanned in addition.
//!
//! Which listens may coexist is `listen::overlaps`, unchanged: two exact listens on
//! different IDs never overlap (no ID equals both), so a new exact listen is checked
//! against the listens on its ID and every partial-mask one; a new partial-mask listen may
//! overlap any listen and is checked against all of them (rare: administrators only).
//!
//! Both maps hash with the manager's [`KeyedHash`] (SipHash-1-3, random key): the service
//! IDs inserted come from LISTENs of non-administrators, who could otherwise choose IDs
//! that collide and make every lookup on them probe a long run, and those looked up come
//! from REQs on the wire; siphasher is no_std and already the engine's hasher for
//! peer-chosen keys (design.md).

use alloc::vec::Vec;

use hashbrown::HashMap;

use super::listen::{overlaps, takes};
use super::lookup::KeyedHash;
use super::memory::hash_table_bytes;
use crate::error::CmError;
use crate::grow::HeapBytes;
use crate::types::{CepId, ListenParams};

#[derive(Debug, Clone)]
pub(super) struct ListenEntry {
    pub(super) cep: CepId,
    pub(super) params: ListenParams,
    /// REQs this listen reported and nobody answered yet: what its backlog bounds
    /// (held.rs).
    pub(super) pending: u32,
    /// REQs past the backlog, waiting to be reported (held.rs).
    pub(super) held: super::held::HeldReqs,
    /// The next exact listen on the same service ID (its CEP's slot index).
    next: Option<u32>,
}

/// Every listen: by its CEP's slot index, by exact service ID, and the partial-mask ones.
#[derive(Debug)]
pub(super) struct ListenTable {
    /// Every listen, keyed by its CEP's slot index.
    entries: HashMap<u32, ListenEntry, KeyedHash>,
    /// Exact-mask listens: service ID -> the slot index of the first listen on it.
    exact: HashMap<u64, u32, KeyedHash>,
    /// Partial-mask listens' slot indices.
    partial: Vec<u32>,
    /// The live listens' backlogs, summed (the room their REQs may take).
    backlogs: usize,
    /// `overlaps` and `takes` evaluations, for the tests that bound them.
    #[cfg(test)]
    pub(super) evaluations: core::sync::atomic::AtomicUsize,
}

fn is_exact(p: &ListenParams) -> bool {
    p.service_mask == u64::MAX
}

fn key(id: CepId) -> u32 {
    id.index() as u32
}

impl ListenTable {
    pub(super) fn new(hash: KeyedHash) -> Self {
        Self {
            entries: HashMap::with_hasher(hash),
            exact: HashMap::with_hasher(hash),
            partial: Vec::new(),
            backlogs: 0,
            #[cfg(test)]
            evaluations: core::sync::atomic::AtomicUsize::new(0),
        }
    }

    #[cfg(test)]
    fn evaluated(&self) {
        self.evaluations
            .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    }

    #[cfg(not(test))]
    fn evaluated(&self) {}

    /// The listen of `id`.
    pub(super) fn get(&self, id: CepId) -> Option<&ListenEntry> {
        self.entries.get(&key(id)).filter(|l| l.cep == id)
    }

    pub(super) fn get_mut(&mut self, id: CepId) -> Option<&mut ListenEntry> {
        self.entries.get_mut(&key(id)).filter(|l| l.cep == id)
    }

    /// Every listen, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &ListenEntry> {
        self.entries.values()
    }

    /// The exact listens on `service_id`.
    fn on_id(&self, service_id: u64) -> impl Iterator<Item = &ListenEntry> {
        let mut at = self.exact.get(&service_id).copied();
        core::iter::from_fn(move || {
            let l = self.entries.get(&at?)?;
            at = l.next;
            Some(l)
        })
    }

    fn partials(&self) -> impl Iterator<Item = &ListenEntry> {
        self.partial.iter().filter_map(|i| self.entries.get(i))
    }

    /// Whether an existing listen overlaps `params` (listen.rs): for an exact listen, those
    /// on its ID and the partial-mask ones; for a partial-mask listen, all.
    pub(super) fn overlapping(&self, params: &ListenParams) -> bool {
        let overlap = |l: &ListenEntry| {
            self.evaluated();
            overlaps(&l.params, params)
        };
        if is_exact(params) {
            self.on_id(params.service_id).any(overlap) || self.partials().any(overlap)
        } else {
            self.iter().any(overlap)
        }
    }

    /// The listen that takes a REQ (or SIDR_REQ) for `service_id` arriving on `port` with
    /// `private_data`: at most one does, since no two listens overlap, so the order they
    /// are looked at in decides nothing.
    pub(super) fn taker(&self, port: u8, service_id: u64, private_data: &[u8]) -> Option<CepId> {
        let take = |l: &&ListenEntry| {
            self.evaluated();
            takes(&l.params, port, service_id, private_data)
        };
        self.on_id(service_id)
            .find(take)
            .or_else(|| self.partials().find(take))
            .map(|l| l.cep)
    }

    /// Adds the listen of `id` (which the caller checked with [`Self::overlapping`]).
    /// Allocates only through `try_reserve`, and nothing when [`Self::room`] is not 0;
    /// fails, changing nothing, when memory runs out.
    pub(super) fn insert(&mut self, id: CepId, params: ListenParams) -> Result<(), CmError> {
        let no = CmError::NoResources;
        self.entries.try_reserve(1).map_err(|_| no)?;
        let exact = is_exact(&params);
        if exact {
            if !self.exact.contains_key(&params.service_id) {
                self.exact.try_reserve(1).map_err(|_| no)?;
            }
        } else {
            self.partial.try_reserve(1).map_err(|_| no)?;
        }
        self.backlogs = self.backlogs.saturating_add(params.backlog as usize);
        let next = if exact {
            self.exact.insert(params.service_id, key(id))
        } else {
            self.partial.push(key(id));
            None
        };
        self.entries.insert(
            key(id),
            ListenEntry {
                cep: id,
                params,
                pending: 0,
                held: super::held::HeldReqs::default(),
                next,
            },
        );
        Ok(())
    }

    /// Removes the listen of `id`. Allocates nothing.
    pub(super) fn remove(&mut self, id: CepId) -> Option<ListenEntry> {
        self.get(id)?;
        let gone = self.entries.remove(&key(id))?;
        self.backlogs = self.backlogs.saturating_sub(gone.params.backlog as usize);
        if !is_exact(&gone.params) {
            self.partial.retain(|&i| i != key(id));
            return Some(gone);
        }
        let sid = gone.params.service_id;
        if self.exact.get(&sid) == Some(&key(id)) {
            match gone.next {
                Some(next) => {
                    self.exact.insert(sid, next);
                }
                None => {
                    self.exact.remove(&sid);
                }
            }
            return Some(gone);
        }
        // Unlink it from behind the listen before it on the same ID.
        let mut at = self.exact.get(&sid).copied();
        while let Some(i) = at {
            let Some(l) = self.entries.get_mut(&i) else {
                break;
            };
            if l.next == Some(key(id)) {
                l.next = gone.next;
                break;
            }
            at = l.next;
        }
        Some(gone)
    }

    /// The live listens' backlogs, summed. O(1).
    pub(super) fn backlogs(&self) -> usize {
        self.backlogs
    }

    /// Listens [`Self::insert`] adds without allocating (hashbrown's capacity is items +
    /// growth left; a table with tombstones may hold more).
    pub(super) fn room(&self) -> usize {
        let entries = self.entries.capacity() - self.entries.len();
        let exact = self.exact.capacity() - self.exact.len();
        let partial = self.partial.capacity() - self.partial.len();
        entries.min(exact).min(partial)
    }

    /// Makes room for `n` listens more than are live, exact or partial-mask.
    pub(super) fn try_reserve(&mut self, n: usize) -> Result<(), CmError> {
        let no = CmError::NoResources;
        self.entries.try_reserve(n).map_err(|_| no)?;
        self.exact.try_reserve(n).map_err(|_| no)?;
        self.partial.try_reserve(n).map_err(|_| no)
    }

    /// Heap bytes of the table (the compare buffers aside: `compare_bytes`).
    pub(super) fn heap_bytes(&self) -> usize {
        hash_table_bytes(self.entries.capacity(), size_of::<(u32, ListenEntry)>())
            + hash_table_bytes(self.exact.capacity(), size_of::<(u64, u32)>())
            + self.partial.heap_bytes()
    }

    /// Heap bytes of the listens' compare buffers.
    pub(super) fn compare_bytes(&self) -> usize {
        self.iter()
            .filter_map(|l| l.params.compare.as_ref())
            .map(|(_, bytes)| bytes.capacity())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use alloc::vec;
    use alloc::vec::Vec;
    use core::sync::atomic::Ordering::Relaxed;

    use proptest::prelude::*;

    use super::*;
    use crate::pair::{GUID_A, GUID_B, Pair};
    use crate::{CmConfig, CmManager, Event, Instant, MadAddress, MadOwner};

    fn exact(service_id: u64, port: Option<u8>) -> ListenParams {
        ListenParams {
            service_id,
            service_mask: u64::MAX,
            port,
            compare: None,
            backlog: 4,
        }
    }

    /// A REQ on the wire for `service_id`, from another manager.
    fn req_for(service_id: u64) -> [u8; ibcm_mad::MAD_SIZE] {
        let mut a = CmManager::new(CmConfig::new(GUID_A, [1; 32]));
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        let cep = a.create().unwrap();
        a.connect(
            Instant::default(),
            cep,
            &Pair::connect_params(service_id, 0x11),
        )
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        .unwrap();
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        a.poll_transmit().unwrap().mad
    }

    /// review-30 A5: with N = 10^4 listens on distinct exact IDs, 3 partial-mask ones and
    /// 2 on one ID S, a LISTEN on S evaluates `overlaps` against the 2 on S and the 3
    /// partial ones, and a REQ for S is matched (`takes`) against the listens on S and the
    /// partial ones: 5 and at most 6 evaluations, not N (a scan of every listen: N + 5).
    #[test]
    fn one_listen_and_one_req_look_at_the_listens_on_their_id_and_the_partial_ones() {
        const N: u64 = 10_000;
        const BASE: u64 = 0x1_0000_0000;
        const S: u64 = 0x5000;
        let mut cm = CmManager::new(CmConfig::new(GUID_B, [2; 32]));
        let listen = |cm: &mut CmManager, params| {
            // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
            let cep = cm.create().unwrap();
            // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
            cm.listen(cep, params).unwrap();
            cep
        };
        for k in 0..N {
            listen(&mut cm, exact(BASE + k, None));
        }
        for k in 0..3u64 {
            let wildcard = ListenParams {
                service_mask: !0xffff,
                ..exact(0x2_0000_0000 + (k << 16), None)
            };
            listen(&mut cm, wildcard);
        }
        listen(&mut cm, exact(S, Some(1)));
        listen(&mut cm, exact(S, Some(2)));
        let evaluations = |cm: &CmManager| cm.listens.evaluations.swap(0, Relaxed);
        evaluations(&cm);

        let on_s = listen(&mut cm, exact(S, Some(3)));
        assert_eq!(evaluations(&cm), 2 + 3, "LISTEN");
        // An overlapping one is still refused.
        // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
        let dup = cm.create().unwrap();
        assert_eq!(
            cm.listen(dup, exact(S, None)),
            Err(crate::CmError::DuplicateListen)
        );
        assert!(evaluations(&cm) <= 3 + 3, "refused LISTEN");

        let req = req_for(S);
        assert_eq!(cm.owner_of(3, &req), MadOwner::Ours);
        assert!(evaluations(&cm) <= 3 + 3, "REQ steered");
        assert_eq!(cm.owner_of(4, &req), MadOwner::Theirs);
        assert_eq!(evaluations(&cm), 3 + 3, "REQ no listen takes");
        let miss = req_for(0x6000);
        assert_eq!(cm.owner_of(1, &miss), MadOwner::Theirs);
        assert_eq!(evaluations(&cm), 3, "REQ for an ID nobody listens on");

        let src = MadAddress {
            port: 3,
            ..Pair::address_of(crate::pair::Side::A)
        };
        cm.handle_mad(Instant::default(), &src, &req);
        assert!(evaluations(&cm) <= 3 + 3, "REQ received");
        let taken = core::iter::from_fn(|| cm.poll_event())
            .any(|(_, e)| matches!(e, Event::ReqReceived(r) if r.listen == on_s));
        assert!(taken, "the REQ reached the listen on S, port 3");
    }

    // ---- the table against a linear scan -------------------------------------------

    #[derive(Debug, Clone)]
    enum Op {
        Listen {
            slot: u32,
            params: ListenParams,
        },
        Remove {
            slot: u32,
            stale: bool,
        },
        Req {
            port: u8,
            service_id: u64,
            private_data: Vec<u8>,
        },
    }

    /// Few IDs and masks, so that listens meet on IDs and masks cover each other.
    fn service_id() -> impl Strategy<Value = u64> {
        prop_oneof![
            3 => Just(0x10u64),
            4 => prop::sample::select(vec![0x11u64, 0x12, 0x1f, 0x20, 0x1_0010]),
            1 => any::<u64>(),
        ]
    }

    fn params() -> impl Strategy<Value = ListenParams> {
        let mask = prop_oneof![
            3 => Just(u64::MAX),
            1 => prop::sample::select(vec![!0xfu64, !0xff, !0x1, 0, !0x1_0000, 0xf0]),
        ];
        let compare = proptest::option::of((0u8..4, prop::collection::vec(0u8..2, 1..3)));
        (service_id(), mask, proptest::option::of(1u8..5), compare).prop_map(
            |(service_id, service_mask, port, compare)| ListenParams {
                service_id,
                service_mask,
                port,
                compare,
                backlog: 1,
            },
        )
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..16, params()).prop_map(|(slot, params)| Op::Listen { slot, params }),
            2 => (0u32..16, any::<bool>()).prop_map(|(slot, stale)| Op::Remove { slot, stale }),
            3 => (1u8..5, service_id(), prop::collection::vec(0u8..2, 0..6)).prop_map(
                |(port, service_id, private_data)| Op::Req { port, service_id, private_data }
            ),
        ]
    }

    proptest! {
        /// Whatever listens are made and removed, the table refuses the listens a linear
        /// scan with `overlaps` refuses, and gives each REQ to the listen a linear scan
        /// with `takes` finds (at most one takes it).
        #[test]
        fn the_table_answers_as_a_linear_scan(ops in prop::collection::vec(op(), 1..120)) {
            let mut table = ListenTable::new(KeyedHash(7, 11));
            let mut model: Vec<(CepId, ListenParams)> = Vec::new();
            let mut generation = 0u32;
            for op in ops {
                match op {
                    Op::Listen { slot, params } => {
                        if model.iter().any(|(id, _)| id.index() == slot as usize) {
                            continue;
                        }
                        let refused = model.iter().any(|(_, p)| overlaps(p, &params));
                        prop_assert_eq!(table.overlapping(&params), refused);
                        if !refused {
                            generation += 1;
                            let id = CepId::new(slot, generation);
                            // ok: a unit test (cfg(test)), not driver code: a failure here fails the test.
                            table.insert(id, params.clone()).unwrap();
                            model.push((id, params));
                        }
                    }
                    Op::Remove { slot, stale } => {
                        let at = model.iter().position(|(id, _)| id.index() == slot as usize);
                        match at {
                            Some(at) if stale => {
                                let id = model[at].0;
                                let old = CepId::new(slot, id.tag().wrapping_add(1));
                                prop_assert!(table.remove(old).is_none());
                            }
                            Some(at) => {
                                let (id, _) = model.swap_remove(at);
                                prop_assert_eq!(table.remove(id).map(|l| l.cep), Some(id));
                            }
                            None => {
                                prop_assert!(table.remove(CepId::new(slot, 0)).is_none());
                            }
                        }
                    }
                    Op::Req { port, service_id, private_data } => {
                        let mut taking = model
                            .iter()
                            .filter(|(_, p)| takes(p, port, service_id, &private_data));
                        let want = taking.next().map(|(id, _)| *id);
                        prop_assert!(taking.next().is_none(), "two listens take one REQ");
                        prop_assert_eq!(table.taker(port, service_id, &private_data), want);
                    }
                }
                // Every listen is found by its CEP, and by its ID or among the partial ones.
                prop_assert_eq!(table.iter().count(), model.len());
                for (id, p) in &model {
                    let l = table.get(*id);
                    prop_assert_eq!(l.map(|l| (l.cep, &l.params)), Some((*id, p)));
                    let mut found = table.on_id(p.service_id).chain(table.partials());
                    prop_assert!(found.any(|l| l.cep == *id));
                }
            }
        }
    }
}
