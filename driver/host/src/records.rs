//! IOCTL input records as a user-mode caller on the simulated fabric sends them, for the
//! tests and benchmarks that drive the dispatch layer record by record: a path between
//! two nodes, a CONNECT and a FORMAT_REP with ordinary RC values, an endpoint's handle.

use ibcm_ioctl::{ConnectIn, FormatRepIn, HandleIn, PathAbi};
use zerocopy::FromZeros;

use crate::node_address;

/// The path from node `from` to node `to` (their LIDs and GIDs, 100 Gb/s, packet life
/// time 14, subnet-local).
pub fn path(from: usize, to: usize) -> PathAbi {
    let (a, b) = (node_address(from), node_address(to));
    let mut p = PathAbi::new_zeroed();
    p.slid = a.lid;
    p.dlid = b.lid;
    p.sgid = a.gid;
    p.dgid = b.gid;
    p.rate = 16;
    p.packet_life_time = 14;
    p.subnet_local = 1;
    p
}

/// CONNECT of endpoint `handle` from node 0 to node 1, to `service_id`, from `qpn` (RC,
/// MTU 4096, two reads each way, no private data).
pub fn connect_in(handle: u64, service_id: u64, qpn: u32) -> ConnectIn {
    let mut c = ConnectIn::new_zeroed();
    c.size = ConnectIn::SIZE;
    c.handle = handle;
    c.service_id = service_id;
    c.qpn = qpn;
    c.pkey = 0xffff;
    c.port = 1;
    c.path_mtu = 5;
    c.responder_resources = 2;
    c.initiator_depth = 2;
    c.remote_cm_response_timeout = 16;
    c.local_cm_response_timeout = 16;
    c.retry_count = 7;
    c.rnr_retry_count = 7;
    c.max_cm_retries = 3;
    c.primary = path(0, 1);
    c
}

/// FORMAT_REP of request endpoint `handle` with `qpn` (two reads each way, failover not
/// supported, no private data).
pub fn format_rep_in(handle: u64, qpn: u32) -> FormatRepIn {
    let mut r = FormatRepIn::new_zeroed();
    r.size = FormatRepIn::SIZE;
    r.handle = handle;
    r.qpn = qpn;
    r.responder_resources = 2;
    r.initiator_depth = 2;
    r.rnr_retry_count = 7;
    r.failover_accepted = 1;
    r
}

/// The input of the IOCTLs that name one endpoint (DESTROY, GET_EVENT, CANCEL_LISTEN, ...).
pub fn handle_in(handle: u64) -> HandleIn {
    HandleIn {
        size: HandleIn::SIZE,
        reserved: 0,
        handle,
    }
}
