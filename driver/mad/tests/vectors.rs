//! Real CM MADs captured on the wire (`shared/vectors`, next to the repository): every
//! field that `CmMad::parse` returns is compared with the reference decode in each
//! directory's `index.json`, and `emit(parse(b)) == b`.
//!
//! The vectors are not copied into the repository: the test reads them from
//! `../shared/vectors` relative to the repository root and fails if they are missing.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ibcm_mad::{
    AttributeId, CmMad, CmMessage, IP_HEADER_SIZE, IpHeader, IpServiceId, MAD_SIZE, Method,
    PortSpace, ReqPacket,
};
use serde_json::Value;

fn vectors_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors");
    assert!(
        dir.is_dir(),
        "CM test vectors not found at {}: the tests need the shared/ directory next to the \
         repository (shared/vectors/*/index.json and *.mad.hex); they are never copied into \
         the repository",
        dir.display()
    );
    dir
}

/// Hex from lines after the `#` provenance line(s).
fn read_hex(path: &Path) -> Vec<u8> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let hex: String = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| l.split_whitespace())
        .collect();
    hex::decode(&hex).unwrap_or_else(|e| panic!("{}: bad hex: {e}", path.display()))
}

fn hex_bytes(v: &Value, what: &str) -> Vec<u8> {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("{what}: not a string: {v}"));
    hex::decode(s).unwrap_or_else(|e| panic!("{what}: bad hex {s:?}: {e}"))
}

/// One parsed vector's fields, named and valued as `reference_decode` has them.
type Fields = BTreeMap<&'static str, Value>;

fn n(v: impl Into<u64>) -> Value {
    Value::from(v.into())
}

fn flag(b: bool) -> Value {
    Value::from(u64::from(b))
}

fn h(bytes: &[u8]) -> Value {
    Value::from(hex::encode(bytes))
}

fn path_fields(f: &mut Fields, prefix: &'static str, p: &ibcm_mad::Path) {
    let names: [(&str, Value); 11] = [
        ("local_port_lid", n(p.local_lid)),
        ("remote_port_lid", n(p.remote_lid)),
        ("local_port_gid", h(&p.local_gid)),
        ("remote_port_gid", h(&p.remote_gid)),
        ("flow_label", n(p.flow_label)),
        ("packet_rate", n(u8::from(p.packet_rate))),
        ("traffic_class", n(p.traffic_class)),
        ("hop_limit", n(p.hop_limit)),
        ("sl", n(p.sl)),
        ("subnet_local", flag(p.subnet_local)),
        ("local_ack_timeout", n(p.local_ack_timeout)),
    ];
    for (name, value) in names {
        let key: &'static str = Box::leak(format!("{prefix}_{name}").into_boxed_str());
        f.insert(key, value);
    }
}

