//! driver/kmdf, the KMDF binding of ibcm.sys, run on the simulated Windows kernel
//! (`ibcm-ntos`) under its Driver Verifier and KMDF Verifier rules.
//!
//! Each scenario runs in its own process (this binary re-executed with
//! `IBCM_SIM_SCENARIO=<name>`): the binding keeps process globals as a driver image does,
//! and a verifier failure aborts its process (it happens inside `extern "C"` frames), so
//! one failure names its scenario and the others still run. Scenarios that show a rule
//! firing expect their process to stop with that rule. `cargo test -- NAME` runs the
//! scenarios whose name contains NAME; `IBCM_SIM_DBGPRINT=1` prints the driver's DbgPrint.

mod accounts;
mod bad_driver;
mod kernel_clients;
mod pnp_power;
mod upper_filters;
mod user_library;
mod verbs_hook;

use std::process::Command;
use std::time::{Duration, Instant};

use accounts::*;
use ibcm_host::records;
use ibcm_ioctl::{
    ConnectIn, CreateIn, CreateOut, EventRecord, HandleIn, ListenIn, PrivateDataIn, VersionIn,
    code, event_type, status,
};
use ibcm_kmdf_scenarios::peer::Peer;
use ibcm_ntos::al::{self, CaConfig, PortConfig};
use ibcm_ntos::io::{self, Open};
use ibcm_ntos::security::{GENERIC_READ, Token};
use ibcm_ntos::{pnp, registry, thread};
use kernel_clients::*;
use pnp_power::*;
use upper_filters::*;
use user_library::*;
use verbs_hook::*;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

#[global_allocator]
static POOL: ibcm_ntos::pool::TrackingAllocator = ibcm_ntos::pool::TrackingAllocator;

/// The simulated HCA's CA GUID (host order).
const CA_GUID: u64 = 0x0002_c903_0000_1000;
/// `\DosDevices\Global\ibcm` (`\\.\ibcm`).
const LINK: &str = r"\DosDevices\Global\ibcm";
/// The SDDL the README promises: SYSTEM all, Administrators RWX, everyone RW, restricted
/// code R (control.rs, wdmsec.h SDDL_DEVOBJ_SYS_ALL_ADM_RWX_WORLD_RW_RES_R).
const SDDL: &str = "D:P(A;;GA;;;SY)(A;;GRGWGX;;;BA)(A;;GRGW;;;WD)(A;;GR;;;RC)";
/// wdm.h FILE_DEVICE_SECURE_OPEN.
const FILE_DEVICE_SECURE_OPEN: u32 = 0x100;
/// SECURITY_IMPERSONATION_LEVEL SecurityIdentification.
const SECURITY_IDENTIFICATION: i32 = 1;

fn port(port_num: u8, lid: u16) -> PortConfig {
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[8..].copy_from_slice(&(CA_GUID + u64::from(port_num)).to_be_bytes());
    PortConfig {
        port_num,
        lid,
        gid,
        pkeys: vec![0xffff],
    }
}

/// The simulated HCA: two ports (LIDs 0x10 and 0x11); `al_cm_holds_send` as on a stock
/// WinOF host.
fn hca(al_cm_holds_send: bool) -> CaConfig {
    CaConfig {
        ca_guid: CA_GUID,
        ports: vec![port(1, 0x10), port(2, 0x11)],
        al_cm_holds_send,
        verbs: false,
    }
}

/// DriverEntry, one HCA whose ports take ibcm's CM MAD service, added and started.
fn boot(registry_values: &[(&str, u32)]) -> usize {
    boot_on(hca(false), registry_values)
}

