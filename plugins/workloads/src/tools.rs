//! Benchmarks over software the user points to: a Linux source tree to
//! build and a GAP benchmark suite to run PageRank from. Their output is
//! kept in the output folder; the result is the build time and PageRank's
//! trial times.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use kernmlops_plugin_sdk::{
    benchmark::{MachineSettings, Run},
    serde_json, settings, workload, BenchmarkImpl, Error, Result, StartArgs,
};

use crate::{at_least_one, bench::StdoutReport, indicator, reports, run_to_end};

// ---------------------------------------------------------------- linux_build

settings! {
    /// `[benchmarks.linux_build]` settings.
    pub struct LinuxBuildSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// A configured Linux source tree (required).
        pub source_dir: String = String::new(),
        /// Parallel make jobs (0: one per CPU).
        pub jobs: u32 = 0,
        /// The make target.
        pub target: String = "vmlinux".into(),
        /// Run `make clean` in setup, so every run builds everything.
        pub clean_first: bool = true,
    }
    validate(s) {
        if s.target.trim().is_empty() || s.target.starts_with('-') {
            return Err(format!("target = {:?}: name a make target, e.g. \"vmlinux\"", s.target));
        }
        Ok(())
    }
}

impl LinuxBuild {
    fn jobs(&self) -> u32 {
        match self.settings.jobs {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            n => n,
        }
    }
}

/// True when `dir` looks like the top of a Linux source tree.
fn is_kernel_tree(dir: &Path) -> bool {
    dir.join("Makefile").is_file()
        && dir.join("Kconfig").is_file()
        && dir.join("kernel").is_dir()
        && dir.join("arch").is_dir()
}

benchmark! {
    /// `make -C <source_dir> -j<jobs> <target>` in a Linux tree.
    pub struct LinuxBuild(LinuxBuildSettings) = "linux_build",
        "Builds a Linux source tree the user points to (make -jN)";
    setup custom;
    {
        fn is_configured(&self) -> Result<()> {
            let dir = &self.settings.source_dir;
            if dir.is_empty() {
                return Err(Error::new(
                    "set [benchmarks.linux_build] source_dir to a Linux source tree",
                ));
            }
            if !is_kernel_tree(Path::new(dir)) {
                return Err(Error::new(format!(
                    "set [benchmarks.linux_build] source_dir to a Linux source tree: {dir:?} is not one (no Makefile, Kconfig, kernel/ and arch/)"
                )));
            }
            if !Path::new(dir).join(".config").is_file() {
                return Err(Error::new(format!(
                    "{dir:?} has no .config: run `make -C {dir} defconfig` (or olddefconfig) first"
                )));
            }
            let hint = "apt-get install build-essential bc bison flex libelf-dev libssl-dev";
            workload::require_program("make", hint)?;
            workload::require_program("gcc", hint)?;
            Ok(())
        }

        fn setup(&mut self) -> Result<()> {
            if self.settings.clean_first {
                let mut cmd = Command::new("make");
                cmd.arg("-C").arg(&self.settings.source_dir).arg("clean");
                run_to_end(cmd, "make clean")?;
            }
            self.run.prepare(&self.settings.machine)
        }

        fn launch(&mut self) -> Result<()> {
            let mut cmd = Command::new("make");
            cmd.arg("-C")
                .arg(&self.settings.source_dir)
                .arg(format!("-j{}", self.jobs()))
                .arg(&self.settings.target);
            self.run.start_captured(cmd, "make (linux_build)")
        }

        /// The build's wall time: make prints none of its own, so it is the
        /// time from launch until `poll` saw make end (within one polling
        /// interval, 100 ms under the host).
        fn result(&self) -> Result<Option<serde_json::Value>> {
            let make = self.run.finished("make")?;
            let took = make
                .elapsed()
                .ok_or_else(|| Error::new("linux_build: make has not ended"))?;
            let mut settings = self.settings.clone();
            settings.jobs = self.jobs();
            let ind = indicator(Self::NAME, "linux", &settings, &self.run)?
                .with_result("build_s", took.as_secs_f64());
            Ok(Some(ind.to_value()?))
        }
    }
}

