//! Completion of asynchronous requests, three ways: wait for it (blocking), await it (a
//! Rust future), or have it posted to a [`CompletionPort`] with its [`Overlapped`] (the
//! I/O completion port model of WinVerbs and NetworkDirect providers).
//!
//! A multi-step operation (connect: CONNECT, then GET_EVENT until the REP) is an async
//! block. Run with [`block_on`] it blocks; awaited it is a future; started with
//! [`spawn`] it is driven by the completions of its own requests, with no thread of its
//! own, and its result lands on an [`Overlapped`].

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// How one request ended: NTSTATUS and output bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// NTSTATUS.
    pub status: i32,
    /// The output bytes written.
    pub output: Vec<u8>,
}

impl Done {
    /// The output on success; otherwise an [`Error`](crate::Error) naming `operation`.
    pub(crate) fn into_result(self, operation: &'static str) -> crate::Result<Vec<u8>> {
        if self.status == ibcm_ioctl::status::SUCCESS {
            Ok(self.output)
        } else {
            Err(crate::Error::new(operation, self.status))
        }
    }
}

#[derive(Debug, Default)]
struct SlotState {
    done: Option<Done>,
    waker: Option<Waker>,
}

/// The completion slot of one request (the library's side of an OVERLAPPED).
#[derive(Debug, Default)]
pub struct Slot {
    state: Mutex<SlotState>,
}

/// Completed slots a thread keeps for its next requests, at most.
const SPARE_SLOTS: usize = 16;

