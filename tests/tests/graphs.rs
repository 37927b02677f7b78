//! Graphs rendered in-process (through the graphs plugin's rlib) from a real
//! collection: every kind writes a PNG of 1200x600 that is not a blank
//! image, and an SVG.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use graphs::{BlockIo, MemoryUsage, PerfCounters, QuantaQueued, QuantaRuntime};
use kernmlops_e2e::*;
use kernmlops_plugin_sdk::{graph::GraphData, GraphImpl};
use kernmlops_plugin_testing::start_args;

const CONFIG: &str = "[probes.memory_usage]\ninterval = \"100ms\"\n\n\
                      [probes.perf]\ncounters = [\"page_faults\", \"context_switches\"]\n\
                      frequency_hz = 20.0\n";

/// Writes and fsyncs a file a few times, so block_io sees requests.
fn disk_io(dir: &Path) {
    let path = dir.join("graphs-io.bin");
    let chunk = vec![0x5au8; 1 << 20];
    let until = Instant::now() + Duration::from_secs(2);
    let mut round = 0u8;
    while Instant::now() < until {
        let mut f = std::fs::File::create(&path).expect("creating I/O file");
        for _ in 0..4 {
            f.write_all(&chunk).expect("writing I/O file");
        }
        f.write_all(&[round]).expect("writing I/O file");
        f.sync_all().expect("fsync");
        round = round.wrapping_add(1);
        std::thread::sleep(Duration::from_millis(150));
    }
    let _ = std::fs::remove_file(&path);
}

/// Collects quanta_runtime, memory_usage, block_io and perf for a few
/// seconds with disk I/O going on; returns the collection folder.
fn collect() -> PathBuf {
    let plugins = plugin_dir(
        "graphs",
        &[
            ("quanta_runtime", "quanta_runtime"),
            ("memory_usage", "memory_usage"),
            ("block_io", "block_io"),
            ("perf", "perf"),
        ],
    );
    let output = temp_dir("graphs-out");
    let config = temp_dir("graphs-config").join("kernmlops.toml");
    std::fs::write(&config, CONFIG).expect("writing config");
    let c = Collector::start(&[
        "--config",
        config.to_str().expect("utf8"),
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "quanta_runtime,memory_usage,block_io,perf",
        "--duration",
        "4s",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    disk_io(&temp_dir("graphs-io"));
    let done = c.wait();
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    done.dir.expect("collection folder printed")
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 24, "PNG too short");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |o: usize| u32::from_be_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    (be(16), be(20))
}

/// How many distinct pixel values the decoded PNG holds.
fn distinct_pixels(path: &Path) -> usize {
    let decoder = png::Decoder::new(std::fs::File::open(path).expect("opening PNG"));
    let mut reader = decoder.read_info().expect("PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    let px = info.color_type.samples() * usize::from(info.bit_depth as u8).div_ceil(8);
    let mut seen = std::collections::HashSet::new();
    for p in buf[..info.buffer_size()].chunks(px) {
        seen.insert(p.to_vec());
    }
    seen.len()
}

/// Checks the files one graph wrote: pairs of PNG and SVG, PNG 1200x600 with
/// more than a background and a few lines' colors.
fn check_files(graph: &str, files: &[PathBuf], figures: usize) {
    let pngs: Vec<&PathBuf> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "png"))
        .collect();
    let svgs: Vec<&PathBuf> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "svg"))
        .collect();
    assert_eq!(pngs.len(), figures, "{graph}: PNGs {files:?}");
    assert_eq!(svgs.len(), figures, "{graph}: SVGs {files:?}");
    for png in pngs {
        let bytes = std::fs::read(png).expect("reading PNG");
        assert_eq!(png_size(&bytes), (1200, 600), "{}", png.display());
        let colors = distinct_pixels(png);
        // Text is anti-aliased: a real figure has many shades.
        assert!(colors > 20, "{}: only {colors} colors", png.display());
        let svg = png.with_extension("svg");
        let text = std::fs::read_to_string(&svg).expect("reading SVG");
        assert!(
            text.starts_with("<svg") || text.starts_with("<?xml"),
            "{}: not an SVG",
            svg.display()
        );
        assert!(text.len() > 1000, "{}: SVG too small", svg.display());
    }
}

