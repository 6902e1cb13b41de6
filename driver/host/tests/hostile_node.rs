//! What a third, hostile node can do to a connection between two others (docs/security.md,
//! "Threat model"): on InfiniBand the HCA stamps the source LID, so a node sends only
//! from its own address (the simulated fabric stamps `from` likewise); what it can forge
//! is every field of the MAD.
//!
//! Linux matches a REJ by its RemoteCommID alone (`cm_acquire_rejected_id`, cm.c; by
//! (RemoteCommID, CA GUID) for REJ(Timeout)), and AL by the local comm ID
//! (`__process_rej`, al_cm_cep.c): neither looks at the source, and in REQ_SENT no remote
//! comm ID is known yet. ibcm takes a message for a connection only from an address the
//! connection uses (src/manager/peer.rs `sent_by_peer`) and numbers its comm IDs with a
//! keyed permutation (src/comm_id.rs), so a third node neither knows the number nor sends
//! from the right place.

mod user_handle;

use ibcm_endpoint::{Caller, FileId};
use ibcm_host::records::{connect_in, format_rep_in, handle_in, path};
use ibcm_host::{Fabric, Node, node_address};
use ibcm_ioctl::{QpTransitionsOut, QueryOut, code, ep_state, event_type};
use ibcm_mad::{CmMad, CmMessage, Dreq, MadHeader, MessageKind, Rej, RejReason};
use user_handle::{channel_events, create, must, open};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const SERVICE: u64 = 0x5e_c0de;
const MAD_SIZE: usize = 256;

fn state(node: &Node, file: FileId, handle: u64) -> u32 {
    let done = must(
        node,
        file,
        code::QUERY,
        handle_in(handle).as_bytes(),
        QueryOut::SIZE as usize,
    );
    QueryOut::read_from_bytes(&done.output).unwrap().state
}

fn listen(node: &Node, file: FileId, service: u64) -> u64 {
    let l = create(node, file);
    let mut li = ibcm_ioctl::ListenIn::new_zeroed();
    li.size = ibcm_ioctl::ListenIn::SIZE;
    li.handle = l;
    li.service_id = service;
    li.service_mask = u64::MAX;
    li.backlog = 16;
    must(node, file, code::LISTEN, li.as_bytes(), 0);
    l
}

fn rej(local: u32, remote: u32) -> [u8; MAD_SIZE] {
    let mut mad = [0; MAD_SIZE];
    CmMad {
        header: MadHeader::send(0x77),
        message: CmMessage::Rej(Rej {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: MessageKind::Req,
            reason: RejReason::ConsumerDefined,
            ari: &[],
            private_data: b"forged",
        }),
    }
    .emit(&mut mad)
    .unwrap();
    mad
}

fn dreq(local: u32, remote: u32, qpn: u32) -> [u8; MAD_SIZE] {
    let mut mad = [0; MAD_SIZE];
    CmMad {
        header: MadHeader::send(0x78),
        message: CmMessage::Dreq(Dreq {
            local_comm_id: local,
            remote_comm_id: remote,
            remote_qpn_eecn: qpn,
            private_data: &[],
        }),
    }
    .emit(&mut mad)
    .unwrap();
    mad
}

/// The comm ID the attacker learns of node 0: it connects to a public service there (as
/// any node may) and reads the LocalCommID of node 0's REP.
fn learn_a_comm_id(fabric: &mut Fabric) -> u32 {
    fabric.capture = Some(Vec::new());
    let n0 = &fabric.nodes[0];
    let public = open(n0, Caller::User);
    let _ = listen(n0, public, SERVICE + 1);
    let n2 = &fabric.nodes[2];
    let attacker = open(n2, Caller::User);
    let a = create(n2, attacker);
    let mut c = connect_in(a, SERVICE + 1, 0x2222);
    c.primary = path(2, 0);
    must(n2, attacker, code::CONNECT, c.as_bytes(), 0);
    fabric.run_for(100_000);
    let n0 = &fabric.nodes[0];
    let req = channel_events(n0, public);
    let s = req
        .iter()
        .find(|e| e.event_type == event_type::REQ_RECEIVED)
        .unwrap()
        .new_handle;
    must(
        n0,
        public,
        code::FORMAT_REP,
        format_rep_in(s, 0x3333).as_bytes(),
        QpTransitionsOut::SIZE as usize,
    );
    must(n0, public, code::SEND_REP, handle_in(s).as_bytes(), 0);
    fabric.run_for(100_000);
    let captured = fabric.capture.take().unwrap();
    captured
        .iter()
        .filter(|c| c.from.lid == node_address(0).lid)
        .find_map(|c| match CmMad::parse(&c.mad).ok()?.message {
            CmMessage::Rep(rep) => Some(rep.local_comm_id),
            _ => None,
        })
        .expect("node 0's REP")
}

