//! The InfiniBand Communication Management MAD codec (IBA Vol 1 chapter 12).
//!
//! Two layers, after smoltcp's `wire` module:
//!
//! - **Views** (`ReqPacket<T>`, `RepPacket<T>`, ..., [`Mad<T>`]): zero-copy accessors over a
//!   byte buffer, one getter and one setter per field of the IBA table. A view over a short
//!   buffer never panics: `new_checked` refuses it, and accessors on an unchecked one read
//!   zeros.
//! - **Representations** ([`Req`], [`Rep`], ..., and [`CmMad`] over them): validated values.
//!   `parse` checks the common header (base version 1, class 0x07, class version 2, a method
//!   the attribute uses) and length fields, and ignores reserved bits; `emit` checks every
//!   field against its width and every variable-length field against the message's maximum
//!   *before* writing, then writes exactly 256 bytes with reserved bits zero.
//!
//! Private data has no length on the wire: `parse` returns the whole field (92 bytes for a
//! REQ, 196 for a REP, ...), and `emit` accepts up to that many bytes and zero-fills the rest.
//!
//! **Length fields** (REJ RejectedInfoLength, APR and SIDR_REP AdditionalInfoLength) over
//! the 72-byte field they describe are clamped to 72, not refused: a peer's REJ must never
//! be lost to a bad length (the active side would wait out a whole REQ timeout). See
//! [`CmMad::length_clamped`].
//!
//! **Reserved bits.** The codec preserves none of them in a representation:
//!
//! - `parse` ignores every reserved bit and byte (REQ bytes 4 and 24-27 and the rsvd bits
//!   of 50/94/95/138/139, REP 27[3:0] and the low byte of the QPN/EECN/PSN words outside
//!   the VendorID bytes, REJ 9[0], LAP 8-11 and 16-19, APR 10-11, SIDR_REQ 6-7, the MAD
//!   header's Reserved@18, ...): a representation has no field for them, so re-emitting a
//!   parsed MAD zeroes them. The REQ, REP and SIDR_REP VendorID bytes (IBA 1.4 ECE, which
//!   older revisions reserve) are not reserved here: they are parsed and emitted.
//! - `emit` zeroes the whole 256-byte buffer first: every reserved bit it writes is zero.
//! - The views' setters change only their own bits (a bit-field setter keeps the rest of its
//!   byte, a flow-label setter the low 12 bits of its word), so editing a received MAD in
//!   place through a view preserves its reserved bits; the getters never mask them in.
//!
//! ```
//! use ibcm_mad::{CmMad, CmMessage, MadHeader, Rtu, MAD_SIZE};
//!
//! let rtu = CmMad {
//!     header: MadHeader::send(0x1234),
//!     message: CmMessage::Rtu(Rtu { local_comm_id: 7, remote_comm_id: 9, private_data: b"hi" }),
//! };
//! let mut buf = [0u8; MAD_SIZE];
//! rtu.emit(&mut buf)?;
//! let parsed = CmMad::parse(&buf)?;
//! let CmMessage::Rtu(back) = parsed.message else { unreachable!() };
//! assert_eq!((back.local_comm_id, &back.private_data[..3]), (7, &b"hi\0"[..]));
//! # Ok::<(), ibcm_mad::Error>(())
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod conn;
mod cpi;
mod error;
mod field;
mod header;
mod lap;
mod path;
mod rep;
mod req;
mod sidr;
mod view;

