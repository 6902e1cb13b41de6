//! Whether ibcm answers `GUID_INFINIBAND_INTERFACE_CM`, decided once for the host, and
//! which HCAs the access layer reports that no ibcm filter serves.
//!
//! WinVerbs keeps one `iba_cm` table for the whole host: the first one any HCA's query
//! returned (`core/winverbs/kernel/wv_driver.c:574-575`, `if (IbCmInterface.CM.create_id
//! == NULL) IbCmInterface = dev->IbCmInterface;`), and uses it for every endpoint on every
//! HCA. ndfltr keeps a table per device (`core/ndfltr/kernel/nd_driver.cpp:737-744`). A
//! per-HCA answer would hand WinVerbs ibcm's table through one HCA and AL's through
//! another, and WinVerbs would take whichever came first for all of them: connections on
//! an HCA without a QP1 route for ibcm would go to ibcm and fail. Forwarding per port
//! instead (ibcm passing what it cannot serve to AL's own `iba_cm`) is not possible:
//! `create_id` and `listen` name no port, and a listen spans every HCA.
//!
//! So the first CM query of the host CM's life decides for every later one, on every
//! HCA: ibcm iff one HCA is bound, every bound HCA has a QP1 route, and every CA the
//! access layer has reported is one an ibcm filter serves or may still bind. An HCA that
//! arrives later without a route, or without ibcm in its stack, cannot change what
//! WinVerbs already holds: the binding logs it, and its WinVerbs connections fail until
//! the HCAs restart. The verdict lives as long as the host CM (the next CM decides
//! afresh).
//!
//! HCAs without ibcm: ibcm's filter on one HCA registers for port events with the access
//! layer, which reports the ports of every CA of the host (`ib_reg_pnp`, `IB_PNP_PORT`:
//! `core/al/kernel/al_pnp.c` `__pnp_reg_notify` reports each registered CA's ports,
//! `__pnp_process_add_ca` those of every CA registered later), and, since the filter
//! accepts each, their removal too (`__pnp_process_remove_port` notifies the ports whose
//! PORT_ADD was accepted). So the table holds the CAs the access layer has registered, each with
//! the reports that name it, and the CAs ibcm is bound to. A CA reported and not bound is
//! one whose own filter has not bound yet or one with no ibcm in its stack. The two differ
//! by count: every HCA stack is built (EvtDriverDeviceAdd, so the filter exists) before its
//! start IRP, and ibbus registers the CA with the access layer only in that start
//! (`bus_pnp.c` `fdo_start` -> `__register_ca`), so a CA the access layer reports while
//! each existing filter device is bound has no ibcm filter. While some filter device has
//! not bound yet, a reported CA may be its own: it is not named until the count says so.
//! Once named, a CA counts as one without ibcm until it leaves the table or binds: a filter
//! added later (slack in the count) does not make it one of ibcm's again.

/// The CAs the host keeps apart: as many as ibbus serves (`bus_pnp.c`: 64). Reports of
/// more count as CAs without ibcm (the table cannot tell them from ibcm's own).
pub const MAX_CAS: usize = 64;

/// One CA the access layer reported or a filter bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Ca {
    guid: u64,
    /// An ibcm filter is bound to it.
    bound: bool,
    /// Reported as an HCA without ibcm ([`HostCm::next_without_ibcm`]).
    logged: bool,
    /// Port reports that name it and have not been withdrawn (one per port per filter's
    /// registration).
    reports: u32,
    /// An ibcm filter saw ibbus's verbs query name it ([`HostCm::expected`]): its CA.
    expected: bool,
}

impl Ca {
    /// Reported by AL and no filter bound to it.
    fn reported_unbound(&self) -> bool {
        self.reports > 0 && !self.bound
    }

    /// Nothing keeps the entry: no report, no binding, no expectation. It is freed.
    fn release_if_idle(&mut self) {
        if self.reports == 0 && !self.bound && !self.expected {
            *self = Self::default();
        }
    }
}

/// How many of `cas` satisfy `which`.
fn count(cas: &[Ca], which: impl Fn(&Ca) -> bool) -> u32 {
    u32::try_from(cas.iter().filter(|ca| which(ca)).count()).unwrap_or(u32::MAX)
}

