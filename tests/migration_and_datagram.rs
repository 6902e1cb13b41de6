//! Path migration (LAP/APR, migrate) and the datagram endpoint (SIDR) through the user
//! library, the IOCTL records and the driver on the simulated fabric.

use ibcm::{
    AcceptParams, AprStatus, Failover, ListenParams, Provider, QpState, ResolveParams, SidrStatus,
};
use ibcm_cli::sim::{Sim, SimOptions};

fn connected(
    client: &Provider,
    server: &Provider,
) -> (ibcm::ConnectEndpoint, ibcm::ConnectEndpoint) {
    let listener = server
        .listen(&ListenParams {
            service_id: 0x4400,
            service_mask: u64::MAX,
            port: None,
            compare: None,
            backlog: 4,
        })
        .unwrap();
    let server_side = std::thread::spawn(move || {
        let req = listener.get_request().unwrap();
        req.endpoint
            .prepare_accept(&AcceptParams {
                qpn: 0x22,
                starting_psn: None,
                responder_resources: 1,
                initiator_depth: 1,
                rnr_retry_count: 7,
                failover_accepted: Failover::NotSupported,
                flow_control: true,
                srq: false,
                private_data: &[],
            })
            .unwrap();
        req.endpoint.accept().unwrap();
        (req.endpoint, listener)
    });
    let ep = client.connect_endpoint().unwrap();
    ep.connect(&ibcm::example_connect_params(0x4400, 0x11, 0, 1))
        .unwrap();
    ep.rtu(&[]).unwrap();
    let (passive, _listener) = server_side.join().unwrap();
    (ep, passive)
}

#[test]
fn lap_apr_and_migrate_through_the_library() {
    let sim = Sim::start(&SimOptions::default());
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let (active, passive) = connected(&client, &server);
    let mut alt = ibcm::example_connect_params(0x4400, 0x11, 0, 1).primary_path;
    alt.sl = 3;
    alt.flow_label = 0x12345;
    let lap = std::thread::spawn(move || {
        let reply = active.load_alternate_path(&alt, b"alt?").unwrap();
        (reply, active)
    });
    let request = passive.get_alternate_path_request().unwrap();
    assert_eq!(request.alternate_path.sl, 3);
    assert_eq!(&request.private_data[..4], b"alt?");
    let rts = passive
        .answer_alternate_path(AprStatus::Success, &[], b"ok")
        .unwrap()
        .expect("RTS attributes on success");
    assert_eq!(rts.alternate.map(|a| a.path.sl), Some(3));
    let (reply, active) = lap.join().unwrap();
    assert_eq!(reply.status, AprStatus::Success);
    assert_eq!(&reply.private_data[..2], b"ok");
    let q = active.query().unwrap();
    assert_eq!((q.has_alternate, q.alternate.sl), (1, 3));
    // The QP migrated: primary and alternate swap.
    active.migrate().unwrap();
    let rtr = active.qp_attributes(QpState::Rtr).unwrap();
    assert_eq!(rtr.primary.map(|p| p.path.sl), Some(3));
    assert_eq!(rtr.alternate.map(|p| p.path.sl), Some(0));
    // A second migrate swaps back; a LAP rejected by the peer changes nothing.
    active.migrate().unwrap();
    let lap = std::thread::spawn(move || {
        let mut other = alt;
        other.sl = 9;
        (active.load_alternate_path(&other, &[]).unwrap(), active)
    });
    passive.get_alternate_path_request().unwrap();
    assert_eq!(
        passive
            .answer_alternate_path(AprStatus::Reject, &[], &[])
            .unwrap(),
        None
    );
    let (reply, active) = lap.join().unwrap();
    assert_eq!(reply.status, AprStatus::Reject);
    assert_eq!(active.query().unwrap().alternate.sl, 3);
    active.disconnect(&[]).unwrap();
    drop((active, passive));
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn sidr_resolves_a_service_and_reports_unsupported_without_a_listener() {
    let sim = Sim::start(&SimOptions::default());
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let listener = server
        .listen(&ListenParams {
            service_id: 0x5500,
            service_mask: u64::MAX,
            port: None,
            compare: None,
            backlog: 4,
        })
        .unwrap();
    let answer = std::thread::spawn(move || {
        let req = listener.get_datagram_request().unwrap();
        assert_eq!(&req.private_data[..3], b"who");
        req.endpoint
            .reply(SidrStatus::Success, 0x777, 0x1111_2222, b"info", b"here")
            .unwrap();
        listener
    });
    let dgram = client.datagram_endpoint().unwrap();
    let path = ibcm::example_connect_params(0, 0, 0, 1).primary_path;
    let params = |service_id| ResolveParams {
        service_id,
        port: 1,
        pkey: 0xffff,
        path,
        timeout: 16,
        max_retries: 3,
        private_data: b"who",
    };
    let reply = dgram.resolve(&params(0x5500)).unwrap();
    assert_eq!(
        (reply.status, reply.qpn, reply.qkey),
        (SidrStatus::Success, 0x777, 0x1111_2222)
    );
    assert_eq!(
        (&reply.info[..], &reply.private_data[..4]),
        (&b"info"[..], &b"here"[..])
    );
    let _listener = answer.join().unwrap();
    let other = client.datagram_endpoint().unwrap();
    assert_eq!(
        other.resolve(&params(0x9999)).unwrap().status,
        SidrStatus::Unsupported
    );
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}
