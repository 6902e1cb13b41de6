//! RC QPs, CQs and registered memory through libibverbs (rdma-core), for the data path
//! of connections ibcm sets up.
//!
//! [`RcQp::modify`] applies one QP transition record of the engine (the user library's
//! `QpAttributes`, what `GET_QP_ATTR` / the REP's transitions return) and nothing else:
//! each attribute present sets the matching `ibv_qp_attr` field and mask bit. Two values
//! come from elsewhere, because no CM message carries them: the P_Key *index* (the
//! device's table, searched for the record's P_Key) and the GID *index* of the path's
//! source GID (the device's GID table), plus the responder's minimum RNR NAK timer at RTR,
//! which is 0 as Linux's CM sets it (drivers/infiniband/core/cm.c, cm_init_qp_rtr_attr:
//! `qp_attr->min_rnr_timer = 0`) and the kernel requires for RC INIT->RTR.
//!
//! Every `unsafe` block here is one call across the C ABI (or one dereference of a
//! pointer libibverbs handed out), with its `// SAFETY:`.

use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use crate::ibv::{
    self, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_WRITE,
    IBV_GID_TYPE_ROCE_V2, IBV_MIG_MIGRATED, IBV_MIG_REARM, IBV_PORT_ACTIVE, IBV_QP_ACCESS_FLAGS,
    IBV_QP_AV, IBV_QP_CAP, IBV_QP_DEST_QPN, IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MAX_QP_RD_ATOMIC,
    IBV_QP_MIN_RNR_TIMER, IBV_QP_PATH_MIG_STATE, IBV_QP_PATH_MTU, IBV_QP_PKEY_INDEX, IBV_QP_PORT,
    IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN, IBV_QP_SQ_PSN, IBV_QP_STATE, IBV_QP_TIMEOUT,
    IBV_QPS_ERR, IBV_QPS_INIT, IBV_QPS_RESET, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_RC,
    IBV_SEND_SIGNALED, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_SEND, Verbs, ibv_ah_attr,
    ibv_context, ibv_cq, ibv_gid, ibv_gid_entry, ibv_global_route, ibv_mr, ibv_pd, ibv_qp,
    ibv_qp_attr, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, ibv_sge,
};
use ibcm_host::rocev2::gid_ipv4;
use ibcm_ioctl::iba::{AddressVector, MigrationState, QpAttributes, QpState};

pub use crate::cq::{Completion, Cq};
use crate::pkey_table::find_cached_pkey;
use crate::port_indices::PortIndices;

