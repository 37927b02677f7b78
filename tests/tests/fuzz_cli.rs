//! Fuzzing the real binary: mutated `kernmlops run` argument lists and
//! mutated configuration files (a smaller set than the in-process fuzzing
//! of `core/tests/fuzz.rs`, which runs thousands). Every case is invalid by
//! construction, so each must exit non-zero with exactly one `error:`
//! line, no backtrace and no control character, and create nothing. The
//! argument lists that found problems stay in `tests/fuzz/args.txt` and
//! run every time.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use kernmlops_e2e::*;

/// xorshift64*, seeded (`KERNMLOPS_FUZZ_SEED`) so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed: u64 = std::env::var("KERNMLOPS_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(7);
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
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
}

/// What one invocation left.
struct Outcome {
    code: Option<i32>,
    stderr: String,
}

/// Runs the binary with `args` from `cwd`, killed after 30 s.
fn invoke(args: &[String], cwd: &Path) -> Outcome {
    let mut child = Command::new(kernmlops_bin())
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kernmlops");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = err.read_to_end(&mut bytes);
        bytes
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kernmlops {args:?} ran for more than 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let bytes = reader.join().expect("reader");
    Outcome {
        code: status.code(),
        stderr: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// The property every invalid invocation must have; `Err` says how it
/// failed.
fn judge(o: &Outcome, output: &Path) -> Result<(), String> {
    if o.code == Some(0) || o.code.is_none() {
        return Err(format!(
            "exit {:?} (accepted, or killed by a signal)",
            o.code
        ));
    }
    let errors = o.stderr.lines().filter(|l| l.starts_with("error:")).count();
    if errors != 1 {
        return Err(format!("{errors} error lines"));
    }
    if o.stderr.contains("panicked") || o.stderr.contains("stack backtrace") {
        return Err("a panic or backtrace".into());
    }
    if o.stderr
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err("a control character on stderr".into());
    }
    let made = std::fs::read_dir(output).map(|d| d.count()).unwrap_or(0);
    if made != 0 {
        return Err(format!("{made} entries created in the output folder"));
    }
    Ok(())
}

/// Values each option must refuse.
fn bad_values(flag: &str, here: &Path) -> Vec<String> {
    let none = here.join("no-such-thing").display().to_string();
    let v: &[&str] = match flag {
        "--duration" => &[
            "",
            "-1s",
            "1e999s",
            "5y",
            "nan",
            "\u{1}",
            "99999999999999999999h",
            "1..5s",
        ],
        "--ring-size" => &[
            "4KiB",
            "8KiB",
            "3MiB",
            "0",
            "2GiB",
            "-16KiB",
            "16XiB",
            "\u{1b}[31m",
        ],
        "--flush-interval" => &["0s", "1ms", "0", "soon", "-5ms", "\u{7f}"],
        "--tgid" | "--pid" => &["0", "4294967295", "-1", "abc", "99999999", "1\u{7f}"],
        "--plugins" => &[
            "no_such_probe",
            "memory_usage,\u{1b}[2J",
            ",",
            "a\nb",
            "../../etc",
            "memory_usage,no_such",
        ],
        "--plugin-dir" => &["/etc/passwd", "\u{1}dir"],
        "--benchmark" => &["no_such_benchmark", "\u{1b}]0;x\u{7}", ""],
        "--cgroup" => &["/tmp", "/proc/self", ""],
        "--config" => &["/etc", "\u{2}.toml"],
        _ => &[],
    };
    let mut out: Vec<String> = v.iter().map(|s| (*s).to_owned()).collect();
    if matches!(flag, "--plugin-dir" | "--cgroup" | "--config") {
        out.push(none);
    }
    out
}

const FLAGS: &[&str] = &[
    "--duration",
    "--ring-size",
    "--flush-interval",
    "--tgid",
    "--pid",
    "--plugins",
    "--plugin-dir",
    "--benchmark",
    "--cgroup",
    "--config",
];

/// A valid run (one second of memory_usage into `output`), made invalid by
/// one to three mutations.
fn mutated_run(rng: &mut Rng, plugins: &Path, output: &Path, here: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "run",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "memory_usage",
        "--duration",
        "1s",
        "--output",
        output.to_str().expect("utf8"),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for _ in 0..=rng.below(3) {
        match rng.below(6) {
            0..=2 => {
                let flag = *rng.pick(FLAGS);
                let value = rng.pick(&bad_values(flag, here)).clone();
                if let Some(i) = args.iter().position(|a| a == flag) {
                    if i + 1 < args.len() {
                        args[i + 1] = value;
                    } else {
                        args.push(value);
                    }
                } else if flag == "--config" {
                    args.insert(0, value);
                    args.insert(0, flag.to_owned());
                } else {
                    args.push(flag.to_owned());
                    args.push(value);
                }
            }
            3 => args.push(
                rng.pick(&["--bogus", "--collection-dir", "-x", "--baseline", "--\u{1}"])
                    .to_string(),
            ),
            4 => {
                // A flag left without its value.
                let flag = *rng.pick(&["--duration", "--ring-size", "--tgid", "--plugins"]);
                args.push(flag.to_owned());
            }
            _ => {
                // A control or non-ASCII byte inside a value.
                let i = 1 + rng.below(args.len() - 1);
                let c = *rng.pick(&['\u{1}', '\u{1b}', '\u{7f}', 'é', '\u{202e}']);
                let at = rng.below(args[i].chars().count() + 1);
                let mut chars: Vec<char> = args[i].chars().collect();
                chars.insert(at, c);
                args[i] = chars.into_iter().collect();
            }
        }
    }
    // The mutations above can each be undone by a later one; one value
    // that is always refused keeps every case invalid.
    if !args.iter().any(|a| a.contains(|c: char| c.is_control())) {
        let bad = rng.pick(&bad_values("--duration", here)).clone();
        match args.iter().position(|a| a == "--duration") {
            Some(i) if i + 1 < args.len() && args[i + 1] == "1s" => args[i + 1] = bad,
            Some(_) => {}
            None => args.extend(["--duration".to_owned(), bad]),
        }
    }
    args
}

/// One fuzzed invocation: runs it from `here`, judges it, and on failure
/// describes it.
fn case(args: &[String], here: &Path, output: &Path) -> Option<String> {
    let o = invoke(args, here);
    let verdict = judge(&o, output);
    let _ = std::fs::remove_dir_all(output);
    std::fs::create_dir_all(output).expect("output");
    verdict
        .err()
        .map(|why| format!("{args:?}: {why}\n  stderr: {}", o.stderr.trim_end()))
}

#[test]
fn root_mutated_run_arguments_give_one_error_line() {
    if !require_root("root_mutated_run_arguments_give_one_error_line") {
        return;
    }
    let plugins = plugin_dir(
        "fuzz-cli",
        &[("memory_usage", "memory_usage"), ("workloads", "workloads")],
    );
    let here = temp_dir("fuzz-cli-cwd");
    let output = here.join("out");
    std::fs::create_dir_all(&output).expect("output");
    let mut rng = Rng::new();
    let mut failures = Vec::new();
    let mut tried = 0;
    // The argument lists that found problems, then mutated ones.
    let seeds = std::fs::read_to_string(workspace_root().join("tests/fuzz/args.txt"))
        .expect("tests/fuzz/args.txt");
    for line in seeds
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let args: Vec<String> = serde_json::from_str::<Vec<String>>(line)
            .unwrap_or_else(|e| panic!("tests/fuzz/args.txt: {line}: {e}"))
            .into_iter()
            .map(|a| {
                a.replace("$PLUGINS", plugins.to_str().expect("utf8"))
                    .replace("$OUT", output.to_str().expect("utf8"))
            })
            .collect();
        tried += 1;
        failures.extend(case(&args, &here, &output));
    }
    let n = std::env::var("KERNMLOPS_FUZZ_CLI_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    for _ in 0..n {
        let args = mutated_run(&mut rng, &plugins, &output, &here);
        tried += 1;
        failures.extend(case(&args, &here, &output));
    }
    eprintln!("fuzz: {tried} kernmlops run argument lists through the binary");
    std::fs::remove_dir_all(&here).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
    assert!(
        failures.is_empty(),
        "{} of {tried} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A configuration file mutated at the byte level, through `config show`
/// and `run`: one error line each (the in-process fuzzing tries many more).
#[test]
fn root_mutated_configuration_files_through_the_binary() {
    if !require_root("root_mutated_configuration_files_through_the_binary") {
        return;
    }
    let plugins = plugin_dir(
        "fuzz-cfg",
        &[
            ("memory_usage", "memory_usage"),
            ("block_io", "block_io"),
            ("workloads", "workloads"),
        ],
    );
    let here = temp_dir("fuzz-cfg-cwd");
    let output = here.join("out");
    std::fs::create_dir_all(&output).expect("output");
    let seeds: Vec<PathBuf> = {
        let dir = workspace_root().join("tests/fuzz/configs");
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("seeds")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        v.sort();
        v
    };
    let mut rng = Rng::new();
    let mut failures = Vec::new();
    let mut tried = 0;
    for i in 0..40 {
        let seed = rng.pick(&seeds).clone();
        let mut bytes = std::fs::read(&seed).expect("seed");
        // Seeds are invalid already; a byte more must keep them one line.
        if i % 2 == 1 {
            let at = rng.below(bytes.len() + 1);
            bytes.insert(at, *rng.pick(&[0u8, 1, 0x1b, 0xff, b'\n', b'[']));
        }
        let file = here.join("fuzzed.toml");
        std::fs::write(&file, &bytes).expect("write");
        let file = file.to_str().expect("utf8").to_owned();
        let plugin_dir = plugins.to_str().expect("utf8").to_owned();
        let out = output.to_str().expect("utf8").to_owned();
        let command: Vec<String> = if i % 4 < 2 {
            vec![
                "--config".into(),
                file,
                "--plugin-dir".into(),
                plugin_dir,
                "config".into(),
                "show".into(),
            ]
        } else {
            vec![
                "--config".into(),
                file,
                "run".into(),
                "--plugin-dir".into(),
                plugin_dir,
                "--plugins".into(),
                "memory_usage".into(),
                "--duration".into(),
                "1s".into(),
                "--output".into(),
                out,
            ]
        };
        tried += 1;
        if let Some(f) = case(&command, &here, &output) {
            // A byte inserted into the comment line, say, can leave a seed
            // valid: then a run of one collects for a second, as it should.
            if !(f.contains("exit Some(0)") && i % 2 == 1) {
                failures.push(format!("{}: {f}", seed.display()));
            }
        }
    }
    eprintln!("fuzz: {tried} configuration files through the binary");
    std::fs::remove_dir_all(&here).expect("clean up");
    std::fs::remove_dir_all(&plugins).expect("clean up");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
