#!/usr/bin/env python3
"""Rebuild ../shared/vectors (the codec's capture test vectors) from public sources.

The capture tests (driver/mad/tests/vectors.rs, driver/host/tests/pcap.rs,
driver/host/tests/rocev2.rs) read `../shared/vectors` beside the checkout. No capture
bytes are committed to this repository; this script writes the same directory from
checkouts of the public repositories the vectors come from (shared/vectors/SOURCES.md):

  ib-erf-infiniband-pcap     github.com/srinivaskoritala/rdma-softroce-demo,
                             infiniband.pcap (added in 091d8b4a3640e815425f144466fc7e7344e1b38d)
  liteeth-pr198-linux-host   github.com/enjoy-digital/liteeth refs/pull/198/head
                             cbad103fd24d59d4669c43dd6b90135c535b7078, test/test_rocev2.py
  liteeth-79c4872f-mellanox  github.com/enjoy-digital/liteeth
                             79c4872fb2d750c1d95f2d09ae3c340caf306c33, test/test_rocev2.py

For each CM MAD found (management class 7, sent to QP1) it writes

  <dir>/<name>.mad.hex        `# source: ...` line, then the 256-byte MAD, 32 bytes a line
  <dir>/frames/<name>.hex     `# linktype=N source: ...` line, then the whole frame
  <dir>/index.json            per vector: file, frame, message, crc_check,
                              reference_decode, ip_cm, reserved_bits_nonzero

`reference_decode` comes from the decoder in this file, written from the IBA Vol 1
chapter 12 message tables (REQ, MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR, SIDR_REQ,
SIDR_REP); it shares no code with the Rust codec it checks. Every frame's CRCs are
recomputed (ICRC, and VCRC for native IB) and must equal the captured ones, and each
source's selected frames must hash to the pinned SHA-256 below, or the script fails.
Python 3 standard library only.

Not reproduced: the tshark decode the hand-made directory also carries (`tshark`,
`tshark_label`, `tshark_cm`, `tshark_known_bugs`, `not_decoded_by_tshark`), which no test
reads, and shared/reference/ (driver/host/tests/rocev2.rs reads linux-peer.md there too).

Usage:
  make_vectors.py --softroce-demo DIR --liteeth-pr198 DIR --liteeth-79c4872f DIR --out DIR
                  [--compare EXISTING_VECTORS_DIR]

Each DIR is a checkout (or any directory holding the file at the same relative path).
--compare checks the output against an existing vectors directory: hex files
byte-identical, index.json equal in every field the tests read.
"""

import argparse
import hashlib
import ipaddress
import json
import os
import re
import struct
import sys
import zlib

MAD_SIZE = 256
MAD_HEADER = 24
CM_CLASS = 0x07
LINKTYPE_ETHERNET = 1
LINKTYPE_ERF = 197
ROCEV2_PORT = 4791

# ---------------------------------------------------------------------------------------
# The sources. The `source` strings are the provenance written into every file.

SOFTROCE_DEMO = {
    "dir": "ib-erf-infiniband-pcap",
    "prefix": "ibpcap",
    "file": "infiniband.pcap",
    # git blob id of infiniband.pcap: the same at 091d8b4a (where it was added) and at
    # a27eb5cb (the commit the provenance names); a checkout of either gives these bytes.
    "blob": "cfe28f69552ac433ba603eba5025b32ba8d0ad51",
    "frames_sha256": "e51a255d596a525102342956961aacf9216604b1a021fd34eddb9a5e42f7cc76",
    "source": "github.com/srinivaskoritala/rdma-softroce-demo @ "
    "a27eb5cb9544049dc4dc6e948cca111db702da65 (file added in "
    "091d8b4a3640e815425f144466fc7e7344e1b38d) infiniband.pcap: Endace ERF (type 21 "
    "InfiniBand) capture dated 2008-05-14, Mellanox HCAs (GUID 0002c9...), native IB "
    "LID-routed",
}

