//! ndfltr (core/ndfltr/kernel/nd_ep.cpp, the NetworkDirect v2 provider) on ibcm's `iba_cm`,
//! call for call (`c/ndfltr.c`), over the simulated fabric under the host verifier. These
//! replays, not our idea of a client, are the acceptance tests of the interface: each step
//! names the nd_ep.cpp lines it replays and the AL lines (core/al/kernel/al_cm_cep.c) of
//! what it checks.

mod harness;
mod replay;

use std::sync::Arc;

use ibcm_iba_cm::abi::{event_type as ev, qp_state, status};
use ibcm_iba_cm_ctest as _;

use harness::{World, path};
use replay::{FakeQp, Host, NdEp, NdParam, nd};

const A_IP: [u8; 4] = [10, 0, 0, 1];
const B_IP: [u8; 4] = [10, 0, 0, 2];
const PORT: u16 = 7000;
const SETTLE: u64 = 200_000;
/// ndfltr's StartingPSNs (m_StartingPsn = RtlRandomEx, nd_ep.cpp:66).
const A_PSN: u32 = 0x0012_3456;
const B_PSN: u32 = 0x0065_4321;
const PENDING: i32 = 0x0000_0103;
/// STATUS_IO_TIMEOUT, STATUS_CONNECTION_REFUSED, STATUS_DEVICE_REMOVED (ntstatus.h).
const IO_TIMEOUT: i32 = 0xC000_00B5_u32 as i32;
const CONNECTION_REFUSED: i32 = 0xC000_0236_u32 as i32;

struct Sides {
    w: World,
    a: Arc<Host>,
    b: Arc<Host>,
}

fn sides(seed: u64) -> Sides {
    let w = World::new(seed);
    let a = Arc::new(Host::new(&w.a));
    let b = Arc::new(Host::new(&w.b));
    Sides { w, a, b }
}

/// B: an ndfltr listener on B_IP:PORT (Bind: create_id with ListenHandler, nd_ep.cpp:399;
/// Listen: the RDMA CM header with IB_REQ_CM_RDMA_CMP_DST_IP, 2121) and a connector
/// waiting in its queue (GetConnectionRequest, 2185-2219).
fn listening(s: &Sides) -> (NdEp, NdEp) {
    let (listener, passive) = (
        NdEp::new(&s.b, nd::LISTENER, 0),
        NdEp::new(&s.b, nd::CONNECTOR, B_PSN),
    );
    assert_eq!(listener.bind(B_IP, PORT), status::SUCCESS);
    assert_eq!(listener.listen(), status::SUCCESS);
    assert_eq!(listener.state(), nd::LISTENING);
    // No request yet: get_request_ex fails, the connector waits (2197-2209).
    assert_eq!(listener.get_connection_request(&passive), PENDING);
    assert_eq!(passive.state(), nd::QUEUED);
    (listener, passive)
}

/// A: a connector bound (create_id with CmHandler, nd_ep.cpp:401; the port from the cid,
/// 411-414) connecting (Connect, 568-638; SendIbCmReq, 910-969).
fn connecting(s: &Sides, qp: &mut FakeQp, param: &NdParam) -> NdEp {
    let active = NdEp::new(&s.a, nd::CONNECTOR, A_PSN);
    assert_eq!(active.bind(A_IP, 0), status::SUCCESS);
    assert_ne!(active.local_port(), 0);
    assert_eq!(active.connect(qp, B_IP, PORT, &path(0, 1), param), PENDING);
    assert_eq!(active.state(), nd::REQ_SENT);
    active
}

fn clean(eps: &[&NdEp]) {
    for e in eps {
        assert_eq!(
            e.recursions(),
            0,
            "a callback ran under ndfltr's queue lock"
        );
        for seen in e.seen() {
            assert_eq!(
                seen.at_dispatch, 1,
                "callback below DISPATCH_LEVEL: {seen:?}"
            );
        }
    }
}

