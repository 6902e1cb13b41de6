//! What one user's handle can do to another's (issue #30): two handles opened as
//! `Caller::User` are two users of one host, as two processes of different accounts
//! opening `\\.\ibcm` on Windows (its SDDL lets every user in).
//!
//! - Listens cannot be hijacked: AL refuses a listen beside another on the same service
//!   ID unless both compare and differ (al_cm_cep.c:4430-4505); Linux looks REQs up by
//!   exact service ID (cm.c `cm_find_listen`) and refuses a second listen on one
//!   (`cm_insert_listen`, -EBUSY). ibcm refuses overlapping listens for everyone and
//!   partial masks for users.
//! - A caller cannot name another's QP: WinVerbs derives the QPN of its REQ and REP from
//!   a QP the caller owns (wv_ep.c:602-614, 823-828); a REQ carrying a live connection's
//!   QPN towards the same peer makes the peer's stale-connection check (Linux
//!   `cm_match_req`, ibcm's establish.rs) reject it and DREQ the live connection.
//! - AL places every path it sends on by its source (`__find_port_cep`,
//!   al_cm_cep.c:4569): a path whose SGID or SLID is not the named port's is refused.
//! - Quotas per user handle, IOCTLs after cleanup, cleanup in bounded lock holds.

use ibcm_endpoint::{Caller, FileId, Quotas};
mod user_handle;

use ibcm_host::records::{connect_in, format_rep_in, handle_in, path};
use ibcm_host::verifier::Completion;
use ibcm_host::{Fabric, Node};
use ibcm_ioctl::{
    CreateIn, LapIn, ListenIn, PrivateDataIn, QpTransitionsOut, QueryOut, code, ep_state,
    event_type, status,
};
use user_handle::{channel_events, create, must, open};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const SERVICE: u64 = 0x1234;
/// The victim's QPN.
const VICTIM_QPN: u32 = 0x123;

/// A listen of `file` on `service` (exact ID): its handle.
fn listen(node: &Node, file: FileId, service: u64) -> u64 {
    let l = create(node, file);
    must(
        node,
        file,
        code::LISTEN,
        listen_in(l, service, u64::MAX).as_bytes(),
        0,
    );
    l
}

/// FORMAT_REP of `handle` with `qpn`, which must succeed.
fn format_rep(node: &Node, file: FileId, handle: u64, qpn: u32) -> Completion {
    let out = QpTransitionsOut::SIZE as usize;
    must(
        node,
        file,
        code::FORMAT_REP,
        format_rep_in(handle, qpn).as_bytes(),
        out,
    )
}

fn listen_in(handle: u64, service_id: u64, mask: u64) -> ListenIn {
    let mut l = ListenIn::new_zeroed();
    l.size = ListenIn::SIZE;
    l.handle = handle;
    l.service_id = service_id;
    l.service_mask = mask;
    l.backlog = 16;
    l
}

fn private_data_in(handle: u64) -> PrivateDataIn {
    let mut p = PrivateDataIn::new_zeroed();
    p.size = PrivateDataIn::SIZE;
    p.handle = handle;
    p
}

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

fn reqs_sent(node: &Node) -> u64 {
    sent(node, ibcm_mad::AttributeId::Req)
}

fn sent(node: &Node, attribute: ibcm_mad::AttributeId) -> u64 {
    let slot = ibcm_cep::counter_slot(attribute).unwrap();
    node.device.with_engine(|cm| cm.counters().sent[slot])
}

