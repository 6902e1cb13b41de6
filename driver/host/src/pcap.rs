//! Captured CM MADs as RoCEv2 frames in a classic pcap file (linktype 1, Ethernet), so a
//! run on the simulated fabric can be read with Wireshark or tshark.
//!
//! Each MAD becomes Ethernet / the RoCEv2 packet of [`crate::wire`] (IPv4 / UDP port 4791
//! / BTH / DETH / the 256-byte MAD / ICRC), with IP ID 0 and no UDP checksum. Node
//! addresses are derived from the LID: MAC `02:00:00:4d:hi:lo`, IPv4 `10.77.hi.lo` (node
//! `i` has LID `i + 1`, so `10.77.0.(i+1)`).
//!
//! The file format is pcap-file's, the Ethernet and VLAN headers etherparse's.
//! [`read_pcap`] and [`parse_rocev2`] read such files back (and real captures: a VLAN
//! tag is skipped), for tests.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::time::Duration;

use etherparse::{EtherType, Ethernet2Header, Ethernet2HeaderSlice, SingleVlanHeaderSlice};
use pcap_file::pcap::{PcapHeader, PcapParser, PcapWriter};
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};

use crate::fabric::Captured;
use crate::wire::{self, Framing, NotUdp, PACKET_LEN};
pub use crate::wire::{
    BTH_UD_SEND_ONLY, DEFAULT_PKEY, QP1_QKEY, ROCEV2_PORT, TTL, icrc, ipv4_checksum,
};

/// pcap linktype of Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;

/// The MAC address written for the node with `lid` (locally administered).
pub fn node_mac(lid: u16) -> [u8; 6] {
    let [hi, lo] = lid.to_be_bytes();
    [0x02, 0x00, 0x00, 0x4d, hi, lo]
}

/// The IPv4 address written for the node with `lid`: `10.77.hi.lo`.
pub fn node_ipv4(lid: u16) -> [u8; 4] {
    let [hi, lo] = lid.to_be_bytes();
    [10, 77, hi, lo]
}

/// The UDP source port written for the node with `lid` (RoCEv2 leaves it to the sender;
/// replies go to 4791 whatever it is).
pub fn udp_source_port(lid: u16) -> u16 {
    0xc000 | (lid & 0x3fff)
}

/// Ethernet header.
const ETH_LEN: usize = Ethernet2Header::LEN;

/// One captured MAD as a RoCEv2 frame (no FCS), with `psn` in its BTH.
pub fn rocev2_frame(captured: &Captured, psn: u32) -> Vec<u8> {
    let (src, dst) = (captured.from.lid, captured.to.lid);
    let eth = Ethernet2Header {
        source: node_mac(src),
        destination: node_mac(dst),
        ether_type: EtherType::IPV4,
    };
    let framing = Framing {
        src: Ipv4Addr::from(node_ipv4(src)),
        dst: Ipv4Addr::from(node_ipv4(dst)),
        ip_id: 0,
        udp_src: udp_source_port(src),
        pkey: captured.from.pkey,
        psn,
        ack_req: false,
        mig_req: false,
    };
    let mut f = vec![0u8; ETH_LEN + PACKET_LEN];
    let (eth_out, packet) = f.split_at_mut(ETH_LEN);
    eth_out.copy_from_slice(&eth.to_bytes());
    // A captured MAD is always MAD_SIZE bytes, so the packet is always built.
    let _ = wire::write_packet(&framing, &captured.mad, false, packet);
    f
}

/// Writes `captured` as a classic pcap file (nanosecond timestamps, little-endian,
/// linktype Ethernet), one RoCEv2 frame per MAD; each sender's PSNs count up from 0.
pub fn write_pcap<W: Write>(out: W, captured: &[Captured]) -> io::Result<()> {
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ts_resolution: TsResolution::NanoSecond,
        endianness: Endianness::Little,
        ..PcapHeader::default()
    };
    let mut writer = PcapWriter::with_header(out, header).map_err(io_error)?;
    let mut psns: std::collections::HashMap<u16, u32> = std::collections::HashMap::new();
    for c in captured {
        let psn = psns.entry(c.from.lid).or_insert(0);
        let frame = rocev2_frame(c, *psn);
        *psn = (*psn + 1) & 0x00ff_ffff;
        let packet = pcap_file::pcap::PcapPacket::new(
            Duration::from_nanos(c.at_ns),
            frame.len() as u32,
            &frame,
        );
        writer.write_packet(&packet).map_err(io_error)?;
    }
    writer.into_writer().flush()
}