/// ndfltr's connection, both sides: the listener's callback takes the request with
/// get_request_ex under its queue lock (nd_ep.cpp:2033-2062, 1978); Accept is format_rep
/// (the INIT attributes), RTR and RTS, then send_formatted_rep (1319-1346); the active
/// side's CompleteConnect moves its QP to INIT, RTR, RTS and sends the RTU (1113-1162).
/// Both QPs agree: each side's send PSN is the other's receive PSN (al_cm_cep.c:877,
/// 1316, 4865, 5057). Then Disconnect both ways (1848-1894).
#[test]
fn ndfltr_connects_accepts_and_disconnects() {
    let mut s = sides(201);
    let (listener, passive) = listening(&s);
    let mut qp_a = FakeQp::new(0x11);
    let active = connecting(&s, &mut qp_a, &NdParam::new(&[0xA1; 12], 4, 2, 6, 7));
    s.w.run(SETTLE);
    assert_eq!(passive.state(), nd::REQ_RECEIVED);
    assert_eq!(listener.completions(), 1);
    // nd_ep.cpp:2022-2023: m_ReadLimits from the REQ event (al_cm_cep.c:6260-6261).
    assert_eq!(passive.read_limits(), (4, 2));
    let mut qp_b = FakeQp::new(0x22);
    assert_eq!(
        passive.accept(&mut qp_b, &NdParam::new(&[0xB2; 8], 3, 2, 0, 5)),
        PENDING
    );
    let all = qp_state::INIT | qp_state::RTR | qp_state::RTS;
    assert_eq!(
        qp_b.modified, all,
        "INIT (format_rep), RTR, RTS before the REP"
    );
    let (b_rtr, b_rts) = (qp_b.rtr(), qp_b.rts());
    // ModifyQp's overrides (nd_ep.cpp:1043-1048).
    assert_eq!(
        (b_rtr.resp_res, b_rtr.rnr_nak_timeout, b_rts.init_depth),
        (4, 12, 2)
    );
    s.w.run(SETTLE);
    // ProcessCmRep (671-692).
    assert_eq!(active.types(), [ev::REP_RECEIVED]);
    assert_eq!(active.state(), nd::REP_RECEIVED);
    assert_eq!(active.last_status(), status::SUCCESS);
    // nd_ep.cpp:683, 686: Inbound and Outbound from the REP event
    // (al_cm_cep.c:6292-6293).
    assert_eq!(active.read_limits(), (3, 2));
    assert_eq!(active.complete_connect(9), status::SUCCESS);
    assert_eq!(active.state(), nd::CONNECTED);
    assert_eq!(qp_a.modified, all);
    let (a_rtr, a_rts) = (qp_a.rtr(), qp_a.rts());
    assert_eq!(a_rts.sq_psn.get(), b_rtr.rq_psn.get());
    assert_eq!(b_rts.sq_psn.get(), a_rtr.rq_psn.get());
    assert_eq!(a_rtr.dest_qp.get(), 0x22);
    assert_eq!(b_rtr.dest_qp.get(), 0x11);
    s.w.run(SETTLE);
    // ProcessCmRtu (695-711).
    assert_eq!(passive.types(), [ev::RTU_RECEIVED]);
    assert_eq!(passive.state(), nd::CONNECTED);

    // A's DREQ (1863); B's ProcessCmDreq (714-743), then B's DREP at PASSIVE_LEVEL (1879).
    assert_eq!(active.disconnect(), PENDING);
    s.w.run(SETTLE);
    assert_eq!(passive.state(), nd::PASSIVE_DISCONNECT);
    assert_eq!(passive.disconnect(), status::SUCCESS);
    assert_eq!(passive.state(), nd::DISCONNECTED);
    s.w.run(SETTLE);
    // CompleteDisconnect (746-754).
    assert_eq!(active.types(), [ev::REP_RECEIVED, ev::DREP_RECEIVED]);
    assert_eq!(active.state(), nd::DISCONNECTED);
    assert_eq!(active.flushes(), 1);
    clean(&[&listener, &passive, &active]);
    for e in [&passive, &listener, &active] {
        e.destructor();
    }
    s.w.finish();
}

