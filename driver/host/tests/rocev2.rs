//! The RoCEv2 port's framing and ICRC, against real frames: the captured RoCEv2 frames in
//! `shared/vectors/liteeth-*/frames/*.hex` and the REQ Linux rping sent over soft-RoCE,
//! quoted in `shared/reference/linux-peer.md`. Both are read from their files.
#![cfg(target_os = "linux")]

use std::net::Ipv4Addr;
use std::path::PathBuf;

use ibcm_host::pcap::{ipv4_checksum, parse_rocev2};
use ibcm_host::rocev2::{
    DropReason, Framing, HOP_LIMIT, PACKET_LEN, PATH_MTU, RoceConfig, attribute_of, decode, encode,
    gid_ipv4, guid_from_mac, ipv4_gid, path_record, roce_address,
};
use ibcm_mad::{CmMad, CmMessage, MAD_SIZE, Mtu};

fn shared() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    assert!(
        dir.is_dir(),
        "the shared directory is missing: expected {} (../shared beside the repository)",
        dir.display()
    );
    dir
}

fn unhex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits");
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// Every RoCEv2 frame of the liteeth vectors (Ethernet, maybe VLAN-tagged): name, bytes.
fn liteeth_frames() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let vectors = shared().join("vectors");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&vectors)
        .expect("read shared/vectors")
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("liteeth-")
        })
        .collect();
    dirs.sort();
    for d in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(d.join("frames"))
            .expect("read a frames dir")
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "hex"))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(
                text.starts_with("# linktype=1"),
                "{}: not Ethernet",
                f.display()
            );
            let hex: String = text.lines().filter(|l| !l.starts_with('#')).collect();
            out.push((
                f.file_name().unwrap().to_string_lossy().into_owned(),
                unhex(&hex),
            ));
        }
    }
    assert!(
        out.len() >= 4,
        "expected the liteeth frames, found {}",
        out.len()
    );
    out
}

/// The IPv4 packet inside an Ethernet frame.
fn ip_packet(frame: &[u8]) -> &[u8] {
    let f = parse_rocev2(frame).expect("a RoCEv2 frame");
    &frame[f.ip_offset..f.ip_offset + usize::from(f.ip_total_len)]
}

#[test]
fn real_frames_decode_with_a_good_icrc() {
    for (name, frame) in liteeth_frames() {
        let packet = ip_packet(&frame);
        let d = decode(packet).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(d.mad.len(), MAD_SIZE, "{name}");
        let mad = CmMad::parse(d.mad).unwrap_or_else(|e| panic!("{name}: MAD: {e:?}"));
        assert!(matches!(
            mad.message,
            CmMessage::Req(_) | CmMessage::Rtu(_) | CmMessage::Dreq(_)
        ));
        assert_eq!(d.framing.pkey, 0xffff, "{name}");
    }
}

#[test]
fn icrc_covers_what_it_must_and_masks_what_it_may() {
    for (name, frame) in liteeth_frames() {
        let packet = ip_packet(&frame).to_vec();
        // Masked: TOS, TTL, IPv4 header checksum, UDP checksum, BTH byte 4.
        for at in [1usize, 8, 10, 11, 26, 27, 28 + 4] {
            let mut p = packet.clone();
            p[at] ^= 0x5a;
            assert!(decode(&p).is_ok(), "{name}: byte {at} is masked");
        }
        // Covered: IP ID, flags, addresses, UDP source port, BTH P_Key and PSN, DETH, the
        // MAD's first and last byte.
        for at in [4usize, 5, 6, 12, 19, 20, 28 + 2, 28 + 11, 44, 48, 48 + 255] {
            let mut p = packet.clone();
            p[at] ^= 0x01;
            assert!(
                matches!(decode(&p), Err(DropReason::BadIcrc { .. })),
                "{name}: byte {at} is covered"
            );
        }
    }
}

