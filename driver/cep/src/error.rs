//! Errors of user operations. A failed operation changes nothing.

use core::fmt;

use crate::cep::StateName;

/// Why a user operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmError {
    /// No CEP has this handle (never created, or destroyed).
    UnknownCep,
    /// The operation is not valid in the CEP's state.
    InvalidState {
        /// The state the CEP is in.
        state: StateName,
    },
    /// A value does not fit its field (e.g. a QPN over 24 bits, a timeout over 31).
    OutOfRange {
        /// The parameter.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// A value the field can hold but the protocol reserves (a REQ from QPN 0, a reserved
    /// transport service type: IBA Table 106; WinOF `__req_handler` rejects both).
    Reserved {
        /// The parameter.
        field: &'static str,
        /// The value given.
        value: u64,
    },
    /// Private data, ARI or a compare buffer exceeds the message's maximum.
    TooLong {
        /// The parameter.
        field: &'static str,
        /// The length given.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The initiator depth exceeds what the peer offered as responder resources.
    InitiatorDepthOverPeer {
        /// Requested initiator depth.
        requested: u8,
        /// The peer's responder resources.
        peer: u8,
    },
    /// A path this side would send on does not start at the local port named (its
    /// source GID or LID is not that port's).
    NotLocal {
        /// What was checked.
        field: &'static str,
    },
    /// A listen exists that could take the same REQs (its service ID under both masks,
    /// its port and its compare data can all match one REQ; manager/listen.rs).
    DuplicateListen,
    /// The manager holds its maximum number of CEPs, or memory ran out.
    NoResources,
    /// The local port named is down (`CmManager::port_down`): nothing can be sent from
    /// it until it is back.
    PortDown {
        /// The port.
        port: u8,
    },
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::UnknownCep => f.write_str("no such endpoint"),
            Self::InvalidState { state } => write!(f, "not valid in state {state:?}"),
            Self::OutOfRange { field, value, max } => {
                write!(f, "{field} = {value} is out of range (max {max})")
            }
            Self::Reserved { field, value } => {
                write!(f, "{field} = {value} is reserved by the protocol")
            }
            Self::TooLong { field, len, max } => {
                write!(f, "{field} of {len} bytes exceeds the maximum of {max}")
            }
            Self::InitiatorDepthOverPeer { requested, peer } => write!(
                f,
                "initiator depth {requested} exceeds the peer's responder resources {peer}"
            ),
            Self::NotLocal { field } => write!(f, "{field} is not a local port's address"),
            Self::DuplicateListen => f.write_str("an overlapping listen exists"),
            Self::NoResources => f.write_str("no resources for another endpoint"),
            Self::PortDown { port } => write!(f, "port {port} is down"),
        }
    }
}

impl core::error::Error for CmError {}

pub(crate) fn check_width(field: &'static str, value: u64, bits: u32) -> Result<(), CmError> {
    let max = (1u64 << bits) - 1;
    if value > max {
        Err(CmError::OutOfRange { field, value, max })
    } else {
        Ok(())
    }
}

pub(crate) fn check_max(field: &'static str, value: u8, max: u8) -> Result<(), CmError> {
    if value > max {
        Err(CmError::OutOfRange {
            field,
            value: value.into(),
            max: max.into(),
        })
    } else {
        Ok(())
    }
}

pub(crate) fn check_len(field: &'static str, len: usize, max: usize) -> Result<(), CmError> {
    if len > max {
        Err(CmError::TooLong { field, len, max })
    } else {
        Ok(())
    }
}
