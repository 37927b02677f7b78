"""``python -m kernmlops``: features and summaries of collections from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from . import KernmlopsError, features, open_any
from ._read import Collection, Dataset, Experiment


def _info(args: argparse.Namespace) -> int:
    src = open_any(args.dir)
    if isinstance(src, Experiment):
        print(f"experiment {src.name}: {src.results.height} runs, variables: {', '.join(src.variables) or 'none'}")
        print(src.results.group_by("status").len().sort("status"))
    elif isinstance(src, Collection):
        print(f"collection {src.id} ({src.status}), host {src.manifest.get('hostname')}, kernel {src.manifest.get('kernel_release')}")
        for name, t in sorted(src.info.items()):
            rows = (src.manifest.get("tables") or {}).get(name, {}).get("rows")
            print(f"  {name:<28} {rows if rows is not None else '':>10}  {t.description or ''}")
    elif isinstance(src, Dataset):
        print(f"dataset {src.path}: tables {', '.join(sorted(src.tables))}")
    return 0


def _features(args: argparse.Namespace) -> int:
    tables = args.tables.split(",") if args.tables else None
    f = features(args.dir, every=args.every, by=args.by, tables=tables, labels=not args.no_labels)
    out = f.write(args.out)
    print(f"{f.frame.height} windows x {len(f.feature_columns)} features, {len(f.label_columns)} labels -> {out} (card: {out}.card.md)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="python -m kernmlops",
        description="Features and summaries of kernmlops collections, experiments and Hive exports.",
        epilog="example: python -m kernmlops features experiments/sweep --every 100ms --by tgid --out features.parquet",
    )
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("info", help="what a collection, experiment or export holds")
    i.add_argument("dir", help="a collection, experiment or Hive export folder")
    i.set_defaults(run=_info)
    f = sub.add_parser(
        "features",
        help="windowed features (and labels) as Parquet plus a data card",
        description="Every table on one time grid, aggregated per window; labels from the experiment's results.",
    )
    f.add_argument("dir", help="a collection, experiment or Hive export folder")
    f.add_argument("--every", default="100ms", help="window length (default 100ms)")
    f.add_argument("--by", choices=["tgid", "pid", "cpu", "cgroup"], help="one row per key per window")
    f.add_argument("--tables", help="comma-separated tables to use (default: every event table)")
    f.add_argument("--no-labels", action="store_true", help="join no labels")
    f.add_argument("--out", required=True, help="the Parquet file to write")
    f.set_defaults(run=_features)
    args = p.parse_args(argv)
    try:
        return int(args.run(args))
    except (KernmlopsError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
