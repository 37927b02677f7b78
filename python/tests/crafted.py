"""Crafted collection folders: hand-written Arrow tables with known answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.ipc as ipc


def field(name: str, type_: pa.DataType, unit: str | None = None, description: str | None = None) -> pa.Field:
    meta = {}
    if unit:
        meta[b"unit"] = unit.encode()
    if description:
        meta[b"description"] = description.encode()
    return pa.field(name, type_, metadata=meta or None)


def write_collection(
    root: Path,
    cid: str,
    start_us: int,
    end_us: int,
    tables: Mapping[str, tuple[list[pa.Field], dict[str, list[Any]], str]],
) -> Path:
    """`tables`: name -> (fields without collection_id, columns, table description)."""
    d = root / cid
    d.mkdir(parents=True)
    entries = {}
    for name, (fields, columns, description) in tables.items():
        n = len(next(iter(columns.values())))
        schema = pa.schema(
            [pa.field("collection_id", pa.dictionary(pa.int32(), pa.string()))] + fields,
            metadata={b"description": description.encode(), b"table": name.encode()},
        )
        arrays = [pa.array([cid] * n).dictionary_encode()] + [
            pa.array(columns[f.name], type=f.type) for f in fields
        ]
        with ipc.new_file(d / f"{name}.arrow", schema) as w:
            w.write_batch(pa.record_batch(arrays, schema=schema))
        entries[name] = {"probe": name, "file": f"{name}.arrow", "rows": n, "lost_events": 0}
    manifest = {
        "collection_id": cid,
        "status": "complete",
        "hostname": "crafted",
        "kernel_release": "0.0-crafted",
        "start": {"uptime_us": start_us},
        "end": {"uptime_us": end_us},
        "tables": entries,
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d
