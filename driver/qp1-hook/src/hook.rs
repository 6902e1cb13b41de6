//! The hook of one HCA: the bookkeeping behind each hooked verb, called by the binding's
//! thunks around the HCA's own entry point.
//!
//! | verb | when the thunk calls the hook | IRQL |
//! |---|---|---|
//! | `create_spl_qp` | after the HCA's call succeeded: [`Hook::create_spl_qp`] | PASSIVE |
//! | `post_recv` | before calling through: [`Hook::post_recv`]; after a failure: [`Hook::post_recv_failed`] | ≤ DISPATCH |
//! | `poll_cq`, `poll_cq_array` | after the HCA's call returned `IB_SUCCESS`, on the done list or the filled entries: [`Hook::poll_cq`] | ≤ DISPATCH |
//! | `modify_qp` | after the HCA's call succeeded: [`Hook::modify_qp`] | ≤ DISPATCH |
//! | `destroy_qp`, `destroy_cq` | after the HCA's call succeeded: [`Hook::destroy_qp`], [`Hook::destroy_cq`] | PASSIVE |
//!
//! A receive is recorded *before* it is posted: once posted it can complete and be polled
//! on another CPU before `post_recv` returns on this one. Each port's state is under its
//! own lock (a spin lock in the binding), held only for map operations: the steering
//! decision and the remap run without it, so the decision may take the CM manager's lock
//! (no lock nesting). Every other CQ and QP of the HCA passes a lock-free filter (one
//! atomic load per port) and is never locked.

use alloc::vec::Vec;
use core::marker::PhantomData;

use crate::method::{
    GRH_SIZE, MAD_HEADER_SIZE, MAD_SIZE, PrivateMethod, RECEIVE_SIZE, is_cm_send, remap,
};
use crate::port::{Counters, Qp1};
use crate::sync::{AtomicUsize, Ordering};
use crate::tickets::Ticket;

/// An HCA handle (`ib_qp_handle_t`, `ib_cq_handle_t`) as its address; 0 is none.
pub type Handle = usize;

/// `IB_QPT_QP1` (`inc/iba/ib_types.h`: `ib_qp_type_t`).
pub const IB_QPT_QP1: u32 = 5;
/// `IB_QPS_RESET` (`inc/iba/ib_types.h`).
pub const IB_QPS_RESET: u32 = 0x0000_0001;
/// `IB_WCS_SUCCESS` (`inc/iba/ib_types.h`: `ib_wc_status_t`).
pub const IB_WCS_SUCCESS: u32 = 0;
/// `IB_WCS_WR_FLUSHED_ERR` (`inc/iba/ib_types.h`: `ib_wc_status_t`).
pub const IB_WCS_WR_FLUSHED_ERR: u32 = 4;

/// A lock around one port's state: a spin lock raised to DISPATCH_LEVEL in the binding.
pub trait Lock<T> {
    /// A lock holding `value`.
    fn new(value: T) -> Self;
    /// Runs `f` with the value, the lock held.
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

/// The receive buffers the binding records at `post_recv`.
pub trait Memory {
    /// What the binding keeps of a posted receive's buffer (its system address).
    type Buffer: Copy;
    /// The bytes of a completed receive (`length`: the completion's byte count, GRH
    /// included), writable: the HCA is done with them and AL reads them only after
    /// `poll_cq` returns. None if they cannot be had.
    fn received(&mut self, buffer: Self::Buffer, length: u32) -> Option<&mut [u8]>;
}

/// The steering decision: fed by `CmManager::owner_of` (`ibcm-cep`, `manager/steer.rs`).
pub trait Steer {
    /// Whether the CM Send received on `port` is ibcm's.
    fn is_ours(&self, port: u8, mad: &[u8]) -> bool;
}

impl<F: Fn(u8, &[u8]) -> bool> Steer for F {
    fn is_ours(&self, port: u8, mad: &[u8]) -> bool {
        self(port, mad)
    }
}

/// The fields of an `ib_wc_t` the hook reads (it writes none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// `wr_id`.
    pub wr_id: u64,
    /// `status` (`ib_wc_status_t`).
    pub status: u32,
    /// `length`: bytes received, GRH included.
    pub length: u32,
}