/// DriverEntry, `ca` added and started.
fn boot_on(ca: CaConfig, registry_values: &[(&str, u32)]) -> usize {
    for (name, value) in registry_values {
        registry::set(name, *value);
    }
    al::set_cas(vec![ca]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    let device = pnp::add_device(0).expect("the filter attaches");
    assert_eq!(
        pnp::start(device),
        0,
        "EvtDeviceD0Entry never fails the HCA"
    );
    device
}

/// Orderly removal and unload; the leak report runs at unload.
fn shutdown(device: usize) {
    pnp::remove(device);
    assert!(
        io::device_named(LINK).is_none(),
        "the control device goes with the last filter"
    );
    pnp::unload();
}

fn ioctl<I: IntoBytes + zerocopy::Immutable>(
    file: usize,
    code: u32,
    input: &I,
    output_len: usize,
) -> usize {
    io::ioctl(file, code, input.as_bytes(), output_len)
}

fn complete(request: usize) -> (i32, Vec<u8>) {
    io::wait_for(request, Duration::from_secs(10)).expect("the request completes")
}

fn version(file: usize) -> i32 {
    let v = VersionIn {
        size: VersionIn::SIZE,
        abi_version: ibcm_ioctl::ABI_VERSION,
    };
    complete(ioctl(file, code::VERSION, &v, 16)).0
}

fn create(file: usize) -> Result<u64, i32> {
    Binding(file).try_endpoint()
}

/// Opens `\\.\ibcm` as `who` and does the VERSION handshake.
fn open(who: Open) -> usize {
    let file = io::open(LINK, who).expect("the open succeeds");
    assert_eq!(version(file), status::SUCCESS);
    file
}

/// CONNECT of `handle` from `from` to `to` (records::connect_in's RC values, QPN 0x123).
fn connect_between(handle: u64, service_id: u64, from: &PortConfig, to: &PortConfig) -> ConnectIn {
    let mut c = records::connect_in(handle, service_id, 0x123);
    c.port = from.port_num;
    c.primary.slid = from.lid;
    c.primary.dlid = to.lid;
    c.primary.sgid = from.gid;
    c.primary.dgid = to.gid;
    c
}

/// LISTEN of `handle` on `service_id` (exact mask, any port) with `backlog`.
fn listen_in(handle: u64, service_id: u64, backlog: u32) -> ListenIn {
    let mut listen = ListenIn::new_zeroed();
    listen.size = ListenIn::SIZE;
    listen.handle = handle;
    listen.service_id = service_id;
    listen.service_mask = u64::MAX;
    listen.backlog = backlog;
    listen
}

fn handle_in(handle: u64) -> HandleIn {
    HandleIn {
        size: HandleIn::SIZE,
        reserved: 0,
        handle,
    }
}

/// Opens `\\.\ibcm` as `who` and creates endpoints until the handle's quota (2, from
/// the registry) stops it: how many it got.
fn endpoints_allowed(who: Open) -> usize {
    let file = open(who);
    let mut made = 0;
    for _ in 0..3 {
        match create(file) {
            Ok(_) => made += 1,
            Err(s) => {
                assert_eq!(s, status::QUOTA_EXCEEDED);
                break;
            }
        }
    }
    io::close(file);
    made
}

// ------------------------------------------------------------------------------------
// Scenarios
// ------------------------------------------------------------------------------------

/// DriverEntry, device add, start, removal and unload, with nothing left.
fn load_start_remove_unload() {
    let device = boot(&[]);
    assert!(
        io::device_named(LINK).is_some(),
        "\\\\.\\ibcm exists once a filter is added"
    );
    shutdown(device);
}

/// The control device: its name (the first instance's, `\Device\ibcm0`), link, SDDL and
/// FILE_DEVICE_SECURE_OPEN, and the I/O manager's check of who may open it for what.
fn control_device_security() {
    let device = boot(&[]);
    let (sddl, characteristics, exclusive) =
        io::device_security(r"\Device\ibcm0").expect("\\Device\\ibcm0");
    assert_eq!(sddl.as_deref(), Some(SDDL));
    assert_ne!(characteristics & FILE_DEVICE_SECURE_OPEN, 0);
    assert!(!exclusive, "several processes open the CM at once");
    assert_eq!(io::device_named(LINK), io::device_named(r"\Device\ibcm0"));
    // A restricted token gets read access only: the I/O manager refuses read/write.
    assert_eq!(
        io::open(LINK, Open::user(Token::RESTRICTED_ADMIN)),
        Err(ibcm_ntos::STATUS_ACCESS_DENIED)
    );
    for who in [
        Open::user(Token::USER),
        Open::user(Token::ADMIN),
        Open::kernel(),
    ] {
        let file = io::open(LINK, who).expect("opens");
        assert_eq!(version(file), status::SUCCESS);
        io::close(file);
    }
    shutdown(device);
}

/// Who the driver takes the caller for, seen through the per-handle quota read from the
/// registry (administrators and kernel components are not limited).
fn callers_and_registry_quotas() {
    let device = boot(&[("MaxEndpointsPerHandle", 2)]);
    assert!(
        registry::read()
            .iter()
            .any(|n| n == "MaxEndpointsPerHandle"),
        "the quota is read from Parameters"
    );
    assert_eq!(
        endpoints_allowed(Open::user(Token::USER)),
        2,
        "a user is held to the quota"
    );
    assert_eq!(
        endpoints_allowed(Open::user(Token::ADMIN)),
        3,
        "an elevated administrator is not"
    );
    assert_eq!(
        endpoints_allowed(Open::kernel()),
        3,
        "a kernel component on its own behalf is not"
    );
    let forced = Open {
        force_access_check: true,
        primary: Token::USER,
        ..Open::kernel()
    };
    assert_eq!(
        endpoints_allowed(forced),
        2,
        "a kernel open for a user (SL_FORCE_ACCESS_CHECK) is the user's"
    );
    let identification = Open {
        client: Some((Token::ADMIN, SECURITY_IDENTIFICATION)),
        ..Open::user(Token::USER)
    };
    assert_eq!(
        endpoints_allowed(identification),
        2,
        "an identification-level administrator's token acts for no one"
    );
    let restricted = Open {
        desired: GENERIC_READ,
        ..Open::user(Token::RESTRICTED_ADMIN)
    };
    assert_eq!(
        endpoints_allowed(restricted),
        2,
        "a restricted administrator's token is not an administrator's"
    );
    shutdown(device);
}

/// Every IOCTL with no input, with garbage, and bad records: each completes with an
/// error and changes nothing; the handle still works after.
fn ioctls_with_bad_records() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    for c in code::ALL {
        for input in [&[][..], &[0xffu8; 7][..], &[0x5au8; 64][..]] {
            let (s, _) = complete(io::ioctl(file, c, input, 64));
            assert_ne!(s, status::SUCCESS, "IOCTL {c:#x} with input {input:?}");
        }
    }
    let (s, _) = complete(io::ioctl(file, code::VERSION + (0x7f << 2), &[], 0));
    assert_eq!(s, status::INVALID_DEVICE_REQUEST, "an unknown code");
    let bad_size = VersionIn {
        size: 7,
        abi_version: ibcm_ioctl::ABI_VERSION,
    };
    assert_ne!(
        complete(ioctl(file, code::VERSION, &bad_size, 16)).0,
        status::SUCCESS
    );
    assert_eq!(
        complete(ioctl(file, code::DESTROY, &handle_in(0x1234_5678), 0)).0,
        status::INVALID_HANDLE
    );
    let (s, _) = complete(io::ioctl(file, code::CREATE, &[0u8; 1 << 16], 16));
    assert_ne!(s, status::SUCCESS, "an oversized input");
    assert_eq!(version(file), status::SUCCESS);
    let handle = create(file).expect("an endpoint");
    assert_eq!(
        complete(ioctl(file, code::DESTROY, &handle_in(handle), 0)).0,
        status::SUCCESS
    );
    io::close(file);
    shutdown(device);
}

/// A GET_EVENT pends, and is cancelled from another thread (IoCancelIrp runs the cancel
/// routine there, at DISPATCH_LEVEL).
fn get_event_cancelled_from_another_thread() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    let handle = create(file).expect("an endpoint");
    let request = ioctl(file, code::GET_EVENT, &handle_in(handle), 4096);
    assert!(
        io::wait_for(request, Duration::from_millis(200)).is_none(),
        "GET_EVENT pends"
    );
    std::thread::spawn(move || io::cancel(request))
        .join()
        .expect("the cancelling thread");
    assert_eq!(complete(request).0, status::CANCELLED);
    io::close(file);
    shutdown(device);
}

/// A handle closed with requests pending: cleanup completes them, then close comes.
fn cleanup_and_close_with_requests_pending() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    let mut pending = Vec::new();
    for _ in 0..4 {
        let handle = create(file).expect("an endpoint");
        pending.push(ioctl(file, code::GET_EVENT, &handle_in(handle), 4096));
    }
    io::close(file);
    for request in pending {
        assert!(
            io::result(request).is_some(),
            "cleanup completed every pending request"
        );
    }
    shutdown(device);
}

/// A REQ through the binding's QP1 path: a CONNECT from port 1 leaves through AL's MAD
/// service, arrives on port 2's, goes through the receive ring and DPC to the listen,
/// whose pending GET_EVENT completes with the REQ.
fn req_through_qp1() {
    let device = boot(&[]);
    let file = open(Open::user(Token::ADMIN));
    let listener = create(file).expect("an endpoint");
    let listen = listen_in(listener, 0x1000_0000_0000_1234, 8);
    assert_eq!(
        complete(ioctl(file, code::LISTEN, &listen, 0)).0,
        status::SUCCESS
    );
    let event = ioctl(file, code::GET_EVENT, &handle_in(listener), 4096);
    let client = create(file).expect("an endpoint");
    let (a, b) = (port(1, 0x10), port(2, 0x11));
    let connect = connect_between(client, listen.service_id, &a, &b);
    let (s, _) = complete(ioctl(file, code::CONNECT, &connect, 0));
    assert!(
        s == status::SUCCESS || s == status::PENDING,
        "CONNECT: {s:#x}"
    );
    let (s, out) = complete(event);
    assert_eq!(
        s,
        status::SUCCESS,
        "the listen's GET_EVENT completes with the REQ"
    );
    assert!(
        out.len() >= size_of::<ibcm_ioctl::EventRecord>(),
        "an event record"
    );
    assert!(al::sent().is_empty(), "every MAD went to a simulated port");
    io::close(file);
    // The sends the close made (REJ, DREQ) complete on the processor thread.
    let until = Instant::now() + Duration::from_secs(5);
    while al::elements_held() > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(al::elements_held(), 0, "every MAD element went back to AL");
    shutdown(device);
}

