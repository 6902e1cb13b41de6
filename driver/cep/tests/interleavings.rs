//! Random interleavings of user operations with MAD loss, duplication, reordering and
//! delay, on the two-node virtual-time harness ([`Pair`] with [`Chaos`]).
//!
//! Each case opens 1..20 connections from A to B. Every connection has a plan: when A
//! connects; whether B listens on its service; what B's user does with the REQ (accept,
//! MRA then accept, accept and report "communication established" itself, reject, MRA then
//! reject, destroy) and after how long; what A's user does with the REP (RTU, MRA then RTU,
//! reject, destroy); how an established connection is torn down (A disconnects, B
//! disconnects, both at the same instant, A destroys, B destroys); and maybe one destroy of
//! A's or B's CEP at a random moment. DREQs are answered with a DREP after a think time.
//! The link loses, duplicates and delays MADs at random (seeded `Chaos`); a delay never
//! exceeds the packet life time, the protocol's bound on how long a MAD may live. Think
//! times stay inside the peers' retry windows, so without loss nothing may time out.
//!
//! B may see one connection more than once: after an attempt ends *without* timewait (B
//! rejected or destroyed the REQ, or took A's REJ) B forgets the peer, and a REQ retry or
//! duplicate still in flight is a new request (Linux and WinOF do the same). Each such B
//! CEP is an *incarnation* of the connection; B's user treats each by the same plan.
//!
//! Checked, on every event:
//! - per CEP, at most one each of ReqReceived, RepReceived, RtuReceived, DreqReceived,
//!   DrepReceived, MraReceived, TimewaitExit, and at most one Rejected-or-Timeout; nothing
//!   after TimewaitExit; only TimewaitExit after a Rejected or Timeout; nothing at all
//!   after the user destroyed the CEP; ReqReceived only as a B CEP's first event, RepReceived
//!   only on A, RtuReceived only on B;
//! - a new incarnation appears only when every earlier one of the same connection is Idle
//!   or destroyed (a REQ is never reported twice while a CEP still handles it).
//!
//! Checked once the case settles (no MAD in flight, no timer, no user action pending) --
//! the consistency relation between A's and B's views of each connection:
//! - R1 every `Rejected` A reports was sent by B: InvalidServiceId <-> B does not listen;
//!   ConsumerDefined for the REQ <-> an incarnation B's user rejected (same private data)
//!   or destroyed before sending its REP (no private data); ConsumerDefined for "other" <->
//!   an incarnation destroyed in REP_SENT; Timeout (ARI = B's GUID) <-> an incarnation
//!   reported Timeout{Rep}; StaleConn <-> an incarnation accepted (reached timewait).
//! - R2 every `Rejected` an incarnation reports was sent by A: ConsumerDefined for the REP
//!   <-> A's user rejected the REP (same private data) or destroyed A in REP_RCVD; Timeout
//!   (ARI = A's GUID) <-> A destroyed in REQ_SENT or A reported Timeout{Req}. Nothing else.
//! - R3 MraReceived on one side <-> the other side's user sent an MRA; DreqReceived on one
//!   side <-> the other side disconnected or destroyed an established CEP.
//! - R4 establishment: at most one incarnation is established (RtuReceived, DreqReceived
//!   before either, or `established()`), and only if A's RTU went out; A's Timeout{Req}
//!   excludes any established incarnation.
//! - R5 every CEP not destroyed has ended: Idle with a last event of Rejected, Timeout or
//!   TimewaitExit (an incarnation B's user rejected may have none), or -- only if MADs are
//!   lost -- still Established because its peer's DREQs or REJ were all lost.
//! - R6 without loss, strictly: no Timeout at all on A (REQ, DREQ), B's Timeout{Rep} only
//!   for a REP A never answered with an RTU; A established <-> exactly one incarnation
//!   established (or it was destroyed in REP_SENT, then A got its REJ); and a connection
//!   established on both sides and not destroyed is torn down as planned: the side that
//!   did not disconnect gets exactly one DreqReceived and the one that did gets
//!   DrepReceived; after a simultaneous disconnect each side gets the crossing DREQ or,
//!   if the link reordered it behind the DREP that answers it, the DREP; both end with
//!   TimewaitExit.
//!
//! Finally every CEP is destroyed and virtual time runs until nothing is left: both
//! managers must then have no CEP, no peer-map entry and no timer entry.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ibcm_cep::pair::{Chaos, GUID_A, GUID_B, Pair, Side};
use ibcm_cep::{CepId, CmConfig, Event, Instant, RejectParams, StateName};
use ibcm_mad::{AttributeId, MessageKind, RejReason};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const SERVICE: u64 = 0x5000;
const SERVICE_UNLISTENED: u64 = 0x6000;
/// 4.096us * 2^14 = 67 ms: the MRA asks for more than any think time.
const MRA_TIMEOUT: u8 = 14;
const A_REJ_PD: &[u8] = b"A says no";
const B_REJ_PD: &[u8] = b"B says no";
/// A's packet life time: 4.096us * 2^10 = 4.2 ms; B derives 2^11 from A's ACK timeout.
const PACKET_LIFE_TIME: u8 = 10;
/// CM response timeouts: 4.096us * 2^12 = 16.8 ms; REQ/DREQ retries every ~25 ms, REP
/// retries every ~34 ms, three retries each.
const RESPONSE_TIMEOUT: u8 = 12;
/// Longest think time: inside every retry window (~100 ms).
const MAX_THINK_NS: u64 = 40_000_000;
/// Longest link delay: the packet life time.
const MAX_DELAY_NS: u64 = 4_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BReply {
    Accept,
    MraAccept,
    /// Accept, and call `established()` as soon as A has sent its RTU (the QP's
    /// communication-established event racing the RTU).
    AcceptEstablished,
    Reject,
    MraReject,
    Destroy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AReply {
    Rtu,
    MraRtu,
    Reject,
    Destroy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Teardown {
    DisconnectA,
    DisconnectB,
    Simultaneous,
    DestroyA,
    DestroyB,
}

#[derive(Debug, Clone)]
struct Plan {
    listened: bool,
    start_ns: u64,
    b_reply: BReply,
    b_think_ns: u64,
    a_reply: AReply,
    a_think_ns: u64,
    teardown: Teardown,
    teardown_ns: u64,
    /// One destroy at a random moment: A's CEP (true) or B's newest incarnation.
    destroy_at: Option<(bool, u64)>,
}

#[derive(Debug, Clone)]
struct Faults {
    seed: u64,
    drop_per_mille: u16,
    duplicate_per_mille: u16,
    delay_per_mille: u16,
    max_delay_ns: u64,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Connect(usize),
    BReply(usize, CepId),
    AReply(usize),
    Drep(Side, CepId),
    Disconnect(Side, usize),
    Simultaneous(usize),
    Destroy(Side, usize),
    BEstablished(usize),
}

#[derive(Debug, Default)]
struct Inc {
    cep: Option<CepId>,
    events: Vec<Event>,
    destroyed: Option<StateName>,
    user_rejected: bool,
    accepted: bool,
    mra: bool,
    est: bool,
    sent_dreq: bool,
}

#[derive(Debug, Default)]
struct Conn {
    a: Inc,
    incs: Vec<Inc>,
}

impl Conn {
    fn current_b(&self) -> Option<CepId> {
        self.incs.last().and_then(|i| i.cep)
    }
}

struct Sim {
    p: Pair,
    plans: Vec<Plan>,
    conns: Vec<Conn>,
    a_map: HashMap<CepId, usize>,
    b_map: HashMap<CepId, (usize, usize)>,
    listen: CepId,
    queue: BinaryHeap<Reverse<(Instant, usize)>>,
    actions: Vec<Action>,
    seen_a: usize,
    seen_b: usize,
    lossy: bool,
}

type Check = Result<(), TestCaseError>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(TestCaseError::fail(format!($($fmt)*)));
        }
    };
}

/// Private data as it comes off the wire: `expected`, then zeros.
fn pd_is(pd: &ibcm_cep::PrivateData, expected: &[u8]) -> bool {
    let s = pd.as_slice();
    s.len() >= expected.len()
        && &s[..expected.len()] == expected
        && s[expected.len()..].iter().all(|&b| b == 0)
}

fn rejected_with(events: &[Event]) -> impl Iterator<Item = &Event> {
    events
        .iter()
        .filter(|e| matches!(e, Event::Rejected { .. }))
}

fn has(events: &[Event], pred: impl Fn(&Event) -> bool) -> bool {
    events.iter().any(pred)
}

fn count(events: &[Event], pred: impl Fn(&Event) -> bool) -> usize {
    events.iter().filter(|e| pred(e)).count()
}

fn is_terminal(e: &Event) -> bool {
    matches!(
        e,
        Event::Rejected { .. } | Event::Timeout { .. } | Event::TimewaitExit
    )
}

