"""Collecting from Python with the real binary: rows recorded, clean stops on
exceptions and Ctrl+C, nothing left running, clear errors."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import kernmlops
from conftest import need_root


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not running.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_collect_records_rows_of_the_block(binary: Path, tmp_path: Path) -> None:
    need_root()
    with kernmlops.collect(plugins=["quanta_runtime", "process_trace"], output=tmp_path, binary=binary) as c:
        assert c.path is not None and c.path.is_dir()
        pid = c.pid
        for _ in range(5):
            subprocess.run(["true"], check=True)
        time.sleep(0.3)
    assert pid is not None and not alive(pid)
    col = c.collection
    assert col is not None and col.status == "complete" and col.path == c.path
    assert col.table("quanta_runtime").collect().height > 0
    execs = col.table("process_trace").collect()
    assert execs.height >= 5


def test_collect_stops_cleanly_on_an_exception(binary: Path, tmp_path: Path) -> None:
    need_root()
    c = kernmlops.collect(plugins=["quanta_runtime"], output=tmp_path, binary=binary, config={"collect": {"drain_interval": "50ms"}})
    with pytest.raises(RuntimeError, match="workload failed"):
        with c:
            pid = c.pid
            time.sleep(0.2)
            raise RuntimeError("workload failed")
    assert not alive(pid)
    assert c.collection is not None and c.collection.status == "complete"
    assert c.collection.manifest["config"]["collect"]["drain_interval"] == "50ms"
    assert c.collection.table("quanta_runtime").collect().height > 0


def test_collect_stops_cleanly_on_ctrl_c(binary: Path, tmp_path: Path) -> None:
    need_root()
    c = kernmlops.collect(plugins=["quanta_runtime"], output=tmp_path, binary=binary)
    with pytest.raises(KeyboardInterrupt):
        with c:
            pid = c.pid
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl+C in a notebook
            time.sleep(5)
    assert not alive(pid)
    assert c.collection is not None and c.collection.status == "complete"


def test_collect_errors_are_one_clear_exception(binary: Path, tmp_path: Path) -> None:
    need_root()
    with pytest.raises(kernmlops.KernmlopsError, match="not an executable"):
        kernmlops.collect(binary=tmp_path / "missing")
    with pytest.raises(kernmlops.KernmlopsError, match="kernmlops run: error:.*no_such_probe"):
        with kernmlops.collect(plugins=["no_such_probe"], output=tmp_path, binary=binary):
            pass
    assert list(tmp_path.iterdir()) == []


def test_collect_with_trace_events(binary: Path, tmp_path: Path) -> None:
    need_root()
    with kernmlops.collect(trace=["sched:sched_process_exec"], output=tmp_path, binary=binary) as c:
        for _ in range(3):
            subprocess.run(["true"], check=True)
        time.sleep(0.3)
    t = c.collection.table("sched_process_exec").collect()
    assert t.height >= 3


def test_run_experiment_from_python(binary: Path, experiment_file: Path, tmp_path: Path) -> None:
    need_root()
    lines: list[str] = []
    e = kernmlops.run_experiment(experiment_file, dir=tmp_path / "exp", binary=binary, progress=lines.append)
    assert e.results.height == 4
    assert (e.results["status"] == "complete").all()
    assert any("run" in line for line in lines)


def test_non_root_is_refused(binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As a user other than root: one clear exception, nothing started.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(kernmlops.KernmlopsError, match="collecting needs root"):
        kernmlops.collect(binary=binary, output=tmp_path)
    with pytest.raises(kernmlops.KernmlopsError, match="running an experiment needs root"):
        kernmlops.run_experiment(tmp_path / "x.toml", binary=binary)
    assert list(tmp_path.iterdir()) == []
