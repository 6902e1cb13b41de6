//! A host node: one [`Device`] on a [`HostPlatform`], and the calls a user-mode process
//! or the fabric makes on it, each under the verifier's eye.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use ibcm_cep::{CmConfig, MadAddress, MadOwner};
use ibcm_endpoint::{Caller, Device, FileId};

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
    /// Whether `driver_bytes` is being counted.
    counting: AtomicBool,
    /// Whether the DISPATCH_LEVEL entry points are timed, and their times.
    timing: AtomicBool,
    /// Made when timing starts: three histograms are 48 KB zeroed, which every node
    /// (every process on a real device) would otherwise pay at start.
    dpc_times: Mutex<Option<DpcTimes>>,
}

/// How long the DISPATCH_LEVEL entry points took (what a DPC would hold the CPU for), in
/// ns, less the host's stand-ins (the user library's completion hooks, user-mode work on
/// Windows; the verifier's ledger; the simulated wire's queue); kept when
/// [`Node::time_dpcs`] asks for it.
#[derive(Debug, Clone)]
pub struct DpcTimes {
    /// Receive calls handed a full batch ([`ibcm_endpoint::RECEIVE_BATCH`] MADs).
    pub full_receive_batches: hdrhistogram::Histogram<u64>,
    /// Receive calls handed fewer.
    pub other_receive_batches: hdrhistogram::Histogram<u64>,
    /// Timer passes.
    pub timer_passes: hdrhistogram::Histogram<u64>,
}

impl Default for DpcTimes {
    fn default() -> Self {
        let h = || hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!("3 digits"));
        Self {
            full_receive_batches: h(),
            other_receive_batches: h(),
            timer_passes: h(),
        }
    }
}

impl Node {
    /// A node with `config` at `address`, reading time from `clock`.
    pub fn new(config: CmConfig, address: MadAddress, clock: Arc<Clock>, wake: Arc<Wake>) -> Self {
        let platform = HostPlatform::new(clock, wake);
        platform.set_hca(config.ca_guid, address.port);
        let device = Device::new(platform.clone(), config);
        // The node's one port, as the HCA's PnP would announce it (a simulated node has
        // room for one GID; a port without a LID is a RoCE port, not checked by LID).
        let _ = device.set_port(address.port, address.lid, 0, &[address.gid]);
        Self {
            device,
            platform,
            address,
            driver_bytes: AtomicI64::new(0),
            counting: AtomicBool::new(false),
            timing: AtomicBool::new(false),
            dpc_times: Mutex::new(None),
        }
    }

    /// Starts (or stops) timing the DISPATCH_LEVEL entry points.
    pub fn time_dpcs(&self, on: bool) {
        if on {
            // The harness's memory, not the driver's.
            crate::counting::opt_out(|| {
                self.dpc_times
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert_with(DpcTimes::default);
            });
            crate::platform::TIMING_DPCS.store(true, Ordering::Relaxed);
        }
        self.timing.store(on, Ordering::Relaxed);
    }

    /// The DISPATCH_LEVEL entry points' times so far.
    pub fn dpc_times(&self) -> DpcTimes {
        self.dpc_times
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_default()
    }

    /// Runs a DISPATCH_LEVEL entry point, timing it if asked to (less the host's
    /// stand-ins it ran) into the histogram `which` picks.
    fn dpc<T>(
        &self,
        which: fn(&mut DpcTimes) -> &mut hdrhistogram::Histogram<u64>,
        f: impl FnOnce() -> T,
    ) -> T {
        if !self.timing.load(Ordering::Relaxed) {
            return f();
        }
        let hooks = crate::platform::harness_ns();
        let start = std::time::Instant::now();
        let value = f();
        let ns = (start.elapsed().as_nanos() as u64)
            .saturating_sub(crate::platform::harness_ns().saturating_sub(hooks));
        // The measuring is the harness's, not the driver's (a histogram may grow).
        crate::counting::opt_out(|| {
            let mut t = self
                .dpc_times
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(t) = t.as_mut() {
                let _ = which(t).record(ns.max(1));
            }
        });
        value
    }