/// One side of a connection: the binding (IOCTLs through the simulated I/O manager) or
/// the host peer (its node's IOCTL records).
trait Side {
    /// Sends an IOCTL; its key.
    fn call(&self, code: u32, input: &[u8], output_len: usize) -> u64;
    /// The IOCTL's completion, waited for at most 10 s.
    fn done(&self, key: u64) -> (i32, Vec<u8>);
    /// CREATE (after the VERSION handshake the side did at open): the new endpoint, or
    /// the status it failed with.
    fn try_endpoint(&self) -> Result<u64, i32> {
        let c = CreateIn {
            size: CreateIn::SIZE,
            reserved: 0,
        };
        let (s, out) = self.done(self.call(code::CREATE, c.as_bytes(), size_of::<CreateOut>()));
        if s != status::SUCCESS {
            return Err(s);
        }
        Ok(CreateOut::read_from_bytes(&out)
            .expect("a CreateOut")
            .handle)
    }
    /// A new endpoint.
    fn endpoint(&self) -> u64 {
        self.try_endpoint().expect("CREATE")
    }
    fn ok(&self, code: u32, input: &[u8], output_len: usize) {
        let (s, _) = self.done(self.call(code, input, output_len));
        assert_eq!(s, status::SUCCESS, "IOCTL {code:#x}");
    }
}

struct Binding(usize);

impl Side for Binding {
    fn call(&self, code: u32, input: &[u8], output_len: usize) -> u64 {
        io::ioctl(self.0, code, input, output_len) as u64
    }
    fn done(&self, key: u64) -> (i32, Vec<u8>) {
        complete(key as usize)
    }
}

struct Host<'a>(&'a ibcm_host::Node, ibcm_endpoint::FileId);

