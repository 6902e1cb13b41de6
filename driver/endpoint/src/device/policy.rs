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
//!   unread, per handle; the same of one account's handles together, and of all users'
//!   handles together ([`UserTotals`]), since a user may open any number of handles
//!   (review of issue 30, A3) and one account must not take every user's share. A user's
//!   CEP lingering in DREQ or timewait after its endpoint's destroy still counts. An
//!   administrator's handle has none and is not counted, nor is a kernel client (the
//!   `iba_cm` interface).
//! - Paths: a user's packet life time is bounded ([`USER_MAX_PACKET_LIFE_TIME`]), and
//!   with it how long its closed connections linger.

use alloc::vec::Vec;

use ibcm_cep::{CepId, CmManager};
use ibcm_ioctl::status;

use crate::records::Status;

use super::endpoint::File;
use super::{Inner, LINGER_PRUNE};
use crate::platform::Platform;

/// The longest packet life time a user's path may carry: 20, 4.096 us x 2^20 = 4.3 s,
/// so a user's connection lingers in timewait (2 x packet life time + the CA's ACK
/// delay) about 9 s, where 31 held it 4.9 hours. At or above what paths really carry:
/// Linux's rdma_cm gives every RoCE path `CMA_IBOE_PACKET_LIFETIME` = 18 (cma.c), and
/// OpenSM's default `packet_life_time` is 0x12 = 18; 20 leaves four times that for a
/// long fabric. Administrators and kernel clients may name any (IBA Table 106: 5 bits).
pub const USER_MAX_PACKET_LIFE_TIME: u8 = 20;

/// Who opened a handle: the binding decides at IRP_MJ_CREATE from the creating thread's
/// security context (an elevated member of Administrators, or a kernel-mode open, is an
/// administrator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// An ordinary user whose account the binding did not tell: exact-ID listens, its own
    /// QPNs, [`Quotas`] per handle and all users' budgets; its handle is an account of its
    /// own for the per-account budgets.
    User,
    /// An ordinary user of the account `key`, as [`Caller::User`] and, with every other
    /// handle of that account, held to the per-account budgets of [`Quotas`]. The key is
    /// opaque: the binding derives it from the user SID of the token that opened the
    /// handle (one account, one key; two accounts, two keys).
    UserOf(u64),
    /// An administrator: any listen mask, any QPN, no quotas.
    Administrator,
}

impl Caller {
    /// A user's handle (counted, held to quotas), of a told account or not.
    pub(super) fn is_user(self) -> bool {
        self != Caller::Administrator
    }

    /// An ordinary user of the account whose SID is `sid` (the bytes of a Windows SID, as
    /// `RtlLengthSid` measures them): its key is a hash of them, the same for every handle
    /// of the account. SipHash with a fixed key: SIDs are given out by the machine's or
    /// the domain's authority, not chosen by a caller who could aim at a collision.
    pub fn of_account_sid(sid: &[u8]) -> Caller {
        use core::hash::Hasher as _;
        let mut hasher = siphasher::sip::SipHasher13::new_with_keys(0, 0);
        hasher.write(sid);
        Caller::UserOf(hasher.finish())
    }
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
    /// Endpoints of all handles of one account ([`Caller::UserOf`]) together, REQ-created
    /// ones and CEPs still in timewait after their endpoint's destroy included
    /// (`MaxEndpointsPerAccount`): one account cannot take every user's budget.
    pub account_endpoints: u32,
    /// Listening endpoints of one account's handles (`MaxListensPerAccount`).
    pub account_listens: u32,
    /// The sum of one account's listen backlogs (`MaxBacklogPerAccount`).
    pub account_backlog: u32,
    /// Event records queued unread on one account's handles
    /// (`MaxQueuedEventsPerAccount`).
    pub account_queued_events: u32,
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
    ///
    /// Per account: a quarter of each all-users budget (one handle's worth of endpoints,
    /// backlog and records; 16 handles' listens), so that at least four accounts get
    /// their share however hard one of them tries.
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
            account_endpoints: 16384,
            account_listens: 1024,
            account_backlog: 16384,
            account_queued_events: 16384,
        }
    }
}

