//! Property tests of the CM MAD codec over every message.
//!
//! - (a) `parse(emit(x)) == x` for every valid representation `x`;
//! - (b) `emit(parse(b)) == b` for every valid MAD `b` with reserved bits zero, `parse`
//!   ignores exactly the reserved bits (flipping one changes nothing, flipping any other bit
//!   changes the parse), and `emit` writes them as zero;
//! - (c) `parse` never panics, and whatever it accepts re-emits and re-parses unchanged;
//! - (d) `emit` of any out-of-range value fails with the exact error and leaves the buffer
//!   untouched.
//!
//! Reprs borrow their variable-length fields, so the strategies generate an [`Owned`] value
//! (the repr with empty slices, plus the bytes) and borrow from it with [`Owned::mad`].

use ibcm_mad::{
    APR_ADDITIONAL_INFO_SIZE, APR_PRIVATE_DATA_SIZE, Apr, AprStatus, AttributeId, ClassPortInfo,
    CmMad, CmMessage, CpiTarget, DREP_PRIVATE_DATA_SIZE, DREQ_PRIVATE_DATA_SIZE, Drep, Dreq, Error,
    Failover, LAP_PRIVATE_DATA_SIZE, Lap, MAD_SIZE, MRA_PRIVATE_DATA_SIZE, MadHeader, MessageKind,
    Method, Mra, Mtu, Path, REJ_ARI_SIZE, REJ_PRIVATE_DATA_SIZE, REP_PRIVATE_DATA_SIZE,
    REQ_PRIVATE_DATA_SIZE, RTU_PRIVATE_DATA_SIZE, Rate, Rej, RejReason, Rep, Req, Rtu,
    SIDR_REP_ADDITIONAL_INFO_SIZE, SIDR_REP_PRIVATE_DATA_SIZE, SIDR_REQ_PRIVATE_DATA_SIZE, SidrRep,
    SidrReq, SidrStatus, Transport,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// MAD offset of the CM data (the IBA tables' offset 0).
const D: usize = 24;

// ---------------------------------------------------------------------------------------
// Owned values
// ---------------------------------------------------------------------------------------

/// The twelve attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Req,
    Mra,
    Rej,
    Rep,
    Rtu,
    Dreq,
    Drep,
    Lap,
    Apr,
    SidrReq,
    SidrRep,
    Cpi,
}

impl Kind {
    /// The private-data field size, or 0 for ClassPortInfo.
    fn pd_size(self) -> usize {
        match self {
            Kind::Req => REQ_PRIVATE_DATA_SIZE,
            Kind::Mra => MRA_PRIVATE_DATA_SIZE,
            Kind::Rej => REJ_PRIVATE_DATA_SIZE,
            Kind::Rep => REP_PRIVATE_DATA_SIZE,
            Kind::Rtu => RTU_PRIVATE_DATA_SIZE,
            Kind::Dreq => DREQ_PRIVATE_DATA_SIZE,
            Kind::Drep => DREP_PRIVATE_DATA_SIZE,
            Kind::Lap => LAP_PRIVATE_DATA_SIZE,
            Kind::Apr => APR_PRIVATE_DATA_SIZE,
            Kind::SidrReq => SIDR_REQ_PRIVATE_DATA_SIZE,
            Kind::SidrRep => SIDR_REP_PRIVATE_DATA_SIZE,
            Kind::Cpi => 0,
        }
    }

    /// The ARI / additional-info field size, or 0 if the message has none.
    fn extra_size(self) -> usize {
        match self {
            Kind::Rej => REJ_ARI_SIZE,
            Kind::Apr => APR_ADDITIONAL_INFO_SIZE,
            Kind::SidrRep => SIDR_REP_ADDITIONAL_INFO_SIZE,
            _ => 0,
        }
    }
}

