//! The Windows backend's logic, apart from the Win32 calls it makes: which requests are in
//! flight and by what key they are cancelled, the completion thread, close and drop, and
//! what status a failure reports. The calls themselves are the [`Win32`] trait:
//! `backend::windows` makes them for real; `backend::emulated` (feature `in-process`)
//! fakes them over the driver's dispatch code with the same threading, which is how this
//! logic is tested off Windows.
//!
//! - A request is kept (OVERLAPPED, buffers, completion hook) in a table under a key of
//!   its own until its completion packet is dequeued. A cancel looks its key up and calls
//!   `CancelIoEx` with the OVERLAPPED's address only while the request is in the table,
//!   under the table's lock: the address cannot have been freed and reused by another
//!   request (the provider's event-channel GET_EVENT, say).
//! - `DeviceIoControl` is called under the same lock, so a `CloseHandle` (close, drop)
//!   cannot come between the check that the handle is open and the call: a closed handle
//!   value, which Windows may give to another object, is never used.
//! - One thread dequeues completions (`GetQueuedCompletionStatus`) and runs their hooks.
//!   A hook that panics is caught: the provider fails (its handle is closed, every
//!   pending request completes with STATUS_INTERNAL_ERROR, later ones fail with it)
//!   instead of every wait hanging on a dead thread. A blocking call made on this thread
//!   fails (`crate::completion`): only this thread could complete what it would wait for.
//! - Dropping the device closes the handle, posts the quit packet and joins the thread,
//!   unless it is dropped on that thread (a completion ended the last reference to the
//!   provider): then the thread quits once that completion returns, and the port is
//!   closed by whoever lets go of it last.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use hashbrown::HashMap;
use ibcm_ioctl::status;

use crate::error::{
    STATUS_ACCESS_DENIED, STATUS_INTERNAL_ERROR, STATUS_OBJECT_NAME_NOT_FOUND,
    STATUS_QUOTA_EXCEEDED,
};

use super::{Backend, OnComplete};

/// ERROR_IO_PENDING: the request was queued; its packet will come.
pub const ERROR_IO_PENDING: u32 = 997;

/// Where a request's completion is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notify {
    /// A packet on the handle's completion port (an OVERLAPPED without an event).
    Port,
    /// The calling thread's event alone: `hEvent` with its low bit set, so no packet is
    /// queued (WinVerbs' blocking calls, core/winverbs/user/wv_base.cpp:56-60); the
    /// caller waits for it with [`Win32::finish`].
    Event,
}

/// The Win32 calls the backend makes, on one file handle of the control device opened
/// with `FILE_FLAG_OVERLAPPED` and bound to a private I/O completion port.
pub trait Win32: Send + Sync + 'static {
    /// One request's OVERLAPPED and buffers, at a fixed address from
    /// [`device_io_control`](Self::device_io_control) until [`reclaim`](Self::reclaim).
    type Request: Send;

    /// `DeviceIoControl` with a new OVERLAPPED that carries `key`, `input` and an output
    /// buffer of `output_len` bytes made in `output`, which comes empty with that much
    /// room. The system's backend fills it with zeroes only so that DeviceIoControl is
    /// handed initialised memory (with METHOD_BUFFERED the bytes copied back come from
    /// the system buffer, not from these); the emulated backend, whose driver writes into
    /// the request's own buffer, fills nothing (a GET_EVENT's 16 records are 7 KB, zeroed
    /// on every re-arm before). Returns the request and what the call said.
    fn device_io_control(
        &self,
        key: u64,
        code: u32,
        input: &[u8],
        output: Vec<u8>,
        output_len: usize,
        notify: Notify,
    ) -> (Self::Request, Issue);

    /// On a request issued with [`Notify::Event`] that `DeviceIoControl` did not fail:
    /// waits on the event until it completes (`HasOverlappedIoCompleted`; at once if it
    /// already did), then takes it back as [`reclaim`](Self::reclaim) does, the output
    /// holding the bytes written.
    fn finish(&self, request: Self::Request) -> (i32, Vec<u8>);

    /// Whether this thread can issue a [`Notify::Event`] request (on Windows, whether its
    /// event exists or can be made now); if not, the request goes through the port.
    fn has_thread_event(&self) -> bool {
        true
    }

    /// The address of the request's OVERLAPPED: `CancelIoEx`'s key.
    fn overlapped_address(request: &Self::Request) -> usize;

    /// `CancelIoEx(file, overlapped)`: cancels the file's pending request whose OVERLAPPED
    /// is at that address, if there is one (the pointer is only compared).
    fn cancel_io(&self, overlapped: usize);

    /// `GetQueuedCompletionStatus(port, INFINITE)`.
    fn dequeue(&self) -> Dequeued;

    /// Takes back a request the kernel is done with (its packet was dequeued, or the call
    /// failed without queueing one): `OVERLAPPED.Internal` and the output buffer.
    fn reclaim(&self, request: Self::Request) -> (i32, Vec<u8>);

    /// `CloseHandle(file)`: IRP_MJ_CLEANUP completes the handle's pending requests, whose
    /// packets are queued before it returns. Called once.
    fn close_file(&self);

    /// `PostQueuedCompletionStatus(port, 0, QUIT, NULL)`: the completion thread's last
    /// packet.
    fn post_quit(&self);

    /// Starts the completion thread.
    fn spawn(&self, run: Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("ibcm-completions".into())
            .spawn(run)
    }
}

