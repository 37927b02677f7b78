//! The benchmark tools' own reports turned into `@result` figures: pure
//! functions from the text a tool wrote to the figures, each checked
//! against output captured from the real tool (`testdata/`).

use kernmlops_plugin_sdk::{
    serde_json::{self, Map, Value},
    Error, Result,
};

/// Figures of one run, by key (units in the key).
pub type Figures = Map<String, Value>;

/// `name` as a key: lowercase ASCII letters and digits, runs of anything
/// else as one `_`, none at either end.
pub fn slug(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    out
}

/// A finite float as a JSON number.
fn num(tool: &str, what: &str, x: f64) -> Result<Value> {
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .ok_or_else(|| Error::new(format!("{tool}: {what} is not a finite number ({x})")))
}

fn parse_f64(tool: &str, what: &str, text: &str) -> Result<f64> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| Error::new(format!("{tool}: {what} is not a number: {text:?}")))
}

// ---------------------------------------------------------------- redis

/// One CSV line's fields (double-quoted fields, `""` inside for a quote).
fn csv_fields(line: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    '"' => break,
                    c => field.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                field.push(c);
                chars.next();
            }
        }
        fields.push(field);
        match chars.next() {
            None => return Some(fields),
            Some(',') => {}
            Some(_) => return None,
        }
    }
}

/// `redis-benchmark --csv`: a header (`test`, `rps`, then latency columns
/// such as `p50_latency_ms` in redis 7) and one row per test. Each figure
/// becomes `<test>_<column>`, the test named by what precedes its
/// parenthesis (`MSET (10 keys)`: `mset`, `LRANGE_100 (first 100
/// elements)`: `lrange_100`), e.g. `set_rps`, `get_p99_latency_ms`.
/// redis-benchmark's preparation rows (`LPUSH (needed to benchmark
/// LRANGE)`) are left out.
pub fn redis_csv(text: &str) -> Result<Figures> {
    const TOOL: &str = "redis-benchmark --csv";
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .next()
        .ok_or_else(|| Error::new(format!("{TOOL}: no output")))?;
    let columns = csv_fields(header.trim())
        .ok_or_else(|| Error::new(format!("{TOOL}: header is not CSV: {header:?}")))?;
    if columns.first().map(String::as_str) != Some("test") || !columns.iter().any(|c| c == "rps") {
        return Err(Error::new(format!(
            "{TOOL}: expected a header starting with \"test\" and holding \"rps\", found {header:?}"
        )));
    }
    let mut figures = Figures::new();
    for line in lines {
        let fields = csv_fields(line.trim())
            .filter(|f| f.len() == columns.len())
            .ok_or_else(|| {
                Error::new(format!(
                    "{TOOL}: expected {} CSV fields, found {line:?}",
                    columns.len()
                ))
            })?;
        let name = &fields[0];
        if name.contains("(needed to benchmark") {
            continue;
        }
        let test = slug(name.split(" (").next().unwrap_or(name));
        if test.is_empty() {
            return Err(Error::new(format!(
                "{TOOL}: a row has no test name: {line:?}"
            )));
        }
        for (column, value) in columns.iter().zip(&fields).skip(1) {
            let key = format!("{test}_{}", slug(column));
            let what = format!("{column} of {name}");
            let x = parse_f64(TOOL, &what, value)?;
            if figures.insert(key.clone(), num(TOOL, &what, x)?).is_some() {
                return Err(Error::new(format!("{TOOL}: two rows give {key}")));
            }
        }
    }
    if figures.is_empty() {
        return Err(Error::new(format!("{TOOL}: a header but no test rows")));
    }
    Ok(figures)
}

// ---------------------------------------------------------------- memcslap

/// The seconds at the end of a memcslap line (`...:  0.061 seconds.`).
fn memcslap_seconds(line: &str) -> Option<f64> {
    let (_, rest) = line.rsplit_once(':')?;
    rest.trim().strip_suffix("seconds.")?.trim().parse().ok()
}

