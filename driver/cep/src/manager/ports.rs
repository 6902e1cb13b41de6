//! This CA's ports as the REQ's paths must name them: REJ reasons 12/13 (InvalidGID,
//! InvalidLID) and 18/19 (their alternate-path twins; 14/15 are InvalidSL and
//! InvalidTrafficClass), IBA 12.6.7 (the REJ, Table 108, and its table of reasons).
//!
//! The passive side's own port is the REQ path's *remote* port (IBA Table 106: "Primary
//! Remote Port GID/LID" name the passive side). Anchors:
//!
//! - Linux `cm_req_handler` rejects with INVALID_GID when `cm_init_av_by_path` cannot
//!   find the primary path's GID on the device (ARI: GID index 0 of the receiving port,
//!   16 bytes), and with INVALID_ALT_GID for the alternate path (ARI: the primary path's
//!   GID); it never checks LIDs (and sends permissive LIDs, 0xFFFF, when a path is not
//!   subnet-local: `cm_format_req`, "Work-around until there's a way to obtain remote LID
//!   info").
//! - WinOF `__format_req_av` looks the port up by GID, LID (within the port's LMC range,
//!   `__is_lid_valid`) and P_Key (`__find_port_cep`) but sends no REJ: a REQ it cannot
//!   place fails later, at the REP.
//!
//! Ours: the GID must be in some port's GID table (REJ 12 / 18), then, on a subnet-local
//! path whose LID is not permissive (0xFFFF, also what RoCE carries), the LID must be in
//! that port's range base ..= base | (2^LMC - 1) (REJ 13 / 19; ARI: the port's base LID,
//! 2 bytes). A manager told of no port checks nothing (as before: tests, fuzzers and a
//! host that cannot tell keep working).

use alloc::vec::Vec;

use ibcm_mad::{Gid, Path, RejReason, Req};

use crate::error::CmError;
use crate::types::MadAddress;

use super::CmManager;

/// One port of this CA as [`CmManager::set_port`] was told of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PortAddress {
    port: u8,
    /// Base LID (0 or 0xFFFF: none, as on RoCE).
    lid: u16,
    /// LID mask control: the port answers 2^lmc LIDs from `lid`.
    lmc: u8,
    gids: Vec<Gid>,
}

impl PortAddress {
    fn has_lid(&self, lid: u16) -> bool {
        let span = (1u32 << self.lmc.min(7)) - 1;
        let base = u32::from(self.lid) & !span;
        (base..=base | span).contains(&u32::from(lid))
    }

    pub(super) fn port_number(&self) -> u8 {
        self.port
    }

    fn checks_lids(&self) -> bool {
        self.lid != 0 && self.lid != PERMISSIVE_LID
    }
}

/// The CA GUID of each port: one CM serves the ports of several CAs (host port numbers,
/// ibcm-endpoint's ports.rs), and a message names the CA of the port it leaves by
/// (REQ/REP LocalCAGUID, IBA Tables 103/106; the ARI of REJ(Timeout), Table 108). Peers
/// key their stale-connection check by (CA GUID, QPN) (Linux `cm_insert_remote_qpn`,
/// `cm_match_req`): two CAs that reuse a QPN towards one peer must not share a GUID.
/// A port nobody told of is the configured [`CmConfig::ca_guid`](crate::CmConfig)'s.
#[derive(Debug, Clone)]
pub(super) struct PortCas {
    /// By port number; 0: not told.
    guids: [u64; 256],
}

impl PortCas {
    pub(super) const fn new() -> Self {
        Self { guids: [0; 256] }
    }
}

/// The permissive LID: what Linux puts in a REQ's path LIDs when the path is not
/// subnet-local, and what a RoCE path carries (no LIDs).
const PERMISSIVE_LID: u16 = 0xFFFF;

/// A REQ path check that failed: the reason and its ARI.
pub(super) struct PathRejection {
    pub(super) reason: RejReason,
    pub(super) ari: [u8; 16],
    pub(super) ari_len: usize,
}

impl CmManager {
    /// Tells the manager one of its CA's ports: its base LID (0 or 0xFFFF on RoCE: no
    /// LID check), LMC and GID table. From then on a REQ whose primary or alternate path
    /// does not end at one of the ports told is rejected (module docs; IBA Table 108
    /// reasons 12, 13, 18, 19). Telling a port again replaces what was told; nothing is
    /// checked until some port is told. Fails (changing nothing) if memory runs out.
    pub fn set_port(&mut self, port: u8, lid: u16, lmc: u8, gids: &[Gid]) -> Result<(), CmError> {
        let mut table = Vec::new();
        table
            .try_reserve_exact(gids.len())
            .map_err(|_| CmError::NoResources)?;
        table.extend_from_slice(gids);
        let entry = PortAddress {
            port,
            lid,
            lmc,
            gids: table,
        };
        if let Some(p) = self.ports.iter_mut().find(|p| p.port == port) {
            *p = entry;
        } else {
            self.ports
                .try_reserve(1)
                .map_err(|_| CmError::NoResources)?;
            self.ports.push(entry);
        }
        Ok(())
    }

    /// Tells the manager which CA `port` belongs to: REQs, REPs and REJ(Timeout)s sent
    /// for connections on that port carry `ca_guid` from now on (0: the configured
    /// [`CmConfig::ca_guid`](crate::CmConfig) again). PASSIVE_LEVEL or DISPATCH_LEVEL; no
    /// allocation.
    pub fn set_port_ca_guid(&mut self, port: u8, ca_guid: u64) {
        if let Some(g) = self.port_cas.guids.get_mut(usize::from(port)) {
            *g = ca_guid;
        }
    }