/// A victim on node 0 connects to node 1; returns (file, endpoint), its REQ not yet on
/// the wire (REQ_SENT).
fn victim_connects(fabric: &Fabric) -> (FileId, u64) {
    let n0 = &fabric.nodes[0];
    let victim = open(n0, Caller::User);
    let v = create(n0, victim);
    must(
        n0,
        victim,
        code::CONNECT,
        connect_in(v, SERVICE, 0x123).as_bytes(),
        0,
    );
    assert_eq!(state(n0, victim, v), ep_state::REQ_SENT);
    (victim, v)
}

/// Forged MADs dropped, as COUNTERS reports them (and the engine counts them).
fn forged_drops(node: &Node) -> u64 {
    let file = open(node, Caller::User);
    let c = ibcm_ioctl::CountersIn {
        size: ibcm_ioctl::CountersIn::SIZE,
        reserved: 0,
    };
    let done = must(
        node,
        file,
        code::COUNTERS,
        c.as_bytes(),
        ibcm_ioctl::CountersOut::SIZE as usize,
    );
    let out = ibcm_ioctl::CountersOut::read_from_bytes(&done.output).unwrap();
    assert_eq!(
        out.forged,
        node.device.with_engine(|cm| cm.counters().forged)
    );
    out.forged
}

/// The attack that worked on comm IDs `(index | generation << 20) ^ operand`: knowing one
/// comm ID of node 0, a third node tries every generation (12 bits) of the 32 slots
/// around it, 131 072 REJs, from its own address. Seen failing on the old code: the
/// victim's endpoint left REQ_SENT (it got REJ_RECEIVED from a forged REJ).
#[test]
fn a_third_node_sweeping_forged_rejs_ends_no_connection_attempt() {
    let mut fabric = Fabric::new(3, 11);
    let n1 = &fabric.nodes[1];
    let server = open(n1, Caller::User);
    let _ = listen(n1, server, SERVICE);
    let known = learn_a_comm_id(&mut fabric);
    let (victim, v) = victim_connects(&fabric);

    let n0 = &fabric.nodes[0];
    let from = node_address(2);
    for generation in 0..1u32 << 12 {
        for low in 0..32u32 {
            let guess = known ^ (low | generation << 20);
            n0.receive(&from, &rej(0x4242, guess));
        }
    }
    assert_eq!(state(n0, victim, v), ep_state::REQ_SENT);
    // Not one guess but the known ID itself (the attacker's own connection, from its own
    // address: not forged) named a live CEP: nothing was even counted as forged.
    assert_eq!(forged_drops(n0), 0);
    assert!(
        channel_events(n0, victim)
            .iter()
            .all(|e| e.event_type != event_type::REJECTED)
    );
    // The attempt still completes: node 1 answers.
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let req = channel_events(n1, server);
    assert!(req.iter().any(|e| e.event_type == event_type::REQ_RECEIVED));
}

/// A third node that knows the comm ID (on RoCE it may see the traffic; here the test
/// reads it from the REQ) still cannot end the attempt from its own address; the same
/// REJ from node 1, the address the REQ went to, ends it (so the test could fail).
/// Seen failing on the old code: the forged REJ from node 2 was taken (REJ_RECEIVED).
#[test]
fn a_forged_rej_with_the_right_comm_id_from_another_node_is_dropped_and_counted() {
    let mut fabric = Fabric::new(3, 12);
    fabric.capture = Some(Vec::new());
    let (victim, v) = victim_connects(&fabric);
    // Node 1 has no listen: deliver nothing yet; read the REQ as it leaves node 0.
    let n0 = &fabric.nodes[0];
    let sent = n0.platform.take_sent();
    let comm_id = sent
        .iter()
        .find_map(|t| match CmMad::parse(&t.mad).ok()?.message {
            CmMessage::Req(req) => Some(req.local_comm_id),
            _ => None,
        })
        .expect("the REQ");
    let before = forged_drops(n0);
    n0.receive(&node_address(2), &rej(0x4242, comm_id));
    assert_eq!(state(n0, victim, v), ep_state::REQ_SENT);
    assert_eq!(forged_drops(n0), before + 1);
    n0.receive(&node_address(1), &rej(0x4242, comm_id));
    assert_eq!(state(n0, victim, v), ep_state::IDLE);
}

