//! Fuzzing as a test, in process: mutated configuration files through the
//! whole configuration check (the file, then every loaded plugin's
//! settings and rules), mutated duration and size texts through the
//! command line's value parsers, and random table declarations through
//! validation, decoding and an Arrow file. Each input must give a value or
//! one printable error line, never a panic. The seeds under `tests/fuzz/`
//! (inputs that found problems) run every time as regular cases.
//!
//! The generator is seeded (`KERNMLOPS_FUZZ_SEED`, default fixed) so a
//! failure reproduces; `KERNMLOPS_FUZZ_CASES` scales the case counts.

use std::{
    panic::{catch_unwind, AssertUnwindSafe},
    path::{Path, PathBuf},
};

use kernmlops::{
    config::{self, Config},
    decode::TableDecoder,
    plugin::Registry,
    sink::{self, FlushPolicy, IpcSink, RepairOutcome},
    trust::Policy,
};
use kernmlops_plugin_api::spec::validate_table;
use kernmlops_plugin_api::{ColumnDecl, ColumnKind, TableDecl};

/// xorshift64*: small, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed: u64 = std::env::var("KERNMLOPS_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x6b65_726e_6d6c_6f70);
        // splitmix64 of the seed: any seed, even 0, gives a good state.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// How many cases of a kind to run: `base`, scaled by
/// `KERNMLOPS_FUZZ_CASES` (a factor, default 1).
fn cases(base: usize) -> usize {
    let factor: f64 = std::env::var("KERNMLOPS_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    ((base as f64) * factor).max(1.0) as usize
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("core/ has a parent")
        .to_owned()
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kml-fuzz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Values that broke or nearly broke parsers before, and their kin.
const EDGE_VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "4294967296",
    "18446744073709551615",
    "9223372036854775807",
    "-9223372036854775808",
    "1e309",
    "nan",
    "inf",
    "-inf",
    "0.0",
    "1.5",
    "true",
    "[]",
    "{}",
    "[1, \"a\"]",
    "\"\"",
    "\"0s\"",
    "\"0ms\"",
    "\"-1s\"",
    "\"1e400s\"",
    "\"99999999999999999999h\"",
    "\"nan s\"",
    "\"1.5.5s\"",
    "\"4KiB\"",
    "\"3MiB\"",
    "\"auto\"",
    "\"never\"",
    "\"sometimes\"",
    "\"--cpu\"",
    "\"\\u0000\"",
    "\"\\u001b[31m\"",
    "\"\\u00e9\u{1f980}\"",
    "1979-05-27T07:32:00Z",
    "'''multi\nline'''",
];

/// Sections and keys a configuration may hold (the host's, probes' and
/// benchmarks'), so mutations reach deep checks, not only the parser.
const SECTIONS: &[&str] = &[
    "collect",
    "probes.block_io",
    "probes.perf",
    "probes.memory_usage",
    "probes.process_metadata",
    "probes.file_data",
    "probes.no_such_probe",
    "benchmarks.fio",
    "benchmarks.redis",
    "benchmarks.stress_ng",
    "benchmarks.memcached",
    "benchmarks.gap",
    "benchmarks.script",
    "benchmarks.script.parameters",
    "power",
    "nope",
];

const KEYS: &[&str] = &[
    "duration",
    "ring_size",
    "drain_interval",
    "flush_interval",
    "flush_rows",
    "plugins",
    "strict",
    "inflight_entries",
    "frequency_hz",
    "interval",
    "counters",
    "numjobs",
    "rw",
    "bs",
    "requests",
    "clients",
    "thp_mode",
    "workers",
    "stressor",
    "timeout",
    "command",
    "scale",
    "trials",
    "memory_mb",
    "test",
    "bogus",
];

/// One mutation of a configuration text, at the byte level or the TOML
/// level.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..=rng.below(3) {
        match rng.below(9) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(out.len() + 1);
                let b = *rng.pick(&[0u8, 1, 7, 0x1b, b'\n', b'"', b'[', b'=', 0x7f, 0xc3, 0xff]);
                out.insert(i, b);
            }
            2 if !out.is_empty() => {
                let i = rng.below(out.len());
                let n = rng.below(16).min(out.len() - i);
                out.drain(i..i + n);
            }
            3 | 4 => {
                // key = edge value, in some section.
                let line = format!(
                    "\n[{}]\n{} = {}\n",
                    rng.pick(SECTIONS),
                    rng.pick(KEYS),
                    rng.pick(EDGE_VALUES)
                );
                out.extend_from_slice(line.as_bytes());
            }
            5 => {
                // Replace the value of an existing `key = value` line.
                let text = String::from_utf8_lossy(&out).into_owned();
                let lines: Vec<&str> = text.lines().collect();
                let with_value: Vec<usize> = (0..lines.len())
                    .filter(|&i| lines[i].contains(" = ") && !lines[i].starts_with('#'))
                    .collect();
                if !with_value.is_empty() {
                    let i = *rng.pick(&with_value);
                    let key = lines[i].split(" = ").next().unwrap_or("x");
                    let mut new: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
                    new[i] = format!("{key} = {}", rng.pick(EDGE_VALUES));
                    out = (new.join("\n") + "\n").into_bytes();
                }
            }
            6 => {
                // Duplicate a line (a duplicate key or table).
                let text = String::from_utf8_lossy(&out).into_owned();
                let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
                if !lines.is_empty() {
                    let i = rng.below(lines.len());
                    let l = lines[i].clone();
                    lines.insert(rng.below(lines.len() + 1), l);
                    out = (lines.join("\n") + "\n").into_bytes();
                }
            }
            7 => {
                let i = rng.below(out.len() + 1);
                let n = rng.below(12);
                let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                out.splice(i..i, junk);
            }
            _ => {
                out.truncate(rng.below(out.len() + 1));
            }
        }
    }
    out
}

