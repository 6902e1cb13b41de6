//! STATUS: the platform's HCAs and ports (`Platform::fabric_status`), asked with no lock of
//! the dispatch layer held (the platform takes its own), after the same checks as every
//! record: the VERSION handshake, the input's size and reserved field, the output's room.

use ibcm_ioctl::{StatusIn, StatusOut, status};
use zerocopy::FromZeros;

use crate::platform::Platform;
use crate::records::Status;

use super::Device;
use super::ioctl::{check_reserved, input, output};

impl<P: Platform> Device<P> {
    /// One STATUS request: completed before this returns.
    pub(super) fn status(&self, file: super::FileId, mut request: P::Request, bytes: &[u8]) {
        let checked = self.run(|i| -> Result<(), Status> {
            if i.removed {
                return Err(status::DEVICE_REMOVED);
            }
            let f = i.file(file)?;
            // After IRP_MJ_CLEANUP, as every other IOCTL (Device::dispatch).
            if f.closed {
                return Err(status::FILE_CLOSED);
            }
            if !f.versioned {
                return Err(status::INVALID_DEVICE_STATE);
            }
            let s: StatusIn = input(bytes, StatusIn::SIZE)?;
            check_reserved(s.reserved == 0)
        });
        let outcome = checked.and_then(|()| {
            let mut out = StatusOut::new_zeroed();
            out.size = StatusOut::SIZE;
            self.platform.fabric_status(&mut out);
            out.size = StatusOut::SIZE;
            output(&mut request, &out)
        });
        match outcome {
            Ok(n) => self.platform.complete(request, status::SUCCESS, n),
            Err(st) => self.platform.complete(request, st, 0),
        }
    }
}
