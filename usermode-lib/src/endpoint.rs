//! The shared core of listeners and connection endpoints: the handle, the IOCTL helpers,
//! and the event pump that keeps one GET_EVENT outstanding while anyone waits.

use std::future::Future;
use std::mem::offset_of;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use ibcm_ioctl::{CreateIn, CreateOut, EventRecord, HandleIn, code, status};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::backend::CompletionHook;
use crate::completion::{Ioctl, block_on, output_buffer, recycle_buffer};
use crate::error::{Error, Result};
use crate::provider::Provider;

/// Records one GET_EVENT of a connection endpoint asks for. A connection's events come
/// one at a time (REP, then DREQ or DREP, then timewait exit), and its GET_EVENT holds
/// its output buffer (nonpaged system buffer on Windows) for as long as it waits, which
/// for an established connection is its whole life: room for one record.
const EVENTS_PER_REQUEST: usize = 1;
/// Records one GET_EVENT of a listener asks for: REQs come in bursts.
pub(crate) const LISTENER_EVENTS_PER_REQUEST: usize = 16;

#[derive(Default)]
struct Events {
    /// Queued event records, back to back as GET_EVENT wrote them: the first batch to
    /// arrive at an empty queue becomes the queue (no copy, no allocation), and an idle
    /// connection keeps no buffer at all.
    queue: Vec<u8>,
    wakers: Wakers,
    /// The outstanding GET_EVENT: (ticket, backend key; 0 until `submit` returned).
    outstanding: Option<(u64, u64)>,
    tickets: u64,
    /// Bumped by `cancel`: waiters started before it fail with STATUS_CANCELLED.
    epoch: u64,
    /// A terminal failure of GET_EVENT (device removed, endpoint gone).
    failed: Option<i32>,
    get_event_calls: u64,
    records: u64,
    /// Records per GET_EVENT (0: [`EVENTS_PER_REQUEST`]).
    batch: usize,
    /// The GET_EVENT (ticket) that [`Endpoint::cancel`] cancelled: its STATUS_CANCELLED is
    /// ours. Any other comes from the driver (endpoint destroyed, handle closed) and ends
    /// every wait.
    cancelled: Option<u64>,
}

impl Events {
    /// Takes the first queued record whose event type `wanted` accepts (read in place:
    /// only the record taken is copied out).
    fn take(&mut self, wanted: fn(u32) -> bool) -> Option<EventRecord> {
        let size = EventRecord::SIZE as usize;
        let at = offset_of!(EventRecord, event_type);
        let i = self.queue.chunks_exact(size).position(|c| {
            c.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .is_some_and(|b| wanted(u32::from_le_bytes(b)))
        })?;
        let record =
            EventRecord::read_from_bytes(self.queue.get(i * size..(i + 1) * size)?).ok()?;
        if self.queue.len() == size {
            // Connections mostly sit idle between events: keep no buffer (the thread
            // keeps it for its next request).
            recycle_buffer(std::mem::take(&mut self.queue));
        } else {
            self.queue.drain(i * size..(i + 1) * size);
        }
        Some(record)
    }
}

/// An endpoint's event queue, and the completion hook of its outstanding GET_EVENT: it
/// holds nothing of the endpoint, so a pending GET_EVENT does not keep a dropped
/// endpoint alive (dropping destroys it, and the driver cancels the GET_EVENT).
#[derive(Default)]
struct EventQueue(Mutex<Events>);

impl EventQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Events> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl CompletionHook for EventQueue {
    fn completed(self: Arc<Self>, status: i32, mut output: Vec<u8>) {
        let wakers = {
            let mut ev = self.lock();
            // One GET_EVENT is outstanding at a time: this is its completion.
            let ticket = ev.outstanding.take().map(|(t, _)| t);
            let ours = ticket.is_some() && ev.cancelled.take() == ticket;
            if status == status::SUCCESS {
                let size = EventRecord::SIZE as usize;
                output.truncate(output.len() - output.len() % size);
                ev.records += (output.len() / size) as u64;
                if ev.queue.is_empty() {
                    ev.queue = output;
                } else {
                    ev.queue.extend_from_slice(&output);
                }
            } else if status != status::CANCELLED || !ours {
                ev.failed = Some(status);
            }
            ev.wakers.take()
        };
        for w in wakers {
            w.wake();
        }
    }
}

