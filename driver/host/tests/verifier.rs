//! The verifier's self-test: every rule it enforces can fire, and does not fire for the
//! correct counterpart of the same action.
//!
//! [`Violation::EndpointLeak`] is not exercised: only `Node::close` raises it, after the
//! device's own cleanup has destroyed every endpoint of the file, so no sequence of
//! public calls on a single thread can leave one behind.

use std::hint::black_box;

use ibcm_endpoint::{Lock, Platform, Request};
use ibcm_host::verifier::{Completion, Violation, at_dispatch, locks_held};
use ibcm_host::{Fabric, HostPlatform};
use ibcm_ioctl::{ABI_VERSION, EventRecord, HandleIn, VersionIn, code, status};
use zerocopy::IntoBytes;

fn fabric() -> Fabric {
    Fabric::new(1, 9)
}

fn done(status: i32, information: usize, output: Vec<u8>) -> Completion {
    Completion {
        status,
        information,
        output,
    }
}

#[test]
fn a_request_completed_twice_is_flagged() {
    let f = fabric();
    let node = &f.nodes[0];
    let file = node.open();
    let v = VersionIn {
        size: VersionIn::SIZE,
        abi_version: ABI_VERSION,
    };
    let key = node.ioctl(file, code::VERSION, v.as_bytes(), 16);
    let first = node.completion(key).expect("VERSION completes at once");
    assert_eq!(first.status, status::SUCCESS);
    assert_eq!(node.violations(), vec![], "one completion is fine");

    node.platform
        .ledger
        .complete_for_test(key, done(status::CANCELLED, 0, Vec::new()));
    assert_eq!(node.violations(), vec![Violation::DoubleCompletion { key }]);
    // The first completion stands.
    assert_eq!(node.completion(key), Some(first));
    node.close(file);
    assert_eq!(node.violations(), vec![Violation::DoubleCompletion { key }]);
}

#[test]
fn a_completion_under_a_held_lock_is_flagged() {
    let f = fabric();
    let node = &f.nodes[0];
    let file = node.open();
    let lock = <HostPlatform as Platform>::new_lock(0u32);

    let inside = node.request(file, 0);
    let key = inside.key();
    lock.with(|n| {
        *n += 1;
        assert_eq!(locks_held(), 1);
        node.platform.complete(inside, status::SUCCESS, 0);
    });
    assert_eq!(locks_held(), 0);
    assert_eq!(
        node.violations(),
        vec![Violation::CompletedUnderLock { key }]
    );

    // Nested locks count too; after both are released, completing is fine again.
    let nested = node.request(file, 0);
    let nested_key = nested.key();
    let outer = <HostPlatform as Platform>::new_lock(());
    outer.with(|()| lock.with(|_| node.platform.complete(nested, status::SUCCESS, 0)));
    let outside = node.request(file, 0);
    assert_eq!(lock.with(|n| *n), 1);
    node.platform.complete(outside, status::SUCCESS, 0);
    assert_eq!(
        node.violations(),
        vec![
            Violation::CompletedUnderLock { key },
            Violation::CompletedUnderLock { key: nested_key },
        ]
    );
}

#[test]
fn a_write_past_the_output_buffer_is_flagged() {
    let f = fabric();
    let node = &f.nodes[0];
    let file = node.open();
    let mut r = node.request(file, 8);
    let key = r.key();
    assert_eq!(r.output_len(), 8);
    r.write_output(0, &[1; 8]);
    r.write_output(7, &[2]);
    r.write_output(8, &[]);
    assert_eq!(
        node.violations(),
        vec![],
        "writes within the buffer are fine"
    );

    r.write_output(8, &[3]);
    r.write_output(4, &[4; 5]);
    r.write_output(usize::MAX, &[5]);
    assert_eq!(
        node.violations(),
        vec![
            Violation::OutputOverflow {
                key,
                end: 9,
                len: 8
            },
            Violation::OutputOverflow {
                key,
                end: 9,
                len: 8
            },
            Violation::OutputOverflow {
                key,
                end: usize::MAX,
                len: 8
            },
        ]
    );
    node.platform.complete(r, status::SUCCESS, 8);
    // The refused writes left the buffer as the good ones made it.
    let c = node.completion(key).unwrap();
    assert_eq!(c.output, vec![1, 1, 1, 1, 1, 1, 1, 2]);
    assert_eq!(node.violations().len(), 3);
}

