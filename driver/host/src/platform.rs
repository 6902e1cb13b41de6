//! The host platform: a lock that the verifier can see, requests with bounded output
//! buffers and a ledger, a clock, a timer and an outbox of MADs.

use std::sync::{Arc, Mutex, PoisonError};

use ibcm_cep::{Instant, Transmit};
use ibcm_endpoint::{Lock, Platform, Request};

use crate::clock::Clock;
use crate::verifier::{Completion, Ledger, Violation, lock_acquired, lock_released};
use crate::wake::Wake;

/// A number unique to the running thread.
fn thread_key() -> u64 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static KEY: u64 = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    KEY.with(|k| *k)
}

/// A mutex standing in for a WDF spin lock; it tells the verifier when it is held.
#[derive(Debug, Default)]
pub struct HostLock<T>(Mutex<T>);

impl<T> Lock<T> for HostLock<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lock_acquired();
        let r = f(&mut guard);
        lock_released();
        r
    }
}

/// A request from a (modelled) user-mode caller: its output buffer has exactly the
/// length the caller gave. It holds the bytes written so far (a prefix, gaps zeroed), so
/// the ledger sees a report of more bytes than were written, and nothing is zeroed for
/// the whole buffer on every request.
pub struct HostRequest {
    key: u64,
    output: Vec<u8>,
    output_len: usize,
    ledger: Arc<Ledger>,
    /// Who learns of the completion (an in-process user library); without one the
    /// ledger keeps the completion for [`Ledger::completion`].
    hook: Option<Arc<dyn CompletionHook>>,
}

impl core::fmt::Debug for HostRequest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HostRequest")
            .field("key", &self.key)
            .field("output_len", &self.output_len)
            .finish_non_exhaustive()
    }
}

impl HostRequest {
    /// The request's key in the ledger.
    pub fn key_value(&self) -> u64 {
        self.key
    }
}

impl Request for HostRequest {
    fn output_len(&self) -> usize {
        self.output_len
    }

    fn write_output(&mut self, offset: usize, bytes: &[u8]) {
        let end = offset.saturating_add(bytes.len());
        if end > self.output_len {
            self.ledger.violate(Violation::OutputOverflow {
                key: self.key,
                end,
                len: self.output_len,
            });
            return;
        }
        // Within the capacity reserved at issue: no allocation (DISPATCH_LEVEL writes).
        if self.output.len() < end {
            self.output.resize(end, 0);
        }
        if let Some(dst) = self.output.get_mut(offset..end) {
            dst.copy_from_slice(bytes);
        }
    }

    fn key(&self) -> u64 {
        self.key
    }
}

/// MADs the outbox holds without growing, at least (see [`HostPlatform::take_sent`]).
pub const OUTBOX_ROOM: usize = 1024;

/// How an in-process user library learns that its request finished (after the ledger
/// checked the completion): the ABI's completion contract, defined with the records.
pub use ibcm_ioctl::CompletionHook;

thread_local! {
    /// Time this thread spent in the host's stand-ins for what is not the driver (the
    /// user library's completion hooks, the verifier's ledger, the simulated wire's
    /// queue growing), ns: a timed DISPATCH_LEVEL entry point leaves it out.
    static HARNESS_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Time this thread has spent in the host's stand-ins so far, ns.
pub(crate) fn harness_ns() -> u64 {
    HARNESS_NS.with(std::cell::Cell::get)
}

/// Whether any node times its DISPATCH_LEVEL entry points (then the stand-ins are timed).
pub(crate) static TIMING_DPCS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Runs `f`, a stand-in for what is not the driver, counting its time as the harness's
/// while DISPATCH_LEVEL times are kept.
fn harness<T>(f: impl FnOnce() -> T) -> T {
    if !TIMING_DPCS.load(std::sync::atomic::Ordering::Relaxed) {
        return f();
    }
    let start = std::time::Instant::now();
    let value = f();
    HARNESS_NS.with(|ns| ns.set(ns.get() + start.elapsed().as_nanos() as u64));
    value
}

/// The host platform of one node.
#[derive(Clone)]
pub struct HostPlatform {
    /// Every request's fate, and every broken rule.
    pub ledger: Arc<Ledger>,
    clock: Arc<Clock>,
    outbox: Arc<Mutex<Vec<Transmit>>>,
    /// The outbox's other buffer (see [`HostPlatform::take_sent`]).
    spare: Arc<Mutex<Vec<Transmit>>>,
    timer: Arc<Mutex<Option<Instant>>>,
    wake: Arc<Wake>,
    /// A DISPATCH_LEVEL path asked for PASSIVE_LEVEL work (the WDFWORKITEM's stand-in:
    /// the fabric runs it between deliveries).
    passive_work: Arc<std::sync::atomic::AtomicBool>,
    /// The node's simulated HCA, (CA GUID, port), for STATUS.
    hca: Arc<Mutex<Option<(u64, u8)>>>,
}

impl core::fmt::Debug for HostPlatform {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HostPlatform")
            .field("timer", &self.timer())
            .finish_non_exhaustive()
    }
}

