//! Connection establishment as the passive and the active side receive it: REQ, REP,
//! RTU, MRA and REJ (IBA 12.6, 12.9.5, 12.9.8), stale connections (12.9.8.3.1).

use ibcm_mad::{
    AttributeId, CmMessage, CommIds, Failover, MadHeader, MessageKind, Mra, Rej, RejReason, Rep,
    Req, Transport,
};

use crate::cep::{Backlog, LapState, State};
use crate::event::{Event, RepInfo, ReqInfo};
use crate::types::{CepId, Instant, MadAddress, PathRecord, PrivateData, WirePath};

use super::alternate::Alt;
use super::{CmManager, message_rejected, rejected, transport_supported};

impl CmManager {
    pub(super) fn on_req(&mut self, now: Instant, src: &MadAddress, tid: u64, req: &Req<'_>) {
        self.received(AttributeId::Req);
        // WinOF `__req_handler` checks this first, before any lookup ("Reserved value.
        // Reject."): a transport this CM does not run (RD, which neither anchor supports,
        // or a reserved ExtendedTransportType, IBA Table 106) or LocalQPN 0 (QP0 is the
        // SMI's, never a connection's) gets REJ(InvalidTransportType).
        if !transport_supported(req.transport) || req.local_qpn == 0 {
            self.reply_rej(
                src,
                tid,
                req.local_comm_id,
                MessageKind::Req,
                RejReason::InvalidTransportType,
            );
            return;
        }
        let peer = (req.local_comm_id, req.local_ca_guid);
        if let Some(id) = self.remote_ids.get(&peer, &self.slots) {
            self.duplicate(AttributeId::Req);
            match self.cep_any(id).map(|c| c.state) {
                Some(State::ReqRcvd { mra_sent: true } | State::RepPrepared { mra_sent: true }) => {
                    self.repeat_mra(id);
                }
                Some(State::RepSent { .. }) => self.resend(id, AttributeId::Rep),
                // The connection this REQ asked for has come and gone (IBA 12.9.8.3.1).
                Some(State::Timewait) => {
                    self.reply_rej(
                        src,
                        tid,
                        req.local_comm_id,
                        MessageKind::Req,
                        RejReason::StaleConn,
                    );
                }
                _ => {}
            }
            return;
        }
        if let Some(old) = self
            .remote_qpns
            .get(&(req.local_qpn, req.local_ca_guid), &self.slots)
        {
            // The peer reuses a QPN we still associate with a connection (IBA 12.9.8.3.2).
            self.reply_rej(
                src,
                tid,
                req.local_comm_id,
                MessageKind::Req,
                RejReason::StaleConn,
            );
            self.end_stale(now, old);
            return;
        }
        // A crossing REQ (peer-to-peer): the side that stays active never stores its
        // alternate path; the other checks the room itself (peer.rs).
        if self.crossing_req(now, src, tid, req) {
            return;
        }
        // IBA 12.6.7 Table 108 reasons 12/13/18/19: a path that does not end at one of
        // this CA's ports (when the owner told them: `set_port`; Linux `cm_req_handler`).
        if let Some(r) = self.check_req_paths(src, req) {
            let ari = r.ari.get(..r.ari_len).unwrap_or(&[]);
            self.reply_rej_ari(src, tid, req.local_comm_id, MessageKind::Req, r.reason, ari);
            return;
        }
        let Some(listen_id) = self.listen_for(src.port, req) else {
            self.reply_rej(
                src,
                tid,
                req.local_comm_id,
                MessageKind::Req,
                RejReason::InvalidServiceId,
            );
            return;
        };
        let Some(listen) = self.listens.get(listen_id) else {
            return;
        };
        // Past the backlog the REQ is held, up to the cap (held.rs).
        let hold = listen.pending >= listen.params.backlog || listen.held.len() > 0;
        // Refused at once, before a CEP is taken: past the cap (a flood costs at most the
        // cap), or a wait too long for the sender (waiting.rs), who learns now.
        let over_cap = hold && listen.held.len() >= self.config.held_requests_per_listen;
        if over_cap {
            self.backlog_drop(AttributeId::Req);
        }
        if over_cap || self.wait_too_long() {
            self.reply_rej(
                src,
                tid,
                req.local_comm_id,
                MessageKind::Req,
                RejReason::NoResources,
            );
            return;
        }
        // No room for its alternate path (fixed-room mode, DISPATCH_LEVEL: the room
        // `prepare_for` made is used up): dropped before a CEP is taken, as a REQ that
        // finds no slot is; the sender retries into the room passive work makes. After
        // the listen lookup and the path checks, as Linux `cm_match_req` and WinOF
        // `__lookup_listen` (al_cm_cep.c:1153) come before any allocation: a REQ for no
        // listen gets InvalidServiceId whatever the room.
        if !self.path_room_for(req.alternate_path.is_present()) {
            return;
        }
        if hold && !self.room_to_hold() {
            self.backlog_drop(AttributeId::Req);
            return;
        }
        let Ok(id) = self.alloc_received() else {
            // Out of room: a held REQ asks for more (held.rs).
            self.held_short |= hold;
            self.backlog_drop(AttributeId::Req);
            return;
        };
        let event = self.take_req(now, id, listen_id, src, tid, req);
        if hold {
            self.hold(listen_id, id, event);
        } else {
            if let Some(l) = self.listens.get_mut(listen_id) {
                l.pending += 1;
                let (pending, backlog) = (l.pending, l.params.backlog);
                self.backlog_filling(pending, backlog);
            }
            if let Some(c) = self.cep_mut(id) {
                c.backlog_of = Some(listen_id);
                c.backlog = Backlog::Reported;
            }
            self.emit(id, event);
        }
        self.await_answer(now, id);
    }

