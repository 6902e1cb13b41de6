//! Peer-to-peer connection establishment (IBA 12.9.3.1): both sides send a REQ for the
//! same service to each other; when the REQs cross, the side with the larger CA GUID (the
//! larger QPN if the GUIDs are equal) stays active and ignores the REQ it received; the
//! other becomes passive and answers that REQ with a REP. Each side ends established once.

use ibcm_mad::Req;

use super::CmManager;
use crate::CmError;
use crate::cep::State;
use crate::event::{Event, ReqInfo};
use crate::types::{CepId, ConnectParams, Instant, MadAddress, PathRecord, PrivateData};

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
    pub(super) fn crossing_req(&mut self, src: &MadAddress, tid: u64, req: &Req<'_>) -> bool {
        if self.peers.is_empty() {
            return false;
        }
        let slots = &self.slots;
        let waiting = |id: &CepId| {
            slots
                .get(id.index())
                .filter(|s| s.generation == id.generation())
                .and_then(|s| s.cep.as_ref())
                .filter(|c| c.peer_to_peer && matches!(c.state, State::ReqSent { .. }))
        };
        self.peers.retain(|id| waiting(id).is_some());
        let ours = self.peers.iter().find_map(|id| {
            let c = waiting(id)?;
            (c.service_id == req.service_id
                && c.primary.dgid == req.primary_path.local_gid
                && c.primary.dlid == req.primary_path.local_lid)
                .then_some((*id, c.local_qpn))
        });
        let Some((id, local_qpn)) = ours else {
            return false;
        };
        let we_stay_active = (self.config.ca_guid, local_qpn) > (req.local_ca_guid, req.local_qpn);
        if we_stay_active {
            // The peer will lose the same comparison and answer our REQ.
            return true;
        }
        self.cancel_timer(id);
        let primary = PathRecord::from_peer(&req.primary_path);
        let alternate = req
            .alternate_path
            .is_present()
            .then(|| PathRecord::from_peer(&req.alternate_path));
        let ca_ack_delay = self.config.ca_ack_delay;
        let Some(c) = self.cep_mut(id) else {
            return true;
        };
        c.active = false;
        c.peer_to_peer = false;
        c.state = State::ReqRcvd { mra_sent: false };
        c.dest = *src;
        c.tid = tid;
        c.remote_comm_id = req.local_comm_id;
        c.remote_ca_guid = req.local_ca_guid;
        c.remote_qpn = req.local_qpn;
        c.remote_psn = req.starting_psn;
        c.pkey = req.partition_key;
        c.transport = req.transport;
        c.path_mtu = req.path_mtu;
        c.primary = primary;
        c.alternate = alternate;
        c.ack_timeout = crate::qp::ack_timeout(primary.packet_life_time, ca_ack_delay);
        c.peer_responder_resources = req.responder_resources;
        c.peer_initiator_depth = req.initiator_depth;
        c.retry_count = req.retry_count;
        c.rnr_retry = req.rnr_retry_count;
        c.max_cm_retries = req.max_cm_retries;
        c.remote_cm_response_timeout = req.remote_cm_response_timeout;
        c.local_cm_response_timeout = req.local_cm_response_timeout;
        c.target_ack_delay = ca_ack_delay;
        c.srq = req.srq;
        c.flow_control = req.end_to_end_flow_control;
        self.remote_ids
            .insert((req.local_comm_id, req.local_ca_guid), id);
        self.remote_qpns
            .insert((req.local_qpn, req.local_ca_guid), id);
        self.emit(
            id,
            Event::ReqReceived(ReqInfo {
                port: src.port,
                listen: id,
                service_id: req.service_id,
                remote_ca_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                pkey: req.partition_key,
                primary_path: primary,
                alternate_path: alternate,
                path_mtu: req.path_mtu,
                transport: req.transport,
                peer_responder_resources: req.responder_resources,
                peer_initiator_depth: req.initiator_depth,
                rnr_retry_count: req.rnr_retry_count,
                srq: req.srq,
                private_data: PrivateData::new(req.private_data),
            }),
        );
        true
    }
}
