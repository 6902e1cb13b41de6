//! `ibcm`: the user-mode library of the ibcm InfiniBand Connection Manager, in the mould of
//! WinVerbs (`IWVProvider`, `IWVConnectEndpoint`) and NetworkDirect (`IND2Connector`,
//! `IND2Listener`).
//!
//! A [`Provider`] is one open handle to the device. From it come [`Listener`]s and
//! [`ConnectEndpoint`]s. Every operation exists in three forms:
//!
//! - blocking: `ep.connect(&params)`;
//! - a Rust future: `ep.connect_async(&params)` (no runtime needed; any executor);
//! - overlapped: `ibcm::spawn(ep.connect_async(&params), &overlapped)`, completed on the
//!   [`Overlapped`] and, if it has one, queued on a [`CompletionPort`] — the IOCP model
//!   WinVerbs and ND providers expect.
//!
//! On Windows one library thread completes a provider's requests, and runs the steps of
//! its spawned operations: there, await the futures; a blocking operation fails with
//! [`STATUS_POSSIBLE_DEADLOCK`] rather than wait for itself (see `backend::device`).
//!
//! Errors name the failing operation and carry the NTSTATUS (and the peer's REJ reason).
//! Dropping an endpoint destroys it; cancellation is explicit (`cancel`).
//!
//! Two backends speak the same IOCTL byte records: the installed driver on Windows
//! ([`Provider::open`]), and, with the `in-process` feature (off by default), the driver's
//! own dispatch code running in this process on a simulated fabric
//! (`Provider::in_process`), which is how everything is tested on Linux. Without that
//! feature the library links only the ABI (`ibcm-ioctl`), `zerocopy` and, on Windows,
//! `windows-sys`.
//!
//! # Example: connect and accept
//!
//! ```
//! use ibcm::{Fabric, ListenParams, Provider, ConnectParams, AcceptParams, Realtime};
//!
//! // Two nodes on a simulated fabric running in real time.
//! let fabric = Realtime::start(Fabric::with_clock(2, 1, ibcm::Clock::real()));
//! let server = Provider::in_process(fabric.node(1).unwrap()).unwrap();
//! let client = Provider::in_process(fabric.node(0).unwrap()).unwrap();
//!
//! let listener = server.listen(&ListenParams {
//!     service_id: 0x1000, service_mask: u64::MAX, port: None, compare: None, backlog: 8,
//! })?;
//! let server_thread = std::thread::spawn(move || -> ibcm::Result<Vec<u8>> {
//!     let request = listener.get_request()?;
//!     let qp = request.endpoint.prepare_accept(&AcceptParams {
//!         qpn: 0x22, starting_psn: None, responder_resources: 1, initiator_depth: 1,
//!         rnr_retry_count: 7, failover_accepted: ibcm::Failover::NotSupported,
//!         flow_control: true, srq: false, private_data: b"welcome",
//!     })?;
//!     assert_eq!(qp.rtr.dest_qpn, Some(0x11)); // modify the QP to INIT/RTR/RTS here
//!     request.endpoint.accept()?; // REP sent; completes on the RTU
//!     Ok(request.private_data)
//! });
//!
//! let ep = client.connect_endpoint()?;
//! let mut params = ibcm::example_connect_params(0x1000, 0x11, 0, 1);
//! params.private_data = b"hello";
//! let reply = ep.connect(&params)?; // REQ sent; completes on the REP
//! assert_eq!(reply.private_data[..7], *b"welcome");
//! assert_eq!(reply.rtr.dest_qpn, Some(0x22));
//! ep.rtu(&[])?;
//! assert_eq!(server_thread.join().unwrap()?[..5], *b"hello");
//! ep.disconnect(&[])?;
//! # Ok::<(), ibcm::Error>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
mod channel;
mod completion;
mod connection;
mod endpoint;
mod error;
mod migration;
mod provider;

pub use completion::{CompletionPacket, CompletionPort, Overlapped, Panicked, block_on, spawn};
pub use connection::{ConnectEndpoint, ConnectReply, ConnectionRequest, Listener, QpTransitions};
pub use error::{
    Detail, Error, Result, STATUS_ACCESS_DENIED, STATUS_CONNECTION_DISCONNECTED,
    STATUS_INTERNAL_ERROR, STATUS_OBJECT_NAME_NOT_FOUND, STATUS_POSSIBLE_DEADLOCK,
    STATUS_QUOTA_EXCEEDED, status_name,
};
pub use migration::{
    AprReply, DatagramEndpoint, DatagramRequest, LapRequest, ResolveParams, SidrReply,
};
pub use provider::Provider;

pub use ibcm_ioctl::iba::{
    AprStatus, Failover, IpHeader, IpServiceId, MigrationState, Mtu, Rate, RejReason, SidrStatus,
    Transport,
};
pub use ibcm_ioctl::iba::{
    ConnectParams, ListenParams, PathRecord, QpAttributes, QpState, RepParams as AcceptParams,
};

/// The simulated fabric the in-process backend runs on.
#[cfg(feature = "in-process")]
pub use ibcm_host::{Clock, Fabric, Faults, Realtime};

/// Connect parameters for a path between nodes `from` and `to` of the simulated fabric
/// (IBA defaults otherwise): a starting point for examples and tests.
#[cfg(feature = "in-process")]
pub fn example_connect_params(
    service_id: u64,
    qpn: u32,
    from: usize,
    to: usize,
) -> ConnectParams<'static> {
    let (a, b) = (ibcm_host::node_address(from), ibcm_host::node_address(to));
    ConnectParams {
        service_id,
        port: 1,
        pkey: 0xffff,
        qpn,
        transport: Transport::Rc,
        starting_psn: None,
        primary_path: PathRecord {
            slid: a.lid,
            dlid: b.lid,
            sgid: a.gid,
            dgid: b.gid,
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 0,
            sl: 0,
            rate: Rate::Gbps100,
            packet_life_time: 14,
            subnet_local: true,
        },
        alternate_path: None,
        path_mtu: Mtu::Mtu4096,
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_response_timeout: 16,
        local_cm_response_timeout: 16,
        retry_count: 7,
        rnr_retry_count: 7,
        max_cm_retries: 8,
        srq: false,
        flow_control: true,
        private_data: &[],
    }
}
