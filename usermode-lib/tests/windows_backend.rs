//! The Windows backend's logic (`backend::device`) over emulated Win32 calls
//! (`backend::emulated`: the driver's dispatch code behind an emulated overlapped handle
//! and completion port, with the same threading as on Windows). Each test guards one way
//! the backend hung or failed (issue 30, item 4). A test that would hang runs its body on
//! a thread of its own and fails when that thread has not finished in time.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ibcm::backend::device::{self, Device, Issue};
use ibcm::backend::emulated::{self, Emulated};
use ibcm::backend::{Backend, CompletionHook};
use ibcm::{
    AcceptParams, Clock, Fabric, Failover, ListenParams, Overlapped, Provider, Realtime, spawn,
};
use ibcm_ioctl::{
    ABI_VERSION, ANY_ENDPOINT, EventRecord, HandleIn, VersionIn, VersionOut, code, status,
};
use zerocopy::IntoBytes;

/// Longer than anything here takes; a body still running then is hung.
const HANG: Duration = Duration::from_secs(10);

/// Runs `body` on a thread of its own; fails the test if it has not returned within
/// [`HANG`] (the thread is left behind, and the test binary still exits).
fn within<T: Send + 'static>(what: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(body());
    });
    match rx.recv_timeout(HANG) {
        Ok(v) => v,
        Err(_) => panic!("{what}: hung (not done after {HANG:?})"),
    }
}

/// Waits for an overlapped operation, failing the test if it hangs.
fn wait_for<T: 'static>(what: &str, o: &Overlapped) -> T {
    let o2 = o.clone();
    within(what, move || o2.wait());
    o.result::<T>()
        .unwrap_or_else(|| panic!("{what}: no result of the expected type"))
}

fn fabric() -> Realtime {
    Realtime::start(Fabric::with_clock(2, 1, Clock::real()))
}

fn listen(p: &Provider, service_id: u64) -> ibcm::Listener {
    p.listen(&ListenParams {
        service_id,
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: 8,
    })
    .unwrap()
}

fn accept_params() -> AcceptParams<'static> {
    AcceptParams {
        qpn: 0x22,
        starting_psn: None,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        failover_accepted: Failover::NotSupported,
        flow_control: true,
        srq: false,
        private_data: &[],
    }
}

/// A client on node 0 (the in-process backend) connects to `service_id` on node 1 as an
/// overlapped operation nobody waits for.
fn connect_from(f: &Realtime, service_id: u64) -> Provider {
    let client = Provider::in_process(f.node(0).unwrap()).unwrap();
    let ep = client.connect_endpoint().unwrap();
    let params = ibcm::example_connect_params(service_id, 0x11, 0, 1);
    spawn(ep.connect_async(&params), &Overlapped::new());
    client
}

/// A completion hook that sends (status, output length) down a channel.
struct Sink(Mutex<mpsc::Sender<(i32, usize)>>);

impl CompletionHook for Sink {
    fn completed(self: Arc<Self>, st: i32, output: Vec<u8>) {
        let _ = self.0.lock().unwrap().send((st, output.len()));
    }
}

fn sink() -> (Arc<Sink>, mpsc::Receiver<(i32, usize)>) {
    let (tx, rx) = mpsc::channel();
    (Arc::new(Sink(Mutex::new(tx))), rx)
}

fn version_in() -> VersionIn {
    VersionIn {
        size: VersionIn::SIZE,
        abi_version: ABI_VERSION,
    }
}

/// Dropping the last reference to a provider on its completion thread (a spawned
/// operation owned it) used to join that thread from itself: on Windows it waits for
/// itself forever (on Linux the join fails with EDEADLK and the thread died). Now the
/// thread quits once that completion returns.
#[test]
fn last_provider_dropped_on_the_completion_thread() {
    let f = fabric();
    let server = emulated::provider(f.node(1).unwrap()).unwrap();
    let listener = listen(&server, 0x7001);
    let done = Overlapped::new();
    spawn(
        async move {
            let request = listener.get_request_async().await;
            // The operation holds the provider's last references: they go here, on
            // the thread that completed the GET_EVENT.
            drop((request, listener, server));
            "dropped"
        },
        &done,
    );
    let _client = connect_from(&f, 0x7001);
    assert_eq!(
        wait_for::<&str>("drop on the completion thread", &done),
        "dropped"
    );
}

