//! WinVerbs and ndfltr above the filter, replayed call for call (the C replays of
//! `driver/iba-cm/ctest/c`: `winverbs.c` follows wv_ep.c, `ndfltr.c` nd_ep.cpp): each asks
//! for `GUID_INFINIBAND_INTERFACE_CM` with IRP_MN_QUERY_INTERFACE from the top of the HCA's
//! stack, as `WdfFdoQueryForInterface` does (wv_driver.c:554, nd_driver.cpp NdPowerD0Entry),
//! and calls the table the binding answered with: their queue spin lock held (DISPATCH_LEVEL
//! on the calling thread) where theirs is, the binding's callbacks from its DPCs. The other
//! side is the HCA's second port, or the same driver on a driver/host node's `iba_cm`
//! (`peer_cm.rs`) across the simulated fabric; every MAD of the binding goes through AL's
//! MAD service.

use std::ffi::c_void;
use std::sync::Arc;

use ibcm_iba_cm::abi::{IbPathRec, InfinibandInterfaceCm, event_type as ev, qp_state};

use super::*;

#[path = "../../../../../driver/iba-cm/ctest/tests/replay/endpoints.rs"]
mod endpoints;
mod peer_cm;

use endpoints::{FakeQp, Host as Client, NdEp, NdParam, WvEp, WvParam, nd, wv};
use peer_cm::PeerCm;

const A_IP: [u8; 4] = [10, 0, 0, 1];
const B_IP: [u8; 4] = [10, 0, 0, 2];
const IP_PORT: u16 = 7000;
/// WinVerbs' and ndfltr's random StartingPSNs (wv_ep.c:616, nd_ep.cpp:66).
const A_PSN: u32 = 0xAB12_3456;
const B_PSN: u32 = 0x0065_4321;
/// STATUS_PENDING.
const PENDING: i32 = 0x0000_0103;

extern "C" fn sim_is_dispatch(_: *const c_void) -> i32 {
    i32::from(thread::irql() >= thread::DISPATCH)
}

/// The client's queue spin lock: the client's code at DISPATCH_LEVEL on this thread.
extern "C" fn sim_at_dispatch(_: *const c_void, f: extern "C" fn(*mut c_void), arg: *mut c_void) {
    thread::call_driver("a kernel client's queue lock", thread::DISPATCH, || f(arg));
}

/// A kernel client of the binding's CM on `device`'s stack: its table (kept boxed for the
/// replays' pointer) and its IRQL hooks.
struct KernelClient {
    table: Box<InfinibandInterfaceCm>,
    client: Arc<Client>,
}

impl KernelClient {
    fn query(device: usize) -> Self {
        let size = size_of::<InfinibandInterfaceCm>() as u16;
        let (st, ifc) = query_cm_interface(device, size);
        assert_eq!(st, 0, "the query is answered");
        assert_eq!(
            ifc.interface_header.version,
            ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION,
            "by ibcm's CM, not passed down to AL's"
        );
        let table = Box::new(ifc);
        let client = Arc::new(Client::from_hooks(
            &raw const *table,
            std::ptr::null(),
            sim_is_dispatch,
            sim_at_dispatch,
            Box::new(()),
        ));
        Self { table, client }
    }

    /// The client's D0Exit: its reference goes (wv_driver.c:662-672).
    fn release(self) {
        drop(self.client);
        release_cm_interface(&self.table);
    }
}

/// The path from `a` to `b` (what a provider's route resolution gives).
fn path(a: &PortConfig, b: &PortConfig) -> IbPathRec {
    use ibcm_iba_cm::abi::{Be16, Be32};
    IbPathRec {
        sgid: a.gid,
        dgid: b.gid,
        slid: Be16::new(a.lid),
        dlid: Be16::new(b.lid),
        hop_flow_raw: Be32::new(0),
        pkey: Be16::new(0xFFFF),
        mtu: 0x80 | 4,
        rate: 0x80 | 3,
        pkt_life: 0x80 | 10,
        ..IbPathRec::default()
    }
}

