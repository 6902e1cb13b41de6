//! The common MAD header (IBA 13.4.3, Table 137) as the CM class uses it.

use crate::error::Error;
use crate::field;
use ibcm_iba::{AttributeId, Method};

/// A MAD is always 256 bytes (IBA 13.4.1).
pub const MAD_SIZE: usize = 256;
/// The common MAD header: 24 bytes.
pub const MAD_HEADER_SIZE: usize = 24;
/// The CM data after the header: 232 bytes.
pub const CM_DATA_SIZE: usize = MAD_SIZE - MAD_HEADER_SIZE;
/// BaseVersion of every MAD this class sends (IBA 13.4.3).
pub const BASE_VERSION: u8 = 1;
/// MgmtClass of the Communication Management class (IBA 13.4.4, Table 138).
pub const CM_CLASS: u8 = 0x07;
/// ClassVersion of the CM class since IBA 1.2 (IBA 12.6.1).
pub const CM_CLASS_VERSION: u8 = 2;

pub(crate) fn check_mad_len(buf: &[u8]) -> Result<(), Error> {
    if buf.len() < MAD_SIZE {
        Err(Error::Truncated { len: buf.len() })
    } else {
        Ok(())
    }
}

mod offset {
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: usize = 4;
    pub const CLASS_SPECIFIC: usize = 6;
    pub const TRANSACTION_ID: usize = 8;
    pub const ATTRIBUTE_ID: usize = 16;
    pub const ATTRIBUTE_MODIFIER: usize = 20;
}

/// A zero-copy view of the common MAD header of a 256-byte buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mad<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Wraps a buffer without checking its length; accessors on a short buffer read zeros.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer of at least 256 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        check_mad_len(buffer.as_ref())?;
        Ok(Self { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// BaseVersion.
    pub fn base_version(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), offset::BASE_VERSION)
    }

    /// MgmtClass.
    pub fn mgmt_class(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), offset::MGMT_CLASS)
    }

    /// ClassVersion.
    pub fn class_version(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), offset::CLASS_VERSION)
    }

    /// Method (including the response bit 0x80).
    pub fn method(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), offset::METHOD)
    }

    /// Status.
    pub fn status(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), offset::STATUS)
    }

    /// ClassSpecific.
    pub fn class_specific(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), offset::CLASS_SPECIFIC)
    }

    /// TransactionID.
    pub fn transaction_id(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), offset::TRANSACTION_ID)
    }

    /// AttributeID.
    pub fn attribute_id(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), offset::ATTRIBUTE_ID)
    }

    /// AttributeModifier.
    pub fn attribute_modifier(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), offset::ATTRIBUTE_MODIFIER)
    }

    /// The 232 bytes of CM data after the header (empty on a short buffer).
    pub fn data(&self) -> &[u8] {
        field::bytes(self.buffer.as_ref(), MAD_HEADER_SIZE, CM_DATA_SIZE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mad<T> {
    /// Sets BaseVersion.
    pub fn set_base_version(&mut self, v: u8) {
        field::set_u8(self.buffer.as_mut(), offset::BASE_VERSION, v);
    }

    /// Sets MgmtClass.
    pub fn set_mgmt_class(&mut self, v: u8) {
        field::set_u8(self.buffer.as_mut(), offset::MGMT_CLASS, v);
    }

    /// Sets ClassVersion.
    pub fn set_class_version(&mut self, v: u8) {
        field::set_u8(self.buffer.as_mut(), offset::CLASS_VERSION, v);
    }

    /// Sets Method.
    pub fn set_method(&mut self, v: u8) {
        field::set_u8(self.buffer.as_mut(), offset::METHOD, v);
    }

    /// Sets Status.
    pub fn set_status(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), offset::STATUS, v);
    }

    /// Sets ClassSpecific.
    pub fn set_class_specific(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), offset::CLASS_SPECIFIC, v);
    }

    /// Sets TransactionID.
    pub fn set_transaction_id(&mut self, v: u64) {
        field::set_u64(self.buffer.as_mut(), offset::TRANSACTION_ID, v);
    }

    /// Sets AttributeID.
    pub fn set_attribute_id(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), offset::ATTRIBUTE_ID, v);
    }

    /// Sets AttributeModifier.
    pub fn set_attribute_modifier(&mut self, v: u32) {
        field::set_u32(self.buffer.as_mut(), offset::ATTRIBUTE_MODIFIER, v);
    }
}

/// The validated common MAD header of a CM MAD. BaseVersion, MgmtClass and ClassVersion are
/// fixed for the class and so are not fields; the AttributeID follows the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeader {
    /// Send for CM messages, Get/GetResp for ClassPortInfo.
    pub method: Method,
    /// Status (0 except in a GetResp that reports an error).
    pub status: u16,
    /// ClassSpecific (unused by the CM class: zero).
    pub class_specific: u16,
    /// TransactionID.
    pub transaction_id: u64,
    /// AttributeModifier (the ECE option for REQ/REP in IBA 1.4; otherwise zero).
    pub attribute_modifier: u32,
}

impl MadHeader {
    /// A Send header with the given TID, as every CM message uses (IBA 12.6.1).
    pub const fn send(transaction_id: u64) -> Self {
        Self {
            method: Method::Send,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_modifier: 0,
        }
    }

    /// Reads and validates the header: BaseVersion 1, class CM, ClassVersion 2. The method
    /// is checked against the attribute by [`CmMad::parse`](crate::CmMad::parse).
    pub fn parse(buf: &[u8]) -> Result<(Self, AttributeId), Error> {
        let mad = Mad::new_checked(buf)?;
        if mad.base_version() != BASE_VERSION {
            return Err(Error::BaseVersion(mad.base_version()));
        }
        if mad.mgmt_class() != CM_CLASS {
            return Err(Error::MgmtClass(mad.mgmt_class()));
        }
        if mad.class_version() != CM_CLASS_VERSION {
            return Err(Error::ClassVersion(mad.class_version()));
        }
        let header = Self {
            method: Method::from(mad.method()),
            status: mad.status(),
            class_specific: mad.class_specific(),
            transaction_id: mad.transaction_id(),
            attribute_modifier: mad.attribute_modifier(),
        };
        Ok((header, AttributeId::from(mad.attribute_id())))
    }

    /// Writes the header with the given attribute; the reserved bytes 18..20 are zeroed.
    pub(crate) fn write(&self, attribute: AttributeId, buf: &mut [u8]) {
        let mut mad = Mad::new_unchecked(buf);
        mad.set_base_version(BASE_VERSION);
        mad.set_mgmt_class(CM_CLASS);
        mad.set_class_version(CM_CLASS_VERSION);
        mad.set_method(self.method.into());
        mad.set_status(self.status);
        mad.set_class_specific(self.class_specific);
        mad.set_transaction_id(self.transaction_id);
        mad.set_attribute_id(attribute.into());
        field::set_u16(mad.buffer, 18, 0);
        mad.set_attribute_modifier(self.attribute_modifier);
    }
}
