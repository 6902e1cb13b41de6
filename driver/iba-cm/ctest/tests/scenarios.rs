//! The `iba_cm` interface driven from C, as WinVerbs and ndfltr drive it, over the
//! simulated fabric under the host verifier: every scenario checks both sides, and ends
//! with nothing leaked and no rule broken (no allocation or wait at DISPATCH_LEVEL, no
//! callback under the client's own lock).

mod harness;

// The C client, linked through the package library.
use ibcm_iba_cm_ctest as _;

use harness::{CONFIG, Cep, World, path};
use ibcm_host::node_guid;
use ibcm_iba_cm::abi::{
    IbaCmEvent, IbaCmReqEvent, IbaCmSidrReqEvent, access, apm_state, event_type as ev, qp_opts,
    qp_state, status,
};

const SID: u64 = 0x0000_0000_0000_1234;
const SETTLE: u64 = 200_000;

fn req(e: &IbaCmEvent) -> IbaCmReqEvent {
    assert_eq!(e.event_type, ev::REQ_RECEIVED);
    // SAFETY: the type says the union holds a REQ.
    unsafe { e.data.req }
}

fn sidr_req(e: &IbaCmEvent) -> IbaCmSidrReqEvent {
    assert_eq!(e.event_type, ev::SIDR_REQ_RECEIVED);
    // SAFETY: the type says the union holds a SIDR_REQ.
    unsafe { e.data.sidr_req }
}

/// A listen on B, a connection from A, the request pulled on B (WinVerbs style).
fn requested(w: &mut World, listen: &Cep, a: &Cep, child: &Cep) -> IbaCmReqEvent {
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    assert_eq!(
        a.connect(SID, &path(0, 1), None, 0x11, &[0xA1; 10], 3, 2),
        status::SUCCESS
    );
    w.run(SETTLE);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(child, &mut e), status::SUCCESS);
    req(&e)
}

/// Connected: REQ, REP, RTU.
fn connected(w: &mut World, listen: &Cep, a: &Cep, child: &Cep) {
    requested(w, listen, a, child);
    assert_eq!(child.accept(0x22, &[0xB2; 5], 2, 3), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a.rtu(&[0xC3]), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a.types(), [ev::REP_RECEIVED]);
    assert_eq!(child.types(), [ev::RTU_RECEIVED]);
}

fn no_recursion(ceps: &[&Cep]) {
    for c in ceps {
        let s = c.stats();
        assert_eq!(
            s.recursions, 0,
            "a callback ran under the client's own lock"
        );
        assert_eq!(s.callbacks_after_destroy, 0);
        assert_eq!(s.bad_notifications, 0);
        assert_eq!(s.notifications_not_at_dispatch, 0);
    }
    for c in ceps {
        for l in c.log() {
            assert_eq!(l.at_dispatch, 1, "callback below DISPATCH_LEVEL: {l:?}");
        }
    }
}