pub use conn::{
    CommIds, DREP_PRIVATE_DATA_SIZE, DREQ_PRIVATE_DATA_SIZE, Drep, DrepPacket, Dreq, DreqPacket,
    MRA_PRIVATE_DATA_SIZE, Mra, MraPacket, REJ_ARI_SIZE, REJ_PRIVATE_DATA_SIZE,
    RTU_PRIVATE_DATA_SIZE, Rej, RejPacket, Rtu, RtuPacket,
};
pub use cpi::{CLASS_PORT_INFO_SIZE, ClassPortInfo, ClassPortInfoPacket, CpiTarget};
pub use error::Error;
pub use header::{
    BASE_VERSION, CM_CLASS, CM_CLASS_VERSION, CM_DATA_SIZE, MAD_HEADER_SIZE, MAD_SIZE, Mad,
    MadHeader,
};
pub use ibcm_iba::{
    AprStatus, AttributeId, Failover, IB_TIME_BASE_NS, IB_TIME_MAX, IP_HEADER_SIZE,
    IP_HEADER_VERSION, IpHeader, IpHeaderError, IpServiceId, MessageKind, Method, Mtu, PortSpace,
    Rate, RejReason, SidrStatus, Transport, ib_time_from_ns_ceil, ib_time_ns,
};
pub use lap::{
    APR_ADDITIONAL_INFO_SIZE, APR_PRIVATE_DATA_SIZE, Apr, AprPacket, LAP_PRIVATE_DATA_SIZE, Lap,
    LapPacket,
};
pub use path::{Gid, LapPath, Path, ReqPath};
pub use rep::{REP_PRIVATE_DATA_SIZE, Rep, RepPacket};
pub use req::{REQ_PRIVATE_DATA_SIZE, Req, ReqPacket};
pub use sidr::{
    SIDR_REP_ADDITIONAL_INFO_SIZE, SIDR_REP_PRIVATE_DATA_SIZE, SIDR_REQ_PRIVATE_DATA_SIZE, SidrRep,
    SidrRepPacket, SidrReq, SidrReqPacket,
};

/// Offset of the CM data in a MAD: the IBA tables' offsets are relative to it.
const D: usize = MAD_HEADER_SIZE;

