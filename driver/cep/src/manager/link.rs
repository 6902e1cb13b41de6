//! A port that goes down and comes back (a cable pulled and put back, a switch reboot):
//! the port's state leaves Active and returns, which the CA reports to its consumers as
//! an unaffiliated asynchronous event (IBAL's `IB_PNP_PORT_DOWN` /
//! `IB_PNP_PORT_ACTIVE`, Linux's `IB_EVENT_PORT_ERR` / `IB_EVENT_PORT_ACTIVE`). Unlike a
//! removal ([`CmManager::remove_port`]) the port keeps its number, GIDs and LIDs, and its
//! listens stay.
//!
//! What the counterparts do:
//!
//! - WinOF's CEP manager ignores it: `__cep_pnp_cb` (al_cm_cep.c:3178-3197) acts on
//!   `IB_PNP_PORT_ADD` and `IB_PNP_PORT_REMOVE` only ("Ignore other PNP events"). A REQ or
//!   REP in flight is re-sent into the dead port until its MAD times out, then REJ(Timeout)
//!   (`__cep_mad_send_cb`, al_cm_cep.c:2324-2332); an established connection hears nothing.
//! - Linux ib_cm registers no event handler at all: `cm_client` has `.add = cm_add_one`
//!   and `.remove = cm_remove_one` only, and `ib_cm_notify` takes `IB_EVENT_COMM_EST` and
//!   `IB_EVENT_PATH_MIG` only (drivers/infiniband/core/cm.c @ 00777a68). A pending MAD
//!   runs out its retries (`cm_send_handler` -> `cm_process_send_error` ->
//!   `IB_CM_REQ_ERROR` / `IB_CM_REP_ERROR` / `IB_CM_DREQ_ERROR`); an established
//!   connection learns only from its QP, once the data path's retries are exhausted.
//!
//! Both leave handshakes to burn their whole retry budget (up to MaxCMRetries x the
//! response timeout: seconds) and established connections half-open until the QP fails.
//! ibcm ends every connection on the port at once, each with one event its owner already
//! handles, and sends nothing on the port until it is back:
//!
//! | state when the port goes down          | event                    | then            |
//! |----------------------------------------|--------------------------|-----------------|
//! | REQ sent (MRA received or not)         | `Timeout { Req }`        | idle            |
//! | REQ received, not answered (MRA or not)| `Timeout { Rep }`        | idle            |
//! | REP prepared / sent (MRA or not)       | `Timeout { Rep }`        | timewait        |
//! | REP received, RTU not sent             | `Timeout { Req }`        | timewait        |
//! | established (a LAP in flight or not)   | `DreqReceived` (no data) | DREQ received   |
//! | DREQ sent                              | `Timeout { Dreq }`       | timewait        |
//! | DREQ received, timewait                | none (already told)      | as before       |
//! | SIDR_REQ sent                          | `Timeout { SidrReq }`    | idle            |
//! | listen, idle, SIDR answered/answering  | none                     | as before       |
//!
//! Why these events: the kernel clients of the `iba_cm` interface act on them in these
//! states. WinVerbs fails a connect on `iba_cm_req_error` and an accept on
//! `iba_cm_rep_error` (wv_ep.c:511-526) and, on `iba_cm_dreq_received` while connected,
//! completes the application's NotifyDisconnect (wv_ep.c:546-551); ND v2 flushes the QP
//! on `iba_cm_dreq_received` while connected (nd_ep.cpp:714-727, `AsyncFlushQp`) and
//! ignores `iba_cm_dreq_error` there (nd_ep.cpp:868-869 -> `CompleteDisconnect` acts only
//! while disconnecting), so an established connection is told with a DREQ: the owner
//! answers with its DREP (not sent while the port is down; harmless once it is back: a
//! DREP for an established connection is dropped) and the connection waits out timewait
//! like any other. States whose QP may have reached RTR go through timewait (IBA
//! 12.9.7), so a QPN is not reused while the old connection's packets may live.
//!
//! While the port is down a connect from it is refused ([`CmError::PortDown`]), nothing
//! is sent from it (retries and answers of connections not on it are unaffected), and a
//! MAD said to arrive on it is dropped.

use crate::cep::{LapState, State};
use crate::error::CmError;
use crate::event::Event;
use crate::types::{CepId, Instant, PrivateData};
use ibcm_mad::AttributeId;

use super::{CmManager, TIMER_BATCH};

/// Whether a CEP in `state` is ended (or told) when its port goes down.
fn ends_on_port_down(state: State) -> bool {
    matches!(
        state,
        State::ReqSent { .. }
            | State::ReqRcvd { .. }
            | State::RepPrepared { .. }
            | State::RepSent { .. }
            | State::RepRcvd { .. }
            | State::Established
            | State::DreqSent
            | State::SidrReqSent
    )
}