/// ndfltr keeps a connector's id across a failed connect: a REJ (ProcessCmRej,
/// nd_ep.cpp:757-775) or a REQ timeout (CmReqError, 778-794) puts it back in
/// NdEpAddressBound (nd_ep.h:92-93), and the next Connect sends the REQ on the same
/// `m_hIfc` (964). AL's CEP is idle again after either (al_cm_cep.c:987-989: "Abort
/// connection establishment. No transition to timewait"). Passive reject: Reject in
/// NdEpReqReceived (1424-1438).
#[test]
fn ndfltr_reuses_its_id_after_a_rej_and_after_a_timeout() {
    let mut s = sides(202);
    let (listener, passive) = listening(&s);
    let mut qp_a = FakeQp::new(0x11);
    let param = NdParam::new(&[0xA1; 12], 1, 1, 6, 7);
    let active = connecting(&s, &mut qp_a, &param);
    let id = active.id();
    s.w.run(SETTLE);
    assert_eq!(passive.state(), nd::REQ_RECEIVED);
    assert_eq!(passive.reject(&NdParam::new(&[0xEE; 9], 0, 0, 0, 0)), 0);
    assert_eq!(passive.state(), nd::DISCONNECTED);
    s.w.run(SETTLE);
    assert_eq!(active.types(), [ev::REJ_RECEIVED]);
    assert_eq!(
        active.seen()[0].rej_reason,
        28,
        "IB_REJ_USER_DEFINED (1428-1435)"
    );
    assert_eq!(active.state(), nd::ADDRESS_BOUND);
    assert_eq!(active.last_status(), CONNECTION_REFUSED);

    // The same id connects again, to a listener that now takes it.
    let again = NdEp::new(&s.b, nd::CONNECTOR, B_PSN);
    assert_eq!(listener.get_connection_request(&again), PENDING);
    let mut qp_a2 = FakeQp::new(0x12);
    assert_eq!(
        active.connect(&mut qp_a2, B_IP, PORT, &path(0, 1), &param),
        PENDING
    );
    assert_eq!(active.state(), nd::REQ_SENT, "send_req on the REJected id");
    assert_eq!(active.id(), id);
    s.w.run(SETTLE);
    assert_eq!(again.state(), nd::REQ_RECEIVED);
    let mut qp_b = FakeQp::new(0x22);
    assert_eq!(
        again.accept(&mut qp_b, &NdParam::new(&[], 1, 1, 0, 7)),
        PENDING
    );
    s.w.run(SETTLE);
    assert_eq!(active.state(), nd::REP_RECEIVED);
    // Active reject: Reject in NdEpRepReceived (1424-1438); B's accept ends refused
    // (ProcessCmRej in NdEpRepSent, 765-769).
    assert_eq!(active.reject(&NdParam::new(&[0xDD; 3], 0, 0, 0, 0)), 0);
    s.w.run(SETTLE);
    assert_eq!(again.types(), [ev::REJ_RECEIVED]);
    assert_eq!(again.state(), nd::DISCONNECTED);
    assert_eq!(again.last_status(), CONNECTION_REFUSED);
    assert_eq!(active.state(), nd::DISCONNECTED);

    // A fresh connector times out (nothing reaches B) and connects again on its id.
    let mut qp_a3 = FakeQp::new(0x13);
    let lonely = connecting(&s, &mut qp_a3, &param);
    let lonely_id = lonely.id();
    s.w.fabric.faults.loss = 1.0;
    // 16 REQs of IB_CMA_CM_RESPONSE_TIMEOUT (4.3 s) each, and their waits.
    s.w.run(200_000_000_000);
    assert_eq!(lonely.types(), [ev::REQ_ERROR]);
    assert_eq!(lonely.state(), nd::ADDRESS_BOUND);
    assert_eq!(lonely.last_status(), IO_TIMEOUT, "nd_ep.cpp:790");
    s.w.fabric.faults.loss = 0.0;
    let third = NdEp::new(&s.b, nd::CONNECTOR, B_PSN);
    assert_eq!(listener.get_connection_request(&third), PENDING);
    let mut qp_a4 = FakeQp::new(0x14);
    assert_eq!(
        lonely.connect(&mut qp_a4, B_IP, PORT, &path(0, 1), &param),
        PENDING
    );
    assert_eq!(lonely.id(), lonely_id);
    s.w.run(SETTLE);
    assert_eq!(
        third.state(),
        nd::REQ_RECEIVED,
        "the timed-out id's second REQ"
    );
    assert_eq!(third.reject(&NdParam::new(&[], 0, 0, 0, 0)), 0);
    s.w.run(SETTLE);
    assert_eq!(lonely.state(), nd::ADDRESS_BOUND);
    clean(&[&listener, &passive, &active, &again, &lonely, &third]);
    for e in [&passive, &again, &third, &listener, &active, &lonely] {
        e.destructor();
    }
    s.w.finish();
}

