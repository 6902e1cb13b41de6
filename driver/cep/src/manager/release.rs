//! Connection release: DREQ and DREP received and sent (IBA 12.6.11-12, 12.9.6), and
//! destroy.

use ibcm_mad::{AttributeId, CmMessage, CommIds, Dreq, MadHeader, MessageKind, RejReason};

use crate::cep::{Backlog, State};
use crate::error::{CmError, check_len};
use crate::event::Event;
use crate::types::{CepId, Instant, MadAddress, PrivateData};

use super::{CmManager, peer_response_timeout};

impl CmManager {
    pub(super) fn on_dreq(&mut self, now: Instant, src: &MadAddress, tid: u64, dreq: &Dreq<'_>) {
        self.received(AttributeId::Dreq);
        let target = self
            .addressed(dreq.remote_comm_id, dreq.local_comm_id)
            .filter(|&id| {
                self.cep_any(id).is_some_and(|c| {
                    c.remote_comm_id == dreq.local_comm_id && c.local_qpn == dreq.remote_qpn_eecn
                })
            });
        let Some(id) = target else {
            // IBA 12.9.8.5: an unknown or mismatched DREQ gets an unaffiliated DREP.
            let drep = CommIds {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: &[],
            };
            self.push_mad(*src, MadHeader::send(tid), CmMessage::Drep(drep));
            return;
        };
        match self.cep_any(id).map(|c| c.state) {
            // A DREQ in REP_SENT means the RTU was lost: the connection was established.
            Some(State::RepSent { .. } | State::Established | State::DreqSent) => {
                self.cancel_timer(id);
                if let Some(c) = self.cep_mut(id) {
                    c.tid = tid;
                    c.drep_rcvd = false;
                }
                self.set_state(id, State::DreqRcvd);
                if self.cep_any(id).is_some_and(|c| c.detached) {
                    // Destroyed in DREQ_SENT (a simultaneous disconnect): no owner is left
                    // to answer, so answer now as `destroy` does in DREQ_RCVD.
                    let _ = self.send_cached(id, AttributeId::Drep, &[]);
                    self.enter_timewait(now, id);
                } else {
                    self.emit(id, Event::DreqReceived(PrivateData::new(dreq.private_data)));
                }
            }
            // TIMEWAIT + DREQ -> DREP (IBA 12.9.6; Linux re-sends the saved DREP), also when
            // this side sent the DREQ (DREP received, or DREQ timed out: WinOF pre-formats a
            // DREP then), with no private data. Past timewait (idle) the peer's retry means
            // our DREP was lost: answer it, as an unknown comm ID would be.
            Some(State::Timewait | State::Idle) => {
                self.duplicate(AttributeId::Dreq);
                self.resend(id, AttributeId::Drep);
            }
            _ => self.duplicate(AttributeId::Dreq),
        }
    }

    pub(super) fn on_drep(&mut self, now: Instant, drep: &CommIds<'_>) {
        self.received(AttributeId::Drep);
        let Some(id) = self.addressed(drep.remote_comm_id, drep.local_comm_id) else {
            self.unmatched(AttributeId::Drep);
            return;
        };
        match self.cep_any(id).map(|c| c.state) {
            Some(State::DreqSent) => {
                self.emit(id, Event::DrepReceived(PrivateData::new(drep.private_data)));
                self.enter_timewait(now, id);
            }
            // Simultaneous disconnect: the peer answered our DREQ while ours is still
            // owed; the consumer's DREP ends it. Reported once: a duplicate DREP is not.
            Some(State::DreqRcvd) if self.cep_any(id).is_some_and(|c| !c.drep_rcvd) => {
                if let Some(c) = self.cep_mut(id) {
                    c.drep_rcvd = true;
                }
                self.emit(id, Event::DrepReceived(PrivateData::new(drep.private_data)));
            }
            _ => self.duplicate(AttributeId::Drep),
        }
    }

