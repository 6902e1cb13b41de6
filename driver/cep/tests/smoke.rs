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

/// Fixed-room mode (`set_fixed_room`, what the kernel-client interface runs the engine
/// in): REQs that arrive faster than their CEPs' slots become reusable (a slot is reused
/// only once 128 are free) never grow the slab past the room made ahead; the oldest free
/// slot is reused early instead. Found by the `iba_cm` fuzz target: `on_req` grew the
/// slab at DISPATCH_LEVEL.
#[test]
fn fixed_room_requests_never_grow_the_slab() {
    let mut p = Pair::new(9);
    p.b.reserve(8).unwrap();
    p.b.set_fixed_room(true);
    let capacity = p.b.slot_capacity();
    let listen = p.b.create().unwrap();
    p.b.listen(listen, Pair::listen_params(0x1000, 4)).unwrap();
    let mut seen = 0;
    for i in 0..(3 * capacity) {
        let cep = p.a.create().unwrap();
        let now = p.now;
        p.a.connect(now, cep, &Pair::connect_params(0x1000, 0x11))
            .unwrap();
        p.drive_for(1_000_000);
        let requests: Vec<_> = p.events(Side::B)[seen..]
            .iter()
            .filter_map(|(c, e)| matches!(e, Event::ReqReceived(_)).then_some(*c))
            .collect();
        seen = p.events(Side::B).len();
        assert_eq!(requests.len(), 1, "REQ {i} reached B");
        let now = p.now;
        for r in requests {
            p.b.destroy(now, r).unwrap();
        }
        p.a.destroy(now, cep).unwrap();
        p.drive();
        assert_eq!(p.b.slot_capacity(), capacity, "REQ {i}: the slab grew");
    }
}
