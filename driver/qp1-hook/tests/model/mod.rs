//! Models for the hook's tests: an HCA's QP1 and receive CQ, AL's special-QP service on
//! top of it (`core/al/kernel/al_smi.c`), AL's GSI dispatcher with AL's CM, ibcm's
//! `{M, Get}` MAD service, and the CM traffic of a host where both CMs run.
//!
//! - HCA (mlx4's behaviour): a FIFO receive queue bounded by its depth; an arriving MAD
//!   takes the head receive, its GRH + MAD are written into that buffer and a successful
//!   completion goes on the CQ; completions can be reordered on the CQ (the hook must not
//!   rely on order); a local error completes the head receive in error, flushes the rest
//!   and moves the QP to ERROR (posts to an ERROR QP complete flushed at once); RESET
//!   drops the queue and cleans the QP's completions from the CQ (`qp.c`
//!   `mlx4_ib_cq_clean`); `poll_cq` returns at most N completions, in CQ order.
//! - AL (`al_smi.c`): `spl_qp_svc_post_recvs` posts elements up to the depth, each
//!   tracked on `recv_queue`, from a pool shared with AL's other MAD users that reuses
//!   elements oldest first (so `wr_id`s repeat, but not as the same set);
//!   `spl_qp_comp` polls one completion at a time (or, as other CQ consumers do, an
//!   array), skips flushed ones (their elements stay tracked until the reset), unlinks a
//!   completed element by item, re-posts, dispatches the MAD, and resets QP1 after an
//!   error completion (`spl_qp_svc_reset_cb`: RESET, elements back to the pool, re-init,
//!   re-post). Destroy and re-create a port's QP1 (port down/up).
//! - AL's dispatcher (`al_mad.c` `__mad_disp_recv_done`): CM class 2 method Send to AL's
//!   CM; methods M and Get to ibcm's service; any other class or method to "others".
//! - ibcm's service: [`Hook::claim`] + [`restore`], then the MAD is ibcm's.
//!
//! The arena of receive buffers checks that the hook reads or writes a buffer only while
//! it holds a receive the HCA completed successfully and AL has not yet dispatched.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use ibcm_cep::pair::Pair;
use ibcm_cep::{CmConfig, CmManager, Instant, ListenParams, MadOwner};
use ibcm_mad::{
    AttributeId, CmMad, CmMessage, Dreq, MadHeader, MessageKind, Mra, Rej, RejReason, Rtu,
};
use ibcm_qp1_hook::method::{GRH_SIZE, RECEIVE_SIZE};
use ibcm_qp1_hook::{
    Counters, Delivered, Handle, Hook, IB_QPS_RESET, IB_QPT_QP1, IB_WCS_SUCCESS,
    IB_WCS_WR_FLUSHED_ERR, Lock, Memory, PrivateMethod, Qp1, WorkCompletion, restore,
};

pub const M: PrivateMethod = PrivateMethod::DEFAULT;
/// The service ibcm listens on.
pub const SID_IBCM: u64 = 0x0000_0000_0001_2345;
/// IPoIB-CM's service IDs: IPOIB_CM_IETF_ID | QPN (Linux `ipoib_cm.c`).
pub const SID_IPOIB: u64 = 0x1000_0000_0000_0000;
/// `IB_WCS_LOCAL_LEN_ERR`.
pub const IB_WCS_LOCAL_LEN_ERR: u32 = 1;
/// QP states of the model (IB_QPS_INIT/RTR/RTS collapsed).
pub const IB_QPS_ERROR: u32 = 0x0000_0020;
pub const IB_QPS_RTS: u32 = 0x0000_0008;

/// The port lock: a mutex.
pub struct ModelLock<T>(Mutex<T>);

impl<T> Lock<T> for ModelLock<T> {
    fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }
}

pub type ModelHook = Hook<usize, ModelLock<Option<Qp1<usize>>>>;

// ---------------------------------------------------------------------------------------
// Traffic
// ---------------------------------------------------------------------------------------

