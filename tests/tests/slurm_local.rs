//! `scripts/slurm-local up --nodes 2`: a Slurm cluster of two nodes on this
//! machine, each slurmd in its own network and host-name namespace on a
//! private bridge. Jobs see two host names and two addresses, a batch job
//! on node 1 reaches node 2 with srun, a server on
//! one node answers a client on the other over the bridge, and `down`
//! leaves no namespace, link, daemon or file, also after an `up` that
//! failed or was killed part way. Experiment files with bad roles are one
//! error line each against it, with nothing submitted or written.

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use kernmlops_e2e::*;

#[path = "support/slurm_cluster.rs"]
mod slurm_cluster;
use slurm_cluster::{require, Cluster, Place};

fn host_name() -> String {
    let out = Command::new("hostname")
        .arg("-s")
        .output()
        .expect("hostname");
    text(&out.stdout).trim().to_owned()
}

/// The host's own IPv4 addresses (`ip -4 -o addr show`, as `a.b.c.d/n`).
fn host_addresses() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("ip addr");
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_owned))
        .collect()
}

#[test]
fn root_slurm_local_two_nodes_have_own_names_and_addresses_and_talk_over_the_bridge() {
    let test = "root_slurm_local_two_nodes_have_own_names_and_addresses_and_talk_over_the_bridge";
    if !require(test) {
        return;
    }
    let _serial = serial();
    let cluster = Cluster::up(2);
    let net = cluster.place.net.clone();

    // Two idle nodes.
    let nodes = cluster.ok("sinfo", &["--noheader", "--Node", "--format=%N %t"]);
    let mut nodes: Vec<&str> = nodes.lines().map(str::trim).collect();
    nodes.sort();
    assert_eq!(nodes, ["kml-n1 idle", "kml-n2 idle"]);
    let out = cluster.place.script(&["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("kml-n[1-2]"),
        "{}",
        text(&out.stdout)
    );

    // A job on both nodes sees two host names, neither the host's.
    let names = cluster.ok("srun", &["-N2", "--exclusive", "hostname"]);
    let mut names: Vec<&str> = names.lines().map(str::trim).collect();
    names.sort();
    assert_eq!(names, ["kml-n1", "kml-n2"]);
    assert!(!names.contains(&host_name().as_str()));

    // `exec` runs a command in a node's namespaces.
    let out = cluster.place.script(&[
        "exec",
        "kml-n2",
        "sh",
        "-c",
        "hostname; ip -4 -o addr show dev eth0",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen = text(&out.stdout);
    assert!(
        seen.starts_with("kml-n2\n") && seen.contains(&format!(" {net}.2/24 ")),
        "{seen}"
    );

    // A batch job of two nodes runs its script on the first and reaches
    // the second with srun from there (from inside node 1's namespaces).
    let batch = temp_dir("slurm-local-batch");
    std::fs::write(
        batch.join("job.sh"),
        "#!/bin/sh\necho \"batch on $(hostname)\"\nsrun --nodes=2 --ntasks=2 hostname | sort\n",
    )
    .expect("batch script");
    let output = batch.join("job.log");
    cluster.ok(
        "sbatch",
        &[
            "--wait",
            "--nodes=2",
            "--exclusive",
            &format!("--output={}", output.display()),
            &format!("--chdir={}", batch.display()),
            s(&batch.join("job.sh")),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(&output).expect("job output"),
        "batch on kml-n1\nkml-n1\nkml-n2\n"
    );

    // Each node has its own bridge address (and loopback) and no default
    // route; the host has only the bridge's host side in that /24.
    let script = "h=$(hostname); ip -4 -o addr show | while read -r _ dev _ addr _; do echo \"$h addr $dev $addr\"; done; ip -4 route | sed \"s/^/$h route /\"";
    let seen = cluster.ok("srun", &["-N2", "--exclusive", "sh", "-c", script]);
    for i in [1, 2] {
        let node = format!("kml-n{i}");
        let mut addrs: Vec<String> = seen
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{node} addr ")))
            .map(str::to_owned)
            .collect();
        addrs.sort();
        assert_eq!(
            addrs,
            [format!("eth0 {net}.{i}/24"), "lo 127.0.0.1/8".to_owned()],
            "{seen}"
        );
        let routes: Vec<&str> = seen
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{node} route ")))
            .collect();
        assert_eq!(routes.len(), 1, "{seen}");
        assert!(
            routes[0].starts_with(&format!("{net}.0/24 dev eth0")),
            "{seen}"
        );
    }
    let on_host: Vec<String> = host_addresses()
        .into_iter()
        .filter(|a| a.starts_with(&format!("{net}.")))
        .collect();
    assert_eq!(on_host, [format!("{net}.254/24")]);

    // A web server on node 1, at node 1's address, serves a file to a
    // client on node 2: the only way between them is the bridge.
    let work = temp_dir("slurm-local-tcp");
    let token = format!("token-{}", std::process::id());
    std::fs::write(work.join("token"), &token).expect("token file");
    let server_log = work.join("server.log");
    let log = std::fs::File::create(&server_log).expect("server log");
    let mut server = Command::new("srun")
        .args([
            "-N1",
            "-w",
            "kml-n1",
            "python3",
            "-u",
            "-m",
            "http.server",
            "18080",
        ])
        .arg("--bind")
        .arg(format!("{net}.1"))
        .arg("--directory")
        .arg(&work)
        .env("SLURM_CONF", cluster.place.conf())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("srun the server");
    let client = format!(
        "import socket, urllib.request\n\
         body = urllib.request.urlopen('http://{net}.1:18080/token', timeout=5).read().decode()\n\
         print(socket.gethostname(), body)\n"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        let out = cluster.tool("srun", &["-N1", "-w", "kml-n2", "python3", "-c", &client]);
        if out.status.success() {
            break text(&out.stdout);
        }
        assert!(
            Instant::now() < deadline,
            "no answer from node 1 in 60 s: {}\nserver: {}",
            text(&out.stderr),
            std::fs::read_to_string(&server_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(answer.trim(), format!("kml-n2 {token}"));
    // The server's log line travels from its node to its srun after the
    // answer: wait for it before stopping the server.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&server_log)
        .unwrap_or_default()
        .contains("GET /token")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill with a child's pid and a signal has no preconditions.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the server's srun did not end");
        std::thread::sleep(Duration::from_millis(100));
    }
    let served = std::fs::read_to_string(&server_log).expect("server log");
    assert!(
        served.contains(&format!("{net}.2 - - ")) && served.contains("GET /token"),
        "the request came from node 2's address: {served}"
    );

    // Down leaves nothing: no namespace, bridge, veth, daemon or file.
    let place = Place {
        dir: cluster.place.dir.clone(),
        port: cluster.place.port,
        net: net.clone(),
    };
    assert!(
        !place.leftovers().is_empty(),
        "the cluster is seen while up"
    );
    drop(cluster);
    assert_eq!(place.leftovers(), Vec::<String>::new());
    let out = place.script(&["status"]);
    assert!(!out.status.success(), "status after down says not up");
}

#[test]
fn root_slurm_local_down_after_a_failed_or_killed_up_leaves_nothing() {
    let test = "root_slurm_local_down_after_a_failed_or_killed_up_leaves_nothing";
    if !require(test) {
        return;
    }
    let _serial = serial();

    // Node 1's slurmd does not start (a slurmd earlier in PATH that fails,
    // except for `slurmd -C`): up fails after making the bridge, the
    // namespaces, munged and slurmctld, and removes all of it.
    let place = Place::new();
    let work = temp_dir("slurm-local-partial");
    let real = Command::new("sh")
        .args(["-c", "command -v slurmd"])
        .output()
        .expect("command -v");
    let real = text(&real.stdout).trim().to_owned();
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).expect("bin folder");
    std::fs::write(
        bin.join("slurmd"),
        format!(
            "#!/bin/sh\ncase \"$1\" in -C) exec {real} -C ;; esac\necho 'slurmd: refusing to start' >&2\nexit 1\n"
        ),
    )
    .expect("slurmd wrapper");
    std::fs::set_permissions(
        bin.join("slurmd"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = place
        .script_command(&["up", "--nodes", "2"])
        .env("PATH", &path)
        .output()
        .expect("slurm-local up");
    let left = place.leftovers();
    // Clean up before asserting, whatever happened.
    if !left.is_empty() || out.status.success() {
        let _ = place.script(&["down"]);
    }
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "up with a failing slurmd: {stderr}");
    assert!(
        stderr.contains("start-up failed") && stderr.contains("stopping slurmctld"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("down; removed {}", place.dir.display())),
        "{stderr}"
    );
    assert_eq!(left, Vec::<String>::new(), "{stderr}");

    // Up killed part way (once its bridge exists), then down: nothing left.
    let place = Place::new();
    let mut up = place
        .script_command(&["up", "--nodes", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("slurm-local up");
    let bridge = format!("kml{}br", place.port);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new("ip")
            .args(["link", "show", &bridge])
            .output()
            .expect("ip link");
        if out.status.success() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    up.kill().expect("SIGKILL up");
    up.wait().expect("wait");
    let partial = place.leftovers();
    let out = place.script(&["down"]);
    let left = place.leftovers();
    assert!(
        partial.iter().any(|l| *l == format!("link {bridge}")),
        "killed after its bridge was made: {partial:?}"
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(left, Vec::<String>::new(), "after down of {partial:?}");
    // Down again: nothing to do.
    let out = place.script(&["down"]);
    assert!(out.status.success());
    assert!(text(&out.stderr).contains("nothing to stop"));
}

/// One `error:` line on stderr, nothing else.
fn one_error_line(out: &Output) -> String {
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "expected a failure:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn root_slurm_local_bad_role_files_are_one_error_line_each_with_nothing_submitted() {
    let test = "root_slurm_local_bad_role_files_are_one_error_line_each_with_nothing_submitted";
    if !require(test) {
        return;
    }
    let _serial = serial();
    let work = temp_dir("slurm-local-roles");
    let plugins = work.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin folder");
    let cluster = Cluster::up(2);
    let server = "[roles.server]\nbenchmark = \"redis_server\"\nprobes = [\"quanta_runtime\"]\n";
    let client = "[roles.client]\nbenchmark = \"script\"\nscript = \"load.sh\"\nprobes = []\nafter = \"server\"\nresult = true\n";
    let cases = [
        (
            "cycle",
            format!(
                "{server}after = \"client\"\n{client}"
            ),
            "roles.server.after: the roles wait for each other in a cycle (server -> client -> server)",
        ),
        (
            "unknown",
            format!("{server}{}", client.replace("\"server\"", "\"db\"")),
            "roles.client.after: \"db\" is not a role (roles: server, client)",
        ),
        (
            "two_results",
            format!("{server}result = true\n{client}"),
            "roles.client.result: 2 roles have result = true (server, client)",
        ),
        (
            "three_roles",
            format!("{server}{client}[roles.monitor]\nbenchmark = \"stress_ng\"\n"),
            "roles: 3 roles (server, client, monitor) need 3 nodes, but partition debug has 2",
        ),
    ];
    for (name, body, needle) in &cases {
        let file = work.join(format!("{name}.toml"));
        std::fs::write(&file, format!("name = \"{name}\"\nrepeats = 2\n{body}")).expect("file");
        let dir = work.join(format!("exp-{name}"));
        let out = Command::new(kernmlops_bin())
            .arg("--plugin-dir")
            .arg(&plugins)
            .args(["experiment", "run", s(&file), "--dir", s(&dir)])
            .args(["--executor", "slurm"])
            .env("SLURM_CONF", cluster.place.conf())
            .current_dir(&work)
            .output()
            .expect("kernmlops experiment run");
        let line = one_error_line(&out);
        assert!(
            line.starts_with(&format!("error: {}: ", file.display())) && line.contains(needle),
            "{name}: {line}"
        );
        assert!(!dir.exists(), "{name}: nothing written");
        assert_eq!(cluster.active_jobs(), Vec::<String>::new(), "{name}");
        assert_eq!(
            cluster.ok("squeue", &["--noheader", "--states=all", "--format=%i"]),
            "",
            "{name}: no job ever submitted"
        );
    }
    // The local executor does not count nodes (every role runs here): three
    // roles go on to the plugin checks, which this empty plugin folder
    // fails, in one line with nothing written.
    let file = work.join("three_roles.toml");
    let out = Command::new(kernmlops_bin())
        .arg("--plugin-dir")
        .arg(&plugins)
        .args([
            "experiment",
            "run",
            s(&file),
            "--dir",
            s(&work.join("exp-local")),
        ])
        .current_dir(&work)
        .output()
        .expect("kernmlops experiment run");
    let line = one_error_line(&out);
    assert!(
        line.contains("benchmark: unknown benchmark \"script\"") && !line.contains("nodes"),
        "{line}"
    );
    assert!(!work.join("exp-local").exists());
}
