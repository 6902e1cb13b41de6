//! The QP attributes of a CEP's INIT, RTR and RTS transitions (IBA 12.7.x; what Linux
//! `ib_cm_init_qp_attr` and WinOF `al_cep_get_rtr/rts_attr` fill in).

use crate::cep::Cep;
use crate::types::PathRecord;
use ibcm_iba::{AddressVector, MigrationState, QpAttributes, QpState, access, ack_timeout};

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
        .map(|p| av(p, ack_timeout(p.packet_life_time, c.target_ack_delay)));
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
            a.rq_psn = Some(c.remote_psn);
            a.max_dest_rd_atomic = Some(c.responder_resources);
            a.primary = Some(av(c.primary, c.ack_timeout));
            a.alternate = alternate;
        }
        QpState::Rts => {
            a.sq_psn = Some(c.local_psn);
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
