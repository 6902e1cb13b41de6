//! An endpoint, its file, and the owner of each CEP: what a GET_EVENT or an answered
//! CONNECT/SEND_REP waits on, and where an event is delivered.

use alloc::collections::{TryReserveError, VecDeque};
use alloc::vec::Vec;

use ibcm_cep::CepId;
use ibcm_ioctl::event_type;

use super::Table;
use super::pdata::Kept;
use super::policy::Caller;
use super::pool::Fifo;

/// What a CONNECT or SEND_REP with an output buffer waits for (see `code::CONNECT`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Awaited {
    /// The REP (or what ended the attempt, or, peer to peer, the crossing REQ that made
    /// this side passive); with the QP transitions after a REP when the buffer holds them.
    Rep { transitions: bool },
    /// The RTU (or a DREQ, or what ended the attempt).
    Rtu,
}

impl Awaited {
    pub(super) fn answered_by(self, event: u32) -> bool {
        let ends = matches!(
            event,
            event_type::REJECTED | event_type::TIMEOUT | event_type::DEVICE_REMOVAL
        );
        ends || match self {
            Awaited::Rep { .. } => {
                matches!(event, event_type::REP_RECEIVED | event_type::REQ_RECEIVED)
            }
            Awaited::Rtu => matches!(event, event_type::RTU_RECEIVED | event_type::DREQ_RECEIVED),
        }
    }
}

#[derive(Debug)]
pub(super) struct Endpoint<R> {
    pub(super) cep: CepId,
    /// Queued events: a list through the device's record pool.
    pub(super) events: Fifo,
    pub(super) pending: VecDeque<R>,
    /// A CONNECT or SEND_REP waiting for its answer (held inline: parking it allocates
    /// nothing, and its answer arrives at DISPATCH_LEVEL).
    pub(super) answer: Option<(R, Awaited)>,
    /// Private data of the last message received, for QUERY (pdata.rs: a block of the
    /// device's pool, none while empty).
    pub(super) private_data: Kept,
    /// LISTEN's backlog while listening.
    pub(super) backlog: u32,
    /// On its file's `ready` list.
    pub(super) ready: bool,
}

impl<R> Endpoint<R> {
    pub(super) fn new(cep: CepId, events: Fifo) -> Self {
        Self {
            cep,
            events,
            pending: VecDeque::new(),
            answer: None,
            private_data: Kept::default(),
            backlog: 0,
            ready: false,
        }
    }
}

/// Request key -> endpoint handle. The keys are the platform's (a WDFREQUEST in the
/// driver, a counter on the host), never a caller's choice.
pub(super) type Waiting =
    hashbrown::HashMap<u64, u64, core::hash::BuildHasherDefault<siphasher::sip::SipHasher13>>;

#[derive(Debug)]
pub(super) struct File<R> {
    /// Who opened it (policy.rs).
    pub(super) caller: Caller,
    /// Its cleanup ran (IRP_MJ_CLEANUP): later IOCTLs are refused.
    pub(super) closed: bool,
    pub(super) versioned: bool,
    pub(super) endpoints: Table<Endpoint<R>>,
    /// Endpoints built ahead (at PASSIVE_LEVEL) for REQs that arrive at DISPATCH_LEVEL.
    pub(super) spares: Vec<Endpoint<R>>,
    /// The sum of its listens' backlogs (kept, so that preparing for REQs does not walk
    /// every endpoint of the file on every GET_EVENT).
    pub(super) backlog: usize,
    /// Its listening endpoints (those with a backlog).
    pub(super) listens: u32,
    /// Event records queued on its endpoints, unread.
    pub(super) queued: usize,
    /// GET_EVENTs pending on the file's event channel (`ANY_ENDPOINT`).
    pub(super) channel: VecDeque<R>,
    /// Which endpoint holds a pending request (its GET_EVENT or answered operation), by
    /// the request's key: the cancel routine finds it without walking the endpoints. An
    /// entry of a request completed since is found stale (its endpoint holds another key
    /// or none) and goes when the endpoint's next request of that kind comes, or with it.
    pub(super) waiting: Waiting,
    /// The channel's queue: endpoints with events queued and no GET_EVENT of their own,
    /// in the order their first queued event arrived, each once (`Endpoint::ready`). It
    /// has room for every endpoint and spare (made at PASSIVE_LEVEL), so queueing on it
    /// at DISPATCH_LEVEL never allocates.
    pub(super) ready: VecDeque<u64>,
}

impl<R> File<R> {
    /// Enters `key` as endpoint `handle`'s pending request (its GET_EVENT or answered
    /// operation) in `waiting`; it leaves when the request completes or is cancelled.
    /// Room was made (`waiting.try_reserve(1)`), so this allocates nothing.
    pub(super) fn enter_waiting(&mut self, handle: u64, key: u64) {
        self.waiting.insert(key, handle);
    }

    /// Request `key` of endpoint `handle` completed, or the endpoint left with it parked:
    /// its entry in `waiting` goes (allocates nothing).
    pub(super) fn leave_waiting(&mut self, handle: u64, key: u64) {
        forget_waiting(&mut self.waiting, handle, key);
    }

    pub(super) fn new(caller: Caller) -> Self {
        Self {
            caller,
            closed: false,
            versioned: false,
            endpoints: Table::new(),
            spares: Vec::new(),
            backlog: 0,
            listens: 0,
            queued: 0,
            channel: VecDeque::new(),
            waiting: Waiting::default(),
            ready: VecDeque::new(),
        }
    }

    /// Room on `ready` for every endpoint and spare of the file and `more` besides
    /// (PASSIVE_LEVEL).
    pub(super) fn reserve_ready(&mut self, more: usize) -> Result<(), TryReserveError> {
        let most = self.endpoints.live + self.spares.len() + more;
        self.ready
            .try_reserve(most.saturating_sub(self.ready.len()))
    }
}

/// Who owns a CEP (kept in the engine: `CmManager::set_owner`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Owner {
    pub(super) file: u64,
    pub(super) endpoint: u64,
}

/// Removes `key`'s entry from a file's index of pending requests if it names endpoint
/// `handle` (removing allocates nothing). Requests leave the index as they complete, so
/// that it holds the requests pending, not one completed request per endpoint that ever
/// had one (35 bytes a connection at 1e6).
pub(super) fn forget_waiting(index: &mut Waiting, handle: u64, key: u64) {
    if index.get(&key) == Some(&handle) {
        index.remove(&key);
    }
}
