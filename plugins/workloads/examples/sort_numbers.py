#!/usr/bin/env python3
"""A `script` benchmark for kernmlops: sorts random numbers and prints one
performance indicator (JSON) on standard output; progress goes to standard
error, which kernmlops keeps as benchmark.stderr.

Parameters arrive as one JSON object in KML_PARAMETERS:
  n     how many numbers (default 200000)
  seed  the random seed (default 1)

  [benchmarks.script]
  command = ["python3", "plugins/workloads/examples/sort_numbers.py"]
  parameters = { n = 200000, seed = 1 }
"""
import json
import os
import random
import sys
import time

params = json.loads(os.environ.get("KML_PARAMETERS", "{}"))
n = int(params.get("n", 200_000))
seed = int(params.get("seed", 1))

rng = random.Random(seed)
numbers = [rng.random() for _ in range(n)]
print(f"sorting {n} numbers (seed {seed})", file=sys.stderr)
start = time.perf_counter()
numbers.sort()
elapsed = time.perf_counter() - start
print(f"sorted in {elapsed:.6f} s", file=sys.stderr)

json.dump(
    {
        "name": "sort_numbers",
        "component": "cpython",
        "@parameters": {"n": n, "seed": seed},
        "@result": {
            "elapsed_s": elapsed,
            "items_per_s": n / elapsed if elapsed > 0 else 0.0,
            "python": sys.version.split()[0],
        },
    },
    sys.stdout,
)
print()
