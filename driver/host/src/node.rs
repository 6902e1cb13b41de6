//! A host node: one [`Device`] on a [`HostPlatform`], and the calls a user-mode process
//! or the fabric makes on it, each under the verifier's eye.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use ibcm_cep::{CmConfig, MadAddress};
use ibcm_endpoint::{Device, FileId};

use crate::clock::Clock;
use crate::platform::{HostPlatform, HostRequest};
use crate::verifier::{Completion, Violation, at_dispatch};
use crate::wake::Wake;

/// One node: its device, platform and address on the fabric.
pub struct Node {
    /// The dispatch layer.
    pub device: Device<HostPlatform>,
    /// The platform (ledger, outbox, timer).
    pub platform: HostPlatform,
    /// This node's address as peers see it.
    pub address: MadAddress,
    /// Heap bytes the driver holds: what its entry points allocated less what they freed,
    /// counted by the allocator (the platform's own bookkeeping and the callers' buffers
    /// opted out).
    driver_bytes: AtomicI64,
}

impl Node {
    /// A node with `config` at `address`, reading time from `clock`.
    pub fn new(config: CmConfig, address: MadAddress, clock: Arc<Clock>, wake: Arc<Wake>) -> Self {
        let platform = HostPlatform::new(clock, wake);
        Self {
            device: Device::new(platform.clone(), config),
            platform,
            address,
            driver_bytes: AtomicI64::new(0),
        }
    }

    /// Runs a driver entry point, counting what it leaves allocated.
    fn in_driver<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut value = None;
        let info = allocation_counter::measure(|| value = Some(f()));
        self.driver_bytes
            .fetch_add(info.bytes_current, Ordering::Relaxed);
        match value {
            Some(v) => v,
            None => unreachable!("allocation_counter::measure did not run the closure"),
        }
    }

    /// Heap bytes the driver holds now, by the allocator's count over every entry point
    /// of this node (the kernel-client calls tests make on `device` directly excepted).
    pub fn driver_bytes(&self) -> u64 {
        self.driver_bytes.load(Ordering::Relaxed).max(0) as u64
    }

    /// Opens a file handle.
    pub fn open(&self) -> FileId {
        self.in_driver(|| self.device.open())
    }

    /// EvtIoDeviceControl with a request made by the caller (the user library's
    /// in-process backend).
    pub fn dispatch(&self, file: FileId, request: HostRequest, code: u32, input: &[u8]) {
        self.in_driver(|| self.device.dispatch(file, request, code, input));
    }

    /// Issues an IOCTL and returns the request's key; the completion (now or later) is
    /// in the ledger.
    pub fn ioctl(&self, file: FileId, code: u32, input: &[u8], output_len: usize) -> u64 {
        let request = self.platform.request(file_key(file), output_len);
        let key = request.key_value();
        self.dispatch(file, request, code, input);
        key
    }

    /// Issues an IOCTL that must complete at once, and returns its completion.
    pub fn ioctl_now(
        &self,
        file: FileId,
        code: u32,
        input: &[u8],
        output_len: usize,
    ) -> Completion {
        let key = self.ioctl(file, code, input, output_len);
        self.completion(key).unwrap_or(Completion {
            status: ibcm_ioctl::status::PENDING,
            information: 0,
            output: Vec::new(),
        })
    }

    /// How request `key` ended, if it has.
    pub fn completion(&self, key: u64) -> Option<Completion> {
        self.platform.ledger.completion(key)
    }

    /// Cancels a pending request (the I/O manager's cancel routine, which runs at
    /// DISPATCH_LEVEL).
    pub fn cancel(&self, file: FileId, key: u64) {
        self.platform.ledger.cancel_requested(key);
        self.in_driver(|| at_dispatch(&self.platform.ledger, || self.device.cancel(file, key)));
    }

    /// Closes a file handle (cleanup + close) and checks that every request of the file
    /// was completed and no endpoint is left.
    pub fn close(&self, file: FileId) {
        let left = self.in_driver(|| {
            self.device.cleanup(file);
            let left = self.device.endpoint_count(file);
            self.device.close(file);
            left
        });
        self.platform.ledger.account_file(file_key(file));
        if left != 0 {
            self.platform
                .ledger
                .violate(Violation::EndpointLeak { count: left });
        }
    }

    /// A MAD arrives from `src` (DISPATCH_LEVEL).
    pub fn receive(&self, src: &MadAddress, mad: &[u8]) {
        self.in_driver(|| at_dispatch(&self.platform.ledger, || self.device.receive(src, mad)));
    }

    /// MADs arrive together, as one QP1 completion pass hands them up (DISPATCH_LEVEL).
    pub fn receive_batch<'a, I>(&self, mads: I)
    where
        I: IntoIterator<Item = (&'a MadAddress, &'a [u8])>,
        I::IntoIter: Clone,
    {
        self.in_driver(|| at_dispatch(&self.platform.ledger, || self.device.receive_batch(mads)));
    }

    /// The timer DPC (DISPATCH_LEVEL).
    pub fn fire_timer(&self) {
        // One-shot, as a WDFTIMER: firing disarms it, and the device must arm it again.
        self.platform.disarm_timer();
        self.in_driver(|| at_dispatch(&self.platform.ledger, || self.device.timer_expired()));
    }

    /// Runs the PASSIVE_LEVEL work a DISPATCH_LEVEL path asked for, if it did (a work
    /// item on Windows).
    pub fn run_passive_work(&self) {
        if self.platform.take_passive_work() {
            self.in_driver(|| self.device.passive_work());
        }
    }

    /// Every rule broken so far.
    pub fn violations(&self) -> Vec<Violation> {
        self.platform.ledger.violations()
    }

    /// A request of this node (for tests that drive the device directly).
    pub fn request(&self, file: FileId, output_len: usize) -> HostRequest {
        self.platform.request(file_key(file), output_len)
    }
}

/// The ledger key of a file.
pub fn file_key(file: FileId) -> u64 {
    file.raw()
}
