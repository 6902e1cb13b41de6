//! The short connection messages: MRA (Table 107), REJ (Table 108), RTU (Table 111),
//! DREQ (Table 112) and DREP (Table 113).

use crate::D;
use crate::error::{Error, check_len, check_width};
use crate::req::field_of;
use crate::view::view;
use ibcm_iba::{MessageKind, RejReason};

/// MRA private data: 222 bytes.
pub const MRA_PRIVATE_DATA_SIZE: usize = 222;
/// REJ additional rejection information (ARI): 72 bytes.
pub const REJ_ARI_SIZE: usize = 72;
/// REJ private data: 148 bytes.
pub const REJ_PRIVATE_DATA_SIZE: usize = 148;
/// RTU private data: 224 bytes.
pub const RTU_PRIVATE_DATA_SIZE: usize = 224;
/// DREQ private data: 220 bytes.
pub const DREQ_PRIVATE_DATA_SIZE: usize = 220;
/// DREP private data: 224 bytes.
pub const DREP_PRIVATE_DATA_SIZE: usize = 224;

view! {
    /// A zero-copy view of an MRA MAD.
    pub struct MraPacket [base D, len 232] {
        /// LocalCommID.
        local_comm_id / set_local_comm_id: u32(0);
        /// RemoteCommID.
        remote_comm_id / set_remote_comm_id: u32(4);
        /// MessageMRAed (2 bits).
        message_mraed / set_message_mraed: bits(8, 6, 2);
        /// ServiceTimeout (5 bits).
        service_timeout / set_service_timeout: bits(9, 3, 5);
        /// PrivateData.
        private_data / set_private_data: bytes(10, MRA_PRIVATE_DATA_SIZE);
    }
}

/// An MRA: "message received, answer will take longer".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mra<'a> {
    /// LocalCommID.
    pub local_comm_id: u32,
    /// RemoteCommID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged.
    pub message_mraed: MessageKind,
    /// ServiceTimeout (5 bits): the extra time the sender needs.
    pub service_timeout: u8,
    /// PrivateData (222 bytes on parse).
    pub private_data: &'a [u8],
}

