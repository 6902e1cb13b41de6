//! Receiving: parse, route a MAD to its CEP (IBA 12.9.3, comm ID and CA GUID) and count
//! what is dropped; ClassPortInfo.

use ibcm_mad::{AttributeId, ClassPortInfo, CmMad, CmMessage, MadHeader, Method, Req};

use crate::counters::Counters;
use crate::trace::{DropReason, TracePoint};
use crate::types::{CepId, Instant, MadAddress};

use super::CmManager;

impl CmManager {
    /// Starts loading what [`handle_mad`](Self::handle_mad) will read for this MAD (the
    /// CEP it names; for a REQ, the lookups of its peer), and handles nothing.
    ///
    /// With many CEPs, the one a MAD names is seldom in the cache, and `handle_mad` waits
    /// for memory (at 10^6 connections that wait is most of its cost). An owner that
    /// receives MADs in batches (one completion-queue poll) may call this for each MAD of
    /// the batch, then `handle_mad` for each: the batch's cache misses then overlap
    /// instead of adding up. Any buffer is harmless; skipping the call changes only speed.
    pub fn prefetch(&self, mad: &[u8]) {
        let be32 = |at: usize| {
            mad.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes)
        };
        let attribute = mad
            .get(16..18)
            .and_then(|b| b.try_into().ok())
            .map(u16::from_be_bytes);
        let id = match attribute {
            // REQ: LocalCommID, LocalCAGUID and LocalQPN (CM data offsets 0, 16 and 32).
            Some(0x0010) => {
                let guid = mad
                    .get(40..48)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes);
                let (Some(comm), Some(guid), Some(qpn)) = (be32(24), guid, be32(56)) else {
                    return;
                };
                core::hint::black_box(self.remote_qpns.get(&(qpn >> 8, guid), &self.slots));
                self.remote_ids
                    .get(&(comm, guid), &self.slots)
                    .map(|id| id.index())
            }
            // Every other connection message: RemoteCommID at CM data offset 4.
            Some(0x0011..=0x0016 | 0x0019 | 0x001a) => {
                be32(28).and_then(|w| self.index_from_wire(w))
            }
            _ => None,
        };
        if let Some(slot) = id.and_then(|i| self.slots.get(i)) {
            // The generation and the CEP's hot fields fill the slot's first 64 bytes; the
            // handle of its cached private data follows them (a repeat reads both).
            let pdata = slot.cep.as_ref().map_or(0, |c| c.pdata.len());
            core::hint::black_box((slot.generation, pdata));
        }
    }

    /// Handles one MAD received on QP1 from `src` (the port it arrived on and the sender's
    /// address). Malformed MADs, unknown CEPs and wrong states are counted and dropped;
    /// nothing here panics or allocates once the manager is warm.
    pub fn handle_mad(&mut self, now: Instant, src: &MadAddress, mad: &[u8]) {
        // A port that is down receives nothing (link.rs): a MAD said to come from it
        // was in flight before it went down.
        if self.down.contains(src.port) {
            return;
        }
        let parsed = match CmMad::parse(mad) {
            Ok(m) => m,
            Err(e) => {
                self.counters.malformed += 1;
                self.trace(TracePoint::Drop {
                    attribute: mad
                        .get(16..18)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u16::from_be_bytes),
                    reason: DropReason::Malformed(e),
                });
                return;
            }
        };
        let tid = parsed.header.transaction_id;
        if matches!(
            parsed.message,
            CmMessage::Rej(_) | CmMessage::Apr(_) | CmMessage::SidrRep(_)
        ) && CmMad::length_clamped(mad)
        {
            // Handled with the length clamped to 72 (never dropped: see `Rej::parse`).
            self.counters.clamped_lengths += 1;
        }
        if self.drop_if_forged(src, &parsed.message) {
            return;
        }
        match parsed.message {
            CmMessage::Req(m) => self.on_req(now, src, tid, &m),
            CmMessage::Mra(m) => self.on_mra(now, &m),
            CmMessage::Rej(m) => self.on_rej(now, src, &m),
            CmMessage::Rep(m) => self.on_rep(now, src, tid, &m),
            CmMessage::Rtu(m) => self.on_rtu(&m),
            CmMessage::Dreq(m) => self.on_dreq(now, src, tid, &m),
            CmMessage::Drep(m) => self.on_drep(now, &m),
            CmMessage::Lap(m) => self.on_lap(tid, &m),
            CmMessage::Apr(m) => self.on_apr(&m),
            CmMessage::SidrReq(m) => self.on_sidr_req(now, src, tid, &m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(&m),
            CmMessage::ClassPortInfo(_) if parsed.header.method == Method::Get => {
                self.on_class_port_info(src, parsed.header);
            }
            other => self.unmatched(other.attribute_id()),
        }
    }

    pub(super) fn received(&mut self, attr: AttributeId) {
        Counters::bump(&mut self.counters.received, attr);
    }

    pub(super) fn duplicate(&mut self, attr: AttributeId) {
        Counters::bump(&mut self.counters.duplicates, attr);
        self.trace(TracePoint::Duplicate { attribute: attr });
    }

    /// A MAD that names no CEP, or one whose state does not take it: counted and dropped.
    pub(super) fn unmatched(&mut self, attr: AttributeId) {
        self.counters.unmatched += 1;
        self.trace(TracePoint::Drop {
            attribute: attr.into(),
            reason: DropReason::Unmatched,
        });
    }

    /// A REQ or SIDR_REQ for a listen with no room: dropped silently so the peer retries.
    pub(super) fn backlog_drop(&mut self, attr: AttributeId) {
        self.counters.backlog_drops += 1;
        self.trace(TracePoint::Drop {
            attribute: attr.into(),
            reason: DropReason::BacklogFull,
        });
    }

    /// A CEP named by a message's RemoteCommID whose peer is the message's sender (once
    /// the peer's comm ID is known).
    /// One slot read: a RemoteCommID outside this manager's space (fixed bits, 0) or of
    /// another generation (all its bits, src/comm_id.rs) names no CEP.
    #[inline]
    pub(super) fn addressed(&self, remote_comm_id: u32, sender_comm_id: u32) -> Option<CepId> {
        let (index, slot) = self.slot_from_wire(remote_comm_id)?;
        let c = slot.cep.as_ref()?;
        (c.remote_comm_id == 0 || c.remote_comm_id == sender_comm_id)
            .then(|| CepId::new(index as u32, slot.generation))
    }

    pub(super) fn on_class_port_info(&mut self, src: &MadAddress, header: MadHeader) {
        self.received(AttributeId::ClassPortInfo);
        // RespTimeValue: the CM answers at DISPATCH_LEVEL, well within 4.096us * 2^16.
        let cpi = ClassPortInfo {
            base_version: ibcm_mad::BASE_VERSION,
            class_version: ibcm_mad::CM_CLASS_VERSION,
            capability_mask: 0,
            capability_mask2: 0,
            resp_time_value: 16,
            ..ClassPortInfo::default()
        };
        let reply = MadHeader {
            method: Method::GetResp,
            ..header
        };
        self.push_mad(*src, reply, CmMessage::ClassPortInfo(cpi));
    }

    /// The listen that takes `req` (listen_table.rs).
    pub(super) fn listen_for(&self, port: u8, req: &Req<'_>) -> Option<CepId> {
        self.listens.taker(port, req.service_id, req.private_data)
    }
}
