"""Open every table of a kernmlops collection with pyarrow and polars.

Prints JSON: {table: {pyarrow: {column: type}, polars: {column: type},
pyarrow_rows, polars_rows}}. Used by the end-to-end tests; also a quick
check that a collection is readable: python3 read_back.py data/<id>
"""
import json
import pathlib
import sys

import polars as pl
import pyarrow.ipc as ipc


def main(folder: str) -> None:
    out = {}
    for path in sorted(pathlib.Path(folder).glob("*.arrow")):
        with ipc.open_file(path) as reader:
            table = reader.read_all()
        frame = pl.read_ipc(path)
        out[path.stem] = {
            "pyarrow": {f.name: str(f.type) for f in table.schema},
            "polars": {name: str(dtype) for name, dtype in frame.schema.items()},
            "pyarrow_rows": table.num_rows,
            "polars_rows": frame.height,
        }
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
