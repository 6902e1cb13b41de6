//! The pcap writer's ICRC against real RoCEv2 frames (known answers), and a round trip of
//! frames written from a capture.

use std::path::PathBuf;

use ibcm_host::pcap::{LINKTYPE_ETHERNET, icrc, parse_rocev2, read_pcap, rocev2_frame, write_pcap};
use ibcm_host::{Captured, node_address};

fn vectors_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors");
    assert!(
        dir.is_dir(),
        "the shared test vectors are missing: expected {} (../shared/vectors beside the \
         repository)",
        dir.display()
    );
    dir
}

/// Every `frames/*.hex` of the liteeth vector directories: (path, linktype, bytes).
fn liteeth_frames() -> Vec<(PathBuf, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(vectors_dir())
        .expect("read the vectors dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("liteeth-"))
        })
        .collect();
    dirs.sort();
    for dir in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("frames"))
            .expect("read a frames dir")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "hex"))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read a frame");
            let mut lines = text.lines();
            let first = lines.next().expect("a first line");
            let linktype: u32 = first
                .split_whitespace()
                .find_map(|w| w.strip_prefix("linktype="))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{}: no linktype in {first:?}", f.display()));
            let hex: String = lines.flat_map(|l| l.split_whitespace()).collect();
            let bytes = unhex(&hex).unwrap_or_else(|| panic!("{}: bad hex", f.display()));
            out.push((f, linktype, bytes));
        }
    }
    out
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The ICRC is the zlib CRC-32 (IEEE 802.3, reflected): what `crc32fast` computes.
#[test]
fn crc32_is_zlib() {
    assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32fast::hash(b""), 0);
    let mut c = crc32fast::Hasher::new();
    c.update(b"1234");
    c.update(b"56789");
    assert_eq!(c.finalize(), 0xCBF4_3926);
}

