//! The filter through what Windows and ibbus do to an HCA's stack, in the order of
//! `driver/lifecycle/tests/model/kmdf.rs` (the simulated PnP manager, `ibcm_ntos::pnp`):
//! sleep, hibernation and resume; resource rebalance; surprise removal from D0 and from
//! Dx; two HCAs; an HCA starting while the last one's teardown waits for a kernel client;
//! a stale `\\.\ibcm` handle kept across a disable and enable. Wherever ibbus deregisters
//! the CA it first waits for every reference of ibcm's on its interfaces
//! (`al::deregister_ca`, bus_pnp.c:790-829): a reference left is a verifier stop.

use super::*;

/// The second simulated HCA (host order), one port with LID 0x20.
pub const CA_GUID_2: u64 = 0x0002_c903_0000_2000;

pub fn second_hca() -> CaConfig {
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[8..].copy_from_slice(&(CA_GUID_2 + 1).to_be_bytes());
    CaConfig {
        ca_guid: CA_GUID_2,
        ports: vec![PortConfig {
            port_num: 1,
            lid: 0x20,
            gid,
            pkeys: vec![0xffff],
        }],
        al_cm_holds_send: false,
        verbs: false,
    }
}

/// STATUS through `file`: (HCAs, ports) ibcm serves.
fn served(file: usize) -> (u32, u32) {
    let report = status_report(file);
    (report.hca_count, report.port_count)
}

/// An endpoint whose REQ went to a LID no simulated port has (the MAD is captured, no
/// answer comes), with a GET_EVENT pending on it.
fn connecting(side: &Binding) -> u64 {
    let ep = side.endpoint();
    let nowhere = PortConfig {
        port_num: 1,
        lid: 0x77,
        gid: [0; 16],
        pkeys: vec![0xffff],
    };
    let wait = get_event(side, ep);
    side.ok(
        code::CONNECT,
        connect_between(ep, 0x5151, &port(1, 0x10), &nowhere).as_bytes(),
        0,
    );
    wait
}

/// The connection attempt ended with DEVICE_REMOVAL when its port went.
fn ended_by_removal(side: &Binding, wait: u64) {
    assert_eq!(
        event(side, wait).event_type,
        event_type::DEVICE_REMOVAL,
        "the endpoint hears that its port went"
    );
}

/// Sleep (S3) and hibernation (S4) with a connection attempt in flight, then resume: each
/// D0Exit ends the HCA's connections (DEVICE_REMOVAL) and releases ibbus's interface
/// before the Dx IRP reaches ibbus; the listen and the handle survive; after D0Entry the
/// HCA is served again and a whole connection runs between its ports.
pub fn sleep_hibernate_and_resume() {
    let device = boot(&[]);
    let file = open(Open::user(Token::ADMIN));
    let side = Binding(file);
    let (a, b) = (port(1, 0x10), port(2, 0x11));
    for hibernate in [false, true] {
        let wait = connecting(&side);
        pnp::sleep(device, hibernate);
        ended_by_removal(&side, wait);
        assert_eq!(
            served(file),
            (1, 0),
            "the HCA is listed, without ports, while it sleeps"
        );
        assert_eq!(pnp::wake(device), 0, "D0Entry never fails the HCA");
        assert_eq!(served(file), (1, 2), "both ports again after resume");
        connection(&side, &a, &side, &b);
    }
    io::close(file);
    shutdown(device);
}

/// Resource rebalance (IRP_MN_STOP_DEVICE, then IRP_MN_START_DEVICE): D0Exit to D3Final
/// before the stop reaches ibbus, D0Entry after the start; connections work again.
pub fn rebalance_stop_and_start() {
    let device = boot(&[]);
    let file = open(Open::user(Token::ADMIN));
    let side = Binding(file);
    let wait = connecting(&side);
    assert_eq!(pnp::rebalance(device), 0);
    ended_by_removal(&side, wait);
    assert_eq!(served(file), (1, 2));
    connection(&side, &port(1, 0x10), &side, &port(2, 0x11));
    io::close(file);
    shutdown(device);
}

/// Surprise removal of an HCA in D0 with a REQ in flight: EvtDeviceSurpriseRemoval unbinds
/// before ibbus sees the IRP, the endpoint hears DEVICE_REMOVAL, the remove IRP deletes
/// the filter, and the control device goes with the last one.
pub fn surprise_removal_from_d0() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    let side = Binding(file);
    let wait = connecting(&side);
    pnp::surprise_remove(device);
    ended_by_removal(&side, wait);
    io::close(file);
    shutdown(device);
}

/// An HCA that never returns from a sleep: it is surprise-removed while in Dx (only the
/// callback runs, nothing is bound), then removed; the host goes, nothing leaks.
pub fn hca_never_returns_from_sleep() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    let side = Binding(file);
    let wait = connecting(&side);
    pnp::sleep(device, false);
    ended_by_removal(&side, wait);
    pnp::surprise_remove(device);
    io::close(file);
    shutdown(device);
}

