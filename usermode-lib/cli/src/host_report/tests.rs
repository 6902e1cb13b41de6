use ibcm_ioctl::status_report::{CM_AL_HOST_VERDICT, CM_AL_SWITCHED_OFF, CM_IBCM, ROUTE_ORDINARY};
use zerocopy::FromZeros;

use super::*;

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect()
}

fn node(id: &str, filters: &str, stack: Option<&str>) -> Devnode {
    Devnode {
        instance_id: format!(r"PCI\VEN_15B3&DEV_1003&SUBSYS_005015B3&REV_00\{id}"),
        description: "ConnectX-3".into(),
        hardware_ids: vec![r"PCI\VEN_15B3&DEV_1003&SUBSYS_005015B3&REV_00".into()],
        upper_filters: list(filters),
        stack: stack.map(|s| s.split(',').map(|d| format!(r"\Driver\{d}")).collect()),
    }
}

/// A driver STATUS with one HCA per `cm` code (ordinary route when ibcm answers).
fn driver(cms: &[u8]) -> Result<(StatusOut, CountersOut), String> {
    let mut s = StatusOut::new_zeroed();
    s.hca_count = cms.len() as u32;
    for (i, cm) in cms.iter().enumerate() {
        s.hcas[i].ca_guid = 0x0002_c903_0000_1000 + i as u64;
        s.hcas[i].cm = *cm;
        s.hcas[i].route = if *cm == CM_IBCM {
            ROUTE_ORDINARY
        } else {
            ROUTE_NONE
        };
    }
    Ok((s, CountersOut::new_zeroed()))
}

const WITH: &str = "ibbus,ibcm,ndfltr,WinVerbs,WinMad";
const WITHOUT: &str = "ibbus,ndfltr,WinVerbs,WinMad";
const STACK_WITH: &str = "WinMad,WinVerbs,ndfltr,ibcm,ibbus,mlx4_bus,pci";
const STACK_WITHOUT: &str = "WinMad,WinVerbs,ndfltr,ibbus,mlx4_bus,pci";

#[test]
fn supported_ids_are_the_infs_models_only() {
    assert!(supported_hca(&[
        r"PCI\VEN_15B3&DEV_1003&SUBSYS_005015B3&REV_00"
    ]));
    assert!(
        supported_hca(&[r"pci\ven_15b3&dev_673c"]),
        "case-insensitive"
    );
    assert!(
        !supported_hca(&[r"PCI\VEN_15B3&DEV_1017&SUBSYS_0050"]),
        "mlx5: WinOF-2"
    );
    assert!(
        !supported_hca(&[r"PCI\VEN_15B3&DEV_10031"]),
        "a longer device ID"
    );
    assert!(!supported_hca(&[r"PCI\VEN_8086&DEV_1003"]));
    assert!(!supported_hca::<&str>(&[]));
}

#[test]
fn the_stack_names_ibcm_only_as_a_driver_object() {
    assert!(ibcm_in_stack(&[
        r"\Driver\WinVerbs",
        r"\Driver\ibcm",
        r"\Driver\ibbus"
    ]));
    assert!(ibcm_in_stack(&[r"\Driver\IBCM"]));
    assert!(!ibcm_in_stack(&[r"\Driver\ibcmx", r"\Driver\ibbus"]));
    assert!(!ibcm_in_stack::<&str>(&[]));
}

#[test]
fn an_hca_without_ibcm_beside_one_with_it_is_named() {
    let host = Host {
        devnodes: vec![
            node("A", WITH, Some(STACK_WITH)),
            // Reinstalled by a WinOF update: mlx4_bus's AddReg wrote the list without ibcm.
            node("B", WITHOUT, Some(STACK_WITHOUT)),
        ],
        switch: None,
        driver: driver(&[CM_IBCM]),
    };
    assert!(ibcm_answers(&host));
    let a = node_report(&host, &host.devnodes[0]);
    assert_eq!(a.placement, Placement::AboveIbbus);
    assert_eq!(a.ibcm_loaded, Some(true));
    assert_eq!(a.winverbs, Serving::Ibcm);
    assert_eq!(a.ndfltr, Serving::Ibcm);
    assert_eq!(
        a.qp1_route, "ordinary CM MAD service",
        "one HCA on each side"
    );
    let b = node_report(&host, &host.devnodes[1]);
    assert_eq!(b.placement, Placement::Absent);
    assert_eq!(b.ibcm_loaded, Some(false));
    // WinVerbs holds ibcm's one table (wv_driver.c:574-575): it fails on B.
    assert_eq!(b.winverbs, Serving::IbcmWithoutRoute);
    // ndfltr asked B's own stack: AL's CM answered it.
    assert_eq!(b.ndfltr, Serving::Al);
    assert_eq!(b.qp1_route, "none: ibcm is not in this HCA's stack");
    let text = text(&host);
    assert!(text.contains("connections on this HCA fail"), "{text}");
    assert!(
        text.contains("UpperFilters: [ibbus, ndfltr, WinVerbs, WinMad]"),
        "{text}"
    );
}

#[test]
fn in_upper_filters_but_not_loaded_is_told_apart() {
    // ibcm written but the HCA not restarted yet (install --no-restart): the list has it,
    // the stack does not.
    let host = Host {
        devnodes: vec![node("A", WITH, Some(STACK_WITHOUT))],
        switch: None,
        driver: Err("no \\\\.\\ibcm device".into()),
    };
    let r = node_report(&host, &host.devnodes[0]);
    assert_eq!(r.placement, Placement::AboveIbbus);
    assert_eq!(r.ibcm_loaded, Some(false));
    assert_eq!(r.winverbs, Serving::Al);
    assert_eq!(r.ndfltr, Serving::Al);
}

