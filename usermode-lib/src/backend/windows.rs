//! The Windows backend: the installed ibcm driver through Win32. All of the library's
//! `unsafe` is in this module.
//!
//! The device is the driver's control device, `\\.\ibcm` (`ibcm_ioctl::DEVICE_PATH`), opened with
//! `FILE_FLAG_OVERLAPPED`, and bound to a private I/O completion port. Every IOCTL is a
//! `DeviceIoControl` with its own heap-allocated `OVERLAPPED` (the first field of an
//! [`Op`]); one thread dequeues completions and hands each to its request's callback.
//! Windows only: CI type-checks it against the real Windows std and windows-sys from
//! Linux (`.ci/windows-check`).

use std::ptr;
use std::thread::JoinHandle;

use windows_sys::Win32::Foundation::{
    CloseHandle, ERROR_IO_PENDING, GENERIC_READ, GENERIC_WRITE, GetLastError, HANDLE,
    INVALID_HANDLE_VALUE,
};
use windows_sys::Win32::Storage::FileSystem::{
    CreateFileW, FILE_FLAG_OVERLAPPED, FILE_SHARE_READ, FILE_SHARE_WRITE, OPEN_EXISTING,
};
use windows_sys::Win32::System::IO::{
    CancelIoEx, CreateIoCompletionPort, DeviceIoControl, GetQueuedCompletionStatus, OVERLAPPED,
    PostQueuedCompletionStatus,
};

use super::{Backend, OnComplete};

/// `INFINITE` for GetQueuedCompletionStatus.
const INFINITE: u32 = u32::MAX;
/// Completion key of the packet that stops the completion thread.
const QUIT_KEY: usize = 1;
/// STATUS_INVALID_HANDLE, for a request that could not even be issued.
const STATUS_INVALID_HANDLE: i32 = ibcm_ioctl::status::INVALID_HANDLE;

/// One IOCTL in flight. `#[repr(C)]` with the OVERLAPPED first, so the pointer the
/// completion port returns is the pointer to the whole `Op`.
#[repr(C)]
struct Op {
    overlapped: OVERLAPPED,
    input: Vec<u8>,
    output: Vec<u8>,
    on_complete: OnComplete,
}

/// A raw pointer that may cross to the completion thread.
struct SendHandle(HANDLE);
// SAFETY: an I/O completion port handle may be used from any thread.
unsafe impl Send for SendHandle {}

/// The open device: file handle, completion port and completion thread.
pub struct Device {
    file: HANDLE,
    port: HANDLE,
    thread: Option<JoinHandle<()>>,
}

// SAFETY: file and completion-port handles may be used from any thread; the Ops they
// refer to are owned by the kernel between DeviceIoControl and their dequeue.
unsafe impl Send for Device {}
// SAFETY: as above; `submit` and `cancel` take `&self` and touch no shared Rust state.
unsafe impl Sync for Device {}

impl Device {
    /// Opens the control device (`ibcm_ioctl::DEVICE_PATH`).
    pub fn open() -> Result<Self, i32> {
        let path = device_path();
        // SAFETY: 1. `path` is a NUL-terminated UTF-16 string that outlives the call;
        // 2. null security attributes and template are allowed.
        let file = unsafe {
            CreateFileW(
                path.as_ptr(),
                GENERIC_READ | GENERIC_WRITE,
                FILE_SHARE_READ | FILE_SHARE_WRITE,
                ptr::null(),
                OPEN_EXISTING,
                FILE_FLAG_OVERLAPPED,
                ptr::null_mut(),
            )
        };
        if file == INVALID_HANDLE_VALUE {
            return Err(ibcm_ioctl::status::DEVICE_REMOVED);
        }
        // SAFETY: `file` is a valid overlapped handle; a null existing port creates one.
        let port = unsafe { CreateIoCompletionPort(file, ptr::null_mut(), 0, 1) };
        if port.is_null() {
            // SAFETY: `file` is open and owned here.
            unsafe { CloseHandle(file) };
            return Err(ibcm_ioctl::status::INSUFFICIENT_RESOURCES);
        }
        let p = SendHandle(port);
        let thread = std::thread::Builder::new()
            .name("ibcm-completions".into())
            .spawn(move || completion_loop(p))
            .ok();
        Ok(Self { file, port, thread })
    }
}

