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
//! - `IBV_EVENT_PKEY_CHANGE` drops the cached P_Key indices of the event's port
//!   ([`Context::forget_pkeys`]), as the KMDF binding takes the port's new attributes on
//!   `IB_PNP_PKEY_CHANGE`, and on the node's port the umad port's P_Key table too;
//!   `IBV_EVENT_GID_CHANGE` drops the cached GID indices of the event's port
//!   ([`Context::forget_gids`]), as the KMDF binding takes them again on
//!   `IB_PNP_GID_CHANGE`. Any port's: the context's caches serve every port a QP's
//!   address vector names. Only the node's port's are counted as such.
//!
//! A port that is not ACTIVE when the port starts (`ibv_query_port`) is told down at
//! once. The events are read from the context's async fd, which the umad port's thread
//! waits on beside the umad file (`ibv_get_async_event` once it is readable, each
//! acknowledged with `ibv_ack_async_event`, libibverbs' contract): a port event runs
//! in the thread that runs the driver's timer and receives, as the KMDF binding's PnP
//! callback runs the driver's code, with no thread of its own. The other events are only
//! counted.
//!
//! [`Device::port_down`]: ibcm_endpoint::Device::port_down
//! [`Device::port_up`]: ibcm_endpoint::Device::port_up
//! [`Device::remove`]: ibcm_endpoint::Device::remove
//! [`Context::forget_pkeys`]: crate::verbs::Context::forget_pkeys
//! [`Context::forget_gids`]: crate::verbs::Context::forget_gids

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::ibv::{
    self, IBV_EVENT_DEVICE_FATAL, IBV_EVENT_GID_CHANGE, IBV_EVENT_PKEY_CHANGE,
    IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ERR, ibv_async_event,
};
use ibcm_host::Node;

use crate::pkey_table::PkeyTable;
use crate::verbs::Context;

/// What the events were.
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
    /// Every other event (other ports' events, their table changes included; QP and CQ
    /// events).
    pub other: u64,
}

/// The device's asynchronous events, read by the umad port's thread
/// ([`UmadPort::start`](crate::umad::UmadPort::start)).
pub struct PortEvents {
    ctx: Arc<Context>,
    counts: Counts,
    down_at_start: AtomicBool,
}

impl PortEvents {
    /// The events of `ctx`, for the umad port to read. Its async fd is made non-blocking
    /// (as ibv_get_async_event(3) describes), so that a read finding nothing (another
    /// reader took the event) returns instead of stopping the port's thread.
    pub fn new(ctx: Arc<Context>) -> io::Result<Self> {
        let fd = ctx.async_fd();
        // SAFETY: fcntl on the context's open async fd, no pointers.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ctx,
            counts: Counts::default(),
            down_at_start: AtomicBool::new(false),
        })
    }

    /// Tells `node` its port is down if it is not ACTIVE now; before the port's thread
    /// starts, so an event after this query waits on the async fd for it.
    pub(crate) fn attach(&self, node: &Node) -> io::Result<()> {
        let port = node.address.port;
        if !self.ctx.port_state(port)?.active {
            self.down_at_start.store(true, Ordering::Relaxed);
            node.device.port_down(port);
        }
        Ok(())
    }

    /// The file to wait on.
    pub(crate) fn fd(&self) -> RawFd {
        self.ctx.async_fd()
    }

    /// The events so far.
    pub fn counts(&self) -> PortEventCounts {
        let c = &self.counts;
        PortEventCounts {
            port_err: c.port_err.load(Ordering::Relaxed),
            port_active: c.port_active.load(Ordering::Relaxed),
            device_fatal: c.device_fatal.load(Ordering::Relaxed),
            pkey_change: c.pkey_change.load(Ordering::Relaxed),
            gid_change: c.gid_change.load(Ordering::Relaxed),
            down_at_start: self.down_at_start.load(Ordering::Relaxed),
            other: c.other.load(Ordering::Relaxed),
        }
    }
}

impl core::fmt::Debug for PortEvents {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PortEvents")
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

/// What an event asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    PortDown,
    PortUp,
    /// `port`'s P_Key table changed; `ours` when it is the node's port (counted).
    ForgetPkeys {
        port: u8,
        ours: bool,
    },
    /// `port`'s GID table changed; `ours` when it is the node's port (counted).
    ForgetGids {
        port: u8,
        ours: bool,
    },
    DeviceFatal,
    Other,
}