/// What a MAD on the wire is, and so where it must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A REQ for ibcm's listen: ibcm's.
    ReqOurs,
    /// An IPoIB-CM REQ (a service ibcm does not listen on): AL's.
    ReqIpoib,
    /// RTU / DREQ / DREP / MRA / REJ naming one of ibcm's comm IDs: ibcm's.
    ConnOurs(AttributeId),
    /// The same naming one of AL's comm IDs: AL's.
    ConnAl(AttributeId),
    /// A REJ whose RemoteCommID is 0 (names nobody): AL's.
    RejNobody,
    /// A ClassPortInfo Get: ibcm's own registration.
    Get,
    /// A non-CM MAD (an SA GetResp): AL's other clients.
    NotCm,
    /// A CM MAD sent with the private method on the wire: ibcm must refuse it.
    Spoofed,
}

/// Where a MAD ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sink {
    Ibcm,
    AlCm,
    Others,
    Refused,
}

impl Kind {
    pub fn sink(self) -> Sink {
        match self {
            Kind::ReqOurs | Kind::ConnOurs(_) | Kind::Get => Sink::Ibcm,
            Kind::ReqIpoib | Kind::ConnAl(_) | Kind::RejNobody => Sink::AlCm,
            Kind::NotCm => Sink::Others,
            Kind::Spoofed => Sink::Refused,
        }
    }

    /// Whether the hook must remap it.
    pub fn steered(self) -> bool {
        matches!(self, Kind::ReqOurs | Kind::ConnOurs(_))
    }

    pub fn all() -> Vec<Kind> {
        let conn = [
            AttributeId::Rtu,
            AttributeId::Dreq,
            AttributeId::Drep,
            AttributeId::Mra,
            AttributeId::Rej,
        ];
        let mut v = vec![Kind::ReqOurs, Kind::ReqIpoib];
        v.extend(conn.iter().map(|&k| Kind::ConnOurs(k)));
        v.extend(conn.iter().map(|&k| Kind::ConnAl(k)));
        v.extend([Kind::RejNobody, Kind::Get, Kind::NotCm, Kind::Spoofed]);
        v
    }
}

/// ibcm's engine (the steering decision's source) and MAD templates.
pub struct Traffic {
    pub ibcm: CmManager,
    req: [u8; 256],
}

impl Traffic {
    pub fn new() -> Self {
        let config = CmConfig::new(0xB, [2; 32]).with_comm_id_pattern(CmConfig::BESIDE_WINOF_AL);
        let mut ibcm = CmManager::new(config);
        let l = ibcm.create().unwrap();
        ibcm.listen(
            l,
            ListenParams {
                service_id: SID_IBCM,
                service_mask: u64::MAX,
                port: None,
                compare: None,
                backlog: 8,
            },
        )
        .unwrap();
        let mut remote = CmManager::new(CmConfig::new(0xA, [1; 32]));
        let a = remote.create().unwrap();
        remote
            .connect(
                Instant::from_nanos(0),
                a,
                &Pair::connect_params(SID_IBCM, 0x11),
            )
            .unwrap();
        let req = remote.poll_transmit().unwrap().mad;
        Self { ibcm, req }
    }

    /// The steering decision, as the binding feeds it: `owner_of`.
    pub fn is_ours(&self, port: u8, mad: &[u8]) -> bool {
        self.ibcm.owner_of(port, mad) == MadOwner::Ours
    }

    /// A MAD of `kind`, unique by `tid`; `r` varies the comm IDs.
    pub fn mad(&self, kind: Kind, tid: u64, r: u32) -> [u8; 256] {
        let ours = (r | 0xF000).max(1);
        let al = (r & 0x00FF_FF00) << 8 | (r & 0xFF) | 0x0100_0000; // wire bytes lo, mid, 0, modifier
        let mut mad = match kind {
            Kind::ReqOurs | Kind::Spoofed => self.req,
            Kind::ReqIpoib => {
                let mut m = self.req;
                m[32..40].copy_from_slice(&(SID_IPOIB | u64::from(r & 0xFF_FFFF)).to_be_bytes());
                m
            }
            Kind::ConnOurs(k) => conn(k, ours, r),
            Kind::ConnAl(k) => conn(k, al, r),
            Kind::RejNobody => conn(AttributeId::Rej, 0, r),
            Kind::Get => {
                let mut m = [0u8; 256];
                m[..4].copy_from_slice(&[1, 0x07, 2, 0x01]);
                m[16..18].copy_from_slice(&1u16.to_be_bytes());
                m
            }
            Kind::NotCm => {
                let mut m = [0u8; 256];
                m[..4].copy_from_slice(&[1, 0x03, 2, 0x81]);
                m[16..18].copy_from_slice(&0x0035u16.to_be_bytes());
                m[100] = r as u8;
                m
            }
        };
        mad[8..16].copy_from_slice(&tid.to_be_bytes());
        if kind == Kind::Spoofed {
            mad[3] = M.get();
        }
        mad
    }
}

