//! What the dispatch layer holds, by part, in bytes: the capacity of every table, queue
//! and pool it owns (what a kernel pays in nonpaged pool, touched or not). The engine's
//! share is what the platform measures for the whole driver less these parts.

use core::mem::size_of;

use ibcm_cep::grow::HeapBytes;
use ibcm_ioctl::EventRecord;

use super::client::Clients;
use super::pool::{RECORD_CHUNK, RecordPool};
use super::table::Table;
use super::{Endpoint, File, Inner};
use crate::platform::Platform;

/// The dispatch layer's memory by part (see [`Device::memory`](crate::Device::memory)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DispatchMemory {
    /// The event-record pool: the records queued on endpoints, and a few batches' worth free.
    pub records: usize,
    /// File and endpoint tables, endpoints built ahead, their FIFOs and request queues,
    /// the index of pending requests, users' lingering CEPs, and the CEP-to-owner table.
    pub endpoints: usize,
    /// Kernel-client endpoints and their event queues.
    pub clients: usize,
    /// Batches kept for the DISPATCH_LEVEL paths (MADs to send, requests to complete).
    pub batches: usize,
    /// The private data of the last message each endpoint received (for QUERY: the
    /// blocks of its pool, held or free), counted apart from `endpoints` as the budgets
    /// exclude cached private data.
    pub private_data: usize,
}

impl DispatchMemory {
    /// All parts but the cached private data.
    pub fn tables(&self) -> usize {
        self.records + self.endpoints + self.clients + self.batches
    }

    /// All parts.
    pub fn total(&self) -> usize {
        self.tables() + self.private_data
    }
}

fn table_bytes<T>(t: &Table<T>, each: impl Fn(&T) -> usize) -> usize {
    t.slots.heap_bytes()
        + t.free.heap_bytes()
        + t.retired_bytes()
        + t.values().map(each).sum::<usize>()
}

fn endpoint_bytes<R>(ep: &Endpoint<R>) -> usize {
    ep.pending.heap_bytes()
}

fn file_bytes<R>(f: &File<R>) -> usize {
    table_bytes(&f.endpoints, endpoint_bytes)
        + f.spares.heap_bytes()
        + f.spares.iter().map(endpoint_bytes).sum::<usize>()
        + f.channel.heap_bytes()
        + f.ready.heap_bytes()
        + f.waiting.allocation_size()
}

impl RecordPool {
    fn bytes(&self) -> usize {
        self.chunks.len() * RECORD_CHUNK * size_of::<EventRecord>()
            + self.chunks.heap_bytes()
            + self.free.heap_bytes()
            + self.next.heap_bytes()
    }
}

impl<P: Platform> Clients<P> {
    fn bytes(&self) -> usize {
        table_bytes(&self.table, |c| c.heap_bytes()) + self.ready.heap_bytes() + self.spare_bytes()
    }
}

impl<P: Platform> Inner<P> {
    pub(super) fn memory(&self) -> DispatchMemory {
        DispatchMemory {
            records: self.records.bytes(),
            endpoints: table_bytes(&self.files, file_bytes) + self.lingering.heap_bytes(),
            private_data: self.pdata.bytes(),
            clients: self.clients.bytes(),
            batches: self.tx.heap_bytes()
                + self.done.heap_bytes()
                + self.spare_tx.heap_bytes()
                + self
                    .spare_tx
                    .iter()
                    .map(HeapBytes::heap_bytes)
                    .sum::<usize>()
                + self.spare_done.heap_bytes()
                + self
                    .spare_done
                    .iter()
                    .map(HeapBytes::heap_bytes)
                    .sum::<usize>(),
        }
    }
}