/// Two HCAs under one host CM: a connection between them, then the first is removed (its
/// ports go, the host and the other HCA stay), then the second (the host goes).
pub fn two_hcas() {
    al::set_cas(vec![hca(false), second_hca()]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    let first = pnp::add_device(0).expect("the filter attaches to HCA 0");
    let second = pnp::add_device(1).expect("the filter attaches to HCA 1");
    assert_eq!(pnp::start(first), 0);
    assert_eq!(pnp::start(second), 0);
    let file = open(Open::user(Token::ADMIN));
    let side = Binding(file);
    assert_eq!(served(file), (2, 3));
    // CONNECT names the host's port number: the first HCA's ports are 1 and 2, the
    // second's port 1 is the host's 3 (assigned in the order the HCAs bound).
    let mut other = second_hca().ports[0].clone();
    other.port_num = 3;
    connection(&side, &port(1, 0x10), &side, &other);
    pnp::remove(first);
    assert_eq!(served(file), (1, 1), "the second HCA is still served");
    connection(&side, &other, &side, &other);
    io::close(file);
    shutdown(second);
}

/// A `\\.\ibcm` handle kept open while the only HCA is disabled and enabled again: the new
/// control device takes opens at once (the stale one's name and link are gone), the
/// stale handle still completes what it sends, and closing it frees the old host only.
pub fn stale_handle_across_disable_enable() {
    let device = boot(&[]);
    let stale = open(Open::user(Token::USER));
    let handle = create(stale).expect("an endpoint");
    pnp::remove(device);
    let device = pnp::add_device(0).expect("the filter attaches again");
    assert_eq!(pnp::start(device), 0);
    let fresh = io::open(LINK, Open::user(Token::USER))
        .expect("a new handle reaches the new control device while the stale one is open");
    assert_eq!(version(fresh), status::SUCCESS);
    let (s, _) = complete(io::ioctl(
        stale,
        code::DESTROY,
        handle_in(handle).as_bytes(),
        0,
    ));
    assert_ne!(s, status::PENDING, "the stale handle's IOCTL completes");
    io::close(stale);
    assert_eq!(served(fresh), (1, 2), "the new host serves the HCA");
    let side = Binding(fresh);
    connection(&side, &port(1, 0x10), &side, &port(2, 0x11));
    io::close(fresh);
    shutdown(device);
}

/// An HCA that starts while the last filter's cleanup waits for a kernel client to drop
/// its `iba_cm` reference: once the teardown ends, the new HCA is bound and served.
pub fn hca_starting_during_last_teardown() {
    let device = boot(&[]);
    let size = size_of::<ibcm_iba_cm::abi::InfinibandInterfaceCm>() as u16;
    let (st, client) = query_cm_interface(device, size);
    assert_eq!(st, 0, "a kernel client holds ibcm's CM");
    let removal = std::thread::spawn(move || pnp::remove(device));
    // The removal's teardown is waiting for the client's reference.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!removal.is_finished(), "the teardown waits for the client");
    let next = pnp::add_device(0).expect("the filter attaches");
    assert_eq!(pnp::start(next), 0);
    release_cm_interface(&client);
    removal.join().expect("the removal ends");
    let file = open(Open::user(Token::USER));
    assert_eq!(
        served(file),
        (1, 2),
        "the HCA that started meanwhile is bound"
    );
    io::close(file);
    shutdown(next);
}

/// Surprise removal of an HCA whose hardware stopped with a CM MAD in flight (the REQ
/// posted after it stopped is never completed by the HCA): EvtDeviceSurpriseRemoval's
/// `ib_close_al` waits for the send, which completes only when ibbus deregisters the CA,
/// which ibbus does only after this filter released its interface reference
/// (bus_pnp.c:896, 911), after `ib_close_al`. AL ends the wait with its timeout and forces
/// the destruction (al_common.c `sync_destroy_obj`); ibcm cannot order this away (the
/// reference must go before the IRP reaches ibbus, AL must be closed before the reference
/// goes, and `ib_cancel_mad` leaves a posted send alone: al_mad.c `__check_send_queue`
/// skips an active send). The late completion then comes to the port that was the
/// send's context: the binding parks such ports (and their binding) until their last
/// send returns, so it finds them alive (AddressSanitizer would report a use after free)
/// and frees them; nothing leaks.
pub fn surprise_removal_with_a_send_in_flight() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    let side = Binding(file);
    pnp::hardware_gone(device);
    let _wait = connecting(&side);
    pnp::surprise_remove(device);
    assert_eq!(al::forced_destroys(), 1, "AL forced ib_close_al's end");
    // The flushed completion runs on a processor thread.
    let until = Instant::now() + Duration::from_secs(5);
    while al::elements_held() > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        al::elements_held(),
        0,
        "the late completion returned its element"
    );
    io::close(file);
    shutdown(device);
}

/// The subnet manager adds a partition while the ports come up: AL reports no P_Key
/// change below Armed (al_pnp.c:1433-1440), only IB_PNP_PORT_ACTIVE with the tables as
/// they are now (:486-497). The binding takes them from that record, so a connection on
/// the new partition goes out (with the tables of PORT_ADD, its REQ was dropped as
/// "no such P_Key").
pub fn a_partition_added_while_the_port_came_up_is_used() {
    let device = boot(&[]);
    let partition = 0x8001;
    for port_num in [1, 2] {
        al::port_active(0, port_num, vec![0xffff, partition]);
    }
    let file = open(Open::user(Token::ADMIN));
    let listener = create(file).expect("an endpoint");
    let listen = listen_in(listener, 0x1000_0000_0000_8001, 8);
    assert_eq!(
        complete(ioctl(file, code::LISTEN, &listen, 0)).0,
        status::SUCCESS
    );
    let event = ioctl(file, code::GET_EVENT, &handle_in(listener), 4096);
    let client = create(file).expect("an endpoint");
    let mut connect = connect_between(client, listen.service_id, &port(1, 0x10), &port(2, 0x11));
    connect.pkey = partition;
    let (s, _) = complete(ioctl(file, code::CONNECT, &connect, 0));
    assert!(
        s == status::SUCCESS || s == status::PENDING,
        "CONNECT: {s:#x}"
    );
    let (s, _) = io::wait_for(event, Duration::from_secs(5))
        .expect("the REQ on the new partition reaches the listen");
    assert_eq!(s, status::SUCCESS);
    io::close(file);
    let until = Instant::now() + Duration::from_secs(5);
    while al::elements_held() > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    shutdown(device);
}
