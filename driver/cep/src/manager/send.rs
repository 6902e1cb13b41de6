//! Sending: every MAD is built here from a CEP's state (IBA 12.6 Tables 103-110) and
//! queued for `poll_transmit`; a repeat re-sends the cached message.

use ibcm_mad::{
    AttributeId, CmMad, CmMessage, CommIds, Dreq, MAD_SIZE, MadHeader, MessageKind, Mra, Rej,
    RejReason, Rep, Req, Transport,
};

use crate::cep::{Cep, State};
use crate::counters::Counters;
use crate::error::CmError;
use crate::pdata_pool::Held;
use crate::trace::TracePoint;
use crate::types::{CepId, MadAddress, WirePath};
use ibcm_iba::ack_timeout;

use super::{CmManager, Transmit, cached, guid_ari};

impl CmManager {
    pub(super) fn push_mad(&mut self, dest: MadAddress, header: MadHeader, message: CmMessage<'_>) {
        // A port that is down sends nothing (link.rs), here and in `resend`: what was
        // owed is re-sent by its retries or answered again by the peer's, once it is back.
        if self.down.contains(dest.port) {
            return;
        }
        let attr = message.attribute_id();
        let mad = CmMad { header, message };
        let mut buf = [0u8; MAD_SIZE];
        // Every field was validated when the user gave it; a failure here is a bug in
        // this crate, and dropping the MAD is the safe answer (the peer retries).
        if mad.emit(&mut buf).is_ok() {
            self.trace(TracePoint::Send {
                attribute: attr,
                dlid: dest.lid,
                tid: header.transaction_id,
                rej: match mad.message {
                    CmMessage::Rej(ref r) => Some(r.reason),
                    _ => None,
                },
            });
            self.transmits.push_back(Transmit { dest, mad: buf });
            Counters::bump(&mut self.counters.sent, attr);
        }
    }

    pub(super) fn build_req<'a>(&'a self, id: CepId, c: &'a Cep) -> Req<'a> {
        Req {
            local_comm_id: self.local_comm_id(id),
            vendor_id: 0,
            service_id: c.service_id,
            local_ca_guid: self.ca_guid_of(c.dest.port),
            local_qkey: 0,
            local_qpn: c.local_qpn,
            responder_resources: c.responder_resources,
            local_eecn: 0,
            initiator_depth: c.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: c.remote_cm_response_timeout,
            transport: c.transport,
            end_to_end_flow_control: c.flow_control,
            starting_psn: c.local_psn,
            local_cm_response_timeout: c.local_cm_response_timeout,
            retry_count: c.retry_count,
            partition_key: c.pkey,
            path_mtu: c.path_mtu,
            rdc_exists: false,
            rnr_retry_count: c.peer_rnr_retry,
            max_cm_retries: c.max_cm_retries,
            srq: c.srq,
            primary_path: c.primary.to_wire(c.ack_timeout),
            alternate_path: self.alternate_of(c).map_or_else(Default::default, |a| {
                a.to_wire(ack_timeout(a.packet_life_time, self.config.ca_ack_delay))
            }),
            sap_supported: false,
            private_data: cached(&self.pdata, c, AttributeId::Req),
        }
    }

    pub(super) fn build_rep<'a>(&'a self, id: CepId, c: &'a Cep) -> Rep<'a> {
        // An XRC target puts its QPN in LocalEEContext and sets SRQ (Linux `cm_format_rep`
        // for IB_QPT_XRC_TGT; the initiator reads it back with `cm_rep_get_qpn`).
        let xrc = c.transport == Transport::Xrc;
        Rep {
            local_comm_id: self.local_comm_id(id),
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: if xrc { 0 } else { c.local_qpn },
            local_eecn: if xrc { c.local_qpn } else { 0 },
            vendor_id: 0,
            starting_psn: c.local_psn,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            target_ack_delay: self.config.ca_ack_delay,
            failover_accepted: c.failover,
            end_to_end_flow_control: c.flow_control,
            rnr_retry_count: c.peer_rnr_retry,
            srq: c.srq || xrc,
            local_ca_guid: self.ca_guid_of(c.dest.port),
            private_data: cached(&self.pdata, c, AttributeId::Rep),
        }
    }

