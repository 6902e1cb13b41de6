//! What the manager reports to the owner of a CEP.

use ibcm_mad::{AttributeId, MessageKind, RejReason};

use crate::types::{CepId, PathRecord, PrivateData};

/// A connection request that reached a listen: everything a consumer needs to decide and
/// to build its QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqInfo {
    /// The port the REQ arrived on.
    pub port: u8,
    /// The listening CEP that matched.
    pub listen: CepId,
    /// ServiceID of the REQ.
    pub service_id: u64,
    /// The peer's CA GUID.
    pub remote_ca_guid: u64,
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// Partition key.
    pub pkey: u16,
    /// The primary path, from this side's point of view.
    pub primary_path: PathRecord,
    /// The alternate path, if the REQ carries one.
    pub alternate_path: Option<PathRecord>,
    /// Path MTU code.
    pub path_mtu: ibcm_mad::Mtu,
    /// Transport.
    pub transport: ibcm_mad::Transport,
    /// The peer's responder resources: the most this side may use as initiator depth.
    pub peer_responder_resources: u8,
    /// The peer's initiator depth: how many reads the peer will have in flight.
    pub peer_initiator_depth: u8,
    /// RNR retry count the peer asks this side to use.
    pub rnr_retry_count: u8,
    /// The peer's StartingPSN (24 bits): the PSN its receive queue expects first.
    pub starting_psn: u32,
    /// The peer's MaxCMRetries (4 bits).
    pub max_cm_retries: u8,
    /// The peer's RemoteCMResponseTimeout (5 bits): how long it gives this side to answer.
    pub remote_cm_response_timeout: u8,
    /// The peer's LocalCMResponseTimeout (5 bits): how long it takes to answer a REQ.
    pub local_cm_response_timeout: u8,
    /// The peer's EndToEndFlowControl.
    pub flow_control: bool,
    /// The peer's RetryCount (3 bits) for this side's send queue.
    pub retry_count: u8,
    /// The peer uses an SRQ.
    pub srq: bool,
    /// REQ private data (92 bytes).
    pub private_data: PrivateData,
}

/// A REP received by the active side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepInfo {
    /// The peer's CA GUID.
    pub remote_ca_guid: u64,
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// The peer's starting PSN.
    pub remote_psn: u32,
    /// The peer's responder resources.
    pub peer_responder_resources: u8,
    /// The peer's initiator depth.
    pub peer_initiator_depth: u8,
    /// FailoverAccepted.
    pub failover_accepted: ibcm_mad::Failover,
    /// The RNR retry count the peer asks this side to use (3 bits).
    pub rnr_retry_count: u8,
    /// The peer's EndToEndFlowControl.
    pub flow_control: bool,
    /// The peer's TargetACKDelay (5 bits).
    pub target_ack_delay: u8,
    /// The peer uses an SRQ.
    pub srq: bool,
    /// REP private data (196 bytes).
    pub private_data: PrivateData,
}

/// A SIDR_REQ that reached a listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReqInfo {
    /// The listening CEP that matched.
    pub listen: CepId,
    /// The port it arrived on.
    pub port: u8,
    /// ServiceID.
    pub service_id: u64,
    /// PartitionKey.
    pub pkey: u16,
    /// The requester's address.
    pub source: crate::types::MadAddress,
    /// SIDR_REQ private data (216 bytes).
    pub private_data: PrivateData,
}

/// A SIDR_REP received by the requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRepInfo {
    /// Status.
    pub status: ibcm_mad::SidrStatus,
    /// The service's UD QPN.
    pub qpn: u32,
    /// The service's Q_Key.
    pub qkey: u32,
    /// Additional information (a ClassPortInfo on redirect).
    pub info: [u8; 72],
    /// Length of the additional information.
    pub info_len: u8,
    /// SIDR_REP private data (136 bytes).
    pub private_data: PrivateData,
}

/// One event on one CEP, in the order the manager produced them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A REQ matched a listen and created this (new) CEP; it is reported on the new CEP
    /// and names the listen in [`ReqInfo::listen`].
    ReqReceived(ReqInfo),
    /// The passive side answered the REQ (active side).
    RepReceived(RepInfo),
    /// The active side's RTU arrived: the connection is established (passive side).
    RtuReceived(PrivateData),
    /// The peer acknowledged a message and asked for more time (only the first MRA per
    /// message is reported).
    MraReceived {
        /// ServiceTimeout the peer asked for.
        service_timeout: u8,
        /// MRA private data (222 bytes).
        private_data: PrivateData,
    },
    /// The peer rejected the connection.
    Rejected {
        /// Reason.
        reason: RejReason,
        /// Which message the peer rejected.
        message: MessageKind,
        /// Additional rejection information.
        ari: [u8; 72],
        /// Length of the ARI.
        ari_len: u8,
        /// REJ private data (148 bytes).
        private_data: PrivateData,
    },
    /// A message was sent MaxCMRetries + 1 times without an answer (or its deadline
    /// passed). For a REQ or a REP a REJ(Timeout) has been sent to the peer.
    Timeout {
        /// The message that went unanswered.
        message: AttributeId,
    },
    /// The peer asks to disconnect; answer with a DREP.
    DreqReceived(PrivateData),
    /// The peer answered this side's DREQ.
    DrepReceived(PrivateData),
    /// The peer asks to load an alternate path (LAP); answer with an APR
    /// ([`CmManager::prepare_apr`](crate::CmManager::prepare_apr) then `send_apr`).
    LapReceived {
        /// The alternate path, from this side's point of view.
        alternate_path: PathRecord,
        /// LAP private data (168 bytes).
        private_data: PrivateData,
    },
    /// The peer answered this side's LAP.
    AprReceived {
        /// APStatus.
        status: ibcm_mad::AprStatus,
        /// Additional information.
        info: [u8; 72],
        /// Length of the additional information.
        info_len: u8,
        /// APR private data (148 bytes).
        private_data: PrivateData,
    },
    /// A SIDR_REQ matched a listen and created this (new) CEP: answer with
    /// [`CmManager::sidr_reply`](crate::CmManager::sidr_reply).
    SidrReqReceived(SidrReqInfo),
    /// The answer to this side's SIDR_REQ.
    SidrRepReceived(SidrRepInfo),
    /// The port this CEP used was removed: nothing more will be sent or received; destroy
    /// the CEP (no network needed).
    DeviceRemoval,
    /// Timewait is over: the QP may be reused. This is the last event of a connection
    /// that reached the QP's RTR state; one that failed earlier ends with its `Rejected`
    /// or `Timeout` event.
    TimewaitExit,
}