impl Side for Host<'_> {
    fn call(&self, code: u32, input: &[u8], output_len: usize) -> u64 {
        self.0.ioctl(self.1, code, input, output_len)
    }
    fn done(&self, key: u64) -> (i32, Vec<u8>) {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = self.0.completion(key) {
                return (c.status, c.output[..c.information].to_vec());
            }
            assert!(
                Instant::now() < until,
                "the peer's request {key:#x} completes"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The first event of a completed GET_EVENT.
fn event(side: &dyn Side, key: u64) -> EventRecord {
    let (s, out) = side.done(key);
    assert_eq!(s, status::SUCCESS, "GET_EVENT");
    EventRecord::read_from_bytes(&out[..size_of::<EventRecord>()]).expect("an event record")
}

fn get_event(side: &dyn Side, handle: u64) -> u64 {
    side.call(
        code::GET_EVENT,
        handle_in(handle).as_bytes(),
        size_of::<EventRecord>(),
    )
}

fn private_data_in(handle: u64) -> PrivateDataIn {
    let mut p = PrivateDataIn::new_zeroed();
    p.size = PrivateDataIn::SIZE;
    p.handle = handle;
    p
}

/// A whole connection between `active` (at `a`) and `passive` (at `b`), with every IOCTL
/// of the exchange on good records: LISTEN, CONNECT, the REQ event, MRA (the MRA event),
/// FORMAT_REP and SEND_REP, the REP event, GET_QP_TRANSITIONS and GET_QP_ATTR, RTU, the
/// RTU event, QUERY on both sides; then a second REQ answered with REJ, a SIDR_REQ
/// answered with SIDR_REP; a DREQ from the passive side, DREP, timewait's end on both;
/// CANCEL_LISTEN and DESTROY.
fn connection(active: &dyn Side, a: &PortConfig, passive: &dyn Side, b: &PortConfig) {
    let service_id = 0x1000_0000_0000_0077;
    let listener = passive.endpoint();
    passive.ok(
        code::LISTEN,
        listen_in(listener, service_id, 8).as_bytes(),
        0,
    );
    let req_wait = get_event(passive, listener);
    let ep = active.endpoint();
    let mut connect = connect_between(ep, service_id, a, b);
    connect.private_data_len = 5;
    connect.private_data[..5].copy_from_slice(b"hello");
    let mra_wait = get_event(active, ep);
    active.ok(code::CONNECT, connect.as_bytes(), 0);
    let req = event(passive, req_wait);
    assert_eq!(req.event_type, event_type::REQ_RECEIVED);
    assert_eq!(&req.private_data[..5], b"hello");
    assert_eq!(req.service_id, service_id);
    let child = req.new_handle;
    let mut mra = ibcm_ioctl::MraIn::new_zeroed();
    mra.size = ibcm_ioctl::MraIn::SIZE;
    mra.handle = child;
    mra.service_timeout = 14;
    passive.ok(code::MRA, mra.as_bytes(), 0);
    assert_eq!(event(active, mra_wait).event_type, event_type::MRA_RECEIVED);
    let rep_wait = get_event(active, ep);
    let rep = records::format_rep_in(child, 0x202);
    passive.ok(code::FORMAT_REP, rep.as_bytes(), size_of::<EventRecord>());
    let rtu_wait = get_event(passive, child);
    passive.ok(code::SEND_REP, handle_in(child).as_bytes(), 0);
    let rep = event(active, rep_wait);
    assert_eq!(rep.event_type, event_type::REP_RECEIVED);
    assert_eq!(rep.remote_qpn, 0x202);
    let transitions = size_of::<ibcm_ioctl::QpTransitionsOut>();
    active.ok(
        code::GET_QP_TRANSITIONS,
        handle_in(ep).as_bytes(),
        transitions,
    );
    let attr = ibcm_ioctl::GetQpAttrIn {
        size: ibcm_ioctl::GetQpAttrIn::SIZE,
        reserved: 0,
        handle: ep,
        qp_state: ibcm_ioctl::qp_state::RTR,
        reserved1: 0,
    };
    let (s, out) = active.done(active.call(
        code::GET_QP_ATTR,
        attr.as_bytes(),
        size_of::<ibcm_ioctl::QpAttrOut>(),
    ));
    assert_eq!(s, status::SUCCESS);
    let rtr = ibcm_ioctl::QpAttrOut::read_from_bytes(&out).expect("a QpAttrOut");
    assert_eq!(rtr.attr.dest_qpn, 0x202, "RTR names the peer's QP");
    active.ok(code::RTU, private_data_in(ep).as_bytes(), 0);
    assert_eq!(
        event(passive, rtu_wait).event_type,
        event_type::RTU_RECEIVED
    );
    for (side, handle) in [(active, ep), (passive, child)] {
        let (s, out) = side.done(side.call(
            code::QUERY,
            handle_in(handle).as_bytes(),
            size_of::<ibcm_ioctl::QueryOut>(),
        ));
        assert_eq!(s, status::SUCCESS);
        let q = ibcm_ioctl::QueryOut::read_from_bytes(&out[..size_of::<ibcm_ioctl::QueryOut>()])
            .expect("a QueryOut");
        assert_eq!(q.state, ibcm_ioctl::ep_state::ESTABLISHED);
    }

    // A second REQ, rejected by the consumer (IBA Table 112, reason 28).
    let refused = active.endpoint();
    let req_wait = get_event(passive, listener);
    let rej_wait = get_event(active, refused);
    let mut second = connect_between(refused, service_id, a, b);
    second.qpn = 0x124;
    active.ok(code::CONNECT, second.as_bytes(), 0);
    let req = event(passive, req_wait);
    let mut rej = ibcm_ioctl::RejIn::new_zeroed();
    rej.size = ibcm_ioctl::RejIn::SIZE;
    rej.handle = req.new_handle;
    rej.reason = 28;
    passive.ok(code::REJ, rej.as_bytes(), 0);
    let rejected = event(active, rej_wait);
    assert_eq!(
        (rejected.event_type, rejected.reason),
        (event_type::REJECTED, 28)
    );

    // SIDR: the listen resolves the service to a UD QPN and Q_Key.
    let resolver = active.endpoint();
    let sidr_wait = get_event(passive, listener);
    let answer_wait = get_event(active, resolver);
    let mut sidr = ibcm_ioctl::SidrReqIn::new_zeroed();
    sidr.size = ibcm_ioctl::SidrReqIn::SIZE;
    sidr.handle = resolver;
    sidr.service_id = service_id;
    sidr.pkey = 0xffff;
    sidr.port = a.port_num;
    sidr.timeout = 16;
    sidr.max_retries = 3;
    sidr.path = connect.primary;
    active.ok(code::SIDR_REQ, sidr.as_bytes(), 0);
    let asked = event(passive, sidr_wait);
    assert_eq!(asked.event_type, event_type::SIDR_REQ_RECEIVED);
    let mut reply = ibcm_ioctl::SidrRepIn::new_zeroed();
    reply.size = ibcm_ioctl::SidrRepIn::SIZE;
    reply.handle = asked.new_handle;
    reply.qpn = 0x333;
    reply.qkey = 0x1111_2222;
    passive.ok(code::SIDR_REP, reply.as_bytes(), 0);
    let resolved = event(active, answer_wait);
    assert_eq!(
        (resolved.event_type, resolved.remote_qpn),
        (event_type::SIDR_REP_RECEIVED, 0x333)
    );

    let dreq_wait = get_event(active, ep);
    let drep_wait = get_event(passive, child);
    passive.ok(code::DREQ, private_data_in(child).as_bytes(), 0);
    assert_eq!(
        event(active, dreq_wait).event_type,
        event_type::DREQ_RECEIVED
    );
    let exit_wait = get_event(active, ep);
    active.ok(code::DREP, private_data_in(ep).as_bytes(), 0);
    assert_eq!(
        event(passive, drep_wait).event_type,
        event_type::DREP_RECEIVED
    );
    let passive_exit = get_event(passive, child);
    assert_eq!(
        event(passive, passive_exit).event_type,
        event_type::TIMEWAIT_EXIT
    );
    assert_eq!(
        event(active, exit_wait).event_type,
        event_type::TIMEWAIT_EXIT
    );
    passive.ok(code::CANCEL_LISTEN, handle_in(listener).as_bytes(), 0);
    for (side, handle) in [
        (active, ep),
        (active, refused),
        (active, resolver),
        (passive, child),
        (passive, listener),
    ] {
        side.ok(code::DESTROY, handle_in(handle).as_bytes(), 0);
    }
}

/// The host peer's port (LID 0x20 on its own CA).
fn peer_port() -> PortConfig {
    let mut p = port(1, 0x20);
    p.gid[15] ^= 0x80;
    p
}

fn address(p: &PortConfig) -> ibcm_cep::MadAddress {
    ibcm_cep::MadAddress {
        port: 1,
        lid: p.lid,
        gid: p.gid,
        grh: false,
        sl: 0,
        pkey: 0xffff,
    }
}

/// A connection with a driver/host node on the simulated fabric, each side active once:
/// every MAD of the binding goes through AL's MAD service, the receive ring, its DPCs and
/// its timer.
fn connection_with_a_host_peer() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    let ours = port(1, 0x10);
    let theirs = peer_port();
    let peer = Peer::start(0x0002_c903_00ab_0001, address(&theirs), address(&ours));
    let node_file = peer.node.open();
    let node = Host(&peer.node, node_file);
    let v = VersionIn {
        size: VersionIn::SIZE,
        abi_version: ibcm_ioctl::ABI_VERSION,
    };
    node.ok(code::VERSION, v.as_bytes(), 16);
    connection(&Binding(file), &ours, &node, &theirs);
    connection(&node, &theirs, &Binding(file), &ours);
    peer.node.close(node_file);
    io::close(file);
    peer.stop();
    shutdown(device);
}

/// GET_EVENTs cancelled from another thread while the REQs they wait for arrive, on
/// endpoints and on the file's channel: each request completes exactly once, with an event
/// or STATUS_CANCELLED (the cancel routine and the dispatch layer's completion hand the
/// request over through RequestContext::parties; the verifier stops a second completion,
/// a completion while still cancelable, and a touch after completion).
fn cancel_races_event_delivery() {
    let device = boot(&[]);
    let file = open(Open::user(Token::ADMIN));
    let side = Binding(file);
    let (a, b) = (port(1, 0x10), port(2, 0x11));
    let listener = side.endpoint();
    let listen = listen_in(listener, 0x99, 64);
    side.ok(code::LISTEN, listen.as_bytes(), 0);
    let (mut events, mut cancelled) = (0, 0);
    for round in 0..40 {
        let target = if round % 2 == 0 {
            listener
        } else {
            ibcm_ioctl::ANY_ENDPOINT
        };
        let wait = get_event(&side, target) as usize;
        let client = side.endpoint();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(50 * (round % 7)));
            io::cancel(wait);
        });
        side.ok(
            code::CONNECT,
            connect_between(client, 0x99, &a, &b).as_bytes(),
            0,
        );
        canceller.join().expect("the cancelling thread");
        match complete(wait).0 {
            status::SUCCESS => events += 1,
            status::CANCELLED => cancelled += 1,
            s => panic!("GET_EVENT ended with {s:#x}"),
        }
    }
    assert_eq!(events + cancelled, 40);
    io::close(file);
    shutdown(device);
}

