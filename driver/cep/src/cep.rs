//! One CEP: the state of one communication endpoint, and what it remembers of its peer.

use ibcm_mad::{AttributeId, Failover, Mtu, Transport};

use crate::path_table::PathRef;
use crate::pdata_pool::Held;
use crate::types::{CepId, Instant, MadAddress, PathRecord};

/// The state of a CEP, by name (IBA 12.9.6 Figure 154; MRA sub-states folded in as
/// `MraReqRcvd` etc. as Linux names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateName {
    /// Created, or back after a connection ended.
    Idle,
    /// Listening for REQs.
    Listen,
    /// REQ sent, waiting for the REP.
    ReqSent,
    /// REQ sent and an MRA received for it.
    MraReqRcvd,
    /// REQ received, no answer yet.
    ReqRcvd,
    /// REQ received and MRA sent.
    MraReqSent,
    /// REP formatted and QP attributes handed out; not sent yet (pre-REP).
    RepPrepared,
    /// REP sent, waiting for the RTU.
    RepSent,
    /// REP sent and an MRA received for it.
    MraRepRcvd,
    /// REP received, RTU not sent yet.
    RepRcvd,
    /// REP received and MRA sent.
    MraRepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for the DREP.
    DreqSent,
    /// DREQ received, DREP not sent yet.
    DreqRcvd,
    /// Waiting out stray packets before the QP may be reused.
    Timewait,
    /// SIDR_REQ sent, waiting for the SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ received, SIDR_REP not sent yet.
    SidrReqRcvd,
    /// SIDR_REP sent; kept a while to answer repeated SIDR_REQs the same way.
    SidrRepSent,
    /// The port this CEP used was removed; only destroy remains.
    Removed,
}

/// The state, with what only that state needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Idle,
    Listen,
    ReqSent { mra_rcvd: bool },
    ReqRcvd { mra_sent: bool },
    RepPrepared { mra_sent: bool },
    RepSent { mra_rcvd: bool },
    RepRcvd { mra_sent: bool },
    Established,
    DreqSent,
    DreqRcvd,
    Timewait,
    SidrReqSent,
    SidrReqRcvd,
    SidrRepSent,
    Removed,
}

impl State {
    pub(crate) fn name(self) -> StateName {
        match self {
            Self::Idle => StateName::Idle,
            Self::Listen => StateName::Listen,
            Self::ReqSent { mra_rcvd: false } => StateName::ReqSent,
            Self::ReqSent { mra_rcvd: true } => StateName::MraReqRcvd,
            Self::ReqRcvd { mra_sent: false } => StateName::ReqRcvd,
            Self::ReqRcvd { mra_sent: true } => StateName::MraReqSent,
            Self::RepPrepared { .. } => StateName::RepPrepared,
            Self::RepSent { mra_rcvd: false } => StateName::RepSent,
            Self::RepSent { mra_rcvd: true } => StateName::MraRepRcvd,
            Self::RepRcvd { mra_sent: false } => StateName::RepRcvd,
            Self::RepRcvd { mra_sent: true } => StateName::MraRepSent,
            Self::Established => StateName::Established,
            Self::DreqSent => StateName::DreqSent,
            Self::DreqRcvd => StateName::DreqRcvd,
            Self::Timewait => StateName::Timewait,
            Self::SidrReqSent => StateName::SidrReqSent,
            Self::SidrReqRcvd => StateName::SidrReqRcvd,
            Self::SidrRepSent => StateName::SidrRepSent,
            Self::Removed => StateName::Removed,
        }
    }
}

/// Path migration on an established connection (IBA 12.8; Linux's separate `lap_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum LapState {
    /// No LAP in progress.
    #[default]
    Idle,
    /// LAP sent, waiting for the APR.
    Sent { mra_rcvd: bool },
    /// LAP received, APR not sent yet.
    Rcvd { mra_sent: bool },
    /// APR formatted (pre-APR), not sent yet.
    AprPrepared { mra_sent: bool },
}

/// Where a REQ-created CEP stands in its listen's backlog (manager/held.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backlog {
    /// Past the backlog: its event waits in the listen's queue, not reported yet.
    Held,
    /// Reported; its user has not read it.
    Reported,
    /// Read by its user (`take_request`): its endpoint is the user's.
    Taken,
}

/// The retransmission state of the one request a CEP may have outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retry {
    /// Wait before the first retry.
    pub base_ns: u64,
    /// When the request is given up whatever retries remain ([`Retry::NO_DEADLINE`]:
    /// never; not an `Option`, which would take 8 more bytes in every CEP).
    pub deadline: Instant,
    /// Retries left.
    pub left: u8,
    /// Retries done.
    pub done: u8,
}

