//! The PNGs of BALANCING.md, drawn by the simulator from its own rows
//! ([`crate::report`]) with `plotters` on its bitmap backend. Text is
//! rendered by `ab_glyph` with the DejaVu Sans font embedded by the
//! `dejavu` crate: pure Rust, no fontconfig or freetype on the machine.

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use crate::report::Row;
use crate::{Policy, SimError};

/// Blocking below this is drawn at it (a log axis has no 0): "none lost".
const FLOOR: f64 = 1e-7;
const FONT: &str = "sans-serif";

fn colour(policy: Policy) -> RGBColor {
    match policy {
        Policy::Pooled => RGBColor(0x1b, 0x9e, 0x77),
        Policy::Ecss => RGBColor(0x37, 0x7e, 0xb8),
        Policy::WebSip => RGBColor(0xe4, 0x1a, 0x1c),
        Policy::CallLoad => RGBColor(0xff, 0x7f, 0x00),
        Policy::LeastReported => RGBColor(0x98, 0x4e, 0xa3),
        Policy::TwoChoices => RGBColor(0x99, 0x99, 0x99),
        Policy::PooledLiteral => RGBColor(0xa6, 0x56, 0x28),
        Policy::Oracle | Policy::RoundRobin => BLACK,
    }
}

fn short(policy: Policy) -> &'static str {
    match policy {
        Policy::LeastReported => "least-rep.",
        Policy::TwoChoices => "2-choices",
        other => other.name(),
    }
}

fn err<E: std::fmt::Display>(e: E) -> SimError {
    SimError::Plot(e.to_string())
}

fn register_font() -> Result<(), SimError> {
    plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| SimError::Plot("the embedded DejaVu Sans font did not load".into()))
}

/// One panel: the rows of one scenario and G, in policy order.
struct Panel<'r> {
    title: String,
    rows: Vec<&'r Row>,
}

fn panels<'r>(rows: &'r [Row], variants: &[&str]) -> Vec<Panel<'r>> {
    let mut scenarios: Vec<&str> = Vec::new();
    for r in rows {
        if !scenarios.contains(&r.scenario.as_str()) {
            scenarios.push(&r.scenario);
        }
    }
    let mut out = Vec::new();
    for scenario in scenarios {
        for variant in variants {
            for g in [1, 3] {
                let selected: Vec<&Row> = rows
                    .iter()
                    .filter(|r| {
                        r.scenario == scenario && r.variant == *variant && r.core_hosts == g
                    })
                    .collect();
                if selected.is_empty() {
                    continue;
                }
                let variant = if *variant == "-" {
                    String::new()
                } else {
                    format!(", {variant}")
                };
                out.push(Panel {
                    title: format!("{scenario}{variant}, G = {g}"),
                    rows: selected,
                });
            }
        }
    }
    out
}

/// Blocking per policy on a log axis, with its 99 % interval, the pooled
/// Erlang-B limit (dotted) and 2 × it (dashed, the goal of SPEC §10);
/// above each bar its × pooled.
fn blocking_chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    panel: &Panel<'_>,
) -> Result<(), SimError> {
    let n = panel.rows.len() as u32;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, (FONT, 20))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(
            (0..n.saturating_sub(1)).into_segmented(),
            (FLOOR..1.0_f64).log_scale(),
        )
        .map_err(err)?;
    let names: Vec<&str> = panel.rows.iter().map(|r| short(r.policy)).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i as usize).copied().unwrap_or("").to_owned(),
            _ => String::new(),
        })
        .y_desc("blocking")
        .y_label_formatter(&|y| format!("{y:.0e}"))
        .label_style((FONT, 12))
        .draw()
        .map_err(err)?;
    for (i, r) in panel.rows.iter().enumerate() {
        let i = i as u32;
        let o = &r.outcome;
        let top = o.blocking.max(FLOOR);
        let c = colour(r.policy);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [
                    (SegmentValue::Exact(i), FLOOR),
                    (SegmentValue::Exact(i + 1), top),
                ],
                c.filled(),
            )))
            .map_err(err)?;
        if o.blocking > 0.0 {
            let lo = (o.blocking - o.half_width).max(FLOOR);
            let hi = (o.blocking + o.half_width).max(FLOOR);
            chart
                .draw_series(std::iter::once(ErrorBar::new_vertical(
                    SegmentValue::CenterOf(i),
                    lo,
                    o.blocking,
                    hi,
                    BLACK.stroke_width(1),
                    8,
                )))
                .map_err(err)?;
        }
        // Where the pooled limit is below one call in the run, × pooled
        // says nothing: the count of lost calls does.
        let lost = (o.blocking * o.calls as f64).round();
        let text = if o.blocking > 0.0 && o.pooled_erlang_b * o.calls as f64 >= 1.0 {
            times(o.times_pooled())
        } else {
            format!("{lost:.0} lost")
        };
        chart
            .draw_series(std::iter::once(Text::new(
                text,
                (SegmentValue::CenterOf(i), (top * 2.0).min(0.5)),
                (FONT, 12)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )))
            .map_err(err)?;
    }
    if let Some(first) = panel.rows.first() {
        let pooled = first.outcome.pooled_erlang_b;
        for (value, dashed) in [(pooled, false), (2.0 * pooled, true)] {
            if value < FLOOR {
                continue;
            }
            let points = [
                (SegmentValue::Exact(0), value),
                (SegmentValue::Exact(n), value),
            ];
            if dashed {
                chart
                    .draw_series(DashedLineSeries::new(points, 6, 4, BLACK.stroke_width(1)))
                    .map_err(err)?;
            } else {
                chart
                    .draw_series(DashedLineSeries::new(points, 2, 3, BLACK.stroke_width(1)))
                    .map_err(err)?;
            }
        }
    }
    Ok(())
}