/// STATUS (the binding's own `status.rs` fills the fabric part) and COUNTERS after a REQ
/// went through: one HCA, its two ports on the ordinary CM MAD service, ibcm's CM.
fn status_and_counters_through_the_binding() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    let side = Binding(file);
    let report = status_report(file);
    assert_eq!((report.hca_count, report.port_count), (1, 2));
    assert_eq!(report.hcas[0].ca_guid, CA_GUID);
    assert_eq!(report.hcas[0].cm, ibcm_ioctl::status_report::CM_IBCM);
    assert_eq!(
        report.hcas[0].route,
        ibcm_ioctl::status_report::ROUTE_ORDINARY
    );
    let mut ports: Vec<(u8, u8, u8)> = report.ports[..2]
        .iter()
        .map(|p| {
            assert_eq!(p.ca_guid, CA_GUID);
            (p.ca_port, p.host_port, p.route)
        })
        .collect();
    ports.sort_unstable();
    assert_eq!(
        ports,
        vec![(1, 1, 1), (2, 2, 1)],
        "(CA port, host port, ordinary route)"
    );
    let c = ibcm_ioctl::CountersIn {
        size: ibcm_ioctl::CountersIn::SIZE,
        reserved: 0,
    };
    let (st, _) = side.done(side.call(
        code::COUNTERS,
        c.as_bytes(),
        size_of::<ibcm_ioctl::CountersOut>(),
    ));
    assert_eq!(st, status::SUCCESS, "COUNTERS");
    io::close(file);
    shutdown(device);
}

/// An HCA whose stack answers no access-layer query (ibbus without the CA): the filter
/// attaches, binds nothing, writes the System log entry an administrator reads, and the
/// control device refuses opens until a port exists (no dispatch layer to ask).
fn hca_without_access_layer_is_logged() {
    al::set_cas(Vec::new());
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0);
    let device = pnp::add_device(0).expect("the filter attaches");
    assert_eq!(
        pnp::start(device),
        0,
        "the HCA's start never fails for ibcm"
    );
    let log = io::system_log();
    assert_eq!(log.len(), 1, "one entry: {log:?}");
    assert!(
        log[0]
            .1
            .iter()
            .any(|s| s.contains("access-layer interface failed")),
        "the entry says why: {log:?}"
    );
    assert_eq!(
        io::open(LINK, Open::user(Token::USER)),
        Err(ibcm_ioctl::status::DEVICE_NOT_READY)
    );
    shutdown(device);
}

/// Every value of the service's Parameters key is read when the CM is made (the quotas
/// of each handle and of all users, MaxRequestWaitMs, MaxHeldRequestsPerListen), and the
/// all-users budget holds
/// across handles of different users while an administrator is not counted.
fn every_parameter_is_read_and_all_users_budget_holds() {
    let names = [
        "MaxEndpointsPerHandle",
        "MaxListensPerHandle",
        "MaxBacklogPerHandle",
        "MaxQueuedEventsPerHandle",
        "MaxEndpointsAllUsers",
        "MaxListensAllUsers",
        "MaxBacklogAllUsers",
        "MaxQueuedEventsAllUsers",
        "MaxRequestWaitMs",
        "MaxHeldRequestsPerListen",
    ];
    let values: Vec<(&str, u32)> = names
        .iter()
        .map(|n| (*n, if *n == "MaxEndpointsAllUsers" { 3 } else { 100 }))
        .collect();
    let device = boot(&values);
    let read = registry::read();
    for n in names {
        assert!(read.iter().any(|r| r == n), "{n} is read: {read:?}");
    }
    let (one, two) = (open(Open::user(Token::USER)), open(Open::user(Token::USER)));
    assert!(create(one).is_ok() && create(one).is_ok() && create(two).is_ok());
    assert_eq!(
        create(two),
        Err(status::QUOTA_EXCEEDED),
        "all users' three endpoints are taken"
    );
    let admin = open(Open::user(Token::ADMIN));
    assert!(create(admin).is_ok(), "an administrator is not counted");
    for f in [one, two, admin] {
        io::close(f);
    }
    shutdown(device);
}

/// A kernel client's query for `GUID_INFINIBAND_INTERFACE_CM` 1.1 (WinVerbs', ndfltr's),
/// sent from above to the filter: ibcm answers with its `iba_cm` table (not passed down
/// to ibbus, whose answer is AL's CM) and a reference the client drops.
fn query_cm_interface(device: usize, size: u16) -> (i32, ibcm_iba_cm::abi::InfinibandInterfaceCm) {
    let g = ibcm_iba_cm::abi::GUID_INFINIBAND_INTERFACE_CM;
    let guid = ibcm_ntos::GUID {
        Data1: g.data1,
        Data2: g.data2,
        Data3: g.data3,
        Data4: g.data4,
    };
    // SAFETY: all-zero is an empty interface (no functions, null context).
    let mut ifc: ibcm_iba_cm::abi::InfinibandInterfaceCm = unsafe { std::mem::zeroed() };
    let status = io::query_interface(
        device,
        &guid,
        (&raw mut ifc).cast(),
        size,
        ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION,
    );
    (status, ifc)
}

/// A kernel client drops the reference its query took (as WinVerbs' D0Exit does,
/// wv_driver.c:662-672).
fn release_cm_interface(ifc: &ibcm_iba_cm::abi::InfinibandInterfaceCm) {
    let release = ifc
        .interface_header
        .interface_dereference
        .expect("a dereference routine");
    // SAFETY: the interface's own context, released once as the client does.
    unsafe { release(ifc.interface_header.context) };
}

/// STATUS through `file`.
fn status_report(file: usize) -> ibcm_ioctl::StatusOut {
    let side = Binding(file);
    let s = ibcm_ioctl::StatusIn {
        size: ibcm_ioctl::StatusIn::SIZE,
        reserved: 0,
    };
    let (st, out) = side.done(side.call(
        code::STATUS,
        s.as_bytes(),
        size_of::<ibcm_ioctl::StatusOut>(),
    ));
    assert_eq!(st, status::SUCCESS, "STATUS");
    ibcm_ioctl::StatusOut::read_from_bytes(&out).expect("a StatusOut")
}

fn cm_interface_answered_and_released() {
    let device = boot(&[]);
    let size = size_of::<ibcm_iba_cm::abi::InfinibandInterfaceCm>() as u16;
    let (status, ifc) = query_cm_interface(device, size);
    assert_eq!(status, 0, "answered");
    assert_eq!(
        ifc.interface_header.version,
        ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION,
        "ibcm's table, not AL's"
    );
    release_cm_interface(&ifc);
    // A buffer too small for the table goes down to ibbus (AL's CM answers it).
    let (status, small) = query_cm_interface(device, size - 1);
    assert_eq!(status, 0);
    assert_eq!(
        small.interface_header.version,
        io::AL_CM_MARK,
        "passed down to ibbus"
    );
    shutdown(device);
}

/// A client that never drops its reference: the last filter's removal waits for it
/// (after writing the System log entry), a wait that never returns.
fn cm_interface_reference_kept_blocks_removal() {
    ibcm_ntos::state::set_hang_limit(Duration::from_secs(3));
    let device = boot(&[]);
    let size = size_of::<ibcm_iba_cm::abi::InfinibandInterfaceCm>() as u16;
    let (status, _kept) = query_cm_interface(device, size);
    assert_eq!(status, 0);
    shutdown(device);
}

