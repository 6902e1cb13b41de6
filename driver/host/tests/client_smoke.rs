//! The kernel-client interface between two host nodes, in virtual time.

use std::sync::{Arc, Mutex};

use ibcm_cep::{Event, ListenParams};
use ibcm_endpoint::{ClientEvent, ClientId, Device};
use ibcm_host::{Fabric, HostPlatform, node_address};

type Log = Arc<Mutex<Vec<(ClientId, &'static str)>>>;

fn name(e: &Event) -> &'static str {
    match e {
        Event::ReqReceived(_) => "req",
        Event::RepReceived(_) => "rep",
        Event::RtuReceived(_) => "rtu",
        Event::DreqReceived(_) => "dreq",
        Event::DrepReceived(_) => "drep",
        Event::TimewaitExit => "exit",
        _ => "other",
    }
}

fn recorder(log: &Log) -> ibcm_endpoint::Callback<HostPlatform> {
    let log = Arc::clone(log);
    Arc::new(
        move |_dev: &Device<HostPlatform>, id: ClientId, ev: &ClientEvent| {
            log.lock().unwrap().push((id, name(&ev.event)));
            0
        },
    )
}

#[test]
fn connect_accept_disconnect_through_callbacks() {
    let mut fabric = Fabric::new(2, 3);
    let (a, b) = (Arc::clone(&fabric.nodes[0]), Arc::clone(&fabric.nodes[1]));
    // Preallocated: callbacks run at DISPATCH_LEVEL, where allocation is flagged.
    let log: Log = Arc::new(Mutex::new(Vec::with_capacity(64)));
    let listen = b.device.create_id(recorder(&log)).unwrap();
    b.device
        .listen_id(
            listen,
            ListenParams {
                service_id: 7,
                service_mask: u64::MAX,
                port: None,
                compare: None,
                backlog: 4,
            },
        )
        .unwrap();
    let active = a.device.create_id(recorder(&log)).unwrap();
    let mut p = ibcm_cep::pair::Pair::connect_params(7, 0x11);
    let (sa, sb) = (node_address(0), node_address(1));
    p.primary_path.slid = sa.lid;
    p.primary_path.dlid = sb.lid;
    p.primary_path.sgid = sa.gid;
    p.primary_path.dgid = sb.gid;
    a.device.send_req(active, &p).unwrap();
    fabric.run_for(100_000);
    let (child, event) = b
        .device
        .get_request_ex(listen, recorder(&log))
        .expect("a request");
    assert!(matches!(event, Event::ReqReceived(_)));
    b.device
        .send_rep(child, &ibcm_cep::pair::Pair::rep_params(0x22))
        .unwrap();
    fabric.run_for(100_000);
    a.device.send_rtu(active, b"").unwrap();
    fabric.run_for(100_000);
    a.device.send_dreq(active, b"").unwrap();
    fabric.run_for(100_000);
    b.device.send_drep(child, b"").unwrap();
    fabric.run_for(60_000_000_000);
    let got = log.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![
            (listen, "req"),
            (active, "rep"),
            (child, "rtu"),
            (child, "dreq"),
            (active, "drep"),
            (active, "exit"),
            (child, "exit"),
        ]
    );
    for (n, id) in [(&a, active), (&b, child), (&b, listen)] {
        n.device.destroy_id(id);
    }
    assert_eq!(a.device.client_count() + b.device.client_count(), 0);
    fabric.run_for(60_000_000_000);
    assert_eq!(a.device.with_engine(|cm| cm.live_ceps()), 0);
    assert_eq!(b.device.with_engine(|cm| cm.live_ceps()), 0);
    assert_eq!((a.violations(), b.violations()), (vec![], vec![]));
}

/// Found by the `iba_cm` fuzz target (fixed mode, as `iba_cm` runs the device): the
/// owner table covered live + the room asked for, but the engine reuses a CEP slot only
/// once `REUSE_AFTER` are free, so after a few dozen short-lived CEPs a new one's index
/// fell outside the table and `create_id` failed with `NoResources` on an idle device.
#[test]
fn fixed_mode_create_and_destroy_never_run_out() {
    let fabric = Fabric::new(1, 4);
    let d = &fabric.nodes[0].device;
    let log: Log = Arc::new(Mutex::new(Vec::with_capacity(64)));
    d.reserve_clients(8, 2, 4, 4).unwrap();
    for i in 0..400 {
        let id = d
            .create_id(recorder(&log))
            .unwrap_or_else(|e| panic!("create_id {i}: {e:?}"));
        d.destroy_id(id);
        // iba_cm tops the room up after every destroy at PASSIVE_LEVEL.
        d.reserve_clients(8, 2, 4, 4).unwrap();
    }
    assert_eq!(d.client_count(), 0);
}

