//! WinOF's kernel CM interface, `iba_cm` 1.1 (`GUID_INFINIBAND_INTERFACE_CM`,
//! `inc/kernel/iba/ib_cm_ifc.h`), binary-compatible and with the semantics of AL's
//! `core/al/kernel/al_cm.c`, over ibcm's dispatch layer ([`ibcm_endpoint::Device`]), so
//! that unmodified WinVerbs and ndfltr run their connections through ibcm.
//!
//! - [`abi`]: the structures, laid out as MSVC x64 lays them out, every size and offset
//!   asserted at compile time.
//! - [`Registered`]: one CM instance: a [`Backend`] (the device and what the platform
//!   knows: IRQL, ports, P_Key table), a pool of `iba_cm_id`s made at PASSIVE_LEVEL, and
//!   the table a query for the interface hands out ([`Registered::answer_query`]), with a
//!   reference count that removal waits on.
//! - The 22 functions (`ffi`), in the header's order.
//! - [`decide_query`] / [`answer`]: which `IRP_MN_QUERY_INTERFACE` the binding answers and
//!   which it passes down to ibbus (and why).
//!
//! What the functions guarantee (AL's contract, and where ibcm does better):
//! - Every function but `destroy_id` may be called at IRQL <= DISPATCH_LEVEL, under the
//!   caller's own spin lock: they allocate nothing and wait for nothing (ids come from a
//!   pool grown at PASSIVE_LEVEL, listens from a bounded set of compare buffers and
//!   queues, the engine from room made ahead); when the room is used up they fail with
//!   `STATUS_INSUFFICIENT_RESOURCES`. A pool running low asks for the PASSIVE_LEVEL work
//!   that grows it (`Platform::request_passive_work`), so a client that leaks ids (as
//!   WinVerbs does at every reconnect) runs out no sooner than under AL. They never call a callback (the caller may hold the
//!   lock its callback takes): events they make ready are delivered by the receive path,
//!   the timer, or [`Registered::deliver`] (a DPC, asked for with
//!   [`Backend::schedule_delivery`]).
//! - `destroy_id` is synchronous and for PASSIVE_LEVEL (as AL's, which waits): when it
//!   returns, no callback of the id runs or will run. Unlike AL's it may also be called
//!   from the id's own callback (the destroy is then finished when the callback returns).
//! - Callbacks run at DISPATCH_LEVEL ([`Backend::at_dispatch`]) with no ibcm lock held, one
//!   at a time per id, in order. The id's `callback` and `context` are read afresh at every
//!   delivery. A `!NT_SUCCESS` return destroys the id and frees it (al_cm.c:90-95): the
//!   client must not touch it again.
//! - A listen's callback gets a zeroed `iba_cm_req_received` notification per request (its
//!   return value is ignored, al_cm.c:101-111); the client pulls requests with
//!   `get_request`/`get_request_ex` until `STATUS_NO_MORE_ENTRIES`. A request's id inherits
//!   the listen's callback with context = the listen id (`get_request`, al_cm.c:147-150),
//!   or gets the given ones (`get_request_ex`).
//! - For an RDMA-CM service ID (0x0000_0000_01PP_pppp) with a compare buffer,
//!   `compare_offset` is a mask of `IB_REQ_CM_RDMA_CMP_*` bits (al_cm_cep.c:2783,
//!   2850-2864): the header's version and IP version always compare, then the selected
//!   fields.
//! - Pointers in an event (private data, ARI, paths) are valid only during the callback,
//!   except those of a SIDR_REQ returned by `get_request`, which are valid until the id is
//!   destroyed.
//! - Kept from ibcm: MRA honoured once, stale-connection detection through timewait,
//!   duplicate handling, SIDR (AL's kernel CM returns STATUS_NOT_SUPPORTED), the LAP/APR
//!   events formatted (AL leaves them empty).
//! - No input from a client can make it panic: null pointers, bad lengths, bad enum values
//!   fail with STATUS_INVALID_PARAMETER; a pointer that is not an id of this CM fails with
//!   STATUS_INVALID_HANDLE (it is compared, never read), and so does the pointer of an
//!   id already destroyed (`destroy_id` on it does nothing) long after: slots are reused
//!   oldest-first, each at a new address, so that ndfltr's second `destroy_id` at HCA
//!   removal reaches no other connection (`slots`).
#![no_std]
#![warn(missing_docs)]

extern crate alloc;

pub mod abi;
mod convert;
mod ffi;
mod instance;
mod query;
mod slots;

pub use instance::{Backend, Config, MAX_INSTANCES, Registered};
pub use query::{PassDown, QueryDecision, answer, decide_query};