/// The parsed message as `reference_decode` names its fields, with its IBA message name.
fn fields(m: &CmMessage<'_>) -> (&'static str, Fields) {
    let mut f = Fields::new();
    let name = match m {
        CmMessage::Req(r) => {
            let (st, ext) = r.transport.to_wire();
            f.insert("local_comm_id", n(r.local_comm_id));
            f.insert("vendor_id", n(r.vendor_id));
            f.insert("service_id", n(r.service_id));
            f.insert("local_ca_guid", n(r.local_ca_guid));
            f.insert("local_qkey", n(r.local_qkey));
            f.insert("local_qpn", n(r.local_qpn));
            f.insert("responder_resources", n(r.responder_resources));
            f.insert("local_eecn", n(r.local_eecn));
            f.insert("initiator_depth", n(r.initiator_depth));
            f.insert("remote_eecn", n(r.remote_eecn));
            f.insert(
                "remote_cm_response_timeout",
                n(r.remote_cm_response_timeout),
            );
            f.insert("transport_service_type", n(st));
            f.insert("end_to_end_flow_control", flag(r.end_to_end_flow_control));
            f.insert("starting_psn", n(r.starting_psn));
            f.insert("local_cm_response_timeout", n(r.local_cm_response_timeout));
            f.insert("retry_count", n(r.retry_count));
            f.insert("partition_key", n(r.partition_key));
            f.insert("path_packet_payload_mtu", n(u8::from(r.path_mtu)));
            f.insert("rdc_exists", flag(r.rdc_exists));
            f.insert("rnr_retry_count", n(r.rnr_retry_count));
            f.insert("max_cm_retries", n(r.max_cm_retries));
            f.insert("srq", flag(r.srq));
            f.insert("extended_transport_type", n(ext));
            path_fields(&mut f, "primary", &r.primary_path);
            path_fields(&mut f, "alternate", &r.alternate_path);
            f.insert("sap_supported", flag(r.sap_supported));
            f.insert("private_data", h(r.private_data));
            "REQ"
        }
        CmMessage::Rep(r) => {
            let [_, vh, vm, vl] = r.vendor_id.to_be_bytes();
            f.insert("local_comm_id", n(r.local_comm_id));
            f.insert("remote_comm_id", n(r.remote_comm_id));
            f.insert("local_qkey", n(r.local_qkey));
            f.insert("local_qpn", n(r.local_qpn));
            f.insert("vendor_id_h", n(vh));
            f.insert("local_eecn", n(r.local_eecn));
            f.insert("vendor_id_m", n(vm));
            f.insert("starting_psn", n(r.starting_psn));
            f.insert("vendor_id_l", n(vl));
            f.insert("responder_resources", n(r.responder_resources));
            f.insert("initiator_depth", n(r.initiator_depth));
            f.insert("target_ack_delay", n(r.target_ack_delay));
            f.insert("failover_accepted", n(u8::from(r.failover_accepted)));
            f.insert("end_to_end_flow_control", flag(r.end_to_end_flow_control));
            f.insert("rnr_retry_count", n(r.rnr_retry_count));
            f.insert("srq", flag(r.srq));
            f.insert("local_ca_guid", n(r.local_ca_guid));
            f.insert("private_data", h(r.private_data));
            "REP"
        }
        CmMessage::Rtu(r) | CmMessage::Drep(r) => {
            f.insert("local_comm_id", n(r.local_comm_id));
            f.insert("remote_comm_id", n(r.remote_comm_id));
            f.insert("private_data", h(r.private_data));
            if matches!(m, CmMessage::Rtu(_)) {
                "RTU"
            } else {
                "DREP"
            }
        }
        CmMessage::Dreq(r) => {
            f.insert("local_comm_id", n(r.local_comm_id));
            f.insert("remote_comm_id", n(r.remote_comm_id));
            f.insert("remote_qpn_eecn", n(r.remote_qpn_eecn));
            f.insert("private_data", h(r.private_data));
            "DREQ"
        }
        CmMessage::Mra(r) => {
            f.insert("local_comm_id", n(r.local_comm_id));
            f.insert("remote_comm_id", n(r.remote_comm_id));
            f.insert("message_mraed", n(u8::from(r.message_mraed)));
            f.insert("service_timeout", n(r.service_timeout));
            f.insert("private_data", h(r.private_data));
            "MRA"
        }
        CmMessage::Rej(r) => {
            f.insert("local_comm_id", n(r.local_comm_id));
            f.insert("remote_comm_id", n(r.remote_comm_id));
            f.insert("message_rejected", n(u8::from(r.message_rejected)));
            f.insert("rejected_info_length", n(r.ari.len() as u64));
            f.insert("reason", n(u16::from(r.reason)));
            f.insert("ari", h(r.ari));
            f.insert("private_data", h(r.private_data));
            "REJ"
        }
        CmMessage::Lap(r) => {
            f.insert("local_comm_id", n(r.local_comm_id));
            f.insert("remote_comm_id", n(r.remote_comm_id));
            f.insert("remote_qpn_eecn", n(r.remote_qpn_eecn));
            f.insert(
                "remote_cm_response_timeout",
                n(r.remote_cm_response_timeout),
            );
            path_fields(&mut f, "alternate", &r.alternate_path);
            f.insert("private_data", h(r.private_data));
            "LAP"
        }
        CmMessage::Apr(r) => {
            f.insert("local_comm_id", n(r.local_comm_id));
            f.insert("remote_comm_id", n(r.remote_comm_id));
            f.insert("additional_info_length", n(r.additional_info.len() as u64));
            f.insert("ap_status", n(u8::from(r.status)));
            f.insert("additional_info", h(r.additional_info));
            f.insert("private_data", h(r.private_data));
            "APR"
        }
        CmMessage::SidrReq(r) => {
            f.insert("request_id", n(r.request_id));
            f.insert("partition_key", n(r.partition_key));
            f.insert("service_id", n(r.service_id));
            f.insert("private_data", h(r.private_data));
            "SIDR_REQ"
        }
        CmMessage::SidrRep(r) => {
            f.insert("request_id", n(r.request_id));
            f.insert("status", n(u8::from(r.status)));
            f.insert("additional_info_length", n(r.additional_info.len() as u64));
            f.insert("qpn", n(r.qpn));
            f.insert("service_id", n(r.service_id));
            f.insert("qkey", n(r.qkey));
            f.insert("additional_info", h(r.additional_info));
            f.insert("private_data", h(r.private_data));
            "SIDR_REP"
        }
        CmMessage::ClassPortInfo(_) => "ClassPortInfo",
    };
    (name, f)
}

