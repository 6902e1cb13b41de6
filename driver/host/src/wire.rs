//! The RoCEv2 packet that carries a QP1 MAD: IPv4 / UDP (destination port 4791) / BTH
//! (UD SEND_ONLY, opcode 0x64, P_Key, destination QP 1) / DETH (Q_Key 0x80010000, source
//! QP 1) / the 256-byte MAD / ICRC. Built and taken apart here for both the pcap writer
//! ([`crate::pcap`], which puts an Ethernet header in front) and the RoCEv2 port
//! (`crate::rocev2`, which sends it on a raw socket).
//!
//! The IPv4 and UDP headers and their checksums are etherparse's. The InfiniBand transport
//! headers (BTH, DETH) have no crate: their layout is written out here, read and written
//! through zerocopy. The ICRC is the zlib CRC-32 (crc32fast) computed exactly as a RoCEv2
//! receiver checks it (IBA Annex A17; rxe `rxe_icrc.c`): over 8 bytes of ones, then the
//! IPv4 header with TOS, TTL and checksum set to ones, the UDP header with its checksum set
//! to ones, the BTH with its reserved byte 4 set to ones, then DETH and payload; stored
//! little-endian.

use std::net::Ipv4Addr;

use etherparse::checksum::Sum16BitWords;
use etherparse::{IpNumber, Ipv4Header, Ipv4HeaderSlice, UdpHeader, UdpHeaderSlice};
use ibcm_mad::MAD_SIZE;
use zerocopy::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The RoCEv2 UDP destination port.
pub const ROCEV2_PORT: u16 = 4791;
/// BTH opcode of a UD SEND_ONLY.
pub const BTH_UD_SEND_ONLY: u8 = 0x64;
/// The Q_Key of QP1 (the GSI).
pub const QP1_QKEY: u32 = 0x8001_0000;
/// The default partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// TTL of the packets built.
pub const TTL: u8 = 64;

/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = Ipv4Header::MIN_LEN;
/// UDP header.
pub const UDP_HEADER_LEN: usize = UdpHeader::LEN;
/// Base transport header.
pub const BTH_LEN: usize = size_of::<Bth>();
/// Datagram extended transport header.
pub const DETH_LEN: usize = size_of::<Deth>();
/// Invariant CRC.
pub const ICRC_LEN: usize = 4;
/// A whole QP1 packet: IPv4 + UDP + BTH + DETH + MAD + ICRC.
pub const PACKET_LEN: usize =
    IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN + DETH_LEN + MAD_SIZE + ICRC_LEN;

/// The 24 bits of a QP number or PSN.
const LOW_24: u32 = 0x00ff_ffff;
/// BTH byte 1: MigReq.
const BTH_MIG_REQ: u8 = 0x40;
/// BTH byte 1: PadCnt, the bytes of pad at the end of the payload.
const BTH_PAD_CNT: u8 = 0x30;
/// BTH byte 1: TVer, the transport header version (0).
const BTH_TVER: u8 = 0x0f;
/// BTH word 2: AckReq.
const BTH_ACK_REQ: u32 = 0x8000_0000;

/// Base transport header (IBA 9.2), as on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct Bth {
    pub(crate) opcode: u8,
    /// SE, MigReq, PadCnt, TVer.
    pub(crate) flags: u8,
    pub(crate) pkey: U16,
    /// A reserved byte (masked in the ICRC), then the destination QP.
    pub(crate) dest_qp: U32,
    /// AckReq, 7 reserved bits, then the PSN.
    pub(crate) psn: U32,
}

/// Datagram extended transport header (IBA 9.3.3), as on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct Deth {
    pub(crate) qkey: U32,
    /// A reserved byte, then the source QP.
    pub(crate) src_qp: U32,
}

/// The transport headers of a UD packet: BTH then DETH.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct UdHeaders {
    pub(crate) bth: Bth,
    pub(crate) deth: Deth,
}

/// The ICRC of a RoCEv2 packet: `packet` runs from the first byte of the IPv4 header to
/// the end of the payload (the ICRC itself excluded). `None` if it is not IPv4 with room
/// for a UDP header and a BTH.
pub fn icrc(packet: &[u8]) -> Option<u32> {
    let ihl = Ipv4HeaderSlice::from_slice(packet).ok()?.slice().len();
    let b = ihl + UDP_HEADER_LEN;
    if packet.len() < b + BTH_LEN {
        return None;
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[0xff; 8]);
    let mut ip = [0u8; Ipv4Header::MAX_LEN];
    let ip = ip.get_mut(..ihl)?;
    ip.copy_from_slice(packet.get(..ihl)?);
    ip[1] = 0xff; // TOS
    ip[8] = 0xff; // TTL
    ip[10] = 0xff; // header checksum
    ip[11] = 0xff;
    crc.update(ip);
    let mut udp = [0u8; UDP_HEADER_LEN];
    udp.copy_from_slice(packet.get(ihl..b)?);
    udp[6] = 0xff; // checksum
    udp[7] = 0xff;
    crc.update(&udp);
    let mut bth = [0u8; BTH_LEN];
    bth.copy_from_slice(packet.get(b..b + BTH_LEN)?);
    bth[4] = 0xff; // reserved byte before the destination QP
    crc.update(&bth);
    crc.update(packet.get(b + BTH_LEN..)?);
    Some(crc.finalize())
}

