//! Duration text, one way everywhere: `parse_duration` for settings and
//! flags (`250ms`, `1.5s`, `2m`), and `format_duration`, whose output
//! parses back to the same value.
//!
//! Units: `us` (or `µs`), `ms`, `s`, `m` or `min`, `h`; a bare number is
//! seconds. The number is decimal digits with at most one point (`1.5s`,
//! `.5s`, `10 s`); it is converted exactly, not through a float, and a
//! fraction of a nanosecond is dropped. There is deliberately no `ns`: no
//! kernmlops setting is that fine, and `0.001us` still says it.

use std::{fmt, time::Duration};

const NS_PER_US: u128 = 1_000;
const NS_PER_MS: u128 = 1_000_000;
const NS_PER_S: u128 = 1_000_000_000;
const NS_PER_MIN: u128 = 60 * NS_PER_S;
const NS_PER_H: u128 = 3_600 * NS_PER_S;

/// Digits after the point that are used; later ones cannot change the
/// whole-nanosecond result of any unit (25 digits times an hour in
/// nanoseconds still fits a u128).
const MAX_FRACTION_DIGITS: usize = 25;

const EXAMPLES: &str = "try 10s, 500ms, 1.5s or 2m";
const UNITS: &str = "us, ms, s, m, min or h";

/// Why a text is not a duration. Each variant carries the text as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    /// Nothing but white space.
    Empty,
    /// Starts with a minus sign.
    Negative(String),
    /// NaN or infinity.
    NotFinite(String),
    /// No number where one should be.
    NotANumber(String),
    /// A unit this parser does not know.
    UnknownUnit { input: String, unit: String },
    /// Longer than `Duration::MAX` (about 584 billion years).
    TooLarge(String),
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "an empty text is not a duration ({EXAMPLES})"),
            Self::Negative(s) => write!(f, "{s:?}: a duration cannot be negative"),
            Self::NotFinite(s) => write!(f, "{s:?}: a duration must be a finite number"),
            Self::NotANumber(s) => write!(f, "{s:?} is not a duration ({EXAMPLES})"),
            Self::UnknownUnit { input, unit } => {
                write!(f, "unknown unit {unit:?} in {input:?} (use {UNITS})")
            }
            Self::TooLarge(s) => write!(f, "{s:?} is too long for a duration"),
        }
    }
}

impl std::error::Error for DurationError {}

/// Nanoseconds per unit, or `None` for a unit this parser does not know.
fn unit_ns(unit: &str) -> Option<u128> {
    Some(match unit {
        "us" | "µs" => NS_PER_US,
        "ms" => NS_PER_MS,
        "" | "s" => NS_PER_S,
        "m" | "min" => NS_PER_MIN,
        "h" => NS_PER_H,
        _ => return None,
    })
}

/// Parses `250us`, `250ms`, `10s`, `1.5s`, `2m`, `2min`, `1h`; a bare
/// number is seconds. Refuses negative, NaN, infinite and too-large values
/// with a message that names the text.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let text = s.trim();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    if text.starts_with('-') {
        return Err(DurationError::Negative(text.to_owned()));
    }
    let lower = text.trim_start_matches('+').to_ascii_lowercase();
    if lower.starts_with("nan") || lower.starts_with("inf") {
        return Err(DurationError::NotFinite(text.to_owned()));
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let not_a_number = || DurationError::NotANumber(text.to_owned());
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(not_a_number());
    }
    let unit = unit.trim();
    let per_unit = unit_ns(unit).ok_or_else(|| DurationError::UnknownUnit {
        input: text.to_owned(),
        unit: unit.to_owned(),
    })?;
    let too_large = || DurationError::TooLarge(text.to_owned());

    let mut whole_units: u128 = 0;
    for d in whole.bytes() {
        whole_units = whole_units
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(d - b'0')))
            .ok_or_else(too_large)?;
    }
    let mut fraction_value: u128 = 0;
    let mut scale: u128 = 1;
    for d in fraction.bytes().take(MAX_FRACTION_DIGITS) {
        fraction_value = fraction_value * 10 + u128::from(d - b'0');
        scale *= 10;
    }
    let nanos = whole_units
        .checked_mul(per_unit)
        .and_then(|ns| ns.checked_add(fraction_value * per_unit / scale))
        .ok_or_else(too_large)?;
    let secs = u64::try_from(nanos / NS_PER_S).map_err(|_| too_large())?;
    // The remainder is below 10^9.
    Ok(Duration::new(secs, (nanos % NS_PER_S) as u32))
}

