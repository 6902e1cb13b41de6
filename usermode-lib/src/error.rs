//! The library's error: which operation failed, the NTSTATUS, and what the peer said.

use std::fmt;

use ibcm_ioctl::iba::{AttributeId, RejReason};
use ibcm_ioctl::status;

/// STATUS_ACCESS_DENIED: this account may not open the device, or the operation needs an
/// administrator's handle.
pub const STATUS_ACCESS_DENIED: i32 = status::ACCESS_DENIED;
/// STATUS_OBJECT_NAME_NOT_FOUND: no `\\.\ibcm`: the driver is not installed or not
/// started.
pub const STATUS_OBJECT_NAME_NOT_FOUND: i32 = 0xC000_0034_u32 as i32;
/// STATUS_QUOTA_EXCEEDED: a quota of the driver (per handle, or all users' handles
/// together), or the process's quota.
pub const STATUS_QUOTA_EXCEEDED: i32 = status::QUOTA_EXCEEDED;
/// STATUS_INTERNAL_ERROR: a completion of the provider panicked; the provider failed.
pub const STATUS_INTERNAL_ERROR: i32 = 0xC000_00E5_u32 as i32;
/// STATUS_CONNECTION_DISCONNECTED: the CM ended the connection with its own DREQ, which
/// the peer answered (a stale connection, IBA 12.9.8.3.1); no IOCTL completes with it.
pub const STATUS_CONNECTION_DISCONNECTED: i32 = 0xC000_020C_u32 as i32;
/// STATUS_POSSIBLE_DEADLOCK: a blocking call on the thread that completes the provider's
/// requests, which would wait for itself; await the operation's future instead.
pub const STATUS_POSSIBLE_DEADLOCK: i32 = 0xC000_0194_u32 as i32;

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
        status::DEVICE_NOT_READY => "STATUS_DEVICE_NOT_READY",
        status::IO_TIMEOUT => "STATUS_IO_TIMEOUT",
        status::CONNECTION_REFUSED => "STATUS_CONNECTION_REFUSED",
        STATUS_ACCESS_DENIED => "STATUS_ACCESS_DENIED",
        STATUS_OBJECT_NAME_NOT_FOUND => "STATUS_OBJECT_NAME_NOT_FOUND",
        STATUS_QUOTA_EXCEEDED => "STATUS_QUOTA_EXCEEDED",
        STATUS_INTERNAL_ERROR => "STATUS_INTERNAL_ERROR",
        STATUS_POSSIBLE_DEADLOCK => "STATUS_POSSIBLE_DEADLOCK",
        STATUS_CONNECTION_DISCONNECTED => "STATUS_CONNECTION_DISCONNECTED",
        status::FILE_CLOSED => "STATUS_FILE_CLOSED",
        // FACILITY_NTWIN32: a Win32 error (its code is the low 16 bits).
        _ if (st as u32) >> 16 == 0xC007 => "FACILITY_NTWIN32",
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
        match self.status {
            STATUS_OBJECT_NAME_NOT_FOUND => {
                f.write_str(": no \\\\.\\ibcm, is the ibcm driver installed and started?")?;
            }
            STATUS_ACCESS_DENIED if self.operation == "open" => {
                f.write_str(": this account may not open \\\\.\\ibcm")?;
            }
            STATUS_ACCESS_DENIED => f.write_str(": this needs an administrator's handle")?,
            STATUS_POSSIBLE_DEADLOCK => f.write_str(
                ": a blocking call on the provider's completion thread; await the operation instead",
            )?,
            STATUS_CONNECTION_DISCONNECTED => {
                f.write_str(": the CM disconnected it (its DREQ for a stale connection)")?
            }
            st if (st as u32) >> 16 == 0xC007 => write!(f, ": Win32 error {}", st as u32 & 0xFFFF)?,
            _ => {}
        }
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
