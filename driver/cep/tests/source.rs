//! Where a connection's messages may come from (src/manager/source.rs): the peer's LIDs
//! within the port's LMC on InfiniBand, its GID where LIDs say nothing (RoCE).

use ibcm_cep::pair::{Pair, Side, gid};
use ibcm_cep::{Event, MadAddress, StateName};

const SID: u64 = 0x50;
const MS: u64 = 1_000_000;

/// B answers from another of its LIDs: within the LMC that A's port was told (2: four
/// LIDs, 0..=3 around B's LID 2) the REP is B's and the connection goes on; from LID 6,
/// outside it, the REP is dropped as forged and A stays in REQ_SENT (OpenSM gives every
/// CA port the same LMC: its `lmc` option).
#[test]
fn a_message_from_another_lid_of_the_peers_lmc_range_is_the_peers() {
    for (from, taken) in [(3u16, true), (6, false)] {
        let mut p = Pair::new(3);
        p.a.set_port(1, 1, 2, &[gid(1)]).unwrap();
        p.set_address(
            Side::B,
            MadAddress {
                lid: from,
                ..Pair::address_of(Side::B)
            },
        );
        let l = p.b.create().unwrap();
        p.b.listen(l, Pair::listen_params(SID, 4)).unwrap();
        let a = p.a.create().unwrap();
        let now = p.now;
        p.a.connect(now, a, &Pair::connect_params(SID, 0x11))
            .unwrap();
        p.drive_for(MS);
        let b = p.last_request().expect("the REQ reached B");
        p.b.take_request(b).unwrap();
        let now = p.now;
        p.b.accept(now, b, &Pair::rep_params(0x22)).unwrap();
        p.drive_for(MS);
        let got_rep = p
            .events_of(Side::A, a)
            .iter()
            .any(|e| matches!(e, Event::RepReceived(_)));
        assert_eq!(got_rep, taken, "REP from LID {from}");
        let want = if taken {
            StateName::RepRcvd
        } else {
            StateName::ReqSent
        };
        assert_eq!(p.a.state(a).unwrap(), want, "LID {from}");
        assert_eq!(p.a.counters().forged > 0, !taken, "LID {from}");
    }
}

/// On RoCE (permissive LIDs) the GID decides: a REJ from the peer's GID ends the attempt,
/// one from another GID is forged.
#[test]
fn on_roce_the_gid_decides() {
    let mapped = |last: u8| {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 0, last]);
        g
    };
    for (from, taken) in [(2u8, true), (9, false)] {
        let mut p = Pair::new(4);
        let roce = |last: u8| MadAddress {
            lid: 0xffff,
            gid: mapped(last),
            grh: true,
            ..Pair::address_of(Side::B)
        };
        p.set_address(Side::A, roce(1));
        p.set_address(Side::B, roce(from));
        let a = p.a.create().unwrap();
        let mut cp = Pair::connect_params(SID, 0x11);
        cp.primary_path.slid = 0xffff;
        cp.primary_path.dlid = 0xffff;
        cp.primary_path.sgid = mapped(1);
        cp.primary_path.dgid = mapped(2);
        cp.primary_path.subnet_local = false;
        let now = p.now;
        p.a.connect(now, a, &cp).unwrap();
        // B has no listen: it answers with REJ (invalid service ID).
        p.drive_for(MS);
        let rejected = p
            .events_of(Side::A, a)
            .iter()
            .any(|e| matches!(e, Event::Rejected { .. }));
        assert_eq!(rejected, taken, "REJ from {from}");
        assert_eq!(p.a.counters().forged > 0, !taken, "REJ from {from}");
    }
}
