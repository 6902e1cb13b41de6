//! WinVerbs (core/winverbs/kernel/wv_ep.c) on ibcm's `iba_cm`, call for call (`c/winverbs.c`),
//! over the simulated fabric under the host verifier. These replays, not our idea of a
//! client, are the acceptance tests of the interface: each step names the wv_ep.c lines
//! it replays and the AL lines (core/al/kernel/al_cm_cep.c) of what it checks.

mod harness;
mod replay;

use std::sync::Arc;

use ibcm_iba_cm::abi::{event_type as ev, qp_state, status};
use ibcm_iba_cm_ctest as _;

use harness::{CONFIG, World, path};
use replay::{FakeQp, Host, NdEp, NdParam, WvEp, WvParam, nd, rdma_cm_sid, wv};

const A_IP: [u8; 4] = [10, 0, 0, 1];
const B_IP: [u8; 4] = [10, 0, 0, 2];
const PORT: u16 = 7000;
const SETTLE: u64 = 200_000;
/// WinVerbs' random StartingPSNs (RtlRandomEx, wv_ep.c:616, 829): 32 bits, of which the
/// REQ and REP carry 24 (al_cm_conn.h conn_req_set_starting_psn).
const A_PSN: u32 = 0xAB12_3456;
const B_PSN: u32 = 0xCD65_4321;
/// STATUS_TIMEOUT, STATUS_CONNECTION_REFUSED (ntstatus.h).
const TIMEOUT: i32 = 0x0000_0102;
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

/// B: a WinVerbs listen on B_IP:PORT with an endpoint queued by WvEpGetRequest; A: an
/// endpoint with its route, connecting (WvEpBind, WvEpModify(ROUTE), WvEpConnect).
fn requested(s: &mut Sides, qp_a: &FakeQp, param: &WvParam) -> (WvEp, WvEp, WvEp) {
    let (listen, passive, active) = (WvEp::new(&s.b), WvEp::new(&s.b), WvEp::new(&s.a));
    assert_eq!(listen.bind(B_IP, PORT), status::SUCCESS);
    // wv_ep.c:1221-1230, 1238, 1246: a bound address listens with the RDMA CM header and
    // IB_REQ_CM_RDMA_CMP_DST_IP.
    assert_eq!(listen.listen(8), status::SUCCESS);
    assert_eq!(listen.state(), wv::LISTENING);
    // wv_ep.c:1285-1307: queued on the listen; no request yet.
    assert_eq!(listen.get_request(&passive), 0x103);
    assert_eq!(passive.state(), wv::QUEUED);
    assert_eq!(active.bind(A_IP, 0x4000), status::SUCCESS);
    assert_eq!(active.set_route(&path(0, 1)), status::SUCCESS);
    // wv_ep.c:641-647: create_id and send_req under the queue lock.
    assert_eq!(
        active.connect(qp_a, B_IP, PORT, param, A_PSN),
        status::SUCCESS
    );
    assert_eq!(active.state(), wv::ACTIVE_CONNECT);
    s.w.run(SETTLE);
    // wv_ep.c:1189-1196 -> 1125-1187: the listen's callback pulled the request.
    assert_eq!(passive.state(), wv::PASSIVE_CONNECT);
    assert_eq!(listen.completions(), 1);
    (listen, passive, active)
}

fn no_recursion(eps: &[&WvEp]) {
    for e in eps {
        assert_eq!(
            e.recursions(),
            0,
            "a callback ran under WinVerbs' queue lock"
        );
        for seen in e.seen() {
            assert_eq!(
                seen.at_dispatch, 1,
                "callback below DISPATCH_LEVEL: {seen:?}"
            );
        }
    }
}

