"""Load kernmlops data into polars DataFrames, one per table, by name.

Only dependency: polars.

Two layouts are read:

* An exported class folder, written by ``kernmlops export``::

      data/{curated,baseline,failed}/<table>/<collection_id>.<benchmark>.parquet

  ``read_parquet_dir("data/curated")`` returns ``{table: DataFrame}`` with the
  files of every collection of a table concatenated (columns missing from a
  collection's file are null).

* A raw collection folder, written by ``kernmlops run``::

      data/<collection_id>/{manifest.json,<table>.arrow,system_info.arrow}

  ``read_collection("data/<collection_id>")`` returns ``{table: DataFrame}``.

Columns keep their declared types (``ts_uptime_us`` is UInt64, microseconds
of CLOCK_BOOTTIME; labels are String; ``collection_id`` is Categorical).

Example::

    from kernmlops_data import read_parquet_dir
    tables = read_parquet_dir("data/curated")
    quanta = tables["quanta_runtime"]
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

__all__ = ["read_parquet_dir", "read_collection"]


def read_parquet_dir(path: str | Path) -> dict[str, pl.DataFrame]:
    """Every table of an exported class folder (e.g. ``data/curated``).

    Each sub-folder is a table; all its ``*.parquet`` files (one per
    collection) are concatenated in file-name order. Tables without files
    are left out.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a folder")
    tables: dict[str, pl.DataFrame] = {}
    for table_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(table_dir.glob("*.parquet"))
        if not files:
            continue
        frames = [pl.read_parquet(f) for f in files]
        tables[table_dir.name] = (
            frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
        )
    return tables


def read_collection(path: str | Path) -> dict[str, pl.DataFrame]:
    """Every ``<table>.arrow`` file of a raw collection folder, by table name.

    A crashed collection may need ``kernmlops repair <folder>`` first.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a folder")
    return {
        f.stem: pl.read_ipc(f) for f in sorted(root.glob("*.arrow"))
    }
