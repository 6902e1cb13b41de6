//! `ibcm`: the command line of the ibcm connection manager.
//!
//! On Windows every command uses the installed driver unless `--simulate` is given. Off
//! Windows (or with `--simulate`) they run on the simulated fabric in this process, in real
//! time: the driver's own code on two nodes, node 0 the client and node 1 the server.
//!
//! - `ibcm cmtime`: connection setup and teardown timed step by step (rdma-core cmtime).
//! - `ibcm listen` / `ibcm connect`: ucmatose-style exchanges, printing each event.
//! - `ibcm stats`: the driver's per-attribute message counters.
//! - `ibcm status`: HCAs, ports, which CM serves them, QP1 routes, counters.
//! - `ibcm install` / `ibcm uninstall`: ibcm into or out of the HCAs' `UpperFilters`.
//! - `ibcm off` / `ibcm on`: the kill switch.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ibcm::{Faults, Provider};
use ibcm_cli::cmtime::{self, Progress, Report, Timing, Wave};
use ibcm_cli::exchange::{self, PathEnd, Service};
use ibcm_cli::plot;
use ibcm_cli::sim::{DriverMemory, Pump, Sim, SimOptions};
use ibcm_cli::status::{self, ATTRIBUTES};
use ibcm_ioctl::CountersOut;
use indicatif::{ProgressBar, ProgressStyle};

#[cfg(all(target_os = "linux", feature = "devices"))]
mod cli_fault;
mod cli_install;
#[cfg(all(target_os = "linux", feature = "devices"))]
mod cli_perftest;
#[cfg(all(target_os = "linux", feature = "devices"))]
mod cli_rc;
mod cli_reboot;
mod cli_rocev2;
mod cli_switch;
#[cfg(all(target_os = "linux", feature = "devices"))]
mod cli_udaddy;

#[derive(Parser, Debug)]
#[command(
    name = "ibcm",
    version,
    about = "ibcm, an InfiniBand connection manager: cmtime, listen/connect (ucmatose), stats, \
             status, install, off/on; rping, ucmatose, udaddy, rc-bw, perftest, port-fault on RDMA devices",
    long_about = "ibcm, an InfiniBand connection manager, and tools that exercise it. On \
                  Windows every command uses the installed ibcm driver unless --simulate is \
                  given. Elsewhere (or with --simulate) cmtime, listen, connect, stats and \
                  status run on a simulated two-node fabric in this process (node 0: client, \
                  node 1: server), in real time; on Linux, with --bind ADDR they run on a real \
                  RoCEv2 link, peers of rdma-core's tools (and with --ib-dev on an RDMA \
                  device). rping, ucmatose, udaddy, rc-bw, perftest and port-fault run \
                  on an RDMA device (Linux, built with the feature `devices`). Short options \
                  follow the rdma-core tool each command mirrors. On the simulated fabric \
                  the CLI's handles are an administrator's (as a kernel client's would be): \
                  no per-handle quota, per-account or all-users budget, or user limit on \
                  packet life time applies, so cmtime at 10^6 connections and the storms \
                  are not throttled; a user's handle on Windows is (docs/security.md)."
)]
struct Cli {
    /// Trace what the driver does on stderr: -v connection milestones and failures with
    /// their reason, -vv every state change, retry and drop, -vvv every MAD and timer
    /// pass. RUST_LOG (e.g. `RUST_LOG=ibcm=debug`) overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// Each command's options are built only when it is the one given (`defer`): building
/// all of them took 80 of the 170 ms from `main` to an rping client's REQ on the harness's
/// TCG guests, 33 ms with this. A deferred command takes the about text of its options'
/// structs' doc comments over its own, so those structs carry plain comments.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum Command {
    /// Time connection setup and teardown over many connections (like rdma-core cmtime).
    Cmtime(CmtimeArgs),
    /// Accept connections (ucmatose server); on the simulated fabric an internal client
    /// connects to it.
    Listen(ExchangeArgs),
    /// Open connections (ucmatose client); on the simulated fabric an internal server
    /// accepts them.
    Connect(ExchangeArgs),
    /// Show the driver's per-attribute message counters (sent, received, duplicates,
    /// retries); on the simulated fabric after a short exchange.
    Stats(StatsArgs),
    /// Show, read-only, every HCA devnode of this host with or without ibcm: its
    /// UpperFilters, whether ibcm is loaded in its stack, its QP1 route and which CM serves
    /// WinVerbs and ndfltr there; the kill switch; the driver's HCAs, ports and counters
    /// (Windows). With --simulate (the only mode off Windows), the simulated fabric's two
    /// nodes after a short exchange, marked as simulated.
    Status(StatusArgs),
    /// Put ibcm into each HCA's UpperFilters directly above ibbus, keeping every other
    /// filter in its order, and restart the HCA (Windows; --list shows the edit on a
    /// given list).
    Install(cli_install::FilterArgs),
    /// Take ibcm out of each HCA's UpperFilters, leaving the other filters as they were,
    /// and restart the HCA (Windows; --list shows the edit on a given list).
    Uninstall(cli_install::FilterArgs),
    /// Switch ibcm off (the kill switch: the service's Parameters\Disabled = 1): it stays
    /// in each HCA's stack but binds nothing and answers no CM query, so AL's CM serves
    /// every client; applies at each HCA's start, so it offers to restart them (Windows).
    Off(cli_switch::SwitchArgs),
    /// Switch ibcm back on (Parameters\Disabled = 0); offers to restart the HCAs (Windows).
    On(cli_switch::SwitchArgs),
    /// rdma-core rping's exchange on a real RDMA device (RDMA READ, RDMA WRITE, SEND),
    /// every ping verified; a peer for Linux `rping -v -V` in either role.
    #[cfg(all(target_os = "linux", feature = "devices"))]
    Rping(cli_rc::RpingArgs),
    /// rdma-core ucmatose's exchange on a real RDMA device: -c connections, each with -C
    /// messages of -S bytes each way, then both sides disconnect; a peer for Linux
    /// `ucmatose` in either role.
    #[cfg(all(target_os = "linux", feature = "devices"))]
    Ucmatose(cli_rc::UcmatoseArgs),
    /// RDMA READ and SEND bandwidth between two ibcm nodes on real RDMA devices, every
    /// byte verified.
    #[cfg(all(target_os = "linux", feature = "devices"))]
    RcBw(cli_rc::BwArgs),
    /// rdma-core udaddy's exchange on a real RDMA device: a UD QP resolved with SIDR, -C
    /// datagrams of -S bytes each way; a peer for Linux `udaddy` in either role.
    #[cfg(all(target_os = "linux", feature = "devices"))]
    Udaddy(cli_udaddy::UdaddyArgs),
    /// A peer for Linux perftest's `ib_send_bw -R`, `ib_read_bw -R`, `ib_write_bw -R`,
    /// `ib_read_lat -R` and `ib_send_lat -R` (rdma_cm mode) in either role: its control
    /// connection, parameter exchange, report or latency line; a peer running another
    /// test is refused (exit 1). Not `ib_write_lat`.
    #[cfg(all(target_os = "linux", feature = "devices"))]
    Perftest(cli_perftest::PerftestArgs),
    /// rping's client while the port goes down under it: the CM event, the QP in ERR,
    /// nothing left in the engine; then, the port back, a new connection's pings verified.
    #[cfg(all(target_os = "linux", feature = "devices"))]
    PortFault(cli_fault::FaultArgs),
}