/// A user's catch-all listen (mask 0), made before a victim's, would take the victim's
/// REQs (the first listen that matches wins). Refused: a user listens on exact IDs.
/// Seen failing on the old code: the catch-all LISTEN completed with STATUS_SUCCESS, and
/// the REQ for the victim's service went to the attacker.
#[test]
fn a_users_catch_all_listen_is_refused_and_the_victims_req_reaches_the_victim() {
    let mut fabric = Fabric::new(2, 5);
    let n1 = &fabric.nodes[1];
    let (attacker, victim) = (open(n1, Caller::User), open(n1, Caller::User));
    let la = create(n1, attacker);
    let catch_all = n1.ioctl_now(attacker, code::LISTEN, listen_in(la, 0, 0).as_bytes(), 0);
    assert_eq!(catch_all.status, status::ACCESS_DENIED);
    // A partial mask likewise (the services 0x1200..=0x12ff).
    let partial = n1.ioctl_now(
        attacker,
        code::LISTEN,
        listen_in(la, 0x1200, !0xff).as_bytes(),
        0,
    );
    assert_eq!(partial.status, status::ACCESS_DENIED);
    let lv = listen(n1, victim, SERVICE);

    let n0 = &fabric.nodes[0];
    let peer = open(n0, Caller::User);
    let a = create(n0, peer);
    must(
        n0,
        peer,
        code::CONNECT,
        connect_in(a, SERVICE, 0x77).as_bytes(),
        0,
    );
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let got = channel_events(n1, victim);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].event_type, event_type::REQ_RECEIVED);
    assert_eq!(got[0].handle, lv);
    assert!(channel_events(n1, attacker).is_empty());
}

/// A listen on a victim's service ID with a port or a compare prefix would take the
/// victim's REQs wherever it sits in the list. Refused for everyone as AL refuses it
/// (al_cm_cep.c:4443-4465, 4500-4505); an administrator may use partial masks, but not to
/// overlap a listen either. Seen failing on the old code: both LISTENs completed with
/// STATUS_SUCCESS.
#[test]
fn a_listen_overlapping_anothers_is_refused() {
    let fabric = Fabric::new(1, 5);
    let n = &fabric.nodes[0];
    let (victim, attacker) = (open(n, Caller::User), open(n, Caller::User));
    let admin = open(n, Caller::Administrator);
    let _ = listen(n, victim, SERVICE);
    let la = create(n, attacker);
    let mut on_port = listen_in(la, SERVICE, u64::MAX);
    on_port.port = 1;
    let mut with_prefix = listen_in(la, SERVICE, u64::MAX);
    with_prefix.compare_len = 2;
    with_prefix.compare[..2].copy_from_slice(b"hi");
    for l in [on_port, with_prefix] {
        let done = n.ioctl_now(attacker, code::LISTEN, l.as_bytes(), 0);
        assert_eq!(done.status, status::ADDRESS_ALREADY_EXISTS);
    }
    let ladmin = create(n, admin);
    let wide = listen_in(ladmin, 0x1200, !0xff);
    let done = n.ioctl_now(admin, code::LISTEN, wide.as_bytes(), 0);
    assert_eq!(done.status, status::ADDRESS_ALREADY_EXISTS);
    let beside = listen_in(ladmin, 0x5600, !0xff);
    must(n, admin, code::LISTEN, beside.as_bytes(), 0);
    // The attacker's own exact service ID is fine.
    must(
        n,
        attacker,
        code::LISTEN,
        listen_in(la, SERVICE + 1, u64::MAX).as_bytes(),
        0,
    );
}

/// The QPN teardown: a second user's REQ with the victim's QPN towards the victim's peer
/// would make the peer reject it as stale and DREQ the victim's connection. Refused
/// before it reaches the wire, so the victim's connection stays established on both
/// sides. Seen failing on the old code: the attacker's CONNECT completed with
/// STATUS_SUCCESS, a second REQ went out, and the victim's endpoint got DREQ_RECEIVED.
/// A user's connection from node 0 (QPN `qpn`) to a user's listen on node 1 (QPN
/// 0x456), established: (node 0's file, its endpoint, node 1's file, its endpoint).
fn establish(fabric: &mut Fabric, qpn: u32) -> (FileId, u64, FileId, u64) {
    let n1 = &fabric.nodes[1];
    let server = open(n1, Caller::User);
    let _ = listen(n1, server, SERVICE);
    let n0 = &fabric.nodes[0];
    let client = open(n0, Caller::User);
    let c = create(n0, client);
    must(
        n0,
        client,
        code::CONNECT,
        connect_in(c, SERVICE, qpn).as_bytes(),
        0,
    );
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let req = channel_events(n1, server);
    assert_eq!(req.len(), 1);
    let s = req[0].new_handle;
    format_rep(n1, server, s, 0x456);
    must(n1, server, code::SEND_REP, handle_in(s).as_bytes(), 0);
    fabric.run_for(100_000);
    let n0 = &fabric.nodes[0];
    must(n0, client, code::RTU, private_data_in(c).as_bytes(), 0);
    fabric.run_for(100_000);
    let n0 = &fabric.nodes[0];
    assert_eq!(state(n0, client, c), ep_state::ESTABLISHED);
    (client, c, server, s)
}

