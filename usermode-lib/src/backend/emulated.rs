//! The Win32 calls of the Windows backend, emulated over the driver's dispatch code on the
//! host platform (feature `in-process`): `backend::device` runs here exactly as on
//! Windows (its table, its completion thread, its close and drop), so its hangs and
//! races are tested off Windows.
//!
//! What is emulated, after the I/O manager's rules for an overlapped handle bound to a
//! completion port (Microsoft's "Synchronous and Asynchronous I/O" and
//! `GetQueuedCompletionStatus` documentation):
//! - `DeviceIoControl` sets `OVERLAPPED.Internal` to STATUS_PENDING and dispatches the
//!   request. Completed before the dispatch returns: with success the call returns TRUE
//!   and a packet is queued; with an error it returns FALSE with the Win32 error, no
//!   packet is queued and `Internal` is not written. Still pending: FALSE with
//!   ERROR_IO_PENDING, and the packet comes when the driver completes it.
//! - A request whose OVERLAPPED names an event with its low bit set (`Notify::Event`)
//!   queues no packet, however it completes; `finish` waits for its completion.
//! - With [`EmulatedFaults::pend_all`], every request that reaches the driver pends, as
//!   under KMDF, whose dispatch returns STATUS_PENDING for every request it queues
//!   (fxioqueue.cpp): its result comes through the port or the event even when the
//!   driver completed it at once.
//! - On a closed handle it fails with ERROR_INVALID_HANDLE before any request exists.
//! - OVERLAPPED addresses are reused as a heap reuses a freed block (last freed, first
//!   given), and `CancelIoEx` cancels whatever pending request has the address it is
//!   given, as Windows does.
//! - The port is a FIFO that `GetQueuedCompletionStatus(INFINITE)` waits on forever.
//!
//! [`EmulatedFaults`] makes the failures a test needs: the completion thread cannot be
//! started, the driver is transiently short of memory for GET_EVENTs, or the port is
//! closed under the completion thread.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use hashbrown::HashMap;
use ibcm_endpoint::FileId;
use ibcm_host::Node;
use ibcm_ioctl::{code, status};

use super::CompletionHook;
use super::device::{self, Dequeued, ERROR_IO_PENDING, Issue, Notify, Win32};

/// ERROR_INVALID_HANDLE.
const ERROR_INVALID_HANDLE: u32 = 6;
/// The first emulated OVERLAPPED address, and the size of a block.
const FIRST_ADDRESS: usize = 0x10_0000;
const BLOCK_SIZE: usize = 0x100;

/// ERROR_ABANDONED_WAIT_0: the port was closed under a waiting GetQueuedCompletionStatus.
const ERROR_ABANDONED_WAIT_0: u32 = 735;

/// Failures to make.
#[derive(Default)]
pub struct EmulatedFaults {
    /// The completion thread cannot be started.
    pub fail_spawn: AtomicBool,
    /// This many GET_EVENTs fail with STATUS_INSUFFICIENT_RESOURCES (the driver is
    /// transiently short of memory).
    pub get_event_failures: AtomicU32,
    /// Every request that reaches the driver pends (KMDF's rule, above).
    pub pend_all: AtomicBool,
    port: Arc<Port>,
}

impl EmulatedFaults {
    /// Packets queued on the port so far (the quit packet included).
    pub fn packets_posted(&self) -> u64 {
        self.port.posted.load(Ordering::Acquire)
    }