    /// A CEP answers `req` (from a listen, or a peer-to-peer CEP that turned passive):
    /// it takes the peer's side of the connection from the REQ, enters REQ_RCVD and joins
    /// the peer lookups; returns the [`Event::ReqReceived`] naming `listen` to report.
    pub(super) fn take_req(
        &mut self,
        now: Instant,
        id: CepId,
        listen: CepId,
        src: &MadAddress,
        tid: u64,
        req: &Req<'_>,
    ) -> Event {
        let primary = PathRecord::from_peer(&req.primary_path);
        let alternate = req
            .alternate_path
            .is_present()
            .then(|| PathRecord::from_peer(&req.alternate_path));
        let ca_ack_delay = self.config.ca_ack_delay;
        // The REP's StartingPSN, chosen now so that the RTR attributes a client reads
        // before it formats the REP (WinVerbs, wv_ep.c:722-767) already name it; a REP
        // with a PSN of its own replaces it.
        let rep_psn = self.random_psn();
        let event = Event::ReqReceived(ReqInfo {
            port: src.port,
            listen,
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
            starting_psn: req.starting_psn,
            max_cm_retries: req.max_cm_retries,
            remote_cm_response_timeout: req.remote_cm_response_timeout,
            local_cm_response_timeout: req.local_cm_response_timeout,
            flow_control: req.end_to_end_flow_control,
            retry_count: req.retry_count,
            srq: req.srq,
            private_data: PrivateData::new(req.private_data),
        });
        // `on_req` checked the room (`path_room`): the store does not fail.
        let alternate = self.store_path(alternate).ok().flatten();
        self.put_path(id, Alt::Loaded, alternate);
        let Some(c) = self.cep_mut(id) else {
            return event;
        };
        c.active = false;
        c.local_psn = rep_psn;
        c.dest = *src;
        c.tid = tid;
        c.remote_comm_id = req.local_comm_id;
        c.remote_ca_guid = req.local_ca_guid;
        c.service_id = req.service_id;
        c.remote_qpn = req.local_qpn;
        c.remote_psn = req.starting_psn;
        c.pkey = req.partition_key;
        c.transport = req.transport;
        c.path_mtu = req.path_mtu;
        c.primary = primary;
        c.ack_timeout = c.path_ack_timeout(primary.packet_life_time);
        c.peer_responder_resources = req.responder_resources;
        c.peer_initiator_depth = req.initiator_depth;
        // Until the REP says otherwise the read limits are the REQ's, crossed: this side
        // accepts the reads the peer issues and issues what the peer accepts (WinOF
        // `__save_wire_req`, al_cm_cep.c:869, 875; Linux `cm_req_handler`).
        c.responder_resources = req.initiator_depth;
        c.initiator_depth = req.responder_resources;
        c.retry_count = req.retry_count;
        c.rnr_retry = req.rnr_retry_count;
        c.max_cm_retries = req.max_cm_retries;
        c.remote_cm_response_timeout = req.remote_cm_response_timeout;
        c.local_cm_response_timeout = req.local_cm_response_timeout;
        c.target_ack_delay = ca_ack_delay;
        c.srq = req.srq;
        c.flow_control = req.end_to_end_flow_control;
        self.set_state(id, State::ReqRcvd { mra_sent: false });
        self.stamp_arrival(now, id);
        self.remote_ids.insert(id, &self.slots);
        self.remote_qpns.insert(id, &self.slots);
        event
    }

