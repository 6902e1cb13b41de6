//! Golden-byte tests for every CM MAD (IBA Vol 1 ch. 12, Tables 106–120, and ClassPortInfo,
//! IBA 13.4.8.1).
//!
//! The expected bytes are written out by hand from the IBA tables (as transcribed in
//! `include/rdma/ibta_vol1_c12.h` and `cm-anchors.md` §5), never produced by the codec.
//! Offsets in the `put` calls are MAD offsets: `D + n` is CM byte `n` of the tables.
//! Bit ranges are MSB-first within a byte; 24-bit fields are the top three bytes of the
//! big-endian word at their offset.
//!
//! Every message gets four vectors:
//!
//! - `v`: distinct byte values in every field (catches byte order and swapped offsets), with
//!   the vectors `cm-anchors.md` §5 suggests;
//! - `max`: every field all ones of its width (so every bit the table defines is set and
//!   every reserved bit must stay clear);
//! - `a` and `b`: complementary halves of `max`: each field is all ones while its
//!   neighbours are zero in one vector, and the other way round in the other, so a field
//!   that bleeds into (or clears) a neighbouring bit is caught in either direction.
//!
//! For each vector [`golden`] checks that `emit` produces exactly the hand-written 256 bytes
//! (even over a dirty buffer), that `parse` gives back the representation field for field,
//! and — flipping each of the 2048 bits in turn — that parse ignores exactly the bits the
//! table marks reserved and sees every other one.

use ibcm_mad::{
    Apr, AprStatus, ClassPortInfo, CmMad, CmMessage, CommIds, CpiTarget, Dreq, Error, Failover,
    Lap, MadHeader, MessageKind, Method, Mra, Mtu, Path, Rate, Rej, RejReason, Rep, Req, SidrRep,
    SidrReq, SidrStatus, Transport,
};

/// MAD offset of the CM data: the IBA tables' offsets are relative to it.
const D: usize = 24;

type Mad = [u8; 256];

/// A reserved region: MAD bytes `start..end`, bits `mask` of each.
type Reserved = (usize, usize, u8);

/// Common MAD header bytes 18..19 are reserved in every MAD.
const HEADER_RESERVED: Reserved = (18, 20, 0xFF);

fn put(b: &mut Mad, at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// A MAD holding only a common header, every other byte zero.
fn header(method: u8, tid: [u8; 8], attribute: [u8; 2]) -> Mad {
    let mut b = [0u8; 256];
    // 0 BaseVersion 1 | 1 MgmtClass 0x07 (CM) | 2 ClassVersion 2 | 3 Method
    put(&mut b, 0, &[0x01, 0x07, 0x02, method]);
    // 4 Status = 0, 6 ClassSpecific = 0
    put(&mut b, 8, &tid); // 8 TransactionID
    put(&mut b, 16, &attribute); // 16 AttributeID
    // 18 reserved, 20 AttributeModifier = 0
    b
}

/// A MAD of all ones but for the fixed header bytes: Status, ClassSpecific, TID and
/// AttributeModifier are all ones too ([`MAX_SEND`] / [`MAX_GET_RESP`]).
fn all_ones(method: u8, attribute: [u8; 2]) -> Mad {
    let mut b = [0xFFu8; 256];
    put(&mut b, 0, &[0x01, 0x07, 0x02, method]);
    // 4..16 Status 0xFFFF, ClassSpecific 0xFFFF, TID all ones
    put(&mut b, 16, &[attribute[0], attribute[1], 0x00, 0x00]); // AttributeID, reserved
    // 20..24 AttributeModifier 0xFFFFFFFF
    b
}

const MAX_SEND: MadHeader = MadHeader {
    method: Method::Send,
    status: 0xFFFF,
    class_specific: 0xFFFF,
    transaction_id: u64::MAX,
    attribute_modifier: u32::MAX,
};

const MAX_GET_RESP: MadHeader = MadHeader {
    method: Method::GetResp,
    ..MAX_SEND
};

/// Private data with a recognisable, non-constant pattern.
fn pattern<const N: usize>(seed: u8) -> [u8; N] {
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7).wrapping_add(seed);
    }
    out
}

fn reserved_mask(reserved: &[Reserved], byte: usize) -> u8 {
    core::iter::once(&HEADER_RESERVED)
        .chain(reserved)
        .filter(|&&(start, end, _)| (start..end).contains(&byte))
        .fold(0, |acc, &(_, _, mask)| acc | mask)
}

#[track_caller]
fn assert_mad_eq(got: &[u8], want: &Mad) {
    let diffs: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .map(|(i, (g, w))| {
            let cm = i.checked_sub(D).map_or("hdr".into(), |c| c.to_string());
            format!("MAD byte {i} (CM {cm}): got {g:#04x}, want {w:#04x}")
        })
        .collect();
    assert_eq!(got.len(), 256);
    assert!(
        diffs.is_empty(),
        "emitted bytes differ:\n{}",
        diffs.join("\n")
    );
}

/// The golden checks: emit == expected, parse(expected) == mad, reserved bits (and only
/// they) ignored by parse.
#[track_caller]
fn golden(mad: &CmMad<'_>, expected: &Mad, reserved: &[Reserved]) {
    // The hand-written vector itself keeps reserved bits zero.
    for (i, &byte) in expected.iter().enumerate() {
        assert_eq!(
            byte & reserved_mask(reserved, i),
            0,
            "vector sets reserved bits at MAD byte {i}"
        );
    }

    // (1) emit writes exactly the expected 256 bytes...
    let mut out = [0u8; 256];
    mad.emit(&mut out).unwrap();
    assert_mad_eq(&out, expected);
    // ...over whatever the buffer held, and nothing past byte 255.
    let mut dirty = [0xA5u8; 300];
    mad.emit(&mut dirty).unwrap();
    assert_mad_eq(&dirty[..256], expected);
    assert!(
        dirty[256..].iter().all(|&b| b == 0xA5),
        "emit wrote past 256"
    );

    // (2) parse gives back every field.
    assert_eq!(CmMad::parse(expected).unwrap(), *mad);
    // A longer buffer parses from its first 256 bytes.
    let mut long = [0x5Au8; 300];
    long[..256].copy_from_slice(expected);
    assert_eq!(CmMad::parse(&long).unwrap(), *mad);

    // (3) all reserved bits set at once: the same representation.
    let mut noisy = *expected;
    for (i, b) in noisy.iter_mut().enumerate() {
        *b |= reserved_mask(reserved, i);
    }
    assert_eq!(CmMad::parse(&noisy).unwrap(), *mad);

    // (4) one bit at a time: parse ignores a flip exactly when the bit is reserved.
    for i in 0..256 {
        for bit in 0..8 {
            let m = 1u8 << bit;
            let mut flipped = *expected;
            flipped[i] ^= m;
            let ignored = CmMad::parse(&flipped).is_ok_and(|p| p == *mad);
            if i >= D && CmMad::length_clamped(&flipped) && !CmMad::length_clamped(expected) {
                // A length flipped above 72 is clamped to 72: from 72 that is the same
                // message, from less it is not; both are right, and
                // `length_fields_over_72_are_clamped_and_flagged_never_refused` checks it.
                continue;
            }
            let is_reserved = reserved_mask(reserved, i) & m != 0;
            assert_eq!(
                ignored,
                is_reserved,
                "MAD byte {i} (CM byte {}) bit {bit}: reserved = {is_reserved}, but parse {} the flip",
                i as isize - D as isize,
                if ignored { "ignored" } else { "saw" }
            );
        }
    }
}

/// The `a` and `b` vectors are complementary halves of `max` over the CM data.
#[track_caller]
fn assert_halves(a: &Mad, b: &Mad, max: &Mad) {
    for i in D..256 {
        assert_eq!(a[i] & b[i], 0, "a and b overlap at MAD byte {i}");
        assert_eq!(a[i] | b[i], max[i], "a | b != max at MAD byte {i}");
    }
}

fn send(tid: u64, message: CmMessage<'_>) -> CmMad<'_> {
    CmMad {
        header: MadHeader::send(tid),
        message,
    }
}

// ---------------------------------------------------------------------------------------
// REQ (Table 106)
// ---------------------------------------------------------------------------------------

const REQ_RESERVED: &[Reserved] = &[
    (D + 4, D + 5, 0xFF),     // 4: reserved (VendorID is 5..7)
    (D + 24, D + 28, 0xFF),   // 24..27: reserved
    (D + 90, D + 91, 0x0F),   // primary FlowLabel word bits 11..8
    (D + 91, D + 92, 0xC0),   // 91[7:6] before PacketRate
    (D + 94, D + 95, 0x07),   // 94[2:0] after SL, SubnetLocal
    (D + 95, D + 96, 0x07),   // 95[2:0] after LocalACKTimeout
    (D + 134, D + 135, 0x0F), // alternate FlowLabel word bits 11..8
    (D + 135, D + 136, 0xC0), // 135[7:6]
    (D + 138, D + 139, 0x07), // 138[2:0]
    (D + 139, D + 140, 0x03), // 139[1:0] after LocalACKTimeout, SAPSupported
];
/// ExtendedTransportType (51[2:0]) is reserved unless TransportServiceType is 3.
const REQ_EXT_RESERVED: Reserved = (D + 51, D + 52, 0x07);

const REQ_LGID: [u8; 16] = [
    0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xC9, 0x03, 0x00, 0xAB, 0xCD, 0xEF,
];
const REQ_RGID: [u8; 16] = [
    0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xC9, 0x03, 0x00, 0x12, 0x34, 0x56,
];
const REQ_ALT_LGID: [u8; 16] = [
    0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xC9, 0x03, 0x00, 0xAB, 0xCD, 0xF0,
];
const REQ_ALT_RGID: [u8; 16] = [
    0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xC9, 0x03, 0x00, 0x12, 0x34, 0x57,
];

fn req_v(private_data: &[u8]) -> CmMad<'_> {
    send(
        0x1122_3344_5566_7788,
        CmMessage::Req(Req {
            local_comm_id: 0x0A0B_0C0D,
            vendor_id: 0x5A_5B5C,
            service_id: 0x0000_0000_0106_4E20,
            local_ca_guid: 0x0002_C903_00AB_CDEF,
            local_qkey: 0x8001_0203,
            local_qpn: 0x12_3456,
            responder_resources: 0x10,
            local_eecn: 0x65_4321,
            initiator_depth: 0x08,
            remote_eecn: 0x0F_1E2D,
            remote_cm_response_timeout: 20,
            transport: Transport::Rc,
            end_to_end_flow_control: true,
            starting_psn: 0xAB_CDEF,
            local_cm_response_timeout: 20,
            retry_count: 7,
            partition_key: 0x8123,
            path_mtu: Mtu::Mtu4096,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            primary_path: Path {
                local_lid: 0x0102,
                remote_lid: 0x0304,
                local_gid: REQ_LGID,
                remote_gid: REQ_RGID,
                flow_label: 0x1_2345,
                packet_rate: Rate::Gbps100,
                traffic_class: 0x28,
                hop_limit: 0x40,
                sl: 0,
                subnet_local: true,
                local_ack_timeout: 14,
            },
            alternate_path: Path {
                local_lid: 0x0506,
                remote_lid: 0x0708,
                local_gid: REQ_ALT_LGID,
                remote_gid: REQ_ALT_RGID,
                flow_label: 0xA_BCDE,
                packet_rate: Rate::Gbps200,
                traffic_class: 0x60,
                hop_limit: 0xFF,
                sl: 9,
                subnet_local: false,
                local_ack_timeout: 18,
            },
            sap_supported: true,
            private_data,
        }),
    )
}

fn req_v_bytes(pd: &[u8]) -> Mad {
    let mut b = header(
        0x03,
        [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88],
        [0x00, 0x10],
    );
    put(&mut b, D, &[0x0A, 0x0B, 0x0C, 0x0D]); // 0: LocalCommID
    put(&mut b, D + 4, &[0x00, 0x5A, 0x5B, 0x5C]); // 4: reserved; 5..7: VendorID
    put(
        &mut b,
        D + 8,
        &[0x00, 0x00, 0x00, 0x00, 0x01, 0x06, 0x4E, 0x20],
    ); // 8: ServiceID
    put(
        &mut b,
        D + 16,
        &[0x00, 0x02, 0xC9, 0x03, 0x00, 0xAB, 0xCD, 0xEF],
    ); // 16: LocalCAGUID
    // 24..27: reserved
    put(&mut b, D + 28, &[0x80, 0x01, 0x02, 0x03]); // 28: LocalQ_Key
    put(&mut b, D + 32, &[0x12, 0x34, 0x56, 0x10]); // 32: LocalQPN 0x123456; 35: RespRes 0x10
    put(&mut b, D + 36, &[0x65, 0x43, 0x21, 0x08]); // 36: LocalEECN; 39: InitiatorDepth
    // 40: RemoteEECN; 43: RemoteCMResponseTimeout 20<<3 | RC 0<<1 | E2E 1 = 0xA1
    put(&mut b, D + 40, &[0x0F, 0x1E, 0x2D, 0xA1]);
    // 44: StartingPSN; 47: LocalCMResponseTimeout 20<<3 | RetryCount 7 = 0xA7
    put(&mut b, D + 44, &[0xAB, 0xCD, 0xEF, 0xA7]);
    // 48: P_Key; 50: MTU 5<<4 | RDC 0<<3 | RNR 7 = 0x57; 51: MaxCMRetries 15<<4 | SRQ 0 | ext 0
    put(&mut b, D + 48, &[0x81, 0x23, 0x57, 0xF0]);
    // Primary path.
    put(&mut b, D + 52, &[0x01, 0x02, 0x03, 0x04]); // 52: LocalPortLID, 54: RemotePortLID
    put(&mut b, D + 56, &REQ_LGID);
    put(&mut b, D + 72, &REQ_RGID);
    // 88: FlowLabel 0x12345 in word bits 31..12 = 12 34 5_; 91: PacketRate 16 (100 Gb/s)
    put(&mut b, D + 88, &[0x12, 0x34, 0x50, 0x10]);
    // 92: TC; 93: HopLimit; 94: SL 0<<4 | SubnetLocal 1<<3 = 0x08; 95: ACK timeout 14<<3
    put(&mut b, D + 92, &[0x28, 0x40, 0x08, 0x70]);
    // Alternate path.
    put(&mut b, D + 96, &[0x05, 0x06, 0x07, 0x08]);
    put(&mut b, D + 100, &REQ_ALT_LGID);
    put(&mut b, D + 116, &REQ_ALT_RGID);
    // 132: FlowLabel 0xABCDE = AB CD E_; 135: PacketRate 17 (200 Gb/s)
    put(&mut b, D + 132, &[0xAB, 0xCD, 0xE0, 0x11]);
    // 136: TC; 137: HL; 138: SL 9<<4 | SubnetLocal 0 = 0x90; 139: ACK 18<<3 | SAP 1<<2 = 0x94
    put(&mut b, D + 136, &[0x60, 0xFF, 0x90, 0x94]);
    put(&mut b, D + 140, pd); // 140: PrivateData (92)
    b
}

