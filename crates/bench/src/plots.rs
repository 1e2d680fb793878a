//! The report folder's plots, each written as SVG and PNG: committed throughput per run (bars),
//! latency CDFs (one line per run, log-scaled latency), throughput over time, and runs with
//! faults over time (throughput and p99, faults marked). Text is
//! drawn with the vendored DejaVu Sans (`assets/`), so no system font or fontconfig is needed.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::sync::Once;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const SIZE: (u32, u32) = (960, 600);
/// Most bars whose names lie flat under them; more are turned upright.
const BARS_FLAT_MAX: usize = 6;
/// Characters of a run's name shown under its bar.
const BAR_NAME_CHARS_MAX: usize = 30;
/// Ticks on a log axis at most (1, 2 and 5 per decade: ten decades).
const LOG_TICKS_MAX: usize = 30;
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

/// Committed throughput per run, each bar named below it (names turned upright when there
/// are many) with its value above it.
pub fn throughput_bars(stem: &Path, title: &str, runs: &[(String, f64)]) -> Result<(), String> {
    struct Bars<'a>(&'a str, &'a [(String, f64)]);
    impl Draw for Bars<'_> {
        fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
            let Bars(title, runs) = *self;
            area.fill(&WHITE).map_err(err)?;
            let top = runs.iter().map(|r| r.1).fold(0.0, f64::max).max(1.0) * 1.15;
            let upright = runs.len() > BARS_FLAT_MAX;
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 24))
                .margin(20)
                .x_label_area_size(if upright { 190 } else { 50 })
                .y_label_area_size(90)
                .build_cartesian_2d((0..runs.len()).into_segmented(), 0.0..top)
                .map_err(err)?;
            let name = |at: &SegmentValue<usize>| match at {
                SegmentValue::CenterOf(i) => runs.get(*i).map_or_else(String::new, |r| short(&r.0)),
                _ => String::new(),
            };
            let font = ("sans-serif", if upright { 13 } else { 15 }).into_font();
            let font = if upright { font.transform(FontTransform::Rotate90) } else { font };
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(runs.len())
                .x_label_formatter(&name)
                .x_label_style(font)
                .y_desc("committed txn/s")
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(err)?;
            chart
                .draw_series(runs.iter().enumerate().map(|(i, (_, v))| {
                    let corners = [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), *v)];
                    let mut bar = Rectangle::new(corners, colour(i).filled());
                    bar.set_margin(0, 0, 4, 4);
                    bar
                }))
                .map_err(err)?;
            let value = TextStyle::from(("sans-serif", 13).into_font())
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            chart
                .draw_series(runs.iter().enumerate().map(|(i, (_, v))| {
                    let at = (SegmentValue::CenterOf(i), *v + top * 0.01);
                    Text::new(format!("{v:.0}"), at, value.clone())
                }))
                .map_err(err)?;
            Ok(())
        }
    }
    both(stem, &Bars(title, runs))
}

/// A run's name cut to what fits under a bar.
fn short(name: &str) -> String {
    if name.chars().count() <= BAR_NAME_CHARS_MAX {
        return name.to_string();
    }
    let kept: String = name.chars().take(BAR_NAME_CHARS_MAX - 1).collect();
    format!("{kept}…")
}