/// Item 4: the REQ event has the fields AL's `__format_event_req` fills; WinVerbs reports
/// RetryCount to user mode from it (wv_ep.c:1174). Then B rejects (WvEpReject,
/// wv_ep.c:1001-1012) and A's connect completes refused (wv_ep.c:564-572).
#[test]
fn request_fields_reach_winverbs_and_a_passive_reject_refuses_the_connect() {
    let mut s = sides(101);
    let qp_a = FakeQp::new(0x11);
    let param = WvParam::new(&[0xA1; 10], 3, 2, 5, 6);
    let (listen, passive, active) = requested(&mut s, &qp_a, &param);
    let r = passive.req_event();
    // al_cm_cep.c:6255 (24 bits, as the REQ carries them).
    assert_eq!(r.starting_psn.get(), A_PSN & 0x00FF_FFFF);
    // 6259: WinVerbs sends IB_CMA_MAX_CM_RETRIES (wv_ep.c:621).
    assert_eq!(r.max_cm_retries, 15);
    // 6262, 6264: IB_CMA_CM_RESPONSE_TIMEOUT both (wv_ep.c:624, 626).
    assert_eq!(r.remote_resp_timeout, 20);
    assert_eq!(r.local_resp_timeout, 20);
    // 6263: wv_ep.c:625.
    assert_eq!(r.flow_ctrl, 1);
    // 6265-6266.
    assert_eq!((r.rnr_retry_cnt, r.retry_cnt), (6, 5));
    // 6260-6261: this side's view of the read limits.
    assert_eq!((r.resp_res, r.init_depth), (2, 3));
    assert_eq!(r.qpn.get(), 0x11);
    // wv_ep.c:1172-1175: what WinVerbs hands to user mode.
    let p = passive.param();
    assert_eq!(
        (
            p.responder_resources,
            p.initiator_depth,
            p.retry_count,
            p.rnr_retry_count
        ),
        (2, 3, 5, 6)
    );
    assert_eq!(p.data[..10], [0xA1; 10]);

    assert_eq!(passive.reject(&[0xEE; 20]), status::SUCCESS);
    assert_eq!(passive.state(), wv::DISCONNECTED);
    s.w.run(SETTLE);
    assert_eq!(active.types(), [ev::REJ_RECEIVED]);
    let rej = active.seen()[0];
    assert_eq!(rej.rej_reason, 28, "IB_REJ_USER_DEFINED (wv_ep.c:1008)");
    assert_eq!((rej.pdata_len, rej.pdata0), (148, 0xEE));
    assert_eq!(active.state(), wv::DISCONNECTED);
    assert_eq!(active.last_status(), CONNECTION_REFUSED);
    assert_eq!(active.param().data[..20], [0xEE; 20], "wv_ep.c:387-394");
    no_recursion(&[&listen, &passive, &active]);
    for e in [&passive, &listen, &active] {
        e.free();
    }
    s.w.finish();
}

/// Item 2 (with item 1): WinVerbs' passive accept (wv_ep.c:816-871) moves its QP to INIT,
/// RTR and RTS (get_qp_attr, 722/733/760) before `send_rep` (858), and overrides
/// resp_res and rq_psn at RTR (738-741) and init_depth at RTS (765-767) with what it puts
/// in the REP. AL answers RTR in REQ_RCVD (al_cm_cep.c:6480-6490) and RTS there too
/// (6553-6566). The active side then moves its QP (wv_ep.c:789-792) and sends the RTU
/// (803). Both QPs must agree: each side's send PSN is the other's receive PSN, and a
/// receive PSN is the StartingPSN its own side sent (al_cm_cep.c:4865 and 5057 set
/// `rq_psn`, 877 and 1316 set `sq_psn` from the peer's message; 6495 and 6569 hand them
/// out). Then WinVerbs' disconnect both ways (wv_ep.c:1044-1072).
#[test]
fn winverbs_accept_moves_the_qp_to_rts_before_the_rep() {
    let mut s = sides(102);
    let qp_a = FakeQp::new(0x11);
    let param = WvParam::new(&[0xA1; 10], 3, 2, 5, 6);
    let (listen, passive, active) = requested(&mut s, &qp_a, &param);
    let mut qp_b = FakeQp::new(0x22);
    let accept = WvParam::new(&[0xB2; 5], 2, 3, 0, 4);
    assert_eq!(passive.accept(&mut qp_b, &accept, B_PSN), status::SUCCESS);
    let all = qp_state::INIT | qp_state::RTR | qp_state::RTS;
    assert_eq!(qp_b.modified, all, "INIT, RTR and RTS before the REP");
    let (b_rtr, b_rts) = (qp_b.rtr(), qp_b.rts());
    assert_eq!(b_rtr.rq_psn.get(), B_PSN, "wv_ep.c:740");
    assert_eq!(
        (b_rtr.resp_res, b_rts.init_depth),
        (2, 3),
        "wv_ep.c:739, 766"
    );
    assert_eq!(b_rtr.dest_qp.get(), 0x11);
    s.w.run(SETTLE);
    // wv_ep.c:530-537: the REP completes the connect.
    assert_eq!(active.types(), [ev::REP_RECEIVED]);
    assert_eq!(active.last_status(), status::SUCCESS);
    let mut qp_a = qp_a;
    assert_eq!(
        active.accept(&mut qp_a, &WvParam::new(&[0xC3], 0, 0, 0, 0), 0),
        0
    );
    assert_eq!(qp_a.modified, all);
    assert_eq!(active.state(), wv::CONNECTED);
    let (a_rtr, a_rts) = (qp_a.rtr(), qp_a.rts());
    assert_eq!(
        a_rtr.rq_psn.get(),
        A_PSN & 0x00FF_FFFF,
        "al_cm_cep.c:4865, 6495"
    );
    assert_eq!(
        a_rts.sq_psn.get(),
        B_PSN & 0x00FF_FFFF,
        "al_cm_cep.c:1316, 6569"
    );
    assert_eq!(
        b_rts.sq_psn.get(),
        A_PSN & 0x00FF_FFFF,
        "al_cm_cep.c:877, 6569"
    );
    assert_eq!(a_rts.sq_psn.get(), b_rtr.rq_psn.get() & 0x00FF_FFFF);
    // (WinVerbs' RTR carries its 32-bit random value; the QP keeps 24 bits.)
    assert_eq!(b_rts.sq_psn.get(), a_rtr.rq_psn.get());
    s.w.run(SETTLE);
    // wv_ep.c:538-545.
    assert_eq!(passive.types(), [ev::RTU_RECEIVED]);
    assert_eq!(passive.state(), wv::CONNECTED);
    assert_eq!(passive.last_status(), status::SUCCESS);

    // wv_ep.c:1047: A's DREQ; B's callback (546-560), then B's DREP at PASSIVE_LEVEL (1061).
    assert_eq!(active.disconnect(), status::SUCCESS);
    assert_eq!(active.state(), wv::ACTIVE_DISCONNECT);
    s.w.run(SETTLE);
    assert_eq!(passive.state(), wv::PASSIVE_DISCONNECT);
    assert_eq!(passive.disconnect(), status::SUCCESS);
    assert_eq!(passive.state(), wv::DISCONNECTED);
    s.w.run(SETTLE);
    assert_eq!(active.types(), [ev::REP_RECEIVED, ev::DREP_RECEIVED]);
    assert_eq!(active.state(), wv::DISCONNECTED);
    no_recursion(&[&listen, &passive, &active]);
    for e in [&passive, &listen, &active] {
        e.free();
    }
    s.w.finish();
}