/// The host-wide CM verdict and what it was decided from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostCm {
    /// Filter devices of ibcm's that exist (each serves one HCA once it binds).
    filters: u32,
    /// Of those, the ones that cannot see ibbus's verbs query complete (no hook slot).
    blind: u32,
    /// Some filter saw ibbus's verbs query name its CA: the host's filters learn their CAs
    /// before AL can report them.
    sighted: bool,
    /// Bound HCAs.
    bound: u32,
    /// Bound HCAs with no QP1 route for ibcm.
    unrouted: u32,
    /// Bound HCAs whose binding failed before it learnt the CA's GUID.
    anonymous: u32,
    /// Started filters whose HCA ibbus has no CA for (no InfiniBand port: it runs without
    /// the access layer, `bus_pnp.c:566-569`): no CA of theirs will be reported, and
    /// WinVerbs has nothing to connect there.
    no_ca: u32,
    /// CAs reported or bound, by GUID (`guid` 0: a free entry).
    cas: [Ca; MAX_CAS],
    /// Port reports of CAs the full table could not list.
    overflow: u32,
    /// Decided by the first CM query: `true` = ibcm answers every CM query.
    verdict: Option<bool>,
}

impl Default for HostCm {
    fn default() -> Self {
        Self::new()
    }
}

impl HostCm {
    /// No filter, no HCA bound, nothing decided.
    pub const fn new() -> Self {
        Self {
            filters: 0,
            blind: 0,
            sighted: false,
            bound: 0,
            unrouted: 0,
            anonymous: 0,
            no_ca: 0,
            cas: [Ca {
                guid: 0,
                bound: false,
                logged: false,
                reports: 0,
                expected: false,
            }; MAX_CAS],
            overflow: 0,
            verdict: None,
        }
    }

    /// The filter devices of ibcm's that exist now (EvtDriverDeviceAdd made one; its
    /// cleanup deleted one), and how many of them have no hook slot (they do not see
    /// ibbus's verbs query complete).
    pub fn filters(&mut self, count: usize, blind: usize) {
        self.filters = u32::try_from(count).unwrap_or(u32::MAX);
        self.blind = u32::try_from(blind).unwrap_or(u32::MAX);
    }

    /// An ibcm filter saw ibbus's `GUID_RDMA_INTERFACE_VERBS` query on its stack name CA
    /// `ca_guid` (`ci_interface_t::guid`): ibbus makes it before it registers the CA with
    /// AL (`bus_pnp.c` `__register_ca`: `__get_ifc`, then `ib_register_ca`), so the CA is
    /// known to be ibcm's before any filter can hear of it.
    pub fn expected(&mut self, ca_guid: u64) {
        if let Some(ca) = self.entry(ca_guid) {
            ca.expected = true;
            self.sighted = true;
        }
    }

    /// The filter of CA `ca_guid` is gone (its device deleted).
    pub fn unexpected(&mut self, ca_guid: u64) {
        if let Some(ca) = self.listed(ca_guid) {
            ca.expected = false;
            ca.release_if_idle();
        }
    }

    /// Whether every CA with ibcm is known before it is reported: filters learn their CAs
    /// from ibbus's verbs queries here and none is blind. Then a reported CA no filter
    /// expects has no ibcm, whatever filters are still to start; else the count decides.
    fn strict(&self) -> bool {
        self.sighted && self.blind == 0
    }

    /// A filter's HCA has no CA (`started`), or that filter stopped.
    pub fn no_ca(&mut self, started: bool) {
        self.no_ca = if started {
            self.no_ca.saturating_add(1)
        } else {
            self.no_ca.saturating_sub(1)
        };
    }

    /// An HCA bound, `ca_guid` (0: the binding failed before it learnt it; `routed`: it
    /// has a QP1 route for ibcm). True when the verdict is already ibcm and this HCA has
    /// no route: its kernel clients' connections fail (WinVerbs holds ibcm's table); the
    /// caller logs it.
    pub fn bound(&mut self, ca_guid: u64, routed: bool) -> bool {
        self.bound = self.bound.saturating_add(1);
        if !routed {
            self.unrouted = self.unrouted.saturating_add(1);
        }
        match self.entry(ca_guid) {
            Some(ca) => ca.bound = true,
            None => self.anonymous = self.anonymous.saturating_add(1),
        }
        !routed && self.verdict == Some(true)
    }

    /// An HCA unbound (`ca_guid` and `routed` as it was bound). The CA stays listed while
    /// reports name it (it is powering down or going away: the access layer withdraws them
    /// when ibbus deregisters it).
    pub fn unbound(&mut self, ca_guid: u64, routed: bool) {
        self.bound = self.bound.saturating_sub(1);
        if !routed {
            self.unrouted = self.unrouted.saturating_sub(1);
        }
        match self.listed(ca_guid) {
            Some(ca) => {
                ca.bound = false;
                ca.release_if_idle();
            }
            None => self.anonymous = self.anonymous.saturating_sub(1),
        }
    }

