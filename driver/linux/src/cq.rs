//! Completion queues through libibverbs: one a QP owns, with a completion channel to sleep
//! on, or one several QPs share without a channel (cmtime's shape: QPs that carry no data
//! cost one `ibv_create_qp` each, nothing more).

use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::ibv::{self, ibv_comp_channel, ibv_cq, ibv_wc};
use crate::verbs::{Context, check, os_error};

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's ID.
    pub wr_id: u64,
    /// `ibv_wc_status` (0: success).
    pub status: u32,
    /// `ibv_wc_opcode`.
    pub opcode: u32,
    /// Bytes received (receives) or read.
    pub byte_len: u32,
}

impl Completion {
    /// Whether it succeeded.
    pub fn ok(&self) -> bool {
        self.status == 0
    }

    /// libibverbs' name of the status.
    pub fn status_text(&self) -> String {
        let Ok(v) = ibv::verbs() else {
            return format!("status {}", self.status);
        };
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        let s = unsafe { (v.ibv_wc_status_str)(self.status) };
        if s.is_null() {
            return format!("status {}", self.status);
        }
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

/// A CQ on a device context.
pub struct Cq {
    ctx: Arc<Context>,
    cq: NonNull<ibv_cq>,
    /// The CQ's completion channel, if it has one: [`next`](Self::next) sleeps on its file
    /// until the device signals a completion (`ibv_req_notify_cq`), instead of polling.
    channel: Option<NonNull<ibv_comp_channel>>,
    /// Whether the CQ is armed (a notification asked for and not yet taken).
    armed: AtomicBool,
}

// SAFETY: verbs on a CQ are thread-safe (the provider locks its queue); the channel is
// non-blocking, so a caller that finds its event taken by another gets EAGAIN instead of
// blocking (`with_channel`).
unsafe impl Send for Cq {}
// SAFETY: as for Send.
unsafe impl Sync for Cq {}

impl Cq {
    /// A CQ of `entries` completions on a completion channel of its own, non-blocking, as
    /// ibv_get_cq_event(3) allows: [`next`](Self::next) takes `&self`, so two threads may
    /// both see the file readable, and the one that finds the event taken must get EAGAIN
    /// and go back to its deadline, not block without one.
    pub fn with_channel(ctx: &Arc<Context>, entries: u32) -> io::Result<Self> {
        let v = ctx.verbs();
        // SAFETY: `ctx` is open.
        let channel = unsafe { (v.ibv_create_comp_channel)(ctx.raw()) };
        let channel = NonNull::new(channel).ok_or_else(|| os_error("ibv_create_comp_channel"))?;
        // SAFETY: the channel is alive; its fd is open.
        let fd = unsafe { channel.as_ref() }.fd;
        // SAFETY: F_GETFL on an open fd.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: F_SETFL on an open fd, its own flags plus O_NONBLOCK.
        let nonblock =
            flags >= 0 && unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } == 0;
        let cq = if nonblock {
            Self::create(ctx, entries, Some(channel))
        } else {
            Err(os_error("fcntl(O_NONBLOCK) on the completion channel"))
        };
        if cq.is_err() {
            // SAFETY: created above, no CQ uses it.
            unsafe { (v.ibv_destroy_comp_channel)(channel.as_ptr()) };
        }
        cq
    }

    /// A CQ of `entries` completions without a channel, for QPs to share:
    /// [`next`](Self::next) polls it.
    pub fn shared(ctx: &Arc<Context>, entries: u32) -> io::Result<Arc<Self>> {
        Self::create(ctx, entries, None).map(Arc::new)
    }

    fn create(
        ctx: &Arc<Context>,
        entries: u32,
        channel: Option<NonNull<ibv_comp_channel>>,
    ) -> io::Result<Self> {
        let cqe = i32::try_from(entries.max(1)).unwrap_or(i32::MAX);
        let channel_ptr = channel.map_or(std::ptr::null_mut(), NonNull::as_ptr);
        // SAFETY: `ctx` is open; the channel, if any, is this context's; no CQ context,
        // vector 0.
        let cq = unsafe {
            (ctx.verbs().ibv_create_cq)(ctx.raw(), cqe, std::ptr::null_mut(), channel_ptr, 0)
        };
        let cq = NonNull::new(cq).ok_or_else(|| os_error("ibv_create_cq"))?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            cq,
            channel,
            armed: AtomicBool::new(false),
        })
    }

    /// The context the CQ is on.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The CQ, for a QP's creation attributes.
    pub(crate) fn as_ptr(&self) -> NonNull<ibv_cq> {
        self.cq
    }

    /// Polls the CQ once: up to `max` completions (at most 16) appended to `out`.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> io::Result<usize> {
        let mut wc: [ibv_wc; 16] = ibv::zeroed();
        let want = max.min(wc.len()) as i32;
        // SAFETY: `cq` is alive; `wc` holds `want` entries.
        let n = unsafe { ibv::poll_cq(self.cq.as_ptr(), want, wc.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq: {n}")));
        }
        for w in wc.iter().take(n as usize) {
            out.push(Completion {
                wr_id: w.wr_id,
                status: w.status,
                opcode: w.opcode,
                byte_len: w.byte_len,
            });
        }
        Ok(n as usize)
    }

    /// Waits for the next completion until `deadline`: polls the CQ a few times, then,
    /// with a channel, arms it (`ibv_req_notify_cq`), polls once more (a completion that
    /// came before the arming raises no event) and sleeps on the channel's file; without
    /// one, sleeps [`POLL_SLEEP`] between polls.
    pub fn next(&self, deadline: Instant) -> io::Result<Completion> {
        let mut out = Vec::with_capacity(1);
        let mut spins = 0u32;
        loop {
            if self.poll(&mut out, 1)? > 0
                && let Some(c) = out.pop()
            {
                return Ok(c);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no completion before the deadline",
                ));
            }
            // A completion often follows within microseconds (a SEND's ACK on a real
            // link): a few polls before a system call and a sleep.
            if spins < SPINS_BEFORE_SLEEP {
                spins += 1;
                std::thread::yield_now();
                continue;
            }
            let Some(channel) = self.channel else {
                std::thread::sleep(POLL_SLEEP.min(deadline.saturating_duration_since(now)));
                continue;
            };
            if !self.armed.swap(true, Ordering::AcqRel) {
                // SAFETY: `cq` is alive; 0: every completion, not only solicited ones.
                let rc = unsafe { ibv::req_notify_cq(self.cq.as_ptr(), 0) };
                check(rc, "ibv_req_notify_cq")?;
                continue;
            }
            // At most RECHECK at a time: a completion posted without an event (a flush
            // as the QP goes to ERR, on a provider that raises none for it) is still seen.
            if self.wait_event(
                channel,
                deadline.saturating_duration_since(now).min(RECHECK),
            )? {
                self.armed.store(false, Ordering::Release);
            }
        }
    }

    /// Sleeps until `channel` has an event (taken and acknowledged here: true) or
    /// `timeout` passes (false).
    fn wait_event(
        &self,
        channel: NonNull<ibv_comp_channel>,
        timeout: Duration,
    ) -> io::Result<bool> {
        // SAFETY: `channel` is alive until Drop.
        let fd = unsafe { channel.as_ref() }.fd;
        let mut fds = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd, alive for the call.
        let n = unsafe { libc::poll(&mut fds, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(io::Error::new(e.kind(), format!("poll: {e}")))
            };
        }
        if n == 0 || fds.revents & libc::POLLIN == 0 {
            return Ok(false);
        }
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut context: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: `channel` is alive and non-blocking; the out-pointers are valid.
        let rc =
            unsafe { (self.ctx.verbs().ibv_get_cq_event)(channel.as_ptr(), &mut cq, &mut context) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // Another thread in `next` took the event first.
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) {
                return Ok(false);
            }
            return Err(io::Error::new(e.kind(), format!("ibv_get_cq_event: {e}")));
        }
        // SAFETY: the event is for our only CQ on this channel; acknowledged once.
        unsafe { (self.ctx.verbs().ibv_ack_cq_events)(self.cq.as_ptr(), 1) };
        Ok(true)
    }
}

/// Polls of an empty CQ, each after a yield, before [`Cq::next`] sleeps.
const SPINS_BEFORE_SLEEP: u32 = 16;
/// The longest sleep on the channel before [`Cq::next`] polls the CQ again.
const RECHECK: Duration = Duration::from_millis(50);
/// Without a channel, the sleep between [`Cq::next`]'s polls (udaddy.c `poll_cqs` polls
/// without one too): what a QP on a shared CQ gets if it waits for completions (the CLI's
/// shared CQs carry none: their QPs post no work).
const POLL_SLEEP: Duration = Duration::from_millis(1);

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: no QP uses the CQ any more (each holds it until destroyed); every event
        // taken was acknowledged.
        unsafe { (self.ctx.verbs().ibv_destroy_cq)(self.cq.as_ptr()) };
        if let Some(channel) = self.channel {
            // SAFETY: its only CQ is gone.
            unsafe { (self.ctx.verbs().ibv_destroy_comp_channel)(channel.as_ptr()) };
        }
    }
}
