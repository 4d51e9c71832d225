//! Pictures: the profile's traffic matrix as an SVG heat map, and a timeline of a merged trace
//! (for documentation, where the Perfetto UI cannot be shown).

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::check::Checked;
use crate::profile::{human_bytes, Report};
use crate::{Error, Result};

/// Where the font comes from on a Debian machine with `fonts-dejavu-core`.
const SYSTEM_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::Plot(e.to_string())
}

/// Registers the font text is drawn with (once): the system's DejaVu Sans, else the copy
/// the `dejavu` crate embeds.
fn font() -> Result<()> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| {
        let bytes: &'static [u8] = match std::fs::read(SYSTEM_FONT) {
            Ok(b) => Box::leak(b.into_boxed_slice()),
            Err(_) => dejavu::sans::regular(),
        };
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
            || plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Plot("no usable font".into()))
    }
}

/// White through yellow to dark red, for `v` in 0..=1.
fn heat(v: f64) -> RGBColor {
    let v = v.clamp(0.0, 1.0);
    let stops = [(255.0, 255.0, 255.0), (255.0, 237.0, 160.0), (253.0, 141.0, 60.0), (189.0, 0.0, 38.0), (90.0, 0.0, 20.0)];
    let x = v * (stops.len() - 1) as f64;
    let i = (x.floor() as usize).min(stops.len() - 2);
    let f = x - i as f64;
    let mix = |a: f64, b: f64| (a + (b - a) * f).round() as u8;
    RGBColor(mix(stops[i].0, stops[i + 1].0), mix(stops[i].1, stops[i + 1].1), mix(stops[i].2, stops[i + 1].2))
}

/// Writes the traffic matrix (bytes from each rank, by row, to each rank, by column) as an SVG
/// heat map on a logarithmic colour scale.
///
/// # Errors
/// [`Error::Plot`] if it cannot be drawn or written.
pub fn traffic_svg(report: &Report, path: &Path) -> Result<()> {
    font()?;
    let n = report.size.max(1);
    let cell = (560 / n).clamp(2, 48) as i32;
    let (left, top) = (90i32, 70i32);
    let side = cell * n as i32;
    let w = (left + side + 150) as u32;
    let h = (top + side + 60) as u32;
    let root = SVGBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let max = (0..n as u32).flat_map(|a| (0..n as u32).map(move |b| (a, b))).map(|(a, b)| report.pair(a, b).bytes).max().unwrap_or(0);
    let scale = |b: u64| if b == 0 || max == 0 { 0.0 } else { 0.15 + 0.85 * ((b as f64).ln_1p() / (max as f64).ln_1p()) };
    let text = |s: &str, size: i32| (s.to_string(), ("sans-serif", size).into_font());
    let title = format!("bytes sent, {} ranks (row: sender, column: receiver)", report.size);
    root.draw(&Text::new(title, (10, 12), ("sans-serif", 16).into_font())).map_err(plot_err)?;
    for from in 0..n {
        for to in 0..n {
            let b = report.pair(from as u32, to as u32).bytes;
            let (x, y) = (left + to as i32 * cell, top + from as i32 * cell);
            root.draw(&Rectangle::new([(x, y), (x + cell, y + cell)], heat(scale(b)).filled())).map_err(plot_err)?;
        }
    }
    root.draw(&Rectangle::new([(left, top), (left + side, top + side)], BLACK.stroke_width(1))).map_err(plot_err)?;
    let step = (n / 16).max(1);
    for r in (0..n).step_by(step) {
        let (s, f) = text(&r.to_string(), 12);
        root.draw(&Text::new(s.clone(), (left - 30, top + r as i32 * cell + cell / 2 - 6), f.clone())).map_err(plot_err)?;
        root.draw(&Text::new(s, (left + r as i32 * cell + cell / 2 - 4, top - 18), f)).map_err(plot_err)?;
    }
    root.draw(&Text::new("sender", (8, top + side / 2), ("sans-serif", 13).into_font())).map_err(plot_err)?;
    root.draw(&Text::new("receiver", (left + side / 2 - 25, top - 40), ("sans-serif", 13).into_font())).map_err(plot_err)?;
    legend(&root, left + side + 30, top, side.max(100), max)?;
    root.present().map_err(plot_err)
}

/// The colour scale beside the matrix.
fn legend<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, x: i32, y: i32, height: i32, max: u64) -> Result<()> {
    let steps = 50;
    for i in 0..steps {
        let v = 1.0 - i as f64 / steps as f64;
        let (y0, y1) = (y + height * i / steps, y + height * (i + 1) / steps);
        root.draw(&Rectangle::new([(x, y0), (x + 18, y1)], heat(0.15 + 0.85 * v).filled())).map_err(plot_err)?;
    }
    let f = ("sans-serif", 12).into_font();
    root.draw(&Text::new(human_bytes(max), (x + 24, y), f.clone())).map_err(plot_err)?;
    root.draw(&Text::new("1 B (log)", (x + 24, y + height - 12), f.clone())).map_err(plot_err)?;
    root.draw(&Text::new("white: none", (x, y + height + 10), f)).map_err(plot_err)?;
    Ok(())
}

/// Colour of a slice by its category.
fn cat_colour(cat: &str, name: &str) -> RGBColor {
    match (cat, name) {
        ("msg", _) => RGBColor(60, 60, 60),
        ("p2p", n) if n.contains("recv") || n.contains("probe") => RGBColor(31, 119, 180),
        ("p2p", _) => RGBColor(44, 160, 44),
        ("post", _) => RGBColor(148, 103, 189),
        ("complete", _) => RGBColor(255, 127, 14),
        ("coll", _) | ("nbc", _) => RGBColor(214, 39, 40),
        ("comm", _) => RGBColor(140, 86, 75),
        ("phase", _) => RGBColor(227, 119, 194),
        _ => RGBColor(127, 127, 127),
    }
}