/// The seed configuration files: the defaults, a file that sets something
/// in every section, and every file under `tests/fuzz/configs/`.
fn config_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = vec![
        ("defaults".to_owned(), config::defaults_file().into_bytes()),
        (
            "every-section".to_owned(),
            b"[collect]\nduration = \"2s\"\nring_size = \"64KiB\"\n\n[probes.memory_usage]\ninterval = \"500ms\"\n\n[probes.block_io]\ninflight_entries = 1024\n\n[benchmarks.fio]\nnumjobs = 2\nrw = \"randread\"\n\n[benchmarks.script]\ncommand = [\"./b.sh\"]\n[benchmarks.script.parameters]\nsize = 3\n"
                .to_vec(),
        ),
    ];
    seeds.extend(seed_files());
    seeds
}

/// `tests/fuzz/configs/*.toml`: inputs that found problems, kept as
/// regular cases.
fn seed_files() -> Vec<(String, Vec<u8>)> {
    let dir = workspace().join("tests/fuzz/configs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seeds in {}", dir.display());
    files
        .into_iter()
        .map(|p| {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read(&p).expect("seed"))
        })
        .collect()
}

/// The `# expect: <text>` first line of a seed: what its error must say.
fn expected(bytes: &[u8]) -> Option<String> {
    let first = bytes.split(|&b| b == b'\n').next()?;
    let text = std::str::from_utf8(first).ok()?;
    text.strip_prefix("# expect: ").map(|s| s.trim().to_owned())
}

/// An error line must be one printable line.
fn check_line(what: &str, line: &str) -> Result<(), String> {
    if line.is_empty() || line.contains('\n') || line.chars().any(|c| c.is_control()) {
        return Err(format!("{what}: not one printable line: {line:?}"));
    }
    Ok(())
}

