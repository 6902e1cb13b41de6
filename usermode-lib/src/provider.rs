//! A provider: one open handle to the ibcm device.

use std::sync::Arc;

use ibcm_ioctl::{
    ABI_VERSION, CountersIn, CountersOut, StatusIn, StatusOut, VersionIn, VersionOut, code, status,
};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::backend::Backend;
use crate::backend::CompletionHook;
use crate::channel::Channel;
use crate::completion::{Ioctl, Slot, SlotFuture, blocking, output_buffer, recycle_buffer};
use crate::error::{Error, Result};

/// An open handle to the ibcm device (`IWVProvider`, `IND2Adapter`): endpoints are created
/// from it and belong to it; dropping the last clone closes the handle, which destroys
/// whatever endpoints remain and completes their pending requests.
#[derive(Clone)]
pub struct Provider(Arc<Shared>);

struct Shared {
    backend: Arc<dyn Backend>,
    /// Every endpoint's events come through it.
    channel: Arc<Channel>,
}

impl Provider {
    /// A provider over a backend: performs the version handshake.
    pub fn with_backend(backend: Arc<dyn Backend>) -> Result<Self> {
        let channel = Channel::new(Arc::downgrade(&backend));
        let p = Self(Arc::new(Shared { backend, channel }));
        let v = VersionIn {
            size: VersionIn::SIZE,
            abi_version: ABI_VERSION,
        };
        // A driver whose answer is not a VersionOut speaks another ABI.
        let out = blocking("open", || {
            p.ioctl(
                "open",
                code::VERSION,
                v.as_bytes(),
                VersionOut::SIZE as usize,
            )
        })?;
        let got = VersionOut::read_from_bytes(&out)
            .map_err(|_| Error::new("open", status::REVISION_MISMATCH))?;
        if got.abi_version != ABI_VERSION {
            return Err(Error::new("open", status::REVISION_MISMATCH));
        }
        Ok(p)
    }

    /// A provider on a node of the simulated fabric in this process (feature `in-process`).
    #[cfg(feature = "in-process")]
    pub fn in_process(node: Arc<ibcm_host::Node>) -> Result<Self> {
        Self::with_backend(Arc::new(crate::backend::inproc::InProcess::open(node)))
    }

    /// A provider on a real RDMA device of this machine (Linux, feature `rdma`): a handle
    /// of `device`, the driver running on the device's QP1 through ib_umad
    /// ([`backend::rdma`](crate::backend::rdma)).
    #[cfg(all(feature = "rdma", target_os = "linux"))]
    pub fn open_rdma(device: &Arc<crate::backend::rdma::Device>) -> Result<Self> {
        let handle = crate::backend::rdma::open(device).map_err(|st| Error::new("open", st))?;
        Self::with_backend(Arc::new(handle))
    }

    /// Opens the installed ibcm driver (its control device, `\\.\ibcm`). Fails with
    /// STATUS_OBJECT_NAME_NOT_FOUND when the driver is not installed or not started, and
    /// STATUS_ACCESS_DENIED when this account may not open it.
    #[cfg(windows)]
    pub fn open() -> Result<Self> {
        let backend = crate::backend::windows::open().map_err(|st| Error::new("open", st))?;
        Self::with_backend(Arc::new(backend))
    }

    /// Closes the handle now, whoever still holds clones of the provider or endpoints
    /// made from it (`CloseHandle`): the driver destroys every endpoint of the handle and
    /// completes every pending request, so every operation still waiting fails with
    /// STATUS_CANCELLED; later operations fail with STATUS_INVALID_HANDLE.
    pub fn close(&self) {
        self.0.backend.close();
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.0.backend
    }

    pub(crate) fn channel(&self) -> &Arc<Channel> {
        &self.0.channel
    }

    /// Issues an IOCTL; awaiting it gives its output, or an [`Error`] naming `operation`.
    pub(crate) fn ioctl(
        &self,
        operation: &'static str,
        code: u32,
        input: &[u8],
        output_len: usize,
    ) -> Ioctl {
        let slot = Slot::new();
        let mut buffer = output_buffer(output_len);
        // A request the driver completes in its dispatch routine is waited for here,
        // off the completion port, where the backend can: no thread switch on the way in
        // or out.
        if !ibcm_ioctl::may_pend(code, output_len) {
            match self.backend().call(code, input, output_len, buffer) {
                Ok((st, output)) => {
                    Arc::clone(&slot).completed(st, output);
                    return Ioctl {
                        slot: SlotFuture(Some(slot)),
                        operation,
                        key: 0,
                    };
                }
                Err(back) => buffer = back,
            }
        }
        let key = self.backend().submit(
            code,
            input,
            output_len,
            buffer,
            Arc::clone(&slot) as Arc<dyn CompletionHook>,
        );
        Ioctl {
            slot: SlotFuture(Some(slot)),
            operation,
            key,
        }
    }

    /// Issues an IOCTL whose output is one `T` record; awaiting it gives the record (the
    /// output buffer is kept for a later request).
    pub(crate) fn ioctl_out<T: FromBytes + IntoBytes + Immutable>(
        &self,
        operation: &'static str,
        code: u32,
        input: &[u8],
    ) -> impl Future<Output = Result<T>> + Send + 'static + use<T> {
        let ioctl = self.ioctl(operation, code, input, core::mem::size_of::<T>());
        async move {
            let out = ioctl.await?;
            let record = T::read_from_bytes(&out)
                .map_err(|_| Error::new(operation, status::INFO_LENGTH_MISMATCH));
            recycle_buffer(out);
            record
        }
    }

    /// The device's message counters (per attribute: sent, received, duplicates, retries).
    pub fn counters(&self) -> Result<CountersOut> {
        let c = CountersIn {
            size: CountersIn::SIZE,
            reserved: 0,
        };
        blocking("counters", || {
            self.ioctl_out("counters", code::COUNTERS, c.as_bytes())
        })
    }

    /// The HCAs and ports the driver serves: which CM answers WinVerbs and ndfltr on each
    /// HCA, and each port's QP1 route (`ibcm status`).
    pub fn status(&self) -> Result<StatusOut> {
        let s = StatusIn {
            size: StatusIn::SIZE,
            reserved: 0,
        };
        blocking("status", || {
            self.ioctl_out("status", code::STATUS, s.as_bytes())
        })
    }
}
