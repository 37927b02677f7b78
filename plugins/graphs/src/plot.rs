//! A small figure model (line and point series on one or two y axes) drawn
//! with plotters to a PNG and an SVG of the same size.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use kernmlops_plugin_sdk::{Error, Result};
use plotters::{
    coord::Shift,
    prelude::*,
    style::{register_font, FontStyle},
};

/// Width and height of every image, in pixels.
pub const SIZE: (u32, u32) = (1200, 600);

/// Most points drawn per series; longer series are thinned by taking every
/// n-th point, so a long run still renders in seconds and the SVG stays small.
pub const MAX_POINTS: usize = 40_000;

/// The font text is drawn with.
pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Line,
    /// A line that holds each value until the next point (a level such as
    /// a queue depth).
    Step,
    Points,
}

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub kind: Kind,
    /// Drawn against the second (right) y axis.
    pub secondary: bool,
}

pub struct Axis {
    pub label: String,
    /// Logarithmic (values below 1 are drawn at 1).
    pub log: bool,
}

pub struct Figure {
    /// File name without extension.
    pub stem: String,
    pub title: String,
    pub x_label: String,
    pub y: Axis,
    pub y2: Option<Axis>,
    pub series: Vec<Series>,
}

impl Series {
    /// A series of `points` drawn as `kind` against the first y axis.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>, kind: Kind) -> Self {
        Self {
            name: name.into(),
            points,
            kind,
            secondary: false,
        }
    }
}

impl Axis {
    /// A linear axis.
    pub fn linear(label: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            log: false,
        }
    }

    /// A logarithmic axis.
    pub fn logarithmic(label: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            log: true,
        }
    }
}

/// A drawing error as the plugin's error.
pub(crate) fn drawing_error<E: std::error::Error + Send + Sync>(
    e: DrawingAreaErrorKind<E>,
) -> Error {
    Error::new(e.to_string())
}

/// Fills `root` white and starts a chart on it with `title` and the
/// margins and label areas every figure has.
pub(crate) fn chart_on<'a, 'b, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &str,
) -> Result<ChartBuilder<'a, 'b, DB>> {
    root.fill(&WHITE).map_err(drawing_error)?;
    let mut chart = ChartBuilder::on(root);
    chart
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(80);
    Ok(chart)
}

/// Draws the legend of the named series in the upper right corner.
pub(crate) fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(drawing_error)
}

/// Registers DejaVu Sans as "sans-serif" once per process.
fn ensure_font() -> Result<()> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let bytes = std::fs::read(FONT_PATH).map_err(|e| {
            format!("reading {FONT_PATH}: {e} (install fonts-dejavu-core: apt-get install fonts-dejavu-core)")
        })?;
        // The font registry keeps a &'static slice; this happens once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT_PATH} is not a usable TrueType font"))
    })
    .clone()
    .map_err(Error::new)
}

/// A figure that draws itself on any plotters backend.
pub(crate) trait Drawable {
    /// File name without extension.
    fn stem(&self) -> &str;

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static;

    /// Writes `<stem>.png` and `<stem>.svg` into `out_dir`.
    fn render(&self, out_dir: &Path) -> Result<Vec<PathBuf>> {
        ensure_font()?;
        std::fs::create_dir_all(out_dir)
            .map_err(|e| Error::new(format!("creating {}: {e}", out_dir.display())))?;
        let png = out_dir.join(format!("{}.png", self.stem()));
        let svg = out_dir.join(format!("{}.svg", self.stem()));
        {
            let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
            self.draw(&root)
                .and_then(|()| root.present().map_err(|e| Error::new(e.to_string())))
                .map_err(|e| Error::new(format!("drawing {}: {e}", png.display())))?;
        }
        {
            let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
            self.draw(&root)
                .and_then(|()| root.present().map_err(|e| Error::new(e.to_string())))
                .map_err(|e| Error::new(format!("drawing {}: {e}", svg.display())))?;
        }
        Ok(vec![png, svg])
    }
}