    /// An older connection owns a QPN the peer reuses: it is stale (IBA 12.9.8.3.1).
    ///
    /// - Established: disconnect it with a DREQ, retried until the DREP or MaxCMRetries,
    ///   then timewait (Linux `cm_match_req` / `cm_rep_handler` -> `ib_send_cm_dreq`; the
    ///   DREQ's RemoteQPN is the connection's remote QPN, the one the REQ/REP reuses).
    ///   Its owner sees the DREP (or the DREQ's timeout) and then TimewaitExit.
    /// - Not yet established: REJ(StaleConn) to its peer, MessageRejected from its state
    ///   (WinOF `__process_stale`), reported to its owner, then timewait.
    /// - Already disconnecting or in timewait: nothing more.
    pub(super) fn end_stale(&mut self, now: Instant, old: CepId) {
        let Some(state) = self.cep_any(old).map(|c| c.state) else {
            return;
        };
        match state {
            State::Established => {
                // A DREQ with no private data needs no allocation and cannot fail.
                let _ = self.send_dreq(now, old, &[]);
            }
            State::ReqSent { .. }
            | State::ReqRcvd { .. }
            | State::RepPrepared { .. }
            | State::RepSent { .. }
            | State::RepRcvd { .. } => {
                let message = message_rejected(state);
                self.send_rej_for(old, RejReason::StaleConn, message);
                self.emit(old, rejected(RejReason::StaleConn, message, &[], &[]));
                self.enter_timewait(now, old);
            }
            State::DreqSent
            | State::DreqRcvd
            | State::Timewait
            | State::Idle
            | State::Listen
            | State::SidrReqSent
            | State::SidrReqRcvd
            | State::SidrRepSent
            | State::Removed => {}
        }
    }

