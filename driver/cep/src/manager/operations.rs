//! The user's operations: create, listen, connect (REQ), MRA, pre-REP and REP, RTU,
//! established, reject. Each fails with a `CmError` and changes nothing, or succeeds.

use ibcm_mad::{AttributeId, Failover, MessageKind};

use crate::cep::{Backlog, LapState, State};
use crate::counters::Counters;
use crate::error::{CmError, check_len, check_max, check_width};
use crate::types::{
    CepId, ConnectParams, Instant, ListenParams, MadAddress, RejectParams, RepParams,
};
use ibcm_iba::{QpState, ack_timeout};

use super::alternate::Alt;
use super::{CmManager, PreparedRep, qp_attributes_of, transport_supported};

impl CmManager {
    pub(super) fn state_of(&self, id: CepId) -> Result<State, CmError> {
        Ok(self.user_cep(id)?.state)
    }

    pub(super) fn invalid(&self, id: CepId) -> CmError {
        match self.state(id) {
            Ok(state) => CmError::InvalidState { state },
            Err(e) => e,
        }
    }

    /// Creates an idle CEP.
    pub fn create(&mut self) -> Result<CepId, CmError> {
        self.alloc()
    }

    /// Makes an idle CEP listen. The compare buffer must fit the 92-byte REQ private data.
    pub fn listen(&mut self, id: CepId, params: ListenParams) -> Result<(), CmError> {
        if self.state_of(id)? != State::Idle {
            return Err(self.invalid(id));
        }
        if let Some((offset, bytes)) = &params.compare {
            let end = usize::from(*offset) + bytes.len();
            check_len(
                "listen compare offset + length",
                end,
                ibcm_mad::REQ_PRIVATE_DATA_SIZE,
            )?;
        }
        // No two listens may take the same REQ (listen.rs).
        if self.listens.overlapping(&params) {
            return Err(CmError::DuplicateListen);
        }
        self.listens.insert(id, params)?;
        self.set_state(id, State::Listen);
        Ok(())
    }

    /// Its user read the event of a REQ-created CEP: the CEP is the user's now (a listen
    /// destroyed no longer refuses it). It counts against the listen's backlog until
    /// answered (held.rs).
    pub fn take_request(&mut self, id: CepId) -> Result<(), CmError> {
        self.user_cep(id)?;
        if let Some(c) = self.cep_mut(id)
            && c.backlog_of.is_some()
            && c.backlog == Backlog::Reported
        {
            c.backlog = Backlog::Taken;
        }
        Ok(())
    }

