//! The Windows backend's Win32 calls: the installed ibcm driver. All of the library's
//! `unsafe` is in this module; the logic around these calls (request table, cancel keys,
//! completion thread, close and drop, status mapping) is `backend::device`, tested off
//! Windows over `backend::emulated`.
//!
//! The device is the driver's control device, `\\.\ibcm` (`ibcm_ioctl::DEVICE_PATH`), opened
//! with `FILE_FLAG_OVERLAPPED` and bound to a private I/O completion port. Every IOCTL is
//! a `DeviceIoControl` with its own heap-allocated `OVERLAPPED` (the first field of a
//! [`Block`]): completed through the port, or (`Notify::Event`, an IOCTL the driver
//! completes in its dispatch routine) through the calling thread's event alone, with its
//! low bit set so that no packet is queued, as WinVerbs' blocking calls
//! (core/winverbs/user/wv_base.cpp:56-60, 90-99). Windows only: CI type-checks it against
//! the real Windows std and windows-sys from Linux (`.ci/windows-check`).

use std::ptr::{self, NonNull};

use windows_sys::Win32::Foundation::{
    CloseHandle, GENERIC_READ, GENERIC_WRITE, GetLastError, HANDLE, INVALID_HANDLE_VALUE,
    WAIT_OBJECT_0,
};
use windows_sys::Win32::Storage::FileSystem::{
    CreateFileW, FILE_FLAG_OVERLAPPED, FILE_SHARE_READ, FILE_SHARE_WRITE, OPEN_EXISTING,
};
use windows_sys::Win32::System::IO::{
    CancelIoEx, CreateIoCompletionPort, DeviceIoControl, GetQueuedCompletionStatus, OVERLAPPED,
    PostQueuedCompletionStatus,
};
use windows_sys::Win32::System::Threading::{CreateEventW, SetEvent, WaitForSingleObject};

use super::device::{self, Dequeued, Issue, Notify, Win32};

/// `INFINITE` for GetQueuedCompletionStatus and WaitForSingleObject.
const INFINITE: u32 = u32::MAX;
/// Completion key of the packet that stops the completion thread (the file's own packets
/// carry key 0).
const QUIT_KEY: usize = 1;

/// The open installed driver.
pub type Device = device::Device<Sys>;

/// A thread's event for its `Notify::Event` requests (WinVerbs keeps one per object,
/// wv_base.cpp:56-60), made when first needed and closed when the thread ends. Auto-reset,
/// as WinVerbs' (Microsoft suggests manual-reset for an event several waiters share; this
/// one has a single waiter, its thread, and DeviceIoControl resets it as each request
/// starts).
struct ThreadEvent(std::cell::Cell<HANDLE>);

impl ThreadEvent {
    /// The event, made now if it was not (null if CreateEventW fails: tried again next
    /// time).
    fn get(&self) -> HANDLE {
        if self.0.get().is_null() {
            // SAFETY: null security attributes and name are allowed; auto-reset, not
            // signalled.
            self.0
                .set(unsafe { CreateEventW(ptr::null(), 0, 0, ptr::null()) });
        }
        self.0.get()
    }
}

impl Drop for ThreadEvent {
    fn drop(&mut self) {
        let event = self.0.get();
        if !event.is_null() {
            // SAFETY: the event is owned here; no request of this thread still waits on it
            // (each is finished before the call that issued it returns).
            unsafe { CloseHandle(event) };
        }
    }
}

thread_local! {
    static EVENT: ThreadEvent = const { ThreadEvent(std::cell::Cell::new(ptr::null_mut())) };
}

/// Opens the control device (`ibcm_ioctl::DEVICE_PATH`): the NTSTATUS of a failure
/// (STATUS_OBJECT_NAME_NOT_FOUND when the driver is not installed or not started,
/// STATUS_ACCESS_DENIED, ...; see [`device::status_from_win32`]).
pub fn open() -> Result<Device, i32> {
    Device::new(Sys::open()?)
}

/// One IOCTL in flight. `#[repr(C)]` with the OVERLAPPED first, so the pointer the
/// completion port returns is the pointer to the whole block.
#[repr(C)]
struct Block {
    overlapped: OVERLAPPED,
    key: u64,
    input: Vec<u8>,
    output: Vec<u8>,
}

/// A [`Block`] leaked while the kernel may use it: reclaimed exactly once, by
/// [`Sys::reclaim`], which `device` calls only when the kernel is done with it.
pub struct Request(NonNull<Block>);

// SAFETY: the block is plain heap memory owned by whoever holds the Request (the
// kernel's use of it is the Win32 contract, not a thread's).
unsafe impl Send for Request {}

/// The file handle and its completion port.
pub struct Sys {
    file: HANDLE,
    port: HANDLE,
}

// SAFETY: file and completion-port handles may be used from any thread.
unsafe impl Send for Sys {}
// SAFETY: as above; every method takes `&self` and touches no Rust state of its own.
unsafe impl Sync for Sys {}

