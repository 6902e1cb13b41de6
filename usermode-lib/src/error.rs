//! The library's error: which operation failed, the NTSTATUS, and what the peer said.

use std::fmt;

use ibcm_ioctl::iba::{AttributeId, RejReason};
use ibcm_ioctl::status;

/// What went wrong beyond the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detail {
    /// Nothing more.
    None,
    /// The peer rejected: its reason and private data.
    Rejected {
        /// The REJ reason.
        reason: RejReason,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// A request went unanswered.
    Timeout {
        /// The message that went unanswered.
        message: AttributeId,
    },
}

/// A failed operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The operation, e.g. "connect".
    pub operation: &'static str,
    /// The NTSTATUS it failed with.
    pub status: i32,
    /// What the peer said, if anything.
    pub detail: Detail,
}

impl Error {
    /// An error from a status.
    pub fn new(operation: &'static str, status: i32) -> Self {
        Self {
            operation,
            status,
            detail: Detail::None,
        }
    }

    /// The peer's REJ reason, if it rejected.
    pub fn reject_reason(&self) -> Option<RejReason> {
        match &self.detail {
            Detail::Rejected { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// Whether the operation was cancelled (explicitly, or by destroy/close).
    pub fn is_cancelled(&self) -> bool {
        self.status == status::CANCELLED
    }
}

/// The name of an NTSTATUS the driver uses.
pub fn status_name(st: i32) -> &'static str {
    match st {
        status::SUCCESS => "STATUS_SUCCESS",
        status::PENDING => "STATUS_PENDING",
        status::INFO_LENGTH_MISMATCH => "STATUS_INFO_LENGTH_MISMATCH",
        status::INVALID_HANDLE => "STATUS_INVALID_HANDLE",
        status::INVALID_PARAMETER => "STATUS_INVALID_PARAMETER",
        status::INVALID_DEVICE_REQUEST => "STATUS_INVALID_DEVICE_REQUEST",
        status::BUFFER_TOO_SMALL => "STATUS_BUFFER_TOO_SMALL",
        status::REVISION_MISMATCH => "STATUS_REVISION_MISMATCH",
        status::INSUFFICIENT_RESOURCES => "STATUS_INSUFFICIENT_RESOURCES",
        status::CANCELLED => "STATUS_CANCELLED",
        status::INVALID_DEVICE_STATE => "STATUS_INVALID_DEVICE_STATE",
        status::ADDRESS_ALREADY_EXISTS => "STATUS_ADDRESS_ALREADY_EXISTS",
        status::DEVICE_REMOVED => "STATUS_DEVICE_REMOVED",
        status::IO_TIMEOUT => "STATUS_IO_TIMEOUT",
        status::CONNECTION_REFUSED => "STATUS_CONNECTION_REFUSED",
        status::ACCESS_DENIED => "STATUS_ACCESS_DENIED",
        status::QUOTA_EXCEEDED => "STATUS_QUOTA_EXCEEDED",
        status::FILE_CLOSED => "STATUS_FILE_CLOSED",
        _ => "NTSTATUS",
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({:#010x})",
            self.operation,
            status_name(self.status),
            self.status as u32
        )?;
        match &self.detail {
            Detail::None => Ok(()),
            Detail::Rejected { reason, .. } => write!(f, ", rejected by the peer: {reason:?}"),
            Detail::Timeout { message } => write!(f, ", no answer to the {message:?}"),
        }
    }
}

impl std::error::Error for Error {}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;
