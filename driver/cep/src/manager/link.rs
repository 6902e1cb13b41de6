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
//!   `IB_PNP_PORT_ADD` and `IB_PNP_PORT_REMOVE` only ("Ignore other PNP events",
//!   3194-3196). A REQ or REP in flight is re-sent into the dead port until its MAD times
//!   out, then REJ(Timeout) and the owner's REQ/REP error (`__cep_mad_send_cb`,
//!   al_cm_cep.c:2322-2331, `__reject_timeout` at 2329); an established connection hears
//!   nothing from the CM. AL learns link state by polling (al_pnp.c:1351-1430), so a
//!   short retrain may reach its consumers as DOWN + ACTIVE or as nothing.
//! - Linux ib_cm registers no event handler at all: `cm_client` has `.add = cm_add_one`
//!   and `.remove = cm_remove_one` only, and `ib_cm_notify` takes `IB_EVENT_COMM_EST` and
//!   `IB_EVENT_PATH_MIG` only (drivers/infiniband/core/cm.c @ 00777a68). A pending MAD
//!   runs out its retries (`cm_send_handler` -> `cm_process_send_error` ->
//!   `IB_CM_REQ_ERROR` / `IB_CM_REP_ERROR` / `IB_CM_DREQ_ERROR`); an established
//!   connection learns only from its QP, once the data path's retries are exhausted.
//!
//! So a flap the transport rides out ends nothing there. ibcm does the same for
//! handshakes and tells established connections when their QPs would give up:
//!
//! - While the port is down nothing is sent from it (`push_mad`, `resend`), a connect or
//!   SIDR_REQ from it fails with [`CmError::PortDown`], and a MAD said to arrive on it is
//!   dropped (receive.rs).
//! - Handshakes, a DREQ and a SIDR_REQ keep their own retry timers: their retries go
//!   nowhere and they end as any unanswered request ends (Timeout, the REJ(Timeout) not
//!   sent). If the port comes back first, the next retry goes out and they complete.
//!   States that wait on their owner (REQ received, REP prepared, REP received, DREQ
//!   received) keep waiting, as in AL and Linux.
//! - An established connection on the port gets a deadline: when its RC QP's transport
//!   retries would have run out, (Retry Count + 1) x its Local ACK Timeout
//!   ([`transport_give_up_ns`]; IBA 9.7.6.1.3, C9-140: the requester re-sends an
//!   unacknowledged packet Retry Count times, each after the Local ACK Timeout, then
//!   reports the error), counted from the port's going down, with the values its QP was
//!   given at RTS (qp.rs: `timeout` = `ack_timeout`, `retry_count`). It uses the CEP's
//!   own timer: an established CEP has none armed, unless a LAP is in flight; a LAP keeps
//!   its timer, and when it gives up (Timeout(LAP)) the deadline, still counted from the
//!   port's going down, takes over. If the port is still down at the deadline the owner
//!   is told once, with a DREQ (`DreqReceived`, no private data): the event the `iba_cm`
//!   clients act on while connected. WinVerbs completes the application's
//!   NotifyDisconnect (wv_ep.c:546-551); ND v2 flushes the QP (nd_ep.cpp:714-727,
//!   `AsyncFlushQp`) and ignores `iba_cm_dreq_error` there (nd_ep.cpp:868-869), so a
//!   Timeout would go unheard; an ND application sees a graceful remote close for what
//!   was a local link failure. If the port came back first, the deadline finds it up and
//!   does nothing: no scan at port up. A port that went down again since counts from its
//!   latest down.
//! - A connection told (or whose DREQ gave up) while its port was down owes its peer the
//!   DREQ it could not send: its timewait does not end while the port is down (it is
//!   re-armed), and once the port is up the DREQ goes out once and timewait runs once
//!   more (`timewait_over`). The peer answers with a DREP (ibcm's `on_dreq`, Linux
//!   `cm_dreq_handler`, AL `__dreq_handler` answer even an unknown DREQ), so a peer whose
//!   port stayed up hears exactly once, after this side's port is back, and the same QPNs
//!   reconnect without REJ(StaleConn).
//! - APM: an established connection whose loaded alternate path leaves from another port
//!   that is up gets no deadline (its QP migrates; Linux `cm_alloc_msg` sends on the
//!   alternate when the primary port is not ready); [`CmManager::migrate`] moves the
//!   CEP's port to the alternate's, so CM MADs follow the QP.
//!
//! | state when the port goes down          | while it stays down            | then          |
//! |----------------------------------------|--------------------------------|---------------|
//! | REQ sent (MRA received or not)         | `Timeout { Req }` at retry end | idle          |
//! | REQ received, MRA sent or not          | nothing (waits on its owner)   | as before     |
//! | REP prepared                           | nothing (waits on its owner)   | as before     |
//! | REP sent (MRA received or not)         | `Timeout { Rep }` at retry end | timewait      |
//! | REP received (MRA sent or not)         | nothing (waits on its owner)   | as before     |
//! | established                            | `DreqReceived` at the deadline | DREQ received |
//! | established, LAP sent                  | `Timeout { Lap }`, then `DreqReceived` | DREQ received |
//! | DREQ sent                              | `Timeout { Dreq }` at retry end| timewait (DREQ owed) |
//! | DREQ received, timewait                | none (already told)            | as before     |
//! | SIDR_REQ sent                          | `Timeout { SidrReq }` at retry end | idle      |
//! | listen, idle, SIDR answered/answering  | none                           | as before     |
//!
//! A REQ received and not answered when the port comes back is answered as usual; a
//! retried REQ that arrives after its CEP ended is a new request on the listen. HCA
//! removal arrives as DOWN then REMOVE (al_pnp.c:1022-1036): the DOWN ends nothing, and
//! [`CmManager::remove_port`] gives each connection its one `DeviceRemoval`.
//!
//! `port_down` walks the slab in slices ([`PORT_SCAN_SLOTS`]) and not at all for a port
//! with no established connection or one already down (AL can send DOWN twice:
//! al_pnp.c:1382-1397).