impl Sim {
    fn new(plans: Vec<Plan>, faults: &Faults) -> Self {
        let mut a = CmConfig::new(GUID_A, [faults.seed as u8; 32]);
        let mut b = CmConfig::new(GUID_B, [(faults.seed >> 8) as u8; 32]);
        a.ca_ack_delay = 10;
        b.ca_ack_delay = 10;
        let mut p = Pair::with_config(a, b);
        let mut chaos = Chaos::new(faults.seed);
        chaos.drop_per_mille = faults.drop_per_mille;
        chaos.duplicate_per_mille = faults.duplicate_per_mille;
        chaos.delay_per_mille = faults.delay_per_mille;
        chaos.max_delay_ns = faults.max_delay_ns;
        p.chaos = Some(chaos);
        let listen = p.b.create().expect("create listen");
        p.b.listen(listen, Pair::listen_params(SERVICE, 1024))
            .expect("listen");
        let n = plans.len();
        let mut sim = Self {
            p,
            plans,
            conns: (0..n).map(|_| Conn::default()).collect(),
            a_map: HashMap::new(),
            b_map: HashMap::new(),
            listen,
            queue: BinaryHeap::new(),
            actions: Vec::new(),
            seen_a: 0,
            seen_b: 0,
            lossy: faults.drop_per_mille > 0,
        };
        for i in 0..n {
            let start = sim.plans[i].start_ns;
            sim.schedule_at(start, Action::Connect(i));
            if let Some((a_side, offset)) = sim.plans[i].destroy_at {
                let side = if a_side { Side::A } else { Side::B };
                sim.schedule_at(start + offset, Action::Destroy(side, i));
            }
        }
        sim
    }

    fn schedule_at(&mut self, at_ns: u64, action: Action) {
        let at = Instant::from_nanos(1_000_000).add_nanos(at_ns);
        self.actions.push(action);
        self.queue.push(Reverse((at, self.actions.len() - 1)));
    }

    fn schedule(&mut self, after_ns: u64, action: Action) {
        let at = self.p.now.add_nanos(after_ns);
        self.actions.push(action);
        self.queue.push(Reverse((at, self.actions.len() - 1)));
    }

    /// Runs until nothing is left to happen.
    fn run(&mut self) -> Check {
        for _ in 0..1_000_000 {
            let user = self.queue.peek().map(|Reverse((at, _))| *at);
            let wake = self.p.next_wakeup();
            match (user, wake) {
                (None, None) => return Ok(()),
                (Some(u), w) if w.is_none_or(|w| u <= w) => {
                    let Some(Reverse((at, index))) = self.queue.pop() else {
                        unreachable!()
                    };
                    if at > self.p.now {
                        self.p.now = at;
                    }
                    let action = self.actions[index];
                    self.act(action);
                    self.p.flush();
                }
                _ => {
                    self.p.step();
                }
            }
            self.absorb()?;
        }
        Err(TestCaseError::fail("no quiescence after 10^6 steps"))
    }

    fn inc_mut(&mut self, i: usize, cep: CepId) -> Option<&mut Inc> {
        self.conns[i].incs.iter_mut().find(|x| x.cep == Some(cep))
    }

    fn destroy(&mut self, side: Side, i: usize, cep: CepId) {
        let now = self.p.now;
        let Ok(state) = self.p.node(side).state(cep) else {
            return;
        };
        if self.p.node(side).destroy(now, cep).is_err() {
            return;
        }
        let rec = match side {
            Side::A => &mut self.conns[i].a,
            Side::B => match self.inc_mut(i, cep) {
                Some(x) => x,
                None => return,
            },
        };
        rec.destroyed = Some(state);
        if state == StateName::Established {
            rec.sent_dreq = true;
        }
    }

    fn act(&mut self, action: Action) {
        let now = self.p.now;
        match action {
            Action::Connect(i) => {
                let plan = &self.plans[i];
                let service = if plan.listened {
                    SERVICE
                } else {
                    SERVICE_UNLISTENED
                };
                let pd = [i as u8, b'A'];
                let mut cp = Pair::connect_params(service, 0x100 + i as u32);
                cp.primary_path.packet_life_time = PACKET_LIFE_TIME;
                cp.remote_cm_response_timeout = RESPONSE_TIMEOUT;
                cp.local_cm_response_timeout = RESPONSE_TIMEOUT;
                cp.max_cm_retries = 3;
                cp.private_data = &pd;
                let cep = self.p.a.create().expect("create");
                self.p.a.connect(now, cep, &cp).expect("connect");
                self.conns[i].a.cep = Some(cep);
                self.a_map.insert(cep, i);
            }
            Action::BReply(i, cep) => match self.plans[i].b_reply {
                BReply::Accept | BReply::MraAccept | BReply::AcceptEstablished => {
                    let mut rp = Pair::rep_params(0x200 + i as u32);
                    rp.private_data = b"B accepts";
                    if self.p.b.accept(now, cep, &rp).is_ok()
                        && let Some(x) = self.inc_mut(i, cep)
                    {
                        x.accepted = true;
                    }
                }
                BReply::Reject | BReply::MraReject => {
                    let rp = RejectParams {
                        reason: RejReason::ConsumerDefined,
                        ari: &[],
                        private_data: B_REJ_PD,
                    };
                    if self.p.b.reject(now, cep, &rp).is_ok()
                        && let Some(x) = self.inc_mut(i, cep)
                    {
                        x.user_rejected = true;
                    }
                }
                BReply::Destroy => self.destroy(Side::B, i, cep),
            },
            Action::AReply(i) => {
                let Some(cep) = self.conns[i].a.cep else {
                    return;
                };
                match self.plans[i].a_reply {
                    AReply::Rtu | AReply::MraRtu => {
                        if self.p.a.rtu(cep, b"A ready").is_ok() {
                            self.conns[i].a.est = true;
                            self.on_established(Side::A, i);
                            if self.plans[i].b_reply == BReply::AcceptEstablished {
                                self.schedule(500, Action::BEstablished(i));
                            }
                        }
                    }
                    AReply::Reject => {
                        let rp = RejectParams {
                            reason: RejReason::ConsumerDefined,
                            ari: &[],
                            private_data: A_REJ_PD,
                        };
                        if self.p.a.reject(now, cep, &rp).is_ok() {
                            self.conns[i].a.user_rejected = true;
                        }
                    }
                    AReply::Destroy => self.destroy(Side::A, i, cep),
                }
            }
            Action::BEstablished(i) => {
                if let Some(cep) = self.conns[i].current_b()
                    && self.p.b.established(cep).is_ok()
                {
                    self.mark_b_est(i, cep);
                }
            }
            Action::Drep(side, cep) => {
                let _ = self.p.node(side).drep(now, cep, b"");
            }
            Action::Disconnect(side, i) => self.disconnect(side, i),
            Action::Simultaneous(i) => {
                self.disconnect(Side::A, i);
                self.disconnect(Side::B, i);
            }
            Action::Destroy(side, i) => {
                let cep = match side {
                    Side::A => self.conns[i].a.cep,
                    Side::B => self.conns[i].current_b(),
                };
                if let Some(cep) = cep {
                    self.destroy(side, i, cep);
                }
            }
        }
    }

    fn disconnect(&mut self, side: Side, i: usize) {
        let now = self.p.now;
        let cep = match side {
            Side::A => self.conns[i].a.cep,
            Side::B => self.conns[i].current_b(),
        };
        let Some(cep) = cep else { return };
        if self.p.node(side).disconnect(now, cep, b"").is_ok() {
            match side {
                Side::A => self.conns[i].a.sent_dreq = true,
                Side::B => {
                    if let Some(x) = self.inc_mut(i, cep) {
                        x.sent_dreq = true;
                    }
                }
            }
        }
    }

    fn mark_b_est(&mut self, i: usize, cep: CepId) {
        let Some(x) = self.inc_mut(i, cep) else {
            return;
        };
        if x.est {
            return;
        }
        x.est = true;
        self.on_established(Side::B, i);
    }

    /// One side of connection `i` just became established: schedule its teardown.
    fn on_established(&mut self, side: Side, i: usize) {
        let plan = &self.plans[i];
        let delay = plan.teardown_ns;
        let a_est = self.conns[i].a.est;
        let b_est = self.conns[i].incs.iter().any(|x| x.est);
        match (plan.teardown, side) {
            (Teardown::DisconnectA, Side::A) => {
                self.schedule(delay, Action::Disconnect(Side::A, i))
            }
            (Teardown::DisconnectB, Side::B) => {
                self.schedule(delay, Action::Disconnect(Side::B, i))
            }
            (Teardown::DestroyA, Side::A) => self.schedule(delay, Action::Destroy(Side::A, i)),
            (Teardown::DestroyB, Side::B) => self.schedule(delay, Action::Destroy(Side::B, i)),
            (Teardown::Simultaneous, _) if a_est && b_est => {
                self.schedule(delay, Action::Simultaneous(i));
            }
            _ => {}
        }
    }

    /// Takes the events produced since the last call: checks them and reacts.
    fn absorb(&mut self) -> Check {
        while self.seen_a < self.p.events_a.len() || self.seen_b < self.p.events_b.len() {
            if self.seen_a < self.p.events_a.len() {
                let (cep, e) = self.p.events_a[self.seen_a];
                self.seen_a += 1;
                self.on_event_a(cep, e)?;
            } else {
                let (cep, e) = self.p.events_b[self.seen_b];
                self.seen_b += 1;
                self.on_event_b(cep, e)?;
            }
        }
        Ok(())
    }

