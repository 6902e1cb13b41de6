//! LAP, LoadAlternatePath (IBA 12.8.1, Table 115) and APR, AlternatePathResponse
//! (IBA 12.8.2, Table 116).

use crate::D;
use crate::error::{Error, check_len, check_width};
use crate::path::{LapPath, Path};
use crate::req::field_of;
use crate::view::view;
use ibcm_iba::AprStatus;

/// LAP private data: 168 bytes.
pub const LAP_PRIVATE_DATA_SIZE: usize = 168;
/// APR additional information: 72 bytes.
pub const APR_ADDITIONAL_INFO_SIZE: usize = 72;
/// APR private data: 148 bytes.
pub const APR_PRIVATE_DATA_SIZE: usize = 148;
const LAP_PATH: usize = 20;
const LAP_PATH_LEN: usize = 44;

view! {
    /// A zero-copy view of a LAP MAD.
    pub struct LapPacket [base D, len 232] {
        /// LocalCommID.
        local_comm_id / set_local_comm_id: u32(0);
        /// RemoteCommID.
        remote_comm_id / set_remote_comm_id: u32(4);
        /// RemoteQPN/EECN (24 bits).
        remote_qpn_eecn / set_remote_qpn_eecn: u24(12);
        /// RemoteCMResponseTimeout (5 bits).
        remote_cm_response_timeout / set_remote_cm_response_timeout: bits(15, 3, 5);
        /// PrivateData.
        private_data / set_private_data: bytes(64, LAP_PRIVATE_DATA_SIZE);
    }
}

impl<T: AsRef<[u8]>> LapPacket<T> {
    /// The alternate path to load.
    pub fn alternate_path(&self) -> LapPath<&[u8]> {
        let buf = self.buffer.as_ref();
        LapPath::new_unchecked(
            buf.get(D + LAP_PATH..D + LAP_PATH + LAP_PATH_LEN)
                .unwrap_or(&[]),
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> LapPacket<T> {
    /// The alternate path, writable.
    pub fn alternate_path_mut(&mut self) -> LapPath<&mut [u8]> {
        let buf = self.buffer.as_mut();
        LapPath::new_unchecked(
            buf.get_mut(D + LAP_PATH..D + LAP_PATH + LAP_PATH_LEN)
                .unwrap_or(&mut []),
        )
    }
}

/// A LAP: load this alternate path for path migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lap<'a> {
    /// LocalCommID.
    pub local_comm_id: u32,
    /// RemoteCommID.
    pub remote_comm_id: u32,
    /// RemoteQPN/EECN (24 bits).
    pub remote_qpn_eecn: u32,
    /// RemoteCMResponseTimeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// The alternate path.
    pub alternate_path: Path,
    /// PrivateData (168 bytes on parse).
    pub private_data: &'a [u8],
}

impl<'a> Lap<'a> {
    /// Reads a LAP from a MAD buffer.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = LapPacket::new_checked(buf)?;
        Ok(Self {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            remote_qpn_eecn: p.remote_qpn_eecn(),
            remote_cm_response_timeout: p.remote_cm_response_timeout(),
            alternate_path: p.alternate_path().path(),
            private_data: field_of(buf, 64, LAP_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks field widths and the private-data length.
    pub fn check(&self) -> Result<(), Error> {
        check_width("RemoteQPN/EECN", self.remote_qpn_eecn.into(), 24)?;
        check_width(
            "RemoteCMResponseTimeout",
            self.remote_cm_response_timeout.into(),
            5,
        )?;
        self.alternate_path.check()?;
        check_len(
            "PrivateData",
            self.private_data.len(),
            LAP_PRIVATE_DATA_SIZE,
        )
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = LapPacket::new_unchecked(buf);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_remote_qpn_eecn(self.remote_qpn_eecn);
        p.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        p.alternate_path_mut().set_path(&self.alternate_path);
        p.set_private_data(self.private_data);
    }
}

view! {
    /// A zero-copy view of an APR MAD.
    pub struct AprPacket [base D, len 232] {
        /// LocalCommID.
        local_comm_id / set_local_comm_id: u32(0);
        /// RemoteCommID.
        remote_comm_id / set_remote_comm_id: u32(4);
        /// AdditionalInfoLength.
        additional_info_length / set_additional_info_length: u8(8);
        /// APStatus.
        ap_status / set_ap_status: u8(9);
        /// AdditionalInfo (the whole 72-byte field).
        additional_info / set_additional_info: bytes(12, APR_ADDITIONAL_INFO_SIZE);
        /// PrivateData.
        private_data / set_private_data: bytes(84, APR_PRIVATE_DATA_SIZE);
    }
}

/// An APR: the answer to a LAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Apr<'a> {
    /// LocalCommID.
    pub local_comm_id: u32,
    /// RemoteCommID.
    pub remote_comm_id: u32,
    /// APStatus.
    pub status: AprStatus,
    /// AdditionalInfo: AdditionalInfoLength bytes, at most 72.
    pub additional_info: &'a [u8],
    /// PrivateData (148 bytes on parse).
    pub private_data: &'a [u8],
}

impl<'a> Apr<'a> {
    /// Reads an APR from a MAD buffer. An AdditionalInfoLength over 72 (IBA Table 116) is
    /// clamped to 72, never refused (an APR dropped leaves the LAP's sender waiting out its
    /// retries); [`CmMad::length_clamped`](crate::CmMad::length_clamped) tells when.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let p = AprPacket::new_checked(buf)?;
        let len = p
            .additional_info_length()
            .min(APR_ADDITIONAL_INFO_SIZE as u8);
        Ok(Self {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            status: AprStatus::from(p.ap_status()),
            additional_info: field_of(buf, 12, len.into()),
            private_data: field_of(buf, 84, APR_PRIVATE_DATA_SIZE),
        })
    }

    /// Checks the additional-info and private-data lengths.
    pub fn check(&self) -> Result<(), Error> {
        check_len(
            "AdditionalInfo",
            self.additional_info.len(),
            APR_ADDITIONAL_INFO_SIZE,
        )?;
        check_len(
            "PrivateData",
            self.private_data.len(),
            APR_PRIVATE_DATA_SIZE,
        )
    }

    pub(crate) fn write(&self, buf: &mut [u8]) {
        let mut p = AprPacket::new_unchecked(buf);
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        // Checked against 72 bytes.
        p.set_additional_info_length(self.additional_info.len() as u8);
        p.set_ap_status(self.status.into());
        p.set_additional_info(self.additional_info);
        p.set_private_data(self.private_data);
    }
}