/// The IPv4 header checksum of `header` (with its checksum field as it is: zero it to
/// compute, leave it to check: a correct header sums to 0).
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    Sum16BitWords::new().add_slice(header).ones_complement()
}

/// The fields of a packet, besides the MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// IPv4 identification (never 0 on a raw socket: the kernel would replace 0).
    pub ip_id: u16,
    /// UDP source port (RoCEv2 leaves it to the sender; replies go to 4791).
    pub udp_src: u16,
    /// BTH P_Key.
    pub pkey: u16,
    /// BTH PSN (24 bits).
    pub psn: u32,
    /// The BTH AckReq bit (meaningless on UD; Linux rxe sets it, this port does not).
    pub ack_req: bool,
    /// The BTH MigReq bit (Mellanox NICs set it on QP1; Linux rxe and this port do not).
    pub mig_req: bool,
}

/// Builds the whole IPv4 packet carrying `mad` to QP1: header checksum, UDP checksum and
/// ICRC computed. `mad` must be [`MAD_SIZE`] bytes.
pub fn encode(f: &Framing, mad: &[u8]) -> Option<[u8; PACKET_LEN]> {
    let mut p = [0u8; PACKET_LEN];
    write_packet(f, mad, true, &mut p)?;
    Some(p)
}

/// Writes the packet carrying `mad` into `out`, which must be [`PACKET_LEN`] bytes, with a
/// UDP checksum or (`udp_checksum` false) with 0 there, as RoCEv2 allows.
pub(crate) fn write_packet(
    f: &Framing,
    mad: &[u8],
    udp_checksum: bool,
    out: &mut [u8],
) -> Option<()> {
    if mad.len() != MAD_SIZE || out.len() != PACKET_LEN {
        return None;
    }
    let transport = UdHeaders {
        bth: Bth {
            opcode: BTH_UD_SEND_ONLY,
            flags: if f.mig_req { BTH_MIG_REQ } else { 0 },
            pkey: f.pkey.into(),
            dest_qp: 1.into(),
            psn: ((f.psn & LOW_24) | if f.ack_req { BTH_ACK_REQ } else { 0 }).into(),
        },
        deth: Deth {
            qkey: QP1_QKEY.into(),
            src_qp: 1.into(),
        },
    };
    // DF set, identification ours, TOS 0.
    let mut ip = Ipv4Header::new(
        (PACKET_LEN - IPV4_HEADER_LEN) as u16,
        TTL,
        IpNumber::UDP,
        f.src.octets(),
        f.dst.octets(),
    )
    .ok()?;
    ip.identification = f.ip_id;
    ip.header_checksum = ip.calc_header_checksum();
    let udp_payload = PACKET_LEN - IPV4_HEADER_LEN - UDP_HEADER_LEN;
    let udp = UdpHeader::without_ipv4_checksum(f.udp_src, ROCEV2_PORT, udp_payload).ok()?;
    let (ip_out, rest) = out.split_at_mut(IPV4_HEADER_LEN);
    let (udp_out, rest) = rest.split_at_mut(UDP_HEADER_LEN);
    let (transport_out, rest) = rest.split_at_mut(BTH_LEN + DETH_LEN);
    let (mad_out, _icrc) = rest.split_at_mut(MAD_SIZE);
    ip_out.copy_from_slice(&ip.to_bytes());
    udp_out.copy_from_slice(&udp.to_bytes());
    transport_out.copy_from_slice(transport.as_bytes());
    mad_out.copy_from_slice(mad);
    // The ICRC covers the UDP checksum as ones, so it is computed first; the UDP
    // checksum then covers the ICRC.
    let end = PACKET_LEN - ICRC_LEN;
    let crc = icrc(&out[..end])?;
    out[end..].copy_from_slice(&crc.to_le_bytes());
    if udp_checksum {
        let u = IPV4_HEADER_LEN;
        let sum = udp
            .calc_checksum_ipv4(&ip, &out[u + UDP_HEADER_LEN..])
            .ok()?;
        out[u + 6..u + 8].copy_from_slice(&sum.to_be_bytes());
    }
    Some(())
}

/// Why a received packet was not handed to the CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Not IPv4/UDP to port 4791 (some other traffic: ignored, not counted as an error).
    NotRoce,
    /// RoCEv2, but not a UD SEND_ONLY to QP1 with the QP1 Q_Key and a whole MAD (with
    /// transport header version 0, no pad, and a UDP length that matches the packet's).
    NotQp1,
    /// The ICRC does not match.
    BadIcrc {
        /// In the packet.
        stored: u32,
        /// Computed.
        computed: u32,
    },
}

/// A QP1 MAD taken out of a received IPv4 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The fields of the packet: [`encode`] of these and the MAD gives the packet back
    /// (but for TOS, TTL and the checksums).
    pub framing: Framing,
    /// The MAD.
    pub mad: &'a [u8],
}