/// MaxHeldRequestsPerListen: 1 to 2^32 - 1 (0 is the registry's "unset").
fn held_requests(s: &str) -> Result<u32, String> {
    let n = number(s)?;
    match u32::try_from(n) {
        Ok(h) if h > 0 => Ok(h),
        _ => Err(format!("{n} is out of range (1 to {})", u32::MAX)),
    }
}

/// A probability in [0, 1].
fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number (expected a fraction from 0 to 1)"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{v} is out of range (expected a fraction from 0 to 1)"
        ))
    }
}

/// A 64-bit number, decimal or 0x-hex.
fn number(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => s.replace('_', "").parse(),
    };
    r.map_err(|_| format!("`{s}` is not a number (decimal or 0x-hex)"))
}

fn positive(s: &str) -> Result<usize, String> {
    match number(s)? {
        0 => Err("must be at least 1".into()),
        n => usize::try_from(n).map_err(|_| format!("{n} is too large")),
    }
}

fn ib_time(s: &str) -> Result<u8, String> {
    match number(s)? {
        n @ 0..=31 => Ok(n as u8),
        n => Err(format!(
            "{n} is out of range (an IB time exponent, 0 to 31)"
        )),
    }
}

fn retries(s: &str) -> Result<u8, String> {
    match number(s)? {
        n @ 0..=15 => Ok(n as u8),
        n => Err(format!("{n} is out of range (MaxCMRetries is 0 to 15)")),
    }
}

// Options of the simulated fabric.
#[derive(Args, Debug, Clone)]
struct FabricArgs {
    /// Probability that a MAD is lost (0..1).
    #[arg(long, value_name = "P", default_value = "0", value_parser = fraction)]
    loss: f64,
    /// Probability that a MAD is delivered twice (0..1).
    #[arg(long, value_name = "P", default_value = "0", value_parser = fraction)]
    dup: f64,
    /// Probability that a MAD is held back behind later ones (0..1).
    #[arg(long, value_name = "P", default_value = "0", value_parser = fraction)]
    reorder: f64,
    /// Probability that a MAD has a byte corrupted (0..1).
    #[arg(long, value_name = "P", default_value = "0", value_parser = fraction)]
    corrupt: f64,
    /// Extra one-way delay of every MAD, ns.
    #[arg(long, value_name = "NS", default_value = "0", value_parser = number)]
    delay: u64,
    /// Seed of the nodes' RNGs and of the fault decisions.
    #[arg(long, value_name = "S", default_value = "1", value_parser = number)]
    seed: u64,
    /// Capture every MAD and write it to FILE as RoCEv2 frames (pcap, Ethernet).
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// The simulated drivers' MaxHeldRequestsPerListen (the Windows driver's registry
    /// value): REQs a listen holds past its backlog, their senders kept waiting by MRAs,
    /// before it refuses one at once with REJ(NoResources) [default: 131072]. Raise it
    /// for a storm larger than backlog + 131072 clients.
    #[arg(long, value_name = "N", value_parser = held_requests)]
    max_held_requests: Option<u32>,
    /// Use the installed ibcm driver (Windows only; there it is the default).
    #[arg(long)]
    device: bool,
    /// Run on the simulated fabric in this process: two nodes, each the whole driver (the
    /// default off Windows; on Windows the installed driver is used unless this is given).
    #[arg(long, conflicts_with = "device")]
    simulate: bool,
}

impl FabricArgs {
    /// Whether the command runs on the installed driver: on Windows unless `--simulate`
    /// is given, elsewhere only with `--device` (which then fails: there is no driver).
    fn use_device(&self) -> bool {
        self.device || (cfg!(windows) && !self.simulate)
    }

    fn faults(&self) -> Faults {
        Faults {
            loss: self.loss,
            duplicate: self.dup,
            reorder: self.reorder,
            delay_ns: self.delay,
            corrupt: self.corrupt,
        }
    }

    fn sim(&self, real_time: bool) -> Sim {
        Sim::start(&SimOptions {
            nodes: 2,
            seed: self.seed,
            faults: self.faults(),
            capture: self.pcap.is_some(),
            real_time,
            max_held_requests: self.max_held_requests,
        })
    }

    fn describe(&self, sim: &Sim) -> String {
        let f = self.faults();
        let faults = if f == Faults::default() {
            "no faults".to_string()
        } else {
            format!(
                "loss {}, duplication {}, reordering {}, corruption {}, extra delay {} ns",
                f.loss, f.duplicate, f.reorder, f.corrupt, f.delay_ns
            )
        };
        let held = self.max_held_requests.map_or(String::new(), |h| {
            format!(", {h} held REQs per listen at most")
        });
        format!(
            "simulated fabric in {} time, seed {}, {faults}{held}",
            if sim.is_real_time() {
                "real"
            } else {
                "virtual"
            },
            self.seed
        )
    }
}

/// Connections of a simulated cmtime run when `-c` is not given.
const SIM_CONNECTIONS: usize = 10_000;
/// Connections of a cmtime run on a link or device when `-c` is not given (rdma-core
/// cmtime's default).
const CMTIME_CONNECTIONS: usize = 100;