pub(crate) struct Inner {
    pub provider: Provider,
    pub handle: u64,
    /// The backend key of a CONNECT or SEND_REP waiting for its answer, for
    /// [`Endpoint::cancel`].
    answer: Mutex<Option<u64>>,
    /// Made at the first wait for an event: connect and accept get their answers
    /// without one, so a connection that is only set up never needs it.
    events: std::sync::OnceLock<Arc<EventQueue>>,
}

/// An endpoint handle and its event queue; destroyed when dropped.
#[derive(Clone)]
pub(crate) struct Endpoint(pub Arc<Inner>);

impl Endpoint {
    /// CREATE: a new endpoint on `provider`'s handle.
    pub fn create(provider: &Provider, operation: &'static str) -> Result<Self> {
        let c = CreateIn {
            size: CreateIn::SIZE,
            reserved: 0,
        };
        let out: CreateOut = block_on(provider.ioctl_out(operation, code::CREATE, c.as_bytes()))?;
        Ok(Self::new(provider.clone(), out.handle))
    }

    pub fn new(provider: Provider, handle: u64) -> Self {
        Self(Arc::new(Inner {
            provider,
            handle,
            answer: Mutex::new(None),
            events: std::sync::OnceLock::new(),
        }))
    }

    pub fn handle_in(&self) -> HandleIn {
        HandleIn {
            size: HandleIn::SIZE,
            reserved: 0,
            handle: self.0.handle,
        }
    }

    /// Issues one IOCTL; awaiting it gives its output.
    pub fn ioctl(
        &self,
        operation: &'static str,
        code: u32,
        input: &[u8],
        output_len: usize,
    ) -> Ioctl {
        self.0.provider.ioctl(operation, code, input, output_len)
    }

    /// Issues an IOCTL whose output is one `T` record; awaiting it gives the record.
    pub fn ioctl_out<T: FromBytes + IntoBytes + Immutable>(
        &self,
        operation: &'static str,
        code: u32,
        input: &[u8],
    ) -> impl Future<Output = Result<T>> + Send + 'static {
        self.0.provider.ioctl_out(operation, code, input)
    }

    /// Issues a CONNECT or SEND_REP with an output buffer, which completes when the peer
    /// answers (see `code::CONNECT`); awaiting it gives the answer. [`cancel`](Self::cancel)
    /// cancels it.
    pub fn ioctl_answer(
        &self,
        operation: &'static str,
        code: u32,
        input: &[u8],
        output_len: usize,
    ) -> impl Future<Output = Result<Vec<u8>>> + Send + 'static + use<> {
        let ioctl = self.ioctl(operation, code, input, output_len);
        if ioctl.pending() {
            *self.answer() = Some(ioctl.key);
        }
        let me = self.clone();
        async move {
            let answer = ioctl.await;
            *me.answer() = None;
            answer
        }
    }

    /// Waits for the first queued event `wanted` accepts (others stay queued, in order).
    pub fn wait_event(&self, operation: &'static str, wanted: fn(u32) -> bool) -> EventWait {
        let epoch = self.events().epoch;
        EventWait {
            endpoint: self.clone(),
            operation,
            wanted,
            epoch,
        }
    }

    fn answer(&self) -> std::sync::MutexGuard<'_, Option<u64>> {
        self.0.answer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The event queue, made at first use.
    fn queue(&self) -> &Arc<EventQueue> {
        self.0.events.get_or_init(Arc::default)
    }

    fn events(&self) -> std::sync::MutexGuard<'_, Events> {
        self.queue().lock()
    }

    /// Keeps one GET_EVENT outstanding. Called with the event lock released: the
    /// request may complete before `submit` returns.
    fn pump(&self) {
        let (ticket, batch) = {
            let mut ev = self.events();
            if ev.outstanding.is_some() || ev.failed.is_some() {
                return;
            }
            ev.tickets += 1;
            ev.get_event_calls += 1;
            ev.outstanding = Some((ev.tickets, 0));
            let batch = if ev.batch == 0 {
                EVENTS_PER_REQUEST
            } else {
                ev.batch
            };
            (ev.tickets, batch)
        };
        let len = batch * EventRecord::SIZE as usize;
        let key = self.0.provider.backend().submit(
            code::GET_EVENT,
            self.handle_in().as_bytes(),
            len,
            output_buffer(len),
            Arc::clone(self.queue()) as Arc<dyn CompletionHook>,
        );
        let mut ev = self.events();
        if let Some((t, k)) = ev.outstanding.as_mut()
            && *t == ticket
        {
            *k = key;
        }
    }

    /// Fails every wait in progress with STATUS_CANCELLED and cancels the GET_EVENT, and a
    /// CONNECT or SEND_REP waiting for its answer.
    pub fn cancel(&self) {
        let answer = *self.answer();
        if let Some(key) = answer {
            self.0.provider.backend().cancel(key);
        }
        // No event queue yet: nobody waits for an event.
        let Some(queue) = self.0.events.get() else {
            return;
        };
        let (key, wakers) = {
            let mut ev = queue.lock();
            ev.epoch += 1;
            if let Some((ticket, key)) = ev.outstanding
                && key != 0
            {
                ev.cancelled = Some(ticket);
            }
            (ev.outstanding, ev.wakers.take())
        };
        if let Some((_, key)) = key.filter(|(_, k)| *k != 0) {
            self.0.provider.backend().cancel(key);
        }
        for w in wakers {
            w.wake();
        }
    }

    /// Sets how many records each GET_EVENT asks for.
    pub fn set_batch(&self, records: usize) {
        self.events().batch = records.max(1);
    }

    /// Puts an event back at the head of the queue, for the next wait.
    pub fn requeue(&self, record: EventRecord) {
        self.events()
            .queue
            .splice(0..0, record.as_bytes().iter().copied());
    }

    /// (GET_EVENT system calls, event records received) so far.
    pub fn event_stats(&self) -> (u64, u64) {
        self.0.events.get().map_or((0, 0), |q| {
            let ev = q.lock();
            (ev.get_event_calls, ev.records)
        })
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Destroy: the driver completes this endpoint's pending requests and tears the
        // connection down in the background; nothing here waits for the network.
        let input = HandleIn {
            size: HandleIn::SIZE,
            reserved: 0,
            handle: self.handle,
        };
        self.provider.backend().submit(
            code::DESTROY,
            input.as_bytes(),
            0,
            Vec::new(),
            Ignore::hook(),
        );
    }
}