/// Dequeues completions until the quit packet.
fn completion_loop(port: SendHandle) {
    loop {
        let mut bytes = 0u32;
        let mut key = 0usize;
        let mut ov: *mut OVERLAPPED = ptr::null_mut();
        // SAFETY: `port` stays open until the quit packet has been dequeued (Drop joins
        // this thread before closing it); the out-pointers are valid locals.
        let ok =
            unsafe { GetQueuedCompletionStatus(port.0, &mut bytes, &mut key, &mut ov, INFINITE) };
        if key == QUIT_KEY && ov.is_null() {
            return;
        }
        if ov.is_null() {
            if ok == 0 {
                return;
            }
            continue;
        }
        // SAFETY: 1. every OVERLAPPED queued on this port is the first field of an `Op`
        // leaked by `submit` with Box::into_raw; 2. the kernel is done with it once its
        // packet is dequeued, so ownership returns here exactly once.
        let op = unsafe { Box::from_raw(ov.cast::<Op>()) };
        let status = op.overlapped.Internal as i32;
        let len = (bytes as usize).min(op.output.len());
        let Op {
            mut output,
            on_complete,
            ..
        } = *op;
        output.truncate(len);
        on_complete.completed(status, output);
    }
}

/// The control device's path (`ibcm_ioctl::DEVICE_PATH`), NUL-terminated UTF-16. The
/// driver has one control device for the host, whatever the number of HCAs; a control
/// device has no device interface, so it is opened by its symbolic link.
fn device_path() -> Vec<u16> {
    ibcm_ioctl::DEVICE_PATH.encode_utf16().chain([0]).collect()
}

impl Backend for Device {
    fn submit(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        mut buffer: Vec<u8>,
        on_complete: OnComplete,
    ) -> u64 {
        buffer.clear();
        buffer.resize(output_len, 0);
        let op = Box::new(Op {
            // SAFETY: OVERLAPPED is plain data; all-zero is its documented initial state.
            overlapped: unsafe { std::mem::zeroed() },
            input: input.to_vec(),
            output: buffer,
            on_complete,
        });
        let raw = Box::into_raw(op);
        let (in_ptr, in_len, out_ptr, out_len, ov) = {
            // SAFETY: `raw` was just leaked from a Box: live and not shared yet.
            let op = unsafe { &mut *raw };
            (
                op.input.as_ptr(),
                op.input.len() as u32,
                op.output.as_mut_ptr(),
                op.output.len() as u32,
                ptr::addr_of_mut!(op.overlapped),
            )
        };
        // SAFETY: 1. the buffers and the OVERLAPPED belong to the leaked Op, which stays
        // alive until the completion thread reclaims it; 2. `self.file` is open; 3. the
        // OVERLAPPED is the Op's first field, so the port hands back `raw` itself.
        let ok = unsafe {
            DeviceIoControl(
                self.file,
                code,
                in_ptr.cast(),
                in_len,
                out_ptr.cast(),
                out_len,
                ptr::null_mut(),
                ov,
            )
        };
        // SAFETY: reading the thread's last-error value has no preconditions.
        let pending = ok != 0 || unsafe { GetLastError() } == ERROR_IO_PENDING;
        if !pending {
            // Failed before it was queued: no packet will come; complete it here.
            // SAFETY: the kernel never took ownership of `raw`; reclaim it once.
            let op = unsafe { Box::from_raw(raw) };
            let status = if op.overlapped.Internal != 0 {
                op.overlapped.Internal as i32
            } else {
                STATUS_INVALID_HANDLE
            };
            op.on_complete.completed(status, Vec::new());
        }
        raw as u64
    }

    fn cancel(&self, key: u64) {
        // SAFETY: CancelIoEx only uses the pointer as a key to match the file's pending
        // requests; it does not dereference a request that has already completed.
        unsafe { CancelIoEx(self.file, key as usize as *const OVERLAPPED) };
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: each handle is owned here and closed once; closing the file cancels its
        // requests, whose packets reach the port before the quit packet posted after.
        unsafe { CloseHandle(self.file) };
        // SAFETY: `self.port` is open until the thread has quit.
        unsafe { PostQueuedCompletionStatus(self.port, 0, QUIT_KEY, ptr::null()) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: the completion thread has exited; nothing uses the port any more.
        unsafe { CloseHandle(self.port) };
    }
}