fn io_error(e: PcapError) -> io::Error {
    match e {
        PcapError::IoError(e) => e,
        e => io::Error::new(io::ErrorKind::InvalidInput, e),
    }
}

/// Why a pcap file or a frame could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The bytes end before `what`.
    Truncated {
        /// What was being read.
        what: &'static str,
    },
    /// Not a classic pcap file.
    BadMagic(u32),
    /// A field that must have a fixed value does not.
    Unexpected {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { what } => write!(f, "truncated {what}"),
            Self::BadMagic(m) => write!(f, "not a classic pcap file (magic {m:#010x})"),
            Self::Unexpected { field, value } => write!(f, "unexpected {field} {value:#x}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// One record of a pcap file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcapPacket {
    /// Timestamp, ns.
    pub ts_ns: u64,
    /// Length on the wire.
    pub orig_len: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
}

/// A pcap file read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pcap {
    /// The linktype.
    pub linktype: u32,
    /// Whether timestamps had nanosecond resolution.
    pub nanosecond: bool,
    /// The records.
    pub packets: Vec<PcapPacket>,
}

/// Reads a classic pcap file (either byte order, micro- or nanosecond timestamps).
pub fn read_pcap(bytes: &[u8]) -> Result<Pcap, FrameError> {
    let (mut rest, parser) = PcapParser::new(bytes).map_err(|e| match e {
        PcapError::IncompleteBuffer => FrameError::Truncated {
            what: "pcap header",
        },
        _ => FrameError::BadMagic(u32::from_le_bytes(
            bytes
                .get(..4)
                .and_then(|m| m.try_into().ok())
                .unwrap_or_default(),
        )),
    })?;
    let header = parser.header();
    let nanosecond = header.ts_resolution == TsResolution::NanoSecond;
    let mut packets = Vec::new();
    while !rest.is_empty() {
        // The raw record, unvalidated: pcap-file's checked record refuses an original
        // length above the snap length, which is what a truncating capture (`-s 96`)
        // writes.
        let (next, raw) = parser
            .next_raw_packet(rest)
            .map_err(|_| FrameError::Truncated { what: "record" })?;
        let frac = u64::from(raw.ts_frac) * if nanosecond { 1 } else { 1_000 };
        packets.push(PcapPacket {
            ts_ns: u64::from(raw.ts_sec) * 1_000_000_000 + frac,
            orig_len: raw.orig_len,
            data: Cow::into_owned(raw.data),
        });
        rest = next;
    }
    Ok(Pcap {
        linktype: header.datalink.into(),
        nanosecond,
        packets,
    })
}

/// A RoCEv2 frame taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoceFrame<'a> {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// The VLAN tag's TCI, if the frame has one.
    pub vlan: Option<u16>,
    /// Offset of the IPv4 header in the frame.
    pub ip_offset: usize,
    /// The IPv4 header (with options).
    pub ip_header: &'a [u8],
    /// IPv4 total length.
    pub ip_total_len: u16,
    /// IPv4 identification.
    pub ip_id: u16,
    /// IPv4 flags and fragment offset.
    pub ip_flags_fragment: u16,
    /// TTL.
    pub ttl: u8,
    /// Source address.
    pub src_ip: [u8; 4],
    /// Destination address.
    pub dst_ip: [u8; 4],
    /// Whether the IPv4 header checksum is right.
    pub ip_checksum_ok: bool,
    /// UDP source port.
    pub udp_src: u16,
    /// UDP destination port.
    pub udp_dst: u16,
    /// UDP length.
    pub udp_len: u16,
    /// UDP checksum.
    pub udp_checksum: u16,
    /// BTH opcode.
    pub opcode: u8,
    /// BTH byte 1 (SE, M, PadCnt, TVer).
    pub bth_flags: u8,
    /// P_Key.
    pub pkey: u16,
    /// Destination QP.
    pub dest_qp: u32,
    /// PSN.
    pub psn: u32,
    /// DETH Q_Key.
    pub qkey: u32,
    /// DETH source QP.
    pub src_qp: u32,
    /// What follows the DETH, up to the ICRC (the MAD).
    pub payload: &'a [u8],
    /// The ICRC in the frame.
    pub icrc_stored: u32,
    /// The ICRC computed over the frame.
    pub icrc_computed: u32,
}

