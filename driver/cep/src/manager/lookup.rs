//! The lookups of peer-chosen keys: (comm ID or QPN, CA GUID) -> CEP, under a keyed hash
//! (design.md: peer-chosen keys go in maps with a keyed hash).

use core::hash::BuildHasher;

use hashbrown::HashMap;
use siphasher::sip::SipHasher13;

use crate::types::CepId;

/// SipHash-1-3 with a key drawn from the manager's RNG: peers choose comm IDs, QPNs and
/// GUIDs, so their keys must not be predictable to them (quinn's rule for peer keys).
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyedHash(pub(super) u64, pub(super) u64);

impl BuildHasher for KeyedHash {
    type Hasher = SipHasher13;
    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.0, self.1)
    }
}

/// A peer lookup: (comm ID or QPN, CA GUID) -> CEP. Two entries per connection, the largest
/// cost per connection after the slot: the key is kept in 12 bytes, so that an entry
/// takes 16 (a `(u32, u64)` key, padded to 16, makes 24).
#[derive(Debug)]
pub(super) struct PeerMap(HashMap<PeerKey, CepId, KeyedHash>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeerKey {
    id: u32,
    guid: [u32; 2],
}

impl core::hash::Hash for PeerKey {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        state.write_u32(self.id);
        state.write_u32(self.guid[0]);
        state.write_u32(self.guid[1]);
    }
}

impl PeerMap {
    pub(super) fn with_hasher(hash: KeyedHash) -> Self {
        Self(HashMap::with_hasher(hash))
    }

    fn key(&(id, guid): &(u32, u64)) -> PeerKey {
        PeerKey {
            id,
            guid: [(guid >> 32) as u32, guid as u32],
        }
    }

    pub(super) fn get(&self, key: &(u32, u64)) -> Option<&CepId> {
        self.0.get(&Self::key(key))
    }

    pub(super) fn insert(&mut self, key: (u32, u64), id: CepId) -> Option<CepId> {
        self.0.insert(Self::key(&key), id)
    }

    /// Removes the entry for `key` if it names `id` (one probe: at 1e6 connections each is
    /// a cache miss or two, in every timewait exit's timer pass). Allocates nothing.
    pub(super) fn remove_if(&mut self, key: &(u32, u64), id: CepId) {
        if let hashbrown::hash_map::Entry::Occupied(e) = self.0.entry(Self::key(key))
            && *e.get() == id
        {
            e.remove();
        }
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Gives back room beyond `min` entries (or what it holds).
    pub(super) fn shrink_to(&mut self, min: usize) {
        crate::grow::shrink_map(&mut self.0, min);
    }

    /// Heap bytes of the table.
    pub(super) fn heap_bytes(&self) -> usize {
        super::memory::hash_table_bytes(self.0.capacity(), core::mem::size_of::<(PeerKey, CepId)>())
    }

    /// Entries that fit without growing (hashbrown's capacity is items + growth left).
    pub(super) fn capacity(&self) -> usize {
        self.0.capacity()
    }

    pub(super) fn try_reserve(
        &mut self,
        additional: usize,
    ) -> Result<(), hashbrown::TryReserveError> {
        self.0.try_reserve(additional)
    }
}

/// The bytes of one entry of a [`PeerMap`].
#[cfg(test)]
pub(super) fn entry_size() -> usize {
    core::mem::size_of::<(PeerKey, CepId)>()
}