/// Why a special QP is not tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotTracked {
    /// Not QP1 (QP0, raw): nothing of the CM's.
    NotQp1,
    /// A port number beyond the slots the hook was made with.
    Port(u8),
    /// No room for the receive map (its MADs then all reach AL).
    NoMemory,
}

/// One port's slot: the filter's copies of its handles and the locked state.
struct Slot<L> {
    qp: AtomicUsize,
    recv_cq: AtomicUsize,
    state: L,
}

/// The hook of one HCA (see the module's documentation).
pub struct Hook<B, L> {
    slots: Vec<Slot<L>>,
    method: PrivateMethod,
    buffer: PhantomData<fn(B) -> B>,
}

impl<B: Copy, L: Lock<Option<Qp1<B>>>> Hook<B, L> {
    /// A hook for ports 1..=`ports` (PASSIVE_LEVEL, when the filter device is added);
    /// None if the room cannot be had.
    pub fn new(ports: u8, method: PrivateMethod) -> Option<Self> {
        let mut slots = Vec::new();
        slots.try_reserve_exact(usize::from(ports)).ok()?;
        for _ in 0..ports {
            slots.push(Slot {
                qp: AtomicUsize::new(0),
                recv_cq: AtomicUsize::new(0),
                state: L::new(None),
            });
        }
        Some(Self {
            slots,
            method,
            buffer: PhantomData,
        })
    }

    /// The private method this hook remaps to.
    pub fn method(&self) -> PrivateMethod {
        self.method
    }

    /// `create_spl_qp` succeeded (PASSIVE_LEVEL): track a QP1 (`p_create_attr->qp_type`,
    /// `h_rq_cq`, the created `p_qp_attr->rq_depth`). Replaces what the port had. On an
    /// error the QP works, unhooked: all its MADs reach AL.
    pub fn create_spl_qp(
        &self,
        port_num: u8,
        qp_type: u32,
        qp: Handle,
        recv_cq: Handle,
        rq_depth: u32,
    ) -> Result<(), NotTracked> {
        if qp_type != IB_QPT_QP1 {
            return Err(NotTracked::NotQp1);
        }
        let slot = self.slot(port_num).ok_or(NotTracked::Port(port_num))?;
        let fresh = Qp1::new(port_num, qp, recv_cq, rq_depth).ok_or(NotTracked::NoMemory)?;
        let stale = slot.state.with(|s| {
            let stale = s.replace(fresh);
            slot.qp.store(qp, Ordering::Release);
            slot.recv_cq.store(recv_cq, Ordering::Release);
            stale
        });
        drop(stale);
        Ok(())
    }

    /// `post_recv` on `qp`, before calling through: records each work request's `wr_id`
    /// and buffer (None: the binding could not see it). Returns whether `qp` is a tracked
    /// QP1 (then a failed post must be reported with [`Self::post_recv_failed`]).
    pub fn post_recv(&self, qp: Handle, wrs: impl IntoIterator<Item = (u64, Option<B>)>) -> bool {
        self.with_qp(qp, |s| {
            for (wr_id, buffer) in wrs {
                let Some(buffer) = buffer else {
                    // A stale entry of this wr_id must not meet this receive's completion.
                    if s.receives.take(wr_id).is_some() {
                        s.counters.replaced += 1;
                    }
                    s.counters.unmapped += 1;
                    continue;
                };
                match s.receives.insert(wr_id, buffer) {
                    Ok(replaced) => {
                        s.counters.posted += 1;
                        s.counters.replaced += u64::from(replaced);
                    }
                    Err(_) => s.counters.over_depth += 1,
                }
            }
        })
        .is_some()
    }

