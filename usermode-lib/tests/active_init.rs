//! The active side's QP to INIT before its REQ (`ConnectParams::init_attributes`, as
//! librdmacm's rdma_create_qp), held against the engine's INIT: what GET_QP_ATTR(INIT)
//! gives once the REQ is out, and the INIT the CONNECT's answer carries after the REP
//! (`ConnectReply::init`), which differs only when the REP leaves no responder resources.

use ibcm::{
    AcceptParams, Clock, Fabric, Failover, ListenParams, Overlapped, Provider, QpState, Realtime,
    spawn,
};
use ibcm_ioctl::iba::access;

fn fabric() -> Realtime {
    Realtime::start(Fabric::with_clock(2, 1, Clock::real()))
}

fn listen(p: &Provider, service_id: u64) -> ibcm::Listener {
    p.listen(&ListenParams {
        service_id,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: 8,
    })
    .unwrap()
}

/// In REQ_SENT (the REQ held unanswered by the listener) the engine's INIT is what the
/// parameters gave before the REQ, with and without responder resources.
#[test]
fn init_before_the_req_is_the_engines() {
    let f = fabric();
    let server = Provider::in_process(f.node(1).unwrap()).unwrap();
    let client = Provider::in_process(f.node(0).unwrap()).unwrap();
    for (k, responder_resources) in [0u8, 1, 4].into_iter().enumerate() {
        let service_id = 0x3900 + k as u64;
        let listener = listen(&server, service_id);
        let mut params = ibcm::example_connect_params(service_id, 0x11 + k as u32, 0, 1);
        params.responder_resources = responder_resources;
        let before = params.init_attributes();
        let ep = client.connect_endpoint().unwrap();
        spawn(ep.connect_async(&params), &Overlapped::new());
        // The REQ has reached the listener: the client is in REQ_SENT.
        let request = listener.get_request().unwrap();
        assert_eq!(
            ep.qp_attributes(QpState::Init).unwrap(),
            before,
            "responder resources {responder_resources}"
        );
        let read = before.access_flags.unwrap() & access::REMOTE_READ != 0;
        assert_eq!(read, responder_resources > 0);
        assert_eq!((before.port, before.pkey), (Some(1), Some(0xffff)));
        ep.cancel();
        drop(request);
    }
}

/// The REP's initiator depth is the active side's responder resources (IBA 12.7.30, Linux
/// cm_rep_handler): 0 takes REMOTE_READ off the INIT, which the answer's INIT shows; any
/// other leaves it as it was before the REQ.
#[test]
fn the_answers_init_differs_only_when_the_rep_leaves_no_responder_resources() {
    let f = fabric();
    let server = Provider::in_process(f.node(1).unwrap()).unwrap();
    let client = Provider::in_process(f.node(0).unwrap()).unwrap();
    for (k, rep_initiator_depth) in [0u8, 1].into_iter().enumerate() {
        let service_id = 0x3910 + k as u64;
        let listener = listen(&server, service_id);
        let accept = std::thread::spawn(move || {
            let request = listener.get_request().unwrap();
            request
                .endpoint
                .prepare_accept(&AcceptParams {
                    qpn: 0x22 + k as u32,
                    starting_psn: None,
                    responder_resources: 1,
                    initiator_depth: rep_initiator_depth,
                    rnr_retry_count: 7,
                    failover_accepted: Failover::NotSupported,
                    flow_control: true,
                    srq: false,
                    private_data: &[],
                })
                .unwrap();
            request.endpoint.accept().unwrap();
            request.endpoint
        });
        // QPNs of their own: the last connection is still up (IBA 12.9.8.3 stale).
        let params = ibcm::example_connect_params(service_id, 0x11 + k as u32, 0, 1);
        let before = params.init_attributes();
        let ep = client.connect_endpoint().unwrap();
        let reply = ep.connect(&params).unwrap();
        assert_eq!(reply.init, ep.qp_attributes(QpState::Init).unwrap());
        assert_eq!(
            reply.init == before,
            rep_initiator_depth > 0,
            "REP initiator depth {rep_initiator_depth}: {:?} against {:?}",
            reply.init,
            before
        );
        assert_eq!(
            reply.init_again(&before),
            (rep_initiator_depth == 0).then_some(&reply.init)
        );
        assert_eq!(
            reply.init.access_flags.unwrap() & access::REMOTE_READ != 0,
            rep_initiator_depth > 0
        );
        ep.rtu(&[]).unwrap();
        let _server_ep = accept.join().unwrap();
    }
}
