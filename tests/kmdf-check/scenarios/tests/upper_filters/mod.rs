//! HCAs without ibcm in their UpperFilters (a reinstall of the HCA's driver rewrites the
//! list; an HCA added after `ibcm install`): the access layer reports every CA's ports to
//! ibcm's port registration on another HCA (al_pnp.c `__pnp_reg_notify`,
//! `__pnp_process_add_ca`), the filters count them against ibcm's own filter devices
//! (`ibcm_lifecycle::HostCm`), the System log names each once, and WinVerbs' one CM for the
//! host (wv_driver.c:574-575) is AL's whenever ibcm could not serve every HCA.

use super::*;
use ibcm_ioctl::status_report as report_cm;

/// How many System-log entries of `message` name `ca_guid` (host order).
fn entries_naming(message: &ibcm_eventlog::Message, ca_guid: u64) -> usize {
    let code = message.code() as i32;
    let name = ibcm_eventlog::ca_guid(ca_guid.to_be());
    io::system_log()
        .iter()
        .filter(|(c, strings)| *c == code && strings.contains(&name))
        .count()
}

/// Entries of either message about an HCA without ibcm.
fn entries_without_ibcm() -> usize {
    let codes = [
        ibcm_eventlog::HCA_WITHOUT_IBCM.code() as i32,
        ibcm_eventlog::HCA_WITHOUT_IBCM_UNSERVED.code() as i32,
    ];
    io::system_log()
        .iter()
        .filter(|(c, _)| codes.contains(c))
        .count()
}

/// The CM query on `device`: the interface's version (ibcm's 1.1, or `io::AL_CM_MARK`
/// when it went down to ibbus), released again.
fn cm_answer(device: usize) -> u16 {
    let size = size_of::<ibcm_iba_cm::abi::InfinibandInterfaceCm>() as u16;
    let (status, ifc) = query_cm_interface(device, size);
    assert_eq!(status, 0, "the CM query succeeds either way");
    let version = ifc.interface_header.version;
    if version == ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION {
        release_cm_interface(&ifc);
    }
    version
}

