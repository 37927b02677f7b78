"""Reading collections, experiments and exported datasets as polars LazyFrames."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, Union

import polars as pl
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

PathLike = Union[str, Path]

# Files of a collection folder that are not event tables.
_NOT_TABLES = {"system_info", "performance_indicator", "collector_overhead"}


class KernmlopsError(Exception):
    """A kernmlops folder, binary or run that cannot be used as asked."""


@dataclass(frozen=True)
class Column:
    """A column's declared type, unit and description (from the file's field metadata)."""

    name: str
    dtype: str
    unit: str | None = None
    description: str | None = None


@dataclass(frozen=True)
class TableInfo:
    """A table's description and its columns, in file order."""

    name: str
    description: str | None
    columns: tuple[Column, ...]

    def column(self, name: str) -> Column:
        """The column called ``name`` (``KeyError`` names the table when there is none)."""
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name} has no column {name!r}")

    @property
    def units(self) -> dict[str, str]:
        """Column name to unit, for the columns that declare one."""
        return {c.name: c.unit for c in self.columns if c.unit}


def _decode(meta: Mapping[bytes, bytes] | None, key: str) -> str | None:
    if not meta:
        return None
    v = meta.get(key.encode())
    return v.decode() if v is not None else None


def _table_info(name: str, schema: Any) -> TableInfo:
    cols = tuple(
        Column(
            name=f.name,
            dtype=str(f.type),
            unit=_decode(f.metadata, "unit"),
            description=_decode(f.metadata, "description"),
        )
        for f in schema
    )
    return TableInfo(name=name, description=_decode(schema.metadata, "description"), columns=cols)


def _arrow_schema(path: Path) -> Any:
    with ipc.open_file(path) as reader:
        return reader.schema


