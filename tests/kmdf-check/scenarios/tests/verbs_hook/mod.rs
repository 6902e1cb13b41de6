//! The QP1 verbs hook (driver/kmdf/verbs_hook.rs) under the HCA's simulated verbs table,
//! on a stock WinOF host where AL's CM holds the CM class's Send on every port:
//! ibbus's `GUID_RDMA_INTERFACE_VERBS` query passes the filter, whose completion routine
//! patches the table before AL copies it (`ibcm_ntos::spl_qp`); AL's special-QP service
//! then creates QP1, posts its receives and polls its receive CQ through the thunks,
//! and the binding's ports take the steering route (`ibcm_qp1_hook::route`: the ordinary
//! registration fails, the table is patched, QP1 is tracked, `{M, Get}` registers).
//! Each CM MAD ibcm owns is remapped to the private method below AL and restored in
//! ibcm's receive callback; everything else reaches AL as it came.

use super::*;
use ibcm_ntos::{hca, spl_qp};

/// The simulated HCA with its verbs table, on a stock WinOF host (AL's CM holds Send).
fn verbs_hca() -> CaConfig {
    CaConfig {
        verbs: true,
        ..hca(true)
    }
}

/// A second such HCA, one port with LID 0x20.
fn second_verbs_hca() -> CaConfig {
    let mut ca = pnp_power::second_hca();
    ca.al_cm_holds_send = true;
    ca.verbs = true;
    ca
}