/// Item 4: the REP event has the fields AL's `__format_event_rep` fills; WinVerbs keeps
/// the RNR retry count for user mode (wv_ep.c:384). The passive side is ndfltr (format_rep
/// then send_formatted_rep). Then WinVerbs rejects the REP (wv_ep.c:1001-1012, in
/// WvEpActiveConnect) and ndfltr's accept ends refused (nd_ep.cpp:765-769).
#[test]
fn rep_fields_reach_winverbs_and_an_active_reject_refuses_the_accept() {
    let mut s = sides(103);
    let (listener, passive) = (
        NdEp::new(&s.b, nd::LISTENER, 0),
        NdEp::new(&s.b, nd::CONNECTOR, B_PSN),
    );
    assert_eq!(listener.bind(B_IP, PORT), status::SUCCESS);
    assert_eq!(listener.listen(), status::SUCCESS);
    assert_eq!(listener.get_connection_request(&passive), 0x103);
    let active = WvEp::new(&s.a);
    let qp_a = FakeQp::new(0x11);
    assert_eq!(active.bind(A_IP, 0x4000), status::SUCCESS);
    assert_eq!(active.set_route(&path(0, 1)), status::SUCCESS);
    let param = WvParam::new(&[0xA1; 10], 3, 2, 5, 6);
    assert_eq!(active.connect(&qp_a, B_IP, PORT, &param, A_PSN), 0);
    s.w.run(SETTLE);
    assert_eq!(passive.state(), nd::REQ_RECEIVED);
    let mut qp_b = FakeQp::new(0x22);
    let accept = NdParam::new(&[0xB2; 5], 2, 1, 0, 4);
    assert_eq!(passive.accept(&mut qp_b, &accept), 0x103);
    s.w.run(SETTLE);
    let rep = active.seen()[0];
    assert_eq!(rep.event_type, ev::REP_RECEIVED);
    // al_cm_cep.c:6295; ndfltr sends pAccept->RnrRetryCount (nd_ep.cpp:1198).
    assert_eq!(rep.rnr_retry_cnt, 4);
    assert_eq!(active.param().rnr_retry_count, 4, "wv_ep.c:384");
    // 6294; nd_ep.cpp:1197.
    assert_eq!(rep.flow_ctrl, 1);
    // 6284: the TargetACKDelay B's CM put in the REP (its CA's ACK delay).
    let b_delay = s.w.b.node.device.with_engine(|cm| cm.config().ca_ack_delay);
    assert_eq!(rep.target_ack_delay, b_delay);
    assert_ne!(b_delay, 0);
    // 6292-6293: this side's view of the read limits (the REP's InitiatorDepth and
    // ResponderResources).
    assert_eq!((rep.resp_res, rep.init_depth), (1, 2));
    assert_eq!((rep.pdata_len, rep.pdata0), (196, 0xB2));

    assert_eq!(active.reject(&[0xDD; 7]), status::SUCCESS);
    assert_eq!(active.state(), wv::DISCONNECTED);
    s.w.run(SETTLE);
    assert_eq!(passive.types(), [ev::REJ_RECEIVED]);
    assert_eq!(passive.state(), nd::DISCONNECTED);
    assert_eq!(passive.last_status(), CONNECTION_REFUSED);
    assert_eq!(passive.flushes(), 1);
    assert_eq!(passive.recursions() + listener.recursions(), 0);
    no_recursion(&[&active]);
    active.free();
    passive.destructor();
    listener.destructor();
    s.w.finish();
}

