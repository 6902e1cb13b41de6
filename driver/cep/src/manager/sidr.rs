//! SIDR: service ID resolution for UD (IBA 12.11). The requester's SIDR_REQ is retried
//! like a REQ; a listen matches it as it would a REQ; duplicates (same request ID from the
//! same source) are answered once, and a repeat after the answer gets the same SIDR_REP;
//! no listener gets status Unsupported.

use ibcm_mad::{AttributeId, CmMessage, MadHeader, SidrRep, SidrReq, SidrStatus};

use super::CmManager;
use crate::cep::{Backlog, State};
use crate::error::{CmError, check_len, check_width};
use crate::event::{Event, SidrRepInfo, SidrReqInfo};
use crate::types::{CepId, Instant, MadAddress, PathRecord, PrivateData};

/// A SIDR_REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrParams<'a> {
    /// The service to resolve.
    pub service_id: u64,
    /// Local port.
    pub port: u8,
    /// Partition key.
    pub pkey: u16,
    /// The path to the node that offers the service.
    pub path: PathRecord,
    /// How long the responder may take (5-bit IB time).
    pub timeout: u8,
    /// Retries after the first send (4 bits).
    pub max_retries: u8,
    /// Private data (<= 216 bytes).
    pub private_data: &'a [u8],
}

/// A SIDR_REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReplyParams<'a> {
    /// Status.
    pub status: SidrStatus,
    /// The service's UD QPN (24 bits).
    pub qpn: u32,
    /// The service's Q_Key.
    pub qkey: u32,
    /// Additional information (<= 72 bytes).
    pub info: &'a [u8],
    /// Private data (<= 136 bytes).
    pub private_data: &'a [u8],
}

/// How long an answered SIDR_REQ is remembered so a repeat gets the same answer.
const SIDR_LINGER_NS: u64 = 4_000_000_000;

impl CmManager {
    /// Sends a SIDR_REQ from an idle CEP; completes with [`Event::SidrRepReceived`] or
    /// `Timeout { SidrReq }`.
    pub fn sidr_request(
        &mut self,
        now: Instant,
        id: CepId,
        p: &SidrParams<'_>,
    ) -> Result<(), CmError> {
        if self.user_cep(id)?.state != State::Idle {
            return Err(self.invalid(id));
        }
        self.check_port_up(p.port)?;
        crate::error::check_max("timeout", p.timeout, 31)?;
        crate::error::check_max("max_retries", p.max_retries, 15)?;
        check_len(
            "private_data",
            p.private_data.len(),
            ibcm_mad::SIDR_REQ_PRIVATE_DATA_SIZE,
        )?;
        let held = self.store(p.private_data)?;
        let tid = self.fresh_tid();
        let Some(c) = self.cep_mut(id) else {
            self.unstore(held);
            return Err(CmError::UnknownCep);
        };
        c.active = true;
        c.tid = tid;
        c.service_id = p.service_id;
        c.pkey = p.pkey;
        c.primary = p.path;
        c.dest = MadAddress {
            port: p.port,
            lid: p.path.dlid,
            gid: p.path.dgid,
            grh: !p.path.subnet_local,
            sl: p.path.sl,
            pkey: p.pkey,
        };
        let base = c
            .round_trip_ns()
            .saturating_add(ibcm_mad::ib_time_ns(p.timeout).unwrap_or(0));
        self.set_state(id, State::SidrReqSent);
        self.send_held(id, AttributeId::SidrReq, held);
        self.start_retry(id, now, base, p.max_retries);
        Ok(())
    }