    /// The port is closed under the completion thread: GetQueuedCompletionStatus fails
    /// with ERROR_ABANDONED_WAIT_0 from now on.
    pub fn abandon_port(&self) {
        self.port.abandoned.store(true, Ordering::Release);
        let _guard = lock(&self.port.packets);
        self.port.ready.notify_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The completion port.
#[derive(Default)]
struct Port {
    packets: Mutex<VecDeque<Dequeued>>,
    ready: Condvar,
    abandoned: AtomicBool,
    posted: AtomicU64,
}

impl Port {
    fn post(&self, packet: Dequeued) {
        self.posted.fetch_add(1, Ordering::AcqRel);
        lock(&self.packets).push_back(packet);
        self.ready.notify_one();
    }
}

/// Where a request is.
enum Phase {
    /// In `DeviceIoControl`.
    Dispatching,
    /// Pending: its completion queues its packet.
    Queued,
}

struct PendingState {
    phase: Phase,
    /// How the driver completed it (or the output buffer, if it never reached the
    /// driver).
    done: Option<(i32, Vec<u8>)>,
}

/// The emulated OVERLAPPED of one request: the driver's completion hook.
struct Pending {
    key: u64,
    port: Arc<Port>,
    notify: Notify,
    state: Mutex<PendingState>,
    /// Set when it completes (the event of a `Notify::Event` request).
    event: Condvar,
}

impl CompletionHook for Pending {
    fn completed(self: Arc<Self>, st: i32, output: Vec<u8>) {
        let mut s = lock(&self.state);
        let bytes = output.len() as u32;
        s.done = Some((st, output));
        self.event.notify_all();
        if matches!(s.phase, Phase::Queued) && self.notify == Notify::Port {
            drop(s);
            self.port.post(Dequeued::Packet {
                key: self.key,
                bytes,
            });
        }
    }
}

/// One emulated request in flight.
pub struct Request {
    address: usize,
    pending: Arc<Pending>,
}

/// OVERLAPPED addresses: the free ones (last freed first) and the requests at the
/// others.
#[derive(Default)]
struct Addresses {
    free: Vec<usize>,
    next: usize,
    /// The driver's request key at each address in use.
    live: HashMap<usize, u64>,
}

/// An emulated file handle of a host node's device, bound to an emulated port.
pub struct Emulated {
    node: Arc<Node>,
    file: FileId,
    closed: AtomicBool,
    port: Arc<Port>,
    addresses: Mutex<Addresses>,
    faults: Arc<EmulatedFaults>,
}

impl Emulated {
    /// Opens `node`'s device (CreateFileW, CreateIoCompletionPort).
    pub fn open(node: Arc<Node>) -> Self {
        let file = node.open();
        let port = Arc::<Port>::default();
        Self {
            node,
            file,
            closed: AtomicBool::new(false),
            port: Arc::clone(&port),
            addresses: Mutex::new(Addresses {
                next: FIRST_ADDRESS,
                ..Addresses::default()
            }),
            faults: Arc::new(EmulatedFaults {
                port,
                ..EmulatedFaults::default()
            }),
        }
    }

    /// The failures this handle makes (set them before handing it to the device).
    pub fn faults(&self) -> Arc<EmulatedFaults> {
        Arc::clone(&self.faults)
    }

    fn take_address(&self) -> usize {
        let mut a = lock(&self.addresses);
        a.free.pop().unwrap_or_else(|| {
            let at = a.next;
            a.next += BLOCK_SIZE;
            at
        })
    }
}

/// The Win32 error `RtlNtStatusToDosError` gives for a status the driver completes
/// with: the one `device::status_from_win32` turns back into it.
fn win32_from_status(st: i32) -> u32 {
    const ERRORS: [u32; 17] = [
        1, 2, 5, 6, 1450, 8, 22, 24, 52, 87, 121, 122, 995, 1225, 1306, 1617, 1816,
    ];
    ERRORS
        .into_iter()
        .find(|&e| device::status_from_win32(e) == st)
        // ERROR_MR_MID_NOT_FOUND, as RtlNtStatusToDosError for a status it does not know.
        .unwrap_or(317)
}

impl Win32 for Emulated {
    type Request = Request;

    fn device_io_control(
        &self,
        key: u64,
        code: u32,
        input: &[u8],
        output: Vec<u8>,
        output_len: usize,
        notify: Notify,
    ) -> (Request, Issue) {
        let pending = Arc::new(Pending {
            key,
            port: Arc::clone(&self.port),
            notify,
            state: Mutex::new(PendingState {
                phase: Phase::Dispatching,
                done: None,
            }),
            event: Condvar::new(),
        });
        let address = self.take_address();
        let request = Request {
            address,
            pending: Arc::clone(&pending),
        };
        let failed = |last_error| Issue {
            returned: false,
            last_error,
            internal: status::PENDING,
        };
        if self.closed.load(Ordering::Acquire) {
            lock(&pending.state).done = Some((status::PENDING, output));
            return (request, failed(ERROR_INVALID_HANDLE));
        }
        let short = code == code::GET_EVENT
            && self
                .faults
                .get_event_failures
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
        if short {
            lock(&pending.state).done = Some((status::PENDING, output));
            return (
                request,
                failed(win32_from_status(status::INSUFFICIENT_RESOURCES)),
            );
        }
        // The driver writes the output into the request's own buffer (HostRequest), as
        // METHOD_BUFFERED's system buffer: nothing is zeroed here.
        let r = self.node.platform.request_with_hook(
            ibcm_host::file_key(self.file),
            output,
            output_len,
            Arc::clone(&pending) as Arc<dyn CompletionHook>,
        );
        lock(&self.addresses).live.insert(address, r.key_value());
        self.node.dispatch(self.file, r, code, input);
        let mut s = lock(&pending.state);
        let pend_all = self.faults.pend_all.load(Ordering::Acquire);
        let issue = match &s.done {
            None => {
                s.phase = Phase::Queued;
                failed(ERROR_IO_PENDING)
            }
            // NT_ERROR: failed at once; no packet, the OVERLAPPED not written (KMDF pends
            // it first: then it is told as any pending request).
            Some((st, _)) if !pend_all && (*st as u32) >> 30 == 3 => failed(win32_from_status(*st)),
            Some((st, output)) => {
                if notify == Notify::Port {
                    self.port.post(Dequeued::Packet {
                        key,
                        bytes: output.len() as u32,
                    });
                }
                if pend_all {
                    s.phase = Phase::Queued;
                    failed(ERROR_IO_PENDING)
                } else {
                    Issue {
                        returned: true,
                        last_error: 0,
                        internal: *st,
                    }
                }
            }
        };
        drop(s);
        (request, issue)
    }

    fn overlapped_address(request: &Request) -> usize {
        request.address
    }

    fn cancel_io(&self, overlapped: usize) {
        let key = lock(&self.addresses).live.get(&overlapped).copied();
        if let Some(key) = key
            && !self.closed.load(Ordering::Acquire)
        {
            self.node.cancel(self.file, key);
        }
    }

    fn dequeue(&self) -> Dequeued {
        let mut q = lock(&self.port.packets);
        loop {
            if self.port.abandoned.load(Ordering::Acquire) {
                return Dequeued::Failed(ERROR_ABANDONED_WAIT_0);
            }
            if let Some(p) = q.pop_front() {
                return p;
            }
            q = self
                .port
                .ready
                .wait(q)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn finish(&self, request: Request) -> (i32, Vec<u8>) {
        {
            let p = &request.pending;
            let mut s = lock(&p.state);
            while s.done.is_none() {
                s = p.event.wait(s).unwrap_or_else(PoisonError::into_inner);
            }
        }
        self.reclaim(request)
    }

    fn reclaim(&self, request: Request) -> (i32, Vec<u8>) {
        {
            let mut a = lock(&self.addresses);
            a.live.remove(&request.address);
            a.free.push(request.address);
        }
        lock(&request.pending.state)
            .done
            .take()
            .unwrap_or((status::PENDING, Vec::new()))
    }

    fn close_file(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.node.close(self.file);
        }
    }

    fn post_quit(&self) {
        self.port.post(Dequeued::Quit);
    }

    fn spawn(&self, run: Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>> {
        if self.faults.fail_spawn.load(Ordering::Acquire) {
            return Err(std::io::Error::other("emulated CreateThread failure"));
        }
        std::thread::Builder::new()
            .name("ibcm-completions".into())
            .spawn(run)
    }
}

/// A provider over the emulated Windows backend on `node`.
pub fn provider(node: Arc<Node>) -> crate::Result<crate::Provider> {
    provider_with(Emulated::open(node))
}

/// A provider over an emulated handle (whose [`faults`](Emulated::faults) a test set).
pub fn provider_with(sys: Emulated) -> crate::Result<crate::Provider> {
    let device = device::Device::new(sys).map_err(|st| crate::Error::new("open", st))?;
    crate::Provider::with_backend(Arc::new(device))
}
