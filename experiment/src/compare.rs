//! Comparing combinations of runs: Welch's t-test, Holm's correction, the
//! ratio of two means with Fieller's 95% interval, robust spread (median,
//! MAD) with outliers flagged, and the best value of a variable with its
//! margin over the runner-up and the regret of a default.

use super::stats::{t_cdf, t_quantile, Summary};

/// Welch's two-sample t-test (unequal variances), two-sided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Welch {
    pub t: f64,
    /// Welch-Satterthwaite degrees of freedom.
    pub df: f64,
    /// Two-sided p-value; 1 when both samples are constant and equal, 0
    /// when they are constant and differ.
    pub p: f64,
}

/// Mean and variance of the mean (s² / n) of the finite values.
fn moments(values: &[f64]) -> Option<(usize, f64, f64)> {
    let s = Summary::of(values)?;
    let sd = s.sd?;
    Some((s.n, s.mean, sd * sd / s.n as f64))
}

/// Welch's test of `a` against `b`; `None` when either has fewer than two
/// finite values.
pub fn welch(a: &[f64], b: &[f64]) -> Option<Welch> {
    let (na, ma, va) = moments(a)?;
    let (nb, mb, vb) = moments(b)?;
    let se2 = va + vb;
    if se2 == 0.0 {
        let differ = ma != mb;
        return Some(Welch {
            t: if differ {
                f64::INFINITY.copysign(ma - mb)
            } else {
                0.0
            },
            df: (na + nb - 2) as f64,
            p: if differ { 0.0 } else { 1.0 },
        });
    }
    let t = (ma - mb) / se2.sqrt();
    let df = se2 * se2 / (va * va / (na - 1) as f64 + vb * vb / (nb - 1) as f64);
    let p = (2.0 * t_cdf(-t.abs(), df)).min(1.0);
    Some(Welch { t, df, p })
}

/// Holm's step-down adjustment of `p` (family-wise error), in the input's
/// order: the k-th smallest p is multiplied by (m - k + 1), made
/// monotone, and capped at 1. Non-finite p-values stay as they are and do
/// not count in m.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..p.len()).filter(|&i| p[i].is_finite()).collect();
    order.sort_by(|&i, &j| p[i].total_cmp(&p[j]));
    let m = order.len();
    let mut out = p.to_vec();
    let mut running: f64 = 0.0;
    for (k, &i) in order.iter().enumerate() {
        running = running.max(((m - k) as f64 * p[i]).min(1.0));
        out[i] = running;
    }
    out
}

/// The ratio of mean(a) to mean(b) with its 95% confidence interval by
/// Fieller's theorem (independent samples, unequal variances, degrees of
/// freedom from Welch-Satterthwaite on the ratio's variance terms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    pub ratio: f64,
    /// `None` when the interval is unbounded: the reference mean is not
    /// distinguishable from 0 at this confidence.
    pub ci: Option<(f64, f64)>,
}

/// `None` when either sample is empty or mean(b) is 0.
pub fn ratio(a: &[f64], b: &[f64]) -> Option<Ratio> {
    let sa = Summary::of(a)?;
    let sb = Summary::of(b)?;
    if sb.mean == 0.0 {
        return None;
    }
    let r = sa.mean / sb.mean;
    let (Some(sda), Some(sdb)) = (sa.sd, sb.sd) else {
        return Some(Ratio { ratio: r, ci: None });
    };
    let va = sda * sda / sa.n as f64;
    let vb = sdb * sdb / sb.n as f64;
    let (ta, tb) = (va, r * r * vb);
    let df = if ta + tb == 0.0 {
        (sa.n + sb.n - 2) as f64
    } else {
        (ta + tb).powi(2) / (ta * ta / (sa.n - 1) as f64 + tb * tb / (sb.n - 1) as f64)
    };
    let q = t_quantile(0.975, df);
    let (x, y) = (sa.mean, sb.mean);
    // (x - θy)² = q²(va + θ²vb): θ²(y² - q²vb) - 2xyθ + (x² - q²va) = 0.
    let lead = y * y - q * q * vb;
    if lead <= 0.0 {
        return Some(Ratio { ratio: r, ci: None });
    }
    let disc = q * q * (x * x * vb + y * y * va - q * q * va * vb);
    if disc < 0.0 {
        return Some(Ratio { ratio: r, ci: None });
    }
    let lo = (x * y - disc.sqrt()) / lead;
    let hi = (x * y + disc.sqrt()) / lead;
    Some(Ratio {
        ratio: r,
        ci: Some((lo, hi)),
    })
}