/// Formats a duration in the largest unit that says it exactly: `2h`,
/// `90m`, `1.5s`, `500ms`, `250us`, `0.001us`, `0s`.
/// `parse_duration(&format_duration(d)) == Ok(d)` for every `d`.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".to_owned();
    }
    if ns % NS_PER_H == 0 {
        return format!("{}h", ns / NS_PER_H);
    }
    if ns % NS_PER_MIN == 0 {
        return format!("{}m", ns / NS_PER_MIN);
    }
    let (per_unit, digits, unit) = if ns >= NS_PER_S {
        (NS_PER_S, 9, "s")
    } else if ns >= NS_PER_MS {
        (NS_PER_MS, 6, "ms")
    } else {
        (NS_PER_US, 3, "us")
    };
    let (whole, rest) = (ns / per_unit, ns % per_unit);
    if rest == 0 {
        format!("{whole}{unit}")
    } else {
        let fraction = format!("{rest:0digits$}");
        format!("{whole}.{}{unit}", fraction.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_the_accepted_forms() {
        for (text, want) in [
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("250ms", ms(250)),
            ("10s", Duration::from_secs(10)),
            ("10", Duration::from_secs(10)),
            ("1.5", ms(1500)),
            ("1.5s", ms(1500)),
            (".5s", ms(500)),
            ("5.s", Duration::from_secs(5)),
            (" 10 s ", Duration::from_secs(10)),
            ("0", Duration::ZERO),
            ("0.0ms", Duration::ZERO),
            ("2m", Duration::from_secs(120)),
            ("2min", Duration::from_secs(120)),
            ("1.5m", Duration::from_secs(90)),
            ("1h", Duration::from_secs(3600)),
            ("0.25h", Duration::from_secs(900)),
            ("0.001us", Duration::from_nanos(1)),
            ("0.0015us", Duration::from_nanos(1)),
            ("1.1s", Duration::new(1, 100_000_000)),
            ("0.1", ms(100)),
            (
                "18446744073709551615.999999999s",
                Duration::new(u64::MAX, 999_999_999),
            ),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn refuses_with_a_message_naming_the_text() {
        for (text, want, needle) in [
            ("", DurationError::Empty, "empty"),
            ("  ", DurationError::Empty, "empty"),
            ("-1s", DurationError::Negative("-1s".into()), "negative"),
            ("-0", DurationError::Negative("-0".into()), "negative"),
            ("NaN", DurationError::NotFinite("NaN".into()), "finite"),
            ("inf", DurationError::NotFinite("inf".into()), "finite"),
            ("+infs", DurationError::NotFinite("+infs".into()), "finite"),
            (
                "ten",
                DurationError::NotANumber("ten".into()),
                "not a duration",
            ),
            ("s", DurationError::NotANumber("s".into()), "not a duration"),
            (".", DurationError::NotANumber(".".into()), "not a duration"),
            (
                "1.2.3s",
                DurationError::NotANumber("1.2.3s".into()),
                "not a duration",
            ),
            (
                "+5s",
                DurationError::NotANumber("+5s".into()),
                "not a duration",
            ),
            (
                "5y",
                DurationError::UnknownUnit {
                    input: "5y".into(),
                    unit: "y".into(),
                },
                "unknown unit \"y\"",
            ),
            (
                "10ns",
                DurationError::UnknownUnit {
                    input: "10ns".into(),
                    unit: "ns".into(),
                },
                "use us, ms",
            ),
            (
                "1e3s",
                DurationError::UnknownUnit {
                    input: "1e3s".into(),
                    unit: "e3s".into(),
                },
                "unknown unit",
            ),
            (
                "18446744073709551616s",
                DurationError::TooLarge("18446744073709551616s".into()),
                "too long",
            ),
            (
                "99999999999999999999999999999999999999999h",
                DurationError::TooLarge("99999999999999999999999999999999999999999h".into()),
                "too long",
            ),
        ] {
            let got = parse_duration(text);
            assert_eq!(got, Err(want), "{text:?}");
            let message = got.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(message.contains(needle), "{text:?}: {message}");
            if !text.trim().is_empty() {
                assert!(message.contains(text.trim()), "{text:?}: {message}");
            }
        }
    }

    #[test]
    fn formats_in_the_largest_exact_unit() {
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(1), "1s"),
            (ms(500), "500ms"),
            (ms(1500), "1.5s"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_micros(1250), "1.25ms"),
            (Duration::from_nanos(1), "0.001us"),
            (Duration::from_nanos(1_001), "1.001us"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(5400), "90m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::new(3600, 1), "3600.000000001s"),
            (
                Duration::new(u64::MAX, 999_999_999),
                "18446744073709551615.999999999s",
            ),
        ] {
            assert_eq!(format_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn formatted_text_parses_back_to_the_same_value() {
        let mut samples = vec![
            Duration::ZERO,
            Duration::MAX,
            Duration::from_nanos(1),
            Duration::from_secs(u64::MAX),
            Duration::from_secs(3600 * 24 * 365),
        ];
        // A fixed linear congruential sequence: varied magnitudes, same
        // every run.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let secs = (x >> 11) >> (x % 53);
            let nanos = match x % 5 {
                0 => 0,
                1 => ((x >> 7) % 1000) as u32 * 1_000_000,
                2 => ((x >> 9) % 1_000_000) as u32 * 1_000,
                _ => ((x >> 13) % 1_000_000_000) as u32,
            };
            samples.push(Duration::new(secs, nanos));
        }
        for d in samples {
            let text = format_duration(d);
            assert_eq!(parse_duration(&text), Ok(d), "{d:?} formatted as {text:?}");
        }
    }
}

/// A duration written as text in settings (`"1s"`, `"500ms"`, `"2m"`):
/// parsed by [`parse_duration`] and shown by [`format_duration`], with serde
/// support behind the `serde` feature. Host and plugins use this one type.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }

    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    pub const fn get(self) -> Duration {
        self.0
    }
}

impl fmt::Debug for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl std::str::FromStr for HumanDuration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, DurationError> {
        parse_duration(s).map(Self)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