/// The hook of a request whose outcome nobody waits for (DESTROY of a dropped endpoint).
struct Ignore;

impl Ignore {
    /// One hook shared by every such request.
    fn hook() -> Arc<Self> {
        static HOOK: std::sync::LazyLock<Arc<Ignore>> =
            std::sync::LazyLock::new(|| Arc::new(Ignore));
        Arc::clone(&HOOK)
    }
}

impl CompletionHook for Ignore {
    fn completed(self: Arc<Self>, _: i32, _: Vec<u8>) {}
}

/// The tasks waiting on an endpoint's events. One waiter is the usual case: it is held
/// inline, so waiting allocates nothing.
#[derive(Default)]
struct Wakers {
    first: Option<Waker>,
    rest: Vec<Waker>,
}

impl Wakers {
    fn push(&mut self, waker: Waker) {
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.rest.push(waker);
        }
    }

    /// The wakers to wake once the event lock is released.
    fn take(&mut self) -> impl Iterator<Item = Waker> + use<> {
        self.first
            .take()
            .into_iter()
            .chain(std::mem::take(&mut self.rest))
    }
}

/// A wait for one event (see [`Endpoint::wait_event`]).
pub(crate) struct EventWait {
    endpoint: Endpoint,
    operation: &'static str,
    wanted: fn(u32) -> bool,
    epoch: u64,
}

impl Future for EventWait {
    type Output = Result<EventRecord>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let ep = this.endpoint.clone();
        let mut ev = ep.events();
        if ev.epoch != this.epoch {
            return Poll::Ready(Err(Error::new(this.operation, status::CANCELLED)));
        }
        if let Some(record) = ev.take(this.wanted) {
            return Poll::Ready(Ok(record));
        }
        if let Some(st) = ev.failed {
            return Poll::Ready(Err(Error::new(this.operation, st)));
        }
        ev.wakers.push(cx.waker().clone());
        drop(ev);
        ep.pump();
        Poll::Pending
    }
}
