//! Two CMs on one port, as on a WinOF host (issue #19): ibcm's engine and a stand-in for
//! AL's CM share node 1's address ([`Fabric::share_port`]), every MAD to it steered by
//! ibcm's `CmManager::owner_of`. A peer (node 0) connects to a service of each, and each
//! connects to the peer's: every connection establishes and ends on the CM it belongs to,
//! and the steering counts show which MADs went where.

use std::sync::{Arc, Mutex};

use ibcm_cep::pair::Pair;
use ibcm_cep::{ConnectParams, Event, ListenParams};
use ibcm_endpoint::{ClientEvent, ClientId, Device};
use ibcm_host::{Fabric, HostPlatform, Node, STEER_ROWS, SharedPort, SteerCounts, node_address};
use ibcm_mad::{AttributeId, RejReason};

const IBCM_SID: u64 = 0x1000;
const AL_SID: u64 = 0x2000;
const PEER_SID: u64 = 0x4000;
/// A long run of virtual time: past every retry and timewait.
const SETTLE_NS: u64 = 60_000_000_000;

type Log = Arc<Mutex<Vec<(ClientId, String)>>>;

fn name(e: &Event) -> String {
    match e {
        Event::ReqReceived(_) => "req".into(),
        Event::RepReceived(_) => "rep".into(),
        Event::RtuReceived(_) => "rtu".into(),
        Event::DreqReceived(_) => "dreq".into(),
        Event::DrepReceived(_) => "drep".into(),
        Event::Rejected { reason, .. } => format!("rej {}", u16::from(*reason)),
        Event::TimewaitExit => "exit".into(),
        other => format!("{other:?}"),
    }
}

fn log() -> Log {
    // Preallocated: callbacks run at DISPATCH_LEVEL, where allocation is flagged.
    Arc::new(Mutex::new(Vec::with_capacity(64)))
}

fn recorder(log: &Log) -> ibcm_endpoint::Callback<HostPlatform> {
    let log = Arc::clone(log);
    Arc::new(
        move |_dev: &Device<HostPlatform>, id: ClientId, ev: &ClientEvent| {
            // The event's name is the harness's, not the driver's allocation.
            allocation_counter::opt_out(|| log.lock().unwrap().push((id, name(&ev.event))));
            0
        },
    )
}

fn events(log: &Log) -> Vec<(ClientId, String)> {
    log.lock().unwrap().clone()
}

fn listen(node: &Node, log: &Log, service_id: u64) -> ClientId {
    let l = node.device.create_id(recorder(log)).unwrap();
    node.device
        .listen_id(
            l,
            ListenParams {
                service_id,
                service_mask: u64::MAX,
                port: None,
                compare: None,
                backlog: 4,
            },
        )
        .unwrap();
    l
}

/// Connect parameters from node `from` to node `to` (node 1 is the shared port).
fn params(from: usize, to: usize, service_id: u64, qpn: u32) -> ConnectParams<'static> {
    let mut p = Pair::connect_params(service_id, qpn);
    let (a, b) = (node_address(from), node_address(to));
    p.primary_path.slid = a.lid;
    p.primary_path.dlid = b.lid;
    p.primary_path.sgid = a.gid;
    p.primary_path.dgid = b.gid;
    p
}

fn connect(node: &Node, log: &Log, p: &ConnectParams<'_>) -> ClientId {
    let id = node.device.create_id(recorder(log)).unwrap();
    node.device.send_req(id, p).unwrap();
    id
}

/// The counts with `rows` (attribute, count) set and every other row 0.
fn table(rows: &[(AttributeId, u64)]) -> [u64; STEER_ROWS] {
    let mut t = [0; STEER_ROWS];
    for &(a, n) in rows {
        t[SteerCounts::row(u16::from(a))] = n;
    }
    t
}

/// A fabric with node 0 the peer and node 1's port shared by ibcm and AL's stand-in,
/// every MAD captured.
fn fabric(seed: u64) -> (Fabric, Arc<SharedPort>) {
    let mut f = Fabric::new(2, seed);
    let shared = f.share_port(1).unwrap();
    f.capture = Some(Vec::new());
    (f, shared)
}

