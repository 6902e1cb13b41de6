//! Figures of cmtime runs as SVG (`ibcm cmtime --plot FILE.svg`): what a reader looks at
//! before the tables.
//!
//! - [`cmtime`]: each step's latency distribution (CDF, log time axis); the connections
//!   established over time (a storm's against the ideal N/R); with `--waves`, the drivers'
//!   memory per connection and the process's RSS wave by wave.
//! - [`port_flap`]: the connections up over time through the four runs of `--port-flap`,
//!   the ports' down times shaded.
//!
//! Drawn with plotters' SVG backend alone: text is written as SVG `<text>` (laid out with
//! plotters' own estimate of its width), so nothing needs a font library.

use std::io;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::cmtime::{Config, FlapReport, Report, Step, Wave};

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = Result<(), DrawingAreaErrorKind<io::Error>>;

/// The figure's width; each row of panels is `ROW` high, under a `HEADING`.
const WIDTH: u32 = 1400;
const ROW: u32 = 600;
const HEADING: u32 = 48;

/// Around a chart, and the room its axes' labels take (pixels).
const MARGIN: u32 = 16;
const X_LABELS: u32 = 64;
const Y_LABELS: u32 = 84;

/// Font sizes as plotters takes them (its SVG backend writes them 1/1.24 as large).
const FONT: &str = "sans-serif";
const TITLE: f64 = 26.0;
const CAPTION: f64 = 24.0;
const TEXT: f64 = 19.0;
const TICKS: f64 = 18.0;

/// Legend entries a panel has room for, one a row.
const KEY_ROWS: u32 = 5;
const KEY_ROW: u32 = 26;

/// How opaque a shaded interval is.
const SHADE: f64 = 0.18;

/// matplotlib's `tab10` colours: told apart at a glance, and by most colour-blind readers
/// better than the primaries.
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Ideals and budgets, drawn dashed.
const IDEAL: RGBColor = RGBColor(90, 90, 90);

/// The driver's memory budget per established connection, bytes (design.md,
/// "Performance budgets": <= 1 KiB nonpaged per established connection).
const BUDGET_BYTES: f64 = 1024.0;

fn color(i: usize) -> RGBColor {
    COLORS.get(i % COLORS.len()).copied().unwrap_or(BLACK)
}

/// Renders a figure of `rows` rows of panels under `heading` and writes it to `path`.
fn figure(
    path: &Path,
    heading: &str,
    rows: u32,
    draw: impl FnOnce(&Area) -> Drawn,
) -> io::Result<()> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEADING + ROW * rows.max(1)))
            .into_drawing_area();
        let drawn = root.fill(&WHITE).and_then(|()| {
            let body = root.titled(heading, (FONT, TITLE))?;
            draw(&body)?;
            root.present()
        });
        drawn.map_err(|e| io::Error::other(e.to_string()))?;
    }
    std::fs::write(path, svg)
}

/// The cmtime figure: each step's latency distribution and the connections established
/// over time, side by side; with more than one wave, a second row with the drivers'
/// memory per connection and the process's RSS wave by wave.
pub fn cmtime(
    path: &Path,
    heading: &str,
    r: &Report,
    cfg: &Config,
    waves: &[Wave],
) -> io::Result<()> {
    let rows = if waves.len() > 1 { 2 } else { 1 };
    figure(path, heading, rows, |body| {
        let rows = body.split_evenly((rows as usize, 1));
        if let Some(top) = rows.first() {
            let (left, right) = top.split_horizontally(WIDTH / 2);
            latency(&left, r)?;
            established(&right, r, cfg)?;
        }
        if let Some(bottom) = rows.get(1) {
            let (left, right) = bottom.split_horizontally(WIDTH / 2);
            wave_bytes(&left, waves)?;
            wave_memory(&right, waves)?;
        }
        Ok(())
    })
}

/// The port-flap figure: connections up (server side) through the four runs, on the
/// fabric's clock from the first REQ, with the ports' down times shaded.
pub fn port_flap(path: &Path, heading: &str, f: &FlapReport) -> io::Result<()> {
    figure(path, heading, 1, |body| flap_panel(body, f))
}

/// A time axis's unit, so that its labels stay short.
#[derive(Clone, Copy)]
struct Unit {
    name: &'static str,
    ns: f64,
}

impl Unit {
    fn for_span(span_ns: f64) -> Self {
        if span_ns >= 10e9 {
            Unit { name: "s", ns: 1e9 }
        } else if span_ns >= 10e6 {
            Unit {
                name: "ms",
                ns: 1e6,
            }
        } else {
            Unit {
                name: "\u{b5}s",
                ns: 1e3,
            }
        }
    }
}

