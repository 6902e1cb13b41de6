//! The provider's event channel: one GET_EVENT on [`ANY_ENDPOINT`] for every endpoint of
//! the handle (an `rdma_event_channel`), rather than one per endpoint. An idle connection
//! then holds no request, no output buffer and, on Windows, no IRP and no nonpaged system
//! buffer while it waits for its next event; a burst of events comes back in batches.

use std::mem::offset_of;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::Waker;
use std::time::Duration;

use hashbrown::HashMap;
use ibcm_ioctl::{ANY_ENDPOINT, EventRecord, HandleIn, code, event_type, status};
use zerocopy::{FromBytes, IntoBytes};

use crate::backend::{Backend, CompletionHook};
use crate::completion::{output_buffer, recycle_buffer};

/// Records one channel GET_EVENT asks for: a burst of REQs, or of DREQs, comes back in
/// batches of this many.
const RECORDS_PER_REQUEST: usize = 16;

/// A GET_EVENT that fails otherwise than for good (STATUS_INSUFFICIENT_RESOURCES when the
/// driver is transiently short) is retried after 1 ms, doubling up to [`MAX_BACKOFF`];
/// after this many failures in a row (about 7 s) the channel fails with the last status.
const MAX_RETRIES: u32 = 16;
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Whether a GET_EVENT's failure ends the channel: the device is gone, or the handle was
/// closed (its requests complete with STATUS_CANCELLED, later ones fail with
/// STATUS_INVALID_HANDLE) or failed (STATUS_INTERNAL_ERROR, `backend::device`).
fn terminal(st: i32) -> bool {
    [
        status::DEVICE_REMOVED,
        status::CANCELLED,
        status::INVALID_HANDLE,
        crate::error::STATUS_INTERNAL_ERROR,
    ]
    .contains(&st)
}

/// The wait before retry number `n` (from 0).
fn backoff(n: u32) -> Duration {
    Duration::from_millis(1u64 << n.min(10)).min(MAX_BACKOFF)
}

/// An endpoint's queue of events the channel brought, and the tasks waiting on it.
#[derive(Default)]
pub(crate) struct EventQueue(Mutex<Events>);

#[derive(Default)]
pub(crate) struct Events {
    /// Queued event records, back to back, from byte `head` on (the bytes before it
    /// were taken); an idle endpoint keeps no buffer.
    queue: Vec<u8>,
    /// Where the first queued record starts. Taking the first record moves it on
    /// instead of moving every record behind it (a listen's queue holds every REQ not
    /// taken yet: moving them on each take made a storm of N REQs cost N^2 / 2
    /// record copies); the taken bytes are dropped once they are half the buffer.
    head: usize,
    pub(crate) wakers: Wakers,
    /// Bumped by `Endpoint::cancel`: waiters started before it fail with
    /// STATUS_CANCELLED.
    pub(crate) epoch: u32,
    /// A terminal failure of the channel (device removed, handle closed).
    pub(crate) failed: Option<i32>,
    /// The application's disconnects whose DREQ may be out (counted, as two can race:
    /// the second is refused): while there is one, the events that answer it (DREP, the
    /// DREQ's timeout, a REJ, a crossing DREQ) are its disconnect's, not a watcher's of
    /// the connection's end.
    pub(crate) own_dreqs: u8,
    /// Channel completions that brought this endpoint records, and the records.
    pub(crate) deliveries: u32,
    pub(crate) records: u32,
}

impl EventQueue {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Events> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Events {
    /// Takes the first queued record whose event type and `message` byte `wanted`
    /// accepts (read in place: only the record taken is copied out).
    pub(crate) fn take(&mut self, wanted: impl Fn(u32, u8) -> bool) -> Option<EventRecord> {
        let size = EventRecord::SIZE as usize;
        let at = offset_of!(EventRecord, event_type);
        let message = offset_of!(EventRecord, message);
        let queued = self.queue.get(self.head..)?;
        let i = queued.chunks_exact(size).position(|c| {
            let t = c.get(at..at + 4).and_then(|b| b.try_into().ok());
            match (t, c.get(message)) {
                (Some(t), Some(&m)) => wanted(u32::from_le_bytes(t), m),
                _ => false,
            }
        })?;
        let start = self.head + i * size;
        let record = EventRecord::read_from_bytes(self.queue.get(start..start + size)?).ok()?;
        if self.queue.len() - self.head == size {
            // Connections mostly sit idle between events: keep no buffer (the thread
            // keeps it for its next request).
            recycle_buffer(std::mem::take(&mut self.queue));
            self.head = 0;
        } else if i == 0 {
            self.head += size;
            if self.head * 2 >= self.queue.len() {
                self.queue.drain(..self.head);
                self.head = 0;
            }
        } else {
            self.queue.drain(start..start + size);
        }
        Some(record)
    }

