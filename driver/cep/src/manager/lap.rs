//! Path migration: LAP/APR (IBA 12.8) and the path-migrated notification, plus removal
//! of a port. WinOF lets only the active side send a LAP and Linux no longer sends one at
//! all; here either side of an established connection may.

use ibcm_mad::{AprStatus, AttributeId, Lap};

use super::CmManager;
use super::alternate::Alt;
use crate::cep::{LapState, State};
use crate::counters::Counters;
use crate::error::{CmError, check_len, check_max, check_width};
use crate::event::Event;
use crate::types::{CepId, Instant, PathRecord, PrivateData, WirePath};
use ibcm_iba::{QpAttributes, QpState, ack_timeout};

impl CmManager {
    pub(super) fn build_lap<'a>(&'a self, id: CepId, c: &'a crate::cep::Cep) -> Lap<'a> {
        let alt = self.pending_of(c).copied().unwrap_or_default();
        Lap {
            local_comm_id: self.local_comm_id(id),
            remote_comm_id: c.remote_comm_id,
            remote_qpn_eecn: c.remote_qpn,
            remote_cm_response_timeout: super::peer_response_timeout(c),
            // As a REQ's: 2 x PLT + this CA's ACK delay, the receiver's QP timeout.
            alternate_path: alt
                .to_wire(ack_timeout(alt.packet_life_time, self.config.ca_ack_delay)),
            private_data: super::cached(&self.pdata, c, AttributeId::Lap),
        }
    }

