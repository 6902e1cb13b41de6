//! Kernel clients (the `iba_cm` interface's endpoints, driver/endpoint's client.rs) when
//! the link flaps for longer than their connections' deadline (issue 29 #3,
//! driver/cep/src/manager/link.rs): K established connections and M REQs just sent,
//! between two host nodes in virtual time; both ports go down. Nothing is told at once;
//! each endpoint's callback hears exactly one event - the established ones on both sides
//! the DREQ once their QPs would have given up (which driver/iba-cm hands WinVerbs and ND
//! as `iba_cm_dreq_received`, the event both act on while connected: wv_ep.c:546-551,
//! nd_ep.cpp:714-727), the REQs in flight their timeout as their retries run out
//! (`iba_cm_req_error`: wv_ep.c:511-518, nd_ep.cpp:862-863) - and no MAD leaves either
//! node. Half the clients answer inside their callback, during the delivery (as ND's
//! NdEpActiveDisconnect does, nd_ep.cpp:736-741), half afterwards. Their timewait waits
//! for the ports (the DREQs they owe); once the ports are back the connections end with
//! their exit, the listen that stayed takes all K again, nothing is left behind and the
//! verifiers are clean.

use std::sync::{Arc, Mutex};

use ibcm_cep::pair::Pair;
use ibcm_cep::{Event, ListenParams};
use ibcm_endpoint::{Callback, ClientEvent, ClientId, Device};
use ibcm_host::{Fabric, HostPlatform, node_address};

const K: usize = 200;
const M: usize = 20;
const SERVICE: u64 = 0x2903;

type Log = Arc<Mutex<Vec<(ClientId, &'static str)>>>;

fn name(e: &Event) -> &'static str {
    match e {
        Event::ReqReceived(_) => "req",
        Event::RepReceived(_) => "rep",
        Event::RtuReceived(_) => "rtu",
        Event::DreqReceived(_) => "dreq",
        Event::DrepReceived(_) => "drep",
        Event::Timeout { .. } => "timeout",
        Event::TimewaitExit => "exit",
        Event::DeviceRemoval => "removal",
        _ => "other",
    }
}

fn recorder(log: &Log) -> Callback<HostPlatform> {
    let log = Arc::clone(log);
    Arc::new(
        move |_dev: &Device<HostPlatform>, id: ClientId, ev: &ClientEvent| {
            log.lock().unwrap().push((id, name(&ev.event)));
            0
        },
    )
}

/// A recorder that answers a DREQ with its DREP inside the callback.
fn answerer(log: &Log) -> Callback<HostPlatform> {
    let log = Arc::clone(log);
    Arc::new(
        move |dev: &Device<HostPlatform>, id: ClientId, ev: &ClientEvent| {
            log.lock().unwrap().push((id, name(&ev.event)));
            if matches!(ev.event, Event::DreqReceived(_)) {
                assert_eq!(dev.send_drep(id, b""), Ok(()));
            }
            0
        },
    )
}

fn params(qpn: u32) -> ibcm_cep::ConnectParams<'static> {
    let mut p = Pair::connect_params(SERVICE, qpn);
    let (sa, sb) = (node_address(0), node_address(1));
    p.primary_path.slid = sa.lid;
    p.primary_path.dlid = sb.lid;
    p.primary_path.sgid = sa.gid;
    p.primary_path.dgid = sb.gid;
    p
}

/// Connects K client ids of A to B's listen; returns (A's ids, B's ids). Each node's ids
/// log to their node's log (the two number their ids alike).
fn connect(
    fabric: &mut Fabric,
    listen: ClientId,
    logs: &[Log; 2],
) -> (Vec<ClientId>, Vec<ClientId>) {
    let [log_a, log_b] = logs;
    let (a, b) = (Arc::clone(&fabric.nodes[0]), Arc::clone(&fabric.nodes[1]));
    let active: Vec<ClientId> = (0..K)
        .map(|k| {
            let cb = if k % 2 == 0 {
                answerer(log_a)
            } else {
                recorder(log_a)
            };
            let id = a.device.create_id(cb).unwrap();
            a.device.send_req(id, &params(0x100 + k as u32)).unwrap();
            id
        })
        .collect();
    fabric.run_for(1_000_000);
    let passive: Vec<ClientId> = (0..K)
        .map(|k| {
            let cb = if k % 2 == 0 {
                answerer(log_b)
            } else {
                recorder(log_b)
            };
            let (id, _) = b.device.get_request_ex(listen, cb).unwrap();
            b.device
                .send_rep(id, &Pair::rep_params(0x9000 + k as u32))
                .unwrap();
            id
        })
        .collect();
    fabric.run_for(1_000_000);
    for &id in &active {
        a.device.send_rtu(id, b"").unwrap();
    }
    fabric.run_for(1_000_000);
    (active, passive)
}

fn events_of(log: &Log, from: usize, id: ClientId) -> Vec<&'static str> {
    log.lock().unwrap()[from..]
        .iter()
        .filter(|(i, _)| *i == id)
        .map(|(_, e)| *e)
        .collect()
}

