//! REP, ConnectReply (IBA 12.6.8, Table 110).

use crate::D;
use crate::error::{Error, check_len, check_width};
use crate::req::field_of;
use crate::view::view;
use ibcm_iba::Failover;

/// REP private data: 196 bytes.
pub const REP_PRIVATE_DATA_SIZE: usize = 196;
const PRIVATE_DATA: usize = 36;

view! {
    /// A zero-copy view of a REP MAD.
    pub struct RepPacket [base D, len 232] {
        /// LocalCommID.
        local_comm_id / set_local_comm_id: u32(0);
        /// RemoteCommID.
        remote_comm_id / set_remote_comm_id: u32(4);
        /// LocalQ_Key.
        local_qkey / set_local_qkey: u32(8);
        /// LocalQPN (24 bits).
        local_qpn / set_local_qpn: u24(12);
        /// VendorID bits 23..16 (IBA 1.4 ECE).
        vendor_id_h / set_vendor_id_h: u8(15);
        /// LocalEEContext (24 bits; for XRC the receive QPN).
        local_eecn / set_local_eecn: u24(16);
        /// VendorID bits 15..8.
        vendor_id_m / set_vendor_id_m: u8(19);
        /// StartingPSN (24 bits).
        starting_psn / set_starting_psn: u24(20);
        /// VendorID bits 7..0.
        vendor_id_l / set_vendor_id_l: u8(23);
        /// ResponderResources.
        responder_resources / set_responder_resources: u8(24);
        /// InitiatorDepth.
        initiator_depth / set_initiator_depth: u8(25);
        /// TargetACKDelay (5 bits).
        target_ack_delay / set_target_ack_delay: bits(26, 3, 5);
        /// FailoverAccepted (2 bits).
        failover_accepted / set_failover_accepted: bits(26, 1, 2);
        /// End-to-end flow control.
        end_to_end_flow_control / set_end_to_end_flow_control: bits(26, 0, 1);
        /// RNRRetryCount (3 bits).
        rnr_retry_count / set_rnr_retry_count: bits(27, 5, 3);
        /// SRQ.
        srq / set_srq: bits(27, 4, 1);
        /// LocalCAGUID.
        local_ca_guid / set_local_ca_guid: u64(28);
        /// PrivateData.
        private_data / set_private_data: bytes(PRIVATE_DATA, REP_PRIVATE_DATA_SIZE);
    }
}

/// A REP: the passive side's answer to a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rep<'a> {
    /// LocalCommID: the sender's communication ID.
    pub local_comm_id: u32,
    /// RemoteCommID: the REQ's LocalCommID.
    pub remote_comm_id: u32,
    /// LocalQ_Key.
    pub local_qkey: u32,
    /// LocalQPN (24 bits).
    pub local_qpn: u32,
    /// LocalEEContext (24 bits).
    pub local_eecn: u32,
    /// VendorID (24 bits, split over three reserved bytes).
    pub vendor_id: u32,
    /// StartingPSN (24 bits).
    pub starting_psn: u32,
    /// ResponderResources.
    pub responder_resources: u8,
    /// InitiatorDepth.
    pub initiator_depth: u8,
    /// TargetACKDelay (5 bits).
    pub target_ack_delay: u8,
    /// FailoverAccepted.
    pub failover_accepted: Failover,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNRRetryCount (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// LocalCAGUID.
    pub local_ca_guid: u64,
    /// PrivateData: the whole 196-byte field on parse; at most 196 bytes on emit.
    pub private_data: &'a [u8],
}

impl<'a> Rep<'a> {
    /// Reads a REP from a MAD buffer (the header is not checked here).
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = RepPacket::new_checked(buf)?;
        Ok(Self {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            local_qkey: p.local_qkey(),
            local_qpn: p.local_qpn(),
            local_eecn: p.local_eecn(),
            vendor_id: u32::from_be_bytes([0, p.vendor_id_h(), p.vendor_id_m(), p.vendor_id_l()]),
            starting_psn: p.starting_psn(),
            responder_resources: p.responder_resources(),
            initiator_depth: p.initiator_depth(),
            target_ack_delay: p.target_ack_delay(),
            failover_accepted: Failover::from(p.failover_accepted()),
            end_to_end_flow_control: p.end_to_end_flow_control() != 0,
            rnr_retry_count: p.rnr_retry_count(),
            srq: p.srq() != 0,
            local_ca_guid: p.local_ca_guid(),
            private_data: field_of(buf, PRIVATE_DATA, REP_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks every field against its width and the private data against 196 bytes.
    pub fn check(&self) -> Result<(), Error> {
        check_width("LocalQPN", self.local_qpn.into(), 24)?;
        check_width("LocalEEContext", self.local_eecn.into(), 24)?;
        check_width("VendorID", self.vendor_id.into(), 24)?;
        check_width("StartingPSN", self.starting_psn.into(), 24)?;
        check_width("TargetACKDelay", self.target_ack_delay.into(), 5)?;
        check_width(
            "FailoverAccepted",
            u8::from(self.failover_accepted).into(),
            2,
        )?;
        check_width("RNRRetryCount", self.rnr_retry_count.into(), 3)?;
        check_len(
            "PrivateData",
            self.private_data.len(),
            REP_PRIVATE_DATA_SIZE,
        )
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = RepPacket::new_unchecked(buf);
        let [_, vendor_h, vendor_m, vendor_l] = self.vendor_id.to_be_bytes();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_local_qkey(self.local_qkey);
        p.set_local_qpn(self.local_qpn);
        p.set_vendor_id_h(vendor_h);
        p.set_local_eecn(self.local_eecn);
        p.set_vendor_id_m(vendor_m);
        p.set_starting_psn(self.starting_psn);
        p.set_vendor_id_l(vendor_l);
        p.set_responder_resources(self.responder_resources);
        p.set_initiator_depth(self.initiator_depth);
        p.set_target_ack_delay(self.target_ack_delay);
        p.set_failover_accepted(self.failover_accepted.into());
        p.set_end_to_end_flow_control(self.end_to_end_flow_control.into());
        p.set_rnr_retry_count(self.rnr_retry_count);
        p.set_srq(self.srq.into());
        p.set_local_ca_guid(self.local_ca_guid);
        p.set_private_data(self.private_data);
    }
}