use crate::cep::{Cep, LapState, State};
use crate::error::CmError;
use crate::event::Event;
use crate::types::{CepId, Instant, PathRecord, PrivateData};
use ibcm_mad::AttributeId;

use super::alternate::Alt;
use super::{CmManager, ports};

/// The slots one [`CmManager::port_down`] call looks at, at most: the walk runs under
/// the dispatch layer's spinlock at DISPATCH_LEVEL (review of issue #29 item 3, finding
/// 4: 1e6 idle slots took 29.8 ms in one call), so it is cut into short holds, as a
/// timer pass is.
pub const PORT_SCAN_SLOTS: usize = 1024;

/// Ports that are down, since when, and how many established connections each port has.
#[derive(Debug, Clone)]
pub(super) struct DownPorts {
    bits: [u64; 4],
    /// When each port went down (valid while its bit is set).
    since: [Instant; 256],
    /// Established CEPs per port (`note_state`, `move_port`): a port with none is not
    /// walked at all.
    established: [u32; 256],
}

impl Default for DownPorts {
    fn default() -> Self {
        Self {
            bits: [0; 4],
            since: [Instant::from_nanos(0); 256],
            established: [0; 256],
        }
    }
}

impl DownPorts {
    fn bit(port: u8) -> (usize, u64) {
        (usize::from(port / 64), 1u64 << (port % 64))
    }

    pub(super) fn contains(&self, port: u8) -> bool {
        let (word, bit) = Self::bit(port);
        self.bits.get(word).is_some_and(|w| w & bit != 0)
    }

    pub(super) fn set(&mut self, port: u8, down: bool) {
        let (word, bit) = Self::bit(port);
        if let Some(w) = self.bits.get_mut(word) {
            if down {
                *w |= bit;
            } else {
                *w &= !bit;
            }
        }
    }

    fn since(&self, port: u8) -> Instant {
        self.since[usize::from(port)]
    }

    /// A CEP on `port` went from `from` to `to`: keeps the count of established ones.
    pub(super) fn note_state(&mut self, port: u8, from: State, to: State) {
        let n = &mut self.established[usize::from(port)];
        match (from == State::Established, to == State::Established) {
            (false, true) => *n = n.saturating_add(1),
            (true, false) => *n = n.saturating_sub(1),
            _ => {}
        }
    }

