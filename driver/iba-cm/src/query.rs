//! Which `IRP_MN_QUERY_INTERFACE` ibcm answers, and why it passes the others down.
//!
//! ibcm is an upper filter directly above ibbus on each HCA's stack, so every
//! `IRP_MN_QUERY_INTERFACE` a driver higher in the stack sends (WinVerbs, ndfltr:
//! `WdfFdoQueryForInterface`, which starts at the top of the stack) passes through it. It
//! answers exactly what ibbus would answer for the CM (`core/bus/kernel/bus_pnp.c`
//! `__query_cm_ifc`: the GUID, the version equal to `INFINIBAND_INTERFACE_CM_VERSION`, a
//! buffer of at least `sizeof(INFINIBAND_INTERFACE_CM)`) and only when it can serve the
//! client: its CM exists, it has a working QP1 route on this HCA, and it is not being
//! removed. Everything else goes down to ibbus unchanged, so the client gets AL's CM
//! (WinVerbs marks the interface taken even when the query fails,
//! `core/winverbs/kernel/wv_driver.c:572`: a well-formed query must never fail here).
//!
//! The Windows binding calls [`decide_query`] (or [`answer`]) from its
//! `WdfDeviceInitAssignWdmIrpPreprocessCallback` routine and does what it says; it decides
//! nothing itself.

use crate::abi::{
    GUID_INFINIBAND_INTERFACE_CM, Guid, INFINIBAND_INTERFACE_CM_VERSION, InfinibandInterfaceCm,
};
use crate::instance::{Backend, Registered};

/// Why a query goes down the stack instead of being answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassDown {
    /// Not `GUID_INFINIBAND_INTERFACE_CM`: not ibcm's business (AL, verbs, ...).
    OtherInterface,
    /// The CM GUID with another version than 1.1 (ibbus also requires an exact match).
    Version(u16),
    /// The CM GUID and version with a buffer smaller than `INFINIBAND_INTERFACE_CM`.
    TooSmall(u16),
    /// ibcm's CM does not exist yet (no port of any CA has been reported to it).
    NoCm,
    /// ibcm has no working QP1 route on this HCA: the AL MAD-service registration for
    /// the CM class failed on every port (AL's own CM holds it) and no QP1 steering is
    /// installed. Serving the client would give it a CM that cannot reach the wire.
    NoQp1Route,
    /// ibcm's CM is being removed: no new reference is handed out.
    Removing,
    /// The kill switch is on (the service's `Parameters\\Disabled`, read at the HCA's
    /// start): ibcm answers no CM query, and AL's CM serves every client.
    SwitchedOff,
}

impl PassDown {
    /// Whether the binding should log this (Event Log / ETW): a CM query ibcm did not
    /// answer is a deployment fact a user wants to see; other interfaces are routine.
    pub const fn is_cm_query(self) -> bool {
        !matches!(self, Self::OtherInterface)
    }

    /// A short English reason, for the log line.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::OtherInterface => "not the CM interface",
            Self::Version(_) => "interface version is not 1.1",
            Self::TooSmall(_) => "interface buffer smaller than INFINIBAND_INTERFACE_CM",
            Self::NoCm => "ibcm's CM has no port yet",
            Self::NoQp1Route => {
                "no QP1 route on this HCA (CM MAD service registration failed, no steering)"
            }
            Self::Removing => "ibcm's CM is being removed",
            Self::SwitchedOff => "ibcm is switched off (Parameters\\Disabled)",
        }
    }
}

/// What to do with one `IRP_MN_QUERY_INTERFACE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryDecision {
    /// Fill the caller's buffer with ibcm's `iba_cm` interface (taking a reference) and
    /// complete the IRP with `STATUS_SUCCESS` without passing it down.
    Answer,
    /// `IoSkipCurrentIrpStackLocation` + `WdfDeviceWdmDispatchPreprocessedIrp`.
    PassDown(PassDown),
}