/// Renders `G` in-process from what the host would hand it for `dir`
/// (nothing when its tables are not there).
fn render<G: GraphImpl>(dir: &Path, out: &Path) -> Vec<PathBuf> {
    let Some(tables) = kernmlops::graph::tables_matching(G::TABLES, G::TABLES_WITH_COLUMNS, dir)
        .expect("listing tables")
    else {
        return Vec::new();
    };
    let input = kernmlops::graph::collection_input(dir, &tables).expect("reading tables");
    std::fs::create_dir_all(out).expect("creating graph folder");
    let mut g = G::new(&start_args("{}")).expect("creating graph");
    let files = g.render(GraphData::new(&input), out).expect("rendering");
    for f in &files {
        assert!(
            f.starts_with(out),
            "{} outside {}",
            f.display(),
            out.display()
        );
        assert!(std::fs::metadata(f).expect("written file").len() > 0);
    }
    files
}

/// One real collection, every graph kind rendered from it.
#[test]
fn root_graphs_render_from_real_collection() {
    if !require_root("root_graphs_render_from_real_collection") {
        return;
    }
    let dir = {
        let _serial = serial();
        collect()
    };
    for table in [
        "quanta_runtime",
        "quanta_queued_time",
        "memory_usage",
        "block_io",
        "page_faults",
        "context_switches",
    ] {
        assert!(
            dir.join(format!("{table}.arrow")).is_file(),
            "collection lacks {table}"
        );
    }
    let out = dir.join("graphs");
    check_files("quanta_runtime", &render::<QuantaRuntime>(&dir, &out), 1);
    check_files("quanta_queued_time", &render::<QuantaQueued>(&dir, &out), 1);
    check_files("memory_usage", &render::<MemoryUsage>(&dir, &out), 1);
    check_files("block_io", &render::<BlockIo>(&dir, &out), 1);
    // Two counters, two figures each.
    check_files("perf_counters", &render::<PerfCounters>(&dir, &out), 4);
    eprintln!("graphs in {}", out.display());
}

/// A collection without perf tables: perf_counters renders nothing.
#[test]
fn perf_counters_without_perf_tables_render_nothing() {
    let dir = temp_dir("graphs-noperf");
    std::fs::write(
        dir.join("manifest.json"),
        r#"{"collection_id":"x","benchmark":null,"start":{"uptime_us":1}}"#,
    )
    .expect("writing manifest");
    // The host does not offer it...
    let tables =
        kernmlops::graph::tables_matching(&[], graphs_columns(), &dir).expect("listing tables");
    assert!(tables.is_none(), "{tables:?}");
    // ...and given no tables it draws nothing.
    let input = kernmlops::graph::collection_input(&dir, &[]).expect("reading manifest");
    let mut g = PerfCounters::new(&start_args("{}")).expect("creating graph");
    let files = g
        .render(GraphData::new(&input), &dir.join("graphs"))
        .expect("rendering");
    assert!(files.is_empty(), "{files:?}");
}

fn graphs_columns() -> &'static [&'static str] {
    <PerfCounters as GraphImpl>::TABLES_WITH_COLUMNS
}

/// `kernmlops run --graphs` renders the collection's graphs through the
/// host, loading the graphs plugin like any other.
#[test]
fn root_run_with_graphs_writes_png_and_svg() {
    if !require_root("root_run_with_graphs_writes_png_and_svg") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir(
        "host-graphs",
        &[("quanta_runtime", "quanta_runtime"), ("graphs", "graphs")],
    );
    let output = temp_dir("host-graphs-out");
    let out = kernmlops(&[
        "run",
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "quanta_runtime",
        "--duration",
        "1s",
        "--graphs",
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for graph in ["quanta_runtime", "quanta_queued_time"] {
        let files: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("graph {graph}: ")))
            .collect();
        assert!(
            files.iter().any(|f| f.ends_with(".png")) && files.iter().any(|f| f.ends_with(".svg")),
            "{graph}: no PNG and SVG reported:\n{stdout}"
        );
        for f in files {
            let len = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
            assert!(len > 1000, "{f} is empty or tiny ({len} bytes)");
        }
    }
    assert!(
        !stdout.contains("graph memory_usage"),
        "graphs whose tables are absent are not drawn:\n{stdout}"
    );
}

/// Renders `G` in-process with its settings as `config_json`.
fn render_with<G: GraphImpl>(dir: &Path, out: &Path, config_json: &str) -> Vec<PathBuf> {
    let tables = kernmlops::graph::tables_matching(G::TABLES, G::TABLES_WITH_COLUMNS, dir)
        .expect("listing tables")
        .expect("the graph applies");
    let input = kernmlops::graph::collection_input(dir, &tables).expect("reading tables");
    let mut g = G::new(&start_args(config_json)).expect("creating graph");
    g.render(GraphData::new(&input), out).expect("rendering")
}