/// Wire byte 2 of the LocalCommID (CM data offset 0: MAD bytes 24..28) of every MAD of
/// `attribute` sent from node 1's address.
fn local_comm_id_byte2_from_shared(f: &Fabric, attribute: AttributeId) -> Vec<u8> {
    let from = node_address(1);
    let mut v: Vec<u8> = f
        .capture
        .as_ref()
        .unwrap()
        .iter()
        .filter(|c| c.from.lid == from.lid)
        .filter(|c| u16::from_be_bytes([c.mad[16], c.mad[17]]) == u16::from(attribute))
        .map(|c| c.mad[26])
        .collect();
    v.sort_unstable();
    v
}

fn assert_clean(f: &mut Fabric, nodes: &[&Arc<Node>]) {
    f.run_for(SETTLE_NS);
    for n in nodes {
        assert_eq!(n.device.with_engine(|cm| cm.live_ceps()), 0);
        assert_eq!(n.violations(), vec![]);
    }
}

#[test]
fn a_peer_connects_to_a_service_of_each_cm_and_each_cm_gets_only_its_own() {
    let (mut f, shared) = fabric(21);
    let peer = Arc::clone(&f.nodes[0]);
    let (ibcm, al) = (Arc::clone(shared.ibcm()), Arc::clone(shared.al()));
    let (peer_log, ibcm_log, al_log) = (log(), log(), log());
    let ibcm_listen = listen(&ibcm, &ibcm_log, IBCM_SID);
    let al_listen = listen(&al, &al_log, AL_SID);

    let to_ibcm = connect(&peer, &peer_log, &params(0, 1, IBCM_SID, 0x11));
    let to_al = connect(&peer, &peer_log, &params(0, 1, AL_SID, 0x12));
    f.run_for(100_000);
    // Each CM got the one REQ for its service, and no other.
    let (ibcm_child, _) = ibcm
        .device
        .get_request_ex(ibcm_listen, recorder(&ibcm_log))
        .expect("ibcm's REQ");
    let (al_child, _) = al
        .device
        .get_request_ex(al_listen, recorder(&al_log))
        .expect("AL's REQ");
    assert!(
        ibcm.device
            .get_request_ex(ibcm_listen, recorder(&ibcm_log))
            .is_none()
    );
    assert!(
        al.device
            .get_request_ex(al_listen, recorder(&al_log))
            .is_none()
    );
    ibcm.device
        .send_rep(ibcm_child, &Pair::rep_params(0x21))
        .unwrap();
    al.device
        .send_rep(al_child, &Pair::rep_params(0x22))
        .unwrap();
    f.run_for(100_000);
    for id in [to_ibcm, to_al] {
        peer.device.send_rtu(id, b"").unwrap();
    }
    f.run_for(100_000);
    for id in [to_ibcm, to_al] {
        peer.device.send_dreq(id, b"").unwrap();
    }
    f.run_for(100_000);
    ibcm.device.send_drep(ibcm_child, b"").unwrap();
    al.device.send_drep(al_child, b"").unwrap();
    f.run_for(SETTLE_NS);

    let passive = |listen, child| {
        vec![
            (listen, "req".to_string()),
            (child, "rtu".into()),
            (child, "dreq".into()),
            (child, "exit".into()),
        ]
    };
    assert_eq!(events(&ibcm_log), passive(ibcm_listen, ibcm_child));
    assert_eq!(events(&al_log), passive(al_listen, al_child));
    let peer_events = events(&peer_log);
    for id in [to_ibcm, to_al] {
        let mine: Vec<String> = peer_events
            .iter()
            .filter(|(i, _)| *i == id)
            .map(|(_, e)| e.clone())
            .collect();
        assert_eq!(mine, ["rep", "drep", "exit"]);
    }
    // Per CM: the REQ of its service, the RTU and DREQ that name its comm ID.
    let each = table(&[
        (AttributeId::Req, 1),
        (AttributeId::Rtu, 1),
        (AttributeId::Dreq, 1),
    ]);
    assert_eq!(
        shared.counts(),
        SteerCounts {
            steered: each,
            passed: each
        }
    );
    for cm in [&ibcm, &al] {
        let c = cm.device.with_engine(|cm| *cm.counters());
        assert_eq!(&c.received[..7], &[1, 0, 0, 0, 1, 1, 0], "{c:?}");
        assert_eq!((c.unmatched, c.malformed), (0, 0));
    }
    // The REPs and DREPs came from both comm ID spaces, one each.
    for attribute in [AttributeId::Rep, AttributeId::Drep] {
        let ids = local_comm_id_byte2_from_shared(&f, attribute);
        assert_eq!(ids.len(), 2, "{attribute:?}");
        assert!(ids[0] < 0xF0 && ids[1] >= 0xF0, "{attribute:?}: {ids:x?}");
    }
    for (n, id) in [
        (&peer, to_ibcm),
        (&peer, to_al),
        (&ibcm, ibcm_child),
        (&ibcm, ibcm_listen),
        (&al, al_child),
        (&al, al_listen),
    ] {
        n.device.destroy_id(id);
    }
    assert_clean(&mut f, &[&peer, &ibcm, &al]);
}