/// A `\\.\ibcm` handle kept open while the last HCA goes: the control device's deletion
/// waits for the handle (KMDF ControlDeviceDelete), its pending GET_EVENT completes with
/// a DEVICE_REMOVAL event at the removal, an IOCTL on the stale handle still completes,
/// the link goes at once (no new open finds a device), and the device and its CM are
/// freed when the handle closes (unload's leak report checks it).
fn handle_kept_across_removal() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    let handle = create(file).expect("an endpoint");
    let pending = get_event(&Binding(file), handle);
    pnp::remove(device);
    let removal = event(&Binding(file), pending);
    assert_eq!(
        removal.event_type,
        event_type::DEVICE_REMOVAL,
        "the endpoint hears of the removal"
    );
    assert_eq!(
        io::open(LINK, Open::user(Token::USER)),
        Err(ibcm_ntos::STATUS_OBJECT_NAME_NOT_FOUND),
        "the link went with the last HCA"
    );
    let (s, _) = complete(io::ioctl(
        file,
        code::DESTROY,
        handle_in(handle).as_bytes(),
        0,
    ));
    assert_ne!(s, status::PENDING, "an IOCTL on the stale handle completes");
    io::close(file);
    pnp::unload();
}

/// A stock WinOF host, where AL's CM holds the CM class's Send method on every port: the
/// ordinary registration fails; without the verbs hook's steering (this CA's verbs table
/// is not simulated, so ibbus's verbs query never passes the filter) the HCA has no QP1
/// route, so CM queries go down to AL's CM, STATUS says so, the System log says
/// why, and the ports' QP1 aliases are destroyed with their own contexts.
fn al_cm_holding_send_leaves_clients_to_it() {
    let device = boot_on(hca(true), &[]);
    let size = size_of::<ibcm_iba_cm::abi::InfinibandInterfaceCm>() as u16;
    let (status, ifc) = query_cm_interface(device, size);
    assert_eq!(status, 0);
    assert_eq!(
        ifc.interface_header.version,
        io::AL_CM_MARK,
        "AL's CM answers"
    );
    let log = io::system_log();
    assert!(
        !log.is_empty(),
        "the System log says why the query went down"
    );
    let file = open(Open::user(Token::USER));
    let report = status_report(file);
    assert_eq!(report.hcas[0].route, ibcm_ioctl::status_report::ROUTE_NONE);
    assert_eq!(report.hcas[0].cm, ibcm_ioctl::status_report::CM_AL_NO_ROUTE);
    io::close(file);
    shutdown(device);
}

/// An IOCTL that arrives after IRP_MJ_CLEANUP (a thread inside DeviceIoControl holds the
/// file object, not the handle): it must complete, not pend, or IRP_MJ_CLOSE never comes.
fn ioctl_after_cleanup() {
    let device = boot(&[]);
    let file = open(Open::user(Token::USER));
    let handle = create(file).expect("an endpoint");
    io::cleanup(file);
    for (code, input) in [
        (code::GET_EVENT, handle_in(handle)),
        (code::GET_EVENT, handle_in(ibcm_ioctl::ANY_ENDPOINT)),
    ] {
        let request = io::ioctl(file, code, input.as_bytes(), size_of::<EventRecord>());
        let (s, _) = complete(request);
        assert_eq!(s, status::FILE_CLOSED, "refused after cleanup");
    }
    io::close_after_cleanup(file);
    shutdown(device);
}

/// A kernel component's IOCTLs sent at DISPATCH_LEVEL (the parallel queue presents them
/// in the caller's context): the binding copies, dispatches and completes them there.
fn kernel_ioctls_at_dispatch() {
    let device = boot(&[]);
    let file = io::open(LINK, Open::kernel()).expect("opens");
    let at_dispatch = |code: u32, input: &[u8], out: usize| {
        complete(io::ioctl_as(
            file,
            code,
            input,
            out,
            thread::DISPATCH,
            false,
        ))
    };
    let v = VersionIn {
        size: VersionIn::SIZE,
        abi_version: ibcm_ioctl::ABI_VERSION,
    };
    assert_eq!(
        at_dispatch(code::VERSION, v.as_bytes(), 16).0,
        status::SUCCESS
    );
    let c = CreateIn {
        size: CreateIn::SIZE,
        reserved: 0,
    };
    let (s, out) = at_dispatch(code::CREATE, c.as_bytes(), size_of::<CreateOut>());
    assert_eq!(s, status::SUCCESS);
    let handle = CreateOut::read_from_bytes(&out)
        .expect("a CreateOut")
        .handle;
    let listen = listen_in(handle, 0x42, 4);
    assert_eq!(
        at_dispatch(code::LISTEN, listen.as_bytes(), 0).0,
        status::SUCCESS
    );
    let counters = ibcm_ioctl::CountersIn {
        size: ibcm_ioctl::CountersIn::SIZE,
        reserved: 0,
    };
    let out = size_of::<ibcm_ioctl::CountersOut>();
    assert_eq!(
        at_dispatch(code::COUNTERS, counters.as_bytes(), out).0,
        status::SUCCESS
    );
    assert_eq!(
        at_dispatch(code::DESTROY, handle_in(handle).as_bytes(), 0).0,
        status::SUCCESS
    );
    io::close(file);
    shutdown(device);
}

// ---- the verifier's own rules, shown firing ----

fn in_driver(f: impl FnOnce()) {
    thread::call_driver("a test routine", thread::PASSIVE, f);
}

fn verifier_spin_lock_recursive() {
    let mut lock: u64 = 0;
    in_driver(|| {
        // SAFETY: a KSPIN_LOCK on this stack; the second acquire is the fault under test.
        let old = unsafe { ibcm_ntos::ntddk::KeAcquireSpinLockRaiseToDpc(&raw mut lock) };
        // SAFETY: as above.
        let _ = unsafe { ibcm_ntos::ntddk::KeAcquireSpinLockRaiseToDpc(&raw mut lock) };
        // SAFETY: not reached.
        unsafe { ibcm_ntos::ntddk::KeReleaseSpinLock(&raw mut lock, old) };
    });
}

fn verifier_spin_lock_release_irql() {
    let mut lock: u64 = 0;
    in_driver(|| {
        // SAFETY: a KSPIN_LOCK on this stack.
        let _old = unsafe { ibcm_ntos::ntddk::KeAcquireSpinLockRaiseToDpc(&raw mut lock) };
        // SAFETY: released to DISPATCH_LEVEL instead of PASSIVE_LEVEL: the fault.
        unsafe { ibcm_ntos::ntddk::KeReleaseSpinLock(&raw mut lock, 2) };
    });
}

