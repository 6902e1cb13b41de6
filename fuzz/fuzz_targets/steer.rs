//! The QP1 steering decision (`CmManager::owner_of`, issue #19) on arbitrary MADs and
//! listen tables. Never a panic; never an ID outside ibcm's comm ID space steered to it;
//! never a REQ that one of its listens takes left to the other CM; every SIDR_REP ibcm's.
#![no_main]

use arbitrary::Arbitrary;
use ibcm_cep::{CmConfig, CmManager, ListenParams, MadOwner};
use ibcm_mad::{CmMad, CmMessage, MAD_SIZE, Method};
use libfuzzer_sys::fuzz_target;

include!("asan_options.rs");

#[derive(Arbitrary, Debug)]
struct Listen {
    service_id: u64,
    service_mask: u64,
    port: Option<u8>,
    compare: Option<(u8, Vec<u8>)>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    beside_al: bool,
    listens: Vec<Listen>,
    /// Forced into a CM Send header (most inputs then reach the per-attribute rules).
    header: bool,
    attribute: u8,
    port: u8,
    mad: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let mut config = CmConfig::new(0x0002_c903_0000_000b, [7; 32]);
    if input.beside_al {
        config = config.with_comm_id_pattern(CmConfig::BESIDE_WINOF_AL);
    }
    let mut cm = CmManager::new(config);
    for l in input.listens.into_iter().take(8) {
        let Ok(id) = cm.create() else { return };
        let compare = l
            .compare
            .map(|(at, bytes)| (at % 92, bytes.into_iter().take(16).collect()));
        let _ = cm.listen(
            id,
            ListenParams {
                service_id: l.service_id,
                service_mask: l.service_mask,
                port: l.port,
                compare,
                backlog: 4,
            },
        );
    }
    let mut mad = input.mad;
    if input.header && mad.len() >= MAD_SIZE {
        mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        mad[16] = 0;
        mad[17] = 0x10 + input.attribute % 11;
    }
    let owner = cm.owner_of(input.port, &mad);
    let Ok(parsed) = CmMad::parse(&mad) else {
        assert_eq!(
            owner,
            MadOwner::Theirs,
            "a MAD the codec refuses is not steered"
        );
        return;
    };
    if parsed.header.method != Method::Send {
        assert_eq!(owner, MadOwner::Theirs);
        return;
    }
    let in_space = |id: u32| id != 0 && cm.config().is_local_comm_id(id);
    match parsed.message {
        CmMessage::Req(r) => {
            // The oracle is the engine itself: a REQ it hands to a listen (ReqReceived)
            // must have been steered to it, and one steered away must reach no listen.
            let src = ibcm_cep::MadAddress {
                port: input.port,
                ..Default::default()
            };
            cm.handle_mad(ibcm_cep::Instant::from_nanos(1), &src, &mad);
            let taken = std::iter::from_fn(|| cm.poll_event())
                .any(|(_, e)| matches!(e, ibcm_cep::Event::ReqReceived(_)));
            if taken {
                assert_eq!(
                    owner,
                    MadOwner::Ours,
                    "a listen's REQ {:#x} left",
                    r.service_id
                );
            }
            if owner == MadOwner::Theirs {
                assert!(!taken);
            }
        }
        CmMessage::SidrRep(_) => assert_eq!(owner, MadOwner::Ours),
        CmMessage::Mra(m) => assert_eq!(owner == MadOwner::Ours, in_space(m.remote_comm_id)),
        CmMessage::Rej(m) => assert_eq!(owner == MadOwner::Ours, in_space(m.remote_comm_id)),
        CmMessage::Rep(m) => assert_eq!(owner == MadOwner::Ours, in_space(m.remote_comm_id)),
        CmMessage::Rtu(m) | CmMessage::Drep(m) => {
            assert_eq!(owner == MadOwner::Ours, in_space(m.remote_comm_id))
        }
        CmMessage::Dreq(m) => assert_eq!(owner == MadOwner::Ours, in_space(m.remote_comm_id)),
        CmMessage::Lap(m) => assert_eq!(owner == MadOwner::Ours, in_space(m.remote_comm_id)),
        CmMessage::Apr(m) => assert_eq!(owner == MadOwner::Ours, in_space(m.remote_comm_id)),
        CmMessage::SidrReq(_) | CmMessage::ClassPortInfo(_) => {}
    }
});
