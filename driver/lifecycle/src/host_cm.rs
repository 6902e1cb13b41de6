//! Whether ibcm answers `GUID_INFINIBAND_INTERFACE_CM`, decided once for the host.
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
//! HCA: ibcm iff every HCA bound at that moment has a QP1 route (and one is bound). An HCA
//! that binds later without a route cannot change what WinVerbs already holds: the
//! binding logs it ([`HostCm::bound`] says so), and its connections through ibcm fail.
//! The verdict lives as long as the host CM (the next CM decides afresh).

/// The host-wide CM verdict and what it was decided from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCm {
    /// Bound HCAs.
    bound: u32,
    /// Bound HCAs with no QP1 route for ibcm.
    unrouted: u32,
    /// Decided by the first CM query: `true` = ibcm answers every CM query.
    verdict: Option<bool>,
}

impl HostCm {
    /// No HCA bound, nothing decided.
    pub const fn new() -> Self {
        Self {
            bound: 0,
            unrouted: 0,
            verdict: None,
        }
    }

    /// An HCA bound (`routed`: it has a QP1 route for ibcm). True when the verdict is
    /// already ibcm and this HCA has no route: its kernel clients' connections fail
    /// (WinVerbs holds ibcm's table); the caller logs it.
    pub fn bound(&mut self, routed: bool) -> bool {
        self.bound = self.bound.saturating_add(1);
        if !routed {
            self.unrouted = self.unrouted.saturating_add(1);
        }
        !routed && self.verdict == Some(true)
    }

    /// An HCA unbound (`routed` as it was bound).
    pub fn unbound(&mut self, routed: bool) {
        self.bound = self.bound.saturating_sub(1);
        if !routed {
            self.unrouted = self.unrouted.saturating_sub(1);
        }
    }

    /// A CM query on any HCA: whether ibcm answers it. The first one decides.
    pub fn answer(&mut self) -> bool {
        let bound = self.bound;
        let unrouted = self.unrouted;
        *self.verdict.get_or_insert(bound > 0 && unrouted == 0)
    }

    /// The verdict, once decided.
    pub fn verdict(&self) -> Option<bool> {
        self.verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_query_decides_for_every_hca() {
        let mut cm = HostCm::new();
        assert!(!cm.bound(true));
        assert!(cm.answer());
        assert!(cm.bound(false), "a later HCA without a route is reported");
        assert!(
            cm.answer(),
            "WinVerbs holds ibcm's table: every answer agrees"
        );
        cm.unbound(true);
        cm.unbound(false);
        assert!(cm.answer(), "sleep does not change the verdict");
    }

    #[test]
    fn an_unrouted_hca_at_the_first_query_sends_every_client_to_al() {
        let mut cm = HostCm::new();
        assert!(!cm.bound(true));
        assert!(!cm.bound(false));
        assert!(!cm.answer());
        cm.unbound(false);
        assert!(!cm.answer(), "still AL's: WinVerbs kept AL's table");
        assert!(!cm.bound(false), "nothing to report: the verdict is AL's");
    }

    #[test]
    fn no_hca_bound_is_not_a_route() {
        let mut cm = HostCm::new();
        assert!(!cm.answer());
        assert_eq!(cm.verdict(), Some(false));
    }
}