/// An IPv4 packet carrying UDP, as far as its total length says.
pub(crate) struct UdpInIpv4<'a> {
    /// The IPv4 header (with options).
    pub(crate) ip: Ipv4HeaderSlice<'a>,
    pub(crate) udp: UdpHeaderSlice<'a>,
    /// From the IPv4 header to the end of the packet.
    pub(crate) packet: &'a [u8],
}

/// Why bytes are not an IPv4 packet carrying UDP.
pub(crate) enum NotUdp {
    /// The bytes end before `.0`.
    Truncated(&'static str),
    /// Not IPv4 (the first byte: version and IHL).
    NotIpv4(u8),
    /// IPv4, another protocol.
    Protocol(u8),
}

/// Takes the IPv4 and UDP headers of `bytes` apart (no checksum is checked).
pub(crate) fn udp_in_ipv4(bytes: &[u8]) -> Result<UdpInIpv4<'_>, NotUdp> {
    use etherparse::err::ipv4::HeaderSliceError;
    let ip = Ipv4HeaderSlice::from_slice(bytes).map_err(|e| match e {
        HeaderSliceError::Len(_) => NotUdp::Truncated("IPv4 header"),
        HeaderSliceError::Content(_) => NotUdp::NotIpv4(bytes.first().copied().unwrap_or(0)),
    })?;
    if ip.protocol() != IpNumber::UDP {
        return Err(NotUdp::Protocol(ip.protocol().0));
    }
    let ihl = ip.slice().len();
    let packet = bytes
        .get(..usize::from(ip.total_len()))
        .filter(|p| p.len() >= ihl)
        .ok_or(NotUdp::Truncated("IPv4 packet"))?;
    let udp = UdpHeaderSlice::from_slice(packet.get(ihl..).unwrap_or_default())
        .map_err(|_| NotUdp::Truncated("UDP header"))?;
    Ok(UdpInIpv4 { ip, udp, packet })
}

/// The UD transport of a RoCEv2 packet: its headers, the payload (up to the ICRC) and the
/// ICRC stored and computed.
pub(crate) struct UdTransport<'a> {
    pub(crate) headers: &'a UdHeaders,
    pub(crate) payload: &'a [u8],
    pub(crate) icrc_stored: u32,
    pub(crate) icrc_computed: u32,
}

impl<'a> UdpInIpv4<'a> {
    /// The BTH, DETH, payload and ICRC after the UDP header; `None` if there is no room
    /// for them.
    pub(crate) fn ud_transport(&self) -> Option<UdTransport<'a>> {
        let packet: &'a [u8] = self.packet;
        let start = self.ip.slice().len() + UDP_HEADER_LEN;
        let end = packet.len().checked_sub(ICRC_LEN)?;
        let covered = packet.get(..end)?;
        let (headers, payload) = UdHeaders::ref_from_prefix(covered.get(start..)?).ok()?;
        let stored = packet.get(end..)?;
        Some(UdTransport {
            headers,
            payload,
            icrc_stored: u32::from_le_bytes(stored.try_into().ok()?),
            icrc_computed: icrc(covered)?,
        })
    }
}

/// Takes a received IPv4 packet apart and checks its ICRC.
pub fn decode(packet: &[u8]) -> Result<Decoded<'_>, DropReason> {
    let p = udp_in_ipv4(packet).map_err(|_| DropReason::NotRoce)?;
    if p.udp.destination_port() != ROCEV2_PORT {
        return Err(DropReason::NotRoce);
    }
    let t = p.ud_transport().ok_or(DropReason::NotQp1)?;
    let (bth, deth) = (&t.headers.bth, &t.headers.deth);
    // What a RoCE NIC drops besides: a UDP length that disagrees with the IP packet's
    // (the UDP layer under the NIC's RoCE stack drops the datagram; read from a raw
    // socket it arrives whole), a transport header version other than 0 (IBA 9.2.1), and
    // pad (a 256-byte MAD is a whole number of words: PadCnt bytes of pad would leave
    // fewer than 256 bytes of MAD).
    if usize::from(p.udp.length()) != p.packet.len() - p.ip.slice().len()
        || bth.flags & (BTH_PAD_CNT | BTH_TVER) != 0
        || bth.opcode != BTH_UD_SEND_ONLY
        || bth.dest_qp.get() & LOW_24 != 1
        || deth.qkey.get() != QP1_QKEY
        || t.payload.len() != MAD_SIZE
    {
        return Err(DropReason::NotQp1);
    }
    if t.icrc_stored != t.icrc_computed {
        return Err(DropReason::BadIcrc {
            stored: t.icrc_stored,
            computed: t.icrc_computed,
        });
    }
    Ok(Decoded {
        framing: Framing {
            src: p.ip.source_addr(),
            dst: p.ip.destination_addr(),
            ip_id: p.ip.identification(),
            udp_src: p.udp.source_port(),
            pkey: bth.pkey.get(),
            psn: bth.psn.get() & LOW_24,
            ack_req: bth.psn.get() & BTH_ACK_REQ != 0,
            mig_req: bth.flags & BTH_MIG_REQ != 0,
        },
        mad: t.payload,
    })
}