// ---------------------------------------------------------------- gap

settings! {
    /// `[benchmarks.gap]` settings.
    pub struct GapSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// A built GAP benchmark suite (https://github.com/sbeamer/gapbs) holding the pr binary (required).
        pub suite_dir: String = String::new(),
        /// Kronecker graph of 2^scale vertices (pr -g).
        pub scale: u32 = 20,
        /// PageRank trials (pr -n).
        pub trials: u32 = 3,
    }
    validate(s) {
        at_least_one("scale", u64::from(s.scale))?;
        if s.scale > 31 {
            return Err(format!("scale = {}: use at most 31 (2^31 vertices)", s.scale));
        }
        at_least_one("trials", u64::from(s.trials))
    }
}

impl Gap {
    fn pr(&self) -> PathBuf {
        Path::new(&self.settings.suite_dir).join("pr")
    }
}

benchmark! {
    /// `<suite_dir>/pr -g <scale> -n <trials>`: PageRank on a Kronecker graph.
    pub struct Gap(GapSettings) = "gap",
        "PageRank (pr) from a GAP benchmark suite directory on a generated Kronecker graph";
    {
        fn is_configured(&self) -> Result<()> {
            let dir = &self.settings.suite_dir;
            if dir.is_empty() {
                return Err(Error::new("set [benchmarks.gap] suite_dir to a built GAP benchmark suite (git clone https://github.com/sbeamer/gapbs && make -C gapbs)",
                ));
            }
            let pr = self.pr();
            let executable = std::fs::metadata(&pr)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            if !executable {
                return Err(Error::new(format!(
                    "[benchmarks.gap] suite_dir = {dir:?} has no executable pr: build the suite there (make -C {dir})"
                )));
            }
            Ok(())
        }

        fn launch(&mut self) -> Result<()> {
            let mut cmd = Command::new(self.pr());
            cmd.arg("-g")
                .arg(self.settings.scale.to_string())
                .arg("-n")
                .arg(self.settings.trials.to_string());
            self.run.start_captured(cmd, "gap pr")
        }

        /// Each PageRank trial's time and their mean, from pr's report (its
        /// standard output).
        fn result(&self) -> Result<Option<serde_json::Value>> {
            let pr = StdoutReport {
                tool: "pr",
                parse: reports::gap_pr,
            };
            let ind = pr.indicator(&self.run, (Self::NAME, "gapbs"), &self.settings)?;
            Ok(Some(ind.to_value()?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernmlops_plugin_testing::start_args;

    #[test]
    fn linux_build_needs_a_kernel_tree() {
        let b = LinuxBuild::new(&start_args("{}")).expect("defaults");
        let e = b.is_configured().expect_err("no source_dir");
        assert_eq!(
            e.message,
            "set [benchmarks.linux_build] source_dir to a Linux source tree"
        );
        let b = LinuxBuild::new(&start_args(r#"{"source_dir": "/tmp"}"#)).expect("settings");
        let e = b.is_configured().expect_err("not a kernel tree");
        assert!(
            e.message
                .starts_with("set [benchmarks.linux_build] source_dir to a Linux source tree")
                && e.message.contains("\"/tmp\" is not one"),
            "{e}"
        );
    }

    #[test]
    fn linux_build_jobs_default_to_cpus() {
        let b = LinuxBuild::new(&start_args("{}")).expect("defaults");
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        assert_eq!(b.jobs(), cpus);
        let b = LinuxBuild::new(&start_args(r#"{"jobs": 3}"#)).expect("settings");
        assert_eq!(b.jobs(), 3);
    }

    #[test]
    fn gap_needs_a_suite_with_pr() {
        let g = Gap::new(&start_args("{}")).expect("defaults");
        let e = g.is_configured().expect_err("no suite_dir");
        assert!(
            e.message.starts_with("set [benchmarks.gap] suite_dir"),
            "{e}"
        );
        let g = Gap::new(&start_args(r#"{"suite_dir": "/tmp"}"#)).expect("settings");
        let e = g.is_configured().expect_err("no pr");
        assert!(e.message.contains("has no executable pr"), "{e}");
    }
}