#[derive(Args, Debug)]
struct CmtimeArgs {
    /// Connections to open [default: 10000 on the simulated fabric, 100 (rdma-core
    /// cmtime's) on a RoCEv2 link or device]. The simulated main job opens 10 000: at
    /// cmtime's 100 the run lasts a few milliseconds, too short for a rate, percentiles
    /// or the driver's memory per connection to mean anything.
    #[arg(short = 'c', long, value_parser = positive)]
    connections: Option<usize>,
    /// Client threads starting connections (each with its own completion port).
    #[arg(long, default_value = "1", value_parser = positive)]
    threads: usize,
    /// Most connections in flight at once.
    #[arg(long, default_value = "256", value_parser = positive)]
    window: usize,
    /// Service ID to listen on and connect to (simulated fabric; a link uses --port).
    #[arg(long, default_value = "0x1c0de", value_parser = number)]
    service_id: u64,
    /// The server's RDMA-CM TCP port (rdma-core cmtime's -p; a RoCEv2 link or device).
    #[arg(short = 'p', long, default_value_t = cli_rocev2::CMTIME_PORT)]
    port: u16,
    /// PacketLifeTime (IB time exponent: 4.096 us x 2^t).
    #[arg(long, default_value = "10", value_parser = ib_time)]
    packet_life_time: u8,
    /// CM response timeout (IB time exponent).
    #[arg(long, default_value = "15", value_parser = ib_time)]
    response_timeout: u8,
    /// MaxCMRetries: REQs re-sent before the connection times out (Linux rdma_cm's is
    /// 15).
    #[arg(long, default_value = "15", value_parser = retries)]
    max_cm_retries: u8,
    /// Run the simulated fabric in virtual time on this thread (deterministic; the whole
    /// stack on one core).
    #[arg(long)]
    virtual_time: bool,
    /// Print the report as one JSON object (steps, setup, teardown, storm, driver
    /// memory, failures, faults, counters) instead of text.
    #[arg(long)]
    json: bool,
    /// The server's listen backlog: REQs its driver holds for the application before
    /// the application takes them (ListenParams.backlog).
    #[arg(long, value_name = "B", default_value = "4096", value_parser = positive)]
    backlog: usize,
    /// Reconnect storm: the server application accepts R requests per second of the
    /// fabric's clock (modelled; default: as fast as it can). With --window equal to
    /// --connections every REQ leaves at once, as when every client of a restarted
    /// server reconnects; the report sets the time until all are established against
    /// the ideal N/R, and shows the REQ retries, MRAs and REJs in the counters.
    #[arg(long, value_name = "R", value_parser = positive)]
    accept_rate: Option<usize>,
    /// Churn: run W waves of --connections each on the same nodes (each set up and torn
    /// down before the next), printing the drivers' memory and the process's RSS after
    /// every wave: a leak or a high-water mark kept shows as growth.
    #[arg(long, value_name = "W", default_value = "1", value_parser = positive)]
    waves: usize,
    /// Time the simulated drivers' DISPATCH_LEVEL entry points (what a receive DPC or
    /// the timer DPC would hold a CPU for) and print their percentiles.
    #[arg(long)]
    dpc_times: bool,
    /// Port flap (simulated fabric): set up --connections, flap both nodes' ports for half
    /// the connections' deadline (their QPs' transport retries: nothing may end, an
    /// ordinary teardown follows); set them up again and take the ports down for longer
    /// than the deadline (a cable pulled), so every connection's two sides are told by
    /// their drivers (an established one reads it as the peer's DREQ); the ports come
    /// back, each side answers, the owed DREQs go out, timewait runs out, and all
    /// reconnect. The table shows the deadline, how long the ports were down, the time to
    /// tell every side, the MADs sent while down (0), the reconnect's time to all against
    /// the ideal (the first setup of the same N), its retries and failures, and the
    /// drivers' memory at the baseline (after a first run of the same N the ordinary
    /// way), with all established, after the flap and after the reconnect. Combine with
    /// --loss, --dup and --reorder for faults.
    #[arg(long, conflicts_with_all = ["waves", "accept_rate", "json"])]
    port_flap: bool,
    /// A peer that reboots (simulated fabric): set up --connections, then node 0 (the
    /// client) reboots: a fresh driver on the same port and CA GUID, every connection gone
    /// without a word to node 1. Its application reconnects each from the QPN it used
    /// before; node 1, the survivor, refuses each such REQ with REJ(StaleConn) and ends
    /// the old connection with a DREQ (IBA 12.9.8.3.1), and the client tries again once
    /// its refused attempt's timewait is over. Prints the time until the survivor had
    /// ended every stale connection and until all were made again, the REJ, DREQ and DREP
    /// counts, the retries, and what both drivers hold after the teardown (CEPs, timer
    /// entries, handles, endpoints: none).
    #[arg(long, conflicts_with_all = ["waves", "accept_rate", "port_flap", "plot", "device"])]
    peer_reboot: bool,
    /// Draw the run as an SVG figure: each step's latency distribution (CDF), the
    /// connections established over time (with --accept-rate against the ideal N/R), and
    /// with --waves the drivers' bytes per connection and the process's RSS wave by wave;
    /// with --port-flap, the connections up over time through its runs, the ports' down
    /// times shaded. Simulated fabric and --device.
    #[arg(long, value_name = "FILE.svg", conflicts_with = "bind")]
    plot: Option<PathBuf>,
    #[command(flatten)]
    fabric: FabricArgs,
    #[command(flatten)]
    roce: cli_rocev2::RoceArgs,
    #[command(flatten)]
    lids: DeviceLids,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("service").args(["port", "service_id"])))]
struct ExchangeArgs {
    /// RDMA-CM TCP port: its port-space service ID, and an RDMA-CM IP header in the REQ
    /// (ucmatose's -p) [default on a RoCEv2 link: 7471].
    #[arg(short = 'p', long)]
    port: Option<u16>,
    /// Service ID (decimal or 0x-hex) when not using --port.
    #[arg(long, value_parser = number)]
    service_id: Option<u64>,
    /// Connections, one after the other (ucmatose's -c).
    #[arg(short = 'c', long, default_value = "1", value_parser = positive)]
    connections: usize,
    /// Longest wait for a peer's REQ or DREQ, seconds.
    #[arg(long, default_value = "30", value_parser = positive)]
    wait: usize,
    /// Simulated fabric: the service ID the other node listens on (default: the one
    /// connected to). Another one shows how the CM refuses a REQ for a service nobody
    /// listens on (REJ reason 8, invalid service ID; see it with -v).
    #[arg(long, value_name = "ID", value_parser = number, conflicts_with = "device")]
    peer_service: Option<u64>,
    #[command(flatten)]
    fabric: FabricArgs,
    #[command(flatten)]
    roce: cli_rocev2::RoceArgs,
    #[command(flatten)]
    lids: DeviceLids,
}

// The path's LIDs when running against the installed driver (`--device`).
#[derive(Args, Debug)]
struct DeviceLids {
    /// Device mode: this node's LID (the client connects from it).
    #[arg(long, value_name = "LID", value_parser = number)]
    local_lid: Option<u64>,
    /// Device mode: the peer's LID, the server's (connect and cmtime; may be the local
    /// one).
    #[arg(long, value_name = "LID", value_parser = number)]
    remote_lid: Option<u64>,
}