/// Waits up to 10 s for `cond`.
fn until(what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The HCA `index` of STATUS takes the steering route, ibcm serving its CM queries.
fn steered(file: usize, index: usize) {
    let report = status_report(file);
    let h = &report.hcas[index];
    assert_eq!(
        h.route,
        ibcm_ioctl::status_report::ROUTE_STEERING,
        "the HCA's ports take the verbs hook's steering route"
    );
    assert_eq!(h.cm, ibcm_ioctl::status_report::CM_IBCM);
}

/// A REQ ibcm sent for service 0x5151 to a LID no port has (captured off the wire).
fn captured_req(side: &Binding) -> Vec<u8> {
    let ep = side.endpoint();
    let nowhere = PortConfig {
        port_num: 1,
        lid: 0x77,
        gid: [0; 16],
        pkeys: vec![0xffff],
    };
    side.ok(
        code::CONNECT,
        connect_between(ep, 0x5151, &port(1, 0x10), &nowhere).as_bytes(),
        0,
    );
    until("the REQ on the wire", || !al::sent().is_empty());
    let req = al::take_sent().remove(0).mad;
    assert_eq!((req[1], req[3]), (0x07, 0x03), "a CM Send");
    side.ok(code::DESTROY, handle_in(ep).as_bytes(), 0);
    req
}

/// The REQ arrives at port 2 (LID 0x11) from LID 0x77 on QP1.
fn arrives(req: &[u8]) {
    assert!(
        al::receive(0x11, 0x77, req),
        "QP1 of port 2 had a receive posted"
    );
}

/// AL's CM got `mad` exactly as it was sent (method Send, no byte changed), `n` CM Sends
/// so far.
fn al_cm_got(mad: &[u8], n: usize) {
    until("AL's CM to receive the MAD", || {
        al::al_cm_received().len() >= n
    });
    let got = al::al_cm_received();
    assert_eq!(got.len(), n, "AL's CM received exactly these");
    assert_eq!(got[n - 1].mad, mad, "AL's CM got the MAD untouched");
}

/// A whole connection (REQ, MRA, REP, RTU, REJ, SIDR, DREQ/DREP) between the HCA's ports
/// over QP1 through the hook: every CM MAD is ibcm's, so AL's CM receives none, and no
/// MAD is left without a client.
fn steered_connection(side: &Binding) {
    let before = al::al_cm_received().len();
    connection(side, &port(1, 0x10), side, &port(2, 0x11));
    assert_eq!(
        al::al_cm_received().len(),
        before,
        "every CM MAD of ibcm's was steered to ibcm's private method"
    );
    assert!(
        al::unclaimed().is_empty(),
        "no MAD was left without a client"
    );
}

/// Connect, accept and disconnect over QP1 through the hook, first with AL's one-entry
/// `poll_cq`, then with `poll_cq_array`: the table was patched by the completion routine
/// (the query succeeded, the route is steering), receives are posted to the depth and
/// replaced as they complete, and at removal QP1 and its CQs are destroyed through the
/// thunks and ibbus's verbs reference is released.
pub fn connection_through_the_verbs_hook() {
    let device = boot_on(verbs_hca(), &[]);
    assert_eq!(
        spl_qp::query_status(0),
        Some(0),
        "the HCA answered ibbus's verbs query"
    );
    assert_eq!(hca::references(0), 1, "ibbus holds the verbs interface");
    let file = open(Open::user(Token::ADMIN));
    steered(file, 0);
    let side = Binding(file);
    for poll in [spl_qp::Poll::List, spl_qp::Poll::Array] {
        spl_qp::set_poll(0, poll);
        let polled = spl_qp::completions(hca::IB_WCS_SUCCESS);
        steered_connection(&side);
        assert!(
            spl_qp::completions(hca::IB_WCS_SUCCESS) > polled,
            "AL polled QP1's receives ({poll:?})"
        );
        for port_num in [1, 2] {
            until("the receives replaced", || {
                spl_qp::posted(0, port_num) == Some(16)
            });
        }
    }
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(device);
    assert_eq!(hca::references(0), 0, "ibbus released the verbs interface");
}

/// A REQ for a service ibcm does not listen on reaches AL's CM untouched, a MAD of another
/// class reaches AL's dispatcher untouched; once ibcm listens, the same REQ is steered
/// to ibcm (method restored: the listener's event carries it).
pub fn mads_for_al_pass_untouched() {
    let device = boot_on(verbs_hca(), &[]);
    let file = open(Open::user(Token::ADMIN));
    let side = Binding(file);
    let req = captured_req(&side);
    arrives(&req);
    al_cm_got(&req, 1);
    // A PerfMgt Get (class 0x04, method 0x01): nobody registered it; AL drops it.
    let mut perf = vec![0u8; 256];
    perf[..4].copy_from_slice(&[1, 0x04, 1, 0x01]);
    perf[8..16].copy_from_slice(&0x1234_5678_9abc_def0u64.to_be_bytes());
    assert!(al::receive(0x11, 0x77, &perf));
    until("the PerfMgt MAD at AL's dispatcher", || {
        !al::unclaimed().is_empty()
    });
    assert_eq!(
        al::unclaimed()[0].mad,
        perf,
        "the other class's MAD untouched"
    );
    // ibcm listens on 0x5151: the same REQ is ibcm's now.
    let listener = side.endpoint();
    side.ok(code::LISTEN, listen_in(listener, 0x5151, 8).as_bytes(), 0);
    let wait = get_event(&side, listener);
    arrives(&req);
    let event = event(&side, wait);
    assert_eq!(
        event.event_type,
        event_type::REQ_RECEIVED,
        "the REQ reached ibcm"
    );
    assert_eq!(event.service_id, 0x5151);
    assert_eq!(al::al_cm_received().len(), 1, "AL's CM did not get it");
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(device);
}

/// Receives not in AL's shape (GRH and MAD in two segments; a whole GRH + MAD segment
/// with another after it; one segment crossing a page; one segment too short for a MAD)
/// are not recorded by the hook: a REQ ibcm listens for that lands in one reaches AL
/// untouched (the short one completes with a length error and AL resets QP1 through
/// `modify_qp`, its receives now in AL's shape again). Back in AL's shape, the next one
/// is ibcm's.
pub fn receives_not_in_al_shape_pass_untouched() {
    let device = boot_on(verbs_hca(), &[]);
    let file = open(Open::user(Token::ADMIN));
    let side = Binding(file);
    let req = captured_req(&side);
    let listener = side.endpoint();
    side.ok(code::LISTEN, listen_in(listener, 0x5151, 8).as_bytes(), 0);
    let wait = get_event(&side, listener);
    let mut to_al = 0;
    for shape in [
        spl_qp::Shape::TwoSegments,
        spl_qp::Shape::ExtraSegment,
        spl_qp::Shape::CrossingPage,
    ] {
        spl_qp::set_shape(0, 2, shape);
        spl_qp::reset(0, 2);
        arrives(&req);
        to_al += 1;
        al_cm_got(&req, to_al);
    }
    let errors = spl_qp::completions(hca::IB_WCS_LOCAL_LEN_ERR);
    spl_qp::set_shape(0, 2, spl_qp::Shape::Short);
    spl_qp::reset(0, 2);
    // AL's own reset after the length error posts receives in AL's shape again.
    spl_qp::set_shape(0, 2, spl_qp::Shape::AlMad);
    let resets = spl_qp::resets();
    arrives(&req);
    until("the length error polled and QP1 reset", || {
        spl_qp::completions(hca::IB_WCS_LOCAL_LEN_ERR) > errors && spl_qp::resets() > resets
    });
    assert_eq!(
        al::al_cm_received().len(),
        to_al,
        "the short receive delivered nothing"
    );
    arrives(&req);
    let event = event(&side, wait);
    assert_eq!(
        event.event_type,
        event_type::REQ_RECEIVED,
        "AL's shape: ibcm's again"
    );
    assert_eq!(al::al_cm_received().len(), to_al);
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(device);
}

/// Sleep and wake: QP1 and its CQs are destroyed through the thunks with receives posted
/// when ibbus deregisters the CA; at wake ibbus queries again, the table is patched again
/// (the same HCA entries in the slot), AL makes a new QP1 through the thunks and the
/// ports take the steering route again.
pub fn verbs_hook_across_sleep_and_wake() {
    let device = boot_on(verbs_hca(), &[]);
    let file = open(Open::user(Token::ADMIN));
    let side = Binding(file);
    steered_connection(&side);
    pnp::sleep(device, false);
    assert_eq!(spl_qp::posted(0, 1), None, "QP1 went with the CA");
    assert_eq!(hca::references(0), 0);
    assert_eq!(pnp::wake(device), 0);
    assert_eq!(hca::references(0), 1);
    steered(file, 0);
    steered_connection(&side);
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(device);
}

/// Surprise removal of a card that stopped with QP1's receives posted: the binding
/// unbinds first, then ibbus's deregistration destroys QP1 (its receives never complete)
/// and its CQs through the thunks; the remove IRP follows; nothing leaks.
pub fn verbs_hook_surprise_removal_with_receives_posted() {
    let device = boot_on(verbs_hca(), &[]);
    let file = open(Open::user(Token::ADMIN));
    let side = Binding(file);
    steered_connection(&side);
    assert_eq!(spl_qp::posted(0, 1), Some(16));
    pnp::hardware_gone(device);
    pnp::surprise_remove(device);
    assert_eq!(spl_qp::posted(0, 1), None);
    assert_eq!(hca::references(0), 0);
    io::close(file);
    shutdown(device);
}

/// Two HCAs, each in its own hook slot with its own thunks: a connection between them
/// (both QP1s steered), then the first is removed (its slot's QP1 destroyed), and the
/// second still steers.
pub fn verbs_hook_two_hcas() {
    al::set_cas(vec![verbs_hca(), second_verbs_hca()]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    let first = pnp::add_device(0).expect("the filter attaches to HCA 0");
    let second = pnp::add_device(1).expect("the filter attaches to HCA 1");
    assert_eq!(pnp::start(first), 0);
    assert_eq!(pnp::start(second), 0);
    let file = open(Open::user(Token::ADMIN));
    steered(file, 0);
    steered(file, 1);
    let side = Binding(file);
    let mut other = second_verbs_hca().ports[0].clone();
    other.port_num = 3;
    connection(&side, &port(1, 0x10), &side, &other);
    assert!(
        al::al_cm_received().is_empty(),
        "both HCAs steered ibcm's MADs"
    );
    pnp::remove(first);
    assert_eq!(hca::references(0), 0);
    connection(&side, &other, &side, &other);
    assert!(al::al_cm_received().is_empty());
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(second);
    assert_eq!(hca::references(1), 0);
}

/// WinVerbs, WinMad and ndfltr query `GUID_RDMA_INTERFACE_VERBS` too, with no
/// `InterfaceSpecificData` (version.rs): their table is the HCA's own, every entry as
/// mlx4 filled it, and ibbus's patched table (AL's copy) still steers afterwards.
pub fn other_drivers_verbs_queries_stay_unpatched() {
    let device = boot_on(verbs_hca(), &[]);
    let guid = {
        let g = hca::GUID_RDMA_INTERFACE_VERBS;
        ibcm_ntos::GUID {
            Data1: g.0,
            Data2: g.1,
            Data3: g.2,
            Data4: g.3,
        }
    };
    let size = size_of::<hca::RdmaInterfaceVerbs>() as u16;
    // SAFETY: plain C structures: all-zero is an empty table.
    let mut theirs: Box<hca::RdmaInterfaceVerbs> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: as above.
    let mut hcas: Box<hca::RdmaInterfaceVerbs> = Box::new(unsafe { std::mem::zeroed() });
    let status = io::query_interface(
        device,
        &guid,
        (&raw mut *theirs).cast(),
        size,
        hca::RDMA_INTERFACE_VERBS_VERSION,
    );
    assert_eq!(status, 0, "the HCA answers another driver's query");
    assert_eq!(
        hca::answer_verbs_query(0, CA_GUID, (&raw mut *hcas).cast(), size, 0x0207),
        0
    );
    assert_eq!(
        theirs.verbs.verbs, hcas.verbs.verbs,
        "another driver's table is the HCA's, untouched"
    );
    for t in [&theirs, &hcas] {
        let release = t.header.InterfaceDereference.expect("a dereference");
        // SAFETY: the HCA's dereference with its context, once per answered query.
        unsafe { release(t.header.Context) };
    }
    assert_eq!(hca::references(0), 1, "only ibbus's reference is left");
    let file = open(Open::user(Token::ADMIN));
    steered(file, 0);
    steered_connection(&Binding(file));
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(device);
}

/// A host where AL's CM does not hold Send: ibcm's ordinary registration succeeds, the
/// table is patched all the same (the query comes before any port is bound) and QP1 is
/// tracked, but nothing is steered: every CM MAD reaches ibcm's ordinary service as it
/// came.
pub fn verbs_hook_under_the_ordinary_route() {
    let device = boot_on(
        CaConfig {
            verbs: true,
            ..hca(false)
        },
        &[],
    );
    let file = open(Open::user(Token::ADMIN));
    let report = status_report(file);
    assert_eq!(
        report.hcas[0].route,
        ibcm_ioctl::status_report::ROUTE_ORDINARY
    );
    let side = Binding(file);
    connection(&side, &port(1, 0x10), &side, &port(2, 0x11));
    assert!(al::al_cm_received().is_empty() && al::unclaimed().is_empty());
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(device);
}

/// An HCA driver (and AL) of a build whose `ci_interface_t::version` is not the one the
/// hook was written against: the completion routine leaves ibbus's table as it came and
/// logs why, AL runs QP1 on the HCA's own entries, the HCA has no QP1 route, CM queries
/// go down to AL's CM (the System log says the version is unknown), and a CM Send to the
/// HCA reaches AL's CM untouched.
pub fn verbs_table_of_unknown_version_left_alone() {
    al::set_cas(vec![verbs_hca()]);
    hca::set_verbs_version(0, 0x0002_0008);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    let device = pnp::add_device(0).expect("the filter attaches");
    assert_eq!(pnp::start(device), 0);
    let file = open(Open::user(Token::ADMIN));
    let report = status_report(file);
    assert_eq!(report.hcas[0].route, ibcm_ioctl::status_report::ROUTE_NONE);
    assert_eq!(report.hcas[0].cm, ibcm_ioctl::status_report::CM_AL_NO_ROUTE);
    let size = size_of::<ibcm_iba_cm::abi::InfinibandInterfaceCm>() as u16;
    let (status, ifc) = query_cm_interface(device, size);
    assert_eq!(status, 0);
    assert_eq!(
        ifc.interface_header.version,
        io::AL_CM_MARK,
        "AL's CM answers"
    );
    let log = io::system_log();
    assert!(
        log.iter()
            .any(|(_, strings)| strings.iter().any(|s| s.contains("version is unknown"))),
        "the System log says why the query went down: {log:?}"
    );
    let mut send = vec![0u8; 256];
    send[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    send[8..16].copy_from_slice(&0x0bad_cafe_u64.to_be_bytes());
    assert!(
        al::receive(0x11, 0x77, &send),
        "QP1 receives on the HCA's own entries"
    );
    al_cm_got(&send, 1);
    io::close(file);
    shutdown(device);
}

/// The HCA disabled, its driver reloaded at another address, and enabled again: the
/// removed filter's slot is released with its HCA entries forgotten, so the new filter
/// device, taking the same slot, patches the new table (a slot that kept the old entries
/// would refuse it as "differs" and the HCA would have no route), and the new QP1 is
/// steered.
pub fn verbs_hook_slot_reused_after_disable_enable() {
    let device = boot_on(verbs_hca(), &[]);
    pnp::remove(device);
    assert_eq!(hca::references(0), 0);
    hca::reload_driver(0);
    let device = pnp::add_device(0).expect("the filter attaches again");
    assert_eq!(pnp::start(device), 0);
    assert_eq!(spl_qp::query_status(0), Some(0));
    let file = open(Open::user(Token::ADMIN));
    steered(file, 0);
    steered_connection(&Binding(file));
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(device);
}

/// CM traffic for ibcm arriving on QP1 all through sleep, wake, a rebalance and a
/// surprise removal: polls and steering decisions race the unbind (steering cleared,
/// ports unpublished, AL closed) and AL's destruction of QP1 through the thunks; no
/// verifier rule fires (IRQL, spin-lock order, pool) and nothing leaks at unload.
pub fn verbs_hook_traffic_across_power_changes() {
    let device = boot_on(verbs_hca(), &[]);
    let file = open(Open::user(Token::ADMIN));
    let side = Binding(file);
    let req = captured_req(&side);
    let listener = side.endpoint();
    side.ok(code::LISTEN, listen_in(listener, 0x5151, 64).as_bytes(), 0);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pump = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // A new local comm ID each time (CM data offset 0): a new REQ.
                let mut mad = req.clone();
                n += 1;
                mad[24..28].copy_from_slice(&(0x7000_0000 | n).to_be_bytes());
                mad[8..16].copy_from_slice(&u64::from(n).to_be_bytes());
                al::receive(0x11, 0x77, &mad);
                std::thread::sleep(Duration::from_micros(200));
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    pnp::sleep(device, false);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(pnp::wake(device), 0);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(pnp::rebalance(device), 0);
    std::thread::sleep(Duration::from_millis(100));
    pnp::surprise_remove(device);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = pump.join().expect("the pump ends");
    assert!(sent > 100, "REQs kept arriving ({sent})");
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(device);
}

/// The kill switch (`Disabled`, docs/windows.md "Turning ibcm off": "as without ibcm")
/// leaves ibbus's verbs table as the HCA filled it: AL's QP1 runs on the HCA's own
/// entries, none of ibcm's code is in its path, and a CM Send reaches AL's CM. Cleared,
/// the next start (ibbus queries again) patches the table and the ports are steered.
pub fn kill_switch_leaves_the_verbs_table_alone() {
    registry::set("Disabled", 1);
    let device = boot_on(verbs_hca(), &[]);
    assert_eq!(
        spl_qp::al_entries(0),
        Some(hca::own_entries(0)),
        "switched off: AL's copy of the verbs table is the HCA's own"
    );
    let mut send = vec![0u8; 256];
    send[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    assert!(al::receive(0x11, 0x77, &send));
    al_cm_got(&send, 1);
    registry::set("Disabled", 0);
    assert_eq!(pnp::rebalance(device), 0);
    assert_ne!(
        spl_qp::al_entries(0),
        Some(hca::own_entries(0)),
        "switched on again: the next start patches the table"
    );
    let file = open(Open::user(Token::ADMIN));
    steered(file, 0);
    steered_connection(&Binding(file));
    io::close(file);
    until("every MAD element back", || al::elements_held() == 0);
    shutdown(device);
}
