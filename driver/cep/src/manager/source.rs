//! Whether a message for a connection comes from the connection's peer: every message a
//! CEP is named in by its comm ID (REP, RTU, MRA, REJ, DREQ, DREP, LAP, APR; SIDR_REP by
//! its request ID) must come from an address the connection uses (docs/security.md,
//! "Threat model").
//!
//! On InfiniBand the source LID of a MAD is the sending port's, stamped by its HCA (IBA
//! 7.7.5: the LRH SLID; a node cannot send with another's), so a third node can forge
//! every field of a MAD but not where it comes from. On RoCE the source is the GRH's
//! SGID, an IP address any host on the network can send from: there the check narrows
//! the attack to hosts that forge IP addresses.
//!
//! The counterparts match on comm IDs alone: Linux looks a REJ up by its RemoteCommID
//! (`cm_acquire_rejected_id`, cm.c; by (LocalCommID, CA GUID) from the ARI for
//! REJ(Timeout)) and every other message by (RemoteCommID, LocalCommID)
//! (`cm_acquire_id`), AL by the local comm ID (`__lookup_cep`, `__process_rej`,
//! al_cm_cep.c). In REQ_SENT no remote comm ID is known yet, so for them a REJ needs the
//! right 32 bits and nothing more. ibcm is stricter, and still interoperates: both answer
//! a connection's messages on its path (Linux `cm_init_av_by_path`; a REJ to a REQ from
//! `cm_create_response_msg_ah`, the REQ's own source and destination swapped; AL
//! `__format_req_av`), so the peer's messages come from the address the REQ went to, or
//! from the address the peer's REQ came from.
//!
//! An address the connection uses: the one its MADs go to (`dest`, after a migration too),
//! the primary path's remote end, the alternate's, and the alternate a LAP proposes.
//! Compared by LID where both LIDs are unicast (within the local port's LMC: a subnet
//! manager gives every CA port the same LMC, OpenSM's `lmc` option), else by GID (RoCE,
//! or a path with permissive LIDs: Linux `cm_format_req` sends 0xFFFF off the subnet).

use crate::cep::{Cep, State};
use crate::trace::{DropReason, TracePoint};
use crate::types::{CepId, MadAddress, PathRecord};

use ibcm_mad::{AttributeId, CmMessage, Gid};

use super::CmManager;

fn unicast_lid(lid: u16) -> bool {
    (1..0xC000).contains(&lid)
}

impl CmManager {
    /// The CEP a message names by this manager's comm ID (its RemoteCommID; a SIDR_REP's
    /// RequestID), if a live one holds it.
    fn named_by(&self, message: &CmMessage<'_>) -> Option<CepId> {
        let wire = match message {
            CmMessage::Rep(m) => m.remote_comm_id,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.remote_comm_id,
            CmMessage::Mra(m) => m.remote_comm_id,
            CmMessage::Rej(m) => m.remote_comm_id,
            CmMessage::Dreq(m) => m.remote_comm_id,
            CmMessage::Lap(m) => m.remote_comm_id,
            CmMessage::Apr(m) => m.remote_comm_id,
            CmMessage::SidrRep(m) => m.request_id,
            _ => return None,
        };
        self.id_from_wire(wire)
    }

    /// Drops (and counts as forged) a message that names a connection of ours but comes
    /// from an address that connection does not use. True if it was dropped.
    pub(super) fn drop_if_forged(&mut self, src: &MadAddress, message: &CmMessage<'_>) -> bool {
        let Some(id) = self.named_by(message) else {
            return false;
        };
        if self.sent_by_peer(id, src) {
            return false;
        }
        self.forged(message.attribute_id());
        true
    }

    /// Whether `src` is an address the CEP's connection uses (module docs). A CEP with
    /// no peer yet (idle, listening) is no one's: its messages are unmatched, not forged.
    pub(super) fn sent_by_peer(&self, id: CepId, src: &MadAddress) -> bool {
        let Some(c) = self.cep_any(id) else {
            return true;
        };
        if matches!(c.state, State::Idle | State::Listen | State::Removed) {
            return true;
        }
        let lmc = self.port_lmc(src.port);
        peer_addresses(c, self.alternate_of(c), self.pending_of(c)).any(|(lid, gid)| {
            if unicast_lid(lid) && unicast_lid(src.lid) {
                let span = (1u16 << lmc.min(7)) - 1;
                lid & !span == src.lid & !span
            } else {
                src.grh && gid == src.gid
            }
        })
    }

    /// A message dropped as forged: counted and traced.
    pub(super) fn forged(&mut self, attr: AttributeId) {
        self.counters.forged += 1;
        self.trace(TracePoint::Drop {
            attribute: attr.into(),
            reason: DropReason::Forged,
        });
    }
}

/// The remote addresses (LID, GID) a connection uses: its destination, its primary path,
/// and its alternate and pending alternate paths (from the path table).
fn peer_addresses(
    c: &Cep,
    alternate: Option<&PathRecord>,
    pending: Option<&PathRecord>,
) -> impl Iterator<Item = (u16, Gid)> {
    let path = |p: &PathRecord| (p.dlid, p.dgid);
    [
        Some((c.dest.lid, c.dest.gid)),
        Some(path(&c.primary)),
        alternate.map(path),
        pending.map(path),
    ]
    .into_iter()
    .flatten()
}