/// Median, median absolute deviation, and which values are outliers: a
/// modified z-score 0.6745·|x − median| / MAD above 3.5 (Iglewicz and
/// Hoaglin). Outliers are flagged, never dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct Robust {
    pub median: f64,
    pub mad: f64,
    /// One flag per input value, in order (non-finite values are flagged).
    pub outlier: Vec<bool>,
}

fn median_of(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
    }
}

/// `None` when no value is finite.
pub fn robust(values: &[f64]) -> Option<Robust> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let median = median_of(&v);
    let mut dev: Vec<f64> = v.iter().map(|x| (x - median).abs()).collect();
    dev.sort_by(f64::total_cmp);
    let mad = median_of(&dev);
    let outlier = values
        .iter()
        .map(|&x| !x.is_finite() || (mad > 0.0 && 0.6745 * (x - median).abs() / mad > 3.5))
        .collect();
    Some(Robust {
        median,
        mad,
        outlier,
    })
}

/// The best level of a variable for one figure, among candidates given as
/// (level, values of the figure over that level's runs).
#[derive(Debug, Clone, PartialEq)]
pub struct Best<'a> {
    pub level: &'a str,
    pub mean: f64,
    /// The second-best level and its mean, when there is one.
    pub runner_up: Option<(&'a str, f64)>,
    /// How much better the best is than the runner-up, relative to the
    /// runner-up's mean (positive; `None` without a runner-up or when its
    /// mean is 0).
    pub margin: Option<f64>,
    /// Welch's p-value of best against runner-up.
    pub p: Option<f64>,
}

/// The level whose mean is lowest (`minimize`) or highest; ties keep the
/// first. Levels without a finite value are skipped; `None` when none is
/// left.
pub fn best<'a>(candidates: &[(&'a str, &[f64])], minimize: bool) -> Option<Best<'a>> {
    let mut means: Vec<(usize, f64)> = candidates
        .iter()
        .enumerate()
        .filter_map(|(i, (_, v))| Summary::of(v).map(|s| (i, s.mean)))
        .collect();
    means.sort_by(|a, b| {
        let o = a.1.total_cmp(&b.1);
        if minimize { o } else { o.reverse() }.then(a.0.cmp(&b.0))
    });
    let &(bi, bm) = means.first()?;
    let runner = means.get(1).copied();
    let margin = runner.and_then(|(_, rm)| (rm != 0.0).then(|| ((bm - rm) / rm).abs()));
    let p = runner.and_then(|(ri, _)| welch(candidates[bi].1, candidates[ri].1).map(|w| w.p));
    Some(Best {
        level: candidates[bi].0,
        mean: bm,
        runner_up: runner.map(|(ri, rm)| (candidates[ri].0, rm)),
        margin,
        p,
    })
}