fn conn(kind: AttributeId, remote_comm_id: u32, r: u32) -> [u8; 256] {
    let local_comm_id = r.wrapping_mul(2_654_435_761) | 1;
    let message = match kind {
        AttributeId::Rtu => CmMessage::Rtu(Rtu {
            local_comm_id,
            remote_comm_id,
            private_data: b"",
        }),
        AttributeId::Drep => CmMessage::Drep(Rtu {
            local_comm_id,
            remote_comm_id,
            private_data: b"",
        }),
        AttributeId::Dreq => CmMessage::Dreq(Dreq {
            local_comm_id,
            remote_comm_id,
            remote_qpn_eecn: 0x42,
            private_data: b"",
        }),
        AttributeId::Mra => CmMessage::Mra(Mra {
            local_comm_id,
            remote_comm_id,
            message_mraed: MessageKind::Rep,
            service_timeout: 10,
            private_data: b"",
        }),
        _ => CmMessage::Rej(Rej {
            local_comm_id,
            remote_comm_id,
            message_rejected: MessageKind::Req,
            reason: RejReason::NoQp,
            ari: b"",
            private_data: b"",
        }),
    };
    let mut mad = [0u8; 256];
    CmMad {
        header: MadHeader::send(0),
        message,
    }
    .emit(&mut mad)
    .unwrap();
    mad
}

// ---------------------------------------------------------------------------------------
// Receive buffers
// ---------------------------------------------------------------------------------------

/// Where a buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufState {
    Free,
    Posted,
    /// Completed successfully; the hook may look until AL dispatches it.
    Received,
    /// Completed flushed or in error: the hook must not look.
    Failed,
}

/// AL's MAD elements' buffers (GRH + MAD), indexed by element.
pub struct Arena {
    pub bufs: Vec<[u8; RECEIVE_SIZE]>,
    pub state: Vec<BufState>,
    pub violations: Vec<String>,
}

impl Memory for Arena {
    type Buffer = usize;
    fn received(&mut self, buffer: usize, length: u32) -> Option<&mut [u8]> {
        match self.state.get(buffer) {
            Some(BufState::Received) => {}
            other => self
                .violations
                .push(format!("hook looked at buffer {buffer} in state {other:?}")),
        }
        let len = (length as usize).min(RECEIVE_SIZE);
        self.bufs.get_mut(buffer).map(|b| &mut b[..len])
    }
}

// ---------------------------------------------------------------------------------------
// HCA
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    pub qp: Handle,
    pub wc: WorkCompletion,
    /// The model's note of the MAD this receive holds (its TID), for the accounting.
    pub tid: Option<u64>,
}

/// One port's QP1 and receive CQ in the HCA.
pub struct HcaQp {
    pub qp: Handle,
    pub cq: Handle,
    pub depth: usize,
    pub state: u32,
    pub rq: VecDeque<(u64, usize)>,
    pub cqes: VecDeque<Cqe>,
    /// TIDs of the MADs whose completions a RESET cleaned from the CQ, for the accounting.
    pub cleaned: Vec<u64>,
}

impl HcaQp {
    /// `ci_post_recv`: Err(index of the first WR not taken).
    fn post_recv(&mut self, wrs: &[(u64, usize)], arena: &mut Arena) -> Result<(), usize> {
        for (i, &(wr_id, buf)) in wrs.iter().enumerate() {
            match self.state {
                IB_QPS_RESET => return Err(i),
                IB_QPS_ERROR => {
                    arena.state[buf] = BufState::Failed;
                    self.cqes
                        .push_back(self.cqe(wr_id, IB_WCS_WR_FLUSHED_ERR, 0));
                }
                _ if self.rq.len() >= self.depth => return Err(i),
                _ => {
                    arena.state[buf] = BufState::Posted;
                    self.rq.push_back((wr_id, buf));
                }
            }
        }
        Ok(())
    }

