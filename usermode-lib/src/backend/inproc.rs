//! The in-process backend: the exact IOCTL byte records go to `driver/endpoint` running on
//! the host platform in this process, so what is tested here is what crosses the kernel
//! boundary on Windows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ibcm_endpoint::FileId;
use ibcm_host::Node;

use super::{Backend, OnComplete};

/// One open of a host node's device.
pub struct InProcess {
    node: Arc<Node>,
    file: FileId,
    closed: AtomicBool,
}

impl InProcess {
    /// Opens `node`'s device (IRP_MJ_CREATE).
    pub fn open(node: Arc<Node>) -> Self {
        let file = node.open();
        Self {
            node,
            file,
            closed: AtomicBool::new(false),
        }
    }
}

impl Backend for InProcess {
    fn submit(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        buffer: Vec<u8>,
        on_complete: OnComplete,
    ) -> u64 {
        if self.closed.load(Ordering::Acquire) {
            on_complete.completed(ibcm_ioctl::status::INVALID_HANDLE, Vec::new());
            return 0;
        }
        let request = self.node.platform.request_with_hook(
            ibcm_host::file_key(self.file),
            buffer,
            output_len,
            on_complete,
        );
        let key = request.key_value();
        self.node.dispatch(self.file, request, code, input);
        key
    }

    fn cancel(&self, key: u64) {
        if !self.closed.load(Ordering::Acquire) {
            self.node.cancel(self.file, key);
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn close(&self) {
        // IRP_MJ_CLEANUP + IRP_MJ_CLOSE: everything outstanding completes.
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.node.close(self.file);
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.close();
    }
}
