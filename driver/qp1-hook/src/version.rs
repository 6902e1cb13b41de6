//! Whether the hook goes into a verbs table: only into the one layout it was written
//! against, and only into ibbus's copy.
//!
//! ibbus queries `GUID_RDMA_INTERFACE_VERBS` in `fdo_start` with `Version =
//! VerbsVersion(2, 7)`, `Size = sizeof(RDMA_INTERFACE_VERBS)` and a non-NULL
//! `InterfaceSpecificData` (`core/bus/kernel/bus_pnp.c`: `__register_ca`, `__get_ifc`);
//! WinVerbs, WinMad and ndfltr query the same GUID with `InterfaceSpecificData = NULL`
//! and never touch QP1, so their tables stay the HCA's (no cost on their data paths).
//! AL refuses a table whose `Verbs.version` is not 0x00020007 (`core/al/kernel/al_mgr.c`
//! 282-289); a table that says anything else has a layout this hook does not know
//! (Mellanox's binary builds may differ, winof-deployment.md §5): it passes untouched.

/// `VerbsVersion(VERBS_MAJOR_VER, VERBS_MINOR_VER)`, the `INTERFACE` header's version
/// (`inc/kernel/rdma/verbs.h`: `VerbsVersion`).
pub const RDMA_INTERFACE_VERBS_VERSION: u16 = 0x0207;
/// `ci_interface_t::version` of the same headers (`inc/iba/ib_ci.h`; AL's check,
/// `al_mgr.c`).
pub const CI_VERBS_VERSION: u32 = 0x0002_0007;

/// A completed `IRP_MN_QUERY_INTERFACE` for `GUID_RDMA_INTERFACE_VERBS`, as the filter's
/// completion routine reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerbsQuery {
    /// The IRP completed with a success status.
    pub succeeded: bool,
    /// `Parameters.QueryInterface.Version` (what the querier asked for).
    pub requested_version: u16,
    /// `Parameters.QueryInterface.Size`.
    pub size: u16,
    /// `Parameters.QueryInterface.InterfaceSpecificData` is not NULL (ibbus's query).
    pub from_ibbus: bool,
    /// `INTERFACE::Version` of the answer.
    pub header_version: u16,
    /// `ci_interface_t::version` of the answer.
    pub verbs_version: u32,
}

/// What the completion routine does with the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// Patch the hooked entries of this table.
    Hook,
    /// Leave the table as the HCA filled it, and why.
    NotInstalled(NotInstalled),
}

/// Why a verbs table is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotInstalled {
    /// The query failed: there is no table.
    Failed,
    /// Not ibbus's query (WinVerbs, WinMad, ndfltr): its table never drives QP1.
    NotIbbus,
    /// Another interface or verbs version, or a buffer smaller than the layout:
    /// unknown layout.
    UnknownVersion,
}

/// The decision for one completed query. `layout_size` is `sizeof(RDMA_INTERFACE_VERBS)`
/// of the layout the binding declares.
pub fn install(query: &VerbsQuery, layout_size: u16) -> Install {
    let no = Install::NotInstalled;
    if !query.succeeded {
        no(NotInstalled::Failed)
    } else if !query.from_ibbus {
        no(NotInstalled::NotIbbus)
    } else if query.requested_version != RDMA_INTERFACE_VERBS_VERSION
        || query.header_version != RDMA_INTERFACE_VERBS_VERSION
        || query.verbs_version != CI_VERBS_VERSION
        || query.size < layout_size
    {
        no(NotInstalled::UnknownVersion)
    } else {
        Install::Hook
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: u16 = 1000;

    fn ibbus() -> VerbsQuery {
        VerbsQuery {
            succeeded: true,
            requested_version: 0x0207,
            size: SIZE,
            from_ibbus: true,
            header_version: 0x0207,
            verbs_version: 0x0002_0007,
        }
    }

    #[test]
    fn only_ibbus_s_successful_query_of_the_known_layout_is_hooked() {
        assert_eq!(install(&ibbus(), SIZE), Install::Hook);
        let cases = [
            (
                VerbsQuery {
                    succeeded: false,
                    ..ibbus()
                },
                NotInstalled::Failed,
            ),
            (
                VerbsQuery {
                    from_ibbus: false,
                    ..ibbus()
                },
                NotInstalled::NotIbbus,
            ),
            (
                VerbsQuery {
                    requested_version: 0x0208,
                    ..ibbus()
                },
                NotInstalled::UnknownVersion,
            ),
            (
                VerbsQuery {
                    header_version: 0x0206,
                    ..ibbus()
                },
                NotInstalled::UnknownVersion,
            ),
            (
                VerbsQuery {
                    verbs_version: 0x0002_0008,
                    ..ibbus()
                },
                NotInstalled::UnknownVersion,
            ),
            (
                VerbsQuery {
                    size: SIZE - 1,
                    ..ibbus()
                },
                NotInstalled::UnknownVersion,
            ),
        ];
        for (query, why) in cases {
            assert_eq!(
                install(&query, SIZE),
                Install::NotInstalled(why),
                "{query:?}"
            );
        }
    }
}