LITEETH_PR198 = {
    "dir": "liteeth-pr198-linux-host",
    "prefix": "liteeth198",
    "file": "test/test_rocev2.py",
    "blob": "47b0ae1d2384c298167efbe434a0e08e36dd9592",
    "frames_sha256": "215866c3e1df0e5005985b799296cd7a757ee77b784f2e6350b12210cc4cd8aa",
    "source": "github.com/enjoy-digital/liteeth refs/pull/198/head commit "
    "cbad103fd24d59d4669c43dd6b90135c535b7078 test/test_rocev2.py receiver_direct() hex "
    "frames (RoCEv2/IPv4 from host 192.170.1.2 MAC 20:7b:d2:93:89:9a)",
}

LITEETH_79C = {
    "dir": "liteeth-79c4872f-mellanox",
    "prefix": "liteeth79c",
    "file": "test/test_rocev2.py",
    # No blob id (this commit's file was read through a search index, not git): the
    # selected frames are pinned instead, so the file may come from a checkout by SHA or
    # from raw.githubusercontent.com at that SHA.
    "blob": None,
    "frames_sha256": "967bc37eda608bf34d84d3b1f9a413ead6a2d17efc7cd8f303ff36f59e64a530",
    "source": "github.com/enjoy-digital/liteeth commit "
    "79c4872fb2d750c1d95f2d09ae3c340caf306c33 test/test_rocev2.py receiver_direct() hex "
    "frames (RoCEv2/IPv4, VLAN 1, from Mellanox NIC MAC b8:59:9f:07:7e:2a); zero runs "
    "rebuilt from IBA offsets (rebuild_frames.py), ICRC-validated",
}


class VectorError(Exception):
    pass


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def frames_digest(frames):
    """SHA-256 over the selected frames, each as its frame number, ':' and its bytes."""
    h = hashlib.sha256()
    for n, _, frame, _, _ in frames:
        h.update(b"%d:" % n + frame)
    return h.hexdigest()


def read_source(checkout, spec):
    path = os.path.join(checkout, spec["file"])
    with open(path, "rb") as f:
        data = f.read()
    if spec["blob"] is not None and git_blob_id(data) != spec["blob"]:
        raise VectorError(
            f"{path}: git blob {git_blob_id(data)}, expected {spec['blob']} "
            "(not the pinned version)"
        )
    return data


# ---------------------------------------------------------------------------------------
# Reference decoder: IBA Vol 1 ch. 12 (CM message contents). Offsets are MAD byte offsets
# (the message data starts at byte 24, after the common MAD header); bit offsets count
# from the byte's most significant bit, as the IBA tables draw them. A field is
# (name, byte, bit, width in bits) for numbers, or (name, byte, None, length in bytes)
# for byte strings (GIDs, private data), shown as lowercase hex.

ATTRIBUTES = {
    0x0010: "REQ",
    0x0011: "MRA",
    0x0012: "REJ",
    0x0013: "REP",
    0x0014: "RTU",
    0x0015: "DREQ",
    0x0016: "DREP",
    0x0017: "SIDR_REQ",
    0x0018: "SIDR_REP",
    0x0019: "LAP",
    0x001A: "APR",
}


def path_fields(prefix, base, lap=False):
    """A path's fields (REQ Table 99's primary/alternate path, LAP's alternate path)."""
    p = prefix + "_"
    fields = [
        (p + "local_port_lid", base + 0, 0, 16),
        (p + "remote_port_lid", base + 2, 0, 16),
        (p + "local_port_gid", base + 4, None, 16),
        (p + "remote_port_gid", base + 20, None, 16),
        (p + "flow_label", base + 36, 0, 20),
    ]
    if lap:
        # LAP: flow label (20), reserved (4), traffic class (8), hop limit (8),
        # reserved (2), packet rate (6).
        fields += [
            (p + "traffic_class", base + 39, 0, 8),
            (p + "hop_limit", base + 40, 0, 8),
            (p + "packet_rate", base + 41, 2, 6),
        ]
    else:
        # REQ: flow label (20), reserved (6), packet rate (6), traffic class, hop limit.
        fields += [
            (p + "packet_rate", base + 39, 2, 6),
            (p + "traffic_class", base + 40, 0, 8),
            (p + "hop_limit", base + 41, 0, 8),
        ]
    fields += [
        (p + "sl", base + 42, 0, 4),
        (p + "subnet_local", base + 42, 4, 1),
        (p + "local_ack_timeout", base + 43, 0, 5),
    ]
    return fields


