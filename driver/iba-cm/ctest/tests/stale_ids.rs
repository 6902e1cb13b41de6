//! Item 5 of issue 25: ids a stale pointer cannot reach, for the id a callback's error
//! return frees (al_cm.c:90-95: "the id is destroyed and freed") while its client calls
//! `destroy_id` on it from another CPU. (ndfltr's double `destroy_id` at HCA removal is
//! replayed in `ndfltr.rs`; WinVerbs' leak in `winverbs.rs`.)

mod harness;
mod replay;

use std::sync::Arc;

use ibcm_iba_cm::abi::{IbaCmEvent, event_type as ev, status};
use ibcm_iba_cm_ctest as _;

use harness::{CONFIG, World, path};
use replay::Host;

const SID: u64 = 0x1234;
const SETTLE: u64 = 200_000;

/// A's callback fails the REP (the CM frees its id); A's client, racing, calls
/// `destroy_id` with the pointer only after other ids were created on A. The late call
/// must destroy none of them, however many were created and destroyed meanwhile.
#[test]
fn a_destroy_racing_a_callbacks_error_return_reaches_no_other_id() {
    let mut w = World::new(301);
    let host_a = Arc::new(Host::new(&w.a));
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    assert_eq!(
        a.connect(SID, &path(0, 1), None, 0x11, &[], 1, 1),
        status::SUCCESS
    );
    let stale = a.id_ptr();
    w.run(SETTLE);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(&child, &mut e), status::SUCCESS);
    a.fail_on(ev::REP_RECEIVED);
    assert_eq!(child.accept(0x22, &[], 1, 1), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a.types(), [ev::REP_RECEIVED]);
    assert!(!a.has_id(), "the CM freed the id");
    assert_eq!(w.a.ids_in_use(), 0);
    // Other ids on A meanwhile: the first takes a freed slot, then the pool cycles.
    let mut keep = Vec::new();
    for i in 0..3 * CONFIG.ids {
        let c = w.a.cep();
        assert_eq!(c.create(), status::SUCCESS, "create_id {i}");
        if i % 4 == 0 {
            keep.push(c);
        } else {
            c.destroy();
        }
    }
    assert_eq!(w.a.ids_in_use(), keep.len());
    // The racing destroy_id.
    host_a.raw_destroy_id(stale);
    assert_eq!(
        w.a.ids_in_use(),
        keep.len(),
        "a stale destroy_id destroyed an id"
    );
    for c in &keep {
        assert_eq!(
            host_a.raw_send_dreq(c.id_ptr()),
            status::INVALID_DEVICE_STATE,
            "a live id still answers"
        );
    }
    // And the stale pointer names nothing for any other call.
    assert_eq!(host_a.raw_send_dreq(stale), status::INVALID_HANDLE);
    for c in keep.iter().chain([&child, &listen]) {
        c.destroy();
    }
    w.run(SETTLE);
    w.finish();
}
