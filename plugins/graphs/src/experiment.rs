//! An experiment's results graphs: for each numeric `@result` figure of
//! `results.arrow` (written by `kernmlops experiment`), one line plot
//! against each variable, the other variables' combinations as series,
//! each point the mean of its runs with a 95% confidence interval (Student
//! t) as an error bar. Numeric variables get a numeric axis; others one
//! position per value, in the order the experiment declared them. Failed
//! runs are left out, as in `experiment results`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use kernmlops_plugin_sdk::{
    graph::{GraphData, TableView},
    serde_json, GraphImpl, Result, StartArgs,
};
use plotters::{coord::Shift, prelude::*};

use crate::plot::{chart_on, draw_legend, drawing_error, number, Drawable};

graph! {
    /// The graph `kernmlops experiment` calls with the experiment folder.
    pub struct ExperimentResults = "experiment_results",
        "An experiment's results: each result against each variable, mean with 95% CI per combination";
    // `results.arrow` exists only in experiment folders, so collections
    // never get this graph.
    tables &["results"];
    {
        fn render(&mut self, data: GraphData<'_>, out: &Path) -> Result<Vec<PathBuf>> {
            let results = Results::from_table(data.table("results")?)?;
            let mut files = Vec::new();
            for fig in figures(&results) {
                files.extend(fig.render(out)?);
            }
            Ok(files)
        }
    }
}

/// One cell of the results.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Num(f64),
    Text(String),
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Self::Null => "-".into(),
            Self::Num(x) => number_exact(*x),
            Self::Text(s) => s.clone(),
        }
    }
}

/// A number as written (integers without a fraction).
fn number_exact(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

/// A column of the results table.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub role: String,
    pub numeric: bool,
    /// A variable's values in declared order (`kernmlops.levels`).
    pub levels: Vec<String>,
    pub cells: Vec<Cell>,
}

/// The results table.
#[derive(Debug, Clone)]
pub struct Results {
    pub experiment: String,
    pub columns: Vec<Column>,
    pub rows: usize,
}

impl Results {
    /// The results from the `results` table the host read from
    /// `results.arrow`.
    pub fn from_table(t: TableView<'_>) -> Result<Self> {
        let mut columns = Vec::new();
        for name in t.column_names() {
            let meta = t.column_metadata(name);
            let levels = meta["kernmlops.levels"]
                .as_str()
                .and_then(|t| serde_json::from_str::<Vec<serde_json::Value>>(t).ok())
                .unwrap_or_default()
                .into_iter()
                .map(|v| match v {
                    serde_json::Value::String(s) => s,
                    serde_json::Value::Number(n) => {
                        n.as_f64().map_or_else(|| n.to_string(), number_exact)
                    }
                    other => other.to_string(),
                })
                .collect();
            let arrow_type = t.arrow_type(name);
            let nulls = t.nulls(name)?;
            let cells: Vec<Cell> = match arrow_type.as_str() {
                "Int64" | "Float64" => t
                    .f64s(name)?
                    .into_iter()
                    .zip(&nulls)
                    .map(|(v, &null)| if null { Cell::Null } else { Cell::Num(v) })
                    .collect(),
                "Boolean" => t
                    .u64s(name)?
                    .into_iter()
                    .zip(&nulls)
                    .map(|(v, &null)| {
                        if null {
                            Cell::Null
                        } else {
                            Cell::Text((v != 0).to_string())
                        }
                    })
                    .collect(),
                "Utf8" => t
                    .strings(name)?
                    .into_iter()
                    .zip(&nulls)
                    .map(|(v, &null)| if null { Cell::Null } else { Cell::Text(v) })
                    .collect(),
                _ => (0..t.rows()).map(|_| Cell::Null).collect(),
            };
            columns.push(Column {
                name: name.to_owned(),
                role: meta["kernmlops.role"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                numeric: matches!(arrow_type.as_str(), "Int64" | "Float64"),
                levels,
                cells,
            });
        }
        Ok(Self {
            experiment: t.metadata()["kernmlops.experiment"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            rows: t.rows(),
            columns,
        })
    }

    fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom: exact
/// table values to 30, the Cornish-Fisher expansion beyond (error < 1e-4).
pub fn t975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157,
        2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922,
        2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831,
        2.048407, 2.045230, 2.042272,
    ];
    if df == 0 {
        return f64::NAN;
    }
    if df <= 30 {
        return TABLE[df - 1];
    }
    let z: f64 = 1.959_963_985;
    let v = df as f64;
    z + (z.powi(3) + z) / (4.0 * v)
        + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * v * v)
        + (3.0 * z.powi(7) + 19.0 * z.powi(5) + 17.0 * z.powi(3) - 15.0 * z) / (384.0 * v.powi(3))
}

/// Mean and 95% CI half-width (None below two values).
pub fn mean_ci(values: &[f64]) -> (f64, Option<f64>) {
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, None);
    }
    let var = values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, Some(t975(n - 1) * var.sqrt() / (n as f64).sqrt()))
}

/// One point of a series: position, mean, CI half-width.
type Point = (f64, f64, Option<f64>);

