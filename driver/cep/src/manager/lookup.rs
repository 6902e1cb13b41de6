//! The lookups of peer-chosen keys: (comm ID or QPN, CA GUID) -> CEP, under a keyed hash
//! (design.md: peer-chosen keys go in maps with a keyed hash).

use core::hash::BuildHasher;

use hashbrown::HashTable;
use siphasher::sip::SipHasher13;

use crate::cep::Cep;
use crate::grow::ChunkedVec;
use crate::types::CepId;

use super::Slot;

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

/// Which of its peer's identifiers a CEP is found by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PeerField {
    /// The peer's LocalCommID (duplicate REQs, REJs naming no comm ID of ours).
    CommId,
    /// The peer's QPN (stale connections, IBA 12.9.8.3.2).
    Qpn,
}

/// A peer lookup: (comm ID or QPN, CA GUID) -> CEP, two per connection, the largest cost
/// per connection after the slot. An entry is the CEP's handle alone (4 bytes, where a
/// map keyed by a copy of the key took 16): the key is the CEP's own `remote_comm_id` or
/// `remote_qpn` and `remote_ca_guid`, read from the slab to compare and to rehash. So a
/// CEP's key fields do not change while it is entered (they are set before `insert` and
/// read by `forget_peer`, which removes it, as before).
#[derive(Debug)]
pub(super) struct PeerMap {
    table: HashTable<CepId>,
    hash: KeyedHash,
    field: PeerField,
}

/// The key CEP `id` is entered under, if the slab holds it.
fn key_of(slots: &ChunkedVec<Slot>, field: PeerField, id: CepId) -> Option<(u32, u64)> {
    let c: &Cep = slots
        .get(id.index())
        .filter(|s| s.generation & 0xff == id.tag())?
        .cep
        .as_ref()?;
    let n = match field {
        PeerField::CommId => c.remote_comm_id,
        PeerField::Qpn => c.remote_qpn,
    };
    Some((n, c.remote_ca_guid))
}

impl PeerMap {
    pub(super) fn new(hash: KeyedHash, field: PeerField) -> Self {
        Self {
            table: HashTable::new(),
            hash,
            field,
        }
    }

    fn hash_key(hash: &KeyedHash, &(id, guid): &(u32, u64)) -> u64 {
        use core::hash::Hasher;
        let mut h = hash.build_hasher();
        h.write_u32(id);
        h.write_u32((guid >> 32) as u32);
        h.write_u32(guid as u32);
        h.finish()
    }

    /// The hasher the table rehashes with: each entry's key from its CEP.
    fn rehash<'a>(
        hash: &'a KeyedHash,
        field: PeerField,
        slots: &'a ChunkedVec<Slot>,
    ) -> impl Fn(&CepId) -> u64 + 'a {
        move |&id| key_of(slots, field, id).map_or(0, |k| Self::hash_key(hash, &k))
    }

    pub(super) fn get(&self, key: &(u32, u64), slots: &ChunkedVec<Slot>) -> Option<CepId> {
        let field = self.field;
        self.table
            .find(Self::hash_key(&self.hash, key), |&id| {
                key_of(slots, field, id) == Some(*key)
            })
            .copied()
    }

    /// Enters CEP `id` under its key (its fields already set), replacing the CEP entered
    /// under the same key if any. Allocates only past the room `try_reserve` made.
    pub(super) fn insert(&mut self, id: CepId, slots: &ChunkedVec<Slot>) {
        let field = self.field;
        let Some(key) = key_of(slots, field, id) else {
            return;
        };
        let hash = self.hash;
        let entry = self.table.entry(
            Self::hash_key(&hash, &key),
            |&other| key_of(slots, field, other) == Some(key),
            Self::rehash(&hash, field, slots),
        );
        match entry {
            hashbrown::hash_table::Entry::Occupied(mut e) => *e.get_mut() = id,
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(id);
            }
        }
    }

    /// Removes the entry for `key` if it names `id` (one probe: at 1e6 connections each is
    /// a cache miss or two, in every timewait exit's timer pass). Allocates nothing.
    pub(super) fn remove_if(&mut self, key: &(u32, u64), id: CepId, slots: &ChunkedVec<Slot>) {
        let field = self.field;
        if let Ok(e) = self
            .table
            .find_entry(Self::hash_key(&self.hash, key), |&other| {
                key_of(slots, field, other) == Some(*key)
            })
            && *e.get() == id
        {
            e.remove();
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Gives back room beyond `min` entries (or what it holds); keeps it if memory runs
    /// out.
    pub(super) fn shrink_to(&mut self, min: usize, slots: &ChunkedVec<Slot>) {
        let rehash = Self::rehash(&self.hash, self.field, slots);
        let mut fresh = HashTable::new();
        if fresh
            .try_reserve(min.max(self.table.len()), &rehash)
            .is_ok()
        {
            for id in self.table.drain() {
                fresh.insert_unique(rehash(&id), id, &rehash);
            }
            self.table = fresh;
        }
    }

    /// Heap bytes of the table.
    pub(super) fn heap_bytes(&self) -> usize {
        super::memory::hash_table_bytes(self.table.capacity(), core::mem::size_of::<CepId>())
    }

    /// Entries that fit without growing (hashbrown's capacity is items + growth left).
    pub(super) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub(super) fn try_reserve(
        &mut self,
        additional: usize,
        slots: &ChunkedVec<Slot>,
    ) -> Result<(), hashbrown::TryReserveError> {
        let rehash = Self::rehash(&self.hash, self.field, slots);
        self.table.try_reserve(additional, rehash)
    }
}

/// The bytes of one entry of a [`PeerMap`].
#[cfg(test)]
pub(super) fn entry_size() -> usize {
    core::mem::size_of::<CepId>()
}
