use ibcm_cep::pair::{Pair, Side};
use ibcm_cep::{Event, StateName};

#[test]
fn establish_disconnect_timewait() {
    let mut p = Pair::new(1);
    let (a, b) = p.establish(0x1000);
    assert_eq!(p.a.state(a).unwrap(), StateName::Established);
    assert_eq!(p.b.state(b).unwrap(), StateName::Established);
    let now = p.now;
    p.a.disconnect(now, a, b"bye").unwrap();
    p.drive_for(1_000_000);
    assert_eq!(p.b.state(b).unwrap(), StateName::DreqRcvd);
    let now = p.now;
    p.b.drep(now, b, b"ok").unwrap();
    p.drive();
    assert_eq!(p.a.state(a).unwrap(), StateName::Idle);
    assert_eq!(p.b.state(b).unwrap(), StateName::Idle);
    println!("A: {:?}", p.events(Side::A));
    println!("B: {:?}", p.events(Side::B));
    assert!(matches!(
        p.events_of(Side::A, a).last(),
        Some(Event::TimewaitExit)
    ));
    assert!(matches!(
        p.events_of(Side::B, b).last(),
        Some(Event::TimewaitExit)
    ));
    assert_eq!(p.a.peer_map_entries(), 0);
    assert_eq!(p.b.peer_map_entries(), 0);
}