/// What `DeviceIoControl` said about an overlapped request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issue {
    /// Its BOOL result.
    pub returned: bool,
    /// `GetLastError()` after a FALSE.
    pub last_error: u32,
    /// `OVERLAPPED.Internal` after the call: STATUS_PENDING (as DeviceIoControl sets it)
    /// unless the I/O manager wrote the IRP's status.
    pub internal: i32,
}

/// What `GetQueuedCompletionStatus` dequeued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dequeued {
    /// A request's packet: its key and the bytes written (`lpNumberOfBytes`).
    Packet {
        /// The key given to [`Win32::device_io_control`].
        key: u64,
        /// The output bytes written.
        bytes: u32,
    },
    /// The quit packet.
    Quit,
    /// The call itself failed (the port was closed): its Win32 error.
    Failed(u32),
}

/// The status of a request `DeviceIoControl` did not queue, or `None` if its packet will
/// come: TRUE, ERROR_IO_PENDING, or a FALSE with a status the I/O manager wrote that is
/// not an error (a warning's packet is queued too). A failure the I/O manager did not
/// write into the OVERLAPPED (no IRP was made, or the driver failed the IRP at once: the
/// IOSB of an asynchronous request that fails synchronously is not written) is the Win32
/// error turned back into the NTSTATUS, not the STATUS_PENDING left in `Internal`.
pub fn issue_status(issue: Issue) -> Option<i32> {
    if issue.returned || issue.last_error == ERROR_IO_PENDING {
        return None;
    }
    if issue.internal != status::PENDING {
        // NT_ERROR: severity 3.
        return ((issue.internal as u32) >> 30 == 3).then_some(issue.internal);
    }
    Some(status_from_win32(issue.last_error))
}

/// The NTSTATUS a Win32 error stands for: the inverse of `RtlNtStatusToDosError` for the
/// statuses the driver completes requests with (and those of the I/O manager before an
/// IRP exists), after Microsoft's "Mapping NT status error codes to Win32 error codes"
/// (KB 113996); any other error as an NTSTATUS of FACILITY_NTWIN32 (0xC007xxxx), which
/// keeps the Win32 code.
pub fn status_from_win32(error: u32) -> i32 {
    match error {
        0 => status::SUCCESS,
        // ERROR_INVALID_FUNCTION
        1 => status::INVALID_DEVICE_REQUEST,
        // ERROR_FILE_NOT_FOUND, ERROR_PATH_NOT_FOUND: no such device object
        2 | 3 => STATUS_OBJECT_NAME_NOT_FOUND,
        // ERROR_ACCESS_DENIED
        5 => STATUS_ACCESS_DENIED,
        // ERROR_INVALID_HANDLE
        6 => status::INVALID_HANDLE,
        // ERROR_NOT_ENOUGH_MEMORY, ERROR_NO_SYSTEM_RESOURCES
        8 | 1450 => status::INSUFFICIENT_RESOURCES,
        // ERROR_BAD_COMMAND
        22 => status::INVALID_DEVICE_STATE,
        // ERROR_BAD_LENGTH
        24 => status::INFO_LENGTH_MISMATCH,
        // ERROR_DUP_NAME
        52 => status::ADDRESS_ALREADY_EXISTS,
        // ERROR_INVALID_PARAMETER
        87 => status::INVALID_PARAMETER,
        // ERROR_SEM_TIMEOUT
        121 => status::IO_TIMEOUT,
        // ERROR_INSUFFICIENT_BUFFER
        122 => status::BUFFER_TOO_SMALL,
        // ERROR_OPERATION_ABORTED
        995 => status::CANCELLED,
        // ERROR_CONNECTION_REFUSED
        1225 => status::CONNECTION_REFUSED,
        // ERROR_REVISION_MISMATCH
        1306 => status::REVISION_MISMATCH,
        // ERROR_DEVICE_REMOVED
        1617 => status::DEVICE_REMOVED,
        // ERROR_NOT_ENOUGH_QUOTA
        1816 => STATUS_QUOTA_EXCEEDED,
        _ => (0xC007_0000 | (error & 0xFFFF)) as i32,
    }
}

