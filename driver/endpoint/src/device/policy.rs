//! What a handle may do: who opened it, and the quotas of a non-administrator's handle
//! (issue #30; README, "Security").
//!
//! `\\.\ibcm` is open to every user (the SDDL WinVerbs and ndfltr use), so one user's
//! handle must not take another's REQs, name another's QP, or exhaust what the CM
//! holds for everyone:
//! - Listens: a user listens on exact service IDs only (a mask of all ones); partial masks
//!   catch service IDs that other users and kernel clients may want, and are for
//!   administrators. Overlapping listens are refused for everyone (the engine's
//!   `listen.rs`).
//! - QPNs: a user's CONNECT or FORMAT_REP may not name a local QPN that a live connection
//!   of another handle or a kernel client binds (the engine's `local_qpn.rs`).
//! - Quotas: endpoints, listens, the sum of listen backlogs, and event records queued
//!   unread, per handle; an administrator's handle has none.

use ibcm_cep::CmManager;
use ibcm_ioctl::status;

use crate::records::Status;

use super::endpoint::File;

/// Who opened a handle: the binding decides at IRP_MJ_CREATE from the creating thread's
/// security context (an elevated member of Administrators, or a kernel-mode open, is an
/// administrator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// An ordinary user: exact-ID listens, its own QPNs, [`Quotas`].
    User,
    /// An administrator: any listen mask, any QPN, no quotas.
    Administrator,
}

/// The quotas of each non-administrator's handle. The binding reads them from the
/// service key's `Parameters` (README, "Quotas"); [`Default`] holds the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Endpoints, REQ-created ones included (`MaxEndpointsPerHandle`).
    pub endpoints: u32,
    /// Listening endpoints (`MaxListensPerHandle`).
    pub listens: u32,
    /// The sum of its listens' backlogs (`MaxBacklogPerHandle`).
    pub backlog: u32,
    /// Event records queued and not yet read (`MaxQueuedEventsPerHandle`): past it, the
    /// operations that start new events (CREATE, LISTEN, CONNECT, SIDR_REQ) are refused
    /// until the handle reads its events.
    pub queued_events: u32,
}

impl Default for Quotas {
    /// 16384 endpoints (about 16 MB of nonpaged pool at the driver's 1 KiB per
    /// connection), 64 listens, 16384 REQs waiting (four listens at the largest
    /// backlog), 16384 event records queued (7.6 MB).
    fn default() -> Self {
        Self {
            endpoints: 16384,
            listens: 64,
            backlog: 16384,
            queued_events: 16384,
        }
    }
}

impl<R> File<R> {
    /// Whether this handle's owner is an administrator.
    pub(super) fn privileged(&self) -> bool {
        self.caller == Caller::Administrator
    }

    /// One more endpoint (CREATE).
    pub(super) fn quota_endpoint(&self, q: &Quotas) -> Result<(), Status> {
        self.within(self.endpoints.live < q.endpoints as usize)?;
        self.quota_events(q)
    }

    /// Whether a REQ may add an endpoint to this handle (DISPATCH_LEVEL: over quota, the
    /// REQ is refused as a full backlog refuses it).
    pub(super) fn has_endpoint_room(&self, q: &Quotas) -> bool {
        self.privileged() || self.endpoints.live < q.endpoints as usize
    }

    /// One more listen with `backlog` (LISTEN; the endpoint's old backlog, if it listened,
    /// leaves).
    pub(super) fn quota_listen(&self, q: &Quotas, backlog: u32, old: u32) -> Result<(), Status> {
        let listens = self.listens + u32::from(old == 0);
        self.within(listens <= q.listens)?;
        let total = (self.backlog.saturating_sub(old as usize)).saturating_add(backlog as usize);
        self.within(total <= q.backlog as usize)?;
        self.quota_events(q)
    }

    /// An operation that starts new events (CONNECT, SIDR_REQ, and the above).
    pub(super) fn quota_events(&self, q: &Quotas) -> Result<(), Status> {
        self.within(self.queued < q.queued_events as usize)
    }

    fn within(&self, ok: bool) -> Result<(), Status> {
        if ok || self.privileged() {
            Ok(())
        } else {
            Err(status::QUOTA_EXCEEDED)
        }
    }

    /// A listen's service mask: a user listens on exact service IDs only.
    pub(super) fn may_listen(&self, service_mask: u64) -> Result<(), Status> {
        if service_mask == u64::MAX || self.privileged() {
            Ok(())
        } else {
            Err(status::ACCESS_DENIED)
        }
    }

    /// A local QPN (of the CA of a port) a CONNECT or FORMAT_REP of this handle (`file`)
    /// names: a user may not name one that another handle's or a kernel client's live
    /// connection binds.
    pub(super) fn may_name_qpn(
        &self,
        cm: &CmManager,
        file: u64,
        (port, qpn): (u8, u32),
    ) -> Result<(), Status> {
        match cm.local_qpn_holder(port, qpn) {
            Some(holder) if holder != file && !self.privileged() => Err(status::ACCESS_DENIED),
            _ => Ok(()),
        }
    }
}