#[test]
fn a_user_cannot_send_a_req_with_anothers_qpn() {
    let mut fabric = Fabric::new(2, 7);
    let (victim, v, server, s) = establish(&mut fabric, VICTIM_QPN);
    let n0 = &fabric.nodes[0];
    let attacker = open(n0, Caller::User);

    let sent = reqs_sent(n0);
    let m = create(n0, attacker);
    let done = n0.ioctl_now(
        attacker,
        code::CONNECT,
        connect_in(m, SERVICE, VICTIM_QPN).as_bytes(),
        0,
    );
    assert_eq!(done.status, status::ACCESS_DENIED);
    assert_eq!(reqs_sent(n0), sent, "nothing reached the wire");
    // A QPN of its own is fine.
    must(
        n0,
        attacker,
        code::CONNECT,
        connect_in(m, SERVICE, 0x999).as_bytes(),
        0,
    );
    fabric.run_for(1_000_000);
    let (n0, n1) = (&fabric.nodes[0], &fabric.nodes[1]);
    assert_eq!(state(n0, victim, v), ep_state::ESTABLISHED);
    assert_eq!(state(n1, server, s), ep_state::ESTABLISHED);
    assert!(
        channel_events(n0, victim)
            .iter()
            .all(|e| e.event_type != event_type::DREQ_RECEIVED)
    );

    // The passive side likewise: another user on node 1 cannot answer a REQ with the
    // server's QPN (WinVerbs takes the REP's QPN from its own QP, wv_ep.c:823-828).
    let other = open(n1, Caller::User);
    let l2 = create(n1, other);
    let mut l2_in = listen_in(l2, SERVICE + 1, u64::MAX);
    l2_in.backlog = 4;
    must(n1, other, code::LISTEN, l2_in.as_bytes(), 0);
    let n0 = &fabric.nodes[0];
    let a2 = create(n0, attacker);
    let mut c2 = connect_in(a2, SERVICE, 0x998);
    c2.service_id = SERVICE + 1;
    must(n0, attacker, code::CONNECT, c2.as_bytes(), 0);
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let req2 = channel_events(n1, other);
    let theirs = req2.iter().find(|e| e.handle == l2).unwrap().new_handle;
    let done = n1.ioctl_now(
        other,
        code::FORMAT_REP,
        format_rep_in(theirs, 0x456).as_bytes(),
        QpTransitionsOut::SIZE as usize,
    );
    assert_eq!(done.status, status::ACCESS_DENIED);
    // An administrator names raw QPNs (trusted: docs/security.md).
    let admin = open(n1, Caller::Administrator);
    assert_eq!(
        n1.device.with_engine(|cm| cm.local_qpn_holder(1, 0x456)),
        Some(server.raw())
    );
    let _ = admin;
}

