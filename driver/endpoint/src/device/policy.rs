//! What a handle may do: who opened it, and the quotas of a non-administrator's handle
//! (docs/security.md).
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
//!   unread, per handle; and the same of all users' handles together ([`UserTotals`]),
//!   since a user may open any number of handles (review of issue 30, A3). An
//!   administrator's handle has none and is not counted, nor is a kernel client (the
//!   `iba_cm` interface).

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

/// The quotas of each non-administrator's handle, and the budgets of all of them
/// together. The binding reads them from the service key's `Parameters` (docs/security.md,
/// "Quotas"); [`Default`] holds the defaults. Past any of them the operation fails with
/// STATUS_QUOTA_EXCEEDED (a REQ is refused as over a full backlog).
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
    /// Endpoints of all users' handles together, REQ-created ones included
    /// (`MaxEndpointsAllUsers`): a user opening more handles gets no more CEPs.
    pub all_users_endpoints: u32,
    /// Listening endpoints of all users' handles together (`MaxListensAllUsers`).
    pub all_users_listens: u32,
    /// The sum of the backlogs of all users' listens (`MaxBacklogAllUsers`): each unit
    /// is an endpoint made ahead, at PASSIVE_LEVEL, for a REQ to take at DISPATCH_LEVEL.
    pub all_users_backlog: u32,
    /// Event records queued unread on all users' handles together
    /// (`MaxQueuedEventsAllUsers`): past it, every user's operations that start new
    /// events are refused until users read theirs.
    pub all_users_queued_events: u32,
}

impl Default for Quotas {
    /// Per handle: 16384 endpoints (about 16 MB of nonpaged pool at the driver's 1 KiB
    /// per connection), 64 listens, 16384 REQs waiting (four listens at the largest
    /// backlog), 16384 event records queued (7.6 MB).
    ///
    /// All users together: 65536 endpoints, four default handles' worth (64 MiB at 1 KiB
    /// each), a sixteenth of the engine's CEPs (`CmConfig::max_ceps`, 2^20): the other
    /// 983040 CEPs stay for kernel clients (WinVerbs, ND) and administrators; 65536 of
    /// backlog (endpoints made ahead for REQs, at most 1 KiB each: 64 MiB more); 4096
    /// listens (64 handles at their 64); 65536 event records queued (464 bytes each:
    /// 29 MiB). So users hold about 160 MiB of pool at most, where 64 handles reached
    /// 1 GiB and the whole CEP space before, and records had no bound but the number of
    /// handles. Each is at least what one default handle may hold, so it never refuses a
    /// lone handle anything its own quotas allow.
    fn default() -> Self {
        Self {
            endpoints: 16384,
            listens: 64,
            backlog: 16384,
            queued_events: 16384,
            all_users_endpoints: 65536,
            all_users_listens: 4096,
            all_users_backlog: 65536,
            all_users_queued_events: 65536,
        }
    }
}

/// What all non-administrators' handles hold together, against the all-users budgets of
/// [`Quotas`]. Kept under the device lock beside each handle's own counts and changed
/// where they change: an endpoint inserted (CREATE, a REQ) or removed (DESTROY, cleanup),
/// a LISTEN or CANCEL_LISTEN, a record queued or read, and a file forgotten at close.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserTotals {
    /// Endpoints (each file's `endpoints.live`).
    pub endpoints: usize,
    /// Listening endpoints (each file's `listens`).
    pub listens: u32,
    /// The sum of their backlogs (each file's `backlog`).
    pub backlog: usize,
    /// Event records queued unread on them (each file's `queued`).
    pub queued: usize,
}

impl UserTotals {
    /// An endpoint joined a handle of `caller`.
    pub(super) fn endpoint_added(&mut self, caller: Caller) {
        if caller == Caller::User {
            self.endpoints += 1;
        }
    }