/// One figure: a result against a variable.
#[derive(Debug, Clone)]
pub struct ResultFigure {
    pub stem: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Category names at positions 0, 1, ... for a non-numeric variable.
    pub categories: Option<Vec<String>>,
    pub series: Vec<(String, Vec<Point>)>,
}

fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Every figure the results call for.
pub fn figures(r: &Results) -> Vec<ResultFigure> {
    let variables: Vec<&Column> = r.columns.iter().filter(|c| c.role == "variable").collect();
    let counted: Vec<bool> = match r.column("run_class") {
        Some(c) => c
            .cells
            .iter()
            .map(|v| *v != Cell::Text("failed".into()))
            .collect(),
        None => vec![true; r.rows],
    };
    let mut out = Vec::new();
    for y in r.columns.iter().filter(|c| c.role == "result" && c.numeric) {
        let figure_name = y.name.trim_start_matches("result_");
        for x in &variables {
            // Positions: the value itself, or its index among the levels.
            let categories: Option<Vec<String>> = (!x.numeric).then(|| {
                let mut cats = x.levels.clone();
                for c in &x.cells {
                    if *c != Cell::Null && !cats.contains(&c.text()) {
                        cats.push(c.text());
                    }
                }
                cats
            });
            let position = |i: usize| -> Option<f64> {
                match (&x.cells[i], &categories) {
                    (Cell::Null, _) => None,
                    (Cell::Num(v), None) => Some(*v),
                    (c, Some(cats)) => cats.iter().position(|k| *k == c.text()).map(|p| p as f64),
                    _ => None,
                }
            };
            let mut groups: BTreeMap<String, BTreeMap<i64, (f64, Vec<f64>)>> = BTreeMap::new();
            for (i, &counts) in counted.iter().enumerate() {
                let (Some(px), Cell::Num(v), true) = (position(i), &y.cells[i], counts) else {
                    continue;
                };
                // Variables that do not apply in this run (null) are left
                // out of the series name.
                let series: Vec<String> = variables
                    .iter()
                    .filter(|o| o.name != x.name && o.cells[i] != Cell::Null)
                    .map(|o| format!("{}={}", o.name, o.cells[i].text()))
                    .collect();
                // Keyed by position in millionths, so equal floats group.
                groups
                    .entry(series.join(" "))
                    .or_default()
                    .entry((px * 1e6).round() as i64)
                    .or_insert_with(|| (px, Vec::new()))
                    .1
                    .push(*v);
            }
            if groups.is_empty() {
                continue;
            }
            let series = groups
                .into_iter()
                .map(|(name, points)| {
                    let pts = points
                        .into_values()
                        .map(|(px, vals)| {
                            let (m, h) = mean_ci(&vals);
                            (px, m, h)
                        })
                        .collect();
                    (name, pts)
                })
                .collect();
            out.push(ResultFigure {
                stem: format!("{}_vs_{}", file_safe(figure_name), file_safe(&x.name)),
                title: format!("{figure_name} by {}: {}", x.name, r.experiment),
                x_label: x.name.clone(),
                y_label: format!("{figure_name} (mean, 95% CI)"),
                categories,
                series,
            });
        }
    }
    out
}

