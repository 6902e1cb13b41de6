//! The shared core of listeners and connection endpoints: the handle, the IOCTL helpers,
//! and the waits for events, which the provider's event channel brings.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use ibcm_ioctl::{CreateIn, CreateOut, EventRecord, HandleIn, code, status};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::backend::CompletionHook;
use crate::channel::Events;
use crate::completion::{Ioctl, blocking};
use crate::error::{Error, Result};
use crate::provider::Provider;

/// One endpoint: its handle and its events, in one allocation (the provider's event
/// channel holds it weakly, to bring it its records).
pub(crate) struct Inner {
    pub provider: Provider,
    pub handle: u64,
    /// Filled by the provider's event channel.
    events: Mutex<Events>,
}

impl Inner {
    pub(crate) fn new(provider: Provider, handle: u64, events: Events) -> Self {
        Self {
            provider,
            handle,
            events: Mutex::new(events),
        }
    }

    pub(crate) fn events(&self) -> std::sync::MutexGuard<'_, Events> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }
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
        let out: CreateOut = blocking(operation, || {
            provider.ioctl_out(operation, code::CREATE, c.as_bytes())
        })?;
        Ok(Self::new(provider.clone(), out.handle))
    }

    pub fn new(provider: Provider, handle: u64) -> Self {
        let channel = Arc::clone(provider.channel());
        Self(channel.attach(provider, handle))
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
    ) -> impl Future<Output = Result<T>> + Send + 'static + use<T> {
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
            let mut ev = self.events();
            ev.answer_key = ioctl.key;
            ev.answering = true;
        }
        let me = self.clone();
        async move {
            let answer = ioctl.await;
            me.events().answering = false;
            answer
        }
    }

    /// Waits for the first queued event `wanted` accepts (others stay queued, in order).
    pub fn wait_event(&self, operation: &'static str, wanted: fn(u32) -> bool) -> EventWait {
        self.wait(operation, Wanted::Event(wanted))
    }

    /// [`wait_event`](Self::wait_event) with a `wanted` that also weighs the event's
    /// `message` byte and whether the application's own DREQ is out
    /// ([`own_dreq_out`](Self::own_dreq_out)).
    pub fn wait_event_knowing_own_dreq(
        &self,
        operation: &'static str,
        wanted: fn(u32, u8, bool) -> bool,
    ) -> EventWait {
        self.wait(operation, Wanted::KnowingOwnDreq(wanted))
    }

    fn wait(&self, operation: &'static str, wanted: Wanted) -> EventWait {
        let epoch = self.events().epoch;
        EventWait {
            endpoint: self.clone(),
            operation,
            wanted,
            epoch,
        }
    }

    /// The application's DREQ is about to be issued: the events that answer it belong to
    /// its disconnect from now on.
    pub fn own_dreq_out(&self) {
        let mut ev = self.events();
        ev.own_dreqs = ev.own_dreqs.saturating_add(1);
    }

    /// The application's DREQ was refused (`one`), or the endpoint starts a new
    /// connection (all). Waiters are woken, since a wait may have passed over an event
    /// while the DREQ counted as out.
    pub fn own_dreq_over(&self, one: bool) {
        let wakers = {
            let mut ev = self.events();
            ev.own_dreqs = if one {
                ev.own_dreqs.saturating_sub(1)
            } else {
                0
            };
            ev.wakers.take()
        };
        for w in wakers {
            w.wake();
        }
    }

    fn events(&self) -> std::sync::MutexGuard<'_, Events> {
        self.0.events()
    }

    /// Fails every wait in progress with STATUS_CANCELLED, and cancels a CONNECT or
    /// SEND_REP waiting for its answer (the channel's GET_EVENT is every endpoint's, and
    /// stays).
    pub fn cancel(&self) {
        let answer = {
            let ev = self.events();
            ev.answering.then_some(ev.answer_key)
        };
        if let Some(key) = answer {
            self.0.provider.backend().cancel(key);
        }
        let wakers = {
            let mut ev = self.events();
            ev.epoch = ev.epoch.wrapping_add(1);
            ev.wakers.take()
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Puts an event back at the head of the queue, for the next wait.
    pub fn requeue(&self, record: EventRecord) {
        self.events().requeue(&record);
    }

    /// (Channel completions that brought this endpoint records, event records received)
    /// so far.
    pub fn event_stats(&self) -> (u64, u64) {
        let ev = self.events();
        (u64::from(ev.deliveries), u64::from(ev.records))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.provider.channel().detach(self.handle, self);
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

/// Which events a wait takes.
#[derive(Clone, Copy)]
enum Wanted {
    /// By event type.
    Event(fn(u32) -> bool),
    /// By event type, `message` byte and whether the application's own DREQ is out.
    KnowingOwnDreq(fn(u32, u8, bool) -> bool),
}

/// A wait for one event (see [`Endpoint::wait_event`]).
pub(crate) struct EventWait {
    endpoint: Endpoint,
    operation: &'static str,
    wanted: Wanted,
    epoch: u32,
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
        let own_dreq = ev.own_dreqs > 0;
        let taken = match this.wanted {
            Wanted::Event(wanted) => ev.take(|t, _| wanted(t)),
            Wanted::KnowingOwnDreq(wanted) => ev.take(|t, m| wanted(t, m, own_dreq)),
        };
        if let Some(record) = taken {
            return Poll::Ready(Ok(record));
        }
        if let Some(st) = ev.failed {
            return Poll::Ready(Err(Error::new(this.operation, st.get())));
        }
        ev.wakers.push(cx.waker().clone());
        drop(ev);
        ep.0.provider.channel().pump();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endpoint is one allocation of at most 120 bytes with the reference counts (128
    /// with glibc's chunk header): a million connections hold two million of them.
    #[test]
    fn an_endpoint_is_one_small_allocation() {
        let size = std::mem::size_of::<Inner>() + 2 * std::mem::size_of::<usize>();
        assert!(size <= 120, "an endpoint takes {size} bytes");
    }
}
