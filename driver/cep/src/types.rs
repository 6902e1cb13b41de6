//! Identifiers, time, addresses, private data and the engine's view of wire paths.

pub(crate) use ibcm_iba::{ConnectParams, ListenParams, PathRecord, RepParams};
use ibcm_mad::{Gid, Path, RejReason};

/// A point in time, in nanoseconds since an arbitrary epoch chosen by the caller. The
/// manager never reads a clock: every input carries `now`, and time must not go backwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The instant `ns` nanoseconds after the epoch.
    pub const fn from_nanos(ns: u64) -> Self {
        Self(ns)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + ns`, saturating.
    pub const fn add_nanos(self, ns: u64) -> Self {
        Self(self.0.saturating_add(ns))
    }

    /// Nanoseconds from `earlier` to `self` (0 if `earlier` is later).
    pub const fn nanos_since(self, earlier: Instant) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// A handle to one CEP (communication endpoint) of a [`CmManager`](crate::CmManager):
/// slab index (low 24 bits; the device's owner table indexes by them) and the low 8 bits
/// of the slot's generation, so a stale handle does not name the slot's next 255 CEPs.
/// The wire comm ID carries the whole generation (src/comm_id.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CepId(pub(crate) u32);

impl CepId {
    pub(crate) const INDEX_BITS: u32 = 24;
    pub(crate) const INDEX_MASK: u32 = (1 << Self::INDEX_BITS) - 1;

    /// The handle of slot `index` at `generation` (its low 8 bits).
    pub(crate) fn new(index: u32, generation: u32) -> Self {
        Self((index & Self::INDEX_MASK) | ((generation & 0xff) << Self::INDEX_BITS))
    }

    pub(crate) fn index(self) -> usize {
        (self.0 & Self::INDEX_MASK) as usize
    }

    /// The low 8 bits of the generation it was made at.
    pub(crate) fn tag(self) -> u32 {
        self.0 >> Self::INDEX_BITS
    }

    /// The raw value, for tables outside the manager (it is not the wire comm ID).
    pub const fn to_raw(self) -> u32 {
        self.0
    }

    /// Rebuilds a handle from [`CepId::to_raw`]; the manager checks it on every use.
    pub const fn from_raw(raw: u32) -> Self {
        Self(raw)
    }
}

/// Where a MAD comes from or goes to: a port of this CA and the remote port's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadAddress {
    /// Local port number.
    pub port: u8,
    /// Remote LID (0xFFFF on RoCE).
    pub lid: u16,
    /// Remote GID (IPv4-mapped on RoCEv2).
    pub gid: Gid,
    /// A GRH is present (always on RoCE; off the local subnet on IB).
    pub grh: bool,
    /// Service level.
    pub sl: u8,
    /// Partition key.
    pub pkey: u16,
}

/// A path record as the REQ and LAP carry it (IBA Tables 106, 115).
pub(crate) trait WirePath {
    /// The REQ/LAP wire path with the given local ACK timeout.
    fn to_wire(self, local_ack_timeout: u8) -> Path;
    /// This side's view of a path the peer sent.
    fn from_peer(path: &Path) -> Self;
}

impl WirePath for PathRecord {
    fn to_wire(self, local_ack_timeout: u8) -> Path {
        Path {
            local_lid: self.slid,
            remote_lid: self.dlid,
            local_gid: self.sgid,
            remote_gid: self.dgid,
            flow_label: self.flow_label,
            packet_rate: self.rate,
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            sl: self.sl,
            subnet_local: self.subnet_local,
            local_ack_timeout,
        }
    }

    /// Local and remote swap, and the packet life time is recovered from
    /// LocalACKTimeout - 1 (as Linux `cm_format_paths_from_req`).
    fn from_peer(path: &Path) -> Self {
        Self {
            slid: path.remote_lid,
            dlid: path.local_lid,
            sgid: path.remote_gid,
            dgid: path.local_gid,
            flow_label: path.flow_label,
            traffic_class: path.traffic_class,
            hop_limit: path.hop_limit,
            sl: path.sl,
            rate: path.packet_rate,
            packet_life_time: path.local_ack_timeout.saturating_sub(1),
            subnet_local: path.subnet_local,
        }
    }
}

/// Up to 224 bytes of private data, inline (the largest CM private-data field: RTU/DREP).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrivateData {
    len: u8,
    bytes: [u8; Self::MAX],
}

impl PrivateData {
    /// The largest private data of any CM message.
    pub const MAX: usize = 224;

    /// Copies `data` (truncated to 224 bytes: callers pass wire fields, never longer).
    pub fn new(data: &[u8]) -> Self {
        let len = data.len().min(Self::MAX);
        let mut bytes = [0u8; Self::MAX];
        if let (Some(dst), Some(src)) = (bytes.get_mut(..len), data.get(..len)) {
            dst.copy_from_slice(src);
        }
        Self {
            len: len as u8,
            bytes,
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

impl Default for PrivateData {
    fn default() -> Self {
        Self::new(&[])
    }
}

impl core::fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "PrivateData({} bytes)", self.len)
    }
}

/// Why a REJ is sent: reason, ARI (<= 72 bytes) and private data (<= 148 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejectParams<'a> {
    /// The reason.
    pub reason: RejReason,
    /// Additional rejection information.
    pub ari: &'a [u8],
    /// Private data.
    pub private_data: &'a [u8],
}
