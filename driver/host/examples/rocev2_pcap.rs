//! Checks a capture of RoCEv2 CM traffic (a pcap file, Ethernet, e.g. from
//! `tcpdump -i tap0 -w FILE udp port 4791`) with the project's pcap reader, and summarises
//! it for the interop harness.
//!
//! Every frame must be a UD SEND_ONLY to QP1 (BTH opcode 0x64, destination QP 1, Q_Key
//! 0x80010000, source QP 1) with a right IPv4 header checksum and a right ICRC, carrying
//! a CM MAD that the codec parses. Prints one line per frame, then per sender the count of
//! each attribute (`count FROM ATTR N`), the REJ reasons (`rej FROM REASON N`), the REQs
//! that repeat an earlier one's comm ID and CA GUID (`duplicate-req FROM N`), how many of
//! each attribute's LocalCommIDs and RemoteCommIDs lie in ibcm's comm ID space beside
//! WinOF AL (`CmConfig::BESIDE_WINOF_AL`, wire byte 2 >= 0xF0) and how many outside it
//! (`comm-id FROM ATTR local|remote IN OUT`, issue #19), and a final `frames N bad 0`
//! line. Exits 1 if any frame is bad.
//!
//!     cargo run -p ibcm-host --example rocev2_pcap -- FILE [--quiet]

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::process::ExitCode;

use ibcm_cep::CmConfig;
use ibcm_host::pcap::{
    BTH_UD_SEND_ONLY, LINKTYPE_ETHERNET, QP1_QKEY, ROCEV2_PORT, parse_rocev2, read_pcap,
};
use ibcm_mad::{CmMad, CmMessage};