fn all_ones_path() -> Path {
    Path {
        local_lid: 0xFFFF,
        remote_lid: 0xFFFF,
        local_gid: [0xFF; 16],
        remote_gid: [0xFF; 16],
        flow_label: 0xF_FFFF,
        packet_rate: Rate::Unknown(63),
        traffic_class: 0xFF,
        hop_limit: 0xFF,
        sl: 15,
        subnet_local: true,
        local_ack_timeout: 31,
    }
}

fn req_max(private_data: &[u8]) -> CmMad<'_> {
    CmMad {
        header: MAX_SEND,
        message: CmMessage::Req(Req {
            local_comm_id: u32::MAX,
            vendor_id: 0xFF_FFFF,
            service_id: u64::MAX,
            local_ca_guid: u64::MAX,
            local_qkey: u32::MAX,
            local_qpn: 0xFF_FFFF,
            responder_resources: 0xFF,
            local_eecn: 0xFF_FFFF,
            initiator_depth: 0xFF,
            remote_eecn: 0xFF_FFFF,
            remote_cm_response_timeout: 31,
            transport: Transport::Extended(7),
            end_to_end_flow_control: true,
            starting_psn: 0xFF_FFFF,
            local_cm_response_timeout: 31,
            retry_count: 7,
            partition_key: 0xFFFF,
            path_mtu: Mtu::Unknown(15),
            rdc_exists: true,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: true,
            primary_path: all_ones_path(),
            alternate_path: all_ones_path(),
            sap_supported: true,
            private_data,
        }),
    }
}

fn req_max_bytes() -> Mad {
    let mut b = all_ones(0x03, [0x00, 0x10]);
    put(&mut b, D + 4, &[0x00]); // 4: reserved
    put(&mut b, D + 24, &[0x00, 0x00, 0x00, 0x00]); // 24..27: reserved
    // 43: 31<<3 | 3<<1 | 1 = 0xFF; 47: 31<<3 | 7 = 0xFF; 50: 15<<4 | 1<<3 | 7 = 0xFF;
    // 51: 15<<4 | 1<<3 | 7 = 0xFF: all ones already.
    put(&mut b, D + 90, &[0xF0, 0x3F]); // 90[3:0] reserved; 91: rsvd[7:6] | rate 63
    put(&mut b, D + 94, &[0xF8, 0xF8]); // 94: SL 15<<4 | SL 1<<3; 95: 31<<3
    put(&mut b, D + 134, &[0xF0, 0x3F]);
    put(&mut b, D + 138, &[0xF8, 0xFC]); // 139: 31<<3 | SAP 1<<2
    b
}

fn req_a(private_data: &[u8]) -> CmMad<'_> {
    send(
        0xA,
        CmMessage::Req(Req {
            local_comm_id: u32::MAX,
            vendor_id: 0,
            service_id: u64::MAX,
            local_ca_guid: 0,
            local_qkey: u32::MAX,
            local_qpn: 0,
            responder_resources: 0xFF,
            local_eecn: 0,
            initiator_depth: 0xFF,
            remote_eecn: 0,
            remote_cm_response_timeout: 31,
            transport: Transport::Rc,
            end_to_end_flow_control: true,
            starting_psn: 0,
            local_cm_response_timeout: 31,
            retry_count: 0,
            partition_key: 0xFFFF,
            path_mtu: Mtu::Unknown(0),
            rdc_exists: true,
            rnr_retry_count: 0,
            max_cm_retries: 15,
            srq: false,
            primary_path: Path {
                local_lid: 0xFFFF,
                remote_lid: 0,
                local_gid: [0xFF; 16],
                remote_gid: [0; 16],
                flow_label: 0xF_FFFF,
                packet_rate: Rate::Unknown(0),
                traffic_class: 0xFF,
                hop_limit: 0,
                sl: 15,
                subnet_local: false,
                local_ack_timeout: 31,
            },
            alternate_path: Path {
                local_lid: 0,
                remote_lid: 0xFFFF,
                local_gid: [0; 16],
                remote_gid: [0xFF; 16],
                flow_label: 0,
                packet_rate: Rate::Unknown(63),
                traffic_class: 0,
                hop_limit: 0xFF,
                sl: 0,
                subnet_local: true,
                local_ack_timeout: 0,
            },
            sap_supported: true,
            private_data,
        }),
    )
}

fn req_a_bytes() -> Mad {
    let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x10]);
    put(&mut b, D, &[0xFF; 4]); // LocalCommID
    // 4: reserved, 5..7 VendorID 0
    put(&mut b, D + 8, &[0xFF; 8]); // ServiceID; 16: LocalCAGUID 0
    put(&mut b, D + 28, &[0xFF; 4]); // LocalQ_Key
    put(&mut b, D + 32, &[0x00, 0x00, 0x00, 0xFF]); // QPN 0 | RespRes 0xFF
    put(&mut b, D + 36, &[0x00, 0x00, 0x00, 0xFF]); // LocalEECN 0 | InitiatorDepth 0xFF
    put(&mut b, D + 40, &[0x00, 0x00, 0x00, 0xF9]); // 43: 31<<3 | RC 0<<1 | E2E 1
    put(&mut b, D + 44, &[0x00, 0x00, 0x00, 0xF8]); // 47: 31<<3 | retry 0
    // 50: MTU 0 | RDC 1<<3 | RNR 0 = 0x08; 51: MaxCMRetries 15<<4 | SRQ 0 | ext 0 = 0xF0
    put(&mut b, D + 48, &[0xFF, 0xFF, 0x08, 0xF0]);
    put(&mut b, D + 52, &[0xFF, 0xFF, 0x00, 0x00]); // LocalPortLID | RemotePortLID
    put(&mut b, D + 56, &[0xFF; 16]); // LocalPortGID; 72: RemotePortGID 0
    put(&mut b, D + 88, &[0xFF, 0xFF, 0xF0, 0x00]); // FlowLabel 0xFFFFF | rate 0
    put(&mut b, D + 92, &[0xFF, 0x00, 0xF0, 0xF8]); // TC | HL 0 | SL 15<<4 | ACK 31<<3
    put(&mut b, D + 96, &[0x00, 0x00, 0xFF, 0xFF]); // alt LIDs
    put(&mut b, D + 116, &[0xFF; 16]); // alt RemotePortGID
    put(&mut b, D + 132, &[0x00, 0x00, 0x00, 0x3F]); // alt FlowLabel 0 | rate 63
    // 136: TC 0 | HL 0xFF | 138: SL 0 | SubnetLocal 1<<3 | 139: ACK 0 | SAP 1<<2
    put(&mut b, D + 136, &[0x00, 0xFF, 0x08, 0x04]);
    // 140: PrivateData 0
    b
}

fn req_b(private_data: &[u8]) -> CmMad<'_> {
    send(
        0xB,
        CmMessage::Req(Req {
            local_comm_id: 0,
            vendor_id: 0xFF_FFFF,
            service_id: 0,
            local_ca_guid: u64::MAX,
            local_qkey: 0,
            local_qpn: 0xFF_FFFF,
            responder_resources: 0,
            local_eecn: 0xFF_FFFF,
            initiator_depth: 0,
            remote_eecn: 0xFF_FFFF,
            remote_cm_response_timeout: 0,
            transport: Transport::Extended(7),
            end_to_end_flow_control: false,
            starting_psn: 0xFF_FFFF,
            local_cm_response_timeout: 0,
            retry_count: 7,
            partition_key: 0,
            path_mtu: Mtu::Unknown(15),
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 0,
            srq: true,
            primary_path: Path {
                local_lid: 0,
                remote_lid: 0xFFFF,
                local_gid: [0; 16],
                remote_gid: [0xFF; 16],
                flow_label: 0,
                packet_rate: Rate::Unknown(63),
                traffic_class: 0,
                hop_limit: 0xFF,
                sl: 0,
                subnet_local: true,
                local_ack_timeout: 0,
            },
            alternate_path: Path {
                local_lid: 0xFFFF,
                remote_lid: 0,
                local_gid: [0xFF; 16],
                remote_gid: [0; 16],
                flow_label: 0xF_FFFF,
                packet_rate: Rate::Unknown(0),
                traffic_class: 0xFF,
                hop_limit: 0,
                sl: 15,
                subnet_local: false,
                local_ack_timeout: 31,
            },
            sap_supported: false,
            private_data,
        }),
    )
}

fn req_b_bytes() -> Mad {
    let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x10]);
    put(&mut b, D + 4, &[0x00, 0xFF, 0xFF, 0xFF]); // reserved 0 | VendorID 0xFFFFFF
    put(&mut b, D + 16, &[0xFF; 8]); // LocalCAGUID
    put(&mut b, D + 32, &[0xFF, 0xFF, 0xFF, 0x00]); // QPN | RespRes 0
    put(&mut b, D + 36, &[0xFF, 0xFF, 0xFF, 0x00]); // LocalEECN | InitiatorDepth 0
    put(&mut b, D + 40, &[0xFF, 0xFF, 0xFF, 0x06]); // 43: 0<<3 | TST 3<<1 | E2E 0
    put(&mut b, D + 44, &[0xFF, 0xFF, 0xFF, 0x07]); // 47: 0<<3 | retry 7
    // 50: MTU 15<<4 | RDC 0 | RNR 7 = 0xF7; 51: 0<<4 | SRQ 1<<3 | ext 7 = 0x0F
    put(&mut b, D + 48, &[0x00, 0x00, 0xF7, 0x0F]);
    put(&mut b, D + 52, &[0x00, 0x00, 0xFF, 0xFF]);
    put(&mut b, D + 72, &[0xFF; 16]); // RemotePortGID
    put(&mut b, D + 88, &[0x00, 0x00, 0x00, 0x3F]); // FlowLabel 0 | rate 63
    put(&mut b, D + 92, &[0x00, 0xFF, 0x08, 0x00]); // TC 0 | HL | SL 0, SubnetLocal 1<<3 | ACK 0
    put(&mut b, D + 96, &[0xFF, 0xFF, 0x00, 0x00]);
    put(&mut b, D + 100, &[0xFF; 16]); // alt LocalPortGID
    put(&mut b, D + 132, &[0xFF, 0xFF, 0xF0, 0x00]); // alt FlowLabel max | rate 0
    // 136: TC | HL 0 | 138: SL 15<<4 | 0 | 139: ACK 31<<3 | SAP 0
    put(&mut b, D + 136, &[0xFF, 0x00, 0xF0, 0xF8]);
    put(&mut b, D + 140, &[0xFF; 92]); // PrivateData
    b
}

fn with(list: &[Reserved], extra: &[Reserved]) -> Vec<Reserved> {
    list.iter().chain(extra).copied().collect()
}

#[test]
fn req_suggested_vector() {
    let pd = pattern::<92>(0x40);
    let mad = req_v(&pd);
    let expected = req_v_bytes(&pd);
    golden(&mad, &expected, &with(REQ_RESERVED, &[REQ_EXT_RESERVED]));

    // The cm-anchors §5 bytes, read off the emitted MAD.
    let mut out = [0u8; 256];
    mad.emit(&mut out).unwrap();
    assert_eq!(&out[D + 32..D + 36], &[0x12, 0x34, 0x56, 0x10]);
    assert_eq!(out[D + 43], 0xA1);
    assert_eq!(out[D + 47], 0xA7);
    assert_eq!(out[D + 50], 0x57);
    assert_eq!(out[D + 51], 0xF0);
    assert_eq!(out[D + 95], 0x70);

    // Field by field, as a reader of the table would check them.
    let CmMessage::Req(req) = CmMad::parse(&expected).unwrap().message else {
        panic!("not a REQ")
    };
    assert_eq!(req.local_qpn, 0x12_3456);
    assert_eq!(req.responder_resources, 0x10);
    assert_eq!(req.vendor_id, 0x5A_5B5C);
    assert_eq!(req.remote_cm_response_timeout, 20);
    assert_eq!(req.transport, Transport::Rc);
    assert!(req.end_to_end_flow_control);
    assert_eq!(req.local_cm_response_timeout, 20);
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(req.max_cm_retries, 15);
    assert_eq!(req.path_mtu, Mtu::Mtu4096);
    assert_eq!(req.primary_path.flow_label, 0x1_2345);
    assert_eq!(req.primary_path.packet_rate, Rate::Gbps100);
    assert!(req.primary_path.subnet_local);
    assert_eq!(req.primary_path.local_ack_timeout, 14);
    assert_eq!(req.alternate_path.sl, 9);
    assert_eq!(req.alternate_path.local_ack_timeout, 18);
    assert!(req.sap_supported);
    assert_eq!(req.private_data, &pd[..]);

    // Short private data is zero-filled to 92 bytes.
    let mut short = pd;
    short[10..].fill(0);
    let mut out = [0xEEu8; 256];
    req_v(&pd[..10]).emit(&mut out).unwrap();
    assert_mad_eq(&out, &req_v_bytes(&short));
}

#[test]
fn req_all_ones() {
    let pd = [0xFF; 92];
    golden(&req_max(&pd), &req_max_bytes(), REQ_RESERVED);
}

#[test]
fn req_neighbour_halves() {
    let zeros = [0u8; 92];
    let ones = [0xFF; 92];
    golden(
        &req_a(&zeros),
        &req_a_bytes(),
        &with(REQ_RESERVED, &[REQ_EXT_RESERVED]),
    );
    golden(&req_b(&ones), &req_b_bytes(), REQ_RESERVED);
    assert_halves(&req_a_bytes(), &req_b_bytes(), &req_max_bytes());
}