/// The errno a verbs call left, named by `what`.
pub(crate) fn os_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// `rc` of a verbs call that returns an errno (0 on success).
pub(crate) fn check(rc: i32, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::from_raw_os_error(rc.abs());
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

/// An open RDMA device and a protection domain on it.
pub struct Context {
    /// libibverbs' functions (loaded by the first `open`).
    v: &'static Verbs,
    ctx: NonNull<ibv_context>,
    pd: NonNull<ibv_pd>,
    device: String,
    port: u8,
    /// P_Key indices found so far, by (port, P_Key without its membership bit).
    pkeys: PortIndices<u16, u16>,
    /// GID indices found so far, by (port, GID).
    gids: PortIndices<[u8; 16], u8>,
}

// SAFETY: libibverbs objects may be used from any thread (rdma-core's verbs are
// thread-safe: each provider serialises its own queues); nothing here is thread-local.
unsafe impl Send for Context {}
// SAFETY: as for Send; every method takes &self and calls thread-safe verbs.
unsafe impl Sync for Context {}

impl core::fmt::Debug for Context {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Opens `device` (`rxe0`), or without a name the first device libibverbs lists (as
    /// perftest and rdma-core's examples pick one), and allocates a protection domain.
    /// The list is read once: every `ibv_get_device_list` scans sysfs again, which costs
    /// milliseconds on a slow machine.
    pub fn open(device: Option<&str>, port: u8) -> io::Result<Arc<Self>> {
        let v = ibv::verbs()?;
        let mut n = 0i32;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { (v.ibv_get_device_list)(&mut n) };
        if list.is_null() {
            return Err(os_error("ibv_get_device_list"));
        }
        let mut ctx = std::ptr::null_mut();
        let mut opened = String::new();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: `list` holds `n` device pointers (ibv_get_device_list): `i` is in it.
            let slot = unsafe { list.add(i) };
            // SAFETY: `slot` points to one of the list's entries.
            let dev = unsafe { *slot };
            // SAFETY: `dev` is a device of the list, alive until the list is freed.
            let name = unsafe { (v.ibv_get_device_name)(dev) };
            if name.is_null() {
                continue;
            }
            // SAFETY: ibv_get_device_name returns a NUL-terminated string owned by `dev`.
            let name = unsafe { CStr::from_ptr(name) };
            if device.is_none_or(|d| name.to_bytes() == d.as_bytes()) {
                // SAFETY: `dev` is alive; the context outlives the list by design.
                ctx = unsafe { (v.ibv_open_device)(dev) };
                opened = name.to_string_lossy().into_owned();
                break;
            }
        }
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { (v.ibv_free_device_list)(list) };
        let ctx = NonNull::new(ctx).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                match device.or((!opened.is_empty()).then_some(opened.as_str())) {
                    Some(name) => format!("RDMA device {name} not found or not openable"),
                    None => "no RDMA device (rdma link add rxe0 type rxe netdev IFACE)".into(),
                },
            )
        })?;
        // SAFETY: `ctx` is an open context.
        let pd = unsafe { (v.ibv_alloc_pd)(ctx.as_ptr()) };
        let Some(pd) = NonNull::new(pd) else {
            let e = os_error("ibv_alloc_pd");
            // SAFETY: `ctx` is open and owned here.
            unsafe { (v.ibv_close_device)(ctx.as_ptr()) };
            return Err(e);
        };
        Ok(Arc::new(Self {
            v,
            ctx,
            pd,
            device: opened,
            port,
            pkeys: PortIndices::new(),
            gids: PortIndices::new(),
        }))
    }

    fn device_attr(&self) -> io::Result<ibv::ibv_device_attr> {
        let mut attr: ibv::ibv_device_attr = ibv::zeroed();
        // SAFETY: the context is open; `attr` is valid for the call.
        let rc = unsafe { (self.v.ibv_query_device)(self.ctx.as_ptr(), &mut attr) };
        check(rc, "ibv_query_device")?;
        Ok(attr)
    }

    /// `max_qp_init_rd_atom` of `ibv_query_device`: the most RDMA READs a QP of this
    /// device may have in flight as initiator (rxe: `RXE_MAX_QP_INIT_RD_ATOM`, 128).
    pub fn max_qp_init_rd_atom(&self) -> io::Result<u32> {
        Ok(u32::try_from(self.device_attr()?.max_qp_init_rd_atom).unwrap_or(0))
    }

    /// The deepest queues [`RcQp::create`] can make on this device: `max_qp_wr` of
    /// `ibv_query_device` (rxe: `RXE_MAX_QP_WR`, 0x4000), and half of `max_cqe` (rxe:
    /// `RXE_MAX_CQE`, 32767), since its one CQ takes both queues' completions.
    pub fn max_queue_depth(&self) -> io::Result<u32> {
        let attr = self.device_attr()?;
        let wr = u32::try_from(attr.max_qp_wr).unwrap_or(0);
        let cqe = u32::try_from(attr.max_cqe).unwrap_or(0) / 2;
        Ok(wr.min(cqe))
    }

    /// `ibv_query_port` on `port`: whether it is ACTIVE, and its active MTU code
    /// (`ibv_mtu`, IBA's MTU numbering: 3 = 1024).
    pub fn port_state(&self, port: u8) -> io::Result<PortState> {
        let mut attr: ibv::ibv_port_attr = ibv::zeroed();
        // SAFETY: the context is open; `attr` is valid for the call and at least as large
        // as the older structure the exported function fills (verbs.h's inline
        // ___ibv_query_port calls it with the same buffer).
        let rc = unsafe { (self.v.ibv_query_port)(self.ctx.as_ptr(), port, &mut attr) };
        check(rc, "ibv_query_port")?;
        Ok(PortState {
            active: attr.state == IBV_PORT_ACTIVE,
            active_mtu: attr.active_mtu,
        })
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The index of `pkey` in the port's P_Key table, found once per (port, P_Key) and
    /// kept: libibverbs reads the table from sysfs, a file per entry, which costs
    /// milliseconds per connection on a slow machine. Linux's CM takes the index from the
    /// kernel's P_Key cache in the same way, by the same rule (cm.c cm_init_av_by_path ->
    /// `ib_find_cached_pkey`, cache.c; pkey_table.rs's `find_cached_pkey`): a full member
    /// first, else the last limited one.
    ///
    /// The kept index is right only while a [`PortEvents`] thread reads this context's
    /// events: its PKEY_CHANGE calls [`forget_pkeys`]. Without one, an index found before a
    /// change is used after it.
    ///
    /// [`PortEvents`]: crate::port_events::PortEvents
    /// [`forget_pkeys`]: Self::forget_pkeys
    pub fn pkey_index(&self, port: u8, pkey: u16) -> io::Result<u16> {
        let pkey = pkey & 0x7fff;
        self.pkeys.get(port, pkey, || {
            let table = (0..128u16).map_while(|index| {
                let mut value: u16 = 0;
                // SAFETY: `ctx` is open; `value` is a valid out-pointer (a __be16).
                let rc = unsafe {
                    (self.v.ibv_query_pkey)(self.ctx.as_ptr(), port, i32::from(index), &mut value)
                };
                (rc == 0).then(|| u16::from_be(value))
            });
            find_cached_pkey(table, pkey)
                .and_then(|i| u16::try_from(i).ok())
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{} port {port} has no P_Key {pkey:#06x}", self.device),
                    )
                })
        })
    }

    /// Forgets the P_Key indices found on `port`: its table changed
    /// (`IBV_EVENT_PKEY_CHANGE`), as the kernel refreshes its P_Key cache on the same
    /// event (drivers/infiniband/core/cache.c, ib_cache_event_task). The next transition
    /// reads the table again.
    pub fn forget_pkeys(&self, port: u8) {
        self.pkeys.forget(port);
    }

    /// The index of the RoCEv2 GID `gid` (IPv4-mapped) in the port's GID table, found
    /// once per (port, GID) and kept until the table changes ([`forget_gids`]): every
    /// RTR's address vector names it, and the table query is an ioctl copying the whole
    /// table. Linux's CM takes it from the kernel's GID cache (cm.c cm_init_av_by_path ->
    /// ib_init_ah_attr_from_path, `rdma_find_gid_by_port`, cache.c).
    ///
    /// The kept index is right only while a [`PortEvents`] thread reads this context's
    /// events: its GID_CHANGE calls [`forget_gids`]. Without one, an index found before a
    /// change is used after it.
    ///
    /// [`forget_gids`]: Self::forget_gids
    /// [`PortEvents`]: crate::port_events::PortEvents
    pub fn gid_index(&self, port: u8, gid: &[u8; 16]) -> io::Result<u8> {
        if gid_ipv4(gid).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the path's source GID is not a RoCEv2 (IPv4-mapped) GID",
            ));
        }
        self.gids
            .get(port, *gid, || self.query_gid_index(port, gid))
    }

    /// Forgets the GID indices found on `port`: its GID table changed
    /// (`IBV_EVENT_GID_CHANGE`, which the kernel raises on every entry added or deleted:
    /// cache.c, dispatch_gid_change_event). The next transition reads the table again.
    pub fn forget_gids(&self, port: u8) {
        self.gids.forget(port);
    }

    /// [`gid_index`](Self::gid_index) from the kernel's GID cache in one call
    /// (`ibv_query_gid_table`, an ioctl; the table as it is now).
    fn query_gid_index(&self, port: u8, gid: &[u8; 16]) -> io::Result<u8> {
        // The kernel fails the query with EINVAL when the device's valid GIDs, over all
        // its ports, outnumber the entries given (rdma_query_gid_table): ask again with
        // a larger table.
        let mut size = GID_TABLE_MAX;
        let (table, n) = loop {
            let mut table: Vec<ibv_gid_entry> = (0..size).map(|_| ibv::zeroed()).collect();
            // SAFETY: `ctx` is open; `table` holds `size` entries of the size given.
            let n = unsafe {
                (self.v._ibv_query_gid_table)(
                    self.ctx.as_ptr(),
                    table.as_mut_ptr(),
                    table.len(),
                    0,
                    std::mem::size_of::<ibv_gid_entry>(),
                )
            };
            match usize::try_from(n) {
                Ok(n) => break (table, n),
                Err(_) if -n == libc::EINVAL as isize && size < GID_TABLE_LIMIT => size *= 4,
                Err(_) => {
                    let e = io::Error::from_raw_os_error(i32::try_from(-n).unwrap_or(libc::EIO));
                    return Err(io::Error::new(
                        e.kind(),
                        format!("ibv_query_gid_table: {e}"),
                    ));
                }
            }
        };
        table
            .iter()
            .take(n)
            .find(|e| {
                e.port_num == u32::from(port)
                    && e.gid_type == IBV_GID_TYPE_ROCE_V2
                    // SAFETY: every bit pattern of the union is a valid byte array.
                    && unsafe { e.gid.raw } == *gid
            })
            .and_then(|e| u8::try_from(e.gid_index).ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} port {port} has no RoCE v2 GID {gid:02x?}", self.device),
                )
            })
    }
}

