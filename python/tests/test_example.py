"""examples/ml: a real experiment, its features, and a classifier tested on unseen runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, need, need_root


def test_the_example_trains_and_reports_a_score(binary: Path, tmp_path: Path) -> None:
    need_root()
    try:
        import sklearn  # noqa: F401
    except ImportError:
        need(False, "needs scikit-learn (scripts/setup.sh installs it)")
    subprocess.run(
        [str(binary), "experiment", "run", str(ROOT / "examples/ml/workloads.toml"), "--dir", str(tmp_path / "ml")],
        check=True, capture_output=True, cwd=ROOT, timeout=600,
    )
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples/ml/train.py"), str(tmp_path / "ml")],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert p.returncode == 0, p.stderr
    print(p.stdout)
    m = re.search(r"^accuracy: ([0-9.]+) \(chance: ([0-9.]+)\)$", p.stdout, re.M)
    assert m, p.stdout
    # Three stressors that load the kernel very differently: well above chance
    # (0.33), with room for a machine shared with other work; labels that did
    # not belong to their windows would score about chance.
    assert float(m.group(1)) > 0.5 > float(m.group(2))
    assert (tmp_path / "ml" / "features.parquet.card.md").is_file()