    fn cqe(&self, wr_id: u64, status: u32, length: u32) -> Cqe {
        Cqe {
            qp: self.qp,
            wc: WorkCompletion {
                wr_id,
                status,
                length,
            },
            tid: None,
        }
    }

    /// A MAD arrives: false if no receive is posted (the MAD waits on the wire).
    pub fn arrive(&mut self, mad: &[u8; 256], arena: &mut Arena) -> bool {
        if self.state != IB_QPS_RTS {
            return false;
        }
        let Some((wr_id, buf)) = self.rq.pop_front() else {
            return false;
        };
        let b = &mut arena.bufs[buf];
        b[..GRH_SIZE].fill(0xEE);
        b[GRH_SIZE..].copy_from_slice(mad);
        arena.state[buf] = BufState::Received;
        let tid = u64::from_be_bytes(mad[8..16].try_into().unwrap());
        let cqe = self.cqe(wr_id, IB_WCS_SUCCESS, RECEIVE_SIZE as u32);
        self.cqes.push_back(Cqe {
            tid: Some(tid),
            ..cqe
        });
        true
    }

    /// A local error on the head receive (none without one): it completes in error (its
    /// buffer holds a garbage packet), the rest flush, the QP is in ERROR.
    pub fn fail(&mut self, arena: &mut Arena) {
        if self.state != IB_QPS_RTS {
            return;
        }
        let Some((wr_id, buf)) = self.rq.pop_front() else {
            return;
        };
        arena.bufs[buf].fill(0xFF);
        arena.state[buf] = BufState::Failed;
        self.cqes
            .push_back(self.cqe(wr_id, IB_WCS_LOCAL_LEN_ERR, 0));
        while let Some((wr_id, buf)) = self.rq.pop_front() {
            arena.state[buf] = BufState::Failed;
            self.cqes
                .push_back(self.cqe(wr_id, IB_WCS_WR_FLUSHED_ERR, 0));
        }
        self.state = IB_QPS_ERROR;
    }

    /// `ci_modify_qp`.
    fn modify(&mut self, state: u32) {
        if state == IB_QPS_RESET {
            self.rq.clear();
            let qp = self.qp;
            let (gone, kept): (Vec<Cqe>, Vec<Cqe>) = self.cqes.drain(..).partition(|c| c.qp == qp);
            self.cleaned.extend(gone.iter().filter_map(|c| c.tid));
            self.cqes = kept.into();
        }
        self.state = state;
    }

    /// `ci_poll_cq` / `ci_poll_cq_array`: up to `n`, in CQ order.
    fn poll(&mut self, n: usize) -> Vec<Cqe> {
        let n = n.min(self.cqes.len());
        self.cqes.drain(..n).collect()
    }

    /// Completions leave the CQ out of order.
    pub fn reorder(&mut self, i: usize, j: usize) {
        let len = self.cqes.len();
        if len > 1 {
            self.cqes.swap(i % len, j % len);
        }
    }
}

// ---------------------------------------------------------------------------------------
// AL on the HCA, through the hook
// ---------------------------------------------------------------------------------------

/// One port: the HCA's QP1, AL's special-QP service for it.
pub struct Port {
    pub num: u8,
    pub hca: HcaQp,
    /// AL's `recv_queue`: elements posted and not unlinked.
    pub recv_queue: Vec<usize>,
}

/// What reached each consumer, with the MAD's bytes.
#[derive(Default)]
pub struct Delivery {
    pub al_cm: Vec<(u8, [u8; 256])>,
    pub ibcm: Vec<(u8, [u8; 256])>,
    pub others: Vec<(u8, [u8; 256])>,
    pub refused: Vec<(u8, [u8; 256])>,
    /// Error completions' garbage AL dispatched (AL processes a failed receive's
    /// buffer too, `spl_qp_comp`); never a MAD of the traffic.
    pub garbage: usize,
}

/// One HCA: its hook, its ports, AL's element pool, and the handles it hands out.
pub struct Hca {
    pub hook: ModelHook,
    pub ports: Vec<Port>,
    pub pool: VecDeque<usize>,
    pub arena: Arena,
    /// The last counters of the QP1s destroyed so far.
    pub retired: Vec<Counters>,
    next_handle: Handle,
    id: usize,
}

