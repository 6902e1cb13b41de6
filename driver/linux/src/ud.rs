//! UD QPs and address handles through libibverbs, for the datagram services ibcm resolves
//! with SIDR (IBA 12.11): the QP a SIDR_REP names, and where its datagrams go.
//!
//! - [`UdQp`]: a UD QP with one CQ for both queues, moved RESET -> INIT (P_Key index,
//!   port, Q_Key) -> RTR -> RTS (send PSN) as librdmacm moves one (rdma-core
//!   librdmacm/cma.c `ucma_init_ud_qp`; IBA 11.2.4.2 Table 94 lists no other attribute
//!   for UD), its receives with room for the 40-byte GRH before the payload (IBA 11.4.1.2:
//!   a UD receive buffer starts with the GRH, present or not).
//! - [`AddressHandle`]: a destination, from a path (`ibv_create_ah`, with a GRH: RoCE
//!   routes every packet by GID) or from a received datagram (`ibv_create_ah_from_wc`, the
//!   reply to its sender, as rdma-core's udaddy answers: udaddy.c `create_reply_ah`).
//!
//! Every `unsafe` block here is one call across the C ABI (or one dereference of a
//! pointer libibverbs handed out), with its `// SAFETY:`.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ibv::{
    self, IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_QKEY, IBV_QP_SQ_PSN, IBV_QP_STATE, IBV_QPS_INIT,
    IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_UD, IBV_SEND_SIGNALED, IBV_WC_GRH, IBV_WC_WITH_IMM,
    IBV_WR_SEND_WITH_IMM, ibv_ah, ibv_ah_attr, ibv_cq, ibv_gid, ibv_global_route, ibv_grh, ibv_qp,
    ibv_qp_attr, ibv_qp_init_attr, ibv_send_wr, ibv_wc,
};
use crate::verbs::{Context, Region, check, one_sge_qp_init, os_error, post_one_recv};
use ibcm_ioctl::iba::PathRecord;

/// The bytes of the GRH before each UD receive's payload (`sizeof(struct ibv_grh)`).
pub const GRH_LEN: usize = std::mem::size_of::<ibv_grh>();

/// A UD QP with one CQ for both queues (polled: [`UdQp::next`]).
pub struct UdQp {
    ctx: Arc<Context>,
    qp: NonNull<ibv_qp>,
    cq: NonNull<ibv_cq>,
}

// SAFETY: verbs on a QP and CQ are thread-safe (the provider locks its queues).
unsafe impl Send for UdQp {}
// SAFETY: as for Send.
unsafe impl Sync for UdQp {}

/// A UD work completion, with what a receive says about its sender.
#[derive(Clone, Copy)]
pub struct UdCompletion {
    wc: ibv_wc,
}

impl core::fmt::Debug for UdCompletion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UdCompletion")
            .field("wr_id", &self.wc.wr_id)
            .field("status", &self.wc.status)
            .field("opcode", &self.wc.opcode)
            .field("byte_len", &self.wc.byte_len)
            .field("src_qp", &self.wc.src_qp)
            .field("imm", &self.imm())
            .finish()
    }
}

impl UdCompletion {
    /// The work request's ID.
    pub fn wr_id(&self) -> u64 {
        self.wc.wr_id
    }

    /// Whether it succeeded.
    pub fn ok(&self) -> bool {
        self.wc.status == 0
    }

    /// `ibv_wc_status` (0: success).
    pub fn status(&self) -> u32 {
        self.wc.status
    }

    /// `ibv_wc_opcode` (`IBV_WC_SEND` 0, `IBV_WC_RECV` 128).
    pub fn opcode(&self) -> u32 {
        self.wc.opcode
    }

    /// Whether it is a receive (`IBV_WC_RECV`).
    pub fn is_recv(&self) -> bool {
        self.wc.opcode == ibv::IBV_WC_RECV
    }

    /// Whether it is a send (`IBV_WC_SEND`).
    pub fn is_send(&self) -> bool {
        self.wc.opcode == ibv::IBV_WC_SEND
    }

    /// Bytes received, the GRH's 40 included.
    pub fn byte_len(&self) -> u32 {
        self.wc.byte_len
    }

    /// The sender's QPN (receives).
    pub fn src_qp(&self) -> u32 {
        self.wc.src_qp
    }

    /// The immediate data, in host order, if the SEND carried any.
    pub fn imm(&self) -> Option<u32> {
        (self.wc.wc_flags & IBV_WC_WITH_IMM != 0).then(|| u32::from_be(self.wc.imm_data))
    }

    /// Whether the receive buffer's first 40 bytes hold a GRH (always on RoCE).
    pub fn has_grh(&self) -> bool {
        self.wc.wc_flags & IBV_WC_GRH != 0
    }
}

