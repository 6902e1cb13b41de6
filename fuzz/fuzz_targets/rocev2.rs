//! The RoCEv2 port's receive path (`ibcm_host::rocev2::receive_packet`, what the receive
//! thread runs on every packet the raw socket delivers), on arbitrary bytes.
//!
//! The first byte chooses the mode and the fault injection:
//! - bit 0 clear: the rest is the packet, as the raw socket delivers it (IPv4 header
//!   first); the committed corpus holds real frames (shared/vectors/liteeth-*);
//! - bit 0 set: the rest describes a packet that `encode` builds (framing fields and a
//!   MAD), then changes (byte edits, trailing bytes, a cut), and maybe gives a correct
//!   ICRC again, so that the checks behind the ICRC's are reached with a packet whose
//!   ICRC is right;
//! - bits 1-2: fault injection drops that many MADs of the packet's attribute (bit 3: of
//!   another attribute, which must drop nothing).
//!
//! Nothing may panic, and for every packet:
//! - the outcome is what an independent reference decoder says (written here from
//!   IBA Annex A17 and the module's documentation, with its own CRC-32): ignored if not
//!   IPv4/UDP to port 4791 or not to the local address, not-QP1, bad ICRC, dropped by a
//!   fault, or delivered;
//! - exactly the counter of that outcome moved, by one (none for an ignored packet);
//! - the CM is handed a MAD exactly when the packet is delivered, and then the packet's
//!   256 payload bytes, from the packet's source address and P_Key: a packet with a bad
//!   ICRC never reaches the engine;
//! - a delivered packet in the canonical form `encode` writes comes back byte for byte
//!   (but for TOS, TTL and the checksums) from `encode` of what `decode` took out;
//! - the node the MAD reaches (a host node, nobody has opened it: it answers as a CM
//!   with no listens) breaks no verifier rule: no allocation at DISPATCH_LEVEL.
#![no_main]

use std::cell::RefCell;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use arbitrary::{Arbitrary, Unstructured};
use ibcm_host::rocev2::{
    Framing, PACKET_LEN, Received, RoceCounts, RoceFaults, RoceStats, decode, encode,
    receive_packet, roce_address,
};
use ibcm_host::{Clock, Node, Wake, node_guid};
use ibcm_mad::{ClassPortInfo, CmMad, CmMessage, MAD_SIZE, MadHeader, Method};
use libfuzzer_sys::fuzz_target;

include!("asan_options.rs");

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// Inputs a node serves before it is replaced by a fresh one.
const NODE_USES: u32 = 4096;

/// CRC-32 (IEEE 802.3, reflected, as zlib), bit by bit: the reference, not the table or
/// SIMD code the port uses.
fn crc32(chunks: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for chunk in chunks {
        for &b in *chunk {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
    }
    !crc
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// What the reference decoder makes of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Ignored,
    NotQp1,
    BadIcrc,
    /// A QP1 MAD to `dst` from `src` with P_Key `pkey`, at `mad` in the packet.
    Mad {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        pkey: u16,
        mad: usize,
        /// In the form `encode` writes: no IP options, DF, nothing after the ICRC, the
        /// BTH and DETH reserved bits clear.
        canonical: bool,
    },
}

/// The reference decoder.
fn reference(p: &[u8]) -> Expect {
    // IPv4, with room for its header and options, carrying UDP, as long as it says.
    if p.len() < 20 || p[0] >> 4 != 4 {
        return Expect::Ignored;
    }
    let ihl = usize::from(p[0] & 0xf) * 4;
    if ihl < 20 || p.len() < ihl || p[9] != 17 {
        return Expect::Ignored;
    }
    let total = usize::from(be16(p, 2));
    if total < ihl || total > p.len() {
        return Expect::Ignored;
    }
    let pkt = &p[..total];
    if pkt.len() < ihl + 8 || be16(pkt, ihl + 2) != 4791 {
        return Expect::Ignored;
    }
    // BTH (12) + DETH (8), the payload, the ICRC (4).
    let bth = ihl + 8;
    let Some(payload_len) = total.checked_sub(bth + 20 + 4) else {
        return Expect::NotQp1;
    };
    let opcode = pkt[bth];
    // SE, MigReq, PadCnt (2 bits), TVer (4 bits).
    let (pad, tver) = ((pkt[bth + 1] >> 4) & 3, pkt[bth + 1] & 0xf);
    let dest_qp = be32(pkt, bth + 4) & 0x00ff_ffff;
    let qkey = be32(pkt, bth + 12);
    // The UDP length covers the rest of the IP packet (the UDP layer under a RoCE NIC
    // drops a datagram whose length disagrees with its IP packet's); a transport header
    // version other than 0 is dropped (IBA 9.2.1); PadCnt bytes of the payload are pad,
    // and the MAD is all 256 bytes of it: a whole number of words, never padded.
    if usize::from(be16(pkt, ihl + 4)) != total - ihl
        || tver != 0
        || opcode != 0x64
        || dest_qp != 1
        || qkey != 0x8001_0000
        || pad != 0
        || payload_len != MAD_SIZE
    {
        return Expect::NotQp1;
    }
    // The ICRC: 8 bytes of ones, the IPv4 header with TOS, TTL and checksum as ones, the
    // UDP header with its checksum as ones, the BTH with byte 4 as ones, the rest.
    let mut ip = pkt[..ihl].to_vec();
    ip[1] = 0xff;
    ip[8] = 0xff;
    ip[10] = 0xff;
    ip[11] = 0xff;
    let mut udp = pkt[ihl..bth].to_vec();
    udp[6] = 0xff;
    udp[7] = 0xff;
    let mut bth_bytes = pkt[bth..bth + 12].to_vec();
    bth_bytes[4] = 0xff;
    let end = total - 4;
    let computed = crc32(&[&[0xff; 8], &ip, &udp, &bth_bytes, &pkt[bth + 12..end]]);
    let stored = u32::from_le_bytes([pkt[end], pkt[end + 1], pkt[end + 2], pkt[end + 3]]);
    if computed != stored {
        return Expect::BadIcrc;
    }
    let canonical = ihl == 20
        && p.len() == total
        && total == PACKET_LEN
        && be16(pkt, 6) == 0x4000
        && pkt[bth + 1] & !0x40 == 0
        && pkt[bth + 4] == 0
        && pkt[bth + 8] & 0x7f == 0
        && be32(pkt, bth + 16) == 1;
    Expect::Mad {
        src: Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]),
        dst: Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]),
        pkey: be16(pkt, bth + 2),
        mad: bth + 20,
        canonical,
    }
}