/// Entries first asked of `ibv_query_gid_table`: more than any port's table holds (rxe:
/// 32, mlx5: 255).
const GID_TABLE_MAX: usize = 256;
/// The most asked for when a device's ports together hold more.
const GID_TABLE_LIMIT: usize = 65_536;

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every QP, CQ and MR holds an Arc of this context, so none is left.
        unsafe { (self.v.ibv_dealloc_pd)(self.pd.as_ptr()) };
        // SAFETY: the PD is gone; the context is closed once.
        unsafe { (self.v.ibv_close_device)(self.ctx.as_ptr()) };
    }
}

/// A registered buffer: local write, remote read and remote write allowed.
pub struct Region {
    ctx: Arc<Context>,
    mr: NonNull<ibv_mr>,
    buf: NonNull<u8>,
    len: usize,
}

// SAFETY: the MR is usable from any thread; the buffer is owned by the region.
unsafe impl Send for Region {}
// SAFETY: shared access only reads the buffer ([`Region::bytes`]); writes take &mut.
unsafe impl Sync for Region {}

impl Region {
    /// Allocates `len` zeroed bytes and registers them.
    pub fn new(ctx: &Arc<Context>, len: usize) -> io::Result<Self> {
        let len = len.max(1);
        let layout = std::alloc::Layout::from_size_align(len, 4096)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: `layout` has a non-zero size.
        let buf = unsafe { std::alloc::alloc_zeroed(layout) };
        let buf = NonNull::new(buf).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        // SAFETY: `pd` is alive; `buf` points to `len` bytes owned by the region until
        // after the MR is deregistered (Drop).
        let mr = unsafe { (ctx.v.ibv_reg_mr)(ctx.pd.as_ptr(), buf.as_ptr().cast(), len, access) };
        let Some(mr) = NonNull::new(mr) else {
            let e = os_error("ibv_reg_mr");
            // SAFETY: allocated above with `layout`, never registered.
            unsafe { std::alloc::dealloc(buf.as_ptr(), layout) };
            return Err(e);
        };
        Ok(Self {
            ctx: Arc::clone(ctx),
            mr,
            buf,
            len,
        })
    }

