//! The report folder's plots, each written as SVG and PNG: committed throughput per run (bars),
//! latency CDFs (one line per run, log-scaled latency) and throughput over time. Text is
//! drawn with the vendored DejaVu Sans (`assets/`), so no system font or fontconfig is needed.

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const SIZE: (u32, u32) = (960, 600);
/// Most bars named in full above them; more are numbered as in the report's table.
const BARS_NAMED_MAX: usize = 6;
/// Colours of successive runs.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TTF (checked by the tests); a failure leaves text undrawn.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// A plot that can draw itself on any backend.
trait Draw {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// Draws `plot` into `stem.svg` and `stem.png`.
fn both(stem: &Path, plot: &impl Draw) -> Result<(), String> {
    register_font();
    let svg = stem.with_extension("svg");
    {
        let area = SVGBackend::new(&svg, SIZE).into_drawing_area();
        plot.draw(&area)?;
        area.present().map_err(|e| format!("{}: {e}", svg.display()))?;
    }
    let png = stem.with_extension("png");
    let area = BitMapBackend::new(&png, SIZE).into_drawing_area();
    plot.draw(&area)?;
    area.present().map_err(|e| format!("{}: {e}", png.display()))?;
    Ok(())
}

/// Draws one coloured line per run, `(label, points)`, with a legend.
fn draw_lines<'a, DB, CT, P>(
    chart: &mut ChartContext<'a, DB, CT>,
    runs: impl Iterator<Item = (&'a String, P)>,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate<From = (f64, f64)>,
    P: Iterator<Item = (f64, f64)>,
{
    for (i, (label, points)) in runs.enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))
            .map_err(err)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Committed throughput per run.
pub fn throughput_bars(stem: &Path, title: &str, runs: &[(String, f64)]) -> Result<(), String> {
    struct Bars<'a>(&'a str, &'a [(String, f64)]);
    impl Draw for Bars<'_> {
        fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
            let Bars(title, runs) = *self;
            area.fill(&WHITE).map_err(err)?;
            let top = runs.iter().map(|r| r.1).fold(0.0, f64::max).max(1.0) * 1.15;
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 24))
                .margin(20)
                .x_label_area_size(50)
                .y_label_area_size(90)
                .build_cartesian_2d(0.0..runs.len() as f64, 0.0..top)
                .map_err(err)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(0)
                .x_desc(if runs.len() > BARS_NAMED_MAX {
                    "runs, numbered as in the report's table"
                } else {
                    "each bar is a run, named above it"
                })
                .y_desc("committed txn/s")
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(err)?;
            chart
                .draw_series(runs.iter().enumerate().map(|(i, (_, v))| {
                    Rectangle::new(
                        [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, *v)],
                        colour(i).filled(),
                    )
                }))
                .map_err(err)?;
            chart
                .draw_series(runs.iter().enumerate().map(|(i, (label, v))| {
                    let at = (i as f64 + 0.15, *v + top * 0.02);
                    let text = if runs.len() > BARS_NAMED_MAX {
                        format!("{}", i + 1)
                    } else {
                        format!("{label}: {v:.0}")
                    };
                    Text::new(text, at, ("sans-serif", 15))
                }))
                .map_err(err)?;
            Ok(())
        }
    }
    both(stem, &Bars(title, runs))
}

/// One latency CDF per run: `(label, [(percentile, ms)])`.
pub fn latency_cdf(
    stem: &Path,
    title: &str,
    runs: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    struct Cdf<'a>(&'a str, &'a [(String, Vec<(f64, f64)>)]);
    impl Draw for Cdf<'_> {
        fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
            let Cdf(title, runs) = *self;
            area.fill(&WHITE).map_err(err)?;
            let points = runs.iter().flat_map(|r| r.1.iter().map(|p| p.1));
            let (lo, hi) = points.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
            let (lo, hi) = if lo > hi {
                (0.01, 1.0)
            } else {
                ((lo * 0.8).max(0.001), (hi * 1.25).max(lo * 2.0))
            };
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 24))
                .margin(20)
                .x_label_area_size(50)
                .y_label_area_size(70)
                .build_cartesian_2d((lo..hi).log_scale(), 0.0..100.0)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc("latency (ms, log scale)")
                .x_labels(8)
                .x_label_formatter(&|ms| {
                    if *ms >= 10.0 {
                        format!("{ms:.0}")
                    } else {
                        format!("{ms:.2}")
                    }
                })
                .y_desc("percentile of committed requests")
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(err)?;
            let lines = runs.iter().map(|(label, cdf)| (label, cdf.iter().map(|&(p, ms)| (ms, p))));
            draw_lines(&mut chart, lines)
        }
    }
    both(stem, &Cdf(title, runs))
}

/// Committed transactions per second over the measurement window, one line per run.
pub fn time_series(
    stem: &Path,
    title: &str,
    runs: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    lines(stem, title, ("seconds into the measurement window", "committed txn/s"), runs)
}

/// One line per series, `(label, [(x, y)])`, on linear axes from 0, named `axes` (x, y).
pub fn lines(
    stem: &Path,
    title: &str,
    axes: (&str, &str),
    runs: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    struct Lines<'a>(&'a str, (&'a str, &'a str), &'a [(String, Vec<(f64, f64)>)]);
    impl Draw for Lines<'_> {
        fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
            let Lines(title, (x_desc, y_desc), runs) = *self;
            area.fill(&WHITE).map_err(err)?;
            let x_max = runs.iter().flat_map(|r| r.1.iter().map(|p| p.0)).fold(1.0, f64::max);
            let y_max =
                runs.iter().flat_map(|r| r.1.iter().map(|p| p.1)).fold(1.0, f64::max) * 1.15;
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 24))
                .margin(20)
                .x_label_area_size(50)
                .y_label_area_size(90)
                .build_cartesian_2d(0.0..x_max * 1.05, 0.0..y_max)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(err)?;
            let lines = runs.iter().map(|(label, points)| (label, points.iter().copied()));
            draw_lines(&mut chart, lines)
        }
    }
    both(stem, &Lines(title, axes, runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_written_as_svg_with_text_and_as_png() {
        let dir = std::env::temp_dir().join(format!("meridian-plots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let runs = vec![("occ".to_string(), 1200.0), ("2pl".to_string(), 800.0)];
        throughput_bars(&dir.join("throughput"), "throughput", &runs).unwrap();
        let cdf = vec![("occ".to_string(), vec![(50.0, 1.0), (99.0, 3.0)])];
        latency_cdf(&dir.join("cdf"), "latency", &cdf).unwrap();
        time_series(
            &dir.join("series"),
            "over time",
            &[("occ".into(), vec![(0.0, 10.0), (1.0, 12.0)])],
        )
        .unwrap();
        for stem in ["throughput", "cdf", "series"] {
            let svg = std::fs::read_to_string(dir.join(stem).with_extension("svg")).unwrap();
            assert!(svg.contains("<text"), "{stem}.svg has text");
            let png = std::fs::read(dir.join(stem).with_extension("png")).unwrap();
            assert_eq!(&png[1..4], b"PNG", "{stem}.png is a PNG");
        }
        let svg = std::fs::read_to_string(dir.join("throughput.svg")).unwrap();
        assert!(svg.contains("occ") && svg.contains("2pl"), "bars are labelled by run");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