impl UdQp {
    /// A UD QP in RESET with `depth` send and `depth` receive slots (one SGE each), its
    /// CQ holding both queues' completions.
    pub fn create(ctx: &Arc<Context>, depth: u32) -> io::Result<Self> {
        let v = ctx.verbs();
        let cqe = i32::try_from(depth.saturating_mul(2)).unwrap_or(i32::MAX);
        // SAFETY: the context is open; no CQ context, no channel (polled), vector 0.
        let cq = unsafe {
            (v.ibv_create_cq)(
                ctx.raw(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| os_error("ibv_create_cq"))?;
        let mut init = one_sge_qp_init(cq, depth, IBV_QPT_UD);
        // SAFETY: the PD is alive; `init` is valid for the call.
        let qp = unsafe { (v.ibv_create_qp)(ctx.pd(), &mut init) };
        let Some(qp) = NonNull::new(qp) else {
            let e = os_error("ibv_create_qp (UD)");
            // SAFETY: created above, no QP uses it.
            unsafe { (v.ibv_destroy_cq)(cq.as_ptr()) };
            return Err(e);
        };
        Ok(Self {
            ctx: Arc::clone(ctx),
            qp,
            cq,
        })
    }

    /// The QPN (what a SIDR_REP names).
    pub fn qpn(&self) -> u32 {
        // SAFETY: `qp` is alive until Drop.
        unsafe { self.qp.as_ref() }.qp_num
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: i32, what: &str) -> io::Result<()> {
        // SAFETY: `qp` is alive; `attr` is valid for the call.
        let rc = unsafe { (self.ctx.verbs().ibv_modify_qp)(self.qp.as_ptr(), attr, mask) };
        check(rc, what)
    }

    /// RESET -> INIT -> RTR -> RTS: INIT with the index of `pkey` in `port`'s table, the
    /// port and `qkey`; RTR with nothing more; RTS with send PSN 0 (librdmacm cma.c
    /// `ucma_init_ud_qp`, IBA 11.2.4.2 Table 94).
    pub fn to_rts(&self, port: u8, pkey: u16, qkey: u32) -> io::Result<()> {
        let mut attr: ibv_qp_attr = ibv::zeroed();
        attr.qp_state = IBV_QPS_INIT;
        attr.pkey_index = self.ctx.pkey_index(port, pkey)?;
        attr.port_num = port;
        attr.qkey = qkey;
        self.modify(
            &mut attr,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
            "ibv_modify_qp (UD) to INIT",
        )?;
        let mut attr: ibv_qp_attr = ibv::zeroed();
        attr.qp_state = IBV_QPS_RTR;
        self.modify(&mut attr, IBV_QP_STATE, "ibv_modify_qp (UD) to RTR")?;
        let mut attr: ibv_qp_attr = ibv::zeroed();
        attr.qp_state = IBV_QPS_RTS;
        attr.sq_psn = 0;
        self.modify(
            &mut attr,
            IBV_QP_STATE | IBV_QP_SQ_PSN,
            "ibv_modify_qp (UD) to RTS",
        )
    }

    /// The Q_Key the device holds for the QP (`ibv_query_qp` IBV_QP_QKEY, as udaddy.c
    /// `create_reply_ah` reads the Q_Key its replies carry).
    pub fn qkey(&self) -> io::Result<u32> {
        let mut attr: ibv_qp_attr = ibv::zeroed();
        let mut init: ibv_qp_init_attr = ibv::zeroed();
        // SAFETY: `qp` is alive; both out-structures are valid for the call.
        let rc = unsafe {
            (self.ctx.verbs().ibv_query_qp)(self.qp.as_ptr(), &mut attr, IBV_QP_QKEY, &mut init)
        };
        check(rc, "ibv_query_qp (UD)")?;
        Ok(attr.qkey)
    }

    /// Posts a receive of `len` bytes at `offset` of `region`: the GRH's 40 bytes, then
    /// the payload.
    pub fn post_recv(
        &self,
        region: &Region,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> io::Result<()> {
        if len < GRH_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a UD receive of {len} bytes has no room for the {GRH_LEN}-byte GRH"),
            ));
        }
        let sge = region.sge(offset, len)?;
        // SAFETY: `qp` is alive until Drop; the region outlives the receive (the caller
        // keeps it until the completion).
        unsafe { post_one_recv(self.qp, sge, wr_id, "ibv_post_recv (UD)") }
    }

