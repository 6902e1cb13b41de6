//! Which QP1 route ibcm takes on each port of an HCA, and which one the HCA reports: the
//! decisions the KMDF binding would otherwise make itself (issue #19).
//!
//! Order, per port (AL's PnP thread, `IB_PNP_PORT_ADD`, PASSIVE_LEVEL):
//!
//! 1. [`Registration::Ordinary`]: a MAD service for the CM class with the unsolicited
//!    methods {Send, Get}, as on a stack without AL's CM. It fails on a stock WinOF host,
//!    where AL's CM holds Send (`al_mad.c` `__mad_disp_reg_unsol`; AL then reports
//!    `IB_INSUFFICIENT_MEMORY`, not a conflict, so any failure counts as "held").
//! 2. [`Registration::Private`]: {`M`, Get} on the same QP1 alias, with the verbs hook
//!    steering ibcm's CM Sends to `M` — only if the hook can: the HCA's filter holds a
//!    hook slot, ibbus's verbs table was patched, and the hook tracks this port's QP1
//!    (AL's `create_spl_qp` went through the thunk). Otherwise the port has no route,
//!    and [`NoRoute`] says why.
//! 3. If {`M`, Get} fails too: no route ([`NoRoute::PrivateRegistrationFailed`]).
//!
//! The HCA's route ([`HcaRoute::of`]) is what the filter logs once its ports are bound and
//! what decides whether it answers `GUID_INFINIBAND_INTERFACE_CM`: with no route on any
//! port it passes the query down (clients get AL's CM) and the reason is in the log.
//! Steering counts as a route only once it is in place: {`M`, Get} registered *and* the
//! steering decision set ([`steering_in_place`]); before that every MAD still goes to AL.

use crate::method::PrivateMethod;
use crate::version::NotInstalled;

/// `IB_MAD_METHOD_GET` (IBA 13.4.5).
const GET: u8 = 0x01;
/// `IB_MAD_METHOD_SEND`.
const SEND: u8 = 0x03;

/// The MAD service ibcm registers on a port's QP1 alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// The CM class's unsolicited {Send, Get}: ibcm is the port's CM.
    Ordinary,
    /// {`M`, Get}: the verbs hook remaps ibcm's CM Sends to `M` below AL.
    Private(PrivateMethod),
}

impl Registration {
    /// The unsolicited methods to set in `ib_mad_svc_t::method_array`.
    pub fn methods(self) -> [u8; 2] {
        match self {
            Self::Ordinary => [SEND, GET],
            Self::Private(m) => [m.get(), GET],
        }
    }
}

/// What became of ibbus's verbs table on this HCA (the query's completion routine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// No completed `GUID_RDMA_INTERFACE_VERBS` query from ibbus reached the filter (or
    /// the filter has no hook slot to patch with).
    NotSeen,
    /// The hooked entries are the slot's thunks.
    Patched,
    /// Left as the HCA filled it ([`install`](crate::install) said no).
    Left(NotInstalled),
    /// The install decision said yes, but the table lacked a required entry or the slot
    /// already served a table with other entries: left as it came.
    PatchRefused,
}

/// What the hook offers one port, when its ordinary registration failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookState {
    /// The filter's hook slot and its private method (None: every slot taken or no
    /// memory at device add).
    pub method: Option<PrivateMethod>,
    /// The HCA's verbs table.
    pub table: Table,
    /// The hook tracks this port's QP1 (AL's `create_spl_qp` came through the thunk).
    pub qp1_tracked: bool,
}

/// Why a port (or an HCA) has no QP1 route: its CM MADs all go to AL's CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoute {
    /// IBAL was not bound (no control device, the interface query or `ib_open_al`
    /// failed), or no port was reported.
    NotBound,
    /// The ordinary registration failed and the filter holds no hook slot.
    NoHookSlot,
    /// The ordinary registration failed and ibbus's verbs query never came through
    /// the filter.
    TableNotSeen,
    /// The ordinary registration failed and the verbs table is of an unknown layout
    /// (or not ibbus's, or the query failed): left alone.
    TableLeft(NotInstalled),
    /// The ordinary registration failed and the verbs table could not be patched.
    PatchRefused,
    /// The ordinary registration failed and the hook never saw this port's QP1.
    NoQp1Seen,
    /// The ordinary and the private registration both failed.
    PrivateRegistrationFailed,
    /// The port's number, attributes or memory could not be had before registering.
    PortSetup,
}