#[test]
fn the_switch_sends_every_client_to_al() {
    let host = Host {
        devnodes: vec![node("A", WITH, Some(STACK_WITH))],
        switch: Some(1),
        driver: driver(&[CM_AL_SWITCHED_OFF]),
    };
    assert!(!ibcm_answers(&host));
    let r = node_report(&host, &host.devnodes[0]);
    assert_eq!((r.winverbs, r.ndfltr), (Serving::Al, Serving::Al));
    assert_eq!(r.qp1_route, "none: ibcm is switched off");
    assert!(text(&host).contains("switched OFF"));
}

#[test]
fn clients_not_in_the_stack_and_unreadable_stacks_say_so() {
    let host = Host {
        devnodes: vec![node("A", "ibbus,ibcm,WinVerbs,WinMad", None)],
        switch: Some(0),
        driver: driver(&[CM_IBCM]),
    };
    let r = node_report(&host, &host.devnodes[0]);
    assert_eq!(
        r.ndfltr,
        Serving::NotInStack,
        "the win8 INF installs no ndfltr"
    );
    assert_eq!(r.winverbs, Serving::Unknown);
    assert_eq!(r.ibcm_loaded, None);
}

#[test]
fn json_carries_every_devnode_and_no_simulated_node() {
    let host = Host {
        devnodes: vec![
            node("A", WITH, Some(STACK_WITH)),
            node("B", WITHOUT, Some(STACK_WITHOUT)),
        ],
        switch: None,
        driver: driver(&[CM_IBCM]),
    };
    let j = json(&host);
    assert_eq!(j["simulated"], false);
    assert_eq!(j["switched_off"], false);
    assert_eq!(j["ibcm_answers_cm_queries"], true);
    let nodes = j["devnodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0]["ibcm_loaded"], true);
    assert_eq!(nodes[0]["ibcm_in_upper_filters"], true);
    assert_eq!(nodes[0]["winverbs_cm"], "ibcm");
    assert_eq!(nodes[1]["ibcm_loaded"], false);
    assert_eq!(nodes[1]["ibcm_in_upper_filters"], false);
    assert_eq!(nodes[1]["upper_filters"], serde_json::json!(list(WITHOUT)));
    assert_eq!(nodes[1]["winverbs_cm"], "ibcm_without_route");
    assert_eq!(nodes[1]["ndfltr_cm"], "al");
    assert_eq!(nodes[1]["supported_id"], true);
    assert_eq!(j["driver"]["device"], "device");
    assert_eq!(j["driver"]["hca_count"], 1);
    // Without the driver: the reason, and no node made up.
    let host = Host {
        devnodes: vec![],
        switch: None,
        driver: Err("cannot open \\\\.\\ibcm: the ibcm driver is not loaded".into()),
    };
    let j = json(&host);
    assert_eq!(j["devnodes"].as_array().unwrap().len(), 0);
    assert!(
        j["driver"]["error"]
            .as_str()
            .unwrap()
            .contains("not loaded")
    );
    assert_eq!(j["ibcm_answers_cm_queries"], false);
    assert!(j["driver"].get("hcas").is_none());
}

/// The driver reads the switch at each HCA's start: after `ibcm off --no-restart` the
/// registry says off while the driver still serves, and the report says which holds now.
#[test]
fn the_switch_is_reported_as_the_driver_read_it() {
    let mut host = Host {
        devnodes: vec![node("0", WITH, Some(STACK_WITH))],
        switch: Some(1),
        driver: driver(&[CM_IBCM]),
    };
    assert_eq!(switch(&host), Switch::OffAtNextStart);
    assert!(ibcm_answers(&host), "the driver still answers");
    assert_eq!(
        node_report(&host, &host.devnodes[0]).winverbs,
        Serving::Ibcm
    );
    assert_eq!(json(&host)["switch_pending_restart"], true);
    assert_eq!(json(&host)["switched_off"], false);
    host.driver = driver(&[CM_AL_SWITCHED_OFF]);
    assert_eq!(switch(&host), Switch::Off);
    assert!(!ibcm_answers(&host));
    host.switch = None;
    assert_eq!(switch(&host), Switch::OnAtNextStart);
    assert!(text(&host).contains("switched OFF until the HCAs restart"));
    host.driver = Err("no driver".into());
    assert_eq!(switch(&host), Switch::On);
}

#[test]
fn hcas_the_driver_found_without_ibcm_are_counted() {
    let mut driver = driver(&[CM_AL_HOST_VERDICT]);
    if let Ok((s, _)) = &mut driver {
        s.hcas_without_ibcm = 1;
        s.hcas[0].route = ROUTE_ORDINARY;
    }
    let host = Host {
        devnodes: vec![node("0", WITH, Some(STACK_WITH))],
        switch: None,
        driver,
    };
    let report = text(&host);
    assert!(
        report.contains("the driver knows 1 HCA(s) without ibcm"),
        "{report}"
    );
    assert!(report.contains("the host's one CM is AL's"), "{report}");
    assert_eq!(json(&host)["driver"]["hcas_without_ibcm"], 1);
    assert_eq!(node_report(&host, &host.devnodes[0]).winverbs, Serving::Al);
}