def order(fields, names):
    by_name = {f[0]: f for f in fields}
    assert sorted(by_name) == sorted(names), (sorted(by_name), sorted(names))
    return [by_name[n] for n in names]


_REQ_PATH = ["local_port_lid", "remote_port_lid", "local_port_gid", "remote_port_gid",
             "flow_label", "packet_rate", "traffic_class", "hop_limit", "sl",
             "subnet_local", "local_ack_timeout"]

# REQ (IBA Vol 1 Table 99 in release 1.2.1; 106 in later releases).
REQ = [
    ("local_comm_id", 24, 0, 32),
    ("vendor_id", 29, 0, 24),  # byte 28: reserved (8)
    ("service_id", 32, 0, 64),
    ("local_ca_guid", 40, 0, 64),
    ("local_qkey", 52, 0, 32),  # bytes 48-51: reserved
    ("local_qpn", 56, 0, 24),
    ("responder_resources", 59, 0, 8),
    ("local_eecn", 60, 0, 24),
    ("initiator_depth", 63, 0, 8),
    ("remote_eecn", 64, 0, 24),
    ("remote_cm_response_timeout", 67, 0, 5),
    ("transport_service_type", 67, 5, 2),
    ("end_to_end_flow_control", 67, 7, 1),
    ("starting_psn", 68, 0, 24),
    ("local_cm_response_timeout", 71, 0, 5),
    ("retry_count", 71, 5, 3),
    ("partition_key", 72, 0, 16),
    ("path_packet_payload_mtu", 74, 0, 4),
    ("rdc_exists", 74, 4, 1),
    ("rnr_retry_count", 74, 5, 3),
    ("max_cm_retries", 75, 0, 4),
    ("srq", 75, 4, 1),
    ("extended_transport_type", 75, 5, 3),
]
REQ += order(path_fields("primary", 76), ["primary_" + n for n in _REQ_PATH])
REQ += order(path_fields("alternate", 120), ["alternate_" + n for n in _REQ_PATH])
REQ += [
    ("sap_supported", 163, 5, 1),
    ("private_data", 164, None, 92),
]

MRA = [
    ("local_comm_id", 24, 0, 32),
    ("remote_comm_id", 28, 0, 32),
    ("message_mraed", 32, 0, 2),
    ("service_timeout", 33, 0, 5),
    ("private_data", 34, None, 222),
]

# REJ: ARI is rejected_info_length bytes of the 72-byte ARI field.
REJ = [
    ("local_comm_id", 24, 0, 32),
    ("remote_comm_id", 28, 0, 32),
    ("message_rejected", 32, 0, 2),
    ("rejected_info_length", 33, 0, 7),
    ("reason", 34, 0, 16),
    ("ari", 36, "len:rejected_info_length", 72),
    ("private_data", 108, None, 148),
]

REP = [
    ("local_comm_id", 24, 0, 32),
    ("remote_comm_id", 28, 0, 32),
    ("local_qkey", 32, 0, 32),
    ("local_qpn", 36, 0, 24),
    ("vendor_id_h", 39, 0, 8),
    ("local_eecn", 40, 0, 24),
    ("vendor_id_m", 43, 0, 8),
    ("starting_psn", 44, 0, 24),
    ("vendor_id_l", 47, 0, 8),
    ("responder_resources", 48, 0, 8),
    ("initiator_depth", 49, 0, 8),
    ("target_ack_delay", 50, 0, 5),
    ("failover_accepted", 50, 5, 2),
    ("end_to_end_flow_control", 50, 7, 1),
    ("rnr_retry_count", 51, 0, 3),
    ("srq", 51, 3, 1),
    ("local_ca_guid", 52, 0, 64),
    ("private_data", 60, None, 196),
]

