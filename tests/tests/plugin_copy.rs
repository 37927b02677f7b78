//! Plugins run from a private sealed copy of the bytes that passed the
//! checks: overwriting a loaded plugin's file in place (`cp` of another
//! plugin's bytes over it, truncation) during a run changes nothing under
//! the running collector, and the manifest's SHA-256 is that of the bytes
//! loaded.

use std::{path::Path, process::Command, time::Duration};

use kernmlops_e2e::*;

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("running sha256sum");
    assert!(out.status.success(), "sha256sum {}", path.display());
    text(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_owned()
}

/// Overwritten in place (not replaced by a rename): the open file's own
/// bytes change, as `cp` over it does.
fn overwrite_in_place(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .expect("opening the plugin for writing");
    f.write_all(bytes).expect("overwriting the plugin");
}

#[test]
fn root_plugins_overwritten_in_place_during_a_run_change_nothing() {
    if !require_root("root_plugins_overwritten_in_place_during_a_run_change_nothing") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "overwrite",
        &[
            ("fixture_faulty", "faulty"),
            ("quanta_runtime", "quanta_runtime"),
            ("fixture_hang", "hang"),
        ],
    );
    let (faulty, quanta) = (plugins.join("faulty.so"), plugins.join("quanta_runtime.so"));
    let digests = [
        ("fixture_faulty", sha256(&faulty)),
        ("quanta_runtime", sha256(&quanta)),
    ];
    let output = temp_dir("overwrite-out");
    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "ticker,quanta_runtime",
        "--duration",
        "4s",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    std::thread::sleep(Duration::from_millis(1000));
    // Another plugin's bytes over the ticker's plugin, as `cp` does it.
    let other = std::fs::read(plugins.join("hang.so")).expect("reading hang.so");
    overwrite_in_place(&faulty, &other);
    std::thread::sleep(Duration::from_millis(500));
    // The probe draining every context switch loses its file's pages.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&quanta)
        .and_then(|f| f.set_len(1000))
        .expect("truncating quanta_runtime.so");
    std::thread::sleep(Duration::from_millis(500));
    overwrite_in_place(&quanta, &[0xcc; 4096]);
    let done = c.wait();
    assert!(
        done.status.success(),
        "the run survives its plugin files being overwritten ({}):\n{}",
        done.status,
        done.stderr
    );
    let dir = done.dir.expect("collection folder printed");
    let man = manifest(&dir);
    assert_eq!(man["status"], "complete", "{man}");
    for table in ["ticker", "quanta_runtime"] {
        let rows = man["tables"][table]["rows"].as_u64().expect("rows");
        assert!(rows > 0, "{table} has rows");
        let read: usize = read_table(&dir.join(format!("{table}.arrow")))
            .iter()
            .map(|b| b.num_rows())
            .sum();
        assert_eq!(read as u64, rows, "{table}: rows on disk");
    }
    // Rows kept coming after the files changed: the ticker drains every
    // 10 ms, so its last row is within a drain of the end.
    let ts = column_u64(&read_table(&dir.join("ticker.arrow")), "ts_uptime_us");
    let span = ts.iter().max().expect("rows") - ts.iter().min().expect("rows");
    assert!(
        span > 3_500_000,
        "the ticker ran the whole 4 s: {span} us of rows"
    );
    // The digests are those of the bytes loaded, not of the files now.
    for (plugin, digest) in &digests {
        let entry = man["plugins"]
            .as_array()
            .expect("plugins")
            .iter()
            .find(|p| p["name"] == *plugin)
            .unwrap_or_else(|| panic!("{plugin} in the manifest: {man}"));
        assert_eq!(entry["sha256"], *digest.as_str(), "{plugin}");
    }
}