/// What finishing an operation does to a caller's Win32 OVERLAPPED, by its `hEvent`: the
/// event to set (`hEvent` without its low bit; 0 for none) and whether the OVERLAPPED is
/// posted to the caller's port. As Windows does for I/O on a handle bound to a port, a
/// low bit set keeps the completion off the port (WinVerbs sets it on the event of its
/// own blocking calls, core/winverbs/user/wv_base.cpp:56-60, so that they complete on
/// the event alone, :90-99).
pub fn caller_completion(h_event: usize) -> (usize, bool) {
    (h_event & !1, h_event & 1 == 0)
}

/// One request in flight.
struct Op<R> {
    request: R,
    on_complete: OnComplete,
}

struct Ops<R> {
    pending: HashMap<u64, Op<R>>,
    /// The last key given; keys are never reused.
    last_key: u64,
    /// The file handle was closed: requests fail with STATUS_INVALID_HANDLE.
    closed: bool,
    /// The provider failed (a completion panicked, or the port failed): every request
    /// fails with this.
    failed: Option<i32>,
}

impl<R> Ops<R> {
    /// The status a new request fails with at once, if any: the provider's failure, or
    /// STATUS_INVALID_HANDLE once the handle is closed.
    fn refused(&self) -> Option<i32> {
        self.failed
            .or(self.closed.then_some(status::INVALID_HANDLE))
    }
}

struct Shared<S: Win32> {
    sys: S,
    ops: Mutex<Ops<S::Request>>,
}

impl<S: Win32> Shared<S> {
    fn lock(&self) -> MutexGuard<'_, Ops<S::Request>> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the file handle once.
    fn close(&self, ops: &mut Ops<S::Request>) {
        if !ops.closed {
            ops.closed = true;
            self.sys.close_file();
        }
    }

    /// Dequeues completions until the quit packet.
    fn run(&self) {
        crate::completion::enter_completion_thread();
        loop {
            let (key, bytes) = match self.sys.dequeue() {
                Dequeued::Packet { key, bytes } => (key, bytes),
                Dequeued::Quit => return,
                Dequeued::Failed(error) => {
                    // The port is unusable: no packet will come. Every request still in
                    // flight fails now; its OVERLAPPED is left to the kernel (never
                    // reclaimed: it may still write it).
                    let st = status_from_win32(error);
                    self.fail(st);
                    let ops: Vec<Op<S::Request>> = {
                        let mut ops = self.lock();
                        ops.pending.drain().map(|(_, op)| op).collect()
                    };
                    for op in ops {
                        let Op {
                            request,
                            on_complete,
                        } = op;
                        std::mem::forget(request);
                        let _ = catch_unwind(AssertUnwindSafe(|| {
                            on_complete.completed(st, Vec::new())
                        }));
                    }
                    return;
                }
            };
            let (op, failed) = {
                let mut ops = self.lock();
                (ops.pending.remove(&key), ops.failed)
            };
            let Some(op) = op else {
                continue;
            };
            let (st, mut output) = self.sys.reclaim(op.request);
            output.truncate(bytes as usize);
            let st = failed.unwrap_or(st);
            let hook = op.on_complete;
            if catch_unwind(AssertUnwindSafe(|| hook.completed(st, output))).is_err() {
                self.fail(STATUS_INTERNAL_ERROR);
            }
        }
    }