RTU = [
    ("local_comm_id", 24, 0, 32),
    ("remote_comm_id", 28, 0, 32),
    ("private_data", 32, None, 224),
]

DREQ = [
    ("local_comm_id", 24, 0, 32),
    ("remote_comm_id", 28, 0, 32),
    ("remote_qpn_eecn", 32, 0, 24),
    ("private_data", 36, None, 220),
]

LAP = [
    ("local_comm_id", 24, 0, 32),
    ("remote_comm_id", 28, 0, 32),
    ("remote_qpn_eecn", 36, 0, 24),  # bytes 32-35: reserved
    ("remote_cm_response_timeout", 39, 0, 5),
]
LAP += order(path_fields("alternate", 44, lap=True), ["alternate_" + n for n in _REQ_PATH])
LAP += [("private_data", 88, None, 168)]

APR = [
    ("local_comm_id", 24, 0, 32),
    ("remote_comm_id", 28, 0, 32),
    ("additional_info_length", 32, 0, 8),
    ("ap_status", 33, 0, 8),
    ("additional_info", 36, "len:additional_info_length", 72),
    ("private_data", 108, None, 148),
]

SIDR_REQ = [
    ("request_id", 24, 0, 32),
    ("partition_key", 28, 0, 16),
    ("service_id", 32, 0, 64),
    ("private_data", 40, None, 216),
]

SIDR_REP = [
    ("request_id", 24, 0, 32),
    ("status", 28, 0, 8),
    ("additional_info_length", 29, 0, 8),
    ("qpn", 32, 0, 24),
    ("service_id", 36, 0, 64),
    ("qkey", 44, 0, 32),
    ("additional_info", 48, "len:additional_info_length", 72),
    ("private_data", 120, None, 136),
]
# SIDR_REP's VendorID (bytes 30-31 and 35) is a defined field, not reserved, but the
# tests' field set for SIDR_REP does not carry it.
SIDR_REP_UNLISTED = [("vendor_id_h", 30, 0, 16), ("vendor_id_l", 35, 0, 8)]

LAYOUTS = {
    "REQ": (REQ, []),
    "MRA": (MRA, []),
    "REJ": (REJ, []),
    "REP": (REP, []),
    "RTU": (RTU, []),
    "DREQ": (DREQ, []),
    "DREP": (RTU, []),
    "LAP": (LAP, []),
    "APR": (APR, []),
    "SIDR_REQ": (SIDR_REQ, []),
    "SIDR_REP": (SIDR_REP, SIDR_REP_UNLISTED),
}


def bits(data, byte, bit, width):
    """`width` bits of `data` starting `bit` bits below the top of byte `byte`."""
    nbytes = (bit + width + 7) // 8
    word = int.from_bytes(data[byte:byte + nbytes], "big")
    return (word >> (nbytes * 8 - bit - width)) & ((1 << width) - 1)


