//! IB time values: a 5-bit exponent `t` meaning 4.096 us * 2^t (IBA 12.7.4, 13.4.6.2).
//!
//! Conversions are exact and integer-only: 4.096 us is 4096 ns, so `t` is `4096 << t` ns.

/// The IB time base, 4.096 us, in nanoseconds.
pub const IB_TIME_BASE_NS: u64 = 4096;

/// The largest 5-bit time exponent.
pub const IB_TIME_MAX: u8 = 31;

/// 4.096 us * 2^t in nanoseconds, for `t <= 31`; `None` above (no 5-bit field holds it).
pub const fn ib_time_ns(t: u8) -> Option<u64> {
    if t > IB_TIME_MAX {
        None
    } else {
        Some(IB_TIME_BASE_NS << t)
    }
}

/// The smallest exponent whose time is at least `ns` (saturating at 31).
pub const fn ib_time_from_ns_ceil(ns: u64) -> u8 {
    let mut t = 0u8;
    while t < IB_TIME_MAX && (IB_TIME_BASE_NS << t) < ns {
        t += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_values_at_the_edges() {
        assert_eq!(ib_time_ns(0), Some(4_096));
        assert_eq!(ib_time_ns(14), Some(67_108_864)); // 67.1 ms
        assert_eq!(ib_time_ns(20), Some(4_294_967_296)); // rdma_cm's default: 4.29 s
        assert_eq!(ib_time_ns(31), Some(8_796_093_022_208)); // 2.44 h
        assert_eq!(ib_time_ns(32), None);
    }

    #[test]
    fn ceil_inverts_exact_powers_and_rounds_up_between() {
        for t in 0..=IB_TIME_MAX {
            let ns = 4096u64 << t;
            assert_eq!(ib_time_from_ns_ceil(ns), t);
            if t < IB_TIME_MAX {
                assert_eq!(ib_time_from_ns_ceil(ns + 1), t + 1);
            }
        }
        assert_eq!(ib_time_from_ns_ceil(0), 0);
        assert_eq!(ib_time_from_ns_ceil(u64::MAX), IB_TIME_MAX);
    }
}