/// memcslap's report (libmemcached-tools 1.1):
///
/// ```text
/// Time to set            2000 keys:                     0.146 seconds.
/// Time to get            4000 keys by    2 threads:     0.100 seconds.
/// Time total:                                           0.252 seconds.
/// ```
///
/// Figures: `ops` (operations of the test, all threads), `elapsed_s` (the
/// test's time), `ops_per_s`, `mean_latency_us` (the test's time per
/// operation of one thread: every thread runs its operations one after the
/// other), `load_s` (loading the keys a get or mget test reads, when
/// there is such a step) and `total_s`. memcslap times in milliseconds, so a
/// test that takes less than one is refused.
pub fn memcslap(text: &str) -> Result<Figures> {
    const TOOL: &str = "memcslap";
    let mut figures = Figures::new();
    let mut test: Option<(f64, f64, f64)> = None;
    for line in text.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("Time to ") else {
            if line.starts_with("Time total:") {
                let s = memcslap_seconds(line)
                    .ok_or_else(|| Error::new(format!("{TOOL}: unreadable line {line:?}")))?;
                figures.insert("total_s".into(), num(TOOL, "total time", s)?);
            }
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        match words.as_slice() {
            // Time to <op> <N> keys by <T> threads: <s> seconds.
            [_op, n, "keys", "by", t, "threads:", ..] => {
                let s = memcslap_seconds(line)
                    .ok_or_else(|| Error::new(format!("{TOOL}: unreadable line {line:?}")))?;
                let n = parse_f64(TOOL, "key count", n)?;
                let t = parse_f64(TOOL, "thread count", t)?;
                test = Some((n, t, s));
            }
            // Time to set <N> keys: <s> seconds. (loading for get, mget)
            ["set", _n, "keys:", ..] => {
                let s = memcslap_seconds(line)
                    .ok_or_else(|| Error::new(format!("{TOOL}: unreadable line {line:?}")))?;
                figures.insert("load_s".into(), num(TOOL, "load time", s)?);
            }
            _ => {}
        }
    }
    let (ops, threads, secs) = test.ok_or_else(|| {
        Error::new(format!(
            "{TOOL}: no \"Time to <test> N keys by T threads\" line in its report"
        ))
    })?;
    if secs <= 0.0 || ops <= 0.0 {
        return Err(Error::new(format!(
            "{TOOL}: {ops} operations in {secs} s: too short to measure with its millisecond clock (raise execute_number)"
        )));
    }
    figures.insert("ops".into(), Value::from(ops as u64));
    figures.insert("elapsed_s".into(), num(TOOL, "test time", secs)?);
    figures.insert("ops_per_s".into(), num(TOOL, "rate", ops / secs)?);
    figures.insert(
        "mean_latency_us".into(),
        num(TOOL, "latency", secs * threads / ops * 1e6)?,
    );
    Ok(figures)
}

// ---------------------------------------------------------------- fio

