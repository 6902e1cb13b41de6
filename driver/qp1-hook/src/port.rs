//! One port's QP1 as the hook tracks it: its handles, its posted receives, the tickets of
//! the MADs it remapped, and what it counted.

use crate::Handle;
use crate::receives::Receives;
use crate::tickets::Tickets;

/// What the hook did on one port, for the debugger and the tests. Every counter only
/// grows while the QP lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Receives recorded at `post_recv`.
    pub posted: u64,
    /// Receives not recorded: the depth was reached (the HCA refuses them too).
    pub over_depth: u64,
    /// Receives not recorded: the binding could not see their buffer (not one segment of
    /// GRH + MAD, or no mapping); their completions pass as they come.
    pub unmapped: u64,
    /// Recorded receives the HCA refused (`post_recv` failed), released.
    pub refused: u64,
    /// Recorded receives posted again before they completed (stale entry replaced).
    pub replaced: u64,
    /// Successful receives remapped to the private method (ibcm's).
    pub steered: u64,
    /// Successful CM Sends left for AL's CM.
    pub passed_cm: u64,
    /// Successful receives that are not CM Sends, left as they came.
    pub passed_other: u64,
    /// Flushed receives (`IB_WCS_WR_FLUSHED_ERR`), released, not looked at.
    pub flushed: u64,
    /// Receives completed in error, released, not looked at.
    pub errors: u64,
    /// Completions whose `wr_id` was not recorded, left as they came.
    pub unknown: u64,
    /// Recorded receives forgotten by a reset or a destroy.
    pub forgotten: u64,
    /// Tickets overwritten before ibcm claimed them.
    pub tickets_evicted: u64,
    /// Tickets ibcm claimed.
    pub claimed: u64,
}

/// The port's QP1 state (under the port's lock).
#[derive(Debug)]
pub struct Qp1<B> {
    pub(crate) port_num: u8,
    pub(crate) qp: Handle,
    pub(crate) recv_cq: Handle,
    pub(crate) receives: Receives<B>,
    pub(crate) tickets: Tickets,
    pub(crate) counters: Counters,
}

impl<B: Copy> Qp1<B> {
    /// The state of a QP1 just created (PASSIVE_LEVEL: allocates its room); None if the
    /// room cannot be had.
    pub(crate) fn new(port_num: u8, qp: Handle, recv_cq: Handle, rq_depth: u32) -> Option<Self> {
        Some(Self {
            port_num,
            qp,
            recv_cq,
            receives: Receives::with_depth(usize::try_from(rq_depth).ok()?)?,
            tickets: Tickets::new()?,
            counters: Counters::default(),
        })
    }
}