/// A blocking call on the completion thread would wait for the thread that waits: it
/// fails with STATUS_POSSIBLE_DEADLOCK, having issued nothing, instead of hanging; the
/// same steps as futures complete.
#[test]
fn blocking_call_on_the_completion_thread_fails() {
    let f = fabric();
    let server = emulated::provider(f.node(1).unwrap()).unwrap();
    let listener = listen(&server, 0x7002);
    let done = Overlapped::new();
    spawn(
        async move {
            let request = listener.get_request_async().await?;
            let blocked = request.endpoint.prepare_accept(&accept_params()).err();
            // Refused before anything is issued: no REJ goes out (the accept below
            // would fail).
            let refused = request
                .endpoint
                .reject(ibcm::RejReason::ConsumerDefined, &[])
                .err();
            assert_eq!(
                refused.map(|e| e.status),
                Some(ibcm::STATUS_POSSIBLE_DEADLOCK)
            );
            // The futures of the same steps.
            let qp = request
                .endpoint
                .prepare_accept_async(&accept_params())
                .await?;
            request.endpoint.accept_async().await?;
            Ok::<_, ibcm::Error>((blocked, qp.rtr.dest_qpn))
        },
        &done,
    );
    let client = Provider::in_process(f.node(0).unwrap()).unwrap();
    let ep = client.connect_endpoint().unwrap();
    let params = ibcm::example_connect_params(0x7002, 0x11, 0, 1);
    let reply = within("connect", move || {
        let r = ep.connect(&params);
        if r.is_ok() {
            ep.rtu(&[]).unwrap();
        }
        r.map(|_| ep)
    })
    .unwrap();
    let (blocked, dest_qpn) = wait_for::<ibcm::Result<(Option<ibcm::Error>, Option<u32>)>>(
        "the server's operation",
        &done,
    )
    .unwrap();
    let blocked = blocked.expect("the blocking call failed");
    assert_eq!(blocked.status, ibcm::STATUS_POSSIBLE_DEADLOCK, "{blocked}");
    assert_eq!(dest_qpn, Some(0x11));
    drop(reply);
}

/// `ibcm::block_on` itself on the completion thread panics (it cannot return an
/// error); the panic fails that operation and the provider, and nothing hangs.
#[test]
fn block_on_on_the_completion_thread_panics_and_fails_the_provider() {
    let f = fabric();
    let server = emulated::provider(f.node(1).unwrap()).unwrap();
    let listener = listen(&server, 0x7003);
    let other = listen(&server, 0x7004);
    let panicking = Overlapped::new();
    let get = listener.get_request_async();
    spawn(
        async move {
            let request = get.await;
            ibcm::block_on(std::future::pending::<()>());
            request.map(|_| ())
        },
        &panicking,
    );
    // Another operation of the same provider, waiting on the event channel.
    let waiting = Overlapped::new();
    let get = other.get_request_async();
    spawn(async move { get.await.map(|_| ()) }, &waiting);
    let _client = connect_from(&f, 0x7003);
    assert_eq!(
        wait_for::<ibcm::Panicked>("the panicking operation", &panicking),
        ibcm::Panicked
    );
    let err = wait_for::<ibcm::Result<()>>("the other operation", &waiting).unwrap_err();
    assert_eq!(err.status, ibcm::STATUS_INTERNAL_ERROR, "{err}");
    let later = within("a later operation", move || server.connect_endpoint().err());
    assert_eq!(later.map(|e| e.status), Some(ibcm::STATUS_INTERNAL_ERROR));
}