/// fio's `--output-format=json` file (one job with `--group_reporting`).
/// Per direction (`read`, `write`): `<dir>_iops`, `<dir>_bw_bytes_per_s`,
/// `<dir>_io_bytes`, and when it did any I/O, `<dir>_clat_mean_us` and
/// `<dir>_clat_p99_us` (completion latency); plus the totals `iops` and
/// `bw_bytes_per_s`. Text before the JSON (fio's notes) is skipped.
pub fn fio_json(text: &str) -> Result<Figures> {
    const TOOL: &str = "fio";
    let start = text
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| text.starts_with('{').then_some(0))
        .ok_or_else(|| Error::new(format!("{TOOL}: no JSON object in its output")))?;
    let doc: Value = serde_json::from_str(&text[start..])
        .map_err(|e| Error::new(format!("{TOOL}: its JSON output does not parse: {e}")))?;
    let jobs = doc["jobs"]
        .as_array()
        .ok_or_else(|| Error::new(format!("{TOOL}: its JSON has no \"jobs\" list")))?;
    let [job] = jobs.as_slice() else {
        return Err(Error::new(format!(
            "{TOOL}: expected one job (group_reporting), found {}",
            jobs.len()
        )));
    };
    match job["error"].as_i64() {
        Some(0) => {}
        Some(e) => return Err(Error::new(format!("{TOOL}: the job reported error {e}"))),
        None => {
            return Err(Error::new(format!(
                "{TOOL}: the job has no \"error\" field"
            )))
        }
    }
    let mut figures = Figures::new();
    let (mut iops, mut bw) = (0.0, 0u64);
    for dir in ["read", "write"] {
        let d = &job[dir];
        let field = |name: &str| {
            d[name]
                .as_f64()
                .ok_or_else(|| Error::new(format!("{TOOL}: no number at jobs[0].{dir}.{name}")))
        };
        let dir_iops = field("iops")?;
        let dir_bw = d["bw_bytes"]
            .as_u64()
            .ok_or_else(|| Error::new(format!("{TOOL}: no integer at jobs[0].{dir}.bw_bytes")))?;
        let io_bytes = d["io_bytes"]
            .as_u64()
            .ok_or_else(|| Error::new(format!("{TOOL}: no integer at jobs[0].{dir}.io_bytes")))?;
        iops += dir_iops;
        bw += dir_bw;
        figures.insert(format!("{dir}_iops"), num(TOOL, "iops", dir_iops)?);
        figures.insert(format!("{dir}_bw_bytes_per_s"), Value::from(dir_bw));
        figures.insert(format!("{dir}_io_bytes"), Value::from(io_bytes));
        if field("total_ios")? > 0.0 {
            let clat = &d["clat_ns"];
            let mean = clat["mean"].as_f64().ok_or_else(|| {
                Error::new(format!("{TOOL}: no number at jobs[0].{dir}.clat_ns.mean"))
            })?;
            let p99 = clat["percentile"]["99.000000"].as_f64().ok_or_else(|| {
                Error::new(format!(
                    "{TOOL}: no 99th percentile at jobs[0].{dir}.clat_ns.percentile"
                ))
            })?;
            figures.insert(
                format!("{dir}_clat_mean_us"),
                num(TOOL, "latency", mean / 1e3)?,
            );
            figures.insert(
                format!("{dir}_clat_p99_us"),
                num(TOOL, "latency", p99 / 1e3)?,
            );
        }
    }
    figures.insert("iops".into(), num(TOOL, "iops", iops)?);
    figures.insert("bw_bytes_per_s".into(), Value::from(bw));
    Ok(figures)
}

// ---------------------------------------------------------------- stress-ng

/// stress-ng's `--metrics --yaml FILE`: under `metrics:`, one entry per
/// stressor (`- stressor: cpu` then `bogo-ops: 3714`, ...). Per stressor:
/// `<stressor>_bogo_ops`, `<stressor>_bogo_ops_per_s` (per second of wall
/// time) and `<stressor>_bogo_ops_per_cpu_s` (per second of user plus
/// system time).
pub fn stress_ng_yaml(text: &str) -> Result<Figures> {
    const TOOL: &str = "stress-ng --yaml";
    let mut figures = Figures::new();
    let mut in_metrics = false;
    let mut stressor: Option<String> = None;
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(' ') && !line.starts_with('-') {
            // A top-level key (or `...`): the metrics section starts or ends.
            in_metrics = line.trim_end() == "metrics:";
            stressor = None;
            continue;
        }
        if !in_metrics {
            continue;
        }
        let item = line.trim();
        let item = match item.strip_prefix("- ") {
            Some(first) => {
                stressor = None;
                first
            }
            None => item,
        };
        let Some((key, value)) = item.split_once(':') else {
            return Err(Error::new(format!("{TOOL}: unreadable line {line:?}")));
        };
        let value = value.trim().trim_matches('\'');
        if key == "stressor" {
            let s = slug(value);
            if s.is_empty() {
                return Err(Error::new(format!("{TOOL}: a stressor without a name")));
            }
            stressor = Some(s);
            continue;
        }
        let suffix = match key {
            "bogo-ops" => "bogo_ops",
            "bogo-ops-per-second-real-time" => "bogo_ops_per_s",
            "bogo-ops-per-second-usr-sys-time" => "bogo_ops_per_cpu_s",
            _ => continue,
        };
        let s = stressor
            .as_ref()
            .ok_or_else(|| Error::new(format!("{TOOL}: {key} before any stressor")))?;
        let what = format!("{key} of {s}");
        let x = parse_f64(TOOL, &what, value)?;
        let v = if suffix == "bogo_ops" && x.fract() == 0.0 && x >= 0.0 {
            Value::from(x as u64)
        } else {
            num(TOOL, &what, x)?
        };
        figures.insert(format!("{s}_{suffix}"), v);
    }
    if figures.is_empty() {
        return Err(Error::new(format!(
            "{TOOL}: no stressor metrics (did stress-ng run with --metrics?)"
        )));
    }
    Ok(figures)
}

