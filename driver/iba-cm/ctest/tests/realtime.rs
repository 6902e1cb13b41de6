//! The C client on several threads in real time: the fabric's thread delivers MADs and
//! timers (callbacks at DISPATCH_LEVEL), a DPC-like thread runs the deferred deliveries,
//! and each active connection has its own thread calling in under its spin lock, while
//! the passive side's thread pulls and answers requests. Checks: every connection ends
//! established and disconnected on both sides, no callback under the client's own lock
//! or an ibcm lock, no allocation or wait at DISPATCH_LEVEL, nothing left.

mod harness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use harness::{Cep, Side, path};
use ibcm_host::{Clock, Fabric, Realtime};
use ibcm_iba_cm::abi::{IbaCmEvent, event_type as ev, status};
use ibcm_iba_cm_ctest as _;

const SID: u64 = 0x5151;
const N: usize = 8;

fn wait(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    done()
}

#[test]
fn concurrent_connections_in_real_time() {
    let fabric = Fabric::with_clock(2, 21, Clock::real());
    let a = Side::new(&fabric.nodes[0], 0);
    let b = Side::new(&fabric.nodes[1], 1);
    let rt = Realtime::start(fabric);
    let listen = b.cep();
    assert_eq!(listen.listen(SID, None, 0), status::SUCCESS);
    let actives: Vec<Cep> = (0..N).map(|_| a.cep()).collect();
    let children: Vec<Cep> = (0..N).map(|_| b.cep()).collect();
    let stop = AtomicBool::new(false);
    let limit = Duration::from_secs(30);
    std::thread::scope(|s| {
        let (a, b, stop) = (&a, &b, &stop);
        s.spawn(move || {
            while !stop.load(Ordering::Acquire) {
                a.deliver();
                b.deliver();
                std::thread::sleep(Duration::from_micros(50));
            }
        });
        let (listen, children) = (&listen, &children);
        let passive = s.spawn(move || {
            let mut next = 0;
            let end = Instant::now() + limit;
            while next < N && Instant::now() < end {
                let mut e = IbaCmEvent::zeroed(-1);
                if listen.get_request(&children[next], &mut e) == status::SUCCESS {
                    assert_eq!(children[next].accept(0x100 + next as u32, &[], 1, 1), 0);
                    next += 1;
                } else {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            for c in children {
                assert!(wait(limit, || c.count(ev::DREQ_RECEIVED) == 1), "a DREQ");
                assert_eq!(c.drep(&[]), status::SUCCESS);
            }
            next
        });
        let workers: Vec<_> = actives
            .iter()
            .enumerate()
            .map(|(i, c)| {
                s.spawn(move || {
                    let qpn = 0x10 + i as u32;
                    assert_eq!(c.connect(SID, &path(0, 1), None, qpn, &[], 1, 1), 0);
                    assert!(wait(limit, || c.count(ev::REP_RECEIVED) == 1), "a REP");
                    assert_eq!(c.rtu(&[]), status::SUCCESS);
                    // Let the RTU land before the DREQ (a DREQ first is legal, but the
                    // check below wants RTU then DREQ on the passive side).
                    std::thread::sleep(Duration::from_millis(20));
                    assert_eq!(c.dreq(&[]), status::SUCCESS);
                    assert!(wait(limit, || c.count(ev::DREP_RECEIVED) == 1), "a DREP");
                })
            })
            .collect();
        for w in workers {
            w.join().expect("an active thread");
        }
        assert_eq!(passive.join().expect("the passive thread"), N);
        stop.store(true, Ordering::Release);
    });
    for c in &actives {
        assert_eq!(c.types(), [ev::REP_RECEIVED, ev::DREP_RECEIVED]);
    }
    for c in &children {
        assert_eq!(c.types(), [ev::RTU_RECEIVED, ev::DREQ_RECEIVED]);
    }
    for c in actives.iter().chain(&children).chain([&listen]) {
        let st = c.stats();
        assert_eq!(st.recursions, 0, "a callback under the client's own lock");
        assert_eq!(st.bad_notifications, 0);
        assert!(c.log().iter().all(|l| l.at_dispatch == 1));
        c.destroy();
    }
    rt.stop();
    for s in [&a, &b] {
        assert_eq!(s.violations(), vec![], "node {}", s.index);
        assert_eq!(s.cm().backend().under_lock.load(Ordering::Relaxed), 0);
        assert_eq!(s.ids_in_use(), 0);
        assert_eq!(s.node.device.client_count(), 0);
    }
    assert_eq!(listen.stats().notifications, N as i32);
}
