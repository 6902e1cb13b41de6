//! The parameters of the CM operations a user chooses: listen, connect (REQ) and accept
//! (REP). The engine takes them as they are; the user library passes them through.

use alloc::vec::Vec;

use crate::enums::{Failover, Mtu, Transport};
use crate::path::PathRecord;
use crate::qp::QpAttributes;

/// A listen: which REQs (and SIDR_REQs) a listening CEP accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenParams {
    /// Service ID to match under `service_mask`.
    pub service_id: u64,
    /// Bits of the service ID that must match (all ones: exact).
    pub service_mask: u64,
    /// Only REQs arriving on this port, or any port.
    pub port: Option<u8>,
    /// Private data the REQ must carry: `(offset, bytes)`, within the 92-byte REQ field.
    pub compare: Option<(u8, Vec<u8>)>,
    /// REQs created by this listen and not yet taken by the user; beyond it new REQs are
    /// dropped silently so the peer retries.
    pub backlog: u32,
}

/// Everything the active side chooses for a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams<'a> {
    /// The service to connect to.
    pub service_id: u64,
    /// Local port.
    pub port: u8,
    /// Partition key.
    pub pkey: u16,
    /// Local QPN (24 bits).
    pub qpn: u32,
    /// Transport.
    pub transport: Transport,
    /// Starting PSN (24 bits), or `None` for a random one.
    pub starting_psn: Option<u32>,
    /// Primary path.
    pub primary_path: PathRecord,
    /// Alternate path, for automatic path migration.
    pub alternate_path: Option<PathRecord>,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// RDMA reads/atomics this side accepts in flight (<= the local CA's limit).
    pub responder_resources: u8,
    /// RDMA reads/atomics this side will issue in flight (<= the local CA's limit).
    pub initiator_depth: u8,
    /// How long the passive side may take to answer (5-bit IB time).
    pub remote_cm_response_timeout: u8,
    /// How long this side may take to answer a REP (5-bit IB time).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count the passive side should use (3 bits).
    pub rnr_retry_count: u8,
    /// CM retries of the REQ and of the REP (4 bits).
    pub max_cm_retries: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// REQ private data (<= 92 bytes).
    pub private_data: &'a [u8],
}

impl ConnectParams<'_> {
    /// RESET -> INIT for the QP these parameters connect, before the REQ is sent: what
    /// the engine's INIT attributes are from the REQ on ([`QpAttributes::init`] of the
    /// local port, the P_Key and this side's responder resources). librdmacm moves its QP
    /// to INIT when it is created (`rdma_create_qp` -> `ucma_init_conn_qp`), before
    /// `rdma_connect`; after the REP it moves it INIT -> INIT with the CM's values
    /// (`ucma_modify_qp_rtr`), which differ from these only when the REP's initiator
    /// depth takes this side's responder resources to or from 0 (`ConnectReply::init`).
    pub const fn init_attributes(&self) -> QpAttributes {
        QpAttributes::init(self.port, self.pkey, self.responder_resources)
    }
}

/// Everything the passive side chooses for a REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepParams<'a> {
    /// Local QPN (24 bits).
    pub qpn: u32,
    /// Starting PSN (24 bits), or `None` for a random one.
    pub starting_psn: Option<u32>,
    /// RDMA reads/atomics this side accepts in flight (<= the local CA's limit).
    pub responder_resources: u8,
    /// RDMA reads/atomics this side will issue (<= the peer's responder resources and the
    /// local CA's limit).
    pub initiator_depth: u8,
    /// RNR retry count the active side should use (3 bits).
    pub rnr_retry_count: u8,
    /// Whether the alternate path of the REQ is accepted.
    pub failover_accepted: Failover,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// REP private data (<= 196 bytes).
    pub private_data: &'a [u8],
}