/// Waits (10 s at most) for `what` to hold, running `pump` (a peer CM's deferred
/// deliveries) meanwhile: the binding works on its own threads.
fn until(pump: &dyn Fn(), what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        pump();
        if cond() {
            return;
        }
        assert!(Instant::now() < deadline, "waited 10 s for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// No peer CM to pump.
fn nothing() {}

/// The peer node (LID 0x20) facing the binding's port 1, with its own `iba_cm`.
const PEER_CA_GUID: u64 = 0x0002_c903_00ab_0001;

/// Every callback ran at DISPATCH_LEVEL (AL's contract, al_cm_cep.c) and none under the
/// client's own queue lock.
fn clean(recursions: i32, seen_at_dispatch: Vec<u8>) {
    assert_eq!(
        recursions, 0,
        "a callback ran under the client's queue lock"
    );
    assert!(
        seen_at_dispatch.iter().all(|d| *d == 1),
        "a callback below DISPATCH_LEVEL: {seen_at_dispatch:?}"
    );
}

/// WinVerbs' connection (winverbs.rs `winverbs_accept_moves_the_qp_to_rts_before_the_rep`):
/// `a` listens nowhere and connects over `route`, `b` listens; the passive accept moves
/// its QP to INIT, RTR and RTS before the REP (wv_ep.c:816-871), the active accept sends
/// the RTU (789-803), both QPs agree on PSNs and QPNs, then the disconnect both ways
/// (1044-1072). Every callback at DISPATCH_LEVEL and outside the queue lock.
fn winverbs_connection(a: &Arc<Client>, b: &Arc<Client>, route: &IbPathRec, pump: &dyn Fn()) {
    let (listen, passive, active) = (WvEp::new(b), WvEp::new(b), WvEp::new(a));
    assert_eq!(listen.bind(B_IP, IP_PORT), 0);
    assert_eq!(listen.listen(8), 0);
    assert_eq!(listen.get_request(&passive), PENDING);
    assert_eq!(active.bind(A_IP, 0x4000), 0);
    assert_eq!(active.set_route(route), 0);
    let mut qp_a = FakeQp::new(0x11);
    let param = WvParam::new(&[0xA1; 10], 3, 2, 5, 6);
    assert_eq!(active.connect(&qp_a, B_IP, IP_PORT, &param, A_PSN), 0);
    until(pump, "the REQ at the listen", || {
        passive.state() == wv::PASSIVE_CONNECT
    });
    let r = passive.req_event();
    assert_eq!(
        r.starting_psn.get(),
        A_PSN & 0x00FF_FFFF,
        "al_cm_cep.c:6255"
    );
    assert_eq!(r.qpn.get(), 0x11);
    let mut qp_b = FakeQp::new(0x22);
    let accept = WvParam::new(&[0xB2; 5], 2, 3, 0, 4);
    assert_eq!(passive.accept(&mut qp_b, &accept, B_PSN), 0);
    let all = qp_state::INIT | qp_state::RTR | qp_state::RTS;
    assert_eq!(qp_b.modified, all, "INIT, RTR and RTS before the REP");
    assert_eq!(qp_b.rtr().dest_qp.get(), 0x11);
    until(pump, "the REP", || active.types() == [ev::REP_RECEIVED]);
    assert_eq!(
        active.accept(&mut qp_a, &WvParam::new(&[0xC3], 0, 0, 0, 0), 0),
        0
    );
    assert_eq!(qp_a.modified, all);
    assert_eq!(active.state(), wv::CONNECTED);
    let (a_rtr, a_rts, b_rtr, b_rts) = (qp_a.rtr(), qp_a.rts(), qp_b.rtr(), qp_b.rts());
    assert_eq!(a_rtr.dest_qp.get(), 0x22);
    assert_eq!(a_rts.sq_psn.get(), b_rtr.rq_psn.get() & 0x00FF_FFFF);
    assert_eq!(b_rts.sq_psn.get(), a_rtr.rq_psn.get());
    until(pump, "the RTU", || passive.state() == wv::CONNECTED);
    assert_eq!(active.disconnect(), 0);
    until(pump, "the DREQ", || {
        passive.state() == wv::PASSIVE_DISCONNECT
    });
    assert_eq!(passive.disconnect(), 0);
    until(pump, "the DREP", || active.state() == wv::DISCONNECTED);
    assert_eq!(active.types(), [ev::REP_RECEIVED, ev::DREP_RECEIVED]);
    for e in [&listen, &passive, &active] {
        clean(
            e.recursions(),
            e.seen().iter().map(|s| s.at_dispatch).collect(),
        );
    }
    for e in [&passive, &listen, &active] {
        e.free();
    }
}

/// ndfltr's connection (ndfltr.rs `ndfltr_connects_accepts_and_disconnects`): `b`'s
/// listener callback takes the request under its queue lock (nd_ep.cpp:2033-2062),
/// Accept is format_rep, RTR, RTS and send_formatted_rep (1319-1346), `a`'s
/// CompleteConnect moves its QP and sends the RTU (1113-1162), then Disconnect both ways
/// (1848-1894).
fn ndfltr_connection(a: &Arc<Client>, b: &Arc<Client>, route: &IbPathRec, pump: &dyn Fn()) {
    let (listener, passive) = (
        NdEp::new(b, nd::LISTENER, 0),
        NdEp::new(b, nd::CONNECTOR, B_PSN),
    );
    assert_eq!(listener.bind(B_IP, IP_PORT), 0);
    assert_eq!(listener.listen(), 0);
    assert_eq!(listener.get_connection_request(&passive), PENDING);
    let active = NdEp::new(a, nd::CONNECTOR, A_PSN);
    assert_eq!(active.bind(A_IP, 0), 0);
    let mut qp_a = FakeQp::new(0x11);
    let param = NdParam::new(&[0xA1; 12], 4, 2, 6, 7);
    assert_eq!(
        active.connect(&mut qp_a, B_IP, IP_PORT, route, &param),
        PENDING
    );
    until(pump, "the REQ at the listener", || {
        passive.state() == nd::REQ_RECEIVED
    });
    assert_eq!(passive.read_limits(), (4, 2), "nd_ep.cpp:2022-2023");
    let mut qp_b = FakeQp::new(0x22);
    assert_eq!(
        passive.accept(&mut qp_b, &NdParam::new(&[0xB2; 8], 3, 2, 0, 5)),
        PENDING
    );
    let all = qp_state::INIT | qp_state::RTR | qp_state::RTS;
    assert_eq!(qp_b.modified, all);
    until(pump, "the REP", || active.state() == nd::REP_RECEIVED);
    assert_eq!(active.read_limits(), (3, 2), "nd_ep.cpp:683, 686");
    assert_eq!(active.complete_connect(9), 0);
    assert_eq!(active.state(), nd::CONNECTED);
    assert_eq!(qp_a.rtr().dest_qp.get(), 0x22);
    assert_eq!(qp_b.rtr().dest_qp.get(), 0x11);
    until(pump, "the RTU", || passive.state() == nd::CONNECTED);
    assert_eq!(active.disconnect(), PENDING);
    until(pump, "the DREQ", || {
        passive.state() == nd::PASSIVE_DISCONNECT
    });
    assert_eq!(passive.disconnect(), 0);
    until(pump, "the DREP", || active.state() == nd::DISCONNECTED);
    for e in [&listener, &passive, &active] {
        clean(
            e.recursions(),
            e.seen().iter().map(|s| s.at_dispatch).collect(),
        );
    }
    for e in [&passive, &listener, &active] {
        e.destructor();
    }
}

/// WinVerbs on both of the HCA's ports, through the binding's table.
pub fn winverbs_through_the_binding() {
    let device = boot(&[]);
    let wv = KernelClient::query(device);
    let route = path(&port(1, 0x10), &port(2, 0x11));
    winverbs_connection(&wv.client, &wv.client, &route, &nothing);
    wv.release();
    shutdown(device);
}

/// ndfltr on both of the HCA's ports, through the binding's table.
pub fn ndfltr_through_the_binding() {
    let device = boot(&[]);
    let nd = KernelClient::query(device);
    let route = path(&port(1, 0x10), &port(2, 0x11));
    ndfltr_connection(&nd.client, &nd.client, &route, &nothing);
    nd.release();
    shutdown(device);
}

/// WinVerbs on the binding connects to WinVerbs on a driver/host node (its own `iba_cm`)
/// across the simulated fabric, and ndfltr on the node connects to ndfltr on the binding:
/// each driver in both roles against a peer that is not itself.
pub fn kernel_clients_with_a_peer_node() {
    let device = boot(&[]);
    let (ours, theirs) = (port(1, 0x10), peer_port());
    let peer = Peer::start(PEER_CA_GUID, address(&theirs), address(&ours));
    let peer_cm = PeerCm::new(&peer.node, PEER_CA_GUID);
    let pump = || peer_cm.deliver();
    let wv = KernelClient::query(device);
    winverbs_connection(&wv.client, &peer_cm.client, &path(&ours, &theirs), &pump);
    ndfltr_connection(&peer_cm.client, &wv.client, &path(&theirs, &ours), &pump);
    // What crossed the fabric, as the peer's engine counted it (attributes from REQ,
    // 0x10: REQ, REP 0x13, RTU 0x14, DREQ 0x15, DREP 0x16; IBA Table 106): one of each
    // each way.
    let c = peer.node.device.with_engine(|cm| *cm.counters());
    for (name, i) in [("REQ", 0), ("REP", 3), ("RTU", 4), ("DREQ", 5), ("DREP", 6)] {
        assert_eq!(
            (c.sent[i], c.received[i]),
            (1, 1),
            "{name}s the peer sent and received"
        );
    }
    wv.release();
    peer_cm.remove();
    peer.stop();
    shutdown(device);
}
