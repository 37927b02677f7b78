//! The `script` benchmark: runs any executable the user names, passes it
//! the free-form `parameters` through its environment, and takes its
//! standard output as its result: one JSON performance indicator.

use std::{
    collections::BTreeMap,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use kernmlops_plugin_sdk::{
    benchmark::{MachineSettings, Run},
    indicator::Indicator,
    serde_json::{self, Map, Value},
    settings,
    sys::duration::parse_duration,
    workload::{OutputDir, Workload},
    BenchmarkImpl, Error, Result, StartArgs,
};

/// The exit code a run stopped by its `timeout` reports, as GNU timeout's.
pub const TIMEOUT_EXIT_CODE: i32 = 124;

settings! {
    /// `[benchmarks.script]` settings.
    pub struct ScriptSettings {
        #[flatten]
        pub machine: MachineSettings,
        /// The program and its arguments (required), e.g. ["./bench.sh", "--fast"]. It must print one JSON performance indicator on standard output. A relative path is taken from the folder of the file that sets it, a bare name from PATH; kernmlops checks the program (and any argument naming a file there) like a plugin and runs it by its absolute path.
        pub command: Vec<String> = Vec::new(),
        /// Longest run ("": no limit of its own), e.g. "30s" or "10m"; a script still running then is stopped and the run fails (exit code 124).
        pub timeout: String = String::new(),
        /// Free-form settings for the script: each as the environment variable KML_PARAM_<KEY> (upper case), all as one JSON object in KML_PARAMETERS.
        pub parameters: Map<String, Value> = Map::new(),
    }
    validate(s) {
        if s.command.first().is_some_and(|p| p.is_empty()) {
            return Err("command: the program (its first item) is empty".into());
        }
        parse_timeout(&s.timeout).map_err(|e| format!("timeout = {e}"))?;
        parameter_env(&s.parameters).map_err(|e| strip_section(&e.message))?;
        Ok(())
    }
}

/// An SDK-style message without its `[section]` start (the settings'
/// rules name keys; the host names the section).
fn strip_section(message: &str) -> String {
    match message.strip_prefix('[').and_then(|m| m.split_once("]: ")) {
        Some((_, rest)) => rest.to_owned(),
        None => message.to_owned(),
    }
}

/// Runs `command`; its standard output must be one performance indicator.
pub struct Script {
    settings: ScriptSettings,
    timeout: Option<Duration>,
    env: BTreeMap<String, String>,
    run: Run,
    started: Option<Instant>,
    timed_out: bool,
}

/// `"250ms"`, `"30s"`, `"1.5m"`, `"2h"`; `""` and zero mean no limit.
/// The number is converted exactly (`kernmlops_sys::duration`), so a
/// value too long for a duration is an error, never a panic.
fn parse_timeout(text: &str) -> Result<Option<Duration>, String> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(None);
    }
    if t.ends_with(|c: char| c.is_ascii_digit() || c == '.') {
        return Err(format!(
            "{text:?} has no unit: use ms, s, m or h (e.g. \"30s\")"
        ));
    }
    if !t.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return Err(format!("{text:?} does not start with a number"));
    }
    let d = parse_duration(t).map_err(|e| e.to_string())?;
    Ok((!d.is_zero()).then_some(d))
}

/// A parameter's key as an environment variable: `KML_PARAM_` and the key
/// in upper case, anything but letters, digits and `_` as `_`.
pub fn env_name(key: &str) -> String {
    let body: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("KML_PARAM_{body}")
}

/// A parameter's value as an environment variable's: strings as they are,
/// anything else as JSON (`3`, `true`, `[1,2]`).
fn env_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The environment a script gets from its parameters: `KML_PARAM_<KEY>`
/// each and `KML_PARAMETERS`, all as one JSON object. Two keys that give
/// the same variable are an error naming both.
pub fn parameter_env(parameters: &Map<String, Value>) -> Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    let mut from = BTreeMap::new();
    for (key, value) in parameters {
        if key.is_empty() {
            return Err(Error::config(
                "[benchmarks.script.parameters]: an empty key",
            ));
        }
        let name = env_name(key);
        if let Some(other) = from.insert(name.clone(), key.clone()) {
            return Err(Error::config(format!(
                "[benchmarks.script.parameters]: {other:?} and {key:?} both become {name}: rename one"
            )));
        }
        env.insert(name, env_value(value));
    }
    env.insert(
        "KML_PARAMETERS".into(),
        Value::Object(parameters.clone()).to_string(),
    );
    Ok(env)
}