#[test]
fn icrc_of_real_rocev2_frames_matches_the_captured_icrc() {
    let frames = liteeth_frames();
    assert!(
        frames.len() >= 5,
        "expected the liteeth frames (2 + 3), found {}",
        frames.len()
    );
    let mut vlan_seen = false;
    for (path, linktype, bytes) in &frames {
        assert_eq!(*linktype, LINKTYPE_ETHERNET, "{}", path.display());
        let f = parse_rocev2(bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        vlan_seen |= f.vlan.is_some();
        assert_eq!(f.udp_dst, 4791, "{}", path.display());
        assert_eq!(f.dest_qp, 1, "{}", path.display());
        assert_eq!(f.src_qp, 1, "{}", path.display());
        assert_eq!(f.qkey, 0x8001_0000, "{}", path.display());
        assert_eq!(f.payload.len(), 256, "{}", path.display());
        assert!(f.ip_checksum_ok, "{}", path.display());
        assert_eq!(
            f.icrc_computed,
            f.icrc_stored,
            "{}: ICRC computed {:#010x}, captured {:#010x}",
            path.display(),
            f.icrc_computed,
            f.icrc_stored
        );
        // The same through the bare function, from the IPv4 header to the payload's end.
        let ip = &bytes[f.ip_offset..f.ip_offset + usize::from(f.ip_total_len) - 4];
        assert_eq!(icrc(ip), Some(f.icrc_stored), "{}", path.display());
        // One flipped bit anywhere covered changes it.
        let mut bad = ip.to_vec();
        bad[ip.len() - 100] ^= 0x10;
        assert_ne!(icrc(&bad), Some(f.icrc_stored), "{}", path.display());
        // The masked fields do not.
        let mut masked = ip.to_vec();
        masked[1] ^= 0xff; // TOS
        masked[8] = 1; // TTL
        assert_eq!(icrc(&masked), Some(f.icrc_stored), "{}", path.display());
    }
    assert!(vlan_seen, "the liteeth-79c frames carry a VLAN tag");
}

fn captured(from: usize, to: usize, at_ns: u64, fill: u8) -> Captured {
    let mut mad = [fill; 256];
    mad[0] = 1; // base version
    mad[1] = 7; // CM class
    Captured {
        at_ns,
        from: node_address(from),
        to: node_address(to),
        mad,
    }
}

#[test]
fn written_frames_read_back_with_every_header_right() {
    let caps = vec![
        captured(0, 1, 1_000_002_000, 0x11),
        captured(1, 0, 1_000_004_500, 0x22),
        captured(0, 1, 2_000_000_001, 0x33),
    ];
    let mut file = Vec::new();
    write_pcap(&mut file, &caps).unwrap();
    let pcap = read_pcap(&file).unwrap();
    assert_eq!(pcap.linktype, LINKTYPE_ETHERNET);
    assert!(pcap.nanosecond);
    assert_eq!(pcap.packets.len(), 3);
    let mut psn = [0u32; 2];
    for (p, c) in pcap.packets.iter().zip(&caps) {
        assert_eq!(p.ts_ns, c.at_ns);
        assert_eq!(p.orig_len as usize, p.data.len());
        assert_eq!(p.data.len(), 14 + 20 + 8 + 12 + 8 + 256 + 4);
        let f = parse_rocev2(&p.data).unwrap();
        let (s, d) = (c.from.lid, c.to.lid);
        assert_eq!(f.src_mac, [2, 0, 0, 0x4d, 0, s as u8]);
        assert_eq!(f.dst_mac, [2, 0, 0, 0x4d, 0, d as u8]);
        assert_eq!(f.vlan, None);
        assert_eq!(f.src_ip, [10, 77, 0, s as u8]);
        assert_eq!(f.dst_ip, [10, 77, 0, d as u8]);
        assert_eq!((f.ttl, f.ip_id, f.ip_flags_fragment), (64, 0, 0x4000));
        assert!(f.ip_checksum_ok);
        assert_eq!(f.ip_total_len, 308);
        assert_eq!((f.udp_dst, f.udp_len, f.udp_checksum), (4791, 288, 0));
        assert_eq!((f.opcode, f.pkey, f.dest_qp), (0x64, 0xffff, 1));
        let sender = usize::from(s - 1);
        assert_eq!(f.psn, psn[sender]);
        psn[sender] += 1;
        assert_eq!((f.qkey, f.src_qp), (0x8001_0000, 1));
        assert_eq!(f.payload, &c.mad[..]);
        assert!(f.icrc_ok());
    }
    // The frame builder alone agrees with what the file holds.
    assert_eq!(rocev2_frame(&caps[0], 0), pcap.packets[0].data);
}

#[test]
fn a_truncated_or_foreign_file_is_an_error() {
    assert!(read_pcap(&[0u8; 10]).is_err());
    assert!(read_pcap(&[0u8; 24]).is_err());
    let mut file = Vec::new();
    write_pcap(&mut file, &[captured(0, 1, 5, 0)]).unwrap();
    assert!(read_pcap(&file[..file.len() - 1]).is_err());
    let pcap = read_pcap(&file).unwrap();
    assert!(parse_rocev2(&pcap.packets[0].data[..40]).is_err());
}

#[test]
fn a_truncating_capture_reads_back() {
    // What `tcpdump -s 96` writes: snap length 96, each record cut to it, the original
    // length kept. Big-endian, microsecond timestamps.
    let frame = rocev2_frame(&captured(0, 1, 5, 0), 0);
    let mut file = Vec::new();
    for word in [0xa1b2_c3d4u32, 0x0002_0004, 0, 0, 96, 1] {
        file.extend_from_slice(&word.to_be_bytes());
    }
    for word in [7u32, 250, 96, frame.len() as u32] {
        file.extend_from_slice(&word.to_be_bytes());
    }
    file.extend_from_slice(&frame[..96]);
    let pcap = read_pcap(&file).unwrap();
    assert_eq!(pcap.linktype, LINKTYPE_ETHERNET);
    assert!(!pcap.nanosecond);
    assert_eq!(pcap.packets.len(), 1);
    let p = &pcap.packets[0];
    assert_eq!((p.ts_ns, p.orig_len), (7_000_250_000, frame.len() as u32));
    assert_eq!(p.data, frame[..96]);
}