    /// Answers a SIDR_REQ reported by [`Event::SidrReqReceived`].
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        id: CepId,
        p: &SidrReplyParams<'_>,
    ) -> Result<(), CmError> {
        if self.user_cep(id)?.state != State::SidrReqRcvd {
            return Err(self.invalid(id));
        }
        check_width("qpn", p.qpn.into(), 24)?;
        check_len(
            "info",
            p.info.len(),
            ibcm_mad::SIDR_REP_ADDITIONAL_INFO_SIZE,
        )?;
        check_len(
            "private_data",
            p.private_data.len(),
            ibcm_mad::SIDR_REP_PRIVATE_DATA_SIZE,
        )?;
        let (info, private_data) = self.store_two(p.info, p.private_data)?;
        self.keep_info(id, info);
        let Some(c) = self.cep_mut(id) else {
            self.unstore(private_data);
            return Err(CmError::UnknownCep);
        };
        c.apr_status = p.status.into();
        c.local_qpn = p.qpn;
        // The Q_Key rides in the otherwise unused remote PSN of a SIDR CEP.
        c.remote_psn = p.qkey;
        self.leave_backlog(id);
        self.send_held(id, AttributeId::SidrRep, private_data);
        self.set_state(id, State::SidrRepSent);
        self.arm(id, now.add_nanos(SIDR_LINGER_NS));
        Ok(())
    }

    pub(super) fn send_sidr_rep_status(&mut self, id: CepId, status: SidrStatus) {
        if let Some(c) = self.cep_mut(id) {
            c.apr_status = status.into();
            c.cached = None;
        }
        self.keep_info(id, crate::pdata_pool::Held::NONE);
        self.resend(id, AttributeId::SidrRep);
    }

    /// The SIDR exchange is over: forget it, and free the CEP if nobody owns it (a CEP
    /// its owner holds -- the requester, or the one SidrReqReceived handed out -- goes
    /// back to idle and stays the owner's until destroyed).
    pub(super) fn end_sidr(&mut self, id: CepId) {
        self.cancel_timer(id);
        self.forget_sidr(id);
        self.leave_backlog(id);
        let detached = self.cep_any(id).is_some_and(|c| c.detached);
        if detached {
            self.release(id);
        } else {
            self.set_state(id, State::Idle);
        }
    }

    pub(super) fn forget_sidr(&mut self, id: CepId) {
        self.sidr_requests.retain(|_, v| *v != id);
    }

    pub(super) fn on_sidr_req(
        &mut self,
        _now: Instant,
        src: &MadAddress,
        tid: u64,
        req: &SidrReq<'_>,
    ) {
        self.received(AttributeId::SidrReq);
        let key = (req.request_id, src.gid, src.lid);
        if let Some(&id) = self.sidr_requests.get(&key) {
            let answered = self
                .cep_any(id)
                .is_some_and(|c| c.state == State::SidrRepSent);
            if answered && self.cep_any(id).is_some_and(|c| c.tid != tid) {
                // Same request ID, new transaction: the requester reused its CEP for a new
                // request, which the old answer does not answer.
                self.end_sidr(id);
            } else {
                self.duplicate(AttributeId::SidrReq);
                if answered {
                    self.resend(id, AttributeId::SidrRep);
                }
                return;
            }
        }
        let taker = self
            .listens
            .taker(src.port, req.service_id, req.private_data);
        let Some(listen) = taker.and_then(|id| self.listens.get(id)) else {
            let rep = SidrRep {
                request_id: req.request_id,
                status: SidrStatus::Unsupported,
                vendor_id: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                additional_info: &[],
                private_data: &[],
            };
            self.push_mad(*src, MadHeader::send(tid), CmMessage::SidrRep(rep));
            return;
        };
        let listen_id = listen.cep;
        if listen.pending >= listen.params.backlog {
            self.backlog_drop(AttributeId::SidrReq);
            return;
        }
        if self.sidr_requests.try_reserve(1).is_err() {
            self.backlog_drop(AttributeId::SidrReq);
            return;
        }
        let Ok(id) = self.alloc_received() else {
            self.backlog_drop(AttributeId::SidrReq);
            return;
        };
        if let Some(l) = self.listens.get_mut(listen_id) {
            l.pending += 1;
        }
        let Some(c) = self.cep_mut(id) else { return };
        c.backlog_of = Some(listen_id);
        c.backlog = Backlog::Reported;
        c.dest = *src;
        c.tid = tid;
        c.remote_comm_id = req.request_id;
        c.service_id = req.service_id;
        c.pkey = req.partition_key;
        self.set_state(id, State::SidrReqRcvd);
        self.sidr_requests.insert(key, id);
        self.emit(
            id,
            Event::SidrReqReceived(SidrReqInfo {
                listen: listen_id,
                port: src.port,
                service_id: req.service_id,
                pkey: req.partition_key,
                source: *src,
                private_data: PrivateData::new(req.private_data),
            }),
        );
    }

    pub(super) fn on_sidr_rep(&mut self, rep: &SidrRep<'_>) {
        self.received(AttributeId::SidrRep);
        let id = self.id_from_wire(rep.request_id);
        let Some((id, c)) = id.and_then(|id| Some((id, self.cep_any(id)?))) else {
            self.unmatched(AttributeId::SidrRep);
            return;
        };
        if c.state != State::SidrReqSent {
            self.duplicate(AttributeId::SidrRep);
            return;
        }
        let mut info = [0u8; 72];
        let len = rep.additional_info.len().min(72);
        if let (Some(d), Some(s)) = (info.get_mut(..len), rep.additional_info.get(..len)) {
            d.copy_from_slice(s);
        }
        self.emit(
            id,
            Event::SidrRepReceived(SidrRepInfo {
                status: rep.status,
                qpn: rep.qpn,
                qkey: rep.qkey,
                info,
                info_len: len as u8,
                private_data: PrivateData::new(rep.private_data),
            }),
        );
        self.end_sidr(id);
    }
}
