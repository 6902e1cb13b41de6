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
