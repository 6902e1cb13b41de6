//! Settings of a [`CmManager`](crate::CmManager).

/// Settings fixed when the manager is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// This CA's node GUID (LocalCAGUID of every REQ and REP; ARI of REJ(Timeout)).
    pub ca_guid: u64,
    /// Seed of the manager's RNG (comm-ID operand, PSNs, TIDs, hash keys). Inject a fixed
    /// seed for deterministic tests; the driver seeds from the platform's RNG.
    pub rng_seed: [u8; 32],
    /// Most CEPs alive at once (including those lingering in timewait); at most 2^24,
    /// and at most 2^(free bits - 4) with a fixed comm ID pattern ([`Self::comm_id_mask`]).
    /// It also sizes the comm ID layout: ceil(log2(max_ceps)) bits of slot index, the
    /// other free bits of generation (src/comm_id.rs), so a smaller limit makes IDs
    /// repeat later.
    pub max_ceps: u32,
    /// Bits every local comm ID carries fixed (issue #19: QP1 steering beside another CM
    /// on the same port), with [`Self::comm_id_value`]. A comm ID here is the 32-bit
    /// number its 4 wire bytes make read most significant byte first (MAD fields are
    /// big-endian, IBA 13.4: wire byte `k` holds bits `31-8k ..= 24-8k`). 0 (the
    /// default): no fixed bits. Fixed bits take index bits first (fewer CEPs), and keep
    /// at least 4 generation bits. See [`Self::BESIDE_WINOF_AL`] and
    /// [`Self::is_local_comm_id`].
    pub comm_id_mask: u32,
    /// The values of the fixed bits (bits outside [`Self::comm_id_mask`] are ignored).
    pub comm_id_value: u32,
    /// The CA's ACK delay (5-bit IB time): REP TargetACKDelay, and part of timewait.
    pub ca_ack_delay: u8,
    /// The CA's limit on responder resources (max_qp_rd_atom).
    pub max_responder_resources: u8,
    /// The CA's limit on initiator depth (max_qp_init_rd_atom).
    pub max_initiator_depth: u8,
    /// Double the wait after each unanswered retry (off: every retry waits the first
    /// timeout, as IBA 12.7.36 describes).
    pub exponential_backoff: bool,
    /// Longest total time a request may go unanswered before it fails, whatever retries
    /// remain (None: only MaxCMRetries bounds it).
    pub request_deadline_ns: Option<u64>,
    /// Longest wait this side will ask a REQ's sender to accept while its application
    /// works through the REQs ahead (src/manager/waiting.rs). A REQ whose expected wait
    /// is longer is refused at once with REJ(NoResources) instead of being held (None:
    /// every REQ the backlog takes is held), and no MRA of the manager's own asks for
    /// more. Default [`Self::MAX_REQUEST_WAIT_NS`].
    pub max_request_wait_ns: Option<u64>,
    /// Most REQs a listen holds past its backlog, unreported, their senders kept waiting
    /// by MRAs (src/manager/held.rs); a REQ past them is refused at once with
    /// REJ(NoResources). Default [`Self::HELD_REQUESTS_PER_LISTEN`].
    pub held_requests_per_listen: u32,
}

impl CmConfig {
    /// A configuration with IBA defaults: no backoff, no deadline beyond the retries.
    pub const fn new(ca_guid: u64, rng_seed: [u8; 32]) -> Self {
        Self {
            ca_guid,
            rng_seed,
            max_ceps: 1 << 20,
            ca_ack_delay: 15,
            max_responder_resources: 16,
            max_initiator_depth: 16,
            exponential_backoff: false,
            request_deadline_ns: None,
            max_request_wait_ns: Some(Self::MAX_REQUEST_WAIT_NS),
            held_requests_per_listen: Self::HELD_REQUESTS_PER_LISTEN,
            comm_id_mask: 0,
            comm_id_value: 0,
        }
    }

    /// The default longest wait: 4.096 us x 2^24 = 68.7 s, what Linux's rdma_cm asks of
    /// every REQ's sender (`CMA_CM_MRA_SETTING`, IB_CM_MRA_FLAG_DELAY | 24,
    /// drivers/infiniband/core/cma.c), so no sender is asked to wait longer than the
    /// most common CM already makes it expect.
    pub const MAX_REQUEST_WAIT_NS: u64 = 4096 << 24;

    /// The default cap of REQs held past a listen's backlog: 2^17, room for every client
    /// of a 10^5-client storm behind any backlog (each held REQ costs its CEP and its
    /// event, about 650 bytes: 85 MB at the cap).
    pub const HELD_REQUESTS_PER_LISTEN: u32 = 1 << 17;

    /// `(comm_id_mask, comm_id_value)` that keeps every local comm ID out of WinOF AL's:
    /// wire byte 2 >= 0xF0 (bits 15..12 set). AL's IDs are host-order `cid | modifier <<
    /// 24` copied raw to the wire (`al_cm_cep.c` `__get_lcid`, winof-deployment.md §2):
    /// on x64 wire bytes 0-2 hold its 24-bit vector index little-endian, so its wire
    /// byte 2 reaches 0xF0 only past 15.7M live AL CEPs.
    pub const BESIDE_WINOF_AL: (u32, u32) = (0x0000_F000, 0x0000_F000);

    /// This configuration with local comm IDs carrying `value` on the bits of `mask`.
    #[must_use]
    pub const fn with_comm_id_pattern(self, (mask, value): (u32, u32)) -> Self {
        Self {
            comm_id_mask: mask,
            comm_id_value: value,
            ..self
        }
    }

    /// Whether `wire` (a RemoteCommID received, as the 32-bit big-endian number) can be
    /// a local comm ID of a manager with this configuration: it carries the fixed
    /// pattern and is not 0 (0 means "none", IBA Table 108). Pure, for a QP1 steering
    /// function; whether a live CEP holds it is [`CmManager`](crate::CmManager)'s call.
    #[must_use]
    pub const fn is_local_comm_id(&self, wire: u32) -> bool {
        wire != 0 && wire & self.comm_id_mask == self.comm_id_value & self.comm_id_mask
    }
}
