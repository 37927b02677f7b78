"""Readers on real collections, experiments and Hive exports: types and metadata as declared."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pyarrow.ipc as ipc
import pytest

import kernmlops
import kernmlops_data


def test_collection_tables_keep_declared_types_and_metadata(collection_dir: Path) -> None:
    c = kernmlops.open_collection(collection_dir)
    assert c.status == "complete"
    assert c.id == collection_dir.name
    manifest = json.loads((collection_dir / "manifest.json").read_text())
    for name, entry in manifest["tables"].items():
        if name in ("system_info", "collector_overhead"):
            continue
        df = c.table(name).collect()
        assert df.height == entry["rows"], name
        with ipc.open_file(collection_dir / entry["file"]) as r:
            schema = r.schema
        for f in schema:
            col = c.info[name].column(f.name)
            meta = f.metadata or {}
            assert col.unit == (meta[b"unit"].decode() if b"unit" in meta else None)
            assert col.description == (meta[b"description"].decode() if b"description" in meta else None)
    q = c.table("quanta_runtime").collect_schema()
    assert q["ts_uptime_us"] == pl.UInt64
    assert q["cpu"] == pl.UInt32
    assert c.info["quanta_runtime"].units["quanta_run_length_us"] == "us"
    assert c.table("block_io").collect().height > 0
    assert c.system_info()["kernel_release"] == os.uname().release
    assert c.start_us is not None and c.end_us is not None and c.end_us > c.start_us
    assert set(c.lost_events()) == set(manifest["tables"])
    with pytest.raises(KeyError, match="no table 'nope'"):
        c.table("nope")


def test_the_old_reader_keeps_working(collection_dir: Path) -> None:
    tables = kernmlops_data.read_collection(collection_dir)
    c = kernmlops.open_collection(collection_dir)
    assert tables["quanta_runtime"].height == c.table("quanta_runtime").collect().height


def test_experiment_results_variables_and_collections(experiment_dir: Path) -> None:
    e = kernmlops.open_experiment(experiment_dir)
    assert e.name == "py_sleep"
    assert e.variables == ["ms"]
    assert e.results.height == 4
    assert sorted(e.results["ms"].to_list()) == [20, 20, 60, 60]
    cs = e.collections()
    assert len(cs) == 4
    for c in cs:
        ind = c.indicator()
        assert ind is not None and ind["name"] == "sleep"
        assert c.table("quanta_runtime").collect().height > 0
        assert c.performance_indicator() is not None


def test_dataset_reads_every_collection_of_a_table(experiment_dir: Path, dataset_dir: Path) -> None:
    d = kernmlops.open_dataset(dataset_dir)
    e = kernmlops.open_experiment(experiment_dir)
    q = d.table("quanta_runtime").collect()
    assert q["collection_id"].n_unique() == 4
    assert q.height == sum(c.table("quanta_runtime").collect().height for c in e.collections())
    assert d.info["quanta_runtime"].units["quanta_run_length_us"] == "us"
    assert {"run_class", "benchmark"} <= set(q.columns)
    assert isinstance(kernmlops.open_any(dataset_dir), kernmlops.Dataset)
    assert isinstance(kernmlops.open_any(experiment_dir), kernmlops.Experiment)


def test_not_a_collection_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(kernmlops.KernmlopsError, match="no manifest.json"):
        kernmlops.open_collection(tmp_path)
    with pytest.raises(kernmlops.KernmlopsError, match="not a folder"):
        kernmlops.open_collection(tmp_path / "missing")
    with pytest.raises(kernmlops.KernmlopsError, match="no experiment.json"):
        kernmlops.open_experiment(tmp_path)