/// True when `path` is a file someone may execute.
fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The program `command[0]` names: a path when it has a `/`, otherwise
/// looked up on PATH.
fn resolve(program: &str) -> Result<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return if is_executable(&p) {
            Ok(p)
        } else if p.exists() {
            Err(Error::config(format!(
                "[benchmarks.script] command: {program} is not an executable file (chmod +x {program})"
            )))
        } else {
            Err(Error::config(format!(
                "[benchmarks.script] command: {program} does not exist"
            )))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            Error::config(format!(
                "[benchmarks.script] command: {program} is not on PATH (give its path, e.g. ./{program})"
            ))
        })
}

impl Script {
    /// The process id of the script, once launched.
    pub fn pid(&self) -> Option<u32> {
        self.run.workload().map(Workload::pid)
    }

    /// The output folder (captured standard output and error), once
    /// launched.
    pub fn output_path(&self) -> Option<&Path> {
        self.run.output().map(OutputDir::path)
    }

    fn program(&self) -> &str {
        self.settings.command.first().map_or("", String::as_str)
    }
}

impl BenchmarkImpl for Script {
    const NAME: &'static str = "script";
    const DESCRIPTION: &'static str =
        "Any executable the user names; its standard output is one JSON performance indicator";

    type Settings = ScriptSettings;

    fn create(args: &StartArgs, settings: ScriptSettings) -> Result<Self> {
        let timeout = parse_timeout(&settings.timeout)
            .map_err(|e| Error::config(format!("[benchmarks.script] timeout = {e}")))?;
        let env = parameter_env(&settings.parameters)?;
        Ok(Self {
            settings,
            timeout,
            env,
            run: Run::new(Self::NAME, args),
            started: None,
            timed_out: false,
        })
    }

    fn is_configured(&self) -> Result<()> {
        if self.settings.command.is_empty() {
            return Err(Error::config(
                "set [benchmarks.script] command to the program and its arguments, e.g. command = [\"./bench.sh\", \"--fast\"]",
            ));
        }
        resolve(self.program()).map(|_| ())
    }

    fn setup(&mut self) -> Result<()> {
        self.run.prepare(&self.settings.machine)
    }

