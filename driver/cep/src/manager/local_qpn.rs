//! Which local QPNs speak for a live connection, and for whom (issue #30).
//!
//! A REQ or REP names its sender's QPN, and peers find stale connections by it: Linux
//! `cm_match_req` looks (QPN, CA GUID) up with `cm_insert_remote_qpn` and, on a hit,
//! rejects the new REQ and sends a DREQ for the old connection (so does ibcm's
//! establish.rs). A REQ naming another process's QPN towards the same peer would tear
//! that process's connection down. WinVerbs derives the QPN from a QP the caller owns
//! (wv_ep.c:602-614 for the REQ, 823-828 for the REP); ibcm's user mode names QPNs raw,
//! so the dispatch layer asks [`CmManager::local_qpn_holder`] who holds a QPN before it
//! lets a non-administrator's CONNECT or FORMAT_REP name it.
//!
//! A CEP binds its local QPN from its REQ (ReqSent) or pre-REP (RepPrepared; a
//! re-formatted REP with another QPN moves the binding) until its connection has left
//! timewait (the peer keeps the QPN as long, al_cm_cep.c's timewait and Linux's
//! `cm_cleanup_timewait`), or its port is removed. The holder is the owner (`set_owner`'s
//! first word: the dispatch layer's file, or its kernel-client marker) of the CEP that
//! bound the QPN first, while every CEP that binds it has that owner; once another owner
//! binds it too (a kernel client's QP that a user named first), it is [`CONTESTED`] and
//! no user may name it any more. QPNs are per CA, and one manager serves the ports of
//! several (`set_port_ca_guid`): the key is (CA GUID, QPN).

use hashbrown::HashMap;

use crate::cep::State;

use super::CmManager;
use super::lookup::KeyedHash;

/// A QPN's holder and how many CEPs bind it. In 32-bit words, as [`QpnKey`]: an entry
/// takes 24 bytes, where `(u64, u32)` keys and a `u64` holder, each padded to 16, made
/// 32 (one entry per connection: 17 bytes a connection at 1e6).
#[derive(Debug, Clone, Copy)]
pub(super) struct Hold {
    holder: [u32; 2],
    ceps: u32,
}

impl Hold {
    fn holder(&self) -> u64 {
        (u64::from(self.holder[0]) << 32) | u64::from(self.holder[1])
    }

    fn set_holder(&mut self, holder: u64) {
        self.holder = [(holder >> 32) as u32, holder as u32];
    }
}

/// (CA GUID, QPN), in 32-bit words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct QpnKey {
    guid: [u32; 2],
    qpn: u32,
}

fn key((guid, qpn): (u64, u32)) -> QpnKey {
    QpnKey {
        guid: [(guid >> 32) as u32, guid as u32],
        qpn,
    }
}

/// (CA GUID, QPN) -> its holder.
pub(super) type LocalQpns = HashMap<QpnKey, Hold, KeyedHash>;

/// The holder recorded for a CEP that had no owner when it bound its QPN.
pub(super) const NO_HOLDER: u64 = u64::MAX;

/// The holder of a QPN that CEPs of more than one owner bind: nobody's to name.
pub(super) const CONTESTED: u64 = u64::MAX - 1;

/// Whether a CEP in `state` speaks for its local QPN: from its REQ or pre-REP until its
/// connection has left timewait (module docs).
pub(super) fn binds(state: State) -> bool {
    matches!(
        state,
        State::ReqSent { .. }
            | State::RepPrepared { .. }
            | State::RepSent { .. }
            | State::RepRcvd { .. }
            | State::Established
            | State::DreqSent
            | State::DreqRcvd
            | State::Timewait
    )
}

impl CmManager {
    /// Who holds local QPN `qpn` of the CA of `port` (module docs): the first word of the
    /// owner of the CEPs that bind it ([`NO_HOLDER`] if they had none, [`CONTESTED`] if
    /// they are of several owners), while any CEP binds it.
    pub fn local_qpn_holder(&self, port: u8, qpn: u32) -> Option<u64> {
        let key = key((self.ca_guid_of(port), qpn));
        self.local_qpns.get(&key).map(Hold::holder)
    }

    /// Room for one more binding: the operations that bind a QPN (`connect`, the pre-REP)
    /// make it before they change anything, and fail with `NoResources` without it, so
    /// that a binding is always recorded (an unrecorded one would leave the QPN open to
    /// any user while its connection lives). Allocates only when the room is not there
    /// yet ([`Self::prepare_for`] makes it ahead).
    pub(super) fn reserve_local_qpn(&mut self) -> Result<(), crate::CmError> {
        self.local_qpns
            .try_reserve(1)
            .map_err(|_| crate::CmError::NoResources)
    }

    /// A CEP on `port` changed state from `from` to `to`: binds or unbinds its local QPN.
    /// Never allocates: a bind comes from `connect` or a pre-REP, which made the room
    /// ([`Self::reserve_local_qpn`]); the capacity check only keeps this path from ever
    /// growing the table at DISPATCH_LEVEL.
    pub(super) fn rebind_local_qpn(
        &mut self,
        (port, qpn): (u8, u32),
        owner: Option<u64>,
        from: State,
        to: State,
    ) {
        match (binds(from), binds(to)) {
            (false, true) => self.bind_local_qpn((port, qpn), owner),
            (true, false) => {
                let key = (self.ca_guid_of(port), qpn);
                unbind(&mut self.local_qpns, key);
            }
            _ => {}
        }
    }

    /// A binding CEP on `port` now names `new` instead of `old` (a re-formatted REP).
    pub(super) fn move_local_qpn(&mut self, port: u8, old: u32, new: u32, owner: Option<u64>) {
        let key = (self.ca_guid_of(port), old);
        unbind(&mut self.local_qpns, key);
        self.bind_local_qpn((port, new), owner);
    }

    fn bind_local_qpn(&mut self, (port, qpn): (u8, u32), owner: Option<u64>) {
        let key = key((self.ca_guid_of(port), qpn));
        let holder = owner.unwrap_or(NO_HOLDER);
        if let Some(h) = self.local_qpns.get_mut(&key) {
            h.ceps += 1;
            if h.holder() != holder {
                h.set_holder(CONTESTED);
            }
        } else if self.local_qpns.len() < self.local_qpns.capacity() {
            let mut h = Hold {
                holder: [0; 2],
                ceps: 1,
            };
            h.set_holder(holder);
            self.local_qpns.insert(key, h);
        }
    }
}

/// One CEP binding `key` (CA GUID, QPN) is gone (allocates nothing).
pub(super) fn unbind(qpns: &mut LocalQpns, guid_qpn: (u64, u32)) {
    if let hashbrown::hash_map::Entry::Occupied(mut e) = qpns.entry(key(guid_qpn)) {
        let h = e.get_mut();
        h.ceps = h.ceps.saturating_sub(1);
        if h.ceps == 0 {
            e.remove();
        }
    }
}