/// What some users' handles hold together: all users', or one account's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Endpoints (each file's `endpoints.live`).
    pub endpoints: usize,
    /// Listening endpoints (each file's `listens`).
    pub listens: u32,
    /// The sum of their backlogs (each file's `backlog`).
    pub backlog: usize,
    /// Event records queued unread on them (each file's `queued`).
    pub queued: usize,
}

impl Held {
    fn listen(&mut self, old: u32, new: u32) {
        match (old, new) {
            (0, 0) => {}
            (0, _) => self.listens += 1,
            (_, 0) => self.listens = self.listens.saturating_sub(1),
            _ => {}
        }
        self.backlog = self.backlog.saturating_sub(old as usize) + new as usize;
    }
}

/// One account's handles ([`Caller::UserOf`]) and what they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Account {
    key: u64,
    /// Its open files: the entry goes when the last one has closed and it holds nothing
    /// (no CEP of its left in timewait).
    files: u32,
    held: Held,
}

/// What all non-administrators' handles hold together, against the all-users budgets of
/// [`Quotas`], and what each account's hold, against its per-account budgets. Kept under
/// the device lock beside each handle's own counts and changed where they change: an
/// endpoint inserted (CREATE, a REQ) or removed (DESTROY, cleanup), a LISTEN or
/// CANCEL_LISTEN, a record queued or read, and a file opened or forgotten at close.
///
/// Accounts are few (those with a handle open: a user cannot make more without an
/// administrator), so they are a short list, found by a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserTotals {
    /// Endpoints (each file's `endpoints.live`).
    pub endpoints: usize,
    /// Listening endpoints (each file's `listens`).
    pub listens: u32,
    /// The sum of their backlogs (each file's `backlog`).
    pub backlog: usize,
    /// Event records queued unread on them (each file's `queued`).
    pub queued: usize,
    accounts: Vec<Account>,
}

impl UserTotals {
    /// What the handles of account `key` hold (zero if none is open).
    pub fn account(&self, key: u64) -> Held {
        self.accounts
            .iter()
            .find(|a| a.key == key)
            .map_or(Held::default(), |a| a.held)
    }

    /// What all users' handles hold.
    pub fn all(&self) -> Held {
        Held {
            endpoints: self.endpoints,
            listens: self.listens,
            backlog: self.backlog,
            queued: self.queued,
        }
    }

    /// Applies `change` to all users' totals and to `caller`'s account's, for a user.
    fn change(&mut self, caller: Caller, change: impl Fn(&mut Held)) {
        if !caller.is_user() {
            return;
        }
        let mut all = self.all();
        change(&mut all);
        (self.endpoints, self.listens, self.backlog, self.queued) =
            (all.endpoints, all.listens, all.backlog, all.queued);
        if let Caller::UserOf(key) = caller
            && let Some(a) = self.accounts.iter_mut().find(|a| a.key == key)
        {
            change(&mut a.held);
        }
    }

    /// A file of `caller` opens: its account is entered (fails, changing nothing, if
    /// memory runs out).
    pub(super) fn file_opened(&mut self, caller: Caller) -> Result<(), Status> {
        let Caller::UserOf(key) = caller else {
            return Ok(());
        };
        if let Some(a) = self.accounts.iter_mut().find(|a| a.key == key) {
            a.files += 1;
            return Ok(());
        }
        self.accounts
            .try_reserve(1)
            .map_err(|_| status::INSUFFICIENT_RESOURCES)?;
        self.accounts.push(Account {
            key,
            files: 1,
            held: Held::default(),
        });
        Ok(())
    }

    /// An endpoint joined a handle of `caller`.
    pub(super) fn endpoint_added(&mut self, caller: Caller) {
        self.change(caller, |h| h.endpoints += 1);
    }

    /// An endpoint with `backlog` (0: not listening) left a handle of `caller`.
    pub(super) fn endpoint_removed(&mut self, caller: Caller, backlog: u32) {
        self.change(caller, |h| {
            h.endpoints = h.endpoints.saturating_sub(1);
            h.listen(backlog, 0);
        });
        self.forget_idle(caller);
    }

