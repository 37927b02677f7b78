//! Statistics of repeated runs: mean, sample standard deviation, the 95%
//! confidence interval of the mean from Student's t distribution, and the
//! adaptive rule that repeats a combination until that interval is tight.

/// Summary of one figure over the runs of one variable combination.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation (n - 1); `None` with one value.
    pub sd: Option<f64>,
    /// Half-width of the 95% confidence interval of the mean; `None` with
    /// one value.
    pub half_width: Option<f64>,
}

impl Summary {
    /// The summary of `values` (non-finite values are ignored); `None` when
    /// nothing is left.
    pub fn of(values: &[f64]) -> Option<Self> {
        let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        let n = v.len();
        if n == 0 {
            return None;
        }
        let mean = v.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Some(Self {
                n,
                mean,
                sd: None,
                half_width: None,
            });
        }
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let sd = var.sqrt();
        let t = t_quantile(0.975, (n - 1) as f64);
        Some(Self {
            n,
            mean,
            sd: Some(sd),
            half_width: Some(t * sd / (n as f64).sqrt()),
        })
    }

    /// The 95% confidence interval of the mean.
    pub fn ci(&self) -> Option<(f64, f64)> {
        self.half_width.map(|h| (self.mean - h, self.mean + h))
    }

    /// Half-width relative to |mean|: 0 when every value is the same,
    /// infinite when the mean is 0 but the values are not.
    pub fn relative_half_width(&self) -> Option<f64> {
        let h = self.half_width?;
        Some(if h == 0.0 {
            0.0
        } else if self.mean == 0.0 {
            f64::INFINITY
        } else {
            h / self.mean.abs()
        })
    }
}

/// Adaptive repeats: whether a combination with these `values` of the
/// chosen figure needs another run. It does while the relative half-width
/// of the 95% CI is above `target` (or not known yet: fewer than two
/// values), until `max_repeats` values are there.
pub fn needs_more(values: &[f64], target: f64, max_repeats: usize) -> bool {
    if values.len() >= max_repeats {
        return false;
    }
    match Summary::of(values).and_then(|s| s.relative_half_width()) {
        Some(rel) => rel > target,
        None => true,
    }
}

