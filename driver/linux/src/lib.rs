//! ibcm's third platform, beside the simulated host (`driver/host`) and KMDF: the same
//! dispatch layer and engine (an `ibcm_host::Node`) on a real RDMA device of a Linux
//! machine, in user space.
//!
//! - [`umad`]: QP1 through the kernel's user MAD interface (`/dev/infiniband/umadN`): an
//!   agent for the CM class (0x07, version 2), a GRH on every MAD (RoCE), the node's
//!   timer on the real clock, all on one thread per port that waits on the umad file,
//!   the device's async events and an eventfd (`eventfd`). The kernel's own `ib_cm` must
//!   not be loaded: it holds the class.
//! - [`verbs`]: RC QPs, CQs and memory regions through libibverbs (loaded at run time:
//!   nothing of rdma-core is needed to build); a QP is moved to
//!   INIT, RTR and RTS with exactly the attributes the engine returned (the user
//!   library's QP transition records), as a Windows verbs provider would apply them.
//! - [`cq`]: completion queues, a QP's own (with a channel to sleep on) or shared.
//! - [`ud`]: UD QPs and address handles, for the datagram services ibcm resolves with
//!   SIDR (a UD QP's INIT takes a Q_Key; receives start with the 40-byte GRH).
//! - [`port_events`]: the device's asynchronous events, read by the umad port's thread;
//!   the port leaving or becoming ACTIVE is told to the engine (the port gone, the port
//!   told again).
//! - `pkey_table`: the umad port's P_Key table, read entry by entry as far as lookups
//!   need.
//! - `port_indices`: the P_Key and GID indices found in a port's tables, kept until the
//!   port's events say the table changed.
//! - [`sysfs`]: which umad device and CA GUID belong to an RDMA device.
//!
//! Nothing here decides anything about a connection: what is not in the engine's records
//! is either the device's (its GID table) or stated where it is set (the RNR NAK timer,
//! which no CM message carries).
#![warn(missing_docs)]
#![cfg_attr(not(target_os = "linux"), forbid(unsafe_code))]

#[cfg(target_os = "linux")]
pub mod cq;
#[cfg(target_os = "linux")]
mod eventfd;
#[cfg(target_os = "linux")]
mod ibv;
#[cfg(target_os = "linux")]
mod pkey_table;
#[cfg(target_os = "linux")]
pub mod port_events;
#[cfg(target_os = "linux")]
mod port_indices;
#[cfg(target_os = "linux")]
pub mod sysfs;
#[cfg(target_os = "linux")]
pub mod ud;
#[cfg(target_os = "linux")]
pub mod umad;
#[cfg(target_os = "linux")]
pub mod verbs;

/// The CPU time this process has used so far, (user, system) (`getrusage(RUSAGE_SELF)`):
/// what a run cost besides its wall time (polling a CQ costs CPU, sleeping on a
/// completion channel does not).
#[cfg(target_os = "linux")]
pub fn process_cpu() -> (std::time::Duration, std::time::Duration) {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-pointer for the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Default::default();
    }
    let t = |tv: libc::timeval| {
        std::time::Duration::from_secs(u64::try_from(tv.tv_sec).unwrap_or(0))
            + std::time::Duration::from_micros(u64::try_from(tv.tv_usec).unwrap_or(0))
    };
    (t(usage.ru_utime), t(usage.ru_stime))
}