impl Drawable for ResultFigure {
    fn stem(&self) -> &str {
        &self.stem
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let err = drawing_error::<DB::ErrorType>;
        let m = self.series.len();
        // Side by side within a category, so error bars do not overlap.
        let offset = |i: usize| -> f64 {
            if self.categories.is_some() && m > 1 {
                (i as f64 - (m - 1) as f64 / 2.0) * (0.3 / m as f64)
            } else {
                0.0
            }
        };
        let all = self.series.iter().flat_map(|(_, p)| p.iter());
        let (mut y_lo, mut y_hi) = (0.0f64, f64::NEG_INFINITY);
        let (mut x_lo, mut x_hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for &(x, mean, h) in all {
            let h = h.unwrap_or(0.0);
            y_lo = y_lo.min(mean - h);
            y_hi = y_hi.max(mean + h);
            x_lo = x_lo.min(x);
            x_hi = x_hi.max(x);
        }
        if !y_hi.is_finite() || y_hi <= y_lo {
            y_hi = y_lo + 1.0;
        }
        let pad = (y_hi - y_lo) * 0.06;
        let y_range = if y_lo < 0.0 { y_lo - pad } else { y_lo }..y_hi + pad;
        let x_range = match &self.categories {
            Some(c) => -0.5..(c.len() as f64 - 0.5),
            None if x_hi > x_lo => {
                let pad = (x_hi - x_lo) * 0.05;
                (x_lo - pad)..(x_hi + pad)
            }
            None => (x_lo - 1.0)..(x_lo + 1.0),
        };
        let mut chart = chart_on(root, &self.title)?
            .build_cartesian_2d(x_range, y_range)
            .map_err(err)?;
        let categories = self.categories.clone();
        let x_fmt = move |v: &f64| match &categories {
            Some(c) if (v - v.round()).abs() < 1e-9 && v.round() >= 0.0 => {
                c.get(v.round() as usize).cloned().unwrap_or_default()
            }
            Some(_) => String::new(),
            None => number(*v),
        };
        let x_labels = self.categories.as_ref().map_or(10, |c| 2 * c.len() + 1);
        chart
            .configure_mesh()
            .x_labels(x_labels)
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&|v| number(*v))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .draw()
            .map_err(err)?;
        for (i, (name, points)) in self.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let dx = offset(i);
            let pts: Vec<(f64, f64)> = points.iter().map(|p| (p.0 + dx, p.1)).collect();
            let anno = chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(err)?;
            if !name.is_empty() {
                anno.label(name.as_str()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                });
            }
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(err)?;
            let cap = match &self.categories {
                Some(_) => 0.04,
                None => {
                    let r = chart.x_range();
                    (r.end - r.start) * 0.008
                }
            };
            for &(x, mean, h) in points {
                let Some(h) = h else { continue };
                let x = x + dx;
                let (lo, hi) = (mean - h, mean + h);
                for seg in [
                    vec![(x, lo), (x, hi)],
                    vec![(x - cap, lo), (x + cap, lo)],
                    vec![(x - cap, hi), (x + cap, hi)],
                ] {
                    chart
                        .draw_series(std::iter::once(PathElement::new(
                            seg,
                            color.stroke_width(1),
                        )))
                        .map_err(err)?;
                }
            }
        }
        if self.series.iter().any(|(n, _)| !n.is_empty()) {
            draw_legend(&mut chart)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_table_and_expansion_agree() {
        assert!((t975(1) - 12.7062).abs() < 1e-4);
        assert!((t975(10) - 2.2281).abs() < 1e-4);
        // The expansion just past the table, and far out.
        assert!((t975(31) - 2.0395).abs() < 1e-4);
        assert!((t975(100) - 1.98397).abs() < 1e-4);
        assert!((t975(1_000_000) - 1.95997).abs() < 1e-4);
        let (m, h) = mean_ci(&[10.0, 12.0, 14.0]);
        assert!((m - 12.0).abs() < 1e-12);
        assert!((h.expect("two or more") - 4.302653 * 2.0 / 3f64.sqrt()).abs() < 1e-5);
        assert_eq!(mean_ci(&[5.0]), (5.0, None));
    }

    fn col(name: &str, role: &str, numeric: bool, cells: Vec<Cell>) -> Column {
        Column {
            name: name.into(),
            role: role.into(),
            numeric,
            levels: Vec::new(),
            cells,
        }
    }

    #[test]
    fn one_figure_per_result_and_variable() {
        use Cell::{Num, Text};
        let r = Results {
            experiment: "t".into(),
            rows: 6,
            columns: vec![
                col(
                    "threads",
                    "variable",
                    true,
                    [1.0, 1.0, 2.0, 2.0, 1.0, 2.0].map(Num).to_vec(),
                ),
                {
                    let mut c = col(
                        "mode",
                        "variable",
                        false,
                        ["b", "b", "b", "b", "a", "a"]
                            .map(|s| Text(s.into()))
                            .to_vec(),
                    );
                    c.levels = vec!["b".into(), "a".into()];
                    c
                },
                col(
                    "run_class",
                    "run",
                    false,
                    [
                        "curated", "curated", "curated", "curated", "curated", "failed",
                    ]
                    .map(|s| Text(s.into()))
                    .to_vec(),
                ),
                col(
                    "result_rate",
                    "result",
                    true,
                    [10.0, 12.0, 20.0, 22.0, 5.0, 99.0].map(Num).to_vec(),
                ),
                col("result_unit", "result", false, vec![Text("x".into()); 6]),
            ],
        };
        let figs = figures(&r);
        let stems: Vec<&str> = figs.iter().map(|f| f.stem.as_str()).collect();
        assert_eq!(stems, ["rate_vs_threads", "rate_vs_mode"]);
        let by_threads = &figs[0];
        assert_eq!(by_threads.categories, None);
        let names: Vec<&str> = by_threads.series.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(names, ["mode=a", "mode=b"]);
        // mode=b: threads 1 -> mean 11 with an interval, threads 2 -> 21.
        let b = &by_threads.series[1].1;
        assert_eq!((b[0].0, b[0].1), (1.0, 11.0));
        assert!(b[0].2.is_some());
        assert_eq!((b[1].0, b[1].1), (2.0, 21.0));
        // The failed run (99) is left out: mode=a has one point, no bar.
        assert_eq!(by_threads.series[0].1, vec![(1.0, 5.0, None)]);
        // A string variable: its declared order gives the positions.
        let by_mode = &figs[1];
        assert_eq!(by_mode.categories, Some(vec!["b".into(), "a".into()]));
        let dir = std::env::temp_dir().join(format!("kml-graphs-exp-{}", std::process::id()));
        if Path::new(crate::plot::FONT_PATH).is_file() {
            let files = by_mode.render(&dir).expect("render");
            assert_eq!(files.len(), 2);
            assert!(files.iter().all(|f| f.is_file()));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
