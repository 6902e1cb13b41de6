//! `inf/ibcm.inx` parsed and its sections cross-checked: every section it names exists,
//! every %string% is defined, the models are exactly the PCI IDs WinOF's base INF installs,
//! and nothing in it writes the HCA devnode (UpperFilters, Security, DeviceCharacteristics):
//! `ibcm install` edits UpperFilters in place (`usermode-lib/cli/src/upper_filters.rs`).

use std::collections::BTreeMap;

const INF: &str = include_str!("../inf/ibcm.inx");

/// Sections by lower-cased name (INF section names are case-insensitive), each a list of
/// lines without comments or surrounding blanks.
fn sections() -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = None;
    for raw in INF.lines() {
        let line = strip_comment(raw).trim().to_string();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim().to_ascii_lowercase();
            assert!(!out.contains_key(&name), "section [{name}] twice");
            out.insert(name.clone(), Vec::new());
            current = Some(name);
            continue;
        }
        let name = current.as_ref().expect("a line before the first section");
        out.get_mut(name).unwrap().push(line);
    }
    out
}

/// The line up to a `;` that is not inside double quotes.
fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ';' if !quoted => return &line[..i],
            _ => {}
        }
    }
    line
}

/// `key = value` lines of a section.
fn entries<'a>(s: &'a BTreeMap<String, Vec<String>>, section: &str) -> Vec<(String, &'a str)> {
    s.get(&section.to_ascii_lowercase())
        .unwrap_or_else(|| panic!("no section [{section}]"))
        .iter()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim()))
        .collect()
}

fn fields(value: &str) -> Vec<&str> {
    value.split(',').map(str::trim).collect()
}

/// The PCI IDs of `hw/mlx4/kernel/bus/drv/mlx4_bus_win8.inx:48-84` @913bc0ce
/// (`[MLX4BUS.DeviceSection.ntamd64.6.2]`, ranked first on every OS ibcm supports); those
/// of `mlx4_bus.inx:193-228` (ntamd64) are the same without DEV_1005 and DEV_1006.
const WINOF_MODELS: [&str; 37] = [
    "6340", "634A", "6354", "6368", "6372", "6732", "6778", "673C", "6746", "6750", "675A", "6764",
    "676E", "6341", "634B", "6733", "673D", "6369", "6751", "6765", "1000", "1001", "1002", "1003",
    "1004", "1005", "1006", "1007", "1008", "1009", "100A", "100B", "100C", "100D", "100E", "100F",
    "1010",
];

#[test]
fn the_models_are_every_pci_id_winofs_base_inf_installs() {
    let s = sections();
    let manufacturer = entries(&s, "Manufacturer");
    assert_eq!(manufacturer.len(), 1);
    let decl = fields(manufacturer[0].1);
    // "Standard,NT$ARCH$.10.0...17134": the models section is the name plus decoration.
    let models_section = format!("{}.{}", decl[0], decl[1]);
    let mut ids: Vec<String> = entries(&s, &models_section)
        .iter()
        .map(|(_, v)| {
            let f = fields(v);
            assert_eq!(f[0], "ibcm_Install", "every model installs ibcm_Install");
            f[1].to_ascii_uppercase()
        })
        .collect();
    let mut expected: Vec<String> = WINOF_MODELS
        .iter()
        .map(|d| format!("PCI\\VEN_15B3&DEV_{d}"))
        .collect();
    ids.sort();
    expected.sort();
    assert_eq!(ids, expected);
}

#[test]
fn every_section_it_names_exists() {
    let s = sections();
    let install = "ibcm_install";
    let mut named = vec![];
    for suffix in ["", ".nt", ".nt.services", ".nt.wdf"] {
        let name = format!("{install}{suffix}");
        if !s.contains_key(&name) {
            continue;
        }
        for (key, value) in entries(&s, &name) {
            match key.as_str() {
                "copyfiles" | "addreg" | "delreg" => named.extend(fields(value)),
                // AddService = name, flags, service-install-section[, event-log-section]
                "addservice" => named.extend(fields(value).into_iter().skip(2)),
                // KmdfService = name, wdf-section
                "kmdfservice" => named.extend(fields(value).into_iter().skip(1)),
                _ => {}
            }
        }
    }
    for (key, value) in entries(&s, "ibcm_EventLog_Inst") {
        if key == "addreg" {
            named.extend(fields(value));
        }
    }
    for name in &named {
        assert!(
            s.contains_key(&name.to_ascii_lowercase()),
            "[{name}] is named but missing"
        );
    }
    // The models name ibcm_Install; Windows appends the .NT decoration.
    assert!(s.contains_key("ibcm_install.nt"));
    for needed in [
        "ibcm_Files",
        "ibcm_Service_Inst",
        "ibcm_EventLog_Inst",
        "ibcm_EventLog_AddReg",
        "ibcm_wdfsect",
    ] {
        assert!(
            named.iter().any(|n| n.eq_ignore_ascii_case(needed)),
            "{needed} not named"
        );
    }
    // The files it copies are the files it ships.
    let copied: Vec<&String> = s["ibcm_files"].iter().collect();
    let shipped: Vec<String> = entries(&s, "SourceDisksFiles")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(copied, shipped.iter().collect::<Vec<_>>());
}

