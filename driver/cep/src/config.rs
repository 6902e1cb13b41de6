//! Settings of a [`CmManager`](crate::CmManager).

/// Settings fixed when the manager is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// This CA's node GUID (LocalCAGUID of every REQ and REP; ARI of REJ(Timeout)).
    pub ca_guid: u64,
    /// Seed of the manager's RNG (comm-ID operand, PSNs, TIDs, hash keys). Inject a fixed
    /// seed for deterministic tests; the driver seeds from the platform's RNG.
    pub rng_seed: [u8; 32],
    /// Most CEPs alive at once (including those lingering in timewait); at most 2^24.
    pub max_ceps: u32,
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
        }
    }
}