/// The decision for a query of `interface_type`, `version`, `size` (the stack location's
/// `Parameters.QueryInterface`), given whether ibcm's CM exists (`cm_ready`) and whether
/// this HCA has a working QP1 route (`qp1_route`).
pub fn decide_query(
    interface_type: &Guid,
    version: u16,
    size: u16,
    cm_ready: bool,
    qp1_route: bool,
) -> QueryDecision {
    let full = core::mem::size_of::<InfinibandInterfaceCm>();
    let pass = QueryDecision::PassDown;
    if *interface_type != GUID_INFINIBAND_INTERFACE_CM {
        pass(PassDown::OtherInterface)
    } else if version != INFINIBAND_INTERFACE_CM_VERSION {
        pass(PassDown::Version(version))
    } else if usize::from(size) < full {
        pass(PassDown::TooSmall(size))
    } else if !cm_ready {
        pass(PassDown::NoCm)
    } else if !qp1_route {
        pass(PassDown::NoQp1Route)
    } else {
        QueryDecision::Answer
    }
}

/// [`decide_query`], then [`Registered::answer_query`]: the interface to copy into the
/// caller's buffer (already referenced for the caller), or why the query goes down.
/// `cm` is `None` while ibcm's CM does not exist.
pub fn answer<B: Backend>(
    cm: Option<&Registered<B>>,
    interface_type: &Guid,
    version: u16,
    size: u16,
    qp1_route: bool,
) -> Result<InfinibandInterfaceCm, PassDown> {
    match decide_query(interface_type, version, size, cm.is_some(), qp1_route) {
        QueryDecision::PassDown(why) => Err(why),
        QueryDecision::Answer => cm
            .and_then(|cm| cm.answer_query(version, size))
            .ok_or(PassDown::Removing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CM: Guid = GUID_INFINIBAND_INTERFACE_CM;
    /// `GUID_IB_AL_INTERFACE` {96234E89-496F-4dfb-AA90-FCE82BCEC8A8} (ib_al_ifc.h).
    const AL: Guid = Guid {
        data1: 0x9623_4E89,
        data2: 0x496F,
        data3: 0x4DFB,
        data4: [0xAA, 0x90, 0xFC, 0xE8, 0x2B, 0xCE, 0xC8, 0xA8],
    };

    #[test]
    fn the_cm_query_winverbs_sends_is_answered() {
        // wv_driver.c:554-574 / nd_driver.cpp:737-752: sizeof(INFINIBAND_INTERFACE_CM),
        // INFINIBAND_INTERFACE_CM_VERSION.
        assert_eq!(
            decide_query(&CM, 0x0101, 208, true, true),
            QueryDecision::Answer
        );
        assert_eq!(
            decide_query(&CM, 0x0101, 4096, true, true),
            QueryDecision::Answer
        );
    }

    #[test]
    fn other_interfaces_go_down_silently() {
        let d = decide_query(&AL, 0x0101, 208, true, true);
        assert_eq!(d, QueryDecision::PassDown(PassDown::OtherInterface));
        assert!(!PassDown::OtherInterface.is_cm_query());
        // One bit off in Data4.
        let mut near = CM;
        near.data4[7] ^= 1;
        assert_eq!(
            decide_query(&near, 0x0101, 208, true, true),
            QueryDecision::PassDown(PassDown::OtherInterface)
        );
    }

    #[test]
    fn only_version_1_1_exactly() {
        for v in [0x0100, 0x0102, 0x0201, 0x0001, 0] {
            assert_eq!(
                decide_query(&CM, v, 208, true, true),
                QueryDecision::PassDown(PassDown::Version(v))
            );
        }
    }

    #[test]
    fn a_short_buffer_goes_down() {
        assert_eq!(
            decide_query(&CM, 0x0101, 207, true, true),
            QueryDecision::PassDown(PassDown::TooSmall(207))
        );
        assert_eq!(
            decide_query(&CM, 0x0101, 0, true, true),
            QueryDecision::PassDown(PassDown::TooSmall(0))
        );
    }

    #[test]
    fn no_cm_or_no_route_goes_down_and_is_logged() {
        let no_cm = decide_query(&CM, 0x0101, 208, false, true);
        assert_eq!(no_cm, QueryDecision::PassDown(PassDown::NoCm));
        let no_route = decide_query(&CM, 0x0101, 208, true, false);
        assert_eq!(no_route, QueryDecision::PassDown(PassDown::NoQp1Route));
        assert!(PassDown::NoCm.is_cm_query());
        assert!(PassDown::NoQp1Route.is_cm_query());
        assert!(PassDown::NoQp1Route.reason().contains("QP1"));
    }

    #[test]
    fn malformed_before_unavailable() {
        // A wrong version is reported as such even when ibcm could not serve anyway.
        assert_eq!(
            decide_query(&CM, 0x0100, 10, false, false),
            QueryDecision::PassDown(PassDown::Version(0x0100))
        );
    }
}