def _require_dir(path: PathLike, what: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise KernmlopsError(f"{p}: not a folder (expected {what})")
    return p


@dataclass
class Collection:
    """One collection folder written by ``kernmlops run``.

    ``tables`` maps each event table to a LazyFrame over its Arrow file
    (declared types kept, ``collection_id`` on every row); ``info`` has each
    table's units and descriptions; ``manifest`` is ``manifest.json``.
    """

    path: Path
    manifest: dict[str, Any]
    tables: dict[str, pl.LazyFrame] = field(repr=False)
    info: dict[str, TableInfo] = field(repr=False)

    @property
    def id(self) -> str:
        """The collection id (the folder's name)."""
        return str(self.manifest.get("collection_id", self.path.name))

    @property
    def start_us(self) -> int | None:
        """When collection started, microseconds of CLOCK_BOOTTIME."""
        return (self.manifest.get("start") or {}).get("uptime_us")

    @property
    def end_us(self) -> int | None:
        """When collection ended, microseconds of CLOCK_BOOTTIME (None while running)."""
        return (self.manifest.get("end") or {}).get("uptime_us")

    @property
    def status(self) -> str:
        """The manifest's status: complete, failed, running, repaired ..."""
        return str(self.manifest.get("status", "unknown"))

    def table(self, name: str) -> pl.LazyFrame:
        """A table by name; ``KeyError`` lists the tables there are."""
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(
                f"collection {self.id} has no table {name!r} (it has: {', '.join(sorted(self.tables))})"
            ) from None

    def system_info(self) -> dict[str, Any]:
        """The machine, kernel and run: ``system_info``'s one row, as a dict."""
        f = self.path / "system_info.arrow"
        if not f.is_file():
            return {}
        rows = pl.read_ipc(f).to_dicts()
        return rows[0] if rows else {}

    def indicator(self) -> dict[str, Any] | None:
        """The benchmark's performance indicator (``indicator.json``), or None without a benchmark."""
        f = self.path / "indicator.json"
        if not f.is_file():
            return None
        return json.loads(f.read_text())

    def performance_indicator(self) -> pl.LazyFrame | None:
        """The ``performance_indicator`` table (one row per benchmark run), or None."""
        f = self.path / "performance_indicator.arrow"
        return pl.scan_ipc(f) if f.is_file() else None

    def collector_overhead(self) -> pl.LazyFrame | None:
        """The collector's own cost over time (``collector_overhead``), or None."""
        f = self.path / "collector_overhead.arrow"
        return pl.scan_ipc(f) if f.is_file() else None

    def lost_events(self) -> dict[str, int]:
        """Events lost per table, as the manifest counts them."""
        return {
            name: int(t.get("lost_events") or 0)
            for name, t in (self.manifest.get("tables") or {}).items()
        }


def open_collection(path: PathLike) -> Collection:
    """Open a collection folder (``<output>/<collection_id>/``).

    A collection cut off by a crash may need ``kernmlops repair FOLDER`` first:
    a table file without its footer is an error naming it.
    """
    root = _require_dir(path, "a collection folder with manifest.json")
    mf = root / "manifest.json"
    if not mf.is_file():
        raise KernmlopsError(f"{root}: no manifest.json (not a kernmlops collection)")
    manifest = json.loads(mf.read_text())
    tables: dict[str, pl.LazyFrame] = {}
    info: dict[str, TableInfo] = {}
    for f in sorted(root.glob("*.arrow")):
        name = f.stem
        try:
            schema = _arrow_schema(f)
        except Exception as e:  # pyarrow raises several types for a cut-off file
            raise KernmlopsError(
                f"{f}: unreadable ({e}); `kernmlops repair {root}` restores a cut-off file"
            ) from e
        info[name] = _table_info(name, schema)
        if name not in _NOT_TABLES:
            tables[name] = pl.scan_ipc(f)
    return Collection(path=root, manifest=manifest, tables=tables, info=info)


@dataclass
class Experiment:
    """An experiment folder written by ``kernmlops experiment run``.

    ``results`` has one row per run (variables, ``run_id``, ``combo_id``,
    ``collection_id``, status, the benchmark's ``result_*`` figures, ``ru_*``,
    rows and lost events per table); ``record`` is ``experiment.json``.
    """

    path: Path
    record: dict[str, Any]
    results: pl.DataFrame

    @property
    def name(self) -> str:
        """The experiment's name."""
        return str(self.record.get("name", self.path.name))

    @property
    def variables(self) -> list[str]:
        """The experiment's variable names, in the record's order."""
        v = self.record.get("variables") or []
        if isinstance(v, dict):
            return list(v)
        return [x["name"] if isinstance(x, dict) else str(x) for x in v]

    def run_ids(self) -> list[str]:
        """Every run of the results, in their order."""
        return self.results["run_id"].to_list()

    def collections(self, status: str | None = "complete") -> list[Collection]:
        """The runs' collections (by default only runs that succeeded), in run order."""
        out = []
        rows = self.results
        if status is not None and "status" in rows.columns:
            rows = rows.filter(pl.col("status") == status)
        for run_id in rows["run_id"].to_list():
            folder = self.path / "runs" / str(run_id)
            if (folder / "manifest.json").is_file():
                out.append(open_collection(folder))
        return out

    def __iter__(self) -> Iterator[Collection]:
        return iter(self.collections())


def open_experiment(path: PathLike) -> Experiment:
    """Open an experiment folder; its ``results.parquet`` must exist
    (``kernmlops experiment results DIR`` writes it)."""
    root = _require_dir(path, "an experiment folder with experiment.json")
    rec = root / "experiment.json"
    if not rec.is_file():
        raise KernmlopsError(f"{root}: no experiment.json (not a kernmlops experiment)")
    res = root / "results.parquet"
    if not res.is_file():
        raise KernmlopsError(
            f"{root}: no results.parquet yet; `kernmlops experiment results {root}` writes it"
        )
    return Experiment(path=root, record=json.loads(rec.read_text()), results=pl.read_parquet(res))


@dataclass
class Dataset:
    """An export written by ``kernmlops export --layout hive``:
    ``<table>/run_class=<class>/benchmark=<benchmark>/<collection_id>.parquet``."""

    path: Path
    tables: dict[str, pl.LazyFrame] = field(repr=False)
    info: dict[str, TableInfo] = field(repr=False)

    def table(self, name: str) -> pl.LazyFrame:
        """A table by name, every collection of it (``run_class`` and ``benchmark`` as columns)."""
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(
                f"dataset {self.path} has no table {name!r} (it has: {', '.join(sorted(self.tables))})"
            ) from None


def open_dataset(path: PathLike) -> Dataset:
    """Open a Hive-partitioned export (``kernmlops export --layout hive``)."""
    root = _require_dir(path, "a Hive-partitioned export")
    tables: dict[str, pl.LazyFrame] = {}
    info: dict[str, TableInfo] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(d.rglob("*.parquet"))
        if not files:
            continue
        info[d.name] = _table_info(d.name, pq.read_schema(files[0]))
        tables[d.name] = pl.scan_parquet(
            d / "**" / "*.parquet", hive_partitioning=True, missing_columns="insert"
        )
    if not tables:
        raise KernmlopsError(f"{root}: no <table>/**/*.parquet files (not a Hive export)")
    return Dataset(path=root, tables=tables, info=info)


Source = Union[Collection, Experiment, Dataset, Sequence[Collection], PathLike]


def open_any(path: PathLike) -> Collection | Experiment | Dataset:
    """Open a folder as whatever it is: a collection, an experiment, or a Hive export."""
    p = _require_dir(path, "a collection, an experiment or a Hive export")
    if (p / "experiment.json").is_file():
        return open_experiment(p)
    if (p / "manifest.json").is_file():
        return open_collection(p)
    return open_dataset(p)