/// `× pooled` as printed above a bar.
fn times(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}x")
    } else {
        format!("{x:.1}x")
    }
}

/// The time-average spread of occupancy between MSRs per policy.
fn spread_chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    panel: &Panel<'_>,
    max: f64,
) -> Result<(), SimError> {
    let n = panel.rows.len() as u32;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, (FONT, 20))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d((0..n.saturating_sub(1)).into_segmented(), 0.0..max)
        .map_err(err)?;
    let names: Vec<&str> = panel.rows.iter().map(|r| short(r.policy)).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i as usize).copied().unwrap_or("").to_owned(),
            _ => String::new(),
        })
        .y_desc("spread, max - min occupancy (pp)")
        .label_style((FONT, 12))
        .draw()
        .map_err(err)?;
    for (i, r) in panel.rows.iter().enumerate() {
        let i = i as u32;
        let s = r.outcome.spread_pp;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), s),
                ],
                colour(r.policy).filled(),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{s:.1}"),
                (SegmentValue::CenterOf(i), (s + max * 0.03).min(max)),
                (FONT, 12)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )))
            .map_err(err)?;
    }
    Ok(())
}

fn grid(
    path: &Path,
    title: &str,
    panels: &[Panel<'_>],
    mut draw: impl FnMut(
        &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
        &Panel<'_>,
    ) -> Result<(), SimError>,
) -> Result<(), SimError> {
    let rows = panels.len().div_ceil(2).max(1);
    let height = 60 + 360 * u32::try_from(rows).unwrap_or(1);
    let root = BitMapBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, (FONT, 24)).map_err(err)?;
    let areas = root.split_evenly((rows, 2));
    for (area, panel) in areas.iter().zip(panels) {
        draw(area, panel)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Draws `blocking.png` and `spread.png` from the table's rows (the
/// required setup only), and `sensitivity.png` from the sensitivity rows
/// with the table's A 90 % pooled and ecss rows beside them; returns the
/// files written.
///
/// # Errors
/// [`SimError::Plot`] when the font does not load or a file cannot be
/// drawn or written.
pub fn draw(
    table: &[Row],
    sensitivity: Option<&[Row]>,
    out: &Path,
) -> Result<Vec<PathBuf>, SimError> {
    register_font()?;
    let mut written = Vec::new();
    let required = panels(table, &["-"]);
    let path = out.join("blocking.png");
    grid(
        &path,
        "Blocking per policy, 99 % CI (log; dotted: pooled Erlang-B, dashed: 2 x it; label: x pooled or calls lost)",
        &required,
        blocking_chart,
    )?;
    written.push(path);
    let max = table
        .iter()
        .map(|r| r.outcome.spread_pp)
        .fold(0.0_f64, f64::max)
        * 1.1
        + 1.0;
    let path = out.join("spread.png");
    grid(
        &path,
        "Time-average spread of occupancy between MSRs (percentage points)",
        &required,
        |area, panel| spread_chart(area, panel, max),
    )?;
    written.push(path);
    if let Some(sensitivity) = sensitivity {
        let mut rows: Vec<Row> = table
            .iter()
            .filter(|r| {
                r.scenario == "A 90 %"
                    && r.variant == "-"
                    && matches!(r.policy, Policy::Pooled | Policy::Ecss)
            })
            .cloned()
            .collect();
        rows.extend(sensitivity.iter().cloned());
        let mut variants: Vec<String> = vec!["-".to_owned()];
        for r in sensitivity {
            if !variants.contains(&r.variant) {
                variants.push(r.variant.clone());
            }
        }
        let names: Vec<&str> = variants.iter().map(String::as_str).collect();
        let path = out.join("sensitivity.png");
        grid(
            &path,
            "A 90 %: pooled and ecss, holding time and NOTIFY delay (log; dashed: 2 x pooled)",
            &panels(&rows, &names),
            blocking_chart,
        )?;
        written.push(path);
    }
    Ok(written)
}

/// SPEC §10's goal for `core_hosts` core hosts, × the pooled limit.
fn goal(core_hosts: u32) -> f64 {
    match core_hosts {
        1 => 1.25,
        2..=3 => 1.15,
        _ => 1.3,
    }
}

/// The number after `key` in a row's variant (`holding 30 s`, `seed 2`).
fn variant_number(variant: &str, key: &str) -> Option<u64> {
    let at = variant.find(key)? + key.len();
    variant[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Draws `hosts.png` from the rows of `msr-sim hosts`: for each scenario
/// whose pooled limit a run can show and each holding time, every G and
/// seed's blocking over the pooled limit with its 99 % interval, a dotted
/// line at the limit and SPEC §10's goal for that G dashed over its bars;
/// returns the file written.
///
/// # Errors
/// [`SimError::Plot`] when the font does not load or the file cannot be
/// drawn or written.
pub fn draw_hosts(rows: &[Row], out: &Path) -> Result<PathBuf, SimError> {
    register_font()?;
    let mut panels: Vec<Panel<'_>> = Vec::new();
    for r in rows {
        let o = &r.outcome;
        if o.pooled_erlang_b * (o.calls as f64) < 1.0 {
            continue;
        }
        let holding = variant_number(&r.variant, "holding").unwrap_or(120);
        let title = format!("{}, holding {holding} s", r.scenario);
        match panels.iter_mut().find(|p| p.title == title) {
            Some(panel) => panel.rows.push(r),
            None => panels.push(Panel {
                title,
                rows: vec![r],
            }),
        }
    }
    for panel in &mut panels {
        panel.rows.sort_by_key(|r| {
            (
                r.core_hosts,
                variant_number(&r.variant, "seed").unwrap_or(1),
            )
        });
    }
    let path = out.join("hosts.png");
    grid(
        &path,
        "pooled with G core hosts, failing over: x pooled Erlang-B, 99 % CI (dotted: the limit; dashed: SPEC 10's goal)",
        &panels,
        hosts_chart,
    )?;
    Ok(path)
}

/// One panel of [`draw_hosts`].
fn hosts_chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    panel: &Panel<'_>,
) -> Result<(), SimError> {
    let n = panel.rows.len() as u32;
    let top = panel
        .rows
        .iter()
        .map(|r| r.outcome.times_pooled_interval().1)
        .filter(|x| x.is_finite())
        .fold(2.0_f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, (FONT, 20))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d((0..n.saturating_sub(1)).into_segmented(), 0.0..top)
        .map_err(err)?;
    let names: Vec<String> = panel
        .rows
        .iter()
        .map(|r| {
            let seed = variant_number(&r.variant, "seed").unwrap_or(1);
            format!("G={} s{seed}", r.core_hosts)
        })
        .collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("x pooled Erlang-B")
        .label_style((FONT, 12))
        .draw()
        .map_err(err)?;
    for (i, r) in panel.rows.iter().enumerate() {
        let i = i as u32;
        let o = &r.outcome;
        let ratio = o.times_pooled();
        let (low, high) = o.times_pooled_interval();
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), ratio),
                ],
                colour(r.policy).filled(),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(ErrorBar::new_vertical(
                SegmentValue::CenterOf(i),
                low,
                ratio,
                high,
                BLACK.stroke_width(1),
                8,
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{ratio:.2}"),
                (SegmentValue::CenterOf(i), (high + top * 0.02).min(top)),
                (FONT, 12)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )))
            .map_err(err)?;
        let goal = goal(r.core_hosts);
        chart
            .draw_series(DashedLineSeries::new(
                [
                    (SegmentValue::Exact(i), goal),
                    (SegmentValue::Exact(i + 1), goal),
                ],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(err)?;
    }
    chart
        .draw_series(DashedLineSeries::new(
            [(SegmentValue::Exact(0), 1.0), (SegmentValue::Exact(n), 1.0)],
            2,
            3,
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
    Ok(())
}
