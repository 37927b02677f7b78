//! The `kernmlops` command: collect kernel-behaviour datasets from probe
//! plugins into Arrow IPC files, and run experiments over them.
//!
//! This file parses the command line, dispatches to the module of each
//! group of commands and holds the exit-code and error-line policy.

mod args;
mod context;
mod data;
mod experiment;
mod inspect;
mod run;
mod trace_flags;

use std::{path::PathBuf, process::ExitCode};

use anyhow::Result;
use clap::Parser;

use args::{Cli, Command, ConfigCommand};
use context::Context;

fn main() -> ExitCode {
    let mut raw = std::env::args_os().skip(1);
    if raw
        .next()
        .is_some_and(|a| a == kernmlops::undo::GUARDIAN_ARG)
    {
        let state = raw.next().map(PathBuf::from).unwrap_or_default();
        return kernmlops::undo::guardian_main(&state);
    }
    let cli = Cli::parse();
    kernmlops::tune_allocator();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line, whatever the error carries (a user's bytes, a
            // plugin's message): control characters are escaped.
            eprintln!(
                "error: {}",
                kernmlops::trust::printable(chain_line(&e).trim_end().as_bytes())
            );
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, `outer: cause: ...`, each cause
/// once: an error whose message already quotes its source (`path: No such
/// file or directory (os error 2)`) does not get it appended again.
pub(crate) fn chain_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// Commands that only print: a reader that stops early (`| head`) ends them
/// quietly, as it ends `ls`. The others keep SIGPIPE ignored: a run must
/// close its files whatever happens to its terminal.
fn report_only(command: &Command) -> bool {
    matches!(
        command,
        Command::Plugins
            | Command::Check { .. }
            | Command::Config { .. }
            | Command::PerfList { .. }
            | Command::PowerList { .. }
            | Command::TraceList { .. }
            | Command::Dump { .. }
    )
}

fn dispatch(cli: Cli) -> Result<ExitCode> {
    if report_only(&cli.command) {
        // SAFETY: restoring a signal's default action has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // The commands a configuration names run as root: checked only for
    // the commands that use them.
    let resolve_commands = matches!(
        cli.command,
        Command::Run(_)
            | Command::Config {
                what: ConfigCommand::Show
            }
    );
    let ctx = Context::new(
        cli.config.as_deref(),
        cli.plugin_dir,
        cli.allow_insecure_plugins,
        resolve_commands,
    )?;
    match cli.command {
        Command::Run(args) => run::run(&ctx, args),
        Command::Plugins => inspect::plugins(&ctx),
        Command::Check { plugins } => inspect::check(&ctx, plugins),
        Command::Config { what } => inspect::config(&ctx, what),
        Command::PerfList { json, resolve } => inspect::perf_list(json, resolve.as_deref()),
        Command::PowerList { json } => inspect::power_list(&ctx, json),
        Command::TraceList { pattern, json } => inspect::trace_list(pattern.as_deref(), json),
        Command::Repair { collection } => data::repair(&collection),
        Command::Export {
            format,
            parquet,
            layout,
            data,
            to,
            collections,
        } => data::export(
            &ctx,
            data,
            to,
            &collections,
            layout,
            format.or_parquet(parquet),
        ),
        Command::Dump { data, collection } => data::dump(&ctx, data, collection),
        Command::Graph {
            collection,
            data,
            trace_field,
        } => data::graph(&ctx, data, collection, trace_field),
        Command::Experiment(args) => {
            experiment::run(&ctx, cli.config, cli.allow_insecure_plugins, args)
        }
    }
}
