//! Requests: the IRP behind each, its buffers, completion, cancellation.

use crate::io::RequestInfo;
use crate::objects::Kind;
use crate::state::{self, changed};
use crate::thread::{self, DISPATCH, KernelCode, require_irql};
use crate::verifier::{Rule, bugcheck};
use crate::wdf_device::finish;
use crate::*;

/// Runs `f` on a live, not completed request.
fn with_request<R>(
    request: WDFREQUEST,
    function: &str,
    f: impl FnOnce(&mut RequestInfo) -> R,
) -> R {
    let handle = request as usize;
    let mut guard = state::lock();
    guard.objects.get_kind(handle, Kind::Request, function);
    let Some(info) = guard.io.requests.get_mut(&handle) else {
        drop(guard);
        bugcheck(
            Rule::Simulation,
            format_args!("{function}: request {handle:#x} unknown to the I/O manager"),
        );
    };
    if info.completed {
        drop(guard);
        bugcheck(
            Rule::RequestCompleted,
            format_args!("{function}: WDFREQUEST {handle:#x} is already completed"),
        );
    }
    f(info)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRequestCompleteWithInformation(
    Request: WDFREQUEST,
    Status: NTSTATUS,
    Information: ULONG_PTR,
) {
    let _k = KernelCode::enter();
    require_irql("WdfRequestCompleteWithInformation", DISPATCH);
    if thread::held_locks() > 0 {
        bugcheck(
            Rule::CompleteUnderLock,
            format_args!("request {Request:p} completed with a spin lock held"),
        );
    }
    let handle = Request as usize;
    with_request(Request, "WdfRequestCompleteWithInformation", |r| {
        if r.marked.is_some() && !r.cancel_invoked {
            bugcheck(
                Rule::RequestCompletedCancelable,
                format_args!("WDFREQUEST {handle:#x} completed while still cancelable"),
            );
        }
        let information = Information as usize;
        if information > r.output_len {
            bugcheck(
                Rule::RequestInformation,
                format_args!(
                    "WDFREQUEST {handle:#x} completed with Information {information} > output buffer {}",
                    r.output_len
                ),
            );
        }
        r.completed = true;
        r.marked = None;
        r.result = Some((Status, r.buffer[..information].to_vec()));
        // The I/O manager frees the system buffer and the IRP as the request completes
        // (fxrequest.cpp:742-743: completing "can cause any associated buffers ... to be
        // invalidated"): a pointer the driver kept into either now points at freed heap,
        // which AddressSanitizer reports at its first use.
        r.buffer = Vec::new();
        // SAFETY: plain C structures: all-zero is valid.
        let fresh = Box::new(unsafe { core::mem::zeroed() });
        // A new allocation, so the old block's memory is freed, not reused in place.
        drop(std::mem::replace(&mut r.irp, fresh));
    });
    let mut guard = state::lock();
    let file = guard.io.requests.get(&handle).map_or(0, |r| r.file);
    if let Some(f) = guard.io.files.get_mut(&file) {
        f.outstanding = f.outstanding.saturating_sub(1);
        if f.port_bound {
            guard.io.port.push_back(handle);
        }
    }
    guard.objects.begin_delete(handle);
    drop(guard);
    finish(handle);
    changed();
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRequestGetFileObject(Request: WDFREQUEST) -> WDFFILEOBJECT {
    let _k = KernelCode::enter();
    require_irql("WdfRequestGetFileObject", DISPATCH);
    with_request(Request, "WdfRequestGetFileObject", |r| {
        r.file as WDFFILEOBJECT
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRequestGetIoQueue(Request: WDFREQUEST) -> WDFQUEUE {
    let _k = KernelCode::enter();
    require_irql("WdfRequestGetIoQueue", DISPATCH);
    with_request(Request, "WdfRequestGetIoQueue", |r| r.queue as WDFQUEUE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRequestGetRequestorMode(Request: WDFREQUEST) -> KPROCESSOR_MODE {
    let _k = KernelCode::enter();
    require_irql("WdfRequestGetRequestorMode", DISPATCH);
    with_request(Request, "WdfRequestGetRequestorMode", |r| {
        r.irp.irp.RequestorMode
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRequestWdmGetIrp(Request: WDFREQUEST) -> PIRP {
    let _k = KernelCode::enter();
    require_irql("WdfRequestWdmGetIrp", DISPATCH);
    with_request(Request, "WdfRequestWdmGetIrp", |r| &raw mut r.irp.irp)
}

fn retrieve(
    request: WDFREQUEST,
    minimum: usize,
    buffer: *mut PVOID,
    length: *mut usize,
    input: bool,
    function: &str,
) -> NTSTATUS {
    with_request(request, function, |r| {
        let len = if input { r.input_len } else { r.output_len };
        if len == 0 || len < minimum {
            return STATUS_BUFFER_TOO_SMALL;
        }
        // SAFETY: the caller's out pointers.
        unsafe { *buffer = r.buffer.as_mut_ptr().cast() };
        if !length.is_null() {
            // SAFETY: as above.
            unsafe { *length = len };
        }
        STATUS_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRequestRetrieveInputBuffer(
    Request: WDFREQUEST,
    MinimumRequiredLength: usize,
    Buffer: *mut PVOID,
    Length: *mut usize,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfRequestRetrieveInputBuffer", DISPATCH);
    retrieve(
        Request,
        MinimumRequiredLength,
        Buffer,
        Length,
        true,
        "WdfRequestRetrieveInputBuffer",
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRequestRetrieveOutputBuffer(
    Request: WDFREQUEST,
    MinimumRequiredSize: usize,
    Buffer: *mut PVOID,
    Length: *mut usize,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfRequestRetrieveOutputBuffer", DISPATCH);
    retrieve(
        Request,
        MinimumRequiredSize,
        Buffer,
        Length,
        false,
        "WdfRequestRetrieveOutputBuffer",
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRequestMarkCancelableEx(
    Request: WDFREQUEST,
    EvtRequestCancel: PFN_WDF_REQUEST_CANCEL,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfRequestMarkCancelableEx", DISPATCH);
    let handle = Request as usize;
    with_request(Request, "WdfRequestMarkCancelableEx", |r| {
        if r.marked.is_some() {
            bugcheck(
                Rule::RequestMarkedTwice,
                format_args!("WDFREQUEST {handle:#x} is already cancelable"),
            );
        }
        if r.cancel_requested {
            // fxioqueue.cpp:2222-2233: the caller completes it with STATUS_CANCELLED.
            return STATUS_CANCELLED;
        }
        r.marked = Some(EvtRequestCancel);
        STATUS_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn WdfRequestUnmarkCancelable(Request: WDFREQUEST) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("WdfRequestUnmarkCancelable", DISPATCH);
    let handle = Request as usize;
    with_request(Request, "WdfRequestUnmarkCancelable", |r| {
        if r.marked.is_none() {
            bugcheck(
                Rule::RequestNotCancelable,
                format_args!("WDFREQUEST {handle:#x} is not cancelable"),
            );
        }
        // The cancel routine won the race (fxrequest.cpp:1977-2008): the request stays
        // cancelable until the routine runs (fxioqueue.cpp:2258-2261 clears the flag only
        // on success).
        if r.cancel_taken {
            return STATUS_CANCELLED;
        }
        r.marked = None;
        STATUS_SUCCESS
    })
}