/// The ports that are down, one bit per port number.
#[derive(Debug, Clone, Default)]
pub(super) struct DownPorts([u64; 4]);

impl DownPorts {
    fn bit(port: u8) -> (usize, u64) {
        (usize::from(port / 64), 1u64 << (port % 64))
    }

    pub(super) fn contains(&self, port: u8) -> bool {
        let (word, bit) = Self::bit(port);
        self.0.get(word).is_some_and(|w| w & bit != 0)
    }

    pub(super) fn set(&mut self, port: u8, down: bool) {
        let (word, bit) = Self::bit(port);
        if let Some(w) = self.0.get_mut(word) {
            if down {
                *w |= bit;
            } else {
                *w &= !bit;
            }
        }
    }
}

impl CmManager {
    /// The port left the Active state (module docs): every connection on it ends with
    /// one event (the table in the module docs), listens stay, and nothing is sent from
    /// the port until [`Self::port_up`].
    ///
    /// Bounded, like a timer pass: one call looks at the CEPs from slab index `from` (0
    /// the first time) and ends at most [`TIMER_BATCH`] of them, then returns where to go
    /// on (None: all seen). Drain the events between calls, and call until None: the
    /// event queue then stays within its reserve and no lock is held long. The port is
    /// down from the first call. No allocation: DISPATCH_LEVEL.
    #[must_use]
    pub fn port_down(&mut self, now: Instant, port: u8, from: usize) -> Option<usize> {
        self.down.set(port, true);
        let mut ended = 0;
        let mut index = from;
        while index < self.slots.len() {
            if ended == TIMER_BATCH {
                return Some(index);
            }
            let hit = self.slots.get(index).and_then(|s| {
                let c = s.cep.as_ref()?;
                (c.dest.port == port && ends_on_port_down(c.state)).then(|| self.id_at(index, s))
            });
            if let Some(id) = hit {
                self.end_on_port_down(now, id);
                ended += 1;
            }
            index += 1;
        }
        None
    }

    /// The port is Active again: sends from it resume and connects from it are taken.
    /// Connections ended by [`Self::port_down`] stay ended; their owners reconnect.
    pub fn port_up(&mut self, port: u8) {
        self.down.set(port, false);
    }

    /// Whether `port` is down ([`Self::port_down`] without a [`Self::port_up`] since).
    pub fn is_port_down(&self, port: u8) -> bool {
        self.down.contains(port)
    }

    /// [`CmError::PortDown`] if `port` is down.
    pub(super) fn check_port_up(&self, port: u8) -> Result<(), CmError> {
        if self.down.contains(port) {
            return Err(CmError::PortDown { port });
        }
        Ok(())
    }

    fn end_on_port_down(&mut self, now: Instant, id: CepId) {
        let Some(state) = self.cep_any(id).map(|c| c.state) else {
            return;
        };
        let timeout = |message| Event::Timeout { message };
        match state {
            State::ReqSent { .. } => {
                self.emit(id, timeout(AttributeId::Req));
                self.end_attempt(id);
            }
            State::ReqRcvd { .. } => {
                self.emit(id, timeout(AttributeId::Rep));
                self.end_attempt(id);
            }
            State::RepPrepared { .. } | State::RepSent { .. } => {
                self.emit(id, timeout(AttributeId::Rep));
                self.enter_timewait(now, id);
            }
            State::RepRcvd { .. } => {
                self.emit(id, timeout(AttributeId::Req));
                self.enter_timewait(now, id);
            }
            State::Established => {
                self.cancel_timer(id);
                if let Some(c) = self.cep_mut(id) {
                    c.lap = LapState::Idle;
                    c.pending_alternate = None;
                }
                self.set_state(id, State::DreqRcvd);
                if self.cep_any(id).is_some_and(|c| c.detached) {
                    // No owner to answer (destroy sends a DREQ first, so this is only a
                    // guard): without it the CEP would wait in DREQ received for ever.
                    self.enter_timewait(now, id);
                } else {
                    self.emit(id, Event::DreqReceived(PrivateData::new(&[])));
                }
            }
            State::DreqSent => {
                self.emit(id, timeout(AttributeId::Dreq));
                self.enter_timewait(now, id);
            }
            State::SidrReqSent => {
                self.emit(id, timeout(AttributeId::SidrReq));
                self.end_sidr(id);
            }
            State::Idle
            | State::Listen
            | State::DreqRcvd
            | State::Timewait
            | State::SidrReqRcvd
            | State::SidrRepSent
            | State::Removed => {}
        }
    }
}