/// The LocalCommID and, but for a REQ, the RemoteCommID of a connection message.
fn comm_ids(m: &CmMessage<'_>) -> Option<(u32, Option<u32>)> {
    let both = |l, r| Some((l, Some(r)));
    match m {
        CmMessage::Req(r) => Some((r.local_comm_id, None)),
        CmMessage::Mra(m) => both(m.local_comm_id, m.remote_comm_id),
        CmMessage::Rej(m) => both(m.local_comm_id, m.remote_comm_id),
        CmMessage::Rep(m) => both(m.local_comm_id, m.remote_comm_id),
        CmMessage::Rtu(m) | CmMessage::Drep(m) => both(m.local_comm_id, m.remote_comm_id),
        CmMessage::Dreq(m) => both(m.local_comm_id, m.remote_comm_id),
        CmMessage::Lap(m) => both(m.local_comm_id, m.remote_comm_id),
        CmMessage::Apr(m) => both(m.local_comm_id, m.remote_comm_id),
        CmMessage::SidrReq(_) | CmMessage::SidrRep(_) | CmMessage::ClassPortInfo(_) => None,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quiet = args.iter().any(|a| a == "--quiet");
    let Some(path) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: rocev2_pcap FILE [--quiet]");
        return ExitCode::FAILURE;
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("rocev2_pcap: {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let pcap = match read_pcap(&bytes) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rocev2_pcap: {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if pcap.linktype != LINKTYPE_ETHERNET {
        eprintln!(
            "rocev2_pcap: {path}: linktype {} (expected Ethernet)",
            pcap.linktype
        );
        return ExitCode::FAILURE;
    }
    let mut bad = 0usize;
    let mut counts: BTreeMap<(Ipv4Addr, String), usize> = BTreeMap::new();
    let mut rejs: BTreeMap<(Ipv4Addr, u16), usize> = BTreeMap::new();
    let mut reqs_seen: BTreeSet<(u32, u64)> = BTreeSet::new();
    let mut dup_reqs: BTreeMap<Ipv4Addr, usize> = BTreeMap::new();
    let mut ip_ids: BTreeMap<Ipv4Addr, (usize, usize)> = BTreeMap::new();
    // (sender, attribute, field) -> (in ibcm's space beside AL, outside it).
    let mut spaces: BTreeMap<(Ipv4Addr, String, &str), (usize, usize)> = BTreeMap::new();
    let beside_al = CmConfig::new(0, [0; 32]).with_comm_id_pattern(CmConfig::BESIDE_WINOF_AL);
    let t0 = pcap.packets.first().map_or(0, |p| p.ts_ns);
    for (i, p) in pcap.packets.iter().enumerate() {
        let f = match parse_rocev2(&p.data) {
            Ok(f) => f,
            Err(e) => {
                println!("frame {i}: not RoCEv2: {e}");
                bad += 1;
                continue;
            }
        };
        let src = Ipv4Addr::from(f.src_ip);
        let dst = Ipv4Addr::from(f.dst_ip);
        let mut problems = Vec::new();
        if !f.icrc_ok() {
            problems.push(format!(
                "ICRC {:#010x}, computed {:#010x}",
                f.icrc_stored, f.icrc_computed
            ));
        }
        if !f.ip_checksum_ok {
            problems.push("IPv4 header checksum".to_string());
        }
        if f.udp_dst != ROCEV2_PORT {
            problems.push(format!("UDP destination port {}", f.udp_dst));
        }
        if f.opcode != BTH_UD_SEND_ONLY || f.dest_qp != 1 || f.qkey != QP1_QKEY || f.src_qp != 1 {
            problems.push(format!(
                "not a QP1 MAD (opcode {:#04x}, QP {} <- {}, Q_Key {:#x})",
                f.opcode, f.dest_qp, f.src_qp, f.qkey
            ));
        }
        let e = ip_ids.entry(src).or_default();
        e.0 += 1;
        if f.ip_id == 0 {
            e.1 += 1;
        }
        let what = match CmMad::parse(f.payload) {
            Ok(mad) => {
                let attr = format!("{:?}", mad.message.attribute_id()).to_uppercase();
                *counts.entry((src, attr.clone())).or_default() += 1;
                if let Some((local, remote)) = comm_ids(&mad.message) {
                    for (field, id) in [("local", Some(local)), ("remote", remote)] {
                        let Some(id) = id else { continue };
                        let e = spaces.entry((src, attr.clone(), field)).or_default();
                        if beside_al.is_local_comm_id(id) {
                            e.0 += 1;
                        } else {
                            e.1 += 1;
                        }
                    }
                }
                let detail = match mad.message {
                    CmMessage::Req(r) => {
                        if !reqs_seen.insert((r.local_comm_id, r.local_ca_guid)) {
                            *dup_reqs.entry(src).or_default() += 1;
                        }
                        format!(
                            "comm {:#010x} service {:#018x} QPN {:#08x} CA {:#018x}",
                            r.local_comm_id, r.service_id, r.local_qpn, r.local_ca_guid
                        )
                    }
                    CmMessage::Rej(r) => {
                        let code = u16::from(r.reason);
                        *rejs.entry((src, code)).or_default() += 1;
                        format!(
                            "comm {:#010x} -> {:#010x} reason {:?} ({code}) of {:?}",
                            r.local_comm_id, r.remote_comm_id, r.reason, r.message_rejected
                        )
                    }
                    CmMessage::Rep(r) => format!(
                        "comm {:#010x} -> {:#010x} QPN {:#08x}",
                        r.local_comm_id, r.remote_comm_id, r.local_qpn
                    ),
                    _ => String::new(),
                };
                format!("{attr} tid {:#018x} {detail}", mad.header.transaction_id)
            }
            Err(e) => {
                problems.push(format!("MAD does not parse: {e}"));
                "?".to_string()
            }
        };
        if !quiet || !problems.is_empty() {
            println!(
                "frame {i} +{:.6}s {src} -> {dst} id {:#06x} psn {}: {what}{}",
                p.ts_ns.saturating_sub(t0) as f64 / 1e9,
                f.ip_id,
                f.psn,
                if problems.is_empty() {
                    String::new()
                } else {
                    format!(" BAD: {}", problems.join("; "))
                }
            );
        }
        if !problems.is_empty() {
            bad += 1;
        }
    }
    for ((src, attr), n) in &counts {
        println!("count {src} {attr} {n}");
    }
    for ((src, reason), n) in &rejs {
        println!("rej {src} {reason} {n}");
    }
    for (src, n) in &dup_reqs {
        println!("duplicate-req {src} {n}");
    }
    for ((src, attr, field), (inside, outside)) in &spaces {
        println!("comm-id {src} {attr} {field} {inside} {outside}");
    }
    for (src, (n, zero)) in &ip_ids {
        println!("ip-id {src} frames {n} zero {zero}");
    }
    println!("frames {} bad {bad}", pcap.packets.len());
    if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