impl Retry {
    /// No deadline: only the retry count ends the request.
    pub(crate) const NO_DEADLINE: Instant = Instant::from_nanos(u64::MAX);
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            base_ns: 0,
            deadline: Self::NO_DEADLINE,
            left: 0,
            done: 0,
        }
    }
}

/// One communication endpoint.
///
/// `repr(C)`, hot fields first: with the slot's generation, what routing a MAD and
/// answering a duplicate read sits in the slot's first 64 bytes (with 10^6 CEPs nearly
/// every CEP a MAD names is a cache miss, and the lines it spans are what the MAD costs).
/// The rest is ordered by alignment so that there is no padding: the CEP is most of the
/// memory a connection takes (budget: 512 bytes in all). Keep both when adding a field.
#[derive(Debug, Clone)]
#[repr(C)]
pub(crate) struct Cep {
    // ---- hot: the slot's first 64 bytes ----
    pub state: State,
    /// Destroyed by its owner: it lingers (DREQ, timewait) but reports nothing.
    pub detached: bool,
    /// This side sent the REQ.
    pub active: bool,
    /// The MRA this side sent for the REQ was the manager's own (waiting.rs), not its
    /// owner's: the owner's `mra` then replaces it instead of failing.
    pub mra_by_manager: bool,
    /// Which message `pdata` belongs to: the last one sent that a duplicate may repeat.
    pub cached: Option<AttributeId>,
    pub remote_comm_id: u32,
    pub local_qpn: u32,
    pub tid: u64,
    /// Where this CEP's MADs go.
    pub dest: MadAddress,
    pub remote_qpn: u32,
    /// The MRA this side sent last (ServiceTimeout), to repeat on a duplicate.
    pub mra_service_timeout: u8,
    pub max_cm_retries: u8,
    pub remote_cm_response_timeout: u8,
    /// The peer's (active side) or this CA's (passive side) ACK delay.
    pub target_ack_delay: u8,
    // ---- the rest, by alignment ----
    pub retry: Retry,
    pub remote_ca_guid: u64,
    pub service_id: u64,
    pub primary: PathRecord,
    /// The listen whose backlog this REQ-created CEP counts against, until its REQ is
    /// answered (manager/held.rs).
    pub backlog_of: Option<CepId>,
    pub local_psn: u32,
    pub remote_psn: u32,
    /// This CEP's wire LocalCommID (src/comm_id.rs), derived once when its slot was given
    /// to it: every MAD it sends and every trace of it names it, and the derivation is
    /// four SipHash rounds.
    pub local_comm_id: u32,
    /// Passive, while its REQ is unanswered: when the REQ arrived, in units of 2^12 ns
    /// (wrapping every 4.9 h), the start of its answer time (waiting.rs).
    pub req_arrival: u32,
    /// Passive, while its REQ is unanswered: the count of answers after which the REQs
    /// ahead of it are answered (wrapping; waiting.rs).
    pub req_ticket: u32,
    /// Where its armed timer's entry is in the timer heap (manager/timer_heap.rs;
    /// `NO_TIMER`: none armed).
    pub timer_pos: u32,
    /// The alternate path, in the manager's path table (src/path_table.rs).
    pub alternate: Option<PathRef>,
    /// The alternate path a LAP carries, until its APR settles it (and a REQ's alternate
    /// path a pre-REP refused, until the REP goes), in the path table.
    pub pending_alternate: Option<PathRef>,
    /// Private data of that message, in the manager's private-data pool (src/pdata_pool.rs).
    pub pdata: Held,
    /// Private data of that MRA: kept apart from `pdata`, since an MRA sent after the
    /// pre-REP must not replace the REP's (which `send_rep` and REP repeats still need).
    pub mra_pdata: Held,
    /// Additional information of the APR or SIDR_REP this side sent (IBA Tables 116, 120).
    pub apr_info: Held,
    pub pkey: u16,
    pub transport: Transport,
    pub path_mtu: Mtu,
    pub failover: Failover,
    /// Path migration sub-state (only while established).
    pub lap: LapState,
    /// Local ACK timeout of the primary path (for RTS).
    pub ack_timeout: u8,
    /// This side's responder resources and initiator depth.
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// The peer's, from its REQ or REP.
    pub peer_responder_resources: u8,
    pub peer_initiator_depth: u8,
    /// Transport retry count (from the REQ, both sides).
    pub retry_count: u8,
    /// RNR retry count this side uses (set by the peer's message).
    pub rnr_retry: u8,
    /// RNR retry count this side asks of the peer.
    pub peer_rnr_retry: u8,
    pub local_cm_response_timeout: u8,
    pub srq: bool,
    pub flow_control: bool,
    /// DREQ_RCVD after a simultaneous disconnect: the peer's DREP was reported (a
    /// duplicate of it must not be).
    pub drep_rcvd: bool,
    /// Its peer is owed a DREQ this side could not send: told of a connection ended
    /// while its port was down, or its DREQ gave up then (link.rs `timewait_over`).
    pub owes_dreq: bool,
    /// Where it stands in `backlog_of`'s backlog.
    pub backlog: Backlog,
    /// The APR this side sent last: status and additional info (repeated on a dup LAP).
    pub apr_status: u8,
    /// This CEP connects peer-to-peer: a crossing REQ for its service is compared with
    /// its own (IBA 12.9.3.1).
    pub peer_to_peer: bool,
    /// `owner` is set.
    pub owned: bool,
    /// What its owner keeps with it (`CmManager::set_owner`): the dispatch layer's file
    /// and endpoint.
    pub owner: [u64; 2],
}