/// Established both ways, a DREQ with the right comm IDs and QPN from a third node ends
/// neither side. Seen failing on the old code: node 0 went to DREQ_RCVD.
#[test]
fn a_forged_dreq_from_a_third_node_ends_no_connection() {
    let mut fabric = Fabric::new(3, 13);
    fabric.capture = Some(Vec::new());
    let n1 = &fabric.nodes[1];
    let server = open(n1, Caller::User);
    let _ = listen(n1, server, SERVICE);
    let (victim, v) = victim_connects(&fabric);
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let s = channel_events(n1, server)[0].new_handle;
    must(
        n1,
        server,
        code::FORMAT_REP,
        format_rep_in(s, 0x456).as_bytes(),
        QpTransitionsOut::SIZE as usize,
    );
    must(n1, server, code::SEND_REP, handle_in(s).as_bytes(), 0);
    fabric.run_for(100_000);
    let n0 = &fabric.nodes[0];
    must(
        n0,
        victim,
        code::RTU,
        ibcm_ioctl::PrivateDataIn {
            size: ibcm_ioctl::PrivateDataIn::SIZE,
            handle: v,
            ..FromZeros::new_zeroed()
        }
        .as_bytes(),
        0,
    );
    fabric.run_for(100_000);
    let captured = fabric.capture.take().unwrap();
    let (mut ids0, mut ids1) = (0, 0);
    for c in &captured {
        if let Ok(CmMad {
            message: CmMessage::Rep(rep),
            ..
        }) = CmMad::parse(&c.mad)
        {
            (ids1, ids0) = (rep.local_comm_id, rep.remote_comm_id);
        }
    }
    let n0 = &fabric.nodes[0];
    assert_eq!(state(n0, victim, v), ep_state::ESTABLISHED);
    n0.receive(&node_address(2), &dreq(ids1, ids0, 0x123));
    let n1 = &fabric.nodes[1];
    n1.receive(&node_address(2), &dreq(ids0, ids1, 0x456));
    assert_eq!(state(n0, victim, v), ep_state::ESTABLISHED);
    assert_eq!(state(n1, server, s), ep_state::ESTABLISHED);
    assert_eq!(forged_drops(n0), 1);
    assert_eq!(forged_drops(n1), 1);
}

