//! Shared helpers of the kernmlops benchmarks: timing and reporting.

use std::path::{Path, PathBuf};

/// The workspace these benchmarks belong to.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_owned)
        .unwrap_or_default()
}

/// A benchmark's positional command-line arguments, each optional.
pub struct Args(std::iter::Skip<std::env::Args>);

impl Args {
    /// The arguments this process was given, its name left out.
    pub fn from_env() -> Self {
        Self(std::env::args().skip(1))
    }

    /// The next argument as a `T`, or `default` where there is none left.
    pub fn next_or<T>(&mut self, default: T) -> anyhow::Result<T>
    where
        T: std::str::FromStr,
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        Ok(self
            .0
            .next()
            .map(|a| a.parse())
            .transpose()?
            .unwrap_or(default))
    }
}

/// The release `kernmlops` binary that `cargo xtask build-plugins` builds,
/// or how to get it.
pub fn release_host() -> anyhow::Result<PathBuf> {
    let bin = workspace().join("target/release/kernmlops");
    if !bin.is_file() {
        anyhow::bail!(
            "{} missing: run `cargo xtask build-plugins` first",
            bin.display()
        );
    }
    Ok(bin)
}

/// User + system CPU time of this process, in seconds.
pub fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain old data and getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Median of a non-empty slice.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Runs `cmd` (its output as the caller set it up), failing unless it
/// succeeds; `what` names it in the error.
pub fn run_checked(cmd: &mut std::process::Command, what: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;

    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        anyhow::bail!("{what} failed ({status})");
    }
    Ok(())
}

/// `perf bench sched pipe -l <loops>`, its output discarded. Pinned to CPU
/// 0, both ends of the pipe share a CPU: no idle in between, the highest
/// switch rate.
pub fn sched_pipe(loops: u32, pinned: bool) -> anyhow::Result<()> {
    let mut cmd = if pinned {
        let mut c = std::process::Command::new("taskset");
        c.args(["-c", "0", "perf"]);
        c
    } else {
        std::process::Command::new("perf")
    };
    cmd.args(["bench", "sched", "pipe", "-l", &loops.to_string()])
        .stdout(std::process::Stdio::null());
    run_checked(&mut cmd, "perf bench (apt-get install linux-perf)")
}

/// A `kernmlops run` a benchmark started, attached and collecting.
pub struct Collecting {
    child: std::process::Child,
    /// Its standard error, read up to the "collecting" line; the rest is
    /// drained when it stops, so the host never blocks on a full pipe.
    stderr: std::io::BufReader<std::process::ChildStderr>,
    /// From the spawn to the "collecting" line.
    pub startup: std::time::Duration,
}

/// What a stopped [`Collecting`] left: its summary and its manifest (the
/// collection folder itself is removed).
pub struct Stopped {
    pub stdout: String,
    pub manifest: serde_json::Value,
}

impl Collecting {
    /// Spawns `run` (a `kernmlops run` command) and waits until it says it
    /// is collecting.
    pub fn start(mut run: std::process::Command) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        use std::io::BufRead as _;
        use std::process::Stdio;

        let started = std::time::Instant::now();
        let mut child = run
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kernmlops")?;
        let mut stderr = std::io::BufReader::new(child.stderr.take().context("stderr")?);
        let mut line = String::new();
        loop {
            line.clear();
            if stderr.read_line(&mut line)? == 0 {
                let _ = child.wait();
                anyhow::bail!("kernmlops exited before attaching");
            }
            if line.starts_with("collecting ") {
                break;
            }
        }
        Ok(Self {
            child,
            stderr,
            startup: started.elapsed(),
        })
    }

    /// The collector's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Asks the run to stop (SIGINT), as Ctrl+C would.
    pub fn interrupt(&self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
    }

    /// Waits for the run to end (after [`Collecting::interrupt`], or at the
    /// end of its `--duration`), reads its manifest and removes the
    /// collection folder.
    pub fn wait(self) -> anyhow::Result<Stopped> {
        use anyhow::Context as _;

        let Self {
            child, mut stderr, ..
        } = self;
        let drain = std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        let output = child.wait_with_output()?;
        let _ = drain.join();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let dir = stdout
            .lines()
            .find_map(|l| {
                l.strip_prefix("collection ")
                    .and_then(|r| r.split_once(" in "))
                    .map(|(_, d)| d.trim().to_owned())
            })
            .with_context(|| format!("no collection line in:\n{stdout}"))?;
        let dir = std::path::Path::new(&dir);
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json"))?)?;
        std::fs::remove_dir_all(dir).ok();
        Ok(Stopped { stdout, manifest })
    }
}