/// The regret of choosing `default_mean` instead of `best_mean`: how much
/// worse, relative to the best (0 when the default is the best; `None`
/// when the best mean is 0).
pub fn regret(default_mean: f64, best_mean: f64, minimize: bool) -> Option<f64> {
    if best_mean == 0.0 {
        return None;
    }
    let worse = if minimize {
        default_mean - best_mean
    } else {
        best_mean - default_mean
    };
    Some((worse / best_mean).abs() * worse.signum().max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welch_matches_a_hand_computation() {
        // a: mean 3, s² = 2.5, n 5; b: mean 6, s² = 10, n 5.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [2.0, 4.0, 6.0, 8.0, 10.0];
        let w = welch(&a, &b).unwrap();
        let se2: f64 = 2.5 / 5.0 + 10.0 / 5.0;
        assert!((w.t - (-3.0 / se2.sqrt())).abs() < 1e-12);
        let df = se2 * se2 / ((0.5f64).powi(2) / 4.0 + (2.0f64).powi(2) / 4.0);
        assert!((w.df - df).abs() < 1e-12);
        assert!(w.p > 0.0 && w.p < 1.0);
        assert_eq!(welch(&a, &[1.0]), None);
        let same = welch(&[2.0, 2.0], &[2.0, 2.0]).unwrap();
        assert_eq!(same.p, 1.0);
        assert_eq!(welch(&[2.0, 2.0], &[3.0, 3.0]).unwrap().p, 0.0);
    }

    #[test]
    fn holm_on_a_crafted_case() {
        // Sorted: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06 by
        // monotonicity), 0.5 (x1 = 0.5).
        let adj = holm(&[0.03, 0.5, 0.01, 0.02]);
        let want = [0.06, 0.5, 0.04, 0.06];
        for (a, w) in adj.iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{adj:?}");
        }
        assert_eq!(holm(&[0.4, 0.5]), vec![0.8, 0.8]);
        let with_nan = holm(&[f64::NAN, 0.2]);
        assert!(with_nan[0].is_nan() && with_nan[1] == 0.2);
    }

    #[test]
    fn fieller_interval_contains_the_ratio_and_widens_with_noise() {
        let a = [10.0, 11.0, 9.0, 10.5, 9.5];
        let b = [5.0, 5.2, 4.8, 5.1, 4.9];
        let r = ratio(&a, &b).unwrap();
        assert!((r.ratio - 2.0).abs() < 1e-12);
        let (lo, hi) = r.ci.unwrap();
        assert!(lo < 2.0 && 2.0 < hi && lo > 1.5 && hi < 2.5, "{lo} {hi}");
        // The interval's ends solve Fieller's equation.
        let s = |v: &[f64]| Summary::of(v).unwrap();
        let (sa, sb) = (s(&a), s(&b));
        let va = sa.sd.unwrap().powi(2) / 5.0;
        let vb = sb.sd.unwrap().powi(2) / 5.0;
        let (ta, tb) = (va, 4.0 * vb);
        let df = (ta + tb).powi(2) / (ta * ta / 4.0 + tb * tb / 4.0);
        let q = t_quantile(0.975, df);
        for th in [lo, hi] {
            let lhs = (sa.mean - th * sb.mean).powi(2);
            let rhs = q * q * (va + th * th * vb);
            assert!((lhs - rhs).abs() < 1e-9 * rhs.max(1.0), "{lhs} {rhs}");
        }
        // A reference indistinguishable from 0: unbounded.
        assert_eq!(ratio(&a, &[-1.0, 1.0, -2.0, 2.1]).unwrap().ci, None);
        assert_eq!(ratio(&a, &[0.0, 0.0]), None);
    }

    #[test]
    fn robust_flags_outliers_without_dropping() {
        let v = [10.0, 10.2, 9.9, 10.1, 10.0, 30.0];
        let r = robust(&v).unwrap();
        assert_eq!(r.median, 10.05);
        assert_eq!(r.outlier, vec![false, false, false, false, false, true]);
        assert_eq!(robust(&[5.0, 5.0, 5.0]).unwrap().outlier, vec![false; 3]);
        assert_eq!(robust(&[]), None);
    }

    #[test]
    fn best_level_margin_significance_and_regret() {
        let fast = [1.0, 1.1, 0.9, 1.0];
        let mid = [2.0, 2.1, 1.9, 2.0];
        let slow = [4.0, 4.2, 3.8, 4.0];
        let c: Vec<(&str, &[f64])> = vec![("a", &slow), ("b", &fast), ("c", &mid)];
        let b = best(&c, true).unwrap();
        assert_eq!(b.level, "b");
        assert_eq!(b.runner_up.map(|r| r.0), Some("c"));
        assert!((b.margin.unwrap() - 0.5).abs() < 1e-12);
        assert!(b.p.unwrap() < 0.001);
        let w = best(&c, false).unwrap();
        assert_eq!(w.level, "a");
        assert!((regret(4.0, 1.0, true).unwrap() - 3.0).abs() < 1e-12);
        assert_eq!(regret(1.0, 1.0, true), Some(0.0));
        assert_eq!(regret(0.5, 1.0, true), Some(0.0));
        assert!((regret(1.0, 4.0, false).unwrap() - 0.75).abs() < 1e-12);
    }
}