/// The reference ICRC of a packet long enough to have one, put in place.
fn fix_icrc(p: &mut [u8]) {
    if p.len() < 20 {
        return;
    }
    let ihl = usize::from(p[0] & 0xf) * 4;
    let total = usize::from(be16(p, 2));
    if ihl < 20 || total > p.len() || total < ihl + 8 + 12 + 4 {
        return;
    }
    let bth = ihl + 8;
    let mut ip = p[..ihl].to_vec();
    ip[1] = 0xff;
    ip[8] = 0xff;
    ip[10] = 0xff;
    ip[11] = 0xff;
    let mut udp = p[ihl..bth].to_vec();
    udp[6] = 0xff;
    udp[7] = 0xff;
    let mut bth_bytes = p[bth..bth + 12].to_vec();
    bth_bytes[4] = 0xff;
    let end = total - 4;
    let crc = crc32(&[&[0xff; 8], &ip, &udp, &bth_bytes, &p[bth + 12..end]]);
    p[end..total].copy_from_slice(&crc.to_le_bytes());
}

#[derive(Arbitrary, Debug)]
enum MadIn {
    /// A ClassPortInfo Get or GetResp.
    Cpi { tid: u64, get: bool },
    /// These bytes, zero-padded or cut to 256.
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Built {
    to_local: bool,
    src: Option<[u8; 4]>,
    ip_id: u16,
    udp_src: u16,
    pkey: u16,
    psn: u32,
    ack_req: bool,
    mig_req: bool,
    mad: MadIn,
    /// (offset, xor) applied to the packet.
    edits: Vec<(u16, u8)>,
    /// Bytes appended after the packet.
    tail: Vec<u8>,
    /// Cut the packet to this many bytes.
    cut: Option<u16>,
    /// Put a correct ICRC back after the edits.
    fix: bool,
}

fn build(b: &Built) -> Vec<u8> {
    let mut mad = [0u8; MAD_SIZE];
    match &b.mad {
        MadIn::Cpi { tid, get } => {
            let m = CmMad {
                header: MadHeader {
                    method: if *get { Method::Get } else { Method::GetResp },
                    ..MadHeader::send(*tid)
                },
                message: CmMessage::ClassPortInfo(ClassPortInfo::default()),
            };
            let _ = m.emit(&mut mad);
        }
        MadIn::Bytes(bytes) => {
            for (d, s) in mad.iter_mut().zip(bytes) {
                *d = *s;
            }
        }
    }
    let framing = Framing {
        src: b.src.map_or(PEER, Ipv4Addr::from),
        dst: if b.to_local {
            LOCAL
        } else {
            Ipv4Addr::new(10, 0, 0, 3)
        },
        ip_id: b.ip_id,
        udp_src: b.udp_src,
        pkey: b.pkey,
        psn: b.psn,
        ack_req: b.ack_req,
        mig_req: b.mig_req,
    };
    let Some(packet) = encode(&framing, &mad) else {
        panic!("encode refused {framing:?}");
    };
    // What `encode` writes, the reference takes as a canonical QP1 MAD.
    match reference(&packet) {
        Expect::Mad {
            canonical: true,
            src,
            dst,
            pkey,
            ..
        } => assert_eq!((src, dst, pkey), (framing.src, framing.dst, framing.pkey)),
        other => panic!("encode wrote a packet the reference takes as {other:?}"),
    }
    let mut p = packet.to_vec();
    for &(at, x) in &b.edits {
        let n = p.len();
        p[usize::from(at) % n] ^= x;
    }
    p.extend_from_slice(&b.tail);
    if let Some(cut) = b.cut {
        p.truncate(usize::from(cut));
    }
    if b.fix {
        fix_icrc(&mut p);
    }
    p
}

fn fresh_node() -> Node {
    let clock = Arc::new(Clock::virtual_at(1_000_000));
    let config = ibcm_cep::CmConfig::new(node_guid(7), [7; 32]);
    Node::new(
        config,
        roce_address(LOCAL, 0xffff),
        clock,
        Arc::new(Wake::default()),
    )
}

thread_local! {
    static NODE: RefCell<Option<(Node, u32)>> = const { RefCell::new(None) };
}

fn delta(before: &RoceCounts, after: &RoceCounts) -> [u64; 8] {
    let f = |c: &RoceCounts| {
        [
            c.sent,
            c.send_errors,
            c.refused,
            c.received,
            c.bad_icrc,
            c.not_qp1,
            c.fault_tx,
            c.fault_rx,
        ]
    };
    let (a, b) = (f(before), f(after));
    core::array::from_fn(|i| b[i] - a[i])
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let packet = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let Ok(b) = Built::arbitrary_take_rest(Unstructured::new(rest)) else {
            return;
        };
        build(&b)
    };
    let expect = reference(&packet);