    fn check_event(side: Side, i: usize, rec: &Inc, e: &Event) -> Check {
        let ev = &rec.events;
        let ctx = || format!("{side:?} conn {i}: {e:?} after {ev:?}");
        ensure!(rec.destroyed.is_none(), "event after destroy: {}", ctx());
        ensure!(
            !has(ev, |x| matches!(x, Event::TimewaitExit)),
            "event after TimewaitExit: {}",
            ctx()
        );
        if has(ev, |x| {
            matches!(x, Event::Rejected { .. } | Event::Timeout { .. })
        }) {
            ensure!(
                matches!(e, Event::TimewaitExit),
                "event after Rejected/Timeout: {}",
                ctx()
            );
        }
        let same = |x: &Event| core::mem::discriminant(x) == core::mem::discriminant(e);
        let once = matches!(
            e,
            Event::ReqReceived(_)
                | Event::RepReceived(_)
                | Event::RtuReceived(_)
                | Event::DreqReceived(_)
                | Event::DrepReceived(_)
                | Event::MraReceived { .. }
        );
        ensure!(!(once && has(ev, same)), "duplicate event: {}", ctx());
        match (side, e) {
            (Side::A, Event::ReqReceived(_) | Event::RtuReceived(_)) => {
                return Err(TestCaseError::fail(format!("wrong side: {}", ctx())));
            }
            (Side::B, Event::RepReceived(_)) => {
                return Err(TestCaseError::fail(format!("wrong side: {}", ctx())));
            }
            (Side::B, Event::ReqReceived(_)) => {
                ensure!(ev.is_empty(), "ReqReceived not first: {}", ctx());
            }
            _ => {}
        }
        Ok(())
    }

    fn on_event_a(&mut self, cep: CepId, e: Event) -> Check {
        let Some(&i) = self.a_map.get(&cep) else {
            return Err(TestCaseError::fail(format!(
                "A event on unknown CEP: {e:?}"
            )));
        };
        Self::check_event(Side::A, i, &self.conns[i].a, &e)?;
        self.conns[i].a.events.push(e);
        let plan = self.plans[i].clone();
        match e {
            Event::RepReceived(_) => {
                if plan.a_reply == AReply::MraRtu && self.p.a.mra(cep, MRA_TIMEOUT, b"").is_ok() {
                    self.conns[i].a.mra = true;
                }
                self.schedule(plan.a_think_ns, Action::AReply(i));
            }
            Event::DreqReceived(_) => {
                self.schedule(plan.a_think_ns / 2, Action::Drep(Side::A, cep))
            }
            _ => {}
        }
        Ok(())
    }

    fn on_event_b(&mut self, cep: CepId, e: Event) -> Check {
        if let Event::ReqReceived(info) = e {
            let i = usize::from(info.private_data.as_slice()[0]);
            ensure!(
                i < self.conns.len() && info.listen == self.listen,
                "REQ from nowhere: {info:?}"
            );
            ensure!(!self.b_map.contains_key(&cep), "ReqReceived on a known CEP");
            // Every earlier incarnation must be over.
            for old in &self.conns[i].incs {
                let Some(old) = old.cep else { continue };
                let state = self.p.b.state(old);
                ensure!(
                    matches!(state, Ok(StateName::Idle) | Err(_)),
                    "conn {i}: new incarnation while {state:?}: {:?}",
                    self.conns[i]
                );
            }
            self.conns[i].incs.push(Inc {
                cep: Some(cep),
                ..Inc::default()
            });
            self.b_map.insert(cep, (i, self.conns[i].incs.len() - 1));
        }
        let Some(&(i, k)) = self.b_map.get(&cep) else {
            return Err(TestCaseError::fail(format!(
                "B event on unknown CEP: {e:?}"
            )));
        };
        Self::check_event(Side::B, i, &self.conns[i].incs[k], &e)?;
        self.conns[i].incs[k].events.push(e);
        let plan = self.plans[i].clone();
        match e {
            Event::ReqReceived(_) => {
                self.p.b.take_request(cep).expect("take");
                if matches!(plan.b_reply, BReply::MraAccept | BReply::MraReject)
                    && self.p.b.mra(cep, MRA_TIMEOUT, b"").is_ok()
                {
                    self.conns[i].incs[k].mra = true;
                }
                self.schedule(plan.b_think_ns, Action::BReply(i, cep));
            }
            Event::RtuReceived(_) => self.mark_b_est(i, cep),
            Event::DreqReceived(_) => {
                // A DREQ in REP_SENT stands for the lost RTU: established.
                if let Some(x) = self.inc_mut(i, cep) {
                    x.est = true;
                }
                self.schedule(plan.b_think_ns / 2, Action::Drep(Side::B, cep));
            }
            _ => {}
        }
        Ok(())
    }

    /// R1..R6 for connection `i` (see the file's documentation).
    fn check_conn(&self, i: usize) -> Check {
        let plan = &self.plans[i];
        let c = &self.conns[i];
        let a = &c.a;
        let ctx = || {
            format!(
                "conn {i} plan {plan:?} lossy {}\nA {a:?}\nB {:?}",
                self.lossy, c.incs
            )
        };
        let destroyed_in =
            |x: &Inc, states: &[StateName]| x.destroyed.is_some_and(|s| states.contains(&s));
        let before_rep = [
            StateName::ReqRcvd,
            StateName::MraReqSent,
            StateName::RepPrepared,
        ];
        let in_rep_sent = [StateName::RepSent, StateName::MraRepRcvd];
        // R1.
        for r in rejected_with(&a.events) {
            let Event::Rejected {
                reason,
                message,
                ari,
                ari_len,
                private_data,
            } = r
            else {
                unreachable!()
            };
            let ok = match (*reason, *message) {
                (RejReason::InvalidServiceId, MessageKind::Req) => !plan.listened,
                (RejReason::ConsumerDefined, MessageKind::Req) => c.incs.iter().any(|x| {
                    (x.user_rejected && pd_is(private_data, B_REJ_PD))
                        || (destroyed_in(x, &before_rep) && pd_is(private_data, b""))
                }),
                (RejReason::ConsumerDefined, MessageKind::Other) => {
                    c.incs.iter().any(|x| destroyed_in(x, &in_rep_sent))
                }
                (RejReason::Timeout, MessageKind::Other) => {
                    ari[..usize::from(*ari_len)] == GUID_B.to_be_bytes()
                        && c.incs.iter().any(|x| {
                            has(&x.events, |e| {
                                matches!(
                                    e,
                                    Event::Timeout {
                                        message: AttributeId::Rep
                                    }
                                )
                            })
                        })
                }
                (RejReason::StaleConn, _) => c.incs.iter().any(|x| x.accepted),
                _ => false,
            };
            ensure!(ok, "R1: A's {r:?} unexplained: {}", ctx());
        }
        // R2.
        for x in &c.incs {
            for r in rejected_with(&x.events) {
                let Event::Rejected {
                    reason,
                    message,
                    ari,
                    ari_len,
                    private_data,
                } = r
                else {
                    unreachable!()
                };
                let ok = match (*reason, *message) {
                    (RejReason::ConsumerDefined, MessageKind::Rep) => {
                        (a.user_rejected && pd_is(private_data, A_REJ_PD))
                            || (destroyed_in(a, &[StateName::RepRcvd, StateName::MraRepSent])
                                && pd_is(private_data, b""))
                    }
                    (RejReason::Timeout, MessageKind::Other) => {
                        ari[..usize::from(*ari_len)] == GUID_A.to_be_bytes()
                            && (destroyed_in(a, &[StateName::ReqSent, StateName::MraReqRcvd])
                                || has(&a.events, |e| {
                                    matches!(
                                        e,
                                        Event::Timeout {
                                            message: AttributeId::Req
                                        }
                                    )
                                }))
                    }
                    _ => false,
                };
                ensure!(ok, "R2: B's {r:?} unexplained: {}", ctx());
            }
        }
        // R3.
        let mra = |e: &Event| matches!(e, Event::MraReceived { .. });
        let dreq = |e: &Event| matches!(e, Event::DreqReceived(_));
        // B's engine sends an MRA itself for a REQ still unanswered at half the
        // sender's response timeout (src/manager/waiting.rs, IBA 12.6.6).
        let b_slow = plan.b_think_ns >= ibcm_mad::ib_time_ns(RESPONSE_TIMEOUT).unwrap_or(0) / 2;
        ensure!(
            !has(&a.events, mra) || c.incs.iter().any(|x| x.mra) || b_slow,
            "R3: A's MRA unexplained: {}",
            ctx()
        );
        ensure!(
            !has(&a.events, dreq) || c.incs.iter().any(|x| x.sent_dreq),
            "R3: A's DREQ unexplained: {}",
            ctx()
        );
        for x in &c.incs {
            ensure!(
                !has(&x.events, mra) || a.mra,
                "R3: B's MRA unexplained: {}",
                ctx()
            );
            ensure!(
                !has(&x.events, dreq) || a.sent_dreq,
                "R3: B's DREQ unexplained: {}",
                ctx()
            );
        }
        // R4.
        let established = c.incs.iter().filter(|x| x.est).count();
        let a_timeout = |m: AttributeId| has(&a.events, |e| *e == Event::Timeout { message: m });
        ensure!(
            established <= 1,
            "R4: {established} incarnations established: {}",
            ctx()
        );
        ensure!(
            established == 0 || a.est,
            "R4: B established without A's RTU: {}",
            ctx()
        );
        ensure!(
            established == 0 || !a_timeout(AttributeId::Req),
            "R4: B established but A timed out: {}",
            ctx()
        );
        // R5.
        let check_ended = |side: Side, x: &Inc| -> Check {
            let Some(cep) = x.cep else { return Ok(()) };
            if x.destroyed.is_some() {
                return Ok(());
            }
            let state = self.p.node_ref(side).state(cep);
            match state {
                Ok(StateName::Idle) => {
                    let last = x.events.last();
                    ensure!(
                        last.is_some_and(is_terminal) || (x.user_rejected && x.events.len() == 1),
                        "R5: {side:?} idle without an ending: {}",
                        ctx()
                    );
                }
                Ok(StateName::Established) if self.lossy => {}
                other => {
                    return Err(TestCaseError::fail(format!(
                        "R5: {side:?} left in {other:?}: {}",
                        ctx()
                    )));
                }
            }
            Ok(())
        };
        check_ended(Side::A, a)?;
        for x in &c.incs {
            check_ended(Side::B, x)?;
        }
        // R6.
        if self.lossy {
            return Ok(());
        }
        ensure!(
            !a_timeout(AttributeId::Req) && !a_timeout(AttributeId::Dreq),
            "R6: A timed out without loss: {}",
            ctx()
        );
        for x in &c.incs {
            ensure!(
                !has(&x.events, |e| *e
                    == Event::Timeout {
                        message: AttributeId::Dreq
                    }),
                "R6: B's DREQ timed out without loss: {}",
                ctx()
            );
            ensure!(
                !(a.est
                    && has(&x.events, |e| *e
                        == Event::Timeout {
                            message: AttributeId::Rep
                        })),
                "R6: B's REP timed out though A sent its RTU: {}",
                ctx()
            );
        }
        if a.est {
            ensure!(
                established == 1 || c.incs.iter().any(|x| destroyed_in(x, &in_rep_sent)),
                "R6: A established, B not: {}",
                ctx()
            );
        }
        let Some(b) = c.incs.iter().find(|x| x.est) else {
            return Ok(());
        };
        if !a.est || a.destroyed.is_some() || b.destroyed.is_some() {
            return Ok(());
        }
        let tw = |x: &Inc| matches!(x.events.last(), Some(Event::TimewaitExit));
        ensure!(tw(a) && tw(b), "R6: not through timewait: {}", ctx());
        let drep = |e: &Event| matches!(e, Event::DrepReceived(_));
        let ok = match plan.teardown {
            Teardown::DisconnectA => {
                count(&b.events, dreq) == 1 && !has(&a.events, dreq) && has(&a.events, drep)
            }
            Teardown::DisconnectB => {
                count(&a.events, dreq) == 1 && !has(&b.events, dreq) && has(&b.events, drep)
            }
            // Each DREQ is answered by the crossing DREQ or, if that one is overtaken by
            // the DREP to it, by the DREP.
            Teardown::Simultaneous => [a, b]
                .iter()
                .all(|x| has(&x.events, dreq) || has(&x.events, drep)),
            Teardown::DestroyA | Teardown::DestroyB => true,
        };
        ensure!(
            ok,
            "R6: teardown {:?} not as planned: {}",
            plan.teardown,
            ctx()
        );
        Ok(())
    }

