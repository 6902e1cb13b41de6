//! Captured CM MADs as RoCEv2 frames in a classic pcap file (linktype 1, Ethernet), so a
//! run on the simulated fabric can be read with Wireshark or tshark.
//!
//! Each MAD becomes Ethernet / IPv4 / UDP (port 4791) / BTH (UD SEND_ONLY to QP1) / DETH
//! (the QP1 Q_Key, source QP1) / the 256-byte MAD / ICRC, with the ICRC computed exactly as
//! a RoCEv2 receiver checks it (IBA Annex A17; rxe `rxe_icrc.c`): CRC-32 over 8 bytes of
//! ones, then the IPv4 header with TOS, TTL and checksum set to ones, the UDP header with
//! its checksum set to ones, the BTH with its reserved byte 4 set to ones, then DETH and
//! payload; stored little-endian. Node addresses are derived from the LID: MAC
//! `02:00:00:4d:hi:lo`, IPv4 `10.77.hi.lo` (node `i` has LID `i + 1`, so `10.77.0.(i+1)`).
//!
//! [`read_pcap`] and [`parse_rocev2`] read such files back (and real captures: a VLAN
//! tag is skipped), for tests.

use std::fmt;
use std::io::{self, Write};

use crate::fabric::Captured;

/// The RoCEv2 UDP destination port.
pub const ROCEV2_PORT: u16 = 4791;
/// pcap linktype of Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// BTH opcode of a UD SEND_ONLY.
pub const BTH_UD_SEND_ONLY: u8 = 0x64;
/// The Q_Key of QP1 (the GSI).
pub const QP1_QKEY: u32 = 0x8001_0000;
/// The default partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// TTL of the frames written.
pub const TTL: u8 = 64;

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const IPV4_LEN: usize = 20;
const UDP_LEN: usize = 8;
const BTH_LEN: usize = 12;
const DETH_LEN: usize = 8;
const ICRC_LEN: usize = 4;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_VLAN: u16 = 0x8100;
/// Classic pcap magic with microsecond timestamps.
const MAGIC_US: u32 = 0xa1b2_c3d4;
/// Classic pcap magic with nanosecond timestamps (what [`write_pcap`] writes).
const MAGIC_NS: u32 = 0xa1b2_3c4d;

/// The CRC-32 table of the zlib (IEEE 802.3, reflected 0xEDB88320) polynomial.
const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// A running CRC-32 (zlib): start with [`Crc32::new`], feed bytes, then [`Crc32::finish`].
#[derive(Debug, Clone, Copy)]
pub struct Crc32(u32);

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    /// A CRC over no bytes yet.
    pub const fn new() -> Self {
        Self(0xFFFF_FFFF)
    }

    /// Feeds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        let mut c = self.0;
        for &b in bytes {
            let i = usize::from((c as u8) ^ b);
            c = CRC_TABLE.get(i).copied().unwrap_or(0) ^ (c >> 8);
        }
        self.0 = c;
    }

    /// The CRC of everything fed.
    pub const fn finish(self) -> u32 {
        !self.0
    }
}

/// The zlib CRC-32 of `bytes` (`crc32(b"123456789") == 0xCBF43926`).
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(bytes);
    c.finish()
}

/// The ICRC of a RoCEv2 packet: `packet` runs from the first byte of the IPv4 header to
/// the end of the payload (the ICRC itself excluded). `None` if it is not IPv4/UDP with
/// room for a BTH.
pub fn icrc(packet: &[u8]) -> Option<u32> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    if packet.first()? >> 4 != 4 || ihl < IPV4_LEN || packet.len() < ihl + UDP_LEN + BTH_LEN {
        return None;
    }
    let mut crc = Crc32::new();
    crc.update(&[0xff; 8]);
    let mut ip = [0u8; 60];
    let ip = ip.get_mut(..ihl)?;
    ip.copy_from_slice(packet.get(..ihl)?);
    ip[1] = 0xff; // TOS
    ip[8] = 0xff; // TTL
    ip[10] = 0xff; // header checksum
    ip[11] = 0xff;
    crc.update(ip);
    let mut udp = [0u8; UDP_LEN];
    udp.copy_from_slice(packet.get(ihl..ihl + UDP_LEN)?);
    udp[6] = 0xff; // checksum
    udp[7] = 0xff;
    crc.update(&udp);
    let mut bth = [0u8; BTH_LEN];
    let b = ihl + UDP_LEN;
    bth.copy_from_slice(packet.get(b..b + BTH_LEN)?);
    bth[4] = 0xff; // reserved byte before the destination QP
    crc.update(&bth);
    crc.update(packet.get(b + BTH_LEN..)?);
    Some(crc.finish())
}

