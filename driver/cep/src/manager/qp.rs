//! The QP attributes of a CEP's INIT, RTR and RTS transitions (IBA 12.7.x; what Linux
//! `ib_cm_init_qp_attr` and WinOF `al_cep_get_rtr/rts_attr` fill in).

use crate::cep::Cep;
use crate::types::PathRecord;
use ibcm_iba::{AddressVector, MigrationState, QpAttributes, QpState, access};

/// INIT, RTR and RTS attributes as Linux `cm_init_qp_{init,rtr,rts}_attr` computes them.
pub(super) fn qp_attributes_of(c: &Cep, state: QpState) -> QpAttributes {
    let mut a = QpAttributes::empty(state);
    let av = |path: PathRecord, ack: u8| AddressVector {
        path,
        port: c.dest.port,
        ack_timeout: ack,
    };
    let alternate = c
        .alternate
        .filter(|p| p.is_present())
        .map(|p| av(p, c.path_ack_timeout(p.packet_life_time)));
    match state {
        QpState::Init => {
            let mut flags = access::LOCAL_WRITE | access::REMOTE_WRITE;
            if c.responder_resources > 0 {
                flags |= access::REMOTE_READ | access::REMOTE_ATOMIC;
            }
            a.port = Some(c.dest.port);
            a.pkey = Some(c.pkey);
            a.access_flags = Some(flags);
        }
        QpState::Rtr => {
            a.path_mtu = Some(c.path_mtu);
            a.dest_qpn = Some(c.remote_qpn);
            // The StartingPSN this side sent (its REQ or REP) is the PSN its receive queue
            // expects (IBA 12.7.7/12.7.21; Linux `ib_send_cm_req`/`ib_send_cm_rep` set
            // `rq_psn` from their own message).
            a.rq_psn = Some(c.local_psn);
            a.max_dest_rd_atomic = Some(c.responder_resources);
            a.primary = Some(av(c.primary, c.ack_timeout));
            a.alternate = alternate;
        }
        QpState::Rts => {
            // The peer's StartingPSN is where this side's sends begin (Linux
            // `cm_req_handler`/`cm_rep_handler`: `sq_psn` from the peer's message).
            a.sq_psn = Some(c.remote_psn);
            a.timeout = Some(c.ack_timeout);
            a.retry_count = Some(c.retry_count);
            a.rnr_retry = Some(c.rnr_retry);
            a.max_rd_atomic = Some(c.initiator_depth);
            if alternate.is_some() {
                a.alternate = alternate;
                a.path_mig_state = Some(MigrationState::Rearm);
            }
        }
    }
    a
}
