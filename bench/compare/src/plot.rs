//! Log-log plots of a benchmark's medians against message size, as SVG and PNG.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::Error;
use crate::spec::size_label;

/// Where the plot font comes from on a Debian machine with `fonts-dejavu-core`.
const SYSTEM_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (size in bytes, value) points, ascending by size.
    pub points: Vec<(usize, f64)>,
}

/// Registers the font plotters draws text with (once): the system's DejaVu Sans if present,
/// else the copy embedded by the `dejavu` crate. Returns where it came from.
pub fn font_source() -> Result<&'static str, Error> {
    static SOURCE: OnceLock<Result<&'static str, String>> = OnceLock::new();
    SOURCE
        .get_or_init(|| {
            let (bytes, source): (&'static [u8], &'static str) = match std::fs::read(SYSTEM_FONT) {
                Ok(b) => (Box::leak(b.into_boxed_slice()), SYSTEM_FONT),
                Err(_) => (dejavu::sans::regular(), "embedded DejaVu Sans"),
            };
            let ok = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
                || plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok();
            if ok {
                Ok(source)
            } else {
                Err("no usable font".to_string())
            }
        })
        .clone()
        .map_err(Error::Plot)
}

/// The colour of the `i`-th series (tmpi first, in a colour that stands out).
fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 6] = [
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    C[i % C.len()]
}

/// The y range that holds every point with some room, rounded out to powers of ten.
fn y_range(series: &[Series]) -> Option<(f64, f64)> {
    let vals = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = vals.fold(None, |acc: Option<(f64, f64)>, v| match acc {
        None => Some((v, v)),
        Some((a, b)) => Some((a.min(v), b.max(v))),
    })?;
    let lo = 10f64.powf(lo.log10().floor());
    let mut hi = 10f64.powf(hi.log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    Some((lo, hi))
}

/// A y-axis tick label: whole numbers above 1, at most three decimals below, no trailing
/// zeroes (`0.1`, not `0.10000000000000001`).
fn axis_number(v: f64) -> String {
    if v >= 1.0 {
        return format!("{v:.0}");
    }
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "0" {
        format!("{v:.1e}")
    } else {
        s.to_string()
    }
}

/// The x range (sizes) of every point.
fn x_range(series: &[Series]) -> Option<(f64, f64)> {
    let lo = series.iter().flat_map(|s| s.points.first()).map(|p| p.0).min()?;
    let hi = series.iter().flat_map(|s| s.points.last()).map(|p| p.0).max()?;
    let lo = lo.max(1) as f64;
    let hi = (hi as f64).max(lo * 2.0);
    Some((lo, hi))
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    y_desc: &str,
    series: &[Series],
    legend: Legend,
) -> Result<(), Error>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| Error::Plot(e.to_string());
    let (Some((x0, x1)), Some((y0, y1))) = (x_range(series), y_range(series)) else {
        return Err(Error::Plot(format!("{title}: nothing to plot")));
    };
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(52)
        .y_label_area_size(84)
        .build_cartesian_2d((x0..x1).log_scale().base(4.0), (y0..y1).log_scale())
        .map_err(err)?;
    let x_fmt = |v: &f64| size_label(v.round() as usize);
    let y_fmt = |v: &f64| axis_number(*v);
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc(y_desc)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let c = colour(i);
        let pts: Vec<(f64, f64)> =
            s.points.iter().filter(|p| p.0 > 0 && p.1 > 0.0 && p.1.is_finite()).map(|&(x, y)| (x as f64, y)).collect();
        let width = if i == 0 { 3 } else { 2 };
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(width)))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(match legend {
            Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
            Legend::LowerRight => SeriesLabelPosition::LowerRight,
        })
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Where the legend goes: where the curves are not (lower right for latency, which grows
/// with size; upper left for bandwidth).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legend {
    /// Top left corner.
    UpperLeft,
    /// Bottom right corner.
    LowerRight,
}

/// Draws `series` into `<stem>.svg` and `<stem>.png` (1000x640).
///
/// # Errors
/// [`Error::Plot`] when there is no point or drawing fails, [`Error::Io`] when the PNG
/// cannot be written.
pub fn plot(stem: &Path, title: &str, y_desc: &str, series: &[Series], legend: Legend) -> Result<(), Error> {
    font_source()?;
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    {
        let root = SVGBackend::new(&svg, (1000, 640)).into_drawing_area();
        draw(&root, title, y_desc, series, legend)?;
    }
    {
        let root = BitMapBackend::new(&png, (1000, 640)).into_drawing_area();
        draw(&root, title, y_desc, series, legend)?;
    }
    for f in [&svg, &png] {
        let meta = std::fs::metadata(f).map_err(|e| Error::io(format!("{}", f.display()), e))?;
        if meta.len() == 0 {
            return Err(Error::Plot(format!("{} is empty", f.display())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_points() {
        let s = vec![
            Series { label: "a".into(), points: vec![(1, 0.3), (1024, 45.0)] },
            Series { label: "b".into(), points: vec![(2, 0.5), (4096, 2000.0)] },
        ];
        assert_eq!(x_range(&s), Some((1.0, 4096.0)));
        assert_eq!(y_range(&s), Some((0.1, 10_000.0)));
        assert_eq!(y_range(&[]), None);
        assert_eq!(axis_number(0.1 + 0.2), "0.3");
        assert_eq!(axis_number(1000.0), "1000");
        assert_eq!(axis_number(0.0001), "1.0e-4");
    }

    #[test]
    fn plots_are_written_as_svg_and_png() {
        let dir = std::env::temp_dir().join(format!("tmpi-compare-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string()).ok();
        let s = vec![Series { label: "tmpi".into(), points: vec![(1, 0.5), (64, 0.7), (65536, 9.0)] }];
        let r = plot(&dir.join("lat"), "Latency", "µs", &s, Legend::LowerRight).map_err(|e| e.to_string());
        assert_eq!(r, Ok(()));
        let svg = std::fs::read_to_string(dir.join("lat.svg")).unwrap_or_default();
        assert!(svg.contains("<svg") && svg.contains("tmpi"), "{svg}");
        let png = std::fs::read(dir.join("lat.png")).unwrap_or_default();
        assert!(png.starts_with(b"\x89PNG"));
        assert!(plot(&dir.join("none"), "x", "y", &[], Legend::UpperLeft).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