/// The IPv4 header checksum of `header` (with its checksum field as it is: zero it to
/// compute, leave it to check: a correct header sums to 0).
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum = 0u32;
    for pair in header.chunks(2) {
        let hi = u32::from(pair.first().copied().unwrap_or(0));
        let lo = u32::from(pair.get(1).copied().unwrap_or(0));
        sum += (hi << 8) | lo;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

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

/// One captured MAD as a RoCEv2 frame (no FCS), with `psn` in its BTH.
pub fn rocev2_frame(captured: &Captured, psn: u32) -> Vec<u8> {
    let (src, dst) = (captured.from.lid, captured.to.lid);
    let payload = captured.mad.len();
    let udp_len = UDP_LEN + BTH_LEN + DETH_LEN + payload + ICRC_LEN;
    let ip_len = IPV4_LEN + udp_len;
    let mut f = Vec::with_capacity(ETH_LEN + ip_len);
    f.extend_from_slice(&node_mac(dst));
    f.extend_from_slice(&node_mac(src));
    f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip_start = f.len();
    f.extend_from_slice(&[0x45, 0x00]);
    f.extend_from_slice(&(ip_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0x00, TTL, 17, 0, 0]); // ID 0, DF, UDP
    f.extend_from_slice(&node_ipv4(src));
    f.extend_from_slice(&node_ipv4(dst));
    let sum = ipv4_checksum(f.get(ip_start..).unwrap_or(&[]));
    if let Some(c) = f.get_mut(ip_start + 10..ip_start + 12) {
        c.copy_from_slice(&sum.to_be_bytes());
    }
    f.extend_from_slice(&udp_source_port(src).to_be_bytes());
    f.extend_from_slice(&ROCEV2_PORT.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    // BTH: opcode, SE/M/PadCnt/TVer, P_Key, reserved, dest QP, AckReq/reserved, PSN.
    f.extend_from_slice(&[BTH_UD_SEND_ONLY, 0x00]);
    f.extend_from_slice(&captured.from.pkey.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1]);
    f.extend_from_slice(&(psn & 0x00ff_ffff).to_be_bytes());
    // DETH: Q_Key, reserved, source QP.
    f.extend_from_slice(&QP1_QKEY.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1]);
    f.extend_from_slice(&captured.mad);
    let crc = icrc(f.get(ip_start..).unwrap_or(&[])).unwrap_or(0);
    f.extend_from_slice(&crc.to_le_bytes());
    f
}

/// Writes `captured` as a classic pcap file (nanosecond timestamps, linktype Ethernet),
/// one RoCEv2 frame per MAD; each sender's PSNs count up from 0.
pub fn write_pcap<W: Write>(mut out: W, captured: &[Captured]) -> io::Result<()> {
    let mut header = Vec::with_capacity(24);
    header.extend_from_slice(&MAGIC_NS.to_le_bytes());
    header.extend_from_slice(&2u16.to_le_bytes());
    header.extend_from_slice(&4u16.to_le_bytes());
    header.extend_from_slice(&0i32.to_le_bytes()); // thiszone
    header.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
    header.extend_from_slice(&65_535u32.to_le_bytes()); // snaplen
    header.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    out.write_all(&header)?;
    let mut psns: std::collections::HashMap<u16, u32> = std::collections::HashMap::new();
    for c in captured {
        let psn = psns.entry(c.from.lid).or_insert(0);
        let frame = rocev2_frame(c, *psn);
        *psn = (*psn + 1) & 0x00ff_ffff;
        let mut record = Vec::with_capacity(16 + frame.len());
        record.extend_from_slice(&((c.at_ns / 1_000_000_000) as u32).to_le_bytes());
        record.extend_from_slice(&((c.at_ns % 1_000_000_000) as u32).to_le_bytes());
        record.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        record.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        record.extend_from_slice(&frame);
        out.write_all(&record)?;
    }
    out.flush()
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

fn take<'a>(
    bytes: &'a [u8],
    at: usize,
    n: usize,
    what: &'static str,
) -> Result<&'a [u8], FrameError> {
    bytes
        .get(at..at.saturating_add(n))
        .ok_or(FrameError::Truncated { what })
}

fn u16_be(b: &[u8], at: usize, what: &'static str) -> Result<u16, FrameError> {
    let s = take(b, at, 2, what)?;
    Ok(u16::from_be_bytes([s[0], s[1]]))
}

