//! The CEPs' alternate paths, in the manager's path table (src/path_table.rs): a store
//! comes before an operation changes anything (so that a table with no room fails it
//! cleanly), a CEP's reference is put in place once the operation cannot fail, and what
//! it replaces goes back.

use super::CmManager;
use crate::cep::Cep;
use crate::error::CmError;
use crate::path_table::{KEEP_FREE, PathRef};
use crate::types::{CepId, PathRecord};

/// Which of a CEP's two alternate paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Alt {
    /// The connection's alternate path (`Cep::alternate`).
    Loaded,
    /// A LAP's, or a refused REQ's, until settled (`Cep::pending_alternate`).
    Pending,
}

fn field(c: &mut Cep, which: Alt) -> &mut Option<PathRef> {
    match which {
        Alt::Loaded => &mut c.alternate,
        Alt::Pending => &mut c.pending_alternate,
    }
}

impl CmManager {
    /// A CEP's loaded alternate path.
    pub(super) fn alternate_of(&self, c: &Cep) -> Option<&PathRecord> {
        self.paths.get(c.alternate)
    }

    /// A CEP's pending alternate path.
    pub(super) fn pending_of(&self, c: &Cep) -> Option<&PathRecord> {
        self.paths.get(c.pending_alternate)
    }

    /// Stores `path` (nothing for `None`) for an operation that has not changed anything
    /// yet. In fixed-room mode (DISPATCH_LEVEL) only the room `prepare_for` made is
    /// taken: none left, `NoResources`; half of `KEEP_FREE` left, more is asked for
    /// ([`Self::wants_room`]) before a REQ or LAP finds none.
    pub(super) fn store_path(
        &mut self,
        path: Option<PathRecord>,
    ) -> Result<Option<PathRef>, CmError> {
        let stored = path
            .map(|p| self.paths.store(p, !self.fixed_room))
            .transpose();
        if self.fixed_room && self.paths.room() < KEEP_FREE / 2 {
            self.paths_short = true;
        }
        stored
    }

    /// Whether a received REQ or LAP carrying an alternate path finds room for it:
    /// what [`Self::store_path`] would take. None: the MAD is dropped (counted), as a
    /// REQ finding no slot is, and its sender retries (Linux `cm_lap_handler` and WinOF
    /// `__lap_handler` drop a LAP they cannot load too); passive work is asked for, whose
    /// `prepare_for` makes the room the retry finds.
    pub(super) fn path_room_for(&mut self, alternate: bool) -> bool {
        if !alternate || !self.fixed_room || self.paths.room() > 0 {
            return true;
        }
        self.counters.path_room_drops += 1;
        self.paths_short = true;
        false
    }

    /// Puts `path` as CEP `id`'s `which` alternate path, giving back what it held (and
    /// `path` itself if there is no such CEP).
    pub(super) fn put_path(&mut self, id: CepId, which: Alt, path: Option<PathRef>) {
        let old = match self.cep_mut(id) {
            Some(c) => core::mem::replace(field(c, which), path),
            None => path,
        };
        self.paths.free(old);
    }

    /// CEP `id`'s `which` alternate path is forgotten.
    pub(super) fn drop_path(&mut self, id: CepId, which: Alt) {
        self.put_path(id, which, None);
    }

    /// The pending alternate path becomes the loaded one (a LAP settled by an APR
    /// Success, a REQ's alternate path accepted by a re-formatted REP).
    pub(super) fn load_pending(&mut self, id: CepId) {
        let pending = self.cep_mut(id).and_then(|c| c.pending_alternate.take());
        self.put_path(id, Alt::Loaded, pending);
    }

    /// Alternate paths the CEPs hold (loaded and pending) in the path table.
    pub fn alternate_paths(&self) -> usize {
        self.paths.in_use()
    }
}
