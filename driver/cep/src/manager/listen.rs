//! Which listens may exist side by side: none two that could both take one REQ.
//!
//! A REQ (or SIDR_REQ) is taken by the listen whose service ID under its mask, port and
//! private-data compare match it ([`takes`]). If two
//! listens could match the same REQ, the one found first would take REQs meant for the
//! other: a listen made later, by another process, with a wider mask, a port or a compare
//! prefix, would steal a service (issue #30). So a listen is refused when an existing
//! one *overlaps* it: some service ID is matched by both masks, their ports can be equal,
//! and some private data satisfies both compares. Then at most one listen takes any REQ,
//! whatever the order they are looked at in.
//!
//! The counterparts:
//! - WinOF AL keys its listen map by exact service ID (al_cm_cep.c:4430-4441), then by
//!   port GUID when both name one (4443-4457); on equal keys a listen without a compare
//!   buffer, beside any other, is a duplicate (4464-4465), as is one whose compare length
//!   or offset differs (4470-4476); only equal-length, equal-offset compares with
//!   different bytes coexist (4478-4497); a duplicate fails with IB_INVALID_SETTING
//!   (4500-4505), STATUS_INVALID_PARAMETER through `iba_cm` (al_proxy.c:1216).
//! - Linux `cm_insert_listen` (cm.c) refuses a second listen on the same service ID and
//!   device with -EBUSY (`ib_cm_listen`); `cm_find_listen` looks REQs up by exact ID.
//!
//! Ours is AL's rule carried over to masks: where AL finds the same service ID, the same
//! or an unnamed port and compares that can both match, so do we; two compares at
//! different offsets or of different lengths coexist here when the bytes they both cover
//! differ (they can never both match), which AL refuses for want of a comparison.

use crate::types::ListenParams;

/// Whether the listen `p` takes a REQ (or SIDR_REQ) for `service_id` arriving on `port`
/// with `private_data`: the service ID under the mask, the port, the compare.
pub(super) fn takes(p: &ListenParams, port: u8, service_id: u64, private_data: &[u8]) -> bool {
    (service_id & p.service_mask) == (p.service_id & p.service_mask)
        && p.port.is_none_or(|x| x == port)
        && p.compare.as_ref().is_none_or(|(offset, bytes)| {
            let start = usize::from(*offset);
            private_data.get(start..start + bytes.len()) == Some(bytes.as_slice())
        })
}

/// Whether some REQ could be taken by both `a` and `b` (module docs). The IDs and ports,
/// two compares of words, are looked at before the compare buffers (up to 92 bytes).
pub(super) fn overlaps(a: &ListenParams, b: &ListenParams) -> bool {
    // IDs s with s & ma == ia & ma and s & mb == ib & mb exist iff ia and ib agree on
    // every bit both masks compare.
    let ids = (a.service_id ^ b.service_id) & a.service_mask & b.service_mask == 0;
    // No port: every port (AL's IB_ALL_PORTS).
    let ports = || match (a.port, b.port) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    };
    let compares = || match (&a.compare, &b.compare) {
        (Some((oa, da)), Some((ob, db))) => agree(usize::from(*oa), da, usize::from(*ob), db),
        // No compare: any private data.
        _ => true,
    };
    ids && ports() && compares()
}

/// Whether `a` at `oa` and `b` at `ob` hold the same byte wherever both cover the REQ's
/// private data (then one private data satisfies both).
fn agree(oa: usize, a: &[u8], ob: usize, b: &[u8]) -> bool {
    a.iter().enumerate().all(|(i, x)| {
        (oa + i)
            .checked_sub(ob)
            .and_then(|j| b.get(j))
            .is_none_or(|y| y == x)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn listen(id: u64, mask: u64, port: Option<u8>, compare: Option<(u8, &[u8])>) -> ListenParams {
        ListenParams {
            service_id: id,
            service_mask: mask,
            port,
            compare: compare.map(|(o, b)| (o, Vec::from(b))),
            backlog: 1,
        }
    }

    #[test]
    fn overlap_is_symmetric_and_follows_each_criterion() {
        let full = u64::MAX;
        let cases = [
            // AL 4464-4465: no compare beside a compare on the same ID.
            (
                listen(1, full, None, None),
                listen(1, full, None, Some((0, b"x"))),
                true,
            ),
            // AL 4443-4457: two named ports that differ are two keys.
            (
                listen(1, full, Some(1), None),
                listen(1, full, Some(2), None),
                false,
            ),
            (
                listen(1, full, Some(1), None),
                listen(1, full, None, None),
                true,
            ),
            // AL 4478-4497: same offset and length, other bytes: both coexist.
            (
                listen(1, full, None, Some((4, b"ab"))),
                listen(1, full, None, Some((4, b"ac"))),
                false,
            ),
            // Different offsets whose common byte differs: never both.
            (
                listen(1, full, None, Some((0, b"ab"))),
                listen(1, full, None, Some((1, b"c"))),
                false,
            ),
            // ... and whose common byte agrees: "abc..." matches both.
            (
                listen(1, full, None, Some((0, b"ab"))),
                listen(1, full, None, Some((1, b"bc"))),
                true,
            ),
            // Disjoint ranges: one private data satisfies both.
            (
                listen(1, full, None, Some((0, b"a"))),
                listen(1, full, None, Some((8, b"z"))),
                true,
            ),
            // Masks: 0x10/0xf0 covers 0x1X, which includes 0x12.
            (
                listen(0x10, !0xf, None, None),
                listen(0x12, full, None, None),
                true,
            ),
            (
                listen(0x10, !0xf, None, None),
                listen(0x22, full, None, None),
                false,
            ),
            (
                listen(0, 0, None, None),
                listen(0x22, full, Some(1), Some((0, b"q"))),
                true,
            ),
        ];
        for (n, (a, b, want)) in cases.iter().enumerate() {
            assert_eq!(overlaps(a, b), *want, "case {n}");
            assert_eq!(overlaps(b, a), *want, "case {n} reversed");
        }
    }
}