#[test]
fn every_string_token_is_defined() {
    let s = sections();
    let strings: Vec<String> = entries(&s, "Strings").into_iter().map(|(k, _)| k).collect();
    for (n, line) in INF.lines().enumerate() {
        let line = strip_comment(line).replace("%%", "");
        let parts: Vec<&str> = line.split('%').collect();
        assert!(parts.len() % 2 == 1, "line {}: unpaired %", n + 1);
        for token in parts.iter().skip(1).step_by(2) {
            // %13%: a DIRID (the driver store).
            if token.chars().all(|c| c.is_ascii_digit()) {
                continue;
            }
            assert!(
                strings.contains(&token.to_ascii_lowercase()),
                "line {}: %{token}% is not in [Strings]",
                n + 1
            );
        }
    }
}

#[test]
fn nothing_writes_the_hca_devnode() {
    let s = sections();
    // No .HW section: the base INF owns the hardware key (UpperFilters, Security,
    // DeviceCharacteristics: mlx4_bus_win8.inx:86-91, mlx4_bus.inx:270-279).
    assert!(s.keys().all(|k| !k.ends_with(".hw")), "{:?}", s.keys());
    for (name, lines) in &s {
        for line in lines {
            let l = line.to_ascii_lowercase();
            for value in [
                "upperfilters",
                "lowerfilters",
                "security",
                "devicecharacteristics",
            ] {
                assert!(!l.contains(value), "[{name}] writes {value}: {line}");
            }
        }
    }
    // The one AddReg writes the event source's key (HKR of the event-log section).
    let reg = &s["ibcm_eventlog_addreg"];
    assert_eq!(reg.len(), 2);
    let message_file = fields(&reg[0]);
    assert_eq!(
        message_file[..4],
        ["HKR", "", "EventMessageFile", "0x00020000"]
    );
    assert!(message_file[4].contains("%13%\\ibcm_driver.sys"));
    assert!(message_file[4].contains("IoLogMsg.dll"));
    assert_eq!(
        fields(&reg[1]),
        ["HKR", "", "TypesSupported", "0x00010001", "7"]
    );
}

#[test]
fn the_service_is_a_boot_start_filter_not_the_function_driver() {
    let s = sections();
    let services = entries(&s, "ibcm_Install.NT.Services");
    assert_eq!(services.len(), 1);
    let f = fields(services[0].1);
    // Flags empty: no SPSVCINST_ASSOCSERVICE (mlx4_bus stays the function driver).
    assert_eq!(f, ["ibcm", "", "ibcm_Service_Inst", "ibcm_EventLog_Inst"]);
    let service: BTreeMap<String, &str> = entries(&s, "ibcm_Service_Inst").into_iter().collect();
    assert_eq!(service["servicetype"], "1");
    assert_eq!(service["starttype"], "0");
    assert_eq!(service["loadordergroup"], "PnP Filter");
    assert_eq!(service["dependencies"], "ibbus");
    assert_eq!(service["servicebinary"], "%13%\\ibcm_driver.sys");
}

#[test]
fn the_cli_knows_the_same_hcas_as_the_inf() {
    // `ibcm status` and `ibcm install --check` name an HCA of a supported ID without ibcm:
    // the same IDs the INF installs on.
    let mut cli: Vec<&str> = ibcm_cli::host_report::SUPPORTED_DEVICE_IDS.to_vec();
    let mut inf: Vec<&str> = WINOF_MODELS.to_vec();
    cli.sort_unstable();
    inf.sort_unstable();
    assert_eq!(cli, inf);
}