/// A number with one decimal at most, none when it is whole.
fn short(v: f64) -> String {
    if (v - v.round()).abs() < 1e-6 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A duration in us as a reader says it: "250 us", "4.2 ms", "1 s".
fn duration_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", short(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", short(us / 1e3))
    } else {
        format!("{} \u{b5}s", short(us))
    }
}

fn duration_ns(ns: u64) -> String {
    duration_us(ns as f64 / 1e3)
}

/// How a legend entry shows its series.
#[derive(Clone, Copy)]
enum Look {
    Line,
    Dashed,
    Shaded,
}

/// A legend entry.
struct Key {
    label: String,
    color: RGBColor,
    look: Look,
}

impl Key {
    fn new(label: impl Into<String>, color: RGBColor, look: Look) -> Self {
        Self {
            label: label.into(),
            color,
            look,
        }
    }
}

/// A panel: its chart's area, and under it the strip its legend goes in (a legend inside
/// the chart would hide the lines it explains).
fn panel<'a>(area: &Area<'a>) -> (Area<'a>, Area<'a>) {
    let height = area.dim_in_pixel().1;
    area.split_vertically(height.saturating_sub(KEY_ROWS * KEY_ROW + MARGIN))
}

/// A chart with its caption, in the house style.
fn chart_builder<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(area);
    b.caption(caption, (FONT, CAPTION))
        .margin(MARGIN)
        .x_label_area_size(X_LABELS)
        .y_label_area_size(Y_LABELS);
    b
}

/// Draws the legend in its strip, lined up with the chart's left edge.
fn legend(area: &Area, keys: &[Key]) -> Drawn {
    let x = (MARGIN + Y_LABELS) as i32;
    let style = TextStyle::from((FONT, TEXT).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, k) in (0i32..).zip(keys) {
        let y = i * KEY_ROW as i32 + KEY_ROW as i32 / 2;
        match k.look {
            Look::Line => area.draw(&PathElement::new(
                vec![(x, y), (x + 32, y)],
                k.color.stroke_width(3),
            ))?,
            Look::Dashed => {
                for d in [0, 12, 24] {
                    area.draw(&PathElement::new(
                        vec![(x + d, y), (x + d + 8, y)],
                        k.color.stroke_width(3),
                    ))?;
                }
            }
            Look::Shaded => area.draw(&Rectangle::new(
                [(x, y - 8), (x + 32, y + 8)],
                k.color.mix(SHADE).filled(),
            ))?,
        }
        area.draw(&Text::new(k.label.clone(), (x + 44, y), style.clone()))?;
    }
    Ok(())
}

/// Panel 1: for each step, the share of connections that completed it within a time.
fn latency(area: &Area, r: &Report) -> Drawn {
    let (area, keys) = panel(area);
    let steps: Vec<_> = r.steps.iter().filter(|s| !s.cdf.is_empty()).collect();
    // A duration of 0 (both marks in one instant of virtual time) sits at 1 ns.
    let us = |ns: u64| ns.max(1) as f64 / 1e3;
    let lo = steps
        .iter()
        .filter_map(|s| s.cdf.first())
        .map(|&(ns, _)| us(ns))
        .fold(f64::INFINITY, f64::min);
    let hi = steps
        .iter()
        .filter_map(|s| s.cdf.last())
        .map(|&(ns, _)| us(ns))
        .fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo / 1.5, hi * 1.5)
    } else {
        (1.0, 1e3)
    };
    let mut chart = chart_builder(&area, "Latency of each step (CDF)")
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..100f64)?;
    chart
        .configure_mesh()
        .x_desc("time the step took, per connection (log scale)")
        .y_desc("connections done within that time, %")
        .x_label_formatter(&|v| duration_us(*v))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, TICKS))
        .axis_desc_style((FONT, TEXT))
        .draw()?;
    let mut key = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let c = color(i);
        let points = s.cdf.iter().map(|&(ns, q)| (us(ns), q * 100.0));
        // The whole setup is dashed: where one step is most of it (a storm's REQ -> REP),
        // the two lines coincide, and a solid one would hide the other.
        let look = if s.step == Step::Setup {
            chart.draw_series(DashedLineSeries::new(points, 10, 6, c.stroke_width(2)))?;
            Look::Dashed
        } else {
            chart.draw_series(LineSeries::new(points, c.stroke_width(2)))?;
            Look::Line
        };
        key.push(Key::new(
            format!(
                "{}: median {}, p99 {}",
                s.step.name(),
                duration_ns(s.median_ns),
                duration_ns(s.p99_ns)
            ),
            c,
            look,
        ));
    }
    legend(&keys, &key)
}