#[test]
fn a_req_for_a_service_neither_cm_serves_is_als_to_reject() {
    let (mut f, shared) = fabric(22);
    let peer = Arc::clone(&f.nodes[0]);
    let (ibcm, al) = (Arc::clone(shared.ibcm()), Arc::clone(shared.al()));
    let (peer_log, ibcm_log) = (log(), log());
    let ibcm_listen = listen(&ibcm, &ibcm_log, IBCM_SID);
    let id = connect(&peer, &peer_log, &params(0, 1, 0x3000, 0x11));
    f.run_for(1_000_000);
    // AL's CM answers a REQ nobody takes (IBA 12.6.7.1: REJ reason 8, invalid service).
    assert_eq!(
        events(&peer_log),
        vec![(
            id,
            format!("rej {}", u16::from(RejReason::InvalidServiceId))
        )]
    );
    assert_eq!(
        shared.counts(),
        SteerCounts {
            steered: [0; STEER_ROWS],
            passed: table(&[(AttributeId::Req, 1)]),
        }
    );
    assert_eq!(events(&ibcm_log), vec![]);
    let received = |n: &Node| n.device.with_engine(|cm| cm.counters().received);
    assert_eq!(received(&ibcm), [0; 12]);
    assert_eq!(received(&al)[0], 1);
    peer.device.destroy_id(id);
    ibcm.device.destroy_id(ibcm_listen);
    assert_clean(&mut f, &[&peer, &ibcm, &al]);
}

#[test]
fn replies_to_each_cms_own_requests_follow_its_comm_ids() {
    let (mut f, shared) = fabric(23);
    let peer = Arc::clone(&f.nodes[0]);
    let (ibcm, al) = (Arc::clone(shared.ibcm()), Arc::clone(shared.al()));
    let (peer_log, ibcm_log, al_log) = (log(), log(), log());
    let peer_listen = listen(&peer, &peer_log, PEER_SID);
    let from_ibcm = connect(&ibcm, &ibcm_log, &params(1, 0, PEER_SID, 0x31));
    let from_al = connect(&al, &al_log, &params(1, 0, PEER_SID, 0x32));
    f.run_for(100_000);
    let mut children = Vec::new();
    while let Some((child, _)) = peer.device.get_request_ex(peer_listen, recorder(&peer_log)) {
        peer.device
            .send_rep(child, &Pair::rep_params(0x40 + children.len() as u32))
            .unwrap();
        children.push(child);
    }
    assert_eq!(children.len(), 2);
    f.run_for(100_000);
    ibcm.device.send_rtu(from_ibcm, b"").unwrap();
    al.device.send_rtu(from_al, b"").unwrap();
    f.run_for(100_000);
    // The peer ends both: its DREQs name the two CMs' comm IDs.
    for &c in &children {
        peer.device.send_dreq(c, b"").unwrap();
    }
    f.run_for(100_000);
    ibcm.device.send_drep(from_ibcm, b"").unwrap();
    al.device.send_drep(from_al, b"").unwrap();
    f.run_for(SETTLE_NS);

    let active = |id| {
        vec![
            (id, "rep".to_string()),
            (id, "dreq".into()),
            (id, "exit".into()),
        ]
    };
    assert_eq!(events(&ibcm_log), active(from_ibcm));
    assert_eq!(events(&al_log), active(from_al));
    let each = table(&[(AttributeId::Rep, 1), (AttributeId::Dreq, 1)]);
    assert_eq!(
        shared.counts(),
        SteerCounts {
            steered: each,
            passed: each
        }
    );
    // The REQs came from both comm ID spaces, one each.
    let ids = local_comm_id_byte2_from_shared(&f, AttributeId::Req);
    assert!(
        ids.len() == 2 && ids[0] < 0xF0 && ids[1] >= 0xF0,
        "{ids:x?}"
    );
    for (n, id) in [(&ibcm, from_ibcm), (&al, from_al), (&peer, peer_listen)] {
        n.device.destroy_id(id);
    }
    for c in children {
        peer.device.destroy_id(c);
    }
    assert_clean(&mut f, &[&peer, &ibcm, &al]);
}