    pub(super) fn on_rep(&mut self, now: Instant, src: &MadAddress, tid: u64, rep: &Rep<'_>) {
        self.received(AttributeId::Rep);
        let Some(id) = self.addressed(rep.remote_comm_id, rep.local_comm_id) else {
            self.unmatched(AttributeId::Rep);
            return;
        };
        let Some(c) = self.cep_any(id) else { return };
        match c.state {
            State::ReqSent { .. } => {}
            State::RepRcvd { mra_sent: true } => {
                self.duplicate(AttributeId::Rep);
                self.resend(id, AttributeId::Mra);
                return;
            }
            State::Established if c.active && c.cached == Some(AttributeId::Rtu) => {
                self.duplicate(AttributeId::Rep);
                self.resend(id, AttributeId::Rtu);
                return;
            }
            _ => {
                self.duplicate(AttributeId::Rep);
                return;
            }
        }
        // Linux `cm_rep_handler` "Check for duplicate REP": a (LocalCommID, CA GUID) that
        // already names another connection is not this REQ's answer (a stray or forged
        // REP); drop it rather than re-point that connection's lookup. The REQ retries.
        if self
            .remote_ids
            .get(&(rep.local_comm_id, rep.local_ca_guid), &self.slots)
            .is_some_and(|other| other != id)
        {
            self.duplicate(AttributeId::Rep);
            return;
        }
        // An XRC initiator finds the target's QPN in LocalEEContext (Linux `cm_rep_get_qpn`).
        let rep_qpn = if c.transport == Transport::Xrc {
            rep.local_eecn
        } else {
            rep.local_qpn
        };
        let peer_qpn = (rep_qpn, rep.local_ca_guid);
        if let Some(old) = self.remote_qpns.get(&peer_qpn, &self.slots) {
            // The passive side answers with a QPN another live connection uses. The REJ
            // names our comm ID too (Linux `cm_issue_rej` swaps the REP's IDs): the passive
            // CEP knows its peer, so a REJ from comm ID 0 would not reach it.
            let rej = Rej {
                local_comm_id: rep.remote_comm_id,
                remote_comm_id: rep.local_comm_id,
                message_rejected: MessageKind::Rep,
                reason: RejReason::StaleConn,
                ari: &[],
                private_data: &[],
            };
            self.push_mad(*src, MadHeader::send(tid), CmMessage::Rej(rej));
            self.end_stale(now, old);
            self.emit(
                id,
                rejected(RejReason::StaleConn, MessageKind::Rep, &[], &[]),
            );
            self.end_attempt(id);
            return;
        }
        self.cancel_timer(id);
        let Some(c) = self.cep_mut(id) else { return };
        c.remote_comm_id = rep.local_comm_id;
        c.remote_ca_guid = rep.local_ca_guid;
        c.remote_qpn = rep_qpn;
        c.remote_psn = rep.starting_psn;
        c.peer_responder_resources = rep.responder_resources;
        c.peer_initiator_depth = rep.initiator_depth;
        // The read limits cross over (Linux `cm_rep_handler`: initiator_depth =
        // REP.ResponderResources, responder_resources = REP.InitiatorDepth; WinOF
        // `__save_wire_rep`): this side issues no more RDMA reads than the passive side
        // accepts (RTS max_rd_atomic) and accepts as many as it issues (RTR
        // max_dest_rd_atomic).
        c.initiator_depth = rep.responder_resources;
        c.responder_resources = rep.initiator_depth;
        // IBA Table 110: an alternate path the passive side did not accept (1 not
        // supported, 2 rejected) is loaded into no QP state and cannot be migrated to.
        let refused = rep.failover_accepted != Failover::Accepted;
        c.target_ack_delay = rep.target_ack_delay;
        c.rnr_retry = rep.rnr_retry_count;
        c.failover = rep.failover_accepted;
        c.ack_timeout = c.path_ack_timeout(c.primary.packet_life_time);
        if refused {
            self.drop_path(id, Alt::Loaded);
        }
        self.set_state(id, State::RepRcvd { mra_sent: false });
        self.remote_ids.insert(id, &self.slots);
        self.remote_qpns.insert(id, &self.slots);
        self.emit(
            id,
            Event::RepReceived(RepInfo {
                remote_ca_guid: rep.local_ca_guid,
                remote_qpn: rep_qpn,
                remote_psn: rep.starting_psn,
                peer_responder_resources: rep.responder_resources,
                peer_initiator_depth: rep.initiator_depth,
                failover_accepted: rep.failover_accepted,
                rnr_retry_count: rep.rnr_retry_count,
                flow_control: rep.end_to_end_flow_control,
                target_ack_delay: rep.target_ack_delay,
                srq: rep.srq,
                private_data: PrivateData::new(rep.private_data),
            }),
        );
    }

    pub(super) fn on_rtu(&mut self, rtu: &CommIds<'_>) {
        self.received(AttributeId::Rtu);
        let Some(id) = self.addressed(rtu.remote_comm_id, rtu.local_comm_id) else {
            self.unmatched(AttributeId::Rtu);
            return;
        };
        if !matches!(
            self.cep_any(id).map(|c| c.state),
            Some(State::RepSent { .. })
        ) {
            self.duplicate(AttributeId::Rtu);
            return;
        }
        self.cancel_timer(id);
        self.set_state(id, State::Established);
        self.forget_handshake_pdata(id);
        self.emit(id, Event::RtuReceived(PrivateData::new(rtu.private_data)));
    }

