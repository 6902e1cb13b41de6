//! Whose a CM MAD is, when ibcm shares QP1 with another CM (WinOF's AL CM: issue #19):
//! `CmManager::owner_of` for every CM attribute, both comm ID spaces, listens with masks,
//! ports and compares, peer-to-peer and SIDR.

use ibcm_cep::pair::{GUID_A, GUID_B, Pair, Side};
use ibcm_cep::{CmConfig, ListenParams, MadOwner};
use ibcm_mad::{AttributeId, MAD_SIZE, Mad};

const SID: u64 = 0x1000;

/// A pair whose node B's local comm IDs carry WinOF-AL's side pattern (wire byte 2 0xF_),
/// with every MAD on the wire kept.
fn pair_beside_al() -> Pair {
    let a = CmConfig::new(GUID_A, [1; 32]);
    let b = CmConfig::new(GUID_B, [2; 32]).with_comm_id_pattern(CmConfig::BESIDE_WINOF_AL);
    let mut p = Pair::with_config(a, b);
    p.wire = Some(Vec::new());
    p
}

fn wire_of(p: &Pair, from: Side, attribute: AttributeId) -> [u8; MAD_SIZE] {
    p.wire
        .as_ref()
        .and_then(|w| {
            w.iter().find(|(s, mad)| {
                *s == from
                    && AttributeId::from(Mad::new_unchecked(&mad[..]).attribute_id()) == attribute
            })
        })
        .map(|(_, mad)| *mad)
        .unwrap_or_else(|| panic!("no {attribute:?} from {from:?} on the wire"))
}

/// RemoteCommID: CM data offset 4 (IBA 12.6, every connection message but the REQ).
fn with_remote_comm_id(mut mad: [u8; MAD_SIZE], id: u32) -> [u8; MAD_SIZE] {
    mad[28..32].copy_from_slice(&id.to_be_bytes());
    mad
}

#[test]
fn a_req_is_ours_only_when_a_listen_of_ours_takes_it() {
    let mut p = pair_beside_al();
    let a = p.a.create().unwrap();
    let now = p.now;
    p.a.connect(now, a, &Pair::connect_params(SID, 0x11))
        .unwrap();
    let req = p.a.poll_transmit().unwrap().mad;
    // No listen: the other CM's (IPoIB-CM, SRP: services ibcm does not serve).
    assert_eq!(p.b.owner_of(1, &req), MadOwner::Theirs);
    let l = p.b.create().unwrap();
    let listen = |service_id, service_mask, port, compare| ListenParams {
        service_id,
        service_mask,
        port,
        compare,
        backlog: 8,
    };
    // A masked listen on the service's range, on another port: still not ours.
    p.b.listen(l, listen(SID & !0xff, !0xff, Some(2), None))
        .unwrap();
    assert_eq!(p.b.owner_of(1, &req), MadOwner::Theirs);
    assert_eq!(p.b.owner_of(2, &req), MadOwner::Ours);
    let now = p.now;
    p.b.destroy(now, l).unwrap();
    // A compare the REQ's private data does not carry: not ours; one it does: ours.
    let l = p.b.create().unwrap();
    p.b.listen(l, listen(SID, u64::MAX, None, Some((0, vec![0xAB]))))
        .unwrap();
    assert_eq!(p.b.owner_of(1, &req), MadOwner::Theirs);
    let mut tagged = req;
    tagged[24 + 140] = 0xAB; // REQ PrivateData: CM data offset 140 (Table 99).
    assert_eq!(p.b.owner_of(1, &tagged), MadOwner::Ours);
    // It runs in the QP1 completion path (DISPATCH_LEVEL): nothing allocated.
    let info = allocation_counter::measure(|| {
        std::hint::black_box(p.b.owner_of(1, &tagged));
    });
    assert_eq!(info.count_total, 0);
}

#[test]
fn a_req_for_our_waiting_peer_to_peer_request_is_ours() {
    let mut p = pair_beside_al();
    // B connects peer-to-peer to A's service; A's crossing REQ for it is B's.
    let b = p.b.create().unwrap();
    let now = p.now;
    p.b.connect_peer(now, b, &Pair::connect_params(SID, 0x22))
        .unwrap();
    let a = p.a.create().unwrap();
    p.a.connect_peer(now, a, &Pair::connect_params(SID, 0x11))
        .unwrap();
    let req = p.a.poll_transmit().unwrap().mad;
    assert_eq!(p.b.owner_of(1, &req), MadOwner::Ours);
    let other = Pair::connect_params(SID + 1, 0x11);
    let a2 = p.a.create().unwrap();
    p.a.connect(now, a2, &other).unwrap();
    let req2 = p.a.poll_transmit().unwrap().mad;
    assert_eq!(p.b.owner_of(1, &req2), MadOwner::Theirs);
}