#[test]
fn encode_reproduces_real_frames_and_their_icrc() {
    for (name, frame) in liteeth_frames() {
        let real = ip_packet(&frame);
        let d = decode(real).unwrap();
        let ours = encode(&d.framing, d.mad).unwrap();
        assert_eq!(ours.len(), real.len(), "{name}");
        // TOS, TTL and the two checksums may differ (ours: TOS 0, TTL 64, checksums
        // computed); everything else, the ICRC included, is byte for byte the sender's.
        for (i, (a, b)) in ours.iter().zip(real).enumerate() {
            if [1, 8, 10, 11, 26, 27].contains(&i) {
                continue;
            }
            assert_eq!(a, b, "{name}: byte {i} differs");
        }
        assert_eq!(
            ipv4_checksum(&ours[..20]),
            0,
            "{name}: our IPv4 header checksum"
        );
        assert!(decode(&ours).is_ok());
    }
}

#[test]
fn ca_guid_is_the_eui64_of_the_mac() {
    // The Linux host of liteeth PR 198: its REQ's LocalCAGUID is the EUI-64 of the frame's
    // source MAC, as rxe derives it.
    let (_, frame) = liteeth_frames()
        .into_iter()
        .find(|(n, _)| n.contains("198") && n.contains("req"))
        .expect("the liteeth PR 198 REQ");
    let f = parse_rocev2(&frame).unwrap();
    let CmMessage::Req(req) = CmMad::parse(f.payload).unwrap().message else {
        panic!("not a REQ")
    };
    assert_eq!(guid_from_mac(f.src_mac), req.local_ca_guid);
}

/// The REQ Linux rping sent (UDP payload: BTH to ICRC) from the reference document.
fn rping_req() -> Vec<u8> {
    let doc = std::fs::read_to_string(shared().join("reference/linux-peer.md"))
        .expect("read shared/reference/linux-peer.md");
    let start = doc
        .find("A sample REQ as sent by Linux rping")
        .expect("the rping REQ section");
    let rest = &doc[start..];
    let open = rest.find("```").expect("the code block") + 3;
    let close = rest[open..].find("```").expect("the end of the code block") + open;
    let bytes = unhex(&rest[open..close]);
    assert_eq!(bytes.len(), 280, "BTH + DETH + MAD + ICRC");
    bytes
}

#[test]
fn rping_req_icrc_is_reproduced_for_exactly_one_ip_id() {
    let payload = rping_req();
    let mad = &payload[20..20 + MAD_SIZE];
    let stored = u32::from_le_bytes(payload[276..280].try_into().unwrap());
    let CmMessage::Req(req) = CmMad::parse(mad).unwrap().message else {
        panic!("not a REQ")
    };
    // The addresses are the path's GIDs; the UDP source port is rxe's for QP1
    // (0xc000 + hash_32(1, 14)); the IP ID is not in the payload: search it.
    let src = gid_ipv4(&req.primary_path.local_gid).expect("an IPv4-mapped GID");
    let dst = gid_ipv4(&req.primary_path.remote_gid).expect("an IPv4-mapped GID");
    let rxe_qp1_port = 0xc000 + ((1u32.wrapping_mul(0x61C8_8647) >> (32 - 14)) as u16);
    let framing = Framing {
        src,
        dst,
        ip_id: 1,
        udp_src: rxe_qp1_port,
        pkey: u16::from_be_bytes([payload[2], payload[3]]),
        psn: u32::from_be_bytes([0, payload[9], payload[10], payload[11]]),
        ack_req: payload[8] & 0x80 != 0,
        mig_req: payload[1] & 0x40 != 0,
    };
    let mut packet = encode(&framing, mad).unwrap();
    let mut found = Vec::new();
    for id in 0..=u16::MAX {
        packet[4..6].copy_from_slice(&id.to_be_bytes());
        if ibcm_host::pcap::icrc(&packet[..PACKET_LEN - 4]) == Some(stored) {
            found.push(id);
        }
    }
    assert_eq!(found.len(), 1, "IP IDs reproducing the ICRC: {found:?}");
    // With that ID, encode gives Linux's payload byte for byte, ICRC included.
    let ours = encode(
        &Framing {
            ip_id: found[0],
            ..framing
        },
        mad,
    )
    .unwrap();
    assert_eq!(&ours[28..], &payload[..]);
    assert!(decode(&ours).is_ok());
}