impl DeviceLids {
    /// The simulated fabric makes its own LIDs: none may be given for it.
    fn none_for_the_simulation(&self) -> Result<(), Failure> {
        if self.local_lid.is_some() || self.remote_lid.is_some() {
            return Err(Failure(
                "--local-lid and --remote-lid name the installed driver's path; the \
                 simulated fabric makes its own"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[derive(Args, Debug)]
struct StatsArgs {
    /// Connections of the exchange run first on the simulated fabric.
    #[arg(short = 'c', long, default_value = "100", value_parser = positive)]
    connections: usize,
    /// Print one JSON object (the run, the fabric's faults, each node's counters) instead
    /// of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    fabric: FabricArgs,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// Print JSON instead of text: an object whose `simulated` says which it describes
    /// (this host's devnodes and driver, or the simulated nodes).
    #[arg(long)]
    json: bool,
    /// Connections of the exchange run first on the simulated fabric.
    #[arg(short = 'c', long, default_value = "10", value_parser = positive)]
    connections: usize,
    #[command(flatten)]
    fabric: FabricArgs,
}

/// A failure of the command: the message, and the exit code.
pub(crate) struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let result = match cli.command {
        Command::Cmtime(a) => cmtime_command(&a),
        Command::Listen(a) => exchange_command(&a, true),
        Command::Connect(a) => exchange_command(&a, false),
        Command::Stats(a) => stats_command(&a),
        Command::Status(a) => status_command(&a),
        Command::Install(a) => cli_install::command(cli_install::Action::Install, &a),
        Command::Uninstall(a) => cli_install::command(cli_install::Action::Uninstall, &a),
        Command::Off(a) => cli_switch::command(true, &a),
        Command::On(a) => cli_switch::command(false, &a),
        #[cfg(all(target_os = "linux", feature = "devices"))]
        Command::Rping(a) => cli_rc::rping(&a),
        #[cfg(all(target_os = "linux", feature = "devices"))]
        Command::RcBw(a) => cli_rc::bw(&a),
        #[cfg(all(target_os = "linux", feature = "devices"))]
        Command::Ucmatose(a) => cli_rc::ucmatose(&a),
        #[cfg(all(target_os = "linux", feature = "devices"))]
        Command::Udaddy(a) => cli_udaddy::udaddy(&a),
        #[cfg(all(target_os = "linux", feature = "devices"))]
        Command::Perftest(a) => cli_perftest::perftest(&a),
        #[cfg(all(target_os = "linux", feature = "devices"))]
        Command::PortFault(a) => cli_fault::port_fault(&a),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(Failure(msg)) => {
            eprintln!("ibcm: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// Sends the driver's trace points (target `ibcm`) to stderr, human-readable, when asked
/// for with `-v` or RUST_LOG; otherwise installs nothing, so the driver's trace points
/// cost one branch each.
fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let level = match verbose {
        0 => None,
        1 => Some("ibcm=info"),
        2 => Some("ibcm=debug"),
        _ => Some("ibcm=trace"),
    };
    let filter = match (std::env::var("RUST_LOG"), level) {
        (Ok(env), _) if !env.is_empty() => EnvFilter::new(env),
        (_, Some(level)) => EnvFilter::new(level),
        _ => return,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

/// The installed driver (Windows).
#[cfg(windows)]
fn device() -> Result<Provider, Failure> {
    Provider::open().map_err(|e| Failure(format!("cannot open the ibcm device: {e}")))
}

/// The installed driver: there is none off Windows.
#[cfg(not(windows))]
fn device() -> Result<Provider, Failure> {
    Err(Failure(
        "--device needs the ibcm driver, which runs on Windows; without --device the \
         simulated fabric is used"
            .into(),
    ))
}

fn lid(v: Option<u64>, what: &str) -> Result<u16, Failure> {
    let v = v.ok_or_else(|| Failure(format!("--device needs --{what}")))?;
    u16::try_from(v).map_err(|_| Failure(format!("--{what} {v} is not a 16-bit LID")))
}

fn write_capture(fabric: &FabricArgs, sim: &Sim) -> Result<(), Failure> {
    if let Some(path) = &fabric.pcap {
        let n = sim
            .write_pcap(path)
            .map_err(|e| Failure(format!("cannot write {}: {e}", path.display())))?;
        println!("pcap: {n} RoCEv2 frames written to {}", path.display());
    }
    Ok(())
}

fn progress_bar() -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>10} [{bar:40}] {pos}/{len} ({per_sec}, {elapsed_precise})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    Some(bar)
}

fn cmtime_command(a: &CmtimeArgs) -> Result<bool, Failure> {
    if let Some(ok) = cli_rocev2::cmtime(a)? {
        return Ok(ok);
    }
    let connections = a.connections.unwrap_or(if a.fabric.use_device() {
        CMTIME_CONNECTIONS
    } else {
        SIM_CONNECTIONS
    });
    let mut cfg = cmtime::Config {
        connections,
        window: a.window,
        threads: a.threads,
        service_id: a.service_id,
        timing: Timing {
            packet_life_time: a.packet_life_time,
            cm_response_timeout: a.response_timeout,
            max_cm_retries: a.max_cm_retries,
        },
        backlog: u32::try_from(a.backlog).unwrap_or(u32::MAX),
        accept_rate: a.accept_rate.map(|r| u32::try_from(r).unwrap_or(u32::MAX)),
        ..cmtime::Config::default()
    };
    let bar = progress_bar();
    let on_progress = |p: Progress| {
        if let Some(b) = &bar {
            if b.length() != Some(p.total as u64) || b.prefix() != p.phase {
                b.set_prefix(p.phase);
                b.set_length(p.total as u64);
                b.reset();
            }
            b.set_position(p.done as u64);
        }
    };
    let t = cfg.timing;
    let timing = format!(
        "packet life time {}, response timeout {} (a retry every {}, {} retries)",
        ms(ib_ns(t.packet_life_time)),
        ms(ib_ns(t.cm_response_timeout)),
        ms(t.retry_interval().as_nanos() as u64),
        t.max_cm_retries
    );
    if a.fabric.use_device() {
        if a.virtual_time {
            return Err(Failure("--virtual-time is for the simulated fabric".into()));
        }
        if a.fabric.max_held_requests.is_some() {
            return Err(Failure(
                "--max-held-requests is for the simulated fabric (the driver reads the \
                 registry value MaxHeldRequestsPerListen)"
                    .into(),
            ));
        }
        let provider = device()?;
        let (local, remote) = (
            lid(a.lids.local_lid, "local-lid")?,
            lid(a.lids.remote_lid, "remote-lid")?,
        );
        if !a.json {
            println!(
                "ibcm cmtime: {} connections on the ibcm device, LID {local} -> LID {remote}",
                cfg.connections
            );
            println!("timing: {timing}");
        }
        cfg.client = PathEnd::lid(local);
        cfg.server = PathEnd::lid(remote);
        let pump = ibcm_cli::sim::RealTimePump::default();
        let report = cmtime::run(&provider, &provider, &pump, &cfg, &on_progress)?;
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        if a.json {
            let j = report_json(&report, &cfg, &[("device", &provider)], None);
            println!("{}", serde_json::to_string_pretty(&j)?);
        } else {
            print_report(&report, &cfg);
            print_counters(&[("device", &provider)]);
        }
        let heading = format!(
            "ibcm cmtime: {} connections on the ibcm device, window {}",
            cfg.connections, cfg.window
        );
        write_plot(a, |path| plot::cmtime(path, &heading, &report, &cfg, &[]))?;
        return Ok(report.established == report.connections);
    }
    a.lids.none_for_the_simulation()?;
    let sim = a.fabric.sim(!a.virtual_time);
    let (client, server) = (sim.provider(0)?, sim.provider(1)?);
    if !a.json {
        println!(
            "ibcm cmtime: {} connections, window {}, {} client thread(s); {}",
            cfg.connections,
            cfg.window,
            if sim.is_virtual() { 1 } else { cfg.threads },
            a.fabric.describe(&sim)
        );
        println!("timing: {timing}");
    }
    if a.dpc_times {
        sim.time_dpcs();
    }
    if a.peer_reboot {
        drop((client, server));
        let r = ibcm_cli::reboot::run(&sim, &cfg, &on_progress)?;
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        if a.json {
            let mut j = cli_reboot::json(&r);
            j["fabric"] = serde_json::json!(a.fabric.describe(&sim));
            j["timing"] = serde_json::json!(timing);
            println!("{}", serde_json::to_string_pretty(&j)?);
            return Ok(r.clean());
        }
        let clean = cli_reboot::print(&r);
        print_faults(&sim);
        write_capture(&a.fabric, &sim)?;
        return Ok(clean);
    }
    if a.port_flap {
        let flap = cmtime::port_flap(&client, &server, &sim, &cfg, &on_progress)?;
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        let ok = print_flap(&flap);
        let heading = format!(
            "ibcm cmtime --port-flap: {} connections; {}",
            cfg.connections,
            a.fabric.describe(&sim)
        );
        write_plot(a, |path| plot::port_flap(path, &heading, &flap))?;
        if a.dpc_times {
            print_dpc_times(&sim);
        }
        print_faults(&sim);
        print_counters(&[("client (node 0)", &client), ("server (node 1)", &server)]);
        drop((client, server));
        write_capture(&a.fabric, &sim)?;
        return Ok(check_driver(&sim) && ok);
    }
    let mut report = cmtime::run(&client, &server, &sim, &cfg, &on_progress)?;
    let mut all_established = report.established == report.connections;
    let mut waves = Vec::new();
    let mut wave_figures = Vec::new();
    if a.waves > 1 {
        let start = std::time::Instant::now();
        for wave in 1..=a.waves {
            if wave > 1 {
                report = cmtime::run(&client, &server, &sim, &cfg, &on_progress)?;
                all_established &= report.established == report.connections;
            }
            let w = Wave::of(wave, &report);
            waves.push(print_wave(&w, a.waves, &report, &sim, start, a.json));
            wave_figures.push(w);
        }
        if !a.json {
            println!("last wave:");
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let heading = format!(
        "ibcm cmtime: {} connections{}, window {}{}; {}",
        cfg.connections,
        if a.waves > 1 {
            format!(" x {} waves (latency and setup: the last wave's)", a.waves)
        } else {
            String::new()
        },
        cfg.window,
        cfg.accept_rate.map_or(String::new(), |r| format!(
            ", backlog {}, accepting {r}/s",
            cfg.backlog
        )),
        a.fabric.describe(&sim)
    );
    let draw = |path: &Path| plot::cmtime(path, &heading, &report, &cfg, &wave_figures);
    if a.json {
        write_plot(a, draw)?;
        let nodes = [("client (node 0)", &client), ("server (node 1)", &server)];
        let mut j = report_json(&report, &cfg, &nodes, Some(&sim));
        j["fabric"] = serde_json::json!(a.fabric.describe(&sim));
        j["timing"] = serde_json::json!(timing);
        if a.waves > 1 {
            j["waves"] = serde_json::json!(waves);
        }
        if a.dpc_times {
            j["dpc_times"] = dpc_times_json(&sim);
        }
        drop((client, server));
        write_capture(&a.fabric, &sim)?;
        let (clean, driver) = driver_check(&sim);
        j["driver"] = driver;
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(clean && all_established);
    }
    print_report(&report, &cfg);
    write_plot(a, draw)?;
    if a.dpc_times {
        print_dpc_times(&sim);
    }
    print_faults(&sim);
    print_counters(&[("client (node 0)", &client), ("server (node 1)", &server)]);
    drop((client, server));
    write_capture(&a.fabric, &sim)?;
    Ok(check_driver(&sim) && all_established)
}

/// Percentiles of the DISPATCH_LEVEL entry points, per node.
fn print_dpc_times(sim: &Sim) {
    println!(
        "{:<32} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "DISPATCH_LEVEL time", "count", "p50 us", "p99 us", "p99.9 us", "max us"
    );
    for (node, t) in sim.dpc_times().iter().enumerate() {
        for (what, h) in [
            ("receive, 16 MADs", &t.full_receive_batches),
            ("receive, 1-15 MADs", &t.other_receive_batches),
            ("timer pass", &t.timer_passes),
        ] {
            println!(
                "node {node}: {what:<24} {:>9} {:>9} {:>9} {:>9} {:>9}",
                h.len(),
                us(h.value_at_quantile(0.5)),
                us(h.value_at_quantile(0.99)),
                us(h.value_at_quantile(0.999)),
                us(h.max())
            );
        }
    }
}

/// Writes `--plot`'s figure, if asked for, and says where (unless stdout is for the
/// JSON alone).
fn write_plot(
    a: &CmtimeArgs,
    draw: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), Failure> {
    if let Some(path) = &a.plot {
        draw(path)
            .map_err(|e| Failure(format!("cannot write the plot {}: {e}", path.display())))?;
        if !a.json {
            println!("plot:     {}", path.display());
        }
    }
    Ok(())
}

/// One line per churn wave: what was set up, and what the drivers and the process hold
/// once it is torn down (printed, or only returned as JSON with `json`).
fn print_wave(
    w: &Wave,
    waves: usize,
    r: &Report,
    sim: &Sim,
    start: std::time::Instant,
    json: bool,
) -> serde_json::Value {
    let (wave, rss) = (w.wave, w.rss);
    let m = DriverMemory::sum(&sim.driver_memory());
    let j = serde_json::json!({
        "wave": wave,
        "established": r.established,
        "connections": r.connections,
        "setups_per_s": r.setup_rate(),
        "driver_bytes_after_teardown": memory_json(&m),
        "rss_bytes": rss,
        "elapsed_s": start.elapsed().as_secs_f64(),
    });
    if json {
        return j;
    }
    println!(
        "wave {wave:>4}/{waves}: {}/{} established, {:.0} setups/s; after the teardown the \
         drivers hold {} KB (engine {} KB, endpoints {} KB, event records {} KB), RSS {}, \
         {:.1} s in",
        r.established,
        r.connections,
        r.setup_rate(),
        m.total() / 1024,
        m.engine / 1024,
        m.endpoints / 1024,
        m.records / 1024,
        rss.map_or("?".to_string(), |b| format!("{} MB", b >> 20)),
        start.elapsed().as_secs_f64(),
    );
    j
}

/// After the handles closed: CEPs left in the engines, and what the host verifier saw.
fn check_driver(sim: &Sim) -> bool {
    let (clean, j) = driver_check(sim);
    println!(
        "driver:   {} CEPs left once both sides were out of timewait; verifier: {}",
        j["ceps_left"],
        if clean || j["violations"].as_object().is_none_or(|v| v.is_empty()) {
            "clean".to_string()
        } else {
            j["violations"].to_string()
        }
    );
    clean
}

/// Whether the drivers ended clean (no CEP left, no verifier violation), and what they
/// left, as JSON.
fn driver_check(sim: &Sim) -> (bool, serde_json::Value) {
    let leaks = sim.live_ceps(0) + sim.live_ceps(1);
    let violations = sim.violations();
    let mut kinds: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for (node, v) in &violations {
        let name = format!("{v:?}");
        let kind = name.split([' ', '{']).next().unwrap_or("?").to_string();
        *kinds.entry(format!("node {node}: {kind}")).or_default() += 1;
    }
    (
        leaks == 0 && violations.is_empty(),
        serde_json::json!({ "ceps_left": leaks, "violations": kinds }),
    )
}

fn ib_ns(t: u8) -> u64 {
    ibcm_mad::ib_time_ns(t).unwrap_or(0)
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

fn ms3(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

/// The port flap's table; true if every side was told, nothing was sent while the ports
/// were down, all reconnected and nothing failed.
fn print_flap(f: &cmtime::FlapReport) -> bool {
    let n = f.flap.connections;
    let none = cmtime::FlapFigures {
        told: 0,
        told_all_ns: 0,
        sent_while_down: 0,
        deadline_ns: 0,
        down_ns: 0,
        down_at_ns: 0,
    };
    let figures = f.flap.flap.unwrap_or(none);
    let short = f.short.flap.unwrap_or(none);
    let clean = |r: &Report| {
        r.outcomes
            .iter()
            .map(|c| {
                usize::from(c.client == cmtime::Outcome::Complete)
                    + usize::from(c.server == cmtime::Outcome::Complete)
            })
            .sum::<usize>()
    };
    let failures = |r: &Report| r.failures.values().sum::<usize>();
    println!();
    println!(
        "short port flap: {n} connections, both nodes' ports down for {} (half the \
         deadline of {}), then back, then an ordinary teardown",
        ms3(short.down_ns),
        ms3(short.deadline_ns)
    );
    println!("{:<44} {:>14} {:>14}", "", "measured", "ideal");
    println!(
        "{:<44} {:>14} {:>14}",
        "established before the flap", f.short.established, n
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "sides that ended cleanly (DREQ, DREP, timewait)",
        clean(&f.short),
        2 * n
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "MADs sent while the ports were down", short.sent_while_down, 0
    );
    println!("{:<44} {:>14} {:>14}", "failures", failures(&f.short), 0);
    for (reason, count) in &f.short.failures {
        println!("  short flap: {count} x {reason}");
    }
    println!();
    println!(
        "port flap: {n} connections (after a first run of {n} the ordinary way: the \
         baseline), both nodes' ports down for {} (deadline {}), then back",
        ms3(figures.down_ns),
        ms3(figures.deadline_ns)
    );
    println!("{:<44} {:>14} {:>14}", "", "measured", "ideal");
    println!(
        "{:<44} {:>14} {:>14}",
        "connections established before the flap", f.flap.established, n
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "sides told by their driver (once each)",
        figures.told,
        2 * f.flap.established
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "time to tell every server side",
        ms3(figures.told_all_ns),
        ms3(figures.deadline_ns)
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "MADs sent while the ports were down", figures.sent_while_down, 0
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "sides that ended cleanly (told, DREP, timewait)",
        clean(&f.flap),
        2 * n
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "reconnected (established on both sides)", f.reconnect.established, n
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "time to all reconnected (ideal: first setup)",
        ms3(f.reconnect.time_to_all_ns),
        ms3(f.warm.time_to_all_ns)
    );
    println!(
        "{:<44} {:>14.2} {:>14}",
        "reconnect / ideal",
        f.reconnect_ratio(),
        "1.00"
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "retries, all MADs; REQs (ideal: first run's)",
        format!("{}; {}", f.reconnect_retries.0, f.reconnect_retries.1),
        format!("{}; {}", f.warm_retries.0, f.warm_retries.1)
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "failures (flap; reconnect)",
        format!("{}; {}", failures(&f.flap), failures(&f.reconnect)),
        "0; 0"
    );
    for (what, r) in [("flap", &f.flap), ("reconnect", &f.reconnect)] {
        for (reason, count) in &r.failures {
            println!("  {what}: {count} x {reason}");
        }
    }
    if let (Some([_, _, before]), Some([_, established, after]), Some([_, again, last])) = (
        &f.warm.driver_memory,
        &f.flap.driver_memory,
        &f.reconnect.driver_memory,
    ) {
        let kb = |m: &[DriverMemory]| DriverMemory::sum(m).total() / 1024;
        println!(
            "{:<44} {:>14} {:>14}",
            "driver memory, both nodes (KB): baseline",
            kb(before),
            ""
        );
        println!("{:<44} {:>14}", "  all established", kb(established));
        println!(
            "{:<44} {:>14} {:>14}",
            "  after the flap (all out of timewait)",
            kb(after),
            kb(before)
        );
        println!("{:<44} {:>14}", "  all reconnected", kb(again));
        println!(
            "{:<44} {:>14} {:>14}",
            "  after the reconnect's teardown",
            kb(last),
            kb(before)
        );
    }
    figures.told == 2 * n
        && figures.sent_while_down == 0
        && short.sent_while_down == 0
        && f.short.established == n
        && clean(&f.short) == 2 * n
        && f.short.failures.is_empty()
        && f.flap.established == n
        && f.reconnect.established == n
        && f.flap.failures.is_empty()
        && f.reconnect.failures.is_empty()
}

fn step_rows(r: &Report) -> Vec<cmtime::StepRow> {
    r.steps.iter().map(cmtime::StepRow::from).collect()
}

fn print_report(r: &Report, cfg: &cmtime::Config) {
    println!();
    print!("{}", cmtime::step_table(&step_rows(r)));
    println!();
    println!(
        "setup:    {}/{} connections established on both sides in {:.3} s: {:.0} connections/s",
        r.established,
        r.connections,
        r.setup_wall.as_secs_f64(),
        r.setup_rate()
    );
    if let (Some(cpu), Some(rate)) = (r.setup_cpu, r.setup_rate_per_cpu()) {
        println!(
            "          {:.3} s of CPU (all threads): {:.0} connections per CPU-second",
            cpu.as_secs_f64(),
            rate
        );
    }
    println!(
        "teardown: {:.3} s (disconnect and timewait on both sides)",
        r.teardown_wall.as_secs_f64()
    );
    println!(
        "total:    {:.3} s, window {}",
        (r.setup_wall + r.teardown_wall).as_secs_f64(),
        cfg.window
    );
    if let Some(rate) = cfg.accept_rate {
        let ideal = r.connections as f64 / f64::from(rate.max(1));
        let took = r.time_to_all_ns as f64 / 1e9;
        println!(
            "storm:    backlog {}, accept rate {rate}/s: every connection established {:.3} s \
             after the first REQ; ideal N/R {:.3} s ({:.2}x)",
            cfg.backlog,
            took,
            ideal,
            if ideal > 0.0 { took / ideal } else { 0.0 }
        );
        if let Some(m) = r.server_memory_peak {
            println!(
                "          server driver at most {} KB during the setup (engine {} KB, \
                 endpoints {} KB, event records {} KB)",
                m.total() / 1024,
                m.engine / 1024,
                m.endpoints / 1024,
                m.records / 1024
            );
        }
    }
    if let Some([before, established, after]) = &r.driver_memory {
        let roles = ["client", "server"];
        for (node, (b, e)) in before.iter().zip(established).enumerate() {
            let per = |f: fn(&DriverMemory) -> u64| {
                f(e).saturating_sub(f(b)) as f64 / r.established.max(1) as f64
            };
            println!(
                "driver:   node {node} ({}): {:.0} bytes per established connection (engine \
                 {:.0}, endpoints {:.0}, event records {:.0}, batches {:.0}; cached private \
                 data {:.0} more)",
                roles.get(node).copied().unwrap_or("node"),
                per(DriverMemory::total),
                per(|m| m.engine),
                per(|m| m.endpoints),
                per(|m| m.records),
                per(|m| m.batches),
                per(|m| m.private_data),
            );
        }
        let [before, established, after] =
            [before, established, after].map(|m| DriverMemory::sum(m));
        println!(
            "          both nodes: {} KB before the run, {} KB established, {} KB after the \
             teardown (engine {} KB, endpoints {} KB, event records {} KB)",
            before.total() / 1024,
            established.total() / 1024,
            after.total() / 1024,
            after.engine / 1024,
            after.endpoints / 1024,
            after.records / 1024,
        );
    }
    if let Some(peak) = cmtime::process_peak_rss() {
        // Both sides of every connection live in this process: its peak over the
        // connections is what one connection costs, both ends, all parts together.
        let drivers = r.driver_memory.as_ref().map(|[before, established, _]| {
            let [b, e] = [before, established].map(|m| DriverMemory::sum(m).total());
            e.saturating_sub(b) as f64 / r.established.max(1) as f64
        });
        println!(
            "process:  peak RSS {} MB, {:.0} bytes per connection (both ends{}; the rest \
             the user library's endpoints, cmtime's tasks and bookkeeping, the allocator)",
            peak >> 20,
            peak as f64 / r.connections.max(1) as f64,
            drivers.map_or(String::new(), |d| format!(
                ", the drivers' {d:.0} of them at established"
            )),
        );
    }
    if r.failures.is_empty() {
        println!("failures: none");
    } else {
        println!("failures:");
        for (reason, n) in &r.failures {
            println!("  {n:>8}  {reason}");
        }
    }
    if r.unexpected_requests != 0 || r.stalls != 0 {
        println!(
            "anomalies: {} unexpected requests, {} stalled waits cancelled",
            r.unexpected_requests, r.stalls
        );
    }
}

/// A driver's memory by part, bytes.
fn memory_json(m: &DriverMemory) -> serde_json::Value {
    serde_json::json!({
        "total": m.total(),
        "engine": m.engine,
        "endpoints": m.endpoints,
        "records": m.records,
        "batches": m.batches,
        "clients": m.clients,
        "private_data": m.private_data,
    })
}

/// Each node's counters (or the error reading them), by name.
fn counters_json(providers: &[(&str, &Provider)]) -> serde_json::Value {
    providers
        .iter()
        .map(|(name, p)| {
            let v = match p.counters() {
                Ok(c) => status::counters_json(&c),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            };
            ((*name).to_string(), v)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The fabric's deliveries and injected faults.
fn faults_json(sim: &Sim) -> serde_json::Value {
    let f = sim.fault_counts();
    serde_json::json!({
        "delivered": sim.delivered(),
        "lost": f.lost,
        "duplicated": f.duplicated,
        "reordered": f.reordered,
        "corrupted": f.corrupted,
    })
}

/// The percentiles of the DISPATCH_LEVEL entry points, per node, us.
fn dpc_times_json(sim: &Sim) -> serde_json::Value {
    let us = |ns: u64| ns as f64 / 1e3;
    sim.dpc_times()
        .iter()
        .map(|t| {
            [
                ("receive_16_mads", &t.full_receive_batches),
                ("receive_1_15_mads", &t.other_receive_batches),
                ("timer_pass", &t.timer_passes),
            ]
            .into_iter()
            .map(|(what, h)| {
                let v = serde_json::json!({
                    "count": h.len(),
                    "p50_us": us(h.value_at_quantile(0.5)),
                    "p99_us": us(h.value_at_quantile(0.99)),
                    "p99_9_us": us(h.value_at_quantile(0.999)),
                    "max_us": us(h.max()),
                });
                (what.to_string(), v)
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
        })
        .collect::<Vec<serde_json::Value>>()
        .into()
}

/// A cmtime run as one JSON object: what `print_report` prints, plus the counters and
/// (simulated fabric) the faults. With `--accept-rate` it holds the storm's figures.
fn report_json(
    r: &Report,
    cfg: &cmtime::Config,
    nodes: &[(&str, &Provider)],
    sim: Option<&Sim>,
) -> serde_json::Value {
    let mut j = serde_json::json!({
        "connections": r.connections,
        "established": r.established,
        "window": cfg.window,
        "steps": step_rows(r).iter().map(cmtime::StepRow::json).collect::<Vec<_>>(),
        "setup": {
            "wall_s": r.setup_wall.as_secs_f64(),
            "connections_per_s": r.setup_rate(),
            "cpu_s": r.setup_cpu.map(|c| c.as_secs_f64()),
            "connections_per_cpu_s": r.setup_rate_per_cpu(),
        },
        "teardown_wall_s": r.teardown_wall.as_secs_f64(),
        "failures": r.failures,
        "unexpected_requests": r.unexpected_requests,
        "stalls": r.stalls,
        "counters": counters_json(nodes),
    });
    if let Some(rate) = cfg.accept_rate {
        let ideal = r.connections as f64 / f64::from(rate.max(1));
        let took = r.time_to_all_ns as f64 / 1e9;
        j["storm"] = serde_json::json!({
            "backlog": cfg.backlog,
            "accept_rate_per_s": rate,
            "time_to_all_s": took,
            "ideal_s": ideal,
            "ratio": if ideal > 0.0 { took / ideal } else { 0.0 },
            "server_driver_peak": r.server_memory_peak.as_ref().map(memory_json),
        });
    }
    if let Some([before, established, after]) = &r.driver_memory {
        let nodes: Vec<serde_json::Value> = before
            .iter()
            .zip(established)
            .zip(after)
            .map(|((b, e), a)| {
                serde_json::json!({
                    "before": memory_json(b),
                    "established": memory_json(e),
                    "after_teardown": memory_json(a),
                    "bytes_per_connection": e.total().saturating_sub(b.total()) as f64
                        / r.established.max(1) as f64,
                })
            })
            .collect();
        j["driver_memory"] = nodes.into();
    }
    if let Some(sim) = sim {
        j["faults"] = faults_json(sim);
    }
    j
}

fn print_faults(sim: &Sim) {
    let f = sim.fault_counts();
    println!(
        "fabric:   {} MADs delivered; faults injected: {} lost, {} duplicated, {} reordered, {} corrupted",
        sim.delivered(),
        f.lost,
        f.duplicated,
        f.reordered,
        f.corrupted
    );
}

fn print_counters(providers: &[(&str, &Provider)]) {
    for (name, p) in providers {
        match p.counters() {
            Ok(c) => print_counter_table(name, &c),
            Err(e) => println!("counters of {name}: {e}"),
        }
    }
}

fn print_counter_table(name: &str, c: &CountersOut) {
    println!();
    println!("counters, {name}:");
    println!(
        "  {:<14} {:>10} {:>10} {:>10} {:>10}",
        "attribute", "sent", "retries", "received", "duplicates"
    );
    for (i, attr) in ATTRIBUTES.iter().enumerate() {
        let (s, r, v, d) = (c.sent[i], c.retries[i], c.received[i], c.duplicates[i]);
        if s + r + v + d == 0 {
            continue;
        }
        println!("  {attr:<14} {s:>10} {r:>10} {v:>10} {d:>10}");
    }
    println!(
        "  malformed {}, unmatched {}, backlog drops {}, forged {}, quota exceeded {}",
        c.malformed, c.unmatched, c.backlog_drops, c.forged, c.quota_exceeded
    );
}

fn exchange_command(a: &ExchangeArgs, listen: bool) -> Result<bool, Failure> {
    if let Some(ok) = cli_rocev2::exchange(a, listen)? {
        return Ok(ok);
    }
    let service = match (a.port, a.service_id) {
        (Some(p), _) => Service::Port(p),
        (None, Some(id)) => Service::Id(id),
        (None, None) => Service::Id(0x1000),
    };
    let wait = Duration::from_secs(a.wait as u64);
    let side = if listen { "listen" } else { "connect" };
    let start = std::time::Instant::now();
    let log = move |line: String| {
        println!("[{:>10.6}] {side}: {line}", start.elapsed().as_secs_f64());
    };
    if a.fabric.use_device() {
        if a.peer_service.is_some() {
            return Err(Failure(
                "--peer-service is for the simulated fabric (--simulate)".into(),
            ));
        }
        let provider = device()?;
        let local = PathEnd::lid(lid(a.lids.local_lid, "local-lid")?);
        let cfg = exchange::Config {
            service,
            count: a.connections,
            local,
            remote: if listen {
                local
            } else {
                PathEnd::lid(lid(a.lids.remote_lid, "remote-lid")?)
            },
            wait,
        };
        let summary = if listen {
            exchange::listen(&provider, &cfg, &log)?
        } else {
            exchange::connect(&provider, &cfg, &log)?
        };
        println!(
            "{side}: {} connection(s) completed, {} failed",
            summary.completed,
            summary.failed.len()
        );
        return Ok(summary.failed.is_empty());
    }
    a.lids.none_for_the_simulation()?;
    let sim = a.fabric.sim(true);
    println!("{side}: {}", a.fabric.describe(&sim));
    let (client, server) = (sim.provider(0)?, sim.provider(1)?);
    let cfg = exchange::Config {
        service,
        count: a.connections,
        local: PathEnd::sim_node(0),
        remote: PathEnd::sim_node(1),
        wait,
    };
    // The peer runs on the other node, silently; this side prints.
    let quiet = |_: String| {};
    let listener = server.listen(&ibcm::ListenParams {
        service_id: a.peer_service.unwrap_or(service.service_id()),
        service_mask: u64::MAX,
        port: None,
        compare: None,
        backlog: 16,
    })?;
    let summary = std::thread::scope(|s| -> Result<exchange::Summary, Failure> {
        if listen {
            log(format!("listening on {service}"));
            let peer = s.spawn(|| exchange::connect(&client, &cfg, &quiet));
            let summary = exchange::serve(&listener, &cfg, &log)?;
            let _ = peer.join();
            Ok(summary)
        } else {
            let peer = s.spawn(|| exchange::serve(&listener, &cfg, &quiet));
            let summary = exchange::connect(&client, &cfg, &log)?;
            if !summary.failed.is_empty() {
                listener.cancel();
            }
            let _ = peer.join();
            Ok(summary)
        }
    })?;
    println!(
        "{side}: {} connection(s) completed, {} failed",
        summary.completed,
        summary.failed.len()
    );
    drop(listener);
    print_faults(&sim);
    drop((client, server));
    write_capture(&a.fabric, &sim)?;
    Ok(summary.failed.is_empty())
}

fn stats_command(a: &StatsArgs) -> Result<bool, Failure> {
    if a.fabric.use_device() {
        let provider = device()?;
        if a.json {
            let j = serde_json::json!({ "counters": counters_json(&[("device", &provider)]) });
            println!("{}", serde_json::to_string_pretty(&j)?);
        } else {
            print_counters(&[("device", &provider)]);
        }
        return Ok(true);
    }
    let sim = Arc::new(a.fabric.sim(true));
    let (client, server) = (sim.provider(0)?, sim.provider(1)?);
    let cfg = cmtime::Config {
        connections: a.connections,
        ..cmtime::Config::default()
    };
    let report = cmtime::run(&client, &server, &*sim, &cfg, &|_| {})?;
    let nodes = [("node 0 (client)", &client), ("node 1 (server)", &server)];
    if a.json {
        let j = serde_json::json!({
            "fabric": a.fabric.describe(&sim),
            "connections": report.connections,
            "established": report.established,
            "faults": faults_json(&sim),
            "counters": counters_json(&nodes),
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        println!(
            "stats: after {} connections set up and torn down ({} established) on the {}",
            report.connections,
            report.established,
            a.fabric.describe(&sim)
        );
        print_faults(&sim);
        print_counters(&nodes);
    }
    drop((client, server));
    write_capture(&a.fabric, &sim)?;
    Ok(report.established == report.connections)
}

fn status_command(a: &StatusArgs) -> Result<bool, Failure> {
    if a.fabric.use_device() {
        return host_status(a.json);
    }
    let sim = Arc::new(a.fabric.sim(true));
    let (client, server) = (sim.provider(0)?, sim.provider(1)?);
    let cfg = cmtime::Config {
        connections: a.connections,
        ..cmtime::Config::default()
    };
    let run = cmtime::run(&client, &server, &*sim, &cfg, &|_| {})?;
    let fabric = a.fabric.describe(&sim);
    let mut nodes = Vec::new();
    if !a.json {
        println!(
            "status (SIMULATED, not this host): the two nodes of the {fabric}, after {} \
             connections set up and torn down",
            run.connections
        );
    }
    for (name, p) in [("node 0 (client)", &client), ("node 1 (server)", &server)] {
        let (s, c) = (p.status()?, p.counters()?);
        if a.json {
            nodes.push(status::json(name, &s, &c));
        } else {
            print!("{}", status::text(name, &s, &c));
        }
    }
    if a.json {
        let j = serde_json::json!({ "simulated": true, "fabric": fabric, "nodes": nodes });
        println!("{}", serde_json::to_string_pretty(&j)?);
    }
    Ok(true)
}

/// `ibcm status` on this host (Windows): every HCA devnode with or without ibcm, the kill
/// switch, and the installed driver's status when it is loaded. Read-only.
#[cfg(windows)]
fn host_status(json: bool) -> Result<bool, Failure> {
    use ibcm_cli::host_report::{self, Host};
    use ibcm_cli::install_windows;
    let devnodes = install_windows::devnodes()
        .map_err(|e| Failure(format!("cannot list the devices: {e}")))?;
    let switch = install_windows::switch_value().unwrap_or(None);
    let driver = Provider::open()
        .map_err(|e| format!("cannot open \\\\.\\ibcm ({e}): ibcm is loaded in no HCA's stack"))
        .and_then(|p| {
            Ok((
                p.status().map_err(|e| e.to_string())?,
                p.counters().map_err(|e| e.to_string())?,
            ))
        });
    let host = Host {
        devnodes,
        switch,
        driver,
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&host_report::json(&host))?
        );
    } else {
        print!("{}", host_report::text(&host));
    }
    Ok(true)
}

/// `ibcm status` on this host: only Windows has the driver.
#[cfg(not(windows))]
fn host_status(_json: bool) -> Result<bool, Failure> {
    device().map(|_| true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every command shows its own about text once its deferred options are built: a doc
    /// comment on one of its options' structs would replace it (`Command`'s `defer`).
    #[test]
    fn a_deferred_command_keeps_its_own_about() {
        let unbuilt = Cli::command();
        let mut built = Cli::command();
        built.build();
        let mut seen = 0;
        for own in unbuilt.get_subcommands() {
            let name = own.get_name();
            let shown = built
                .find_subcommand(name)
                .and_then(|c| c.get_about())
                .map(ToString::to_string);
            assert_eq!(
                shown,
                own.get_about().map(ToString::to_string),
                "`ibcm {name} --help`"
            );
            seen += 1;
        }
        assert!(seen >= 9, "{seen} commands");
    }
}
