//! `--bind LOCAL_ADDR`: `ibcm cmtime`, `ibcm listen` and `ibcm connect` on a real
//! RoCEv2 link (Linux), against a real CM such as Linux `rdma_cm` over soft-RoCE:
//!
//! - `ibcm cmtime -b A -s B -c N`: the client of a Linux `cmtime -b B` server;
//! - `ibcm listen -b A -p 7471 -c N`: the server of a Linux `cmtime -s A -c N`;
//! - `ibcm connect -b A -s B -p PORT -c N`: N connections one after the other,
//!   each held until all were tried, then all disconnected;
//! - `ibcm listen -b A -p 7471 --beside-al 7472 -c N`: two CMs on the node, ibcm's
//!   serving port 7471 and a stand-in for WinOF AL's serving port 7472, every received MAD
//!   steered by ibcm's engine (issue #19); each serves N connections, and the steering
//!   counts say which CM got which MADs.
//!
//! Connections are RDMA-CM's: TCP port-space service IDs and the Annex A11 IP header in
//! the REQ's private data.

use std::net::Ipv4Addr;

use clap::Args;

#[cfg(target_os = "linux")]
pub use imp::{cmtime, exchange};

/// rdma-core cmtime's TCP port.
pub(crate) const CMTIME_PORT: u16 = 7471;

/// The CM attributes by name.
const ATTRIBUTES: [(&str, u16); 11] = [
    ("REQ", 0x10),
    ("MRA", 0x11),
    ("REJ", 0x12),
    ("REP", 0x13),
    ("RTU", 0x14),
    ("DREQ", 0x15),
    ("DREP", 0x16),
    ("SIDR_REQ", 0x17),
    ("SIDR_REP", 0x18),
    ("LAP", 0x19),
    ("APR", 0x1a),
];

/// A MAD attribute by name (REQ, REP, RTU, DREQ, ...) or number.
fn parse_attribute(s: &str) -> Result<u16, String> {
    if let Some((_, id)) = ATTRIBUTES.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
        return Ok(*id);
    }
    u16::try_from(super::number(s)?)
        .map_err(|_| format!("`{s}` is not a CM attribute (REQ, REP, RTU, DREQ, ... or a number)"))
}