    /// An established CEP moved from port `from` to port `to` (APM, `migrate`).
    pub(super) fn move_port(&mut self, from: u8, to: u8) {
        let old = &mut self.established[usize::from(from)];
        *old = old.saturating_sub(1);
        let new = &mut self.established[usize::from(to)];
        *new = new.saturating_add(1);
    }
}

/// How long an RC QP on this connection keeps re-sending an unacknowledged packet before
/// it gives up and goes to the error state: its Retry Count plus the first try, each
/// waited out by the Local ACK Timeout (IBA 9.7.6.1.3 "Transport Timer", C9-140..C9-141:
/// 4.096 us x 2^timeout per try; the retry count as given to the QP, IBA 9.7.6.1.3
/// "Retry Counter"). The values are those `qp_attributes_of` gives the QP at RTS
/// (qp.rs: `timeout` = `ack_timeout`, `retry_count`). A timeout of 0 is "infinite"
/// (IBA 9.7.6.1.3); ibcm never gives one (`Cep::path_ack_timeout` makes 0 into 1, as
/// Linux), and it is read as 1 here so that a deadline exists.
pub(super) fn transport_give_up_ns(c: &Cep) -> u64 {
    let tries = u64::from(c.retry_count.min(7)) + 1;
    let per_try = ibcm_mad::ib_time_ns(c.ack_timeout.clamp(1, 31)).unwrap_or(u64::MAX);
    tries.saturating_mul(per_try)
}

impl CmManager {
    /// The port left the Active state (module docs). Nothing ends now: sends from the
    /// port are dropped, connects from it are refused, handshakes keep their own retry
    /// timers, and every established connection on it gets a deadline (when its QP's
    /// transport retries would have run out, `transport_give_up_ns`, from now). One
    /// that still has its port down then is told with [`Event::DreqReceived`]; one whose
    /// port came back lives on. A connection whose loaded alternate path leaves from
    /// another port that is up gets no deadline: its QP migrates (APM).
    ///
    /// Bounded: one call looks at [`PORT_SCAN_SLOTS`] slots from slab index `from` (0 the
    /// first time) and returns where to go on (None: all seen). Call until None; it emits
    /// no events. A port with no established connection, or already down, returns None at
    /// once. No allocation: DISPATCH_LEVEL.
    #[must_use]
    pub fn port_down(&mut self, now: Instant, port: u8, from: usize) -> Option<usize> {
        if from == 0 {
            if self.down.contains(port) {
                // AL can send DOWN twice (ACTIVE -> INIT -> DOWN, al_pnp.c:1382-1397):
                // the deadlines of the first still run.
                return None;
            }
            self.down.set(port, true);
            self.down.since[usize::from(port)] = now;
        }
        if self.down.established[usize::from(port)] == 0 {
            return None;
        }
        let end = from.saturating_add(PORT_SCAN_SLOTS).min(self.slots.len());
        for index in from..end {
            let hit = self.slots.get(index).and_then(|s| {
                let c = s.cep.as_ref()?;
                (c.dest.port == port
                    && c.state == State::Established
                    && c.timer_pos == super::NO_TIMER)
                    .then(|| self.id_at(index, s))
            });
            if let Some(id) = hit {
                self.arm_port_deadline(id);
            }
        }
        (end < self.slots.len()).then_some(end)
    }

    /// The port is Active again: sends from it resume and connects from it are taken.
    /// Nothing is walked: a deadline that fires with its port up does nothing, and an
    /// owed DREQ goes out when its timewait next ends (`timewait_over`).
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

    /// The local port a path leaves from: the port whose GID table holds its source GID
    /// (and, subnet-local with a LID, whose LIDs hold its source LID), as
    /// [`Self::check_source`] places it. None if no port told ([`Self::set_port`]) has it.
    pub(super) fn port_of_path(&self, path: &PathRecord) -> Option<u8> {
        if self.ports.is_empty() {
            return None;
        }
        self.ports
            .iter()
            .map(ports::PortAddress::port_number)
            .find(|&port| self.check_source(port, path).is_ok())
    }