    /// Runs a driver entry point, counting what it leaves allocated when asked to
    /// ([`count_driver_bytes`](Self::count_driver_bytes)).
    fn in_driver<T>(&self, f: impl FnOnce() -> T) -> T {
        if !self.counting.load(Ordering::Relaxed) {
            return f();
        }
        let mut value = None;
        let info = crate::counting::measure(|| value = Some(f()));
        self.driver_bytes
            .fetch_add(info.bytes_current, Ordering::Relaxed);
        match value {
            Some(v) => v,
            None => unreachable!("counting::measure did not run the closure"),
        }
    }

    /// Starts counting, with the allocator, what every entry point of this node leaves
    /// allocated (off by default: it costs each entry point a measure). Counts only with
    /// the feature `count-allocations`; without it [`driver_bytes`](Self::driver_bytes)
    /// stays 0.
    pub fn count_driver_bytes(&self) {
        self.counting.store(true, Ordering::Relaxed);
    }

    /// Heap bytes the driver's entry points left allocated since counting started, by the
    /// allocator's count (the kernel-client calls tests make on `device` directly
    /// excepted).
    pub fn driver_bytes(&self) -> u64 {
        self.driver_bytes.load(Ordering::Relaxed).max(0) as u64
    }

    /// Opens a file handle as an administrator (the machine's owner: the CLI, the
    /// in-process library, most tests).
    pub fn open(&self) -> FileId {
        self.open_as(Caller::Administrator)
    }

    /// Opens a file handle as `caller`: two handles opened as [`Caller::User`] are two
    /// users, as two processes of different accounts on Windows (the binding decides at
    /// IRP_MJ_CREATE from the caller's token).
    pub fn open_as(&self, caller: Caller) -> FileId {
        match self.in_driver(|| self.device.open(caller)) {
            Ok(file) => file,
            Err(st) => panic!("the host ran out of memory opening a handle: {st:#x}"),
        }
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

    /// Whose a MAD received on `port` is, by this node's engine: the QP1 steering decision
    /// beside another CM ([`ibcm_cep::CmManager::owner_of`], issue #19), made at
    /// DISPATCH_LEVEL as in the QP1 completion path.
    pub fn owner_of(&self, port: u8, mad: &[u8]) -> MadOwner {
        at_dispatch(&self.platform.ledger, || self.device.owner_of(port, mad))
    }

    /// MADs arrive together, as one QP1 completion pass hands them up (DISPATCH_LEVEL).
    pub fn receive_batch<'a, I>(&self, mads: I)
    where
        I: IntoIterator<Item = (&'a MadAddress, &'a [u8])>,
        I::IntoIter: Clone,
    {
        let mads = mads.into_iter();
        let which: fn(&mut DpcTimes) -> &mut hdrhistogram::Histogram<u64> =
            if mads.clone().count() == ibcm_endpoint::RECEIVE_BATCH {
                |t| &mut t.full_receive_batches
            } else {
                |t| &mut t.other_receive_batches
            };
        self.in_driver(|| {
            at_dispatch(&self.platform.ledger, || {
                self.dpc(which, || self.device.receive_batch(mads))
            })
        });
    }

    /// The timer DPC (DISPATCH_LEVEL).
    pub fn fire_timer(&self) {
        // One-shot, as a WDFTIMER: firing disarms it, and the device must arm it again.
        self.platform.disarm_timer();
        self.in_driver(|| {
            at_dispatch(&self.platform.ledger, || {
                self.dpc(|t| &mut t.timer_passes, || self.device.timer_expired())
            })
        });
    }

    /// Runs the PASSIVE_LEVEL work a DISPATCH_LEVEL path asked for, if it did (a work
    /// item on Windows); returns whether it ran.
    pub fn run_passive_work(&self) -> bool {
        let asked = self.platform.take_passive_work();
        if asked {
            self.in_driver(|| self.device.passive_work());
        }
        asked
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