/// The action for an event of type `kind` on `event_port` (the element's `port_num`) on a
/// node at `port`. A table change is acted on for any port: the context's caches serve
/// every port an address vector names, as the kernel refreshes the changed port's cache
/// whichever it is (cache.c, ib_cache_event_task -> ib_cache_update(event->element.port_num)).
fn action(kind: u32, event_port: i32, port: u8) -> Action {
    let ours = event_port == i32::from(port);
    let changed = u8::try_from(event_port).ok();
    match (kind, changed) {
        (IBV_EVENT_PORT_ERR, _) if ours => Action::PortDown,
        (IBV_EVENT_PORT_ACTIVE, _) if ours => Action::PortUp,
        (IBV_EVENT_PKEY_CHANGE, Some(port)) => Action::ForgetPkeys { port, ours },
        (IBV_EVENT_GID_CHANGE, Some(port)) => Action::ForgetGids { port, ours },
        (IBV_EVENT_DEVICE_FATAL, _) => Action::DeviceFatal,
        _ => Action::Other,
    }
}

impl PortEvents {
    /// Takes one event, the async fd being readable, and tells `node` (its port's P_Key
    /// table `pkeys`) what it means.
    pub(crate) fn take(&self, node: &Node, pkeys: &PkeyTable) {
        let (ctx, counts) = (&*self.ctx, &self.counts);
        let port = node.address.port;
        let mut ev: ibv_async_event = ibv::zeroed();
        // SAFETY: the context is open (the Arc keeps it); its fd is non-blocking (`new`):
        // nothing queued fails with EAGAIN.
        if unsafe { (ctx.verbs().ibv_get_async_event)(ctx.raw(), &mut ev) } != 0 {
            return;
        }
        // SAFETY: the union is plain data, zeroed and then filled by the call, and any bits
        // are a valid c_int; port events carry the port number there (verbs.h), and
        // `action` takes it as one only for them.
        let event_port = unsafe { ev.element.port_num };
        let count = |c: &AtomicU64| c.fetch_add(1, Ordering::Relaxed);
        match action(ev.event_type, event_port, port) {
            Action::PortDown => {
                count(&counts.port_err);
                node.device.port_down(port);
            }
            Action::PortUp => {
                count(&counts.port_active);
                node.device.port_up(port);
            }
            Action::ForgetPkeys {
                port: changed,
                ours,
            } => {
                ctx.forget_pkeys(changed);
                if ours {
                    count(&counts.pkey_change);
                    pkeys.forget();
                } else {
                    count(&counts.other);
                }
            }
            Action::ForgetGids {
                port: changed,
                ours,
            } => {
                ctx.forget_gids(changed);
                count(if ours {
                    &counts.gid_change
                } else {
                    &counts.other
                });
            }
            Action::DeviceFatal => {
                count(&counts.device_fatal);
                node.device.remove();
            }
            Action::Other => {
                count(&counts.other);
            }
        }
        // SAFETY: `ev` came from ibv_get_async_event and is acknowledged once.
        unsafe { (ctx.verbs().ibv_ack_async_event)(&mut ev) };
    }
}

#[cfg(test)]
mod tests {
    use super::{Action, action};
    use crate::ibv::{
        IBV_EVENT_DEVICE_FATAL, IBV_EVENT_GID_CHANGE, IBV_EVENT_PKEY_CHANGE, IBV_EVENT_PORT_ACTIVE,
        IBV_EVENT_PORT_ERR,
    };

    /// A two-port HCA with the node on port 1: a GID re-added on port 2 may take a new
    /// index (a RoCE entry deleted stays PENDING_DEL until its last reference goes,
    /// cache.c del_gid), so port 2's cached GID indices must go too, not only port 1's.
    #[test]
    fn a_table_change_on_another_port_forgets_that_port() {
        for (port, ours) in [(2u8, false), (1, true)] {
            let event_port = i32::from(port);
            assert_eq!(
                action(IBV_EVENT_GID_CHANGE, event_port, 1),
                Action::ForgetGids { port, ours }
            );
            assert_eq!(
                action(IBV_EVENT_PKEY_CHANGE, event_port, 1),
                Action::ForgetPkeys { port, ours }
            );
        }
        // Not a port number: nothing to forget.
        assert_eq!(action(IBV_EVENT_GID_CHANGE, 300, 1), Action::Other);
    }

    /// The port's state is the node's port's only.
    #[test]
    fn only_the_nodes_port_goes_down_or_up() {
        assert_eq!(action(IBV_EVENT_PORT_ERR, 1, 1), Action::PortDown);
        assert_eq!(action(IBV_EVENT_PORT_ACTIVE, 1, 1), Action::PortUp);
        assert_eq!(action(IBV_EVENT_PORT_ERR, 2, 1), Action::Other);
        assert_eq!(action(IBV_EVENT_PORT_ACTIVE, 2, 1), Action::Other);
        assert_eq!(action(IBV_EVENT_DEVICE_FATAL, 0, 1), Action::DeviceFatal);
    }
}