    /// The local port a CEP's alternate path leaves from ([`Self::port_of_path`]); the
    /// primary's when no port placed it (no port told, or no alternate).
    pub(super) fn alternate_port(&self, c: &Cep) -> u8 {
        self.port_of_alternate(c, self.alternate_of(c))
    }

    /// The local port the alternate path `alt` of CEP `c` would leave from (a LAP's, before
    /// it is loaded); the primary's when no port placed it.
    pub(super) fn port_of_alternate(&self, c: &Cep, alt: Option<&PathRecord>) -> u8 {
        alt.filter(|p| p.is_present())
            .and_then(|alt| self.port_of_path(alt))
            .unwrap_or(c.dest.port)
    }

    /// Whether an established connection's QP can migrate off `port` when it is down:
    /// its loaded alternate path leaves from another port that is up.
    fn migrates_off(&self, c: &Cep) -> bool {
        self.alternate_of(c)
            .filter(|p| p.is_present())
            .and_then(|alt| self.port_of_path(alt))
            .is_some_and(|p| p != c.dest.port && !self.down.contains(p))
    }

    /// Arms an established CEP's port deadline if its port is down and it cannot
    /// migrate: at the port's down time + [`transport_give_up_ns`]. Called by
    /// `port_down`, on entering Established (`set_state`) and when a LAP gives up.
    pub(super) fn arm_port_deadline(&mut self, id: CepId) {
        let Some(c) = self.cep_any(id) else { return };
        let port = c.dest.port;
        if c.state != State::Established || !self.down.contains(port) || self.migrates_off(c) {
            return;
        }
        let at = self.down.since(port).add_nanos(transport_give_up_ns(c));
        self.arm(id, at);
    }

    /// An established CEP's timer fired with no LAP in flight: its port deadline. Told
    /// once if its port is still down (and it cannot migrate) and the deadline, counted
    /// from the port's latest down, has passed; re-armed if the port went down again
    /// since; nothing if the port is up.
    pub(super) fn port_deadline(&mut self, now: Instant, id: CepId) {
        let Some(c) = self.cep_any(id) else { return };
        let port = c.dest.port;
        if !self.down.contains(port) || self.migrates_off(c) {
            return;
        }
        let at = self.down.since(port).add_nanos(transport_give_up_ns(c));
        if at > now {
            self.arm(id, at);
            return;
        }
        if let Some(c) = self.cep_mut(id) {
            c.lap = LapState::Idle;
            c.owes_dreq = true;
        }
        self.drop_path(id, Alt::Pending);
        self.set_state(id, State::DreqRcvd);
        if self.cep_any(id).is_some_and(|c| c.detached) {
            // No owner to answer (destroy sends a DREQ first, so this is only a guard):
            // without it the CEP would wait in DREQ received for ever.
            self.enter_timewait(now, id);
        } else {
            self.emit(id, Event::DreqReceived(PrivateData::new(&[])));
        }
    }

    /// A CEP's timewait ended. One that owes its peer a DREQ (told while its port was
    /// down, or its DREQ gave up while down) waits on while its port is down; once the
    /// port is up the DREQ goes out once (the peer answers with a DREP: ibcm's `on_dreq`,
    /// Linux `cm_dreq_handler`, AL `__dreq_handler` answer even an unknown one) and
    /// timewait runs once more, since the peer's QP may send until it hears.
    pub(super) fn timewait_over(&mut self, now: Instant, id: CepId) {
        let Some(c) = self.cep_any(id) else { return };
        if !c.owes_dreq {
            self.exit_timewait(id);
            return;
        }
        let wait = c.timewait_ns(self.alternate_of(c));
        if !self.down.contains(c.dest.port) {
            if let Some(c) = self.cep_mut(id) {
                c.owes_dreq = false;
            }
            // Empty private data: no pool room needed (as `destroy`'s DREQ).
            if let Ok(held) = self.store(&[]) {
                self.send_held(id, AttributeId::Dreq, held);
            }
        }
        self.arm(id, now.add_nanos(wait));
    }
}