def reference_decode(mad):
    """(message name, {field: value}, [MAD byte offsets holding nonzero reserved bits])."""
    if len(mad) != MAD_SIZE:
        raise VectorError(f"MAD of {len(mad)} bytes")
    attr = int.from_bytes(mad[16:18], "big")
    name = ATTRIBUTES.get(attr)
    if name is None:
        raise VectorError(f"attribute {attr:#06x} is not a CM message this decoder knows")
    fields, unlisted = LAYOUTS[name]
    out = {}
    defined = bytearray(MAD_SIZE)  # bit mask of the bits some field covers
    defined[:MAD_HEADER] = b"\xff" * MAD_HEADER
    defined[18:20] = b"\0\0"  # MAD header: reserved (16)
    for fname, byte, bit, width in fields + unlisted:
        if bit is None or isinstance(bit, str):
            length = width
            if isinstance(bit, str):
                length = min(out[bit.split(":", 1)[1]], width)
            value = mad[byte:byte + length].hex()
            for i in range(byte, byte + width):
                defined[i] = 0xFF
        else:
            value = bits(mad, byte, bit, width)
            for b in range(bit, bit + width):
                defined[byte + b // 8] |= 0x80 >> (b % 8)
        if (fname, byte, bit, width) not in unlisted:
            out[fname] = value
    reserved = [i for i in range(MAD_SIZE) if mad[i] & ~defined[i] & 0xFF]
    return name, out, reserved


def ip_cm(service_id, private_data_hex):
    """RDMA-CM IP addressing (IBA Annex A11): the IP CM service ID and private data."""
    if service_id >> 24 != 0x0000000001:
        return None
    pd = bytes.fromhex(private_data_hex)
    version = pd[1] >> 4
    if version == 4:
        src = ipaddress.IPv4Address(pd[16:20])
        dst = ipaddress.IPv4Address(pd[32:36])
    elif version == 6:
        src = ipaddress.IPv6Address(pd[4:20])
        dst = ipaddress.IPv6Address(pd[20:36])
    else:
        raise VectorError(f"IP CM header with IP version {version}")
    return {
        "ipcm_major_version": pd[0] >> 4,
        "ipcm_minor_version": pd[0] & 0xF,
        "ipcm_ip_version": version,
        "ipcm_reserved": pd[1] & 0xF,
        "ipcm_source_port": int.from_bytes(pd[2:4], "big"),
        "ipcm_source_ip": str(src),
        "ipcm_destination_ip": str(dst),
        "ipcm_consumer_private_data": pd[36:].hex(),
        "sid_prefix": f"{service_id >> 24:010x}",
        "sid_protocol": (service_id >> 16) & 0xFF,
        "sid_dport": service_id & 0xFFFF,
    }


# ---------------------------------------------------------------------------------------
# Frames and CRCs (IBA Vol 1 §7.8; RoCEv2: Annex A17).

def crc32_le(data):
    """ICRC as it sits on the wire: the IEEE CRC-32, least significant byte first."""
    return struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF)


def vcrc16(data):
    """VCRC: CRC-16, polynomial 0x100B, seed 0xFFFF, bit-reflected, inverted at the end."""
    crc = 0xFFFF
    poly = 0xD008  # 0x100B reflected
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
    return struct.pack("<H", crc ^ 0xFFFF)


def ib_local_packet(pkt):
    """Native IB, LRH + BTH + DETH (LNH = IBA local, UD): (MAD, crc_check) or None."""
    if len(pkt) < 8 + 12 + 8:
        return None
    lnh = pkt[1] & 3
    if lnh != 2:  # only LID-routed (no GRH) packets are in the capture
        return None
    pktlen = (int.from_bytes(pkt[4:6], "big") & 0x7FF) * 4  # LRH to ICRC, in bytes
    bth = pkt[8:20]
    dest_qp = int.from_bytes(bth[5:8], "big")
    if bth[0] != 0x64 or dest_qp != 1:  # UD SEND only, to QP1
        return None
    mad = pkt[28:28 + MAD_SIZE]
    if len(mad) != MAD_SIZE or pktlen != 8 + 12 + 8 + MAD_SIZE + 4 or mad[1] != CM_CLASS:
        return None
    masked = bytearray(pkt[:pktlen - 4])
    masked[0] |= 0xF0  # LRH VL
    masked[8 + 4] = 0xFF  # BTH resv8a
    icrc_ok = crc32_le(bytes(masked)) == pkt[pktlen - 4:pktlen]
    vcrc_ok = vcrc16(pkt[:pktlen]) == pkt[pktlen:pktlen + 2]
    return mad, {"icrc_ok": icrc_ok, "vcrc_ok": vcrc_ok}


def rocev2_layout(frame):
    """(offset of IPv4, IP total length) of a RoCEv2/IPv4 frame to QP1, or None."""
    off = 12
    ethertype = int.from_bytes(frame[off:off + 2], "big")
    if ethertype == 0x8100:
        off += 4
        ethertype = int.from_bytes(frame[off:off + 2], "big")
    ip = off + 2
    if ethertype != 0x0800 or frame[ip] >> 4 != 4 or frame[ip + 9] != 17:
        return None
    ihl = (frame[ip] & 0xF) * 4
    udp = ip + ihl
    if int.from_bytes(frame[udp + 2:udp + 4], "big") != ROCEV2_PORT:
        return None
    total = int.from_bytes(frame[ip + 2:ip + 4], "big")
    return ip, ihl, total