impl Sys {
    /// CreateFileW on the control device and CreateIoCompletionPort.
    fn open() -> Result<Self, i32> {
        let path: Vec<u16> = ibcm_ioctl::DEVICE_PATH.encode_utf16().chain([0]).collect();
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
            // SAFETY: reading the thread's last-error value has no preconditions.
            return Err(device::status_from_win32(unsafe { GetLastError() }));
        }
        // SAFETY: `file` is a valid overlapped handle; a null existing port creates one.
        let port = unsafe { CreateIoCompletionPort(file, ptr::null_mut(), 0, 1) };
        if port.is_null() {
            // SAFETY: reading the thread's last-error value has no preconditions.
            let error = unsafe { GetLastError() };
            // SAFETY: `file` is open and owned here.
            unsafe { CloseHandle(file) };
            return Err(device::status_from_win32(error));
        }
        Ok(Self { file, port })
    }
}

impl Win32 for Sys {
    type Request = Request;

    fn device_io_control(
        &self,
        key: u64,
        code: u32,
        input: &[u8],
        mut output: Vec<u8>,
        output_len: usize,
        notify: Notify,
    ) -> (Request, Issue) {
        // Windows is given initialised bytes (the I/O manager copies back those the driver
        // wrote, METHOD_BUFFERED).
        output.resize(output_len, 0);
        // SAFETY: OVERLAPPED is plain data; all-zero is its documented initial state.
        let mut overlapped: OVERLAPPED = unsafe { std::mem::zeroed() };
        if notify == Notify::Event {
            // `device` asks for an event only once `has_thread_event` said there is one;
            // the low bit keeps the completion off the port.
            let event = EVENT.try_with(ThreadEvent::get).unwrap_or(ptr::null_mut());
            overlapped.hEvent = (event as usize | 1) as HANDLE;
        }
        let block = Box::new(Block {
            overlapped,
            key,
            input: input.to_vec(),
            output,
        });
        let raw = NonNull::from(Box::leak(block));
        let (in_ptr, in_len, out_ptr, out_len, ov, internal) = {
            // SAFETY: `raw` was just leaked from a Box: live and not shared yet.
            let b = unsafe { &mut *raw.as_ptr() };
            (
                b.input.as_ptr(),
                b.input.len() as u32,
                b.output.as_mut_ptr(),
                b.output.len() as u32,
                ptr::addr_of_mut!(b.overlapped),
                ptr::addr_of!(b.overlapped.Internal),
            )
        };
        // SAFETY: 1. the buffers and the OVERLAPPED belong to the leaked block, which
        // stays alive until `reclaim`; 2. `self.file` is open (`device` calls this under
        // the lock that `close_file` takes, never after it); 3. the OVERLAPPED is the
        // block's first field, so the port hands back the block's own address.
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
        let last_error = if ok == 0 {
            // SAFETY: reading the thread's last-error value has no preconditions.
            unsafe { GetLastError() }
        } else {
            0
        };
        // SAFETY: the OVERLAPPED is live (the block is not reclaimed); a volatile read, as
        // the kernel may be writing it for a request that is pending.
        let internal = unsafe { ptr::read_volatile(internal) } as i32;
        (
            Request(raw),
            Issue {
                returned: ok != 0,
                last_error,
                internal,
            },
        )
    }

    fn overlapped_address(request: &Request) -> usize {
        request.0.as_ptr() as usize
    }

    fn cancel_io(&self, overlapped: usize) {
        // SAFETY: CancelIoEx only compares the pointer with the file's pending requests;
        // `device` passes the address of a block it has not reclaimed.
        unsafe { CancelIoEx(self.file, overlapped as *const OVERLAPPED) };
    }

    fn dequeue(&self) -> Dequeued {
        let mut bytes = 0u32;
        let mut key = 0usize;
        let mut ov: *mut OVERLAPPED = ptr::null_mut();
        // SAFETY: `self.port` is open while `self` lives (closed in Drop); the
        // out-pointers are valid locals.
        let ok = unsafe {
            GetQueuedCompletionStatus(self.port, &mut bytes, &mut key, &mut ov, INFINITE)
        };
        if ov.is_null() {
            if ok != 0 && key == QUIT_KEY {
                return Dequeued::Quit;
            }
            // SAFETY: reading the thread's last-error value has no preconditions.
            return Dequeued::Failed(unsafe { GetLastError() });
        }
        // SAFETY: every OVERLAPPED queued on this private port is the first field of a
        // Block that `device` has not reclaimed (it reclaims one only after dequeuing its
        // packet), so the block is live; the kernel is done with it.
        let key = unsafe { (*ov.cast::<Block>()).key };
        Dequeued::Packet { key, bytes }
    }

    fn has_thread_event(&self) -> bool {
        EVENT.try_with(|e| !e.get().is_null()).unwrap_or(false)
    }

