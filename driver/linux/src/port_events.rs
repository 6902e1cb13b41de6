//! The port's state, from the device's asynchronous events, told to the engine.
//!
//! The same mapping as the KMDF binding's for IBAL's PnP events (driver/kmdf ibal.rs:
//! `IB_PNP_PORT_DOWN` / `IB_PNP_PORT_ACTIVE` to [`Device::port_down`] / [`Device::port_up`]),
//! seen through verbs:
//!
//! - `IBV_EVENT_PORT_ERR` (the port left ACTIVE; rdma_rxe raises it when its netdev goes
//!   down, rxe_net.c `rxe_port_down`) is [`Device::port_down`]: the engine sends nothing
//!   from the port until it is back, keeps the listens and the handshakes' own retries,
//!   and tells an established connection's owner only if the port is still down at its
//!   QP's give-up time (the engine's link.rs);
//! - `IBV_EVENT_PORT_ACTIVE` (rxe_net.c `rxe_port_up`) is [`Device::port_up`]. rxe raises
//!   either event again on NETDEV_CHANGE (`rxe_set_port_state`); a repeat is harmless to
//!   the engine (a port already down or up stays so);
//! - `IBV_EVENT_DEVICE_FATAL` (the device is lost: rxe on NETDEV_UNREGISTER) is
//!   [`Device::remove`], as the KMDF binding's device removal.
//!
//! - `IBV_EVENT_PKEY_CHANGE` on the node's port drops the port's cached P_Key indices
//!   ([`Context::forget_pkeys`]), as the KMDF binding takes the port's new attributes on
//!   `IB_PNP_PKEY_CHANGE`; `IBV_EVENT_GID_CHANGE` on it drops its cached GID indices
//!   ([`Context::forget_gids`]), as the KMDF binding takes them again on
//!   `IB_PNP_GID_CHANGE`.
//!
//! A port that is not ACTIVE when the thread starts (`ibv_query_port`) is told down at
//! once. The events are read from the context's async fd (`ibv_get_async_event`, each
//! acknowledged with `ibv_ack_async_event`, libibverbs' contract); the other events are
//! only counted.
//!
//! [`Device::port_down`]: ibcm_endpoint::Device::port_down
//! [`Device::port_up`]: ibcm_endpoint::Device::port_up
//! [`Device::remove`]: ibcm_endpoint::Device::remove
//! [`Context::forget_pkeys`]: crate::verbs::Context::forget_pkeys
//! [`Context::forget_gids`]: crate::verbs::Context::forget_gids

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use crate::ibv::{
    self, IBV_EVENT_DEVICE_FATAL, IBV_EVENT_GID_CHANGE, IBV_EVENT_PKEY_CHANGE,
    IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ERR, ibv_async_event,
};
use ibcm_host::Node;

use crate::verbs::Context;

/// What the event thread saw.
#[derive(Debug, Default)]
struct Counts {
    port_err: AtomicU64,
    port_active: AtomicU64,
    device_fatal: AtomicU64,
    pkey_change: AtomicU64,
    gid_change: AtomicU64,
    other: AtomicU64,
}

/// How many port events were told to the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortEventCounts {
    /// `IBV_EVENT_PORT_ERR` on the node's port: `port_down`.
    pub port_err: u64,
    /// `IBV_EVENT_PORT_ACTIVE` on the node's port: `port_up`.
    pub port_active: u64,
    /// `IBV_EVENT_DEVICE_FATAL`: `Device::remove`.
    pub device_fatal: u64,
    /// `IBV_EVENT_PKEY_CHANGE` on the node's port: its cached P_Key indices dropped.
    pub pkey_change: u64,
    /// `IBV_EVENT_GID_CHANGE` on the node's port: its cached GID indices dropped.
    pub gid_change: u64,
    /// The port was not ACTIVE at start (`ibv_query_port`): told down then.
    pub down_at_start: bool,
    /// Every other event (other ports, QP and CQ events).
    pub other: u64,
}

/// The thread that reads the device's asynchronous events.
pub struct PortEvents {
    counts: Arc<Counts>,
    down_at_start: bool,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PortEvents {
    /// Starts reading `ctx`'s events for `node`'s port.
    pub fn start(ctx: Arc<Context>, node: Arc<Node>) -> io::Result<Self> {
        // An event after this query waits on the async fd for the thread.
        let port = node.address.port;
        let down_at_start = !ctx.port_state(port)?.active;
        if down_at_start {
            node.device.port_down(port);
        }
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (counts, stop) = (Arc::clone(&counts), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("ibcm-port-events".into())
                .spawn(move || event_loop(&ctx, &node, &counts, &stop))?
        };
        Ok(Self {
            counts,
            down_at_start,
            stop,
            thread: Some(thread),
        })
    }

    /// The events so far.
    pub fn counts(&self) -> PortEventCounts {
        PortEventCounts {
            port_err: self.counts.port_err.load(Ordering::Relaxed),
            port_active: self.counts.port_active.load(Ordering::Relaxed),
            device_fatal: self.counts.device_fatal.load(Ordering::Relaxed),
            pkey_change: self.counts.pkey_change.load(Ordering::Relaxed),
            gid_change: self.counts.gid_change.load(Ordering::Relaxed),
            down_at_start: self.down_at_start,
            other: self.counts.other.load(Ordering::Relaxed),
        }
    }
}

impl Drop for PortEvents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The poll interval: how long the thread takes to see `stop`.
const POLL_MS: i32 = 100;

fn event_loop(ctx: &Context, node: &Node, counts: &Counts, stop: &AtomicBool) {
    let port = node.address.port;
    while !stop.load(Ordering::Relaxed) {
        let mut fds = libc::pollfd {
            fd: ctx.async_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        let n = unsafe { libc::poll(&mut fds, 1, POLL_MS) };
        if n <= 0 || fds.revents & libc::POLLIN == 0 {
            continue;
        }
        let mut ev: ibv_async_event = ibv::zeroed();
        // SAFETY: the context is open (the Arc keeps it); the fd is readable, so the call
        // does not block.
        if unsafe { (ctx.verbs().ibv_get_async_event)(ctx.raw(), &mut ev) } != 0 {
            continue;
        }
        let kind = ev.event_type;
        // SAFETY: port events carry the port number in the union (verbs.h).
        let on_port = |ev: &ibv_async_event| unsafe { ev.element.port_num } == i32::from(port);
        match kind {
            IBV_EVENT_PORT_ERR if on_port(&ev) => {
                counts.port_err.fetch_add(1, Ordering::Relaxed);
                node.device.port_down(port);
            }
            IBV_EVENT_PORT_ACTIVE if on_port(&ev) => {
                counts.port_active.fetch_add(1, Ordering::Relaxed);
                node.device.port_up(port);
            }
            IBV_EVENT_PKEY_CHANGE if on_port(&ev) => {
                counts.pkey_change.fetch_add(1, Ordering::Relaxed);
                ctx.forget_pkeys(port);
            }
            IBV_EVENT_GID_CHANGE if on_port(&ev) => {
                counts.gid_change.fetch_add(1, Ordering::Relaxed);
                ctx.forget_gids(port);
            }
            IBV_EVENT_DEVICE_FATAL => {
                counts.device_fatal.fetch_add(1, Ordering::Relaxed);
                node.device.remove();
            }
            _ => {
                counts.other.fetch_add(1, Ordering::Relaxed);
            }
        }
        // SAFETY: `ev` came from ibv_get_async_event and is acknowledged once.
        unsafe { (ctx.verbs().ibv_ack_async_event)(&mut ev) };
    }
}