/// A third node that knows both comm IDs of a connection (as if it could read them)
/// replays every connection message an exchange carries (REP, RTU, MRA, REJ, DREQ, DREP,
/// LAP, APR, as captured from a first connection, comm IDs rewritten for the victim's)
/// at the victim's connection in each state it passes (REQ_SENT and REQ_RCVD, REP_SENT
/// and REP_RCVD, ESTABLISHED on both sides), 100 000 MADs in all: nothing changes, and
/// each is counted as forged. Seen failing with the source check taken out
/// (`drop_if_forged` skipped, the comm IDs being known): the victim's active side went
/// from REQ_SENT to IDLE (a forged REJ ended it).
#[test]
fn a_third_node_replaying_every_message_type_changes_no_state() {
    let mut fabric = Fabric::new(3, 14);
    let n1 = &fabric.nodes[1];
    let server = open(n1, Caller::Administrator);
    let _ = listen(n1, server, SERVICE);
    // A first connection, with an MRA, a LAP and its APR, and a disconnect: the messages.
    fabric.capture = Some(Vec::new());
    let (c1, e1, s1) = connect_both(&mut fabric, server, 0x111, 0x222, true);
    let n0 = &fabric.nodes[0];
    let mut lap = ibcm_ioctl::LapIn::new_zeroed();
    lap.size = ibcm_ioctl::LapIn::SIZE;
    lap.handle = e1;
    lap.alternate = path(0, 1);
    must(n0, c1, code::LAP, lap.as_bytes(), 0);
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let mut apr = ibcm_ioctl::AprIn::new_zeroed();
    apr.size = ibcm_ioctl::AprIn::SIZE;
    apr.handle = s1;
    must(
        n1,
        server,
        code::PREPARE_APR,
        apr.as_bytes(),
        ibcm_ioctl::QpAttrOut::SIZE as usize,
    );
    must(n1, server, code::SEND_APR, handle_in(s1).as_bytes(), 0);
    fabric.run_for(100_000);
    let n0 = &fabric.nodes[0];
    must(n0, c1, code::DESTROY, handle_in(e1).as_bytes(), 0);
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let mut drep = ibcm_ioctl::PrivateDataIn::new_zeroed();
    drep.size = ibcm_ioctl::PrivateDataIn::SIZE;
    drep.handle = s1;
    must(n1, server, code::DREP, drep.as_bytes(), 0);
    // And a REJ: a REQ for a service nobody listens on.
    let n0 = &fabric.nodes[0];
    let r = create(n0, c1);
    must(
        n0,
        c1,
        code::CONNECT,
        connect_in(r, SERVICE + 9, 0x333).as_bytes(),
        0,
    );
    fabric.run_for(100_000);
    let captured = fabric.capture.take().unwrap();
    let mut kinds: Vec<(bool, [u8; MAD_SIZE])> = Vec::new();
    for c in &captured {
        let attribute = u16::from_be_bytes([c.mad[16], c.mad[17]]);
        let to_node0 = c.to.lid == node_address(0).lid;
        if attribute != 0x10
            && !kinds
                .iter()
                .any(|(t, m)| *t == to_node0 && m[16..18] == c.mad[16..18])
        {
            kinds.push((to_node0, c.mad));
        }
    }
    let names: Vec<u16> = kinds
        .iter()
        .map(|(_, m)| u16::from_be_bytes([m[16], m[17]]))
        .collect();
    for want in [0x11u16, 0x12, 0x13, 0x14, 0x15, 0x16, 0x19, 0x1a] {
        assert!(
            names.contains(&want),
            "attribute {want:#x} not captured: {names:x?}"
        );
    }

    // The victim's connection, attacked in each state it passes.
    let n0 = &fabric.nodes[0];
    let victim = open(n0, Caller::User);
    let v = create(n0, victim);
    must(
        n0,
        victim,
        code::CONNECT,
        connect_in(v, SERVICE, 0x123).as_bytes(),
        0,
    );
    let mut total = 0u64;
    let mut attack = |fabric: &mut Fabric, ids: (u32, u32)| {
        for (to_node0, mad) in &kinds {
            let (node, local, remote) = if *to_node0 {
                (0, ids.1, ids.0)
            } else {
                (1, ids.0, ids.1)
            };
            let mut forged = *mad;
            forged[24..28].copy_from_slice(&local.to_be_bytes());
            forged[28..32].copy_from_slice(&remote.to_be_bytes());
            for _ in 0..3_200 {
                fabric.nodes[node].receive(&node_address(2), &forged);
                total += 1;
            }
        }
    };
    // REQ_SENT: node 0's comm ID from its REQ as it leaves (held back from the wire
    // while node 0 is attacked; node 1 has no CEP for it yet).
    let sent = fabric.nodes[0].platform.take_sent();
    let n0_id = first_comm_id(&sent, 0x10).expect("the REQ");
    attack(&mut fabric, (n0_id, 0));
    assert_eq!(state(&fabric.nodes[0], victim, v), ep_state::REQ_SENT);
    for t in &sent {
        fabric.nodes[1].receive(&node_address(0), &t.mad);
    }
    // REQ_RCVD on node 1.
    let s = channel_events(&fabric.nodes[1], server)
        .iter()
        .find(|e| e.event_type == event_type::REQ_RECEIVED)
        .unwrap()
        .new_handle;
    must(
        &fabric.nodes[1],
        server,
        code::FORMAT_REP,
        format_rep_in(s, 0x456).as_bytes(),
        QpTransitionsOut::SIZE as usize,
    );
    must(
        &fabric.nodes[1],
        server,
        code::SEND_REP,
        handle_in(s).as_bytes(),
        0,
    );
    let sent = fabric.nodes[1].platform.take_sent();
    let n1_id = first_comm_id(&sent, 0x13).expect("the REP");
    // REQ_RCVD answered: REP_SENT on node 1, the REP held back.
    attack(&mut fabric, (n0_id, n1_id));
    assert_eq!(state(&fabric.nodes[1], server, s), ep_state::REP_SENT);
    assert_eq!(state(&fabric.nodes[0], victim, v), ep_state::REQ_SENT);
    for t in &sent {
        fabric.nodes[0].receive(&node_address(1), &t.mad);
    }
    // REP_RCVD on node 0.
    attack(&mut fabric, (n0_id, n1_id));
    assert_eq!(state(&fabric.nodes[0], victim, v), ep_state::REP_RCVD);
    let mut rtu = ibcm_ioctl::PrivateDataIn::new_zeroed();
    rtu.size = ibcm_ioctl::PrivateDataIn::SIZE;
    rtu.handle = v;
    must(&fabric.nodes[0], victim, code::RTU, rtu.as_bytes(), 0);
    fabric.run_for(100_000);
    // ESTABLISHED on both.
    attack(&mut fabric, (n0_id, n1_id));
    assert_eq!(state(&fabric.nodes[0], victim, v), ep_state::ESTABLISHED);
    assert_eq!(state(&fabric.nodes[1], server, s), ep_state::ESTABLISHED);
    assert!(total >= 100_000, "{total}");
    // All but those naming node 1's CEP before it existed named a live CEP.
    let forged = forged_drops(&fabric.nodes[0]) + forged_drops(&fabric.nodes[1]);
    assert!(forged >= total * 3 / 4, "{forged} of {total}");
    let _ = (c1, s1);
}

