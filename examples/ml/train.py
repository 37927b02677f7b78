#!/usr/bin/env python3
"""Classify the running workload from kernel features, on runs the model never saw.

    python3 examples/ml/train.py EXPERIMENT_DIR      # an experiment of examples/ml/workloads.toml
    python3 examples/ml/train.py --run              # run that experiment first (root, ~1 minute)

Features per 200 ms window while the benchmark ran (kernmlops.features with
during="benchmark"), the stressor as the label,
and a 3-fold split by repeat (kernmlops.kfold by="repeat"): each fold tests on
one repeat of every stressor and trains on the others, so the windows of one
run are never on both sides and every class is on both. Prints the accuracy of each fold and the
mean, and writes the features with their data card next to the experiment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))

import kernmlops  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("experiment", nargs="?", help="an experiment folder of workloads.toml")
    p.add_argument("--run", action="store_true", help="run examples/ml/workloads.toml first (root)")
    p.add_argument("--dir", default="experiments/ml_workloads", help="where --run puts the experiment")
    p.add_argument("--every", default="200ms", help="window length")
    args = p.parse_args()
    if args.run:
        e = kernmlops.run_experiment(HERE / "workloads.toml", dir=args.dir)
    elif args.experiment:
        e = kernmlops.open_experiment(args.experiment)
    else:
        p.error("give an experiment folder or --run")

    from sklearn.ensemble import RandomForestClassifier

    f = kernmlops.features(e, every=args.every, during="benchmark")
    # What the workload does to the kernel (event rates, latencies, counter
    # changes), not the machine's state (memory gauges, running totals),
    # which drifts from run to run whatever runs.
    cols = [c for c in f.feature_columns if not c.endswith("__last") and not c.startswith("memory_usage__")]
    print(f"{f.frame.height} windows x {len(cols)} features from {len(f.sources)} runs")
    scores = []
    for i, (train, test) in enumerate(kernmlops.kfold(f, k=3, by="repeat", seed=0)):
        model = RandomForestClassifier(n_estimators=100, random_state=0)
        model.fit(train.to_numpy(cols), train.frame["stressor"].to_numpy())
        score = model.score(test.to_numpy(cols), test.frame["stressor"].to_numpy())
        scores.append(score)
        print(f"fold {i}: trained on {train.frame['collection_id'].n_unique()} runs, "
              f"tested on {test.frame['collection_id'].n_unique()} others: accuracy {score:.3f}")
    mean = sum(scores) / len(scores)
    print(f"accuracy: {mean:.3f} (chance: {1 / f.frame['stressor'].n_unique():.3f})")
    out = f.write(Path(e.path) / "features.parquet")
    print(f"features: {out} (data card: {out}.card.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