fn verifier_wait_at_dispatch() {
    let mut lock: u64 = 0;
    let mut event = ibcm_ntos::KEVENT::default();
    in_driver(|| {
        // SAFETY: an event on this stack.
        unsafe { ibcm_ntos::ntddk::KeInitializeEvent(&raw mut event, 0, 0) };
        // SAFETY: a KSPIN_LOCK on this stack.
        let old = unsafe { ibcm_ntos::ntddk::KeAcquireSpinLockRaiseToDpc(&raw mut lock) };
        let mut timeout = ibcm_ntos::LARGE_INTEGER { QuadPart: -10_000 };
        // SAFETY: a wait at DISPATCH_LEVEL: the fault.
        let _ = unsafe {
            ibcm_ntos::ntddk::KeWaitForSingleObject(
                (&raw mut event).cast(),
                0,
                0,
                0,
                &raw mut timeout,
            )
        };
        // SAFETY: not reached.
        unsafe { ibcm_ntos::ntddk::KeReleaseSpinLock(&raw mut lock, old) };
    });
}

fn verifier_lock_held_on_return() {
    let lock: &'static mut u64 = Box::leak(Box::new(0));
    in_driver(|| {
        // SAFETY: a KSPIN_LOCK that outlives the call; never released: the fault.
        let _ = unsafe { ibcm_ntos::ntddk::KeAcquireSpinLockRaiseToDpc(lock) };
    });
}

fn verifier_leak_at_unload() {
    let device = boot(&[]);
    in_driver(|| {
        // Pool the driver allocates and never frees.
        std::mem::forget(vec![0u8; 100]);
    });
    shutdown(device);
}

// ---- each WDF rule on a small driver that breaks it (bad_driver) ----

use bad_driver::{Fault, provoke};

fn verifier_request_completed_twice() {
    provoke(Fault::CompleteTwice);
}
fn verifier_request_completed_while_cancelable() {
    provoke(Fault::CompleteWhileCancelable);
}
fn verifier_request_unmarked_not_cancelable() {
    provoke(Fault::UnmarkNotCancelable);
}
fn verifier_request_marked_twice() {
    provoke(Fault::MarkTwice);
}
fn verifier_request_information_past_buffer() {
    provoke(Fault::InformationPastBuffer);
}
fn verifier_request_touched_after_completion() {
    provoke(Fault::TouchAfterCompletion);
}
fn verifier_request_deleted_by_driver() {
    provoke(Fault::DeleteRequest);
}
fn verifier_reference_underflow() {
    provoke(Fault::DereferenceTooOften);
}
fn verifier_completed_under_spin_lock() {
    provoke(Fault::CompleteUnderSpinLock);
}
fn verifier_wrong_context_type() {
    provoke(Fault::WrongContextType);
}
fn verifier_registry_at_dispatch() {
    provoke(Fault::RegistryAtDispatch);
}
fn verifier_wait_lock_released_by_non_owner() {
    provoke(Fault::WaitLockReleasedByNonOwner);
}
fn verifier_rundown_released_too_often() {
    provoke(Fault::RundownReleasedTooOften);
}
fn verifier_irql_lowered_upwards() {
    provoke(Fault::LowerIrqlUpwards);
}
fn verifier_deleted_handle_used() {
    provoke(Fault::TimerDeletedTwice);
}
fn verifier_locks_in_both_orders() {
    provoke(Fault::LocksInBothOrders);
}
fn verifier_outer_lock_released_first() {
    provoke(Fault::OuterLockReleasedFirst);
}
fn verifier_wait_never_returns() {
    ibcm_ntos::state::set_hang_limit(Duration::from_secs(2));
    provoke(Fault::RundownNeverReleased);
}

