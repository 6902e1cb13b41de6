//! The filter's lifecycle (`ibcm_lifecycle::Hca`) driven through models of KMDF's callback
//! order, ibbus's power and PnP handlers and AL's forced destruction (`model/`, each step
//! citing its source lines), on one HCA and two, with connections, kernel clients and user
//! handles live, and an HCA that never comes back. Checked after every transition
//! (`World::check`) and at the end (`World::check_nothing_left`): ibbus never waits on a
//! reference of ibcm's, no AL object is used after its CA went, no hook slot is freed while
//! ibbus's table holds its thunks, every connection and kernel id on a port that went was
//! told, nothing is left, and the other HCA's connections are untouched.

mod model;

use ibcm_lifecycle::{Mapping, Teardown};
use model::kmdf;
use model::world::{Control, Owner, World};

fn clean(w: &World) {
    assert_eq!(w.hung, None, "violations so far: {:?}", w.violations);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
}

fn connect_both(w: &mut World, hca: usize) {
    w.connect(hca, Owner::User);
    w.connect(hca, Owner::Kernel);
}

/// Connections of `hca` not yet told.
fn live(w: &World, hca: usize) -> usize {
    w.connections
        .iter()
        .filter(|c| c.hca == hca && !c.told)
        .count()
}

#[test]
fn one_hca_sleeps_hibernates_and_comes_back() {
    let mut w = World::new(Mapping::Power, 1);
    kmdf::start(&mut w, 0);
    connect_both(&mut w, 0);
    assert_eq!(live(&w, 0), 4);
    assert_eq!(w.stacks[0].ibbus.table_patched_by, Some(0));
    for _ in 0..2 {
        // S3, then S4: the same D3 path in ibbus.
        kmdf::sleep(&mut w, 0, false);
        clean(&w);
        assert_eq!(w.stacks[0].ibbus.ibcm_refs, 0);
        assert!(
            !w.stacks[0].ibbus.forced,
            "every AL object closed before the CA went"
        );
        assert_eq!(live(&w, 0), 0, "every connection and id on the HCA told");
        assert!(
            w.connections
                .iter()
                .filter(|c| c.owner == Owner::Kernel)
                .all(|c| c.told),
            "kernel clients' ids too"
        );
        assert!(w.cm, "the host CM survives");
        kmdf::wake(&mut w, 0);
        clean(&w);
        assert!(w.stacks[0].published, "bound again after D0Entry");
        assert_eq!(
            w.stacks[0].ibbus.table_patched_by,
            Some(0),
            "ibbus re-queried the verbs through the filter: patched again"
        );
        connect_both(&mut w, 0);
        w.send_everywhere();
    }
    kmdf::remove(&mut w, 0);
    w.check_nothing_left();
    clean(&w);
}

#[test]
fn shutdown_d3_does_not_wait_and_the_binding_still_goes() {
    let mut w = World::new(Mapping::Power, 1);
    kmdf::start(&mut w, 0);
    connect_both(&mut w, 0);
    kmdf::sleep(&mut w, 0, true);
    clean(&w);
    assert_eq!(live(&w, 0), 0);
}

#[test]
fn rebalance_stops_and_restarts_the_hca() {
    let mut w = World::new(Mapping::Power, 1);
    kmdf::start(&mut w, 0);
    connect_both(&mut w, 0);
    kmdf::rebalance(&mut w, 0);
    clean(&w);
    assert_eq!(live(&w, 0), 0);
    assert!(w.stacks[0].published);
    connect_both(&mut w, 0);
    w.send_everywhere();
    kmdf::remove(&mut w, 0);
    w.check_nothing_left();
    clean(&w);
}

#[test]
fn two_hcas_one_surprise_removed_the_other_keeps_its_connections() {
    let mut w = World::new(Mapping::Power, 2);
    kmdf::start(&mut w, 0);
    kmdf::start(&mut w, 1);
    connect_both(&mut w, 0);
    connect_both(&mut w, 1);
    kmdf::surprise_remove(&mut w, 0, true);
    clean(&w);
    assert_eq!(live(&w, 0), 0);
    assert_eq!(live(&w, 1), 4, "the second HCA's connections are untouched");
    assert!(w.stacks[1].published && w.cm);
    assert_eq!(w.slots[0], None, "the gone HCA's slot is free");
    assert_eq!(w.stacks[1].ibbus.table_patched_by, Some(1));
    w.send_everywhere();
    kmdf::sleep(&mut w, 1, false);
    kmdf::wake(&mut w, 1);
    clean(&w);
    kmdf::remove(&mut w, 1);
    w.check_nothing_left();
    clean(&w);
}

