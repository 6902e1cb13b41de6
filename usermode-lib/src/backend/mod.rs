//! Where IOCTLs go: the driver through Win32 (Windows), the same dispatch code running
//! in this process on the host platform (everywhere), or that code on a real RDMA device
//! of this machine (Linux, feature `rdma`).

pub mod device;
#[cfg(feature = "in-process")]
pub mod emulated;
#[cfg(feature = "in-process")]
pub mod inproc;
#[cfg(feature = "in-process")]
pub mod local;
#[cfg(all(feature = "rdma", target_os = "linux"))]
pub mod rdma;
#[cfg(windows)]
#[allow(unsafe_code)]
pub mod windows;

pub use ibcm_ioctl::CompletionHook;

/// Told exactly once when a request completes, on whatever thread completes it, with the
/// NTSTATUS and the output bytes written. Shared: the caller's completion slot (or event
/// queue) is itself the hook, so issuing a request allocates nothing to wrap it.
pub type OnComplete = std::sync::Arc<dyn CompletionHook>;

/// An IOCTL transport. Every request completes exactly once, through `on_complete`,
/// possibly before `submit` returns.
pub trait Backend: Send + Sync {
    /// Issues an IOCTL with an output buffer of `output_len` bytes, made in `buffer` (its
    /// contents are dropped; it comes back in the completion, holding the bytes written,
    /// so the caller can reuse it); returns a key for [`cancel`](Self::cancel).
    fn submit(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        buffer: Vec<u8>,
        on_complete: OnComplete,
    ) -> u64;
    /// Issues an IOCTL that the driver completes in its dispatch routine
    /// ([`ibcm_ioctl::may_pend`] is false) and returns its status and output on this thread,
    /// off the completion port: no completion thread wakes for it, and none wakes this
    /// thread, as WinVerbs' blocking calls wait on an event of their own
    /// (core/winverbs/user/wv_base.cpp:56-60, 90-99). A backend without such a path gives
    /// `buffer` back (`Err`), and the request goes through [`submit`](Self::submit).
    fn call(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        buffer: Vec<u8>,
    ) -> Result<(i32, Vec<u8>), Vec<u8>> {
        let _ = (code, input, output_len);
        Err(buffer)
    }
    /// Cancels a pending request (`CancelIoEx`); it completes with STATUS_CANCELLED unless
    /// it already completed.
    fn cancel(&self, key: u64);
    /// Closes the handle now (IRP_MJ_CLEANUP + IRP_MJ_CLOSE), whoever still holds the
    /// provider: every pending request completes with STATUS_CANCELLED and later requests
    /// fail with STATUS_INVALID_HANDLE. Dropping the backend closes it if this was not
    /// called. A backend that cannot close early does nothing here.
    fn close(&self) {}
    /// Whether the handle was closed (by [`close`](Self::close), or because the backend
    /// failed): every request now fails, and none is worth retrying.
    fn is_closed(&self) -> bool {
        false
    }
}
