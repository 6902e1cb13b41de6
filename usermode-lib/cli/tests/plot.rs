//! `ibcm cmtime --plot FILE.svg`: the figure written for a run has every panel, drawn
//! from what the run measured. The runs are small and in virtual time (deterministic,
//! one core); the figures are written where cargo keeps integration tests' files.

use std::path::{Path, PathBuf};

use ibcm_cli::cmtime::{self, Config, Report, Wave};
use ibcm_cli::plot;
use ibcm_cli::sim::{Sim, SimOptions};

fn virtual_sim() -> Sim {
    Sim::start(&SimOptions {
        real_time: false,
        ..SimOptions::default()
    })
}

fn out(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// The SVG document at `path`.
fn read_svg(path: &Path) -> String {
    let svg = std::fs::read_to_string(path).expect("the plot was written");
    assert!(
        svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
        "not an SVG document: {}",
        path.display()
    );
    svg
}

/// Each text must be drawn (as an SVG `<text>`: a panel's title, a legend entry).
fn assert_texts(svg: &str, texts: &[&str], path: &Path) {
    for t in texts {
        assert!(svg.contains(t), "no `{t}` in {}", path.display());
    }
}

fn assert_complete(r: &Report, n: usize) {
    assert_eq!(r.established, n, "{:?}", r.failures);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
}

#[test]
fn cmtime_plot_has_every_panel() {
    const N: usize = 200;
    let sim = virtual_sim();
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let cfg = Config {
        connections: N,
        ..Config::default()
    };
    // `--waves 2`: two runs on the same nodes, each wave's figures taken as it ends.
    let mut waves = Vec::new();
    let mut last = None;
    for wave in 1..=2 {
        let r = cmtime::run(&client, &server, &sim, &cfg, &|_| {}).unwrap();
        assert_complete(&r, N);
        waves.push(Wave::of(wave, &r));
        last = Some(r);
    }
    let r = last.unwrap();

    // What the panels are drawn from: every step's distribution, rising to 100 %, and
    // the connections established over time, ending at all of them.
    for s in &r.steps {
        assert!(!s.cdf.is_empty(), "{:?}: no distribution", s.step);
        assert!(
            s.cdf
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1),
            "{:?}: the distribution does not rise",
            s.step
        );
        assert_eq!(s.cdf.last().map(|p| (p.0, p.1)), Some((s.max_ns, 1.0)));
    }
    let est = &r.established_over_time.counts;
    assert!(est.windows(2).all(|w| w[0] <= w[1]), "{est:?}");
    assert_eq!(est.last(), Some(&N), "{est:?}");
    // Everything was torn down: nothing is up at the end.
    assert_eq!(r.up_over_time.counts.last(), Some(&0));
    for w in &waves {
        assert_eq!(w.bytes_per_connection.len(), 2, "{w:?}");
        assert!(w.driver_after.is_some(), "{w:?}");
    }

    let path = out("cmtime.svg");
    plot::cmtime(&path, "cmtime test", &r, &cfg, &waves).unwrap();
    let svg = read_svg(&path);
    assert_texts(
        &svg,
        &[
            "Latency of each step (CDF)",
            "Connections established over time",
            "Driver memory per established connection, by wave",
            "Memory after each teardown, by wave",
            "budget: 1 KiB per established connection",
            "process RSS (left axis)",
        ],
        &path,
    );
    // A legend entry per step, each with its median.
    assert_eq!(svg.matches(": median ").count(), cmtime::Step::ALL.len());
}

#[test]
fn storm_plot_draws_the_ideal() {
    const N: usize = 200;
    let sim = virtual_sim();
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let cfg = Config {
        connections: N,
        window: N,
        backlog: 64,
        accept_rate: Some(20_000),
        ..Config::default()
    };
    let r = cmtime::run(&client, &server, &sim, &cfg, &|_| {}).unwrap();
    assert_complete(&r, N);
    let path = out("storm.svg");
    plot::cmtime(&path, "storm test", &r, &cfg, &[]).unwrap();
    let svg = read_svg(&path);
    assert_texts(
        &svg,
        &[
            "Latency of each step (CDF)",
            "Connections established over time (storm)",
            "ideal: accepting 20000/s, all 200 up at N/R = 10 ms",
            "x the ideal)",
        ],
        &path,
    );
    // One wave: no wave panels.
    assert!(!svg.contains("by wave"), "{}", path.display());
}

#[test]
fn port_flap_plot_shows_the_ports_down() {
    const N: usize = 50;
    let sim = virtual_sim();
    let (client, server) = (sim.provider(0).unwrap(), sim.provider(1).unwrap());
    let cfg = Config {
        connections: N,
        ..Config::default()
    };
    let f = cmtime::port_flap(&client, &server, &sim, &cfg, &|_| {}).unwrap();
    for r in [&f.warm, &f.short, &f.flap, &f.reconnect] {
        assert_complete(r, N);
    }
    let path = out("port-flap.svg");
    plot::port_flap(&path, "port flap test", &f).unwrap();
    let svg = read_svg(&path);
    assert_texts(
        &svg,
        &[
            "Connections up over time through a port flap",
            "ports down (both nodes)",
            "first run, ordinary teardown",
            "short flap (half the deadline), then teardown",
            "long flap (past the deadline): every side told",
            "reconnect, ordinary teardown",
        ],
        &path,
    );
    // The two flaps shaded, and the legend's sample of the shading.
    assert_eq!(
        svg.matches("opacity=\"0.18\"").count(),
        3,
        "{}",
        path.display()
    );
}