    /// Sends (again) the message a CEP has cached: the REQ, REP or DREQ being retried, or
    /// the MRA, REP, RTU or DREP that answers a duplicate.
    pub(super) fn resend(&mut self, id: CepId, attr: AttributeId) {
        let Some(c) = self.cep_any(id) else { return };
        let header = MadHeader::send(c.tid);
        let dest = c.dest;
        if self.down.contains(dest.port) {
            return;
        }
        let ids = CommIds {
            local_comm_id: self.local_comm_id(id),
            remote_comm_id: c.remote_comm_id,
            private_data: cached(&self.pdata, c, attr),
        };
        let message = match attr {
            AttributeId::Req => CmMessage::Req(self.build_req(id, c)),
            AttributeId::Rep => CmMessage::Rep(self.build_rep(id, c)),
            AttributeId::Rtu => CmMessage::Rtu(ids),
            AttributeId::Drep => CmMessage::Drep(ids),
            AttributeId::Dreq => CmMessage::Dreq(Dreq {
                local_comm_id: ids.local_comm_id,
                remote_comm_id: ids.remote_comm_id,
                remote_qpn_eecn: c.remote_qpn,
                private_data: ids.private_data,
            }),
            AttributeId::Mra => CmMessage::Mra(Mra {
                local_comm_id: ids.local_comm_id,
                remote_comm_id: ids.remote_comm_id,
                message_mraed: if c.state == State::Established {
                    MessageKind::Other
                } else if c.active {
                    MessageKind::Rep
                } else {
                    MessageKind::Req
                },
                service_timeout: c.mra_service_timeout,
                private_data: self.pdata.get(c.mra_pdata),
            }),
            AttributeId::Lap => CmMessage::Lap(self.build_lap(id, c)),
            AttributeId::Apr => CmMessage::Apr(ibcm_mad::Apr {
                local_comm_id: ids.local_comm_id,
                remote_comm_id: ids.remote_comm_id,
                status: ibcm_mad::AprStatus::from(c.apr_status),
                additional_info: self.pdata.get(c.apr_info),
                private_data: ids.private_data,
            }),
            AttributeId::SidrReq => CmMessage::SidrReq(ibcm_mad::SidrReq {
                request_id: ids.local_comm_id,
                partition_key: c.pkey,
                service_id: c.service_id,
                private_data: ids.private_data,
            }),
            AttributeId::SidrRep => CmMessage::SidrRep(ibcm_mad::SidrRep {
                request_id: c.remote_comm_id,
                status: ibcm_mad::SidrStatus::from(c.apr_status),
                vendor_id: 0,
                qpn: c.local_qpn,
                service_id: c.service_id,
                qkey: c.remote_psn,
                additional_info: self.pdata.get(c.apr_info),
                private_data: ids.private_data,
            }),
            _ => return,
        };
        // `message` borrows `c`, which borrows `self`: emit into a local buffer first.
        let mad = CmMad { header, message };
        let mut buf = [0u8; MAD_SIZE];
        if mad.emit(&mut buf).is_ok() {
            self.transmits.push_back(Transmit { dest, mad: buf });
        }
    }

    /// Sends a message now (first time) and caches its private data for a repeat. Fails
    /// with `NoResources`, changing nothing, if the private-data pool has no room.
    pub(super) fn send_cached(
        &mut self,
        id: CepId,
        attr: AttributeId,
        pdata: &[u8],
    ) -> Result<(), CmError> {
        self.cep_any(id).ok_or(CmError::UnknownCep)?;
        let held = self.store(pdata)?;
        self.send_held(id, attr, held);
        Ok(())
    }

    /// [`Self::send_cached`] with the private data already stored: cannot fail.
    pub(super) fn send_held(&mut self, id: CepId, attr: AttributeId, held: Held) {
        self.keep_cached(id, attr, held);
        self.resend(id, attr);
        if self
            .cep_any(id)
            .is_some_and(|c| !self.down.contains(c.dest.port))
        {
            Counters::bump(&mut self.counters.sent, attr);
        }
    }

    pub(super) fn send_rej_for(&mut self, id: CepId, reason: RejReason, message: MessageKind) {
        let port = self.cep_any(id).map_or(0, |c| c.dest.port);
        let guid = guid_ari(self.ca_guid_of(port));
        let ari: &[u8] = if reason == RejReason::Timeout {
            &guid
        } else {
            &[]
        };
        self.send_rej(id, reason, message, ari, &[]);
    }

    pub(super) fn send_rej(
        &mut self,
        id: CepId,
        reason: RejReason,
        message: MessageKind,
        ari: &[u8],
        pdata: &[u8],
    ) {
        let Some(c) = self.cep_any(id) else { return };
        let (dest, tid, remote) = (c.dest, c.tid, c.remote_comm_id);
        let rej = Rej {
            local_comm_id: self.local_comm_id(id),
            remote_comm_id: remote,
            message_rejected: message,
            reason,
            ari,
            private_data: pdata,
        };
        self.push_mad(dest, MadHeader::send(tid), CmMessage::Rej(rej));
    }

    /// A REJ not tied to a CEP (no listener, stale connection): echo the TID, name the
    /// peer's comm ID, give none of ours.
    pub(super) fn reply_rej(
        &mut self,
        src: &MadAddress,
        tid: u64,
        remote_comm_id: u32,
        message: MessageKind,
        reason: RejReason,
    ) {
        self.reply_rej_ari(src, tid, remote_comm_id, message, reason, &[]);
    }

    /// [`Self::reply_rej`] with additional rejection information (IBA Table 108).
    pub(super) fn reply_rej_ari(
        &mut self,
        src: &MadAddress,
        tid: u64,
        remote_comm_id: u32,
        message: MessageKind,
        reason: RejReason,
        ari: &[u8],
    ) {
        let rej = Rej {
            local_comm_id: 0,
            remote_comm_id,
            message_rejected: message,
            reason,
            ari,
            private_data: &[],
        };
        self.push_mad(*src, MadHeader::send(tid), CmMessage::Rej(rej));
    }
}