    // Fault injection: on the packet's attribute (or another one).
    let attribute = match expect {
        Expect::Mad { mad, .. } => be16(&packet, mad + 16),
        _ => 0x0010,
    };
    let drops = u32::from((mode >> 1) & 3);
    let faulted_attribute = if mode & 8 == 0 {
        attribute
    } else {
        attribute ^ 0x8000
    };
    let faults = Mutex::new(RoceFaults {
        drop_tx: Vec::new(),
        drop_rx: vec![(faulted_attribute, drops)],
    });
    let fault_hits = drops > 0 && faulted_attribute == attribute;

    let stats = RoceStats::default();
    NODE.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(_, uses)| *uses >= NODE_USES) {
            *cell = Some((fresh_node(), 0));
        }
        let (node, uses) = cell.as_mut().expect("a node");
        *uses += 1;

        let before = stats.counts();
        let mut handed = None;
        let got = receive_packet(&packet, LOCAL, &stats, &faults, |src, mad| {
            handed = Some((*src, mad.to_vec()));
            node.receive(src, mad);
        });
        let moved = delta(&before, &stats.counts());
        // The counter of each outcome: received, bad_icrc, not_qp1, fault_rx.
        let mut want = [0u64; 8];
        let outcome = match expect {
            Expect::Ignored => Received::Ignored,
            Expect::NotQp1 => {
                want[5] = 1;
                Received::NotQp1
            }
            Expect::BadIcrc => {
                want[4] = 1;
                Received::BadIcrc
            }
            Expect::Mad { dst, .. } if dst != LOCAL => Received::Ignored,
            Expect::Mad { .. } if fault_hits => {
                want[7] = 1;
                Received::Faulted
            }
            Expect::Mad { .. } => {
                want[3] = 1;
                Received::Delivered
            }
        };
        assert_eq!(got, outcome, "reference says {expect:?} for {packet:02x?}");
        assert_eq!(moved, want, "counters moved {moved:?} for {got:?}");
        match (got, expect, &handed) {
            (Received::Delivered, Expect::Mad { src, pkey, mad, .. }, Some((from, bytes))) => {
                assert_eq!(*from, roce_address(src, pkey), "reply address");
                assert_eq!(bytes[..], packet[mad..mad + MAD_SIZE], "the MAD handed up");
            }
            (Received::Delivered, _, _) => panic!("delivered, but the CM got {handed:?}"),
            (_, _, None) => {}
            (_, _, Some(_)) => panic!("{got:?}, yet the CM was handed a MAD"),
        }
        if let Expect::Mad {
            canonical: true, ..
        } = expect
        {
            let d = decode(&packet).expect("a canonical packet decodes");
            let again = encode(&d.framing, d.mad).expect("encodes");
            for (i, (a, b)) in again.iter().zip(&packet).enumerate() {
                if ![1, 8, 10, 11, 26, 27].contains(&i) {
                    assert_eq!(a, b, "byte {i} differs after decode and encode");
                }
            }
        }
        // What the engine answered is not for this test; the outbox is emptied so that
        // it does not grow.
        let sent = node.platform.take_sent();
        for t in &sent {
            assert!(
                CmMad::parse(&t.mad).is_ok(),
                "the node sent a MAD that does not parse"
            );
        }
        node.platform.recycle_sent(sent);
        let v = node.violations();
        assert!(v.is_empty(), "the node broke verifier rules: {v:?}");
    });
});