/// Panel 2: the connections established over time; a storm's against the ideal: the
/// application accepting at its rate R from the first REQ, all N up at N/R.
fn established(area: &Area, r: &Report, cfg: &Config) -> Drawn {
    let (area, keys) = panel(area);
    let s = &r.established_over_time;
    let n = r.connections as f64;
    let ideal_ns = cfg.accept_rate.map(|rate| n * 1e9 / f64::from(rate.max(1)));
    let span = (s.span_ns() as f64).max(ideal_ns.unwrap_or(0.0)).max(1.0);
    let unit = Unit::for_span(span);
    let x_max = span * 1.04 / unit.ns;
    let caption = match cfg.accept_rate {
        Some(_) => "Connections established over time (storm)",
        None => "Connections established over time",
    };
    let mut chart =
        chart_builder(&area, caption).build_cartesian_2d(0f64..x_max, 0f64..(n * 1.05).max(1.0))?;
    chart
        .configure_mesh()
        .x_desc(format!("time since the first REQ, {}", unit.name))
        .y_desc("connections established (server side)")
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, TICKS))
        .axis_desc_style((FONT, TEXT))
        .draw()?;
    let c = color(0);
    chart.draw_series(LineSeries::new(
        s.points().map(|(t, k)| (t as f64 / unit.ns, k as f64)),
        c.stroke_width(3),
    ))?;
    let took = match ideal_ns {
        Some(ideal) if ideal > 0.0 => {
            format!("{:.2}x the ideal", r.time_to_all_ns as f64 / ideal)
        }
        _ => format!(
            "{:.0} per second",
            r.established as f64 / (r.time_to_all_ns.max(1) as f64 / 1e9)
        ),
    };
    let mut key = vec![Key::new(
        format!(
            "established: {} of {} in {} ({took})",
            s.counts.last().copied().unwrap_or(0),
            r.connections,
            duration_ns(r.time_to_all_ns)
        ),
        c,
        Look::Line,
    )];
    // The ideal on top: where the run meets it, its dashes still show.
    if let (Some(ideal), Some(rate)) = (ideal_ns, cfg.accept_rate) {
        chart.draw_series(DashedLineSeries::new(
            [(0.0, 0.0), (ideal / unit.ns, n), (x_max, n)],
            10,
            6,
            IDEAL.stroke_width(2),
        ))?;
        key.push(Key::new(
            format!(
                "ideal: accepting {rate}/s, all {} up at N/R = {}",
                r.connections,
                duration_us(ideal / 1e3)
            ),
            IDEAL,
            Look::Dashed,
        ));
    }
    legend(&keys, &key)
}

/// The wave axis: wave numbers, with room on either side.
fn wave_axis(waves: &[Wave]) -> std::ops::Range<f64> {
    0.5..waves.len() as f64 + 0.5
}