/// A completion that panics used to kill the completion thread silently: every other
/// wait of the provider then hung. Now the provider fails: pending operations complete
/// with STATUS_INTERNAL_ERROR, and later ones fail with it.
#[test]
fn panic_in_a_completion_fails_the_provider() {
    let f = fabric();
    let server = emulated::provider(f.node(1).unwrap()).unwrap();
    let listener = listen(&server, 0x7005);
    let other = listen(&server, 0x7006);
    let panicking = Overlapped::new();
    let get = listener.get_request_async();
    spawn(
        async move {
            let _request = get.await;
            panic!("an application's operation panics");
        },
        &panicking,
    );
    let waiting = Overlapped::new();
    let get = other.get_request_async();
    spawn(async move { get.await.map(|_| ()) }, &waiting);
    let _client = connect_from(&f, 0x7005);
    let err = wait_for::<ibcm::Result<()>>("the other operation", &waiting).unwrap_err();
    assert_eq!(err.status, ibcm::STATUS_INTERNAL_ERROR, "{err}");
    assert!(panicking.is_done(), "the panicking operation is over");
    let later = within("a later operation", move || server.connect_endpoint().err());
    assert_eq!(later.map(|e| e.status), Some(ibcm::STATUS_INTERNAL_ERROR));
}

/// A completion thread that cannot be started used to leave `open` waiting forever for
/// its VERSION; now `open` fails.
#[test]
fn open_fails_when_the_completion_thread_cannot_start() {
    let f = fabric();
    let sys = Emulated::open(f.node(1).unwrap());
    sys.faults()
        .fail_spawn
        .store(true, std::sync::atomic::Ordering::Release);
    let err = within("open", move || emulated::provider_with(sys).err()).expect("open fails");
    assert_eq!(err.status, status::INSUFFICIENT_RESOURCES, "{err}");
}

/// `Provider::close` used to do nothing on Windows: a pending operation waited on. Now
/// it closes the handle: pending operations fail with STATUS_CANCELLED, later ones with
/// STATUS_INVALID_HANDLE.
#[test]
fn close_completes_pending_operations() {
    let f = fabric();
    let server = emulated::provider(f.node(1).unwrap()).unwrap();
    let listener = listen(&server, 0x7007);
    let waiting = Overlapped::new();
    spawn(listener.get_request_async(), &waiting);
    std::thread::sleep(Duration::from_millis(20));
    assert!(!waiting.is_done());
    server.close();
    let err = wait_for::<ibcm::Result<ibcm::ConnectionRequest>>("get request", &waiting)
        .err()
        .expect("it fails");
    assert_eq!(err.status, status::CANCELLED, "{err}");
    assert_eq!(
        server.connect_endpoint().err().map(|e| e.status),
        Some(status::INVALID_HANDLE)
    );
}

/// A cancel used to pass the address of a request that had completed (and been freed)
/// to CancelIoEx: the next request given that address (here the event channel's
/// GET_EVENT) was cancelled instead. Now a cancel names the request by a key that is
/// never reused, and does nothing once it completed.
#[test]
fn cancel_of_a_completed_request_cancels_nothing_else() {
    let f = fabric();
    let device = Device::new(Emulated::open(f.node(1).unwrap())).unwrap();
    let (hook, done) = sink();
    let version = device.submit(
        code::VERSION,
        version_in().as_bytes(),
        VersionOut::SIZE as usize,
        Vec::new(),
        hook,
    );
    let (st, _) = done.recv_timeout(HANG).unwrap();
    assert_eq!(st, status::SUCCESS);
    // The event channel's GET_EVENT: pending (no events), at the freed address.
    let get_event = HandleIn {
        size: HandleIn::SIZE,
        reserved: 0,
        handle: ANY_ENDPOINT,
    };
    let (hook, events) = sink();
    let channel = device.submit(
        code::GET_EVENT,
        get_event.as_bytes(),
        EventRecord::SIZE as usize,
        Vec::new(),
        hook,
    );
    device.cancel(version);
    assert!(
        events.recv_timeout(Duration::from_millis(200)).is_err(),
        "the GET_EVENT is still pending"
    );
    assert_ne!(channel, version, "keys are not reused");
    // Its own key cancels it.
    device.cancel(channel);
    assert_eq!(events.recv_timeout(HANG).unwrap().0, status::CANCELLED);
}

