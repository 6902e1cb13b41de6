//! The codec's error type: every malformed input and every out-of-range value has a variant.

use core::fmt;

/// Why a MAD could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The buffer holds fewer bytes than a MAD (256).
    Truncated {
        /// The buffer's length.
        len: usize,
    },
    /// Common MAD header BaseVersion is not 1.
    BaseVersion(u8),
    /// Common MAD header MgmtClass is not the CM class (0x07).
    MgmtClass(u8),
    /// Common MAD header ClassVersion is not 2.
    ClassVersion(u8),
    /// The method is not one the CM class uses for this attribute.
    Method {
        /// The MAD's method byte.
        method: u8,
        /// The MAD's attribute ID.
        attribute: u16,
    },
    /// The attribute ID names no CM attribute.
    UnknownAttribute(u16),
    /// A length field on the wire exceeds the size of the field it describes.
    LengthField {
        /// The field, as the IBA table names it.
        field: &'static str,
        /// The length found on the wire.
        len: u8,
        /// The largest length the field can hold.
        max: u8,
    },
    /// Emit: a variable-length field (private data, ARI, additional info) is too long.
    TooLong {
        /// The field, as the IBA table names it.
        field: &'static str,
        /// The length given.
        len: usize,
        /// The message's maximum for that field.
        max: usize,
    },
    /// Emit: a value does not fit its field's width (e.g. a QPN over 24 bits).
    OutOfRange {
        /// The field, as the IBA table names it.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest value the field can carry.
        max: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated { len } => write!(f, "MAD truncated: {len} bytes, need 256"),
            Self::BaseVersion(v) => write!(f, "MAD base version {v}, expected 1"),
            Self::MgmtClass(c) => write!(f, "management class {c:#04x}, expected CM (0x07)"),
            Self::ClassVersion(v) => write!(f, "CM class version {v}, expected 2"),
            Self::Method { method, attribute } => {
                write!(
                    f,
                    "method {method:#04x} not valid for attribute {attribute:#06x}"
                )
            }
            Self::UnknownAttribute(a) => write!(f, "unknown CM attribute {a:#06x}"),
            Self::LengthField { field, len, max } => {
                write!(f, "{field} is {len}, the field holds at most {max}")
            }
            Self::TooLong { field, len, max } => {
                write!(f, "{field} of {len} bytes exceeds the maximum of {max}")
            }
            Self::OutOfRange { field, value, max } => {
                write!(f, "{field} = {value} is out of range (max {max})")
            }
        }
    }
}

impl core::error::Error for Error {}

/// Checks that `value` fits in `bits` bits.
#[inline]
pub(crate) fn check_width(field: &'static str, value: u64, bits: u32) -> Result<(), Error> {
    let max = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    if value > max {
        Err(Error::OutOfRange { field, value, max })
    } else {
        Ok(())
    }
}

/// Checks a variable-length field against its maximum.
#[inline]
pub(crate) fn check_len(field: &'static str, len: usize, max: usize) -> Result<(), Error> {
    if len > max {
        Err(Error::TooLong { field, len, max })
    } else {
        Ok(())
    }
}
