#!/usr/bin/env python3
"""Rows per second of `kernmlops.features()` on one core, and its peak memory.

    python3 benchmarks/features.py [ROWS] [RUNS]      # default 10,000,000 rows, 3 runs

Writes a collection folder of ROWS context-switch-like rows (an event table
with a duration and the ids of `quanta_runtime`) over 100 s, plus a
once-a-second gauge table, in a private temporary folder; then, in a fresh
process with POLARS_MAX_THREADS=1 for each run, times
`features(collection, every="100ms")` and reads that process's peak RSS.
Twice: with the default aggregations (p50/p90/p99 hold each window's values
in memory) and with sum/mean/max only (streamed). Prints each run and the
medians.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write(folder: Path, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc

    sys.path.insert(0, str(ROOT / "python" / "tests"))
    from crafted import write_collection, field

    start, span = 1_000_000_000, 100_000_000  # 100 s
    write_collection(folder, "bench", start, start + span, {
        "gauge": (
            [field("ts_uptime_us", pa.uint64(), "us"), field("free_bytes", pa.uint64(), "bytes")],
            {"ts_uptime_us": list(range(start, start + span, 1_000_000)), "free_bytes": [1] * 100},
            "One row per sample",
        ),
    })
    d = folder / "bench"
    schema = pa.schema(
        [
            pa.field("collection_id", pa.dictionary(pa.int32(), pa.string())),
            pa.field("cpu", pa.uint32()),
            pa.field("pid", pa.uint32()),
            pa.field("tgid", pa.uint32()),
            pa.field("ts_uptime_us", pa.uint64(), metadata={b"unit": b"us"}),
            pa.field("quanta_run_length_us", pa.uint64(), metadata={b"unit": b"us"}),
        ],
        metadata={b"description": b"One row per context switch"},
    )
    rng = np.random.default_rng(1)
    chunk = 1_000_000
    with ipc.new_file(d / "quanta_runtime.arrow", schema) as w:
        for lo in range(0, rows, chunk):
            n = min(chunk, rows - lo)
            ts = start + (np.arange(lo, lo + n, dtype=np.uint64) * span // rows)
            tgid = rng.integers(1, 500, n).astype(np.uint32)
            w.write_batch(pa.record_batch([
                pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array(["bench"])),
                pa.array(rng.integers(0, 2, n).astype(np.uint32)),
                pa.array(tgid),
                pa.array(tgid),
                pa.array(ts),
                pa.array(rng.integers(1, 10_000, n).astype(np.uint64)),
            ], schema=schema))
    m = json.loads((d / "manifest.json").read_text())
    m["tables"]["quanta_runtime"] = {"probe": "quanta_runtime", "file": "quanta_runtime.arrow", "rows": rows, "lost_events": 0}
    (d / "manifest.json").write_text(json.dumps(m))


def measure(folder: Path, mode: str) -> None:
    sys.path.insert(0, str(ROOT / "python"))
    import kernmlops

    aggs = None
    if mode == "no-quantiles":
        aggs = {"quanta_runtime": {"quanta_run_length_us": ["sum", "mean", "max"]}}
    t = time.perf_counter()
    f = kernmlops.features(folder, every="100ms", aggregations=aggs)
    s = time.perf_counter() - t
    rows = int(f.frame["quanta_runtime__count"].sum()) + int(f.frame["gauge__count"].sum())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": s, "rows": rows, "windows": f.frame.height, "peak_rss_bytes": peak}))


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--measure":
        measure(Path(sys.argv[2]), sys.argv[3])
        return 0
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if not 1_000 <= rows <= 1_000_000_000 or not 1 <= runs <= 100:
        print("error: ROWS must be 1,000 to 10^9 and RUNS 1 to 100", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="kernmlops-features-bench."))
    try:
        write(tmp, rows)
        size = (tmp / "bench" / "quanta_runtime.arrow").stat().st_size
        print(f"{rows} rows ({size / 2**20:.0f} MiB of Arrow), features every 100ms, one core (POLARS_MAX_THREADS=1)")
        for mode in ("default", "no-quantiles"):
            results = []
            for i in range(runs):
                out = subprocess.run(
                    [sys.executable, __file__, "--measure", str(tmp / "bench"), mode],
                    env={**os.environ, "POLARS_MAX_THREADS": "1"}, capture_output=True, text=True, check=True,
                )
                r = json.loads(out.stdout)
                assert r["rows"] == rows + 100, r
                results.append(r)
                print(f"{mode} run {i}: {r['seconds']:.2f} s, {r['rows'] / r['seconds'] / 1e6:.2f} M rows/s, "
                      f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB, {r['windows']} windows")
            med = statistics.median(r["seconds"] for r in results)
            rss = statistics.median(r["peak_rss_bytes"] for r in results)
            print(f"{mode} median: {rows / med / 1e6:.2f} M rows/s, peak RSS {rss / 2**20:.0f} MiB "
                  f"({rss / size:.2f}x the Arrow file)")
    finally:
        shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