/// The second HCA has no ibcm and started first: when ibcm's filter on the first binds,
/// the access layer reports the second CA's port, no filter of ibcm's is left to bind it,
/// so the first CM query goes to AL's CM (WinVerbs would otherwise hold ibcm's CM for an
/// HCA ibcm cannot reach), and the System log names the second HCA once.
pub fn an_hca_without_ibcm_at_start_leaves_every_client_to_al() {
    al::set_cas(vec![hca(false), second_hca()]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    // The second HCA's stack: ibbus and the others, no ibcm; ibbus registers its CA.
    al::register_ca(1);
    let device = pnp::add_device(0).expect("the filter attaches");
    assert_eq!(pnp::start(device), 0);
    assert!(al::references(0) > 0, "the first HCA is bound");
    for _ in 0..2 {
        assert_eq!(
            cm_answer(device),
            io::AL_CM_MARK,
            "AL's CM serves every HCA"
        );
    }
    assert_eq!(
        entries_naming(&ibcm_eventlog::HCA_WITHOUT_IBCM, CA_GUID_2),
        1,
        "the System log names the HCA without ibcm once: {:?}",
        io::system_log()
    );
    assert_eq!(entries_without_ibcm(), 1, "and no other");
    // STATUS says why AL's CM serves an HCA that has a route of its own.
    let file = open(Open::user(Token::ADMIN));
    let report = status_report(file);
    assert_eq!(
        report.hcas_without_ibcm, 1,
        "STATUS counts the HCA without ibcm"
    );
    assert_eq!(report.hca_count, 1);
    assert_eq!(
        report.hcas[0].cm,
        report_cm::CM_AL_HOST_VERDICT,
        "this HCA has a QP1 route; the host's verdict is AL's"
    );
    io::close(file);
    // Sleep and wake: the access layer reports the second CA again; not named twice.
    pnp::sleep(device, false);
    assert_eq!(pnp::wake(device), 0);
    assert_eq!(entries_without_ibcm(), 1, "named once per boot");
    shutdown(device);
}

/// WinVerbs took ibcm's CM (the first query, one HCA bound), then an HCA without ibcm
/// arrives: the verdict cannot change (WinVerbs keeps its table), so the System log says
/// that HCA's WinVerbs connections fail until the HCAs restart; ibcm keeps answering.
pub fn an_hca_without_ibcm_arriving_later_is_named() {
    al::set_cas(vec![hca(false), second_hca()]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    let device = pnp::add_device(0).expect("the filter attaches");
    assert_eq!(pnp::start(device), 0);
    assert_eq!(
        cm_answer(device),
        ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION,
        "ibcm answers: every HCA it knows of is bound"
    );
    assert_eq!(entries_without_ibcm(), 0);
    al::register_ca(1);
    assert_eq!(
        entries_naming(&ibcm_eventlog::HCA_WITHOUT_IBCM_UNSERVED, CA_GUID_2),
        1,
        "the late HCA is named, with what its WinVerbs connections face: {:?}",
        io::system_log()
    );
    assert_eq!(
        cm_answer(device),
        ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION,
        "the verdict stays: WinVerbs already holds ibcm's CM"
    );
    let file = open(Open::user(Token::ADMIN));
    let report = status_report(file);
    assert_eq!(report.hcas_without_ibcm, 1);
    assert_eq!(report.hcas[0].cm, report_cm::CM_IBCM);
    io::close(file);
    shutdown(device);
}

/// Both HCAs have ibcm, and the second CA is registered (and reported to the first
/// HCA's filter) before its own filter reaches D0Entry: its filter device exists (the
/// stack is built before the start IRP), so it is not named and ibcm answers.
pub fn an_hca_whose_filter_binds_later_is_not_one_without_ibcm() {
    al::set_cas(vec![hca(false), second_hca()]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    let first = pnp::add_device(0).expect("the filter attaches");
    let second = pnp::add_device(1).expect("the filter attaches to the second HCA");
    // The second HCA's ibbus has started (its CA registered), its filter not yet.
    al::register_ca(1);
    assert_eq!(pnp::start(first), 0);
    assert_eq!(
        cm_answer(first),
        ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION,
        "ibcm answers: the second CA's own filter is still to bind"
    );
    assert_eq!(pnp::start(second), 0);
    assert!(al::references(1) > 0, "the second HCA is bound");
    assert_eq!(
        cm_answer(second),
        ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION
    );
    assert_eq!(
        entries_without_ibcm(),
        0,
        "no HCA named: {:?}",
        io::system_log()
    );
    pnp::remove(second);
    shutdown(first);
}

/// The HCA without ibcm goes away (its ibbus deregisters the CA) before any CM query: the
/// access layer reports its ports' removal to the filter (which kept a context for each,
/// al_pnp.c `__pnp_process_remove_port`), the host forgets it, and ibcm answers.
pub fn an_hca_without_ibcm_that_goes_away_is_forgotten() {
    al::set_cas(vec![hca(false), second_hca()]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    al::register_ca(1);
    let device = pnp::add_device(0).expect("the filter attaches");
    assert_eq!(pnp::start(device), 0);
    let file = open(Open::user(Token::ADMIN));
    assert_eq!(status_report(file).hcas_without_ibcm, 1);
    al::deregister_ca(1, "removal");
    assert_eq!(
        status_report(file).hcas_without_ibcm,
        0,
        "the removed CA is no longer counted"
    );
    io::close(file);
    assert_eq!(
        cm_answer(device),
        ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION,
        "every HCA left has ibcm"
    );
    shutdown(device);
}

/// An HCA whose ports are all Ethernet beside an InfiniBand one, both with ibcm: ibbus
/// registers no CA for it and answers the access-layer query with CA GUID 0
/// (bus_pnp.c:566-569, 1246). Nothing for WinVerbs there: it does not send every client
/// to AL's CM, and it is not an HCA without ibcm.
pub fn an_hca_without_infiniband_ports_leaves_the_verdict_alone() {
    let ethernet = CaConfig {
        ca_guid: CA_GUID_2,
        ports: Vec::new(),
        al_cm_holds_send: false,
        verbs: false,
    };
    al::set_cas(vec![hca(false), ethernet]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    let infiniband = pnp::add_device(0).expect("the filter attaches");
    let other = pnp::add_device(1).expect("the filter attaches to the Ethernet HCA");
    assert_eq!(pnp::start(other), 0);
    assert_eq!(al::references(1), 0, "nothing bound, no reference kept");
    assert_eq!(pnp::start(infiniband), 0);
    assert_eq!(
        cm_answer(infiniband),
        ibcm_iba_cm::abi::INFINIBAND_INTERFACE_CM_VERSION,
        "ibcm serves the InfiniBand HCA's clients"
    );
    assert_eq!(entries_without_ibcm(), 0);
    pnp::remove(other);
    shutdown(infiniband);
}

/// The third simulated HCA (host order), one port with LID 0x30: its stack has no ibcm.
const CA_GUID_3: u64 = 0x0002_c903_0000_3000;

/// A, B with ibcm and C without, every HCA with its verbs table: C's ibbus has registered
/// C, B's filter is added but its HCA not started, and A's filter binds and gets the first
/// CM query. Each ibcm filter learns its CA from ibbus's verbs query, made before ibbus
/// registers the CA (bus_pnp.c `__register_ca`), so C, which no filter expects, lacks
/// ibcm although B's filter could by count still be C's: AL's CM answers and C is named.
/// B, reported once it starts, is expected and never named. Counting alone answered ibcm
/// here, and C's WinVerbs connections would have failed.
pub fn an_hca_no_filter_expects_is_known_before_every_filter_starts() {
    let mut first = hca(false);
    first.verbs = true;
    let mut second = second_hca();
    second.verbs = true;
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[8..].copy_from_slice(&(CA_GUID_3 + 1).to_be_bytes());
    let third = CaConfig {
        ca_guid: CA_GUID_3,
        ports: vec![PortConfig {
            port_num: 1,
            lid: 0x30,
            gid,
            pkeys: vec![0xffff],
        }],
        al_cm_holds_send: false,
        verbs: true,
    };
    al::set_cas(vec![first, second, third]);
    assert_eq!(pnp::load(ibcm_driver::driver_entry), 0, "DriverEntry");
    let a = pnp::add_device(0).expect("the filter attaches");
    let b = pnp::add_device(1).expect("the filter attaches to the second HCA");
    al::register_ca(2);
    assert_eq!(pnp::start(a), 0);
    assert_eq!(cm_answer(a), io::AL_CM_MARK, "AL's CM serves every HCA");
    assert_eq!(
        entries_naming(&ibcm_eventlog::HCA_WITHOUT_IBCM, CA_GUID_3),
        1,
        "the HCA without ibcm is named: {:?}",
        io::system_log()
    );
    assert_eq!(pnp::start(b), 0);
    assert!(al::references(1) > 0, "the second HCA is bound");
    assert_eq!(entries_without_ibcm(), 1, "the second HCA is not named");
    pnp::remove(b);
    shutdown(a);
}
