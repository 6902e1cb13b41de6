//! The CEP (communication endpoint) manager of ibcm: IBA Vol 1 chapter 12 connection
//! establishment and release, sans-IO.
//!
//! [`CmManager`] holds every CEP of one CA. It is driven by its owner (the KMDF binding on
//! Windows, the host platform on Linux) with received MADs, timeouts and user operations,
//! and hands back MADs to send, events for CEP owners and the next deadline. See
//! [`CmManager`] for the call order.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

mod cep;
mod comm_id;
mod config;
mod counters;
mod error;
mod event;
pub mod grow;
mod manager;
mod path_table;
mod pdata_pool;
mod trace;
mod types;

pub use cep::StateName;
pub use config::CmConfig;
pub use counters::{COUNTED_ATTRIBUTES, Counters, slot as counter_slot};
pub use error::CmError;
pub use event::{Event, RepInfo, ReqInfo, SidrRepInfo, SidrReqInfo};
pub use ibcm_iba::{
    AddressVector, ConnectParams, ListenParams, MigrationState, PathRecord, QpAttributes, QpState,
    RepParams, access, ack_timeout,
};
pub use manager::{
    CepInfo, CmManager, EngineMemory, MadOwner, PORT_SCAN_SLOTS, PreparedRep, SidrParams,
    SidrReplyParams, TIMER_BATCH, Transmit,
};
pub use trace::{DropReason, Level, TracePoint, Tracer};
pub use types::{CepId, Instant, MadAddress, PrivateData, RejectParams};

#[cfg(feature = "pair")]
pub mod pair;