    /// Sends a DREQ on an established connection.
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: CepId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if self.state_of(id)? != State::Established {
            return Err(self.invalid(id));
        }
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::DREQ_PRIVATE_DATA_SIZE,
        )?;
        self.send_dreq(now, id, private_data)
    }

    pub(super) fn send_dreq(
        &mut self,
        now: Instant,
        id: CepId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let held = self.store(private_data)?;
        self.cancel_timer(id);
        self.set_state(id, State::DreqSent);
        self.send_held(id, AttributeId::Dreq, held);
        let Some(c) = self.cep_any(id) else {
            return Err(CmError::UnknownCep);
        };
        // The peer's response time: the passive side waits the REQ's LocalCMResponseTimeout.
        let base = c
            .round_trip_ns()
            .saturating_add(ibcm_mad::ib_time_ns(peer_response_timeout(c).min(31)).unwrap_or(0));
        let retries = c.max_cm_retries;
        self.start_retry(id, now, base, retries);
        Ok(())
    }

    /// Answers a DREQ: the connection enters timewait.
    pub fn drep(&mut self, now: Instant, id: CepId, private_data: &[u8]) -> Result<(), CmError> {
        if self.state_of(id)? != State::DreqRcvd {
            return Err(self.invalid(id));
        }
        check_len(
            "private_data",
            private_data.len(),
            ibcm_mad::DREP_PRIVATE_DATA_SIZE,
        )?;
        self.send_cached(id, AttributeId::Drep, private_data)?;
        self.enter_timewait(now, id);
        Ok(())
    }

    /// Destroys a CEP. It never waits: a connection still up is torn down in the
    /// background (REJ, DREQ or DREP as its state requires, then timewait) and reports
    /// nothing more; its slot is freed when that ends.
    pub fn destroy(&mut self, now: Instant, id: CepId) -> Result<(), CmError> {
        let state = self.state_of(id)?;
        self.owner_answers(now, id);
        self.leave_backlog(id);
        if let Some(c) = self.cep_mut(id) {
            c.detached = true;
        }
        match state {
            State::Idle => {
                self.cancel_timer(id);
                self.release(id);
            }
            State::Listen => {
                let mut left = self
                    .listens
                    .remove(id)
                    .map_or(0, |l| l.pending.saturating_add(l.held.len()));
                // Requests nobody took from this listen (held, or reported and not read)
                // can never be answered: refuse them now rather than let the peers time
                // out. Those its user took are the user's, counted against nothing now.
                // The slab is walked by index (no list of them is allocated: this runs
                // under the dispatch layer's lock, where memory may be short) and only
                // while some remain.
                let mut index = 0;
                while left > 0 && index < self.slots.len() {
                    let counted = self.slots.get(index).and_then(|s| {
                        let c = s.cep.as_ref()?;
                        (c.backlog_of == Some(id)).then(|| (self.id_at(index, s), c.backlog))
                    });
                    if let Some((cep, place)) = counted {
                        left -= 1;
                        if place == Backlog::Taken {
                            if let Some(c) = self.cep_mut(cep) {
                                c.backlog_of = None;
                            }
                        } else {
                            let _ = self.destroy(now, cep);
                        }
                    }
                    index += 1;
                }
                self.release(id);
            }
            State::ReqSent { .. } => {
                // Linux `cm_destroy_id`: tell the passive side with REJ(Timeout).
                self.send_rej_for(id, RejReason::Timeout, MessageKind::Other);
                self.end_attempt(id);
            }
            State::ReqRcvd { .. } | State::RepPrepared { .. } => {
                self.send_rej(id, RejReason::ConsumerDefined, MessageKind::Req, &[], &[]);
                self.end_attempt(id);
            }
            State::RepSent { .. } | State::RepRcvd { .. } => {
                let message = if state == (State::RepRcvd { mra_sent: false })
                    || state == (State::RepRcvd { mra_sent: true })
                {
                    MessageKind::Rep
                } else {
                    MessageKind::Other
                };
                self.send_rej(id, RejReason::ConsumerDefined, message, &[], &[]);
                self.enter_timewait(now, id);
            }
            State::Established => {
                // A DREQ with no private data needs no allocation and cannot fail.
                let _ = self.send_dreq(now, id, &[]);
            }
            State::DreqRcvd => {
                let _ = self.send_cached(id, AttributeId::Drep, &[]);
                self.enter_timewait(now, id);
            }
            State::DreqSent | State::Timewait => {}
            State::SidrReqRcvd => {
                // Linux `ib_destroy_cm_id` in SIDR_REQ_RCVD: answer with status Reject.
                self.send_sidr_rep_status(id, ibcm_mad::SidrStatus::Reject);
                self.end_sidr(id);
            }
            // Answered: it lingers, ownerless, to repeat its answer, and is freed when that
            // ends.
            State::SidrRepSent => {}
            State::SidrReqSent | State::Removed => self.end_sidr(id),
        }
        Ok(())
    }
}