    /// The access layer reported a port of CA `ca_guid` (another CA's, to some filter's
    /// port registration).
    pub fn ca_reported(&mut self, ca_guid: u64) {
        match self.entry(ca_guid) {
            Some(ca) => ca.reports = ca.reports.saturating_add(1),
            None if ca_guid != 0 => self.overflow = self.overflow.saturating_add(1),
            None => {}
        }
    }

    /// A report of a port of CA `ca_guid` is withdrawn: the access layer removed the port
    /// (`IB_PNP_PORT_REMOVE`), or the registration that got it was closed. A CA no report
    /// names and no filter is bound to leaves the table.
    pub fn ca_report_withdrawn(&mut self, ca_guid: u64) {
        match self.listed(ca_guid) {
            Some(ca) => {
                ca.reports = ca.reports.saturating_sub(1);
                ca.release_if_idle();
            }
            None if ca_guid != 0 => self.overflow = self.overflow.saturating_sub(1),
            None => {}
        }
    }

    /// The entry of `ca_guid` if it has one (None for GUID 0).
    fn listed(&mut self, ca_guid: u64) -> Option<&mut Ca> {
        self.cas
            .iter_mut()
            .find(|ca| ca_guid != 0 && ca.guid == ca_guid)
    }

    /// The entry of `ca_guid`, made if new (None: GUID 0 or the table full).
    fn entry(&mut self, ca_guid: u64) -> Option<&mut Ca> {
        if ca_guid == 0 {
            return None;
        }
        let at = match self.cas.iter().position(|ca| ca.guid == ca_guid) {
            Some(at) => at,
            None => {
                let free = self.cas.iter().position(|ca| ca.guid == 0)?;
                self.cas[free] = Ca {
                    guid: ca_guid,
                    ..Ca::default()
                };
                free
            }
        };
        self.cas.get_mut(at)
    }

    /// Reported CAs no filter is bound to.
    fn unbound_cas(&self) -> u32 {
        count(&self.cas, Ca::reported_unbound).saturating_add(self.overflow.min(1))
    }

    /// Named CAs (each surely without ibcm when named) no filter is bound to.
    fn named(&self) -> u32 {
        count(&self.cas, |ca| ca.guid != 0 && !ca.bound && ca.logged)
    }

    /// A reported CA that no filter is bound to or expects (the strict rule's).
    fn unexpected_ca(ca: &Ca) -> bool {
        ca.reported_unbound() && !ca.expected
    }

    /// Filter devices that may still bind one of those CAs: not bound yet (starting,
    /// asleep; not one whose HCA has no CA), or bound to a CA whose GUID is unknown.
    fn filters_unaccounted(&self) -> u32 {
        self.filters
            .saturating_sub(self.bound)
            .saturating_sub(self.no_ca)
            .saturating_add(self.anonymous)
    }

    /// How many reported CAs surely have no ibcm filter (`ibcm status`): more such CAs
    /// than filters that could still bind them, and those already named.
    pub fn without_ibcm(&self) -> u32 {
        let surely = if self.strict() {
            count(&self.cas, Self::unexpected_ca).saturating_add(self.overflow.min(1))
        } else {
            self.unbound_cas()
                .saturating_sub(self.filters_unaccounted())
        };
        surely.max(self.named())
    }

    /// Whether some CA the access layer reported surely has no ibcm filter.
    pub fn hca_without_ibcm(&self) -> bool {
        self.without_ibcm() > 0
    }

    /// The next CA known to have no ibcm filter and not yet returned (each once, for the
    /// System log): one no filter expects ([`Self::strict`]), or, counting, only once
    /// every filter device is accounted for, so that a CA whose own filter is about to
    /// bind is never named.
    pub fn next_without_ibcm(&mut self) -> Option<u64> {
        let strict = self.strict();
        if !strict && self.filters_unaccounted() != 0 {
            return None;
        }
        let ca = self.cas.iter_mut().find(|ca| {
            !ca.logged
                && if strict {
                    Self::unexpected_ca(ca)
                } else {
                    ca.reported_unbound()
                }
        })?;
        ca.logged = true;
        Some(ca.guid)
    }

    /// A CM query on any HCA: whether ibcm answers it. The first one decides.
    pub fn answer(&mut self) -> bool {
        let now = self.would_answer();
        *self.verdict.get_or_insert(now)
    }

    /// Whether a CM query would be answered now, deciding nothing (`ibcm status`).
    pub fn would_answer(&self) -> bool {
        self.verdict
            .unwrap_or(self.bound > 0 && self.unrouted == 0 && !self.hca_without_ibcm())
    }