#[test]
fn every_kernel_client_is_told_once_when_the_link_flaps() {
    let mut fabric = Fabric::new(2, 29);
    let (a, b) = (Arc::clone(&fabric.nodes[0]), Arc::clone(&fabric.nodes[1]));
    // Preallocated: callbacks run at DISPATCH_LEVEL, where allocation is flagged.
    let logs: [Log; 2] = [(); 2].map(|_| Arc::new(Mutex::new(Vec::with_capacity(8 * (K + M)))));
    let [log_a, log_b] = &logs;
    let listen = b.device.create_id(recorder(log_b)).unwrap();
    let listen_params = ListenParams {
        service_id: SERVICE,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: (K + M) as u32,
    };
    b.device.listen_id(listen, listen_params).unwrap();
    let (active, passive) = connect(&mut fabric, listen, &logs);
    // M more REQs, sent as the cable is pulled: they never leave.
    let pending: Vec<ClientId> = (0..M)
        .map(|k| {
            let id = a.device.create_id(recorder(log_a)).unwrap();
            a.device.send_req(id, &params(0x800 + k as u32)).unwrap();
            id
        })
        .collect();

    let from = [log_a, log_b].map(|l| l.lock().unwrap().len());
    let sent =
        |d: &Device<HostPlatform>| -> u64 { d.with_engine(|cm| cm.counters().sent.iter().sum()) };
    let sent_before = (sent(&a.device), sent(&b.device));
    fabric.set_port_up(0, false);
    fabric.set_port_up(1, false);
    let told = |ids: &[ClientId], side: usize, want: &[&str]| {
        for &id in ids {
            assert_eq!(events_of(&logs[side], from[side], id), want, "{id:?}");
        }
    };
    // At once: nothing (handshakes retry, connections wait for their deadline).
    told(&active, 0, &[]);
    told(&passive, 1, &[]);
    told(&pending, 0, &[]);
    // Past every deadline and retry budget: each told once.
    fabric.run_for(20_000_000_000);
    told(&active, 0, &["dreq"]);
    told(&passive, 1, &["dreq"]);
    told(&pending, 0, &["timeout"]);
    told(&[listen], 1, &[]);

    // The other half answer now (as WinVerbs and ND do on their disconnect). Their
    // timewait waits for the ports: each owes its peer a DREQ.
    for &id in active.iter().skip(1).step_by(2) {
        a.device.send_drep(id, b"").unwrap();
    }
    for &id in passive.iter().skip(1).step_by(2) {
        b.device.send_drep(id, b"").unwrap();
    }
    fabric.run_for(60_000_000_000);
    assert_eq!((sent(&a.device), sent(&b.device)), sent_before);
    told(&active, 0, &["dreq"]);
    told(&passive, 1, &["dreq"]);
    told(&pending, 0, &["timeout"]);
    // While down, a REQ from the port is refused.
    let probe = a.device.create_id(recorder(log_a)).unwrap();
    assert_eq!(
        a.device.send_req(probe, &params(0x77)),
        Err(ibcm_cep::CmError::PortDown { port: 1 })
    );
    // The ports come back: the owed DREQs go out, each answered; timewait ends.
    fabric.set_port_up(0, true);
    fabric.set_port_up(1, true);
    fabric.run_for(10_000_000_000);
    told(&active, 0, &["dreq", "exit"]);
    told(&passive, 1, &["dreq", "exit"]);
    for &id in active.iter().chain(&pending).chain([&probe]) {
        a.device.destroy_id(id);
    }
    for &id in &passive {
        b.device.destroy_id(id);
    }
    fabric.run_for(1_000_000);
    assert_eq!(a.device.client_count(), 0);
    assert_eq!(b.device.client_count(), 1, "the listen");
    assert_eq!(a.device.with_engine(|cm| cm.live_ceps()), 0);
    assert_eq!(b.device.with_engine(|cm| cm.live_ceps()), 1);

    // The listen that stayed takes all K again, from the same QPNs.
    let (again, accepted) = connect(&mut fabric, listen, &logs);
    for &id in &again {
        assert_eq!(
            a.device.query_id(id).unwrap().state,
            ibcm_cep::StateName::Established
        );
    }
    for &id in &accepted {
        assert_eq!(
            b.device.query_id(id).unwrap().state,
            ibcm_cep::StateName::Established
        );
    }
    for node in [&a, &b] {
        let v = node.violations();
        assert!(v.is_empty(), "verifier: {:?}", &v[..v.len().min(10)]);
    }
}

/// HCA removal as AL reports it: DOWN, then REMOVE (`__pnp_process_remove_port`,
/// al_pnp.c:1022-1036). The DOWN ends nothing, so each kernel client hears exactly one
/// event, the removal (review finding 5: two events before), even past the deadline.
#[test]
fn hca_removal_after_port_down_tells_each_client_once() {
    let mut fabric = Fabric::new(2, 31);
    let (a, b) = (Arc::clone(&fabric.nodes[0]), Arc::clone(&fabric.nodes[1]));
    let logs: [Log; 2] = [(); 2].map(|_| Arc::new(Mutex::new(Vec::with_capacity(8 * K))));
    let [log_a, log_b] = &logs;
    let listen = b.device.create_id(recorder(log_b)).unwrap();
    let listen_params = ListenParams {
        service_id: SERVICE,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: K as u32,
    };
    b.device.listen_id(listen, listen_params).unwrap();
    let (active, _passive) = connect(&mut fabric, listen, &logs);
    let from = log_a.lock().unwrap().len();
    fabric.set_port_up(0, false);
    a.device.remove();
    fabric.run_for(20_000_000_000);
    for &id in &active {
        assert_eq!(events_of(log_a, from, id), ["removal"], "{id:?}");
    }
    for &id in &active {
        a.device.destroy_id(id);
    }
    fabric.run_for(1_000_000);
    assert_eq!(a.device.with_engine(|cm| cm.live_ceps()), 0);
}