// ---------------------------------------------------------------- gap

/// GAP's `pr` report: `Trial Time:` per trial, `Average Time:`, and the
/// graph's `Generate Time:` and `Build Time:`, all in seconds. Figures:
/// `trial_<n>_s` (from 1), `mean_trial_s` (pr's average, or the mean of
/// the trials when it printed none), `graph_generate_s`, `graph_build_s`.
pub fn gap_pr(text: &str) -> Result<Figures> {
    const TOOL: &str = "gap pr";
    let mut figures = Figures::new();
    let mut trials = Vec::new();
    let mut average = None;
    for line in text.lines() {
        let Some((label, value)) = line.split_once(':') else {
            continue;
        };
        let key = match label.trim() {
            "Trial Time" => None,
            "Average Time" => Some("mean_trial_s"),
            "Generate Time" => Some("graph_generate_s"),
            "Build Time" => Some("graph_build_s"),
            _ => continue,
        };
        let x = parse_f64(TOOL, label.trim(), value)?;
        match key {
            None => trials.push(x),
            Some("mean_trial_s") => average = Some(x),
            Some(k) => {
                figures.insert(k.into(), num(TOOL, label.trim(), x)?);
            }
        }
    }
    if trials.is_empty() {
        return Err(Error::new(format!(
            "{TOOL}: no \"Trial Time\" in its output"
        )));
    }
    for (i, t) in trials.iter().enumerate() {
        figures.insert(format!("trial_{}_s", i + 1), num(TOOL, "trial time", *t)?);
    }
    let mean = average.unwrap_or_else(|| trials.iter().sum::<f64>() / trials.len() as f64);
    figures.insert("mean_trial_s".into(), num(TOOL, "average time", mean)?);
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(figures: &Figures, key: &str) -> f64 {
        figures
            .get(key)
            .and_then(Value::as_f64)
            .unwrap_or_else(|| panic!("no {key} in {figures:?}"))
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("MSET (10 keys)"), "mset_10_keys");
        assert_eq!(slug("LRANGE_100"), "lrange_100");
        assert_eq!(slug("  cpu-online "), "cpu_online");
        assert_eq!(slug("---"), "");
    }

    #[test]
    fn csv_lines() {
        assert_eq!(
            csv_fields(r#""a","b ""c"", d",3"#),
            Some(vec!["a".into(), "b \"c\", d".into(), "3".into()])
        );
        assert_eq!(csv_fields(r#""open"#), None);
        assert_eq!(csv_fields(r#""a"x"#), None);
    }

    /// redis-benchmark 7.0.15 --csv -t set,get,lpush,mset,lrange_100.
    #[test]
    fn redis_benchmark_csv() {
        let r = redis_csv(include_str!("../testdata/redis-benchmark.csv")).expect("parses");
        assert_eq!(f(&r, "set_rps"), 105263.16);
        assert_eq!(f(&r, "set_p50_latency_ms"), 0.055);
        assert_eq!(f(&r, "set_p99_latency_ms"), 0.151);
        assert_eq!(f(&r, "get_rps"), 93896.71);
        assert_eq!(f(&r, "get_avg_latency_ms"), 0.061);
        assert_eq!(f(&r, "get_max_latency_ms"), 0.807);
        assert_eq!(f(&r, "lpush_rps"), 103092.78, "not the LRANGE preparation");
        assert_eq!(f(&r, "lrange_100_rps"), 73529.41);
        assert_eq!(f(&r, "mset_p95_latency_ms"), 0.119);
        // 5 tests x 7 figures, the preparation row left out.
        assert_eq!(r.len(), 5 * 7, "{r:?}");
    }

    #[test]
    fn redis_benchmark_csv_errors() {
        for (text, needle) in [
            ("", "no output"),
            ("\"SET\",\"1\"\n", "header"),
            ("\"test\",\"rps\"\n", "no test rows"),
            ("\"test\",\"rps\"\n\"SET\"\n", "expected 2 CSV fields"),
            (
                "\"test\",\"rps\"\n\"SET\",\"fast\"\n",
                "rps of SET is not a number",
            ),
            (
                "\"test\",\"rps\"\n\"SET\",\"1\"\n\"SET\",\"2\"\n",
                "two rows give set_rps",
            ),
        ] {
            let e = redis_csv(text).expect_err(text);
            assert!(e.message.contains(needle), "{text:?}: {e}");
        }
        // redis 6 prints only test and rps.
        let r = redis_csv("\"test\",\"rps\"\n\"PING_INLINE\",\"45045.04\"\n").expect("redis 6");
        assert_eq!(f(&r, "ping_inline_rps"), 45045.04);
    }

    /// memcslap 1.1 (libmemcached 1.1.4), --concurrency=2 --execute-number=2000.
    #[test]
    fn memcslap_reports() {
        let set = memcslap(include_str!("../testdata/memcslap-set.txt")).expect("set");
        assert_eq!(f(&set, "ops"), 4000.0);
        assert_eq!(f(&set, "elapsed_s"), 0.061);
        assert!((f(&set, "ops_per_s") - 4000.0 / 0.061).abs() < 1e-6);
        assert!((f(&set, "mean_latency_us") - 0.061 * 2.0 / 4000.0 * 1e6).abs() < 1e-6);
        assert_eq!(f(&set, "total_s"), 0.065);
        assert!(
            !set.contains_key("load_s"),
            "a set test loads nothing first"
        );

        let get = memcslap(include_str!("../testdata/memcslap-get.txt")).expect("get");
        assert_eq!(f(&get, "ops"), 4000.0);
        assert_eq!(f(&get, "elapsed_s"), 0.100);
        assert_eq!(f(&get, "load_s"), 0.146);
        assert_eq!(f(&get, "total_s"), 0.252);

        for (text, needle) in [
            ("", "no \"Time to"),
            (
                "Time to set   10 keys by    1 threads:     0.000 seconds.\n",
                "too short",
            ),
            (
                "Time to set   10 keys by    1 threads:     soon\n",
                "unreadable line",
            ),
        ] {
            let e = memcslap(text).expect_err(text);
            assert!(e.message.contains(needle), "{text:?}: {e}");
        }
    }

    /// fio 3.33 JSON: randrw 4k with two jobs grouped, and randread 64k.
    #[test]
    fn fio_json_reports() {
        let text = include_str!("../testdata/fio-randrw.json");
        let r = fio_json(text).expect("randrw");
        let doc: Value = serde_json::from_str(text).expect("json");
        let job = &doc["jobs"][0];
        assert_eq!(
            f(&r, "read_iops"),
            job["read"]["iops"].as_f64().expect("iops")
        );
        assert_eq!(f(&r, "write_iops"), 20524.271845);
        assert_eq!(
            r["read_bw_bytes_per_s"], job["read"]["bw_bytes"],
            "bytes per second, as fio counts them"
        );
        assert_eq!(
            f(&r, "read_clat_p99_us"),
            job["read"]["clat_ns"]["percentile"]["99.000000"]
                .as_f64()
                .expect("p99")
                / 1e3
        );
        assert_eq!(
            f(&r, "write_clat_mean_us"),
            job["write"]["clat_ns"]["mean"].as_f64().expect("mean") / 1e3
        );
        assert_eq!(f(&r, "iops"), f(&r, "read_iops") + f(&r, "write_iops"));
        assert_eq!(
            f(&r, "bw_bytes_per_s"),
            f(&r, "read_bw_bytes_per_s") + f(&r, "write_bw_bytes_per_s")
        );

        let r = fio_json(include_str!("../testdata/fio-randread.json")).expect("randread");
        assert_eq!(f(&r, "read_iops"), 11636.363636);
        assert_eq!(f(&r, "write_iops"), 0.0);
        assert!(r.contains_key("read_clat_p99_us"));
        assert!(
            !r.contains_key("write_clat_p99_us") && !r.contains_key("write_clat_mean_us"),
            "no latency for a direction without I/O: {r:?}"
        );

        // fio's notes before the JSON do not matter.
        let noisy = format!("note: both iodepth >= 1 and synchronous I/O engine\n{text}");
        assert_eq!(
            fio_json(&noisy).expect("noisy"),
            fio_json(text).expect("clean")
        );
        for (text, needle) in [
            ("fio: error", "no JSON object"),
            ("{\"jobs\": 3}", "no \"jobs\" list"),
            ("{\"jobs\": []}", "expected one job"),
            ("{\"jobs\": [{\"error\": 5}]}", "error 5"),
            ("{\"jobs\": [{\"error\": 0}]}", "jobs[0].read.iops"),
            ("{\"jobs\": [", "does not parse"),
        ] {
            let e = fio_json(text).expect_err(text);
            assert!(e.message.contains(needle), "{text:?}: {e}");
        }
    }

    /// stress-ng 0.15.06 --cpu 1 --vm 1 --metrics --yaml.
    #[test]
    fn stress_ng_yaml_reports() {
        let r = stress_ng_yaml(include_str!("../testdata/stress-ng.yaml")).expect("parses");
        assert_eq!(r["cpu_bogo_ops"], 3714);
        assert_eq!(f(&r, "cpu_bogo_ops_per_s"), 1856.934476);
        assert_eq!(f(&r, "cpu_bogo_ops_per_cpu_s"), 1930.817067);
        assert_eq!(r["vm_bogo_ops"], 82554);
        assert_eq!(f(&r, "vm_bogo_ops_per_s"), 39965.993183);
        assert_eq!(r.len(), 6, "{r:?}");
        for (text, needle) in [
            (
                "---\nsystem-info:\n      cpus: 2\n...\n",
                "no stressor metrics",
            ),
            ("metrics:\n    - bogo-ops: 3\n", "before any stressor"),
            (
                "metrics:\n    - stressor: cpu\n      bogo-ops: many\n",
                "bogo-ops of cpu is not a number",
            ),
        ] {
            let e = stress_ng_yaml(text).expect_err(text);
            assert!(e.message.contains(needle), "{text:?}: {e}");
        }
    }

    /// gapbs pr -g 10 -n 3.
    #[test]
    fn gap_pr_reports() {
        let r = gap_pr(include_str!("../testdata/gap-pr.txt")).expect("parses");
        assert_eq!(f(&r, "trial_1_s"), 0.00017);
        assert_eq!(f(&r, "trial_2_s"), 0.00015);
        assert_eq!(f(&r, "trial_3_s"), 0.00017);
        assert_eq!(f(&r, "mean_trial_s"), 0.00016);
        assert_eq!(f(&r, "graph_generate_s"), 0.00222);
        assert_eq!(f(&r, "graph_build_s"), 0.00057);
        let r = gap_pr("Trial Time: 1.0\nTrial Time: 2.0\n").expect("no average");
        assert_eq!(f(&r, "mean_trial_s"), 1.5);
        let e = gap_pr("Graph has 1024 nodes\n").expect_err("no trials");
        assert!(e.message.contains("no \"Trial Time\""), "{e}");
        let e = gap_pr("Trial Time: fast\n").expect_err("bad number");
        assert!(e.message.contains("Trial Time is not a number"), "{e}");
    }
}