/// The kill switch (`Parameters\Disabled` = 1, parameters.rs): the filter attaches and the
/// HCA starts, but ibcm binds nothing on it (no AL interface reference, no MAD service on
/// its ports: nothing is steered to ibcm) and the CM query goes down to ibbus, where AL's
/// CM answers; the System log says ibcm is switched off, once. The value is read at each
/// HCA start: cleared, the next start binds and ibcm answers; set again, the next HCA's
/// start turns every HCA's CM query to AL's CM (WinVerbs keeps one table for all).
fn kill_switch_leaves_every_client_to_al() {
    let second = CaConfig {
        ca_guid: CA_GUID + 0x100,
        ports: vec![port(1, 0x20)],
        al_cm_holds_send: false,
        verbs: false,
    };
    registry::set("Disabled", 1);
    al::set_cas(vec![hca(false), second]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    let device = pnp::add_device(0).expect("the filter attaches");
    assert_eq!(pnp::start(device), 0, "the HCA starts");
    assert!(
        registry::read().iter().any(|n| n == "Disabled"),
        "the switch is read at the start"
    );
    assert_eq!(al::references(0), 0, "no AL interface reference: not bound");
    assert!(
        !al::receive(0x10, 0x99, &[0u8; 256]),
        "no MAD service of ibcm's on the port: QP1 traffic stays AL's"
    );
    let size = size_of::<ibcm_iba_cm::abi::InfinibandInterfaceCm>() as u16;
    for _ in 0..3 {
        let (status, ifc) = query_cm_interface(device, size);
        assert_eq!(status, 0);
        assert_eq!(
            ifc.interface_header.version,
            io::AL_CM_MARK,
            "passed down to ibbus: AL's CM answers"
        );
    }
    let log = io::system_log();
    let off = ibcm_eventlog::SWITCHED_OFF.code() as i32;
    let passed = ibcm_eventlog::CM_QUERY_PASSED_DOWN.code() as i32;
    assert_eq!(
        log.iter().filter(|(code, _)| *code == off).count(),
        1,
        "the System log says so once: {log:?}"
    );
    assert_eq!(
        log.iter().filter(|(code, _)| *code == passed).count(),
        1,
        "three queries passed down, one entry for the HCA and reason: {log:?}"
    );
    pnp::remove(device);

    // Cleared: the next HCA start reads it again and binds; ibcm answers.
    registry::set("Disabled", 0);
    let device = pnp::add_device(0).expect("the filter attaches");
    assert_eq!(pnp::start(device), 0);
    assert!(al::references(0) > 0, "bound at this start");
    let (status, ifc) = query_cm_interface(device, size);
    assert_eq!(status, 0);
    assert_eq!(
        ifc.interface_header.version,
        ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION,
        "ibcm answers again"
    );
    release_cm_interface(&ifc);

    // Set again while that HCA runs: the next HCA's start reads it; that HCA binds
    // nothing, and the CM query on the first, still bound, goes down too.
    registry::set("Disabled", 1);
    let other = pnp::add_device(1).expect("the filter attaches to the second HCA");
    assert_eq!(pnp::start(other), 0);
    assert_eq!(al::references(1), 0, "the second HCA is not bound");
    let (status, ifc) = query_cm_interface(device, size);
    assert_eq!(status, 0);
    assert_eq!(
        ifc.interface_header.version,
        io::AL_CM_MARK,
        "AL's CM answers on every HCA"
    );
    // STATUS reports the switch as the driver read it (what the filter does), not as
    // the registry now says.
    let file = open(Open::user(Token::ADMIN));
    let report = status_report(file);
    assert!(
        report.hcas[..report.hca_count as usize]
            .iter()
            .all(|h| h.cm == ibcm_ioctl::status_report::CM_AL_SWITCHED_OFF),
        "STATUS: switched off on every HCA"
    );
    io::close(file);
    pnp::remove(other);
    shutdown(device);
}

// ------------------------------------------------------------------------------------
// Runner
// ------------------------------------------------------------------------------------

type Scenario = (&'static str, fn(), Option<&'static str>);

/// The scenarios by function name; `=> "RULE"` for one that must stop with that rule.
macro_rules! scenarios {
    (@rule) => { None };
    (@rule $rule:literal) => { Some($rule) };
    ($($f:ident $(=> $rule:literal)?),* $(,)?) => {
        &[$((stringify!($f), $f as fn(), scenarios!(@rule $($rule)?))),*]
    };
}

const SCENARIOS: &[Scenario] = scenarios![
    load_start_remove_unload,
    control_device_security,
    callers_and_registry_quotas,
    every_parameter_is_read_and_all_users_budget_holds,
    endpoints_are_budgeted_per_account,
    refusals_reach_the_system_log_at_a_limited_rate,
    ioctls_with_bad_records,
    get_event_cancelled_from_another_thread,
    cleanup_and_close_with_requests_pending,
    cancel_races_event_delivery,
    ioctl_after_cleanup,
    kernel_ioctls_at_dispatch,
    status_and_counters_through_the_binding,
    hca_without_access_layer_is_logged,
    req_through_qp1,
    connection_with_a_host_peer,
    handle_kept_across_removal,
    cm_interface_answered_and_released,
    al_cm_holding_send_leaves_clients_to_it,
    sleep_hibernate_and_resume,
    rebalance_stop_and_start,
    surprise_removal_from_d0,
    hca_never_returns_from_sleep,
    two_hcas,
    stale_handle_across_disable_enable,
    hca_starting_during_last_teardown,
    surprise_removal_with_a_send_in_flight,
    winverbs_through_the_binding,
    ndfltr_through_the_binding,
    kernel_clients_with_a_peer_node,
    cmtime_with_a_host_peer,
    connection_through_the_verbs_hook,
    mads_for_al_pass_untouched,
    receives_not_in_al_shape_pass_untouched,
    verbs_hook_across_sleep_and_wake,
    verbs_hook_surprise_removal_with_receives_posted,
    verbs_hook_two_hcas,
    other_drivers_verbs_queries_stay_unpatched,
    verbs_hook_under_the_ordinary_route,
    verbs_table_of_unknown_version_left_alone,
    verbs_hook_slot_reused_after_disable_enable,
    verbs_hook_traffic_across_power_changes,
    kill_switch_leaves_the_verbs_table_alone,
    cm_interface_reference_kept_blocks_removal => "WAIT_NEVER_RETURNS",
    verifier_spin_lock_recursive => "SPIN_LOCK_RECURSIVE",
    verifier_spin_lock_release_irql => "SPIN_LOCK_RELEASE_IRQL",
    verifier_wait_at_dispatch => "WAIT_AT_DISPATCH",
    verifier_lock_held_on_return => "IRQL_NOT_RESTORED",
    verifier_leak_at_unload => "LEAK_AT_UNLOAD",
    verifier_request_completed_twice => "REQUEST_COMPLETED",
    verifier_request_completed_while_cancelable => "REQUEST_COMPLETED_CANCELABLE",
    verifier_request_unmarked_not_cancelable => "REQUEST_NOT_CANCELABLE",
    verifier_request_marked_twice => "REQUEST_MARKED_TWICE",
    verifier_request_information_past_buffer => "REQUEST_INFORMATION",
    verifier_request_touched_after_completion => "REQUEST_COMPLETED",
    verifier_request_deleted_by_driver => "OBJECT_DELETE",
    verifier_reference_underflow => "REFERENCE_UNDERFLOW",
    verifier_completed_under_spin_lock => "COMPLETE_UNDER_LOCK",
    verifier_wrong_context_type => "CONTEXT_TYPE",
    verifier_registry_at_dispatch => "IRQL_TOO_HIGH",
    verifier_wait_lock_released_by_non_owner => "WAIT_LOCK",
    verifier_rundown_released_too_often => "RUNDOWN",
    verifier_irql_lowered_upwards => "IRQL_CHANGE",
    verifier_deleted_handle_used => "INVALID_HANDLE",
    verifier_wait_never_returns => "WAIT_NEVER_RETURNS",
    verifier_locks_in_both_orders => "SPIN_LOCK_ORDER",
    verifier_outer_lock_released_first => "IRQL_CHANGE",
    kill_switch_leaves_every_client_to_al,
    an_hca_without_ibcm_at_start_leaves_every_client_to_al,
    an_hca_without_ibcm_arriving_later_is_named,
    an_hca_whose_filter_binds_later_is_not_one_without_ibcm,
    an_hca_without_ibcm_that_goes_away_is_forgotten,
    an_hca_without_infiniband_ports_leaves_the_verdict_alone,
    a_partition_added_while_the_port_came_up_is_used,
    an_hca_no_filter_expects_is_known_before_every_filter_starts,
];

fn main() {
    if let Ok(name) = std::env::var("IBCM_SIM_SCENARIO") {
        let Some((_, run, _)) = SCENARIOS.iter().find(|(n, _, _)| *n == name) else {
            eprintln!("no scenario {name}");
            std::process::exit(2);
        };
        run();
        std::process::exit(0);
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let me = std::env::current_exe().expect("the test binary's path");
    let (mut passed, mut failed) = (0, 0);
    let start = Instant::now();
    for (name, _, expected) in SCENARIOS {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let t = Instant::now();
        let output = Command::new(&me)
            .env("IBCM_SIM_SCENARIO", name)
            .output()
            .expect("re-exec");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let ok = match expected {
            None => output.status.success(),
            Some(rule) => {
                !output.status.success() && stderr.contains(&format!("*** VERIFIER {rule}:"))
            }
        };
        let how = match expected {
            None => String::new(),
            Some(rule) => format!(" (expects {rule})"),
        };
        if ok {
            passed += 1;
            println!(
                "scenario {name}{how} ... ok ({:.1} s)",
                t.elapsed().as_secs_f64()
            );
            // What a scenario reports (figures) is on its stdout.
            for line in String::from_utf8_lossy(&output.stdout).lines() {
                println!("    {line}");
            }
        } else {
            failed += 1;
            println!(
                "scenario {name}{how} ... FAILED ({:.1} s, {})\n{stderr}",
                t.elapsed().as_secs_f64(),
                output.status
            );
        }
    }
    println!(
        "\nkmdf binding on the simulated kernel: {:.1} s",
        start.elapsed().as_secs_f64()
    );
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
