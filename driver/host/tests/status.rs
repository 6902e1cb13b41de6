//! STATUS through the dispatch layer: the same checks as every record (the VERSION
//! handshake, the input's size and reserved field, the output's room), then the platform's
//! HCAs and ports (on the host, the node's one simulated HCA and port).

use ibcm_host::{Fabric, node_address};
use ibcm_ioctl::status_report::{CM_IBCM, ROUTE_ORDINARY};
use ibcm_ioctl::{ABI_VERSION, StatusIn, StatusOut, VersionIn, code, status};
use zerocopy::{FromBytes, IntoBytes};

fn status_in() -> StatusIn {
    StatusIn {
        size: StatusIn::SIZE,
        reserved: 0,
    }
}

#[test]
fn status_reports_the_nodes_hca_and_port_after_the_handshake() {
    let fabric = Fabric::new(2, 7);
    let node = &fabric.nodes[1];
    let file = node.open();
    let out = StatusOut::SIZE as usize;

    let early = node.ioctl_now(file, code::STATUS, status_in().as_bytes(), out);
    assert_eq!(early.status, status::INVALID_DEVICE_STATE, "before VERSION");
    assert_eq!(early.information, 0);

    let version = VersionIn {
        size: VersionIn::SIZE,
        abi_version: ABI_VERSION,
    };
    let done = node.ioctl_now(file, code::VERSION, version.as_bytes(), 16);
    assert_eq!(done.status, status::SUCCESS);

    let mut bad = status_in();
    bad.size += 1;
    let r = node.ioctl_now(file, code::STATUS, bad.as_bytes(), out);
    assert_eq!(r.status, status::REVISION_MISMATCH);
    let mut bad = status_in();
    bad.reserved = 1;
    let r = node.ioctl_now(file, code::STATUS, bad.as_bytes(), out);
    assert_ne!(r.status, status::SUCCESS, "reserved must be zero");
    let r = node.ioctl_now(file, code::STATUS, &status_in().as_bytes()[..4], out);
    assert_eq!(r.status, status::INFO_LENGTH_MISMATCH);
    let r = node.ioctl_now(file, code::STATUS, status_in().as_bytes(), out - 1);
    assert_eq!(r.status, status::BUFFER_TOO_SMALL);
    assert_eq!(r.information, 0);

    let done = node.ioctl_now(file, code::STATUS, status_in().as_bytes(), out);
    assert_eq!(done.status, status::SUCCESS);
    assert_eq!(done.information, out);
    let s = StatusOut::read_from_bytes(&done.output).unwrap();
    assert_eq!(s.size, StatusOut::SIZE);
    assert_eq!((s.hca_count, s.port_count), (1, 1));
    assert_eq!(s.hcas[0].ca_guid, 0x0002_c903_00ab_0001);
    assert_eq!(s.hcas[0].cm, CM_IBCM);
    assert_eq!(s.hcas[0].route, ROUTE_ORDINARY);
    assert_eq!(s.ports[0].ca_guid, s.hcas[0].ca_guid);
    assert_eq!(s.ports[0].ca_port, node_address(1).port);
    assert_eq!(s.ports[0].route, ROUTE_ORDINARY);
}