    /// Sends a REQ from an idle CEP (active side).
    pub fn connect(
        &mut self,
        now: Instant,
        id: CepId,
        p: &ConnectParams<'_>,
    ) -> Result<(), CmError> {
        if self.state_of(id)? != State::Idle {
            return Err(self.invalid(id));
        }
        self.check_port_up(p.port)?;
        check_width("qpn", p.qpn.into(), 24)?;
        // The REQ the passive side would refuse (WinOF `__req_handler`): never send it.
        if p.qpn == 0 {
            return Err(CmError::Reserved {
                field: "qpn",
                value: 0,
            });
        }
        // Room to record the QPN binding the REQ makes (local_qpn.rs).
        self.reserve_local_qpn()?;
        if !transport_supported(p.transport) {
            let (service_type, extended) = p.transport.to_wire();
            return Err(CmError::Reserved {
                field: "transport",
                value: u64::from(service_type) << 8 | u64::from(extended),
            });
        }
        if let Some(psn) = p.starting_psn {
            check_width("starting_psn", psn.into(), 24)?;
        }
        check_max(
            "remote_cm_response_timeout",
            p.remote_cm_response_timeout,
            31,
        )?;
        check_max("local_cm_response_timeout", p.local_cm_response_timeout, 31)?;
        check_max("retry_count", p.retry_count, 7)?;
        check_max("rnr_retry_count", p.rnr_retry_count, 7)?;
        check_max("max_cm_retries", p.max_cm_retries, 15)?;
        check_max(
            "responder_resources",
            p.responder_resources,
            self.config.max_responder_resources,
        )?;
        check_max(
            "initiator_depth",
            p.initiator_depth,
            self.config.max_initiator_depth,
        )?;
        for path in core::iter::once(&p.primary_path).chain(p.alternate_path.iter()) {
            check_width("flow_label", path.flow_label.into(), 20)?;
            check_max("sl", path.sl, 15)?;
            check_max("packet_life_time", path.packet_life_time, 31)?;
            check_width("rate", u8::from(path.rate).into(), 6)?;
        }
        if let Some(alternate) = &p.alternate_path {
            self.check_alternate_source(p.port, alternate)?;
        }
        check_width("path_mtu", u8::from(p.path_mtu).into(), 4)?;
        check_len(
            "private_data",
            p.private_data.len(),
            ibcm_mad::REQ_PRIVATE_DATA_SIZE,
        )?;
        let held = self.store(p.private_data)?;
        let alternate = match self.store_path(p.alternate_path) {
            Ok(a) => a,
            Err(e) => {
                self.unstore(held);
                return Err(e);
            }
        };
        let psn = match p.starting_psn {
            Some(psn) => psn,
            None => self.random_psn(),
        };
        let tid = self.fresh_tid();
        let ack = ack_timeout(p.primary_path.packet_life_time, self.config.ca_ack_delay);
        if self.cep_any(id).is_none() {
            self.unstore(held);
            self.paths.free(alternate);
            return Err(CmError::UnknownCep);
        }
        // A reused CEP's last alternate paths go back.
        self.put_path(id, Alt::Loaded, alternate);
        self.drop_path(id, Alt::Pending);
        let Some(c) = self.cep_mut(id) else {
            self.unstore(held);
            return Err(CmError::UnknownCep);
        };
        c.active = true;
        c.tid = tid;
        c.dest = MadAddress {
            port: p.port,
            lid: p.primary_path.dlid,
            gid: p.primary_path.dgid,
            grh: !p.primary_path.subnet_local,
            sl: p.primary_path.sl,
            pkey: p.pkey,
        };
        c.service_id = p.service_id;
        c.local_qpn = p.qpn;
        c.local_psn = psn;
        c.remote_comm_id = 0;
        c.remote_ca_guid = 0;
        c.remote_qpn = 0;
        c.pkey = p.pkey;
        c.transport = p.transport;
        c.path_mtu = p.path_mtu;
        c.primary = p.primary_path;
        c.ack_timeout = ack;
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.retry_count = p.retry_count;
        c.peer_rnr_retry = p.rnr_retry_count;
        c.max_cm_retries = p.max_cm_retries;
        c.remote_cm_response_timeout = p.remote_cm_response_timeout;
        c.local_cm_response_timeout = p.local_cm_response_timeout;
        c.srq = p.srq;
        c.flow_control = p.flow_control;
        // A reused CEP starts afresh: no LAP of its last connection, not peer-to-peer
        // unless `connect_peer` says so again.
        c.lap = LapState::Idle;
        c.peer_to_peer = false;
        // IBA 12.7.36: wait 2 x packet life time + RemoteCMResponseTimeout.
        let base = c
            .round_trip_ns()
            .saturating_add(ibcm_mad::ib_time_ns(p.remote_cm_response_timeout).unwrap_or(0));
        self.set_state(id, State::ReqSent { mra_rcvd: false });
        self.send_held(id, AttributeId::Req, held);
        self.start_retry(id, now, base, p.max_cm_retries);
        Ok(())
    }