impl NoRoute {
    /// The reason as one line of the log.
    pub fn reason(self) -> &'static str {
        match self {
            Self::NotBound => "IBAL not bound on this HCA",
            Self::NoHookSlot => "AL's CM holds CM Send and no verbs-hook slot was free",
            Self::TableNotSeen => "AL's CM holds CM Send and ibbus's verbs query was not seen",
            Self::TableLeft(NotInstalled::Failed) => {
                "AL's CM holds CM Send and ibbus's verbs query failed"
            }
            Self::TableLeft(NotInstalled::NotIbbus) => {
                "AL's CM holds CM Send and only other drivers' verbs queries were seen"
            }
            Self::TableLeft(NotInstalled::UnknownVersion) => {
                "AL's CM holds CM Send and the verbs interface version is unknown"
            }
            Self::PatchRefused => "AL's CM holds CM Send and the verbs table could not be patched",
            Self::NoQp1Seen => "AL's CM holds CM Send and the hook saw no QP1 on the port",
            Self::PrivateRegistrationFailed => {
                "AL's CM holds CM Send and the private-method MAD service failed"
            }
            Self::PortSetup => "the port could not be set up",
        }
    }

    /// A small code for an atomic (see [`NoRoute::from_code`]); never 0.
    pub fn code(self) -> u8 {
        match self {
            Self::NotBound => 1,
            Self::NoHookSlot => 2,
            Self::TableNotSeen => 3,
            Self::TableLeft(NotInstalled::Failed) => 4,
            Self::TableLeft(NotInstalled::NotIbbus) => 5,
            Self::TableLeft(NotInstalled::UnknownVersion) => 6,
            Self::PatchRefused => 7,
            Self::NoQp1Seen => 8,
            Self::PrivateRegistrationFailed => 9,
            Self::PortSetup => 10,
        }
    }

    /// The reason a [`NoRoute::code`] stands for (None for 0 or an unknown code).
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::NotBound,
            2 => Self::NoHookSlot,
            3 => Self::TableNotSeen,
            4 => Self::TableLeft(NotInstalled::Failed),
            5 => Self::TableLeft(NotInstalled::NotIbbus),
            6 => Self::TableLeft(NotInstalled::UnknownVersion),
            7 => Self::PatchRefused,
            8 => Self::NoQp1Seen,
            9 => Self::PrivateRegistrationFailed,
            10 => Self::PortSetup,
            _ => return None,
        })
    }
}

impl Table {
    /// A small code for an atomic (see [`Table::from_code`]); `NotSeen` is 0.
    pub fn code(self) -> u8 {
        match self {
            Self::NotSeen => 0,
            Self::Patched => 1,
            Self::Left(NotInstalled::Failed) => 2,
            Self::Left(NotInstalled::NotIbbus) => 3,
            Self::Left(NotInstalled::UnknownVersion) => 4,
            Self::PatchRefused => 5,
        }
    }

    /// The outcome a [`Table::code`] stands for; an unknown code is `NotSeen`.
    pub fn from_code(code: u8) -> Self {
        match code {
            1 => Self::Patched,
            2 => Self::Left(NotInstalled::Failed),
            3 => Self::Left(NotInstalled::NotIbbus),
            4 => Self::Left(NotInstalled::UnknownVersion),
            5 => Self::PatchRefused,
            _ => Self::NotSeen,
        }
    }

    /// What a newly completed verbs query (`outcome`, from ibbus or not) makes of the
    /// recorded one: ibbus's query decides what AL uses, so its outcome replaces any
    /// earlier one (a restart queries again); another driver's query (WinVerbs, WinMad,
    /// ndfltr, whose tables are never patched) only fills in `NotSeen`.
    pub fn after(self, outcome: Table, from_ibbus: bool) -> Table {
        if from_ibbus || self == Self::NotSeen {
            outcome
        } else {
            self
        }
    }
}

/// The registration to try first on every port.
pub const FIRST: Registration = Registration::Ordinary;

/// What to do once `failed` did not register on a port: the next registration, or no
/// route and why.
pub fn after_failure(failed: Registration, hook: &HookState) -> Result<Registration, NoRoute> {
    match failed {
        Registration::Private(_) => Err(NoRoute::PrivateRegistrationFailed),
        Registration::Ordinary => {
            let method = hook.method.ok_or(NoRoute::NoHookSlot)?;
            match hook.table {
                Table::NotSeen => Err(NoRoute::TableNotSeen),
                Table::Left(why) => Err(NoRoute::TableLeft(why)),
                Table::PatchRefused => Err(NoRoute::PatchRefused),
                Table::Patched if !hook.qp1_tracked => Err(NoRoute::NoQp1Seen),
                Table::Patched => Ok(Registration::Private(method)),
            }
        }
    }
}

/// Whether the HCA's steering counts as a QP1 route (the filter's `steering_installed`):
/// some port registered {`M`, Get} and the steering decision is set. Either alone steers
/// nothing, or steers MADs to a method nobody registered.
pub fn steering_in_place(steered_ports: usize, decision_set: bool) -> bool {
    steered_ports > 0 && decision_set
}