/// AL's `__find_port_cep` (al_cm_cep.c:4569): the path a REQ is sent on must start at a
/// local port, its SGID (and SLID, on IB) that port's. Seen failing on the old code: the
/// CONNECT with another node's SGID completed with STATUS_SUCCESS and the REQ went out.
#[test]
fn a_connect_from_an_address_that_is_not_the_ports_is_refused() {
    let fabric = Fabric::new(2, 9);
    let n0 = &fabric.nodes[0];
    let file = open(n0, Caller::User);
    let h = create(n0, file);
    let sent = reqs_sent(n0);
    let mut spoofed = connect_in(h, SERVICE, 0x321);
    spoofed.primary = path(1, 1);
    let done = n0.ioctl_now(file, code::CONNECT, spoofed.as_bytes(), 0);
    assert_eq!(done.status, status::INVALID_PARAMETER);
    let mut wrong_lid = connect_in(h, SERVICE, 0x321);
    wrong_lid.primary.slid = 0x77;
    let done = n0.ioctl_now(file, code::CONNECT, wrong_lid.as_bytes(), 0);
    assert_eq!(done.status, status::INVALID_PARAMETER);
    let mut wrong_port = connect_in(h, SERVICE, 0x321);
    wrong_port.port = 2;
    let done = n0.ioctl_now(file, code::CONNECT, wrong_port.as_bytes(), 0);
    assert_eq!(done.status, status::INVALID_PARAMETER);
    assert_eq!(reqs_sent(n0), sent);
    must(
        n0,
        file,
        code::CONNECT,
        connect_in(h, SERVICE, 0x321).as_bytes(),
        0,
    );
}

/// LAP (review-30 B1): the alternate path a user loads must leave from a local port of
/// the connection's CA, as every path AL sends on (`__format_path_av`, al_cm_cep.c:5766:
/// IB_INVALID_SETTING for a LAP's alternate that no port has). Seen failing on the old
/// code: the LAP with another node's SGID completed with STATUS_SUCCESS and went out.
#[test]
fn a_lap_from_an_address_that_is_not_the_cas_is_refused() {
    let mut fabric = Fabric::new(2, 11);
    let (file, c, _, _) = establish(&mut fabric, 0x321);
    let n0 = &fabric.nodes[0];
    let laps_sent = || sent(n0, ibcm_mad::AttributeId::Lap);
    let before = laps_sent();
    let lap = |alternate| {
        let mut l = LapIn::new_zeroed();
        l.size = LapIn::SIZE;
        l.handle = c;
        l.alternate = alternate;
        n0.ioctl_now(file, code::LAP, l.as_bytes(), 0)
    };
    // Another node's address (node 2 is not on this fabric's node 0).
    assert_eq!(lap(path(2, 1)).status, status::INVALID_PARAMETER);
    let mut wrong_lid = path(0, 1);
    wrong_lid.slid = 0x77;
    assert_eq!(lap(wrong_lid).status, status::INVALID_PARAMETER);
    assert_eq!(laps_sent(), before, "nothing reached the wire");
    // The port's own address is fine.
    assert_eq!(lap(path(0, 1)).status, status::SUCCESS);
    assert_eq!(laps_sent(), before + 1);
}

/// Per-handle quotas of a user's handle; an administrator's has none. Seen failing on
/// the old code: there were no quotas (every CREATE and LISTEN succeeded).
#[test]
fn a_users_handle_keeps_to_its_quotas() {
    let fabric = Fabric::new(1, 11);
    let n = &fabric.nodes[0];
    n.device.set_quotas(Quotas {
        endpoints: 3,
        listens: 1,
        backlog: 20,
        queued_events: 100,
        ..Quotas::default()
    });
    let (user, admin) = (open(n, Caller::User), open(n, Caller::Administrator));
    let hs: Vec<u64> = (0..3).map(|_| create(n, user)).collect();
    let c = CreateIn {
        size: CreateIn::SIZE,
        reserved: 0,
    };
    let over = n.ioctl_now(user, code::CREATE, c.as_bytes(), 16);
    assert_eq!(over.status, status::QUOTA_EXCEEDED);
    for _ in 0..4 {
        create(n, admin);
    }
    must(
        n,
        user,
        code::LISTEN,
        listen_in(hs[0], SERVICE, u64::MAX).as_bytes(),
        0,
    );
    let second = n.ioctl_now(
        user,
        code::LISTEN,
        listen_in(hs[1], SERVICE + 1, u64::MAX).as_bytes(),
        0,
    );
    assert_eq!(second.status, status::QUOTA_EXCEEDED);
    // A listen again with a larger backlog replaces its own: within 20, not beyond.
    let mut again = listen_in(hs[0], SERVICE, u64::MAX);
    again.backlog = 21;
    must(n, user, code::CANCEL_LISTEN, handle_in(hs[0]).as_bytes(), 0);
    let done = n.ioctl_now(user, code::LISTEN, again.as_bytes(), 0);
    assert_eq!(done.status, status::QUOTA_EXCEEDED);
    again.backlog = 20;
    must(n, user, code::LISTEN, again.as_bytes(), 0);
    n.close(user);
    n.close(admin);
    assert!(n.violations().is_empty(), "{:?}", n.violations());
}

