//! The Linux platform of ibcm: it stands in for the kernel so the whole driver runs, end
//! to end, in tests, benches and the CLI.
//!
//! - [`HostPlatform`] implements the dispatch layer's [`Platform`](ibcm_endpoint::Platform):
//!   a lock the verifier can see, requests with bounded output buffers, a clock, one
//!   timer and an outbox of MADs.
//! - [`verifier`] enforces what Driver Verifier would: every request completed exactly
//!   once, never after its cancellation, never under a lock, never past its output
//!   buffer; every request and endpoint accounted for at close; no allocation at
//!   DISPATCH_LEVEL (the receive path and the timer run "at DISPATCH"; counted with the
//!   feature `count-allocations`, which the project's tests and CLI turn on and the user
//!   library never does: its counter replaces the program's global allocator).
//! - [`Fabric`] joins host nodes in virtual time.
//! - [`wire`] builds and takes apart the RoCEv2 packet of a QP1 MAD (IPv4 / UDP / BTH /
//!   DETH / MAD / ICRC).
//! - [`pcap`] writes what the fabric captured as RoCEv2 frames in a pcap file.
//! - [`rocev2`] (Linux) puts a node on a real link: QP1 over UDP 4791, on a raw socket.
//! - [`SharedPort`] carries two CMs on one port, ibcm's and a stand-in for WinOF AL's,
//!   every received MAD steered by ibcm's engine (issue #19).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod counting;
mod fabric;
mod node;
pub mod pcap;
mod platform;
pub mod records;
#[cfg(target_os = "linux")]
pub mod rocev2;
mod steering;
mod trace;
pub mod verifier;
mod wake;
pub mod wire;

pub use clock::Clock;
pub use fabric::{Captured, Fabric, FaultCounts, Faults, Realtime, node_address, node_guid};
pub use node::{DpcTimes, Node, file_key};
pub use platform::{CompletionHook, HostLock, HostPlatform, HostRequest};
pub use steering::{AL_STAND_IN, STEER_ROWS, SharedPort, SteerCounts};
pub use trace::{TRACING, TracingSink};
pub use wake::Wake;