/// A kernel client whose callback runs raised, as every iba_cm callback does
/// (`Instance::call_client` in driver/iba-cm), and destroys its own id from inside it,
/// when the delivery began at PASSIVE_LEVEL: the port's removal from the HCA's PnP
/// thread (`Device::remove_port`). Inside the callback the identity is the processor's,
/// where the delivery took the thread's; without `as_deliverer` the `destroy_id` took
/// itself for another context and waited for its own callback forever (issue 27's
/// review, H1). Now it is deferred and done when the callback returns.
#[test]
fn destroy_from_a_raised_callback_of_a_passive_delivery_is_deferred() {
    let mut fabric = Fabric::new(2, 27);
    let (a, b) = (Arc::clone(&fabric.nodes[0]), Arc::clone(&fabric.nodes[1]));
    let log: Log = Arc::new(Mutex::new(Vec::with_capacity(64)));
    let listen = b.device.create_id(recorder(&log)).unwrap();
    b.device
        .listen_id(
            listen,
            ListenParams {
                service_id: 9,
                service_mask: u64::MAX,
                port: None,
                compare: None,
                backlog: 4,
            },
        )
        .unwrap();
    // A's id: on the port's removal, destroy itself from inside its raised callback.
    let destroyed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let on_event: ibcm_endpoint::Callback<HostPlatform> = {
        let (node, destroyed) = (Arc::clone(&a), Arc::clone(&destroyed));
        Arc::new(
            move |dev: &Device<HostPlatform>, id: ClientId, ev: &ClientEvent| {
                if matches!(ev.event, Event::DeviceRemoval) {
                    ibcm_host::verifier::at_dispatch(&node.platform.ledger, || {
                        dev.as_deliverer(id, || dev.destroy_id(id));
                    });
                    destroyed.store(true, std::sync::atomic::Ordering::Release);
                }
                0
            },
        )
    };
    let active = a.device.create_id(on_event).unwrap();
    let mut p = ibcm_cep::pair::Pair::connect_params(9, 0x11);
    let (sa, sb) = (node_address(0), node_address(1));
    p.primary_path.slid = sa.lid;
    p.primary_path.dlid = sb.lid;
    p.primary_path.sgid = sa.gid;
    p.primary_path.dgid = sb.gid;
    a.device.send_req(active, &p).unwrap();
    fabric.run_for(100_000);
    let (child, _) = b
        .device
        .get_request_ex(listen, recorder(&log))
        .expect("a request");
    b.device
        .send_rep(child, &ibcm_cep::pair::Pair::rep_params(0x22))
        .unwrap();
    fabric.run_for(100_000);
    a.device.send_rtu(active, b"").unwrap();
    fabric.run_for(100_000);

    // The removal, at PASSIVE_LEVEL, on a thread of its own: a hang fails the test
    // instead of stopping it.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let remover = Arc::clone(&a);
    std::thread::spawn(move || {
        remover.device.remove_port(sa.port);
        let _ = done_tx.send(());
    });
    assert!(
        done_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .is_ok(),
        "destroy_id inside its own raised callback waited for itself"
    );
    assert!(destroyed.load(std::sync::atomic::Ordering::Acquire));
    assert_eq!(a.device.client_count(), 0, "A's id was not destroyed");
    let v = a.violations();
    assert!(v.is_empty(), "verifier: {v:?}");
    for id in [child, listen] {
        b.device.destroy_id(id);
    }
    fabric.run_for(60_000_000_000);
}

/// Identities inside callback-free downcalls past the room `reserve_clients` made (64):
/// the list of them never grows under the lock (at DISPATCH_LEVEL a growth is an
/// allocation that cannot fail gracefully); past the room they are counted instead.
#[test]
fn callback_free_downcalls_past_the_reserved_room_grow_nothing() {
    let fabric = Fabric::new(2, 1);
    let d = &fabric.nodes[0].device;
    d.reserve_clients(8, 2, 4, 4).unwrap();
    let before = d.memory().clients;
    fn nest(d: &Device<HostPlatform>, depth: usize) {
        if depth > 0 {
            d.without_client_callbacks(|| nest(d, depth - 1));
        }
    }
    nest(d, 100);
    assert_eq!(
        d.memory().clients,
        before,
        "the list of delivering identities grew under the lock"
    );
}
