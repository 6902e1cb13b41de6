//! The private data CEPs keep for repeats, in the manager's pool (src/pdata_pool.rs):
//! an operation stores what it will keep before it changes anything (so that a pool with
//! no room fails it cleanly), puts it in place once it cannot fail, and gives back what
//! it replaces.

use ibcm_mad::AttributeId;

use super::CmManager;
use crate::cep::Cep;
use crate::error::CmError;
use crate::pdata_pool::Held;
use crate::types::CepId;

impl CmManager {
    /// PASSIVE_LEVEL: tops the private-data pool up to the blocks it keeps free (a chunk,
    /// and a quarter of those in use). Only grows; one compare when the room is there.
    /// Fails (keeping what it made) if memory runs out.
    #[inline]
    pub fn prepare_private_data(&mut self) -> Result<(), CmError> {
        self.pdata.prepare()
    }

    /// PASSIVE_LEVEL, where connections end (destroy, cleanup, passive work): gives back
    /// the private-data pool's unused chunks once far more is free than it keeps
    /// (hysteresis), and all of it when no block is in use (memory back to baseline after
    /// teardown; the next [`prepare_private_data`](Self::prepare_private_data) makes the
    /// first chunk again). Never allocates.
    #[inline]
    pub fn trim_private_data(&mut self) {
        self.pdata.trim();
    }

    /// Whether a user downcall that keeps private data may grow the pool when no block is
    /// free (on by default). A dispatch layer whose downcalls may come at DISPATCH_LEVEL
    /// turns it off and calls [`prepare_private_data`](Self::prepare_private_data) at
    /// PASSIVE_LEVEL: a downcall then takes only a free block, or fails with
    /// [`CmError::NoResources`] and changes nothing.
    pub fn set_private_data_growth(&mut self, on: bool) {
        self.pdata.set_growth(on);
    }

    /// Free blocks of the private-data pool: a downcall takes one for each of its private
    /// data and additional information that is not empty (two at most).
    pub fn private_data_room(&self) -> usize {
        self.pdata.free_blocks()
    }

    /// Blocks of the private-data pool in use.
    pub fn private_data_blocks(&self) -> usize {
        self.pdata.in_use()
    }

    /// Whether the private-data pool has fallen below half what it keeps free: time for
    /// [`prepare_private_data`](Self::prepare_private_data) at PASSIVE_LEVEL.
    pub fn private_data_low(&self) -> bool {
        self.pdata.is_low()
    }

    /// Stores `data` (nothing for empty data) for an operation that has not changed
    /// anything yet.
    pub(super) fn store(&mut self, data: &[u8]) -> Result<Held, CmError> {
        self.pdata.store(data)
    }

    /// Stores `first` and `second`, both or neither.
    pub(super) fn store_two(
        &mut self,
        first: &[u8],
        second: &[u8],
    ) -> Result<(Held, Held), CmError> {
        let a = self.pdata.store(first)?;
        match self.pdata.store(second) {
            Ok(b) => Ok((a, b)),
            Err(e) => {
                self.pdata.free(a);
                Err(e)
            }
        }
    }

    /// Gives back what an operation stored and then could not use.
    pub(super) fn unstore(&mut self, held: Held) {
        self.pdata.free(held);
    }

    /// Puts `held` in the field `which` of CEP `id`, giving back what it held (and `held`
    /// itself if there is no such CEP).
    fn put(&mut self, id: CepId, which: fn(&mut Cep) -> &mut Held, held: Held) {
        let old = match self.cep_mut(id) {
            Some(c) => core::mem::replace(which(c), held),
            None => held,
        };
        self.pdata.free(old);
    }

    /// The private data of the message `attr` a CEP caches for repeats.
    pub(super) fn keep_cached(&mut self, id: CepId, attr: AttributeId, held: Held) {
        self.put(id, |c| &mut c.pdata, held);
        if let Some(c) = self.cep_mut(id) {
            c.cached = Some(attr);
        }
    }

    /// The private data of the MRA a CEP sent.
    pub(super) fn keep_mra(&mut self, id: CepId, held: Held) {
        self.put(id, |c| &mut c.mra_pdata, held);
    }

    /// A passive CEP's connection is established: the REP's and the MRA's private data go
    /// back to the pool. Nothing repeats them any more: a duplicate REQ is answered with
    /// the REP only in REP_SENT and with the MRA only before the REP (establish.rs
    /// `on_req`; Linux `cm_dup_req_handler` answers only MRA_REQ_SENT and TIMEWAIT). The
    /// active side keeps its RTU's, which a duplicate REP gets again (Linux
    /// `cm_dup_rep_handler`, IB_CM_ESTABLISHED).
    pub(super) fn forget_handshake_pdata(&mut self, id: CepId) {
        let Some(c) = self.cep_mut(id) else { return };
        if c.active || c.cached != Some(AttributeId::Rep) {
            return;
        }
        c.cached = None;
        let rep = core::mem::replace(&mut c.pdata, Held::NONE);
        let mra = core::mem::replace(&mut c.mra_pdata, Held::NONE);
        self.pdata.free(rep);
        self.pdata.free(mra);
    }

    /// The additional information of the APR or SIDR_REP a CEP sends.
    pub(super) fn keep_info(&mut self, id: CepId, held: Held) {
        self.put(id, |c| &mut c.apr_info, held);
    }
}