/// A request that failed synchronously used to report the STATUS_PENDING left in
/// OVERLAPPED.Internal (the I/O manager writes no status for it) and drop the Win32
/// error. Now it reports the driver's status: the same as the in-process backend's.
#[test]
fn synchronous_failure_reports_the_drivers_status() {
    let f = fabric();
    let emulated = emulated::provider(f.node(1).unwrap()).unwrap();
    let in_process = Provider::in_process(f.node(1).unwrap()).unwrap();
    let statuses: Vec<(i32, i32)> = [&in_process, &emulated]
        .into_iter()
        .map(|p| {
            let ep = p.connect_endpoint().unwrap();
            // An RTU before any REP: the driver refuses it at once.
            let rtu = ep.rtu(&[]).unwrap_err().status;
            // A DREQ on an idle endpoint, the same way (disconnect then asks why).
            let dreq = ep.disconnect(&[]).unwrap_err().status;
            (rtu, dreq)
        })
        .collect();
    assert_eq!(statuses[0].0, status::INVALID_DEVICE_STATE);
    assert_eq!(statuses[1], statuses[0], "Windows backend as in-process");
    // After close, nothing reaches the (closed) handle.
    emulated.close();
    let err = emulated.counters().unwrap_err();
    assert_eq!(err.status, status::INVALID_HANDLE, "{err}");
}

/// What DeviceIoControl's result means: a failure carries the Win32 error turned back
/// into the driver's NTSTATUS (RtlNtStatusToDosError's pairs) unless the I/O manager
/// wrote a status; TRUE, ERROR_IO_PENDING and a written warning mean a packet comes.
#[test]
fn issue_status_follows_the_io_managers_rules() {
    let failed = |last_error| Issue {
        returned: false,
        last_error,
        internal: status::PENDING,
    };
    // No IRP (closed handle), or the driver failed it at once.
    assert_eq!(
        device::issue_status(failed(6)),
        Some(status::INVALID_HANDLE)
    );
    assert_eq!(
        device::issue_status(failed(22)),
        Some(status::INVALID_DEVICE_STATE)
    );
    assert_eq!(
        device::issue_status(failed(1450)),
        Some(status::INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        device::issue_status(failed(1816)),
        Some(ibcm::STATUS_QUOTA_EXCEEDED)
    );
    assert_eq!(device::issue_status(failed(device::ERROR_IO_PENDING)), None);
    let ok = Issue {
        returned: true,
        last_error: 0,
        internal: status::SUCCESS,
    };
    assert_eq!(device::issue_status(ok), None);
    // STATUS_BUFFER_OVERFLOW (a warning) written: the packet is queued.
    let warning = Issue {
        returned: false,
        last_error: 234,
        internal: 0x8000_0005_u32 as i32,
    };
    assert_eq!(device::issue_status(warning), None);
    let written = Issue {
        returned: false,
        last_error: 87,
        internal: status::INVALID_PARAMETER,
    };
    assert_eq!(
        device::issue_status(written),
        Some(status::INVALID_PARAMETER)
    );
}

/// CreateFileW's failures used to all be STATUS_DEVICE_REMOVED: a missing driver and a
/// refused account now say what they are.
#[test]
fn open_failures_say_what_they_are() {
    // ERROR_FILE_NOT_FOUND: no \\.\ibcm symbolic link (driver not installed or started).
    let missing = ibcm::Error::new("open", device::status_from_win32(2));
    assert_eq!(missing.status, ibcm::STATUS_OBJECT_NAME_NOT_FOUND);
    assert!(missing.to_string().contains("installed"), "{missing}");
    // ERROR_ACCESS_DENIED: the device's security descriptor refuses this account.
    let denied = ibcm::Error::new("open", device::status_from_win32(5));
    assert_eq!(denied.status, ibcm::STATUS_ACCESS_DENIED);
    assert!(denied.to_string().contains("may not open"), "{denied}");
    // Anything else keeps its Win32 code (ERROR_SHARING_VIOLATION).
    let other = ibcm::Error::new("open", device::status_from_win32(32));
    assert_eq!(other.status as u32, 0xC007_0020);
    assert!(other.to_string().contains("Win32 error 32"), "{other}");
}

/// One GET_EVENT failing with STATUS_INSUFFICIENT_RESOURCES (the driver transiently
/// short) used to end event delivery for the whole provider; now it is retried and the
/// connection is made.
#[test]
fn transient_get_event_failures_are_retried() {
    let f = fabric();
    let sys = Emulated::open(f.node(1).unwrap());
    let faults = sys.faults();
    let server = emulated::provider_with(sys).unwrap();
    let listener = listen(&server, 0x7008);
    faults
        .get_event_failures
        .store(3, std::sync::atomic::Ordering::Release);
    let waiting = Overlapped::new();
    spawn(listener.get_request_async(), &waiting);
    let _client = connect_from(&f, 0x7008);
    let request = wait_for::<ibcm::Result<ibcm::ConnectionRequest>>("get request", &waiting);
    assert!(request.is_ok(), "{:?}", request.err());
    assert_eq!(
        faults
            .get_event_failures
            .load(std::sync::atomic::Ordering::Acquire),
        0,
        "every injected failure was met"
    );
}

/// A caller's OVERLAPPED completes as Windows completes I/O on a handle bound to a port:
/// its event is set and it is posted to the port, unless `hEvent` has its low bit set
/// (WinVerbs core/winverbs/user/wv_base.cpp:56-60 sets it on its blocking calls' event,
/// whose completion must not reach the application's port, :90-99).
#[test]
fn caller_overlapped_follows_the_event_low_bit_rule() {
    assert_eq!(device::caller_completion(0), (0, true));
    assert_eq!(device::caller_completion(0x1234), (0x1234, true));
    assert_eq!(device::caller_completion(0x1235), (0x1234, false));
}

/// An overlapped with a notification (how the caller's OVERLAPPED is completed on
/// Windows) is told once, after the result is in, on the thread that finished it.
#[test]
fn overlapped_notification_comes_once_after_the_result() {
    let f = fabric();
    let server = emulated::provider(f.node(1).unwrap()).unwrap();
    let listener = listen(&server, 0x7009);
    let (tx, rx) = mpsc::channel();
    let slot: Arc<Mutex<Option<Overlapped>>> = Arc::default();
    let seen = Arc::clone(&slot);
    let o = Overlapped::with_notify(move || {
        let done = seen
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(Overlapped::is_done);
        let _ = tx.send((done, std::thread::current().name().map(str::to_owned)));
    });
    *slot.lock().unwrap() = Some(o.clone());
    spawn(listener.get_request_async(), &o);
    let _client = connect_from(&f, 0x7009);
    let (done, thread) = rx.recv_timeout(HANG).expect("notified");
    assert!(done, "the result was in before the notification");
    assert_eq!(thread.as_deref(), Some("ibcm-completions"));
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "once");
    assert!(
        o.result::<ibcm::Result<ibcm::ConnectionRequest>>()
            .is_some_and(|r| r.is_ok())
    );
}

