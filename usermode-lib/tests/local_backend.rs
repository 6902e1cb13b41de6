//! The rdma backend's logic apart from the port (`backend::local`), on the simulated
//! fabric whose delivery thread stands for the umad port's thread: the thread that runs
//! the driver for an incoming MAD must never run the application's completions (review
//! 31b, finding 2). With completions run inline on that thread (the rdma backend's
//! earlier `InProcess` handle), a completion that makes a blocking call hangs it, and a
//! completion that panics kills it; both tests then fail by timing out. A test that would
//! hang runs its body on a thread of its own and fails when that thread has not finished
//! in time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use ibcm::backend::local::Local;
use ibcm::{Clock, Fabric, ListenParams, Overlapped, Provider, Realtime, spawn};

/// Longer than anything here takes; a body still running then is hung.
const HANG: Duration = Duration::from_secs(10);

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

fn wait_for<T: 'static>(what: &str, o: &Overlapped) -> T {
    let o2 = o.clone();
    within(what, move || o2.wait());
    o.result::<T>()
        .unwrap_or_else(|| panic!("{what}: no result of the expected type"))
}

fn fabric() -> Realtime {
    Realtime::start(Fabric::with_clock(2, 1, Clock::real()))
}

/// A provider over the rdma backend's logic on `node`; `flushes` counts the calls of its
/// flush (the umad port's, which sends what a call queued).
fn provider(f: &Realtime, node: usize, flushes: &Arc<AtomicU64>) -> Provider {
    let flushes = Arc::clone(flushes);
    let flush = Box::new(move || {
        flushes.fetch_add(1, Ordering::Relaxed);
    });
    let local = Local::open(f.node(node).unwrap(), flush).unwrap();
    Provider::with_backend(Arc::new(local)).unwrap()
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

/// A client on node 0 connects to `service_id` on node 1, an operation nobody waits for.
fn connect_from(f: &Realtime, service_id: u64) -> Provider {
    let client = Provider::in_process(f.node(0).unwrap()).unwrap();
    let ep = client.connect_endpoint().unwrap();
    let params = ibcm::example_connect_params(service_id, 0x11, 0, 1);
    spawn(ep.connect_async(&params), &Overlapped::new());
    client
}

/// A completion (the server's REQ arriving) makes a blocking connect, whose REP or REJ
/// only the thread that delivers MADs could bring. Run on that thread it hangs it, and
/// the whole port with it; on the handle's completion thread it fails at once with
/// STATUS_POSSIBLE_DEADLOCK, having issued nothing.
#[test]
fn a_blocking_call_in_a_completion_does_not_stop_the_port() {
    let f = fabric();
    let flushes = Arc::new(AtomicU64::new(0));
    let server = provider(&f, 1, &flushes);
    let listener = listen(&server, 0x7101);
    let done = Overlapped::new();
    let s = server.clone();
    spawn(
        async move {
            let _request = listener.get_request_async().await?;
            let blocked = s.connect_endpoint().and_then(|ep| {
                ep.connect(&ibcm::example_connect_params(0x7102, 0x33, 0, 0))
                    .map(|_| ())
            });
            Ok::<_, ibcm::Error>(blocked.err().map(|e| e.status))
        },
        &done,
    );
    let _client = connect_from(&f, 0x7101);
    let blocked = wait_for::<ibcm::Result<Option<i32>>>("the server's completion", &done);
    assert_eq!(blocked.unwrap(), Some(ibcm::STATUS_POSSIBLE_DEADLOCK));
    // The port still delivers: another client's REQ reaches another listener.
    let other = listen(&server, 0x7103);
    let _client = connect_from(&f, 0x7103);
    within("a REQ after the blocked completion", move || {
        other.get_request().map(|_| ())
    })
    .unwrap();
    assert!(flushes.load(Ordering::Relaxed) > 0, "every call flushes");
}

/// A completion that panics: run on the delivering thread it kills it (every later
/// request of every handle waits forever); on the handle's completion thread the panic
/// fails that provider (its pending operations complete with STATUS_INTERNAL_ERROR,
/// later ones fail with it), and the port goes on serving the other handles.
#[test]
fn a_panicking_completion_fails_its_provider_not_the_port() {
    let f = fabric();
    let flushes = Arc::new(AtomicU64::new(0));
    let server = provider(&f, 1, &flushes);
    let listener = listen(&server, 0x7201);
    let other = listen(&server, 0x7202);
    let panicking = Overlapped::new();
    let get = listener.get_request_async();
    spawn(
        async move {
            let _request = get.await;
            panic!("an application's completion panics");
        },
        &panicking,
    );
    let waiting = Overlapped::new();
    let get = other.get_request_async();
    spawn(async move { get.await.map(|_| ()) }, &waiting);
    let _client = connect_from(&f, 0x7201);
    let err = wait_for::<ibcm::Result<()>>("the provider's other operation", &waiting).unwrap_err();
    assert_eq!(err.status, ibcm::STATUS_INTERNAL_ERROR, "{err}");
    // Another handle on the same port still gets its REQs.
    let second = provider(&f, 1, &flushes);
    let third = listen(&second, 0x7203);
    let _client = connect_from(&f, 0x7203);
    within("a REQ to another handle", move || {
        third.get_request().map(|_| ())
    })
    .unwrap();
}