    /// A listen of a handle of `caller` went from backlog `old` to `new` (0: none).
    pub(super) fn listen(&mut self, caller: Caller, old: u32, new: u32) {
        self.change(caller, |h| h.listen(old, new));
    }

    /// `n` records were queued on a handle of `caller`.
    pub(super) fn events_queued(&mut self, caller: Caller, n: usize) {
        self.change(caller, |h| h.queued += n);
    }

    /// `n` records queued on a handle of `caller` left it (read, or their endpoint gone).
    pub(super) fn events_read(&mut self, caller: Caller, n: usize) {
        self.change(caller, |h| h.queued = h.queued.saturating_sub(n));
    }

    /// A file is forgotten (IRP_MJ_CLOSE): whatever it still counted leaves (after its
    /// cleanup nothing is left; this keeps the totals right should anything be), and its
    /// account with its last file.
    pub(super) fn file_closed<R>(&mut self, f: &File<R>) {
        self.change(f.caller, |h| {
            h.endpoints = h.endpoints.saturating_sub(f.endpoints.live);
            h.listens = h.listens.saturating_sub(f.listens);
            h.backlog = h.backlog.saturating_sub(f.backlog);
            h.queued = h.queued.saturating_sub(f.queued);
        });
        self.file_gone(f.caller);
    }

    /// A file of `caller` is gone (closed, or never made): its account goes with its last.
    pub(super) fn file_gone(&mut self, caller: Caller) {
        if let Caller::UserOf(key) = caller
            && let Some(a) = self.accounts.iter_mut().find(|a| a.key == key)
        {
            a.files = a.files.saturating_sub(1);
        }
        self.forget_idle(caller);
    }

    /// Forgets `caller`'s account once it has no file open and nothing counted (its
    /// CEPs in timewait keep it until they end).
    fn forget_idle(&mut self, caller: Caller) {
        if let Caller::UserOf(key) = caller
            && let Some(at) = self
                .accounts
                .iter()
                .position(|a| a.key == key && a.files == 0 && a.held == Held::default())
        {
            self.accounts.swap_remove(at);
        }
    }

    /// What `caller`'s account holds, if it is a told account.
    fn of(&self, caller: Caller) -> Option<Held> {
        match caller {
            Caller::UserOf(key) => Some(self.account(key)),
            _ => None,
        }
    }
}

impl<R> File<R> {
    /// Whether this handle's owner is an administrator.
    pub(super) fn privileged(&self) -> bool {
        !self.caller.is_user()
    }

    /// One more endpoint (CREATE), of this handle and of all users' (`all`).
    pub(super) fn quota_endpoint(&self, q: &Quotas, all: &UserTotals) -> Result<(), Status> {
        self.within(self.endpoints.live < q.endpoints as usize)?;
        self.within(all.endpoints < q.all_users_endpoints as usize)?;
        let account = all.of(self.caller).unwrap_or_default();
        self.within(account.endpoints < q.account_endpoints as usize)?;
        self.quota_events(q, all)
    }

    /// Whether a REQ may add an endpoint to this handle (DISPATCH_LEVEL: over its quota
    /// or all users' budget, the REQ is refused as a full backlog refuses it).
    pub(super) fn has_endpoint_room(&self, q: &Quotas, all: &UserTotals) -> bool {
        let account = all.of(self.caller).unwrap_or_default();
        self.privileged()
            || (self.endpoints.live < q.endpoints as usize
                && all.endpoints < q.all_users_endpoints as usize
                && account.endpoints < q.account_endpoints as usize)
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
        if let Some(account) = all.of(self.caller) {
            self.within(account.listens.saturating_add(more) <= q.account_listens)?;
            let total =
                (account.backlog.saturating_sub(old as usize)).saturating_add(backlog as usize);
            self.within(total <= q.account_backlog as usize)?;
        }
        self.quota_events(q, all)
    }