thread_local! {
    /// Slots whose request completed and whose result was taken: the next request on
    /// this thread reuses one, so issuing an IOCTL allocates nothing for its completion.
    static SPARES: std::cell::RefCell<Vec<Arc<Slot>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Slot {
    /// A pending slot: a spare of this thread's, or a new one.
    pub fn new() -> Arc<Self> {
        SPARES
            .try_with(|s| s.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Keeps `slot` for a later request if nobody else holds it (the backend dropped its
    /// reference when it completed the request) and its result was taken.
    fn recycle(slot: Arc<Self>) {
        if Arc::strong_count(&slot) != 1 || Arc::weak_count(&slot) != 0 {
            return;
        }
        {
            let mut s = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
            if s.done.is_some() {
                return;
            }
            s.waker = None;
        }
        let _ = SPARES.try_with(|s| {
            let mut spares = s.borrow_mut();
            if spares.len() < SPARE_SLOTS {
                spares.push(slot);
            }
        });
    }

    /// Called by the backend, exactly once.
    pub fn complete(&self, done: Done) {
        let waker = {
            let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            s.done = Some(done);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Whether the request completed (its result may not have been taken yet).
    pub fn is_done(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .done
            .is_some()
    }

    /// Ready once, with the completion (a slot has one awaiter, polled until ready).
    fn poll(&self, cx: &Context<'_>) -> Poll<Done> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match s.done.take() {
            Some(d) => Poll::Ready(d),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl crate::backend::CompletionHook for Slot {
    fn completed(self: Arc<Self>, status: i32, output: Vec<u8>) {
        self.complete(Done { status, output });
    }
}

/// An IOCTL in flight (see [`Provider::ioctl`](crate::provider::Provider)): issued when
/// made, as `DeviceIoControl` is, so it borrows nothing of its input and an operation
/// awaiting it holds only this.
#[derive(Debug)]
pub(crate) struct Ioctl {
    pub slot: SlotFuture,
    pub operation: &'static str,
    /// The backend's key, for a cancel.
    pub key: u64,
}

impl Ioctl {
    /// Whether it has not completed yet.
    pub fn pending(&self) -> bool {
        self.slot.0.as_ref().is_some_and(|s| !s.is_done())
    }
}

impl Future for Ioctl {
    type Output = crate::Result<Vec<u8>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let done = std::task::ready!(Pin::new(&mut this.slot).poll(cx));
        Poll::Ready(done.into_result(this.operation))
    }
}

/// Output buffers a thread keeps for its next requests, at most.
const SPARE_BUFFERS: usize = 16;
/// Larger buffers are not kept.
const MAX_SPARE_BUFFER: usize = 64 * 1024;

thread_local! {
    /// Output buffers whose bytes were read: the next request on this thread that has
    /// output reuses one rather than allocating.
    static BUFFERS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An output buffer with room for `len` bytes: a spare of this thread's, or a new one.
/// A spare much larger than asked for is left alone: a pending request (a connection's
/// GET_EVENT) holds its buffer for as long as it waits.
pub(crate) fn output_buffer(len: usize) -> Vec<u8> {
    if len == 0 {
        return Vec::new();
    }
    BUFFERS
        .try_with(|b| {
            let mut b = b.borrow_mut();
            let i = b
                .iter()
                .position(|v| (len..=len.saturating_mul(2)).contains(&v.capacity()))?;
            Some(b.swap_remove(i))
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| Vec::with_capacity(len))
}

/// Keeps an output buffer whose bytes were read for a later request.
pub(crate) fn recycle_buffer(mut buffer: Vec<u8>) {
    if buffer.capacity() == 0 || buffer.capacity() > MAX_SPARE_BUFFER {
        return;
    }
    buffer.clear();
    let _ = BUFFERS.try_with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < SPARE_BUFFERS {
            b.push(buffer);
        }
    });
}

/// A future over a slot; the slot goes back to its thread's spares when done.
#[derive(Debug)]
pub(crate) struct SlotFuture(pub Option<Arc<Slot>>);

impl Future for SlotFuture {
    type Output = Done;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Done> {
        let this = self.get_mut();
        let Some(slot) = this.0.as_ref() else {
            return Poll::Pending;
        };
        let done = std::task::ready!(slot.poll(cx));
        if let Some(slot) = this.0.take() {
            Slot::recycle(slot);
        }
        Poll::Ready(done)
    }
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    /// The waker of this thread's blocking waits (made once, not per wait).
    static THREAD_WAKER: Waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
}

thread_local! {
    /// This thread dequeues a device's completions (`backend::device`): what it would
    /// block for, only it could complete.
    static COMPLETION_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as a device's completion thread.
pub(crate) fn enter_completion_thread() {
    COMPLETION_THREAD.with(|c| c.set(true));
}

/// Whether this thread is a device's completion thread (a spawned operation, or a hook,
/// is running on it).
fn on_completion_thread() -> bool {
    COMPLETION_THREAD
        .try_with(std::cell::Cell::get)
        .unwrap_or(false)
}

/// The blocking form of an operation: starts it (`start` issues its first request) and
/// waits for it on this thread; or, on a device's completion thread, where it would wait
/// for the thread that is waiting, fails it with STATUS_POSSIBLE_DEADLOCK before anything
/// is issued.
pub(crate) fn blocking<T, F: Future<Output = crate::Result<T>>>(
    operation: &'static str,
    start: impl FnOnce() -> F,
) -> crate::Result<T> {
    if on_completion_thread() {
        return Err(crate::Error::new(
            operation,
            crate::error::STATUS_POSSIBLE_DEADLOCK,
        ));
    }
    block_on(start())
}

/// Runs a future to completion on this thread (the blocking form of every operation).
///
/// # Panics
///
/// On the thread that completes a device's requests (inside an operation started with
/// [`spawn`]): it would wait for itself. Await the future there instead.
pub fn block_on<F: Future>(future: F) -> F::Output {
    assert!(
        !on_completion_thread(),
        "ibcm::block_on on the provider's completion thread would deadlock: await the future"
    );
    let mut future = std::pin::pin!(future);
    let waker = THREAD_WAKER
        .try_with(Waker::clone)
        .unwrap_or_else(|_| Waker::from(Arc::new(ThreadWaker(std::thread::current()))));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// A completion packet: the user's completion key and the finished overlapped operation.
#[derive(Debug, Clone)]
pub struct CompletionPacket {
    /// The key given when the operation was started.
    pub key: usize,
    /// The operation's overlapped.
    pub overlapped: Overlapped,
}

#[derive(Debug, Default)]
struct PortState {
    packets: VecDeque<CompletionPacket>,
    /// Threads blocked in `get`: only they need a (system-call) wake-up.
    waiting: usize,
}

/// An I/O completion port: finished overlapped operations are queued here, and any thread
/// may dequeue them ([`CompletionPort::get`], as `GetQueuedCompletionStatus`).
#[derive(Debug, Default, Clone)]
pub struct CompletionPort(Arc<(Mutex<PortState>, Condvar)>);

impl CompletionPort {
    /// A new, empty port.
    pub fn new() -> Self {
        Self::default()
    }

    fn post(&self, packet: CompletionPacket) {
        let mut q = self.0.0.lock().unwrap_or_else(PoisonError::into_inner);
        q.packets.push_back(packet);
        let waiting = q.waiting > 0;
        drop(q);
        if waiting {
            self.0.1.notify_one();
        }
    }

    /// Dequeues a packet, waiting up to `timeout` (None: forever).
    pub fn get(&self, timeout: Option<Duration>) -> Option<CompletionPacket> {
        let mut q = self.0.0.lock().unwrap_or_else(PoisonError::into_inner);
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(p) = q.packets.pop_front() {
                return Some(p);
            }
            let left = match deadline {
                None => None,
                Some(d) => Some(d.checked_duration_since(std::time::Instant::now())?),
            };
            q.waiting += 1;
            q = match left {
                None => self.0.1.wait(q).unwrap_or_else(PoisonError::into_inner),
                Some(left) => {
                    self.0
                        .1
                        .wait_timeout(q, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            q.waiting -= 1;
        }
    }
}

type AnyResult = Box<dyn std::any::Any + Send>;

/// Told once an operation's result is in.
type Notify = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct OverlappedState {
    result: Option<AnyResult>,
    port: Option<(CompletionPort, usize)>,
    /// The caller's own completion (on Windows, its IOCP and OVERLAPPED).
    notify: Option<Notify>,
    /// Threads blocked in `wait`.
    waiting: usize,
}

/// The state of one overlapped operation (an OVERLAPPED): started with [`spawn`],
/// completed when its operation finishes, then posted to its completion port if it has
/// one. Take the result with [`Overlapped::result`].
#[derive(Clone, Default)]
pub struct Overlapped(Arc<(Mutex<OverlappedState>, Condvar)>);

impl std::fmt::Debug for Overlapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overlapped")
            .field("done", &self.is_done())
            .finish()
    }
}

impl Overlapped {
    /// An overlapped whose completion only signals itself ([`Overlapped::wait`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// An overlapped whose completion is also queued on `port` with `key`.
    pub fn with_port(port: &CompletionPort, key: usize) -> Self {
        let o = Self::default();
        o.0.0.lock().unwrap_or_else(PoisonError::into_inner).port = Some((port.clone(), key));
        o
    }

    /// An overlapped whose completion also calls `notify`, once, on the thread that
    /// finished the operation, after its result is in (`backend::windows::overlapped_on`
    /// posts the caller's own OVERLAPPED to the caller's own port this way). `notify`
    /// must not block: it may run on the provider's completion thread.
    pub fn with_notify(notify: impl FnOnce() + Send + 'static) -> Self {
        let o = Self::default();
        o.0.0.lock().unwrap_or_else(PoisonError::into_inner).notify = Some(Box::new(notify));
        o
    }

    /// Whether the operation has finished (`HasOverlappedIoCompleted`).
    pub fn is_done(&self) -> bool {
        self.0
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .result
            .is_some()
    }

    /// Blocks until the operation has finished.
    pub fn wait(&self) {
        let mut s = self.0.0.lock().unwrap_or_else(PoisonError::into_inner);
        while s.result.is_none() {
            s.waiting += 1;
            s = self.0.1.wait(s).unwrap_or_else(PoisonError::into_inner);
            s.waiting -= 1;
        }
    }

    /// The operation's result (`GetOverlappedResult`): `None` while it runs, or if the
    /// type asked for is not the operation's.
    pub fn result<T: 'static>(&self) -> Option<T> {
        let mut s = self.0.0.lock().unwrap_or_else(PoisonError::into_inner);
        let any = s.result.take()?;
        match any.downcast::<T>() {
            Ok(v) => Some(*v),
            Err(other) => {
                s.result = Some(other);
                None
            }
        }
    }

    fn finish(&self, value: AnyResult) {
        let (port, notify, waiting) = {
            let mut s = self.0.0.lock().unwrap_or_else(PoisonError::into_inner);
            s.result = Some(value);
            (s.port.take(), s.notify.take(), s.waiting > 0)
        };
        if waiting {
            self.0.1.notify_all();
        }
        if let Some(notify) = notify {
            notify();
        }
        if let Some((port, key)) = port {
            port.post(CompletionPacket {
                key,
                overlapped: self.clone(),
            });
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The result an [`Overlapped`] holds when its operation panicked
/// (`overlapped.result::<ibcm::Panicked>()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Panicked;

/// A task driven by the wakes of the requests it awaits.
///
/// A wake may come while the task is being polled: from another thread, or from this one
/// when a request the poll just issued completes at once (the in-process backend completes
/// a GET_EVENT with queued events before `submit` returns). Such a wake only marks the
/// task; the thread polling it polls again before letting go, so a task is never polled
/// by two threads at once and never re-entered.
///
/// Generic over the operation's output, boxed as [`AnyResult`] only when it is ready: an
/// async block wrapping the future to box its output would hold the future twice (the
/// value it captured and the one it awaits, rust-lang/rust#62958), doubling what every
/// operation in flight costs (a disconnect: 1 456 bytes, 5 848 once cmtime's task block
/// and such a wrapper had each doubled it).
struct Task<T> {
    state: AtomicU8,
    future: Mutex<Option<BoxFuture<T>>>,
    overlapped: Overlapped,
}

/// Nobody is polling the task.
const IDLE: u8 = 0;
/// A thread is polling it.
const POLLING: u8 = 1;
/// A thread is polling it and it was woken meanwhile: poll again.
const NOTIFIED: u8 = 2;
/// It finished.
const DONE: u8 = 3;

impl<T> Task<T> {
    /// Claims the right to poll; false if another poll is under way (which then polls
    /// again) or the task is done.
    fn claim(&self) -> bool {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            let (next, claimed) = match s {
                IDLE => (POLLING, true),
                POLLING => (NOTIFIED, false),
                _ => return false,
            };
            match self
                .state
                .compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return claimed,
                Err(now) => s = now,
            }
        }
    }
}

impl<T: Send + 'static> Wake for Task<T> {
    fn wake(self: Arc<Self>) {
        if !self.claim() {
            return;
        }
        let waker = Waker::from(Arc::clone(&self));
        let mut cx = Context::from_waker(&waker);
        loop {
            let mut slot = self.future.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(future) = slot.as_mut() else {
                self.state.store(DONE, Ordering::Release);
                return;
            };
            let polled =
                std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
            let ready = match polled {
                Ok(Poll::Ready(value)) => Some(value),
                Ok(Poll::Pending) => None,
                Err(panic) => {
                    // The operation is over: its overlapped is done, with no result of the
                    // operation's type; the panic goes on to whoever completed the request
                    // (the Windows backend then fails the provider).
                    *slot = None;
                    drop(slot);
                    self.state.store(DONE, Ordering::Release);
                    self.overlapped.finish(Box::new(Panicked));
                    std::panic::resume_unwind(panic);
                }
            };
            if let Some(value) = ready {
                *slot = None;
                drop(slot);
                self.state.store(DONE, Ordering::Release);
                self.overlapped.finish(Box::new(value));
                return;
            }
            drop(slot);
            // Let go unless a wake came during the poll; then poll again.
            if self
                .state
                .compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
            self.state.store(POLLING, Ordering::Release);
        }
    }
}

/// Starts `future` as an overlapped operation: it runs until it first waits, then on the
/// thread that completes each request it awaits; its result lands on `overlapped`.
pub fn spawn<T: Send + 'static>(
    future: impl Future<Output = T> + Send + 'static,
    overlapped: &Overlapped,
) {
    let task = Arc::new(Task {
        state: AtomicU8::new(IDLE),
        future: Mutex::new(Some(Box::pin(future))),
        overlapped: overlapped.clone(),
    });
    task.wake();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spawned operation costs its future once: the task boxes the future itself. An
    /// async block wrapping it to box its output held it twice (rust-lang/rust#62958).
    #[test]
    fn a_spawned_operation_costs_its_future_once() {
        let payload = [7u8; 4096];
        let future = async move {
            std::future::pending::<()>().await;
            payload.len()
        };
        let size = std::mem::size_of_val(&future);
        let o = Overlapped::new();
        // The future never completes and keeps no waker: the task is freed as `spawn`
        // returns, so the most held at once is what it took.
        let info = allocation_counter::measure(|| spawn(future, &o));
        let most = info.bytes_max as usize;
        assert!(
            most >= size,
            "{most} bytes for a future of {size}: not counted"
        );
        assert!(most < size + 512, "{most} bytes for a future of {size}");
    }
}
