//! PNG charts of the report with plotters' bitmap backend. Text is drawn with ab_glyph from a
//! TrueType file read at run time (DejaVu Sans from Debian's fonts-dejavu-core, or Liberation
//! Sans): no fontconfig or freetype. Without such a file the charts are drawn without any text
//! (bars, whiskers, axes), and the report says so and carries the numbers beside them.

use std::{
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
};

use plotters::{
    coord::{Shift, types::RangedCoordf64},
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

static TEXT: AtomicBool = AtomicBool::new(false);

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
];

/// Registers the first font found (`$LB_BENCH_FONT` first if set; `none` for no text); the path,
/// or None (charts then carry no text).
pub fn init_font() -> Option<String> {
    let chosen = std::env::var("LB_BENCH_FONT").ok();
    let candidates: Vec<String> = match chosen.as_deref() {
        Some("none") => Vec::new(),
        Some(path) => vec![path.to_owned()],
        None => FONTS.iter().map(|p| (*p).to_owned()).collect(),
    };
    for path in candidates {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        // Registered fonts live as long as the process: leak the bytes on purpose.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
            TEXT.store(true, Ordering::SeqCst);
            return Some(path);
        }
    }
    None
}

fn text() -> bool {
    TEXT.load(Ordering::SeqCst)
}

const COLORS: [RGBColor; 5] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
];

/// One bar series: per category (median, min, max).
pub struct Series {
    pub name: String,
    pub values: Vec<(f64, f64, f64)>,
}

fn format_value(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Axes with one column per category at x = 0, 1, ... named below it; `caption` is (title font
/// size, y label area width); `y_values` formats the y labels with [`format_value`].
fn category_chart<'a, 'b>(
    root: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    title: &str,
    caption: (u32, u32),
    y_desc: &str,
    names: &[String],
    ymax: f64,
    y_values: bool,
) -> anyhow::Result<Chart<'a, 'b>> {
    let n = names.len();
    let mut builder = ChartBuilder::on(root);
    builder.margin(16);
    if text() {
        builder
            .caption(title, ("sans-serif", caption.0))
            .x_label_area_size(36)
            .y_label_area_size(caption.1);
    } else {
        builder.x_label_area_size(4).y_label_area_size(4);
    }
    let mut chart = builder.build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..ymax)?;
    let label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            names.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let value = |v: &f64| format_value(*v);
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh();
    if text() {
        mesh.x_labels(n)
            .x_label_formatter(&label)
            .y_desc(y_desc)
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16));
        if y_values {
            mesh.y_label_formatter(&value);
        }
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    Ok(chart)
}

/// The series legend, upper right.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Bars grouped by category, one colour per series, min–max whiskers, the median written above
/// each bar.
pub fn grouped_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    categories: &[String],
    series: &[Series],
) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (1000, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = series
        .iter()
        .flat_map(|s| s.values.iter().flat_map(|v| [v.0, v.2]))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let ymax = if top > 0.0 { top * 1.18 } else { 1.0 };
    let mut chart = category_chart(&root, title, (24, 80), y_desc, categories, ymax, true)?;
    let k = series.len().max(1) as f64;
    let width = 0.8 / k;
    for (j, s) in series.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let x0 = |i: usize| i as f64 - 0.4 + j as f64 * width + 0.08 * width;
        let x1 = |i: usize| i as f64 - 0.4 + (j + 1) as f64 * width - 0.08 * width;
        let bars = s
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.0.is_finite())
            .map(|(i, v)| Rectangle::new([(x0(i), 0.0), (x1(i), v.0)], color.filled()));
        let drawn = chart.draw_series(bars)?;
        if text() {
            drawn.label(s.name.clone()).legend(move |(x, y)| {
                Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
            });
        }
        chart.draw_series(
            s.values
                .iter()
                .enumerate()
                .filter(|(_, v)| v.1.is_finite() && v.2.is_finite())
                .map(|(i, v)| {
                    let xc = (x0(i) + x1(i)) / 2.0;
                    PathElement::new(vec![(xc, v.1), (xc, v.2)], BLACK.stroke_width(2))
                }),
        )?;
        if text() {
            let style = TextStyle::from(("sans-serif", 13).into_font())
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            chart.draw_series(
                s.values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.0.is_finite())
                    .map(|(i, v)| {
                        let xc = (x0(i) + x1(i)) / 2.0;
                        Text::new(
                            format_value(v.0),
                            (xc, v.2.max(v.0) + ymax * 0.01),
                            style.clone(),
                        )
                    }),
            )?;
        }
    }
    if text() && series.len() > 1 {
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

/// One dot per sample, a column per group, a short bar at each group's median, and an optional
/// shaded band (e.g. a formula's window).
pub fn strip(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &[(String, Vec<f64>)],
    band: Option<(f64, f64, &str)>,
) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = groups
        .iter()
        .flat_map(|g| g.1.iter().copied())
        .chain(band.map(|b| b.1))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let ymax = if top > 0.0 { top * 1.2 } else { 1.0 };
    let names: Vec<String> = groups.iter().map(|g| g.0.clone()).collect();
    let n = groups.len();
    let mut chart = category_chart(&root, title, (22, 70), y_desc, &names, ymax, false)?;
    if let Some((lo, hi, name)) = band {
        let shade = RGBColor(0xc7, 0xe9, 0xc0);
        let drawn = chart.draw_series(std::iter::once(Rectangle::new(
            [(-0.5, lo), (n as f64 - 0.5, hi)],
            shade.mix(0.6).filled(),
        )))?;
        if text() {
            drawn.label(name.to_owned()).legend(move |(x, y)| {
                Rectangle::new([(x, y - 6), (x + 14, y + 6)], shade.filled())
            });
        }
    }
    for (i, (_, samples)) in groups.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let m = samples.len().max(1) as f64;
        chart.draw_series(samples.iter().enumerate().map(|(k, &v)| {
            let x = i as f64 - 0.25 + 0.5 * (k as f64 + 0.5) / m;
            Circle::new((x, v), 5, color.filled())
        }))?;
        let med = super::median(samples);
        if med.is_finite() {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(i as f64 - 0.3, med), (i as f64 + 0.3, med)],
                BLACK.stroke_width(3),
            )))?;
        }
    }
    if text() && band.is_some() {
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}
