//! Which CM MADs are this manager's, for a QP1 shared with another CM (WinOF's AL CM on a
//! stock host, issue #19: the MADs that are ibcm's get their method remapped below AL).
//! A pure function of the MAD's bytes, the listens, the outstanding peer-to-peer REQs and
//! the comm ID space ([`CmConfig::comm_id_mask`](crate::CmConfig)): no allocation, no
//! state change, nothing read past the buffer.
//!
//! - A REQ or SIDR_REQ is ours if a listen of ours takes it (service ID under the mask,
//!   port, private-data compare: what `handle_mad` would match), or if a peer-to-peer
//!   REQ of ours for its service waits.
//! - A SIDR_REP is ours: only ibcm sends SIDR_REQs (AL's kernel CM drops SIDR,
//!   `al_cm_cep.c:2126-2138`).
//! - Every other connection message (MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR) names the
//!   receiver's CEP in its RemoteCommID (IBA 12.6, CM data offset 4): ours if that ID is in
//!   our comm ID space. A REJ with RemoteCommID 0 names nobody and is not ours.
//! - Anything else (not the CM class 0x07, version 2, method Send; ClassPortInfo) is not
//!   steered.

use ibcm_mad::{CmMad, CmMessage, Method};

use super::CmManager;
use crate::cep::State;

/// Whose a received CM MAD is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadOwner {
    /// This manager's.
    Ours,
    /// Another CM's (or no CM's): left as it came.
    Theirs,
}

impl CmManager {
    /// Whose the MAD received on `port` is (see the module's documentation). A MAD the
    /// codec refuses is not ours: the engine would drop it anyway.
    pub fn owner_of(&self, port: u8, mad: &[u8]) -> MadOwner {
        let Ok(parsed) = CmMad::parse(mad) else {
            return MadOwner::Theirs;
        };
        if parsed.header.method != Method::Send {
            return MadOwner::Theirs;
        }
        let names_ours =
            |remote_comm_id: u32| remote_comm_id != 0 && self.is_local_comm_id(remote_comm_id);
        let ours = match parsed.message {
            CmMessage::Req(m) => {
                self.listens_take(port, m.service_id, m.private_data)
                    || self.peer_req_waits(m.service_id)
            }
            CmMessage::SidrReq(m) => self.listens_take(port, m.service_id, m.private_data),
            CmMessage::SidrRep(_) => true,
            CmMessage::Mra(m) => names_ours(m.remote_comm_id),
            CmMessage::Rej(m) => names_ours(m.remote_comm_id),
            CmMessage::Rep(m) => names_ours(m.remote_comm_id),
            CmMessage::Rtu(m) | CmMessage::Drep(m) => names_ours(m.remote_comm_id),
            CmMessage::Dreq(m) => names_ours(m.remote_comm_id),
            CmMessage::Lap(m) => names_ours(m.remote_comm_id),
            CmMessage::Apr(m) => names_ours(m.remote_comm_id),
            CmMessage::ClassPortInfo(_) => false,
        };
        if ours {
            MadOwner::Ours
        } else {
            MadOwner::Theirs
        }
    }

    /// Whether a listen of ours takes a REQ (or SIDR_REQ), as `handle_mad` matches it.
    fn listens_take(&self, port: u8, service_id: u64, private_data: &[u8]) -> bool {
        self.listens.taker(port, service_id, private_data).is_some()
    }

    /// Whether a peer-to-peer REQ of ours for `service_id` waits for the peer's.
    fn peer_req_waits(&self, service_id: u64) -> bool {
        self.peers.iter().any(|id| {
            self.slots
                .get(id.index())
                .and_then(|s| s.cep.as_ref())
                .is_some_and(|c| {
                    c.peer_to_peer
                        && c.service_id == service_id
                        && matches!(c.state, State::ReqSent { .. })
                })
        })
    }
}