    /// `post_recv` on `qp` failed: releases the work requests the HCA did not take (the
    /// one `*pp_failed` names and every one after it; all of them when it names none).
    pub fn post_recv_failed(&self, qp: Handle, wr_ids: impl IntoIterator<Item = u64>) {
        self.with_qp(qp, |s| {
            for wr_id in wr_ids {
                if s.receives.take(wr_id).is_some() {
                    s.counters.refused += 1;
                }
            }
        });
    }

    /// `poll_cq` or `poll_cq_array` on `cq` returned these completions (the done list in
    /// order, or the filled array entries): for QP1's receive CQ, each recorded receive
    /// is released, and each successful one holding a CM Send that `steer` gives ibcm
    /// gets the private method in its buffer. The completions themselves are not
    /// touched. Returns how many were remapped.
    pub fn poll_cq<M: Memory<Buffer = B>>(
        &self,
        cq: Handle,
        memory: &mut M,
        steer: &impl Steer,
        wcs: impl IntoIterator<Item = WorkCompletion>,
    ) -> usize {
        let Some(slot) = self.slot_of_cq(cq) else {
            return 0;
        };
        let mut remapped = 0;
        for wc in wcs {
            let Some((port_num, buffer)) = slot.state.with(|s| {
                let s = s.as_mut().filter(|s| s.recv_cq == cq)?;
                let Some(buffer) = s.receives.take(wc.wr_id) else {
                    s.counters.unknown += 1;
                    return None;
                };
                match wc.status {
                    IB_WCS_SUCCESS => Some((s.port_num, buffer)),
                    IB_WCS_WR_FLUSHED_ERR => {
                        s.counters.flushed += 1;
                        None
                    }
                    _ => {
                        s.counters.errors += 1;
                        None
                    }
                }
            }) else {
                continue;
            };
            let outcome = memory
                .received(buffer, wc.length)
                .map_or(Steering::Other, |bytes| self.steer(port_num, bytes, steer));
            slot.state.with(|s| {
                let Some(s) = s.as_mut().filter(|s| s.recv_cq == cq) else {
                    return;
                };
                match outcome {
                    Steering::Steered(ticket) => {
                        s.counters.steered += 1;
                        s.counters.tickets_evicted += u64::from(s.tickets.issue(ticket));
                        remapped += 1;
                    }
                    Steering::Passed => s.counters.passed_cm += 1,
                    Steering::Other => s.counters.passed_other += 1,
                }
            });
        }
        remapped
    }

    /// Decides and remaps one successful receive (no lock held).
    fn steer(&self, port_num: u8, bytes: &mut [u8], steer: &impl Steer) -> Steering {
        let mad: Option<&mut [u8; MAD_SIZE]> = bytes
            .get_mut(GRH_SIZE..RECEIVE_SIZE)
            .and_then(|m| m.try_into().ok());
        let Some(mad) = mad.filter(|m| is_cm_send(&m[..])) else {
            return Steering::Other;
        };
        if !steer.is_ours(port_num, mad) || !remap(mad, self.method) {
            return Steering::Passed;
        }
        let mut ticket: Ticket = [0; MAD_HEADER_SIZE];
        ticket.copy_from_slice(&mad[..MAD_HEADER_SIZE]);
        Steering::Steered(ticket)
    }

    /// `modify_qp` on `qp` to `req_state` succeeded: a QP1 moved to RESET has no receive
    /// left and none of its completions on the CQ (mlx4 cleans them:
    /// `hw/mlx4/kernel/bus/ib/qp.c` `__mlx4_ib_modify_qp`, `mlx4_ib_cq_clean`), so its
    /// map is forgotten. Every other transition changes nothing here (to ERROR, its
    /// receives complete as flushed).
    pub fn modify_qp(&self, qp: Handle, req_state: u32) {
        if req_state != IB_QPS_RESET {
            return;
        }
        self.with_qp(qp, |s| {
            s.counters.forgotten += s.receives.clear() as u64;
        });
    }