impl<'a> Mra<'a> {
    /// Reads an MRA from a MAD buffer.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = MraPacket::new_checked(buf)?;
        Ok(Self {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_mraed: MessageKind::from(p.message_mraed()),
            service_timeout: p.service_timeout(),
            private_data: field_of(buf, 10, MRA_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks field widths and the private-data length.
    pub fn check(&self) -> Result<(), Error> {
        check_width("MessageMRAed", u8::from(self.message_mraed).into(), 2)?;
        check_width("ServiceTimeout", self.service_timeout.into(), 5)?;
        check_len(
            "PrivateData",
            self.private_data.len(),
            MRA_PRIVATE_DATA_SIZE,
        )
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = MraPacket::new_unchecked(buf);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_message_mraed(self.message_mraed.into());
        p.set_service_timeout(self.service_timeout);
        p.set_private_data(self.private_data);
    }
}

view! {
    /// A zero-copy view of a REJ MAD.
    pub struct RejPacket [base D, len 232] {
        /// LocalCommID.
        local_comm_id / set_local_comm_id: u32(0);
        /// RemoteCommID.
        remote_comm_id / set_remote_comm_id: u32(4);
        /// MessageRejected (2 bits).
        message_rejected / set_message_rejected: bits(8, 6, 2);
        /// RejectedInfoLength (7 bits).
        rejected_info_length / set_rejected_info_length: bits(9, 1, 7);
        /// Reason.
        reason / set_reason: u16(10);
        /// ARI (the whole 72-byte field).
        ari / set_ari: bytes(12, REJ_ARI_SIZE);
        /// PrivateData.
        private_data / set_private_data: bytes(84, REJ_PRIVATE_DATA_SIZE);
    }
}

/// A REJ: the connection (or the message named) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rej<'a> {
    /// LocalCommID (0 when the sender has none, e.g. no listener).
    pub local_comm_id: u32,
    /// RemoteCommID.
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MessageKind,
    /// The reason.
    pub reason: RejReason,
    /// Additional rejection information: RejectedInfoLength bytes, at most 72.
    pub ari: &'a [u8],
    /// PrivateData (148 bytes on parse).
    pub private_data: &'a [u8],
}

impl<'a> Rej<'a> {
    /// Reads a REJ from a MAD buffer. A RejectedInfoLength over 72 (the ARI field, IBA
    /// Table 108) is clamped to 72, never refused: a REJ dropped leaves the active side
    /// waiting out a whole REQ timeout, and Linux `cm_format_rej_event` passes the length
    /// on unchecked. [`CmMad::length_clamped`](crate::CmMad::length_clamped) tells when it happened.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = RejPacket::new_checked(buf)?;
        let len = p.rejected_info_length().min(REJ_ARI_SIZE as u8);
        Ok(Self {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_rejected: MessageKind::from(p.message_rejected()),
            reason: RejReason::from(p.reason()),
            ari: field_of(buf, 12, len.into()),
            private_data: field_of(buf, 84, REJ_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks field widths and the ARI and private-data lengths.
    pub fn check(&self) -> Result<(), Error> {
        check_width("MessageRejected", u8::from(self.message_rejected).into(), 2)?;
        check_len("ARI", self.ari.len(), REJ_ARI_SIZE)?;
        check_len(
            "PrivateData",
            self.private_data.len(),
            REJ_PRIVATE_DATA_SIZE,
        )
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = RejPacket::new_unchecked(buf);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_message_rejected(self.message_rejected.into());
        // The length was checked against 72, so it fits the 7-bit field.
        p.set_rejected_info_length(self.ari.len() as u8);
        p.set_reason(self.reason.into());
        p.set_ari(self.ari);
        p.set_private_data(self.private_data);
    }
}

view! {
    /// A zero-copy view of an RTU MAD.
    pub struct RtuPacket [base D, len 232] {
        /// LocalCommID.
        local_comm_id / set_local_comm_id: u32(0);
        /// RemoteCommID.
        remote_comm_id / set_remote_comm_id: u32(4);
        /// PrivateData.
        private_data / set_private_data: bytes(8, RTU_PRIVATE_DATA_SIZE);
    }
}

view! {
    /// A zero-copy view of a DREP MAD.
    pub struct DrepPacket [base D, len 232] {
        /// LocalCommID.
        local_comm_id / set_local_comm_id: u32(0);
        /// RemoteCommID.
        remote_comm_id / set_remote_comm_id: u32(4);
        /// PrivateData.
        private_data / set_private_data: bytes(8, DREP_PRIVATE_DATA_SIZE);
    }
}

/// The body shared by RTU and DREP: the two comm IDs and 224 bytes of private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommIds<'a> {
    /// LocalCommID.
    pub local_comm_id: u32,
    /// RemoteCommID.
    pub remote_comm_id: u32,
    /// PrivateData (224 bytes on parse).
    pub private_data: &'a [u8],
}

/// An RTU: the active side is ready to use the connection.
pub type Rtu<'a> = CommIds<'a>;
/// A DREP: the answer to a DREQ.
pub type Drep<'a> = CommIds<'a>;

impl<'a> CommIds<'a> {
    /// Reads an RTU or a DREP (same layout) from a MAD buffer.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = RtuPacket::new_checked(buf)?;
        Ok(Self {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            private_data: field_of(buf, 8, RTU_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks the private-data length (224 for both messages).
    pub fn check(&self) -> Result<(), Error> {
        check_len(
            "PrivateData",
            self.private_data.len(),
            RTU_PRIVATE_DATA_SIZE,
        )
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = RtuPacket::new_unchecked(buf);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_private_data(self.private_data);
    }
}

view! {
    /// A zero-copy view of a DREQ MAD.
    pub struct DreqPacket [base D, len 232] {
        /// LocalCommID.
        local_comm_id / set_local_comm_id: u32(0);
        /// RemoteCommID.
        remote_comm_id / set_remote_comm_id: u32(4);
        /// RemoteQPN/EECN (24 bits).
        remote_qpn_eecn / set_remote_qpn_eecn: u24(8);
        /// PrivateData.
        private_data / set_private_data: bytes(12, DREQ_PRIVATE_DATA_SIZE);
    }
}

/// A DREQ: the sender wants to disconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dreq<'a> {
    /// LocalCommID.
    pub local_comm_id: u32,
    /// RemoteCommID.
    pub remote_comm_id: u32,
    /// RemoteQPN/EECN (24 bits): the receiver's QPN, so a stale DREQ is detected.
    pub remote_qpn_eecn: u32,
    /// PrivateData (220 bytes on parse).
    pub private_data: &'a [u8],
}

impl<'a> Dreq<'a> {
    /// Reads a DREQ from a MAD buffer.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = DreqPacket::new_checked(buf)?;
        Ok(Self {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            remote_qpn_eecn: p.remote_qpn_eecn(),
            private_data: field_of(buf, 12, DREQ_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks the QPN width and the private-data length.
    pub fn check(&self) -> Result<(), Error> {
        check_width("RemoteQPN/EECN", self.remote_qpn_eecn.into(), 24)?;
        check_len(
            "PrivateData",
            self.private_data.len(),
            DREQ_PRIVATE_DATA_SIZE,
        )
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = DreqPacket::new_unchecked(buf);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_remote_qpn_eecn(self.remote_qpn_eecn);
        p.set_private_data(self.private_data);
    }
}
