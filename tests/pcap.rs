//! `--pcap`: a small exchange on the simulated fabric with capture on, written as a pcap
//! file of RoCEv2 frames, read back, and every frame's headers and ICRC checked.

use std::collections::HashMap;

use ibcm_cli::cmtime;
use ibcm_cli::sim::{Sim, SimOptions};
use ibcm_host::pcap::{LINKTYPE_ETHERNET, node_ipv4, node_mac, parse_rocev2, read_pcap};

#[test]
fn a_captured_exchange_reads_back_as_valid_rocev2_frames() {
    let sim = Sim::start(&SimOptions {
        capture: true,
        real_time: false,
        ..SimOptions::default()
    });
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let cfg = cmtime::Config {
        connections: 20,
        ..cmtime::Config::default()
    };
    let report = cmtime::run(&client, &server, &sim, &cfg, &|_| {}).unwrap();
    assert_eq!(report.established, 20);
    drop((client, server));

    let path = std::env::temp_dir().join(format!("ibcm-pcap-test-{}.pcap", std::process::id()));
    let written = sim.write_pcap(&path).expect("write the pcap");
    let bytes = std::fs::read(&path).expect("read it back");
    let _ = std::fs::remove_file(&path);
    // REQ, REP, RTU, DREQ, DREP per connection.
    assert_eq!(written, 5 * 20);
    assert_eq!(written, sim.captured());

    let pcap = read_pcap(&bytes).expect("a classic pcap file");
    assert_eq!(pcap.linktype, LINKTYPE_ETHERNET);
    assert_eq!(pcap.packets.len(), written);
    let mut next_psn: HashMap<[u8; 4], u32> = HashMap::new();
    let mut attributes: HashMap<u16, usize> = HashMap::new();
    let mut last_ts = 0;
    for (k, p) in pcap.packets.iter().enumerate() {
        assert!(p.ts_ns >= last_ts, "frame {k}: timestamps in order");
        last_ts = p.ts_ns;
        assert_eq!(p.orig_len as usize, p.data.len(), "frame {k}");
        let f = parse_rocev2(&p.data).unwrap_or_else(|e| panic!("frame {k}: {e}"));
        // Ethernet: MACs of the two nodes, IPv4, no VLAN.
        assert_eq!(f.vlan, None, "frame {k}");
        let (src_lid, dst_lid) = (
            u16::from_be_bytes([f.src_ip[2], f.src_ip[3]]),
            u16::from_be_bytes([f.dst_ip[2], f.dst_ip[3]]),
        );
        assert!(
            [(1, 2), (2, 1)].contains(&(src_lid, dst_lid)),
            "frame {k}: {src_lid} -> {dst_lid}"
        );
        assert_eq!(f.src_mac, node_mac(src_lid), "frame {k}");
        assert_eq!(f.dst_mac, node_mac(dst_lid), "frame {k}");
        // IPv4: 10.77.0.x, TTL 64, DF, ID 0, a correct header checksum.
        assert_eq!(f.src_ip, node_ipv4(src_lid), "frame {k}");
        assert_eq!(f.ip_header.len(), 20, "frame {k}");
        assert_eq!(
            (f.ttl, f.ip_id, f.ip_flags_fragment),
            (64, 0, 0x4000),
            "frame {k}"
        );
        assert!(f.ip_checksum_ok, "frame {k}");
        assert_eq!(usize::from(f.ip_total_len), p.data.len() - 14, "frame {k}");
        // UDP to 4791, no checksum.
        assert_eq!(f.udp_dst, 4791, "frame {k}");
        assert_eq!(usize::from(f.udp_len), p.data.len() - 14 - 20, "frame {k}");
        assert_eq!(f.udp_checksum, 0, "frame {k}");
        // BTH: UD SEND_ONLY to QP1 on the default partition, PSNs counting per sender.
        assert_eq!(
            (f.opcode, f.pkey, f.dest_qp),
            (0x64, 0xffff, 1),
            "frame {k}"
        );
        let psn = next_psn.entry(f.src_ip).or_insert(0);
        assert_eq!(f.psn, *psn, "frame {k}");
        *psn += 1;
        // DETH: the QP1 Q_Key, from QP1.
        assert_eq!((f.qkey, f.src_qp), (0x8001_0000, 1), "frame {k}");
        // A 256-byte CM MAD (base version 1, class 0x07, class version 2).
        assert_eq!(f.payload.len(), 256, "frame {k}");
        assert_eq!(&f.payload[..3], &[1, 7, 2], "frame {k}");
        *attributes
            .entry(u16::from_be_bytes([f.payload[16], f.payload[17]]))
            .or_default() += 1;
        // ICRC over the frame as written.
        assert!(
            f.icrc_ok(),
            "frame {k}: ICRC {:#010x}, expected {:#010x}",
            f.icrc_stored,
            f.icrc_computed
        );
    }
    // Every message of the exchange is there: REQ, REP, RTU, DREQ, DREP.
    for attr in [0x10, 0x13, 0x14, 0x15, 0x16] {
        assert_eq!(attributes.get(&attr), Some(&20), "attribute {attr:#x}");
    }
}
