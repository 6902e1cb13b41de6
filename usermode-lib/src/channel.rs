//! The provider's event channel: one GET_EVENT on [`ANY_ENDPOINT`] for every endpoint of
//! the handle (an `rdma_event_channel`), rather than one per endpoint. An idle connection
//! then holds no request, no output buffer and, on Windows, no IRP and no nonpaged system
//! buffer while it waits for its next event; a burst of events comes back in batches.

use std::mem::offset_of;
use std::num::NonZeroI32;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::Waker;
use std::time::Duration;

use hashbrown::HashMap;
use ibcm_ioctl::{ANY_ENDPOINT, EventRecord, HandleIn, code, event_type, status};
use thin_vec::ThinVec;
use zerocopy::{FromBytes, IntoBytes};

use crate::backend::{Backend, CompletionHook};
use crate::completion::{output_buffer, recycle_buffer};
use crate::endpoint::Inner;
use crate::provider::Provider;

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

/// An endpoint's events the channel brought, the tasks waiting on them, and what its
/// operations in flight need to know of each other. Held inline in the endpoint's own
/// allocation (`endpoint::Inner`), which a million connections make two million of:
/// every field is as small as it can be (128 bytes an endpoint with the allocator's
/// header, against 208 when the queue had an allocation of its own).
#[derive(Default)]
pub(crate) struct Events {
    /// Queued event records, back to back, from record `head` on (the records before it
    /// were taken); an idle endpoint keeps no buffer.
    queue: Vec<u8>,
    /// Records taken from the front of `queue`. Taking the first record moves it on
    /// instead of moving every record behind it (a listen's queue holds every REQ not
    /// taken yet: moving them on each take made a storm of N REQs cost N^2 / 2 record
    /// copies); the taken bytes are dropped once they are half the buffer. A count of
    /// records, not bytes: 4 billion of them would be terabytes.
    head: u32,
    /// Bumped by `Endpoint::cancel`: waiters started before it fail with
    /// STATUS_CANCELLED.
    pub(crate) epoch: u32,
    pub(crate) wakers: Wakers,
    /// A terminal failure of the channel (device removed, handle closed): a status,
    /// never STATUS_SUCCESS.
    pub(crate) failed: Option<NonZeroI32>,
    /// Channel completions that brought this endpoint records, and the records.
    pub(crate) deliveries: u32,
    pub(crate) records: u32,
    /// The backend key of a CONNECT or SEND_REP waiting for its answer, for
    /// `Endpoint::cancel`, while `answering` (a key and a flag: `Option<u64>` would take
    /// 16 bytes).
    pub(crate) answer_key: u64,
    pub(crate) answering: bool,
    /// The application's disconnects whose DREQ may be out (counted, as two can race:
    /// the second is refused): while there is one, the events that answer it (DREP, the
    /// DREQ's timeout, a REJ, a crossing DREQ) are its disconnect's, not a watcher's of
    /// the connection's end.
    pub(crate) own_dreqs: u8,
}