/// One CM attribute, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage<'a> {
    /// ConnectRequest.
    Req(Req<'a>),
    /// MsgRcptAck.
    Mra(Mra<'a>),
    /// ConnectReject.
    Rej(Rej<'a>),
    /// ConnectReply.
    Rep(Rep<'a>),
    /// ReadyToUse.
    Rtu(Rtu<'a>),
    /// DisconnectRequest.
    Dreq(Dreq<'a>),
    /// DisconnectReply.
    Drep(Drep<'a>),
    /// LoadAlternatePath.
    Lap(Lap<'a>),
    /// AlternatePathResponse.
    Apr(Apr<'a>),
    /// ServiceIDResReq.
    SidrReq(SidrReq<'a>),
    /// ServiceIDResReqResp.
    SidrRep(SidrRep<'a>),
    /// ClassPortInfo (a Get carries it zeroed, a GetResp filled in).
    ClassPortInfo(ClassPortInfo),
}

impl CmMessage<'_> {
    /// The message's attribute ID.
    pub fn attribute_id(&self) -> AttributeId {
        match self {
            Self::Req(_) => AttributeId::Req,
            Self::Mra(_) => AttributeId::Mra,
            Self::Rej(_) => AttributeId::Rej,
            Self::Rep(_) => AttributeId::Rep,
            Self::Rtu(_) => AttributeId::Rtu,
            Self::Dreq(_) => AttributeId::Dreq,
            Self::Drep(_) => AttributeId::Drep,
            Self::Lap(_) => AttributeId::Lap,
            Self::Apr(_) => AttributeId::Apr,
            Self::SidrReq(_) => AttributeId::SidrReq,
            Self::SidrRep(_) => AttributeId::SidrRep,
            Self::ClassPortInfo(_) => AttributeId::ClassPortInfo,
        }
    }

    /// Checks every field of the message for emit.
    pub fn check(&self) -> Result<(), Error> {
        match self {
            Self::Req(m) => m.check(),
            Self::Mra(m) => m.check(),
            Self::Rej(m) => m.check(),
            Self::Rep(m) => m.check(),
            Self::Rtu(m) | Self::Drep(m) => m.check(),
            Self::Dreq(m) => m.check(),
            Self::Lap(m) => m.check(),
            Self::Apr(m) => m.check(),
            Self::SidrReq(m) => m.check(),
            Self::SidrRep(m) => m.check(),
            Self::ClassPortInfo(m) => m.check(),
        }
    }

    fn write(&self, buf: &mut [u8]) {
        match self {
            Self::Req(m) => m.write(buf),
            Self::Mra(m) => m.write(buf),
            Self::Rej(m) => m.write(buf),
            Self::Rep(m) => m.write(buf),
            Self::Rtu(m) | Self::Drep(m) => m.write(buf),
            Self::Dreq(m) => m.write(buf),
            Self::Lap(m) => m.write(buf),
            Self::Apr(m) => m.write(buf),
            Self::SidrReq(m) => m.write(buf),
            Self::SidrRep(m) => m.write(buf),
            Self::ClassPortInfo(m) => m.write(buf),
        }
    }
}

/// Whether `method` is one the CM class uses with `attribute` (IBA 12.6.1: every CM
/// message is a Send; ClassPortInfo is queried with Get and answered with GetResp).
fn method_allowed(attribute: AttributeId, method: Method) -> bool {
    match attribute {
        AttributeId::ClassPortInfo => matches!(method, Method::Get | Method::GetResp),
        _ => method == Method::Send,
    }
}

/// A whole CM MAD: the common header and one attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad<'a> {
    /// The common MAD header.
    pub header: MadHeader,
    /// The attribute.
    pub message: CmMessage<'a>,
}

impl<'a> CmMad<'a> {
    /// Parses and validates a MAD (the first 256 bytes of `buf`).
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        let (header, attribute) = MadHeader::parse(buf)?;
        if !method_allowed(attribute, header.method) {
            return Err(Error::Method {
                method: header.method.into(),
                attribute: attribute.into(),
            });
        }
        let message = match attribute {
            AttributeId::Req => CmMessage::Req(Req::parse(buf)?),
            AttributeId::Mra => CmMessage::Mra(Mra::parse(buf)?),
            AttributeId::Rej => CmMessage::Rej(Rej::parse(buf)?),
            AttributeId::Rep => CmMessage::Rep(Rep::parse(buf)?),
            AttributeId::Rtu => CmMessage::Rtu(Rtu::parse(buf)?),
            AttributeId::Dreq => CmMessage::Dreq(Dreq::parse(buf)?),
            AttributeId::Drep => CmMessage::Drep(Drep::parse(buf)?),
            AttributeId::Lap => CmMessage::Lap(Lap::parse(buf)?),
            AttributeId::Apr => CmMessage::Apr(Apr::parse(buf)?),
            AttributeId::SidrReq => CmMessage::SidrReq(SidrReq::parse(buf)?),
            AttributeId::SidrRep => CmMessage::SidrRep(SidrRep::parse(buf)?),
            AttributeId::ClassPortInfo => CmMessage::ClassPortInfo(ClassPortInfo::parse(buf)?),
            AttributeId::Unknown(id) => return Err(Error::UnknownAttribute(id)),
        };
        Ok(Self { header, message })
    }

    /// Whether [`parse`](Self::parse) clamped a length field of this MAD to 72: a REJ whose
    /// RejectedInfoLength, or an APR or SIDR_REP whose AdditionalInfoLength, exceeds it.
    /// Reads only the attribute ID and that one field (a short buffer reads as false).
    pub fn length_clamped(buf: &[u8]) -> bool {
        let attribute = AttributeId::from(Mad::new_unchecked(buf).attribute_id());
        let len = match attribute {
            AttributeId::Rej => RejPacket::new_unchecked(buf).rejected_info_length(),
            AttributeId::Apr => AprPacket::new_unchecked(buf).additional_info_length(),
            AttributeId::SidrRep => SidrRepPacket::new_unchecked(buf).additional_info_length(),
            _ => return false,
        };
        usize::from(len) > REJ_ARI_SIZE
    }

    /// Checks the header's method against the attribute and every field of the message.
    pub fn check(&self) -> Result<(), Error> {
        let attribute = self.message.attribute_id();
        if !method_allowed(attribute, self.header.method) {
            return Err(Error::Method {
                method: self.header.method.into(),
                attribute: attribute.into(),
            });
        }
        self.message.check()
    }

    /// Writes the MAD to the first 256 bytes of `buf`, all other bits zero. Nothing is
    /// written unless every check passes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), Error> {
        let len = buf.len();
        let Some(mad) = buf.get_mut(..MAD_SIZE) else {
            return Err(Error::Truncated { len });
        };
        self.check()?;
        mad.fill(0);
        self.header.write(self.message.attribute_id(), mad);
        self.message.write(mad);
        Ok(())
    }
}
