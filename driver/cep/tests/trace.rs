//! The trace points tell why a connection failed: a REJ received names its reason, a
//! request that ran out of retries shows each retry and then the timeout.

use std::sync::Mutex;

use ibcm_cep::pair::{Fate, GUID_A, GUID_B, Pair, Side};
use ibcm_cep::{DropReason, Event, Level, RejectParams, StateName, TracePoint, Tracer};
use ibcm_mad::{AttributeId, RejReason};

/// Keeps every point as text with its CA GUID; wants everything.
struct Recorder(Mutex<Vec<(u64, Level, String)>>);

impl Tracer for Recorder {
    fn enabled(&self, _: Level) -> bool {
        true
    }
    fn trace(&self, ca_guid: u64, point: &TracePoint<'_>) {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        v.push((ca_guid, point.level(), format!("{point:?}")));
    }
}

fn recorder() -> &'static Recorder {
    Box::leak(Box::new(Recorder(Mutex::new(Vec::new()))))
}

fn lines(r: &Recorder, guid: u64) -> Vec<(Level, String)> {
    let v = r.0.lock().unwrap_or_else(|e| e.into_inner());
    v.iter()
        .filter(|(g, ..)| *g == guid)
        .map(|(_, l, s)| (*l, s.clone()))
        .collect()
}

#[test]
fn a_rejected_connection_traces_the_rej_sent_and_its_reason_received() {
    let (ta, tb) = (recorder(), recorder());
    let mut p = Pair::new(3);
    p.a.set_tracer(Some(ta));
    p.b.set_tracer(Some(tb));
    let (a, _) = p.start_connect(0x1000);
    p.drive_for(1_000_000);
    let b = p.last_request().unwrap();
    let now = p.now;
    p.b.reject(
        now,
        b,
        &RejectParams {
            reason: RejReason::ConsumerDefined,
            ari: &[],
            private_data: b"no",
        },
    )
    .unwrap();
    p.drive();
    let a_lines = lines(ta, GUID_A);
    let b_lines = lines(tb, GUID_B);
    // B: the REJ went out with its reason, at Info.
    assert!(
        b_lines
            .iter()
            .any(|(l, s)| *l == Level::Info && s.contains("Rej") && s.contains("ConsumerDefined")),
        "{b_lines:#?}"
    );
    // A: REQ_SENT was entered, and the Rejected event names the reason, at Warn.
    assert!(
        a_lines.iter().any(|(_, s)| s.contains("to: ReqSent")),
        "{a_lines:#?}"
    );
    let rejected = a_lines
        .iter()
        .find(|(_, s)| s.contains("Rejected"))
        .unwrap_or_else(|| panic!("no Rejected point: {a_lines:#?}"));
    assert_eq!(rejected.0, Level::Warn);
    assert!(rejected.1.contains("ConsumerDefined"), "{rejected:?}");
    assert_eq!(p.a.state(a).unwrap(), StateName::Idle);
}

#[test]
fn a_request_that_times_out_traces_each_retry_then_the_timeout() {
    let t = recorder();
    let mut p = Pair::new(4);
    p.a.set_tracer(Some(t));
    // Every REQ is lost: A retries MaxCMRetries times (IBA 12.7.36), then gives up.
    p.fault(Side::A, AttributeId::Req, u32::MAX, Fate::Drop);
    let (a, _) = p.start_connect(0x1000);
    p.drive();
    let l = lines(t, GUID_A);
    let retries = l.iter().filter(|(_, s)| s.starts_with("Retry")).count();
    let max_retries = Pair::connect_params(0x1000, 0x11).max_cm_retries;
    assert_eq!(retries, usize::from(max_retries), "{l:#?}");
    let timeout = l
        .iter()
        .position(|(_, s)| s.contains("Timeout") && s.contains("Req"))
        .unwrap_or_else(|| panic!("no Timeout point: {l:#?}"));
    assert!(
        l[..timeout].iter().any(|(_, s)| s.starts_with("Retry")),
        "the retries come before the timeout"
    );
    assert_eq!(l[timeout].0, Level::Warn);
    assert!(matches!(
        p.events_of(Side::A, a).last(),
        Some(Event::Timeout { .. })
    ));
}

#[test]
fn a_malformed_mad_is_traced_with_the_codec_error() {
    let t = recorder();
    let mut p = Pair::new(5);
    p.b.set_tracer(Some(t));
    let mut mad = [0u8; 256];
    mad[0] = 1; // BaseVersion
    mad[1] = 0x03; // not the CM class
    let now = p.now;
    p.b.handle_mad(now, &ibcm_cep::MadAddress::default(), &mad);
    let l = lines(t, GUID_B);
    assert!(
        l.iter()
            .any(|(lv, s)| *lv == Level::Warn && s.contains("Malformed(MgmtClass(3))")),
        "{l:#?}"
    );
}

#[test]
fn an_rtu_for_no_connection_is_traced_as_unmatched() {
    let t = recorder();
    let mut p = Pair::new(7);
    p.b.set_tracer(Some(t));
    let mut mad = [0u8; 256];
    let rtu = ibcm_mad::CmMad {
        header: ibcm_mad::MadHeader::send(1),
        message: ibcm_mad::CmMessage::Rtu(ibcm_mad::CommIds {
            local_comm_id: 5,
            remote_comm_id: 6,
            private_data: &[],
        }),
    };
    rtu.emit(&mut mad).unwrap();
    let now = p.now;
    p.b.handle_mad(now, &ibcm_cep::MadAddress::default(), &mad);
    let l = lines(t, GUID_B);
    let want = format!("{:?}", DropReason::Unmatched);
    assert!(
        l.iter()
            .any(|(lv, s)| *lv == Level::Debug && s.contains(&want) && s.contains("attribute: 20")),
        "{l:#?}"
    );
}

#[test]
fn a_tracer_that_wants_no_level_is_never_called() {
    struct Deaf;
    impl Tracer for Deaf {
        fn enabled(&self, _: Level) -> bool {
            false
        }
        fn trace(&self, _: u64, _: &TracePoint<'_>) {
            panic!("trace called although not enabled");
        }
    }
    static DEAF: Deaf = Deaf;
    let mut p = Pair::new(6);
    p.a.set_tracer(Some(&DEAF));
    p.b.set_tracer(Some(&DEAF));
    let (a, b) = p.establish(0x1000);
    assert_eq!(p.a.state(a).unwrap(), StateName::Established);
    assert_eq!(p.b.state(b).unwrap(), StateName::Established);
}