    fn launch(&mut self) -> Result<()> {
        let program = resolve(self.program())?;
        let what = format!("script {}", self.program());
        let out = self.run.output_dir()?;
        let mut cmd = Command::new(program);
        cmd.args(&self.settings.command[1..])
            .envs(&self.env)
            .env("KML_OUTPUT_DIR", out.path());
        self.run.start_captured(cmd, &what)?;
        self.started = Some(Instant::now());
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<i32>> {
        if self.timed_out {
            return Ok(Some(TIMEOUT_EXIT_CODE));
        }
        let code = self.run.poll()?;
        if code.is_some() {
            return Ok(code);
        }
        let over = match (self.timeout, self.started) {
            (Some(limit), Some(start)) => start.elapsed() >= limit,
            _ => false,
        };
        if over {
            self.timed_out = true;
            self.run.stop()?;
            return Ok(Some(TIMEOUT_EXIT_CODE));
        }
        Ok(None)
    }

    fn run(&mut self) -> &mut Run {
        &mut self.run
    }

    /// The script's indicator, from its standard output, with the
    /// configured `parameters` added to `@parameters` where the script did
    /// not report them itself.
    fn result(&self) -> Result<Option<serde_json::Value>> {
        let program = self.program();
        if self.timed_out {
            return Err(Error::new(format!(
                "script {program}: stopped after its timeout of {}, so it printed no complete result",
                self.settings.timeout
            )));
        }
        let work = self.run.finished(&format!("script {program}"))?;
        let stdout = work.read_stdout()?;
        let path = work
            .stdout_path()
            .map_or_else(String::new, |p| format!(" ({})", p.display()));
        let mut ind = Indicator::parse(&stdout).map_err(|e| {
            Error::new(format!(
                "script {program}: its standard output{path} is not a performance indicator: {e}"
            ))
        })?;
        for (key, value) in &self.settings.parameters {
            ind.parameters
                .entry(key.clone())
                .or_insert_with(|| value.clone());
        }
        let value = ind.to_value().map_err(|e| {
            Error::new(format!(
                "script {program}: its indicator with the configured parameters: {e}"
            ))
        })?;
        Ok(Some(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernmlops_plugin_testing::start_args;

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout(""), Ok(None));
        assert_eq!(parse_timeout("0s"), Ok(None));
        assert_eq!(parse_timeout("250ms"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(parse_timeout("1.5m"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(parse_timeout("2h"), Ok(Some(Duration::from_secs(7200))));
        assert!(parse_timeout("30")
            .expect_err("no unit")
            .contains("no unit"));
        assert!(parse_timeout("3d")
            .expect_err("unit")
            .contains("unknown unit"));
        assert!(parse_timeout("s").expect_err("number").contains("number"));
        // Longer than any duration: one error, no panic.
        for huge in [
            "100000000000000000000000s",
            "1e23s",
            "99999999999999999999h",
        ] {
            let e = parse_timeout(huge).expect_err(huge);
            assert!(!e.contains('\n') && e.contains(huge), "{huge}: {e}");
        }
        let e = Script::new(&start_args(r#"{"timeout": "soon"}"#))
            .err()
            .expect("bad timeout");
        assert!(
            e.message
                .starts_with("[benchmarks.script]: timeout = \"soon\""),
            "{e}"
        );
    }

    #[test]
    fn parameters_become_environment_variables() {
        let params: Map<String, Value> = serde_json::from_str(
            r#"{"size": 3, "mode": "fast", "block-size": "4k", "on": true, "list": [1, 2]}"#,
        )
        .expect("json");
        let env = parameter_env(&params).expect("env");
        assert_eq!(env["KML_PARAM_SIZE"], "3");
        assert_eq!(env["KML_PARAM_MODE"], "fast");
        assert_eq!(env["KML_PARAM_BLOCK_SIZE"], "4k");
        assert_eq!(env["KML_PARAM_ON"], "true");
        assert_eq!(env["KML_PARAM_LIST"], "[1,2]");
        let all: Value = serde_json::from_str(&env["KML_PARAMETERS"]).expect("json");
        assert_eq!(all, Value::Object(params));

        let clash: Map<String, Value> =
            serde_json::from_str(r#"{"block-size": 1, "block_size": 2}"#).expect("json");
        let e = parameter_env(&clash).expect_err("same variable");
        assert!(
            e.message.contains("KML_PARAM_BLOCK_SIZE") && e.message.contains("block-size"),
            "{e}"
        );
        let e = Script::new(&start_args(r#"{"parameters": {"a.b": 1, "a-b": 2}}"#))
            .err()
            .expect("clash");
        assert!(e.message.contains("KML_PARAM_A_B"), "{e}");
    }

    #[test]
    fn command_is_required_and_must_run() {
        let s = Script::new(&start_args("{}")).expect("defaults");
        let e = s.is_configured().expect_err("no command");
        assert!(
            e.message.starts_with("set [benchmarks.script] command"),
            "{e}"
        );
        let plain = std::env::temp_dir().join(format!("kml-script-plain-{}", std::process::id()));
        std::fs::write(&plain, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let plain_name = plain.to_str().expect("utf8").to_owned();
        for (command, needle) in [
            ("/no/such/script-kml.sh", "does not exist"),
            (plain_name.as_str(), "is not an executable file"),
            ("no-such-program-kml", "is not on PATH"),
        ] {
            let s = Script::new(&start_args(&format!(r#"{{"command": ["{command}"]}}"#)))
                .expect("settings");
            let e = s.is_configured().expect_err(command);
            assert!(e.message.contains(needle), "{command}: {e}");
        }
        std::fs::remove_file(&plain).expect("clean up");
        let s = Script::new(&start_args(r#"{"command": ["sh", "-c", "true"]}"#)).expect("sh");
        s.is_configured().expect("sh is on PATH");
    }
}