    /// Destroys every CEP left and lets time run out.
    fn finish(&mut self) -> Check {
        let now = self.p.now;
        for i in 0..self.conns.len() {
            if let Some(cep) = self.conns[i].a.cep
                && self.conns[i].a.destroyed.is_none()
            {
                let _ = self.p.a.destroy(now, cep);
            }
            for k in 0..self.conns[i].incs.len() {
                let x = &self.conns[i].incs[k];
                if let Some(cep) = x.cep
                    && x.destroyed.is_none()
                {
                    let _ = self.p.b.destroy(now, cep);
                }
            }
        }
        self.p.b.destroy(now, self.listen).expect("destroy listen");
        let (ea, eb) = (self.p.events_a.len(), self.p.events_b.len());
        self.p.drive();
        ensure!(
            self.p.next_wakeup().is_none(),
            "still busy after 10^6 steps"
        );
        ensure!(
            self.p.events_a.len() == ea && self.p.events_b.len() == eb,
            "events from destroyed CEPs: {:?} {:?}",
            &self.p.events_a[ea..],
            &self.p.events_b[eb..]
        );
        for side in [Side::A, Side::B] {
            let m = self.p.node_ref(side);
            ensure!(
                m.live_ceps() == 0 && m.peer_map_entries() == 0 && m.timer_entries() == 0,
                "{side:?} not empty: {} CEPs, {} peer entries, {} timers",
                m.live_ceps(),
                m.peer_map_entries(),
                m.timer_entries()
            );
        }
        Ok(())
    }
}

trait NodeRef {
    fn node_ref(&self, side: Side) -> &ibcm_cep::CmManager;
}

impl NodeRef for Pair {
    fn node_ref(&self, side: Side) -> &ibcm_cep::CmManager {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }
}

fn plan() -> impl Strategy<Value = Plan> {
    (
        prop::bool::weighted(0.9),
        0u64..20_000_000,
        prop_oneof![
            4 => Just(BReply::Accept),
            2 => Just(BReply::MraAccept),
            1 => Just(BReply::AcceptEstablished),
            2 => Just(BReply::Reject),
            1 => Just(BReply::MraReject),
            1 => Just(BReply::Destroy),
        ],
        0u64..MAX_THINK_NS,
        prop_oneof![
            4 => Just(AReply::Rtu),
            2 => Just(AReply::MraRtu),
            1 => Just(AReply::Reject),
            1 => Just(AReply::Destroy),
        ],
        0u64..MAX_THINK_NS,
        prop_oneof![
            Just(Teardown::DisconnectA),
            Just(Teardown::DisconnectB),
            Just(Teardown::Simultaneous),
            Just(Teardown::DestroyA),
            Just(Teardown::DestroyB),
        ],
        0u64..20_000_000,
        prop::option::weighted(0.25, (any::<bool>(), 0u64..150_000_000)),
    )
        .prop_map(
            |(
                listened,
                start_ns,
                b_reply,
                b_think_ns,
                a_reply,
                a_think_ns,
                teardown,
                teardown_ns,
                destroy_at,
            )| Plan {
                listened,
                start_ns,
                b_reply,
                b_think_ns,
                a_reply,
                a_think_ns,
                teardown,
                teardown_ns,
                destroy_at,
            },
        )
}

fn faults() -> impl Strategy<Value = Faults> {
    (
        any::<u64>(),
        prop_oneof![Just(0u16), 1u16..=300],
        prop_oneof![Just(0u16), 1u16..=300],
        prop_oneof![Just(0u16), 1u16..=500],
        0u64..=MAX_DELAY_NS,
    )
        .prop_map(|(seed, drop, dup, delay, max_delay)| Faults {
            seed,
            drop_per_mille: drop,
            duplicate_per_mille: dup,
            delay_per_mille: delay,
            max_delay_ns: max_delay,
        })
}

fn run_case(plans: Vec<Plan>, faults: &Faults) -> Check {
    let n = plans.len();
    let mut sim = Sim::new(plans, faults);
    sim.run()?;
    for i in 0..n {
        sim.check_conn(i)?;
    }
    sim.finish()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn interleavings(plans in prop::collection::vec(plan(), 1..20), faults in faults()) {
        run_case(plans, &faults)?;
    }
}

/// The same relation on a fixed, fault-free run of every plan combination.
#[test]
fn every_reply_without_faults() {
    let b_replies = [
        BReply::Accept,
        BReply::MraAccept,
        BReply::AcceptEstablished,
        BReply::Reject,
        BReply::MraReject,
        BReply::Destroy,
    ];
    let a_replies = [AReply::Rtu, AReply::MraRtu, AReply::Reject, AReply::Destroy];
    let teardowns = [
        Teardown::DisconnectA,
        Teardown::DisconnectB,
        Teardown::Simultaneous,
        Teardown::DestroyA,
        Teardown::DestroyB,
    ];
    let mut plans = Vec::new();
    for &b_reply in &b_replies {
        for &a_reply in &a_replies {
            for &teardown in &teardowns {
                plans.push(Plan {
                    listened: true,
                    start_ns: plans.len() as u64 * 10_000,
                    b_reply,
                    b_think_ns: 1_000_000,
                    a_reply,
                    a_think_ns: 1_000_000,
                    teardown,
                    teardown_ns: 1_000_000,
                    destroy_at: None,
                });
            }
        }
    }
    let faults = Faults {
        seed: 7,
        drop_per_mille: 0,
        duplicate_per_mille: 0,
        delay_per_mille: 0,
        max_delay_ns: 0,
    };
    run_case(plans, &faults).unwrap();
}