/// Compares every field of the reference decode with the parse, and checks that the parse
/// has no field the reference lacks.
fn compare(file: &str, parsed: &Fields, reference: &serde_json::Map<String, Value>) {
    let want: BTreeSet<&str> = reference.keys().map(String::as_str).collect();
    let have: BTreeSet<&str> = parsed.keys().copied().collect();
    assert_eq!(
        have, want,
        "{file}: field sets differ (parse vs reference_decode)"
    );
    for (name, value) in parsed {
        let expected = &reference[*name];
        // GIDs and byte strings: compare case-insensitively as hex.
        let equal = match (value, expected) {
            (Value::String(a), Value::String(b)) => a.eq_ignore_ascii_case(b),
            (a, b) => a == b,
        };
        assert!(
            equal,
            "{file}: {name}: parsed {value}, reference {expected}"
        );
    }
}

/// The RDMA-CM IP header (Annex A11) and IP service ID against the index's `ip_cm`.
fn check_ip_cm(file: &str, service_id: u64, private_data: &[u8], ip_cm: &Value) {
    let ip_cm = ip_cm
        .as_object()
        .unwrap_or_else(|| panic!("{file}: ip_cm is not an object"));
    let hdr = IpHeader::parse(private_data)
        .unwrap_or_else(|e| panic!("{file}: IpHeader::parse failed: {e}"));
    let sid = IpServiceId::from_service_id(service_id)
        .unwrap_or_else(|| panic!("{file}: service ID {service_id:#x} is not an IP one"));
    let ip = |v: &Value| -> IpAddr { v.as_str().unwrap().parse().unwrap() };
    let num = |v: &Value| -> u64 { v.as_u64().unwrap() };
    let mut checked = 0;
    for (key, v) in ip_cm {
        match key.as_str() {
            "ipcm_major_version" => assert_eq!(u64::from(private_data[0] >> 4), num(v)),
            "ipcm_minor_version" => assert_eq!(u64::from(private_data[0] & 0xf), num(v)),
            "ipcm_ip_version" => {
                assert_eq!(u64::from(private_data[1] >> 4), num(v));
                let is_v4 = matches!(hdr.src_addr, IpAddr::V4(_));
                assert_eq!(is_v4, num(v) == 4, "{file}: IP family");
            }
            "ipcm_reserved" => assert_eq!(u64::from(private_data[1] & 0xf), num(v)),
            "ipcm_source_port" => assert_eq!(u64::from(hdr.src_port), num(v)),
            "ipcm_source_ip" => assert_eq!(hdr.src_addr, ip(v), "{file}: source IP"),
            "ipcm_destination_ip" => assert_eq!(hdr.dst_addr, ip(v), "{file}: destination IP"),
            "ipcm_consumer_private_data" => assert_eq!(
                &private_data[IP_HEADER_SIZE..],
                &hex_bytes(v, key)[..],
                "{file}: consumer private data"
            ),
            "sid_prefix" => {
                assert_eq!(format!("{:010x}", service_id >> 24), v.as_str().unwrap())
            }
            "sid_protocol" => {
                assert_eq!(u64::from(u16::from(sid.port_space) & 0xff), num(v));
                assert_eq!(sid.port_space, PortSpace::from(0x0100 | num(v) as u16));
            }
            "sid_dport" => assert_eq!(u64::from(sid.port), num(v)),
            other => panic!("{file}: ip_cm field {other} is not checked by this test"),
        }
        checked += 1;
    }
    assert!(checked > 0, "{file}: empty ip_cm");
    assert_eq!(
        sid.to_service_id(),
        service_id,
        "{file}: service ID rebuild"
    );
}

fn attribute_for(message: &str) -> AttributeId {
    match message {
        "REQ" => AttributeId::Req,
        "MRA" => AttributeId::Mra,
        "REJ" => AttributeId::Rej,
        "REP" => AttributeId::Rep,
        "RTU" => AttributeId::Rtu,
        "DREQ" => AttributeId::Dreq,
        "DREP" => AttributeId::Drep,
        "LAP" => AttributeId::Lap,
        "APR" => AttributeId::Apr,
        "SIDR_REQ" => AttributeId::SidrReq,
        "SIDR_REP" => AttributeId::SidrRep,
        other => panic!("index.json names an unknown message {other:?}"),
    }
}