/// Whole wave numbers only (the axis is continuous).
fn wave_label(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-6 && *v >= 1.0 {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

/// Panel 3, left: each node's driver memory per established connection, wave by wave,
/// against the budget.
fn wave_bytes(area: &Area, waves: &[Wave]) -> Drawn {
    let (area, keys) = panel(area);
    let nodes = waves
        .iter()
        .map(|w| w.bytes_per_connection.len())
        .max()
        .unwrap_or(0);
    let top = waves
        .iter()
        .flat_map(|w| w.bytes_per_connection.iter().copied())
        .fold(BUDGET_BYTES, f64::max)
        * 1.15;
    let mut chart = chart_builder(&area, "Driver memory per established connection, by wave")
        .build_cartesian_2d(wave_axis(waves), 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("wave")
        .y_desc("bytes per established connection")
        .x_label_formatter(&wave_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, TICKS))
        .axis_desc_style((FONT, TEXT))
        .draw()?;
    chart.draw_series(DashedLineSeries::new(
        [
            (0.5, BUDGET_BYTES),
            (waves.len() as f64 + 0.5, BUDGET_BYTES),
        ],
        10,
        6,
        IDEAL.stroke_width(2),
    ))?;
    let mut key = Vec::new();
    for node in 0..nodes {
        let c = color(node);
        chart.draw_series(
            LineSeries::new(
                waves
                    .iter()
                    .filter_map(|w| Some((w.wave as f64, *w.bytes_per_connection.get(node)?))),
                c.stroke_width(2),
            )
            .point_size(4),
        )?;
        let name = match node {
            0 => "client's driver (node 0)".to_string(),
            1 => "server's driver (node 1)".to_string(),
            n => format!("node {n}'s driver"),
        };
        key.push(Key::new(name, c, Look::Line));
    }
    key.push(Key::new(
        "budget: 1 KiB per established connection",
        IDEAL,
        Look::Dashed,
    ));
    legend(&keys, &key)
}

/// Panel 3, right: after each wave's teardown, the process's RSS (left axis) and what
/// the drivers still hold (right axis): a leak or a high-water mark kept climbs.
fn wave_memory(area: &Area, waves: &[Wave]) -> Drawn {
    let (area, keys) = panel(area);
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    let kib = |b: u64| b as f64 / 1024.0;
    let rss_top = waves
        .iter()
        .filter_map(|w| w.rss)
        .map(mib)
        .fold(1.0, f64::max)
        * 1.15;
    let driver_top = waves
        .iter()
        .filter_map(|w| w.driver_after)
        .map(kib)
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = chart_builder(&area, "Memory after each teardown, by wave")
        .right_y_label_area_size(Y_LABELS)
        .build_cartesian_2d(wave_axis(waves), 0f64..rss_top)?
        .set_secondary_coord(wave_axis(waves), 0f64..driver_top);
    chart
        .configure_mesh()
        .x_desc("wave")
        .y_desc("process RSS, MiB")
        .x_label_formatter(&wave_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, TICKS))
        .axis_desc_style((FONT, TEXT))
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("both drivers, KiB")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, TICKS))
        .axis_desc_style((FONT, TEXT))
        .draw()?;
    let (rss, drivers) = (color(4), color(5));
    chart.draw_series(
        LineSeries::new(
            waves
                .iter()
                .filter_map(|w| Some((w.wave as f64, mib(w.rss?)))),
            rss.stroke_width(2),
        )
        .point_size(4),
    )?;
    chart.draw_secondary_series(
        LineSeries::new(
            waves
                .iter()
                .filter_map(|w| Some((w.wave as f64, kib(w.driver_after?)))),
            drivers.stroke_width(2),
        )
        .point_size(4),
    )?;
    legend(
        &keys,
        &[
            Key::new("process RSS (left axis)", rss, Look::Line),
            Key::new(
                "both drivers' memory, all torn down (right axis)",
                drivers,
                Look::Line,
            ),
        ],
    )
}

/// The port flap's one panel: the server sides up in each run, and the ports' down times.
fn flap_panel(area: &Area, f: &FlapReport) -> Drawn {
    let (area, keys) = panel(area);
    let runs = [
        ("first run, ordinary teardown", &f.warm),
        ("short flap (half the deadline), then teardown", &f.short),
        ("long flap (past the deadline): every side told", &f.flap),
        ("reconnect, ordinary teardown", &f.reconnect),
    ];
    let t0 = f.warm.up_over_time.start_ns;
    let downs: Vec<(u64, u64)> = [&f.short, &f.flap]
        .iter()
        .filter_map(|r| r.flap)
        .map(|d| (d.down_at_ns, d.down_at_ns.saturating_add(d.down_ns)))
        .collect();
    let end = runs
        .iter()
        .map(|(_, r)| r.up_over_time.start_ns + r.up_over_time.span_ns())
        .chain(downs.iter().map(|&(_, b)| b))
        .max()
        .unwrap_or(t0);
    let unit = Unit::for_span(end.saturating_sub(t0) as f64);
    let x = |ns: u64| ns.saturating_sub(t0) as f64 / unit.ns;
    let x_max = (x(end) * 1.02).max(1e-9);
    let n = f.warm.connections as f64;
    let y_max = (n * 1.05).max(1.0);
    let mut chart = chart_builder(&area, "Connections up over time through a port flap")
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc(format!(
            "time since the first run's first REQ, {}",
            unit.name
        ))
        .y_desc("connections up (server side)")
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, TICKS))
        .axis_desc_style((FONT, TEXT))
        .draw()?;
    let down = color(3);
    chart.draw_series(
        downs
            .iter()
            .map(|&(a, b)| Rectangle::new([(x(a), 0.0), (x(b), y_max)], down.mix(SHADE).filled())),
    )?;
    let mut key = vec![Key::new("ports down (both nodes)", down, Look::Shaded)];
    for (i, (name, r)) in runs.iter().enumerate() {
        // The shading's colour is not a run's.
        let c = color(if i >= 3 { i + 1 } else { i });
        let s = &r.up_over_time;
        chart.draw_series(LineSeries::new(
            s.points().map(|(t, up)| (x(s.start_ns + t), up as f64)),
            c.stroke_width(2),
        ))?;
        key.push(Key::new(
            format!("{name}: {} of {} established", r.established, r.connections),
            c,
            Look::Line,
        ));
    }
    legend(&keys, &key)
}