    /// Sends an MRA for the REQ (passive) or the REP (active) just received: once per
    /// message, before or after the pre-REP.
    ///
    /// After the manager's own MRA for a REQ its owner had not answered (waiting.rs), the
    /// owner's replaces it: it is kept for the repeats a duplicate REQ asks for, and not
    /// sent now, since a sender drops a second MRA for the same REQ (AL `__mra_handler`,
    /// al_cm_cep.c:1382-1386; Linux `cm_mra_handler` in IB_CM_MRA_REQ_RCVD counts it a
    /// duplicate). A second MRA of the owner's own fails as before.
    pub fn mra(
        &mut self,
        id: CepId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let state = self.state_of(id)?;
        if matches!(
            state,
            State::ReqRcvd { mra_sent: true } | State::RepPrepared { mra_sent: true }
        ) && self.user_cep(id)?.mra_by_manager
        {
            self.hold_mra(id, service_timeout, private_data)?;
            let c = self.cep_mut(id).ok_or(CmError::UnknownCep)?;
            c.mra_by_manager = false;
            return Ok(());
        }
        let next = match state {
            State::ReqRcvd { mra_sent: false } => State::ReqRcvd { mra_sent: true },
            State::RepPrepared { mra_sent: false } => State::RepPrepared { mra_sent: true },
            State::RepRcvd { mra_sent: false } => State::RepRcvd { mra_sent: true },
            State::Established => {
                let lap = self.user_cep(id)?.lap;
                let next = match lap {
                    LapState::Rcvd { mra_sent: false } => LapState::Rcvd { mra_sent: true },
                    LapState::AprPrepared { mra_sent: false } => {
                        LapState::AprPrepared { mra_sent: true }
                    }
                    _ => return Err(self.invalid(id)),
                };
                self.hold_mra(id, service_timeout, private_data)?;
                if let Some(c) = self.cep_mut(id) {
                    c.lap = next;
                }
                self.resend(id, AttributeId::Mra);
                Counters::bump(&mut self.counters.sent, AttributeId::Mra);
                return Ok(());
            }
            _ => return Err(self.invalid(id)),
        };
        self.hold_mra(id, service_timeout, private_data)?;
        self.resend(id, AttributeId::Mra);
        Counters::bump(&mut self.counters.sent, AttributeId::Mra);
        self.set_state(id, next);
        Ok(())
    }

