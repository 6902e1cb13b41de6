//! The user library (`ibcm`, usermode-lib) on a handle of the binding's control device:
//! an IOCTL transport ([`ibcm::backend::Backend`]) over the simulated I/O manager, as
//! the library's Windows backend is over `DeviceIoControl` and a completion port. One
//! thread dequeues the completion port and runs each request's completion.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ibcm::backend::{Backend, OnComplete};
use ibcm_ntos::io::{self, Open};

/// Requests issued whose completion was not dequeued yet, and completions dequeued
/// before their request's `submit` recorded its hook.
#[derive(Default)]
struct InFlight {
    hooks: HashMap<usize, OnComplete>,
    early: HashMap<usize, (i32, Vec<u8>)>,
}

/// A handle of `\\.\ibcm` in the simulated kernel, bound to the completion port.
pub struct SimHandle {
    file: usize,
    in_flight: Arc<Mutex<InFlight>>,
    closed: AtomicBool,
    stop: Arc<AtomicBool>,
    completions: Mutex<Option<JoinHandle<()>>>,
}

impl SimHandle {
    /// Opens `link` as `who`; its completions run on a thread of their own.
    pub fn open(link: &str, who: Open) -> Result<Arc<Self>, i32> {
        let file = io::open(link, who)?;
        io::bind_completion_port(file);
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (Arc::clone(&in_flight), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("completions".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    let Some((request, status, output)) =
                        io::dequeue_completion(Duration::from_millis(20))
                    else {
                        continue;
                    };
                    let hook = {
                        let mut g = f.lock().unwrap_or_else(PoisonError::into_inner);
                        let hook = g.hooks.remove(&request);
                        if hook.is_none() {
                            g.early.insert(request, (status, output.clone()));
                        }
                        hook
                    };
                    if let Some(hook) = hook {
                        hook.completed(status, output);
                    }
                }
            })
            .ok();
        Ok(Arc::new(Self {
            file,
            in_flight,
            closed: AtomicBool::new(false),
            stop,
            completions: Mutex::new(thread),
        }))
    }

    /// Stops the completion thread (after the handle was closed).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let thread = self
            .completions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Backend for SimHandle {
    fn submit(
        &self,
        code: u32,
        input: &[u8],
        output_len: usize,
        _buffer: Vec<u8>,
        on_complete: OnComplete,
    ) -> u64 {
        let request = io::ioctl(self.file, code, input, output_len);
        let early = {
            let mut g = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let early = g.early.remove(&request);
            if early.is_none() {
                g.hooks.insert(request, Arc::clone(&on_complete));
            }
            early
        };
        if let Some((status, output)) = early {
            on_complete.completed(status, output);
        }
        request as u64
    }

    fn cancel(&self, key: u64) {
        io::cancel(key as usize);
    }

    fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            io::close(self.file);
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}
