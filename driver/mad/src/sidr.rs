//! SIDR_REQ, ServiceIDResReq (IBA 12.11.1, Table 119) and SIDR_REP, ServiceIDResReqResp
//! (IBA 12.11.2, Table 120).

use crate::D;
use crate::error::{Error, check_len, check_width};
use crate::req::field_of;
use crate::view::view;
use ibcm_iba::SidrStatus;

/// SIDR_REQ private data: 216 bytes.
pub const SIDR_REQ_PRIVATE_DATA_SIZE: usize = 216;
/// SIDR_REP additional information: 72 bytes.
pub const SIDR_REP_ADDITIONAL_INFO_SIZE: usize = 72;
/// SIDR_REP private data: 136 bytes.
pub const SIDR_REP_PRIVATE_DATA_SIZE: usize = 136;

view! {
    /// A zero-copy view of a SIDR_REQ MAD.
    pub struct SidrReqPacket [base D, len 232] {
        /// RequestID.
        request_id / set_request_id: u32(0);
        /// PartitionKey.
        partition_key / set_partition_key: u16(4);
        /// ServiceID.
        service_id / set_service_id: u64(8);
        /// PrivateData.
        private_data / set_private_data: bytes(16, SIDR_REQ_PRIVATE_DATA_SIZE);
    }
}

/// A SIDR_REQ: resolve a service ID to a UD QPN and Q_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReq<'a> {
    /// RequestID.
    pub request_id: u32,
    /// PartitionKey.
    pub partition_key: u16,
    /// ServiceID.
    pub service_id: u64,
    /// PrivateData (216 bytes on parse).
    pub private_data: &'a [u8],
}

impl<'a> SidrReq<'a> {
    /// Reads a SIDR_REQ from a MAD buffer.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = SidrReqPacket::new_checked(buf)?;
        Ok(Self {
            request_id: p.request_id(),
            partition_key: p.partition_key(),
            service_id: p.service_id(),
            private_data: field_of(buf, 16, SIDR_REQ_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks the private-data length.
    pub fn check(&self) -> Result<(), Error> {
        check_len(
            "PrivateData",
            self.private_data.len(),
            SIDR_REQ_PRIVATE_DATA_SIZE,
        )
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = SidrReqPacket::new_unchecked(buf);
        p.set_request_id(self.request_id);
        p.set_partition_key(self.partition_key);
        p.set_service_id(self.service_id);
        p.set_private_data(self.private_data);
    }
}

view! {
    /// A zero-copy view of a SIDR_REP MAD.
    pub struct SidrRepPacket [base D, len 232] {
        /// RequestID.
        request_id / set_request_id: u32(0);
        /// Status.
        status / set_status: u8(4);
        /// AdditionalInfoLength.
        additional_info_length / set_additional_info_length: u8(5);
        /// VendorID bits 23..8 (IBA 1.4 ECE; Linux `CM_SIDR_REP_VENDOR_ID_H`).
        vendor_id_h / set_vendor_id_h: u16(6);
        /// QPN (24 bits).
        qpn / set_qpn: u24(8);
        /// VendorID bits 7..0 (Linux `CM_SIDR_REP_VENDOR_ID_L`).
        vendor_id_l / set_vendor_id_l: u8(11);
        /// ServiceID.
        service_id / set_service_id: u64(12);
        /// Q_Key.
        qkey / set_qkey: u32(20);
        /// AdditionalInfo (the whole 72-byte field).
        additional_info / set_additional_info: bytes(24, SIDR_REP_ADDITIONAL_INFO_SIZE);
        /// PrivateData.
        private_data / set_private_data: bytes(96, SIDR_REP_PRIVATE_DATA_SIZE);
    }
}

/// A SIDR_REP: the answer to a SIDR_REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRep<'a> {
    /// RequestID (the SIDR_REQ's).
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// VendorID (24 bits; 0 unless ECE is used), as in a REQ and a REP.
    pub vendor_id: u32,
    /// QPN (24 bits).
    pub qpn: u32,
    /// ServiceID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// AdditionalInfo: AdditionalInfoLength bytes, at most 72.
    pub additional_info: &'a [u8],
    /// PrivateData (136 bytes on parse).
    pub private_data: &'a [u8],
}

impl<'a> SidrRep<'a> {
    /// Reads a SIDR_REP from a MAD buffer. An AdditionalInfoLength over 72 (IBA Table 120)
    /// is clamped to 72, never refused (a SIDR_REP dropped leaves the requester waiting out
    /// its retries); [`CmMad::length_clamped`](crate::CmMad::length_clamped) tells when.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = SidrRepPacket::new_checked(buf)?;
        let len = p
            .additional_info_length()
            .min(SIDR_REP_ADDITIONAL_INFO_SIZE as u8);
        let [vendor_h, vendor_m] = p.vendor_id_h().to_be_bytes();
        Ok(Self {
            request_id: p.request_id(),
            status: SidrStatus::from(p.status()),
            vendor_id: u32::from_be_bytes([0, vendor_h, vendor_m, p.vendor_id_l()]),
            qpn: p.qpn(),
            service_id: p.service_id(),
            qkey: p.qkey(),
            additional_info: field_of(buf, 24, len.into()),
            private_data: field_of(buf, 96, SIDR_REP_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks the QPN and vendor ID widths and the additional-info and private-data
    /// lengths.
    pub fn check(&self) -> Result<(), Error> {
        check_width("QPN", self.qpn.into(), 24)?;
        check_width("VendorID", self.vendor_id.into(), 24)?;
        check_len(
            "AdditionalInfo",
            self.additional_info.len(),
            SIDR_REP_ADDITIONAL_INFO_SIZE,
        )?;
        check_len(
            "PrivateData",
            self.private_data.len(),
            SIDR_REP_PRIVATE_DATA_SIZE,
        )
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = SidrRepPacket::new_unchecked(buf);
        p.set_request_id(self.request_id);
        p.set_status(self.status.into());
        // Checked against 72 bytes.
        p.set_additional_info_length(self.additional_info.len() as u8);
        let [_, vendor_h, vendor_m, vendor_l] = self.vendor_id.to_be_bytes();
        p.set_vendor_id_h(u16::from_be_bytes([vendor_h, vendor_m]));
        p.set_qpn(self.qpn);
        p.set_vendor_id_l(vendor_l);
        p.set_service_id(self.service_id);
        p.set_qkey(self.qkey);
        p.set_additional_info(self.additional_info);
        p.set_private_data(self.private_data);
    }
}