#[test]
fn req_transport_types() {
    // (Transport, byte 43 with timeout 20 and E2E 1, byte 51 with MaxCMRetries 15)
    let cases = [
        (Transport::Rc, 0xA1, 0xF0),          // 20<<3 | 0<<1 | 1; 15<<4 | 0
        (Transport::Uc, 0xA3, 0xF0),          // 20<<3 | 1<<1 | 1
        (Transport::Rd, 0xA5, 0xF0),          // 20<<3 | 2<<1 | 1
        (Transport::Xrc, 0xA7, 0xF1),         // 20<<3 | 3<<1 | 1; ext 1
        (Transport::Extended(0), 0xA7, 0xF0), // TST 3, ext 0
        (Transport::Extended(6), 0xA7, 0xF6),
    ];
    let pd = pattern::<92>(0x40);
    for (transport, b43, b51) in cases {
        let mut mad = req_v(&pd);
        let CmMessage::Req(req) = &mut mad.message else {
            unreachable!()
        };
        req.transport = transport;
        let mut expected = req_v_bytes(&pd);
        put(&mut expected, D + 43, &[b43]);
        put(&mut expected, D + 51, &[b51]);
        let reserved = if matches!(transport, Transport::Rc | Transport::Uc | Transport::Rd) {
            with(REQ_RESERVED, &[REQ_EXT_RESERVED])
        } else {
            REQ_RESERVED.to_vec()
        };
        golden(&mad, &expected, &reserved);
    }
}

#[test]
fn req_reserved_bits_named_in_the_brief() {
    // Bytes 4, 24..27, 91[7:6], 94[2:0] set: the same REQ.
    let pd = pattern::<92>(0x40);
    let mut b = req_v_bytes(&pd);
    b[D + 4] = 0xFF;
    b[D + 24..D + 28].fill(0xFF);
    b[D + 91] |= 0xC0;
    b[D + 94] |= 0x07;
    b[18] = 0xFF; // header reserved
    b[19] = 0xFF;
    assert_eq!(CmMad::parse(&b).unwrap(), req_v(&pd));
}

// ---------------------------------------------------------------------------------------
// MRA (Table 107)
// ---------------------------------------------------------------------------------------

const MRA_RESERVED: &[Reserved] = &[
    (D + 8, D + 9, 0x3F),  // 8[5:0] after MessageMRAed
    (D + 9, D + 10, 0x07), // 9[2:0] after ServiceTimeout
];

fn mra(
    header: MadHeader,
    ids: (u32, u32),
    kind: MessageKind,
    timeout: u8,
    private_data: &[u8],
) -> CmMad<'_> {
    CmMad {
        header,
        message: CmMessage::Mra(Mra {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            message_mraed: kind,
            service_timeout: timeout,
            private_data,
        }),
    }
}

fn mra_max_bytes() -> Mad {
    let mut b = all_ones(0x03, [0x00, 0x11]);
    put(&mut b, D + 8, &[0xC0, 0xF8]); // 8: 3<<6; 9: 31<<3
    b
}

#[test]
fn mra_for_rep() {
    let pd = pattern::<222>(0x11);
    let mad = mra(
        MadHeader::send(0x0000_0001_0A0B_0C0D),
        (0x1122_3344, 0x5566_7788),
        MessageKind::Rep,
        24,
        &pd,
    );
    let mut b = header(0x03, [0, 0, 0, 0x01, 0x0A, 0x0B, 0x0C, 0x0D], [0x00, 0x11]);
    put(&mut b, D, &[0x11, 0x22, 0x33, 0x44]); // LocalCommID
    put(&mut b, D + 4, &[0x55, 0x66, 0x77, 0x88]); // RemoteCommID
    put(&mut b, D + 8, &[0x40, 0xC0]); // 8: REP 1<<6 = 0x40; 9: ServiceTimeout 24<<3 = 0xC0
    put(&mut b, D + 10, &pd); // 10: PrivateData (222)
    golden(&mad, &b, MRA_RESERVED);
}

#[test]
fn mra_message_kinds() {
    // (kind, byte 8)
    for (kind, b8) in [
        (MessageKind::Req, 0x00),
        (MessageKind::Rep, 0x40),
        (MessageKind::Other, 0x80),
        (MessageKind::Unknown(3), 0xC0),
    ] {
        let pd = [0u8; 222];
        let mad = mra(MadHeader::send(1), (1, 2), kind, 0, &pd);
        let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 1], [0x00, 0x11]);
        put(&mut b, D, &[0, 0, 0, 1, 0, 0, 0, 2, b8]);
        golden(&mad, &b, MRA_RESERVED);
    }
}

#[test]
fn mra_all_ones_and_halves() {
    let ones = [0xFF; 222];
    let zeros = [0u8; 222];
    golden(
        &mra(
            MAX_SEND,
            (u32::MAX, u32::MAX),
            MessageKind::Unknown(3),
            31,
            &ones,
        ),
        &mra_max_bytes(),
        MRA_RESERVED,
    );

    let a = mra(
        MadHeader::send(0xA),
        (u32::MAX, 0),
        MessageKind::Unknown(3),
        0,
        &ones,
    );
    let mut ab = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x11]);
    put(&mut ab, D, &[0xFF; 4]); // LocalCommID; 4: RemoteCommID 0
    put(&mut ab, D + 8, &[0xC0, 0x00]); // MessageMRAed 3<<6 | ServiceTimeout 0
    put(&mut ab, D + 10, &[0xFF; 222]);
    golden(&a, &ab, MRA_RESERVED);

    let b = mra(
        MadHeader::send(0xB),
        (0, u32::MAX),
        MessageKind::Req,
        31,
        &zeros,
    );
    let mut bb = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x11]);
    put(&mut bb, D + 4, &[0xFF; 4]); // RemoteCommID
    put(&mut bb, D + 8, &[0x00, 0xF8]); // REQ 0 | ServiceTimeout 31<<3
    golden(&b, &bb, MRA_RESERVED);

    assert_halves(&ab, &bb, &mra_max_bytes());
}

// ---------------------------------------------------------------------------------------
// REJ (Table 108)
// ---------------------------------------------------------------------------------------

const REJ_RESERVED: &[Reserved] = &[
    (D + 8, D + 9, 0x3F),  // 8[5:0] after MessageRejected
    (D + 9, D + 10, 0x01), // 9[0] after RejectedInfoLength
];

const CA_GUID: [u8; 8] = [0x00, 0x02, 0xC9, 0x03, 0x00, 0xAB, 0xCD, 0xEF];

fn rej<'a>(
    header: MadHeader,
    ids: (u32, u32),
    kind: MessageKind,
    reason: RejReason,
    ari: &'a [u8],
    private_data: &'a [u8],
) -> CmMad<'a> {
    CmMad {
        header,
        message: CmMessage::Rej(Rej {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            message_rejected: kind,
            reason,
            ari,
            private_data,
        }),
    }
}

fn rej_max_bytes() -> Mad {
    let mut b = all_ones(0x03, [0x00, 0x12]);
    // 8: MessageRejected 3<<6; 9: RejectedInfoLength 72<<1 = 0x90; 10: Reason 0xFFFF
    put(&mut b, D + 8, &[0xC0, 0x90]);
    b
}

#[test]
fn rej_timeout() {
    let pd = pattern::<148>(0x22);
    let mad = rej(
        MadHeader::send(0x0000_0001_0A0B_0C0D),
        (0x0A0B_0C0D, 0),
        MessageKind::Req,
        RejReason::Timeout,
        &CA_GUID,
        &pd,
    );
    let mut b = header(0x03, [0, 0, 0, 0x01, 0x0A, 0x0B, 0x0C, 0x0D], [0x00, 0x12]);
    put(&mut b, D, &[0x0A, 0x0B, 0x0C, 0x0D]); // LocalCommID; 4: RemoteCommID 0
    // 8: MessageRejected REQ 0<<6 = 0x00; 9: RejectedInfoLength 8<<1 = 0x10; 10: Reason 4
    put(&mut b, D + 8, &[0x00, 0x10, 0x00, 0x04]);
    put(&mut b, D + 12, &CA_GUID); // 12: ARI = the CA GUID
    put(&mut b, D + 84, &pd); // 84: PrivateData (148)
    // ARI bytes past RejectedInfoLength are not part of the message.
    golden(&mad, &b, &with(REJ_RESERVED, &[(D + 20, D + 84, 0xFF)]));
}

#[test]
fn rej_odd_ari_lengths() {
    let ari = pattern::<72>(0x90);
    // (ARI length, byte 9)
    for (len, b9) in [(1usize, 0x02u8), (71, 0x8E), (72, 0x90)] {
        let pd = [0u8; 148];
        let mad = rej(
            MadHeader::send(3),
            (5, 6),
            MessageKind::Rep,
            RejReason::InvalidGid,
            &ari[..len],
            &pd,
        );
        let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 3], [0x00, 0x12]);
        put(&mut b, D, &[0, 0, 0, 5, 0, 0, 0, 6]);
        put(&mut b, D + 8, &[0x40, b9, 0x00, 0x0C]); // REP 1<<6 | len<<1 | reason 12
        put(&mut b, D + 12, &ari[..len]);
        golden(
            &mad,
            &b,
            &with(REJ_RESERVED, &[(D + 12 + len, D + 84, 0xFF)]),
        );
    }
}

#[test]
fn rej_all_ones_and_halves() {
    let ones_ari = [0xFF; 72];
    let ones = [0xFF; 148];
    let zeros = [0u8; 148];
    golden(
        &rej(
            MAX_SEND,
            (u32::MAX, u32::MAX),
            MessageKind::Unknown(3),
            RejReason::Unknown(0xFFFF),
            &ones_ari,
            &ones,
        ),
        &rej_max_bytes(),
        REJ_RESERVED,
    );

    let a = rej(
        MadHeader::send(0xA),
        (u32::MAX, 0),
        MessageKind::Unknown(3),
        RejReason::Unknown(0xFFFF),
        &[],
        &ones,
    );
    let mut ab = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x12]);
    put(&mut ab, D, &[0xFF; 4]);
    put(&mut ab, D + 8, &[0xC0, 0x00, 0xFF, 0xFF]); // 3<<6 | len 0 | Reason 0xFFFF
    put(&mut ab, D + 84, &[0xFF; 148]);
    golden(&a, &ab, &with(REJ_RESERVED, &[(D + 12, D + 84, 0xFF)]));

    let b = rej(
        MadHeader::send(0xB),
        (0, u32::MAX),
        MessageKind::Req,
        RejReason::Unknown(0),
        &ones_ari,
        &zeros,
    );
    let mut bb = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x12]);
    put(&mut bb, D + 4, &[0xFF; 4]);
    put(&mut bb, D + 8, &[0x00, 0x90, 0x00, 0x00]); // REQ | 72<<1 | Reason 0
    put(&mut bb, D + 12, &[0xFF; 72]);
    golden(&b, &bb, REJ_RESERVED);

    assert_halves(&ab, &bb, &rej_max_bytes());
}

// ---------------------------------------------------------------------------------------
// REP (Table 110)
// ---------------------------------------------------------------------------------------

const REP_RESERVED: &[Reserved] = &[(D + 27, D + 28, 0x0F)]; // 27[3:0] after RNR, SRQ

fn rep(header: MadHeader, r: Rep<'_>) -> CmMad<'_> {
    CmMad {
        header,
        message: CmMessage::Rep(r),
    }
}

fn rep_v(private_data: &[u8]) -> Rep<'_> {
    Rep {
        local_comm_id: 0x0102_0304,
        remote_comm_id: 0x0A0B_0C0D,
        local_qkey: 0x1A2B_3C4D,
        local_qpn: 0x65_4321,
        local_eecn: 0x0F_EDCB,
        vendor_id: 0x02_C903,
        starting_psn: 0x78_9ABC,
        responder_resources: 4,
        initiator_depth: 8,
        target_ack_delay: 15,
        failover_accepted: Failover::NotSupported,
        end_to_end_flow_control: true,
        rnr_retry_count: 6,
        srq: true,
        local_ca_guid: 0x0002_C903_00AB_CDEF,
        private_data,
    }
}

fn rep_v_bytes(pd: &[u8]) -> Mad {
    let mut b = header(0x03, [0, 0, 0, 0x02, 0x0A, 0x0B, 0x0C, 0x0D], [0x00, 0x13]);
    put(&mut b, D, &[0x01, 0x02, 0x03, 0x04]); // LocalCommID
    put(&mut b, D + 4, &[0x0A, 0x0B, 0x0C, 0x0D]); // RemoteCommID
    put(&mut b, D + 8, &[0x1A, 0x2B, 0x3C, 0x4D]); // LocalQ_Key
    put(&mut b, D + 12, &[0x65, 0x43, 0x21, 0x02]); // LocalQPN | VendorID[23:16]
    put(&mut b, D + 16, &[0x0F, 0xED, 0xCB, 0xC9]); // LocalEECN | VendorID[15:8]
    put(&mut b, D + 20, &[0x78, 0x9A, 0xBC, 0x03]); // StartingPSN | VendorID[7:0]
    // 24: RespRes 4; 25: InitDepth 8;
    // 26: TargetACKDelay 15<<3 | Failover 1<<1 | E2E 1 = 0x7B; 27: RNR 6<<5 | SRQ 1<<4 = 0xD0
    put(&mut b, D + 24, &[0x04, 0x08, 0x7B, 0xD0]);
    put(&mut b, D + 28, &CA_GUID); // LocalCAGUID
    put(&mut b, D + 36, pd); // PrivateData (196)
    b
}

fn rep_max_bytes() -> Mad {
    let mut b = all_ones(0x03, [0x00, 0x13]);
    put(&mut b, D + 27, &[0xF0]); // RNR 7<<5 | SRQ 1<<4 | reserved
    b
}

#[test]
fn rep_vector() {
    let pd = pattern::<196>(0x33);
    let mad = rep(MadHeader::send(0x0000_0002_0A0B_0C0D), rep_v(&pd));
    let b = rep_v_bytes(&pd);
    golden(&mad, &b, REP_RESERVED);
    let mut short = pd;
    short[1..].fill(0);
    let mut out = [0u8; 256];
    rep(MadHeader::send(0x0000_0002_0A0B_0C0D), rep_v(&pd[..1]))
        .emit(&mut out)
        .unwrap();
    assert_mad_eq(&out, &rep_v_bytes(&short));
}