/// Path migration, SIDR, peer-to-peer establishment and port removal on the same faulty
/// link (seeded [`Chaos`], the [`faults`] above).
///
/// Each case runs 1..12 jobs:
/// - **LAP**: on a connection established (fault-free) before the faults start, A or B
///   sends one LAP; the other side (maybe) MRAs it at once and, after a think time, answers
///   with an APR (Success or Reject); on Success each side may `migrate`.
/// - **SIDR**: A resolves a service B listens on (or not, on port 1); B's user answers
///   Success or Reject, or destroys the request, after a think time.
/// - **P2P**: A and B `connect_peer` to each other for the job's service at random times;
///   the passive side (A: `GUID_A < GUID_B`) accepts after a think time, B sends the RTU.
///
/// and maybe removes port 1 of A or B at a random moment (the link to that node is cut
/// then).
///
/// Checked on every event: per CEP at most one event of each kind; nothing after
/// TimewaitExit or DeviceRemoval; only TimewaitExit or DeviceRemoval after a Rejected or a
/// (non-LAP) Timeout; every event on the role that may get it (LapReceived on the LAP's
/// receiver, AprReceived/MraReceived/Timeout{Lap} on its sender, SidrRepReceived and
/// Timeout{SidrReq} on the requester, SidrReqReceived on a new B CEP naming the SIDR listen
/// -- a new incarnation only once every earlier one of the request was destroyed --,
/// ReqReceived only on A's peer-to-peer CEP naming itself, RepReceived only on B's);
/// DeviceRemoval only on the node whose port was removed.
///
/// Checked once the case settles, unless a port was removed:
/// - LAP: the receiver got the LAP at most once; the sender ends with exactly one
///   AprReceived or Timeout{Lap}; AprReceived carries the status the receiver sent;
///   MraReceived only if the receiver sent one; the sender's alternate path is the one it
///   proposed iff it got a Success APR, the receiver's is the one it was told iff it sent
///   one (primary and alternate swapped after `migrate`), and the two are the same path
///   seen from each end; both stay established. Without loss: no Timeout{Lap}.
/// - SIDR: the requester ends with exactly one SidrRepReceived or Timeout{SidrReq};
///   Unsupported iff B does not listen; Success (with B's QPN and Q_Key) iff B replied
///   Success; Reject iff B rejected or destroyed. Without loss: no timeout.
/// - P2P: B never gets a ReqReceived; A established iff its REP was answered; without
///   loss both are established exactly once, A with [ReqReceived, RtuReceived] and B with
///   [RepReceived].
///
/// With a port removed: every CEP on that node not idle or listening got exactly one
/// DeviceRemoval, at once, and is Removed; the node reports nothing after, and retries
/// nothing.
///
/// Finally everything is destroyed and time runs out: no CEP, peer-map entry or timer left.
mod migration_sidr_p2p {
    use super::*;
    use ibcm_cep::pair::Fate;
    use ibcm_cep::{ConnectParams, PathRecord, SidrParams, SidrReplyParams, counter_slot};
    use ibcm_mad::{AprStatus, SidrStatus};

    const LAP_SERVICE: u64 = 0x7000;
    const SIDR_SERVICE: u64 = 0x8000;
    const SIDR_UNLISTENED: u64 = 0x8100;
    const P2P_SERVICE: u64 = 0x9000;
    const SIDR_QPN: u32 = 0x77;
    const SIDR_QKEY: u32 = 0x1234_5678;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Answer {
        Success,
        Reject,
        Destroy,
    }

    #[derive(Debug, Clone)]
    pub(super) enum Job {
        Lap {
            from_a: bool,
            start_ns: u64,
            mra: bool,
            accept: bool,
            think_ns: u64,
            migrate: bool,
        },
        Sidr {
            start_ns: u64,
            listened: bool,
            answer: Answer,
            think_ns: u64,
        },
        P2p {
            a_start_ns: u64,
            b_start_ns: u64,
            think_ns: u64,
        },
    }

    #[derive(Debug, Clone, Copy)]
    enum Act {
        Start(usize),
        P2pB(usize),
        Apr(usize),
        SidrAnswer(usize, CepId),
        Accept(usize),
        Rtu(usize),
        Remove(Side),
    }

    /// What happened to one job.
    #[derive(Debug, Default)]
    struct St {
        /// A's and B's CEP (LAP: the connection; P2P: the two peers; SIDR: A's).
        a: Option<CepId>,
        b: Option<CepId>,
        /// SIDR: B's incarnations and what its user did.
        b_sidr: Vec<(CepId, Option<Answer>)>,
        mra_sent: bool,
        apr_sent: Option<AprStatus>,
        proposed: Option<PathRecord>,
        told: Option<PathRecord>,
        migrated_sender: bool,
        migrated_receiver: bool,
        rep_sent: bool,
        rtu_sent: bool,
    }

    struct Removal {
        side: Side,
        /// Events of that node when its port went.
        events: usize,
        retries: [u64; ibcm_cep::COUNTED_ATTRIBUTES],
        /// Its CEPs that were neither idle nor listening.
        bound: Vec<CepId>,
    }

    struct Ext {
        p: Pair,
        jobs: Vec<Job>,
        st: Vec<St>,
        events: HashMap<(Side, CepId), Vec<Event>>,
        owner: HashMap<(Side, CepId), usize>,
        queue: BinaryHeap<Reverse<(Instant, usize)>>,
        actions: Vec<Act>,
        seen_a: usize,
        seen_b: usize,
        lossy: bool,
        removal: Option<Removal>,
        listens: Vec<CepId>,
    }