/// A real `trace` collection (sched_switch, and sys_enter_write under
/// writes of two sizes): the host offers the trace graph exactly the
/// tables the manifest gives the trace probe; each gets a rate figure and,
/// for the column named by the `field` setting, a distribution figure
/// (valid PNG and SVG); per CPU, the plotted rate over its bins adds up to
/// the table's own row count.
#[test]
fn root_trace_graphs_draw_every_trace_table() {
    use graphs::trace::{bin_us, event_rate, TraceTables};
    if !require_root("root_trace_graphs_draw_every_trace_table") {
        return;
    }
    let dir = {
        let _serial = serial();
        let plugins = plugin_dir("graphs-trace", &[("trace", "trace")]);
        let output = temp_dir("graphs-trace-out");
        let c = Collector::start(&[
            "--trace",
            "sched:sched_switch",
            "--trace",
            "syscalls:sys_enter_write",
            "--plugin-dir",
            plugins.to_str().expect("utf8"),
            "--plugins",
            "trace",
            "--duration",
            "3s",
            "--output",
            output.to_str().expect("utf8"),
        ]);
        disk_io(&temp_dir("graphs-trace-io"));
        let done = c.wait();
        assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
        done.dir.expect("collection folder printed")
    };
    let tables = kernmlops::graph::tables_matching(TraceTables::TABLES, &[], &dir)
        .expect("listing tables")
        .expect("the trace graph applies");
    assert_eq!(tables, ["sched_switch", "sys_enter_write"]);

    let out = dir.join("graphs");
    let files = render_with::<TraceTables>(&dir, &out, r#"{"field": "count"}"#);
    // Two rates, and the distribution of sys_enter_write's count.
    check_files("trace", &files, 3);
    for stem in [
        "trace_sched_switch_rate",
        "trace_sys_enter_write_rate",
        "trace_sys_enter_write_count",
    ] {
        assert!(
            out.join(format!("{stem}.png")).is_file() && out.join(format!("{stem}.svg")).is_file(),
            "{stem}: {files:?}"
        );
    }
    // Without a setting the field is latency_ns, which neither table has.
    let plain = temp_dir("graphs-trace-plain");
    check_files("trace", &render_with::<TraceTables>(&dir, &plain, "{}"), 2);
    // A field that is not a column name, or that no table has, is one
    // clear error.
    assert!(TraceTables::new(&start_args(r#"{"field": "../x"}"#)).is_err());
    let tables_read = kernmlops::graph::collection_input(&dir, &tables).expect("reading tables");
    let e = TraceTables::new(&start_args(r#"{"field": "nosuch"}"#))
        .expect("a column name")
        .render(GraphData::new(&tables_read), &plain)
        .expect_err("no table has it");
    assert!(
        e.to_string().contains("no trace table has a column nosuch"),
        "{e}"
    );

    let m = manifest(&dir);
    for table in &tables {
        let batches = read_table(&dir.join(format!("{table}.arrow")));
        let ts = column_u64(&batches, "ts_uptime_us");
        let cpu = column_u64(&batches, "cpu");
        assert_eq!(m["tables"][table]["rows"].as_u64(), Some(ts.len() as u64));
        assert!(ts.len() > 10, "{table}: {} rows", ts.len());
        let bin = bin_us(&ts);
        let rates = event_rate(&ts, &cpu, bin);
        let mut total = 0u64;
        for (c, points) in &rates {
            let plotted: f64 = points.iter().map(|(_, r)| r * bin as f64 / 1e6).sum();
            let rows = cpu.iter().filter(|x| *x == c).count();
            assert!(
                (plotted - rows as f64).abs() < 1e-6,
                "{table} cpu {c}: plotted {plotted} events, table {rows}"
            );
            // Every bin of the table's span is drawn, so the line shows
            // quiet periods as zero.
            let span =
                (ts.iter().max().expect("rows") / bin) - (ts.iter().min().expect("rows") / bin) + 1;
            assert_eq!(points.len() as u64, span, "{table} cpu {c}");
            total += rows as u64;
        }
        assert_eq!(total, ts.len() as u64, "{table}: every row on some CPU");
    }
}