/// After IRP_MJ_CLEANUP a handle takes no IOCTL (an IOCTL racing the cleanup, or sent
/// through a duplicated handle the I/O manager still lets through, must not create an
/// endpoint nobody will destroy). Seen failing on the old code: CREATE after cleanup
/// completed with STATUS_SUCCESS and the endpoint outlived the cleanup.
#[test]
fn an_ioctl_after_cleanup_is_refused() {
    let fabric = Fabric::new(1, 13);
    let n = &fabric.nodes[0];
    let file = open(n, Caller::User);
    n.device.cleanup(file);
    let c = CreateIn {
        size: CreateIn::SIZE,
        reserved: 0,
    };
    let done = n.ioctl_now(file, code::CREATE, c.as_bytes(), 16);
    assert_eq!(done.status, status::FILE_CLOSED);
    assert_eq!(n.device.endpoint_count(file), 0);
    // An input longer than every record is refused before it is looked at.
    let long = vec![0u8; ibcm_ioctl::MAX_INPUT_SIZE + 1];
    let other = open(n, Caller::User);
    let done = n.ioctl_now(other, code::CREATE, &long, 16);
    assert_eq!(done.status, status::INFO_LENGTH_MISMATCH);
    n.close(file);
    n.close(other);
}

/// A handle with many endpoints closes in many short lock holds. Seen failing on the old
/// code: the whole cleanup ran under one hold (two lock acquisitions in all).
#[test]
fn cleanup_of_many_endpoints_holds_the_lock_briefly() {
    let fabric = Fabric::new(1, 15);
    let n = &fabric.nodes[0];
    let file = open(n, Caller::Administrator);
    const N: usize = 2000;
    for _ in 0..N {
        create(n, file);
    }
    let before = ibcm_host::verifier::lock_holds();
    n.device.cleanup(file);
    let holds = ibcm_host::verifier::lock_holds() - before;
    assert!(holds >= (N / 64) as u64, "{holds} lock holds");
    assert_eq!(n.device.endpoint_count(file), 0);
    n.close(file);
}

/// The queued-events quota counts records queued unread and gives them back as they are
/// read. Seen failing on the old code: there was no such quota (CREATE succeeded with
/// two records unread).
#[test]
fn a_user_reading_no_events_is_stopped_until_it_reads_them() {
    let mut fabric = Fabric::new(2, 17);
    let n1 = &fabric.nodes[1];
    n1.device.set_quotas(Quotas {
        queued_events: 2,
        ..Quotas::default()
    });
    let server = open(n1, Caller::User);
    let _ = listen(n1, server, SERVICE);
    let n0 = &fabric.nodes[0];
    let client = open(n0, Caller::Administrator);
    for qpn in [0x51, 0x52] {
        let a = create(n0, client);
        must(
            n0,
            client,
            code::CONNECT,
            connect_in(a, SERVICE, qpn).as_bytes(),
            0,
        );
    }
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let c = CreateIn {
        size: CreateIn::SIZE,
        reserved: 0,
    };
    let over = n1.ioctl_now(server, code::CREATE, c.as_bytes(), 16);
    assert_eq!(over.status, status::QUOTA_EXCEEDED);
    let got = channel_events(n1, server);
    assert_eq!(got.len(), 2);
    must(n1, server, code::CREATE, c.as_bytes(), 16);
}

/// Who holds QPN `qpn` of port 1's CA on `node`.
fn holder(node: &Node, qpn: u32) -> Option<u64> {
    node.device.with_engine(|cm| cm.local_qpn_holder(1, qpn))
}