/// Item 4: the MRA event reports the MRA's private data as AL does: the whole 222-byte
/// field (al_cm_cep.c:6311-6312). WinVerbs ignores the event (wv_ep.c:573-574).
#[test]
fn mra_event_reports_its_private_data_as_al() {
    let mut s = sides(104);
    let (listen, child) = (s.w.b.cep(), s.w.b.cep());
    assert_eq!(listen.listen(rdma_cm_sid(PORT), None, 0), status::SUCCESS);
    let active = WvEp::new(&s.a);
    let qp_a = FakeQp::new(0x11);
    assert_eq!(active.bind(A_IP, 0x4000), status::SUCCESS);
    assert_eq!(active.set_route(&path(0, 1)), status::SUCCESS);
    let param = WvParam::new(&[0xA1; 10], 3, 2, 5, 6);
    assert_eq!(active.connect(&qp_a, B_IP, PORT, &param, A_PSN), 0);
    s.w.run(SETTLE);
    let mut e = ibcm_iba_cm::abi::IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(&child, &mut e), status::SUCCESS);
    let mut pdata = [0x5A; 222];
    pdata[221] = 0x77;
    assert_eq!(
        s.b.raw_send_mra(child.id_ptr(), 12, &pdata),
        status::SUCCESS
    );
    s.w.run(SETTLE);
    let mra = active.seen()[0];
    assert_eq!(mra.event_type, ev::MRA_RECEIVED);
    assert_eq!(mra.service_timeout, 12);
    assert_eq!(
        (mra.pdata_len, mra.pdata0, mra.pdata_last),
        (222, 0x5A, 0x77)
    );
    assert_eq!(active.state(), wv::ACTIVE_CONNECT);
    assert_eq!(child.rej(28, &[], &[]), status::SUCCESS);
    s.w.run(SETTLE);
    assert_eq!(active.state(), wv::DISCONNECTED);
    no_recursion(&[&active]);
    active.free();
    for c in [&child, &listen] {
        c.destroy();
    }
    s.w.finish();
}

/// Item 5: WinVerbs leaks an id at every reconnect after a REQ timeout: `req_error` puts
/// the endpoint back in WvEpRouteResolved (wv_ep.c:511-518) and the next WvEpConnect's
/// `create_id` overwrites `pIbCmId` (641) without destroying the old one. Under AL each id
/// comes from the nonpaged pool, so such a client fails only when memory does; ibcm's pool
/// must keep growing at PASSIVE_LEVEL. The work item that grows it runs after every
/// delivery DPC (driver/kmdf/host.rs `evt_delivery_dpc` -> `evt_replenish_work_item`),
/// modelled here by `replenish` after each run of the fabric.
#[test]
fn reconnects_after_req_error_leak_ids_and_the_pool_keeps_growing() {
    let mut s = sides(105);
    // Nothing reaches B: every REQ times out.
    s.w.fabric.faults.loss = 1.0;
    let active = WvEp::new(&s.a);
    let qp_a = FakeQp::new(0x11);
    assert_eq!(active.bind(A_IP, 0x4000), status::SUCCESS);
    assert_eq!(active.set_route(&path(0, 1)), status::SUCCESS);
    let param = WvParam::new(&[], 1, 1, 7, 7);
    let reconnects = 3 * CONFIG.ids + 1;
    for i in 0..reconnects {
        assert_eq!(
            active.connect(&qp_a, B_IP, PORT, &param, A_PSN + i as u32),
            status::SUCCESS,
            "connect {i}: ids in use {}",
            s.w.a.ids_in_use()
        );
        // 16 REQs of IB_CMA_CM_RESPONSE_TIMEOUT (4.3 s) each, and their waits.
        s.w.run(200_000_000_000);
        assert_eq!(active.state(), wv::ROUTE_RESOLVED, "connect {i}");
        assert_eq!(active.last_status(), TIMEOUT, "wv_ep.c:514-515");
        s.w.a.cm().replenish();
    }
    assert_eq!(active.ids_created(), reconnects as i32);
    assert_eq!(
        s.w.a.ids_in_use(),
        reconnects,
        "every overwritten id is leaked"
    );
    assert!(s.w.a.cm().ids_allocated() > CONFIG.ids);
    assert_eq!(s.w.a.violations(), vec![]);
    no_recursion(&[&active]);
    // WvEpFree destroys the last id only; the CM's removal takes the leaked ones.
    active.free();
    assert_eq!(s.w.a.ids_in_use(), reconnects - 1);
    let Sides { mut w, a, b } = s;
    drop((a, b));
    w.run(60_000_000_000);
    w.a.remove();
    assert_eq!(w.a.node.device.client_count(), 0);
    assert_eq!(w.a.violations(), vec![]);
    w.b.remove();
}