#[test]
fn connect_accept_rtu_disconnect() {
    let mut w = World::new(1);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    let r = requested(&mut w, &listen, &a, &child);
    // The listen heard of it once, with a zeroed notification.
    assert_eq!(listen.stats().notifications, 1);
    // The REQ, inline, from B's point of view (al_cm_cep.c:6245-6296).
    assert_eq!(r.service_id.get(), SID);
    assert_eq!(r.qpn.get(), 0x11);
    assert_eq!(
        (r.resp_res, r.init_depth),
        (2, 3),
        "A's init depth, A's resp res"
    );
    assert_eq!(r.pdata[..10], [0xA1; 10]);
    assert_eq!(r.local_ca_guid.get(), node_guid(1));
    assert_eq!(r.remote_ca_guid.get(), node_guid(0));
    assert_eq!(
        (r.primary_path.slid.get(), r.primary_path.dlid.get()),
        (2, 1)
    );
    assert_eq!(r.primary_path.pkey.get(), 0xFFFF);
    assert_eq!(r.port_num, 1);
    assert_eq!(r.alt_path.dlid.get(), 0);
    // Nothing more to pull.
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(
        listen.get_request(&w.b.cep(), &mut e),
        status::NO_MORE_ENTRIES
    );
    // cids: non-zero, unique among B's ids.
    assert_ne!(child.cid(), 0);
    assert_ne!(child.cid(), listen.cid());

    assert_eq!(child.accept(0x22, &[0xB2; 5], 2, 3), status::SUCCESS);
    w.run(SETTLE);
    let rep = a.log()[0];
    assert_eq!(rep.event_type, ev::REP_RECEIVED);
    assert_eq!(rep.qpn, 0x22);
    assert_eq!(
        (rep.resp_res, rep.init_depth),
        (3, 2),
        "B's init depth, B's resp res"
    );
    assert_eq!((rep.pdata_len, rep.pdata0), (196, 0xB2));

    // A's QP attributes, AL's ib_qp_mod_t.
    let (s, rtr) = a.qp_attr(qp_state::RTR);
    assert_eq!(s, status::SUCCESS);
    assert_eq!(rtr.req_state, qp_state::RTR);
    // SAFETY: RTR attributes.
    let rtr = unsafe { rtr.state.rtr };
    assert_eq!(rtr.dest_qp.get(), 0x22);
    // The receive PSN is A's own REQ's StartingPSN (0xAB123456 in client.c, modulo 2^24):
    // AL al_cm_cep.c:4865 `rq_psn = p_cm_req->starting_psn`, read back at :6495.
    assert_eq!(
        rtr.rq_psn.get(),
        0x12_3456,
        "A's own starting PSN modulo 2^24"
    );
    assert_eq!(rtr.resp_res, 3);
    assert_eq!(rtr.primary_av.dlid.get(), 2);
    assert_eq!(rtr.primary_av.conn.path_mtu, 4);
    assert_eq!(rtr.opts & qp_opts::ALTERNATE_AV, 0);
    let (s, rts) = a.qp_attr(qp_state::RTS);
    assert_eq!(s, status::SUCCESS);
    // SAFETY: RTS attributes.
    let rts = unsafe { rts.state.rts };
    // The send PSN is the REP's StartingPSN: AL al_cm_cep.c:1316 `sq_psn =
    // conn_rep_get_starting_psn( p_rep )`, read back at :6569.
    assert_eq!(rts.sq_psn.get(), 0x65_4321, "B's starting PSN");
    assert_eq!(rts.init_depth, 2);

    assert_eq!(a.rtu(&[0xC3]), status::SUCCESS);
    w.run(SETTLE);
    let rtu = child.log()[0];
    assert_eq!(
        (rtu.event_type, rtu.pdata_len, rtu.pdata0),
        (ev::RTU_RECEIVED, 224, 0xC3)
    );

    assert_eq!(a.dreq(&[0xD4]), status::SUCCESS);
    w.run(SETTLE);
    let dreq = child.log()[1];
    assert_eq!(
        (dreq.event_type, dreq.pdata_len, dreq.pdata0),
        (ev::DREQ_RECEIVED, 220, 0xD4)
    );
    assert_eq!(child.drep(&[0xE5]), status::SUCCESS);
    w.run(SETTLE);
    let drep = a.log()[1];
    assert_eq!((drep.event_type, drep.pdata0), (ev::DREP_RECEIVED, 0xE5));
    assert_eq!(a.types(), [ev::REP_RECEIVED, ev::DREP_RECEIVED]);
    assert_eq!(child.types(), [ev::RTU_RECEIVED, ev::DREQ_RECEIVED]);
    no_recursion(&[&listen, &child, &a]);
    for c in [&a, &child, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn ndfltr_accept_with_get_request_ex_and_format_rep() {
    let mut w = World::new(2);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    assert_eq!(
        a.connect(SID, &path(0, 1), None, 0x11, &[1], 4, 4),
        status::SUCCESS
    );
    w.run(SETTLE);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request_ex(&child, &mut e), status::SUCCESS);
    assert_eq!(req(&e).qpn.get(), 0x11);
    let mut init = ibcm_iba_cm::abi::IbQpMod::zeroed();
    assert_eq!(
        child.format_rep(0x33, &[7], 4, 4, &mut init),
        status::SUCCESS
    );
    assert_eq!(init.req_state, qp_state::INIT);
    // SAFETY: INIT attributes.
    let i = unsafe { init.state.init };
    assert_eq!((i.primary_port, i.pkey_index), (1, 0));
    assert_eq!(
        i.access_ctrl & (access::LOCAL_WRITE | access::RDMA_WRITE | access::RDMA_READ),
        access::LOCAL_WRITE | access::RDMA_WRITE | access::RDMA_READ
    );
    // Nothing is sent before send_formatted_rep.
    w.run(SETTLE);
    assert_eq!(a.types(), [] as [i32; 0]);
    assert_eq!(child.send_formatted_rep(), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a.types(), [ev::REP_RECEIVED]);
    assert_eq!(a.log()[0].qpn, 0x33);
    assert_eq!(a.rtu(&[]), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(child.types(), [ev::RTU_RECEIVED]);
    // Established already (AL's al_cep_established also wants REP_SENT).
    assert_eq!(child.established(), status::INVALID_DEVICE_STATE);
    no_recursion(&[&listen, &child, &a]);
    for c in [&a, &child, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn get_request_inherits_the_listen_callback_with_the_listen_as_context() {
    let mut w = World::new(3);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    assert_eq!(
        a.connect(SID, &path(0, 1), None, 0x11, &[], 1, 1),
        status::SUCCESS
    );
    w.run(SETTLE);
    let mut e = IbaCmEvent::zeroed(-1);
    let (s, context, same) = listen.probe_inherit(&child, &mut e);
    assert_eq!(s, status::SUCCESS);
    assert_eq!(
        context,
        listen.id_ptr(),
        "context = the listen id (al_cm.c:147-150)"
    );
    assert!(same, "callback = the listen's");
    assert_eq!(req(&e).qpn.get(), 0x11);
    for c in [&a, &child, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn rejects_both_ways() {
    let mut w = World::new(4);
    // The passive side rejects the REQ.
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    requested(&mut w, &listen, &a, &child);
    assert_eq!(child.rej(28, &[7], &[0x99]), status::SUCCESS);
    w.run(SETTLE);
    let rej = a.log()[0];
    assert_eq!(rej.event_type, ev::REJ_RECEIVED);
    assert_eq!(
        rej.rej_reason, 28,
        "ib_rej_status_t, net16 on the wire and in the event"
    );
    assert_eq!((rej.ari_len, rej.ari0), (1, 7));
    assert_eq!((rej.pdata_len, rej.pdata0), (148, 0x99));
    assert_eq!(child.types(), [] as [i32; 0]);
    child.destroy();
    a.destroy();

    // The active side rejects the REP.
    let (child2, a2) = (w.b.cep(), w.a.cep());
    assert_eq!(
        a2.connect(SID, &path(0, 1), None, 0x12, &[], 1, 1),
        status::SUCCESS
    );
    w.run(SETTLE);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(&child2, &mut e), status::SUCCESS);
    assert_eq!(child2.accept(0x23, &[], 1, 1), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a2.types(), [ev::REP_RECEIVED]);
    assert_eq!(a2.rej(28, &[], &[0x77]), status::SUCCESS);
    w.run(SETTLE);
    let rej = child2.log()[0];
    assert_eq!(
        (rej.event_type, rej.rej_reason, rej.pdata0),
        (ev::REJ_RECEIVED, 28, 0x77)
    );
    no_recursion(&[&listen, &child, &a, &child2, &a2]);
    for c in [&a2, &child2, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn mra_is_reported_once_then_the_rep() {
    let mut w = World::new(5);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    requested(&mut w, &listen, &a, &child);
    assert_eq!(child.mra(20), status::SUCCESS);
    w.run(SETTLE);
    // A duplicate REQ (none here) would re-send the MRA; a second MRA is refused.
    assert_ne!(child.mra(20), status::SUCCESS);
    w.run(1_000_000_000);
    let log = a.log();
    assert_eq!(a.types(), [ev::MRA_RECEIVED]);
    assert_eq!(log[0].service_timeout, 20);
    assert_eq!(child.accept(0x22, &[], 2, 3), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a.types(), [ev::MRA_RECEIVED, ev::REP_RECEIVED]);
    no_recursion(&[&listen, &child, &a]);
    for c in [&a, &child, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn timeouts_are_error_events() {
    let mut w = World::new(6);
    // REQ into the void: req_error after MaxCMRetries + 1 sends.
    let a = w.a.cep();
    w.fabric.faults.loss = 1.0;
    assert_eq!(
        a.connect(SID, &path(0, 1), None, 0x11, &[], 1, 1),
        status::SUCCESS
    );
    w.run(60_000_000_000);
    assert_eq!(a.types(), [ev::REQ_ERROR]);
    a.destroy();
    w.fabric.faults.loss = 0.0;

    // A REP that gets no RTU: rep_error on the passive side, REJ(timeout) to the active.
    let (listen, child, a2) = (w.b.cep(), w.b.cep(), w.a.cep());
    requested(&mut w, &listen, &a2, &child);
    assert_eq!(child.accept(0x22, &[], 1, 1), status::SUCCESS);
    w.run(60_000_000_000);
    assert_eq!(child.types(), [ev::REP_ERROR]);
    assert_eq!(a2.types(), [ev::REP_RECEIVED, ev::REJ_RECEIVED]);
    assert_eq!(a2.log()[1].rej_reason, 4);
    child.destroy();
    a2.destroy();

    // A DREQ that gets no DREP: dreq_error.
    let (child3, a3) = (w.b.cep(), w.a.cep());
    assert_eq!(
        a3.connect(SID, &path(0, 1), None, 0x13, &[], 1, 1),
        status::SUCCESS
    );
    w.run(SETTLE);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(&child3, &mut e), status::SUCCESS);
    assert_eq!(child3.accept(0x24, &[], 1, 1), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a3.rtu(&[]), status::SUCCESS);
    w.run(SETTLE);
    w.fabric.faults.loss = 1.0;
    assert_eq!(a3.dreq(&[]), status::SUCCESS);
    w.run(60_000_000_000);
    assert_eq!(a3.types(), [ev::REP_RECEIVED, ev::DREQ_ERROR]);
    w.fabric.faults.loss = 0.0;
    no_recursion(&[&listen, &child, &a, &a2, &child3, &a3]);
    for c in [&a3, &child3, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn lap_and_apr() {
    let mut w = World::new(7);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    connected(&mut w, &listen, &a, &child);
    let mut alt = path(0, 1);
    alt.hop_flow_raw = ibcm_iba_cm::abi::Be32::new(0);
    assert_eq!(a.lap(&alt, &[0x4C]), status::SUCCESS);
    w.run(SETTLE);
    let lap = child.log()[1];
    assert_eq!(lap.event_type, ev::LAP_RECEIVED);
    assert_eq!(lap.alt_dlid, 1, "the alternate path from B's point of view");
    assert_eq!((lap.pdata_len, lap.pdata0), (168, 0x4C));
    assert_eq!(child.apr(0, &[0x4D]), status::SUCCESS);
    w.run(SETTLE);
    let apr = a.log()[1];
    assert_eq!(
        (apr.event_type, apr.status, apr.pdata0),
        (ev::APR_RECEIVED, 0, 0x4D)
    );
    // B's RTS attributes now carry the alternate path, REARM (al_cep_get_rts_attr).
    let (s, rts) = child.qp_attr(qp_state::RTS);
    assert_eq!(s, status::SUCCESS);
    // SAFETY: RTS attributes.
    let rts = unsafe { rts.state.rts };
    assert_eq!(rts.opts, qp_opts::ALTERNATE_AV | qp_opts::APM_STATE);
    assert_eq!(rts.apm_state, apm_state::REARM);
    assert_eq!(rts.alternate_av.dlid.get(), 1);
    // A LAP that gets no APR: lap_error.
    w.fabric.faults.loss = 1.0;
    assert_eq!(a.lap(&alt, &[]), status::SUCCESS);
    w.run(60_000_000_000);
    w.fabric.faults.loss = 0.0;
    assert_eq!(
        a.types(),
        [ev::REP_RECEIVED, ev::APR_RECEIVED, ev::LAP_ERROR]
    );
    no_recursion(&[&listen, &child, &a]);
    for c in [&a, &child, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn sidr_request_and_reply() {
    let mut w = World::new(8);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    assert_eq!(listen.listen(0x77, None, 0), status::SUCCESS);
    assert_eq!(
        a.sidr_req(0x77, &path(0, 1), &[0x51, 0x52], 100),
        status::SUCCESS
    );
    w.run(SETTLE);
    assert_eq!(listen.stats().notifications, 1);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(&child, &mut e), status::SUCCESS);
    let s = sidr_req(&e);
    assert_eq!(s.sidr_req.service_id.get(), 0x77);
    assert_eq!(s.sidr_req.pdata_len, 216);
    // SAFETY: the pointers of a SIDR_REQ from get_request stay valid until the id goes.
    let pd = unsafe { std::slice::from_raw_parts(s.sidr_req.p_pdata.cast::<u8>(), 2) };
    assert_eq!(pd, [0x51, 0x52]);
    // SAFETY: as above.
    let p = unsafe { *s.sidr_req.p_path };
    assert_eq!(p.dlid.get(), 1, "the requester's LID");
    assert_eq!(s.ca_guid.get(), node_guid(1));
    assert_eq!(
        child.sidr_rep(0x333, 0x1234_5678, 0, &[0x61]),
        status::SUCCESS
    );
    w.run(SETTLE);
    let rep = a.log()[0];
    assert_eq!(rep.event_type, ev::SIDR_REP_RECEIVED);
    assert_eq!((rep.qpn, rep.qkey, rep.status), (0x333, 0x1234_5678, 0));
    assert_eq!((rep.pdata_len, rep.pdata0), (136, 0x61));
    // No answer: sidr_req_error.
    let a2 = w.a.cep();
    w.fabric.faults.loss = 1.0;
    assert_eq!(a2.sidr_req(0x77, &path(0, 1), &[], 10), status::SUCCESS);
    w.run(10_000_000_000);
    assert_eq!(a2.types(), [ev::SIDR_REQ_ERROR]);
    w.fabric.faults.loss = 0.0;
    no_recursion(&[&listen, &child, &a, &a2]);
    for c in [&a, &a2, &child, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn listen_compare_plain() {
    let mut w = World::new(9);
    let (l1, l2) = (w.b.cep(), w.b.cep());
    assert_eq!(l1.listen(SID, Some(&[1, 2, 3, 4]), 4), status::SUCCESS);
    assert_eq!(l2.listen(SID, Some(&[5, 6, 7, 8]), 4), status::SUCCESS);
    // The same compare again is a duplicate.
    let dup = w.b.cep();
    assert_ne!(dup.listen(SID, Some(&[5, 6, 7, 8]), 4), status::SUCCESS);
    let pd = |x: [u8; 4]| {
        let mut p = [0u8; 8];
        p[4..].copy_from_slice(&x);
        p
    };
    let (a1, a2, a3) = (w.a.cep(), w.a.cep(), w.a.cep());
    assert_eq!(
        a1.connect(SID, &path(0, 1), None, 0x11, &pd([1, 2, 3, 4]), 1, 1),
        0
    );
    assert_eq!(
        a2.connect(SID, &path(0, 1), None, 0x12, &pd([5, 6, 7, 8]), 1, 1),
        0
    );
    assert_eq!(
        a3.connect(SID, &path(0, 1), None, 0x13, &pd([9, 9, 9, 9]), 1, 1),
        0
    );
    w.run(SETTLE);
    assert_eq!((l1.stats().notifications, l2.stats().notifications), (1, 1));
    let (c1, c2) = (w.b.cep(), w.b.cep());
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(l1.get_request(&c1, &mut e), status::SUCCESS);
    assert_eq!(req(&e).qpn.get(), 0x11);
    assert_eq!(l2.get_request(&c2, &mut e), status::SUCCESS);
    assert_eq!(req(&e).qpn.get(), 0x12);
    // No listen takes the third: REJ "invalid service ID" (IBA Table 112, code 8).
    assert_eq!(a3.types(), [ev::REJ_RECEIVED]);
    assert_eq!(a3.log()[0].rej_reason, 8);
    no_recursion(&[&l1, &l2, &a1, &a2, &a3, &c1, &c2]);
    for c in [&a1, &a2, &a3, &c1, &c2, &l1, &l2, &dup] {
        c.destroy();
    }
    w.finish();
}

/// An RDMA-CM IP header (IBA Annex A11): version 0, IP version, source port, IPs.
fn cma_header(ipv: u8, version: u8, src_port: u16, src: [u8; 4], dst: [u8; 4]) -> [u8; 36] {
    let mut h = [0u8; 36];
    h[0] = version;
    h[1] = ipv;
    h[2..4].copy_from_slice(&src_port.to_be_bytes());
    h[16..20].copy_from_slice(&src);
    h[32..36].copy_from_slice(&dst);
    h
}

#[test]
fn listen_compare_rdma_cm_mask() {
    // TCP port space 0x0106, port 7471 (ib_cm_rdma_sid).
    let sid = 0x0000_0000_0106_1D2F;
    let mut w = World::new(10);
    let (lx, ly) = (w.b.cep(), w.b.cep());
    let x = cma_header(0x40, 0, 0, [0; 4], [10, 0, 0, 2]);
    let y = cma_header(0x40, 0, 0, [0; 4], [10, 0, 0, 3]);
    // compare_offset is the IB_REQ_CM_RDMA_CMP_* mask here (al_cm_cep.c:2783, 2850-2864).
    assert_eq!(lx.listen(sid, Some(&x), 0x04), status::SUCCESS);
    assert_eq!(ly.listen(sid, Some(&y), 0x04), status::SUCCESS);
    // A header that is not an RDMA-CM one is refused at listen.
    let bad = w.b.cep();
    let mut h = x;
    h[1] = 0x50;
    assert_eq!(bad.listen(sid, Some(&h), 0x04), status::INVALID_PARAMETER);
    bad.destroy();
    let req_pd = |ipv, version, dst| {
        let mut p = [0u8; 56];
        p[..36].copy_from_slice(&cma_header(ipv, version, 5555, [10, 0, 0, 1], dst));
        p
    };
    let ceps: Vec<Cep> = (0..5).map(|_| w.a.cep()).collect();
    let cases = [
        req_pd(0x40, 0, [10, 0, 0, 2]), // -> lx (the source port and IP are not compared)
        req_pd(0x40, 0, [10, 0, 0, 3]), // -> ly
        req_pd(0x40, 0, [10, 0, 0, 4]), // no listen
        req_pd(0x60, 0, [10, 0, 0, 2]), // other IP version: always compared
        req_pd(0x40, 0x10, [10, 0, 0, 2]), // other header version: always compared
    ];
    for (i, (c, pd)) in ceps.iter().zip(&cases).enumerate() {
        assert_eq!(
            c.connect(sid, &path(0, 1), None, 0x40 + i as u32, pd, 1, 1),
            status::SUCCESS
        );
    }
    w.run(SETTLE);
    assert_eq!((lx.stats().notifications, ly.stats().notifications), (1, 1));
    let (cx, cy) = (w.b.cep(), w.b.cep());
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(lx.get_request(&cx, &mut e), status::SUCCESS);
    assert_eq!(req(&e).qpn.get(), 0x40);
    assert_eq!(lx.get_request(&w.b.cep(), &mut e), status::NO_MORE_ENTRIES);
    assert_eq!(ly.get_request(&cy, &mut e), status::SUCCESS);
    assert_eq!(req(&e).qpn.get(), 0x41);
    for c in &ceps[2..] {
        assert_eq!(c.types(), [ev::REJ_RECEIVED]);
        assert_eq!(c.log()[0].rej_reason, 8);
    }
    assert_eq!(ceps[0].types(), [] as [i32; 0]);
    for c in ceps.iter().chain([&cx, &cy, &lx, &ly]) {
        c.destroy();
    }
    w.finish();
}

#[test]
fn a_callback_error_destroys_and_frees_the_id() {
    let mut w = World::new(11);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    connected(&mut w, &listen, &a, &child);
    assert_eq!(w.b.ids_in_use(), 2);
    child.fail_on(ev::DREQ_RECEIVED);
    assert_eq!(a.dreq(&[]), status::SUCCESS);
    w.run(SETTLE);
    // The id went with the error (al_cm.c:90-95): its slot is free, the engine answered
    // the DREQ while destroying the connection.
    assert!(!child.has_id());
    assert_eq!(w.b.ids_in_use(), 1);
    assert_eq!(child.types(), [ev::RTU_RECEIVED, ev::DREQ_RECEIVED]);
    assert_eq!(a.types(), [ev::REP_RECEIVED, ev::DREP_RECEIVED]);
    no_recursion(&[&listen, &child, &a]);
    a.destroy();
    listen.destroy();
    w.finish();
}

#[test]
fn destroy_from_inside_and_outside_a_callback() {
    let mut w = World::new(12);
    // Inside: A destroys its id from the DREQ's callback.
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    connected(&mut w, &listen, &a, &child);
    a.destroy_on(ev::DREQ_RECEIVED);
    assert_eq!(child.dreq(&[]), status::SUCCESS);
    w.run(SETTLE);
    assert!(!a.has_id());
    assert_eq!(w.a.ids_in_use(), 0);
    assert_eq!(a.types(), [ev::REP_RECEIVED, ev::DREQ_RECEIVED]);
    assert_eq!(child.types(), [ev::RTU_RECEIVED, ev::DREP_RECEIVED]);
    child.destroy();

    // Outside: A destroys an established connection; the engine disconnects it, and no
    // callback reaches A afterwards.
    let (child2, a2) = (w.b.cep(), w.a.cep());
    assert_eq!(
        a2.connect(SID, &path(0, 1), None, 0x15, &[], 1, 1),
        status::SUCCESS
    );
    w.run(SETTLE);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(&child2, &mut e), status::SUCCESS);
    assert_eq!(child2.accept(0x25, &[], 1, 1), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a2.rtu(&[]), status::SUCCESS);
    w.run(SETTLE);
    a2.destroy();
    assert_eq!(w.a.ids_in_use(), 0);
    w.run(SETTLE);
    assert_eq!(child2.types(), [ev::RTU_RECEIVED, ev::DREQ_RECEIVED]);
    assert_eq!(child2.drep(&[]), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a2.types(), [ev::REP_RECEIVED]);
    no_recursion(&[&listen, &child, &a, &child2, &a2]);
    child2.destroy();
    listen.destroy();
    w.finish();
}

#[test]
fn removal_waits_for_the_last_dereference() {
    let mut w = World::new(13);
    // The client holds the query's reference and takes one more.
    w.a.reference();
    assert_eq!(w.a.cm().references(), 2);
    // An id the client never destroys: removal destroys it.
    let left = w.a.cep();
    assert_eq!(left.create(), status::SUCCESS);
    w.a.cm().begin_removal();
    assert!(
        w.a.cm().answer_query(0x0101, 208).is_none(),
        "no answer while removing"
    );
    assert!(
        !w.a.cm()
            .backend()
            .released
            .load(std::sync::atomic::Ordering::Acquire)
    );
    let cm = w.a.cm.take().expect("the instance");
    let (tx, rx) = std::sync::mpsc::channel();
    let remover = std::thread::spawn(move || {
        drop(cm);
        tx.send(()).expect("the test waits");
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        rx.try_recv().is_err(),
        "removal finished with references held"
    );
    w.a.dereference();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        rx.try_recv().is_err(),
        "removal finished with a reference held"
    );
    w.a.dereference();
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("removal completes once the count is zero");
    remover.join().expect("no panic");
    assert_eq!(
        w.a.node.device.client_count(),
        0,
        "the id left was destroyed"
    );
    assert_eq!(w.a.violations(), vec![]);
    drop(left);
    // Node B still works.
    let b = w.b.cep();
    assert_eq!(b.create(), status::SUCCESS);
    b.destroy();
    w.b.remove();
}

#[test]
fn bad_calls_fail_cleanly() {
    let w = World::new(14);
    let got = w.a.bad_calls();
    use status::{INVALID_DEVICE_STATE as ST, INVALID_HANDLE as H, INVALID_PARAMETER as P};
    assert_eq!(
        got,
        [P, H, H, status::SUCCESS, P, P, P, P, P, P, P, P, P, ST, H]
    );
    assert_eq!(w.a.ids_in_use(), 0);
    w.finish();
}

#[test]
fn pool_exhaustion_is_insufficient_resources_not_an_allocation() {
    let w = World::new(15);
    let ceps: Vec<Cep> = (0..=CONFIG.ids).map(|_| w.a.cep()).collect();
    for c in &ceps[..CONFIG.ids] {
        assert_eq!(c.create(), status::SUCCESS);
    }
    assert_eq!(ceps[CONFIG.ids].create(), status::INSUFFICIENT_RESOURCES);
    let mut cids: Vec<u32> = ceps[..CONFIG.ids].iter().map(Cep::cid).collect();
    cids.sort_unstable();
    cids.dedup();
    assert_eq!(cids.len(), CONFIG.ids, "cids unique");
    for c in &ceps {
        c.destroy();
    }
    // The pool refills: an id again.
    assert_eq!(ceps[0].create(), status::SUCCESS);
    ceps[0].destroy();
    w.finish();
}

/// Issue #18 item 4: every call but `destroy_id` may come at DISPATCH_LEVEL under the
/// caller's spin lock, with private data of the largest size each message carries (IBA
/// 12.6: REQ 92, REP 196, RTU 224, DREQ 220, DREP 224, LAP 168, APR 148, SIDR_REQ 216,
/// SIDR_REP 136 bytes): the engine keeps it in blocks of its pool, made at PASSIVE_LEVEL,
/// so none of them allocates (`World::finish` asserts no violation on either node). This
/// was `engine_private_data_cache_allocates`, which pinned the gap: the engine reserved
/// `Cep::pdata` at the first send, once per connection at DISPATCH_LEVEL.
#[test]
fn private_data_at_dispatch_allocates_nothing() {
    let mut w = World::new(16);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    assert_eq!(
        a.connect(SID, &path(0, 1), None, 0x11, &[0xA1; 92], 1, 1),
        status::SUCCESS
    );
    // Before anything reaches the fabric: the downcall alone allocated nothing.
    assert_eq!(w.a.violations(), vec![]);
    w.run(SETTLE);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(&child, &mut e), status::SUCCESS);
    assert_eq!(req(&e).pdata, [0xA1; 92]);
    assert_eq!(child.accept(0x22, &[0xB2; 196], 1, 1), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a.rtu(&[0xC3; 224]), status::SUCCESS);
    w.run(SETTLE);
    let mut alt = path(0, 1);
    alt.hop_flow_raw = ibcm_iba_cm::abi::Be32::new(0);
    assert_eq!(a.lap(&alt, &[0x4C; 168]), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(child.apr(0, &[0x4D; 148]), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(a.dreq(&[0xD4; 220]), status::SUCCESS);
    w.run(SETTLE);
    assert_eq!(child.drep_at_dispatch(&[0xE5; 224]), status::SUCCESS);
    w.run(SETTLE);
    let seen = |c: &Cep| -> Vec<(i32, u8, u8)> {
        c.log()
            .iter()
            .map(|l| (l.event_type, l.pdata_len, l.pdata0))
            .collect()
    };
    assert_eq!(
        seen(&a),
        [
            (ev::REP_RECEIVED, 196, 0xB2),
            (ev::APR_RECEIVED, 148, 0x4D),
            (ev::DREP_RECEIVED, 224, 0xE5),
        ]
    );
    assert_eq!(
        seen(&child)
            .iter()
            .map(|&(t, _, b)| (t, b))
            .collect::<Vec<_>>(),
        [
            (ev::RTU_RECEIVED, 0xC3),
            (ev::LAP_RECEIVED, 0x4C),
            (ev::DREQ_RECEIVED, 0xD4),
        ]
    );
    // SIDR both ways, at DISPATCH_LEVEL too.
    let (sidr_listen, sidr_child, sa) = (w.b.cep(), w.b.cep(), w.a.cep());
    assert_eq!(sidr_listen.listen(0x77, None, 0), status::SUCCESS);
    assert_eq!(
        sa.sidr_req(0x77, &path(0, 1), &[0x51; 216], 100),
        status::SUCCESS
    );
    w.run(SETTLE);
    assert_eq!(
        sidr_listen.get_request(&sidr_child, &mut e),
        status::SUCCESS
    );
    assert_eq!(
        sidr_child.sidr_rep(0x333, 0x1234_5678, 0, &[0x61; 136]),
        status::SUCCESS
    );
    w.run(SETTLE);
    assert_eq!(seen(&sa), [(ev::SIDR_REP_RECEIVED, 136, 0x61)]);
    assert_eq!(w.a.violations(), vec![]);
    assert_eq!(w.b.violations(), vec![]);
    no_recursion(&[&listen, &child, &a, &sidr_listen, &sidr_child, &sa]);
    for c in [&a, &child, &listen, &sa, &sidr_child, &sidr_listen] {
        c.destroy();
    }
    w.finish();
}

/// The engine's private-data pool used up at DISPATCH_LEVEL: the call that finds no
/// block fails with STATUS_INSUFFICIENT_RESOURCES and changes nothing (no REQ is sent, the
/// id stays idle, nothing is allocated, nothing leaks), PASSIVE_LEVEL work is asked for,
/// and once it ran the same call succeeds (on a new id: WinVerbs destroys the id of a
/// failed connect).
#[test]
fn private_data_pool_exhaustion_is_insufficient_resources_until_passive_work() {
    let mut w = World::new(30);
    let engine = |s: &harness::Side| {
        s.node
            .device
            .with_engine(|cm| (cm.private_data_room(), cm.private_data_blocks()))
    };
    let reqs_sent = |s: &harness::Side| {
        s.node.device.with_engine(|cm| {
            ibcm_cep::counter_slot(ibcm_mad::AttributeId::Req)
                .and_then(|i| cm.counters().sent.get(i).copied())
                .unwrap_or(0)
        })
    };
    let pool_bytes = |s: &harness::Side| s.node.device.with_engine(|cm| cm.memory().private_data);
    let baseline = pool_bytes(&w.a);
    let (room, in_use) = engine(&w.a);
    assert_eq!(in_use, 0);
    assert!(room > 0 && room < CONFIG.ids, "{room} blocks free");
    // No listen on B: every REQ is rejected, and each CEP keeps its REQ's block.
    let ceps: Vec<Cep> = (0..=room).map(|_| w.a.cep()).collect();
    for (i, c) in ceps[..room].iter().enumerate() {
        assert_eq!(
            c.connect(SID, &path(0, 1), None, 0x100 + i as u32, &[0x5A; 92], 1, 1),
            status::SUCCESS
        );
    }
    assert_eq!(engine(&w.a), (0, room));
    let last = &ceps[room];
    assert_eq!(
        last.connect(SID, &path(0, 1), None, 0x1FF, &[0x5A; 92], 1, 1),
        status::INSUFFICIENT_RESOURCES
    );
    // Changed nothing (no REQ went out, the id is still idle: no INIT attributes),
    // allocated nothing, panicked nowhere.
    assert_eq!(engine(&w.a), (0, room));
    assert_eq!(reqs_sent(&w.a), room as u64);
    assert_eq!(last.qp_attr(qp_state::INIT).0, status::INVALID_DEVICE_STATE);
    assert_eq!(w.a.violations(), vec![]);
    // The passive work the shortage asked for (the host runs it with the fabric).
    w.run(SETTLE);
    assert!(engine(&w.a).0 > 0, "the pool was topped up");
    let again = w.a.cep();
    assert_eq!(
        again.connect(SID, &path(0, 1), None, 0x1FF, &[0x5A; 92], 1, 1),
        status::SUCCESS
    );
    assert_eq!(engine(&w.a).1, room + 1);
    w.run(SETTLE);
    for c in ceps[..room].iter().chain([&again]) {
        assert_eq!(c.types(), [ev::REJ_RECEIVED]);
    }
    for c in ceps.iter().chain([&again]) {
        c.destroy();
    }
    // Every block back in the pool, and the pool back to its size before (destroy_id at
    // PASSIVE_LEVEL tops the pools up, and gives back what nobody uses).
    assert_eq!(engine(&w.a).1, 0);
    assert_eq!(pool_bytes(&w.a), baseline);
    w.finish();
}

#[test]
fn no_room_for_a_request_rejects_it() {
    let mut w = World::new(17);
    let listen = w.b.cep();
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    // Every other id of B's pool in use.
    let idle: Vec<Cep> = (1..CONFIG.ids).map(|_| w.b.cep()).collect();
    for c in &idle {
        assert_eq!(c.create(), status::SUCCESS);
    }
    let a = w.a.cep();
    assert_eq!(a.connect(SID, &path(0, 1), None, 0x11, &[], 1, 1), 0);
    w.run(SETTLE);
    // The dispatch layer's room is the pool's: the REQ is refused on arrival, at
    // DISPATCH_LEVEL, without allocating, and never reaches the listen.
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(
        listen.get_request(&w.b.cep(), &mut e),
        status::NO_MORE_ENTRIES
    );
    assert_eq!(listen.stats().notifications, 0);
    w.run(SETTLE);
    assert_eq!(a.types(), [ev::REJ_RECEIVED]);
    for c in idle.iter().chain([&a, &listen]) {
        c.destroy();
    }
    w.finish();
}

/// Found by the `iba_cm` fuzz target: requests that arrive while B's id pool is used up
/// are refused on arrival, and never make B's engine grow at DISPATCH_LEVEL however many
/// arrive before B next runs at PASSIVE_LEVEL (which tops the room up). Each arrival
/// takes a CEP slot; the slab took a fresh slot for each until `REUSE_AFTER` were free, so
/// the room made ahead ran out after a few dozen and the next arrival grew the slab
/// (`CmManager::alloc`, from `on_req` / `on_sidr_req`).
#[test]
fn refused_requests_never_grow_the_engine_at_dispatch() {
    let mut w = World::new(19);
    let listen = w.b.cep();
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    let idle: Vec<Cep> = (1..CONFIG.ids).map(|_| w.b.cep()).collect();
    for c in &idle {
        assert_eq!(c.create(), status::SUCCESS);
    }
    for i in 0..400 {
        let a = w.a.cep();
        let sent = if i % 2 < 2 {
            a.connect(SID, &path(0, 1), None, 0x11, &[], 1, 1)
        } else {
            a.sidr_req(SID, &path(0, 1), &[], 1)
        };
        assert_eq!(
            sent,
            status::SUCCESS,
            "request {i}: ids {} clients {} ceps {}",
            w.a.ids_in_use(),
            w.a.node.device.client_count(),
            w.a.node.device.with_engine(|cm| cm.live_ceps())
        );
        w.run(SETTLE);
        assert_eq!(w.b.violations(), vec![], "request {i}'s arrival at B");
        a.destroy();
        // A's CEP through its retries and timewait (A's room is not what this tests).
        w.run(60_000_000_000);
    }
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(
        listen.get_request(&w.b.cep(), &mut e),
        status::NO_MORE_ENTRIES
    );
    for c in idle.iter().chain([&listen]) {
        c.destroy();
    }
    w.finish();
}

/// Found by the `iba_cm` fuzz target: `destroy_id` runs no callback of another id. It
/// topped the pools up (`replenish`, at PASSIVE_LEVEL) outside
/// `without_client_callbacks`, and the dispatch layer's entry point delivered what was
/// ready, here the REJ queued for a request until `get_request` took it: another id's
/// callback ran inside the caller's `destroy_id`.
#[test]
fn destroy_id_runs_no_callback_of_another_id() {
    let mut w = World::new(21);
    let (listen, child, other, a) = (w.b.cep(), w.b.cep(), w.b.cep(), w.a.cep());
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    assert_eq!(other.create(), status::SUCCESS);
    assert_eq!(a.connect(SID, &path(0, 1), None, 0x11, &[], 1, 1), 0);
    w.run(SETTLE);
    // A gives up (its REQ times out): the REJ waits in B's request until it is taken.
    a.destroy();
    w.run(SETTLE);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(&child, &mut e), status::SUCCESS);
    assert!(child.log().is_empty(), "no callback inside get_request");
    other.destroy();
    assert!(
        child.log().is_empty(),
        "no callback inside another id's destroy_id"
    );
    w.b.deliver();
    assert_eq!(child.types(), [ev::REJ_RECEIVED]);
    for c in [&child, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn cancel_listen_refuses_pending_requests_and_listens_again() {
    let mut w = World::new(18);
    let (listen, a) = (w.b.cep(), w.a.cep());
    assert_eq!(listen.listen(SID, Some(&[4, 2]), 0), status::SUCCESS);
    assert_eq!(a.connect(SID, &path(0, 1), None, 0x11, &[4, 2], 1, 1), 0);
    w.run(SETTLE);
    assert_eq!(listen.stats().notifications, 1);
    assert_eq!(listen.cancel_listen(), status::SUCCESS);
    w.run(SETTLE);
    // The request not pulled was rejected.
    assert_eq!(a.types(), [ev::REJ_RECEIVED]);
    let mut e = IbaCmEvent::zeroed(-1);
    assert_ne!(listen.get_request(&w.b.cep(), &mut e), status::SUCCESS);
    // The id listens again, with a compare buffer from the pool.
    let lid = listen.id_ptr();
    let again = {
        // The C client's listen creates an id; this one already has it: call listen
        // through a second endpoint on the same service to show the service is free.
        let l2 = w.b.cep();
        assert_eq!(l2.listen(SID, Some(&[4, 2]), 0), status::SUCCESS);
        l2
    };
    assert_eq!(listen.id_ptr(), lid);
    let (a2, child) = (w.a.cep(), w.b.cep());
    assert_eq!(a2.connect(SID, &path(0, 1), None, 0x12, &[4, 2], 1, 1), 0);
    w.run(SETTLE);
    assert_eq!(again.get_request(&child, &mut e), status::SUCCESS);
    assert_eq!(req(&e).qpn.get(), 0x12);
    for c in [&a, &a2, &child, &again, &listen] {
        c.destroy();
    }
    w.finish();
}

#[test]
fn hca_removal_fails_calls_and_destroy_still_works() {
    let mut w = World::new(19);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    connected(&mut w, &listen, &a, &child);
    w.b.node.device.remove();
    w.run(SETTLE);
    // iba_cm has no removal event: none is delivered; calls fail, destroy works.
    assert_eq!(child.types(), [ev::RTU_RECEIVED]);
    assert_eq!(child.dreq(&[]), status::INVALID_DEVICE_STATE);
    let late = w.b.cep();
    assert_eq!(late.create(), status::INVALID_DEVICE_STATE);
    assert_eq!(w.b.ids_in_use(), 2);
    for c in [&child, &listen] {
        c.destroy();
    }
    assert_eq!(w.b.ids_in_use(), 0);
    // The peer hears nothing more; its DREQ times out.
    assert_eq!(a.dreq(&[]), status::SUCCESS);
    w.run(60_000_000_000);
    assert_eq!(a.types(), [ev::REP_RECEIVED, ev::DREQ_ERROR]);
    a.destroy();
    w.finish();
}

/// The binding's `IRP_MN_QUERY_INTERFACE` preprocess, through [`ibcm_iba_cm::answer`]: a
/// well-formed query is answered with a referenced interface; without a QP1 route or
/// during removal it goes down (to AL's CM), and the removal waits for the references.
#[test]
fn query_interface_answer_pass_down_and_removal() {
    use ibcm_iba_cm::abi::{GUID_INFINIBAND_INTERFACE_CM as CM, Guid};
    use ibcm_iba_cm::{PassDown, answer};
    let mut w = World::new(41);
    let cm = w.a.cm();
    let before = cm.references();
    let ifc = answer(Some(cm), &CM, 0x0101, 208, true).expect("answered");
    assert_eq!(ifc.interface_header.version, 0x0101);
    assert_eq!(ifc.interface_header.size, 208);
    assert_eq!(
        cm.references(),
        before + 1,
        "the caller's reference is taken"
    );
    let no_route = answer(Some(cm), &CM, 0x0101, 208, false);
    assert_eq!(no_route.err(), Some(PassDown::NoQp1Route));
    assert_eq!(
        cm.references(),
        before + 1,
        "nothing taken when passed down"
    );
    let none = answer::<harness::TestBackend>(None, &CM, 0x0101, 208, true);
    assert_eq!(none.err(), Some(PassDown::NoCm));
    let other = Guid { data1: 1, ..CM };
    assert_eq!(
        answer(Some(cm), &other, 0x0101, 208, true).err(),
        Some(PassDown::OtherInterface)
    );
    // Removal: no new reference; `released` only when the last one goes.
    cm.begin_removal();
    assert_eq!(
        answer(Some(cm), &CM, 0x0101, 208, true).err(),
        Some(PassDown::Removing)
    );
    assert!(
        !cm.backend()
            .released
            .load(std::sync::atomic::Ordering::Acquire)
    );
    let deref = ifc
        .interface_header
        .interface_dereference
        .expect("dereference");
    // SAFETY: the reference `answer` took for this copy, dropped once.
    unsafe { deref(ifc.interface_header.context) };
    assert_eq!(cm.references(), before);
    w.run(SETTLE);
    w.finish();
}

/// One CM for several CAs: the dispatch layer's port numbers are host-wide, and what a
/// client hands its CA (the REQ event's port and CA GUID, `ib_qp_mod_t`'s ports) is the
/// CA's own (`Backend::ca_port`).
#[test]
fn host_wide_port_numbers_reach_the_client_as_the_cas_own() {
    let mut w = World::new(43);
    w.b.cm()
        .backend()
        .ca_port_of_1
        .store(2, std::sync::atomic::Ordering::Relaxed);
    let (listen, child, a) = (w.b.cep(), w.b.cep(), w.a.cep());
    let r = requested(&mut w, &listen, &a, &child);
    assert_eq!(r.port_num, 2, "the CA's port, not the host-wide number");
    assert_eq!(
        r.local_ca_guid.get(),
        node_guid(1) ^ 0xCA,
        "the CA the REQ came in on"
    );
    let mut init = ibcm_iba_cm::abi::IbQpMod::zeroed();
    assert_eq!(
        child.format_rep(0x22, &[7], 2, 3, &mut init),
        status::SUCCESS
    );
    // SAFETY: INIT attributes.
    let i = unsafe { init.state.init };
    assert_eq!(i.primary_port, 2);
    assert_eq!(child.send_formatted_rep(), status::SUCCESS);
    w.run(SETTLE);
    let (s, rtr) = child.qp_attr(qp_state::RTR);
    assert_eq!(s, status::SUCCESS);
    // SAFETY: RTR attributes.
    let rtr = unsafe { rtr.state.rtr };
    assert_eq!(rtr.primary_av.port_num, 2);
    // A's side is unmapped: its own numbers.
    let (s, a_init) = a.qp_attr(qp_state::INIT);
    assert_eq!(s, status::SUCCESS);
    // SAFETY: INIT attributes.
    assert_eq!(unsafe { a_init.state.init }.primary_port, 1);
    for c in [&a, &child, &listen] {
        c.destroy();
    }
    w.finish();
}

/// Found by the `iba_cm` fuzz target: an idle host creates and destroys ids for ever.
/// The owner table covered live + the room asked for, but the engine reuses a CEP slot
/// only once `REUSE_AFTER` are free, so after a dozen create/destroy cycles (each top-up
/// also warms the listen table with a few CEPs) a new CEP's index fell outside the table
/// and `create_id` failed with STATUS_INSUFFICIENT_RESOURCES, with nothing alive.
#[test]
fn an_idle_host_creates_and_destroys_ids_for_ever() {
    let mut w = World::new(20);
    for i in 0..400 {
        let a = w.a.cep();
        assert_eq!(a.create(), status::SUCCESS, "create_id {i}");
        a.destroy();
        w.run(SETTLE);
    }
    w.finish();
}

/// An XRC REQ never reaches an `iba_cm` listen: AL's `__req_handler` rejects a REQ whose
/// transport is neither RC nor UC with "invalid transport type" before any listen lookup
/// (al_cm_cep.c:1106-1113), and neither WinVerbs nor ndfltr looks at the event's qp_type
/// (wv_ep.c:1153-1181, nd_ep.cpp:1992-2029): handed one, they would answer with an RC QP
/// in an XRC-format REP. The REQ is built as Linux sends an XRC_INI's (transport 3 with
/// extended transport 1, cm_msgs.h), and put on B's port as the fabric would.
#[test]
fn an_xrc_req_is_rejected_before_any_listen_sees_it() {
    use ibcm_cep::counter_slot;
    use ibcm_mad::{
        AttributeId, CmMad, CmMessage, MAD_SIZE, MadHeader, Mtu, Path, Rate, Req, Transport,
    };
    let mut w = World::new(23);
    let listen = w.b.cep();
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    let (a, b) = (ibcm_host::node_address(0), ibcm_host::node_address(1));
    let wire_path = Path {
        local_lid: a.lid,
        remote_lid: b.lid,
        local_gid: a.gid,
        remote_gid: b.gid,
        flow_label: 0,
        packet_rate: Rate::Gbps100,
        traffic_class: 0,
        hop_limit: 0,
        sl: 0,
        subnet_local: true,
        local_ack_timeout: 16,
    };
    let xrc = Req {
        local_comm_id: 0x1234_5678,
        vendor_id: 0,
        service_id: SID,
        local_ca_guid: node_guid(0),
        local_qkey: 0,
        local_qpn: 0x31,
        responder_resources: 0,
        local_eecn: 0,
        initiator_depth: 2,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport: Transport::Xrc,
        end_to_end_flow_control: false,
        starting_psn: 0x42,
        local_cm_response_timeout: 20,
        retry_count: 7,
        partition_key: 0xffff,
        path_mtu: Mtu::Mtu2048,
        rdc_exists: false,
        rnr_retry_count: 0,
        max_cm_retries: 15,
        srq: false,
        primary_path: wire_path,
        alternate_path: Path::default(),
        sap_supported: false,
        private_data: &[],
    };
    let mut mad = [0u8; MAD_SIZE];
    CmMad {
        header: MadHeader::send(0x77),
        message: CmMessage::Req(xrc),
    }
    .emit(&mut mad)
    .unwrap();
    w.b.node.receive(&a, &mad);
    w.run(SETTLE);
    assert_eq!(listen.types(), [], "the listen heard of the XRC REQ");
    let child = w.b.cep();
    let mut e = IbaCmEvent::zeroed(-1);
    assert_eq!(listen.get_request(&child, &mut e), status::NO_MORE_ENTRIES);
    let sent = w.b.node.device.with_engine(|cm| cm.counters().sent);
    let slot = |attr| counter_slot(attr).unwrap();
    assert_eq!(sent[slot(AttributeId::Rej)], 1);
    assert_eq!(sent[slot(AttributeId::Rep)], 0);
    // An RC REQ to the same listen still gets through.
    let a = w.a.cep();
    assert_eq!(
        a.connect(SID, &path(0, 1), None, 0x11, &[0xA1; 10], 3, 2),
        status::SUCCESS
    );
    w.run(SETTLE);
    assert_eq!(listen.get_request(&child, &mut e), status::SUCCESS);
    assert_eq!(req(&e).qpn.get(), 0x11);
    for c in [&listen, &a, &child] {
        c.destroy();
    }
    w.finish();
}

/// The REP's read limits as AL reads them (`__al_cep_pre_rep`, al_cm_cep.c:5049-5087),
/// for clients written against it:
/// - an InitiatorDepth above the REQ's ResponderResources goes out as given: neither AL
///   nor Linux `ib_send_cm_rep` (cm.c:2287-2318) checks it, and an ND server accepting a
///   read-only client (ResponderResources 0, as a Linux client that only issues reads
///   sends) with Outbound > 0 must not fail (nd_ep.cpp:1184-1195);
/// - ResponderResources 0 keeps the REQ's InitiatorDepth (:5060-5070), and INIT keeps
///   RDMA READ and atomics (:5184-5188);
/// - more than the CA's limit is capped to it (:5072-5083).
#[test]
fn accept_reads_the_read_limits_as_al_does() {
    let ca_max = ibcm_cep::CmConfig::new(0, [0; 32]).max_responder_resources;
    for (req_resp, req_init, rep_resp, rep_init, want_resp) in [
        // A read-only client; the server answers with reads of its own.
        (0, 2, 1, 2, 1),
        // ResponderResources 0: the REQ's InitiatorDepth.
        (3, 2, 0, 2, 2),
        // Over the CA's limit: capped.
        (3, 2, ca_max + 4, 2, ca_max),
    ] {
        let mut w = World::new(29);
        let (listen, a, child) = (w.b.cep(), w.a.cep(), w.b.cep());
        assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
        assert_eq!(
            a.connect(SID, &path(0, 1), None, 0x11, &[], req_resp, req_init),
            status::SUCCESS
        );
        w.run(SETTLE);
        let mut e = IbaCmEvent::zeroed(-1);
        assert_eq!(listen.get_request(&child, &mut e), status::SUCCESS);
        let mut init = ibcm_iba_cm::abi::IbQpMod::zeroed();
        let case = (req_resp, req_init, rep_resp, rep_init);
        assert_eq!(
            child.format_rep(0x33, &[], rep_resp, rep_init, &mut init),
            status::SUCCESS,
            "{case:?}"
        );
        // SAFETY: INIT attributes.
        let i = unsafe { init.state.init };
        assert_ne!(i.access_ctrl & access::RDMA_READ, 0, "{case:?}");
        let (s, rtr) = child.qp_attr(qp_state::RTR);
        assert_eq!(s, status::SUCCESS);
        // SAFETY: RTR attributes.
        assert_eq!(unsafe { rtr.state.rtr }.resp_res, want_resp, "{case:?}");
        assert_eq!(child.send_formatted_rep(), status::SUCCESS);
        w.run(SETTLE);
        let rep = a.log()[0];
        assert_eq!(rep.event_type, ev::REP_RECEIVED, "{case:?}");
        // The REP event's fields are crossed, as AL's (al_cm_cep.c:6292-6293).
        assert_eq!(
            (rep.resp_res, rep.init_depth),
            (rep_init, want_resp),
            "{case:?}"
        );
        assert_eq!(a.rtu(&[]), status::SUCCESS);
        w.run(SETTLE);
        for c in [&listen, &a, &child] {
            c.destroy();
        }
        w.finish();
    }
}

/// A burst of compare listens with no connection activity (an MPI job's ranks each
/// opening an ND listen at start-up, nd_ep.cpp:2105-2129, under ndfltr's lock) never
/// finds the compare buffers gone: taking one below half asks for the PASSIVE_LEVEL work
/// that makes more, as the id pool does. The work is modelled as the KMDF binding runs
/// it: the replenish work item, queued by `request_passive_work`
/// (driver/kmdf/host.rs `evt_replenish_work_item`), runs between the IOCTLs.
#[test]
fn a_burst_of_compare_listens_is_never_short_of_buffers() {
    let w = World::new(31);
    let mut listens = Vec::new();
    for i in 0..3 * CONFIG.listens {
        let l = w.b.cep();
        assert_eq!(
            l.listen(SID + i as u64, Some(&[0x5A; 8]), 4),
            status::SUCCESS,
            "listen {i}"
        );
        if w.b.node.platform.take_passive_work() {
            w.b.cm().replenish();
        }
        listens.push(l);
    }
    for l in &listens {
        l.destroy();
    }
    w.finish();
}