/// The `p` quantile of Student's t distribution with `df` degrees of
/// freedom (`0 < p < 1`, `df > 0`), by bisection on the distribution
/// function; accurate to about 1e-10.
pub fn t_quantile(p: f64, df: f64) -> f64 {
    if !(0.0..=1.0).contains(&p) || df <= 0.0 || p == 0.0 || p == 1.0 {
        return f64::NAN;
    }
    if p < 0.5 {
        return -t_quantile(1.0 - p, df);
    }
    if p == 0.5 {
        return 0.0;
    }
    let mut hi = 1.0;
    while t_cdf(hi, df) < p {
        hi *= 2.0;
        if hi > 1e12 {
            return f64::INFINITY;
        }
    }
    let mut lo = 0.0;
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_cdf(mid, df) < p {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo < 1e-12 * hi.max(1.0) {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// P(T <= t) for Student's t with `df` degrees of freedom.
pub fn t_cdf(t: f64, df: f64) -> f64 {
    let x = df / (df + t * t);
    let tail = 0.5 * incomplete_beta(0.5 * df, 0.5, x);
    if t >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 - x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularised incomplete beta function I_x(a, b).
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    // The continued fraction converges fast below the mean; use the
    // symmetry I_x(a, b) = 1 - I_{1-x}(b, a) above it.
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(a, b, x) / a
    } else {
        1.0 - front * beta_fraction(b, a, 1.0 - x) / b
    }
}

/// Lentz's evaluation of the incomplete beta continued fraction.
fn beta_fraction(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let away_from_zero = |v: f64| if v.abs() < TINY { TINY } else { v };
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 / away_from_zero(1.0 - qab * x / qap);
    let mut h = d;
    // One term `aa` of the fraction: the factor it multiplies `h` by.
    let mut term = |aa: f64| {
        d = 1.0 / away_from_zero(1.0 + aa * d);
        c = away_from_zero(1.0 + aa / c);
        d * c
    };
    for m in 1..=300 {
        let m = m as f64;
        let m2 = 2.0 * m;
        h *= term(m * (b - m) * x / ((qam + m2) * (a + m2)));
        let del = term(-(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)));
        h *= del;
        if (del - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn t_quantiles_match_the_tables() {
        // Two-sided 95% critical values (the 0.975 quantile).
        for (df, want) in [
            (1.0, 12.706_204_736),
            (2.0, 4.302_652_730),
            (3.0, 3.182_446_305),
            (4.0, 2.776_445_105),
            (5.0, 2.570_581_836),
            (9.0, 2.262_157_163),
            (10.0, 2.228_138_852),
            (30.0, 2.042_272_456),
            (100.0, 1.983_971_519),
            (1e6, 1.959_966_4),
        ] {
            let got = t_quantile(0.975, df);
            assert!(close(got, want, 1e-6), "df {df}: {got} != {want}");
        }
        // Other levels, and symmetry.
        assert!(close(t_quantile(0.95, 10.0), 1.812_461_123, 1e-6));
        assert!(close(t_quantile(0.995, 3.0), 5.840_909_310, 1e-6));
        assert!(close(t_quantile(0.025, 5.0), -2.570_581_836, 1e-6));
        assert_eq!(t_quantile(0.5, 7.0), 0.0);
        assert!(t_quantile(1.5, 3.0).is_nan() && t_quantile(0.9, 0.0).is_nan());
    }

    #[test]
    fn cdf_is_a_distribution_function() {
        assert!(close(t_cdf(0.0, 4.0), 0.5, 1e-12));
        // df = 1 is Cauchy: F(1) = 3/4.
        assert!(close(t_cdf(1.0, 1.0), 0.75, 1e-10));
        assert!(close(t_cdf(-1.0, 1.0), 0.25, 1e-10));
        let mut last = 0.0;
        for i in -50..=50 {
            let f = t_cdf(f64::from(i) / 5.0, 3.0);
            assert!(f >= last, "monotone");
            last = f;
        }
    }

    #[test]
    fn summary_gives_mean_sd_and_ci() {
        let s = Summary::of(&[10.0, 12.0, 14.0]).expect("values");
        assert_eq!(s.n, 3);
        assert!(close(s.mean, 12.0, 1e-12));
        assert!(close(s.sd.expect("sd"), 2.0, 1e-12));
        // t(0.975, 2) * 2 / sqrt(3)
        let h = 4.302_652_730 * 2.0 / 3f64.sqrt();
        assert!(close(s.half_width.expect("ci"), h, 1e-6));
        let (lo, hi) = s.ci().expect("ci");
        assert!(close(lo, 12.0 - h, 1e-6) && close(hi, 12.0 + h, 1e-6));
        assert!(close(s.relative_half_width().expect("rel"), h / 12.0, 1e-9));

        let one = Summary::of(&[5.0]).expect("one value");
        assert_eq!((one.n, one.mean, one.sd, one.ci()), (1, 5.0, None, None));
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(Summary::of(&[f64::NAN]), None, "non-finite values ignored");
        let same = Summary::of(&[3.0, 3.0]).expect("values");
        assert_eq!(same.relative_half_width(), Some(0.0));
        let around_zero = Summary::of(&[-1.0, 1.0]).expect("values");
        assert_eq!(around_zero.relative_half_width(), Some(f64::INFINITY));
    }

    #[test]
    fn adaptive_stops_when_tight_or_at_the_maximum() {
        // Fewer than two values: no interval yet, so more are needed.
        assert!(needs_more(&[], 0.05, 10));
        assert!(needs_more(&[100.0], 0.05, 10));
        // 100 ± 1: half-width 12.7 for n = 2 (rel 12.7%), above 5%.
        assert!(needs_more(&[99.0, 101.0], 0.05, 10));
        // Five values within ±1 of 100: rel ≈ 0.98%, below 5%
        assert!(!needs_more(&[99.0, 101.0, 100.0, 99.5, 100.5], 0.05, 10));
        // (half-width 2.776 * 0.79 / sqrt(5) = 0.98, so 0.98%.) The same
        // spread with a 0.5% target still needs more ...
        assert!(needs_more(&[99.0, 101.0, 100.0, 99.5, 100.5], 0.005, 10));
        // ... until the maximum number of repeats.
        assert!(!needs_more(&[99.0, 101.0, 100.0, 99.5, 100.5], 0.005, 5));
        // Identical values: converged at two.
        assert!(!needs_more(&[7.0, 7.0], 0.05, 10));
    }
}
