//! The dispatch layer's trace points, beside the engine's (`ibcm_cep::TracePoint`): the
//! platform implements [`DispatchTracer`] on one `static` and hands it out with
//! [`Platform::tracer`](crate::Platform::tracer); the device installs it on its engine too.
//! Called under the device lock (DISPATCH_LEVEL in the kernel): never block or allocate.

use ibcm_cep::{Level, Tracer};

use crate::device::FileId;
use crate::records::Status;

/// One dispatch-layer trace point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchPoint {
    /// An IOCTL was refused: nothing changed (design.md, "every malformed input completes
    /// with a precise NTSTATUS").
    IoctlFailed {
        /// The handle it came on.
        file: FileId,
        /// The IOCTL code.
        code: u32,
        /// The NTSTATUS it completed with.
        status: Status,
    },
    /// A pending request was cancelled (CancelIoEx, or the I/O manager).
    Cancelled {
        /// The handle.
        file: FileId,
    },
    /// IRP_MJ_CLEANUP destroyed a handle's endpoints.
    Cleanup {
        /// The handle.
        file: FileId,
        /// Endpoints destroyed.
        endpoints: u32,
    },
    /// The HCA is gone: every endpoint was told.
    Removed {
        /// Open handles.
        files: u32,
    },
    /// The event-record pool was short at DISPATCH_LEVEL (consumers read no events while
    /// many queued): received MADs were dropped (the peer retries), or a timer pass was
    /// deferred, until PASSIVE_LEVEL work grows the pool.
    NoRoom {
        /// MADs dropped (0 for a deferred timer pass).
        dropped: u32,
        /// Records queued on endpoints.
        queued: u32,
    },
}

impl DispatchPoint {
    /// The point's level.
    pub fn level(&self) -> Level {
        match self {
            Self::Removed { .. } | Self::NoRoom { .. } => Level::Warn,
            Self::Cleanup { endpoints: 1.., .. } => Level::Info,
            Self::Cleanup { .. } | Self::IoctlFailed { .. } | Self::Cancelled { .. } => {
                Level::Debug
            }
        }
    }
}

/// Where the engine's and the dispatch layer's trace points go.
pub trait DispatchTracer: Tracer {
    /// Records one dispatch-layer point.
    fn dispatch(&self, point: &DispatchPoint);
}

/// The device's tracer, if the platform has one.
#[derive(Clone, Copy, Default)]
pub(crate) struct DispatchHook(Option<&'static dyn DispatchTracer>);

impl DispatchHook {
    pub(crate) fn new(tracer: Option<&'static dyn DispatchTracer>) -> Self {
        Self(tracer)
    }

    /// The same sink, for the engine.
    pub(crate) fn engine(self) -> Option<&'static dyn Tracer> {
        self.0.map(|t| t as &'static dyn Tracer)
    }

    #[inline]
    pub(crate) fn point(self, point: DispatchPoint) {
        if let Some(t) = self.0
            && t.enabled(point.level())
        {
            t.dispatch(&point);
        }
    }
}
