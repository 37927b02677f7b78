"""Windowed features, labels and history features from collected tables."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

import polars as pl

from ._read import (
    Collection,
    Dataset,
    Experiment,
    KernmlopsError,
    PathLike,
    TableInfo,
    open_any,
)

_UNITS_US = {"ns": 0.001, "us": 1, "ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000}

#: Columns that identify or locate a row rather than measure something: never aggregated.
KEY_COLUMNS = frozenset(
    {
        "collection_id",
        "cpu",
        "pid",
        "tgid",
        "mm_tgid",
        "device",
        "device_major",
        "device_minor",
        "major",
        "minor",
        "sector",
        "flags",
        "inode",
        "error",
        "status_code",
        "cgroup_id",
        "slot_start_us",
    }
)

#: Aggregations a column can be given, by name (``p50``, ``p90``, ... are quantiles).
AGGREGATIONS = ("sum", "mean", "min", "max", "std", "median", "first", "last", "change", "n_unique")

# The grouping keys `features(by=...)` understands, and the column each means.
_BY = {"tgid": "tgid", "cpu": "cpu", "cgroup": "cgroup_id", "pid": "pid"}


def parse_duration_us(text: str | int | float) -> int:
    """``"100ms"`` -> 100000 (microseconds). Accepts ns, us, ms, s, m, h; a bare number is seconds."""
    if isinstance(text, (int, float)):
        us = float(text) * 1_000_000
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h)?\s*", str(text))
        if not m:
            raise ValueError(f"{text!r} is not a duration (e.g. 100ms, 1s, 500us)")
        us = float(m.group(1)) * _UNITS_US[m.group(2) or "s"]
    if us < 1 or us != int(us):
        raise ValueError(f"{text!r}: a window must be a whole number of microseconds, at least 1us")
    if us > 86_400_000_000 * 366:
        raise ValueError(f"{text!r}: a window longer than a year")
    return int(us)


def _is_timestamp(name: str) -> bool:
    return name.startswith("ts_") or name.endswith("_ts_uptime_us") or name.endswith("_uptime_us")


def _is_counter_table(info: TableInfo) -> bool:
    names = {c.name for c in info.columns}
    return {"count", "time_enabled_ns", "time_running_ns"} <= names


def _is_gauge_table(info: TableInfo) -> bool:
    return (info.description or "").lower().startswith("one row per sample")


def _is_counter_column(desc: str | None, unit: str | None = None) -> bool:
    d = (desc or "").lower()
    return "so far" in d or "cumulative" in d or ("since the probe started" in d and unit == "count")


_NUMERIC = ("int", "uint", "float", "double", "decimal")


def _kind(dtype: str) -> str:
    d = dtype.lower()
    if d.startswith("bool"):
        return "bool"
    if any(d.startswith(n) for n in _NUMERIC):
        return "numeric"
    return "other"


def default_aggregations(info: TableInfo) -> dict[str, list[str]]:
    """The aggregations ``features()`` applies to a table's columns when not told otherwise.

    * perf-style counter tables (``count`` with ``time_enabled_ns`` and
      ``time_running_ns``): ``count`` -> ``change`` (scaled by time enabled over
      time running, for multiplexing) and ``last`` (the running total);
    * a column described as counting "so far" / "since the probe started":
      ``change`` and ``last``;
    * gauge tables (described "One row per sample ..."): ``last`` and ``mean``;
    * event tables: a measure with a unit (durations, sizes, counts):
      ``sum``, ``mean``, ``p50``, ``p90``, ``p99``, ``max``; one without a unit:
      ``mean``, ``max``; a boolean: ``mean`` (the fraction true).
    Every table also gets ``<table>__count`` (rows in the window), and event
    tables ``<table>__rate_per_s``.
    Identifiers (pid, cpu, device, ...), timestamps and strings are not aggregated.
    """
    out: dict[str, list[str]] = {}
    if _is_counter_table(info):
        return {"count": ["change", "last"]}
    gauge = _is_gauge_table(info)
    for c in info.columns:
        if c.name in KEY_COLUMNS or _is_timestamp(c.name) or c.name.endswith("_id"):
            continue
        kind = _kind(c.dtype)
        if kind == "other":
            continue
        if kind == "bool":
            out[c.name] = ["mean"]
        elif _is_counter_column(c.description, c.unit):
            out[c.name] = ["change", "last"]
        elif gauge:
            out[c.name] = ["last", "mean"]
        elif c.unit:
            out[c.name] = ["sum", "mean", "p50", "p90", "p99", "max"]
        else:
            out[c.name] = ["mean", "max"]
    return out


@dataclass
class _Part:
    """One table over every source: rows with a String `collection_id`."""

    name: str
    frame: pl.LazyFrame
    info: TableInfo


@dataclass
class _Sources:
    parts: dict[str, list[_Part]]
    bounds: pl.DataFrame  # collection_id, start_us, end_us (may be null)
    described: list[dict[str, Any]]
    labels: pl.DataFrame | None
    label_names: list[str]
    spans: pl.DataFrame | None = None  # collection_id, bench_start_us, bench_end_us


_MACHINE_KEYS = ("os", "architecture", "cpu_vendor", "cpu_model", "logical_cores", "memory_bytes", "is_vm", "thp_enabled")


def _describe(c: Collection) -> dict[str, Any]:
    m = c.manifest
    over = m.get("collector_overhead") or {}
    info = c.system_info()
    return {
        "collection_id": c.id,
        "path": str(c.path),
        "status": c.status,
        "hostname": m.get("hostname"),
        "kernel_release": m.get("kernel_release"),
        "machine": {k: info[k] for k in _MACHINE_KEYS if k in info},
        "benchmark": m.get("benchmark"),
        "start_uptime_us": c.start_us,
        "end_uptime_us": c.end_us,
        "lost_events": c.lost_events(),
        "collector_overhead": {
            "user_cpu_percent": over.get("user_cpu_percent"),
            "peak_rss_bytes": over.get("peak_rss_bytes"),
            "probes": [
                {k: p.get(k) for k in ("probe", "events", "ns_per_event")}
                for p in over.get("probes") or []
            ],
        },
    }


def _indicator_labels(collections: Sequence[Collection]) -> pl.DataFrame | None:
    frames = []
    for c in collections:
        pi = c.performance_indicator()
        if pi is None:
            continue
        df = pi.collect()
        keep = [x for x in df.columns if x.startswith("result_") or x == "overall_score"]
        if not keep or df.height == 0:
            continue
        frames.append(
            df.select(pl.col("collection_id").cast(pl.String), *keep).tail(1)
        )
    if not frames:
        return None
    return pl.concat(frames, how="diagonal_relaxed")


def _energy_labels(collections: Sequence[Collection]) -> pl.DataFrame | None:
    """Energy per run and zone (``run_energy_uj__<source>:<zone>``) from each ``energy`` table."""
    frames = []
    for c in collections:
        if "energy" not in c.tables:
            continue
        e = c.tables["energy"].collect()
        if e.height == 0:
            continue
        frames.append(
            e.group_by(pl.concat_str([pl.col("source"), pl.lit(":"), pl.col("zone")]).alias("zone"))
            .agg(pl.col("energy_uj").sum())
            .with_columns(pl.lit(c.id).alias("collection_id"))
        )
    if not frames:
        return None
    wide = pl.concat(frames).pivot(on="zone", index="collection_id", values="energy_uj")
    return wide.rename({z: f"run_energy_uj__{z}" for z in wide.columns if z != "collection_id"})


def _benchmark_spans(collections: Sequence[Collection]) -> pl.DataFrame | None:
    """When each collection's benchmark ran: its indicator's end and wall time."""
    rows = []
    for c in collections:
        pi = c.performance_indicator()
        if pi is None:
            continue
        df = pi.select("ts_uptime_us", "wall_time_s").collect()
        if df.height:
            end = int(df["ts_uptime_us"][-1])
            rows.append((c.id, end - int(round(float(df["wall_time_s"][-1]) * 1_000_000)), end))
    if not rows:
        return None
    return pl.DataFrame(rows, schema=["collection_id", "bench_start_us", "bench_end_us"], orient="row")


def _gather(source: Any, labels: bool | Sequence[str]) -> _Sources:
    if isinstance(source, (str, Path)):
        source = open_any(source)
    collections: list[Collection]
    label_frame: pl.DataFrame | None = None
    if isinstance(source, Dataset):
        parts = {
            name: [_Part(name, lf.with_columns(pl.col("collection_id").cast(pl.String)), source.info[name])]
            for name, lf in source.tables.items()
        }
        ids = None
        for p in parts.values():
            f = p[0].frame.select(pl.col("collection_id").unique())
            ids = f if ids is None else pl.concat([ids, f])
        bounds = (
            ids.unique().collect().with_columns(
                pl.lit(None, pl.Int64).alias("start_us"), pl.lit(None, pl.Int64).alias("end_us")
            )
            if ids is not None
            else pl.DataFrame()
        )
        described = [{"collection_id": i} for i in bounds["collection_id"].to_list()]
        return _Sources(parts, bounds, described, None, [])
    if isinstance(source, Experiment):
        collections = source.collections()
        res = source.results
        if labels is not False:
            base = [v for v in source.variables if v in res.columns]
            base += [x for x in ("run_id", "combo_id", "repeat") if x in res.columns]
            base += [x for x in res.columns if x.startswith("result_") or x == "overall_score"]
            if not isinstance(labels, bool):
                missing = [x for x in labels if x not in res.columns]
                if missing:
                    raise KernmlopsError(
                        f"results.parquet has no column {missing[0]!r} to use as a label"
                    )
                base += [x for x in labels if x not in base]
            label_frame = res.filter(pl.col("collection_id").is_not_null()).select(
                pl.col("collection_id").cast(pl.String), *base
            )
    elif isinstance(source, Collection):
        collections = [source]
    else:
        collections = [open_any(s) if isinstance(s, (str, Path)) else s for s in source]
        if not all(isinstance(c, Collection) for c in collections):
            raise KernmlopsError("a list source must hold collections only")
    if not collections:
        raise KernmlopsError("no collections to build features from")
    if label_frame is None and labels is not False:
        label_frame = _indicator_labels(collections)
        if label_frame is not None and not isinstance(labels, bool):
            missing = [x for x in labels if x not in label_frame.columns]
            if missing:
                raise KernmlopsError(f"no label column {missing[0]!r} in the performance indicators")
    parts: dict[str, list[_Part]] = {}
    for c in collections:
        for name, lf in c.tables.items():
            parts.setdefault(name, []).append(
                _Part(name, lf.with_columns(pl.col("collection_id").cast(pl.String)), c.info[name])
            )
    bounds = pl.DataFrame(
        {
            "collection_id": [c.id for c in collections],
            "start_us": [c.start_us for c in collections],
            "end_us": [c.end_us for c in collections],
        },
        schema={"collection_id": pl.String, "start_us": pl.Int64, "end_us": pl.Int64},
    )
    if labels is not False:
        energy = _energy_labels(collections)
        if energy is not None:
            label_frame = energy if label_frame is None else label_frame.join(energy, on="collection_id", how="left")
    label_names = [x for x in label_frame.columns if x != "collection_id"] if label_frame is not None else []
    return _Sources(
        parts, bounds, [_describe(c) for c in collections], label_frame, label_names, _benchmark_spans(collections)
    )


def _agg_expr(col: str, agg: str, out: str) -> pl.Expr:
    c = pl.col(col)
    m = re.fullmatch(r"p(\d{1,2}(?:\.\d+)?)", agg)
    if m:
        return c.quantile(float(m.group(1)) / 100, interpolation="nearest").alias(out)
    exprs = {
        "sum": c.sum(),
        "mean": c.mean(),
        "min": c.min(),
        "max": c.max(),
        "std": c.std(),
        "median": c.median(),
        "first": c.first(),
        "last": c.last(),
        "n_unique": c.n_unique(),
    }
    if agg not in exprs:
        raise KernmlopsError(
            f"unknown aggregation {agg!r} (known: {', '.join(AGGREGATIONS)}, p0..p99)"
        )
    return exprs[agg].alias(out)


@dataclass
class Features:
    """Features per window: one row per (collection, window[, key]).

    ``frame`` columns: ``collection_id``, ``window_start_us``, ``window_end_us``
    (CLOCK_BOOTTIME microseconds, aligned to multiples of the window across
    every table and collection), the key column when grouped (``tgid``,
    ``cpu``, ``cgroup_id``), features named ``<table>__<column>__<agg>`` and
    ``<table>__count``, then label columns (``label_columns``).
    """

    frame: pl.DataFrame
    every_us: int
    by: str | None
    units: dict[str, str] = field(default_factory=dict)
    descriptions: dict[str, str] = field(default_factory=dict)
    label_columns: list[str] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    split: dict[str, Any] | None = None

    @property
    def feature_columns(self) -> list[str]:
        """The feature columns (every ``<table>__...`` column), in frame order."""
        return [c for c in self.frame.columns if "__" in c and c not in self.label_columns]

    def __len__(self) -> int:
        return self.frame.height

    def with_frame(self, frame: pl.DataFrame, split: dict[str, Any] | None = None) -> "Features":
        """The same features' description around another frame (e.g. one side of a split)."""
        return Features(
            frame=frame,
            every_us=self.every_us,
            by=self.by,
            units=self.units,
            descriptions=self.descriptions,
            label_columns=self.label_columns,
            sources=self.sources,
            split=split if split is not None else self.split,
        )

    def to_numpy(self, columns: Sequence[str] | None = None) -> Any:
        """The feature columns (or ``columns``) as a 2-D float NumPy array (needs numpy)."""
        cols = list(columns) if columns is not None else self.feature_columns
        return self.frame.select(pl.col(cols).cast(pl.Float64)).to_numpy()

    def xy(self, label: str, columns: Sequence[str] | None = None) -> tuple[Any, Any]:
        """``(X, y)`` NumPy arrays for scikit-learn: features and one label column."""
        if label not in self.frame.columns:
            raise KernmlopsError(f"no label column {label!r} (labels: {', '.join(self.label_columns)})")
        return self.to_numpy(columns), self.frame[label].to_numpy()

    def to_arrow(self) -> Any:
        """A pyarrow Table whose fields carry ``unit`` and ``description`` metadata."""
        import pyarrow as pa

        table = self.frame.to_arrow()
        fields = []
        for f in table.schema:
            meta = {}
            if f.name in self.units:
                meta[b"unit"] = self.units[f.name].encode()
            if f.name in self.descriptions:
                meta[b"description"] = self.descriptions[f.name].encode()
            fields.append(f.with_metadata(meta) if meta else f)
        return table.cast(pa.schema(fields, metadata={b"kernmlops_card": json.dumps(self.card()).encode()}))

    def card(self) -> dict[str, Any]:
        """The data card: sources, machine and kernel, windows, columns with units, overhead, losses, split."""
        kernels = sorted({s.get("kernel_release") for s in self.sources if s.get("kernel_release")})
        hosts = sorted({s.get("hostname") for s in self.sources if s.get("hostname")})
        lost = {}
        for s in self.sources:
            for t, n in (s.get("lost_events") or {}).items():
                lost[t] = lost.get(t, 0) + n
        return {
            "format": "kernmlops-features-1",
            "rows": self.frame.height,
            "window_us": self.every_us,
            "by": self.by,
            "collections": self.sources,
            "kernels": kernels,
            "hosts": hosts,
            "lost_events": lost,
            "columns": [
                {
                    "name": c,
                    "dtype": str(t),
                    "unit": self.units.get(c),
                    "description": self.descriptions.get(c),
                    "role": "label" if c in self.label_columns else ("feature" if "__" in c else "key"),
                }
                for c, t in self.frame.schema.items()
            ],
            "split": self.split,
        }

    def write(self, path: PathLike) -> Path:
        """Write ``path`` (Parquet, with units in the field metadata) and its data card,
        ``<path>.card.json`` and ``<path>.card.md``. Returns the Parquet path."""
        import pyarrow.parquet as pq

        p = Path(path)
        pq.write_table(self.to_arrow(), p)
        card = self.card()
        Path(str(p) + ".card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
        Path(str(p) + ".card.md").write_text(_card_markdown(card, p.name))
        return p


def _card_markdown(card: dict[str, Any], name: str) -> str:
    lines = [f"# Data card: {name}", ""]
    lines.append(f"- rows: {card['rows']}, window: {card['window_us']} us, grouped by: {card['by'] or 'nothing'}")
    lines.append(f"- kernels: {', '.join(card['kernels']) or 'unknown'}; hosts: {', '.join(card['hosts']) or 'unknown'}")
    machines = sorted({
        f"{m.get('cpu_model', '?')}, {m.get('logical_cores', '?')} CPUs, {int(m.get('memory_bytes') or 0) / 2**30:.0f} GiB"
        + (" (VM)" if m.get("is_vm") else "")
        for m in (s.get("machine") or {} for s in card["collections"]) if m
    })
    if machines:
        lines.append(f"- machines: {'; '.join(machines)}")
    lines.append(f"- collections: {len(card['collections'])}")
    lost = card["lost_events"]
    lines.append(
        "- lost events: "
        + (", ".join(f"{t} {n}" for t, n in sorted(lost.items())) if lost else "none recorded")
    )
    if card["split"]:
        s = card["split"]
        lines.append(f"- split: {json.dumps(s, default=str)}")
    lines += ["", "## Collections", "", "| collection | host | kernel | status | collector CPU % |", "|---|---|---|---|---|"]
    for s in card["collections"]:
        over = (s.get("collector_overhead") or {}).get("user_cpu_percent")
        lines.append(
            f"| {s.get('collection_id')} | {s.get('hostname') or ''} | {s.get('kernel_release') or ''} "
            f"| {s.get('status') or ''} | {'' if over is None else f'{over:.2f}'} |"
        )
    lines += ["", "## Columns", "", "| column | role | unit | description |", "|---|---|---|---|"]
    for c in card["columns"]:
        lines.append(f"| {c['name']} | {c['role']} | {c['unit'] or ''} | {c['description'] or ''} |")
    return "\n".join(lines) + "\n"


def _grid(src: _Sources, every: int, key: str | None, used: list[str]) -> pl.DataFrame:
    """Every window of every collection (aligned to multiples of `every`), with every key seen."""
    ts_bounds = []
    for name in used:
        for p in src.parts[name]:
            ts_bounds.append(
                p.frame.group_by("collection_id").agg(
                    pl.col("ts_uptime_us").cast(pl.Int64).min().alias("lo"),
                    pl.col("ts_uptime_us").cast(pl.Int64).max().alias("hi"),
                )
            )
    b = src.bounds.lazy()
    if ts_bounds:
        tb = pl.concat(ts_bounds).group_by("collection_id").agg(pl.col("lo").min(), pl.col("hi").max())
        b = b.join(tb, on="collection_id", how="left")
    else:
        b = b.with_columns(pl.lit(None, pl.Int64).alias("lo"), pl.lit(None, pl.Int64).alias("hi"))
    b = b.with_columns(
        pl.min_horizontal("start_us", "lo").alias("first"),
        pl.max_horizontal(pl.col("end_us") - 1, "hi").alias("last"),
    ).filter(pl.col("first").is_not_null() & pl.col("last").is_not_null())
    grid = (
        b.select(
            "collection_id",
            pl.int_ranges(
                (pl.col("first") // every) * every, (pl.col("last") // every) * every + every, every
            ).alias("window_start_us"),
        )
        .explode("window_start_us")
        .with_columns((pl.col("window_start_us") + every).alias("window_end_us"))
    )
    if key is not None:
        keys = [
            p.frame.select("collection_id", pl.col(key)).unique()
            for name in used
            for p in src.parts[name]
            if key in p.frame.collect_schema().names()
        ]
        if not keys:
            raise KernmlopsError(f"no table of these has a {key!r} column to group by")
        kf = pl.concat([k.with_columns(pl.col(key).cast(pl.Int64)) for k in keys]).unique()
        grid = grid.join(kf, on="collection_id", how="inner")
    order = ["collection_id", "window_start_us"] + ([key] if key else [])
    return grid.sort(order).collect()


def _concat_parts(parts: list[_Part], key: str | None) -> tuple[pl.LazyFrame, list[str], bool]:
    """One table's parts as one frame, its column names and whether it has the
    ``key`` column to group by."""
    lf = pl.concat([p.frame for p in parts], how="diagonal_relaxed")
    cols = lf.collect_schema().names()
    return lf, cols, key is not None and key in cols


def _windowed(lf: pl.LazyFrame, key: str | None, every: int) -> pl.LazyFrame:
    """``lf`` with integer timestamps (and ``key``, if given) and each row's
    ``window_start_us``."""
    return lf.with_columns(
        pl.col("ts_uptime_us").cast(pl.Int64),
        *([pl.col(key).cast(pl.Int64)] if key is not None else []),
    ).with_columns(((pl.col("ts_uptime_us") // every) * every).alias("window_start_us"))


def _named_by_entity(
    wide: pl.DataFrame,
    group: list[str],
    name: str,
    single_measure: str | None,
    note: Callable[[str, str, str], None],
) -> pl.LazyFrame:
    """A frame pivoted on entities with each measure column (``<measure>\\0<entity>``,
    or the entity alone where ``single_measure`` is the only measure) renamed
    ``<name>__<entity>__<measure>`` and passed to ``note(column, entity, measure)``:
    the ``group`` columns first, then the others sorted by name."""
    renamed = {}
    for col in wide.columns:
        if col in group:
            continue
        measure, _, ent = col.partition("\0")
        if not ent and single_measure is not None:  # polars names the column by the entity alone
            measure, ent = single_measure, col
        out = f"{name}__{ent}__{measure}"
        renamed[col] = out
        note(out, ent, measure)
    wide = wide.rename(renamed)
    return wide.select(*group, *sorted(c for c in wide.columns if c not in group)).lazy()


def _table_features(
    parts: list[_Part],
    every: int,
    key: str | None,
    aggs: Mapping[str, Sequence[str]],
    units: dict[str, str],
    descs: dict[str, str],
) -> tuple[pl.LazyFrame, list[str], list[str], bool]:
    """One table's aggregates per (collection, window[, key]).

    Returns the frame, the columns to zero-fill, the columns to forward-fill
    (running totals and gauges' values) and whether it is grouped by `key`."""
    info = parts[0].info
    name = info.name
    lf, cols, keyed = _concat_parts(parts, key)
    part_by = ["collection_id"] + ([key] if keyed else [])
    lf = _windowed(lf, key if keyed else None, every)
    counter_table = _is_counter_table(info)
    gauge = _is_gauge_table(info)
    exprs: list[pl.Expr] = [pl.len().alias(f"{name}__count")]
    units[f"{name}__count"] = "count"
    descs[f"{name}__count"] = f"rows of {name} in the window"
    zero, ffill = [f"{name}__count"], []
    if not gauge and not counter_table:
        exprs.append((pl.len() / (every / 1_000_000)).alias(f"{name}__rate_per_s"))
        units[f"{name}__rate_per_s"] = "1/s"
        descs[f"{name}__rate_per_s"] = f"rows of {name} per second in the window"
        zero.append(f"{name}__rate_per_s")
    pre: list[pl.Expr] = []
    for col, wanted in aggs.items():
        if col not in cols:
            raise KernmlopsError(f"table {name} has no column {col!r} to aggregate")
        try:
            c = info.column(col)
            unit, desc = c.unit, c.description
        except KeyError:
            unit, desc = None, None
        for agg in wanted:
            out = f"{name}__{col}__{agg}"
            units_of = unit
            if agg in ("change", "last") and (counter_table and col == "count" or _is_counter_column(desc, unit) or agg == "change"):
                # A running counter: per row, what it added since the row before
                # (the first row counts from the probe's start), scaled for
                # multiplexing in perf-style tables; `last` is the running total.
                cpu_part = part_by + (["cpu"] if counter_table and "cpu" in cols and not (keyed and key == "cpu") else [])
                d = (pl.col(col).cast(pl.Float64) - pl.col(col).cast(pl.Float64).shift(1).over(cpu_part)).fill_null(
                    pl.col(col).cast(pl.Float64)
                )
                if counter_table and col == "count":
                    den = (pl.col("time_enabled_ns").cast(pl.Float64) - pl.col("time_enabled_ns").cast(pl.Float64).shift(1).over(cpu_part)).fill_null(pl.col("time_enabled_ns").cast(pl.Float64))
                    drun = (pl.col("time_running_ns").cast(pl.Float64) - pl.col("time_running_ns").cast(pl.Float64).shift(1).over(cpu_part)).fill_null(pl.col("time_running_ns").cast(pl.Float64))
                    scaled = pl.when(drun > 0).then(d * den / drun).otherwise(d)
                else:
                    scaled = d
                dname, tname = f"__d_{col}", f"__t_{col}"
                if not any(e.meta.output_name() == dname for e in pre):
                    pre.append(scaled.alias(dname))
                    pre.append(d.cum_sum().over(part_by).alias(tname))
                if agg == "change":
                    exprs.append(pl.col(dname).sum().alias(out))
                    zero.append(out)
                    descs[out] = f"increase of {name}.{col} in the window" + (
                        ", scaled by time enabled over time running" if counter_table and col == "count" else ""
                    )
                else:
                    exprs.append(pl.col(tname).last().alias(out))
                    ffill.append(out)
                    descs[out] = f"running total of {name}.{col} at the window's last row"
            else:
                exprs.append(_agg_expr(col, agg, out))
                if agg == "last" or gauge:
                    ffill.append(out)
                else:
                    zero.append(out)
                descs[out] = f"{agg} of {name}.{col} over the window" + (f" ({desc})" if desc else "")
            if agg == "n_unique":
                units_of = "count"
            if units_of:
                units[out] = units_of
    ordered = bool(pre) or gauge or any(a in ("first", "last") for w in aggs.values() for a in w)
    if ordered:
        # Running counters and last values need the rows in time order; plain
        # event aggregates do not, and skip the sort (the costly part).
        lf = lf.sort(["collection_id", "ts_uptime_us"])
    if pre:
        lf = lf.with_columns(pre)
    group = ["collection_id", "window_start_us"] + ([key] if keyed else [])
    agg = lf.group_by(group, maintain_order=False).agg(exprs)
    # Each table's aggregate is computed on its own with the streaming engine,
    # so a table larger than memory is read in batches.
    return agg.collect(engine="streaming").lazy(), zero, ffill, keyed


def _is_long_table(info: TableInfo) -> bool:
    """A counter-per-row table: ``key``, ``value`` and ``delta`` columns (e.g. procfs_vmstat)."""
    return {"key", "value", "delta"} <= {c.name for c in info.columns}


def _entity_column(info: TableInfo) -> str | None:
    """The one label column of a per-sample table naming what a row is about (a disk,
    an interface, a PSI resource), whose rows become columns per entity."""
    if not _is_gauge_table(info):
        return None
    labels = [c.name for c in info.columns if c.dtype.lower().startswith(("string", "large_string", "utf8", "dictionary")) and c.name != "collection_id"]
    return labels[0] if len(labels) == 1 else None


def _is_delta_column(name: str, desc: str | None) -> bool:
    d = (desc or "").lower()
    return name == "delta" or name.endswith("_delta") or d.startswith("increase")


def _pivoted_features(
    parts: list[_Part],
    every: int,
    key: str | None,
    units: dict[str, str],
    descs: dict[str, str],
) -> tuple[pl.LazyFrame, list[str], list[str], bool]:
    """Long tables (``key``/``value``/``delta``) and per-entity sample tables, one
    column per counter or entity: ``<table>__<key>__change`` (sum of the deltas in
    the window) and ``<table>__<key>__last`` (the raw value); for entity tables
    ``<table>__<entity>__<column>__<agg>``. Rows of several CPUs add up unless
    grouped by CPU."""
    info = parts[0].info
    name = info.name
    lf, cols, keyed = _concat_parts(parts, key)
    lf = _windowed(lf, key if keyed else None, every)
    group = ["collection_id", "window_start_us"] + ([key] if keyed else [])
    zero: list[str] = []
    ffill: list[str] = []
    if _is_long_table(info):
        entity = "key"
        # One sample's value of a counter is the sum over CPUs at that instant.
        per_sample = lf.group_by([*group, "ts_uptime_us", entity]).agg(
            pl.col("value").cast(pl.Float64).sum(), pl.col("delta").cast(pl.Float64).sum()
        )
        agg = per_sample.sort("ts_uptime_us").group_by([*group, entity]).agg(
            pl.col("delta").sum().alias("change"), pl.col("value").last().alias("last")
        )
        measures = {"change": ("delta", "increase in the window"), "last": ("value", "value at the window's last sample")}
    else:
        entity = _entity_column(info)
        assert entity is not None
        numeric = [
            c for c in info.columns
            if c.name not in (entity, "collection_id") and c.name not in KEY_COLUMNS
            and not _is_timestamp(c.name) and _kind(c.dtype) == "numeric"
        ]
        exprs = []
        measures = {}
        for c in numeric:
            if _is_delta_column(c.name, c.description):
                exprs.append(pl.col(c.name).cast(pl.Float64).sum().alias(f"{c.name}__sum"))
                measures[f"{c.name}__sum"] = (c.name, "sum over the window")
            else:
                exprs.append(pl.col(c.name).cast(pl.Float64).last().alias(f"{c.name}__last"))
                measures[f"{c.name}__last"] = (c.name, "at the window's last sample")
        agg = lf.sort("ts_uptime_us").group_by([*group, entity]).agg(exprs)
    agg = agg.collect(engine="streaming")
    wide = agg.with_columns(pl.col(entity).cast(pl.String)).pivot(
        on=entity, index=group, values=list(measures), separator="\0"
    )

    def note(out: str, ent: str, measure: str) -> None:
        src_col, what = measures[measure]
        try:
            unit = info.column(src_col).unit
        except KeyError:
            unit = None
        if unit:
            units[out] = unit
        descs[out] = f"{name} {ent}: {src_col}, {what}"
        (ffill if measure.endswith("last") else zero).append(out)

    return _named_by_entity(wide, group, name, next(iter(measures), None), note), zero, ffill, keyed


def _is_slot_table(info: TableInfo) -> bool:
    """Energy over time slots (``slot_start_us`` .. ``ts_uptime_us``, ``energy_uj``)."""
    return {"slot_start_us", "energy_uj"} <= {c.name for c in info.columns}


def _slot_features(
    parts: list[_Part],
    every: int,
    key: str | None,
    units: dict[str, str],
    descs: dict[str, str],
) -> tuple[pl.LazyFrame, list[str], list[str], bool]:
    """Energy tables: each slot's energy split over the windows it overlaps, in
    proportion to the overlap, per zone (``energy``: ``<table>__<source>:<zone>__energy_uj``
    and ``__measured``, true only when every part was measured) or per scope
    (``energy_attribution``, per process when grouped by tgid)."""
    info = parts[0].info
    name = info.name
    lf, cols, keyed = _concat_parts(parts, key)
    if "zone" in cols:
        entity = pl.concat_str([pl.col("source"), pl.lit(":"), pl.col("zone")]).alias("__entity")
    else:
        entity = pl.col("scope").cast(pl.String).alias("__entity")
    start, end = pl.col("slot_start_us").cast(pl.Int64), pl.col("ts_uptime_us").cast(pl.Int64)
    lf = (
        lf.with_columns(entity, *([pl.col(key).cast(pl.Int64)] if keyed else []))
        .with_columns(
            pl.int_ranges((start // every) * every, ((end - 1) // every) * every + every, every).alias("window_start_us")
        )
        .explode("window_start_us")
        .with_columns(
            (
                pl.col("energy_uj").cast(pl.Float64)
                * (pl.min_horizontal(end, pl.col("window_start_us") + every) - pl.max_horizontal(start, pl.col("window_start_us"))).cast(pl.Float64)
                / pl.max_horizontal(end - start, pl.lit(1)).cast(pl.Float64)
            ).alias("__part")
        )
    )
    group = ["collection_id", "window_start_us"] + ([key] if keyed else [])
    agg = lf.group_by([*group, "__entity"]).agg(
        pl.col("__part").sum().alias("energy_uj"), pl.col("measured").all().alias("measured")
    ).collect(engine="streaming")
    wide = agg.pivot(on="__entity", index=group, values=["energy_uj", "measured"], separator="\0")
    zero: list[str] = []
    ffill: list[str] = []

    def note(out: str, ent: str, measure: str) -> None:
        if measure == "energy_uj":
            units[out] = "uJ"
            descs[out] = f"{name} {ent}: energy in the window (slots split by overlap)"
            zero.append(out)
        else:
            descs[out] = f"{name} {ent}: true when a meter measured all of it, false when modelled"
            ffill.append(out)

    return _named_by_entity(wide, group, name, None, note), zero, ffill, keyed


def features(
    source: Any,
    every: str | int | float = "100ms",
    by: str | None = None,
    tables: Sequence[str] | None = None,
    aggregations: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
    labels: bool | Sequence[str] = True,
    during: str | None = None,
) -> Features:
    """Put every table of ``source`` on one time grid and aggregate each window.

    ``source``: a collection, a list of them, an experiment, a Hive dataset, or a
    folder of any of these. ``every``: the window ("100ms", "1s", microseconds
    as an int). ``by``: ``None`` (whole machine), ``"tgid"``, ``"pid"``, ``"cpu"``
    or ``"cgroup"``: one row per key per window (tables without the key column
    are aggregated over the machine and repeated on each key's row).
    ``tables``: the tables to use (default: every event table).
    ``aggregations``: ``{table: {column: ["sum", "p99", ...]}}`` replacing the
    defaults of the tables named (see ``default_aggregations``).
    ``labels``: True joins the experiment's variables, run and combination ids
    and the benchmark's ``result_*`` figures (from each collection's
    performance indicator otherwise); a list adds result columns by name;
    False joins none.
    ``during="benchmark"`` keeps only the windows that lie wholly inside the
    time the benchmark ran (from its performance indicator: end and wall
    time), leaving out set-up and tear-down; collections without a benchmark
    are then refused.

    Windows start at multiples of ``every`` on CLOCK_BOOTTIME, so the windows
    of every table and collection line up; every window from the collection's
    start to its end is present: counts, sums and changes are 0 in a window
    without rows, running totals and gauges keep their last value (0 before
    the first row).
    """
    every_us = parse_duration_us(every)
    if during not in (None, "benchmark"):
        raise KernmlopsError(f"during={during!r}: expected None or 'benchmark'")
    key = None
    if by is not None:
        if by not in _BY:
            raise KernmlopsError(f"by={by!r}: expected one of {', '.join(_BY)} or None")
        key = _BY[by]
    src = _gather(source, labels)
    names = sorted(src.parts)
    if tables is not None:
        unknown = [t for t in tables if t not in src.parts]
        if unknown:
            raise KernmlopsError(
                f"no table {unknown[0]!r} in the source (tables: {', '.join(names)})"
            )
        names = list(tables)
    aggregations = aggregations or {}
    for t in aggregations:
        if t not in names:
            raise KernmlopsError(f"aggregations name table {t!r}, which is not used")
    names = [n for n in names if "ts_uptime_us" in {c.name for c in src.parts[n][0].info.columns}]
    if not names:
        raise KernmlopsError("no event table with ts_uptime_us to build features from")
    grid = _grid(src, every_us, key, names)
    units: dict[str, str] = {"window_start_us": "us", "window_end_us": "us"}
    descs: dict[str, str] = {
        "window_start_us": "start of the window (CLOCK_BOOTTIME)",
        "window_end_us": "end of the window, exclusive (CLOCK_BOOTTIME)",
    }
    frame = grid.lazy()
    order = ["collection_id", "window_start_us"] + ([key] if key else [])
    for name in names:
        info = src.parts[name][0].info
        if name not in aggregations and _is_slot_table(info) and ("zone" in {c.name for c in info.columns} or "scope" in {c.name for c in info.columns}):
            agg, zero, ffill, keyed = _slot_features(src.parts[name], every_us, key, units, descs)
        elif name not in aggregations and (_is_long_table(info) or _entity_column(info)):
            agg, zero, ffill, keyed = _pivoted_features(src.parts[name], every_us, key, units, descs)
        else:
            aggs = aggregations.get(name) or default_aggregations(info)
            agg, zero, ffill, keyed = _table_features(src.parts[name], every_us, key, aggs, units, descs)
        on = ["collection_id", "window_start_us"] + ([key] if keyed else [])
        frame = frame.join(agg, on=on, how="left")
        part = ["collection_id"] + ([key] if key else [])
        frame = frame.sort(order).with_columns(
            *[pl.col(c).fill_null(0) for c in zero],
            *[pl.col(c).forward_fill().over(part).fill_null(0) for c in ffill],
        )
    out = frame.sort(order).collect()
    if during == "benchmark":
        spans = src.spans
        have = set(spans["collection_id"].to_list()) if spans is not None else set()
        missing = sorted(set(src.bounds["collection_id"].to_list()) - have)
        if missing:
            raise KernmlopsError(f"during='benchmark': collection {missing[0]} ran no benchmark")
        assert spans is not None
        out = (
            out.join(spans, on="collection_id", how="inner")
            .filter(
                (pl.col("window_start_us") >= pl.col("bench_start_us"))
                & (pl.col("window_end_us") <= pl.col("bench_end_us"))
            )
            .drop("bench_start_us", "bench_end_us")
        )
    if src.labels is not None and src.label_names:
        out = out.join(src.labels, on="collection_id", how="left")
    return Features(
        frame=out,
        every_us=every_us,
        by=by,
        units=units,
        descriptions=descs,
        label_columns=list(src.label_names),
        sources=src.described,
    )


def history(
    frame: Union[pl.DataFrame, pl.LazyFrame],
    columns: Sequence[str],
    n: int = 4,
    by: Sequence[str] | str | None = None,
    order: str = "ts_uptime_us",
) -> Union[pl.DataFrame, pl.LazyFrame]:
    """Per-event history features: for each row, the previous ``n`` values of
    ``columns`` within its collection (and ``by`` key, e.g. ``"device"``), in
    ``order``. Adds ``<column>__prev1`` .. ``<column>__prev<n>`` (null where there
    is no earlier row). Only earlier rows are used: no row sees a later one.
    """
    if n < 1 or n > 1024:
        raise KernmlopsError(f"history of {n} rows: expected 1 to 1024")
    keys = ["collection_id"] if "collection_id" in frame.collect_schema().names() else []
    if isinstance(by, str):
        keys.append(by)
    elif by:
        keys.extend(by)
    lazy = isinstance(frame, pl.LazyFrame)
    lf = frame.lazy().sort([*keys, order], maintain_order=True)
    shifted = [
        (pl.col(c).shift(k).over(keys) if keys else pl.col(c).shift(k)).alias(f"{c}__prev{k}")
        for c in columns
        for k in range(1, n + 1)
    ]
    lf = lf.with_columns(shifted)
    return lf if lazy else lf.collect()