    /// The MRA's checked service timeout and private data, kept for its sends and
    /// repeats. Not through `send_cached`: after the pre-REP that cache holds the REP's
    /// data.
    fn hold_mra(
        &mut self,
        id: CepId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        check_max("service_timeout", service_timeout, 31)?;
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::MRA_PRIVATE_DATA_SIZE,
        )?;
        let held = self.store(private_data)?;
        self.keep_mra(id, held);
        let c = self.cep_mut(id).ok_or(CmError::UnknownCep)?;
        c.mra_service_timeout = service_timeout;
        Ok(())
    }

    /// Pre-REP: validates and stores the REP, and returns the QP attributes for the
    /// INIT, RTR and RTS transitions. Nothing is sent until [`send_rep`](Self::send_rep).
    /// May be called again to re-format. The caller's read limits are taken as given or
    /// refused: over the CA's limits, or an InitiatorDepth over what the REQ offered
    /// ([`CmError::InitiatorDepthOverPeer`]).
    pub fn prepare_rep(&mut self, id: CepId, p: &RepParams<'_>) -> Result<PreparedRep, CmError> {
        self.pre_rep(id, p, true)
    }

    /// [`Self::prepare_rep`] reading the caller's read limits as WinOF AL does, for the
    /// `iba_cm` clients written against it (`__al_cep_pre_rep`, al_cm_cep.c:5049-5087):
    /// ResponderResources 0 keeps the REQ's InitiatorDepth (AL's "applications that do
    /// not set resp_res", :5060-5070) and more than the CA's limit is capped to it
    /// (:5072-5083); an InitiatorDepth over the REQ's ResponderResources is sent as
    /// given, as AL and Linux `ib_send_cm_rep` (cm.c:2287-2318) do. WinVerbs moved its QP
    /// to RTS with these values before `send_rep` (wv_ep.c:839-858) and ndfltr derives
    /// them from the REQ event (nd_ep.cpp:1178-1195): refusing would fail an accept AL
    /// makes, with no REJ to the peer.
    pub fn prepare_rep_as_al(
        &mut self,
        id: CepId,
        p: &RepParams<'_>,
    ) -> Result<PreparedRep, CmError> {
        let c = self.user_cep(id)?;
        let responder_resources = match p.responder_resources {
            0 => c.peer_initiator_depth,
            n => n,
        }
        .min(self.config.max_responder_resources);
        self.pre_rep(
            id,
            &RepParams {
                responder_resources,
                ..*p
            },
            false,
        )
    }

    fn pre_rep(
        &mut self,
        id: CepId,
        p: &RepParams<'_>,
        within_peer: bool,
    ) -> Result<PreparedRep, CmError> {
        let (mra_sent, reformat) = match self.state_of(id)? {
            State::ReqRcvd { mra_sent } => (mra_sent, false),
            State::RepPrepared { mra_sent } => (mra_sent, true),
            _ => return Err(self.invalid(id)),
        };
        let c = self.user_cep(id)?;
        // A re-formatted REP naming another QPN moves the CEP's QPN binding (local_qpn.rs).
        let rebind = (reformat && c.local_qpn != p.qpn)
            .then_some(((c.dest.port, c.local_qpn), c.owned.then_some(c.owner[0])));
        check_width("qpn", p.qpn.into(), 24)?;
        if let Some(psn) = p.starting_psn {
            check_width("starting_psn", psn.into(), 24)?;
        }
        check_max("rnr_retry_count", p.rnr_retry_count, 7)?;
        check_max(
            "responder_resources",
            p.responder_resources,
            self.config.max_responder_resources,
        )?;
        check_max(
            "initiator_depth",
            p.initiator_depth,
            self.config.max_initiator_depth,
        )?;
        if within_peer && p.initiator_depth > c.peer_responder_resources {
            return Err(CmError::InitiatorDepthOverPeer {
                requested: p.initiator_depth,
                peer: c.peer_responder_resources,
            });
        }
        check_width("failover_accepted", u8::from(p.failover_accepted).into(), 2)?;
        check_len(
            "private_data",
            p.private_data.len(),
            ibcm_mad::REP_PRIVATE_DATA_SIZE,
        )?;
        // Without a PSN of the caller's, the one chosen with the REQ: the RTR attributes
        // read before this pre-REP stay right.
        let psn = p.starting_psn.unwrap_or(c.local_psn);
        // Room to record the QPN binding this pre-REP makes (local_qpn.rs).
        self.reserve_local_qpn()?;
        let held = self.store(p.private_data)?;
        self.keep_cached(id, AttributeId::Rep, held);
        let Some(c) = self.cep_mut(id) else {
            return Err(CmError::UnknownCep);
        };
        c.local_qpn = p.qpn;
        c.local_psn = psn;
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.peer_rnr_retry = p.rnr_retry_count;
        c.failover = p.failover_accepted;
        // IBA Table 110: the REQ's alternate path is loaded only if accepted. Kept aside
        // (no LAP can be pending before the connection is established) so that a
        // re-formatted REP may still accept it. A move of references: nothing is stored.
        if p.failover_accepted == Failover::Accepted {
            if c.alternate.is_none() {
                c.alternate = c.pending_alternate.take();
            }
        } else if let Some(alt) = c.alternate.take() {
            c.pending_alternate = Some(alt);
        }
        c.flow_control = p.flow_control;
        c.srq = p.srq;
        self.set_state(id, State::RepPrepared { mra_sent });
        if let Some(((port, old), owner)) = rebind {
            self.move_local_qpn(port, old, p.qpn, owner);
        }
        let c = self.cep_any(id).ok_or(CmError::UnknownCep)?;
        let (alternate, port) = (self.alternate_of(c), self.alternate_port(c));
        Ok(PreparedRep {
            init: qp_attributes_of(c, QpState::Init, alternate, port),
            rtr: qp_attributes_of(c, QpState::Rtr, alternate, port),
            rts: qp_attributes_of(c, QpState::Rts, alternate, port),
        })
    }

    /// Sends the REP formatted by [`prepare_rep`](Self::prepare_rep).
    pub fn send_rep(&mut self, now: Instant, id: CepId) -> Result<(), CmError> {
        if !matches!(self.state_of(id)?, State::RepPrepared { .. }) {
            return Err(self.invalid(id));
        }
        self.owner_answers(now, id);
        self.leave_backlog(id);
        // The REQ's refused alternate path, if any, is forgotten now.
        self.drop_path(id, Alt::Pending);
        self.set_state(id, State::RepSent { mra_rcvd: false });
        self.resend(id, AttributeId::Rep);
        Counters::bump(&mut self.counters.sent, AttributeId::Rep);
        let Some(c) = self.cep_any(id) else {
            return Err(CmError::UnknownCep);
        };
        // The REQ's LocalCMResponseTimeout is how long the active side may take to answer.
        let base = c
            .round_trip_ns()
            .saturating_add(ibcm_mad::ib_time_ns(c.local_cm_response_timeout.min(31)).unwrap_or(0));
        let retries = c.max_cm_retries;
        self.start_retry(id, now, base, retries);
        Ok(())
    }

    /// Pre-REP and send in one step.
    pub fn accept(
        &mut self,
        now: Instant,
        id: CepId,
        p: &RepParams<'_>,
    ) -> Result<PreparedRep, CmError> {
        let prepared = self.prepare_rep(id, p)?;
        self.send_rep(now, id)?;
        Ok(prepared)
    }

    /// Sends the RTU after a REP (active side): the connection is established.
    pub fn rtu(&mut self, id: CepId, private_data: &[u8]) -> Result<(), CmError> {
        if !matches!(self.state_of(id)?, State::RepRcvd { .. }) {
            return Err(self.invalid(id));
        }
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::RTU_PRIVATE_DATA_SIZE,
        )?;
        self.send_cached(id, AttributeId::Rtu, private_data)?;
        self.set_state(id, State::Established);
        Ok(())
    }

    /// The QP received a packet before the RTU (communication established async event):
    /// the passive side is established.
    pub fn established(&mut self, id: CepId) -> Result<(), CmError> {
        if !matches!(self.state_of(id)?, State::RepSent { .. }) {
            return Err(self.invalid(id));
        }
        self.cancel_timer(id);
        self.set_state(id, State::Established);
        self.forget_handshake_pdata(id);
        Ok(())
    }

    /// Rejects the connection: a REQ or REP received (or, active side, a REQ in flight).
    pub fn reject(&mut self, now: Instant, id: CepId, p: &RejectParams<'_>) -> Result<(), CmError> {
        let state = self.state_of(id)?;
        let message = match state {
            State::ReqRcvd { .. } | State::RepPrepared { .. } => MessageKind::Req,
            State::RepRcvd { .. } => MessageKind::Rep,
            State::ReqSent { .. } | State::RepSent { .. } => MessageKind::Other,
            _ => return Err(self.invalid(id)),
        };
        check_width("reason", u16::from(p.reason).into(), 16)?;
        check_len("ari", p.ari.len(), ibcm_mad::REJ_ARI_SIZE)?;
        check_len(
            "private_data",
            p.private_data.len(),
            ibcm_mad::REJ_PRIVATE_DATA_SIZE,
        )?;
        self.owner_answers(now, id);
        self.send_rej(id, p.reason, message, p.ari, p.private_data);
        match state {
            // WinOF: REP_RCVD -> TIMEWAIT; Linux: -> IDLE. Our QP reached RTR, so timewait.
            State::RepRcvd { .. } | State::RepSent { .. } => self.enter_timewait(now, id),
            _ => self.end_attempt(id),
        }
        Ok(())
    }
}