#[test]
fn rep_vendor_id_split_and_failover_codes() {
    // VendorID 0x123456: 0x12 at 15, 0x34 at 19, 0x56 at 23; everything else zero.
    let pd = [0u8; 196];
    let r = Rep {
        local_comm_id: 0,
        remote_comm_id: 0,
        local_qkey: 0,
        local_qpn: 0,
        local_eecn: 0,
        vendor_id: 0x12_3456,
        starting_psn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        target_ack_delay: 0,
        failover_accepted: Failover::Accepted,
        end_to_end_flow_control: false,
        rnr_retry_count: 0,
        srq: false,
        local_ca_guid: 0,
        private_data: &pd,
    };
    let mut b = header(0x03, [0; 8], [0x00, 0x13]);
    put(&mut b, D + 15, &[0x12]);
    put(&mut b, D + 19, &[0x34]);
    put(&mut b, D + 23, &[0x56]);
    golden(&rep(MadHeader::send(0), r), &b, REP_RESERVED);

    // (failover, byte 26)
    for (failover, b26) in [
        (Failover::Accepted, 0x00),
        (Failover::NotSupported, 0x02),
        (Failover::Rejected, 0x04),
        (Failover::Unknown(3), 0x06),
    ] {
        let r = Rep {
            vendor_id: 0,
            failover_accepted: failover,
            ..r
        };
        let mut b = header(0x03, [0; 8], [0x00, 0x13]);
        put(&mut b, D + 26, &[b26]);
        golden(&rep(MadHeader::send(0), r), &b, REP_RESERVED);
    }
}

#[test]
fn rep_all_ones_and_halves() {
    let ones = [0xFF; 196];
    let zeros = [0u8; 196];
    let max = Rep {
        local_comm_id: u32::MAX,
        remote_comm_id: u32::MAX,
        local_qkey: u32::MAX,
        local_qpn: 0xFF_FFFF,
        local_eecn: 0xFF_FFFF,
        vendor_id: 0xFF_FFFF,
        starting_psn: 0xFF_FFFF,
        responder_resources: 0xFF,
        initiator_depth: 0xFF,
        target_ack_delay: 31,
        failover_accepted: Failover::Unknown(3),
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: true,
        local_ca_guid: u64::MAX,
        private_data: &ones,
    };
    golden(&rep(MAX_SEND, max), &rep_max_bytes(), REP_RESERVED);

    let a = Rep {
        local_comm_id: u32::MAX,
        remote_comm_id: 0,
        local_qkey: u32::MAX,
        local_qpn: 0,
        local_eecn: 0,
        vendor_id: 0xFF_FFFF,
        starting_psn: 0,
        responder_resources: 0,
        initiator_depth: 0xFF,
        target_ack_delay: 0,
        failover_accepted: Failover::Unknown(3),
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: u64::MAX,
        private_data: &zeros,
    };
    let mut ab = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x13]);
    put(&mut ab, D, &[0xFF; 4]); // LocalCommID; 4: RemoteCommID 0
    put(&mut ab, D + 8, &[0xFF; 4]); // LocalQ_Key
    put(&mut ab, D + 12, &[0x00, 0x00, 0x00, 0xFF]); // QPN 0 | VendorID[23:16]
    put(&mut ab, D + 16, &[0x00, 0x00, 0x00, 0xFF]); // EECN 0 | VendorID[15:8]
    put(&mut ab, D + 20, &[0x00, 0x00, 0x00, 0xFF]); // PSN 0 | VendorID[7:0]
    // 24: RespRes 0 | InitDepth 0xFF | 26: 0<<3 | 3<<1 | 0 = 0x06 | 27: 7<<5 | SRQ 0 = 0xE0
    put(&mut ab, D + 24, &[0x00, 0xFF, 0x06, 0xE0]);
    put(&mut ab, D + 28, &[0xFF; 8]); // LocalCAGUID; 36: PrivateData 0
    golden(&rep(MadHeader::send(0xA), a), &ab, REP_RESERVED);

    let b = Rep {
        local_comm_id: 0,
        remote_comm_id: u32::MAX,
        local_qkey: 0,
        local_qpn: 0xFF_FFFF,
        local_eecn: 0xFF_FFFF,
        vendor_id: 0,
        starting_psn: 0xFF_FFFF,
        responder_resources: 0xFF,
        initiator_depth: 0,
        target_ack_delay: 31,
        failover_accepted: Failover::Accepted,
        end_to_end_flow_control: true,
        rnr_retry_count: 0,
        srq: true,
        local_ca_guid: 0,
        private_data: &ones,
    };
    let mut bb = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x13]);
    put(&mut bb, D + 4, &[0xFF; 4]); // RemoteCommID
    put(&mut bb, D + 12, &[0xFF, 0xFF, 0xFF, 0x00]); // QPN | VendorID[23:16] 0
    put(&mut bb, D + 16, &[0xFF, 0xFF, 0xFF, 0x00]);
    put(&mut bb, D + 20, &[0xFF, 0xFF, 0xFF, 0x00]);
    // 24: RespRes 0xFF | InitDepth 0 | 26: 31<<3 | 0 | 1 = 0xF9 | 27: RNR 0 | SRQ 1<<4 = 0x10
    put(&mut bb, D + 24, &[0xFF, 0x00, 0xF9, 0x10]);
    put(&mut bb, D + 36, &[0xFF; 196]);
    golden(&rep(MadHeader::send(0xB), b), &bb, REP_RESERVED);

    assert_halves(&ab, &bb, &rep_max_bytes());
}

// ---------------------------------------------------------------------------------------
// RTU (Table 111) and DREP (Table 113): LocalCommID 0, RemoteCommID 4, PrivateData 8 (224)
// ---------------------------------------------------------------------------------------

fn comm_ids(header: MadHeader, drep: bool, ids: (u32, u32), private_data: &[u8]) -> CmMad<'_> {
    let body = CommIds {
        local_comm_id: ids.0,
        remote_comm_id: ids.1,
        private_data,
    };
    CmMad {
        header,
        message: if drep {
            CmMessage::Drep(body)
        } else {
            CmMessage::Rtu(body)
        },
    }
}

#[test]
fn rtu_and_drep_vectors() {
    // (DREP?, attribute ID, LocalCommID, its bytes, RemoteCommID, its bytes)
    let cases = [
        (
            false,
            [0x00, 0x14],
            0x0123_4567,
            [0x01, 0x23, 0x45, 0x67],
            0x89AB_CDEF,
            [0x89, 0xAB, 0xCD, 0xEF],
        ),
        (
            true,
            [0x00, 0x16],
            0xDEAD_BEEF,
            [0xDE, 0xAD, 0xBE, 0xEF],
            0x0BAD_CAFE,
            [0x0B, 0xAD, 0xCA, 0xFE],
        ),
    ];
    for (drep, attr, local, local_bytes, remote, remote_bytes) in cases {
        let pd = pattern::<224>(0x44);
        let mad = comm_ids(MadHeader::send(0x0102), drep, (local, remote), &pd);
        let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0x01, 0x02], attr);
        put(&mut b, D, &local_bytes);
        put(&mut b, D + 4, &remote_bytes);
        put(&mut b, D + 8, &pd); // PrivateData (224)
        golden(&mad, &b, &[]);

        let ones = [0xFF; 224];
        let zeros = [0u8; 224];
        let max = all_ones(0x03, attr);
        golden(
            &comm_ids(MAX_SEND, drep, (u32::MAX, u32::MAX), &ones),
            &max,
            &[],
        );
        let mut ab = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], attr);
        put(&mut ab, D, &[0xFF; 4]);
        put(&mut ab, D + 8, &[0xFF; 224]);
        golden(
            &comm_ids(MadHeader::send(0xA), drep, (u32::MAX, 0), &ones),
            &ab,
            &[],
        );
        let mut bb = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], attr);
        put(&mut bb, D + 4, &[0xFF; 4]);
        golden(
            &comm_ids(MadHeader::send(0xB), drep, (0, u32::MAX), &zeros),
            &bb,
            &[],
        );
        assert_halves(&ab, &bb, &max);
    }
}

#[test]
fn header_fields() {
    // Status, ClassSpecific, TID and AttributeModifier each at its offset.
    let pd = [0u8; 224];
    let mad = CmMad {
        header: MadHeader {
            method: Method::Send,
            status: 0x0102,
            class_specific: 0x0304,
            transaction_id: 0x0506_0708_090A_0B0C,
            attribute_modifier: 0x0D0E_0F10,
        },
        message: CmMessage::Rtu(CommIds {
            local_comm_id: 0x1112_1314,
            remote_comm_id: 0x1516_1718,
            private_data: &pd,
        }),
    };
    let mut b = [0u8; 256];
    put(
        &mut b,
        0,
        &[
            0x01, 0x07, 0x02, 0x03, // BaseVersion, MgmtClass, ClassVersion, Method Send
            0x01, 0x02, 0x03, 0x04, // Status, ClassSpecific
            0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, // TransactionID
            0x00, 0x14, 0x00, 0x00, // AttributeID RTU, reserved
            0x0D, 0x0E, 0x0F, 0x10, // AttributeModifier
            0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // RTU comm IDs
        ],
    );
    golden(&mad, &b, &[]);
}

// ---------------------------------------------------------------------------------------
// DREQ (Table 112)
// ---------------------------------------------------------------------------------------

const DREQ_RESERVED: &[Reserved] = &[(D + 11, D + 12, 0xFF)]; // after RemoteQPN/EECN

fn dreq(header: MadHeader, ids: (u32, u32), qpn: u32, private_data: &[u8]) -> CmMad<'_> {
    CmMad {
        header,
        message: CmMessage::Dreq(Dreq {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            remote_qpn_eecn: qpn,
            private_data,
        }),
    }
}

#[test]
fn dreq_vectors() {
    let pd = pattern::<220>(0x55);
    let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x15], [0x00, 0x15]);
    put(&mut b, D, &[0x13, 0x57, 0x9B, 0xDF]); // LocalCommID
    put(&mut b, D + 4, &[0x24, 0x68, 0xAC, 0xE0]); // RemoteCommID
    put(&mut b, D + 8, &[0xAB, 0xCD, 0xEF, 0x00]); // RemoteQPN/EECN | reserved
    put(&mut b, D + 12, &pd); // PrivateData (220)
    golden(
        &dreq(
            MadHeader::send(0x15),
            (0x1357_9BDF, 0x2468_ACE0),
            0xAB_CDEF,
            &pd,
        ),
        &b,
        DREQ_RESERVED,
    );

    let ones = [0xFF; 220];
    let zeros = [0u8; 220];
    let mut max = all_ones(0x03, [0x00, 0x15]);
    put(&mut max, D + 11, &[0x00]);
    golden(
        &dreq(MAX_SEND, (u32::MAX, u32::MAX), 0xFF_FFFF, &ones),
        &max,
        DREQ_RESERVED,
    );

    // a: QPN and private data all ones around the reserved byte 11; b: the rest.
    let mut ab = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x15]);
    put(&mut ab, D, &[0xFF; 4]);
    put(&mut ab, D + 8, &[0xFF, 0xFF, 0xFF, 0x00]);
    put(&mut ab, D + 12, &[0xFF; 220]);
    golden(
        &dreq(MadHeader::send(0xA), (u32::MAX, 0), 0xFF_FFFF, &ones),
        &ab,
        DREQ_RESERVED,
    );
    let mut bb = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x15]);
    put(&mut bb, D + 4, &[0xFF; 4]);
    golden(
        &dreq(MadHeader::send(0xB), (0, u32::MAX), 0, &zeros),
        &bb,
        DREQ_RESERVED,
    );
    assert_halves(&ab, &bb, &max);
}

// ---------------------------------------------------------------------------------------
// LAP (Table 115)
// ---------------------------------------------------------------------------------------

const LAP_RESERVED: &[Reserved] = &[
    (D + 8, D + 12, 0xFF),  // 8..11 reserved
    (D + 15, D + 16, 0x07), // 15[2:0] after RemoteCMResponseTimeout
    (D + 16, D + 20, 0xFF), // 16..19 reserved
    (D + 58, D + 59, 0x0F), // AltFlowLabel word bits 11..8
    (D + 61, D + 62, 0xC0), // 61[7:6] before AltPacketRate
    (D + 62, D + 63, 0x07), // 62[2:0] after AltSL, AltSubnetLocal
    (D + 63, D + 64, 0x07), // 63[2:0] after AltLocalACKTimeout
];

const LAP_LGID: [u8; 16] = [
    0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xC9, 0x03, 0x00, 0x00, 0x00, 0x11,
];
const LAP_RGID: [u8; 16] = [
    0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xC9, 0x03, 0x00, 0x00, 0x00, 0x22,
];

fn lap<'a>(
    header: MadHeader,
    ids: (u32, u32),
    qpn: u32,
    timeout: u8,
    path: Path,
    private_data: &'a [u8],
) -> CmMad<'a> {
    CmMad {
        header,
        message: CmMessage::Lap(Lap {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            remote_qpn_eecn: qpn,
            remote_cm_response_timeout: timeout,
            alternate_path: path,
            private_data,
        }),
    }
}

fn lap_max_bytes() -> Mad {
    let mut b = all_ones(0x03, [0x00, 0x19]);
    put(&mut b, D + 8, &[0x00; 4]); // reserved
    put(&mut b, D + 15, &[0xF8, 0x00, 0x00, 0x00, 0x00]); // 31<<3 | reserved; 16..19
    put(&mut b, D + 58, &[0xF0]); // FlowLabel low nibble reserved
    put(&mut b, D + 61, &[0x3F, 0xF8, 0xF8]); // rate 63 | SL 15<<4, SL 1<<3 | ACK 31<<3
    b
}