    /// Sends a LAP proposing `alternate` as the connection's alternate path. Completes
    /// with [`Event::AprReceived`] (or `Timeout { Lap }`); retried like a REQ.
    pub fn lap(
        &mut self,
        now: Instant,
        id: CepId,
        alternate: &PathRecord,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.user_cep(id)?;
        if c.state != State::Established || c.lap != LapState::Idle {
            return Err(self.invalid(id));
        }
        check_width("flow_label", alternate.flow_label.into(), 20)?;
        check_max("sl", alternate.sl, 15)?;
        check_max("packet_life_time", alternate.packet_life_time, 31)?;
        check_width("rate", u8::from(alternate.rate).into(), 6)?;
        self.check_alternate_source(c.dest.port, alternate)?;
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::LAP_PRIVATE_DATA_SIZE,
        )?;
        let held = self.store(private_data)?;
        let pending = match self.store_path(Some(*alternate)) {
            Ok(p) => p,
            Err(e) => {
                self.unstore(held);
                return Err(e);
            }
        };
        // Each LAP is a new transaction: its TID tells the peer a new LAP from a repeat of
        // the one it already answered.
        let tid = self.fresh_tid();
        self.put_path(id, Alt::Pending, pending);
        if let Some(c) = self.cep_mut(id) {
            c.lap = LapState::Sent { mra_rcvd: false };
            c.tid = tid;
        }
        self.send_held(id, AttributeId::Lap, held);
        let Some(c) = self.cep_any(id) else {
            return Err(CmError::UnknownCep);
        };
        // The peer's response time (the passive side: the REQ's LocalCMResponseTimeout).
        let base = c.round_trip_ns().saturating_add(
            ibcm_mad::ib_time_ns(super::peer_response_timeout(c).min(31)).unwrap_or(0),
        );
        let retries = c.max_cm_retries;
        self.start_retry(id, now, base, retries);
        Ok(())
    }

    pub(super) fn on_lap(&mut self, tid: u64, lap: &Lap<'_>) {
        self.received(AttributeId::Lap);
        let Some(id) = self.addressed(lap.remote_comm_id, lap.local_comm_id) else {
            self.unmatched(AttributeId::Lap);
            return;
        };
        let Some(c) = self.cep_any(id) else { return };
        if c.local_qpn != lap.remote_qpn_eecn {
            self.unmatched(AttributeId::Lap);
            return;
        }
        let (state, lap_state) = (c.state, c.lap);
        match (state, lap_state) {
            // IBA 12.8.1: a LAP in REP_SENT means the RTU was lost; the connection is
            // established.
            (State::RepSent { .. }, _) => {
                self.cancel_timer(id);
                self.set_state(id, State::Established);
            }
            (State::Established, LapState::Idle) => {
                // A LAP already answered by an APR (same transaction): repeat the APR.
                if self
                    .cep_any(id)
                    .is_some_and(|c| c.cached == Some(AttributeId::Apr) && c.tid == tid)
                {
                    self.duplicate(AttributeId::Lap);
                    self.resend(id, AttributeId::Apr);
                    return;
                }
            }
            (State::Established, LapState::Rcvd { mra_sent: true })
            | (State::Established, LapState::AprPrepared { mra_sent: true }) => {
                self.duplicate(AttributeId::Lap);
                self.resend(id, AttributeId::Mra);
                return;
            }
            _ => {
                self.duplicate(AttributeId::Lap);
                return;
            }
        }
        // No room for its path (fixed-room mode, DISPATCH_LEVEL): dropped, as Linux
        // `cm_lap_handler` and WinOF `__lap_handler` drop a LAP they cannot load; the
        // peer resends it (IBA 12.8: LAP retries until an APR or MRA) into the room the
        // passive work asked for makes. The connection keeps its paths.
        if !self.path_room_for(true) {
            return;
        }
        let alternate = PathRecord::from_peer(&lap.alternate_path);
        let Ok(pending) = self.store_path(Some(alternate)) else {
            return;
        };
        self.put_path(id, Alt::Pending, pending);
        if let Some(c) = self.cep_mut(id) {
            c.lap = LapState::Rcvd { mra_sent: false };
            c.tid = tid;
        }
        self.emit(
            id,
            Event::LapReceived {
                alternate_path: alternate,
                private_data: PrivateData::new(lap.private_data),
            },
        );
    }

    /// Pre-APR: records the answer to a LAP and, for status Success, returns the RTS
    /// attributes with the alternate path loaded and migration state REARM. Nothing is sent
    /// until [`send_apr`](Self::send_apr).
    pub fn prepare_apr(
        &mut self,
        id: CepId,
        status: AprStatus,
        info: &[u8],
        private_data: &[u8],
    ) -> Result<Option<QpAttributes>, CmError> {
        let c = self.user_cep(id)?;
        let mra_sent = match c.lap {
            LapState::Rcvd { mra_sent } | LapState::AprPrepared { mra_sent }
                if c.state == State::Established =>
            {
                mra_sent
            }
            _ => return Err(self.invalid(id)),
        };
        check_len(
            "additional_info",
            info.len(),
            ibcm_mad::APR_ADDITIONAL_INFO_SIZE,
        )?;
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::APR_PRIVATE_DATA_SIZE,
        )?;
        let (info, private_data) = self.store_two(info, private_data)?;
        self.keep_info(id, info);
        self.keep_cached(id, AttributeId::Apr, private_data);
        let Some(c) = self.cep_mut(id) else {
            return Err(CmError::UnknownCep);
        };
        c.apr_status = status.into();
        c.lap = LapState::AprPrepared { mra_sent };
        if status != AprStatus::Success {
            return Ok(None);
        }
        let c = self.cep_any(id).ok_or(CmError::UnknownCep)?;
        let pending = self.pending_of(c);
        let port = self.port_of_alternate(c, pending);
        Ok(Some(super::qp_attributes_of(
            c,
            QpState::Rts,
            pending,
            port,
        )))
    }

    /// Sends the APR formatted by [`prepare_apr`](Self::prepare_apr); on Success the
    /// alternate path becomes the connection's.
    pub fn send_apr(&mut self, id: CepId) -> Result<(), CmError> {
        let c = self.user_cep(id)?;
        if !matches!(c.lap, LapState::AprPrepared { .. }) || c.state != State::Established {
            return Err(self.invalid(id));
        }
        let success = c.apr_status == u8::from(AprStatus::Success);
        if success {
            self.load_pending(id);
        } else {
            self.drop_path(id, Alt::Pending);
        }
        if let Some(c) = self.cep_mut(id) {
            c.lap = LapState::Idle;
        }
        self.resend(id, AttributeId::Apr);
        Counters::bump(&mut self.counters.sent, AttributeId::Apr);
        Ok(())
    }

    pub(super) fn on_apr(&mut self, apr: &ibcm_mad::Apr<'_>) {
        self.received(AttributeId::Apr);
        let Some(id) = self.addressed(apr.remote_comm_id, apr.local_comm_id) else {
            self.unmatched(AttributeId::Apr);
            return;
        };
        let Some(c) = self.cep_any(id) else { return };
        if c.state != State::Established || !matches!(c.lap, LapState::Sent { .. }) {
            self.duplicate(AttributeId::Apr);
            return;
        }
        self.cancel_timer(id);
        if apr.status == AprStatus::Success {
            self.load_pending(id);
        } else {
            self.drop_path(id, Alt::Pending);
        }
        if let Some(c) = self.cep_mut(id) {
            c.lap = LapState::Idle;
        }
        let mut info = [0u8; 72];
        let len = apr.additional_info.len().min(72);
        if let (Some(d), Some(s)) = (info.get_mut(..len), apr.additional_info.get(..len)) {
            d.copy_from_slice(s);
        }
        self.emit(
            id,
            Event::AprReceived {
                status: apr.status,
                info,
                info_len: len as u8,
                private_data: PrivateData::new(apr.private_data),
            },
        );
    }

    /// The QP migrated to its alternate path (the path-migrated async event): primary and
    /// alternate swap, and the RTS attributes follow.
    pub fn migrate(&mut self, id: CepId) -> Result<(), CmError> {
        let c = self.user_cep(id)?;
        if c.state != State::Established || c.alternate.is_none() {
            return Err(self.invalid(id));
        }
        // The alternate path may leave from another port of the CA (APM across ports):
        // CM MADs then go out of that port, and its going down is what counts (link.rs).
        // Every lookup before the first change.
        let (from, to, alt) = match self.cep_any(id) {
            Some(c) => match self.alternate_of(c) {
                Some(alt) => (c.dest.port, self.alternate_port(c), *alt),
                None => return Err(CmError::UnknownCep),
            },
            None => return Err(CmError::UnknownCep),
        };
        if from != to {
            self.down.move_port(from, to);
        }
        // Primary and alternate swap: the path table's entry takes the old primary.
        let Some(c) = self.cep_mut(id) else {
            return Err(CmError::UnknownCep);
        };
        let old = core::mem::replace(&mut c.primary, alt);
        let entry = c.alternate;
        if let Some(e) = self.paths.get_mut(entry) {
            *e = old;
        }
        if let Some(c) = self.cep_mut(id) {
            c.dest.port = to;
            c.dest.lid = alt.dlid;
            c.dest.gid = alt.dgid;
            c.dest.grh = !alt.subnet_local;
            c.dest.sl = alt.sl;
            c.ack_timeout = c.path_ack_timeout(alt.packet_life_time);
        }
        Ok(())
    }

    /// The port went away (HCA or port removal): every CEP on it gets
    /// [`Event::DeviceRemoval`], its timers stop and nothing more is sent for it; its
    /// destroy needs no network. Listens bound to the port are removed too, and so are
    /// the port's GIDs and LIDs if [`Self::set_port`] told them. The whole walk at once:
    /// [`Self::remove_port_from`] is the bounded form a DISPATCH_LEVEL caller uses.
    pub fn remove_port(&mut self, port: u8) {
        let mut from = Some(0);
        while let Some(at) = from {
            from = self.remove_port_from(Some(port), at);
        }
    }

    /// [`Self::remove_port`] in slices, as [`Self::port_down`] is, for `port` or (None)
    /// every port (the CA is gone): one call looks at [`super::PORT_SCAN_SLOTS`] slots
    /// from slab index `from` (0 the first time, which also forgets the port's address
    /// and its down state) and returns where to go on (None: all seen). It collects nothing, so it allocates nothing for the walk (the
    /// removal holds the dispatch layer's spinlock at DISPATCH_LEVEL: one hold per call).
    /// A CEP bound to the port between two calls, behind the walk, is not ended here:
    /// its sends go nowhere (the caller unpublished the port first) and it ends by its
    /// own timers.
    #[must_use]
    pub fn remove_port_from(&mut self, port: Option<u8>, from: usize) -> Option<usize> {
        if from == 0 {
            for p in port.map_or(0..=u8::MAX, |p| p..=p) {
                self.forget_port_address(p);
                // A port added again under this number starts up (AL reports its state
                // right after IB_PNP_PORT_ADD, ib_al.h).
                self.down.set(p, false);
            }
        }
        let on_port = |p: u8| port.is_none_or(|port| port == p);
        let end = from
            .saturating_add(super::PORT_SCAN_SLOTS)
            .min(self.slots.len());
        for index in from..end {
            let hit = self.slots.get(index).and_then(|s| {
                let c = s.cep.as_ref()?;
                let id = self.id_at(index, s);
                let listen_on_port = c.state == State::Listen
                    && self
                        .listens
                        .get(id)
                        .and_then(|l| l.params.port)
                        .is_some_and(on_port);
                let bound = c.state != State::Listen
                    && c.state != State::Idle
                    && c.state != State::Removed
                    && on_port(c.dest.port);
                (bound || listen_on_port).then_some(id)
            });
            if let Some(id) = hit {
                self.end_on_removed_port(id);
            }
        }
        (end < self.slots.len()).then_some(end)
    }

    /// One CEP of a removed port: its timers, peer entry, SIDR and backlog places go, and
    /// it hears [`Event::DeviceRemoval`] (a detached one, with no owner to tell, is freed).
    fn end_on_removed_port(&mut self, id: CepId) {
        if let Some(c) = self.cep_mut(id) {
            c.owes_dreq = false;
        }
        self.cancel_timer(id);
        self.forget_peer(id);
        self.forget_sidr(id);
        self.leave_backlog(id);
        self.listens.remove(id);
        self.set_state(id, State::Removed);
        if self.cep_any(id).is_some_and(|c| c.detached) {
            self.release(id);
        } else {
            self.emit(id, Event::DeviceRemoval);
        }
    }
}