impl Drawable for Figure {
    fn stem(&self) -> &str {
        &self.stem
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let err = drawing_error::<DB::ErrorType>;
        let tf = |axis: &Axis, v: f64| if axis.log { v.max(1.0).log10() } else { v };
        let y2_axis = self.y2.as_ref();
        let prepared: Vec<Prepared> = self
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let axis = if s.secondary {
                    y2_axis.unwrap_or(&self.y)
                } else {
                    &self.y
                };
                let step = s.points.len().div_ceil(MAX_POINTS).max(1);
                let pts = s
                    .points
                    .iter()
                    .step_by(step)
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .map(|&(x, y)| (x, tf(axis, y)))
                    .collect();
                let pts = if s.kind == Kind::Step {
                    steps(pts)
                } else {
                    pts
                };
                (i, s, pts)
            })
            .collect();

        let xs = range(prepared.iter().flat_map(|(_, _, p)| p.iter().map(|p| p.0)));
        let y1 = y_range(
            prepared
                .iter()
                .filter(|(_, s, _)| !s.secondary)
                .flat_map(|(_, _, p)| p.iter().map(|p| p.1)),
            self.y.log,
        );
        let y2 = y_range(
            prepared
                .iter()
                .filter(|(_, s, _)| s.secondary)
                .flat_map(|(_, _, p)| p.iter().map(|p| p.1)),
            y2_axis.is_some_and(|a| a.log),
        );

        let mut chart = chart_on(root, &self.title)?
            .right_y_label_area_size(if y2_axis.is_some() { 80 } else { 0 })
            .build_cartesian_2d(xs.0..xs.1, y1.0..y1.1)
            .map_err(err)?
            .set_secondary_coord(xs.0..xs.1, y2.0..y2.1);

        let fmt_y = |log: bool| move |v: &f64| number(if log { 10f64.powf(*v) } else { *v });
        let fmt1 = fmt_y(self.y.log);
        // On log axes, one label per power of ten.
        let labels = |log: bool, r: (f64, f64)| {
            if log {
                (r.1 - r.0).round() as usize + 1
            } else {
                10
            }
        };
        chart
            .configure_mesh()
            .y_labels(labels(self.y.log, y1))
            .x_desc(self.x_label.as_str())
            .y_desc(self.y.label.as_str())
            .y_label_formatter(&fmt1)
            .x_label_formatter(&|v| number(*v))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .draw()
            .map_err(err)?;
        if let Some(a) = y2_axis {
            let fmt2 = fmt_y(a.log);
            chart
                .configure_secondary_axes()
                .y_labels(labels(a.log, y2))
                .y_desc(a.label.as_str())
                .y_label_formatter(&fmt2)
                .label_style(("sans-serif", 14))
                .axis_desc_style(("sans-serif", 16))
                .draw()
                .map_err(err)?;
        }

        let many = prepared.iter().map(|(_, _, p)| p.len()).sum::<usize>() > 2_000;
        for (i, s, pts) in &prepared {
            let color = Palette99::pick(*i).to_rgba();
            let (point_color, radius) = if many {
                (color.mix(0.35), 1)
            } else {
                (color.mix(0.8), 2)
            };
            // One-pixel lines: plotters draws wider ones with miter joins,
            // which spike far past the plot at sharp turns.
            let anno = match (s.kind, s.secondary) {
                (Kind::Line | Kind::Step, false) => chart
                    .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(1)))
                    .map_err(err)?,
                (Kind::Line | Kind::Step, true) => chart
                    .draw_secondary_series(LineSeries::new(
                        pts.iter().copied(),
                        color.stroke_width(1),
                    ))
                    .map_err(err)?,
                (Kind::Points, false) => chart
                    .draw_series(
                        pts.iter()
                            .map(|&p| Circle::new(p, radius, point_color.filled())),
                    )
                    .map_err(err)?,
                (Kind::Points, true) => chart
                    .draw_secondary_series(
                        pts.iter()
                            .map(|&p| Circle::new(p, radius, point_color.filled())),
                    )
                    .map_err(err)?,
            };
            if !s.name.is_empty() {
                anno.label(s.name.as_str()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                });
            }
        }
        if self.series.iter().any(|s| !s.name.is_empty()) {
            draw_legend(&mut chart)?;
        }
        Ok(())
    }
}

/// A series' index (for its color), the series, and its points on the axis
/// scale.
type Prepared<'a> = (usize, &'a Series, Vec<(f64, f64)>);

/// A step line through `pts`: each value held until the next x.
fn steps(pts: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(pts.len() * 2);
    for (i, &(x, y)) in pts.iter().enumerate() {
        if i > 0 {
            out.push((x, pts[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

/// min..max of finite values, widened when empty or a single value.
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        (0.0, 1.0)
    } else if lo == hi {
        (lo - 1.0, hi + 1.0)
    } else {
        (lo, hi)
    }
}

/// A y range with 5 % headroom; linear axes start at 0 when all values are
/// non-negative.
fn y_range(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (lo, hi) = range(values);
    let lo = if log { lo.floor() } else { lo.min(0.0) };
    let hi = if log { hi.ceil().max(lo + 1.0) } else { hi };
    let pad = if log { 0.0 } else { (hi - lo) * 0.05 };
    (lo, hi + pad)
}

/// Compact axis label: 1.5k, 2M, 0.25, 3.
pub fn number(v: f64) -> String {
    let a = v.abs();
    let (div, suffix) = if a >= 1e12 {
        (1e12, "T")
    } else if a >= 1e9 {
        (1e9, "G")
    } else if a >= 1e6 {
        (1e6, "M")
    } else if a >= 1e4 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    let s = v / div;
    let text = if s.abs() >= 100.0 {
        format!("{s:.0}")
    } else if s.abs() >= 1.0 {
        format!("{s:.1}")
    } else {
        format!("{s:.2}")
    };
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    format!("{text}{suffix}")
}