impl Events {
    /// Takes the first queued record whose event type and `message` byte `wanted`
    /// accepts (read in place: only the record taken is copied out).
    pub(crate) fn take(&mut self, wanted: impl Fn(u32, u8) -> bool) -> Option<EventRecord> {
        let size = EventRecord::SIZE as usize;
        let at = offset_of!(EventRecord, event_type);
        let message = offset_of!(EventRecord, message);
        let head = self.head as usize * size;
        let queued = self.queue.get(head..)?;
        let i = queued.chunks_exact(size).position(|c| {
            let t = c.get(at..at + 4).and_then(|b| b.try_into().ok());
            match (t, c.get(message)) {
                (Some(t), Some(&m)) => wanted(u32::from_le_bytes(t), m),
                _ => false,
            }
        })?;
        let start = head + i * size;
        let record = EventRecord::read_from_bytes(self.queue.get(start..start + size)?).ok()?;
        if self.queue.len() - head == size {
            // Connections mostly sit idle between events: keep no buffer (the thread
            // keeps it for its next request).
            recycle_buffer(std::mem::take(&mut self.queue));
            self.head = 0;
        } else if i == 0 {
            self.head += 1;
            let taken = self.head as usize * size;
            if taken * 2 >= self.queue.len() {
                self.queue.drain(..taken);
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
        if self.head > 0 {
            self.head -= 1;
            let head = self.head as usize * size;
            if let Some(slot) = self.queue.get_mut(head..head + size) {
                slot.copy_from_slice(record.as_bytes());
            }
        } else {
            self.queue.splice(0..0, record.as_bytes().iter().copied());
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
    /// A pointer, not a `Vec`'s three words: every endpoint holds one.
    rest: ThinVec<Waker>,
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
    /// Every endpoint of the handle the library made, by handle: the channel's records go
    /// to their events. Held weakly: an endpoint goes when its last holder drops it, and
    /// leaves this map then.
    endpoints: HashMap<u64, Weak<Inner>>,
    /// The events of REQs' new endpoints that nobody has made into an endpoint yet: a
    /// REQ's new endpoint is entered as its record arrives, so that none of its own events
    /// is missed, and its events move into the endpoint when it is made.
    unclaimed: HashMap<u64, Events>,
    /// A channel GET_EVENT is pending.
    outstanding: bool,
    /// `pump` is issuing one on some thread: a completion meanwhile leaves the next one
    /// to it (`again`) instead of recursing through a synchronous completion.
    submitting: bool,
    again: bool,
    /// The channel failed for good (device removed, handle closed).
    failed: Option<NonZeroI32>,
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

    /// The endpoint of `handle` on `provider`'s handle, made now with the events that came
    /// since its REQ arrived, if any; an endpoint made after the channel failed starts
    /// failed.
    pub(crate) fn attach(&self, provider: Provider, handle: u64) -> Arc<Inner> {
        let mut s = self.lock();
        if let Some(inner) = s.endpoints.get(&handle).and_then(Weak::upgrade) {
            return inner;
        }
        let mut events = s.unclaimed.remove(&handle).unwrap_or_default();
        if let Some(st) = s.failed {
            events.failed.get_or_insert(st);
        }
        let inner = Arc::new(Inner::new(provider, handle, events));
        s.endpoints.insert(handle, Arc::downgrade(&inner));
        inner
    }

    /// The endpoint `inner` of `handle` is destroyed: its records, if any still come, go
    /// nowhere.
    pub(crate) fn detach(&self, handle: u64, inner: *const Inner) {
        let mut s = self.lock();
        if s.endpoints
            .get(&handle)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), inner))
        {
            s.endpoints.remove(&handle);
        }
    }

    /// Keeps one channel GET_EVENT pending while the handle has endpoints.
    pub(crate) fn pump(self: &Arc<Self>) {
        let mut s = self.lock();
        if s.submitting {
            s.again = true;
            return;
        }
        loop {
            let idle = s.endpoints.is_empty() && s.unclaimed.is_empty();
            if s.outstanding || s.failed.is_some() || idle {
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
        // The endpoints given records, held until the channel's lock is released and
        // their waiters have run: the last holder's drop detaches the endpoint, which
        // takes that lock.
        let mut held: Vec<Arc<Inner>> = Vec::new();
        // Asked before the lock: this may be the provider's last reference, whose drop
        // closes the handle, which completes requests (this channel's too).
        let open = st == status::SUCCESS || self.backend.upgrade().is_some_and(|b| !b.is_closed());
        {
            let mut s = self.lock();
            s.outstanding = false;
            match NonZeroI32::new(st) {
                None => {
                    s.retries = 0;
                    output.truncate(output.len() - output.len() % size);
                    let mut touched: Option<u64> = None;
                    for record in output.chunks_exact(size) {
                        let handle = EventRecord::ref_from_bytes(record).map_or(0, |r| r.handle);
                        let first_of_run = touched != Some(handle);
                        if first_of_run
                            && let Some(inner) = s.endpoints.get(&handle).and_then(Weak::upgrade)
                        {
                            held.push(inner);
                        }
                        {
                            let mut guard;
                            let ev: &mut Events = match held.last() {
                                Some(inner) if inner.handle == handle => {
                                    guard = inner.events();
                                    &mut guard
                                }
                                // Not made into an endpoint yet, or destroyed meanwhile (its
                                // records come no more).
                                _ => match s.unclaimed.get_mut(&handle) {
                                    Some(ev) => ev,
                                    None => continue,
                                },
                            };
                            ev.push(record);
                            if first_of_run {
                                ev.deliveries = ev.deliveries.saturating_add(1);
                            }
                            wakers.extend(ev.wakers.take());
                        }
                        touched = Some(handle);
                        // A REQ delivered to its listener: its new endpoint's events are
                        // kept from now on (one whose listener is gone is not: nobody
                        // would ever claim it).
                        if let Some(child) = new_endpoint(record) {
                            s.unclaimed.entry(child).or_default();
                        }
                    }
                    output.clear();
                    s.buffer = output;
                }
                Some(_) if !terminal(st) && s.retries < MAX_RETRIES && open => {
                    // Transient: the GET_EVENT is issued again later, and meanwhile counts
                    // as outstanding; no wait ends.
                    recycle_buffer(output);
                    let delay = backoff(s.retries);
                    s.retries += 1;
                    s.outstanding = true;
                    drop(s);
                    self.retry_after(delay);
                    return;
                }
                Some(failed) => {
                    // The handle closed, or the device went, or the failures did not
                    // stop: every wait ends with it.
                    recycle_buffer(output);
                    s.failed = Some(failed);
                    held.extend(s.endpoints.values().filter_map(Weak::upgrade));
                    for inner in &held {
                        let mut ev = inner.events();
                        ev.failed.get_or_insert(failed);
                        wakers.extend(ev.wakers.take());
                    }
                    for ev in s.unclaimed.values_mut() {
                        ev.failed.get_or_insert(failed);
                    }
                }
            }
        }
        // A woken operation may panic (on the Windows backend's completion thread, the
        // device then fails the provider): the others are woken all the same, and the
        // next GET_EVENT issued, which the failure completes, before it goes on.
        let mut panicked = None;
        let woke = !wakers.is_empty();
        for w in wakers {
            if let Err(p) = std::panic::catch_unwind(AssertUnwindSafe(|| w.wake())) {
                panicked.get_or_insert(p);
            }
        }
        if woke {
            // What a woken caller does next is what it waits for; the GET_EVENT issued
            // below is for an event still to come. A thread blocked on its result is only
            // made runnable by the wake, and with no other CPU (the test guests have one)
            // Linux's scheduler runs this thread on until it blocks: the caller would wait
            // for the issue. Yielding lets it go first; with nothing else runnable here it
            // returns at once (SwitchToThread on Windows).
            std::thread::yield_now();
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