pub const DEPTH: usize = 8;

impl Hca {
    pub fn new(id: usize, ports: u8) -> Self {
        let mut hca = Self {
            hook: ModelHook::new(ports, M).unwrap(),
            ports: Vec::new(),
            pool: VecDeque::new(),
            arena: Arena {
                bufs: Vec::new(),
                state: Vec::new(),
                violations: Vec::new(),
            },
            retired: Vec::new(),
            next_handle: 0x1000 * (id + 1),
            id,
        };
        // AL's MAD pool holds more elements than the QPs post.
        for buf in 0..3 * DEPTH * usize::from(ports) {
            hca.arena.bufs.push([0; RECEIVE_SIZE]);
            hca.arena.state.push(BufState::Free);
            hca.pool.push_back(buf);
        }
        for num in 1..=ports {
            let port = hca.create_port(num);
            hca.ports.push(port);
        }
        for i in 0..hca.ports.len() {
            hca.post_recvs(i);
        }
        hca
    }

    /// AL's `create_spl_qp` through the hook: new handles (a destroyed port's come back:
    /// handle values are reused as the HCA's allocator reuses memory).
    fn create_port(&mut self, num: u8) -> Port {
        let base = 0x1000 * (self.id + 1) + usize::from(num) * 0x10;
        self.next_handle = if self.next_handle == base {
            base + 2
        } else {
            base
        };
        let (qp, cq) = (self.next_handle, self.next_handle + 1);
        self.hook
            .create_spl_qp(num, IB_QPT_QP1, qp, cq, DEPTH as u32)
            .unwrap();
        Port {
            num,
            hca: HcaQp {
                qp,
                cq,
                depth: DEPTH,
                state: IB_QPS_RTS,
                rq: VecDeque::new(),
                cqes: VecDeque::new(),
                cleaned: Vec::new(),
            },
            recv_queue: Vec::new(),
        }
    }

    /// AL's element address for a buffer: the `wr_id`.
    pub fn wr_id(&self, buf: usize) -> u64 {
        0xFFFF_A000_0000_0000 + (self.id as u64) * 0x1_0000_0000 + buf as u64 * 0x180
    }

    /// `spl_qp_svc_post_recvs`: up to the depth, one WR per call, through the hook.
    pub fn post_recvs(&mut self, p: usize) {
        while self.ports[p].recv_queue.len() < DEPTH {
            let buf = self.pool.pop_front().unwrap_or_else(|| {
                self.arena.bufs.push([0; RECEIVE_SIZE]);
                self.arena.state.push(BufState::Free);
                self.arena.bufs.len() - 1
            });
            let wr = (self.wr_id(buf), buf);
            self.ports[p].recv_queue.push(buf);
            let qp = self.ports[p].hca.qp;
            // The thunk: record, call through, release what the HCA refused.
            self.hook.post_recv(qp, [(wr.0, Some(wr.1))]);
            if let Err(i) = self.ports[p].hca.post_recv(&[wr], &mut self.arena) {
                self.hook
                    .post_recv_failed(qp, [wr].iter().skip(i).map(|w| w.0));
                self.ports[p].recv_queue.retain(|&b| b != buf);
                self.arena.state[buf] = BufState::Free;
                self.pool.push_back(buf);
                break;
            }
        }
    }

    /// `spl_qp_comp` on port `p`: poll up to `budget` completions, `n` per call (1:
    /// `poll_cq` with one free entry as AL does; more: `poll_cq_array`).
    pub fn poll(
        &mut self,
        p: usize,
        n: usize,
        budget: usize,
        traffic: &Traffic,
        out: &mut Delivery,
    ) {
        let mut done = 0;
        while done < budget {
            let cq = self.ports[p].hca.cq;
            let list = self.ports[p].hca.poll(n.max(1));
            if list.is_empty() {
                break;
            }
            let before = list.clone();
            let steer = |port: u8, mad: &[u8]| traffic.is_ours(port, mad);
            self.hook
                .poll_cq(cq, &mut self.arena, &steer, list.iter().map(|c| c.wc));
            assert_eq!(list, before, "the hook changed the completion list");
            done += list.len();
            let mut failed = false;
            for c in list {
                failed |= self.al_completion(p, c.wc, out);
            }
            if failed {
                self.reset(p);
                return;
            }
        }
    }

