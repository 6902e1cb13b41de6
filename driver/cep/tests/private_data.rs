//! The private data CEPs keep for repeats lives in the manager's pool (src/pdata_pool.rs):
//! with growth off (a dispatch layer serving DISPATCH_LEVEL callers) a downcall takes a
//! block made ahead or fails with `NoResources` and changes nothing; every block goes back
//! when its CEP is done; the accounting follows the pool, back to baseline after teardown.

use ibcm_cep::pair::{Pair, Side};
use ibcm_cep::{CepId, CmError, ConnectParams, Event, SidrParams, SidrReplyParams, StateName};
use ibcm_mad::SidrStatus;

const SID: u64 = 0x5107;

fn connect_with(pdata: &[u8]) -> ConnectParams<'_> {
    ConnectParams {
        private_data: pdata,
        ..Pair::connect_params(SID, 0x11)
    }
}

#[test]
fn without_growth_a_downcall_takes_a_block_made_ahead_or_fails_cleanly() {
    let mut p = Pair::new(61);
    p.a.set_private_data_growth(false);
    let a = p.a.create().unwrap();
    let now = p.now;
    assert_eq!(
        p.a.connect(now, a, &connect_with(&[7; 92])),
        Err(CmError::NoResources)
    );
    // Nothing changed: idle, nothing sent, no block taken.
    assert_eq!(p.a.state(a), Ok(StateName::Idle));
    assert!(p.a.poll_transmit().is_none());
    assert_eq!(p.a.private_data_blocks(), 0);
    // Empty private data needs no block.
    let b = p.a.create().unwrap();
    p.a.connect(now, b, &connect_with(&[])).unwrap();
    p.a.destroy(now, b).unwrap();
    // PASSIVE_LEVEL made room: the same call succeeds without growing anything.
    p.a.prepare_private_data().unwrap();
    let before = p.a.memory().private_data;
    p.a.connect(now, a, &connect_with(&[7; 92])).unwrap();
    assert_eq!(p.a.memory().private_data, before);
    assert_eq!(p.a.private_data_blocks(), 1);
}

#[test]
fn blocks_follow_the_cached_message_and_go_back_at_the_end() {
    let mut p = Pair::new(62);
    let empty = p.a.memory().private_data;
    assert_eq!(empty, 0, "a new manager allocates no block");
    let (a, b) = p.establish(SID);
    // A: the RTU's data replaced the REQ's; B: none, the REP's went back at Established
    // (nothing repeats it any more).
    assert_eq!(p.a.private_data_blocks(), 1);
    assert_eq!(p.b.private_data_blocks(), 0);
    // The DREQ's data replaces the RTU's (the block is taken before the old one goes).
    let now = p.now;
    p.a.disconnect(now, a, &[0xD4; 220]).unwrap();
    p.drive_for(1_000_000);
    let now = p.now;
    p.b.drep(now, b, &[]).unwrap();
    p.drive();
    // B's DREP carries no data: B holds none; A keeps its DREQ's.
    assert_eq!(p.b.private_data_blocks(), 0);
    assert_eq!(p.a.private_data_blocks(), 1);
    assert!(matches!(
        p.events_of(Side::B, b).iter().find(|e| matches!(e, Event::DreqReceived(_))),
        Some(Event::DreqReceived(d)) if d.as_slice() == [0xD4; 220]
    ));
    let now = p.now;
    p.a.destroy(now, a).unwrap();
    p.b.destroy(now, b).unwrap();
    p.drive();
    assert_eq!(p.a.private_data_blocks(), 0);
    assert_eq!(
        (p.a.live_ceps(), p.b.live_ceps()),
        (0, 1),
        "B's listen is left"
    );
    // With nothing in use the pool returns to its baseline: one chunk once prepared.
    p.a.trim_private_data();
    p.a.prepare_private_data().unwrap();
    let one_chunk = p.a.memory().private_data;
    let mut q = Pair::new(63);
    q.a.prepare_private_data().unwrap();
    assert_eq!(q.a.memory().private_data, one_chunk);
}

#[test]
fn many_connections_grow_the_pool_and_teardown_gives_it_back() {
    let mut p = Pair::new(64);
    p.a.prepare_private_data().unwrap();
    let baseline = p.a.memory().private_data;
    let now = p.now;
    let ceps: Vec<CepId> = (0..500)
        .map(|_| {
            let c = p.a.create().unwrap();
            p.a.connect(now, c, &connect_with(&[1; 92])).unwrap();
            c
        })
        .collect();
    assert_eq!(p.a.private_data_blocks(), 500);
    let grown = p.a.memory().private_data;
    assert!(grown >= baseline + 500 * 224, "{grown} bytes");
    for c in ceps {
        p.a.destroy(now, c).unwrap();
    }
    assert_eq!(p.a.private_data_blocks(), 0);
    // Topping up only grows; the trim where connections end gives it back.
    p.a.prepare_private_data().unwrap();
    assert_eq!(p.a.memory().private_data, grown);
    p.a.trim_private_data();
    assert_eq!(p.a.memory().private_data, 0);
    p.a.prepare_private_data().unwrap();
    assert_eq!(p.a.memory().private_data, baseline);
}

#[test]
fn a_sidr_rep_stores_its_info_and_data_both_or_neither() {
    let mut p = Pair::new(65);
    let l = p.b.create().unwrap();
    p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
    let a = p.a.create().unwrap();
    let now = p.now;
    let sidr = SidrParams {
        service_id: SID,
        port: 1,
        pkey: 0xffff,
        path: Pair::path(Side::A),
        timeout: 16,
        max_retries: 3,
        private_data: b"who serves?",
    };
    p.a.sidr_request(now, a, &sidr).unwrap();
    p.drive_for(1_000_000);
    let b = p
        .events(Side::B)
        .iter()
        .find_map(|(c, e)| matches!(e, Event::SidrReqReceived(_)).then_some(*c))
        .unwrap();
    // B's pool with one free block, and no growth.
    p.b.set_private_data_growth(false);
    p.b.prepare_private_data().unwrap();
    let mut fillers = Vec::new();
    while p.b.private_data_room() > 1 {
        let c = p.b.create().unwrap();
        let params = ConnectParams {
            primary_path: Pair::path(Side::B),
            ..connect_with(&[2; 10])
        };
        p.b.connect(now, c, &params).unwrap();
        fillers.push(c);
    }
    let in_use = p.b.private_data_blocks();
    let reply = SidrReplyParams {
        status: SidrStatus::Success,
        qpn: 0x33,
        qkey: 0x1111_2222,
        info: b"info",
        private_data: b"served",
    };
    assert_eq!(p.b.sidr_reply(now, b, &reply), Err(CmError::NoResources));
    assert_eq!(
        p.b.private_data_blocks(),
        in_use,
        "the info's block went back"
    );
    assert_eq!(p.b.state(b), Ok(StateName::SidrReqRcvd));
    // One block is enough without the info.
    let reply = SidrReplyParams { info: &[], ..reply };
    p.b.sidr_reply(now, b, &reply).unwrap();
    p.drive_for(1_000_000);
    assert!(p.events_of(Side::A, a).iter().any(|e| matches!(
        e,
        Event::SidrRepReceived(r) if r.private_data.as_slice().starts_with(b"served")
    )));
}