/// `Device::owner_of`, the accessor the QP1 verbs hook's `poll_cq` thunk calls at
/// DISPATCH_LEVEL (issue #19), gives the engine's own answer for every MAD of a live
/// scenario and for altered copies of them (another method, no RemoteCommID, cut short),
/// and allocates nothing while it does (the host verifier's DISPATCH_LEVEL rule).
#[test]
fn device_owner_of_agrees_with_the_engine_at_dispatch_and_allocates_nothing() {
    use ibcm_cep::MadOwner;
    use ibcm_host::verifier::at_dispatch;

    let (mut f, shared) = fabric(23);
    let peer = Arc::clone(&f.nodes[0]);
    let (ibcm, al) = (Arc::clone(shared.ibcm()), Arc::clone(shared.al()));
    let (peer_log, ibcm_log, al_log) = (log(), log(), log());
    let ibcm_listen = listen(&ibcm, &ibcm_log, IBCM_SID);
    let al_listen = listen(&al, &al_log, AL_SID);
    let to_ibcm = connect(&peer, &peer_log, &params(0, 1, IBCM_SID, 0x11));
    let to_al = connect(&peer, &peer_log, &params(0, 1, AL_SID, 0x12));
    f.run_for(100_000);
    let (ibcm_child, _) = ibcm
        .device
        .get_request_ex(ibcm_listen, recorder(&ibcm_log))
        .expect("ibcm's REQ");
    let (al_child, _) = al
        .device
        .get_request_ex(al_listen, recorder(&al_log))
        .expect("AL's REQ");
    ibcm.device
        .send_rep(ibcm_child, &Pair::rep_params(0x21))
        .unwrap();
    al.device
        .send_rep(al_child, &Pair::rep_params(0x22))
        .unwrap();
    f.run_for(100_000);
    for id in [to_ibcm, to_al] {
        peer.device.send_rtu(id, b"").unwrap();
    }
    f.run_for(100_000);
    // Both connections established on both CMs: every MAD that crossed the fabric so far
    // (REQ, REP, RTU of each), and altered copies.
    let port = node_address(1).port;
    let mut mads: Vec<Vec<u8>> = f
        .capture
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.mad.to_vec())
        .collect();
    let variants: Vec<Vec<u8>> = mads
        .iter()
        .flat_map(|m| {
            let mut get = m.clone();
            get[3] = 0x01;
            let mut nobody = m.clone();
            nobody[28..32].fill(0);
            [get, nobody, m[..100].to_vec(), m[..20].to_vec()]
        })
        .collect();
    mads.extend(variants);
    let (mut ours, mut theirs) = (0, 0);
    for mad in &mads {
        let engine = ibcm.device.with_engine(|cm| cm.owner_of(port, mad));
        let counted = allocation_counter::measure(|| {
            let accessor = at_dispatch(&ibcm.platform.ledger, || ibcm.device.owner_of(port, mad));
            assert_eq!(accessor, engine, "MAD {:02x?}", &mad[..mad.len().min(32)]);
        });
        assert_eq!(counted.count_total, 0);
        match engine {
            MadOwner::Ours => ours += 1,
            MadOwner::Theirs => theirs += 1,
        }
    }
    // The scenario gives both answers (ibcm's REQ and RTU; AL's, the REPs to the peer).
    assert!(ours >= 2 && theirs >= 2, "ours {ours}, theirs {theirs}");
    assert_eq!(ibcm.violations(), vec![]);
    for id in [to_ibcm, to_al] {
        peer.device.send_dreq(id, b"").unwrap();
    }
    f.run_for(100_000);
    ibcm.device.send_drep(ibcm_child, b"").unwrap();
    al.device.send_drep(al_child, b"").unwrap();
    for (n, id) in [
        (&peer, to_ibcm),
        (&peer, to_al),
        (&ibcm, ibcm_child),
        (&ibcm, ibcm_listen),
        (&al, al_child),
        (&al, al_listen),
    ] {
        n.device.destroy_id(id);
    }
    assert_clean(&mut f, &[&peer, &ibcm, &al]);
}