    /// An endpoint with `backlog` (0: not listening) left a handle of `caller`.
    pub(super) fn endpoint_removed(&mut self, caller: Caller, backlog: u32) {
        if caller == Caller::User {
            self.endpoints = self.endpoints.saturating_sub(1);
            self.listen(caller, backlog, 0);
        }
    }

    /// A listen of a handle of `caller` went from backlog `old` to `new` (0: none).
    pub(super) fn listen(&mut self, caller: Caller, old: u32, new: u32) {
        if caller != Caller::User {
            return;
        }
        match (old, new) {
            (0, 0) => {}
            (0, _) => self.listens += 1,
            (_, 0) => self.listens = self.listens.saturating_sub(1),
            _ => {}
        }
        self.backlog = self.backlog.saturating_sub(old as usize) + new as usize;
    }

    /// `n` records were queued on a handle of `caller`.
    pub(super) fn events_queued(&mut self, caller: Caller, n: usize) {
        if caller == Caller::User {
            self.queued += n;
        }
    }

    /// `n` records queued on a handle of `caller` left it (read, or their endpoint gone).
    pub(super) fn events_read(&mut self, caller: Caller, n: usize) {
        if caller == Caller::User {
            self.queued = self.queued.saturating_sub(n);
        }
    }

    /// A file is forgotten (IRP_MJ_CLOSE): whatever it still counted leaves (after its
    /// cleanup nothing is left; this keeps the totals right should anything be).
    pub(super) fn file_closed<R>(&mut self, f: &File<R>) {
        if f.caller == Caller::User {
            self.endpoints = self.endpoints.saturating_sub(f.endpoints.live);
            self.listens = self.listens.saturating_sub(f.listens);
            self.backlog = self.backlog.saturating_sub(f.backlog);
            self.queued = self.queued.saturating_sub(f.queued);
        }
    }
}

impl<R> File<R> {
    /// Whether this handle's owner is an administrator.
    pub(super) fn privileged(&self) -> bool {
        self.caller == Caller::Administrator
    }

    /// One more endpoint (CREATE), of this handle and of all users' (`all`).
    pub(super) fn quota_endpoint(&self, q: &Quotas, all: &UserTotals) -> Result<(), Status> {
        self.within(self.endpoints.live < q.endpoints as usize)?;
        self.within(all.endpoints < q.all_users_endpoints as usize)?;
        self.quota_events(q, all)
    }

    /// Whether a REQ may add an endpoint to this handle (DISPATCH_LEVEL: over its quota
    /// or all users' budget, the REQ is refused as a full backlog refuses it).
    pub(super) fn has_endpoint_room(&self, q: &Quotas, all: &UserTotals) -> bool {
        self.privileged()
            || (self.endpoints.live < q.endpoints as usize
                && all.endpoints < q.all_users_endpoints as usize)
    }

    /// One more listen with `backlog` (LISTEN; the endpoint's old backlog, if it listened,
    /// leaves), of this handle and of all users' (`all`).
    pub(super) fn quota_listen(
        &self,
        q: &Quotas,
        all: &UserTotals,
        backlog: u32,
        old: u32,
    ) -> Result<(), Status> {
        let more = u32::from(old == 0);
        self.within(self.listens + more <= q.listens)?;
        self.within(all.listens.saturating_add(more) <= q.all_users_listens)?;
        let total = (self.backlog.saturating_sub(old as usize)).saturating_add(backlog as usize);
        self.within(total <= q.backlog as usize)?;
        let all_total = (all.backlog.saturating_sub(old as usize)).saturating_add(backlog as usize);
        self.within(all_total <= q.all_users_backlog as usize)?;
        self.quota_events(q, all)
    }

    /// An operation that starts new events (CONNECT, SIDR_REQ, and the above), while this
    /// handle and all users' (`all`) have room for their records.
    pub(super) fn quota_events(&self, q: &Quotas, all: &UserTotals) -> Result<(), Status> {
        self.within(self.queued < q.queued_events as usize)?;
        self.within(all.queued < q.all_users_queued_events as usize)
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