/// Both sides disconnect at once: each sends a DREQ (nd_ep.cpp:1863) and then receives
/// the other's in NdEpActiveDisconnect, where ndfltr sends the DREP from inside its
/// callback, under its queue lock (739). Neither may be called back under that lock, and
/// both end disconnected (IBA 12.9.6: a DREQ received in DREQ_SENT is answered).
#[test]
fn crossing_disconnects_send_drep_from_the_callback() {
    let mut s = sides(203);
    let (listener, passive) = listening(&s);
    let mut qp_a = FakeQp::new(0x11);
    let active = connecting(&s, &mut qp_a, &NdParam::new(&[], 1, 1, 6, 7));
    s.w.run(SETTLE);
    let mut qp_b = FakeQp::new(0x22);
    assert_eq!(
        passive.accept(&mut qp_b, &NdParam::new(&[], 1, 1, 0, 7)),
        PENDING
    );
    s.w.run(SETTLE);
    assert_eq!(active.complete_connect(9), status::SUCCESS);
    s.w.run(SETTLE);
    assert_eq!(passive.state(), nd::CONNECTED);
    // Both DREQs leave before either arrives.
    assert_eq!(active.disconnect(), PENDING);
    assert_eq!(passive.disconnect(), PENDING);
    s.w.run(SETTLE);
    for e in [&active, &passive] {
        assert_eq!(e.state(), nd::DISCONNECTED);
        assert!(
            e.types().contains(&ev::DREQ_RECEIVED),
            "the crossing DREQ: {:?}",
            e.types()
        );
        assert_eq!(e.flushes(), 1);
        assert_eq!(e.pending(), 0, "the Disconnect request completed");
    }
    clean(&[&listener, &passive, &active]);
    for e in [&passive, &listener, &active] {
        e.destructor();
    }
    s.w.finish();
}

/// Item 5: ndfltr destroys the id of an endpoint alive at HCA removal twice: from its
/// remove handler (nd_ep.cpp:149-156) and again from its destructor when the process
/// closes the handle (100-102); `m_hIfc` is never cleared. In between, other endpoints
/// (another process's) create ids. The second `destroy_id` must reach none of them: the
/// destroyed pointer meets a dead slot however many ids were created meanwhile.
#[test]
fn the_second_destroy_at_hca_removal_reaches_no_other_id() {
    let mut s = sides(204);
    let (listener, passive) = listening(&s);
    let mut qp_a = FakeQp::new(0x11);
    let active = connecting(&s, &mut qp_a, &NdParam::new(&[], 1, 1, 6, 7));
    s.w.run(SETTLE);
    let mut qp_b = FakeQp::new(0x22);
    assert_eq!(
        passive.accept(&mut qp_b, &NdParam::new(&[], 1, 1, 0, 7)),
        PENDING
    );
    s.w.run(SETTLE);
    assert_eq!(active.complete_connect(9), status::SUCCESS);
    s.w.run(SETTLE);
    assert_eq!(passive.state(), nd::CONNECTED);

    // HCA removal on B: the connected endpoint's id destroyed, the pointer kept.
    passive.remove_handler();
    let stale = passive.id();
    assert!(!stale.is_null());
    let in_use = s.w.b.ids_in_use();
    // Another process binds connectors meanwhile (create_id, nd_ep.cpp:401), over and
    // over: the pool's slots cycle many times.
    let mut others = Vec::new();
    for i in 0..3 * harness::CONFIG.ids {
        let e = NdEp::new(&s.b, nd::CONNECTOR, B_PSN);
        assert_eq!(e.bind(B_IP, 0), status::SUCCESS, "bind {i}");
        if i % 4 == 0 {
            others.push(e);
        } else {
            e.destructor();
        }
    }
    let live = s.w.b.ids_in_use();
    assert_eq!(live, in_use + others.len());
    // The destructor: destroy_id on the same pointer (nd_ep.cpp:101-102).
    passive.destructor();
    assert_eq!(
        s.w.b.ids_in_use(),
        live,
        "the stale destroy_id destroyed an id"
    );
    for e in &others {
        // An idle id: a DREQ is in the wrong state, not on an unknown id.
        assert_eq!(
            s.b.raw_send_dreq(e.id()),
            status::INVALID_DEVICE_STATE,
            "a live id still answers"
        );
    }
    for e in &others {
        e.destructor();
    }
    // A sees B's connection end (its DREQ, or nothing) and goes away too.
    s.w.run(SETTLE);
    clean(&[&listener, &passive, &active]);
    for e in [&listener, &active] {
        e.destructor();
    }
    s.w.finish();
}