    /// `destroy_qp` on `qp` succeeded (no completion of it is returned after,
    /// `ci_destroy_qp`): forget the port's QP1. Returns its last counters.
    pub fn destroy_qp(&self, qp: Handle) -> Option<Counters> {
        let slot = self.slot_of_qp(qp)?;
        let gone = slot.state.with(|s| {
            if s.as_ref().is_some_and(|s| s.qp == qp) {
                slot.qp.store(0, Ordering::Release);
                slot.recv_cq.store(0, Ordering::Release);
                s.take()
            } else {
                None
            }
        });
        gone.map(|mut s| {
            s.counters.forgotten += s.receives.len() as u64;
            s.counters
        })
    }

    /// `destroy_cq` on `cq` succeeded: if it was a tracked QP1's receive CQ (its QP
    /// destroyed first is the rule, `ci_destroy_cq`; this covers the other order), the
    /// port's QP1 is forgotten.
    pub fn destroy_cq(&self, cq: Handle) -> Option<Counters> {
        let slot = self.slot_of_cq(cq)?;
        let qp = slot
            .state
            .with(|s| s.as_ref().filter(|s| s.recv_cq == cq).map(|s| s.qp))?;
        self.destroy_qp(qp)
    }

    /// ibcm's receive callback, on a delivered MAD with the private method: whether the
    /// hook remapped a MAD with this header on `port_num` (and it is claimed now). Feed
    /// the answer to [`restore`](crate::restore).
    pub fn claim(&self, port_num: u8, mad: &[u8]) -> bool {
        let Some(header) = mad.get(..MAD_HEADER_SIZE) else {
            return false;
        };
        let Some(slot) = self.slot(port_num) else {
            return false;
        };
        slot.state.with(|s| {
            let Some(s) = s.as_mut() else {
                return false;
            };
            let claimed = s.tickets.claim(header);
            s.counters.claimed += u64::from(claimed);
            claimed
        })
    }

    /// Whether `qp` is a tracked QP1 (lock-free; the thunks' fast path).
    pub fn is_qp1(&self, qp: Handle) -> bool {
        qp != 0 && self.slot_of_qp(qp).is_some()
    }

    /// Whether `cq` is a tracked QP1's receive CQ (lock-free; the thunks' fast path).
    pub fn is_qp1_recv_cq(&self, cq: Handle) -> bool {
        cq != 0 && self.slot_of_cq(cq).is_some()
    }

    /// The counters of a port's QP1.
    pub fn counters(&self, port_num: u8) -> Option<Counters> {
        self.slot(port_num)?
            .state
            .with(|s| s.as_ref().map(|s| s.counters))
    }

    /// Receives recorded on a port's QP1, and tickets not claimed.
    pub fn outstanding(&self, port_num: u8) -> Option<(usize, usize)> {
        self.slot(port_num)?.state.with(|s| {
            s.as_ref()
                .map(|s| (s.receives.len(), s.tickets.outstanding()))
        })
    }

    fn slot(&self, port_num: u8) -> Option<&Slot<L>> {
        self.slots.get(usize::from(port_num).checked_sub(1)?)
    }

    fn slot_of_qp(&self, qp: Handle) -> Option<&Slot<L>> {
        self.slots
            .iter()
            .find(|s| qp != 0 && s.qp.load(Ordering::Acquire) == qp)
    }

    fn slot_of_cq(&self, cq: Handle) -> Option<&Slot<L>> {
        self.slots
            .iter()
            .find(|s| cq != 0 && s.recv_cq.load(Ordering::Acquire) == cq)
    }

    /// Runs `f` on the state of the tracked QP1 `qp`, its lock held.
    fn with_qp<R>(&self, qp: Handle, f: impl FnOnce(&mut Qp1<B>) -> R) -> Option<R> {
        let slot = self.slot_of_qp(qp)?;
        slot.state
            .with(|s| s.as_mut().filter(|s| s.qp == qp).map(f))
    }
}

/// What one successful receive came to.
enum Steering {
    Steered(Ticket),
    Passed,
    Other,
}
