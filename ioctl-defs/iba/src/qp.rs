//! QP attributes for the INIT, RTR and RTS transitions, computed from the REQ and REP
//! exchanged (IBA 12.7.x; the same fields Linux `ib_cm_init_qp_attr` and WinOF
//! `al_cep_get_rtr/rts_attr` fill in).

use crate::enums::Mtu;
use crate::time::{ib_time_from_ns_ceil, ib_time_ns};

use crate::path::PathRecord;

/// Target QP state of a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Reset -> INIT.
    Init,
    /// INIT -> RTR (ready to receive).
    Rtr,
    /// RTR -> RTS (ready to send).
    Rts,
}

/// QP access flags (`IB_ACCESS_*`).
pub mod access {
    /// Local write.
    pub const LOCAL_WRITE: u32 = 1;
    /// Remote RDMA write.
    pub const REMOTE_WRITE: u32 = 1 << 1;
    /// Remote RDMA read.
    pub const REMOTE_READ: u32 = 1 << 2;
    /// Remote atomic.
    pub const REMOTE_ATOMIC: u32 = 1 << 3;
}

/// Automatic path migration state (`IB_MIG_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigrationState {
    /// The alternate path is loaded and armed.
    Rearm,
    /// Migration happened; the alternate path is in use.
    Migrated,
}

/// An address vector: a path plus the local ACK timeout to use on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// The path.
    pub path: PathRecord,
    /// Local port.
    pub port: u8,
    /// Local ACK timeout (5-bit IB time): >= 2 x packet life + the peer's ACK delay.
    pub ack_timeout: u8,
}

/// The attributes of one QP transition. Fields a transition does not set are `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpAttributes {
    /// The target state.
    pub state: QpState,
    /// INIT: local port.
    pub port: Option<u8>,
    /// INIT: partition key.
    pub pkey: Option<u16>,
    /// INIT: access flags.
    pub access_flags: Option<u32>,
    /// RTR: path MTU.
    pub path_mtu: Option<Mtu>,
    /// RTR: the peer's QPN.
    pub dest_qpn: Option<u32>,
    /// RTR: the PSN expected from the peer.
    pub rq_psn: Option<u32>,
    /// RTR: RDMA reads/atomics accepted in flight (this side's responder resources).
    pub max_dest_rd_atomic: Option<u8>,
    /// RTR: the primary address vector.
    pub primary: Option<AddressVector>,
    /// RTR/RTS: the alternate address vector, when one was negotiated.
    pub alternate: Option<AddressVector>,
    /// RTS: the PSN of the first packet sent.
    pub sq_psn: Option<u32>,
    /// RTS: local ACK timeout (5-bit IB time).
    pub timeout: Option<u8>,
    /// RTS: transport retry count.
    pub retry_count: Option<u8>,
    /// RTS: RNR retry count.
    pub rnr_retry: Option<u8>,
    /// RTS: RDMA reads/atomics issued in flight (this side's initiator depth).
    pub max_rd_atomic: Option<u8>,
    /// RTS: path migration state, when an alternate path is loaded.
    pub path_mig_state: Option<MigrationState>,
}

impl QpAttributes {
    /// A transition to `state` with no attribute set yet.
    pub const fn empty(state: QpState) -> Self {
        Self {
            state,
            port: None,
            pkey: None,
            access_flags: None,
            path_mtu: None,
            dest_qpn: None,
            rq_psn: None,
            max_dest_rd_atomic: None,
            primary: None,
            alternate: None,
            sq_psn: None,
            timeout: None,
            retry_count: None,
            rnr_retry: None,
            max_rd_atomic: None,
            path_mig_state: None,
        }
    }

    /// RESET -> INIT for a connection on local `port` in partition `pkey` that serves
    /// `responder_resources` RDMA reads/atomics at once: the port, the P_Key and the access
    /// flags, nothing the REQ or REP negotiates beyond the read limit. As Linux
    /// `cm_init_qp_init_attr` (drivers/infiniband/core/cm.c) but for one flag: Linux sets
    /// REMOTE_WRITE, plus REMOTE_READ | REMOTE_ATOMIC when the connection has responder
    /// resources (from about v6.2 also FLUSH_GLOBAL | FLUSH_PERSISTENT there, on a device
    /// that supports FLUSH), and the AV's port and P_Key index. LOCAL_WRITE is ibcm's own
    /// (older Linux set it too): a QP's access flags govern only inbound remote
    /// operations, so it changes nothing. The engine's INIT for a CEP is this, and so is
    /// what an active side applies before its REQ (`ConnectParams::init_attributes`), as
    /// librdmacm's `rdma_create_qp` moves the QP to INIT before `rdma_connect`.
    pub const fn init(port: u8, pkey: u16, responder_resources: u8) -> Self {
        let mut flags = access::LOCAL_WRITE | access::REMOTE_WRITE;
        if responder_resources > 0 {
            flags |= access::REMOTE_READ | access::REMOTE_ATOMIC;
        }
        let mut a = Self::empty(QpState::Init);
        a.port = Some(port);
        a.pkey = Some(pkey);
        a.access_flags = Some(flags);
        a
    }
}

/// The local ACK timeout for a path: the smallest IB time >= 2 x packet life time + the
/// receiving CA's ACK delay (IBA 12.7.34), computed exactly in integers.
pub fn ack_timeout(packet_life_time: u8, ack_delay: u8) -> u8 {
    let two_plt = ib_time_ns(packet_life_time.min(30) + 1).unwrap_or(u64::MAX);
    let delay = ib_time_ns(ack_delay.min(31)).unwrap_or(u64::MAX);
    ib_time_from_ns_ceil(two_plt.saturating_add(delay))
}

#[cfg(test)]
mod tests {
    use super::ack_timeout;

    #[test]
    fn ack_timeout_is_the_exact_ceiling() {
        // 2 x 4.096us*2^14 + 4.096us*2^15 = 4.096us*2^16 exactly.
        assert_eq!(ack_timeout(14, 15), 16);
        // 2 x 2^14 + 2^14 = 3 x 2^14 -> 2^16 (next power up).
        assert_eq!(ack_timeout(14, 14), 16);
        // 2 x 2^0 + 2^0 = 3 -> 2^2.
        assert_eq!(ack_timeout(0, 0), 2);
        // A negligible ACK delay rounds the doubled life time up by one.
        assert_eq!(ack_timeout(18, 0), 20);
        assert_eq!(ack_timeout(31, 31), 31);
    }
}
