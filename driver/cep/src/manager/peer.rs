//! Peer-to-peer connection establishment (IBA 12.9.3.1): both sides send a REQ for the
//! same service to each other; when the REQs cross, the side with the larger CA GUID (the
//! larger QPN if the GUIDs are equal) stays active and ignores the REQ it received; the
//! other becomes passive and answers that REQ with a REP. Each side ends established once.

use ibcm_mad::Req;

use super::CmManager;
use crate::CmError;
use crate::cep::State;
use crate::types::{CepId, ConnectParams, Instant, MadAddress};

impl CmManager {
    /// Sends a REQ as [`connect`](Self::connect) does, and also accepts the peer's
    /// crossing REQ for the same service: whichever side loses the comparison becomes
    /// passive, reports [`Event::ReqReceived`] on this same CEP (naming itself as the
    /// listen) and answers with a REP.
    pub fn connect_peer(
        &mut self,
        now: Instant,
        id: CepId,
        p: &ConnectParams<'_>,
    ) -> Result<(), CmError> {
        self.peers
            .try_reserve(1)
            .map_err(|_| CmError::NoResources)?;
        self.connect(now, id, p)?;
        if let Some(c) = self.cep_mut(id) {
            c.peer_to_peer = true;
        }
        self.peers.push(id);
        Ok(())
    }

    /// A REQ from the peer a peer-to-peer CEP of ours is connecting to, for the same
    /// service: settles the crossing. Returns true if the REQ was consumed.
    pub(super) fn crossing_req(
        &mut self,
        now: Instant,
        src: &MadAddress,
        tid: u64,
        req: &Req<'_>,
    ) -> bool {
        if self.peers.is_empty() {
            return false;
        }
        let slots = &self.slots;
        let waiting = |id: &CepId| {
            slots
                .get(id.index())
                .filter(|s| s.generation & 0xff == id.tag())
                .and_then(|s| s.cep.as_ref())
                .filter(|c| c.peer_to_peer && matches!(c.state, State::ReqSent { .. }))
        };
        self.peers.retain(|id| waiting(id).is_some());
        let ours = self.peers.iter().find_map(|id| {
            let c = waiting(id)?;
            (c.service_id == req.service_id
                && c.primary.dgid == req.primary_path.local_gid
                && c.primary.dlid == req.primary_path.local_lid)
                .then_some((*id, c.local_qpn, c.dest.port))
        });
        let Some((id, local_qpn, port)) = ours else {
            return false;
        };
        let we_stay_active =
            (self.ca_guid_of(port), local_qpn) > (req.local_ca_guid, req.local_qpn);
        if we_stay_active {
            // The peer will lose the same comparison and answer our REQ.
            return true;
        }
        // This side turns passive and stores the REQ's alternate path: with no room the
        // REQ is dropped and our own REQ keeps waiting; the peer's retry finds the room.
        if !self.path_room_for(req.alternate_path.is_present()) {
            return true;
        }
        self.cancel_timer(id);
        if let Some(c) = self.cep_mut(id) {
            c.peer_to_peer = false;
        }
        let event = self.take_req(now, id, id, src, tid, req);
        self.emit(id, event);
        true
    }
}