#[test]
fn lap_vector() {
    let pd = pattern::<168>(0x66);
    let path = Path {
        local_lid: 0x0011,
        remote_lid: 0x0022,
        local_gid: LAP_LGID,
        remote_gid: LAP_RGID,
        flow_label: 0x5_4321,
        packet_rate: Rate::Gbps56,
        traffic_class: 0x1C,
        hop_limit: 0x02,
        sl: 5,
        subnet_local: true,
        local_ack_timeout: 19,
    };
    let mad = lap(
        MadHeader::send(0x19),
        (0x1020_3040, 0x5060_7080),
        0x12_3456,
        22,
        path,
        &pd,
    );
    let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x19], [0x00, 0x19]);
    put(&mut b, D, &[0x10, 0x20, 0x30, 0x40]); // LocalCommID
    put(&mut b, D + 4, &[0x50, 0x60, 0x70, 0x80]); // RemoteCommID; 8..11 reserved
    // 12: RemoteQPN/EECN; 15: RemoteCMResponseTimeout 22<<3 = 0xB0; 16..19 reserved
    put(&mut b, D + 12, &[0x12, 0x34, 0x56, 0xB0]);
    put(&mut b, D + 20, &[0x00, 0x11, 0x00, 0x22]); // AltLocalPortLID | AltRemotePortLID
    put(&mut b, D + 24, &LAP_LGID);
    put(&mut b, D + 40, &LAP_RGID);
    // 56: AltFlowLabel 0x54321 = 54 32 1_; 59: AltTrafficClass
    put(&mut b, D + 56, &[0x54, 0x32, 0x10, 0x1C]);
    // 60: AltHopLimit; 61: AltPacketRate 12 (56 Gb/s); 62: SL 5<<4 | SubnetLocal 1<<3 = 0x58;
    // 63: AltLocalACKTimeout 19<<3 = 0x98
    put(&mut b, D + 60, &[0x02, 0x0C, 0x58, 0x98]);
    put(&mut b, D + 64, &pd); // PrivateData (168)
    golden(&mad, &b, LAP_RESERVED);
}

#[test]
fn lap_all_ones_and_halves() {
    let ones = [0xFF; 168];
    let zeros = [0u8; 168];
    golden(
        &lap(
            MAX_SEND,
            (u32::MAX, u32::MAX),
            0xFF_FFFF,
            31,
            all_ones_path(),
            &ones,
        ),
        &lap_max_bytes(),
        LAP_RESERVED,
    );

    let a_path = Path {
        local_lid: 0xFFFF,
        remote_lid: 0,
        local_gid: [0xFF; 16],
        remote_gid: [0; 16],
        flow_label: 0xF_FFFF,
        packet_rate: Rate::Unknown(0),
        traffic_class: 0,
        hop_limit: 0xFF,
        sl: 15,
        subnet_local: false,
        local_ack_timeout: 31,
    };
    let a = lap(
        MadHeader::send(0xA),
        (u32::MAX, 0),
        0xFF_FFFF,
        0,
        a_path,
        &zeros,
    );
    let mut ab = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x19]);
    put(&mut ab, D, &[0xFF; 4]);
    put(&mut ab, D + 12, &[0xFF, 0xFF, 0xFF, 0x00]); // QPN | timeout 0
    put(&mut ab, D + 20, &[0xFF, 0xFF, 0x00, 0x00]); // LIDs
    put(&mut ab, D + 24, &[0xFF; 16]); // AltLocalPortGID
    put(&mut ab, D + 56, &[0xFF, 0xFF, 0xF0, 0x00]); // FlowLabel | TC 0
    put(&mut ab, D + 60, &[0xFF, 0x00, 0xF0, 0xF8]); // HL | rate 0 | SL 15<<4 | ACK 31<<3
    golden(&a, &ab, LAP_RESERVED);

    let b_path = Path {
        local_lid: 0,
        remote_lid: 0xFFFF,
        local_gid: [0; 16],
        remote_gid: [0xFF; 16],
        flow_label: 0,
        packet_rate: Rate::Unknown(63),
        traffic_class: 0xFF,
        hop_limit: 0,
        sl: 0,
        subnet_local: true,
        local_ack_timeout: 0,
    };
    let b = lap(MadHeader::send(0xB), (0, u32::MAX), 0, 31, b_path, &ones);
    let mut bb = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x19]);
    put(&mut bb, D + 4, &[0xFF; 4]);
    put(&mut bb, D + 12, &[0x00, 0x00, 0x00, 0xF8]); // QPN 0 | 31<<3
    put(&mut bb, D + 20, &[0x00, 0x00, 0xFF, 0xFF]);
    put(&mut bb, D + 40, &[0xFF; 16]); // AltRemotePortGID
    put(&mut bb, D + 56, &[0x00, 0x00, 0x00, 0xFF]); // FlowLabel 0 | TC
    put(&mut bb, D + 60, &[0x00, 0x3F, 0x08, 0x00]); // HL 0 | rate 63 | SubnetLocal 1<<3 | ACK 0
    put(&mut bb, D + 64, &[0xFF; 168]);
    golden(&b, &bb, LAP_RESERVED);

    assert_halves(&ab, &bb, &lap_max_bytes());
}

// ---------------------------------------------------------------------------------------
// APR (Table 116)
// ---------------------------------------------------------------------------------------

const APR_RESERVED: &[Reserved] = &[(D + 10, D + 12, 0xFF)]; // 10..11 reserved

const APR_GID: [u8; 16] = [
    0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xC9, 0x03, 0x00, 0x00, 0x00, 0x33,
];

fn apr<'a>(
    header: MadHeader,
    ids: (u32, u32),
    status: AprStatus,
    info: &'a [u8],
    private_data: &'a [u8],
) -> CmMad<'a> {
    CmMad {
        header,
        message: CmMessage::Apr(Apr {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            status,
            additional_info: info,
            private_data,
        }),
    }
}

fn apr_max_bytes() -> Mad {
    let mut b = all_ones(0x03, [0x00, 0x1A]);
    // 8: AdditionalInfoLength 72; 9: APStatus 0xFF; 10..11 reserved
    put(&mut b, D + 8, &[0x48, 0xFF, 0x00, 0x00]);
    b
}

#[test]
fn apr_vector() {
    let pd = pattern::<148>(0x77);
    let mad = apr(
        MadHeader::send(0x1A),
        (0xA1A2_A3A4, 0xB1B2_B3B4),
        AprStatus::InvalidGid,
        &APR_GID,
        &pd,
    );
    let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x1A], [0x00, 0x1A]);
    put(&mut b, D, &[0xA1, 0xA2, 0xA3, 0xA4]); // LocalCommID
    put(&mut b, D + 4, &[0xB1, 0xB2, 0xB3, 0xB4]); // RemoteCommID
    put(&mut b, D + 8, &[0x10, 0x08, 0x00, 0x00]); // InfoLength 16 | APStatus 8 | reserved
    put(&mut b, D + 12, &APR_GID); // AdditionalInfo
    put(&mut b, D + 84, &pd); // PrivateData (148)
    golden(&mad, &b, &with(APR_RESERVED, &[(D + 28, D + 84, 0xFF)]));
}

#[test]
fn apr_all_ones_and_halves() {
    let ones_info = [0xFF; 72];
    let ones = [0xFF; 148];
    let zeros = [0u8; 148];
    golden(
        &apr(
            MAX_SEND,
            (u32::MAX, u32::MAX),
            AprStatus::Unknown(0xFF),
            &ones_info,
            &ones,
        ),
        &apr_max_bytes(),
        APR_RESERVED,
    );

    let a = apr(
        MadHeader::send(0xA),
        (u32::MAX, 0),
        AprStatus::Success,
        &ones_info,
        &ones,
    );
    let mut ab = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x1A]);
    put(&mut ab, D, &[0xFF; 4]);
    put(&mut ab, D + 8, &[0x48, 0x00, 0x00, 0x00]); // length 72 | Success
    put(&mut ab, D + 12, &[0xFF; 72]);
    put(&mut ab, D + 84, &[0xFF; 148]);
    golden(&a, &ab, APR_RESERVED);

    let b = apr(
        MadHeader::send(0xB),
        (0, u32::MAX),
        AprStatus::Unknown(0xFF),
        &[],
        &zeros,
    );
    let mut bb = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x1A]);
    put(&mut bb, D + 4, &[0xFF; 4]);
    put(&mut bb, D + 8, &[0x00, 0xFF, 0x00, 0x00]); // length 0 | status 0xFF
    golden(&b, &bb, &with(APR_RESERVED, &[(D + 12, D + 84, 0xFF)]));

    assert_halves(&ab, &bb, &apr_max_bytes());
}

// ---------------------------------------------------------------------------------------
// SIDR_REQ (Table 119)
// ---------------------------------------------------------------------------------------

const SIDR_REQ_RESERVED: &[Reserved] = &[(D + 6, D + 8, 0xFF)]; // 6..7 reserved

fn sidr_req(
    header: MadHeader,
    request_id: u32,
    pkey: u16,
    service_id: u64,
    private_data: &[u8],
) -> CmMad<'_> {
    CmMad {
        header,
        message: CmMessage::SidrReq(SidrReq {
            request_id,
            partition_key: pkey,
            service_id,
            private_data,
        }),
    }
}

#[test]
fn sidr_req_vectors() {
    let pd = pattern::<216>(0x88);
    let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x17], [0x00, 0x17]);
    put(&mut b, D, &[0x0B, 0xAD, 0xF0, 0x0D]); // RequestID
    put(&mut b, D + 4, &[0x7F, 0xFF, 0x00, 0x00]); // PartitionKey | reserved
    put(
        &mut b,
        D + 8,
        &[0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x1F, 0x90],
    ); // ServiceID
    put(&mut b, D + 16, &pd); // PrivateData (216)
    golden(
        &sidr_req(MadHeader::send(0x17), 0x0BAD_F00D, 0x7FFF, 0x0111_1F90, &pd),
        &b,
        SIDR_REQ_RESERVED,
    );

    let ones = [0xFF; 216];
    let zeros = [0u8; 216];
    let mut max = all_ones(0x03, [0x00, 0x17]);
    put(&mut max, D + 6, &[0x00, 0x00]);
    golden(
        &sidr_req(MAX_SEND, u32::MAX, 0xFFFF, u64::MAX, &ones),
        &max,
        SIDR_REQ_RESERVED,
    );
    let mut ab = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x17]);
    put(&mut ab, D, &[0xFF; 4]); // RequestID; 4: P_Key 0
    put(&mut ab, D + 8, &[0xFF; 8]); // ServiceID; 16: PrivateData 0
    golden(
        &sidr_req(MadHeader::send(0xA), u32::MAX, 0, u64::MAX, &zeros),
        &ab,
        SIDR_REQ_RESERVED,
    );
    let mut bb = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x17]);
    put(&mut bb, D + 4, &[0xFF, 0xFF, 0x00, 0x00]); // P_Key | reserved
    put(&mut bb, D + 16, &[0xFF; 216]);
    golden(
        &sidr_req(MadHeader::send(0xB), 0, 0xFFFF, 0, &ones),
        &bb,
        SIDR_REQ_RESERVED,
    );
    assert_halves(&ab, &bb, &max);
}

// ---------------------------------------------------------------------------------------
// SIDR_REP (Table 120)
// ---------------------------------------------------------------------------------------

/// None: bytes 6..7 and 11 carry the VendorID (IBA 1.4 ECE; Linux
/// `CM_SIDR_REP_VENDOR_ID_H` / `_L`), as the REQ's and REP's spare bytes do.
const SIDR_REP_RESERVED: &[Reserved] = &[];

/// `mad` (a SIDR_REP) with the given VendorID.
fn with_vendor(mut mad: CmMad<'_>, vendor_id: u32) -> CmMad<'_> {
    if let CmMessage::SidrRep(r) = &mut mad.message {
        r.vendor_id = vendor_id;
    }
    mad
}

#[allow(clippy::too_many_arguments)]
fn sidr_rep<'a>(
    header: MadHeader,
    request_id: u32,
    status: SidrStatus,
    qpn: u32,
    service_id: u64,
    qkey: u32,
    info: &'a [u8],
    private_data: &'a [u8],
) -> CmMad<'a> {
    CmMad {
        header,
        message: CmMessage::SidrRep(SidrRep {
            request_id,
            status,
            vendor_id: 0,
            qpn,
            service_id,
            qkey,
            additional_info: info,
            private_data,
        }),
    }
}

fn sidr_rep_max_bytes() -> Mad {
    let mut b = all_ones(0x03, [0x00, 0x18]);
    put(&mut b, D + 4, &[0xFF, 0x48]); // Status | InfoLength 72; 6..7 VendorID high
    b
}

#[test]
fn sidr_rep_vectors() {
    let pd = pattern::<136>(0x99);
    let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x18], [0x00, 0x18]);
    put(&mut b, D, &[0x0B, 0xAD, 0xF0, 0x0D]); // RequestID
    put(&mut b, D + 4, &[0x00, 0x00, 0x00, 0x00]); // Status 0 | InfoLength 0 | reserved
    put(&mut b, D + 8, &[0x9A, 0x8B, 0x7C, 0x00]); // QPN | reserved
    put(
        &mut b,
        D + 12,
        &[0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x1F, 0x90],
    ); // ServiceID
    put(&mut b, D + 20, &[0x01, 0x23, 0x45, 0x67]); // Q_Key
    put(&mut b, D + 96, &pd); // PrivateData (136)
    golden(
        &sidr_rep(
            MadHeader::send(0x18),
            0x0BAD_F00D,
            SidrStatus::Success,
            0x9A_8B7C,
            0x0111_1F90,
            0x0123_4567,
            &[],
            &pd,
        ),
        &b,
        &with(SIDR_REP_RESERVED, &[(D + 24, D + 96, 0xFF)]),
    );

    // A REJECT with 5 bytes of additional information.
    let info = [0xC1, 0xC2, 0xC3, 0xC4, 0xC5];
    let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x18], [0x00, 0x18]);
    put(&mut b, D, &[0x0B, 0xAD, 0xF0, 0x0D]);
    put(&mut b, D + 4, &[0x02, 0x05]); // Status REJECT 2 | InfoLength 5
    put(&mut b, D + 24, &info);
    let zeros = [0u8; 136];
    golden(
        &sidr_rep(
            MadHeader::send(0x18),
            0x0BAD_F00D,
            SidrStatus::Reject,
            0,
            0,
            0,
            &info,
            &zeros,
        ),
        &b,
        &with(SIDR_REP_RESERVED, &[(D + 29, D + 96, 0xFF)]),
    );
}