fn u32_be(b: &[u8], at: usize, what: &'static str) -> Result<u32, FrameError> {
    let s = take(b, at, 4, what)?;
    Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

/// Reads a classic pcap file (either byte order, micro- or nanosecond timestamps).
pub fn read_pcap(bytes: &[u8]) -> Result<Pcap, FrameError> {
    let head = take(bytes, 0, 24, "pcap header")?;
    let word = |s: &[u8], big: bool| {
        let a = [s[0], s[1], s[2], s[3]];
        if big {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    };
    let magic = word(head, false);
    let (big, nanosecond) = match magic {
        MAGIC_US => (false, false),
        MAGIC_NS => (false, true),
        m if m.swap_bytes() == MAGIC_US => (true, false),
        m if m.swap_bytes() == MAGIC_NS => (true, true),
        m => return Err(FrameError::BadMagic(m)),
    };
    let linktype = word(take(head, 20, 4, "pcap header")?, big);
    let mut packets = Vec::new();
    let mut at = 24;
    while at < bytes.len() {
        let rec = take(bytes, at, 16, "record header")?;
        let sec = u64::from(word(rec, big));
        let frac = u64::from(word(take(rec, 4, 4, "record header")?, big));
        let incl = word(take(rec, 8, 4, "record header")?, big) as usize;
        let orig_len = word(take(rec, 12, 4, "record header")?, big);
        let data = take(bytes, at + 16, incl, "record")?.to_vec();
        let ts_ns = sec * 1_000_000_000 + if nanosecond { frac } else { frac * 1_000 };
        packets.push(PcapPacket {
            ts_ns,
            orig_len,
            data,
        });
        at += 16 + incl;
    }
    Ok(Pcap {
        linktype,
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
    let eth = take(frame, 0, ETH_LEN, "Ethernet header")?;
    let mut dst_mac = [0u8; 6];
    let mut src_mac = [0u8; 6];
    dst_mac.copy_from_slice(&eth[..6]);
    src_mac.copy_from_slice(&eth[6..12]);
    let mut ethertype = u16_be(frame, 12, "ethertype")?;
    let mut at = ETH_LEN;
    let mut vlan = None;
    if ethertype == ETHERTYPE_VLAN {
        vlan = Some(u16_be(frame, at, "VLAN tag")?);
        ethertype = u16_be(frame, at + 2, "VLAN tag")?;
        at += VLAN_LEN;
    }
    if ethertype != ETHERTYPE_IPV4 {
        return Err(FrameError::Unexpected {
            field: "ethertype",
            value: ethertype.into(),
        });
    }
    let ip_offset = at;
    let vihl = take(frame, at, 1, "IPv4 header")?[0];
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < IPV4_LEN {
        return Err(FrameError::Unexpected {
            field: "IPv4 version/IHL",
            value: vihl.into(),
        });
    }
    let ip_header = take(frame, at, ihl, "IPv4 header")?;
    let ip_total_len = u16_be(ip_header, 2, "IPv4 header")?;
    let protocol = ip_header[9];
    if protocol != 17 {
        return Err(FrameError::Unexpected {
            field: "IP protocol",
            value: protocol.into(),
        });
    }
    let ip_end = at + usize::from(ip_total_len);
    let packet = take(frame, at, usize::from(ip_total_len), "IPv4 packet")?;
    if usize::from(ip_total_len) < ihl + UDP_LEN + BTH_LEN + DETH_LEN + ICRC_LEN {
        return Err(FrameError::Truncated {
            what: "RoCEv2 packet",
        });
    }
    let mut src_ip = [0u8; 4];
    let mut dst_ip = [0u8; 4];
    src_ip.copy_from_slice(&ip_header[12..16]);
    dst_ip.copy_from_slice(&ip_header[16..20]);
    let u = at + ihl;
    let b = u + UDP_LEN;
    let d = b + BTH_LEN;
    let payload_start = d + DETH_LEN;
    let icrc_at = ip_end - ICRC_LEN;
    let stored = take(frame, icrc_at, ICRC_LEN, "ICRC")?;
    let icrc_stored = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
    let icrc_computed = icrc(packet.get(..packet.len() - ICRC_LEN).unwrap_or(&[])).ok_or(
        FrameError::Truncated {
            what: "RoCEv2 packet",
        },
    )?;
    Ok(RoceFrame {
        dst_mac,
        src_mac,
        vlan,
        ip_offset,
        ip_header,
        ip_total_len,
        ip_id: u16_be(ip_header, 4, "IPv4 header")?,
        ip_flags_fragment: u16_be(ip_header, 6, "IPv4 header")?,
        ttl: ip_header[8],
        src_ip,
        dst_ip,
        ip_checksum_ok: ipv4_checksum(ip_header) == 0,
        udp_src: u16_be(frame, u, "UDP header")?,
        udp_dst: u16_be(frame, u + 2, "UDP header")?,
        udp_len: u16_be(frame, u + 4, "UDP header")?,
        udp_checksum: u16_be(frame, u + 6, "UDP header")?,
        opcode: take(frame, b, 1, "BTH")?[0],
        bth_flags: take(frame, b + 1, 1, "BTH")?[0],
        pkey: u16_be(frame, b + 2, "BTH")?,
        dest_qp: u32_be(frame, b + 4, "BTH")? & 0x00ff_ffff,
        psn: u32_be(frame, b + 8, "BTH")? & 0x00ff_ffff,
        qkey: u32_be(frame, d, "DETH")?,
        src_qp: u32_be(frame, d + 4, "DETH")? & 0x00ff_ffff,
        payload: take(frame, payload_start, icrc_at - payload_start, "payload")?,
        icrc_stored,
        icrc_computed,
    })
}