/// The route an HCA got, for its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HcaRoute {
    /// Some port has ibcm's ordinary CM MAD service (AL's CM does not hold Send there).
    Ordinary,
    /// Some port is steered by the verbs hook (and none has the ordinary service).
    Steering,
    /// No port has a route: AL's CM serves the HCA's clients, for this reason (the last
    /// port's, or [`NoRoute::NotBound`]).
    None(NoRoute),
}

impl HcaRoute {
    /// The route of an HCA with `ordinary` ports on the ordinary registration, `steered`
    /// on the private one, steering set or not (`decision_set`), and `last_failure` the
    /// reason recorded for the last port without a route.
    pub fn of(
        ordinary: usize,
        steered: usize,
        decision_set: bool,
        last_failure: Option<NoRoute>,
    ) -> Self {
        if ordinary > 0 {
            Self::Ordinary
        } else if steering_in_place(steered, decision_set) {
            Self::Steering
        } else {
            Self::None(last_failure.unwrap_or(NoRoute::NotBound))
        }
    }

    /// The route's name for the log.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ordinary => "ordinary CM MAD service",
            Self::Steering => "QP1 steering (verbs hook)",
            Self::None(_) => "none: AL's CM serves clients",
        }
    }

    /// The reason, for a route of `None`; empty otherwise.
    pub fn reason(self) -> &'static str {
        match self {
            Self::None(why) => why.reason(),
            Self::Ordinary | Self::Steering => "",
        }
    }

    /// Whether ibcm serves CM queries on this HCA.
    pub fn is_route(self) -> bool {
        !matches!(self, Self::None(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: PrivateMethod = PrivateMethod::DEFAULT;

    fn hook(method: Option<PrivateMethod>, table: Table, qp1_tracked: bool) -> HookState {
        HookState {
            method,
            table,
            qp1_tracked,
        }
    }

    #[test]
    fn the_ordinary_registration_comes_first_with_send_and_get() {
        assert_eq!(FIRST, Registration::Ordinary);
        assert_eq!(FIRST.methods(), [0x03, 0x01]);
        assert_eq!(Registration::Private(M).methods(), [126, 0x01]);
    }

    #[test]
    fn a_stock_winof_port_with_a_patched_table_and_its_qp1_tracked_goes_private() {
        let h = hook(Some(M), Table::Patched, true);
        assert_eq!(
            after_failure(Registration::Ordinary, &h),
            Ok(Registration::Private(M))
        );
        // And if that fails too, the port has no route.
        assert_eq!(
            after_failure(Registration::Private(M), &h),
            Err(NoRoute::PrivateRegistrationFailed)
        );
    }

    #[test]
    fn each_missing_piece_of_the_hook_is_its_own_reason_in_order() {
        let cases = [
            (hook(None, Table::Patched, true), NoRoute::NoHookSlot),
            (hook(Some(M), Table::NotSeen, true), NoRoute::TableNotSeen),
            (
                hook(Some(M), Table::Left(NotInstalled::UnknownVersion), true),
                NoRoute::TableLeft(NotInstalled::UnknownVersion),
            ),
            (
                hook(Some(M), Table::Left(NotInstalled::Failed), false),
                NoRoute::TableLeft(NotInstalled::Failed),
            ),
            (
                hook(Some(M), Table::PatchRefused, true),
                NoRoute::PatchRefused,
            ),
            (hook(Some(M), Table::Patched, false), NoRoute::NoQp1Seen),
            // The slot is checked before the table: without a slot no table is patched.
            (hook(None, Table::NotSeen, false), NoRoute::NoHookSlot),
        ];
        for (h, why) in cases {
            assert_eq!(after_failure(Registration::Ordinary, &h), Err(why), "{h:?}");
        }
    }

    #[test]
    fn steering_is_a_route_only_with_both_the_service_and_the_decision() {
        assert!(!steering_in_place(0, false));
        assert!(!steering_in_place(0, true));
        assert!(!steering_in_place(2, false));
        assert!(steering_in_place(1, true));
        assert_eq!(
            HcaRoute::of(0, 1, false, None),
            HcaRoute::None(NoRoute::NotBound)
        );
        assert_eq!(
            HcaRoute::of(0, 1, false, Some(NoRoute::NoQp1Seen)),
            HcaRoute::None(NoRoute::NoQp1Seen)
        );
        assert_eq!(HcaRoute::of(0, 1, true, None), HcaRoute::Steering);
    }

    #[test]
    fn the_hca_route_prefers_ordinary_then_steering_then_says_why_not() {
        assert_eq!(HcaRoute::of(1, 1, true, None), HcaRoute::Ordinary);
        assert_eq!(
            HcaRoute::of(1, 0, false, Some(NoRoute::NoQp1Seen)),
            HcaRoute::Ordinary
        );
        assert_eq!(
            HcaRoute::of(0, 2, true, Some(NoRoute::PortSetup)),
            HcaRoute::Steering
        );
        let none = HcaRoute::of(0, 0, false, Some(NoRoute::TableNotSeen));
        assert_eq!(none, HcaRoute::None(NoRoute::TableNotSeen));
        assert!(!none.is_route());
        assert_eq!(none.reason(), NoRoute::TableNotSeen.reason());
        assert!(HcaRoute::Ordinary.is_route() && HcaRoute::Steering.is_route());
        assert_eq!(HcaRoute::Steering.reason(), "");
        assert_eq!(
            HcaRoute::of(0, 0, true, None).reason(),
            "IBAL not bound on this HCA"
        );
    }

    #[test]
    fn codes_round_trip_and_zero_means_nothing_recorded() {
        let reasons = [
            NoRoute::NotBound,
            NoRoute::NoHookSlot,
            NoRoute::TableNotSeen,
            NoRoute::TableLeft(NotInstalled::Failed),
            NoRoute::TableLeft(NotInstalled::NotIbbus),
            NoRoute::TableLeft(NotInstalled::UnknownVersion),
            NoRoute::PatchRefused,
            NoRoute::NoQp1Seen,
            NoRoute::PrivateRegistrationFailed,
            NoRoute::PortSetup,
        ];
        for why in reasons {
            assert_ne!(why.code(), 0);
            assert_eq!(NoRoute::from_code(why.code()), Some(why));
            assert!(!why.reason().is_empty());
        }
        assert_eq!(NoRoute::from_code(0), None);
        assert_eq!(NoRoute::from_code(200), None);
        let tables = [
            Table::NotSeen,
            Table::Patched,
            Table::Left(NotInstalled::Failed),
            Table::Left(NotInstalled::NotIbbus),
            Table::Left(NotInstalled::UnknownVersion),
            Table::PatchRefused,
        ];
        for t in tables {
            assert_eq!(Table::from_code(t.code()), t);
        }
        assert_eq!(Table::from_code(99), Table::NotSeen);
    }

    #[test]
    fn a_table_the_binding_could_not_read_is_never_hooked() {
        use crate::version::{CI_VERBS_VERSION, RDMA_INTERFACE_VERBS_VERSION, VerbsQuery};
        use crate::{Install, install};
        // The binding reads the versions only from a successful query into a buffer of the
        // whole layout, and passes 0 otherwise.
        let unread = |succeeded, from_ibbus, size| VerbsQuery {
            succeeded,
            requested_version: RDMA_INTERFACE_VERBS_VERSION,
            size,
            from_ibbus,
            header_version: 0,
            verbs_version: 0,
        };
        let no = Install::NotInstalled;
        assert_eq!(
            install(&unread(false, true, 640), 640),
            no(NotInstalled::Failed)
        );
        assert_eq!(
            install(&unread(true, false, 100), 640),
            no(NotInstalled::NotIbbus)
        );
        assert_eq!(
            install(&unread(true, true, 100), 640),
            no(NotInstalled::UnknownVersion)
        );
        // A null buffer of the right size: versions 0 as well.
        assert_eq!(
            install(&unread(true, true, 640), 640),
            no(NotInstalled::UnknownVersion)
        );
        let read = VerbsQuery {
            header_version: RDMA_INTERFACE_VERBS_VERSION,
            verbs_version: CI_VERBS_VERSION,
            ..unread(true, true, 640)
        };
        assert_eq!(install(&read, 640), Install::Hook);
    }

    #[test]
    fn ibbus_query_decides_and_other_drivers_queries_do_not_hide_it() {
        let unknown = Table::Left(NotInstalled::UnknownVersion);
        let not_ibbus = Table::Left(NotInstalled::NotIbbus);
        let failed = Table::Left(NotInstalled::Failed);
        // WinVerbs, WinMad, ndfltr query after ibbus (even failing): ibbus's outcome stays.
        assert_eq!(Table::Patched.after(not_ibbus, false), Table::Patched);
        assert_eq!(Table::Patched.after(failed, false), Table::Patched);
        assert_eq!(unknown.after(not_ibbus, false), unknown);
        assert_eq!(
            Table::PatchRefused.after(not_ibbus, false),
            Table::PatchRefused
        );
        // Only other drivers' queries seen so far: that is what is known.
        assert_eq!(Table::NotSeen.after(not_ibbus, false), not_ibbus);
        // ibbus queries again (a restart): its outcome replaces the old one.
        assert_eq!(unknown.after(Table::Patched, true), Table::Patched);
        assert_eq!(Table::Patched.after(failed, true), failed);
        assert_eq!(not_ibbus.after(unknown, true), unknown);
    }
}
