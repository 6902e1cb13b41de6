//! The received-MAD ring between the QP1 receive callback and the receive DPC: the
//! callback (DISPATCH_LEVEL, any CPU) copies each MAD into a bounded, preallocated ring;
//! the DPC hands the ring to [`Device::receive_batch`] [`RECEIVE_BATCH`] MADs at a time,
//! as the host fabric does, so a batch's MADs share one lock, one send batch and one
//! round of completions.
//!
//! No allocation and no large stack frame at DISPATCH_LEVEL: a batch is copied out of
//! the ring into one preallocated buffer (16 MADs, 4.5 KB) that a draining DPC holds as a
//! baton. A DPC object can run on two CPUs at once (queued again while it runs); the one
//! that finds the baton taken returns at once, and the holder, after putting it back,
//! looks at the ring again and says whether to requeue. No lock is held while the device
//! runs (it completes requests and calls kernel clients).

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use ibcm_cep::MadAddress;
use ibcm_ioctl::status;
use ibcm_mad::MAD_SIZE;

use crate::device::{Device, RECEIVE_BATCH};
use crate::platform::{Lock, Platform};
use crate::records::Status;

/// A received MAD and where it came from.
pub type Received = (MadAddress, [u8; MAD_SIZE]);

/// The ring (see the module's documentation).
pub struct ReceiveRing<P: Platform> {
    ring: P::Lock<VecDeque<Received>>,
    /// The batch buffer, while no DPC holds it.
    baton: P::Lock<Option<Vec<Received>>>,
}

impl<P: Platform> Default for ReceiveRing<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Platform> ReceiveRing<P> {
    /// An empty ring with no room yet: see [`reserve`](Self::reserve).
    pub fn new() -> Self {
        Self {
            ring: P::new_lock(VecDeque::new()),
            baton: P::new_lock(None),
        }
    }

    /// Room for `capacity` MADs and the batch buffer (PASSIVE_LEVEL, device add).
    pub fn reserve(&self, capacity: usize) -> Result<(), Status> {
        let no = |_| status::INSUFFICIENT_RESOURCES;
        self.ring
            .with(|r| r.try_reserve_exact(capacity))
            .map_err(no)?;
        let mut batch = Vec::new();
        batch.try_reserve_exact(RECEIVE_BATCH).map_err(no)?;
        batch.resize(RECEIVE_BATCH, (MadAddress::default(), [0u8; MAD_SIZE]));
        self.baton.with(|b| *b = Some(batch));
        Ok(())
    }

    /// Queues a received MAD (the receive callback, DISPATCH_LEVEL); false if the ring is
    /// full (the MAD is dropped, as a full receive queue drops it: the CM retries).
    pub fn push(&self, source: MadAddress, mad: &[u8; MAD_SIZE]) -> bool {
        self.ring.with(|r| {
            if r.len() < r.capacity() {
                r.push_back((source, *mad));
                true
            } else {
                false
            }
        })
    }

    /// The receive DPC: hands up to `budget` queued MADs to `device`, a batch at a time.
    /// Returns whether MADs remain, so the DPC requeues itself (it stays bounded).
    pub fn drain(&self, device: &Device<P>, budget: usize) -> bool {
        let Some(mut batch) = self.baton.with(Option::take) else {
            // Another CPU is draining; it looks at the ring again when done.
            return false;
        };
        let mut handled = 0;
        while handled < budget {
            let n = self.ring.with(|r| {
                let n = r.len().min(RECEIVE_BATCH).min(budget - handled);
                for (slot, mad) in batch.iter_mut().zip(r.drain(..n)) {
                    *slot = mad;
                }
                n
            });
            let Some(mads) = batch.get(..n).filter(|m| !m.is_empty()) else {
                break;
            };
            device.receive_batch(mads.iter().map(|(src, mad)| (src, &mad[..])));
            handled += n;
        }
        self.baton.with(|b| *b = Some(batch));
        self.ring.with(|r| !r.is_empty())
    }

    /// MADs waiting.
    pub fn len(&self) -> usize {
        self.ring.with(|r| r.len())
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
