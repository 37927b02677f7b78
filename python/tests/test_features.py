"""Windowed features checked against the rows: counts, sums, quantiles, alignment,
empty windows, perf scaling, running counters and history without look-ahead."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kernmlops
from crafted import field, write_collection

U64, U32 = pa.uint64(), pa.uint32()
EVERY = 100_000  # 100 ms


def event_table(rows: list[tuple[int, int, int]]):
    """(ts_us, tgid, latency_us) rows of an event table."""
    return (
        [
            field("ts_uptime_us", U64, "us", "when it ended (CLOCK_BOOTTIME)"),
            field("tgid", U32, None, "process id"),
            field("latency_us", U64, "us", "how long it took"),
        ],
        {
            "ts_uptime_us": [r[0] for r in rows],
            "tgid": [r[1] for r in rows],
            "latency_us": [r[2] for r in rows],
        },
        "One row per event",
    )


@pytest.fixture
def two_tables(tmp_path: Path) -> tuple[Path, list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    rng = random.Random(7)
    start, end = 1_000_050, 2_000_000  # not on a window boundary
    # Events in most windows, none between 1.4 s and 1.6 s (empty windows).
    a = sorted(
        (t, rng.choice([10, 11, 12]), rng.randint(1, 5000))
        for t in (rng.randint(start, end - 1) for _ in range(3000))
        if not 1_400_000 <= t < 1_600_000
    )
    b = sorted((rng.randint(start, end - 1), 10, rng.randint(1, 100)) for _ in range(500))
    write_collection(tmp_path, "c1", start, end, {"ev_a": event_table(a), "ev_b": event_table(b)})
    return tmp_path / "c1", a, b


def direct(rows, window):
    return [r for r in rows if window <= r[0] < window + EVERY]


def test_counts_sums_and_quantiles_equal_the_rows(two_tables) -> None:
    path, a, b = two_tables
    f = kernmlops.features(path, every="100ms")
    df = f.frame
    windows = df["window_start_us"].to_list()
    # Windows aligned to multiples of 100 ms, covering start to end, every one present.
    assert windows == list(range(1_000_000, 2_000_000, EVERY))
    assert (df["window_end_us"] - df["window_start_us"]).unique().to_list() == [EVERY]
    for row in df.iter_rows(named=True):
        w = row["window_start_us"]
        for name, rows in (("ev_a", a), ("ev_b", b)):
            got = direct(rows, w)
            assert row[f"{name}__count"] == len(got)
            assert row[f"{name}__rate_per_s"] == pytest.approx(len(got) / 0.1)
            lat = sorted(r[2] for r in got)
            assert row[f"{name}__latency_us__sum"] == sum(lat)
            if lat:
                assert row[f"{name}__latency_us__max"] == max(lat)
                assert row[f"{name}__latency_us__mean"] == pytest.approx(sum(lat) / len(lat))
                s = pl.Series(lat)
                assert row[f"{name}__latency_us__p90"] == s.quantile(0.9, interpolation="nearest")
                assert row[f"{name}__latency_us__p50"] == s.quantile(0.5, interpolation="nearest")
            else:
                # Empty windows are zeros, not missing rows.
                assert row[f"{name}__latency_us__mean"] == 0
                assert row[f"{name}__latency_us__p99"] == 0
    empty = df.filter((pl.col("window_start_us") >= 1_400_000) & (pl.col("window_start_us") < 1_600_000))
    assert empty.height == 2 and empty["ev_a__count"].to_list() == [0, 0]
    assert f.units["ev_a__latency_us__p99"] == "us"
    assert f.units["ev_a__count"] == "count"


def test_grouping_by_tgid_counts_each_process(two_tables) -> None:
    path, a, b = two_tables
    df = kernmlops.features(path, every="100ms", by="tgid").frame
    assert set(df["tgid"].unique().to_list()) == {10, 11, 12}
    # Every window is present for every process.
    assert df.height == 10 * 3
    for row in df.iter_rows(named=True):
        w, t = row["window_start_us"], row["tgid"]
        assert row["ev_a__count"] == sum(1 for r in direct(a, w) if r[1] == t)
        assert row["ev_b__count"] == sum(1 for r in direct(b, w) if r[1] == t)


def test_windows_align_across_collections_and_tables(tmp_path: Path) -> None:
    write_collection(tmp_path, "x", 5_030_000, 5_300_000, {"ev": event_table([(5_150_000, 1, 5)])})
    write_collection(tmp_path, "y", 7_099_999, 7_250_000, {"ev": event_table([(7_100_000, 1, 5)])})
    c = [kernmlops.open_collection(tmp_path / "x"), kernmlops.open_collection(tmp_path / "y")]
    df = kernmlops.features(c, every="100ms").frame
    assert df.filter(pl.col("collection_id") == "x")["window_start_us"].to_list() == [5_000_000, 5_100_000, 5_200_000]
    assert df.filter(pl.col("collection_id") == "y")["window_start_us"].to_list() == [7_000_000, 7_100_000, 7_200_000]
    assert df["ev__count"].to_list() == [0, 1, 0, 0, 1, 0]


def test_perf_counters_are_scaled_by_time_enabled_over_running(tmp_path: Path) -> None:
    # Two CPUs; CPU 1 is multiplexed half of the time in the second window.
    rows = [
        # ts, cpu, count, enabled, running
        (1_050_000, 0, 100, 50_000_000, 50_000_000),
        (1_050_000, 1, 10, 50_000_000, 50_000_000),
        (1_150_000, 0, 300, 150_000_000, 150_000_000),
        (1_150_000, 1, 60, 150_000_000, 100_000_000),  # +50 counted in 50 ms of 100 ms enabled
        (1_350_000, 0, 400, 350_000_000, 350_000_000),
    ]
    fields = [
        field("ts_uptime_us", U64, "us"),
        field("cpu", U32),
        field("count", U64, "count", "events counted on this CPU since the probe started"),
        field("time_enabled_ns", U64, "ns"),
        field("time_running_ns", U64, "ns"),
    ]
    cols = {f.name: [r[i] for r in rows] for i, f in enumerate(fields)}
    write_collection(tmp_path, "p", 1_000_000, 1_400_000, {"faults": (fields, cols, "page faults per CPU")})
    df = kernmlops.features(tmp_path / "p", every="100ms").frame
    assert df["faults__count__change"].to_list() == [110.0, 200.0 + 50 * 2, 0.0, 100.0]
    # The running total (unscaled) at each window's last row; kept through empty windows.
    assert df["faults__count__last"].to_list() == [110.0, 360.0, 360.0, 460.0]


def test_gauges_keep_their_last_value(tmp_path: Path) -> None:
    fields = [field("ts_uptime_us", U64, "us"), field("free_bytes", U64, "bytes", "MemFree")]
    cols = {"ts_uptime_us": [1_010_000, 1_020_000, 1_250_000], "free_bytes": [5, 7, 9]}
    write_collection(tmp_path, "g", 1_000_000, 1_400_000, {"mem": (fields, cols, "One row per sample of /proc/meminfo")})
    df = kernmlops.features(tmp_path / "g", every="100ms").frame
    assert df["mem__free_bytes__last"].to_list() == [7, 7, 9, 9]
    assert df["mem__count"].to_list() == [2, 0, 1, 0]


def test_history_never_uses_a_later_row(tmp_path: Path) -> None:
    rng = random.Random(3)
    n = 400
    frame = pl.DataFrame(
        {
            "collection_id": [rng.choice(["a", "b"]) for _ in range(n)],
            "device": [rng.choice([1, 2, 3]) for _ in range(n)],
            "ts_uptime_us": rng.sample(range(10_000_000), n),
            "latency_us": [rng.randint(0, 1000) for _ in range(n)],
        }
    )
    out = kernmlops.history(frame, ["latency_us"], n=4, by="device")
    assert isinstance(out, pl.DataFrame)
    rows = frame.to_dicts()
    for r in out.iter_rows(named=True):
        earlier = sorted(
            (x for x in rows if x["collection_id"] == r["collection_id"] and x["device"] == r["device"] and x["ts_uptime_us"] < r["ts_uptime_us"]),
            key=lambda x: x["ts_uptime_us"],
        )
        for k in range(1, 5):
            want = earlier[-k]["latency_us"] if len(earlier) >= k else None
            assert r[f"latency_us__prev{k}"] == want
    lazy = kernmlops.history(frame.lazy(), ["latency_us"], n=1)
    assert isinstance(lazy, pl.LazyFrame)


def test_features_of_a_real_collection_count_every_row(collection_dir: Path) -> None:
    c = kernmlops.open_collection(collection_dir)
    f = kernmlops.features(c, every="250ms")
    for name in ("quanta_runtime", "block_io", "process_trace"):
        assert f.frame[f"{name}__count"].sum() == c.table(name).collect().height, name
    lat = c.table("quanta_runtime").collect()["quanta_run_length_us"].sum()
    assert f.frame["quanta_runtime__quanta_run_length_us__sum"].sum() == lat
    assert f.units["quanta_runtime__quanta_run_length_us__sum"] == "us"
    # The perf counters' changes add up to the last reading of each CPU (no multiplexing here).
    pf = c.table("page_faults").collect()
    last = pf.sort("ts_uptime_us").group_by("cpu").agg(pl.col("count").last())["count"].sum()
    assert f.frame["page_faults__count__change"].sum() == pytest.approx(last)
    by_cpu = kernmlops.features(c, every="250ms", by="cpu", tables=["quanta_runtime", "memory_usage"])
    assert by_cpu.frame["quanta_runtime__count"].sum() == c.table("quanta_runtime").collect().height


def test_experiment_features_carry_labels_and_write_a_card(experiment_dir: Path, tmp_path: Path) -> None:
    e = kernmlops.open_experiment(experiment_dir)
    f = kernmlops.features(e, every="100ms")
    assert {"ms", "run_id", "combo_id", "result_seconds"} <= set(f.label_columns)
    per_run = f.frame.group_by("collection_id").agg(pl.col("ms").unique())
    truth = dict(zip(e.results["collection_id"], e.results["ms"]))
    for cid, ms in per_run.iter_rows():
        assert ms == [truth[cid]]
    out = f.write(tmp_path / "f.parquet")
    t = pq.read_table(out)
    assert t.schema.field("quanta_runtime__quanta_run_length_us__p99").metadata[b"unit"] == b"us"
    card = json.loads(Path(str(out) + ".card.json").read_text())
    assert len(card["collections"]) == 4 and card["window_us"] == 100_000
    assert card["kernels"] and card["collections"][0]["collector_overhead"]["user_cpu_percent"] is not None
    assert card["collections"][0]["machine"]["logical_cores"] == os.cpu_count()
    assert "- machines: " in Path(str(out) + ".card.md").read_text()
    assert "quanta_runtime" in Path(str(out) + ".card.md").read_text()
    X, y = f.xy("result_seconds")
    assert X.shape == (f.frame.height, len(f.feature_columns)) and y.shape == (f.frame.height,)


def test_bad_arguments_are_clear_errors(two_tables) -> None:
    path, _, _ = two_tables
    with pytest.raises(ValueError, match="not a duration"):
        kernmlops.features(path, every="fast")
    with pytest.raises(kernmlops.KernmlopsError, match="no table 'nope'"):
        kernmlops.features(path, tables=["nope"])
    with pytest.raises(kernmlops.KernmlopsError, match="by='disk'"):
        kernmlops.features(path, by="disk")
    with pytest.raises(kernmlops.KernmlopsError, match="unknown aggregation"):
        kernmlops.features(path, aggregations={"ev_a": {"latency_us": ["avg"]}})


def test_windows_during_the_benchmark_and_its_result_as_label(tmp_path: Path) -> None:
    pi = (
        [field("ts_uptime_us", U64, "us"), field("wall_time_s", pa.float64(), "s"), field("result_ops", pa.float64())],
        {"ts_uptime_us": [1_750_000], "wall_time_s": [0.5], "result_ops": [42.0]},
        "The benchmark's own result",
    )
    rows = [(t, 1, 1) for t in range(1_000_000, 2_000_000, 10_000)]
    write_collection(tmp_path, "b", 1_000_000, 2_000_000, {"ev": event_table(rows), "performance_indicator": pi})
    whole = kernmlops.features(tmp_path / "b", every="100ms")
    assert whole.frame.height == 10
    f = kernmlops.features(tmp_path / "b", every="100ms", during="benchmark")
    # The benchmark ran from 1.25 s to 1.75 s: the windows wholly inside it.
    assert f.frame["window_start_us"].to_list() == [1_300_000, 1_400_000, 1_500_000, 1_600_000]
    assert f.label_columns == ["result_ops"] and f.frame["result_ops"].to_list() == [42.0] * 4
    assert "performance_indicator__count" not in f.frame.columns
    write_collection(tmp_path, "n", 1_000_000, 2_000_000, {"ev": event_table(rows)})
    with pytest.raises(kernmlops.KernmlopsError, match="collection n ran no benchmark"):
        kernmlops.features(tmp_path / "n", during="benchmark")


def test_long_counter_tables_become_one_column_per_counter(tmp_path: Path) -> None:
    # procfs-style: one row per counter (per CPU) per sample, raw value and delta.
    rows = []
    values = {("irq_a", 0): 100, ("irq_a", 1): 5, ("irq_b", 0): 7}
    for i, ts in enumerate([1_050_000, 1_150_000, 1_160_000, 1_350_000]):
        for (k, cpu), v in values.items():
            delta = 0 if i == 0 else (i * 3 if k == "irq_a" else 1)
            values[(k, cpu)] = v + delta
            rows.append((ts, k, cpu, v + delta, delta))
    fields = [
        field("ts_uptime_us", U64, "us"),
        field("key", pa.string()),
        field("cpu", U32),
        field("value", U64, "count"),
        field("delta", U64, "count"),
    ]
    cols = {f.name: [r[i] for r in rows] for i, f in enumerate(fields)}
    write_collection(tmp_path, "l", 1_000_000, 1_400_000, {"irqs": (fields, cols, "One row per counter per sample")})
    df = kernmlops.features(tmp_path / "l", every="100ms").frame
    # Window 1 holds samples 1 and 2: irq_a adds 3+6 on each of 2 CPUs.
    assert df["irqs__irq_a__change"].to_list() == [0, 18, 0, 18]
    assert df["irqs__irq_b__change"].to_list() == [0, 2, 0, 1]
    assert df["irqs__irq_a__last"].to_list() == [105, 123, 123, 141]
    by_cpu = kernmlops.features(tmp_path / "l", every="100ms", by="cpu").frame
    assert by_cpu.filter(pl.col("cpu") == 1)["irqs__irq_a__change"].to_list() == [0, 9, 0, 9]


def test_per_entity_sample_tables_pivot_on_their_label(tmp_path: Path) -> None:
    fields = [
        field("ts_uptime_us", U64, "us"),
        field("disk", pa.string(), None, "disk name"),
        field("writes", U64, "count", "writes completed"),
        field("writes_delta", U64, "count", "increase of writes since the previous sample"),
    ]
    rows = [(1_010_000, "vda", 10, 0), (1_010_000, "vdb", 3, 0), (1_110_000, "vda", 15, 5), (1_110_000, "vdb", 3, 0), (1_190_000, "vda", 20, 5)]
    cols = {f.name: [r[i] for r in rows] for i, f in enumerate(fields)}
    write_collection(tmp_path, "e", 1_000_000, 1_300_000, {"disks": (fields, cols, "One row per sample per disk")})
    f = kernmlops.features(tmp_path / "e", every="100ms")
    df = f.frame
    assert df["disks__vda__writes_delta__sum"].to_list() == [0, 10, 0]
    assert df["disks__vda__writes__last"].to_list() == [10, 20, 20]
    assert df["disks__vdb__writes__last"].to_list() == [3, 3, 3]
    assert f.units["disks__vda__writes__last"] == "count"


def test_energy_slots_are_split_over_windows_and_summed_per_run(tmp_path: Path) -> None:
    fields = [
        field("ts_uptime_us", U64, "us"),
        field("slot_start_us", U64, "us"),
        field("source", pa.string()),
        field("zone", pa.string()),
        field("energy_uj", U64, "uJ"),
        field("measured", pa.bool_()),
    ]
    # A 250 ms slot from 1.05 s: 50 ms in the first window, 100 in the next, 100 in the third.
    rows = [(1_300_000, 1_050_000, "rapl", "package-0", 1000, True), (1_300_000, 1_050_000, "estimate", "cpu", 500, False)]
    cols = {f.name: [r[i] for r in rows] for i, f in enumerate(fields)}
    write_collection(tmp_path, "w", 1_000_000, 1_400_000, {"energy": (fields, cols, "Energy per power source, zone and time slot")})
    f = kernmlops.features(tmp_path / "w", every="100ms")
    df = f.frame
    assert df["energy__rapl:package-0__energy_uj"].to_list() == [200.0, 400.0, 400.0, 0.0]
    assert df["energy__estimate:cpu__energy_uj"].to_list() == [100.0, 200.0, 200.0, 0.0]
    # Modelled energy stays marked as modelled.
    assert df["energy__estimate:cpu__measured"].to_list()[:3] == [False] * 3
    assert df["energy__rapl:package-0__measured"].to_list()[:3] == [True] * 3
    assert f.units["energy__rapl:package-0__energy_uj"] == "uJ"
    assert df["run_energy_uj__rapl:package-0"].to_list() == [1000] * 4
    assert "run_energy_uj__estimate:cpu" in f.label_columns


def test_procfs_counters_of_a_real_collection_pivot_per_counter(collection_dir: Path) -> None:
    c = kernmlops.open_collection(collection_dir)
    f = kernmlops.features(c, every="500ms", tables=["procfs_vmstat", "procfs_pressure", "procfs_diskstats"])
    vm = c.table("procfs_vmstat").collect()
    for key in ("pgfault", "pgpgout", "nr_dirtied"):
        rows = vm.filter(pl.col("key") == key)
        assert f.frame[f"procfs_vmstat__{key}__change"].sum() == rows["delta"].sum(), key
        assert f.frame[f"procfs_vmstat__{key}__last"][-1] == rows.sort("ts_uptime_us")["value"][-1]
    assert "procfs_pressure__cpu__some_total_us_delta__sum" in f.frame.columns
    assert not [x for x in f.frame.columns if x.endswith("__major__last")]