    /// Puts a record back at the head of the queue.
    pub(crate) fn requeue(&mut self, record: &EventRecord) {
        let size = EventRecord::SIZE as usize;
        if self.head >= size {
            self.head -= size;
            let head = self.head;
            if let Some(slot) = self.queue.get_mut(head..head + size) {
                slot.copy_from_slice(record.as_bytes());
            }
        } else {
            self.queue
                .splice(self.head..self.head, record.as_bytes().iter().copied());
        }
    }

    fn push(&mut self, record: &[u8]) {
        if self.queue.is_empty() {
            self.queue = output_buffer(record.len());
            self.head = 0;
        }
        self.queue.extend_from_slice(record);
        self.records = self.records.saturating_add(1);
    }
}

/// The tasks waiting on an endpoint's events. One waiter is the usual case: it is held
/// inline, so waiting allocates nothing.
#[derive(Default)]
pub(crate) struct Wakers {
    first: Option<Waker>,
    rest: Vec<Waker>,
}

impl Wakers {
    pub(crate) fn push(&mut self, waker: Waker) {
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.rest.push(waker);
        }
    }

    /// The wakers to wake once the event lock is released.
    pub(crate) fn take(&mut self) -> impl Iterator<Item = Waker> + use<> {
        self.first
            .take()
            .into_iter()
            .chain(std::mem::take(&mut self.rest))
    }
}

/// The channel of one provider (see the module docs).
pub(crate) struct Channel {
    backend: Weak<dyn Backend>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Every endpoint of the handle the library knows, by handle: the channel's records
    /// go to their queues. A REQ's new endpoint is entered as its record arrives, before
    /// anyone holds it, so that none of its own events is missed.
    queues: HashMap<u64, Arc<EventQueue>>,
    /// A channel GET_EVENT is pending.
    outstanding: bool,
    /// `pump` is issuing one on some thread: a completion meanwhile leaves the next one
    /// to it (`again`) instead of recursing through a synchronous completion.
    submitting: bool,
    again: bool,
    /// The channel failed for good (device removed, handle closed).
    failed: Option<i32>,
    /// GET_EVENTs that failed in a row with a status that is not terminal.
    retries: u32,
    /// The last GET_EVENT's buffer, for the next one.
    buffer: Vec<u8>,
}