    /// AL's handling of one receive completion; true if it was an error (AL then resets
    /// the QP, ending the pass).
    fn al_completion(&mut self, p: usize, wc: WorkCompletion, out: &mut Delivery) -> bool {
        if wc.status == IB_WCS_WR_FLUSHED_ERR {
            return false;
        }
        let buf = self.buf_of(wc.wr_id);
        self.ports[p].recv_queue.retain(|&b| b != buf);
        self.post_recvs(p);
        let mut mad = [0u8; 256];
        mad.copy_from_slice(&self.arena.bufs[buf][GRH_SIZE..]);
        self.arena.state[buf] = BufState::Free;
        self.pool.push_back(buf);
        let num = self.ports[p].num;
        if wc.status == IB_WCS_SUCCESS {
            self.dispatch(num, mad, out);
            false
        } else {
            // AL dispatches the failed receive's buffer too.
            out.garbage += 1;
            true
        }
    }

    pub fn buf_of(&self, wr_id: u64) -> usize {
        ((wr_id - self.wr_id(0)) / 0x180) as usize
    }

    /// AL's GSI dispatcher, then ibcm's service for {M, Get}.
    fn dispatch(&self, port: u8, mut mad: [u8; 256], out: &mut Delivery) {
        match (mad[1], mad[2], mad[3]) {
            (0x07, 2, 0x03) => out.al_cm.push((port, mad)),
            (0x07, 2, m) if m == M.get() || m == 0x01 => {
                let from_hook = self.hook.claim(port, &mad);
                match restore(&mut mad, M, from_hook) {
                    Ok(Delivered::Steered | Delivered::Get) => out.ibcm.push((port, mad)),
                    Err(_) => out.refused.push((port, mad)),
                }
            }
            _ => out.others.push((port, mad)),
        }
    }

    /// `spl_qp_svc_reset_cb`: RESET through the hook, elements back, re-init, re-post.
    pub fn reset(&mut self, p: usize) {
        let qp = self.ports[p].hca.qp;
        self.ports[p].hca.modify(IB_QPS_RESET);
        self.hook.modify_qp(qp, IB_QPS_RESET);
        for buf in std::mem::take(&mut self.ports[p].recv_queue) {
            self.arena.state[buf] = BufState::Free;
            self.pool.push_back(buf);
        }
        self.ports[p].hca.modify(IB_QPS_RTS);
        self.hook.modify_qp(qp, IB_QPS_RTS);
        self.post_recvs(p);
    }

    /// Port down and up: AL destroys QP1 and its CQs and makes new ones.
    pub fn cycle(&mut self, p: usize) {
        let (qp, cq) = (self.ports[p].hca.qp, self.ports[p].hca.cq);
        let last = self.hook.destroy_qp(qp).expect("QP1 was tracked");
        self.retired.push(last);
        assert_eq!(self.hook.destroy_cq(cq), None, "the CQ goes with its QP");
        assert!(!self.hook.is_qp1(qp) && !self.hook.is_qp1_recv_cq(cq));
        for buf in std::mem::take(&mut self.ports[p].recv_queue) {
            self.arena.state[buf] = BufState::Free;
            self.pool.push_back(buf);
        }
        let num = self.ports[p].num;
        self.ports[p] = self.create_port(num);
        self.post_recvs(p);
    }

    /// The hook's map holds exactly the receives the HCA holds (posted, or completed and
    /// not yet polled), and AL tracks each of them.
    pub fn check(&self) {
        for port in &self.ports {
            let (recorded, _) = self.hook.outstanding(port.num).unwrap();
            let on_cq = port.hca.cqes.len();
            assert_eq!(
                recorded,
                port.hca.rq.len() + on_cq,
                "port {}: map != HCA",
                port.num
            );
            assert!(port.recv_queue.len() <= DEPTH);
        }
        assert!(
            self.arena.violations.is_empty(),
            "{:?}",
            self.arena.violations
        );
    }
}

/// The wire into each (HCA, port): MADs waiting for a posted receive.
pub type Wire = BTreeMap<(usize, usize), VecDeque<[u8; 256]>>;