    /// An operation that starts new events (CONNECT, SIDR_REQ, and the above), while this
    /// handle and all users' (`all`) have room for their records.
    pub(super) fn quota_events(&self, q: &Quotas, all: &UserTotals) -> Result<(), Status> {
        self.within(self.queued < q.queued_events as usize)?;
        self.within(all.queued < q.all_users_queued_events as usize)?;
        let account = all.of(self.caller).unwrap_or_default();
        self.within(account.queued < q.account_queued_events as usize)
    }

    fn within(&self, ok: bool) -> Result<(), Status> {
        if ok || self.privileged() {
            Ok(())
        } else {
            Err(status::QUOTA_EXCEEDED)
        }
    }

    /// A path of a user's CONNECT or LAP: its packet life time is at most
    /// [`USER_MAX_PACKET_LIFE_TIME`] (timewait is 2 x packet life time + ACK delay, IBA
    /// 12.9.8.7, and holds the CEP and its QPN binding after the handle lets go).
    pub(super) fn may_use_path(&self, path: &ibcm_cep::PathRecord) -> Result<(), Status> {
        if path.packet_life_time <= USER_MAX_PACKET_LIFE_TIME || self.privileged() {
            Ok(())
        } else {
            Err(status::INVALID_PARAMETER)
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

impl<P: Platform> Inner<P> {
    /// A user's endpoint was destroyed but its CEP lives on in the engine (DREQ,
    /// timewait, up to 2 x packet life time + ACK delay: IBA 12.9.8.7): it still counts as
    /// an endpoint of `caller`'s account and of all users' until it ends, so that
    /// destroying and connecting again cannot hold more CEPs than the budgets. Room in
    /// `lingering` was made before the destroy.
    pub(super) fn linger(&mut self, caller: Caller, cep: CepId) {
        if !caller.is_user() || !self.cm.lingers(cep) {
            return;
        }
        if self.lingering.len() < self.lingering.capacity() {
            self.lingering.push_back((cep, caller));
            self.users.endpoint_added(caller);
        }
    }

    /// Looks at up to `max` lingering CEPs, oldest first: those the engine has released
    /// leave their owners' counts. Allocates nothing (a CEP still there goes to the back).
    pub(super) fn prune_lingering(&mut self, max: usize) {
        for _ in 0..max.min(self.lingering.len()) {
            let Some((cep, caller)) = self.lingering.pop_front() else {
                break;
            };
            if self.cm.lingers(cep) {
                self.lingering.push_back((cep, caller));
            } else {
                self.users.endpoint_removed(caller, 0);
            }
        }
    }

    /// A CREATE's quota check; refused over a budget, the lingering CEPs are looked at
    /// once (some may have ended since the last timer pass) and the check made again.
    pub(super) fn quota_create(&mut self, file: super::FileId) -> Result<(), Status> {
        let check = |i: &Self| {
            i.files
                .get(file.0)
                .ok_or(status::INVALID_HANDLE)?
                .quota_endpoint(&i.quotas, &i.users)
        };
        if check(self).is_ok() {
            return Ok(());
        }
        self.prune_lingering(LINGER_PRUNE);
        check(self)
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use super::Caller;

    /// S-1-5-21-1111-2222-3333-`rid` as its bytes (revision, count, authority, sub-authorities).
    fn sid(rid: u32) -> Vec<u8> {
        let mut b = vec![1, 5, 0, 0, 0, 0, 0, 5];
        for sub in [21, 1111, 2222, 3333, rid] {
            b.extend_from_slice(&u32::to_le_bytes(sub));
        }
        b
    }

    #[test]
    fn one_account_one_key_two_accounts_two_keys() {
        assert_eq!(
            Caller::of_account_sid(&sid(1001)),
            Caller::of_account_sid(&sid(1001))
        );
        assert_ne!(
            Caller::of_account_sid(&sid(1001)),
            Caller::of_account_sid(&sid(1002))
        );
        assert!(matches!(
            Caller::of_account_sid(&sid(1001)),
            Caller::UserOf(_)
        ));
    }
}