#[test]
fn sidr_rep_all_ones_and_halves() {
    let ones_info = [0xFF; 72];
    let ones = [0xFF; 136];
    let zeros = [0u8; 136];
    golden(
        &with_vendor(
            sidr_rep(
                MAX_SEND,
                u32::MAX,
                SidrStatus::Unknown(0xFF),
                0xFF_FFFF,
                u64::MAX,
                u32::MAX,
                &ones_info,
                &ones,
            ),
            0xFF_FFFF,
        ),
        &sidr_rep_max_bytes(),
        SIDR_REP_RESERVED,
    );

    let mut ab = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x18]);
    put(&mut ab, D, &[0xFF; 4]); // RequestID
    put(&mut ab, D + 4, &[0x00, 0x48]); // Status 0 | InfoLength 72; 8: QPN 0
    put(&mut ab, D + 12, &[0xFF; 8]); // ServiceID; 20: Q_Key 0
    put(&mut ab, D + 24, &[0xFF; 72]); // AdditionalInfo
    put(&mut ab, D + 96, &[0xFF; 136]);
    golden(
        &sidr_rep(
            MadHeader::send(0xA),
            u32::MAX,
            SidrStatus::Success,
            0,
            u64::MAX,
            0,
            &ones_info,
            &ones,
        ),
        &ab,
        SIDR_REP_RESERVED,
    );

    let mut bb = header(0x03, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x18]);
    put(&mut bb, D + 4, &[0xFF, 0x00, 0xFF, 0xFF]); // Status 0xFF | InfoLength 0 | VendorID hi
    put(&mut bb, D + 8, &[0xFF, 0xFF, 0xFF, 0xFF]); // QPN | VendorID low
    put(&mut bb, D + 20, &[0xFF; 4]); // Q_Key
    golden(
        &with_vendor(
            sidr_rep(
                MadHeader::send(0xB),
                0,
                SidrStatus::Unknown(0xFF),
                0xFF_FFFF,
                0,
                u32::MAX,
                &[],
                &zeros,
            ),
            0xFF_FFFF,
        ),
        &bb,
        &with(SIDR_REP_RESERVED, &[(D + 24, D + 96, 0xFF)]),
    );

    assert_halves(&ab, &bb, &sidr_rep_max_bytes());
}

// ---------------------------------------------------------------------------------------
// ClassPortInfo (IBA 13.4.8.1, Table 146): Get and GetResp
// ---------------------------------------------------------------------------------------

const CPI_RESERVED: &[Reserved] = &[
    (D + 32, D + 33, 0xFF),  // reserved byte before RedirectQP
    (D + 72, D + 232, 0xFF), // CM data past the 72-byte attribute
];

fn cpi(header: MadHeader, info: ClassPortInfo) -> CmMad<'static> {
    CmMad {
        header,
        message: CmMessage::ClassPortInfo(info),
    }
}

fn get_resp(tid: u64) -> MadHeader {
    MadHeader {
        method: Method::GetResp,
        ..MadHeader::send(tid)
    }
}

#[test]
fn class_port_info_get() {
    let mad = cpi(
        MadHeader {
            method: Method::Get,
            ..MadHeader::send(0x0102_0304)
        },
        ClassPortInfo::default(),
    );
    // Method Get 0x01, AttributeID 0x0001, and nothing else.
    let b = header(0x01, [0, 0, 0, 0, 0x01, 0x02, 0x03, 0x04], [0x00, 0x01]);
    golden(&mad, &b, CPI_RESERVED);
}

#[test]
fn class_port_info_get_resp() {
    let redirect_gid = pattern::<16>(0xD0);
    let trap_gid = pattern::<16>(0xE0);
    let info = ClassPortInfo {
        base_version: 1,
        class_version: 2,
        capability_mask: 0x0102,
        capability_mask2: 0x034_5678,
        resp_time_value: 18,
        redirect: CpiTarget {
            gid: redirect_gid,
            traffic_class: 0xA0,
            sl: 0xB,
            flow_label: 0x1_2345,
            lid: 0x0C0D,
            pkey: 0x8001,
            qp: 0x12_3456,
            qkey: 0x1122_3344,
        },
        trap: CpiTarget {
            gid: trap_gid,
            traffic_class: 0x5C,
            sl: 3,
            flow_label: 0xF_EDCB,
            lid: 0x0E0F,
            pkey: 0x7FFF,
            qp: 0x65_4321,
            qkey: 0x5566_7788,
        },
        trap_hop_limit: 0x40,
    };
    let mut b = header(0x81, [0, 0, 0, 0, 0x01, 0x02, 0x03, 0x04], [0x00, 0x01]);
    // 0: BaseVersion 1 | ClassVersion 2 | CapabilityMask 0x0102
    put(&mut b, D, &[0x01, 0x02, 0x01, 0x02]);
    // 4: CapabilityMask2 0x0345678 << 5 | RespTimeValue 18 = 0x068ACF12
    put(&mut b, D + 4, &[0x06, 0x8A, 0xCF, 0x12]);
    put(&mut b, D + 8, &redirect_gid);
    // 24: RedirectTC 0xA0 << 24 | RedirectSL 0xB << 20 | RedirectFL 0x12345 = 0xA0B12345
    put(&mut b, D + 24, &[0xA0, 0xB1, 0x23, 0x45]);
    put(&mut b, D + 28, &[0x0C, 0x0D, 0x80, 0x01]); // RedirectLID | RedirectP_Key
    put(&mut b, D + 32, &[0x00, 0x12, 0x34, 0x56]); // reserved | RedirectQP
    put(&mut b, D + 36, &[0x11, 0x22, 0x33, 0x44]); // RedirectQ_Key
    put(&mut b, D + 40, &trap_gid);
    // 56: TrapTC 0x5C << 24 | TrapSL 3 << 20 | TrapFL 0xFEDCB = 0x5C3FEDCB
    put(&mut b, D + 56, &[0x5C, 0x3F, 0xED, 0xCB]);
    put(&mut b, D + 60, &[0x0E, 0x0F, 0x7F, 0xFF]); // TrapLID | TrapP_Key
    put(&mut b, D + 64, &[0x40, 0x65, 0x43, 0x21]); // TrapHL | TrapQP
    put(&mut b, D + 68, &[0x55, 0x66, 0x77, 0x88]); // TrapQ_Key
    golden(&cpi(get_resp(0x0102_0304), info), &b, CPI_RESERVED);
}