/// A connection from node 0 to `server` on node 1 (an administrator's listen there):
/// (client file, its endpoint, the server's endpoint), established; with `mra`, node 1
/// sends an MRA first.
fn connect_both(
    fabric: &mut Fabric,
    server: FileId,
    qpn0: u32,
    qpn1: u32,
    mra: bool,
) -> (FileId, u64, u64) {
    let n0 = &fabric.nodes[0];
    let client = open(n0, Caller::Administrator);
    let c = create(n0, client);
    must(
        n0,
        client,
        code::CONNECT,
        connect_in(c, SERVICE, qpn0).as_bytes(),
        0,
    );
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let s = channel_events(n1, server)
        .iter()
        .find(|e| e.event_type == event_type::REQ_RECEIVED)
        .unwrap()
        .new_handle;
    if mra {
        let mut m = ibcm_ioctl::MraIn::new_zeroed();
        m.size = ibcm_ioctl::MraIn::SIZE;
        m.handle = s;
        m.service_timeout = 20;
        must(n1, server, code::MRA, m.as_bytes(), 0);
        fabric.run_for(100_000);
    }
    let n1 = &fabric.nodes[1];
    must(
        n1,
        server,
        code::FORMAT_REP,
        format_rep_in(s, qpn1).as_bytes(),
        QpTransitionsOut::SIZE as usize,
    );
    must(n1, server, code::SEND_REP, handle_in(s).as_bytes(), 0);
    fabric.run_for(100_000);
    let n0 = &fabric.nodes[0];
    let mut rtu = ibcm_ioctl::PrivateDataIn::new_zeroed();
    rtu.size = ibcm_ioctl::PrivateDataIn::SIZE;
    rtu.handle = c;
    must(n0, client, code::RTU, rtu.as_bytes(), 0);
    fabric.run_for(100_000);
    assert_eq!(state(&fabric.nodes[0], client, c), ep_state::ESTABLISHED);
    (client, c, s)
}

/// The LocalCommID of the first MAD of `attribute` among `sent`.
fn first_comm_id(sent: &[ibcm_cep::Transmit], attribute: u16) -> Option<u32> {
    sent.iter()
        .find(|t| u16::from_be_bytes([t.mad[16], t.mad[17]]) == attribute)
        .map(|t| u32::from_be_bytes([t.mad[24], t.mad[25], t.mad[26], t.mad[27]]))
}