/// The plugins of the workspace (`cargo xtask build-plugins`), loaded as
/// the host loads them; `None` (said once) when there are none.
fn registry() -> Option<Registry> {
    let dir = workspace().join("plugins");
    let reg = Registry::load_dir_with(&dir, &Policy::for_this_process(false)).ok()?;
    if reg.plugins.is_empty() {
        let ci = matches!(std::env::var("CI").as_deref(), Ok("true" | "1"));
        assert!(
            !ci,
            "no plugins in {}: CI must build them first",
            dir.display()
        );
        eprintln!(
            "note: no plugins in {}: plugin settings are not fuzzed (cargo xtask build-plugins)",
            dir.display()
        );
        return None;
    }
    Some(reg)
}

/// The whole configuration check of `kernmlops run` and `config show` on
/// one file: the file, each component's keys and types, each component's
/// rules. `Ok` or one printable error line naming the file.
fn check_config_file(path: &Path, registry: Option<&Registry>) -> Result<bool, String> {
    let shown = path.display().to_string();
    let cfg = match Config::load(Some(path)) {
        Ok(c) => c,
        Err(e) => {
            let line = e.to_string();
            check_line("Config::load", &line)?;
            if !line.starts_with(&shown) {
                return Err(format!("the error does not name the file: {line}"));
            }
            return Ok(false);
        }
    };
    let Some(reg) = registry else {
        return Ok(true);
    };
    let checked = cfg
        .probe_settings(reg.config_defaults())
        .and_then(|_| cfg.benchmark_settings(reg.benchmark_defaults()))
        .and_then(|_| cfg.check_component_rules(reg, &[], &[]));
    match checked {
        Ok(()) => Ok(true),
        Err(e) => {
            let line = e.to_string();
            check_line("settings", &line)?;
            if !line.starts_with(&shown) {
                return Err(format!("the error does not name the file: {line}"));
            }
            Ok(false)
        }
    }
}