impl RoceFrame<'_> {
    /// Whether the stored ICRC is the computed one.
    pub fn icrc_ok(&self) -> bool {
        self.icrc_stored == self.icrc_computed
    }
}

/// Takes an Ethernet frame (no FCS) carrying RoCEv2 over IPv4 apart, a VLAN tag allowed;
/// the UD BTH + DETH layout is assumed (what QP1 uses).
pub fn parse_rocev2(frame: &[u8]) -> Result<RoceFrame<'_>, FrameError> {
    let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|_| FrameError::Truncated {
        what: "Ethernet header",
    })?;
    let mut ethertype = eth.ether_type();
    let mut ip_offset = eth.slice().len();
    let mut vlan = None;
    if ethertype == EtherType::VLAN_TAGGED_FRAME {
        let tag = SingleVlanHeaderSlice::from_slice(frame.get(ip_offset..).unwrap_or_default())
            .map_err(|_| FrameError::Truncated { what: "VLAN tag" })?;
        let tci = tag.slice().get(..2).and_then(|t| t.try_into().ok());
        vlan = tci.map(u16::from_be_bytes);
        ethertype = tag.ether_type();
        ip_offset += tag.slice().len();
    }
    if ethertype != EtherType::IPV4 {
        return Err(FrameError::Unexpected {
            field: "ethertype",
            value: ethertype.0.into(),
        });
    }
    let p = wire::udp_in_ipv4(frame.get(ip_offset..).unwrap_or_default()).map_err(|e| match e {
        NotUdp::Truncated(what) => FrameError::Truncated { what },
        NotUdp::NotIpv4(vihl) => FrameError::Unexpected {
            field: "IPv4 version/IHL",
            value: vihl.into(),
        },
        NotUdp::Protocol(protocol) => FrameError::Unexpected {
            field: "IP protocol",
            value: protocol.into(),
        },
    })?;
    let t = p.ud_transport().ok_or(FrameError::Truncated {
        what: "RoCEv2 packet",
    })?;
    let (bth, deth) = (&t.headers.bth, &t.headers.deth);
    let ip_header = p.ip.slice();
    Ok(RoceFrame {
        dst_mac: eth.destination(),
        src_mac: eth.source(),
        vlan,
        ip_offset,
        ip_header,
        ip_total_len: p.ip.total_len(),
        ip_id: p.ip.identification(),
        ip_flags_fragment: u16::from_be_bytes([ip_header[6], ip_header[7]]),
        ttl: p.ip.ttl(),
        src_ip: p.ip.source(),
        dst_ip: p.ip.destination(),
        ip_checksum_ok: ipv4_checksum(ip_header) == 0,
        udp_src: p.udp.source_port(),
        udp_dst: p.udp.destination_port(),
        udp_len: p.udp.length(),
        udp_checksum: p.udp.checksum(),
        opcode: bth.opcode,
        bth_flags: bth.flags,
        pkey: bth.pkey.get(),
        dest_qp: bth.dest_qp.get() & 0x00ff_ffff,
        psn: bth.psn.get() & 0x00ff_ffff,
        qkey: deth.qkey.get(),
        src_qp: deth.src_qp.get() & 0x00ff_ffff,
        payload: t.payload,
        icrc_stored: t.icrc_stored,
        icrc_computed: t.icrc_computed,
    })
}