/// A completion port that fails under the completion thread (closed: ERROR_ABANDONED_WAIT_0)
/// brings no more packets: the requests in flight fail at once instead of waiting forever.
#[test]
fn an_abandoned_port_fails_the_requests_in_flight() {
    let f = fabric();
    let sys = Emulated::open(f.node(1).unwrap());
    let faults = sys.faults();
    let server = emulated::provider_with(sys).unwrap();
    let listener = listen(&server, 0x700a);
    let waiting = Overlapped::new();
    spawn(listener.get_request_async(), &waiting);
    std::thread::sleep(Duration::from_millis(20));
    faults.abandon_port();
    let err = wait_for::<ibcm::Result<ibcm::ConnectionRequest>>("get request", &waiting)
        .err()
        .expect("it fails");
    // ERROR_ABANDONED_WAIT_0 (735) as FACILITY_NTWIN32.
    assert_eq!(err.status as u32, 0xC007_0000 | 735, "{err}");
}

/// A hook that holds the thread it runs on until told to let go (or its sender is
/// dropped).
struct Hold(Mutex<mpsc::Receiver<()>>);

impl CompletionHook for Hold {
    fn completed(self: Arc<Self>, _: i32, _: Vec<u8>) {
        let _ = self.0.lock().unwrap().recv();
    }
}

