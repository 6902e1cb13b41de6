//! Loom model of the one race the hook has: AL posts a receive on one CPU
//! (`spl_qp_svc_post_recvs` under AL's lock) while its completion DPC polls the receive
//! CQ on another (`spl_qp_comp`). Once the HCA has the receive, a MAD can land in it and
//! be polled before `post_recv` returns on the first CPU, so the thunk records the receive
//! *before* calling through. In every interleaving the MAD is found in the map and
//! remapped, and the map ends empty. Calling through first loses the MAD's steering in
//! some interleaving (and leaves a stale entry); loom finds it.
//!
//! Run with `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p
//! ibcm-qp1-hook --test loom --release`.
#![cfg(loom)]

use std::collections::VecDeque;

use ibcm_qp1_hook::method::{GRH_SIZE, RECEIVE_SIZE};
use ibcm_qp1_hook::{Hook, IB_QPT_QP1, Lock, Memory, PrivateMethod, Qp1, WorkCompletion};
use loom::sync::{Arc, Mutex};

/// The port's spin lock.
struct LoomLock<T>(Mutex<T>);

impl<T> Lock<T> for LoomLock<T> {
    fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }
}

type LoomHook = Hook<usize, LoomLock<Option<Qp1<usize>>>>;

/// One receive buffer.
struct Buffer([u8; RECEIVE_SIZE]);

impl Memory for Buffer {
    type Buffer = usize;
    fn received(&mut self, _buffer: usize, length: u32) -> Option<&mut [u8]> {
        self.0.get_mut(..length as usize)
    }
}

/// The HCA's receive queue and CQ.
#[derive(Default)]
struct Hca {
    rq: Mutex<VecDeque<u64>>,
    cq: Mutex<VecDeque<WorkCompletion>>,
}

const QP: usize = 0x10;
const CQ: usize = 0x11;
const WR_ID: u64 = 0xFFFF_A000_0000_0180;

/// A CM Send every MAD of which the steering gives ibcm.
fn ibcm_mad() -> [u8; RECEIVE_SIZE] {
    let mut b = [0u8; RECEIVE_SIZE];
    b[GRH_SIZE..GRH_SIZE + 4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    b
}

/// AL posts one receive while the HCA fills it and AL's DPC polls it; `record_first` is
/// the thunk's order; panics (loom reports the interleaving) if the MAD is not steered
/// or a receive stays in the map.
fn race(record_first: bool) {
    loom::model(move || {
        let hook = Arc::new(LoomHook::new(1, PrivateMethod::DEFAULT).unwrap());
        hook.create_spl_qp(1, IB_QPT_QP1, QP, CQ, 4).unwrap();
        let hca = Arc::new(Hca::default());
        let poster = {
            let (hook, hca) = (hook.clone(), hca.clone());
            loom::thread::spawn(move || {
                // The post_recv thunk.
                if record_first {
                    assert!(hook.post_recv(QP, [(WR_ID, Some(0))]));
                }
                hca.rq.lock().unwrap().push_back(WR_ID);
                if !record_first {
                    assert!(hook.post_recv(QP, [(WR_ID, Some(0))]));
                }
            })
        };
        // The HCA: a MAD lands in the receive as soon as it is posted.
        let mut buffer = Buffer([0; RECEIVE_SIZE]);
        loop {
            if let Some(wr_id) = hca.rq.lock().unwrap().pop_front() {
                buffer.0 = ibcm_mad();
                hca.cq.lock().unwrap().push_back(WorkCompletion {
                    wr_id,
                    status: 0,
                    length: RECEIVE_SIZE as u32,
                });
                break;
            }
            loom::thread::yield_now();
        }
        // AL's DPC on this CPU: the poll_cq thunk.
        let wc = hca.cq.lock().unwrap().pop_front().unwrap();
        let steer = |_: u8, _: &[u8]| true;
        let remapped = hook.poll_cq(CQ, &mut buffer, &steer, [wc]);
        poster.join().unwrap();
        assert_eq!(remapped, 1, "the MAD was not steered");
        assert_eq!(buffer.0[GRH_SIZE + 3], PrivateMethod::DEFAULT.get());
        assert_eq!(
            hook.outstanding(1),
            Some((0, 1)),
            "a stale receive stayed in the map"
        );
    });
}

#[test]
fn a_receive_recorded_before_it_is_posted_is_found_at_any_interleaving() {
    race(true);
}

#[test]
fn a_receive_recorded_after_it_is_posted_loses_its_steering_in_some_interleaving() {
    let lost = std::panic::catch_unwind(|| race(false));
    assert!(
        lost.is_err(),
        "loom found no interleaving where calling through first loses"
    );
}