/// Draws a merged trace as a timeline: one row per thread (labelled by its process), one box
/// per complete event coloured by kind, a line per flow from send to receive. SVG or PNG by
/// the extension of `path`; `from_us..to_us` selects the time window (`None`: all).
///
/// # Errors
/// [`Error::Plot`] if it cannot be drawn or written.
pub fn timeline(trace: &Checked, path: &Path, window: Option<(f64, f64)>, size: (u32, u32)) -> Result<()> {
    font()?;
    let png = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if png {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        draw_timeline(&root, trace, window, size)?;
        root.present().map_err(plot_err)
    } else {
        let root = SVGBackend::new(path, size).into_drawing_area();
        draw_timeline(&root, trace, window, size)?;
        root.present().map_err(plot_err)
    }
}

fn draw_timeline<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    t: &Checked,
    window: Option<(f64, f64)>,
    size: (u32, u32),
) -> Result<()> {
    root.fill(&WHITE).map_err(plot_err)?;
    let mut tracks: Vec<(u64, u64)> = t.slices.iter().map(|s| (s.pid, s.tid)).collect();
    tracks.sort_unstable();
    tracks.dedup();
    let lo = t.slices.iter().map(|s| s.ts).fold(f64::INFINITY, f64::min);
    let hi = t.slices.iter().map(|s| s.ts + s.dur).fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = window.unwrap_or((lo, hi));
    if tracks.is_empty() || hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return Err(Error::Plot("the trace has no complete events to draw".into()));
    }
    let (left, right, top, bottom) = (120i32, 20i32, 40i32, 50i32);
    let width = size.0 as i32 - left - right;
    let row = ((size.1 as i32 - top - bottom) / tracks.len() as i32).clamp(8, 60);
    let x_of = |us: f64| left + ((us - lo) / (hi - lo) * width as f64).round() as i32;
    let y_of = |track: (u64, u64)| top + tracks.iter().position(|&k| k == track).unwrap_or(0) as i32 * row;
    let font = ("sans-serif", 13).into_font();
    root.draw(&Text::new(format!("{:.1} us shown", hi - lo), (left, 12), font.clone())).map_err(plot_err)?;
    for &track in &tracks {
        let name = t.processes.get(&track.0).map(|n| n.split(" (").next().unwrap_or(n).to_string()).unwrap_or_default();
        root.draw(&Text::new(name, (8, y_of(track) + row / 2 - 7), font.clone())).map_err(plot_err)?;
        root.draw(&PathElement::new(vec![(left, y_of(track) + row), (left + width, y_of(track) + row)], RGBColor(220, 220, 220)))
            .map_err(plot_err)?;
    }
    let mut slices: Vec<&crate::check::Slice> = t.slices.iter().filter(|s| s.ts + s.dur >= lo && s.ts <= hi).collect();
    slices.sort_by(|a, b| b.dur.total_cmp(&a.dur));
    for s in slices {
        let (x0, x1) = (x_of(s.ts.max(lo)), x_of((s.ts + s.dur).min(hi)).max(x_of(s.ts.max(lo)) + 1));
        let y = y_of((s.pid, s.tid));
        let (y0, y1) = if s.cat == "msg" { (y + row / 2, y + row - 3) } else { (y + 3, y + row - 3) };
        root.draw(&Rectangle::new([(x0, y0), (x1, y1)], cat_colour(&s.cat, &s.name).filled())).map_err(plot_err)?;
        if x1 - x0 > 8 * s.name.len() as i32 && s.cat != "msg" {
            root.draw(&Text::new(s.name.clone(), (x0 + 3, y + 5), ("sans-serif", 11).into_font().color(&WHITE))).map_err(plot_err)?;
        }
    }
    // Only flows with both ends in the window (a line to an end outside would leave the plot).
    let inside = |sl: &crate::check::Slice| sl.ts >= lo && sl.ts + sl.dur <= hi;
    for f in t.flows.iter().filter(|f| inside(&f.from) && inside(&f.to)) {
        let a = (x_of(f.from.ts + f.from.dur / 2.0), y_of((f.from.pid, f.from.tid)) + row - 3);
        let b = (x_of(f.to.ts + f.to.dur / 2.0), y_of((f.to.pid, f.to.tid)) + row / 2);
        root.draw(&PathElement::new(vec![a, b], BLACK.stroke_width(1))).map_err(plot_err)?;
    }
    legend_row(root, left, size.1 as i32 - 30)
}

fn legend_row<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, mut x: i32, y: i32) -> Result<()> {
    let items = [
        ("send", "p2p", "send"),
        ("recv, probe", "p2p", "recv"),
        ("post", "post", ""),
        ("wait, test", "complete", ""),
        ("collective", "coll", ""),
        ("collective step", "phase", ""),
        ("communicator", "comm", ""),
        ("message", "msg", ""),
    ];
    for (label, cat, name) in items {
        root.draw(&Rectangle::new([(x, y), (x + 14, y + 14)], cat_colour(cat, name).filled())).map_err(plot_err)?;
        root.draw(&Text::new(label, (x + 18, y), ("sans-serif", 12).into_font())).map_err(plot_err)?;
        x += 30 + 8 * label.len() as i32;
    }
    root.draw(&Text::new("line: a message from send to receive", (x, y), ("sans-serif", 12).into_font())).map_err(plot_err)?;
    Ok(())
}