    /// The buffer's address (what a peer's RDMA READ/WRITE names).
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: `mr` is registered until Drop.
        unsafe { self.mr.as_ref() }.rkey
    }

    fn lkey(&self) -> u32 {
        // SAFETY: `mr` is registered until Drop.
        unsafe { self.mr.as_ref() }.lkey
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: at least one byte is allocated).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes. Read them only after the work request that filled them completed.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `buf` holds `len` initialised (zeroed) bytes owned by the region.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr(), self.len) }
    }

    /// The bytes, to fill before posting them.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_ptr(), self.len) }
    }

    pub(crate) fn sge(&self, offset: usize, len: usize) -> io::Result<ibv_sge> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{offset}+{len} past a {}-byte region", self.len),
            ));
        }
        Ok(ibv_sge {
            addr: self.addr() + offset as u64,
            length: len as u32,
            lkey: self.lkey(),
        })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: registered in `new`, deregistered once.
        unsafe { (self.ctx.v.ibv_dereg_mr)(self.mr.as_ptr()) };
        if let Ok(layout) = std::alloc::Layout::from_size_align(self.len, 4096) {
            // SAFETY: allocated in `new` with this layout; no MR refers to it any more.
            unsafe { std::alloc::dealloc(self.buf.as_ptr(), layout) };
        }
        let _ = &self.ctx;
    }
}

