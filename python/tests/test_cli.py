"""`python -m kernmlops`: features from the shell, help, one error line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

PYTHON_DIR = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernmlops", *args], capture_output=True, text=True, cwd=PYTHON_DIR
    )


def test_help_names_the_commands() -> None:
    p = cli("--help")
    assert p.returncode == 0
    assert "features" in p.stdout and "info" in p.stdout
    p = cli("features", "--help")
    assert p.returncode == 0 and "--every" in p.stdout and "--by" in p.stdout


def test_features_from_the_shell(collection_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "features.parquet"
    p = cli("features", str(collection_dir), "--every", "500ms", "--by", "tgid", "--out", str(out))
    assert p.returncode == 0, p.stderr
    t = pq.read_table(out)
    assert "tgid" in t.column_names
    assert t.schema.field("quanta_runtime__count").metadata[b"unit"] == b"count"
    card = json.loads(Path(str(out) + ".card.json").read_text())
    assert card["by"] == "tgid" and card["window_us"] == 500_000
    p = cli("info", str(collection_dir))
    assert p.returncode == 0 and "quanta_runtime" in p.stdout


def test_a_bad_folder_is_one_error_line(tmp_path: Path) -> None:
    p = cli("features", str(tmp_path / "missing"), "--out", str(tmp_path / "f.parquet"))
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: ")
    assert not (tmp_path / "f.parquet").exists()