/// Ticks of a log axis over `lo..hi`: 1, 2 and 5 of every decade in range, so that every
/// decade has a labelled gridline, or every digit of the decade where that gives fewer than
/// three (a range narrower than a decade still gets several).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && hi > lo && hi.is_finite()) {
        return Vec::new();
    }
    let ticks = |steps: &[f64]| {
        let mut ticks = Vec::new();
        let mut exponent = lo.log10().floor() as i32;
        while 10f64.powi(exponent) <= hi && ticks.len() < LOG_TICKS_MAX {
            let decade = 10f64.powi(exponent);
            for step in steps {
                let tick = decade * step;
                if tick >= lo && tick <= hi && ticks.len() < LOG_TICKS_MAX {
                    ticks.push(tick);
                }
            }
            exponent += 1;
        }
        ticks
    };
    let coarse = ticks(&[1.0, 2.0, 5.0]);
    if coarse.len() >= 3 {
        return coarse;
    }
    ticks(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
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
                .build_cartesian_2d(
                    (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
                    0.0..100.0,
                )
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc("latency (ms, log scale)")
                .x_label_formatter(&|ms| {
                    // As many decimals as the tick's first digit needs (0.3, 0.05).
                    let decimals = (-ms.log10().floor()).max(0.0) as usize;
                    format!("{ms:.decimals$}")
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

/// A run with faults over time: committed throughput above, p99 latency below, in the
/// timeline's buckets, one line per run, each fault marked by a dashed vertical line labelled
/// with its number (`marks`: seconds from the start of the run, label).
pub fn fault_timeline(
    stem: &Path,
    title: &str,
    runs: &[(String, Vec<crate::timeline::TimelinePoint>)],
    marks: &[(f64, String)],
) -> Result<(), String> {
    type Runs<'a> = &'a [(String, Vec<crate::timeline::TimelinePoint>)];
    struct Timeline<'a>(&'a str, Runs<'a>, &'a [(f64, String)]);
    impl Draw for Timeline<'_> {
        fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
            let Timeline(title, runs, marks) = *self;
            area.fill(&WHITE).map_err(err)?;
            let area = area.titled(title, ("sans-serif", 24)).map_err(err)?;
            let (upper, lower) = area.split_vertically(SIZE.1 / 2 - 20);
            let x_max = runs
                .iter()
                .flat_map(|r| r.1.iter().map(|p| p.at_s))
                .fold(1.0, f64::max)
                .max(marks.iter().map(|m| m.0).fold(0.0, f64::max));
            let panels: [(&DrawingArea<DB, Shift>, &str, bool); 2] =
                [(&upper, "committed txn/s", true), (&lower, "p99 latency (ms)", false)];
            for (panel, y_desc, throughput) in panels {
                let value = |p: &crate::timeline::TimelinePoint| {
                    if throughput {
                        Some(p.throughput_txn_per_s)
                    } else {
                        p.latency_ms_p99
                    }
                };
                let y_max =
                    runs.iter().flat_map(|r| r.1.iter().filter_map(value)).fold(1.0, f64::max)
                        * 1.15;
                let mut chart = ChartBuilder::on(panel)
                    .margin(10)
                    .x_label_area_size(if throughput { 20 } else { 45 })
                    .y_label_area_size(90)
                    .build_cartesian_2d(0.0..x_max * 1.02, 0.0..y_max)
                    .map_err(err)?;
                let mut mesh = chart.configure_mesh();
                mesh.y_desc(y_desc).label_style(("sans-serif", 14));
                if !throughput {
                    mesh.x_desc("seconds from the start of the run (warm-up included)");
                }
                mesh.draw().map_err(err)?;
                for (x, label) in marks {
                    let dashes = (0..40).map(|i| {
                        let (a, b) = (y_max * i as f64 / 40.0, y_max * (i as f64 + 0.5) / 40.0);
                        PathElement::new(vec![(*x, a), (*x, b)], BLACK.stroke_width(1))
                    });
                    chart.draw_series(dashes).map_err(err)?;
                    let at = (*x, y_max * 0.97);
                    chart
                        .draw_series(std::iter::once(Text::new(
                            label.clone(),
                            at,
                            ("sans-serif", 14),
                        )))
                        .map_err(err)?;
                }
                let lines = runs.iter().map(|(label, points)| {
                    (label, points.iter().filter_map(move |p| Some((p.at_s, value(p)?))))
                });
                draw_lines(&mut chart, lines)?;
            }
            Ok(())
        }
    }
    both(stem, &Timeline(title, runs, marks))
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
        let point = |at_s: f64, rate: f64| crate::timeline::TimelinePoint {
            at_s,
            throughput_txn_per_s: rate,
            latency_ms_p99: (rate > 0.0).then_some(250.0),
        };
        fault_timeline(
            &dir.join("faults"),
            "leader crash",
            &[("tiga".into(), vec![point(0.0, 100.0), point(0.1, 0.0), point(0.2, 90.0)])],
            &[(0.1, "1".into())],
        )
        .unwrap();
        for stem in ["throughput", "cdf", "series", "faults"] {
            let svg = std::fs::read_to_string(dir.join(stem).with_extension("svg")).unwrap();
            assert!(svg.contains("<text"), "{stem}.svg has text");
            let png = std::fs::read(dir.join(stem).with_extension("png")).unwrap();
            assert_eq!(&png[1..4], b"PNG", "{stem}.png is a PNG");
        }
        let svg = std::fs::read_to_string(dir.join("throughput.svg")).unwrap();
        assert!(svg.contains("occ") && svg.contains("2pl"), "bars are labelled by run");
        // Many bars: every one still named, under it.
        let many: Vec<(String, f64)> =
            (0..12).map(|i| (format!("proto{i} geo 4 threads"), 100.0 * i as f64)).collect();
        throughput_bars(&dir.join("many"), "many", &many).unwrap();
        let svg = std::fs::read_to_string(dir.join("many.svg")).unwrap();
        for (name, _) in &many {
            assert!(svg.contains(name.as_str()), "{name} named under its bar");
        }
        // A CDF within one decade still labels several ticks.
        let narrow = vec![("occ".to_string(), vec![(50.0, 31.0), (99.0, 58.0)])];
        latency_cdf(&dir.join("narrow"), "latency", &narrow).unwrap();
        let svg = std::fs::read_to_string(dir.join("narrow.svg")).unwrap();
        // (Each label is a text element whose content stands on a line of its own.)
        let labels: Vec<&str> = svg.lines().map(str::trim).collect();
        for tick in ["30", "40", "50", "60", "70"] {
            assert!(labels.contains(&tick), "tick {tick} labelled");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn log_ticks_mark_every_decade_and_one_two_five_within_it() {
        assert_eq!(log_ticks(0.8, 120.0), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(log_ticks(24.0, 72.5), vec![30.0, 40.0, 50.0, 60.0, 70.0]);
        assert_eq!(log_ticks(30.0, 30.0), Vec::<f64>::new());
        assert_eq!(log_ticks(0.0, 10.0), Vec::<f64>::new());
        assert_eq!(log_ticks(f64::NAN, 10.0), Vec::<f64>::new());
        let wide = log_ticks(1e-3, 1e30);
        assert_eq!(wide.len(), LOG_TICKS_MAX);
        assert!(wide.windows(2).all(|w| w[0] < w[1]));
    }
}