#[test]
fn class_port_info_all_ones_and_halves() {
    let ones_target = CpiTarget {
        gid: [0xFF; 16],
        traffic_class: 0xFF,
        sl: 15,
        flow_label: 0xF_FFFF,
        lid: 0xFFFF,
        pkey: 0xFFFF,
        qp: 0xFF_FFFF,
        qkey: u32::MAX,
    };
    let max = ClassPortInfo {
        base_version: 0xFF,
        class_version: 0xFF,
        capability_mask: 0xFFFF,
        capability_mask2: 0x7FF_FFFF,
        resp_time_value: 31,
        redirect: ones_target,
        trap: ones_target,
        trap_hop_limit: 0xFF,
    };
    let mut max_bytes = all_ones(0x81, [0x00, 0x01]);
    put(&mut max_bytes, D + 32, &[0x00]); // reserved
    max_bytes[D + 72..].fill(0x00); // past the attribute
    golden(&cpi(MAX_GET_RESP, max), &max_bytes, CPI_RESERVED);

    // a: base, cap, resp, TC, FL, P_Key, Q_Key(redirect), TrapTC, TrapFL, TrapP_Key, TrapQP.
    let a = ClassPortInfo {
        base_version: 0xFF,
        class_version: 0,
        capability_mask: 0xFFFF,
        capability_mask2: 0,
        resp_time_value: 31,
        redirect: CpiTarget {
            gid: [0; 16],
            traffic_class: 0xFF,
            sl: 0,
            flow_label: 0xF_FFFF,
            lid: 0,
            pkey: 0xFFFF,
            qp: 0,
            qkey: u32::MAX,
        },
        trap: CpiTarget {
            gid: [0; 16],
            traffic_class: 0xFF,
            sl: 0,
            flow_label: 0xF_FFFF,
            lid: 0,
            pkey: 0xFFFF,
            qp: 0xFF_FFFF,
            qkey: 0,
        },
        trap_hop_limit: 0,
    };
    let mut ab = header(0x81, [0, 0, 0, 0, 0, 0, 0, 0x0A], [0x00, 0x01]);
    put(&mut ab, D, &[0xFF, 0x00, 0xFF, 0xFF]); // Base | Class 0 | CapabilityMask
    put(&mut ab, D + 4, &[0x00, 0x00, 0x00, 0x1F]); // CapMask2 0 | RespTimeValue 31
    put(&mut ab, D + 24, &[0xFF, 0x0F, 0xFF, 0xFF]); // TC 0xFF | SL 0 | FL 0xFFFFF
    put(&mut ab, D + 28, &[0x00, 0x00, 0xFF, 0xFF]); // LID 0 | P_Key; 32: reserved, QP 0
    put(&mut ab, D + 36, &[0xFF; 4]); // RedirectQ_Key; 40: TrapGID 0
    put(&mut ab, D + 56, &[0xFF, 0x0F, 0xFF, 0xFF]); // TrapTC | SL 0 | FL
    put(&mut ab, D + 60, &[0x00, 0x00, 0xFF, 0xFF]); // TrapLID 0 | TrapP_Key
    put(&mut ab, D + 64, &[0x00, 0xFF, 0xFF, 0xFF]); // TrapHL 0 | TrapQP; 68: Q_Key 0
    golden(&cpi(get_resp(0xA), a), &ab, CPI_RESERVED);

    let b = ClassPortInfo {
        base_version: 0,
        class_version: 0xFF,
        capability_mask: 0,
        capability_mask2: 0x7FF_FFFF,
        resp_time_value: 0,
        redirect: CpiTarget {
            gid: [0xFF; 16],
            traffic_class: 0,
            sl: 15,
            flow_label: 0,
            lid: 0xFFFF,
            pkey: 0,
            qp: 0xFF_FFFF,
            qkey: 0,
        },
        trap: CpiTarget {
            gid: [0xFF; 16],
            traffic_class: 0,
            sl: 15,
            flow_label: 0,
            lid: 0xFFFF,
            pkey: 0,
            qp: 0,
            qkey: u32::MAX,
        },
        trap_hop_limit: 0xFF,
    };
    let mut bb = header(0x81, [0, 0, 0, 0, 0, 0, 0, 0x0B], [0x00, 0x01]);
    put(&mut bb, D, &[0x00, 0xFF, 0x00, 0x00]);
    put(&mut bb, D + 4, &[0xFF, 0xFF, 0xFF, 0xE0]); // CapMask2 0x7FFFFFF << 5 | 0
    put(&mut bb, D + 8, &[0xFF; 16]); // RedirectGID
    put(&mut bb, D + 24, &[0x00, 0xF0, 0x00, 0x00]); // TC 0 | SL 15 << 20 | FL 0
    put(&mut bb, D + 28, &[0xFF, 0xFF, 0x00, 0x00]); // LID | P_Key 0
    put(&mut bb, D + 32, &[0x00, 0xFF, 0xFF, 0xFF]); // reserved | RedirectQP
    put(&mut bb, D + 40, &[0xFF; 16]); // TrapGID
    put(&mut bb, D + 56, &[0x00, 0xF0, 0x00, 0x00]);
    put(&mut bb, D + 60, &[0xFF, 0xFF, 0x00, 0x00]);
    put(&mut bb, D + 64, &[0xFF, 0x00, 0x00, 0x00]); // TrapHL | TrapQP 0
    put(&mut bb, D + 68, &[0xFF; 4]); // TrapQ_Key
    golden(&cpi(get_resp(0xB), b), &bb, CPI_RESERVED);

    assert_halves(&ab, &bb, &max_bytes);
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

fn rtu_bytes() -> Mad {
    let mut b = header(0x03, [0, 0, 0, 0, 0, 0, 0, 1], [0x00, 0x14]);
    put(&mut b, D, &[0, 0, 0, 1, 0, 0, 0, 2]);
    b
}

#[test]
fn parse_errors_in_the_header() {
    let good = rtu_bytes();
    assert!(CmMad::parse(&good).is_ok());

    assert_eq!(
        CmMad::parse(&good[..255]),
        Err(Error::Truncated { len: 255 })
    );
    assert_eq!(CmMad::parse(&[]), Err(Error::Truncated { len: 0 }));

    let mut b = good;
    b[0] = 2;
    assert_eq!(CmMad::parse(&b), Err(Error::BaseVersion(2)));
    let mut b = good;
    b[1] = 0x04;
    assert_eq!(CmMad::parse(&b), Err(Error::MgmtClass(0x04)));
    let mut b = good;
    b[2] = 1;
    assert_eq!(CmMad::parse(&b), Err(Error::ClassVersion(1)));

    // REQ with method Get / GetResp: every CM message is a Send.
    let mut b = req_v_bytes(&[0; 92]);
    b[3] = 0x01;
    assert_eq!(
        CmMad::parse(&b),
        Err(Error::Method {
            method: 0x01,
            attribute: 0x0010
        })
    );
    b[3] = 0x81;
    assert_eq!(
        CmMad::parse(&b),
        Err(Error::Method {
            method: 0x81,
            attribute: 0x0010
        })
    );
    // ClassPortInfo with method Send.
    let mut b = header(0x03, [0; 8], [0x00, 0x01]);
    assert_eq!(
        CmMad::parse(&b),
        Err(Error::Method {
            method: 0x03,
            attribute: 0x0001
        })
    );
    b[3] = 0x02;
    assert_eq!(
        CmMad::parse(&b),
        Err(Error::Method {
            method: 0x02,
            attribute: 0x0001
        })
    );

    // Unknown attribute.
    let mut b = good;
    b[16] = 0x00;
    b[17] = 0x20;
    assert_eq!(CmMad::parse(&b), Err(Error::UnknownAttribute(0x0020)));
    b[17] = 0x00;
    assert_eq!(CmMad::parse(&b), Err(Error::UnknownAttribute(0x0000)));
    b[16] = 0x80;
    b[17] = 0x10;
    assert_eq!(CmMad::parse(&b), Err(Error::UnknownAttribute(0x8010)));
}

/// IBA Tables 108, 116 and 120 give RejectedInfoLength / AdditionalInfoLength fields of at
/// most 72; a peer's larger value is clamped to 72 and reported by
/// `CmMad::length_clamped`, never refused: a REJ refused leaves the active side waiting
/// out a whole REQ timeout (Linux `cm_format_rej_event` passes the length through).
#[test]
fn length_fields_over_72_are_clamped_and_flagged_never_refused() {
    let ari: Vec<u8> = (0..72).collect();
    // REJ: RejectedInfoLength is 9[7:1]; 72<<1 = 0x90, 73<<1 = 0x92, 127<<1 | 1 = 0xFF.
    let mut b = header(0x03, [0; 8], [0x00, 0x12]);
    put(&mut b, D + 10, &[0x00, 0x01]); // Reason 1
    put(&mut b, D + 12, &ari);
    for (byte, clamped) in [(0x90u8, false), (0x92, true), (0xFF, true)] {
        put(&mut b, D + 9, &[byte]);
        let CmMessage::Rej(rej) = CmMad::parse(&b).expect("a REJ is never refused").message else {
            panic!("not a REJ")
        };
        assert_eq!(
            (rej.ari, rej.reason),
            (&ari[..], RejReason::NoQp),
            "{byte:#x}"
        );
        assert_eq!(CmMad::length_clamped(&b), clamped, "{byte:#x}");
    }

    // APR: AdditionalInfoLength is byte 8.
    let mut b = header(0x03, [0; 8], [0x00, 0x1A]);
    put(&mut b, D + 12, &ari);
    for (len, clamped) in [(72u8, false), (73, true), (0xFF, true)] {
        put(&mut b, D + 8, &[len]);
        let CmMessage::Apr(apr) = CmMad::parse(&b).expect("an APR is never refused").message else {
            panic!("not an APR")
        };
        assert_eq!(apr.additional_info, &ari[..], "{len}");
        assert_eq!(CmMad::length_clamped(&b), clamped, "{len}");
    }

    // SIDR_REP: AdditionalInfoLength is byte 5.
    let mut b = header(0x03, [0; 8], [0x00, 0x18]);
    put(&mut b, D + 24, &ari);
    for (len, clamped) in [(72u8, false), (73, true), (0xFF, true)] {
        put(&mut b, D + 5, &[len]);
        let CmMessage::SidrRep(rep) = CmMad::parse(&b)
            .expect("a SIDR_REP is never refused")
            .message
        else {
            panic!("not a SIDR_REP")
        };
        assert_eq!(rep.additional_info, &ari[..], "{len}");
        assert_eq!(CmMad::length_clamped(&b), clamped, "{len}");
    }
    // Other attributes never report a clamp.
    assert!(!CmMad::length_clamped(&header(0x03, [0; 8], [0x00, 0x10])));
    assert!(!CmMad::length_clamped(&[]));
}

/// Linux `CM_SIDR_REP_VENDOR_ID_H` (16 bits at 6) and `CM_SIDR_REP_VENDOR_ID_L` (8 bits
/// at 11): the SIDR_REP carries the ECE VendorID as the REQ and REP do.
#[test]
fn sidr_rep_carries_the_ece_vendor_id_in_bytes_6_7_and_11() {
    let mut b = header(0x03, [0; 8], [0x00, 0x18]);
    put(&mut b, D + 6, &[0xAB, 0xCD, 0x12, 0x34, 0x56, 0xEF]); // Vendor hi | QPN | Vendor lo
    let CmMessage::SidrRep(rep) = CmMad::parse(&b).unwrap().message else {
        panic!("not a SIDR_REP")
    };
    assert_eq!((rep.vendor_id, rep.qpn), (0xAB_CDEF, 0x12_3456));
    let mut out = [0u8; 256];
    send(0, CmMessage::SidrRep(rep)).emit(&mut out).unwrap();
    assert_eq!(&out[D + 6..D + 12], &[0xAB, 0xCD, 0x12, 0x34, 0x56, 0xEF]);
}

/// Emit fails with `err`, and neither a full nor a short buffer is touched.
#[track_caller]
fn assert_emit_err(mad: &CmMad<'_>, err: Error) {
    assert_eq!(mad.check(), Err(err));
    let mut buf = [0x5Au8; 256];
    assert_eq!(mad.emit(&mut buf), Err(err));
    assert!(buf.iter().all(|&b| b == 0x5A), "emit wrote despite {err:?}");
}

#[test]
fn emit_errors() {
    // Too-long private data, buffer untouched.
    let pd = [0x11u8; 93];
    assert_emit_err(
        &req_v(&pd),
        Error::TooLong {
            field: "PrivateData",
            len: 93,
            max: 92,
        },
    );

    // A 255-byte buffer: Truncated, untouched (even for a valid message).
    let pd = [0u8; 92];
    let mut short = [0x5Au8; 255];
    assert_eq!(
        req_v(&pd).emit(&mut short),
        Err(Error::Truncated { len: 255 })
    );
    assert!(short.iter().all(|&b| b == 0x5A));
    assert_eq!(req_v(&pd).emit(&mut []), Err(Error::Truncated { len: 0 }));

    // Method not used with the attribute.
    let mut mad = req_v(&pd);
    mad.header.method = Method::Get;
    assert_emit_err(
        &mad,
        Error::Method {
            method: 0x01,
            attribute: 0x0010,
        },
    );
    let mut mad = cpi(MadHeader::send(0), ClassPortInfo::default());
    assert_emit_err(
        &mad,
        Error::Method {
            method: 0x03,
            attribute: 0x0001,
        },
    );
    mad.header.method = Method::Unknown(0x02);
    assert_emit_err(
        &mad,
        Error::Method {
            method: 0x02,
            attribute: 0x0001,
        },
    );
}

fn out_of_range(field: &'static str, value: u64, max: u64) -> Error {
    Error::OutOfRange { field, value, max }
}

#[test]
fn emit_out_of_range_req() {
    let pd = [0u8; 92];
    type Edit = fn(&mut Req<'_>);
    let cases: [(Edit, Error); 17] = [
        (
            |r| r.local_qpn = 0x100_0000,
            out_of_range("LocalQPN", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |r| r.vendor_id = 0x100_0000,
            out_of_range("VendorID", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |r| r.local_eecn = 0x100_0000,
            out_of_range("LocalEECN", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |r| r.remote_eecn = 0x100_0000,
            out_of_range("RemoteEECN", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |r| r.starting_psn = 0x100_0000,
            out_of_range("StartingPSN", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |r| r.remote_cm_response_timeout = 32,
            out_of_range("RemoteCMResponseTimeout", 32, 31),
        ),
        (
            |r| r.local_cm_response_timeout = 32,
            out_of_range("LocalCMResponseTimeout", 32, 31),
        ),
        (|r| r.retry_count = 8, out_of_range("RetryCount", 8, 7)),
        (
            |r| r.rnr_retry_count = 8,
            out_of_range("RNRRetryCount", 8, 7),
        ),
        (
            |r| r.max_cm_retries = 16,
            out_of_range("MaxCMRetries", 16, 15),
        ),
        (
            |r| r.path_mtu = Mtu::Unknown(16),
            out_of_range("PathPacketPayloadMTU", 16, 15),
        ),
        (
            |r| r.transport = Transport::Extended(8),
            out_of_range("ExtendedTransportType", 8, 7),
        ),
        (
            |r| r.primary_path.flow_label = 0x10_0000,
            out_of_range("FlowLabel", 0x10_0000, 0xF_FFFF),
        ),
        (
            |r| r.primary_path.packet_rate = Rate::Unknown(64),
            out_of_range("PacketRate", 64, 63),
        ),
        (|r| r.primary_path.sl = 16, out_of_range("SL", 16, 15)),
        (
            |r| r.primary_path.local_ack_timeout = 32,
            out_of_range("LocalACKTimeout", 32, 31),
        ),
        (
            |r| r.alternate_path.local_ack_timeout = 32,
            out_of_range("LocalACKTimeout", 32, 31),
        ),
    ];
    for (edit, err) in cases {
        let mut mad = req_v(&pd);
        let CmMessage::Req(req) = &mut mad.message else {
            unreachable!()
        };
        edit(req);
        assert_emit_err(&mad, err);
    }
}

#[test]
fn emit_out_of_range_other_messages() {
    let pd = [0u8; 8];
    assert_emit_err(
        &mra(MadHeader::send(0), (0, 0), MessageKind::Rep, 32, &pd),
        out_of_range("ServiceTimeout", 32, 31),
    );
    assert_emit_err(
        &mra(MadHeader::send(0), (0, 0), MessageKind::Unknown(4), 0, &pd),
        out_of_range("MessageMRAed", 4, 3),
    );
    assert_emit_err(
        &rej(
            MadHeader::send(0),
            (0, 0),
            MessageKind::Unknown(4),
            RejReason::Timeout,
            &[],
            &pd,
        ),
        out_of_range("MessageRejected", 4, 3),
    );

    type RepEdit = fn(&mut Rep<'_>);
    let rep_cases: [(RepEdit, Error); 6] = [
        (
            |r| r.local_qpn = 0x100_0000,
            out_of_range("LocalQPN", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |r| r.local_eecn = 0x100_0000,
            out_of_range("LocalEEContext", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |r| r.vendor_id = 0x100_0000,
            out_of_range("VendorID", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |r| r.starting_psn = 0x100_0000,
            out_of_range("StartingPSN", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |r| r.target_ack_delay = 32,
            out_of_range("TargetACKDelay", 32, 31),
        ),
        (
            |r| r.rnr_retry_count = 8,
            out_of_range("RNRRetryCount", 8, 7),
        ),
    ];
    for (edit, err) in rep_cases {
        let mut r = rep_v(&pd);
        edit(&mut r);
        assert_emit_err(&rep(MadHeader::send(0), r), err);
    }
    let mut r = rep_v(&pd);
    r.failover_accepted = Failover::Unknown(4);
    assert_emit_err(
        &rep(MadHeader::send(0), r),
        out_of_range("FailoverAccepted", 4, 3),
    );

    assert_emit_err(
        &dreq(MadHeader::send(0), (0, 0), 0x100_0000, &pd),
        out_of_range("RemoteQPN/EECN", 0x100_0000, 0xFF_FFFF),
    );
    assert_emit_err(
        &lap(
            MadHeader::send(0),
            (0, 0),
            0x100_0000,
            0,
            Path::default(),
            &pd,
        ),
        out_of_range("RemoteQPN/EECN", 0x100_0000, 0xFF_FFFF),
    );
    assert_emit_err(
        &lap(MadHeader::send(0), (0, 0), 0, 32, Path::default(), &pd),
        out_of_range("RemoteCMResponseTimeout", 32, 31),
    );
    let path = Path {
        flow_label: 0x10_0000,
        ..Path::default()
    };
    assert_emit_err(
        &lap(MadHeader::send(0), (0, 0), 0, 0, path, &pd),
        out_of_range("FlowLabel", 0x10_0000, 0xF_FFFF),
    );
    let path = Path {
        local_ack_timeout: 32,
        ..Path::default()
    };
    assert_emit_err(
        &lap(MadHeader::send(0), (0, 0), 0, 0, path, &pd),
        out_of_range("LocalACKTimeout", 32, 31),
    );
    assert_emit_err(
        &sidr_rep(
            MadHeader::send(0),
            0,
            SidrStatus::Success,
            0x100_0000,
            0,
            0,
            &[],
            &pd,
        ),
        out_of_range("QPN", 0x100_0000, 0xFF_FFFF),
    );

    type CpiEdit = fn(&mut ClassPortInfo);
    let cpi_cases: [(CpiEdit, Error); 6] = [
        (
            |c| c.capability_mask2 = 1 << 27,
            out_of_range("CapabilityMask2", 1 << 27, 0x7FF_FFFF),
        ),
        (
            |c| c.resp_time_value = 32,
            out_of_range("RespTimeValue", 32, 31),
        ),
        (|c| c.redirect.sl = 16, out_of_range("SL", 16, 15)),
        (
            |c| c.redirect.flow_label = 0x10_0000,
            out_of_range("FL", 0x10_0000, 0xF_FFFF),
        ),
        (
            |c| c.redirect.qp = 0x100_0000,
            out_of_range("QP", 0x100_0000, 0xFF_FFFF),
        ),
        (
            |c| c.trap.qp = 0x100_0000,
            out_of_range("QP", 0x100_0000, 0xFF_FFFF),
        ),
    ];
    for (edit, err) in cpi_cases {
        let mut info = ClassPortInfo::default();
        edit(&mut info);
        assert_emit_err(&cpi(get_resp(0), info), err);
    }
}

#[test]
fn variable_length_maxima() {
    // Exported sizes match the tables.
    assert_eq!(ibcm_mad::REQ_PRIVATE_DATA_SIZE, 92);
    assert_eq!(ibcm_mad::MRA_PRIVATE_DATA_SIZE, 222);
    assert_eq!(ibcm_mad::REJ_PRIVATE_DATA_SIZE, 148);
    assert_eq!(ibcm_mad::REJ_ARI_SIZE, 72);
    assert_eq!(ibcm_mad::REP_PRIVATE_DATA_SIZE, 196);
    assert_eq!(ibcm_mad::RTU_PRIVATE_DATA_SIZE, 224);
    assert_eq!(ibcm_mad::DREQ_PRIVATE_DATA_SIZE, 220);
    assert_eq!(ibcm_mad::DREP_PRIVATE_DATA_SIZE, 224);
    assert_eq!(ibcm_mad::LAP_PRIVATE_DATA_SIZE, 168);
    assert_eq!(ibcm_mad::APR_PRIVATE_DATA_SIZE, 148);
    assert_eq!(ibcm_mad::APR_ADDITIONAL_INFO_SIZE, 72);
    assert_eq!(ibcm_mad::SIDR_REQ_PRIVATE_DATA_SIZE, 216);
    assert_eq!(ibcm_mad::SIDR_REP_PRIVATE_DATA_SIZE, 136);
    assert_eq!(ibcm_mad::SIDR_REP_ADDITIONAL_INFO_SIZE, 72);
    assert_eq!(ibcm_mad::CLASS_PORT_INFO_SIZE, 72);
    assert_eq!(ibcm_mad::MAD_SIZE, 256);
    assert_eq!(ibcm_mad::CM_DATA_SIZE, 232);

    type Build = for<'a> fn(&'a [u8]) -> CmMad<'a>;
    // (message, max private data, MAD offset of the private data, constructor)
    let cases: [(&str, usize, usize, Build); 11] = [
        ("REQ", 92, D + 140, req_v),
        ("MRA", 222, D + 10, |pd| {
            mra(MadHeader::send(0), (1, 2), MessageKind::Req, 3, pd)
        }),
        ("REJ", 148, D + 84, |pd| {
            rej(
                MadHeader::send(0),
                (1, 2),
                MessageKind::Req,
                RejReason::NoQp,
                &[],
                pd,
            )
        }),
        ("REP", 196, D + 36, |pd| rep(MadHeader::send(0), rep_v(pd))),
        ("RTU", 224, D + 8, |pd| {
            comm_ids(MadHeader::send(0), false, (1, 2), pd)
        }),
        ("DREQ", 220, D + 12, |pd| {
            dreq(MadHeader::send(0), (1, 2), 3, pd)
        }),
        ("DREP", 224, D + 8, |pd| {
            comm_ids(MadHeader::send(0), true, (1, 2), pd)
        }),
        ("LAP", 168, D + 64, |pd| {
            lap(MadHeader::send(0), (1, 2), 3, 4, Path::default(), pd)
        }),
        ("APR", 148, D + 84, |pd| {
            apr(MadHeader::send(0), (1, 2), AprStatus::Success, &[], pd)
        }),
        ("SIDR_REQ", 216, D + 16, |pd| {
            sidr_req(MadHeader::send(0), 1, 2, 3, pd)
        }),
        ("SIDR_REP", 136, D + 96, |pd| {
            sidr_rep(MadHeader::send(0), 1, SidrStatus::Success, 2, 3, 4, &[], pd)
        }),
    ];
    let data = pattern::<225>(0xAB);
    for (name, max, at, build) in cases {
        // Max: accepted, lands at its offset and runs to byte 255 exactly.
        let mut out = [0u8; 256];
        build(&data[..max]).emit(&mut out).unwrap();
        assert_eq!(at + max, 256, "{name}: private data does not end the MAD");
        assert_eq!(&out[at..], &data[..max], "{name}");
        let parsed = CmMad::parse(&out).unwrap();
        assert_eq!(parsed, build(&data[..max]), "{name}");
        // Max + 1: refused, buffer untouched.
        assert_emit_err(
            &build(&data[..max + 1]),
            Error::TooLong {
                field: "PrivateData",
                len: max + 1,
                max,
            },
        );
    }

    // ARI and additional information: 72 accepted, 73 refused.
    let info = pattern::<73>(0x10);
    let pd = [0u8; 148];
    let ok = rej(
        MadHeader::send(0),
        (0, 0),
        MessageKind::Req,
        RejReason::PortCmRedirect,
        &info[..72],
        &pd,
    );
    assert!(ok.check().is_ok());
    assert_emit_err(
        &rej(
            MadHeader::send(0),
            (0, 0),
            MessageKind::Req,
            RejReason::PortCmRedirect,
            &info,
            &pd,
        ),
        Error::TooLong {
            field: "ARI",
            len: 73,
            max: 72,
        },
    );
    assert!(
        apr(
            MadHeader::send(0),
            (0, 0),
            AprStatus::Redirect,
            &info[..72],
            &pd
        )
        .check()
        .is_ok()
    );
    assert_emit_err(
        &apr(MadHeader::send(0), (0, 0), AprStatus::Redirect, &info, &pd),
        Error::TooLong {
            field: "AdditionalInfo",
            len: 73,
            max: 72,
        },
    );
    let pd = [0u8; 136];
    let sidr = |info| {
        sidr_rep(
            MadHeader::send(0),
            0,
            SidrStatus::Redirect,
            0,
            0,
            0,
            info,
            &pd,
        )
    };
    assert!(sidr(&info[..72]).check().is_ok());
    assert_emit_err(
        &sidr(&info),
        Error::TooLong {
            field: "AdditionalInfo",
            len: 73,
            max: 72,
        },
    );
}

// ---------------------------------------------------------------------------------------
// Views: getters read the table offsets, setters touch only their own bits
// ---------------------------------------------------------------------------------------

/// Each setter, called with 0 on an all-ones MAD, clears exactly its field's bits. (Emit
/// writes fields in an order that hides a setter clobbering a later neighbour; a caller
/// editing a received MAD through a view would not be so lucky.)
#[test]
fn view_setters_touch_only_their_bits() {
    use ibcm_mad::{ClassPortInfoPacket, LapPacket, Mad as MadView, RepPacket, ReqPacket};

    #[track_caller]
    fn check(got: &Mad, cleared: &[(usize, u8)]) {
        let mut want = [0xFFu8; 256];
        for &(at, byte) in cleared {
            want[at] = byte;
        }
        assert_mad_eq(got, &want);
    }

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..]).unwrap().set_local_qpn(0);
    check(&b, &[(D + 32, 0), (D + 33, 0), (D + 34, 0)]); // 35 ResponderResources kept

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..]).unwrap().set_vendor_id(0);
    check(&b, &[(D + 5, 0), (D + 6, 0), (D + 7, 0)]); // 4 and 8 kept

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .set_remote_cm_response_timeout(0);
    check(&b, &[(D + 43, 0x07)]); // 43[7:3]

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .set_transport_service_type(0);
    check(&b, &[(D + 43, 0xF9)]); // 43[2:1]

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .set_end_to_end_flow_control(0);
    check(&b, &[(D + 43, 0xFE)]); // 43[0]

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .set_rdc_exists(0);
    check(&b, &[(D + 50, 0xF7)]); // 50[3]

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .set_extended_transport_type(0);
    check(&b, &[(D + 51, 0xF8)]); // 51[2:0]

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .primary_path_mut()
        .set_flow_label(0);
    check(&b, &[(D + 88, 0), (D + 89, 0), (D + 90, 0x0F)]); // word bits 31..12 only

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .primary_path_mut()
        .set_packet_rate(0);
    check(&b, &[(D + 91, 0xC0)]); // 91[5:0]

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .alternate_path_mut()
        .set_subnet_local(0);
    check(&b, &[(D + 138, 0xF7)]); // 138[3]

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .alternate_path_mut()
        .set_local_ack_timeout(0);
    check(&b, &[(D + 139, 0x07)]); // 139[7:3]

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .set_sap_supported(0);
    check(&b, &[(D + 139, 0xFB)]); // 139[2]

    let mut b = [0xFFu8; 256];
    ReqPacket::new_checked(&mut b[..])
        .unwrap()
        .set_private_data(&[0, 0, 0]);
    check(&b, &[(D + 140, 0), (D + 141, 0), (D + 142, 0)]); // the rest left as it is

    let mut b = [0xFFu8; 256];
    RepPacket::new_checked(&mut b[..]).unwrap().set_local_qpn(0);
    check(&b, &[(D + 12, 0), (D + 13, 0), (D + 14, 0)]); // 15 VendorID[23:16] kept

    let mut b = [0xFFu8; 256];
    RepPacket::new_checked(&mut b[..])
        .unwrap()
        .set_vendor_id_m(0);
    check(&b, &[(D + 19, 0)]);

    let mut b = [0xFFu8; 256];
    RepPacket::new_checked(&mut b[..])
        .unwrap()
        .set_failover_accepted(0);
    check(&b, &[(D + 26, 0xF9)]); // 26[2:1]

    let mut b = [0xFFu8; 256];
    RepPacket::new_checked(&mut b[..]).unwrap().set_srq(0);
    check(&b, &[(D + 27, 0xEF)]); // 27[4]

    let mut b = [0xFFu8; 256];
    LapPacket::new_checked(&mut b[..])
        .unwrap()
        .alternate_path_mut()
        .set_flow_label(0);
    check(&b, &[(D + 56, 0), (D + 57, 0), (D + 58, 0x0F)]); // 59 TrafficClass kept

    let mut b = [0xFFu8; 256];
    LapPacket::new_checked(&mut b[..])
        .unwrap()
        .alternate_path_mut()
        .set_traffic_class(0);
    check(&b, &[(D + 59, 0)]);

    let mut b = [0xFFu8; 256];
    LapPacket::new_checked(&mut b[..])
        .unwrap()
        .set_remote_qpn_eecn(0);
    check(&b, &[(D + 12, 0), (D + 13, 0), (D + 14, 0)]); // 15 timeout kept

    let mut b = [0xFFu8; 256];
    ClassPortInfoPacket::new_checked(&mut b[..])
        .unwrap()
        .set_redirect_qp(0);
    check(&b, &[(D + 33, 0), (D + 34, 0), (D + 35, 0)]); // 32 and 36 kept

    let mut b = [0xFFu8; 256];
    ClassPortInfoPacket::new_checked(&mut b[..])
        .unwrap()
        .set_trap_qp(0);
    check(&b, &[(D + 65, 0), (D + 66, 0), (D + 67, 0)]); // 64 TrapHL and 68 kept

    let mut b = [0xFFu8; 256];
    MadView::new_checked(&mut b[..])
        .unwrap()
        .set_attribute_id(0);
    check(&b, &[(16, 0), (17, 0)]); // 18..19 kept
}

/// Getters read the hand-written vectors at the table offsets, including the raw wire
/// fields the representations fold into enums.
#[test]
fn view_getters_read_the_table_offsets() {
    use ibcm_mad::{
        AprPacket, ClassPortInfoPacket, LapPacket, Mad as MadView, MraPacket, RejPacket, RepPacket,
        ReqPacket, SidrRepPacket,
    };

    let pd = pattern::<92>(0x40);
    let b = req_v_bytes(&pd);
    let mad = MadView::new_checked(&b[..]).unwrap();
    assert_eq!(
        (
            mad.base_version(),
            mad.mgmt_class(),
            mad.class_version(),
            mad.method()
        ),
        (1, 0x07, 2, 0x03)
    );
    assert_eq!(mad.transaction_id(), 0x1122_3344_5566_7788);
    assert_eq!(mad.attribute_id(), 0x0010);
    assert_eq!(mad.data().len(), 232);
    let p = ReqPacket::new_checked(&b[..]).unwrap();
    assert_eq!(p.local_comm_id(), 0x0A0B_0C0D);
    assert_eq!(p.vendor_id(), 0x5A_5B5C);
    assert_eq!(p.local_qpn(), 0x12_3456);
    assert_eq!(p.responder_resources(), 0x10);
    assert_eq!(p.remote_eecn(), 0x0F_1E2D);
    assert_eq!(
        (
            p.remote_cm_response_timeout(),
            p.transport_service_type(),
            p.end_to_end_flow_control()
        ),
        (20, 0, 1)
    );
    assert_eq!(
        (p.path_mtu(), p.rdc_exists(), p.rnr_retry_count()),
        (5, 0, 7)
    );
    assert_eq!(
        (p.max_cm_retries(), p.srq(), p.extended_transport_type()),
        (15, 0, 0)
    );
    let primary = p.primary_path();
    assert_eq!(primary.flow_label(), 0x1_2345);
    assert_eq!(primary.packet_rate(), 16);
    assert_eq!((primary.sl(), primary.subnet_local()), (0, 1));
    assert_eq!(primary.local_ack_timeout(), 14);
    let alternate = p.alternate_path();
    assert_eq!(alternate.local_port_lid(), 0x0506);
    assert_eq!(alternate.remote_port_gid(), REQ_ALT_RGID);
    assert_eq!(alternate.flow_label(), 0xA_BCDE);
    assert_eq!((alternate.sl(), alternate.local_ack_timeout()), (9, 18));
    assert_eq!(p.sap_supported(), 1);
    assert_eq!(p.private_data(), &pd[..]);

    let rep = rep_v_bytes(&[0; 196]);
    let p = RepPacket::new_checked(&rep[..]).unwrap();
    assert_eq!(
        (p.vendor_id_h(), p.vendor_id_m(), p.vendor_id_l()),
        (0x02, 0xC9, 0x03)
    );
    assert_eq!(
        (
            p.target_ack_delay(),
            p.failover_accepted(),
            p.end_to_end_flow_control()
        ),
        (15, 1, 1)
    );
    assert_eq!((p.rnr_retry_count(), p.srq()), (6, 1));

    let mut b = header(0x03, [0; 8], [0x00, 0x11]);
    put(&mut b, D + 8, &[0x80, 0xF8]);
    let p = MraPacket::new_checked(&b[..]).unwrap();
    assert_eq!((p.message_mraed(), p.service_timeout()), (2, 31));

    let mut b = header(0x03, [0; 8], [0x00, 0x12]);
    put(&mut b, D + 8, &[0x40, 0x8E, 0x00, 0x1C]);
    let p = RejPacket::new_checked(&b[..]).unwrap();
    assert_eq!(
        (p.message_rejected(), p.rejected_info_length(), p.reason()),
        (1, 71, 28)
    );
    assert_eq!(p.ari().len(), 72); // the view gives the whole field

    let mut b = header(0x03, [0; 8], [0x00, 0x19]);
    put(
        &mut b,
        D + 56,
        &[0x54, 0x32, 0x1F, 0x1C, 0x02, 0xCC, 0x5F, 0x9F],
    );
    let lap = LapPacket::new_checked(&b[..]).unwrap();
    let p = lap.alternate_path();
    assert_eq!(
        (
            p.flow_label(),
            p.traffic_class(),
            p.hop_limit(),
            p.packet_rate()
        ),
        (0x5_4321, 0x1C, 0x02, 0x0C)
    );
    assert_eq!(
        (p.sl(), p.subnet_local(), p.local_ack_timeout()),
        (5, 1, 19)
    );

    let mut b = header(0x03, [0; 8], [0x00, 0x1A]);
    put(&mut b, D + 8, &[0x10, 0x08, 0xFF, 0xFF]);
    let p = AprPacket::new_checked(&b[..]).unwrap();
    assert_eq!((p.additional_info_length(), p.ap_status()), (16, 8));

    let mut b = header(0x03, [0; 8], [0x00, 0x18]);
    put(
        &mut b,
        D + 4,
        &[0x02, 0x05, 0xFF, 0xFF, 0x9A, 0x8B, 0x7C, 0xFF],
    );
    let p = SidrRepPacket::new_checked(&b[..]).unwrap();
    assert_eq!(
        (p.status(), p.additional_info_length(), p.qpn()),
        (2, 5, 0x9A_8B7C)
    );

    let mut b = header(0x81, [0; 8], [0x00, 0x01]);
    put(&mut b, D + 32, &[0xFF, 0x12, 0x34, 0x56]);
    put(&mut b, D + 64, &[0x40, 0x65, 0x43, 0x21]);
    let p = ClassPortInfoPacket::new_checked(&b[..]).unwrap();
    assert_eq!(
        (p.redirect_qp(), p.trap_hop_limit(), p.trap_qp()),
        (0x12_3456, 0x40, 0x65_4321)
    );

    // Short buffers: new_checked refuses, an unchecked view reads zeros.
    assert_eq!(
        ReqPacket::new_checked(&b[..255]).err(),
        Some(Error::Truncated { len: 255 })
    );
    assert_eq!(
        MadView::new_checked(&b[..23]).err(),
        Some(Error::Truncated { len: 23 })
    );
    let short = ReqPacket::new_unchecked(&b[..40]);
    assert_eq!((short.local_qpn(), short.private_data().len()), (0, 0));
}