#[test]
fn every_connection_message_is_ours_exactly_when_its_remote_comm_id_is_in_our_space() {
    let mut p = pair_beside_al();
    let (ca, _) = p.start_connect(SID);
    p.drive_for(1_000_000);
    let cb = p.last_request().unwrap();
    p.b.take_request(cb).unwrap();
    p.b.mra(cb, 20, b"").unwrap();
    p.drive_for(1_000_000);
    let now = p.now;
    p.b.accept(now, cb, &Pair::rep_params(0x22)).unwrap();
    p.drive_for(1_000_000);
    p.a.rtu(ca, b"").unwrap();
    p.drive_for(1_000_000);
    let now = p.now;
    p.a.disconnect(now, ca, b"").unwrap();
    p.drive_for(1_000_000);
    let now = p.now;
    p.b.drep(now, cb, b"").unwrap();
    p.drive_for(1_000_000);
    let ours = p.b.local_comm_id(cb);
    assert!(p.b.config().is_local_comm_id(ours));
    let theirs = ours & !0x0000_F000; // Wire byte 2 below 0xF0: AL's space.
    // To B: what A sends (RTU, DREQ); to A: what B sends (MRA, REP, DREP). Each is
    // re-addressed to B's space and out of it.
    for (from, attribute) in [
        (Side::A, AttributeId::Rtu),
        (Side::A, AttributeId::Dreq),
        (Side::B, AttributeId::Mra),
        (Side::B, AttributeId::Rep),
        (Side::B, AttributeId::Drep),
    ] {
        let mad = wire_of(&p, from, attribute);
        assert_eq!(
            p.b.owner_of(1, &with_remote_comm_id(mad, ours)),
            MadOwner::Ours,
            "{attribute:?} to one of ours"
        );
        assert_eq!(
            p.b.owner_of(1, &with_remote_comm_id(mad, theirs)),
            MadOwner::Theirs,
            "{attribute:?} to an AL-space ID"
        );
        assert_eq!(
            p.b.owner_of(1, &with_remote_comm_id(mad, 0)),
            MadOwner::Theirs,
            "{attribute:?} naming nobody"
        );
    }
}

#[test]
fn a_rej_is_ours_when_it_names_one_of_ours() {
    let mut p = pair_beside_al();
    // A REQ from B to a service A does not serve: A's REJ names B's CEP.
    let b = p.b.create().unwrap();
    let now = p.now;
    p.b.connect(now, b, &Pair::connect_params(SID, 0x22))
        .unwrap();
    p.drive_for(1_000_000);
    let rej = wire_of(&p, Side::A, AttributeId::Rej);
    assert_eq!(p.b.owner_of(1, &rej), MadOwner::Ours);
    assert_eq!(
        p.a.owner_of(1, &rej),
        MadOwner::Ours,
        "A's space is the whole of u32"
    );
    let stranger = with_remote_comm_id(rej, p.b.local_comm_id(b) & !0x0000_F000);
    assert_eq!(p.b.owner_of(1, &stranger), MadOwner::Theirs);
}

#[test]
fn sidr_replies_are_always_ours_and_what_is_not_a_cm_send_never_is() {
    let p = pair_beside_al();
    let mut sidr_rep = [0u8; MAD_SIZE];
    let rep = ibcm_mad::CmMad {
        header: ibcm_mad::MadHeader::send(7),
        message: ibcm_mad::CmMessage::SidrRep(ibcm_mad::SidrRep {
            request_id: 1,
            status: ibcm_mad::SidrStatus::Success,
            qpn: 0x33,
            service_id: SID,
            qkey: 0,
            additional_info: &[],
            private_data: &[],
            vendor_id: 0,
        }),
    };
    rep.emit(&mut sidr_rep).unwrap();
    assert_eq!(p.b.owner_of(1, &sidr_rep), MadOwner::Ours);
    // Another class, a response method, a short buffer: not steered.
    let mut other = sidr_rep;
    other[1] = 0x03;
    assert_eq!(p.b.owner_of(1, &other), MadOwner::Theirs);
    let mut get_resp = sidr_rep;
    get_resp[3] = 0x81;
    assert_eq!(p.b.owner_of(1, &get_resp), MadOwner::Theirs);
    assert_eq!(p.b.owner_of(1, &sidr_rep[..100]), MadOwner::Theirs);
}
