//! The dispatch layer of ibcm: every IOCTL goes through [`Device::dispatch`], every
//! received MAD through [`Device::receive`], every timer expiry through
//! [`Device::timer_expired`].
//!
//! - Endpoint handles are per file (index + generation): a file can only name its own
//!   endpoints; REQs on a listen create endpoints in the listen's file.
//! - Inputs are validated completely before any state changes; every failure completes
//!   with a precise NTSTATUS and leaves no trace.
//! - Each endpoint has a FIFO of event records and a queue of pending GET_EVENT requests:
//!   an event completes a waiting request at once (one system call per event at most),
//!   and a request completes with as many queued events as its buffer holds.
//! - Requests are completed, MADs posted and the timer armed only after the lock is
//!   released.
//!
//! Generic over [`Platform`]: the KMDF binding and the Linux host implement it.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

mod device;
mod platform;
mod ports;
mod records;
mod ring;
mod trace;

pub use device::{
    Callback, Caller, ClientEvent, ClientId, Device, DispatchMemory, FileId, Held, Inner,
    MAX_BACKLOG, Quotas, RECEIVE_BATCH, Refused, USER_MAX_PACKET_LIFE_TIME, UserTotals,
    oversized_input,
};
pub use platform::{Lock, Platform, Request};
pub use ports::{MAX_HOST_PORTS, PortNumbers};
pub use records::{Status, status_of};
pub use ring::{ReceiveRing, Received};
pub use trace::{DispatchPoint, DispatchTracer};
