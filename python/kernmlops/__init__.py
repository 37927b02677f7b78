"""kernmlops for Python: read collections, collect from a notebook, and turn
collections into leak-free training sets.

Reading::

    import kernmlops
    c = kernmlops.open_collection("data/20261126-101500-1a2b3c4d5e6f")
    c.table("quanta_runtime").collect()        # a polars DataFrame, declared types
    c.info["quanta_runtime"].units               # {"ts_uptime_us": "us", ...}
    e = kernmlops.open_experiment("experiments/sweep")
    e.results                                     # one row per run, with the variables

Collecting (as root)::

    with kernmlops.collect(plugins=["quanta_runtime", "block_io"]) as c:
        run_my_workload()
    c.collection

Training sets::

    f = kernmlops.features(e, every="100ms")     # windows x features, labels joined
    train, test = kernmlops.split(f, by="combo_id", test=0.25, seed=1)
    X, y = train.xy("result_lines_per_s")
    f.write("features.parquet")                  # plus a data card

Only polars and pyarrow are needed (NumPy for ``to_numpy``).
"""

from ._collect import Collecting, collect, find_binary, run_experiment, to_toml
from ._features import (
    AGGREGATIONS,
    Features,
    default_aggregations,
    features,
    history,
    parse_duration_us,
)
from ._read import (
    Collection,
    Column,
    Dataset,
    Experiment,
    KernmlopsError,
    TableInfo,
    open_any,
    open_collection,
    open_dataset,
    open_experiment,
)
from ._split import kfold, split

__version__ = "0.1.0"

__all__ = [
    "AGGREGATIONS",
    "Collecting",
    "Collection",
    "Column",
    "Dataset",
    "Experiment",
    "Features",
    "KernmlopsError",
    "TableInfo",
    "collect",
    "default_aggregations",
    "features",
    "find_binary",
    "history",
    "kfold",
    "open_any",
    "open_collection",
    "open_dataset",
    "open_experiment",
    "parse_duration_us",
    "run_experiment",
    "split",
    "to_toml",
]
