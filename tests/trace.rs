//! A failed connection's trace says why it failed: the driver's trace points reach a
//! `tracing` subscriber (as the CLI's `-v` installs one) with the REJ reason of a refused
//! connection and the unanswered message of one that timed out.

use std::io::Write;
use std::sync::{Arc, Mutex};

use ibcm::{Error, RejReason};
use ibcm_cli::sim::{Sim, SimOptions};

/// Everything the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[test]
fn a_refused_and_a_timed_out_connection_are_traced_with_their_reason() {
    let out = Captured::default();
    let writer = out.clone();
    tracing_subscriber::fmt()
        .with_env_filter("ibcm=info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    // Refused: nobody listens on the service (IBA 12.6.7: REJ reason 8).
    let sim = Sim::start(&SimOptions::default());
    let client = sim.provider(0).unwrap();
    let mut params = ibcm::example_connect_params(0x4242, 0x11, 0, 1);
    params.max_cm_retries = 2;
    let err: Error = client
        .connect_endpoint()
        .unwrap()
        .connect(&params)
        .unwrap_err();
    assert_eq!(
        err.reject_reason(),
        Some(RejReason::InvalidServiceId),
        "{err}"
    );
    let text = out.text();
    assert!(text.contains("REJ sent: InvalidServiceId (8)"), "{text}");
    assert!(
        text.contains(
            "connection failed: the peer rejected the Req with REJ reason InvalidServiceId (8)"
        ),
        "{text}"
    );

    // Timed out: every MAD is lost; the REQ's retries run out (IBA 12.7.36).
    let mut options = SimOptions::default();
    options.faults.loss = 1.0;
    let sim = Sim::start(&options);
    let client = sim.provider(0).unwrap();
    params.primary_path.packet_life_time = 8;
    params.remote_cm_response_timeout = 10;
    client
        .connect_endpoint()
        .unwrap()
        .connect(&params)
        .unwrap_err();
    let text = out.text();
    assert!(
        text.contains("connection failed: no answer to the Req after its last retry"),
        "{text}"
    );
}