/// The frame the MAD was extracted from must contain it byte for byte.
fn check_frame(dir: &Path, file: &str, mad: &[u8]) {
    let frame_file = dir.join("frames").join(file.replace(".mad.hex", ".hex"));
    if !frame_file.exists() {
        return;
    }
    let frame = read_hex(&frame_file);
    assert!(
        frame.windows(MAD_SIZE).any(|w| w == mad),
        "{file}: MAD bytes not found in {}",
        frame_file.display()
    );
}

#[test]
fn every_vector_matches_its_reference_decode() {
    let root = vectors_dir();
    let mut dirs: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "{}: no vector directories",
        root.display()
    );

    let mut total = 0;
    let mut messages = BTreeMap::<&'static str, usize>::new();
    for dir in &dirs {
        let index_path = dir.join("index.json");
        let index: Value = serde_json::from_str(
            &fs::read_to_string(&index_path)
                .unwrap_or_else(|e| panic!("{}: {e}", index_path.display())),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", index_path.display()));
        let entries = index["vectors"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no vectors[]", index_path.display()));

        let mut files: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| f.ends_with(".mad.hex"))
            .collect();
        files.sort();
        let mut indexed: Vec<String> = entries
            .iter()
            .map(|v| v["file"].as_str().unwrap().to_owned())
            .collect();
        indexed.sort();
        assert_eq!(
            files,
            indexed,
            "{}: *.mad.hex files and index.json entries differ",
            dir.display()
        );

        for entry in entries {
            let file = entry["file"].as_str().unwrap();
            let bytes = read_hex(&dir.join(file));
            assert_eq!(bytes.len(), MAD_SIZE, "{file}: not a 256-byte MAD");
            check_frame(dir, file, &bytes);

            let mad = CmMad::parse(&bytes).unwrap_or_else(|e| panic!("{file}: parse: {e}"));
            let message = entry["message"].as_str().unwrap();
            assert_eq!(
                mad.message.attribute_id(),
                attribute_for(message),
                "{file}: attribute"
            );
            assert_eq!(mad.header.method, Method::Send, "{file}: method");
            assert_eq!(
                mad.header.transaction_id,
                u64::from_be_bytes(bytes[8..16].try_into().unwrap())
            );

            let (name, parsed) = fields(&mad.message);
            assert_eq!(name, message, "{file}: message kind");
            let reference = entry["reference_decode"]
                .as_object()
                .unwrap_or_else(|| panic!("{file}: no reference_decode"));
            compare(file, &parsed, reference);

            if let CmMessage::Req(req) = &mad.message {
                // The transport as a whole, through the public constructor.
                let st = reference["transport_service_type"].as_u64().unwrap() as u8;
                let ext = reference["extended_transport_type"].as_u64().unwrap() as u8;
                assert_eq!(req.transport, ibcm_mad::Transport::from_wire(st, ext));
                let view = ReqPacket::new_checked(&bytes[..]).unwrap();
                assert_eq!(view.extended_transport_type(), ext);
            }

            match (&entry["ip_cm"], &mad.message) {
                (Value::Null, _) => {}
                (ip_cm, CmMessage::Req(req)) => {
                    check_ip_cm(file, req.service_id, req.private_data, ip_cm)
                }
                (_, _) => panic!("{file}: ip_cm on a non-REQ message"),
            }

            // emit(parse(b)) == b: all the captures have their reserved bits zero.
            let mut out = [0xEEu8; MAD_SIZE];
            mad.emit(&mut out)
                .unwrap_or_else(|e| panic!("{file}: emit: {e}"));
            let differing: Vec<usize> = (0..MAD_SIZE).filter(|&i| out[i] != bytes[i]).collect();
            match &entry["reserved_bits_nonzero"] {
                Value::Null => assert!(
                    differing.is_empty(),
                    "{file}: re-emit differs at bytes {differing:?} though the index says no \
                     reserved bit is set"
                ),
                other => panic!(
                    "{file}: index lists nonzero reserved bits ({other}); re-emit differs at \
                     {differing:?}: add the expected difference to this test"
                ),
            }
            total += 1;
            *messages.entry(name).or_default() += 1;
        }
    }
    assert!(total > 0, "no *.mad.hex vectors under {}", root.display());
    eprintln!("checked {total} vectors: {messages:?}");
}
