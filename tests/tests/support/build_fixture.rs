//! What the `[build]` tests (`build.rs`, `build_slurm.rs`) build: a tool
//! "compiled" from `bench/tool.in` by `bench/make.sh` into
//! `out/<node>/tool` (the node that built it is written into it, so a run
//! shows whose build it used), each build counted by a line in `builds`;
//! an experiment of one script benchmark that runs it.

// Each test file uses the part it needs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kernmlops_e2e::*;

/// The build: `bench/tool.in` with `@NODE@` replaced by this node's host
/// name, as `out/<node>/tool` (put in place whole, so a node never runs a
/// half-written tool); the node appended to `builds`. Nodes building at
/// once in one shared folder each write their own files only.
pub const MAKE: &str = r#"#!/bin/sh
set -eu
node=$(cat /proc/sys/kernel/hostname)
mkdir -p "out/$node"
sed "s/@NODE@/$node/" bench/tool.in > "out/$node/tool.new"
chmod +x "out/$node/tool.new"
mv "out/$node/tool.new" "out/$node/tool"
echo "$node" >> builds
"#;

/// A script that runs this node's built tool (which prints the
/// indicator), from the folder the script is in.
pub const USE: &str = r#"#!/bin/sh
exec "$(dirname "$0")/out/$(cat /proc/sys/kernel/hostname)/tool"
"#;

/// The tool's source: prints an indicator with `value` and the node it
/// was built on.
pub fn tool(value: u32) -> String {
    format!(
        "#!/bin/sh\necho '{{\"name\": \"built_tool\", \"component\": \"tool\", \"@result\": {{\"value\": {value}, \"built_on\": \"@NODE@\"}}}}'\n"
    )
}

/// `work/bench/` with `make.sh` and `tool.in` (the tool printing `value`).
pub fn bench(work: &Path, value: u32) {
    std::fs::create_dir_all(work.join("bench")).expect("bench");
    write_exec(&work.join("bench/make.sh"), MAKE);
    std::fs::write(work.join("bench/tool.in"), tool(value)).expect("tool.in");
}

/// The `[build]` table of an experiment file: `commands` (a TOML array)
/// with `bench/` as the inputs.
pub fn build_table(commands: &str) -> String {
    format!("[build]\ncommands = {commands}\ninputs = [\"bench\"]\n")
}

/// An experiment file `work/NAME.toml` of `repeats` runs of one script
/// benchmark running the built tool through `use.sh` (which is written
/// too), the tool printing `value`, with a `[build]` of `commands`.
pub fn one_benchmark(work: &Path, name: &str, commands: &str, value: u32) -> PathBuf {
    bench(work, value);
    write_exec(&work.join("use.sh"), USE);
    let file = work.join(format!("{name}.toml"));
    std::fs::write(
        &file,
        format!(
            "name = \"{name}\"\nbenchmark = \"script\"\nprobes = []\nrepeats = 2\nseed = 1\n{}\
             [config.benchmarks.script]\ncommand = [\"./use.sh\"]\ndrop_page_cache = false\n",
            build_table(commands)
        ),
    )
    .expect("experiment file");
    file
}

/// The nodes that built, one per build, in order.
pub fn builds(work: &Path) -> Vec<String> {
    std::fs::read_to_string(work.join("builds"))
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// `(runs, skips)` of a node's build record, `build/<node>.json`.
pub fn counts(dir: &Path, node: &str) -> (u64, u64) {
    let r = read_json(&dir.join("build").join(format!("{node}.json")));
    assert_eq!(r["node"], node, "{r}");
    (
        r["runs"].as_u64().expect("runs"),
        r["skips"].as_u64().expect("skips"),
    )
}
