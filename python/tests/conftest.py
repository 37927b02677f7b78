"""Shared fixtures: the kernmlops binary, and real collections, an experiment
and a Hive export made once per session by that binary (root)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import kernmlops  # noqa: E402


def in_ci() -> bool:
    return os.environ.get("CI") in ("true", "1")


def need(condition: bool, why: str) -> None:
    """Skip when ``condition`` fails, except under CI=true, where every test must run."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"{why}, and CI must run this test")
    pytest.skip(why)


def need_root() -> None:
    need(os.geteuid() == 0, "needs root (BPF)")


@pytest.fixture(scope="session")
def binary() -> Path:
    try:
        exe = kernmlops.find_binary()
    except kernmlops.KernmlopsError as e:
        need(False, str(e))
        raise
    return exe


def run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, **kw)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="session")
def collection_dir(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3 s collection of five probes while `dd` writes with fsyncs and processes start."""
    need_root()
    out = tmp_path_factory.mktemp("collections")
    work = tmp_path_factory.mktemp("work")
    proc = subprocess.Popen(
        [
            str(binary), "run", "--plugins", "quanta_runtime,process_trace,memory_usage,perf,block_io,procfs",
            "--duration", "3s", "--output", str(out),
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    for i in range(20):
        subprocess.run(["dd", "if=/dev/zero", f"of={work}/f{i}", "bs=64k", "count=16", "conv=fsync"], capture_output=True)
        subprocess.run(["true"])
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


EXPERIMENT = """\
name = "py_sleep"
benchmark = "script"
probes = ["quanta_runtime"]
repeats = 2

[config.benchmarks.script]
command = ["./bench.sh"]
timeout = "30s"
drop_page_cache = false

[variables.ms]
values = [20, 60]
"""

SCRIPT = """\
#!/bin/sh
set -eu
ms=${KML_PARAM_MS:-10}
start=$(date +%s%N)
i=0
while [ $i -lt 5 ]; do sleep "$(awk "BEGIN { print $ms / 5000 }")"; i=$((i + 1)); done
end=$(date +%s%N)
echo "{\\"name\\": \\"sleep\\", \\"component\\": \\"sh\\", \\"@parameters\\": {\\"ms\\": $ms}, \\"@result\\": {\\"seconds\\": $(awk "BEGIN { print ($end - $start) / 1e9 }")}}"
"""


@pytest.fixture(scope="session")
def experiment_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("spec")
    os.chmod(d, 0o755)
    (d / "bench.sh").write_text(SCRIPT)
    os.chmod(d / "bench.sh", 0o755)
    (d / "py_sleep.toml").write_text(textwrap.dedent(EXPERIMENT))
    return d / "py_sleep.toml"


@pytest.fixture(scope="session")
def experiment_dir(binary: Path, experiment_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two settings x two repeats of a sleeping script, collected with quanta_runtime."""
    need_root()
    d = tmp_path_factory.mktemp("experiments") / "py_sleep"
    run([str(binary), "experiment", "run", str(experiment_file), "--dir", str(d)], timeout=300)
    return d


@pytest.fixture(scope="session")
def dataset_dir(binary: Path, experiment_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("dataset")
    run(
        [str(binary), "export", "--layout", "hive", "--data", str(experiment_dir / "runs"), "--to", str(d)],
        timeout=120,
    )
    return d
