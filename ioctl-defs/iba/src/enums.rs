//! Wire enumerations. Each keeps values it does not know in an `Unknown` variant, so a
//! message from a newer peer parses and re-emits unchanged (smoltcp's `enum_with_unknown`).

macro_rules! enum_with_unknown {
    (
        $(#[$meta:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this implementation does not name.
            Unknown($ty),
        }

        impl From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => Self::$variant, )+
                    other => Self::Unknown(other),
                }
            }
        }

        impl From<$name> for $ty {
            fn from(value: $name) -> $ty {
                match value {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

pub(crate) use enum_with_unknown;

enum_with_unknown! {
    /// MAD methods used by the CM class (IBA 13.4.5, Table 141).
    pub enum Method(u8) {
        /// Get: a ClassPortInfo query.
        Get = 0x01,
        /// Send: every CM message (IBA 12.6.1).
        Send = 0x03,
        /// GetResp: the answer to a Get.
        GetResp = 0x81,
    }
}

enum_with_unknown! {
    /// CM attribute IDs (IBA 12.6, Table 104).
    pub enum AttributeId(u16) {
        /// ClassPortInfo (IBA 13.4.8.1).
        ClassPortInfo = 0x0001,
        /// ConnectRequest.
        Req = 0x0010,
        /// MsgRcptAck.
        Mra = 0x0011,
        /// ConnectReject.
        Rej = 0x0012,
        /// ConnectReply.
        Rep = 0x0013,
        /// ReadyToUse.
        Rtu = 0x0014,
        /// DisconnectRequest.
        Dreq = 0x0015,
        /// DisconnectReply.
        Drep = 0x0016,
        /// ServiceIDResReq.
        SidrReq = 0x0017,
        /// ServiceIDResReqResp.
        SidrRep = 0x0018,
        /// LoadAlternatePath.
        Lap = 0x0019,
        /// AlternatePathResponse.
        Apr = 0x001A,
    }
}

enum_with_unknown! {
    /// Which message an MRA acknowledges or a REJ rejects (Tables 107, 108: 2 bits).
    pub enum MessageKind(u8) {
        /// The REQ.
        Req = 0,
        /// The REP.
        Rep = 1,
        /// Another message (for an MRA: the LAP).
        Other = 2,
    }
}

enum_with_unknown! {
    /// REJ reason codes (IBA 12.6.7.2, Table 109).
    pub enum RejReason(u16) {
        /// No QP available.
        NoQp = 1,
        /// No EE context available.
        NoEec = 2,
        /// No resources available.
        NoResources = 3,
        /// Timeout; ARI = the rejecting CA's GUID.
        Timeout = 4,
        /// Unsupported request.
        UnsupportedReq = 5,
        /// Invalid communication ID.
        InvalidCommId = 6,
        /// Invalid communication instance.
        InvalidCommInstance = 7,
        /// Invalid service ID.
        InvalidServiceId = 8,
        /// Invalid transport service type.
        InvalidTransportType = 9,
        /// Stale connection.
        StaleConn = 10,
        /// RDC does not exist.
        RdcNotExist = 11,
        /// Primary remote port GID rejected; ARI = the acceptable GID.
        InvalidGid = 12,
        /// Primary remote port LID rejected.
        InvalidLid = 13,
        /// Primary SL rejected.
        InvalidSl = 14,
        /// Primary traffic class rejected.
        InvalidTrafficClass = 15,
        /// Primary hop limit rejected.
        InvalidHopLimit = 16,
        /// Primary packet rate rejected.
        InvalidPacketRate = 17,
        /// Alternate remote port GID rejected.
        InvalidAltGid = 18,
        /// Alternate remote port LID rejected.
        InvalidAltLid = 19,
        /// Alternate SL rejected.
        InvalidAltSl = 20,
        /// Alternate traffic class rejected.
        InvalidAltTrafficClass = 21,
        /// Alternate hop limit rejected.
        InvalidAltHopLimit = 22,
        /// Alternate packet rate rejected.
        InvalidAltPacketRate = 23,
        /// Port CM redirect; ARI = ClassPortInfo.
        PortCmRedirect = 24,
        /// Port redirect.
        PortRedirect = 25,
        /// Invalid path MTU.
        InvalidMtu = 26,
        /// Insufficient responder resources.
        InsufficientRespResources = 27,
        /// Consumer defined.
        ConsumerDefined = 28,
        /// Invalid RNR NAK retry count.
        InvalidRnrRetry = 29,
        /// Duplicate local communication ID.
        DuplicateLocalCommId = 30,
        /// Unsupported class version.
        InvalidClassVersion = 31,
        /// Invalid primary flow label.
        InvalidFlowLabel = 32,
        /// Invalid alternate flow label.
        InvalidAltFlowLabel = 33,
        /// Vendor option not supported (ECE).
        VendorOptionNotSupported = 35,
    }
}

enum_with_unknown! {
    /// APR status (IBA 12.8.2, Table 117).
    pub enum AprStatus(u8) {
        /// The alternate path was loaded.
        Success = 0,
        /// Invalid communication ID.
        InvalidCommId = 1,
        /// Path migration not supported.
        Unsupported = 2,
        /// Rejected by the consumer.
        Reject = 3,
        /// Redirect; additional info = ClassPortInfo.
        Redirect = 4,
        /// The path given is already the current one.
        IsCurrent = 5,
        /// Invalid QPN/EECN.
        InvalidQpnEecn = 6,
        /// Invalid alternate LID.
        InvalidLid = 7,
        /// Invalid alternate GID.
        InvalidGid = 8,
        /// Invalid alternate flow label.
        InvalidFlowLabel = 9,
        /// Invalid alternate traffic class.
        InvalidTclass = 10,
        /// Invalid alternate hop limit.
        InvalidHopLimit = 11,
        /// Invalid alternate packet rate.
        InvalidPacketRate = 12,
        /// Invalid alternate SL.
        InvalidSl = 13,
    }
}

enum_with_unknown! {
    /// SIDR_REP status (IBA 12.11.2, Table 121).
    pub enum SidrStatus(u8) {
        /// The service was resolved.
        Success = 0,
        /// No such service.
        Unsupported = 1,
        /// Rejected by the consumer.
        Reject = 2,
        /// No QP available.
        NoQp = 3,
        /// Redirect; additional info = ClassPortInfo.
        Redirect = 4,
        /// The requested class version is not supported.
        UnsupportedVersion = 5,
    }
}

enum_with_unknown! {
    /// REP FailoverAccepted (Table 110: 2 bits).
    pub enum Failover(u8) {
        /// The alternate path was accepted.
        Accepted = 0,
        /// Failover is not supported.
        NotSupported = 1,
        /// The alternate path was rejected.
        Rejected = 2,
    }
}

enum_with_unknown! {
    /// Path MTU codes (IBA 9.7.4.1.1 via PathRecord MTU; 4 bits in the REQ).
    pub enum Mtu(u8) {
        /// 256 bytes.
        Mtu256 = 1,
        /// 512 bytes.
        Mtu512 = 2,
        /// 1024 bytes.
        Mtu1024 = 3,
        /// 2048 bytes.
        Mtu2048 = 4,
        /// 4096 bytes.
        Mtu4096 = 5,
    }
}

/// No rate given: the path record's "unknown" (0), which a REQ may carry.
impl Default for Rate {
    fn default() -> Self {
        Rate::Unknown(0)
    }
}

impl Mtu {
    /// The MTU in bytes, if the code is known.
    pub fn bytes(self) -> Option<u32> {
        match self {
            Self::Mtu256 => Some(256),
            Self::Mtu512 => Some(512),
            Self::Mtu1024 => Some(1024),
            Self::Mtu2048 => Some(2048),
            Self::Mtu4096 => Some(4096),
            Self::Unknown(_) => None,
        }
    }
}

enum_with_unknown! {
    /// Static rate codes (PathRecord Rate, 6 bits; IBA 15.2.5.16 Table 205).
    pub enum Rate(u8) {
        /// 2.5 Gb/s.
        Gbps2_5 = 2,
        /// 10 Gb/s.
        Gbps10 = 3,
        /// 30 Gb/s.
        Gbps30 = 4,
        /// 5 Gb/s.
        Gbps5 = 5,
        /// 20 Gb/s.
        Gbps20 = 6,
        /// 40 Gb/s.
        Gbps40 = 7,
        /// 60 Gb/s.
        Gbps60 = 8,
        /// 80 Gb/s.
        Gbps80 = 9,
        /// 120 Gb/s.
        Gbps120 = 10,
        /// 14 Gb/s.
        Gbps14 = 11,
        /// 56 Gb/s.
        Gbps56 = 12,
        /// 112 Gb/s.
        Gbps112 = 13,
        /// 168 Gb/s.
        Gbps168 = 14,
        /// 25 Gb/s.
        Gbps25 = 15,
        /// 100 Gb/s.
        Gbps100 = 16,
        /// 200 Gb/s.
        Gbps200 = 17,
        /// 300 Gb/s.
        Gbps300 = 18,
        /// 28 Gb/s.
        Gbps28 = 19,
        /// 50 Gb/s.
        Gbps50 = 20,
        /// 400 Gb/s.
        Gbps400 = 21,
        /// 600 Gb/s.
        Gbps600 = 22,
    }
}

/// The REQ's transport: TransportServiceType (2 bits) and, when that is 3,
/// ExtendedTransportType (3 bits) (Table 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Reliable Datagram.
    Rd,
    /// Extended transport type 1: XRC.
    Xrc,
    /// Another extended transport type (3 bits).
    Extended(u8),
}

impl Transport {
    /// Builds the transport from TransportServiceType and ExtendedTransportType. The
    /// extended field is reserved (ignored) unless the service type is 3.
    pub fn from_wire(service_type: u8, extended: u8) -> Self {
        match service_type & 0x3 {
            0 => Self::Rc,
            1 => Self::Uc,
            2 => Self::Rd,
            _ => match extended & 0x7 {
                1 => Self::Xrc,
                other => Self::Extended(other),
            },
        }
    }

    /// (TransportServiceType, ExtendedTransportType) as they go on the wire.
    pub fn to_wire(self) -> (u8, u8) {
        match self {
            Self::Rc => (0, 0),
            Self::Uc => (1, 0),
            Self::Rd => (2, 0),
            Self::Xrc => (3, 1),
            Self::Extended(e) => (3, e),
        }
    }
}