    fn path_params(service: u64, qpn: u32, side: Side) -> ConnectParams<'static> {
        let mut cp = Pair::connect_params(service, qpn);
        cp.primary_path = Pair::path(side);
        cp.primary_path.packet_life_time = PACKET_LIFE_TIME;
        cp.remote_cm_response_timeout = RESPONSE_TIMEOUT;
        cp.local_cm_response_timeout = RESPONSE_TIMEOUT;
        cp.max_cm_retries = 3;
        cp
    }

    fn gid(lid: u16) -> [u8; 16] {
        let mut g = Pair::path(Side::A).sgid;
        g[14..].copy_from_slice(&lid.to_be_bytes());
        g
    }

    /// The alternate path a LAP from `side` proposes, from `side`'s end.
    fn alternate(side: Side, i: usize) -> PathRecord {
        let (s, d) = match side {
            Side::A => (0x100 + i as u16, 0x200 + i as u16),
            Side::B => (0x200 + i as u16, 0x100 + i as u16),
        };
        PathRecord {
            slid: s,
            dlid: d,
            sgid: gid(s),
            dgid: gid(d),
            sl: (i % 16) as u8,
            packet_life_time: PACKET_LIFE_TIME + 1,
            ..Pair::path(side)
        }
    }

    /// `theirs` is `ours` seen from the other end.
    fn same_path(ours: &PathRecord, theirs: &PathRecord) -> bool {
        (
            theirs.slid,
            theirs.dlid,
            theirs.sgid,
            theirs.dgid,
            theirs.sl,
        ) == (ours.dlid, ours.slid, ours.dgid, ours.sgid, ours.sl)
    }

    impl Ext {
        fn new(jobs: Vec<Job>, faults: &Faults, removal: Option<(bool, u64)>) -> Self {
            let mut a = CmConfig::new(GUID_A, [faults.seed as u8; 32]);
            let mut b = CmConfig::new(GUID_B, [(faults.seed >> 8) as u8; 32]);
            a.ca_ack_delay = 10;
            b.ca_ack_delay = 10;
            let mut p = Pair::with_config(a, b);
            let lap_listen = p.b.create().expect("create");
            p.b.listen(lap_listen, Pair::listen_params(LAP_SERVICE, 1024))
                .expect("listen");
            let sidr_listen = p.b.create().expect("create");
            let mut lp = Pair::listen_params(SIDR_SERVICE, 1024);
            lp.port = Some(1);
            p.b.listen(sidr_listen, lp).expect("listen");
            let n = jobs.len();
            let mut x = Self {
                p,
                jobs,
                st: (0..n).map(|_| St::default()).collect(),
                events: HashMap::new(),
                owner: HashMap::new(),
                queue: BinaryHeap::new(),
                actions: Vec::new(),
                seen_a: 0,
                seen_b: 0,
                lossy: faults.drop_per_mille > 0,
                removal: None,
                listens: vec![lap_listen, sidr_listen],
            };
            // Fault-free: the connections the LAPs run on, and the peers' CEPs.
            for i in 0..n {
                let own = |x: &mut Self, side: Side, cep: CepId| {
                    x.owner.insert((side, cep), i);
                };
                match x.jobs[i] {
                    Job::Lap { .. } => {
                        let a = x.p.a.create().expect("create");
                        let now = x.p.now;
                        x.p.a
                            .connect(now, a, &path_params(LAP_SERVICE, 0x300 + i as u32, Side::A))
                            .expect("connect");
                        x.p.drive_for(1_000_000);
                        let b = x.p.last_request().expect("REQ");
                        let now = x.p.now;
                        x.p.b.take_request(b).expect("take");
                        x.p.b
                            .accept(now, b, &Pair::rep_params(0x400 + i as u32))
                            .expect("accept");
                        x.p.drive_for(1_000_000);
                        x.p.a.rtu(a, b"").expect("rtu");
                        x.p.drive_for(1_000_000);
                        x.st[i].a = Some(a);
                        x.st[i].b = Some(b);
                        own(&mut x, Side::A, a);
                        own(&mut x, Side::B, b);
                    }
                    Job::Sidr { .. } => {
                        let a = x.p.a.create().expect("create");
                        x.st[i].a = Some(a);
                        own(&mut x, Side::A, a);
                    }
                    Job::P2p { .. } => {
                        let a = x.p.a.create().expect("create");
                        let b = x.p.b.create().expect("create");
                        x.st[i].a = Some(a);
                        x.st[i].b = Some(b);
                        own(&mut x, Side::A, a);
                        own(&mut x, Side::B, b);
                    }
                }
            }
            x.p.flush();
            x.seen_a = x.p.events_a.len();
            x.seen_b = x.p.events_b.len();
            let mut chaos = Chaos::new(faults.seed);
            chaos.drop_per_mille = faults.drop_per_mille;
            chaos.duplicate_per_mille = faults.duplicate_per_mille;
            chaos.delay_per_mille = faults.delay_per_mille;
            chaos.max_delay_ns = faults.max_delay_ns;
            x.p.chaos = Some(chaos);
            for i in 0..n {
                match x.jobs[i] {
                    Job::Lap { start_ns, .. } | Job::Sidr { start_ns, .. } => {
                        x.schedule(start_ns, Act::Start(i));
                    }
                    Job::P2p {
                        a_start_ns,
                        b_start_ns,
                        ..
                    } => {
                        x.schedule(a_start_ns, Act::Start(i));
                        x.schedule(b_start_ns, Act::P2pB(i));
                    }
                }
            }
            if let Some((on_a, at_ns)) = removal {
                x.schedule(at_ns, Act::Remove(if on_a { Side::A } else { Side::B }));
            }
            x
        }

        fn schedule(&mut self, after_ns: u64, act: Act) {
            let at = self.p.now.add_nanos(after_ns);
            self.actions.push(act);
            self.queue.push(Reverse((at, self.actions.len() - 1)));
        }

        fn run(&mut self) -> Check {
            for _ in 0..1_000_000 {
                let user = self.queue.peek().map(|Reverse((at, _))| *at);
                let wake = self.p.next_wakeup();
                match (user, wake) {
                    (None, None) => return Ok(()),
                    (Some(u), w) if w.is_none_or(|w| u <= w) => {
                        let Some(Reverse((at, index))) = self.queue.pop() else {
                            unreachable!()
                        };
                        if at > self.p.now {
                            self.p.now = at;
                        }
                        let act = self.actions[index];
                        self.act(act)?;
                        self.p.flush();
                    }
                    _ => {
                        self.p.step();
                    }
                }
                self.absorb()?;
            }
            Err(TestCaseError::fail("no quiescence after 10^6 steps"))
        }

        fn act(&mut self, act: Act) -> Check {
            let now = self.p.now;
            // The user of a node whose port went does nothing more on it.
            let acting = match act {
                Act::Start(i) => match self.jobs[i] {
                    Job::Lap { from_a: false, .. } => Side::B,
                    _ => Side::A,
                },
                Act::Apr(i) => match self.jobs[i] {
                    Job::Lap { from_a: true, .. } => Side::B,
                    _ => Side::A,
                },
                Act::P2pB(_) | Act::SidrAnswer(..) | Act::Rtu(_) => Side::B,
                Act::Accept(_) => Side::A,
                Act::Remove(side) => side.peer(),
            };
            if self.removal.as_ref().is_some_and(|r| r.side == acting) {
                return Ok(());
            }
            match act {
                Act::Start(i) => match self.jobs[i].clone() {
                    Job::Lap { from_a, .. } => {
                        let (side, cep) = if from_a {
                            (Side::A, self.st[i].a)
                        } else {
                            (Side::B, self.st[i].b)
                        };
                        let path = alternate(side, i);
                        let cep = cep.expect("connection");
                        if self.p.node(side).lap(now, cep, &path, &[i as u8]).is_ok() {
                            self.st[i].proposed = Some(path);
                        }
                    }
                    Job::Sidr { listened, .. } => {
                        let service = if listened {
                            SIDR_SERVICE
                        } else {
                            SIDR_UNLISTENED
                        };
                        let mut path = Pair::path(Side::A);
                        path.packet_life_time = PACKET_LIFE_TIME;
                        let sp = SidrParams {
                            service_id: service,
                            port: 1,
                            pkey: 0xffff,
                            path,
                            timeout: RESPONSE_TIMEOUT,
                            max_retries: 3,
                            private_data: &[i as u8],
                        };
                        let a = self.st[i].a.expect("requester");
                        let _ = self.p.a.sidr_request(now, a, &sp);
                    }
                    Job::P2p { .. } => {
                        let a = self.st[i].a.expect("peer");
                        let cp = path_params(P2P_SERVICE + i as u64, 0x500 + i as u32, Side::A);
                        let _ = self.p.a.connect_peer(now, a, &cp);
                    }
                },
                Act::P2pB(i) => {
                    let b = self.st[i].b.expect("peer");
                    let cp = path_params(P2P_SERVICE + i as u64, 0x600 + i as u32, Side::B);
                    let _ = self.p.b.connect_peer(now, b, &cp);
                }
                Act::Apr(i) => {
                    let Job::Lap {
                        from_a,
                        accept,
                        migrate,
                        ..
                    } = self.jobs[i]
                    else {
                        unreachable!()
                    };
                    let (side, cep) = if from_a {
                        (Side::B, self.st[i].b)
                    } else {
                        (Side::A, self.st[i].a)
                    };
                    let cep = cep.expect("connection");
                    let status = if accept {
                        AprStatus::Success
                    } else {
                        AprStatus::Reject
                    };
                    let m = self.p.node(side);
                    if m.prepare_apr(cep, status, b"", &[i as u8]).is_ok()
                        && m.send_apr(cep).is_ok()
                    {
                        self.st[i].apr_sent = Some(status);
                        if accept && migrate {
                            ensure!(
                                self.p.node(side).migrate(cep).is_ok(),
                                "job {i}: the receiver cannot migrate after its Success APR"
                            );
                            self.st[i].migrated_receiver = true;
                        }
                    }
                }
                Act::SidrAnswer(i, cep) => {
                    let Job::Sidr { answer, .. } = self.jobs[i] else {
                        unreachable!()
                    };
                    let done = match answer {
                        Answer::Success | Answer::Reject => {
                            let rp = SidrReplyParams {
                                status: if answer == Answer::Success {
                                    SidrStatus::Success
                                } else {
                                    SidrStatus::Reject
                                },
                                qpn: SIDR_QPN,
                                qkey: SIDR_QKEY,
                                info: b"",
                                private_data: &[i as u8],
                            };
                            self.p.b.sidr_reply(now, cep, &rp).is_ok()
                        }
                        Answer::Destroy => self.p.b.destroy(now, cep).is_ok(),
                    };
                    if done && let Some(inc) = self.st[i].b_sidr.iter_mut().find(|(c, _)| *c == cep)
                    {
                        inc.1 = Some(answer);
                    }
                }
                Act::Accept(i) => {
                    let a = self.st[i].a.expect("peer");
                    if self
                        .p
                        .a
                        .accept(now, a, &Pair::rep_params(0x500 + i as u32))
                        .is_ok()
                    {
                        self.st[i].rep_sent = true;
                    }
                }
                Act::Rtu(i) => {
                    let b = self.st[i].b.expect("peer");
                    if self.p.b.rtu(b, b"").is_ok() {
                        self.st[i].rtu_sent = true;
                    }
                }
                Act::Remove(side) => {
                    self.p.flush();
                    self.absorb()?;
                    let m = self.p.node(side);
                    let bound: Vec<CepId> = self
                        .owner
                        .keys()
                        .filter(|(s, _)| *s == side)
                        .map(|(_, c)| *c)
                        .filter(|&c| {
                            !matches!(m.state(c), Ok(StateName::Idle | StateName::Listen) | Err(_))
                        })
                        .collect();
                    let retries = m.counters().retries;
                    m.remove_port(1);
                    // The port is gone: nothing reaches the node, nothing leaves it.
                    for from in [side, side.peer()] {
                        for id in 0x10..=0x1a {
                            self.p
                                .fault(from, AttributeId::from(id), u32::MAX, Fate::Drop);
                        }
                    }
                    self.p.flush();
                    self.removal = Some(Removal {
                        side,
                        events: 0,
                        retries,
                        bound,
                    });
                    self.absorb()?;
                    if let Some(r) = &mut self.removal {
                        r.events = self.p.events(side).len();
                    }
                }
            }
            Ok(())
        }

        fn absorb(&mut self) -> Check {
            while self.seen_a < self.p.events_a.len() || self.seen_b < self.p.events_b.len() {
                if self.seen_a < self.p.events_a.len() {
                    let (cep, e) = self.p.events_a[self.seen_a];
                    self.seen_a += 1;
                    self.on_event(Side::A, cep, e)?;
                } else {
                    let (cep, e) = self.p.events_b[self.seen_b];
                    self.seen_b += 1;
                    self.on_event(Side::B, cep, e)?;
                }
            }
            Ok(())
        }

        fn on_event(&mut self, side: Side, cep: CepId, e: Event) -> Check {
            if let (Side::B, Event::SidrReqReceived(info)) = (side, e) {
                let i = usize::from(info.private_data.as_slice()[0]);
                ensure!(
                    i < self.jobs.len()
                        && matches!(self.jobs[i], Job::Sidr { listened: true, .. })
                        && info.listen == self.listens[1],
                    "SIDR_REQ from nowhere: {info:?}"
                );
                ensure!(
                    !self.owner.contains_key(&(side, cep)),
                    "SidrReqReceived on a known CEP"
                );
                // A new incarnation only once every earlier one was destroyed.
                ensure!(
                    self.st[i]
                        .b_sidr
                        .iter()
                        .all(|(_, a)| *a == Some(Answer::Destroy)),
                    "job {i}: a SIDR_REQ reported again: {:?}",
                    self.st[i]
                );
                self.st[i].b_sidr.push((cep, None));
                self.owner.insert((side, cep), i);
            }
            if side == Side::B && self.listens.contains(&cep) {
                // Only the listen bound to the port goes, once.
                let past = self.events.entry((side, cep)).or_default();
                ensure!(
                    e == Event::DeviceRemoval
                        && cep == self.listens[1]
                        && past.is_empty()
                        && self.removal.as_ref().is_some_and(|r| r.side == side),
                    "listen {cep:?}: {e:?} after {past:?}"
                );
                past.push(e);
                return Ok(());
            }
            let Some(&i) = self.owner.get(&(side, cep)) else {
                return Err(TestCaseError::fail(format!(
                    "{side:?}: {e:?} on an unknown CEP"
                )));
            };
            let past = self.events.entry((side, cep)).or_default();
            let ctx = || format!("{side:?} job {i}: {e:?} after {past:?}");
            ensure!(
                !past
                    .iter()
                    .any(|x| matches!(x, Event::TimewaitExit | Event::DeviceRemoval)),
                "event after TimewaitExit/DeviceRemoval: {}",
                ctx()
            );
            let lap_timeout = |x: &Event| {
                matches!(
                    x,
                    Event::Timeout {
                        message: AttributeId::Lap
                    }
                )
            };
            if past.iter().any(|x| {
                matches!(x, Event::Rejected { .. } | Event::Timeout { .. }) && !lap_timeout(x)
            }) {
                ensure!(
                    matches!(e, Event::TimewaitExit | Event::DeviceRemoval),
                    "event after the end: {}",
                    ctx()
                );
            }
            let same = |x: &Event| {
                core::mem::discriminant(x) == core::mem::discriminant(&e)
                    || (matches!(x, Event::AprReceived { .. }) && lap_timeout(&e))
                    || (lap_timeout(x) && matches!(e, Event::AprReceived { .. }))
            };
            ensure!(!past.iter().any(same), "a second of a kind: {}", ctx());
            let removed_here = self.removal.as_ref().is_some_and(|r| r.side == side);
            let role_ok = match (&self.jobs[i], e) {
                (_, Event::DeviceRemoval) => removed_here,
                (Job::Lap { from_a, .. }, Event::LapReceived { .. }) => {
                    (side == Side::B) == *from_a
                }
                (
                    Job::Lap { from_a, .. },
                    Event::AprReceived { .. } | Event::MraReceived { .. },
                ) => (side == Side::A) == *from_a,
                (Job::Lap { from_a, .. }, Event::Timeout { message }) => {
                    message == AttributeId::Lap && (side == Side::A) == *from_a
                }
                (Job::Sidr { .. }, Event::SidrRepReceived(_)) => side == Side::A,
                (Job::Sidr { .. }, Event::Timeout { message }) => {
                    side == Side::A && message == AttributeId::SidrReq
                }
                (Job::Sidr { .. }, Event::SidrReqReceived(_)) => side == Side::B,
                (Job::P2p { .. }, Event::ReqReceived(info)) => {
                    side == Side::A && info.listen == cep
                }
                (Job::P2p { .. }, Event::RepReceived(_)) => side == Side::B,
                (Job::P2p { .. }, Event::RtuReceived(_)) => side == Side::A,
                (
                    Job::P2p { .. },
                    Event::Rejected { .. }
                    | Event::Timeout { .. }
                    | Event::TimewaitExit
                    | Event::MraReceived { .. },
                ) => true,
                _ => false,
            };
            ensure!(role_ok, "not this CEP's event: {}", ctx());
            past.push(e);
            let think = match self.jobs[i] {
                Job::Lap { think_ns, .. }
                | Job::Sidr { think_ns, .. }
                | Job::P2p { think_ns, .. } => think_ns,
            };
            match e {
                Event::LapReceived { alternate_path, .. } => {
                    self.st[i].told = Some(alternate_path);
                    if let Job::Lap { mra: true, .. } = self.jobs[i]
                        && self.p.node(side).mra(cep, MRA_TIMEOUT, b"").is_ok()
                    {
                        self.st[i].mra_sent = true;
                    }
                    self.schedule(think, Act::Apr(i));
                }
                Event::AprReceived {
                    status: AprStatus::Success,
                    ..
                } => {
                    if let Job::Lap { migrate: true, .. } = self.jobs[i] {
                        ensure!(
                            self.p.node(side).migrate(cep).is_ok(),
                            "job {i}: the sender cannot migrate after a Success APR"
                        );
                        self.st[i].migrated_sender = true;
                    }
                }
                Event::SidrReqReceived(_) => self.schedule(think, Act::SidrAnswer(i, cep)),
                Event::ReqReceived(_) => self.schedule(think, Act::Accept(i)),
                Event::RepReceived(_) => self.schedule(think / 2, Act::Rtu(i)),
                _ => {}
            }
            Ok(())
        }

        fn events_of(&self, side: Side, cep: Option<CepId>) -> &[Event] {
            cep.and_then(|c| self.events.get(&(side, c)))
                .map_or(&[], Vec::as_slice)
        }

        fn check_removal(&self) -> Check {
            let Some(r) = &self.removal else {
                return Ok(());
            };
            let m = match r.side {
                Side::A => &self.p.a,
                Side::B => &self.p.b,
            };
            for &c in &r.bound {
                ensure!(
                    m.state(c) == Ok(StateName::Removed),
                    "{:?}: {c:?} is {:?} after its port went",
                    r.side,
                    m.state(c)
                );
                let ev = self.events_of(r.side, Some(c));
                ensure!(
                    matches!(ev.last(), Some(Event::DeviceRemoval)),
                    "{:?}: {c:?} got {ev:?}",
                    r.side
                );
            }
            ensure!(
                self.p.events(r.side).len() == r.events,
                "{:?} reported after its port went: {:?}",
                r.side,
                &self.p.events(r.side)[r.events..]
            );
            ensure!(
                m.counters().retries == r.retries,
                "{:?} retried after its port went",
                r.side
            );
            ensure!(m.timer_entries() == 0, "{:?}: timers left", r.side);
            Ok(())
        }

        fn check_job(&self, i: usize) -> Check {
            let st = &self.st[i];
            let ctx = || format!("job {i} {:?} lossy {}: {st:?}", self.jobs[i], self.lossy);
            match self.jobs[i] {
                Job::Lap { from_a, .. } => {
                    let (sender, receiver) = if from_a {
                        ((Side::A, st.a), (Side::B, st.b))
                    } else {
                        ((Side::B, st.b), (Side::A, st.a))
                    };
                    let se = self.events_of(sender.0, sender.1);
                    let re = self.events_of(receiver.0, receiver.1);
                    let apr = se.iter().find_map(|e| match e {
                        Event::AprReceived { status, .. } => Some(*status),
                        _ => None,
                    });
                    let timed_out = se.iter().any(|e| {
                        *e == Event::Timeout {
                            message: AttributeId::Lap,
                        }
                    });
                    ensure!(
                        apr.is_some() != timed_out,
                        "LAP not ended exactly once: {}",
                        ctx()
                    );
                    ensure!(
                        apr.is_none() || apr == st.apr_sent,
                        "APR status not the receiver's: {}",
                        ctx()
                    );
                    ensure!(
                        !has(se, |e| matches!(e, Event::MraReceived { .. })) || st.mra_sent,
                        "MRA unexplained: {}",
                        ctx()
                    );
                    ensure!(
                        st.apr_sent.is_none() || re.len() == 1,
                        "APR without one LapReceived: {}",
                        ctx()
                    );
                    let sm = self.p.node_ref(sender.0);
                    let rm = self.p.node_ref(receiver.0);
                    let sq = sm.query(sender.1.expect("cep")).expect("query");
                    let rq = rm.query(receiver.1.expect("cep")).expect("query");
                    ensure!(
                        sq.state == StateName::Established && rq.state == StateName::Established,
                        "not established: {}",
                        ctx()
                    );
                    let (s_primary, s_alt) = if st.migrated_sender {
                        (sq.alternate_path, Some(sq.primary_path))
                    } else {
                        (Some(sq.primary_path), sq.alternate_path)
                    };
                    let (r_primary, r_alt) = if st.migrated_receiver {
                        (rq.alternate_path, Some(rq.primary_path))
                    } else {
                        (Some(rq.primary_path), rq.alternate_path)
                    };
                    let success = apr == Some(AprStatus::Success);
                    ensure!(
                        s_alt == if success { st.proposed } else { None },
                        "sender's alternate path: {} {sq:?}",
                        ctx()
                    );
                    let r_success = st.apr_sent == Some(AprStatus::Success);
                    ensure!(
                        r_alt == if r_success { st.told } else { None },
                        "receiver's alternate path: {} {rq:?}",
                        ctx()
                    );
                    ensure!(
                        !success || r_success,
                        "sender loaded a path the receiver did not: {}",
                        ctx()
                    );
                    if let (Some(s), Some(r)) = (s_alt, r_alt) {
                        ensure!(same_path(&s, &r), "different alternates: {}", ctx());
                    }
                    if let (Some(s), Some(r)) = (s_primary, r_primary) {
                        ensure!(same_path(&s, &r), "different primaries: {}", ctx());
                    }
                    if !self.lossy {
                        ensure!(!timed_out && re.len() == 1, "lossless LAP: {}", ctx());
                    }
                }
                Job::Sidr {
                    listened, answer, ..
                } => {
                    let ae = self.events_of(Side::A, st.a);
                    ensure!(ae.len() == 1, "requester: {ae:?}: {}", ctx());
                    match ae[0] {
                        Event::SidrRepReceived(info) => {
                            let ok = match info.status {
                                SidrStatus::Unsupported => !listened,
                                SidrStatus::Success => {
                                    listened
                                        && answer == Answer::Success
                                        && (info.qpn, info.qkey) == (SIDR_QPN, SIDR_QKEY)
                                        && pd_is(&info.private_data, &[i as u8])
                                }
                                SidrStatus::Reject => {
                                    listened
                                        && st.b_sidr.iter().any(|(_, a)| {
                                            matches!(a, Some(Answer::Reject | Answer::Destroy))
                                        })
                                }
                                _ => false,
                            };
                            ensure!(ok, "SIDR_REP unexplained: {info:?}: {}", ctx());
                        }
                        Event::Timeout { .. } => ensure!(self.lossy, "{}", ctx()),
                        _ => unreachable!(),
                    }
                }
                Job::P2p { .. } => {
                    let ae = self.events_of(Side::A, st.a);
                    let be = self.events_of(Side::B, st.b);
                    let est = |side: Side, c: Option<CepId>| {
                        self.p.node_ref(side).state(c.expect("cep")) == Ok(StateName::Established)
                    };
                    ensure!(
                        !est(Side::A, st.a) || has(ae, |e| matches!(e, Event::ReqReceived(_))),
                        "A established without the REQ: {}",
                        ctx()
                    );
                    ensure!(
                        !est(Side::B, st.b) || st.rtu_sent,
                        "B established without its RTU: {}",
                        ctx()
                    );
                    if !self.lossy {
                        let kinds = |ev: &[Event]| -> Vec<&'static str> {
                            ev.iter()
                                .map(|e| match e {
                                    Event::ReqReceived(_) => "req",
                                    Event::RepReceived(_) => "rep",
                                    Event::RtuReceived(_) => "rtu",
                                    _ => "other",
                                })
                                .collect()
                        };
                        ensure!(
                            kinds(ae) == ["req", "rtu"] && kinds(be) == ["rep"],
                            "lossless p2p: A {ae:?} B {be:?}: {}",
                            ctx()
                        );
                        ensure!(
                            est(Side::A, st.a) && est(Side::B, st.b),
                            "lossless p2p not established: {}",
                            ctx()
                        );
                    }
                }
            }
            Ok(())
        }

        fn finish(&mut self) -> Check {
            self.p.chaos = None;
            self.p.faults.clear();
            let now = self.p.now;
            let ceps: Vec<(Side, CepId)> = self.owner.keys().copied().collect();
            for (side, cep) in ceps {
                let _ = self.p.node(side).destroy(now, cep);
            }
            for &l in &self.listens {
                self.p.b.destroy(now, l).expect("destroy listen");
            }
            self.p.flush();
            let (ea, eb) = (self.p.events_a.len(), self.p.events_b.len());
            self.p.drive();
            ensure!(
                self.p.next_wakeup().is_none(),
                "still busy after 10^6 steps"
            );
            ensure!(
                self.p.events_a.len() == ea && self.p.events_b.len() == eb,
                "events from destroyed CEPs: {:?} {:?}",
                &self.p.events_a[ea..],
                &self.p.events_b[eb..]
            );
            for side in [Side::A, Side::B] {
                let m = self.p.node_ref(side);
                ensure!(
                    m.live_ceps() == 0 && m.peer_map_entries() == 0 && m.timer_entries() == 0,
                    "{side:?} not empty: {} CEPs, {} peer entries, {} timers",
                    m.live_ceps(),
                    m.peer_map_entries(),
                    m.timer_entries()
                );
            }
            Ok(())
        }
    }

    pub(super) fn run_ext(jobs: Vec<Job>, faults: &Faults, removal: Option<(bool, u64)>) -> Check {
        let n = jobs.len();
        let mut x = Ext::new(jobs, faults, removal);
        x.run()?;
        x.check_removal()?;
        if x.removal.is_none() {
            for i in 0..n {
                x.check_job(i)?;
            }
        }
        // Counters add up: at most MaxCMRetries (3) retries per message sent.
        for side in [Side::A, Side::B] {
            let c = x.p.node_ref(side).counters();
            for attr in [AttributeId::Lap, AttributeId::SidrReq, AttributeId::Req] {
                let s = counter_slot(attr).expect("counted");
                ensure!(
                    c.retries[s] <= 3 * c.sent[s],
                    "{side:?} {attr:?}: {} retries for {} sent",
                    c.retries[s],
                    c.sent[s]
                );
            }
        }
        x.finish()
    }

    fn job() -> impl Strategy<Value = Job> {
        prop_oneof![
            (
                any::<bool>(),
                0u64..20_000_000,
                any::<bool>(),
                prop::bool::weighted(0.7),
                0u64..MAX_THINK_NS,
                any::<bool>(),
            )
                .prop_map(|(from_a, start_ns, mra, accept, think_ns, migrate)| {
                    Job::Lap {
                        from_a,
                        start_ns,
                        mra,
                        accept,
                        think_ns,
                        migrate,
                    }
                }),
            (
                0u64..20_000_000,
                prop::bool::weighted(0.85),
                prop_oneof![
                    Just(Answer::Success),
                    Just(Answer::Reject),
                    Just(Answer::Destroy)
                ],
                0u64..MAX_THINK_NS,
            )
                .prop_map(|(start_ns, listened, answer, think_ns)| Job::Sidr {
                    start_ns,
                    listened,
                    answer,
                    think_ns,
                }),
            (0u64..20_000_000, 0u64..20_000_000, 0u64..MAX_THINK_NS).prop_map(
                |(a_start_ns, b_start_ns, think_ns)| Job::P2p {
                    a_start_ns,
                    b_start_ns,
                    think_ns,
                }
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 2048,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn migration_sidr_p2p_interleavings(
            jobs in prop::collection::vec(job(), 1..12),
            faults in faults(),
            removal in prop::option::weighted(0.2, (any::<bool>(), 0u64..150_000_000)),
        ) {
            run_ext(jobs, &faults, removal)?;
        }
    }

    /// Every job variant, fault-free, with and without a port removal.
    #[test]
    fn every_job_without_faults() {
        let mut jobs = Vec::new();
        for from_a in [true, false] {
            for mra in [true, false] {
                for accept in [true, false] {
                    for migrate in [true, false] {
                        jobs.push(Job::Lap {
                            from_a,
                            start_ns: jobs.len() as u64 * 10_000,
                            mra,
                            accept,
                            think_ns: 1_000_000,
                            migrate,
                        });
                    }
                }
            }
        }
        for listened in [true, false] {
            for answer in [Answer::Success, Answer::Reject, Answer::Destroy] {
                jobs.push(Job::Sidr {
                    start_ns: jobs.len() as u64 * 10_000,
                    listened,
                    answer,
                    think_ns: 1_000_000,
                });
            }
        }
        for (a_start_ns, b_start_ns) in [
            (0, 0),
            (0, 1_000),
            (1_000, 0),
            (0, 10_000_000),
            (10_000_000, 0),
        ] {
            jobs.push(Job::P2p {
                a_start_ns,
                b_start_ns,
                think_ns: 1_000_000,
            });
        }
        let faults = Faults {
            seed: 9,
            drop_per_mille: 0,
            duplicate_per_mille: 0,
            delay_per_mille: 0,
            max_delay_ns: 0,
        };
        run_ext(jobs.clone(), &faults, None).unwrap();
        for (on_a, at_ns) in [
            (true, 500_000),
            (false, 500_000),
            (true, 5_000_000),
            (false, 30_000_000),
        ] {
            run_ext(jobs.clone(), &faults, Some((on_a, at_ns))).unwrap();
        }
    }
}
