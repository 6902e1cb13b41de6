//! The QP attributes of a CEP's INIT, RTR and RTS transitions (IBA 12.7.x; what Linux
//! `ib_cm_init_qp_attr` and WinOF `al_cep_get_rtr/rts_attr` fill in).

use crate::cep::Cep;
use crate::types::PathRecord;
use ibcm_iba::{AddressVector, MigrationState, QpAttributes, QpState};

/// INIT, RTR and RTS attributes as Linux `cm_init_qp_{init,rtr,rts}_attr` computes them.
/// `alternate_port` is the local port the alternate path leaves from: its own, which may
/// be another port of the CA than the primary's (APM across ports). AL places each path
/// by its source GID (`__format_path_av` -> `__find_port_cep`, al_cm_cep.c:4570-4579, for
/// a REQ's alternate 4815 and a LAP's 5766), and Linux sets `alt_port_num` from the
/// alternate AV's own port (cm.c `cm_init_qp_rtr_attr`: `cm_id_priv->alt_av.port`, found
/// by `cm_init_av_by_path` from the path's SGID). `alternate` is the CEP's alternate path
/// (the manager's path table keeps it).
pub(super) fn qp_attributes_of(
    c: &Cep,
    state: QpState,
    alternate: Option<&PathRecord>,
    alternate_port: u8,
) -> QpAttributes {
    let mut a = QpAttributes::empty(state);
    let primary = AddressVector {
        path: c.primary,
        port: c.dest.port,
        ack_timeout: c.ack_timeout,
    };
    let alternate = alternate
        .filter(|p| p.is_present())
        .map(|&p| AddressVector {
            path: p,
            port: alternate_port,
            ack_timeout: c.path_ack_timeout(p.packet_life_time),
        });
    match state {
        QpState::Init => a = QpAttributes::init(c.dest.port, c.pkey, c.responder_resources),
        QpState::Rtr => {
            a.path_mtu = Some(c.path_mtu);
            a.dest_qpn = Some(c.remote_qpn);
            // The StartingPSN this side sent (its REQ or REP) is the PSN its receive queue
            // expects (IBA 12.7.7/12.7.21; Linux `ib_send_cm_req`/`ib_send_cm_rep` set
            // `rq_psn` from their own message).
            a.rq_psn = Some(c.local_psn);
            a.max_dest_rd_atomic = Some(c.responder_resources);
            a.primary = Some(primary);
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