/// `ATTR:K`: drop the first K MADs of an attribute.
fn parse_drop(s: &str) -> Result<(u16, u32), String> {
    let (a, k) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}`: expected ATTR:K, e.g. REQ:2"))?;
    let k: u32 = k.parse().map_err(|_| format!("`{k}` is not a count"))?;
    Ok((parse_attribute(a)?, k))
}

#[cfg(target_os = "linux")]
fn attribute_name(id: u16) -> String {
    ATTRIBUTES
        .iter()
        .find(|(_, a)| *a == id)
        .map_or_else(|| format!("{id:#06x}"), |(n, _)| (*n).to_string())
}

// Options of a RoCEv2 link (flattened into cmtime, listen and connect).
#[derive(Args, Debug, Clone)]
pub struct RoceArgs {
    /// Run on a real RoCEv2 link instead of the simulated fabric, bound to this local IPv4
    /// address (cmtime's and ucmatose's -b): QP1 over UDP 4791 (Linux; a raw socket: root
    /// or CAP_NET_RAW), or on --ib-dev. The peer is an RDMA-CM one (TCP port-space service
    /// IDs, IP header in the REQ).
    #[arg(short = 'b', long, value_name = "ADDR", help_heading = "RoCEv2 link")]
    pub bind: Option<Ipv4Addr>,
    /// The server's IPv4 address (cmtime's and ucmatose's -s): cmtime and connect connect
    /// to it.
    #[arg(
        short = 's',
        long,
        value_name = "ADDR",
        requires = "bind",
        help_heading = "RoCEv2 link"
    )]
    pub server: Option<Ipv4Addr>,
    /// Prefix length of the local subnet; MADs to any address outside it are refused.
    #[arg(long, value_name = "BITS", default_value_t = 24, value_parser = clap::value_parser!(u8).range(8..=32), help_heading = "RoCEv2 link")]
    pub prefix_len: u8,
    /// The CA GUID (default: the EUI-64 of the MAC of the interface holding --bind).
    #[arg(long, value_name = "GUID", value_parser = super::number, requires = "bind", help_heading = "RoCEv2 link")]
    pub guid: Option<u64>,
    /// Fault injection: drop the first K outgoing MADs of an attribute (ATTR:K, e.g.
    /// REQ:2; repeatable).
    #[arg(long = "drop-tx", value_name = "ATTR:K", value_parser = parse_drop, requires = "bind", help_heading = "RoCEv2 link")]
    pub drop_tx: Vec<(u16, u32)>,
    /// Fault injection: drop the first K incoming MADs of an attribute (ATTR:K).
    #[arg(long = "drop-rx", value_name = "ATTR:K", value_parser = parse_drop, requires = "bind", help_heading = "RoCEv2 link")]
    pub drop_rx: Vec<(u16, u32)>,
    /// cmtime, connect: give every connection the same QPN (a CM must reject the reuse
    /// while the first connection is up: REJ reason 10, stale connection).
    #[arg(long, requires = "bind", help_heading = "RoCEv2 link")]
    pub reuse_qpn: bool,
    /// listen: end each connection with our DREQ once it is established (by default the
    /// peer's DREQ is awaited and answered).
    #[arg(long, requires = "bind", help_heading = "RoCEv2 link")]
    pub disconnect: bool,
    /// listen: carry a second CM on this node beside ibcm's, standing in for WinOF AL's,
    /// serving RDMA-CM TCP port AL_PORT (as many connections, ended the same way); every
    /// received CM MAD goes to the CM ibcm's steering decision names, as on a WinOF host
    /// where AL's CM keeps QP1. ibcm's comm IDs then have wire byte 2 >= 0xF0, the
    /// stand-in's <= 0x0F.
    #[arg(
        long,
        value_name = "AL_PORT",
        requires = "bind",
        help_heading = "RoCEv2 link"
    )]
    pub beside_al: Option<u16>,
    /// Run on this RDMA device (`rxe0`) instead of a raw socket: ibcm's driver on the
    /// device's QP1 through ib_umad (the kernel's `ib_cm` must not be loaded), every
    /// connection with a real RC QP of rdma-core cmtime's size, moved to INIT, RTR and RTS
    /// with the engine's transitions (Linux, feature `devices`). --bind is the device's
    /// IPv4 address.
    #[arg(
        long,
        value_name = "DEV",
        requires = "bind",
        help_heading = "RoCEv2 link"
    )]
    pub ib_dev: Option<String>,
}

#[cfg(target_os = "linux")]
mod imp {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use ibcm_cli::cmtime::{StepRow, step_table};
    use ibcm_cli::exchange::Service;
    use ibcm_cli::rocev2::{
        self, ConnectConfig, ConnectReport, Ending, Roce, RoceConfig, RoceFaults, ServeConfig,
        ServeReport, StepTimes, Timing,
    };
    use ibcm_host::{STEER_ROWS, SteerCounts};

    use super::super::{ATTRIBUTES, CmtimeArgs, ExchangeArgs, FabricArgs, Failure};
    use super::{CMTIME_PORT, RoceArgs, attribute_name};

    /// The service `listen`/`connect --bind` use: `--port` (an RDMA-CM port), else
    /// `--service-id`, else cmtime's port.
    fn exchange_service(a: &ExchangeArgs) -> Service {
        match (a.port, a.service_id) {
            (Some(p), _) => Service::Port(p),
            (None, Some(id)) => Service::Id(id),
            (None, None) => Service::Port(CMTIME_PORT),
        }
    }

    /// What `listen --bind` serves: `--connections` connections on `service`, each ended by our
    /// DREQ with `--disconnect`, else by the peer's; QPNs from `qpn_base`.
    fn serve_config(a: &ExchangeArgs, service: &Service, qpn_base: u32) -> ServeConfig {
        ServeConfig {
            service_id: service.service_id(),
            count: a.connections,
            wait: Duration::from_secs(a.wait as u64),
            ending: if a.roce.disconnect {
                Ending::Us
            } else {
                Ending::Peer
            },
            qpn_base,
        }
    }

    impl RoceArgs {
        fn start(&self, fabric: &FabricArgs) -> Result<Option<Roce>, Failure> {
            let Some(local) = self.bind else {
                return Ok(None);
            };
            if fabric.device {
                return Err(Failure("--bind and --device exclude each other".into()));
            }
            if fabric.pcap.is_some() {
                return Err(Failure(
                    "--pcap records the simulated fabric; on a link capture the link itself \
                 (tcpdump -i IFACE -w FILE udp port 4791)"
                        .into(),
                ));
            }
            if fabric.faults() != ibcm::Faults::default() {
                return Err(Failure(
                    "--loss/--dup/--reorder/--corrupt/--delay are the simulated fabric's; on \
                 a link use --drop-tx/--drop-rx"
                        .into(),
                ));
            }
            let config = RoceConfig {
                prefix_len: self.prefix_len,
                guid: self.guid,
                faults: RoceFaults {
                    drop_tx: self.drop_tx.clone(),
                    drop_rx: self.drop_rx.clone(),
                },
                beside_al: self.beside_al.is_some(),
                ..RoceConfig::new(local)
            };
            let roce = Roce::start(&config).map_err(Failure)?;
            println!(
                "rocev2: {local}/{}, CA GUID {:#018x}, GID ::ffff:{local}{}",
                self.prefix_len,
                roce.port.guid(),
                faults_text(&config.faults)
            );
            Ok(Some(roce))
        }

        /// Refuses `--beside-al` where it does nothing (cmtime, connect).
        fn only_listen_beside_al(&self) -> Result<(), Failure> {
            match self.beside_al {
                Some(_) => Err(Failure("--beside-al is for `ibcm listen`".into())),
                None => Ok(()),
            }
        }

        fn peer(&self) -> Result<Ipv4Addr, Failure> {
            self.server
                .ok_or_else(|| Failure("--bind needs --server ADDR here".into()))
        }
    }

    fn faults_text(f: &RoceFaults) -> String {
        let list = |v: &[(u16, u32)], dir: &str| {
            v.iter()
                .map(|(a, k)| format!("{dir} the first {k} {}", attribute_name(*a)))
                .collect::<Vec<_>>()
        };
        let mut all = list(&f.drop_tx, "dropping outgoing:");
        all.extend(list(&f.drop_rx, "dropping incoming:"));
        if all.is_empty() {
            String::new()
        } else {
            format!("; fault injection: {}", all.join(", "))
        }
    }

    /// Prints which CM the steering gave each kind of MAD to (beside AL).
    fn print_steering(c: &SteerCounts) {
        println!();
        println!("steering, by ibcm's owner_of (MADs received: steered to ibcm, passed to AL):");
        println!("  {:<14} {:>10} {:>10}", "attribute", "ibcm", "AL");
        for row in 0..STEER_ROWS {
            let (ours, theirs) = (c.steered[row], c.passed[row]);
            if ours + theirs == 0 {
                continue;
            }
            let name = ATTRIBUTES.get(row).copied().unwrap_or("other");
            println!("  {name:<14} {ours:>10} {theirs:>10}");
        }
        println!(
            "  total          {:>10} {:>10}",
            c.steered.iter().sum::<u64>(),
            c.passed.iter().sum::<u64>()
        );
    }

    /// Prints the link's counts and the driver's counters (beside AL: the steering counts
    /// and both CMs' counters); false if the host verifier saw a rule broken.
    fn print_link(roce: &Roce) -> bool {
        let c = roce.port.counts();
        println!(
            "rocev2:   {} MADs sent, {} received; dropped: {} bad ICRC, {} not for QP1; {} sends refused (off-link), {} send errors; fault injection dropped {} outgoing, {} incoming",
            c.sent,
            c.received,
            c.bad_icrc,
            c.not_qp1,
            c.refused,
            c.send_errors,
            c.fault_tx,
            c.fault_rx
        );
        match (roce.port.shared(), &roce.al) {
            (Some(shared), Some(al)) => {
                print_steering(&shared.counts());
                super::super::print_counters(&[
                    ("ibcm's CM (rocev2)", &roce.provider),
                    ("AL stand-in (rocev2)", al),
                ]);
            }
            _ => super::super::print_counters(&[("this node (rocev2)", &roce.provider)]),
        }
        let mut violations = roce.port.node().violations();
        if let Some(shared) = roce.port.shared() {
            violations.extend(shared.al().violations());
        }
        if !violations.is_empty() {
            println!("verifier: {violations:?}");
        }
        violations.is_empty()
    }

    fn ms(d: Duration) -> String {
        format!("{:.2}", d.as_secs_f64() * 1e3)
    }

    /// The step rows of a connect run, in rdma-core cmtime's order.
    fn step_rows(r: &ConnectReport) -> Vec<StepRow> {
        let mut rows = Vec::new();
        if r.create_qp.count > 0 {
            rows.push(r.create_qp.row("create qp"));
            // The QP to INIT before its REQ, as librdmacm's rdma_create_qp.
            rows.push(r.init.row("  of which INIT"));
        }
        rows.push(r.create_id.row("create id"));
        rows.push(r.connect.row("connect (REQ -> REP)"));
        if r.establish.count > 0 && r.create_qp.count > 0 {
            rows.push(r.establish.row("establish (REQ -> RTU)"));
            if let Some(first) = r.first_establish {
                // This process's first: a fresh client's; the median above is a warm one's.
                let once = StepTimes {
                    count: 1,
                    total: first,
                    min: first,
                    median: first,
                    p99: first,
                    max: first,
                };
                rows.push(once.row("establish, 1st"));
            }
        }
        rows.push(r.disconnect.row("disconnect (DREQ -> DREP)"));
        rows
    }

    fn print_steps(r: &ConnectReport) {
        println!();
        print!("{}", step_table(&step_rows(r)));
        println!(
            "setup:    {}/{} established in {:.3} s",
            r.established,
            r.attempted,
            r.setup_wall.as_secs_f64()
        );
        println!(
            "teardown: {}/{} disconnected in {:.3} s ({} by the peer first)",
            r.disconnected,
            r.established,
            r.teardown_wall.as_secs_f64(),
            r.peer_disconnects
        );
        print_failures(&r.failures, &r.rejections);
    }

    fn print_failures(
        failures: &std::collections::BTreeMap<String, usize>,
        rejections: &std::collections::BTreeMap<u16, usize>,
    ) {
        if failures.is_empty() {
            println!("failures: none");
        } else {
            println!("failures:");
            for (what, n) in failures {
                println!("  {n:>8}  {what}");
            }
        }
        for (reason, n) in rejections {
            println!(
                "peer REJ: reason {} x {n}",
                rocev2::rej_reason_name(*reason)
            );
        }
    }

    /// `ibcm cmtime --bind`: the client of an RDMA-CM server (Linux `cmtime -b`).
    pub fn cmtime(a: &CmtimeArgs) -> Result<Option<bool>, Failure> {
        a.roce.only_listen_beside_al()?;
        if a.roce.bind.is_some() && a.json {
            return Err(Failure(
                "--json reports simulated and --device runs; on a link (--bind) the report is \
                 text"
                    .into(),
            ));
        }
        if a.roce.bind.is_some()
            && let Some(dev) = &a.roce.ib_dev
        {
            return on_device::cmtime(a, dev).map(Some);
        }
        let Some(roce) = a.roce.start(&a.fabric)? else {
            return Ok(None);
        };
        let peer = a.roce.peer()?;
        let connections = a.connections.unwrap_or(super::super::CMTIME_CONNECTIONS);
        let cfg = ConnectConfig {
            window: a.window,
            timing: Timing {
                packet_life_time: a.packet_life_time,
                cm_response_timeout: a.response_timeout,
                max_cm_retries: a.max_cm_retries,
            },
            reuse_qpn: a.roce.reuse_qpn,
            ..ConnectConfig::new(peer, a.port, connections)
        };
        println!(
            "ibcm cmtime: {} connections to {peer} RDMA-CM TCP port {} (service ID {:#018x}), window {}; a REQ is re-sent after {} ms, {} retries",
            cfg.count,
            a.port,
            cfg.service_id,
            cfg.window,
            ms(cfg.timing.retry_interval()),
            cfg.timing.max_cm_retries
        );
        if cfg.timing.retry_interval() < Duration::from_millis(500) {
            println!(
                "  note: a REQ is re-sent after {} ms: a slow peer (a VM) sees duplicates; \
                 --packet-life-time 12 --response-timeout 18 re-send after about 1.1 s",
                ms(cfg.timing.retry_interval())
            );
        }
        let log = |line: String| println!("  {line}");
        let report = rocev2::connect(&roce, &cfg, &log);
        print_steps(&report);
        let clean = print_link(&roce);
        Ok(Some(
            clean
                && report.established == report.attempted
                && report.disconnected == report.established,
        ))
    }

    /// Prints what a server did; whether it served `count` connections to their end.
    fn print_served(
        who: &str,
        r: &ServeReport,
        cfg: &ServeConfig,
        local: Ipv4Addr,
        count: usize,
    ) -> bool {
        println!(
            "{who}: {} REQs ({} with an RDMA-CM IP header naming {local}), {} established, {} ended ({}), in {:.3} s",
            r.requests,
            r.ip_headers,
            r.established,
            r.completed,
            match cfg.ending {
                Ending::Peer => "by the peer's DREQ",
                Ending::Us => "by our DREQ",
            },
            r.wall.as_secs_f64()
        );
        print_failures(&r.failures, &r.rejections);
        r.requests == count && r.completed == count
    }

    /// `ibcm listen --bind` / `ibcm connect --bind`.
    pub fn exchange(a: &ExchangeArgs, listen: bool) -> Result<Option<bool>, Failure> {
        if !listen {
            a.roce.only_listen_beside_al()?;
        }
        if a.roce.bind.is_some()
            && let Some(dev) = &a.roce.ib_dev
        {
            return on_device::exchange(a, listen, dev).map(Some);
        }
        let Some(roce) = a.roce.start(&a.fabric)? else {
            return Ok(None);
        };
        let service = exchange_service(a);
        let side = if listen { "listen" } else { "connect" };
        let start = std::time::Instant::now();
        let log_as = move |side: &'static str| {
            move |line: String| {
                println!("[{:>10.6}] {side}: {line}", start.elapsed().as_secs_f64());
            }
        };
        let log = log_as(side);
        let wait = Duration::from_secs(a.wait as u64);
        let ok = if listen {
            let cfg = serve_config(a, &service, 0x2000);
            let local = roce.port.local();
            match (a.roce.beside_al, &roce.al) {
                (Some(al_port), Some(al)) => {
                    // The stand-in's QPNs differ from ibcm's: one CA, so a peer checking
                    // (CA GUID, QPN) for stale connections sees them as distinct.
                    let al_cfg = ServeConfig {
                        service_id: Service::Port(al_port).service_id(),
                        qpn_base: 0x3000,
                        ..cfg
                    };
                    println!(
                        "beside-al: two CMs on this node: ibcm's serves {service} (comm IDs with wire byte 2 >= 0xF0), \
                         AL's stand-in serves {} (wire byte 2 <= 0x0F); every MAD received is steered by ibcm's owner_of",
                        Service::Port(al_port)
                    );
                    let (ibcm_log, al_log) = (log_as("listen [ibcm]"), log_as("listen [AL]"));
                    let (ours, theirs) = std::thread::scope(|s| {
                        let theirs = s.spawn(|| rocev2::serve(al, local, &al_cfg, &al_log));
                        let ours = rocev2::serve(&roce.provider, local, &cfg, &ibcm_log);
                        (ours, theirs.join())
                    });
                    let theirs =
                        theirs.map_err(|_| Failure("the AL stand-in's server panicked".into()))?;
                    let ours_ok = print_served("listen [ibcm]", &ours?, &cfg, local, a.connections);
                    let theirs_ok =
                        print_served("listen [AL]", &theirs?, &al_cfg, local, a.connections);
                    ours_ok && theirs_ok
                }
                _ => {
                    let r = rocev2::serve(&roce.provider, local, &cfg, &log)?;
                    print_served("listen", &r, &cfg, local, a.connections)
                }
            }
        } else {
            let peer = a.roce.peer()?;
            let cfg = ConnectConfig {
                service_id: service.service_id(),
                window: 1,
                reuse_qpn: a.roce.reuse_qpn,
                deadline: wait,
                ..ConnectConfig::new(peer, CMTIME_PORT, a.connections)
            };
            log(format!(
                "{} connection(s) to {peer}, {service}, one after the other",
                a.connections
            ));
            let r = rocev2::connect(&roce, &cfg, &log);
            print_steps(&r);
            r.failures.is_empty() && r.established == r.attempted
        };
        let clean = print_link(&roce);
        Ok(Some(ok && clean))
    }

    /// `--ib-dev DEV`: cmtime, listen and connect on a real RDMA device (the user
    /// library's `rdma` backend: the driver on the device's QP1 through ib_umad), every
    /// connection with a real RC QP: what rdma-core `cmtime` does on either side.
    mod on_device {
        #[cfg(not(feature = "devices"))]
        use super::super::super::{CmtimeArgs, ExchangeArgs};
        use super::super::super::{FabricArgs, Failure};
        use super::RoceArgs;

        /// Refuses what belongs to the raw-socket link or the simulated fabric.
        #[cfg_attr(not(feature = "devices"), allow(dead_code))]
        fn check(r: &RoceArgs, fabric: &FabricArgs) -> Result<(), Failure> {
            let raw_only = [
                (r.beside_al.is_some(), "--beside-al"),
                (
                    !r.drop_tx.is_empty() || !r.drop_rx.is_empty(),
                    "--drop-tx/--drop-rx",
                ),
                (r.reuse_qpn, "--reuse-qpn (the QPNs are the device's)"),
                (r.guid.is_some(), "--guid (the CA GUID is the device's)"),
                (fabric.device, "--device"),
                (fabric.pcap.is_some(), "--pcap"),
                (
                    fabric.faults() != ibcm::Faults::default(),
                    "the simulated fabric's faults",
                ),
            ];
            match raw_only.iter().find(|(set, _)| *set) {
                Some((_, what)) => Err(Failure(format!("{what} does not go with --ib-dev"))),
                None => Ok(()),
            }
        }

        #[cfg(feature = "devices")]
        mod imp {
            use std::time::Duration;

            use ibcm_cli::rc::{Rc, VerbsQps};
            use ibcm_cli::rocev2::{self, ConnectConfig, StepTimes, Timing};

            use super::super::super::super::{CmtimeArgs, ExchangeArgs, Failure, print_counters};
            use super::super::{CMTIME_PORT, ms, print_served, print_steps};
            use super::check;

            fn start(a: &super::RoceArgs, dev: &str) -> Result<(Rc, VerbsQps), Failure> {
                let local = a
                    .bind
                    .ok_or_else(|| Failure("--ib-dev needs --bind ADDR".into()))?;
                let rc = Rc::start(Some(dev), local).map_err(Failure)?;
                let gid_index = rc.port().gid_index()?;
                println!(
                    "rdma: ibcm on {dev} port 1 through ib_umad ({}), CA GUID {:#018x}, GID index {}, real RC QPs",
                    local,
                    rc.port().guid(),
                    gid_index
                );
                let qps = VerbsQps::new(&rc.ctx).map_err(Failure)?;
                Ok((rc, qps))
            }

            /// The umad counts, the driver's counters; false if the verifier saw a rule
            /// broken or the port a fault (the driver panicked, the device went away).
            fn print_device(rc: &Rc) -> bool {
                let c = rc.port().counts();
                println!(
                    "rdma:     {} MADs sent, {} received; {} send errors, {} dropped; writes took {} ms, the slowest {} ms",
                    c.sent,
                    c.received,
                    c.send_errors,
                    c.dropped,
                    ms(c.write_time),
                    ms(c.slowest_write)
                );
                println!(
                    "rdma:     MADs written by the caller {}, the port's thread after a MAD read {}, after a timer pass, passive work or a port event {}",
                    c.written_by_caller, c.written_by_receiver, c.written_by_timer
                );
                for w in rc.port().warnings() {
                    println!("rdma: warning: {w}");
                }
                let faults = rc.port().faults();
                for f in &faults {
                    println!("rdma: FAULT: {f}");
                }
                print_counters(&[("this node (rdma)", &rc.provider)]);
                let violations = rc.port().node().violations();
                if !violations.is_empty() {
                    println!("verifier: {violations:?}");
                }
                violations.is_empty() && faults.is_empty()
            }

            fn print_establish(what: &str, s: &StepTimes) {
                println!(
                    "{what}: {} connections, median {} ms, min {} ms, max {} ms, all in {} ms",
                    s.count,
                    ms(s.median),
                    ms(s.min),
                    ms(s.max),
                    ms(s.total)
                );
            }

            pub fn cmtime(a: &CmtimeArgs, dev: &str) -> Result<bool, Failure> {
                check(&a.roce, &a.fabric)?;
                let peer = a.roce.peer()?;
                let connections = a
                    .connections
                    .unwrap_or(super::super::super::super::CMTIME_CONNECTIONS);
                let (rc, qps) = start(&a.roce, dev)?;
                let cfg = ConnectConfig {
                    window: a.window,
                    timing: Timing {
                        packet_life_time: a.packet_life_time,
                        cm_response_timeout: a.response_timeout,
                        max_cm_retries: a.max_cm_retries,
                    },
                    ..ConnectConfig::new(peer, a.port, connections)
                };
                println!(
                    "ibcm cmtime: {} connections to {peer} RDMA-CM TCP port {} (service ID {:#018x}), window {}; a REQ is re-sent after {} ms, {} retries",
                    cfg.count,
                    a.port,
                    cfg.service_id,
                    cfg.window,
                    ms(cfg.timing.retry_interval()),
                    cfg.timing.max_cm_retries
                );
                let log = |line: String| println!("  {line}");
                let local = rc.port().local();
                let report = rocev2::connect_on(&rc.provider, local, Some(&qps), &cfg, &log);
                print_steps(&report);
                print_establish("establish (REQ -> RTU)", &report.establish);
                let clean = print_device(&rc);
                Ok(clean
                    && report.failures.is_empty()
                    && report.established == report.attempted
                    && report.disconnected == report.established)
            }

            pub fn exchange(a: &ExchangeArgs, listen: bool, dev: &str) -> Result<bool, Failure> {
                check(&a.roce, &a.fabric)?;
                let service = super::super::exchange_service(a);
                let (rc, qps) = start(&a.roce, dev)?;
                let local = rc.port().local();
                let side = if listen { "listen" } else { "connect" };
                let t0 = std::time::Instant::now();
                let log = move |line: String| {
                    println!("[{:>10.6}] {side}: {line}", t0.elapsed().as_secs_f64());
                };
                let wait = Duration::from_secs(a.wait as u64);
                let ok = if listen {
                    let cfg = super::super::serve_config(a, &service, 0);
                    let r = rocev2::serve_on(&rc.provider, local, Some(&qps), &cfg, &log)?;
                    let ok = print_served("listen", &r, &cfg, local, a.connections);
                    print_establish("establish (REQ -> RTU)", &r.establish);
                    ok && r.failures.is_empty()
                } else {
                    let peer = a.roce.peer()?;
                    let cfg = ConnectConfig {
                        service_id: service.service_id(),
                        window: 1,
                        deadline: wait,
                        ..ConnectConfig::new(peer, CMTIME_PORT, a.connections)
                    };
                    log(format!(
                        "{} connection(s) to {peer}, {service}, one after the other",
                        a.connections
                    ));
                    let r = rocev2::connect_on(&rc.provider, local, Some(&qps), &cfg, &log);
                    print_steps(&r);
                    print_establish("establish (REQ -> RTU)", &r.establish);
                    r.failures.is_empty() && r.established == r.attempted
                };
                let clean = print_device(&rc);
                Ok(ok && clean)
            }
        }

        #[cfg(feature = "devices")]
        pub use imp::{cmtime, exchange};

        #[cfg(not(feature = "devices"))]
        pub fn cmtime(_: &CmtimeArgs, _: &str) -> Result<bool, Failure> {
            Err(Failure(
                "--ib-dev needs the `devices` feature (cargo build -p ibcm-cli --features devices)"
                    .into(),
            ))
        }

        #[cfg(not(feature = "devices"))]
        pub fn exchange(_: &ExchangeArgs, _: bool, _: &str) -> Result<bool, Failure> {
            Err(Failure(
                "--ib-dev needs the `devices` feature (cargo build -p ibcm-cli --features devices)"
                    .into(),
            ))
        }
    }
}

/// `ibcm cmtime --rocev2`: RoCEv2 is Linux's here.
#[cfg(not(target_os = "linux"))]
pub fn cmtime(a: &super::CmtimeArgs) -> Result<Option<bool>, super::Failure> {
    off_linux(&a.roce)
}

/// `ibcm listen/connect --rocev2`: RoCEv2 is Linux's here.
#[cfg(not(target_os = "linux"))]
pub fn exchange(a: &super::ExchangeArgs, _listen: bool) -> Result<Option<bool>, super::Failure> {
    off_linux(&a.roce)
}

#[cfg(not(target_os = "linux"))]
fn off_linux(r: &RoceArgs) -> Result<Option<bool>, super::Failure> {
    match r.bind {
        Some(_) => Err(super::Failure(
            "--bind (a RoCEv2 link) runs on Linux".into(),
        )),
        None => Ok(None),
    }
}