    /// The LMC of a local port as [`Self::set_port`] told it (0 if not told).
    pub(super) fn port_lmc(&self, port: u8) -> u8 {
        self.ports
            .iter()
            .find(|p| p.port == port)
            .map_or(0, |p| p.lmc)
    }

    /// The GUID of the CA `port` belongs to.
    pub(super) fn ca_guid_of(&self, port: u8) -> u64 {
        match self.port_cas.guids.get(usize::from(port)) {
            Some(&g) if g != 0 => g,
            _ => self.config.ca_guid,
        }
    }

    /// [`Self::remove_port`]: the port's GIDs and LIDs are no longer this CA's (a REQ
    /// naming them is rejected; the other ports are still checked).
    pub(super) fn forget_port_address(&mut self, port: u8) {
        if let Some(p) = self.ports.iter_mut().find(|p| p.port == port) {
            p.gids.clear();
            p.lid = 0;
        }
    }

    /// Whether `req`'s paths end at this CA's ports (module docs); `src` is where the REQ
    /// came in (its port's first GID is the ARI of an InvalidGID REJ, as Linux).
    pub(super) fn check_req_paths(&self, src: &MadAddress, req: &Req<'_>) -> Option<PathRejection> {
        if self.ports.is_empty() {
            return None;
        }
        let gid_ari = |gid: &Gid| PathRejection {
            reason: RejReason::InvalidGid,
            ari: *gid,
            ari_len: 16,
        };
        let lid_ari = |reason, lid: u16| {
            let mut ari = [0u8; 16];
            let [hi, lo] = lid.to_be_bytes();
            ari[0] = hi;
            ari[1] = lo;
            PathRejection {
                reason,
                ari,
                ari_len: 2,
            }
        };
        let primary = &req.primary_path;
        match self.path_check(primary) {
            Ok(()) => {}
            Err(None) => {
                let arrived = self
                    .ports
                    .iter()
                    .find(|p| p.port == src.port)
                    .or(self.ports.first());
                let gid = arrived
                    .and_then(|p| p.gids.first())
                    .copied()
                    .unwrap_or([0; 16]);
                return Some(gid_ari(&gid));
            }
            Err(Some(base)) => return Some(lid_ari(RejReason::InvalidLid, base)),
        }
        let alternate = &req.alternate_path;
        if !alternate.is_present() {
            return None;
        }
        match self.path_check(alternate) {
            Ok(()) => None,
            Err(None) => Some(PathRejection {
                reason: RejReason::InvalidAltGid,
                ..gid_ari(&primary.remote_gid)
            }),
            Err(Some(base)) => Some(lid_ari(RejReason::InvalidAltLid, base)),
        }
    }

    /// Ok if the path's remote port is one of ours; Err(None) if no port has its GID;
    /// Err(Some(base LID)) if the port with its GID does not answer its LID.
    fn path_check(&self, path: &Path) -> Result<(), Option<u16>> {
        let mut with_gid = self
            .ports
            .iter()
            .filter(|p| p.gids.contains(&path.remote_gid))
            .peekable();
        let first = with_gid.peek().map(|p| p.lid).ok_or(None)?;
        if !path.subnet_local || path.remote_lid == PERMISSIVE_LID {
            return Ok(());
        }
        if with_gid.any(|p| !p.checks_lids() || p.has_lid(path.remote_lid)) {
            return Ok(());
        }
        Err(Some(first))
    }
}

impl CmManager {
    /// Whether a path this side sends on (a CONNECT's primary or a SIDR_REQ's) starts at
    /// local port `port`: its source GID in that port's GID table and, on a subnet-local
    /// path with a LID, its source LID in the port's range. WinOF AL places every path it
    /// sends on by its source the same way (`__format_path_av` -> `__find_port_cep`,
    /// al_cm_cep.c:4569-4575: SGID, SLID and P_Key must name a local port, else the REQ is
    /// refused); a caller must not speak from another port's address. A manager told of
    /// no port checks nothing, as [`Self::check_req_paths`].
    pub fn check_source(&self, port: u8, path: &crate::types::PathRecord) -> Result<(), CmError> {
        if self.ports.is_empty() {
            return Ok(());
        }
        let refused = Err(CmError::NotLocal {
            field: "path source",
        });
        let Some(p) = self.ports.iter().find(|p| p.port == port) else {
            return refused;
        };
        if !p.gids.contains(&path.sgid) {
            return refused;
        }
        let lid_checked = path.subnet_local && path.slid != PERMISSIVE_LID && p.checks_lids();
        if lid_checked && !p.has_lid(path.slid) {
            return refused;
        }
        Ok(())
    }

    /// Whether an alternate path this side would load on a connection from `port` (a
    /// CONNECT's or a LAP's) leaves from a local port of the same CA, which may be another
    /// port than `port` (APM across ports; the QP's alternate AV names it, qp.rs). WinOF AL
    /// places the alternate by its source as any path (`__format_path_av`, al_cm_cep.c:
    /// 4815, 5766: IB_INVALID_SETTING if no port has it) and refuses one on another CA
    /// (4816-4821, 5779-5784): a QP cannot migrate across CAs. A manager told of no port
    /// checks nothing, as [`Self::check_source`].
    pub fn check_alternate_source(
        &self,
        port: u8,
        path: &crate::types::PathRecord,
    ) -> Result<(), CmError> {
        if self.ports.is_empty() {
            return Ok(());
        }
        match self.port_of_path(path) {
            Some(p) if self.ca_guid_of(p) == self.ca_guid_of(port) => Ok(()),
            _ => Err(CmError::NotLocal {
                field: "alternate path source",
            }),
        }
    }
}
