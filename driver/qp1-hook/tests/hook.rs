//! The hook's verbs one at a time: what each records, releases and refuses, on the paths
//! the AL model does not take (chains refused part way, QPs and CQs that are not QP1's,
//! ports out of range, a receive CQ destroyed first).

use std::sync::Mutex;

use ibcm_qp1_hook::method::{GRH_SIZE, RECEIVE_SIZE};
use ibcm_qp1_hook::{
    Hook, IB_QPS_RESET, IB_QPT_QP1, IB_WCS_SUCCESS, Lock, Memory, NotTracked, PrivateMethod, Qp1,
    WorkCompletion,
};

struct TestLock<T>(Mutex<T>);

impl<T> Lock<T> for TestLock<T> {
    fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }
}

type TestHook = Hook<usize, TestLock<Option<Qp1<usize>>>>;

/// Buffers holding one CM Send each.
struct Buffers(Vec<[u8; RECEIVE_SIZE]>);

impl Memory for Buffers {
    type Buffer = usize;
    fn received(&mut self, buffer: usize, length: u32) -> Option<&mut [u8]> {
        self.0
            .get_mut(buffer)
            .map(|b| &mut b[..(length as usize).min(RECEIVE_SIZE)])
    }
}

fn buffers(n: usize) -> Buffers {
    let mut b = [0u8; RECEIVE_SIZE];
    b[GRH_SIZE..GRH_SIZE + 4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    Buffers(vec![b; n])
}

fn ok(wr_id: u64) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: IB_WCS_SUCCESS,
        length: RECEIVE_SIZE as u32,
    }
}

const QP: usize = 0x100;
const CQ: usize = 0x101;

fn hook() -> TestHook {
    let hook = TestHook::new(2, PrivateMethod::DEFAULT).unwrap();
    hook.create_spl_qp(1, IB_QPT_QP1, QP, CQ, 4).unwrap();
    hook
}

#[test]
fn a_chain_refused_part_way_keeps_only_what_the_hca_took() {
    let hook = hook();
    assert!(hook.post_recv(QP, (0..4u64).map(|i| (i, Some(i as usize)))));
    // The HCA took WRs 0 and 1 and names WR 2 as failed: 2 and 3 are released.
    hook.post_recv_failed(QP, [2, 3]);
    assert_eq!(hook.outstanding(1), Some((2, 0)));
    let c = hook.counters(1).unwrap();
    assert_eq!((c.posted, c.refused), (4, 2));
    // Their late "completions" are unknown; the posted ones are steered.
    let mut mem = buffers(4);
    let all = |_: u8, _: &[u8]| true;
    assert_eq!(hook.poll_cq(CQ, &mut mem, &all, [ok(3), ok(0), ok(1)]), 2);
    assert_eq!(hook.counters(1).unwrap().unknown, 1);
    assert_eq!(
        mem.0[3][GRH_SIZE + 3],
        0x03,
        "a released receive's buffer was written"
    );
    assert_eq!(mem.0[0][GRH_SIZE + 3], PrivateMethod::DEFAULT.get());
}

#[test]
fn beyond_the_depth_and_unmapped_receives_are_not_recorded() {
    let hook = hook();
    let wrs = (0..6u64).map(|i| (i, (i != 1).then_some(i as usize)));
    assert!(hook.post_recv(QP, wrs));
    let c = hook.counters(1).unwrap();
    assert_eq!((c.posted, c.unmapped, c.over_depth), (4, 1, 1));
    assert_eq!(hook.outstanding(1), Some((4, 0)));
    // The unmapped receive's completion passes as it came.
    let mut mem = buffers(6);
    let all = |_: u8, _: &[u8]| true;
    assert_eq!(hook.poll_cq(CQ, &mut mem, &all, [ok(1)]), 0);
    assert_eq!(mem.0[1][GRH_SIZE + 3], 0x03);
}

#[test]
fn other_qps_cqs_and_ports_are_left_alone() {
    let hook = hook();
    assert_eq!(
        hook.create_spl_qp(2, 4, 0x200, 0x201, 4),
        Err(NotTracked::NotQp1)
    );
    assert_eq!(
        hook.create_spl_qp(3, IB_QPT_QP1, 0x300, 0x301, 4),
        Err(NotTracked::Port(3))
    );
    assert_eq!(
        hook.create_spl_qp(0, IB_QPT_QP1, 0x300, 0x301, 4),
        Err(NotTracked::Port(0))
    );
    assert!(!hook.post_recv(0x200, [(9, Some(0))]));
    assert!(!hook.is_qp1(0x200) && !hook.is_qp1(0) && !hook.is_qp1_recv_cq(0x201));
    assert!(hook.is_qp1(QP) && hook.is_qp1_recv_cq(CQ) && !hook.is_qp1_recv_cq(QP));
    let mut mem = buffers(1);
    let all = |_: u8, _: &[u8]| true;
    assert_eq!(hook.poll_cq(0x201, &mut mem, &all, [ok(9)]), 0);
    assert_eq!(mem.0[0][GRH_SIZE + 3], 0x03);
    // Only RESET forgets, only on a QP1.
    assert!(hook.post_recv(QP, [(1, Some(0))]));
    hook.modify_qp(QP, 0x0000_0002);
    hook.modify_qp(0x200, IB_QPS_RESET);
    assert_eq!(hook.outstanding(1), Some((1, 0)));
    hook.modify_qp(QP, IB_QPS_RESET);
    assert_eq!(hook.outstanding(1), Some((0, 0)));
    assert!(!hook.claim(2, &[0; 24]) && !hook.claim(9, &[0; 24]) && !hook.claim(1, &[0; 3]));
}

#[test]
fn a_receive_cq_destroyed_first_forgets_its_qp1() {
    let hook = hook();
    assert!(hook.post_recv(QP, [(1, Some(0)), (2, Some(1))]));
    assert_eq!(hook.destroy_cq(0x999), None);
    let last = hook.destroy_cq(CQ).unwrap();
    assert_eq!((last.posted, last.forgotten), (2, 2));
    assert!(!hook.is_qp1(QP) && !hook.is_qp1_recv_cq(CQ));
    assert_eq!(hook.destroy_qp(QP), None);
    assert_eq!(hook.counters(1), None);
    // The port takes a new QP1.
    hook.create_spl_qp(1, IB_QPT_QP1, 0x400, 0x401, 2).unwrap();
    assert_eq!(hook.outstanding(1), Some((0, 0)));
}