#[test]
fn an_hca_that_never_comes_back_from_sleep() {
    let mut w = World::new(Mapping::Power, 2);
    kmdf::start(&mut w, 0);
    kmdf::start(&mut w, 1);
    connect_both(&mut w, 0);
    connect_both(&mut w, 1);
    kmdf::sleep(&mut w, 0, false);
    kmdf::sleep(&mut w, 1, false);
    clean(&w);
    kmdf::wake(&mut w, 1);
    connect_both(&mut w, 1);
    // HCA 0 is missing at resume: surprise removed while still in Dx.
    kmdf::surprise_remove(&mut w, 0, false);
    clean(&w);
    assert_eq!(live(&w, 1), 4);
    assert_eq!(w.filters, 1);
    kmdf::remove(&mut w, 1);
    w.check_nothing_left();
    clean(&w);
}

#[test]
fn a_user_handle_kept_open_across_the_last_removal_then_the_control_device_is_retried() {
    let mut w = World::new(Mapping::Power, 2);
    kmdf::start(&mut w, 0);
    w.user_handles = 1;
    connect_both(&mut w, 0);
    kmdf::surprise_remove(&mut w, 0, true);
    clean(&w);
    assert_eq!(w.control, Control::Lingering);
    // A new HCA while the old name is taken: it starts, without ibcm.
    kmdf::start(&mut w, 1);
    clean(&w);
    assert!(!w.stacks[1].published, "no control device: not bound");
    w.close_user_handles();
    // The next D0Entry retries the control device and binds.
    kmdf::sleep(&mut w, 1, false);
    kmdf::wake(&mut w, 1);
    clean(&w);
    assert_eq!(w.control, Control::Live);
    assert!(w.stacks[1].published);
    kmdf::remove(&mut w, 1);
    w.check_nothing_left();
    clean(&w);
}

/// The mapping before issue #27 (bind at SelfManagedIoInit, unbind at ...Cleanup): ibbus
/// waits on ibcm's reference at every D3 for sleep, at stop and at surprise removal; only
/// an orderly removal gets through.
#[test]
fn the_old_mapping_hangs_ibbus_on_sleep_stop_and_surprise_removal() {
    type Scenario = fn(&mut World);
    let scenarios: [(&str, Scenario, Option<&str>); 4] = [
        (
            "sleep",
            |w| kmdf::sleep(w, 0, false),
            Some("bus_pnp.c:1899"),
        ),
        (
            "rebalance",
            |w| kmdf::rebalance(w, 0),
            Some("bus_pnp.c:896"),
        ),
        (
            "surprise removal",
            |w| kmdf::surprise_remove(w, 0, true),
            Some("cl_pnp_po.c:781"),
        ),
        ("orderly removal", |w| kmdf::remove(w, 0), None),
    ];
    for (name, scenario, hang) in scenarios {
        let mut w = World::new(Mapping::SelfManagedIo, 1);
        kmdf::start(&mut w, 0);
        connect_both(&mut w, 0);
        scenario(&mut w);
        match hang {
            Some(line) => {
                let hung = w.hung.clone().unwrap_or_default();
                println!("old mapping, {name}: {hung}");
                assert!(hung.contains(line), "{name}: {hung:?}");
                assert_eq!(w.stacks[0].ibbus.ibcm_refs, 1);
            }
            None => {
                w.check_nothing_left();
                clean(&w);
            }
        }
    }
}

/// The checks are live: an unbind that drops the interface but keeps AL open and the
/// ports published lets ibbus deregister the CA under them; AL destroys ibcm's objects by
/// force, and the next send uses them.
#[test]
fn releasing_the_interface_before_closing_al_is_caught() {
    let mut w = World::new(Mapping::Power, 1);
    w.unbind = vec![Teardown::ClearSteering, Teardown::ReleaseInterface];
    kmdf::start(&mut w, 0);
    connect_both(&mut w, 0);
    kmdf::sleep(&mut w, 0, false);
    w.send_everywhere();
    assert_eq!(w.hung, None);
    assert!(w.stacks[0].ibbus.forced);
    println!("mutant: {:?}", w.violations);
    assert!(
        w.violations
            .iter()
            .any(|v| v.contains("published while its CA is deregistered"))
    );
    assert!(
        w.violations
            .iter()
            .any(|v| v.contains("ib_send_mad on AL objects"))
    );
}