impl HostPlatform {
    /// A platform reading time from `clock` and waking `wake` when it has work.
    pub fn new(clock: Arc<Clock>, wake: Arc<Wake>) -> Self {
        Self {
            ledger: Arc::new(Ledger::default()),
            clock,
            outbox: Arc::new(Mutex::new(Vec::with_capacity(OUTBOX_ROOM))),
            // Both buffers now: the first `take_sent`, on the send path of a node's first
            // MAD (a passive side's first REP), allocates nothing (284 KB, an mmap).
            spare: Arc::new(Mutex::new(Vec::with_capacity(OUTBOX_ROOM))),
            timer: Arc::new(Mutex::new(None)),
            wake,
            passive_work: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            hca: Arc::new(Mutex::new(None)),
        }
    }

    /// The node's HCA as STATUS reports it: `ca_guid` with one port, `port`.
    pub fn set_hca(&self, ca_guid: u64, port: u8) {
        *self.hca.lock().unwrap_or_else(PoisonError::into_inner) = Some((ca_guid, port));
    }

    /// Whether PASSIVE_LEVEL work is asked for and not yet taken (a look: the runner's
    /// tests watch it run).
    pub fn passive_work_asked(&self) -> bool {
        self.passive_work.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether PASSIVE_LEVEL work was asked for since the last call (and forgets it).
    pub fn take_passive_work(&self) -> bool {
        self.passive_work
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Wakes the fabric's runner thread.
    pub fn wake(&self) {
        self.wake.notify();
    }

    /// A request of `file` with an output buffer of `output_len` bytes; the ledger keeps
    /// its completion.
    pub fn request(&self, file: u64, output_len: usize) -> HostRequest {
        HostRequest {
            key: self.ledger.issue(file),
            output: Vec::with_capacity(output_len),
            output_len,
            ledger: Arc::clone(&self.ledger),
            hook: None,
        }
    }

    /// A request whose completion goes to `hook`, with `buffer` (emptied, given room for
    /// `output_len` bytes) as its output buffer: the caller hands back a buffer it got
    /// from an earlier completion, and nothing is allocated per request.
    pub fn request_with_hook(
        &self,
        file: u64,
        mut buffer: Vec<u8>,
        output_len: usize,
        hook: Arc<dyn CompletionHook>,
    ) -> HostRequest {
        buffer.clear();
        buffer.reserve_exact(output_len);
        HostRequest {
            key: self.ledger.issue(file),
            output: buffer,
            output_len,
            ledger: Arc::clone(&self.ledger),
            hook: Some(hook),
        }
    }

    /// Whether MADs were posted and not yet taken ([`take_sent`](Self::take_sent)).
    pub fn sends_queued(&self) -> bool {
        !self
            .outbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Takes the MADs posted since the last call; hand the emptied vector back with
    /// [`recycle_sent`](Self::recycle_sent).
    ///
    /// Posting a MAD from the receive path or the timer (DISPATCH_LEVEL) must not
    /// allocate, so the outbox is double-buffered: the buffer put in place here is a
    /// recycled one, given room (here, on the fabric's thread) for twice the largest batch
    /// seen and at least [`OUTBOX_ROOM`].
    pub fn take_sent(&self) -> Vec<Transmit> {
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        if outbox.is_empty() {
            return Vec::new();
        }
        let mut next =
            std::mem::take(&mut *self.spare.lock().unwrap_or_else(PoisonError::into_inner));
        let want = (outbox.len() * 2).max(outbox.capacity()).max(OUTBOX_ROOM);
        // Exactly: `reserve` may double, and the two buffers would then outgrow each
        // other without end, swap after swap.
        next.reserve_exact(want);
        std::mem::replace(&mut *outbox, next)
    }

    /// Gives back a vector [`take_sent`](Self::take_sent) returned, for reuse.
    pub fn recycle_sent(&self, mut sent: Vec<Transmit>) {
        sent.clear();
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.capacity() < sent.capacity() {
            *spare = sent;
        }
    }

    /// The timer fired: it is disarmed until the device arms it again.
    pub(crate) fn disarm_timer(&self) {
        *self.timer.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The deadline the timer is armed to.
    pub fn timer(&self) -> Option<Instant> {
        *self.timer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Platform for HostPlatform {
    type Request = HostRequest;
    type Lock<T> = HostLock<T>;

    fn new_lock<T>(value: T) -> HostLock<T> {
        HostLock(Mutex::new(value))
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn request_passive_work(&self) {
        self.passive_work
            .store(true, std::sync::atomic::Ordering::Release);
        self.wake.notify();
    }

    /// The simulated node: one HCA with one port, its CM MADs all ibcm's (the fabric has
    /// no AL CM), so ibcm answers the CM query and the route is the ordinary service.
    fn fabric_status(&self, out: &mut ibcm_ioctl::StatusOut) {
        use ibcm_ioctl::status_report::{CM_IBCM, ROUTE_ORDINARY};
        let Some((ca_guid, port)) = *self.hca.lock().unwrap_or_else(PoisonError::into_inner) else {
            return;
        };
        out.hca_count = 1;
        out.hcas[0].ca_guid = ca_guid;
        out.hcas[0].cm = CM_IBCM;
        out.hcas[0].route = ROUTE_ORDINARY;
        out.port_count = 1;
        out.ports[0].ca_guid = ca_guid;
        out.ports[0].ca_port = port;
        out.ports[0].host_port = port;
        out.ports[0].route = ROUTE_ORDINARY;
    }

    fn tracer(&self) -> Option<&'static dyn ibcm_endpoint::DispatchTracer> {
        crate::trace::TracingSink::if_listening()
    }

    fn send(&self, transmit: &Transmit) {
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        // The outbox is the simulated wire, not the driver: the driver hands over a MAD
        // it already holds (on Windows, to a send queue of preallocated MAD buffers). A
        // burst beyond the room `take_sent` made grows the wire's queue, which is not an
        // allocation of the driver's at DISPATCH_LEVEL.
        if outbox.len() == outbox.capacity() {
            let more = outbox.len().max(OUTBOX_ROOM);
            harness(|| crate::counting::opt_out(|| outbox.reserve(more)));
        }
        outbox.push(transmit.clone());
        drop(outbox);
        self.wake.sent();
    }

    fn complete(&self, request: HostRequest, status: i32, information: usize) {
        let HostRequest {
            key, output, hook, ..
        } = request;
        // The bytes written: what the caller may read (`information` at most).
        match hook {
            Some(hook) => {
                // The caller takes the output; the ledger keeps only the fact. The ledger
                // is the verifier's, not the driver's: what it holds is not the driver's.
                harness(|| {
                    crate::counting::opt_out(|| {
                        self.ledger
                            .complete_and_forget(key, status, information, output.len())
                    })
                });
                let mut output = output;
                output.truncate(information);
                // The hook is the user-mode side learning of the completion (IOCP, an
                // event): on Windows that runs later, in the caller's thread, not at the
                // completing driver's IRQL, so what it allocates is not counted against
                // a DISPATCH_LEVEL path that completed the request.
                harness(|| crate::counting::opt_out(|| hook.completed(status, output)));
            }
            None => harness(|| {
                crate::counting::opt_out(|| {
                    self.ledger.complete(
                        key,
                        Completion {
                            status,
                            information,
                            output,
                        },
                    )
                })
            }),
        }
    }

    fn current_thread(&self) -> u64 {
        // As the KMDF binding's identity (driver/kmdf/platform.rs `current_thread`): the
        // processor at DISPATCH_LEVEL, the thread below it. One running context has one
        // identity only while its IRQL stays put: a delivery that takes its identity
        // below DISPATCH_LEVEL and calls back raised would not know its own callback.
        if crate::verifier::is_at_dispatch() {
            thread_key() | 1 << 62
        } else {
            thread_key()
        }
    }

    fn relax(&self) {
        // Waiting for another thread is PASSIVE_LEVEL work (KeDelayExecutionThread).
        if crate::verifier::is_at_dispatch() {
            self.ledger.violate(Violation::WaitAtDispatch);
        }
        std::thread::yield_now();
    }

    fn set_timer(&self, deadline: Option<Instant>) {
        let mut timer = self.timer.lock().unwrap_or_else(PoisonError::into_inner);
        // Every dispatch re-arms the timer; only a change may need the runner.
        if *timer != deadline {
            *timer = deadline;
            drop(timer);
            self.wake.timer_set(deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Taking the first MADs posted allocates nothing: the outbox's second buffer was made
    /// with the platform.
    #[test]
    fn the_first_take_allocates_nothing() {
        let platform = HostPlatform::new(Arc::new(Clock::virtual_at(0)), Arc::new(Wake::default()));
        platform.send(&Transmit {
            dest: Default::default(),
            mad: [0; ibcm_mad::MAD_SIZE],
        });
        let mut sent = Vec::new();
        let counted = crate::counting::measure(|| sent = platform.take_sent());
        assert_eq!(sent.len(), 1);
        assert_eq!(counted.count_total, 0, "the first take allocated");
    }
}