/// An IOCTL the driver completes in its dispatch routine (`ibcm_ioctl::may_pend`: all
/// but GET_EVENT, and CONNECT and SEND_REP with an output buffer) is waited for on the
/// caller's thread, off the completion port, as WinVerbs' blocking calls
/// (wv_base.cpp:90-99): it completes while the completion thread is held by another
/// request's hook. Through the port it would wait behind that hook (seen failing so,
/// with `Provider::ioctl` always submitting).
#[test]
fn a_call_the_driver_completes_at_once_passes_a_busy_completion_thread() {
    let f = fabric();
    let device = Arc::new(Device::new(Emulated::open(f.node(1).unwrap())).unwrap());
    let provider = Provider::with_backend(Arc::clone(&device) as Arc<dyn Backend>).unwrap();
    let (release, held) = mpsc::channel();
    device.submit(
        code::VERSION,
        version_in().as_bytes(),
        VersionOut::SIZE as usize,
        Vec::new(),
        Arc::new(Hold(Mutex::new(held))),
    );
    let p = provider.clone();
    let made = within("CREATE while the completion thread is held", move || {
        p.connect_endpoint().map(|ep| ep.handle())
    });
    assert!(made.is_ok(), "{made:?}");
    // GET_EVENT may pend: it still goes through the port.
    assert!(ibcm_ioctl::may_pend(code::GET_EVENT, 0));
    assert!(ibcm_ioctl::may_pend(code::CONNECT, 1));
    assert!(!ibcm_ioctl::may_pend(code::CONNECT, 0));
    assert!(!ibcm_ioctl::may_pend(code::FORMAT_REP, 64));
    let _ = release.send(());
}

/// A call off the port on a closed handle fails as a submitted request does, having
/// issued nothing; one the driver fails comes back with the driver's status.
#[test]
fn a_call_off_the_port_reports_what_submit_would() {
    let f = fabric();
    let device = Device::new(Emulated::open(f.node(1).unwrap())).unwrap();
    let wrong = VersionIn {
        size: VersionIn::SIZE,
        abi_version: ABI_VERSION + 1,
    };
    let version = |input: &[u8]| {
        let (st, out) = device
            .call(code::VERSION, input, VersionOut::SIZE as usize, Vec::new())
            .unwrap();
        (st, out.len())
    };
    assert_eq!(version(wrong.as_bytes()), (status::REVISION_MISMATCH, 0));
    assert_eq!(
        version(version_in().as_bytes()),
        (status::SUCCESS, VersionOut::SIZE as usize)
    );
    device.close();
    assert_eq!(version(version_in().as_bytes()).0, status::INVALID_HANDLE);
}

/// Under KMDF every request the framework queues pends (its dispatch returns
/// STATUS_PENDING whatever the driver did, fxioqueue.cpp), so on Windows a call off the
/// port always waits for its event: that path, with the emulated handle pending every
/// request, gives the driver's result, and a request that really waits (a GET_EVENT on
/// the channel, ended by the handle's close from another thread) ends with the close's
/// status. Neither queues a packet on the port.
#[test]
fn a_call_off_the_port_waits_for_its_event_and_queues_no_packet() {
    let f = fabric();
    let sys = Emulated::open(f.node(1).unwrap());
    let faults = sys.faults();
    faults
        .pend_all
        .store(true, std::sync::atomic::Ordering::Release);
    let device = Arc::new(Device::new(sys).unwrap());
    let (st, out) = device
        .call(
            code::VERSION,
            version_in().as_bytes(),
            VersionOut::SIZE as usize,
            Vec::new(),
        )
        .unwrap();
    assert_eq!(
        (st, out.len()),
        (status::SUCCESS, VersionOut::SIZE as usize)
    );
    assert_eq!(
        faults.packets_posted(),
        0,
        "a call off the port queued a packet"
    );
    // A request through the port under the same rule gets its packet.
    let (hook, done) = sink();
    device.submit(code::VERSION, version_in().as_bytes(), 0, Vec::new(), hook);
    let _ = done.recv_timeout(HANG);
    assert_eq!(faults.packets_posted(), 1);
    let closer = Arc::clone(&device);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        closer.close();
    });
    let d = Arc::clone(&device);
    let (st, _) = within("a GET_EVENT off the port until the close", move || {
        let input = HandleIn {
            size: HandleIn::SIZE,
            reserved: 0,
            handle: ANY_ENDPOINT,
        };
        d.call(
            code::GET_EVENT,
            input.as_bytes(),
            EventRecord::SIZE as usize,
            Vec::new(),
        )
        .unwrap()
    });
    assert_eq!(st, status::CANCELLED);
    assert_eq!(
        faults.packets_posted(),
        1,
        "a call off the port queued a packet"
    );
}