    /// The verdict, once decided.
    pub fn verdict(&self) -> Option<bool> {
        self.verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 0x0002_c903_0000_0a00;
    const B: u64 = 0x0002_c903_0000_0b00;

    /// `filters` filter devices added, as EvtDriverDeviceAdd reports them.
    fn host(filters: usize) -> HostCm {
        let mut cm = HostCm::new();
        cm.filters(filters, 0);
        cm
    }

    #[test]
    fn the_first_query_decides_for_every_hca() {
        let mut cm = host(2);
        assert!(!cm.bound(A, true));
        assert!(cm.answer());
        assert!(
            cm.bound(B, false),
            "a later HCA without a route is reported"
        );
        assert!(
            cm.answer(),
            "WinVerbs holds ibcm's table: every answer agrees"
        );
        cm.unbound(A, true);
        cm.unbound(B, false);
        assert!(cm.answer(), "sleep does not change the verdict");
    }

    #[test]
    fn an_unrouted_hca_at_the_first_query_sends_every_client_to_al() {
        let mut cm = host(2);
        assert!(!cm.bound(A, true));
        assert!(!cm.bound(B, false));
        assert!(!cm.answer());
        cm.unbound(B, false);
        assert!(!cm.answer(), "still AL's: WinVerbs kept AL's table");
        assert!(
            !cm.bound(B, false),
            "nothing to report: the verdict is AL's"
        );
    }

    #[test]
    fn no_hca_bound_is_not_a_route() {
        let mut cm = host(0);
        assert!(!cm.answer());
        assert_eq!(cm.verdict(), Some(false));
    }

    /// B has no ibcm in its UpperFilters and started first: A's port registration hears
    /// of B's ports (`__pnp_reg_notify`), and with A's filter the only one bound, B is named
    /// and AL's CM serves every HCA.
    #[test]
    fn an_hca_without_ibcm_at_the_first_query_sends_every_client_to_al() {
        let mut cm = host(1);
        cm.ca_reported(B);
        cm.ca_reported(B);
        assert!(!cm.bound(A, true));
        assert!(cm.hca_without_ibcm());
        assert_eq!(cm.without_ibcm(), 1, "two ports, one CA");
        assert_eq!(cm.next_without_ibcm(), Some(B));
        assert_eq!(cm.next_without_ibcm(), None, "named once");
        assert!(!cm.answer(), "WinVerbs would use ibcm's table on B");
    }

    /// Both HCAs have ibcm; B's CA is registered (and reported to A's filter) before B's
    /// own filter reaches D0Entry. B's filter exists (its stack was built before its start
    /// IRP), so B is not named and the verdict stays ibcm's.
    #[test]
    fn a_ca_whose_own_filter_has_not_bound_yet_is_not_one_without_ibcm() {
        let mut cm = host(2);
        assert!(!cm.bound(A, true));
        cm.ca_reported(B);
        assert!(!cm.hca_without_ibcm());
        assert_eq!(cm.without_ibcm(), 0);
        assert_eq!(cm.next_without_ibcm(), None, "B's filter may still bind");
        assert!(cm.answer());
        assert!(!cm.bound(B, true));
        assert_eq!(cm.next_without_ibcm(), None);
        cm.ca_reported(A);
        assert_eq!(
            cm.next_without_ibcm(),
            None,
            "both bound: reports change nothing"
        );
    }

    /// B without ibcm arrives after WinVerbs took ibcm's CM: named, the verdict stays
    /// (WinVerbs cannot be told). When A's registration closes (sleep) its reports are
    /// withdrawn and B leaves the table; after the wake it is named again (the System log
    /// keeps one entry a boot).
    #[test]
    fn an_hca_without_ibcm_that_arrives_later_is_named() {
        let mut cm = host(1);
        assert!(!cm.bound(A, true));
        assert!(cm.answer());
        cm.ca_reported(B);
        assert_eq!(cm.next_without_ibcm(), Some(B));
        assert!(cm.answer(), "WinVerbs already holds ibcm's table");
        cm.unbound(A, true);
        cm.ca_report_withdrawn(B);
        assert_eq!(cm.without_ibcm(), 0, "B left the table with A's reports");
        assert!(!cm.bound(A, true));
        cm.ca_reported(B);
        assert_eq!(cm.next_without_ibcm(), Some(B));
    }

    /// A named CA stays one without ibcm when a filter device is added before the first
    /// query (slack in the count that is not B's: B's stack has no ibcm).
    #[test]
    fn a_named_ca_is_not_taken_back_by_a_later_filter() {
        let mut cm = host(1);
        assert!(!cm.bound(A, true));
        cm.ca_reported(B);
        assert_eq!(cm.next_without_ibcm(), Some(B));
        cm.filters(2, 0);
        assert!(cm.hca_without_ibcm(), "named: still without ibcm");
        assert!(!cm.answer(), "AL's, as the System log said");
        assert!(!cm.bound(B, true), "B's stack rebuilt with ibcm: it binds");
        assert!(!cm.hca_without_ibcm());
    }

    /// A CA whose start failed after ibbus registered it, or one going away: the access
    /// layer withdraws its ports, and it is never named once its filter is gone.
    #[test]
    fn a_ca_withdrawn_before_its_filter_goes_is_not_named() {
        let mut cm = host(2);
        assert!(!cm.bound(A, true));
        cm.ca_reported(B);
        cm.ca_report_withdrawn(B);
        cm.filters(1, 0);
        assert_eq!(cm.next_without_ibcm(), None);
        assert!(cm.answer());
    }

    /// A filter whose binding failed before the CA's GUID was known might be B's: B is not
    /// named (its own failure was logged), and the failed binding already makes the
    /// verdict AL's.
    #[test]
    fn a_binding_without_a_guid_names_no_ca() {
        let mut cm = host(2);
        assert!(!cm.bound(A, true));
        assert!(!cm.bound(0, false));
        cm.ca_reported(B);
        assert_eq!(cm.next_without_ibcm(), None);
        assert!(!cm.answer());
        cm.unbound(0, false);
        assert_eq!(cm.anonymous, 0);
    }

    /// An HCA whose ports are all Ethernet: ibbus registers no CA, so the filter binds
    /// nothing. It neither makes the verdict AL's nor hides a CA without ibcm.
    #[test]
    fn an_hca_without_a_ca_counts_for_nothing() {
        let mut cm = host(3);
        cm.no_ca(true);
        assert!(!cm.bound(A, true));
        cm.ca_reported(B);
        assert_eq!(cm.next_without_ibcm(), None, "the third filter may be B's");
        cm.filters(2, 0);
        assert_eq!(cm.next_without_ibcm(), Some(B));
        cm.ca_report_withdrawn(B);
        assert!(
            cm.answer(),
            "the HCA without a CA does not send WinVerbs to AL"
        );
        cm.no_ca(false);
        assert_eq!(cm.no_ca, 0);
    }

    /// Filters learn their CAs from ibbus's verbs queries (made before the CA is
    /// registered): with three HCAs, A bound, B's filter added but not started, and C
    /// reported with no filter expecting it, C is known to lack ibcm at once, though B's
    /// filter could by count still be C's. B, expected, is never named. Counting alone
    /// left C unnamed and the first query ibcm's.
    #[test]
    fn a_ca_no_filter_expects_lacks_ibcm_whatever_is_still_to_start() {
        const C: u64 = 0x0002_c903_0000_0c00;
        let mut cm = host(2);
        cm.expected(A);
        assert!(!cm.bound(A, true));
        cm.ca_reported(C);
        assert_eq!(cm.next_without_ibcm(), Some(C));
        assert!(!cm.answer(), "AL's CM: C would get ibcm's table otherwise");
        cm.expected(B);
        cm.ca_reported(B);
        assert_eq!(
            cm.next_without_ibcm(),
            None,
            "B is expected: its filter will bind"
        );
        assert!(!cm.bound(B, true));
        assert_eq!(cm.without_ibcm(), 1, "C only");
        cm.unbound(B, true);
        cm.ca_report_withdrawn(B);
        cm.unexpected(B);
        assert_eq!(cm.cas.iter().filter(|ca| ca.guid == B).count(), 0);
    }

    /// A filter with no hook slot sees no verbs query: the count decides again.
    #[test]
    fn a_blind_filter_brings_the_count_back() {
        const C: u64 = 0x0002_c903_0000_0c00;
        let mut cm = HostCm::new();
        cm.filters(2, 1);
        cm.expected(A);
        assert!(!cm.bound(A, true));
        cm.ca_reported(C);
        assert_eq!(cm.next_without_ibcm(), None, "the blind filter may be C's");
        assert!(cm.answer());
    }

    /// More CAs than the table holds: the reports it cannot list count as one CA
    /// without ibcm until they are withdrawn.
    #[test]
    fn cas_past_the_table_count_as_without_ibcm() {
        let mut cm = host(1);
        assert!(!cm.bound(A, true));
        for n in 1..=MAX_CAS as u64 {
            cm.ca_reported(B + n);
        }
        assert_eq!(cm.overflow, 1);
        assert_eq!(cm.without_ibcm(), MAX_CAS as u32);
        cm.ca_report_withdrawn(B + MAX_CAS as u64);
        assert_eq!(cm.overflow, 0);
    }
}