    /// Posts a signalled SEND with immediate data `imm` (host order) of `len` bytes at
    /// `offset` of `region` to QP `remote_qpn` (Q_Key `remote_qkey`) behind `ah`.
    #[allow(clippy::too_many_arguments)]
    pub fn post_send_imm(
        &self,
        ah: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        region: &Region,
        offset: usize,
        len: usize,
        imm: u32,
        wr_id: u64,
    ) -> io::Result<()> {
        let mut sge = region.sge(offset, len)?;
        let mut wr: ibv_send_wr = ibv::zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.imm_data = imm.to_be();
        wr.wr.ud = ibv::ibv_ud_wr {
            ah: ah.ah.as_ptr(),
            remote_qpn,
            remote_qkey,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: `qp` is alive; `wr`, its SGE and the AH are valid for the call; the
        // region and the AH outlive the request (the caller keeps them until the
        // completion).
        let rc = unsafe { ibv::post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        check(rc, "ibv_post_send (UD)")
    }

    /// Polls the CQ until a completion comes or `deadline` passes (a yield between
    /// polls, then 1 ms sleeps: udaddy.c `poll_cqs` spins on `ibv_poll_cq`).
    pub fn next(&self, deadline: Instant) -> io::Result<UdCompletion> {
        let mut polls = 0u32;
        loop {
            let mut wc: ibv_wc = ibv::zeroed();
            // SAFETY: `cq` is alive; `wc` holds one entry.
            let n = unsafe { ibv::poll_cq(self.cq.as_ptr(), 1, &mut wc) };
            if n < 0 {
                return Err(io::Error::other(format!("ibv_poll_cq (UD): {n}")));
            }
            if n > 0 {
                return Ok(UdCompletion { wc });
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no completion before the deadline",
                ));
            }
            polls += 1;
            if polls < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

impl Drop for UdQp {
    fn drop(&mut self) {
        let v = self.ctx.verbs();
        // SAFETY: created in `create`, destroyed once, before its CQ.
        unsafe { (v.ibv_destroy_qp)(self.qp.as_ptr()) };
        // SAFETY: no QP uses the CQ any more.
        unsafe { (v.ibv_destroy_cq)(self.cq.as_ptr()) };
    }
}

/// An address handle: where UD sends go.
pub struct AddressHandle {
    ctx: Arc<Context>,
    ah: NonNull<ibv_ah>,
}

// SAFETY: an AH is an immutable object of the device, usable from any thread.
unsafe impl Send for AddressHandle {}
// SAFETY: as for Send.
unsafe impl Sync for AddressHandle {}

impl AddressHandle {
    /// To the far end of `path` from `port`: a GRH with the path's destination GID,
    /// the index of its source GID in the port's table, its hop limit, traffic class and
    /// flow label (RoCE: every packet carries a GRH; librdmacm's ah_attr from
    /// `ib_init_ah_attr_from_path` has the same fields).
    pub fn from_path(ctx: &Arc<Context>, port: u8, path: &PathRecord) -> io::Result<Self> {
        let mut attr: ibv_ah_attr = ibv::zeroed();
        attr.grh = ibv_global_route {
            dgid: ibv_gid { raw: path.dgid },
            flow_label: path.flow_label,
            sgid_index: ctx.gid_index(port, &path.sgid)?,
            hop_limit: path.hop_limit,
            traffic_class: path.traffic_class,
        };
        attr.dlid = path.dlid;
        attr.sl = path.sl;
        // ibv_rate numbers the rates as IBA's static rate codes do.
        attr.static_rate = u8::from(path.rate);
        attr.is_global = 1;
        attr.port_num = port;
        // SAFETY: the PD is alive; `attr` is valid for the call.
        let ah = unsafe { (ctx.verbs().ibv_create_ah)(ctx.pd(), &mut attr) };
        let ah = NonNull::new(ah).ok_or_else(|| os_error("ibv_create_ah"))?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            ah,
        })
    }

    /// Back to the sender of the datagram `wc` received into `offset` of `region` (its
    /// GRH there), from `port` (`ibv_create_ah_from_wc`, udaddy.c `create_reply_ah`).
    pub fn reply_to(
        ctx: &Arc<Context>,
        port: u8,
        wc: &UdCompletion,
        region: &Region,
        offset: usize,
    ) -> io::Result<Self> {
        // The GRH must lie within the region: `sge` checks the range.
        let sge = region.sge(offset, GRH_LEN)?;
        let mut wc = wc.wc;
        // SAFETY: the PD is alive; `wc` is a copy valid for the call; the GRH's 40 bytes
        // are within the region (checked above), which the caller keeps for the call, and
        // libibverbs only reads them.
        let ah = unsafe {
            (ctx.verbs().ibv_create_ah_from_wc)(
                ctx.pd(),
                &mut wc,
                sge.addr as usize as *mut ibv_grh,
                port,
            )
        };
        let ah = NonNull::new(ah).ok_or_else(|| os_error("ibv_create_ah_from_wc"))?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            ah,
        })
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: created in `from_path` or `reply_to`, destroyed once; a send using it
        // has completed (its owner keeps it until then).
        unsafe { (self.ctx.verbs().ibv_destroy_ah)(self.ah.as_ptr()) };
    }
}