#[test]
fn mutated_configuration_files_give_a_value_or_one_error_line() {
    let dir = temp_dir("configs");
    let reg = registry();
    let mut rng = Rng::new();
    let seeds = config_seeds();
    let mut failures = Vec::new();
    let (mut tried, mut refused) = (0, 0);
    let mut run = |name: String, bytes: Vec<u8>, failures: &mut Vec<String>| {
        let path = dir.join("case.toml");
        std::fs::write(&path, &bytes).expect("write case");
        let outcome = catch_unwind(AssertUnwindSafe(|| check_config_file(&path, reg.as_ref())));
        tried += 1;
        match outcome {
            Ok(Ok(accepted)) => refused += usize::from(!accepted),
            Ok(Err(problem)) => failures.push(format!("{name}: {problem}")),
            Err(_) => failures.push(format!("{name}: panicked")),
        }
        if failures.len() == 1 && !failures[0].is_empty() {
            // Keep the first failing input for a regression seed.
            let keep = std::env::temp_dir().join("kml-fuzz-failing.toml");
            let _ = std::fs::write(keep, &bytes);
        }
    };
    for (name, bytes) in &seeds {
        run(format!("seed {name}"), bytes.clone(), &mut failures);
    }
    for i in 0..cases(1000) {
        let (name, seed) = rng.pick(&seeds).clone();
        let bytes = mutate(&mut rng, &seed);
        run(format!("case {i} (from {name})"), bytes, &mut failures);
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
    eprintln!(
        "fuzz: {tried} configuration files ({refused} refused, {} accepted), plugins {}",
        tried - refused,
        if reg.is_some() { "loaded" } else { "absent" }
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every seed under `tests/fuzz/configs/` that names what its error must
/// say is refused with that, naming the file, in one line.
#[test]
fn regression_seeds_are_refused_as_they_should_be() {
    let Some(reg) = registry() else {
        return;
    };
    let dir = temp_dir("seeds");
    let mut checked = 0;
    for (name, bytes) in seed_files() {
        let Some(needle) = expected(&bytes) else {
            continue;
        };
        let path = dir.join(&name);
        std::fs::write(&path, &bytes).expect("write");
        let cfg = Config::load(Some(&path));
        let error = match cfg {
            Err(e) => e.to_string(),
            Ok(cfg) => cfg
                .probe_settings(reg.config_defaults())
                .and_then(|_| cfg.benchmark_settings(reg.benchmark_defaults()))
                .and_then(|_| cfg.check_component_rules(&reg, &[], &[]))
                .map_err(|e| e.to_string())
                .err()
                .unwrap_or_else(|| panic!("{name} was accepted")),
        };
        assert!(
            error.contains(&needle) && error.starts_with(&path.display().to_string()),
            "{name}: expected {needle:?}, got {error}"
        );
        check_line(&name, &error).unwrap_or_else(|e| panic!("{e}"));
        checked += 1;
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
    assert!(checked > 10, "only {checked} seeds say what they expect");
}

#[test]
fn mutated_durations_and_sizes_parse_or_say_why() {
    let mut rng = Rng::new();
    let seeds = [
        "250ms", "1.5s", "2m", "10", "1h", "16MiB", "4M", "65536", "auto", "1GiB", "0s", ".5s",
    ];
    let alphabet: Vec<char> = "0123456789.,-+eEsmhKMGiBu µ \t\n\u{0}\u{1b}é🦀nainf"
        .chars()
        .collect();
    let mut tried = 0;
    for _ in 0..cases(5000) {
        let mut s: Vec<char> = rng.pick(&seeds).chars().collect();
        for _ in 0..=rng.below(3) {
            let i = rng.below(s.len() + 1);
            match rng.below(3) {
                0 => s.insert(i, *rng.pick(&alphabet)),
                1 if i < s.len() => {
                    s.remove(i);
                }
                _ => s.insert(i, *rng.pick(&['9', '9', '0', 'e'])),
            }
        }
        let text: String = s.into_iter().collect();
        tried += 1;
        let outcome = catch_unwind(|| {
            let d = config::parse_duration(&text)
                .map(|_| ())
                .map_err(|e| e.to_string());
            let r = config::ring_bytes(&text)
                .map(|_| ())
                .map_err(|e| e.to_string());
            let i = config::interval(&text, config::MIN_FLUSH_INTERVAL)
                .map(|_| ())
                .map_err(|e| e.to_string());
            [d, r, i]
        });
        let results = outcome.unwrap_or_else(|_| panic!("{text:?} panicked"));
        for r in results {
            if let Err(e) = r {
                check_line(&text, &e).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
    eprintln!("fuzz: {tried} duration and size texts");
}

const KINDS: &[ColumnKind] = &[
    ColumnKind::U8,
    ColumnKind::U16,
    ColumnKind::U32,
    ColumnKind::U64,
    ColumnKind::I8,
    ColumnKind::I16,
    ColumnKind::I32,
    ColumnKind::I64,
    ColumnKind::F32,
    ColumnKind::F64,
    ColumnKind::BOOL,
    ColumnKind::STR,
    ColumnKind::LABEL,
    ColumnKind(0),
    ColumnKind(99),
];

const NAMES: &[&str] = &[
    "ts_uptime_us",
    "pid",
    "comm",
    "bytes",
    "flag",
    "kind",
    "value",
    "collection_id",
    "Bad",
    "",
    "9lives",
    "a_b",
    "pid",
];

/// A random table declaration: mostly near-valid (a timestamp, columns at
/// plausible offsets and sizes), so that both sides of every rule are hit.
fn random_table(rng: &mut Rng) -> TableDecl {
    let mut columns = Vec::new();
    let mut offset = 0u32;
    if !rng.chance(5) {
        let kind = if rng.chance(95) {
            ColumnKind::U64
        } else {
            ColumnKind::U32
        };
        columns.push(column("ts_uptime_us", kind, 0, 8, &[]));
        offset = 8;
    }
    for _ in 0..rng.below(8) {
        let kind = *rng.pick(KINDS);
        let mut size = match kind {
            ColumnKind::STR => 1 + rng.below(24) as u32,
            ColumnKind::LABEL => *rng.pick(&[1u32, 2, 4]),
            k => k.fixed_size().unwrap_or(4),
        };
        if rng.chance(5) {
            size = rng.below(17) as u32;
        }
        let at = if rng.chance(90) {
            offset
        } else {
            rng.below(offset as usize + 8) as u32
        };
        let labels: &[&str] = if kind == ColumnKind::LABEL && rng.chance(95) {
            &["a", "b", "c"]
        } else {
            &[]
        };
        let name = format!(
            "{}{}",
            rng.pick(NAMES),
            if rng.chance(80) {
                columns.len().to_string()
            } else {
                String::new()
            }
        );
        columns.push(column(&name, kind, at, size, labels));
        offset = offset.max(at.saturating_add(size));
    }
    if rng.chance(3) {
        columns.push(column("far", ColumnKind::U8, u32::MAX, 1, &[]));
    }
    let record_size = match rng.below(10) {
        0 => rng.below(offset as usize + 1) as u32,
        1 => 0,
        2 => u32::MAX,
        _ => offset + rng.below(8) as u32,
    };
    let name = *rng.pick(&["events", "events", "system_info", "Bad Name", "t", ""]);
    TableDecl {
        name: name.into(),
        description: "fuzzed".into(),
        record_size,
        columns: columns.into(),
    }
}

fn column(name: &str, kind: ColumnKind, offset: u32, size: u32, labels: &[&str]) -> ColumnDecl {
    ColumnDecl {
        name: name.into(),
        kind,
        offset,
        size,
        unit: "".into(),
        description: "".into(),
        labels: labels.iter().map(|l| (*l).into()).collect(),
    }
}

/// A property of validation: it never panics, and every declaration it
/// accepts decodes: random records give a batch of as many rows and one
/// column more (`collection_id`), bytes that are not whole records give an
/// error, and the table goes through an Arrow file and back.
#[test]
fn table_validation_accepts_only_what_the_decoder_decodes() {
    let mut rng = Rng::new();
    let dir = temp_dir("tables");
    let (mut tried, mut accepted, mut written) = (0usize, 0usize, 0usize);
    for i in 0..cases(3000) {
        let decl = random_table(&mut rng);
        tried += 1;
        let valid = catch_unwind(|| validate_table(&decl).is_ok())
            .unwrap_or_else(|_| panic!("case {i}: validate_table panicked on {decl:?}"));
        if !valid {
            continue;
        }
        accepted += 1;
        let rows = rng.below(40);
        let rs = decl.record_size as usize;
        let data: Vec<u8> = (0..rows * rs).map(|_| rng.next() as u8).collect();
        let decoder = TableDecoder::new(&decl, "fuzz");
        let batch = catch_unwind(AssertUnwindSafe(|| decoder.decode(&data)))
            .unwrap_or_else(|_| panic!("case {i}: decode panicked on {decl:?}"))
            .unwrap_or_else(|e| {
                panic!("case {i}: an accepted table does not decode: {e}: {decl:?}")
            });
        assert_eq!(batch.num_rows(), rows, "case {i}");
        assert_eq!(batch.num_columns(), decl.columns.len() + 1, "case {i}");
        if rows > 0 {
            let cut = &data[..data.len() - 1];
            assert!(
                decoder.decode(cut).is_err(),
                "case {i}: bytes that are not whole records decoded"
            );
        }
        if i % 10 == 0 {
            // A sink creates its file exclusively: each case writes its own.
            let path = dir.join(format!("t{i}.arrow"));
            let mut sink = IpcSink::create(&path, decoder, FlushPolicy::default())
                .unwrap_or_else(|e| panic!("case {i}: {e}"));
            sink.push(&data, rows as u64).expect("push");
            let (kept, done) = sink.finish();
            done.unwrap_or_else(|e| panic!("case {i}: writing: {e}"));
            assert_eq!(kept, rows as u64);
            assert_eq!(
                sink::repair(&path).expect("read back"),
                RepairOutcome::Intact { rows: rows as u64 },
                "case {i}"
            );
            written += 1;
        }
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
    eprintln!("fuzz: {tried} table declarations, {accepted} accepted and decoded, {written} written and read back");
    assert!(
        accepted > tried / 20,
        "too few valid declarations to say much: {accepted}/{tried}"
    );
}
