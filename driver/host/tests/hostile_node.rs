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