impl Channel {
    pub(crate) fn new(backend: Weak<dyn Backend>) -> Arc<Self> {
        Arc::new(Self {
            backend,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The queue of endpoint `handle`, entered now or when its REQ arrived; a queue made
    /// after the channel failed starts failed.
    pub(crate) fn attach(&self, handle: u64) -> Arc<EventQueue> {
        let mut s = self.lock();
        let failed = s.failed;
        let q = Arc::clone(s.queues.entry(handle).or_default());
        drop(s);
        if let Some(st) = failed {
            q.lock().failed.get_or_insert(st);
        }
        q
    }

    /// The endpoint is destroyed: its records, if any still come, go nowhere.
    pub(crate) fn detach(&self, handle: u64) {
        self.lock().queues.remove(&handle);
    }

    /// Keeps one channel GET_EVENT pending while the handle has endpoints.
    pub(crate) fn pump(self: &Arc<Self>) {
        let mut s = self.lock();
        if s.submitting {
            s.again = true;
            return;
        }
        loop {
            if s.outstanding || s.failed.is_some() || s.queues.is_empty() {
                return;
            }
            let Some(backend) = self.backend.upgrade() else {
                return;
            };
            s.outstanding = true;
            s.submitting = true;
            s.again = false;
            let len = RECORDS_PER_REQUEST * EventRecord::SIZE as usize;
            let buffer = if s.buffer.capacity() >= len {
                std::mem::take(&mut s.buffer)
            } else {
                output_buffer(len)
            };
            drop(s);
            let input = HandleIn {
                size: HandleIn::SIZE,
                reserved: 0,
                handle: ANY_ENDPOINT,
            };
            backend.submit(
                code::GET_EVENT,
                input.as_bytes(),
                len,
                buffer,
                Arc::clone(self) as Arc<dyn CompletionHook>,
            );
            drop(backend);
            s = self.lock();
            s.submitting = false;
            if !s.again {
                return;
            }
        }
    }
}

impl Channel {
    /// Issues the channel's GET_EVENT again after `delay`, on a thread of its own (not the
    /// completion thread, which other requests need meanwhile; on this one only if no
    /// thread can be started).
    fn retry_after(self: Arc<Self>, delay: Duration) {
        fn retry(channel: &Arc<Channel>, delay: Duration) {
            std::thread::sleep(delay);
            channel.lock().outstanding = false;
            channel.pump();
        }
        let me = Arc::clone(&self);
        let started = std::thread::Builder::new()
            .name("ibcm-event-retry".into())
            .spawn(move || retry(&me, delay));
        if started.is_err() {
            retry(&self, delay);
        }
    }
}

/// The handle a REQ record names for its new endpoint.
fn new_endpoint(record: &[u8]) -> Option<u64> {
    let r = EventRecord::ref_from_bytes(record).ok()?;
    let creates =
        r.event_type == event_type::REQ_RECEIVED || r.event_type == event_type::SIDR_REQ_RECEIVED;
    (creates && r.new_handle != 0).then_some(r.new_handle)
}

impl CompletionHook for Channel {
    fn completed(self: Arc<Self>, st: i32, mut output: Vec<u8>) {
        let size = EventRecord::SIZE as usize;
        let mut wakers: Vec<Waker> = Vec::new();
        // Asked before the lock: this may be the provider's last reference, whose drop
        // closes the handle, which completes requests (this channel's too).
        let open = st == status::SUCCESS || self.backend.upgrade().is_some_and(|b| !b.is_closed());
        {
            let mut s = self.lock();
            s.outstanding = false;
            if st == status::SUCCESS {
                s.retries = 0;
                output.truncate(output.len() - output.len() % size);
                let mut touched: Option<u64> = None;
                for record in output.chunks_exact(size) {
                    if let Some(child) = new_endpoint(record) {
                        s.queues.entry(child).or_default();
                    }
                    let handle = EventRecord::ref_from_bytes(record).map_or(0, |r| r.handle);
                    // An endpoint destroyed meanwhile (its records come no more).
                    let Some(q) = s.queues.get(&handle) else {
                        continue;
                    };
                    let mut ev = q.lock();
                    ev.push(record);
                    if touched != Some(handle) {
                        ev.deliveries = ev.deliveries.saturating_add(1);
                        touched = Some(handle);
                    }
                    wakers.extend(ev.wakers.take());
                }
                output.clear();
                s.buffer = output;
            } else if !terminal(st) && s.retries < MAX_RETRIES && open {
                // Transient: the GET_EVENT is issued again later, and meanwhile counts as
                // outstanding; no wait ends.
                recycle_buffer(output);
                let delay = backoff(s.retries);
                s.retries += 1;
                s.outstanding = true;
                drop(s);
                self.retry_after(delay);
                return;
            } else {
                // The handle closed, or the device went, or the failures did not stop:
                // every wait ends with it.
                recycle_buffer(output);
                s.failed = Some(st);
                let State { queues, .. } = &mut *s;
                for q in queues.values() {
                    let mut ev = q.lock();
                    ev.failed.get_or_insert(st);
                    wakers.extend(ev.wakers.take());
                }
            }
        }
        // A woken operation may panic (on the Windows backend's completion thread, the
        // device then fails the provider): the others are woken all the same, and the
        // next GET_EVENT issued, which the failure completes, before it goes on.
        let mut panicked = None;
        for w in wakers {
            if let Err(p) = std::panic::catch_unwind(AssertUnwindSafe(|| w.wake())) {
                panicked.get_or_insert(p);
            }
        }
        self.pump();
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    fn record(event: u32, handle: u64) -> EventRecord {
        let mut r = EventRecord::new_zeroed();
        r.event_type = event;
        r.handle = handle;
        r
    }

    /// Records come out in order whichever way they are taken: from the front (the head
    /// moves on), from behind a record of another type, and after a requeue.
    #[test]
    fn queue_keeps_the_order_through_takes_and_requeues() {
        let mut q = Events::default();
        let req = |t, _| t == event_type::REQ_RECEIVED;
        let any = |_, _| true;
        for h in 0..6 {
            q.push(record(event_type::REQ_RECEIVED, h).as_bytes());
        }
        q.push(record(event_type::REJECTED, 100).as_bytes());
        q.push(record(event_type::REQ_RECEIVED, 6).as_bytes());
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(q.take(req).map(|r| r.handle));
        }
        let back = q.take(req).unwrap();
        q.requeue(&back);
        for _ in 0..4 {
            got.push(q.take(req).map(|r| r.handle));
        }
        assert_eq!(
            got,
            [0, 1, 2, 3, 4, 5, 6].map(Some),
            "REQs in order, the REJECTED skipped"
        );
        assert_eq!(q.take(req).map(|r| r.handle), None);
        assert_eq!(q.take(any).map(|r| r.handle), Some(100));
        assert_eq!(q.take(any).map(|r| r.handle), None);
        assert!(
            q.queue.is_empty() && q.head == 0,
            "an idle queue keeps no buffer"
        );
        // A requeue into an empty queue.
        q.requeue(&record(event_type::REQ_RECEIVED, 7));
        assert_eq!(q.take(req).map(|r| r.handle), Some(7));
    }

    /// Taking N records one by one from the front moves O(N) bytes in all (before, every
    /// take moved every record behind it: N^2 / 2).
    #[test]
    fn taking_from_the_front_does_not_move_the_rest() {
        let mut q = Events::default();
        let n = 1000u64;
        for h in 0..n {
            q.push(record(event_type::REQ_RECEIVED, h).as_bytes());
        }
        let mut moved = 0usize;
        for h in 0..n {
            let before = (q.head, q.queue.len());
            assert_eq!(q.take(|_, _| true).map(|r| r.handle), Some(h));
            if q.head < before.0 {
                // A compaction moved what was left.
                moved += q.queue.len();
            }
        }
        let size = EventRecord::SIZE as usize;
        assert!(moved <= 2 * n as usize * size, "moved {moved} bytes");
    }
}