    pub(super) fn on_mra(&mut self, now: Instant, mra: &Mra<'_>) {
        self.received(AttributeId::Mra);
        let Some(id) = self.addressed(mra.remote_comm_id, mra.local_comm_id) else {
            self.unmatched(AttributeId::Mra);
            return;
        };
        let Some(c) = self.cep_any(id) else { return };
        let next = match (c.state, mra.message_mraed) {
            (State::ReqSent { mra_rcvd: false }, MessageKind::Req) => {
                State::ReqSent { mra_rcvd: true }
            }
            (State::RepSent { mra_rcvd: false }, MessageKind::Rep) => {
                State::RepSent { mra_rcvd: true }
            }
            (State::Established, MessageKind::Other)
                if c.lap == (LapState::Sent { mra_rcvd: false }) =>
            {
                State::Established
            }
            _ => {
                // A repeated MRA extends nothing (Linux "apply MRA only once").
                self.duplicate(AttributeId::Mra);
                return;
            }
        };
        // IBA 12.6.6: wait ServiceTimeout + packet life time before the next retry.
        let wait = ibcm_mad::ib_time_ns(mra.service_timeout.min(31))
            .unwrap_or(0)
            .saturating_add(c.round_trip_ns() / 2);
        let deadline = c.retry.deadline;
        if let Some(c) = self.cep_mut(id)
            && next == State::Established
        {
            c.lap = LapState::Sent { mra_rcvd: true };
        }
        self.set_state(id, next);
        let at = now.add_nanos(wait).min(deadline.max(now));
        self.arm(id, at);
        self.emit(
            id,
            Event::MraReceived {
                service_timeout: mra.service_timeout,
                private_data: PrivateData::new(mra.private_data),
            },
        );
    }

    pub(super) fn on_rej(&mut self, now: Instant, src: &MadAddress, rej: &Rej<'_>) {
        self.received(AttributeId::Rej);
        let by_comm_id = (rej.remote_comm_id != 0)
            .then(|| self.addressed(rej.remote_comm_id, rej.local_comm_id))
            .flatten();
        // A REJ(Timeout) may name no comm ID of ours; its ARI is the sender's CA GUID.
        let by_guid = || {
            let guid = rej.ari.get(..8)?;
            let guid = u64::from_be_bytes(guid.try_into().ok()?);
            self.remote_ids.get(&(rej.local_comm_id, guid), &self.slots)
        };
        let Some(id) = by_comm_id.or_else(by_guid) else {
            self.unmatched(AttributeId::Rej);
            return;
        };
        // Found by the sender's comm ID and CA GUID, which anyone may write: the source
        // decides (source.rs; by our comm ID, `handle_mad` checked it already).
        if !self.sent_by_peer(id, src) {
            self.forged(AttributeId::Rej);
            return;
        }
        let Some(state) = self.cep_any(id).map(|c| c.state) else {
            return;
        };
        let event = rejected(rej.reason, rej.message_rejected, rej.ari, rej.private_data);
        let stale = rej.reason == RejReason::StaleConn;
        match state {
            State::ReqSent { .. }
                if rej.reason == RejReason::InvalidServiceId
                    && self.cep_any(id).is_some_and(|c| c.peer_to_peer) =>
            {
                // A peer-to-peer CEP whose peer has not started connecting yet keeps
                // retrying its REQ (as WinOF's p2p): the crossing REQ settles who answers.
            }
            // Before RTR no packet can be in flight; a stale REJ still quarantines the QPN.
            State::ReqSent { .. } | State::ReqRcvd { .. } | State::RepPrepared { .. } => {
                // WinOF drops a REJ in REQ_RCVD without an event; the consumer then only
                // learns when its REP fails. Linux reports it, and so do we.
                self.emit(id, event);
                if stale {
                    self.enter_timewait(now, id);
                } else {
                    self.end_attempt(id);
                }
            }
            // From RTR on, the QP may have seen packets: always through timewait (Linux
            // goes to IDLE from REP_SENT; timewait is the safe choice for QP reuse).
            State::RepSent { .. }
            | State::RepRcvd { .. }
            | State::Established
            | State::DreqSent
            | State::DreqRcvd => {
                self.emit(id, event);
                self.enter_timewait(now, id);
            }
            State::Idle
            | State::Listen
            | State::Timewait
            | State::SidrReqSent
            | State::SidrReqRcvd
            | State::SidrRepSent
            | State::Removed => {
                self.duplicate(AttributeId::Rej);
            }
        }
    }
}