/// A message with its slices left empty; [`Owned`] holds the bytes.
#[derive(Debug, Clone, Copy)]
enum Body {
    Req(Req<'static>),
    Mra(Mra<'static>),
    Rej(Rej<'static>),
    Rep(Rep<'static>),
    Rtu(Rtu<'static>),
    Dreq(Dreq<'static>),
    Drep(Drep<'static>),
    Lap(Lap<'static>),
    Apr(Apr<'static>),
    SidrReq(SidrReq<'static>),
    SidrRep(SidrRep<'static>),
    Cpi(ClassPortInfo),
}

#[derive(Debug, Clone)]
struct Owned {
    header: MadHeader,
    body: Body,
    /// Private data.
    pd: Vec<u8>,
    /// REJ ARI or APR / SIDR_REP additional info.
    extra: Vec<u8>,
}

impl Owned {
    fn mad(&self) -> CmMad<'_> {
        let pd = &self.pd[..];
        let ex = &self.extra[..];
        let message = match self.body {
            Body::Req(m) => CmMessage::Req(Req {
                private_data: pd,
                ..m
            }),
            Body::Mra(m) => CmMessage::Mra(Mra {
                private_data: pd,
                ..m
            }),
            Body::Rej(m) => CmMessage::Rej(Rej {
                ari: ex,
                private_data: pd,
                ..m
            }),
            Body::Rep(m) => CmMessage::Rep(Rep {
                private_data: pd,
                ..m
            }),
            Body::Rtu(m) => CmMessage::Rtu(Rtu {
                private_data: pd,
                ..m
            }),
            Body::Dreq(m) => CmMessage::Dreq(Dreq {
                private_data: pd,
                ..m
            }),
            Body::Drep(m) => CmMessage::Drep(Drep {
                private_data: pd,
                ..m
            }),
            Body::Lap(m) => CmMessage::Lap(Lap {
                private_data: pd,
                ..m
            }),
            Body::Apr(m) => CmMessage::Apr(Apr {
                additional_info: ex,
                private_data: pd,
                ..m
            }),
            Body::SidrReq(m) => CmMessage::SidrReq(SidrReq {
                private_data: pd,
                ..m
            }),
            Body::SidrRep(m) => CmMessage::SidrRep(SidrRep {
                additional_info: ex,
                private_data: pd,
                ..m
            }),
            Body::Cpi(m) => CmMessage::ClassPortInfo(m),
        };
        CmMad {
            header: self.header,
            message,
        }
    }

    fn kind(&self) -> Kind {
        match self.body {
            Body::Req(_) => Kind::Req,
            Body::Mra(_) => Kind::Mra,
            Body::Rej(_) => Kind::Rej,
            Body::Rep(_) => Kind::Rep,
            Body::Rtu(_) => Kind::Rtu,
            Body::Dreq(_) => Kind::Dreq,
            Body::Drep(_) => Kind::Drep,
            Body::Lap(_) => Kind::Lap,
            Body::Apr(_) => Kind::Apr,
            Body::SidrReq(_) => Kind::SidrReq,
            Body::SidrRep(_) => Kind::SidrRep,
            Body::Cpi(_) => Kind::Cpi,
        }
    }

    /// The same message with its private data zero-padded to the whole field, as parse
    /// returns it.
    fn padded(&self) -> Owned {
        let mut o = self.clone();
        o.pd.resize(self.kind().pd_size(), 0);
        o
    }
}

// ---------------------------------------------------------------------------------------
// Strategies: every field within its width, enums over their whole raw width
// ---------------------------------------------------------------------------------------

fn u24() -> impl Strategy<Value = u32> + Clone {
    prop_oneof![Just(0u32), Just(0xff_ffff), 0u32..1 << 24]
}

fn transport() -> impl Strategy<Value = Transport> + Clone {
    // Canonical values only: the extended type is reserved unless the service type is 3.
    (0u8..4, 0u8..8).prop_map(|(st, ext)| Transport::from_wire(st, if st == 3 { ext } else { 0 }))
}

fn gid() -> impl Strategy<Value = [u8; 16]> + Clone {
    any::<[u8; 16]>()
}

fn path() -> impl Strategy<Value = Path> + Clone {
    (
        any::<u16>(),
        any::<u16>(),
        gid(),
        gid(),
        0u32..1 << 20,
        (0u8..64).prop_map(Rate::from),
        any::<u8>(),
        any::<u8>(),
        0u8..16,
        any::<bool>(),
        0u8..32,
    )
        .prop_map(
            |(
                local_lid,
                remote_lid,
                local_gid,
                remote_gid,
                flow_label,
                packet_rate,
                traffic_class,
                hop_limit,
                sl,
                subnet_local,
                local_ack_timeout,
            )| Path {
                local_lid,
                remote_lid,
                local_gid,
                remote_gid,
                flow_label,
                packet_rate,
                traffic_class,
                hop_limit,
                sl,
                subnet_local,
                local_ack_timeout,
            },
        )
}

fn req() -> impl Strategy<Value = Body> {
    let a = (
        any::<u32>(),
        u24(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        u24(),
        any::<u8>(),
        u24(),
        any::<u8>(),
        u24(),
        0u8..32,
        transport(),
    );
    let b = (
        any::<bool>(),
        u24(),
        0u8..32,
        0u8..8,
        any::<u16>(),
        (0u8..16).prop_map(Mtu::from),
        any::<bool>(),
        0u8..8,
        0u8..16,
        any::<bool>(),
        any::<bool>(),
    );
    (a, b, path(), path()).prop_map(
        |(
            (
                local_comm_id,
                vendor_id,
                service_id,
                local_ca_guid,
                local_qkey,
                local_qpn,
                responder_resources,
                local_eecn,
                initiator_depth,
                remote_eecn,
                remote_cm_response_timeout,
                transport,
            ),
            (
                end_to_end_flow_control,
                starting_psn,
                local_cm_response_timeout,
                retry_count,
                partition_key,
                path_mtu,
                rdc_exists,
                rnr_retry_count,
                max_cm_retries,
                srq,
                sap_supported,
            ),
            primary_path,
            alternate_path,
        )| {
            Body::Req(Req {
                local_comm_id,
                vendor_id,
                service_id,
                local_ca_guid,
                local_qkey,
                local_qpn,
                responder_resources,
                local_eecn,
                initiator_depth,
                remote_eecn,
                remote_cm_response_timeout,
                transport,
                end_to_end_flow_control,
                starting_psn,
                local_cm_response_timeout,
                retry_count,
                partition_key,
                path_mtu,
                rdc_exists,
                rnr_retry_count,
                max_cm_retries,
                srq,
                primary_path,
                alternate_path,
                sap_supported,
                private_data: &[],
            })
        },
    )
}

fn mra() -> impl Strategy<Value = Body> {
    (
        any::<u32>(),
        any::<u32>(),
        (0u8..4).prop_map(MessageKind::from),
        0u8..32,
    )
        .prop_map(
            |(local_comm_id, remote_comm_id, message_mraed, service_timeout)| {
                Body::Mra(Mra {
                    local_comm_id,
                    remote_comm_id,
                    message_mraed,
                    service_timeout,
                    private_data: &[],
                })
            },
        )
}

fn rej() -> impl Strategy<Value = Body> {
    (
        any::<u32>(),
        any::<u32>(),
        (0u8..4).prop_map(MessageKind::from),
        any::<u16>().prop_map(RejReason::from),
    )
        .prop_map(
            |(local_comm_id, remote_comm_id, message_rejected, reason)| {
                Body::Rej(Rej {
                    local_comm_id,
                    remote_comm_id,
                    message_rejected,
                    reason,
                    ari: &[],
                    private_data: &[],
                })
            },
        )
}

fn rep() -> impl Strategy<Value = Body> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        u24(),
        u24(),
        u24(),
        u24(),
        any::<u8>(),
        any::<u8>(),
        0u8..32,
        (0u8..4).prop_map(Failover::from),
        (any::<bool>(), 0u8..8, any::<bool>(), any::<u64>()),
    )
        .prop_map(
            |(
                local_comm_id,
                remote_comm_id,
                local_qkey,
                local_qpn,
                local_eecn,
                vendor_id,
                starting_psn,
                responder_resources,
                initiator_depth,
                target_ack_delay,
                failover_accepted,
                (end_to_end_flow_control, rnr_retry_count, srq, local_ca_guid),
            )| {
                Body::Rep(Rep {
                    local_comm_id,
                    remote_comm_id,
                    local_qkey,
                    local_qpn,
                    local_eecn,
                    vendor_id,
                    starting_psn,
                    responder_resources,
                    initiator_depth,
                    target_ack_delay,
                    failover_accepted,
                    end_to_end_flow_control,
                    rnr_retry_count,
                    srq,
                    local_ca_guid,
                    private_data: &[],
                })
            },
        )
}

fn comm_ids(drep: bool) -> impl Strategy<Value = Body> {
    (any::<u32>(), any::<u32>()).prop_map(move |(local_comm_id, remote_comm_id)| {
        let m = Rtu {
            local_comm_id,
            remote_comm_id,
            private_data: &[],
        };
        if drep { Body::Drep(m) } else { Body::Rtu(m) }
    })
}

fn dreq() -> impl Strategy<Value = Body> {
    (any::<u32>(), any::<u32>(), u24()).prop_map(
        |(local_comm_id, remote_comm_id, remote_qpn_eecn)| {
            Body::Dreq(Dreq {
                local_comm_id,
                remote_comm_id,
                remote_qpn_eecn,
                private_data: &[],
            })
        },
    )
}

fn lap() -> impl Strategy<Value = Body> {
    (any::<u32>(), any::<u32>(), u24(), 0u8..32, path()).prop_map(
        |(local_comm_id, remote_comm_id, remote_qpn_eecn, remote_cm_response_timeout, p)| {
            Body::Lap(Lap {
                local_comm_id,
                remote_comm_id,
                remote_qpn_eecn,
                remote_cm_response_timeout,
                alternate_path: p,
                private_data: &[],
            })
        },
    )
}

fn apr() -> impl Strategy<Value = Body> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u8>().prop_map(AprStatus::from),
    )
        .prop_map(|(local_comm_id, remote_comm_id, status)| {
            Body::Apr(Apr {
                local_comm_id,
                remote_comm_id,
                status,
                additional_info: &[],
                private_data: &[],
            })
        })
}

fn sidr_req() -> impl Strategy<Value = Body> {
    (any::<u32>(), any::<u16>(), any::<u64>()).prop_map(
        |(request_id, partition_key, service_id)| {
            Body::SidrReq(SidrReq {
                request_id,
                partition_key,
                service_id,
                private_data: &[],
            })
        },
    )
}

fn sidr_rep() -> impl Strategy<Value = Body> {
    (
        any::<u32>(),
        any::<u8>().prop_map(SidrStatus::from),
        u24(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(request_id, status, qpn, service_id, qkey)| {
            Body::SidrRep(SidrRep {
                request_id,
                status,
                vendor_id: 0,
                qpn,
                service_id,
                qkey,
                additional_info: &[],
                private_data: &[],
            })
        })
}

fn cpi_target() -> impl Strategy<Value = CpiTarget> + Clone {
    (
        gid(),
        any::<u8>(),
        0u8..16,
        0u32..1 << 20,
        any::<u16>(),
        any::<u16>(),
        u24(),
        any::<u32>(),
    )
        .prop_map(
            |(gid, traffic_class, sl, flow_label, lid, pkey, qp, qkey)| CpiTarget {
                gid,
                traffic_class,
                sl,
                flow_label,
                lid,
                pkey,
                qp,
                qkey,
            },
        )
}

fn cpi() -> impl Strategy<Value = Body> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        0u32..1 << 27,
        0u8..32,
        cpi_target(),
        cpi_target(),
        any::<u8>(),
    )
        .prop_map(
            |(
                base_version,
                class_version,
                capability_mask,
                capability_mask2,
                resp_time_value,
                redirect,
                trap,
                trap_hop_limit,
            )| {
                Body::Cpi(ClassPortInfo {
                    base_version,
                    class_version,
                    capability_mask,
                    capability_mask2,
                    resp_time_value,
                    redirect,
                    trap,
                    trap_hop_limit,
                })
            },
        )
}

fn body(kind: Kind) -> BoxedStrategy<Body> {
    match kind {
        Kind::Req => req().boxed(),
        Kind::Mra => mra().boxed(),
        Kind::Rej => rej().boxed(),
        Kind::Rep => rep().boxed(),
        Kind::Rtu => comm_ids(false).boxed(),
        Kind::Dreq => dreq().boxed(),
        Kind::Drep => comm_ids(true).boxed(),
        Kind::Lap => lap().boxed(),
        Kind::Apr => apr().boxed(),
        Kind::SidrReq => sidr_req().boxed(),
        Kind::SidrRep => sidr_rep().boxed(),
        Kind::Cpi => cpi().boxed(),
    }
}

/// A header the attribute accepts: Send for CM messages, Get or GetResp for ClassPortInfo;
/// every other header field arbitrary.
fn header(kind: Kind) -> BoxedStrategy<MadHeader> {
    let method = if kind == Kind::Cpi {
        prop_oneof![Just(Method::Get), Just(Method::GetResp)].boxed()
    } else {
        Just(Method::Send).boxed()
    };
    (
        method,
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(
            |(method, status, class_specific, transaction_id, attribute_modifier)| MadHeader {
                method,
                status,
                class_specific,
                transaction_id,
                attribute_modifier,
            },
        )
        .boxed()
}

/// A valid message of `kind`. With `full`, the private data is exactly the field's size (so
/// parse returns it unchanged); otherwise any length up to that size. ARI / additional info
/// is any length up to 72: its length is on the wire, so parse returns it exactly.
fn owned(kind: Kind, full: bool) -> BoxedStrategy<Owned> {
    let n = kind.pd_size();
    let pd = if full {
        vec(any::<u8>(), n..=n)
    } else {
        vec(any::<u8>(), 0..=n)
    };
    let extra = vec(any::<u8>(), 0..=kind.extra_size());
    (header(kind), body(kind), pd, extra)
        .prop_map(|(header, body, pd, extra)| Owned {
            header,
            body,
            pd,
            extra,
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------
// Reserved bits
// ---------------------------------------------------------------------------------------

/// Sets `bits` (a byte mask) at CM offset `at` (`at < 0` would be the header; use
/// [`mask_mad`]).
fn mask_cm(mask: &mut [u8; MAD_SIZE], at: usize, bits: u8) {
    mask[D + at] |= bits;
}

fn mask_cm_range(mask: &mut [u8; MAD_SIZE], from: usize, to: usize) {
    for b in &mut mask[D + from..D + to] {
        *b = 0xff;
    }
}

/// The reserved bits of a path at CM offset `at` (REQ and LAP layouts).
fn mask_path(mask: &mut [u8; MAD_SIZE], at: usize, lap: bool, req_alternate: bool) {
    mask_cm(mask, at + 38, 0x0f); // after the 20-bit flow label
    if lap {
        mask_cm(mask, at + 41, 0xc0); // above the 6-bit packet rate
    } else {
        mask_cm(mask, at + 39, 0xc0); // above the 6-bit packet rate
    }
    mask_cm(mask, at + 42, 0x07); // after SL and SubnetLocal
    // After LocalACKTimeout; in the REQ's alternate path bit 2 is SAPSupported.
    mask_cm(mask, at + 43, if req_alternate { 0x03 } else { 0x07 });
}

/// Every bit of the MAD that parse ignores for this (parsed) message: reserved fields, the
/// extended transport type unless the service type is 3, and the tail of a length-prefixed
/// ARI / additional-info field beyond its length.
fn reserved_mask(m: &CmMad<'_>) -> [u8; MAD_SIZE] {
    let mut mask = [0u8; MAD_SIZE];
    mask[18] = 0xff; // common header reserved 16 bits
    mask[19] = 0xff;
    match &m.message {
        CmMessage::Req(r) => {
            mask_cm(&mut mask, 4, 0xff);
            mask_cm_range(&mut mask, 24, 28);
            if r.transport.to_wire().0 != 3 {
                mask_cm(&mut mask, 51, 0x07);
            }
            mask_path(&mut mask, 52, false, false);
            mask_path(&mut mask, 96, false, true);
        }
        CmMessage::Mra(_) => {
            mask_cm(&mut mask, 8, 0x3f);
            mask_cm(&mut mask, 9, 0x07);
        }
        CmMessage::Rej(r) => {
            mask_cm(&mut mask, 8, 0x3f);
            mask_cm(&mut mask, 9, 0x01);
            mask_cm_range(&mut mask, 12 + r.ari.len(), 12 + REJ_ARI_SIZE);
        }
        CmMessage::Rep(_) => mask_cm(&mut mask, 27, 0x0f),
        CmMessage::Rtu(_) | CmMessage::Drep(_) => {}
        CmMessage::Dreq(_) => mask_cm(&mut mask, 11, 0xff),
        CmMessage::Lap(_) => {
            mask_cm_range(&mut mask, 8, 12);
            mask_cm(&mut mask, 15, 0x07);
            mask_cm_range(&mut mask, 16, 20);
            mask_path(&mut mask, 20, true, false);
        }
        CmMessage::Apr(a) => {
            mask_cm_range(&mut mask, 10, 12);
            mask_cm_range(
                &mut mask,
                12 + a.additional_info.len(),
                12 + APR_ADDITIONAL_INFO_SIZE,
            );
        }
        CmMessage::SidrReq(_) => mask_cm_range(&mut mask, 6, 8),
        // Bytes 6..7 and 11 are the VendorID (Linux `CM_SIDR_REP_VENDOR_ID_H` / `_L`).
        CmMessage::SidrRep(s) => {
            mask_cm_range(
                &mut mask,
                24 + s.additional_info.len(),
                24 + SIDR_REP_ADDITIONAL_INFO_SIZE,
            );
        }
        CmMessage::ClassPortInfo(_) => {
            mask_cm(&mut mask, 32, 0xff); // before the 24-bit RedirectQP
            mask_cm_range(&mut mask, 72, 232);
        }
    }
    mask
}

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------

fn emit(m: &CmMad<'_>) -> [u8; MAD_SIZE] {
    let mut buf = [0u8; MAD_SIZE];
    m.emit(&mut buf).expect("valid repr emits");
    buf
}

/// (a) parse(emit(x)) == x; emit writes exactly 256 bytes whatever the buffer held.
fn check_roundtrip(o: &Owned) -> Result<(), TestCaseError> {
    let m = o.mad();
    let buf = emit(&m);
    prop_assert_eq!(CmMad::parse(&buf), Ok(m));

    let mut big = [0xEEu8; MAD_SIZE + 44];
    prop_assert_eq!(m.emit(&mut big), Ok(()));
    prop_assert_eq!(&big[..MAD_SIZE], &buf[..]);
    prop_assert!(big[MAD_SIZE..].iter().all(|&b| b == 0xEE));
    prop_assert_eq!(CmMad::parse(&big), Ok(m));
    Ok(())
}

/// (b) emit(parse(b)) == b; reserved bits are emitted zero and ignored by parse.
fn check_reserved(o: &Owned, noise: &[u8; MAD_SIZE]) -> Result<(), TestCaseError> {
    let b = emit(&o.mad());
    let p = CmMad::parse(&b).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    prop_assert_eq!(emit(&p), b);

    let mask = reserved_mask(&p);
    for (i, (&byte, &m)) in b.iter().zip(&mask).enumerate() {
        prop_assert_eq!(byte & m, 0, "reserved bits set at byte {}", i);
    }
    let mut noisy = b;
    for ((n, &r), &m) in noisy.iter_mut().zip(noise).zip(&mask) {
        *n ^= r & m;
    }
    let q = CmMad::parse(&noisy);
    prop_assert_eq!(q, Ok(p));
    let mut again = [0xEEu8; MAD_SIZE];
    prop_assert_eq!(p.emit(&mut again), Ok(()));
    prop_assert_eq!(again, b);
    Ok(())
}

/// The reserved mask is exact: flipping any bit outside it changes the parse.
fn check_every_other_bit_matters(o: &Owned) -> Result<(), TestCaseError> {
    let b = emit(&o.mad());
    let p = CmMad::parse(&b).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let mask = reserved_mask(&p);
    for i in 0..MAD_SIZE {
        for bit in 0..8 {
            let flip = 1u8 << bit;
            let mut f = b;
            f[i] ^= flip;
            let q = CmMad::parse(&f);
            if mask[i] & flip != 0 {
                prop_assert_eq!(q, Ok(p), "reserved bit {} of byte {} matters", bit, i);
            } else if CmMad::length_clamped(&f) && q == Ok(p) {
                // A length of 72 flipped past 72 reads as 72 (REJ, APR and SIDR_REP length
                // fields are clamped, never refused): the bit matters below 72 only.
                prop_assert!(matches!(
                    p.message.attribute_id(),
                    AttributeId::Rej | AttributeId::Apr | AttributeId::SidrRep
                ));
            } else {
                prop_assert_ne!(q, Ok(p), "bit {} of byte {} is ignored", bit, i);
            }
        }
    }
    Ok(())
}

/// Short private data / ARI: zero-filled on the wire, returned whole (padded) by parse.
fn check_padding(o: &Owned) -> Result<(), TestCaseError> {
    let m = o.mad();
    let mut buf = [0xEEu8; MAD_SIZE];
    prop_assert_eq!(m.emit(&mut buf), Ok(()));
    let padded = o.padded();
    let p = CmMad::parse(&buf);
    prop_assert_eq!(p, Ok(padded.mad()));
    let n = o.kind().pd_size();
    let pd_at = MAD_SIZE - n; // private data always ends the MAD (CPI has none)
    prop_assert_eq!(&buf[pd_at..pd_at + o.pd.len()], &o.pd[..]);
    prop_assert!(buf[pd_at + o.pd.len()..].iter().all(|&b| b == 0));
    let mask = reserved_mask(&padded.mad());
    for (i, (&byte, &m)) in buf.iter().zip(&mask).enumerate() {
        prop_assert_eq!(byte & m, 0, "reserved bits set at byte {}", i);
    }
    Ok(())
}

/// If parse accepts `b`, the result re-emits and re-parses to itself.
fn check_accepted(b: &[u8]) -> Result<(), TestCaseError> {
    // A length field over 72 is clamped: compare with the MAD as if it had said 72.
    let mut clamped = [0u8; MAD_SIZE];
    let b = if CmMad::length_clamped(b) && b.len() >= MAD_SIZE {
        clamped.copy_from_slice(&b[..MAD_SIZE]);
        match u16::from_be_bytes([b[16], b[17]]) {
            0x0012 => clamped[D + 9] = (72 << 1) | (clamped[D + 9] & 1),
            0x001A => clamped[D + 8] = 72,
            _ => clamped[D + 5] = 72,
        }
        &clamped[..]
    } else {
        b
    };
    if let Ok(p) = CmMad::parse(b) {
        let mut out = [0x5Au8; MAD_SIZE];
        prop_assert_eq!(p.emit(&mut out), Ok(()));
        prop_assert_eq!(CmMad::parse(&out), Ok(p));
        // Everything parse reads comes back; only ignored bits may differ.
        let mask = reserved_mask(&p);
        for i in 0..MAD_SIZE {
            prop_assert_eq!(out[i] & !mask[i], b[i] & !mask[i], "byte {}", i);
            prop_assert_eq!(out[i] & mask[i], 0, "byte {}", i);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// (d) Out-of-range values
// ---------------------------------------------------------------------------------------

/// A value in `(2^bits - 1, ty_max]` picked by `r`.
fn over(bits: u32, ty_max: u64, r: u64) -> u64 {
    let lo = 1u64 << bits;
    lo + r % (ty_max - lo + 1)
}

fn range(field: &'static str, value: u64, bits: u32) -> Error {
    Error::OutOfRange {
        field,
        value,
        max: (1u64 << bits) - 1,
    }
}

/// `Some(v)` in `0..=255` for 8-bit wide values: `over` for a u8 field.
fn over8(bits: u32, r: u64) -> u8 {
    over(bits, 0xff, r) as u8
}

fn over24(r: u64) -> u32 {
    over(24, u32::MAX.into(), r) as u32
}

fn corrupt_path(p: &mut Path, sel: usize, r: u64) -> Error {
    match sel % 4 {
        0 => {
            p.flow_label = over(20, u32::MAX.into(), r) as u32;
            range("FlowLabel", p.flow_label.into(), 20)
        }
        1 => {
            let v = over8(6, r);
            p.packet_rate = Rate::from(v);
            range("PacketRate", v.into(), 6)
        }
        2 => {
            p.sl = over8(4, r);
            range("SL", p.sl.into(), 4)
        }
        _ => {
            p.local_ack_timeout = over8(5, r);
            range("LocalACKTimeout", p.local_ack_timeout.into(), 5)
        }
    }
}

fn corrupt_target(t: &mut CpiTarget, sel: usize, r: u64) -> Error {
    match sel % 3 {
        0 => {
            t.sl = over8(4, r);
            range("SL", t.sl.into(), 4)
        }
        1 => {
            t.flow_label = over(20, u32::MAX.into(), r) as u32;
            range("FL", t.flow_label.into(), 20)
        }
        _ => {
            t.qp = over24(r);
            range("QP", t.qp.into(), 24)
        }
    }
}

/// Makes one field of `o` invalid, chosen by `sel`; returns the error emit must report.
fn corrupt(o: &mut Owned, sel: usize, r: u64) -> Error {
    let kind = o.kind();
    // Selector 0: the method; 1: private data too long; 2: ARI / additional info too long
    // (where the message has one); otherwise one of the message's bounded fields.
    match sel % 8 {
        0 => {
            let allowed: &[u8] = if kind == Kind::Cpi {
                &[0x01, 0x81]
            } else {
                &[0x03]
            };
            let mut v = r as u8;
            while allowed.contains(&v) {
                v = v.wrapping_add(1);
            }
            o.header.method = Method::from(v);
            return Error::Method {
                method: v,
                attribute: o.mad().message.attribute_id().into(),
            };
        }
        1 if kind != Kind::Cpi => {
            let max = kind.pd_size();
            o.pd = vec![0xA5; max + 1 + (r % 64) as usize];
            return Error::TooLong {
                field: "PrivateData",
                len: o.pd.len(),
                max,
            };
        }
        2 if kind.extra_size() != 0 => {
            let max = kind.extra_size();
            o.extra = vec![0x5A; max + 1 + (r % 100) as usize];
            let field = if kind == Kind::Rej {
                "ARI"
            } else {
                "AdditionalInfo"
            };
            return Error::TooLong {
                field,
                len: o.extra.len(),
                max,
            };
        }
        _ => {}
    }
    let sel = sel / 8;
    match &mut o.body {
        Body::Req(m) => match sel % 14 {
            0 => {
                m.vendor_id = over24(r);
                range("VendorID", m.vendor_id.into(), 24)
            }
            1 => {
                m.local_qpn = over24(r);
                range("LocalQPN", m.local_qpn.into(), 24)
            }
            2 => {
                m.local_eecn = over24(r);
                range("LocalEECN", m.local_eecn.into(), 24)
            }
            3 => {
                m.remote_eecn = over24(r);
                range("RemoteEECN", m.remote_eecn.into(), 24)
            }
            4 => {
                m.remote_cm_response_timeout = over8(5, r);
                range(
                    "RemoteCMResponseTimeout",
                    m.remote_cm_response_timeout.into(),
                    5,
                )
            }
            5 => {
                m.starting_psn = over24(r);
                range("StartingPSN", m.starting_psn.into(), 24)
            }
            6 => {
                m.local_cm_response_timeout = over8(5, r);
                range(
                    "LocalCMResponseTimeout",
                    m.local_cm_response_timeout.into(),
                    5,
                )
            }
            7 => {
                m.retry_count = over8(3, r);
                range("RetryCount", m.retry_count.into(), 3)
            }
            8 => {
                let v = over8(4, r);
                m.path_mtu = Mtu::from(v);
                range("PathPacketPayloadMTU", v.into(), 4)
            }
            9 => {
                m.rnr_retry_count = over8(3, r);
                range("RNRRetryCount", m.rnr_retry_count.into(), 3)
            }
            10 => {
                m.max_cm_retries = over8(4, r);
                range("MaxCMRetries", m.max_cm_retries.into(), 4)
            }
            11 => {
                let v = over8(3, r);
                m.transport = Transport::Extended(v);
                range("ExtendedTransportType", v.into(), 3)
            }
            12 => corrupt_path(&mut m.primary_path, (r >> 32) as usize, r),
            _ => corrupt_path(&mut m.alternate_path, (r >> 32) as usize, r),
        },
        Body::Mra(m) => match sel % 2 {
            0 => {
                let v = over8(2, r);
                m.message_mraed = MessageKind::from(v);
                range("MessageMRAed", v.into(), 2)
            }
            _ => {
                m.service_timeout = over8(5, r);
                range("ServiceTimeout", m.service_timeout.into(), 5)
            }
        },
        Body::Rej(m) => {
            let v = over8(2, r);
            m.message_rejected = MessageKind::from(v);
            range("MessageRejected", v.into(), 2)
        }
        Body::Rep(m) => match sel % 7 {
            0 => {
                m.local_qpn = over24(r);
                range("LocalQPN", m.local_qpn.into(), 24)
            }
            1 => {
                m.local_eecn = over24(r);
                range("LocalEEContext", m.local_eecn.into(), 24)
            }
            2 => {
                m.vendor_id = over24(r);
                range("VendorID", m.vendor_id.into(), 24)
            }
            3 => {
                m.starting_psn = over24(r);
                range("StartingPSN", m.starting_psn.into(), 24)
            }
            4 => {
                m.target_ack_delay = over8(5, r);
                range("TargetACKDelay", m.target_ack_delay.into(), 5)
            }
            5 => {
                let v = over8(2, r);
                m.failover_accepted = Failover::from(v);
                range("FailoverAccepted", v.into(), 2)
            }
            _ => {
                m.rnr_retry_count = over8(3, r);
                range("RNRRetryCount", m.rnr_retry_count.into(), 3)
            }
        },
        Body::Dreq(m) => {
            m.remote_qpn_eecn = over24(r);
            range("RemoteQPN/EECN", m.remote_qpn_eecn.into(), 24)
        }
        Body::Lap(m) => match sel % 3 {
            0 => {
                m.remote_qpn_eecn = over24(r);
                range("RemoteQPN/EECN", m.remote_qpn_eecn.into(), 24)
            }
            1 => {
                m.remote_cm_response_timeout = over8(5, r);
                range(
                    "RemoteCMResponseTimeout",
                    m.remote_cm_response_timeout.into(),
                    5,
                )
            }
            _ => corrupt_path(&mut m.alternate_path, (r >> 32) as usize, r),
        },
        Body::SidrRep(m) => {
            m.qpn = over24(r);
            range("QPN", m.qpn.into(), 24)
        }
        Body::Cpi(m) => match sel % 4 {
            0 => {
                m.capability_mask2 = over(27, u32::MAX.into(), r) as u32;
                range("CapabilityMask2", m.capability_mask2.into(), 27)
            }
            1 => {
                m.resp_time_value = over8(5, r);
                range("RespTimeValue", m.resp_time_value.into(), 5)
            }
            2 => corrupt_target(&mut m.redirect, (r >> 32) as usize, r),
            _ => corrupt_target(&mut m.trap, (r >> 32) as usize, r),
        },
        // No bounded field besides the lengths: make the private data too long.
        Body::Rtu(_) | Body::Drep(_) | Body::Apr(_) | Body::SidrReq(_) => {
            let max = kind.pd_size();
            o.pd = vec![0xA5; max + 1 + (r % 64) as usize];
            Error::TooLong {
                field: "PrivateData",
                len: o.pd.len(),
                max,
            }
        }
    }
}

/// (d) emit fails with exactly `expected` and leaves the buffer as it was.
fn check_out_of_range(mut o: Owned, sel: usize, r: u64) -> Result<(), TestCaseError> {
    let expected = corrupt(&mut o, sel, r);
    let m = o.mad();
    prop_assert_eq!(m.check(), Err(expected));
    let mut buf = [0xEEu8; MAD_SIZE + 8];
    prop_assert_eq!(m.emit(&mut buf), Err(expected));
    prop_assert!(buf.iter().all(|&b| b == 0xEE), "emit wrote on error");
    Ok(())
}

/// A too-short buffer is refused before anything is written, valid repr or not.
fn check_short_buffer(o: &Owned, len: usize) -> Result<(), TestCaseError> {
    let mut buf = vec![0xEEu8; len];
    prop_assert_eq!(o.mad().emit(&mut buf), Err(Error::Truncated { len }));
    prop_assert!(buf.iter().all(|&b| b == 0xEE));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Tests, per message
// ---------------------------------------------------------------------------------------

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

macro_rules! per_message {
    ($($name:ident => $kind:expr),* $(,)?) => {$(
        mod $name {
            use super::*;

            proptest! {
                #![proptest_config(config(96))]

                #[test]
                fn parse_emit_roundtrip(o in owned($kind, true)) {
                    check_roundtrip(&o)?;
                }

                #[test]
                fn emit_parse_roundtrip_and_reserved_bits(
                    o in owned($kind, true),
                    noise in any::<[u8; MAD_SIZE]>(),
                ) {
                    check_reserved(&o, &noise)?;
                }

                #[test]
                fn short_private_data_is_zero_padded(o in owned($kind, false)) {
                    check_padding(&o)?;
                }

                #[test]
                fn out_of_range_fails_untouched(
                    o in owned($kind, false),
                    sel in any::<usize>(),
                    r in any::<u64>(),
                ) {
                    check_out_of_range(o, sel, r)?;
                }

                #[test]
                fn short_buffer_fails_untouched(o in owned($kind, false), len in 0usize..MAD_SIZE) {
                    check_short_buffer(&o, len)?;
                }

                #[test]
                fn random_body_never_panics(o in owned($kind, true), body in any::<[u8; 232]>()) {
                    let mut b = emit(&o.mad());
                    b[D..].copy_from_slice(&body);
                    let parsed = CmMad::parse(&b);
                    // The header is valid, so only a length field can make parse fail.
                    if let Err(e) = parsed {
                        prop_assert!(matches!(e, Error::LengthField { .. }), "{:?}", e);
                        prop_assert!(o.kind().extra_size() != 0);
                    }
                    check_accepted(&b)?;
                }
            }

            proptest! {
                #![proptest_config(config(8))]

                #[test]
                fn every_non_reserved_bit_matters(o in owned($kind, true)) {
                    check_every_other_bit_matters(&o)?;
                }
            }
        }
    )*};
}

per_message! {
    req => Kind::Req,
    mra => Kind::Mra,
    rej => Kind::Rej,
    rep => Kind::Rep,
    rtu => Kind::Rtu,
    dreq => Kind::Dreq,
    drep => Kind::Drep,
    lap => Kind::Lap,
    apr => Kind::Apr,
    sidr_req => Kind::SidrReq,
    sidr_rep => Kind::SidrRep,
    class_port_info => Kind::Cpi,
}

// ---------------------------------------------------------------------------------------
// (c) Arbitrary input
// ---------------------------------------------------------------------------------------

/// A header that passes the fixed-field checks, with a method and attribute that are
/// mostly (not always) ones the class uses.
fn plausible_header() -> impl Strategy<Value = [u8; D]> {
    let method = prop_oneof![Just(0x01u8), Just(0x03), Just(0x81), any::<u8>()];
    let attr = prop_oneof![
        4 => (0u16..12).prop_map(|i| [0x01, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A][i as usize]),
        1 => any::<u16>(),
    ];
    (method, attr, any::<[u8; D]>()).prop_map(|(method, attr, mut h)| {
        h[0] = 1;
        h[1] = 0x07;
        h[2] = 2;
        h[3] = method;
        h[16..18].copy_from_slice(&attr.to_be_bytes());
        h
    })
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn parse_never_panics_on_arbitrary_bytes(b in vec(any::<u8>(), 0..300)) {
        let r = CmMad::parse(&b);
        if b.len() < MAD_SIZE {
            prop_assert_eq!(r, Err(Error::Truncated { len: b.len() }));
        }
        if b.len() >= MAD_SIZE {
            check_accepted(&b)?;
        }
    }

    #[test]
    fn parse_never_panics_on_valid_headers(
        h in plausible_header(),
        body in vec(any::<u8>(), 232..=276),
    ) {
        let mut b = h.to_vec();
        b.extend_from_slice(&body);
        let r = CmMad::parse(&b);
        let attr = AttributeId::from(u16::from_be_bytes([h[16], h[17]]));
        match r {
            Ok(p) => prop_assert_eq!(p.message.attribute_id(), attr),
            Err(Error::UnknownAttribute(a)) => prop_assert_eq!(AttributeId::from(a), attr),
            Err(Error::Method { method, attribute }) => {
                prop_assert_eq!(method, h[3]);
                prop_assert_eq!(attribute, u16::from(attr));
            }
            Err(Error::LengthField { .. }) => prop_assert!(matches!(
                attr,
                AttributeId::Rej | AttributeId::Apr | AttributeId::SidrRep
            )),
            Err(e) => prop_assert!(false, "unexpected error {:?}", e),
        }
        check_accepted(&b)?;
    }
}

/// The fixed header fields are each checked, in order.
#[test]
fn header_checks() {
    let o = Owned {
        header: MadHeader::send(1),
        body: Body::Rtu(Rtu {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: &[],
        }),
        pd: vec![],
        extra: vec![],
    };
    let good = emit(&o.mad());
    let mut b = good;
    b[0] = 2;
    assert_eq!(CmMad::parse(&b), Err(Error::BaseVersion(2)));
    let mut b = good;
    b[1] = 0x03;
    assert_eq!(CmMad::parse(&b), Err(Error::MgmtClass(0x03)));
    let mut b = good;
    b[2] = 1;
    assert_eq!(CmMad::parse(&b), Err(Error::ClassVersion(1)));
    let mut b = good;
    b[3] = 0x01;
    assert_eq!(
        CmMad::parse(&b),
        Err(Error::Method {
            method: 0x01,
            attribute: 0x14
        })
    );
    let mut b = good;
    b[17] = 0x1B;
    assert_eq!(CmMad::parse(&b), Err(Error::UnknownAttribute(0x1B)));
    assert_eq!(
        CmMad::parse(&good[..255]),
        Err(Error::Truncated { len: 255 })
    );
}

/// Non-canonical `Transport::Extended(1)` is XRC on the wire and parses back as `Xrc`.
#[test]
fn extended_one_is_xrc() {
    assert_eq!(Transport::Extended(1).to_wire(), Transport::Xrc.to_wire());
    for st in 0..4u8 {
        for ext in 0..8u8 {
            let t = Transport::from_wire(st, ext);
            let (s2, e2) = t.to_wire();
            assert_eq!(s2, st);
            assert_eq!(e2, if st == 3 { ext } else { 0 });
        }
    }
}