#[test]
fn roce_addresses_and_paths() {
    let a = Ipv4Addr::new(10, 77, 0, 1);
    let b = Ipv4Addr::new(10, 77, 0, 2);
    let gid = ipv4_gid(a);
    assert_eq!(gid[..12], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    assert_eq!(gid_ipv4(&gid), Some(a));
    let mut link_local = [0u8; 16];
    link_local[0] = 0xfe;
    link_local[1] = 0x80;
    assert_eq!(gid_ipv4(&link_local), None);
    assert_eq!(
        guid_from_mac([0x52, 0x54, 0, 0x77, 0, 2]),
        0x5054_00ff_fe77_0002
    );
    let p = path_record(a, b, 12);
    assert_eq!((p.slid, p.dlid), (0xffff, 0xffff));
    assert_eq!((p.sgid, p.dgid), (ipv4_gid(a), ipv4_gid(b)));
    assert_eq!(p.hop_limit, HOP_LIMIT);
    assert!(!p.subnet_local);
    assert_eq!(PATH_MTU, Mtu::Mtu1024);
    let src = roce_address(b, 0xffff);
    assert_eq!((src.lid, src.gid, src.grh), (0xffff, ipv4_gid(b), true));
    let cfg = RoceConfig::new(a);
    assert!(cfg.on_link(b));
    assert!(!cfg.on_link(a), "not ourselves");
    assert!(
        !cfg.on_link(Ipv4Addr::new(10, 77, 0, 255)),
        "not the broadcast address"
    );
    assert!(!cfg.on_link(Ipv4Addr::new(10, 77, 1, 2)), "another subnet");
    assert!(!cfg.on_link(Ipv4Addr::new(8, 8, 8, 8)));
}

#[test]
fn decode_sorts_out_what_is_not_a_qp1_mad() {
    let mut mad = [0u8; MAD_SIZE];
    mad[16..18].copy_from_slice(&0x0013u16.to_be_bytes());
    assert_eq!(attribute_of(&mad), 0x13);
    let f = Framing {
        src: Ipv4Addr::new(10, 77, 0, 1),
        dst: Ipv4Addr::new(10, 77, 0, 2),
        ip_id: 7,
        udp_src: 0xc123,
        pkey: 0xffff,
        psn: 5,
        ack_req: false,
        mig_req: false,
    };
    let p = encode(&f, &mad).unwrap();
    let d = decode(&p).unwrap();
    assert_eq!((d.framing, d.mad), (f, &mad[..]));
    assert!(encode(&f, &mad[..100]).is_none(), "a MAD is 256 bytes");
    let mut other_port = p;
    other_port[22..24].copy_from_slice(&53u16.to_be_bytes());
    assert_eq!(decode(&other_port), Err(DropReason::NotRoce));
    let mut not_qp1 = p;
    not_qp1[28 + 7] = 2; // destination QP 2
    assert_eq!(decode(&not_qp1), Err(DropReason::NotQp1));
    let mut bad_qkey = p;
    bad_qkey[40] ^= 0x80;
    assert_eq!(decode(&bad_qkey), Err(DropReason::NotQp1));
    let mut bad_icrc = p;
    bad_icrc[PACKET_LEN - 1] ^= 1;
    assert!(matches!(decode(&bad_icrc), Err(DropReason::BadIcrc { .. })));
    assert_eq!(decode(&p[..40]), Err(DropReason::NotRoce), "truncated");
}

/// `p` with its ICRC computed again (after a field it covers was changed).
fn with_icrc(mut p: [u8; PACKET_LEN]) -> [u8; PACKET_LEN] {
    let end = PACKET_LEN - 4;
    let crc = ibcm_host::pcap::icrc(&p[..end]).unwrap();
    p[end..].copy_from_slice(&crc.to_le_bytes());
    p
}

/// Found by the `rocev2` fuzz target (its reference decoder follows IBA and what a RoCE
/// NIC's stack drops): `decode` handed up, as a 256-byte MAD, packets with a good ICRC
/// but a UDP length that disagrees with the IP packet's, a transport header version
/// other than 0, or pad (which leaves fewer than 256 bytes of MAD).
#[test]
fn decode_drops_what_a_roce_nic_drops() {
    let f = Framing {
        src: Ipv4Addr::new(10, 77, 0, 1),
        dst: Ipv4Addr::new(10, 77, 0, 2),
        ip_id: 9,
        udp_src: 0xc001,
        pkey: 0xffff,
        psn: 1,
        ack_req: false,
        mig_req: true,
    };
    let p = encode(&f, &[0x11; MAD_SIZE]).unwrap();
    assert!(decode(&p).is_ok());
    // UDP length: bytes 24..26 (the IPv4 header has no options).
    for len in [279u16, 281, 8, 0xffff] {
        let mut q = p;
        q[24..26].copy_from_slice(&len.to_be_bytes());
        assert_eq!(
            decode(&with_icrc(q)),
            Err(DropReason::NotQp1),
            "UDP length {len}"
        );
    }
    // BTH byte 1 (packet byte 29): SE, MigReq, PadCnt (0x30), TVer (0x0f).
    for flags in [0x41u8, 0x4f, 0x50, 0x60, 0x70, 0x01] {
        let mut q = p;
        q[29] = flags;
        assert_eq!(
            decode(&with_icrc(q)),
            Err(DropReason::NotQp1),
            "BTH flags {flags:#x}"
        );
    }
    // SE and MigReq are no reason to drop.
    let mut q = p;
    q[29] = 0x80;
    assert!(decode(&with_icrc(q)).is_ok());
}

/// The receive path counts every packet once and hands the CM only QP1 MADs with a good
/// ICRC (what the `rocev2` fuzz target checks on arbitrary packets).
#[test]
fn receive_packet_counts_and_hands_up_only_good_mads() {
    use ibcm_host::rocev2::{Received, RoceFaults, RoceStats, receive_packet};
    use std::sync::Mutex;
    let local = Ipv4Addr::new(10, 77, 0, 2);
    let f = Framing {
        src: Ipv4Addr::new(10, 77, 0, 1),
        dst: local,
        ip_id: 3,
        udp_src: 0xc002,
        pkey: 0x8001,
        psn: 2,
        ack_req: false,
        mig_req: false,
    };
    let mut mad = [0u8; MAD_SIZE];
    mad[16..18].copy_from_slice(&0x0015u16.to_be_bytes());
    let good = encode(&f, &mad).unwrap();
    let mut bad_icrc = good;
    bad_icrc[100] ^= 4;
    let mut other_port = good;
    other_port[22..24].copy_from_slice(&53u16.to_be_bytes());
    let mut to_other = f;
    to_other.dst = Ipv4Addr::new(10, 77, 0, 9);
    let elsewhere = encode(&to_other, &mad).unwrap();
    let stats = RoceStats::default();
    let faults = Mutex::new(RoceFaults {
        drop_tx: Vec::new(),
        drop_rx: vec![(0x0015, 1)],
    });
    let mut handed = Vec::new();
    let mut rx = |p: &[u8]| {
        receive_packet(p, local, &stats, &faults, |src, m| {
            handed.push((*src, m.to_vec()));
        })
    };
    assert_eq!(
        rx(&good),
        Received::Faulted,
        "the one MAD fault injection drops"
    );
    assert_eq!(rx(&bad_icrc), Received::BadIcrc);
    assert_eq!(rx(&other_port), Received::Ignored);
    assert_eq!(rx(&elsewhere), Received::Ignored);
    assert_eq!(
        rx(&good[..60]),
        Received::Ignored,
        "truncated: not RoCEv2 as far as it goes"
    );
    assert_eq!(rx(&good), Received::Delivered);
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0].0, roce_address(f.src, 0x8001));
    assert_eq!(handed[0].1, mad);
    let c = stats.counts();
    assert_eq!(
        (c.received, c.bad_icrc, c.not_qp1, c.fault_rx, c.sent),
        (1, 1, 0, 1, 0)
    );
}