def rocev2_icrc(frame, ip, ihl, total):
    """The ICRC recomputed over an IPv4 RoCEv2 packet (masked fields set to ones)."""
    pkt = bytearray(frame[ip:ip + total - 4])
    pkt[1] = 0xFF  # TOS
    pkt[8] = 0xFF  # TTL
    pkt[10:12] = b"\xff\xff"  # header checksum
    pkt[ihl + 6:ihl + 8] = b"\xff\xff"  # UDP checksum
    pkt[ihl + 8 + 4] = 0xFF  # BTH resv8a
    return crc32_le(b"\xff" * 8 + bytes(pkt))


def ipv4_checksum_ok(header):
    s = sum(int.from_bytes(header[i:i + 2], "big") for i in range(0, len(header), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s == 0xFFFF


def rebuild_zero_runs(frame):
    """A quoted frame shorter than its IP total length says: the missing bytes were zeros
    lost from one zero run. Try each run inside the MAD; keep the one placement whose
    ICRC matches the quoted one. Returns the rebuilt frame or raises."""
    ip, ihl, total = rocev2_layout(frame)
    missing = ip + total - len(frame)
    mad_start = ip + ihl + 8 + 12 + 8
    candidates = set()
    i = mad_start
    while i < len(frame) - 4:
        if frame[i] == 0:
            j = i
            while j < len(frame) - 4 and frame[j] == 0:
                j += 1
            rebuilt = frame[:i] + b"\0" * missing + frame[i:]
            if rocev2_icrc(rebuilt, ip, ihl, total) == rebuilt[ip + total - 4:ip + total]:
                candidates.add(rebuilt)
            i = j
        else:
            i += 1
    if len(candidates) != 1:
        raise VectorError(
            f"frame short by {missing} bytes: {len(candidates)} zero-run placements "
            "match the ICRC"
        )
    return candidates.pop()


def rocev2_packet(frame):
    """RoCEv2/IPv4 UD to QP1 carrying a CM MAD: (frame, MAD, crc_check) or None."""
    layout = rocev2_layout(frame)
    if layout is None:
        return None
    ip, ihl, total = layout
    if len(frame) < ip + total:
        frame = rebuild_zero_runs(frame)
    bth = ip + ihl + 8
    if frame[bth] != 0x64 or int.from_bytes(frame[bth + 5:bth + 8], "big") != 1:
        return None
    mad = frame[bth + 20:bth + 20 + MAD_SIZE]
    if len(mad) != MAD_SIZE or mad[1] != CM_CLASS:
        return None
    if not ipv4_checksum_ok(frame[ip:ip + ihl]):
        raise VectorError("IPv4 header checksum wrong")
    icrc_ok = rocev2_icrc(frame, ip, ihl, total) == frame[ip + total - 4:ip + total]
    return frame, mad, {"icrc_ok": icrc_ok, "trailing_bytes": len(frame) - (ip + total)}


# ---------------------------------------------------------------------------------------
# Sources -> frames.

def pcap_records(data):
    """(linktype, [record bytes]) of a classic libpcap file."""
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        raise VectorError("not a libpcap file")
    linktype = struct.unpack(e + "I", data[20:24])[0]
    out, off = [], 24
    while off < len(data):
        if off + 16 > len(data):
            raise VectorError("truncated pcap record header")
        _, _, caplen, _ = struct.unpack(e + "IIII", data[off:off + 16])
        off += 16
        if off + caplen > len(data):
            raise VectorError("truncated pcap record")
        out.append(data[off:off + caplen])
        off += caplen
    return linktype & 0x0FFFFFFF, out


def erf_infiniband(record):
    """The IB packet of an ERF record of type 21 (INFINIBAND), or None."""
    erf_type = record[8]
    if erf_type & 0x80:  # extension headers: none in this capture
        raise VectorError("ERF extension headers are not handled")
    if erf_type & 0x7F != 21:
        return None
    return record[16:]


def softroce_demo_frames(data):
    linktype, records = pcap_records(data)
    if linktype != LINKTYPE_ERF:
        raise VectorError(f"infiniband.pcap: linktype {linktype}, expected ERF")
    for n, record in enumerate(records, 1):
        pkt = erf_infiniband(record)
        if pkt is None:
            continue
        found = ib_local_packet(pkt)
        if found is not None:
            mad, crc = found
            yield n, LINKTYPE_ERF, record, mad, crc


def liteeth_hex_strings(text):
    """The hex strings of `packets = [...]` in test_rocev2.py's receiver_direct(), in
    order; "wNNN" entries (waits) are not frames."""
    m = re.search(r"^def receiver_direct\(dut\):\n(.*?)(?=^\S|\Z)", text, re.S | re.M)
    if m is None:
        raise VectorError("test_rocev2.py: no receiver_direct()")
    lst = re.search(r"packets\s*=\s*\[(.*?)\]", m.group(1), re.S)
    if lst is None:
        raise VectorError("receiver_direct(): no packets = [...]")
    strings = re.findall(r'"([^"]*)"', lst.group(1))
    return [s for s in strings if not re.fullmatch(r"w\d+", s)]


def liteeth_frames(data):
    for n, s in enumerate(liteeth_hex_strings(data.decode()), 1):
        if not re.fullmatch(r"(?:[0-9a-fA-F]{2})+", s):
            raise VectorError(f"receiver_direct() string {n} is not hex")
        found = rocev2_packet(bytes.fromhex(s))
        if found is not None:
            frame, mad, crc = found
            yield n, LINKTYPE_ETHERNET, frame, mad, crc


# ---------------------------------------------------------------------------------------
# Output.

def hex_lines(data):
    h = data.hex()
    return "".join(h[i:i + 64] + "\n" for i in range(0, len(h), 64))


def write_dir(out_root, spec, frames):
    d = os.path.join(out_root, spec["dir"])
    os.makedirs(os.path.join(d, "frames"), exist_ok=True)
    src = spec["source"]
    vectors = []
    for n, linktype, frame, mad, crc in frames:
        if not all(v is True or k == "trailing_bytes" for k, v in crc.items()):
            raise VectorError(f"{spec['dir']} frame {n}: CRC check failed: {crc}")
        message, decode, reserved = reference_decode(mad)
        if mad[3] != 0x03:  # Send
            raise VectorError(f"{spec['dir']} frame {n}: method {mad[3]:#x}, not Send")
        name = f"{spec['prefix']}_f{n:03d}_{message.lower()}"
        with open(os.path.join(d, name + ".mad.hex"), "w") as f:
            f.write(f"# source: {src} frame {n}; {message}\n" + hex_lines(mad))
        with open(os.path.join(d, "frames", name + ".hex"), "w") as f:
            f.write(f"# linktype={linktype} source: {src} frame {n}\n" + hex_lines(frame))
        vectors.append({
            "file": name + ".mad.hex",
            "frame": n,
            "message": message,
            "crc_check": crc,
            "reference_decode": decode,
            "ip_cm": ip_cm(decode["service_id"], decode["private_data"])
            if message == "REQ" else None,
            "reserved_bits_nonzero": reserved or None,
        })
    if not vectors:
        raise VectorError(f"{spec['dir']}: no CM MADs found")
    index = {
        "source": src,
        "generator": "tests/vectors/make_vectors.py (reference_decode: its own decoder "
        "from the IBA Vol 1 ch. 12 message tables)",
        "vectors": vectors,
    }
    with open(os.path.join(d, "index.json"), "w") as f:
        f.write(json.dumps(index, indent=1))
    return len(vectors)


# ---------------------------------------------------------------------------------------
# --compare: the generated directory against an existing one.

INDEX_FIELDS = ("file", "frame", "message", "crc_check", "reference_decode", "ip_cm",
                "reserved_bits_nonzero")


def compare(new_root, old_root):
    problems = []
    for d in sorted(os.listdir(old_root)):
        old_d = os.path.join(old_root, d)
        if not os.path.isdir(old_d):
            continue
        new_d = os.path.join(new_root, d)
        for sub in ("", "frames"):
            od, nd = os.path.join(old_d, sub), os.path.join(new_d, sub)
            old_files = sorted(f for f in os.listdir(od) if f.endswith(".hex"))
            new_files = sorted(f for f in os.listdir(nd) if f.endswith(".hex")) \
                if os.path.isdir(nd) else []
            if old_files != new_files:
                problems.append(f"{d}/{sub}: files {new_files} != {old_files}")
            for f in old_files:
                if f not in new_files:
                    continue
                with open(os.path.join(od, f), "rb") as a, open(os.path.join(nd, f), "rb") as b:
                    if a.read() != b.read():
                        problems.append(f"{d}/{sub}/{f}: differs")
        with open(os.path.join(old_d, "index.json")) as a, \
                open(os.path.join(new_d, "index.json")) as b:
            old_i, new_i = json.load(a), json.load(b)
        old_v = {v["file"]: v for v in old_i["vectors"]}
        new_v = {v["file"]: v for v in new_i["vectors"]}
        if sorted(old_v) != sorted(new_v):
            problems.append(f"{d}/index.json: vectors {sorted(new_v)} != {sorted(old_v)}")
        for f in sorted(set(old_v) & set(new_v)):
            for k in INDEX_FIELDS:
                old, new = old_v[f].get(k), new_v[f].get(k)
                if isinstance(old, dict) and isinstance(new, dict):
                    for key in sorted(set(old) | set(new)):
                        if old.get(key, "<absent>") != new.get(key, "<absent>"):
                            problems.append(f"{d}/index.json {f} {k}.{key}: "
                                            f"{new.get(key, '<absent>')!r} != "
                                            f"{old.get(key, '<absent>')!r}")
                    if list(old) != list(new) and set(old) == set(new):
                        problems.append(f"{d}/index.json {f} {k}: key order differs")
                elif old != new:
                    problems.append(f"{d}/index.json {f} {k}: {new!r} != {old!r}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--softroce-demo", required=True,
                    help="checkout of srinivaskoritala/rdma-softroce-demo")
    ap.add_argument("--liteeth-pr198", required=True,
                    help="checkout of enjoy-digital/liteeth at cbad103f (PR 198 head)")
    ap.add_argument("--liteeth-79c4872f", required=True,
                    help="checkout of enjoy-digital/liteeth at 79c4872f")
    ap.add_argument("--out", required=True, help="vectors directory to write")
    ap.add_argument("--compare", help="existing vectors directory to compare with")
    a = ap.parse_args()
    try:
        os.makedirs(a.out, exist_ok=True)
        jobs = [
            (SOFTROCE_DEMO, a.softroce_demo, softroce_demo_frames),
            (LITEETH_PR198, a.liteeth_pr198, liteeth_frames),
            (LITEETH_79C, a.liteeth_79c4872f, liteeth_frames),
        ]
        for spec, checkout, frames in jobs:
            found = list(frames(read_source(checkout, spec)))
            if frames_digest(found) != spec["frames_sha256"]:
                raise VectorError(
                    f"{spec['dir']}: the frames found (numbers {[f[0] for f in found]}) "
                    f"hash to {frames_digest(found)}, expected {spec['frames_sha256']}"
                )
            n = write_dir(a.out, spec, found)
            print(f"{spec['dir']}: {n} vectors")
        if a.compare:
            problems = compare(a.out, a.compare)
            for p in problems:
                print("DIFFERS:", p)
            if problems:
                return 1
            print(f"identical to {a.compare} (hex files; index.json fields "
                  f"{', '.join(INDEX_FIELDS)})")
    except (VectorError, OSError) as e:
        print(f"make_vectors: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