#[test]
fn more_output_reported_than_written_or_held_is_flagged() {
    let f = fabric();
    let node = &f.nodes[0];
    let file = node.open();
    let mut fits = node.request(file, 4);
    fits.write_output(0, &[7; 4]);
    node.platform.complete(fits, status::SUCCESS, 4);
    assert_eq!(node.violations(), vec![]);
    // Reporting bytes never written would hand the caller whatever the buffer held.
    let mut short = node.request(file, 4);
    short.write_output(0, &[7; 2]);
    let short_key = short.key();
    node.platform.complete(short, status::SUCCESS, 4);
    let r = node.request(file, 4);
    let key = r.key();
    node.platform.complete(r, status::SUCCESS, 5);
    assert_eq!(
        node.violations(),
        vec![
            Violation::BadInformation { key: short_key },
            Violation::BadInformation { key }
        ]
    );
}

#[test]
fn a_completion_other_than_cancelled_after_the_cancel_routine_is_flagged() {
    let f = fabric();
    let node = &f.nodes[0];
    let file = node.open();
    // A request the device never saw: the cancel routine finds nothing to cancel, and
    // whoever holds the request then completes it normally.
    let r = node.request(file, 0);
    let key = r.key();
    node.cancel(file, key);
    node.platform.complete(r, status::SUCCESS, 0);
    assert_eq!(
        node.violations(),
        vec![Violation::CompletedAfterCancel { key }]
    );

    // Completing with STATUS_CANCELLED after the cancel is the correct outcome.
    let ok = node.request(file, 0);
    let ok_key = ok.key();
    node.cancel(file, ok_key);
    node.platform.complete(ok, status::CANCELLED, 0);
    assert_eq!(node.violations().len(), 1);
}

#[test]
fn a_request_never_completed_is_leaked_at_close() {
    let f = fabric();
    let node = &f.nodes[0];
    let file = node.open();
    let v = VersionIn {
        size: VersionIn::SIZE,
        abi_version: ABI_VERSION,
    };
    assert_eq!(
        node.ioctl_now(file, code::VERSION, v.as_bytes(), 16).status,
        status::SUCCESS
    );
    // A GET_EVENT pending in the device is completed by cleanup: not a leak.
    let c = ibcm_ioctl::CreateIn {
        size: ibcm_ioctl::CreateIn::SIZE,
        reserved: 0,
    };
    let created = node.ioctl_now(file, code::CREATE, c.as_bytes(), 16);
    let handle = u64::from_le_bytes(created.output[8..16].try_into().unwrap());
    let h = HandleIn {
        size: HandleIn::SIZE,
        reserved: 0,
        handle,
    };
    let pending = node.ioctl(
        file,
        code::GET_EVENT,
        h.as_bytes(),
        EventRecord::SIZE as usize,
    );
    assert_eq!(node.completion(pending), None);
    // A request issued but never handed to the device, nor completed.
    let lost = node.request(file, 0);
    let key = lost.key();
    let other = node.open();
    node.close(file);
    assert_eq!(
        node.completion(pending).map(|c| c.status),
        Some(status::CANCELLED)
    );
    assert_eq!(node.violations(), vec![Violation::Leaked { key }]);
    // Closing another file accounts only for that file's requests.
    node.close(other);
    assert_eq!(node.violations(), vec![Violation::Leaked { key }]);
    drop(lost);
}

#[test]
fn an_allocation_at_dispatch_level_is_flagged() {
    let f = fabric();
    let ledger = &f.nodes[0].platform.ledger;
    let n = at_dispatch(ledger, || black_box(41u64) + 1);
    assert_eq!(n, 42);
    assert_eq!(ledger.violations(), vec![], "no allocation, no violation");

    let v = at_dispatch(ledger, || black_box(Vec::<u8>::with_capacity(64)));
    assert_eq!(v.capacity(), 64);
    assert_eq!(
        ledger.violations(),
        vec![Violation::DispatchAllocation { count: 1 }]
    );
    // Allocations outside at_dispatch are not counted.
    drop(black_box(vec![0u8; 128]));
    let s = at_dispatch(ledger, || {
        let a = black_box(Box::new(1u8));
        let b = black_box(String::from("two"));
        usize::from(*a) + b.len()
    });
    assert_eq!(s, 4);
    assert_eq!(
        ledger.violations(),
        vec![
            Violation::DispatchAllocation { count: 1 },
            Violation::DispatchAllocation { count: 2 },
        ]
    );
}

#[test]
fn the_receive_and_timer_paths_run_at_dispatch() {
    // A MAD the engine must drop and a timer with nothing due: neither allocates, so the
    // DISPATCH_LEVEL paths themselves raise nothing.
    let f = fabric();
    let node = &f.nodes[0];
    node.receive(&ibcm_host::node_address(0), &[0u8; 256]);
    node.fire_timer();
    assert_eq!(node.violations(), vec![]);
}