/// WinVerbs' listens on one port, one per local address (wv_ep.c:1221-1230: the RDMA CM
/// header with IB_REQ_CM_RDMA_CMP_DST_IP): a REQ reaches the listen of its destination
/// address (AL compares the header fields the mask selects, al_cm_cep.c:2850-2864), and a
/// REQ for an address no listen has is refused with REJ "invalid service ID" (IBA Table
/// 112 code 8), which WinVerbs' connect reports as refused (wv_ep.c:564-572).
#[test]
fn listens_on_one_port_compare_the_destination_address() {
    let mut s = sides(106);
    const B_IP2: [u8; 4] = [10, 0, 0, 3];
    let (l1, l2) = (WvEp::new(&s.b), WvEp::new(&s.b));
    assert_eq!(l1.bind(B_IP, PORT), status::SUCCESS);
    assert_eq!(l2.bind(B_IP2, PORT), status::SUCCESS);
    assert_eq!(l1.listen(8), status::SUCCESS);
    assert_eq!(l2.listen(8), status::SUCCESS);
    let (p1, p2) = (WvEp::new(&s.b), WvEp::new(&s.b));
    assert_eq!(l1.get_request(&p1), 0x103);
    assert_eq!(l2.get_request(&p2), 0x103);
    let param = WvParam::new(&[0x42], 1, 1, 7, 7);
    // One QP per connection (a QPN reused towards the same peer is a stale connection,
    // IBA 12.9.8.3.1).
    let connect = |ip, qpn| {
        let e = WvEp::new(&s.a);
        assert_eq!(e.bind(A_IP, 0x4000), status::SUCCESS);
        assert_eq!(e.set_route(&path(0, 1)), status::SUCCESS);
        let qp = FakeQp::new(qpn);
        assert_eq!(e.connect(&qp, ip, PORT, &param, A_PSN), status::SUCCESS);
        e
    };
    let to2 = connect(B_IP2, 0x12);
    s.w.run(SETTLE);
    assert_eq!(p2.state(), wv::PASSIVE_CONNECT);
    assert_eq!(
        p1.state(),
        wv::QUEUED,
        "the other address's listen heard nothing"
    );
    assert_eq!(p2.req_event().pdata[32..36], B_IP2);
    let to1 = connect(B_IP, 0x11);
    let nowhere = connect([10, 0, 0, 9], 0x13);
    s.w.run(SETTLE);
    assert_eq!(p1.state(), wv::PASSIVE_CONNECT);
    assert_eq!(p1.req_event().pdata[32..36], B_IP);
    assert_eq!(nowhere.types(), [ev::REJ_RECEIVED]);
    assert_eq!(nowhere.seen()[0].rej_reason, 8);
    assert_eq!(nowhere.last_status(), CONNECTION_REFUSED);
    for (p, a) in [(&p1, &to1), (&p2, &to2)] {
        assert_eq!(p.reject(&[]), status::SUCCESS);
        let _ = a;
    }
    s.w.run(SETTLE);
    for e in [&to1, &to2] {
        assert_eq!(e.state(), wv::DISCONNECTED);
    }
    no_recursion(&[&l1, &l2, &p1, &p2, &to1, &to2, &nowhere]);
    for e in [&p1, &p2, &l1, &l2, &to1, &to2, &nowhere] {
        e.free();
    }
    s.w.finish();
}