impl Cep {
    pub(crate) fn new() -> Self {
        Self {
            state: State::Idle,
            detached: false,
            backlog_of: None,
            active: false,
            mra_by_manager: false,
            timer_pos: crate::manager::NO_TIMER,
            retry: Retry::default(),
            dest: MadAddress::default(),
            tid: 0,
            remote_comm_id: 0,
            remote_ca_guid: 0,
            service_id: 0,
            local_qpn: 0,
            local_psn: 0,
            local_comm_id: 0,
            remote_qpn: 0,
            remote_psn: 0,
            req_arrival: 0,
            req_ticket: 0,
            pkey: 0,
            transport: Transport::Rc,
            path_mtu: Mtu::Mtu1024,
            primary: PathRecord::default(),
            alternate: None,
            ack_timeout: 0,
            responder_resources: 0,
            initiator_depth: 0,
            peer_responder_resources: 0,
            peer_initiator_depth: 0,
            retry_count: 0,
            rnr_retry: 0,
            peer_rnr_retry: 0,
            max_cm_retries: 0,
            remote_cm_response_timeout: 0,
            local_cm_response_timeout: 0,
            target_ack_delay: 0,
            srq: false,
            flow_control: false,
            failover: Failover::NotSupported,
            mra_service_timeout: 0,
            mra_pdata: Held::NONE,
            lap: LapState::Idle,
            pending_alternate: None,
            apr_status: 0,
            apr_info: Held::NONE,
            peer_to_peer: false,
            owned: false,
            owner: [0; 2],
            drep_rcvd: false,
            owes_dreq: false,
            backlog: Backlog::Reported,
            cached: None,
            pdata: Held::NONE,
        }
    }

    /// The QP ACK timeout (IB time) for a path of this connection with packet life time
    /// `plt`. Active: twice the life time plus the passive CA's ACK delay from the REP
    /// (Linux `cm_rep_handler` -> `cm_ack_timeout`, cm.c:2566-2573; the exact ceiling,
    /// [`ibcm_iba::ack_timeout`]). Passive: the REQ's (or LAP's) LocalACKTimeout as sent,
    /// i.e. `plt + 1` with `plt` recovered as LocalACKTimeout - 1: the active side
    /// computed it with its own CA's ACK delay, the delay of the CA the passive side sends
    /// to (Linux `cm_req_handler` + `cm_init_av_by_path`, cm.c:1716-1718, 546; AL
    /// `__format_req_av`, al_cm_cep.c:800-801). A LocalACKTimeout of 0 gives 1, as Linux:
    /// AL keeps 0, an infinite timeout, where one lost packet would hang the QP.
    pub(crate) fn path_ack_timeout(&self, plt: u8) -> u8 {
        if self.active {
            ibcm_iba::ack_timeout(plt, self.target_ack_delay)
        } else {
            plt.saturating_add(1).min(31)
        }
    }

    /// Timewait: 2 x packet life time + the target's ACK delay (IBA 12.9.8.7; WinOF
    /// `__calc_timewait`), with the larger packet life time of the primary and the loaded
    /// alternate path `alternate`: packets may linger on either (WinOF's `max_2pkt_life`,
    /// "of any path used on a connection", set by `__save_user_req` / `__save_wire_req`).
    pub(crate) fn timewait_ns(&self, alternate: Option<&PathRecord>) -> u64 {
        let longest = alternate
            .map_or(0, |a| a.packet_life_time)
            .max(self.primary.packet_life_time);
        let plt = ibcm_mad::ib_time_ns(longest.min(31)).unwrap_or(0);
        let delay = ibcm_mad::ib_time_ns(self.target_ack_delay.min(31)).unwrap_or(0);
        plt.saturating_mul(2).saturating_add(delay)
    }

    /// 2 x packet life time, the round trip part of every CM response timeout.
    pub(crate) fn round_trip_ns(&self) -> u64 {
        ibcm_mad::ib_time_ns(self.primary.packet_life_time.min(31))
            .unwrap_or(0)
            .saturating_mul(2)
    }
}