    /// Fails the provider: the handle closes (its requests complete through the port,
    /// with `st`), and later requests fail with `st`.
    fn fail(&self, st: i32) {
        let mut ops = self.lock();
        ops.failed.get_or_insert(st);
        self.close(&mut ops);
    }
}

/// The open device: the Win32 handles, the requests in flight and the completion thread.
pub struct Device<S: Win32> {
    shared: Arc<Shared<S>>,
    thread: Option<JoinHandle<()>>,
}

impl<S: Win32> Device<S> {
    /// The device over an open file handle bound to its port: starts the completion
    /// thread, or closes the handle and fails with STATUS_INSUFFICIENT_RESOURCES if it
    /// cannot.
    pub fn new(sys: S) -> Result<Self, i32> {
        let shared = Arc::new(Shared {
            sys,
            ops: Mutex::new(Ops {
                pending: HashMap::new(),
                last_key: 0,
                closed: false,
                failed: None,
            }),
        });
        let s = Arc::clone(&shared);
        match shared.sys.spawn(Box::new(move || s.run())) {
            Ok(thread) => Ok(Self {
                shared,
                thread: Some(thread),
            }),
            Err(_) => {
                shared.close(&mut shared.lock());
                Err(status::INSUFFICIENT_RESOURCES)
            }
        }
    }
}

impl<S: Win32> Backend for Device<S> {
    fn submit(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        mut buffer: Vec<u8>,
        on_complete: OnComplete,
    ) -> u64 {
        buffer.clear();
        buffer.reserve_exact(output_len);
        let mut ops = self.shared.lock();
        if let Some(st) = ops.refused() {
            drop(ops);
            on_complete.completed(st, buffer);
            return 0;
        }
        ops.last_key += 1;
        let key = ops.last_key;
        let (request, issue) =
            self.shared
                .sys
                .device_io_control(key, code, input, buffer, output_len, Notify::Port);
        match issue_status(issue) {
            None => {
                ops.pending.insert(
                    key,
                    Op {
                        request,
                        on_complete,
                    },
                );
                key
            }
            Some(st) => {
                // No packet will come: the request is back in our hands now.
                drop(ops);
                let (_, mut output) = self.shared.sys.reclaim(request);
                output.clear();
                on_complete.completed(st, output);
                0
            }
        }
    }

    fn call(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        mut buffer: Vec<u8>,
    ) -> Result<(i32, Vec<u8>), Vec<u8>> {
        if !self.shared.sys.has_thread_event() {
            return Err(buffer);
        }
        buffer.clear();
        buffer.reserve_exact(output_len);
        let ops = self.shared.lock();
        if let Some(st) = ops.refused() {
            drop(ops);
            return Ok((st, buffer));
        }
        // Issued under the table's lock, as `submit` does (the handle cannot be closed
        // between the check and the call), and waited for without it: a close meanwhile
        // completes the request (IRP_MJ_CLEANUP), which ends the wait.
        let (request, issue) =
            self.shared
                .sys
                .device_io_control(0, code, input, buffer, output_len, Notify::Event);
        drop(ops);
        if let Some(st) = issue_status(issue) {
            let (_, mut output) = self.shared.sys.reclaim(request);
            output.clear();
            return Ok((st, output));
        }
        let (st, output) = self.shared.sys.finish(request);
        Ok((self.shared.lock().failed.unwrap_or(st), output))
    }

    fn cancel(&self, key: u64) {
        let ops = self.shared.lock();
        if let Some(op) = ops.pending.get(&key) {
            self.shared
                .sys
                .cancel_io(S::overlapped_address(&op.request));
        }
    }

    fn close(&self) {
        self.shared.close(&mut self.shared.lock());
    }

    fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }
}

impl<S: Win32> Drop for Device<S> {
    fn drop(&mut self) {
        // Cleanup completes every pending request; their packets precede the quit packet.
        self.close();
        self.shared.sys.post_quit();
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}
