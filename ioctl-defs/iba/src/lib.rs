//! The InfiniBand values a connection manager and its users speak in, shared by the CM MAD
//! codec (`ibcm-mad`), the CEP engine (`ibcm-cep`), the IOCTL ABI (`ibcm-ioctl`) and the
//! user library (`ibcm`): the wire enumerations of IBA Vol 1 ch. 12, IB time, the RDMA-CM
//! IP header (Annex A11), path records, QP attributes and the parameters of listen,
//! connect and accept.
//!
//! It holds values, not behaviour: no state, no I/O, nothing that a user-mode library
//! would not want to link. The codec and the engine re-export what they use, so
//! `ibcm_mad::RejReason` and `ibcm_iba::RejReason` are one type.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

mod enums;
mod params;
mod path;
mod qp;
mod rdma_cm;
mod time;

pub use enums::{
    AprStatus, AttributeId, Failover, MessageKind, Method, Mtu, Rate, RejReason, SidrStatus,
    Transport,
};
pub use params::{ConnectParams, ListenParams, RepParams};
pub use path::{Gid, PathRecord};
pub use qp::{AddressVector, MigrationState, QpAttributes, QpState, access, ack_timeout};
pub use rdma_cm::{
    IP_HEADER_SIZE, IP_HEADER_VERSION, IpHeader, IpHeaderError, IpServiceId, PortSpace,
};
pub use time::{IB_TIME_BASE_NS, IB_TIME_MAX, ib_time_from_ns_ceil, ib_time_ns};