    fn finish(&self, request: Request) -> (i32, Vec<u8>) {
        let raw = request.0.as_ptr();
        // SAFETY: the block is live until `reclaim` below; `Internal` is read volatile, as
        // the kernel writes it when the request completes.
        let internal = unsafe { ptr::addr_of!((*raw).overlapped.Internal) };
        // SAFETY: as above; `hEvent` was set by `device_io_control` and is not written since.
        let event = (unsafe { (*raw).overlapped.hEvent } as usize & !1) as HANDLE;
        // HasOverlappedIoCompleted: `Internal` leaves STATUS_PENDING when the request
        // completes, and the event is set after it. (KMDF returns STATUS_PENDING from
        // the dispatch routine for every request it queues, so on Windows this wait comes
        // even for a request the driver completed at once; it then returns at once.) The
        // wait is on the thread's event, not on the file handle, which another thread may
        // have closed meanwhile (its cleanup completes the request).
        // SAFETY: the read is of the live block's OVERLAPPED.
        while unsafe { ptr::read_volatile(internal) } as i32 == ibcm_ioctl::status::PENDING {
            // SAFETY: `event` is this thread's event, open while the thread lives.
            if unsafe { WaitForSingleObject(event, INFINITE) } != WAIT_OBJECT_0 {
                // The wait failed with the request still pending: the kernel may still
                // write the block, so it is left to it, never freed.
                std::mem::forget(request);
                return (crate::error::STATUS_INTERNAL_ERROR, Vec::new());
            }
        }
        // SAFETY: the request completed, so the kernel is done with the block.
        let written = unsafe { (*raw).overlapped.InternalHigh };
        let (st, mut output) = self.reclaim(request);
        output.truncate(written);
        (st, output)
    }

    fn reclaim(&self, request: Request) -> (i32, Vec<u8>) {
        // SAFETY: the block was leaked by `device_io_control` and `device` hands each
        // Request back once, after the kernel is done with it: ownership returns here.
        let block = unsafe { Box::from_raw(request.0.as_ptr()) };
        (block.overlapped.Internal as i32, block.output)
    }

    fn close_file(&self) {
        // SAFETY: the file handle is owned here and `device` closes it once.
        unsafe { CloseHandle(self.file) };
    }

    fn post_quit(&self) {
        // SAFETY: `self.port` is open while `self` lives.
        unsafe { PostQueuedCompletionStatus(self.port, 0, QUIT_KEY, ptr::null()) };
    }
}

impl Drop for Sys {
    fn drop(&mut self) {
        // SAFETY: the port is owned here; its last user (the completion thread, or the
        // device) is letting go of it.
        unsafe { CloseHandle(self.port) };
    }
}

/// A caller's completion port, key and OVERLAPPED (see [`overlapped_on`]).
struct CallerOverlapped {
    port: HANDLE,
    key: usize,
    overlapped: *mut OVERLAPPED,
}

// SAFETY: the port is usable from any thread, and `overlapped_on`'s caller keeps the
// OVERLAPPED valid and unused by anyone else until the operation completes on it.
unsafe impl Send for CallerOverlapped {}

impl CallerOverlapped {
    /// Completes the caller's OVERLAPPED: STATUS_SUCCESS and 0 bytes, its event set, and
    /// (unless `hEvent` has its low bit set) it is posted to the caller's port.
    fn complete(self) {
        // SAFETY: `overlapped_on`'s contract: valid, and nobody else's until now.
        let o = unsafe { &mut *self.overlapped };
        o.Internal = ibcm_ioctl::status::SUCCESS as usize;
        o.InternalHigh = 0;
        let (event, post) = device::caller_completion(o.hEvent as usize);
        if event != 0 {
            // SAFETY: an event handle of the caller's, open until it sees the completion.
            unsafe { SetEvent(event as HANDLE) };
        }
        if post && !self.port.is_null() {
            // SAFETY: the caller's port is open; the OVERLAPPED pointer is only carried
            // in the packet (the caller owns it again once it dequeues the packet).
            unsafe { PostQueuedCompletionStatus(self.port, 0, self.key, self.overlapped) };
        }
    }
}

/// An [`Overlapped`](crate::Overlapped) for [`spawn`](crate::spawn) that completes on the
/// caller's own I/O completion port with the caller's own OVERLAPPED, as I/O on a handle
/// bound to that port does (the model of WinVerbs and NetworkDirect consumers): when the
/// operation finishes, `Internal` is STATUS_SUCCESS and `InternalHigh` 0, the event in
/// `hEvent` (if any) is set, and, unless `hEvent` has its low bit set, `overlapped` is
/// posted to `port` (if not null) with `key`. The operation's result is taken from the
/// returned `Overlapped` (`result::<T>()`).
///
/// # Safety
///
/// `port` must be a completion port (or null) and `hEvent` an event (or null) that stay
/// open until the operation finishes; `overlapped` must point to an OVERLAPPED that stays
/// valid, and that nothing else reads or writes, until then (until its packet is dequeued
/// or its event is set).
pub unsafe fn overlapped_on(
    port: HANDLE,
    key: usize,
    overlapped: *mut OVERLAPPED,
) -> crate::Overlapped {
    let target = CallerOverlapped {
        port,
        key,
        overlapped,
    };
    crate::Overlapped::with_notify(move || target.complete())
}
