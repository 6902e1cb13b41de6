//! The Linux backend (feature `rdma`): a real RDMA device of this machine with the driver's
//! own dispatch layer and engine on its QP1, in this process — what the installed driver
//! behind `\\.\ibcm` is on Windows.
//!
//! [`Device`] is the driver: it starts `ibcm_linux::umad` on the device's port (an ib_umad
//! agent for the CM class; the kernel's `ib_cm` must not be loaded) and opens the
//! device's verbs context, where the application makes its RC QPs
//! (`ibcm_linux::verbs`), as a WinVerbs or ND application makes them through its verbs
//! provider on Windows. [`Provider::open_rdma`](crate::Provider::open_rdma) opens a handle
//! on it (IRP_MJ_CREATE); every operation is the same IOCTL record as on Windows, handed
//! to the dispatch code; its completion runs on the handle's own completion thread, as
//! the I/O completion port hands it to a user thread on Windows (`backend::local`), never
//! on the umad port's thread that ran the driver.
//! The MADs an IOCTL makes the driver send are written to the umad file before the call
//! returns, from the caller's thread, as a driver posts them from its dispatch routine.
//! The QP transition records the library returns (`QpAttributes`) go to
//! `ibcm_linux::verbs::RcQp::modify` unchanged.
//!
//! Nothing here decides anything about a connection: the backend carries records and
//! completions, the platform (`ibcm_linux`) carries MADs and verbs calls.

use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;

use ibcm_host::wire::DEFAULT_PKEY;
use ibcm_linux::port_events::PortEvents;
use ibcm_linux::umad::{UmadConfig, UmadPort};
use ibcm_linux::verbs::Context;

use super::local::Local;

/// A real RDMA port with the driver on its QP1, the device's verbs context, and its port
/// events told to the driver (a port going down ends its connections, as the KMDF
/// binding's IB_PNP_PORT_DOWN does).
pub struct Device {
    port: UmadPort,
    /// What the port's thread read of the device's events.
    events: Arc<PortEvents>,
    verbs: Arc<Context>,
}

impl core::fmt::Debug for Device {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Device")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Opens `device`'s verbs context (without a name, the first device libibverbs
    /// lists), starts the driver on its port `port` at `local` (ib_umad) and starts
    /// reading its port events. The verbs context comes first: it names the device from
    /// the one device list read, and finds `local`'s GID index with one ioctl, kept in
    /// the context until the port's GID_CHANGE (the umad port's source GID, and the QPs'
    /// address vectors' when they name it). Fails when there is no such device, the local
    /// address has no RoCEv2 GID, the port has no umad device, or the CM class is taken
    /// (the kernel's `ib_cm` is loaded).
    pub fn start(device: Option<&str>, port: u8, local: Ipv4Addr) -> io::Result<Arc<Self>> {
        let verbs = Context::open(device, port).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("verbs on {}: {e}", device.unwrap_or("an RDMA device")),
            )
        })?;
        let name = verbs.device().to_string();
        let gid = local.to_ipv6_mapped().octets();
        verbs.gid_index(port, &gid).map_err(|e| {
            io::Error::new(e.kind(), format!("{name}: the RoCE v2 GID of {local}: {e}"))
        })?;
        // The default partition's P_Key index, kept in the context as the GID index is:
        // every QP's INIT names it, and a server's first connection then does not wait
        // for the sysfs read inside its REQ's turnaround. A port without the partition
        // fails its INIT, with the reason, as before.
        let _ = verbs.pkey_index(port, DEFAULT_PKEY);
        let config = UmadConfig {
            device: name.clone(),
            port,
            local,
            seed: None,
        };
        // The MADs' source GID index comes from the context's cache, which the port
        // events below keep (forgotten on GID_CHANGE), as the QPs' address vectors do.
        let gid_index = {
            let verbs = Arc::clone(&verbs);
            Box::new(move || verbs.gid_index(port, &gid))
        };
        // The port's thread reads the device's events too: one thread runs the driver.
        let events = Arc::new(PortEvents::new(Arc::clone(&verbs)).map_err(|e| {
            io::Error::new(e.kind(), format!("{name}: the device's async events: {e}"))
        })?);
        let port = UmadPort::start(&config, gid_index, Some(Arc::clone(&events)))
            .map_err(|e| io::Error::new(e.kind(), format!("ib_umad on {name}: {e}")))?;
        Ok(Arc::new(Self {
            port,
            events,
            verbs,
        }))
    }

    /// The port: its CA GUID, GID index, address, paths and counters.
    pub fn port(&self) -> &UmadPort {
        &self.port
    }

    /// The device's verbs context (QPs, CQs, memory regions).
    pub fn verbs(&self) -> &Arc<Context> {
        &self.verbs
    }

    /// The port events told to the driver so far.
    pub fn events(&self) -> &PortEvents {
        &self.events
    }
}

/// Opens a handle of `device` (IRP_MJ_CREATE): the device stays up while a handle is
/// open, as a driver stays loaded while a handle to its device is, because the handle's
/// flush holds it (the handle's cleanup runs, and its MADs leave, while the driver still
/// runs). Its completions run on a thread of its own (`backend::local`), not on the
/// port's thread. Fails with STATUS_INSUFFICIENT_RESOURCES when that
/// thread cannot start.
pub fn open(device: &Arc<Device>) -> Result<Local, i32> {
    let device = Arc::clone(device);
    let node = device.port.node();
    Local::open(node, Box::new(move || device.port.flush()))
}
