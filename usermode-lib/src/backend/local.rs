//! The driver's dispatch code in this process behind the Windows backend's threading
//! (feature `in-process`): what `backend::rdma` runs on a real port, apart from the port.
//!
//! The handle is `backend::device` over `backend::emulated`, so an application's
//! completions run on a completion thread of the provider's own, as on Windows (where
//! they come through the I/O completion port to a user thread), never on the thread that
//! ran the driver: on a real port that is the umad port's thread, which a
//! blocking call made from a completion would deadlock (no MAD would be read while it
//! waited for one), and a panicking completion would kill (every later request of every
//! handle then waits until its deadline). On the completion thread a blocking call fails
//! with STATUS_POSSIBLE_DEADLOCK and a panic fails the provider
//! (`backend::device`).
//!
//! `flush` runs after each call into the driver, outside the backend's locks: it sends
//! what the call made the driver queue (the MADs of an IOCTL leave before the call
//! returns, as a driver posts them from its dispatch routine).

use std::sync::Arc;

use ibcm_host::Node;

use super::device::Device;
use super::emulated::Emulated;
use super::{Backend, OnComplete};

/// What sends the MADs a call into the driver queued.
pub type Flush = Box<dyn Fn() + Send + Sync>;

/// One open handle of a node's device, with its completion thread.
pub struct Local {
    device: Device<Emulated>,
    flush: Flush,
}

impl Local {
    /// Opens `node`'s device (IRP_MJ_CREATE) and starts the handle's completion thread;
    /// fails with STATUS_INSUFFICIENT_RESOURCES when the thread cannot start.
    pub fn open(node: Arc<Node>, flush: Flush) -> Result<Self, i32> {
        Ok(Self {
            device: Device::new(Emulated::open(node))?,
            flush,
        })
    }
}

impl Backend for Local {
    fn submit(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        buffer: Vec<u8>,
        on_complete: OnComplete,
    ) -> u64 {
        let key = self
            .device
            .submit(code, input, output_len, buffer, on_complete);
        (self.flush)();
        key
    }

    fn call(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        buffer: Vec<u8>,
    ) -> Result<(i32, Vec<u8>), Vec<u8>> {
        let done = self.device.call(code, input, output_len, buffer);
        (self.flush)();
        done
    }

    fn cancel(&self, key: u64) {
        self.device.cancel(key);
        (self.flush)();
    }

    fn close(&self) {
        // Cleanup may send (a DREQ for each connection, a REJ for each REQ held).
        self.device.close();
        (self.flush)();
    }

    fn is_closed(&self) -> bool {
        self.device.is_closed()
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // The cleanup's MADs leave now, not at the port's next timer pass.
        self.close();
    }
}