/// What `ibv_query_port` says about a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortState {
    /// `IBV_PORT_ACTIVE`.
    pub active: bool,
    /// The active MTU code (`ibv_mtu`: 1 = 256 .. 5 = 4096).
    pub active_mtu: u32,
}

/// What `ibv_query_qp` says about a QP: what the CM's records set, to compare with the
/// peer's QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpQuery {
    /// `ibv_qp_state` (3: RTS).
    pub state: u32,
    /// The QPN.
    pub qpn: u32,
    /// The peer's QPN.
    pub dest_qpn: u32,
    /// The PSN of the next packet sent.
    pub sq_psn: u32,
    /// The PSN expected next.
    pub rq_psn: u32,
    /// Path MTU code (3: 1024).
    pub path_mtu: u32,
    /// RDMA reads/atomics issued in flight (initiator depth).
    pub max_rd_atomic: u8,
    /// RDMA reads/atomics accepted in flight (responder resources).
    pub max_dest_rd_atomic: u8,
    /// Local ACK timeout.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// The responder's minimum RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Send queue slots (the QP's `cap.max_send_wr`, as the device rounded it).
    pub max_send_wr: u32,
}

/// An RC QP with one CQ for both queues.
pub struct RcQp {
    qp: NonNull<ibv_qp>,
    /// Where both queues complete: the QP's own, or one it shares (destroyed after it),
    /// and through it the context.
    cq: Arc<Cq>,
}

// SAFETY: verbs on a QP and CQ are thread-safe (the provider locks its queues).
unsafe impl Send for RcQp {}
// SAFETY: as for Send.
unsafe impl Sync for RcQp {}

fn mtu_code(m: ibcm_ioctl::iba::Mtu) -> u32 {
    // ibv_mtu numbers the MTUs as IBA's MTU codes do (IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5).
    u32::from(u8::from(m))
}

/// The creation attributes of a QP of `qp_type` with `depth` send and `depth` receive
/// slots of one SGE each, both queues completing on `cq`.
pub(crate) fn one_sge_qp_init(cq: NonNull<ibv_cq>, depth: u32, qp_type: u32) -> ibv_qp_init_attr {
    let mut init: ibv_qp_init_attr = ibv::zeroed();
    init.send_cq = cq.as_ptr();
    init.recv_cq = cq.as_ptr();
    init.cap.max_send_wr = depth;
    init.cap.max_recv_wr = depth;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.qp_type = qp_type;
    init
}

/// Posts one receive of one SGE, `sge`, on `qp`; `what` names the call in an error.
///
/// # Safety
/// `qp` is alive, and the memory `sge` names stays registered and alive until the
/// receive completes.
pub(crate) unsafe fn post_one_recv(
    qp: NonNull<ibv_qp>,
    mut sge: ibv_sge,
    wr_id: u64,
    what: &str,
) -> io::Result<()> {
    let mut wr: ibv_recv_wr = ibv::zeroed();
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    let mut bad = std::ptr::null_mut();
    // SAFETY: the caller keeps `qp` and the SGE's memory alive; `wr` and `sge` are valid
    // for the call.
    let rc = unsafe { ibv::post_recv(qp.as_ptr(), &mut wr, &mut bad) };
    check(rc, what)
}

impl RcQp {
    /// A QP in RESET with `depth` send and receive slots (one SGE each), on a CQ of its
    /// own with a completion channel ([`Cq::with_channel`]): [`next`](Self::next) sleeps
    /// until the device signals.
    pub fn create(ctx: &Arc<Context>, depth: u32) -> io::Result<Self> {
        let cq = Cq::with_channel(ctx, depth.saturating_mul(2))?;
        Self::create_on(&Arc::new(cq), depth)
    }

