//! What the workload benchmarks share: the [`benchmark!`] declaration of a
//! benchmark's struct and the `BenchmarkImpl` parts every one writes the
//! same way, the paths of a launch that writes a report, and the result
//! of a benchmark whose figures are in a report file or in one tool's
//! standard output.

use std::path::PathBuf;

use kernmlops_plugin_sdk::{benchmark::Run, indicator::Indicator, workload, Error, Result};
use serde::Serialize;

use crate::{indicator, reports::Figures};

/// Declares a benchmark: its struct (the settings, the [`Run`], and any
/// further fields with their values at `create`) and its `BenchmarkImpl`
/// with `NAME`, `DESCRIPTION`, `Settings`, `create` and `run` written
/// out, `is_configured` from `requires` (the programs and what installs
/// them) when given, `setup` preparing the machine (after making a private
/// folder with `setup private`; none with `setup custom`), and the items
/// of the braces for the rest. Fields after the first line are declared
/// with `field name: type = value at create;`.
macro_rules! benchmark {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($settings:ident) = $bench:literal, $desc:literal;
        $( $(#[$fmeta:meta])* field $field:ident: $fty:ty = $init:expr; )*
        $( requires $( $program:literal => $hint:literal ),+; )?
        $( setup $setup:ident; )?
        { $($items:tt)* }
    ) => {
        $(#[$meta])*
        pub struct $name {
            settings: $settings,
            run: Run,
            $( $(#[$fmeta])* $field: $fty, )*
        }

        impl BenchmarkImpl for $name {
            const NAME: &'static str = $bench;
            const DESCRIPTION: &'static str = $desc;
            type Settings = $settings;

            fn create(args: &StartArgs, settings: $settings) -> Result<Self> {
                Ok(Self {
                    settings,
                    run: Run::new(Self::NAME, args),
                    $( $field: $init, )*
                })
            }

            $(
                fn is_configured(&self) -> Result<()> {
                    $crate::bench::require(&[$( ($program, $hint) ),+])
                }
            )?

            benchmark!(@setup $($setup)?);

            fn run(&mut self) -> &mut Run {
                &mut self.run
            }

            $($items)*
        }
    };
    (@setup custom) => {};
    (@setup) => {
        fn setup(&mut self) -> Result<()> {
            self.run.prepare(&self.settings.machine)
        }
    };
    (@setup private) => {
        fn setup(&mut self) -> Result<()> {
            self.run.private_dir(None)?;
            self.run.prepare(&self.settings.machine)
        }
    };
}

/// Fails with what to install for the first of `programs` (name, hint)
/// that is not on PATH.
pub(crate) fn require(programs: &[(&str, &str)]) -> Result<()> {
    for (program, hint) in programs {
        workload::require_program(program, hint)?;
    }
    Ok(())
}

/// A tool whose standard output holds a benchmark's figures.
pub(crate) struct StdoutReport {
    /// The tool, as the run's workload names it.
    pub tool: &'static str,
    /// Reads the figures from its standard output.
    pub parse: fn(&str) -> Result<Figures>,
}

impl StdoutReport {
    /// The indicator of benchmark `name` measuring `component` with
    /// `settings`, its figures from the standard output of its finished
    /// tool.
    pub(crate) fn indicator<S: Serialize>(
        &self,
        run: &Run,
        (name, component): (&str, &str),
        settings: &S,
    ) -> Result<Indicator> {
        let report = run.finished(self.tool)?.read_stdout()?;
        Ok(indicator(name, component, settings, run)?.with_results((self.parse)(&report)?))
    }
}

/// The private folder, and the path of report `file` that `tool` writes
/// into the output folder: what a launch writing a report needs.
pub(crate) fn launch_paths(run: &mut Run, file: &str, tool: &str) -> Result<(PathBuf, PathBuf)> {
    let dir = run.private_path_for_launch()?;
    let report = run.output_dir()?.new_report(file, tool)?;
    Ok((dir, report))
}

/// The report file `file` of the benchmark's finished `tool` from the
/// output folder, named `what` in errors (which start with `bench`, the
/// benchmark's name).
pub(crate) fn read_report(
    run: &Run,
    bench: &str,
    tool: &str,
    (file, what): (&str, &str),
) -> Result<String> {
    run.finished(tool)?;
    let path = run
        .output()
        .map(|o| o.join(file))
        .ok_or_else(|| Error::new(format!("{bench}: no output folder")))?;
    std::fs::read_to_string(&path)
        .map_err(|e| Error::new(format!("{bench}: reading {what} {}: {e}", path.display())))
}