/// A re-formatted REP that names another QPN moves the endpoint's QPN binding: the first
/// QPN is free again and the second is the handle's. Before, the binding stayed on the
/// first QPN for good (a leak that filled the table) while the endpoint's end unbound the
/// second: a handle could thereby strip a victim's QPN of its protection (review of
/// issue 30, A1). Seen failing on the code before: holder of 0x500 stayed the server,
/// 0x501 had none.
#[test]
fn a_reformatted_rep_moves_the_qpn_binding() {
    let mut fabric = Fabric::new(2, 9);
    let n1 = &fabric.nodes[1];
    let server = open(n1, Caller::User);
    let _ = listen(n1, server, SERVICE);
    let n0 = &fabric.nodes[0];
    let client = open(n0, Caller::User);
    let c = create(n0, client);
    must(
        n0,
        client,
        code::CONNECT,
        connect_in(c, SERVICE, 0x321).as_bytes(),
        0,
    );
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let s = channel_events(n1, server)[0].new_handle;
    let out = QpTransitionsOut::SIZE as usize;
    format_rep(n1, server, s, 0x500);
    assert_eq!(holder(n1, 0x500), Some(server.raw()));
    format_rep(n1, server, s, 0x501);
    assert_eq!(holder(n1, 0x500), None, "the first QPN is free again");
    assert_eq!(holder(n1, 0x501), Some(server.raw()));
    // Another user may now name 0x500, not 0x501.
    let other = open(n1, Caller::User);
    let _ = listen(n1, other, SERVICE + 1);
    let n0 = &fabric.nodes[0];
    let c2 = create(n0, client);
    let mut c2_in = connect_in(c2, SERVICE, 0x322);
    c2_in.service_id = SERVICE + 1;
    must(n0, client, code::CONNECT, c2_in.as_bytes(), 0);
    fabric.run_for(100_000);
    let n1 = &fabric.nodes[1];
    let o = channel_events(n1, other)[0].new_handle;
    let denied = n1.ioctl_now(
        other,
        code::FORMAT_REP,
        format_rep_in(o, 0x501).as_bytes(),
        out,
    );
    assert_eq!(denied.status, status::ACCESS_DENIED);
    format_rep(n1, other, o, 0x500);
    // The server's endpoint going leaves 0x501 unbound, and 0x500 the other user's.
    must(n1, server, code::DESTROY, handle_in(s).as_bytes(), 0);
    assert_eq!(holder(n1, 0x501), None);
    assert_eq!(holder(n1, 0x500), Some(other.raw()));
}

/// A QPN that endpoints of two owners bind is nobody's to name any more: the first user
/// to name a QPN that a kernel client's QP (or another handle's) turns out to use cannot
/// go on sending REQs with it and tear that connection down (review of issue 30, A2).
/// Administrators (and kernel clients) name any QPN and so bind it beside a user.
#[test]
fn a_qpn_bound_by_two_owners_is_no_users_to_name() {
    let fabric = Fabric::new(2, 10);
    let n1 = &fabric.nodes[1];
    let server = open(n1, Caller::Administrator);
    let _ = listen(n1, server, SERVICE);
    let n0 = &fabric.nodes[0];
    let (squatter, admin) = (open(n0, Caller::User), open(n0, Caller::Administrator));
    let a = create(n0, squatter);
    must(
        n0,
        squatter,
        code::CONNECT,
        connect_in(a, SERVICE, 0x777).as_bytes(),
        0,
    );
    assert_eq!(holder(n0, 0x777), Some(squatter.raw()));
    let b = create(n0, admin);
    must(
        n0,
        admin,
        code::CONNECT,
        connect_in(b, SERVICE, 0x777).as_bytes(),
        0,
    );
    assert_ne!(holder(n0, 0x777), Some(squatter.raw()));
    assert_ne!(holder(n0, 0x777), Some(admin.raw()));
    let c = create(n0, squatter);
    let denied = n0.ioctl_now(
        squatter,
        code::CONNECT,
        connect_in(c, SERVICE, 0x777).as_bytes(),
        0,
    );
    assert_eq!(denied.status, status::ACCESS_DENIED);
}