    /// A QP in RESET with `depth` send and receive slots (one SGE each), completing on
    /// `cq`, which other QPs may share: one system call (and the provider's queue
    /// mappings) per QP instead of three more for a CQ and a channel of its own, as
    /// rdma-core's cmtime makes its QPs (v44 librdmacm/examples/cmtime.c `open_verbs`:
    /// one CQ for the process, `create_qp`: every QP on it).
    pub fn create_on(cq: &Arc<Cq>, depth: u32) -> io::Result<Self> {
        let ctx = cq.context();
        let mut init = one_sge_qp_init(cq.as_ptr(), depth, IBV_QPT_RC);
        // SAFETY: `pd` is alive; `init` is valid for the call; `cq` outlives the QP (held
        // below, dropped after the QP is destroyed).
        let qp = unsafe { (ctx.v.ibv_create_qp)(ctx.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| os_error("ibv_create_qp"))?;
        Ok(Self {
            qp,
            cq: Arc::clone(cq),
        })
    }

    /// The context the QP is on (its CQ's).
    fn ctx(&self) -> &Context {
        self.cq.context()
    }

    /// The QPN (the REQ's or REP's LocalQPN).
    pub fn qpn(&self) -> u32 {
        // SAFETY: `qp` is alive until Drop.
        unsafe { self.qp.as_ref() }.qp_num
    }

    fn ah_attr(&self, av: &AddressVector) -> io::Result<ibv_ah_attr> {
        let p = &av.path;
        Ok(ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw: p.dgid },
                flow_label: p.flow_label,
                sgid_index: self.ctx().gid_index(av.port, &p.sgid)?,
                hop_limit: p.hop_limit,
                traffic_class: p.traffic_class,
            },
            dlid: p.dlid,
            sl: p.sl,
            src_path_bits: 0,
            // ibv_rate numbers the rates as IBA's static rate codes do.
            static_rate: u8::from(p.rate),
            // RoCE: every packet has a GRH.
            is_global: 1,
            port_num: av.port,
        })
    }

    /// Applies one transition record of the engine: exactly the attributes it holds.
    pub fn modify(&self, a: &QpAttributes) -> io::Result<()> {
        let mut attr: ibv_qp_attr = ibv::zeroed();
        let mut mask = IBV_QP_STATE;
        attr.qp_state = match a.state {
            QpState::Init => IBV_QPS_INIT,
            QpState::Rtr => IBV_QPS_RTR,
            QpState::Rts => IBV_QPS_RTS,
        };
        if let Some(port) = a.port {
            attr.port_num = port;
            mask |= IBV_QP_PORT;
        }
        if let Some(pkey) = a.pkey {
            attr.pkey_index = self
                .cq
                .context()
                .pkey_index(a.port.unwrap_or(self.ctx().port), pkey)?;
            mask |= IBV_QP_PKEY_INDEX;
        }
        if let Some(flags) = a.access_flags {
            // IB_ACCESS_* and IBV_ACCESS_* share their bits (LOCAL_WRITE 1 .. ATOMIC 8).
            attr.qp_access_flags = flags;
            mask |= IBV_QP_ACCESS_FLAGS;
        }
        if let Some(mtu) = a.path_mtu {
            attr.path_mtu = mtu_code(mtu);
            mask |= IBV_QP_PATH_MTU;
        }
        if let Some(qpn) = a.dest_qpn {
            attr.dest_qp_num = qpn;
            mask |= IBV_QP_DEST_QPN;
        }
        if let Some(psn) = a.rq_psn {
            attr.rq_psn = psn;
            mask |= IBV_QP_RQ_PSN;
        }
        if let Some(n) = a.max_dest_rd_atomic {
            attr.max_dest_rd_atomic = n;
            mask |= IBV_QP_MAX_DEST_RD_ATOMIC;
        }
        if let Some(av) = &a.primary {
            attr.ah_attr = self.ah_attr(av)?;
            mask |= IBV_QP_AV;
        }
        if a.alternate.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "an alternate path (APM) is not supported on soft-RoCE",
            ));
        }
        if let Some(psn) = a.sq_psn {
            attr.sq_psn = psn;
            mask |= IBV_QP_SQ_PSN;
        }
        if let Some(t) = a.timeout {
            attr.timeout = t;
            mask |= IBV_QP_TIMEOUT;
        }
        if let Some(n) = a.retry_count {
            attr.retry_cnt = n;
            mask |= IBV_QP_RETRY_CNT;
        }
        if let Some(n) = a.rnr_retry {
            attr.rnr_retry = n;
            mask |= IBV_QP_RNR_RETRY;
        }
        if let Some(n) = a.max_rd_atomic {
            attr.max_rd_atomic = n;
            mask |= IBV_QP_MAX_QP_RD_ATOMIC;
        }
        if let Some(m) = a.path_mig_state {
            attr.path_mig_state = match m {
                MigrationState::Rearm => IBV_MIG_REARM,
                MigrationState::Migrated => IBV_MIG_MIGRATED,
            };
            mask |= IBV_QP_PATH_MIG_STATE;
        }
        if a.state == QpState::Rtr {
            // cm.c cm_init_qp_rtr_attr: min_rnr_timer = 0 (no CM message carries it).
            attr.min_rnr_timer = 0;
            mask |= IBV_QP_MIN_RNR_TIMER;
        }
        // SAFETY: `qp` is alive; `attr` is valid for the call.
        let rc = unsafe { (self.ctx().v.ibv_modify_qp)(self.qp.as_ptr(), &mut attr, mask) };
        check(rc, &format!("ibv_modify_qp to {:?}", a.state))
    }

    /// Sets the responder's minimum RNR NAK timer (IBA Table 45 code) on an RTS QP: the
    /// application's own choice after the CM's transitions, as perftest's server makes it
    /// (perftest_communication.c:2324-2326); RTS->RTS allows it (IBA 11.2.4.2, Table 94).
    pub fn set_min_rnr_timer(&self, code: u8) -> io::Result<()> {
        let mut attr: ibv_qp_attr = ibv::zeroed();
        attr.min_rnr_timer = code;
        // SAFETY: `qp` is alive; `attr` is valid for the call.
        let rc = unsafe {
            (self.ctx().v.ibv_modify_qp)(self.qp.as_ptr(), &mut attr, IBV_QP_MIN_RNR_TIMER)
        };
        check(rc, "ibv_modify_qp min_rnr_timer")
    }

    /// Moves the QP to the error state: posted work requests flush.
    pub fn to_error(&self) -> io::Result<()> {
        let mut attr: ibv_qp_attr = ibv::zeroed();
        attr.qp_state = IBV_QPS_ERR;
        // SAFETY: `qp` is alive; `attr` is valid for the call.
        let rc = unsafe { (self.ctx().v.ibv_modify_qp)(self.qp.as_ptr(), &mut attr, IBV_QP_STATE) };
        check(rc, "ibv_modify_qp to ERR")
    }

    /// The QP's attributes as the device holds them.
    pub fn query(&self) -> io::Result<QpQuery> {
        let mut attr: ibv_qp_attr = ibv::zeroed();
        let mut init: ibv_qp_init_attr = ibv::zeroed();
        let mask = IBV_QP_STATE
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_MIN_RNR_TIMER
            | IBV_QP_CAP;
        // SAFETY: `qp` is alive; both out-structures are valid for the call.
        let rc =
            unsafe { (self.ctx().v.ibv_query_qp)(self.qp.as_ptr(), &mut attr, mask, &mut init) };
        check(rc, "ibv_query_qp")?;
        Ok(QpQuery {
            state: attr.qp_state,
            qpn: self.qpn(),
            dest_qpn: attr.dest_qp_num,
            sq_psn: attr.sq_psn,
            rq_psn: attr.rq_psn,
            path_mtu: attr.path_mtu,
            max_rd_atomic: attr.max_rd_atomic,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            min_rnr_timer: attr.min_rnr_timer,
            max_send_wr: attr.cap.max_send_wr,
        })
    }

    /// Posts a receive of `len` bytes at `offset` of `region`.
    pub fn post_recv(
        &self,
        region: &Region,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> io::Result<()> {
        let sge = region.sge(offset, len)?;
        // SAFETY: `qp` is alive until Drop; the region outlives the receive (the caller
        // keeps it until the completion).
        unsafe { post_one_recv(self.qp, sge, wr_id, "ibv_post_recv") }
    }

    fn post(&self, mut wr: ibv_send_wr, mut sge: ibv_sge) -> io::Result<()> {
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = IBV_SEND_SIGNALED;
        let mut bad = std::ptr::null_mut();
        // SAFETY: `qp` is alive; `wr` and its SGE are valid for the call; the region
        // outlives the request (the caller keeps it until the completion).
        let rc = unsafe { ibv::post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        check(rc, "ibv_post_send")
    }

    fn send_wr(wr_id: u64, opcode: u32) -> ibv_send_wr {
        let mut wr: ibv_send_wr = ibv::zeroed();
        wr.wr_id = wr_id;
        wr.opcode = opcode;
        wr
    }

    /// Posts a signalled SEND of `len` bytes at `offset` of `region`.
    pub fn post_send(
        &self,
        region: &Region,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> io::Result<()> {
        self.post(Self::send_wr(wr_id, IBV_WR_SEND), region.sge(offset, len)?)
    }

    /// Posts a signalled RDMA READ of `len` bytes from the peer's `remote_addr` (key
    /// `rkey`) into `offset` of `region`.
    pub fn post_read(
        &self,
        region: &Region,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        wr_id: u64,
    ) -> io::Result<()> {
        let mut wr = Self::send_wr(wr_id, IBV_WR_RDMA_READ);
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = rkey;
        self.post(wr, region.sge(offset, len)?)
    }

    /// Posts a signalled RDMA WRITE of `len` bytes at `offset` of `region` to the peer's
    /// `remote_addr` (key `rkey`).
    pub fn post_write(
        &self,
        region: &Region,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        wr_id: u64,
    ) -> io::Result<()> {
        let mut wr = Self::send_wr(wr_id, IBV_WR_RDMA_WRITE);
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = rkey;
        self.post(wr, region.sge(offset, len)?)
    }

    /// Polls the QP's CQ once: up to `max` completions (on a shared CQ, any sharing
    /// QP's).
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> io::Result<usize> {
        self.cq.poll(out, max)
    }

    /// The next completion on the QP's CQ until `deadline` ([`Cq::next`]; on a shared CQ,
    /// any sharing QP's).
    pub fn next(&self, deadline: Instant) -> io::Result<Completion> {
        self.cq.next(deadline)
    }
}

impl Drop for RcQp {
    fn drop(&mut self) {
        // SAFETY: created in `create_on`, destroyed once; its CQ (an Arc field) is
        // released after this body, with or after the QP.
        unsafe { (self.ctx().v.ibv_destroy_qp)(self.qp.as_ptr()) };
    }
}

impl Context {
    /// libibverbs' functions, for the asynchronous event reader (`port_events`) and the
    /// CQs (`cq`).
    pub(crate) fn verbs(&self) -> &'static Verbs {
        self.v
    }

    /// The context, for the asynchronous event reader (`port_events`) and the CQs
    /// (`cq`).
    pub(crate) fn raw(&self) -> *mut ibv_context {
        self.ctx.as_ptr()
    }

    /// The protection domain, for the UD QPs and address handles of [`crate::ud`].
    pub(crate) fn pd(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }

    /// The context's asynchronous event fd (verbs.h `struct ibv_context::async_fd`).
    pub(crate) fn async_fd(&self) -> i32 {
        // SAFETY: `ctx` is open until Drop.
        unsafe { self.ctx.as_ref() }.async_fd
    }
}

impl RcQp {
    /// Moves the QP to RESET (from any state): its work is gone and it may be connected
    /// again, with the same QPN.
    pub fn to_reset(&self) -> io::Result<()> {
        let mut attr: ibv_qp_attr = ibv::zeroed();
        attr.qp_state = IBV_QPS_RESET;
        // SAFETY: `qp` is alive; `attr` is valid for the call.
        let rc = unsafe { (self.ctx().v.ibv_modify_qp)(self.qp.as_ptr(), &mut attr, IBV_QP_STATE) };
        check(rc, "ibv_modify_qp to RESET")
    }
}