/// ndfltr's listeners on one port, one per local address: Listen compares the RDMA CM
/// header's destination address (nd_ep.cpp:2121-2127: `FIELD_OFFSET(ib_cm_rdma_req_t,
/// pdata)` bytes, IB_REQ_CM_RDMA_CMP_DST_IP; AL al_cm_cep.c:2850-2864). A REQ reaches the
/// listener of its destination; one for an address nobody listens on is refused (REJ
/// "invalid service ID", IBA Table 112 code 8), which ndfltr's connect reports as refused
/// (ProcessCmRej, 757-763).
#[test]
fn listeners_on_one_port_compare_the_destination_address() {
    let mut s = sides(205);
    const B_IP2: [u8; 4] = [10, 0, 0, 3];
    let (l1, l2) = (
        NdEp::new(&s.b, nd::LISTENER, 0),
        NdEp::new(&s.b, nd::LISTENER, 0),
    );
    assert_eq!(l1.bind(B_IP, PORT), status::SUCCESS);
    assert_eq!(l2.bind(B_IP2, PORT), status::SUCCESS);
    assert_eq!(l1.listen(), status::SUCCESS);
    assert_eq!(l2.listen(), status::SUCCESS);
    let (p1, p2) = (
        NdEp::new(&s.b, nd::CONNECTOR, B_PSN),
        NdEp::new(&s.b, nd::CONNECTOR, B_PSN),
    );
    assert_eq!(l1.get_connection_request(&p1), PENDING);
    assert_eq!(l2.get_connection_request(&p2), PENDING);
    let param = NdParam::new(&[0x42], 1, 1, 6, 7);
    let mut qps = [FakeQp::new(0x11), FakeQp::new(0x12), FakeQp::new(0x13)];
    let [q1, q2, q3] = &mut qps;
    let connect = |qp: &mut FakeQp, ip| {
        let e = NdEp::new(&s.a, nd::CONNECTOR, A_PSN);
        assert_eq!(e.bind(A_IP, 0), status::SUCCESS);
        assert_eq!(e.connect(qp, ip, PORT, &path(0, 1), &param), PENDING);
        e
    };
    let to2 = connect(q2, B_IP2);
    s.w.run(SETTLE);
    assert_eq!(p2.state(), nd::REQ_RECEIVED);
    assert_eq!(
        p1.state(),
        nd::QUEUED,
        "the other address's listener heard nothing"
    );
    let to1 = connect(q1, B_IP);
    let nowhere = connect(q3, [10, 0, 0, 9]);
    s.w.run(SETTLE);
    assert_eq!(p1.state(), nd::REQ_RECEIVED);
    assert_eq!(nowhere.types(), [ev::REJ_RECEIVED]);
    assert_eq!(nowhere.seen()[0].rej_reason, 8);
    assert_eq!(nowhere.state(), nd::ADDRESS_BOUND);
    assert_eq!(nowhere.last_status(), CONNECTION_REFUSED);
    for p in [&p1, &p2] {
        assert_eq!(p.reject(&NdParam::new(&[], 0, 0, 0, 0)), status::SUCCESS);
    }
    s.w.run(SETTLE);
    for e in [&to1, &to2] {
        assert_eq!(e.state(), nd::ADDRESS_BOUND);
    }
    clean(&[&l1, &l2, &p1, &p2, &to1, &to2, &nowhere]);
    for e in [&p1, &p2, &l1, &l2, &to1, &to2, &nowhere] {
        e.destructor();
    }
    s.w.finish();
}

/// Timeouts on both sides: with every MAD lost after the REQ, ndfltr's accepted endpoint
/// hears `rep_error` and flushes with STATUS_IO_TIMEOUT (CmRepError, nd_ep.cpp:797-807),
/// and the connector, whose REP never came, hears `req_error` and is bound again
/// (CmReqError, 778-794).
#[test]
fn an_unanswered_rep_times_out_into_rep_error() {
    let mut s = sides(206);
    let (listener, passive) = listening(&s);
    let mut qp_a = FakeQp::new(0x11);
    let active = connecting(&s, &mut qp_a, &NdParam::new(&[], 1, 1, 6, 7));
    s.w.run(SETTLE);
    assert_eq!(passive.state(), nd::REQ_RECEIVED);
    // From now on nothing gets through: the REP and its retries are lost.
    s.w.fabric.faults.loss = 1.0;
    let mut qp_b = FakeQp::new(0x22);
    assert_eq!(
        passive.accept(&mut qp_b, &NdParam::new(&[], 1, 1, 0, 7)),
        PENDING
    );
    s.w.run(200_000_000_000);
    assert_eq!(passive.types(), [ev::REP_ERROR]);
    assert_eq!(passive.state(), nd::DISCONNECTED);
    assert_eq!(passive.last_status(), IO_TIMEOUT);
    assert_eq!(passive.flushes(), 1);
    assert_eq!(active.types(), [ev::REQ_ERROR]);
    assert_eq!(active.state(), nd::ADDRESS_BOUND);
    s.w.fabric.faults.loss = 0.0;
    clean(&[&listener, &passive, &active]);
    for e in [&passive, &listener, &active] {
        e.destructor();
    }
    s.w.finish();
}
