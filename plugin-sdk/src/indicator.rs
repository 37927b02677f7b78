//! Performance indicators: a benchmark's own result as one JSON object
//! (`name`, `component`, `@parameters`, `@result`, optional
//! `overall_score`), built by the shipped benchmarks and parsed from the
//! standard output of user scripts, with the format's rules checked.
//!
//! ```json
//! {"name": "fio", "component": "fio",
//!  "@parameters": {"bs": "4k", "rw": "randread"},
//!  "@result": {"read_iops": 8568.9, "read_bw_bytes_per_s": 35098482}}
//! ```
//!
//! Rules ([`Indicator::validate`]): `name` and `component` are non-empty
//! strings (`framework`, the format's older name, is read as `component`);
//! `@result` is present and an object whose values are numbers, strings or
//! booleans; `@parameters` (optional) is an object; no key is empty and no
//! key is in both `@parameters` and `@result`, since both are flattened
//! into one record; `overall_score`, when present, is a finite number; no
//! other top-level key. Bounds: the text is at most [`MAX_BYTES`], nested
//! at most 128 deep (serde_json's limit), each of `@parameters` and
//! `@result` has at most [`MAX_KEYS`] keys of at most [`MAX_KEY_BYTES`]
//! bytes each.
//!
//! This is the one parser and validator of the format: plugins build and
//! check their results with it, the host checks what a benchmark reported
//! with it, and the host's `indicator.json` (this object with the runner's
//! figures) is written and read back through it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The longest indicator text accepted, in bytes.
pub const MAX_BYTES: usize = 1 << 20;
/// The most keys in `@parameters`, and in `@result`.
pub const MAX_KEYS: usize = 1024;
/// The longest key in `@parameters` or `@result`, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// What is wrong with an indicator. Each message is one line naming the
/// offending key.
#[derive(Debug, Clone, PartialEq)]
pub enum IndicatorError {
    /// The output is empty (only white space).
    Empty,
    /// The output is not exactly one JSON value: serde_json's reason.
    NotJson(String),
    /// The output is JSON but not an object (what it is instead).
    NotAnObject(&'static str),
    /// A required key is absent.
    Missing(&'static str),
    /// A key holds a value of the wrong type.
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    /// `name` or `component` is an empty string.
    EmptyName(&'static str),
    /// An empty key inside `@parameters` or `@result`.
    EmptyKey(&'static str),
    /// A top-level key the format does not have.
    UnknownKey(String),
    /// A key in both `@parameters` and `@result`.
    Collision(String),
    /// Both `component` and its older name `framework`.
    ComponentTwice,
    /// The text is longer than [`MAX_BYTES`] (its length).
    TooLong(usize),
    /// `@parameters` or `@result` has more than [`MAX_KEYS`] keys.
    TooManyKeys { section: &'static str, count: usize },
    /// A key of `@parameters` or `@result` longer than [`MAX_KEY_BYTES`]
    /// (its first characters).
    KeyTooLong { section: &'static str, key: String },
}

/// The JSON type of a value, for messages.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

impl std::fmt::Display for IndicatorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => f.write_str("no output: expected one JSON object"),
            Self::NotJson(e) => write!(f, "not one JSON object: {e}"),
            Self::NotAnObject(found) => write!(f, "expected one JSON object, found {found}"),
            Self::Missing(key) => write!(f, "{key:?} is missing"),
            Self::WrongType {
                key,
                expected,
                found,
            } => write!(f, "{key:?} must be {expected}, found {found}"),
            Self::EmptyName(key) => write!(f, "{key:?} is empty"),
            Self::EmptyKey(section) => write!(f, "{section:?} has an empty key"),
            Self::UnknownKey(key) => write!(
                f,
                "unknown key {key:?} (known: name, component, @parameters, @result, overall_score)"
            ),
            Self::ComponentTwice => {
                f.write_str("give \"component\" or its older name \"framework\", not both")
            }
            Self::Collision(key) => write!(
                f,
                "key {key:?} is in both \"@parameters\" and \"@result\": rename one of them"
            ),
            Self::TooLong(bytes) => write!(
                f,
                "{bytes} bytes, more than the {MAX_BYTES} an indicator may have: report fewer figures"
            ),
            Self::TooManyKeys { section, count } => write!(
                f,
                "{section:?} has {count} keys, more than {MAX_KEYS}: report fewer figures"
            ),
            Self::KeyTooLong { section, key } => write!(
                f,
                "{section:?} has a key longer than {MAX_KEY_BYTES} bytes ({key:?}...)"
            ),
        }
    }
}

impl std::error::Error for IndicatorError {}

impl From<IndicatorError> for crate::Error {
    fn from(e: IndicatorError) -> Self {
        crate::Error::new(format!("performance indicator: {e}"))
    }
}

/// A benchmark's own result in the performance-indicator format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Indicator {
    /// The benchmark (or script) that ran.
    pub name: String,
    /// What was measured, a lowercase package name (`redis`, `fio`).
    pub component: String,
    /// The benchmark's effective settings: what defines the run.
    #[serde(rename = "@parameters", default)]
    pub parameters: Map<String, Value>,
    /// The run's own figures: numbers, strings or booleans.
    #[serde(rename = "@result")]
    pub result: Map<String, Value>,
    /// One number summarising the run, when the benchmark has one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub overall_score: Option<f64>,
}

impl Indicator {
    /// An indicator with no parameters and no figures yet.
    pub fn new(name: impl Into<String>, component: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            component: component.into(),
            parameters: Map::new(),
            result: Map::new(),
            overall_score: None,
        }
    }

    /// Adds every field of `settings` (a struct or map that serialises to
    /// a JSON object) to `@parameters`.
    pub fn with_parameters<T: Serialize>(mut self, settings: &T) -> Result<Self, IndicatorError> {
        match serde_json::to_value(settings) {
            Ok(Value::Object(m)) => {
                self.parameters.extend(m);
                Ok(self)
            }
            Ok(other) => Err(IndicatorError::WrongType {
                key: "@parameters".into(),
                expected: "an object",
                found: kind_of(&other),
            }),
            Err(e) => Err(IndicatorError::NotJson(e.to_string())),
        }
    }

    /// Sets one parameter.
    pub fn with_parameter(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.parameters.insert(key.into(), value.into());
        self
    }

    /// Sets one figure of `@result`. A non-finite float becomes `null`,
    /// which [`Indicator::validate`] refuses.
    pub fn with_result(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.result.insert(key.into(), value.into());
        self
    }

    /// Adds every figure of `figures` to `@result`.
    pub fn with_results(mut self, figures: impl IntoIterator<Item = (String, Value)>) -> Self {
        self.result.extend(figures);
        self
    }

    /// Sets `overall_score`.
    pub fn with_score(mut self, score: f64) -> Self {
        self.overall_score = Some(score);
        self
    }

    /// Checks the format's rules (see the module documentation).
    pub fn validate(&self) -> Result<(), IndicatorError> {
        if self.name.is_empty() {
            return Err(IndicatorError::EmptyName("name"));
        }
        if self.component.is_empty() {
            return Err(IndicatorError::EmptyName("component"));
        }
        check_keys("@parameters", &self.parameters)?;
        check_keys("@result", &self.result)?;
        for (key, value) in &self.result {
            if !matches!(value, Value::Number(_) | Value::String(_) | Value::Bool(_)) {
                return Err(IndicatorError::WrongType {
                    key: format!("@result.{key}"),
                    expected: "a number, a string or a boolean",
                    found: kind_of(value),
                });
            }
        }
        if let Some(key) = self
            .result
            .keys()
            .find(|k| self.parameters.contains_key(*k))
        {
            return Err(IndicatorError::Collision(key.clone()));
        }
        if let Some(score) = self.overall_score {
            if !score.is_finite() {
                return Err(IndicatorError::WrongType {
                    key: "overall_score".into(),
                    expected: "a finite number",
                    found: "a non-finite number",
                });
            }
        }
        Ok(())
    }

    /// The validated indicator as a JSON object, as
    /// [`crate::BenchmarkImpl::result`] returns it.
    pub fn to_value(&self) -> Result<Value, IndicatorError> {
        self.validate()?;
        serde_json::to_value(self).map_err(|e| IndicatorError::NotJson(e.to_string()))
    }

    /// Reads an indicator from a script's standard output, which must be
    /// exactly one JSON object (white space around it is fine), and
    /// validates it.
    pub fn parse(stdout: &str) -> Result<Self, IndicatorError> {
        if stdout.len() > MAX_BYTES {
            return Err(IndicatorError::TooLong(stdout.len()));
        }
        if stdout.trim().is_empty() {
            return Err(IndicatorError::Empty);
        }
        let value: Value =
            serde_json::from_str(stdout).map_err(|e| IndicatorError::NotJson(e.to_string()))?;
        Self::from_value(value)
    }

    /// Reads an indicator from a JSON value and validates it.
    pub fn from_value(value: Value) -> Result<Self, IndicatorError> {
        let Value::Object(mut top) = value else {
            return Err(IndicatorError::NotAnObject(kind_of(&value)));
        };
        if top.contains_key("component") && top.contains_key("framework") {
            return Err(IndicatorError::ComponentTwice);
        }
        let name = take_string(&mut top, "name")?;
        let component = match top.remove("framework") {
            Some(v) => string_of("framework", v)?,
            None => take_string(&mut top, "component")?,
        };
        let parameters = match top.remove("@parameters") {
            None => Map::new(),
            Some(v) => object_of("@parameters", v)?,
        };
        let result = match top.remove("@result") {
            None => return Err(IndicatorError::Missing("@result")),
            Some(v) => object_of("@result", v)?,
        };
        let overall_score = match top.remove("overall_score") {
            None => None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(other) => {
                return Err(IndicatorError::WrongType {
                    key: "overall_score".into(),
                    expected: "a number",
                    found: kind_of(&other),
                })
            }
        };
        if let Some(key) = top.keys().next() {
            return Err(IndicatorError::UnknownKey(key.clone()));
        }
        let ind = Self {
            name,
            component,
            parameters,
            result,
            overall_score,
        };
        ind.validate()?;
        Ok(ind)
    }
}

/// The bounds on the keys of `@parameters` or `@result`: not empty, not
/// too long, not too many.
fn check_keys(section: &'static str, map: &Map<String, Value>) -> Result<(), IndicatorError> {
    if map.len() > MAX_KEYS {
        return Err(IndicatorError::TooManyKeys {
            section,
            count: map.len(),
        });
    }
    for key in map.keys() {
        if key.is_empty() {
            return Err(IndicatorError::EmptyKey(section));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(IndicatorError::KeyTooLong {
                section,
                key: key.chars().take(32).collect(),
            });
        }
    }
    Ok(())
}

fn string_of(key: &'static str, v: Value) -> Result<String, IndicatorError> {
    match v {
        Value::String(s) => Ok(s),
        other => Err(IndicatorError::WrongType {
            key: key.into(),
            expected: "a string",
            found: kind_of(&other),
        }),
    }
}

fn take_string(top: &mut Map<String, Value>, key: &'static str) -> Result<String, IndicatorError> {
    match top.remove(key) {
        None => Err(IndicatorError::Missing(key)),
        Some(v) => string_of(key, v),
    }
}

fn object_of(key: &'static str, v: Value) -> Result<Map<String, Value>, IndicatorError> {
    match v {
        Value::Object(m) => Ok(m),
        other => Err(IndicatorError::WrongType {
            key: key.into(),
            expected: "an object",
            found: kind_of(&other),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = r#"{"name": "matmul", "component": "numpy",
        "@parameters": {"n": 512}, "@result": {"rate": 1.5e9, "unit": "flop/s"},
        "overall_score": 0.9}"#;

    #[test]
    fn parses_a_valid_indicator() {
        let i = Indicator::parse(VALID).expect("valid");
        assert_eq!(i.name, "matmul");
        assert_eq!(i.component, "numpy");
        assert_eq!(i.parameters["n"], 512);
        assert_eq!(i.result["rate"], 1.5e9);
        assert_eq!(i.result["unit"], "flop/s");
        assert_eq!(i.overall_score, Some(0.9));
        // What it writes parses back to the same indicator.
        let again = Indicator::parse(&i.to_value().expect("valid").to_string()).expect("again");
        assert_eq!(again, i);
    }

    #[test]
    fn framework_is_read_as_component_and_parameters_are_optional() {
        let i = Indicator::parse(r#"{"name": "a", "framework": "b", "@result": {"x": 1}}"#)
            .expect("valid");
        assert_eq!(i.component, "b");
        assert!(i.parameters.is_empty());
        assert_eq!(i.overall_score, None);
        let v = i.to_value().expect("valid");
        assert_eq!(v["component"], "b");
        assert!(v.get("overall_score").is_none(), "{v}");
    }

    /// Each rule, with the message that names what is wrong.
    #[test]
    fn each_rule_is_checked_with_a_reason() {
        for (stdout, want, message) in [
            ("", IndicatorError::Empty, "no output"),
            ("  \n", IndicatorError::Empty, "no output"),
            (
                "hello world",
                IndicatorError::NotJson(String::new()),
                "not one JSON object",
            ),
            (
                r#"{"name": "a", "component": "b", "@result": {}} {"name": "c"}"#,
                IndicatorError::NotJson(String::new()),
                "trailing characters",
            ),
            (
                "[1, 2]",
                IndicatorError::NotAnObject("a list"),
                "found a list",
            ),
            (
                r#"{"name": "a", "component": "b"}"#,
                IndicatorError::Missing("@result"),
                "\"@result\" is missing",
            ),
            (
                r#"{"name": "a", "component": "b", "@result": [1]}"#,
                IndicatorError::WrongType {
                    key: "@result".into(),
                    expected: "an object",
                    found: "a list",
                },
                "\"@result\" must be an object, found a list",
            ),
            (
                r#"{"name": "a", "component": "b", "@parameters": 3, "@result": {}}"#,
                IndicatorError::WrongType {
                    key: "@parameters".into(),
                    expected: "an object",
                    found: "a number",
                },
                "\"@parameters\" must be an object",
            ),
            (
                r#"{"name": "a", "component": "b", "@parameters": {"n": 1}, "@result": {"n": 2}}"#,
                IndicatorError::Collision("n".into()),
                "key \"n\" is in both",
            ),
            (
                r#"{"name": "", "component": "b", "@result": {}}"#,
                IndicatorError::EmptyName("name"),
                "\"name\" is empty",
            ),
            (
                r#"{"name": "a", "component": "", "@result": {}}"#,
                IndicatorError::EmptyName("component"),
                "\"component\" is empty",
            ),
            (
                r#"{"component": "b", "@result": {}}"#,
                IndicatorError::Missing("name"),
                "\"name\" is missing",
            ),
            (
                r#"{"name": 7, "component": "b", "@result": {}}"#,
                IndicatorError::WrongType {
                    key: "name".into(),
                    expected: "a string",
                    found: "a number",
                },
                "\"name\" must be a string",
            ),
            (
                r#"{"name": "a", "component": "b", "@result": {"": 1}}"#,
                IndicatorError::EmptyKey("@result"),
                "\"@result\" has an empty key",
            ),
            (
                r#"{"name": "a", "component": "b", "@result": {"x": [1, 2]}}"#,
                IndicatorError::WrongType {
                    key: "@result.x".into(),
                    expected: "a number, a string or a boolean",
                    found: "a list",
                },
                "\"@result.x\" must be a number",
            ),
            (
                r#"{"name": "a", "component": "b", "@result": {"x": null}}"#,
                IndicatorError::WrongType {
                    key: "@result.x".into(),
                    expected: "a number, a string or a boolean",
                    found: "null",
                },
                "found null",
            ),
            (
                r#"{"name": "a", "component": "b", "@result": {}, "overall_score": "high"}"#,
                IndicatorError::WrongType {
                    key: "overall_score".into(),
                    expected: "a number",
                    found: "a string",
                },
                "\"overall_score\" must be a number",
            ),
            (
                r#"{"name": "a", "component": "b", "framework": "c", "@result": {}}"#,
                IndicatorError::ComponentTwice,
                "not both",
            ),
            (
                r#"{"name": "a", "component": "b", "@result": {}, "@results": {}}"#,
                IndicatorError::UnknownKey("@results".into()),
                "unknown key \"@results\"",
            ),
        ] {
            let got = Indicator::parse(stdout).expect_err(stdout);
            if let IndicatorError::NotJson(_) = want {
                // serde_json's own wording is checked through `message`.
                assert!(
                    matches!(got, IndicatorError::NotJson(_)),
                    "{stdout}: {got:?}"
                );
            } else {
                assert_eq!(got, want, "{stdout}");
            }
            let text = got.to_string();
            assert!(text.contains(message), "{stdout}: {text}");
        }
    }

    /// Numbers keep their JSON type (integers stay integers, also beyond
    /// `i64`); a number JSON cannot hold is refused, not rounded.
    #[test]
    fn numbers_keep_their_type_and_out_of_range_is_refused() {
        let i = Indicator::parse(
            r#"{"name": "a", "component": "b", "@result": {"big": 18446744073709551615,
                "neg": -3, "exp": 1.5e300, "zero": 0.0, "int": 7}, "overall_score": 2}"#,
        )
        .expect("valid");
        assert_eq!(i.result["big"].as_u64(), Some(u64::MAX));
        assert_eq!(i.result["neg"].as_i64(), Some(-3));
        assert_eq!(i.result["exp"].as_f64(), Some(1.5e300));
        assert!(i.result["zero"].is_f64() && i.result["int"].is_u64());
        assert_eq!(i.overall_score, Some(2.0));
        for text in [
            r#"{"name": "a", "component": "b", "@result": {"x": 1e400}}"#,
            r#"{"name": "a", "component": "b", "@result": {"x": NaN}}"#,
            r#"{"name": "a", "component": "b", "@result": {}, "overall_score": -1e999}"#,
        ] {
            let e = Indicator::parse(text).expect_err(text);
            assert!(matches!(e, IndicatorError::NotJson(_)), "{text}: {e:?}");
        }
    }

    /// `@parameters` may nest (a setting can be a table); `@result` holds
    /// plain figures only, and a nested figure is named by its path.
    #[test]
    fn nested_parameters_are_kept_and_nested_figures_refused() {
        let i = Indicator::parse(
            r#"{"name": "a", "component": "b", "@parameters": {"job": {"bs": "4k", "depth": [1, 2]}},
                "@result": {"x": 1}}"#,
        )
        .expect("nested parameters are valid");
        assert_eq!(i.parameters["job"]["depth"][1], 2);
        let again = Indicator::parse(&i.to_value().expect("valid").to_string()).expect("again");
        assert_eq!(again, i);
        let e =
            Indicator::parse(r#"{"name": "a", "component": "b", "@result": {"lat": {"p99": 3}}}"#)
                .expect_err("nested figure");
        assert_eq!(
            e.to_string(),
            "\"@result.lat\" must be a number, a string or a boolean, found an object"
        );
    }

    /// Each bound, at its limit and one past it.
    #[test]
    fn bounds_on_size_keys_and_depth() {
        let with_keys = |section: &str, n: usize, key_len: usize| {
            let keys: Map<String, Value> = (0..n)
                .map(|k| (format!("{k:0>key_len$}"), Value::from(1)))
                .collect();
            let mut top = serde_json::json!({"name": "a", "component": "b", "@result": {}});
            top[section] = Value::Object(keys);
            top.to_string()
        };
        for section in ["@parameters", "@result"] {
            assert!(Indicator::parse(&with_keys(section, MAX_KEYS, 8)).is_ok());
            let e = Indicator::parse(&with_keys(section, MAX_KEYS + 1, 8)).expect_err("keys");
            assert_eq!(
                e,
                IndicatorError::TooManyKeys {
                    section,
                    count: MAX_KEYS + 1
                }
            );
            assert!(Indicator::parse(&with_keys(section, 1, MAX_KEY_BYTES)).is_ok());
            let e = Indicator::parse(&with_keys(section, 1, MAX_KEY_BYTES + 1)).expect_err("key");
            assert!(e.to_string().contains("longer than 256 bytes"), "{e}");
        }
        // Text: the limit counts bytes, white space included.
        let valid = r#"{"name": "a", "component": "b", "@result": {}}"#;
        let padded = format!("{valid}{}", " ".repeat(MAX_BYTES - valid.len()));
        assert!(Indicator::parse(&padded).is_ok());
        let e = Indicator::parse(&format!("{padded} ")).expect_err("too long");
        assert_eq!(e, IndicatorError::TooLong(MAX_BYTES + 1));
        // Nesting: serde_json's depth limit, an error rather than a crash.
        let deep = format!(
            r#"{{"name": "a", "component": "b", "@parameters": {{"x": {}1{}}}, "@result": {{}}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let e = Indicator::parse(&deep).expect_err("too deep");
        assert!(e.to_string().contains("recursion limit"), "{e}");
    }

    /// Whatever is wrong, the message is one line, with control characters
    /// in keys escaped.
    #[test]
    fn every_error_is_one_line() {
        let long_key = "k".repeat(MAX_KEY_BYTES + 1);
        let texts = [
            "{\"name\": \"a\",\n \"component\": \"b\",\n \"@result\": {\"x\":\n [1]}}".to_owned(),
            "{\"name\": \"a\", \"component\": \"b\", \"@result\": {}, \"bad\\nkey\": 1}".to_owned(),
            "{\"name\": \"a\", \"component\": \"b\", \"@parameters\": {\"k\\n\": 1}, \"@result\": {\"k\\n\": 2}}".to_owned(),
            format!("{{\"name\": \"a\", \"component\": \"b\", \"@result\": {{\"{long_key}\": 1}}}}"),
            "{\n\"name\": \n".to_owned(),
            "\n\n{} {}".to_owned(),
        ];
        for text in &texts {
            let e = Indicator::parse(text).expect_err(text).to_string();
            assert!(!e.contains('\n') && !e.is_empty(), "{text:?}: {e:?}");
        }
    }

    #[test]
    fn builder_validates_what_it_builds() {
        #[derive(Serialize)]
        struct Settings {
            bs: String,
            numjobs: u32,
        }
        let settings = Settings {
            bs: "4k".into(),
            numjobs: 2,
        };
        let i = Indicator::new("fio", "fio")
            .with_parameters(&settings)
            .expect("an object")
            .with_parameter("rw", "randread")
            .with_result("read_iops", 1000.5)
            .with_results([("read_bw_bytes_per_s".to_owned(), Value::from(4_096_000u64))])
            .with_score(1.0);
        let v = i.to_value().expect("valid");
        assert_eq!(v["@parameters"]["bs"], "4k");
        assert_eq!(v["@parameters"]["numjobs"], 2);
        assert_eq!(v["@parameters"]["rw"], "randread");
        assert_eq!(v["@result"]["read_iops"], 1000.5);
        assert_eq!(v["overall_score"], 1.0);

        let e = Indicator::new("x", "y")
            .with_parameter("bs", "4k")
            .with_result("bs", 1)
            .to_value()
            .expect_err("collision");
        assert_eq!(e, IndicatorError::Collision("bs".into()));
        let e = Indicator::new("x", "y")
            .with_result("rate", f64::NAN)
            .to_value()
            .expect_err("NaN");
        assert!(e.to_string().contains("@result.rate"), "{e}");
        let e = Indicator::new("x", "y")
            .with_score(f64::INFINITY)
            .validate()
            .expect_err("infinite score");
        assert!(e.to_string().contains("overall_score"), "{e}");
        assert!(Indicator::new("x", "y").with_parameters(&3).is_err());
        assert_eq!(
            Indicator::new("", "y").validate(),
            Err(IndicatorError::EmptyName("name"))
        );
    }
}
