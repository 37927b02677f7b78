//! Job steps inside the Slurm job a run is carried out in: the one place
//! the `srun` command line of a step is written, for a role started on its
//! own node of the job (`roles_run::Placement`) and for the `[build]` run
//! on every node of it (`build::on_every_node_of_job`).
//!
//! A step runs as a task of the job's allocation, so it needs no
//! partition, time or account of its own; `--export=ALL` hands it this
//! process's environment (the job's `SLURM_*` variables, the roles'
//! addresses), and `--disable-status` keeps a Ctrl+C at srun a plain
//! signal forwarded to the task instead of a status query.

use std::process::Command;

/// Which nodes of the job a step's tasks run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// One task on the job's node with this index (from 0, in the order of
    /// the job's node list).
    Node(usize),
    /// One task on each of the job's first `n` nodes.
    Each(u32),
}

/// The `srun` command that starts `cmd` (its program, arguments,
/// environment additions and working folder) as a step named `name` of
/// the current job, on the nodes `span` says.
pub fn step(name: &str, span: Span, cmd: &Command) -> Command {
    step_with(name, span, &[], cmd)
}

/// [`step`] with further srun `options` (`--label`), given after the
/// span's.
pub fn step_with(name: &str, span: Span, options: &[&str], cmd: &Command) -> Command {
    let mut srun = Command::new("srun");
    srun.arg("--disable-status");
    match span {
        Span::Node(index) => srun.args([
            "--nodes=1".to_owned(),
            "--ntasks=1".to_owned(),
            format!("--relative={index}"),
        ]),
        Span::Each(n) => srun.args([
            format!("--nodes={n}"),
            format!("--ntasks={n}"),
            "--ntasks-per-node=1".to_owned(),
        ]),
    };
    srun.args(options)
        .args([format!("--job-name={name}"), "--export=ALL".to_owned()])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    // What the caller set on the command is carried over: srun passes its
    // own environment (--export=ALL) and folder to the task.
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => srun.env(key, v),
            None => srun.env_remove(key),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        srun.current_dir(dir);
    }
    srun
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::shown;

    #[test]
    fn a_step_on_one_node_or_on_each() {
        let mut cmd = Command::new("/bin/kernmlops");
        cmd.args(["run", "--benchmark", "script"])
            .env("KML_X", "1")
            .current_dir("/tmp");
        let one = step("kml-role-client", Span::Node(1), &cmd);
        assert_eq!(
            shown(&one),
            "srun --disable-status --nodes=1 --ntasks=1 --relative=1 --job-name=kml-role-client --export=ALL /bin/kernmlops run --benchmark script"
        );
        let envs: Vec<_> = one.get_envs().collect();
        assert_eq!(envs, [("KML_X".as_ref(), Some("1".as_ref()))]);
        assert_eq!(one.get_current_dir(), Some("/tmp".as_ref()));
        let each = step("kml-build", Span::Each(3), &Command::new("/bin/true"));
        assert_eq!(
            shown(&each),
            "srun --disable-status --nodes=3 --ntasks=3 --ntasks-per-node=1 --job-name=kml-build --export=ALL /bin/true"
        );
    }
}
