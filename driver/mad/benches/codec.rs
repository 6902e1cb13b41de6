//! Parse and emit cost of every CM message (`cargo bench -p ibcm-mad --bench codec`).
//!
//! Each message is filled with non-trivial values (full private data, a present alternate
//! path, ...) so that no field is skipped; parse reads a MAD emitted from the same value.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ibcm_mad::{
    Apr, AprStatus, ClassPortInfo, CmMad, CmMessage, CpiTarget, Dreq, Failover, Lap, MAD_SIZE,
    MadHeader, MessageKind, Method, Mra, Mtu, Path, Rate, Rej, RejReason, Rep, Req, Rtu, SidrRep,
    SidrReq, SidrStatus, Transport,
};

const PD: [u8; 224] = {
    let mut pd = [0u8; 224];
    let mut i = 0;
    while i < pd.len() {
        pd[i] = (i as u8).wrapping_mul(37).wrapping_add(11);
        i += 1;
    }
    pd
};

fn path(seed: u8) -> Path {
    Path {
        local_lid: 0x0004 + u16::from(seed),
        remote_lid: 0x0001,
        local_gid: [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 2, 0, 0x24, 0xf6, seed,
        ],
        remote_gid: [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 2, 0, 0x20, 0xb4, 0xdd,
        ],
        flow_label: 0x5_b9a9,
        packet_rate: Rate::Gbps100,
        traffic_class: 0x20,
        hop_limit: 64,
        sl: 3,
        subnet_local: true,
        local_ack_timeout: 18,
    }
}

fn messages() -> Vec<(&'static str, CmMad<'static>)> {
    let send = MadHeader::send(0x0000_0002_f2c9_7e40);
    let target = CpiTarget {
        gid: [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 2, 0, 0x24, 0xf6, 0x36,
        ],
        traffic_class: 1,
        sl: 2,
        flow_label: 3,
        lid: 4,
        pkey: 0xffff,
        qp: 1,
        qkey: 0x8001_0000,
    };
    let msgs = [
        (
            "REQ",
            CmMessage::Req(Req {
                local_comm_id: 0x3571_0757,
                vendor_id: 0x0015b3,
                service_id: 0x0000_0000_0106_6b13,
                local_ca_guid: 0xb859_9f03_0007_7e2a,
                local_qkey: 0,
                local_qpn: 0x144,
                responder_resources: 16,
                local_eecn: 0,
                initiator_depth: 16,
                remote_eecn: 0,
                remote_cm_response_timeout: 22,
                transport: Transport::Rc,
                end_to_end_flow_control: true,
                starting_psn: 0xcf7b76,
                local_cm_response_timeout: 22,
                retry_count: 7,
                partition_key: 0xffff,
                path_mtu: Mtu::Mtu4096,
                rdc_exists: false,
                rnr_retry_count: 7,
                max_cm_retries: 15,
                srq: false,
                primary_path: path(1),
                alternate_path: path(2),
                sap_supported: true,
                private_data: &PD[..92],
            }),
        ),
        (
            "MRA",
            CmMessage::Mra(Mra {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_mraed: MessageKind::Req,
                service_timeout: 20,
                private_data: &PD[..222],
            }),
        ),
        (
            "REJ",
            CmMessage::Rej(Rej {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_rejected: MessageKind::Req,
                reason: RejReason::ConsumerDefined,
                ari: &PD[..16],
                private_data: &PD[..148],
            }),
        ),
        (
            "REP",
            CmMessage::Rep(Rep {
                local_comm_id: 0xf902_1739,
                remote_comm_id: 0xe948_8627,
                local_qkey: 0,
                local_qpn: 0xfc_0607,
                local_eecn: 0,
                vendor_id: 0x0015b3,
                starting_psn: 0xd4_0b55,
                responder_resources: 4,
                initiator_depth: 4,
                target_ack_delay: 15,
                failover_accepted: Failover::Accepted,
                end_to_end_flow_control: true,
                rnr_retry_count: 7,
                srq: true,
                local_ca_guid: 0x0002_c902_0020_b4dc,
                private_data: &PD[..196],
            }),
        ),
        (
            "RTU",
            CmMessage::Rtu(Rtu {
                local_comm_id: 1,
                remote_comm_id: 2,
                private_data: &PD[..224],
            }),
        ),
        (
            "DREQ",
            CmMessage::Dreq(Dreq {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn_eecn: 0xdead,
                private_data: &PD[..220],
            }),
        ),
        (
            "DREP",
            CmMessage::Drep(Rtu {
                local_comm_id: 1,
                remote_comm_id: 2,
                private_data: &PD[..224],
            }),
        ),
        (
            "LAP",
            CmMessage::Lap(Lap {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn_eecn: 0x1234,
                remote_cm_response_timeout: 20,
                alternate_path: path(3),
                private_data: &PD[..168],
            }),
        ),
        (
            "APR",
            CmMessage::Apr(Apr {
                local_comm_id: 1,
                remote_comm_id: 2,
                status: AprStatus::Success,
                additional_info: &PD[..8],
                private_data: &PD[..148],
            }),
        ),
        (
            "SIDR_REQ",
            CmMessage::SidrReq(SidrReq {
                request_id: 7,
                partition_key: 0xffff,
                service_id: 0x0000_0000_0111_0035,
                private_data: &PD[..216],
            }),
        ),
        (
            "SIDR_REP",
            CmMessage::SidrRep(SidrRep {
                request_id: 7,
                status: SidrStatus::Success,
                vendor_id: 0,
                qpn: 0x42,
                service_id: 0x0000_0000_0111_0035,
                qkey: 0x8001_0000,
                additional_info: &PD[..8],
                private_data: &PD[..136],
            }),
        ),
        (
            "ClassPortInfo",
            CmMessage::ClassPortInfo(ClassPortInfo {
                base_version: 1,
                class_version: 2,
                capability_mask: 0x0100,
                capability_mask2: 0x7ff_ffff,
                resp_time_value: 18,
                redirect: target,
                trap: target,
                trap_hop_limit: 64,
            }),
        ),
    ];
    msgs.into_iter()
        .map(|(name, message)| {
            let header = if matches!(message, CmMessage::ClassPortInfo(_)) {
                MadHeader {
                    method: Method::GetResp,
                    ..send
                }
            } else {
                send
            };
            (name, CmMad { header, message })
        })
        .collect()
}

fn codec(c: &mut Criterion) {
    for (name, mad) in messages() {
        let mut wire = [0u8; MAD_SIZE];
        mad.emit(&mut wire).expect("bench message emits");
        assert_eq!(CmMad::parse(&wire), Ok(mad), "{name} round-trips");

        let mut group = c.benchmark_group(name);
        group.bench_function("parse", |b| b.iter(|| CmMad::parse(black_box(&wire[..]))));
        let mut out = [0u8; MAD_SIZE];
        group.bench_function("emit", |b| {
            b.iter(|| black_box(&mad).emit(black_box(&mut out[..])))
        });
        group.finish();
    }
}

criterion_group!(benches, codec);
criterion_main!(benches);
