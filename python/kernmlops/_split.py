"""Leak-free splits: whole groups (runs, combinations, any column) on one side only."""

from __future__ import annotations

import math
import random
from typing import Any, TypeVar, Union

import polars as pl

from ._features import Features
from ._read import KernmlopsError

Data = TypeVar("Data", pl.DataFrame, Features)


def _frame(data: Union[pl.DataFrame, Features]) -> pl.DataFrame:
    return data.frame if isinstance(data, Features) else data


def _groups(frame: pl.DataFrame, by: str, seed: int) -> list[Any]:
    if by not in frame.columns:
        raise KernmlopsError(f"cannot split by {by!r}: no such column (columns: {', '.join(frame.columns[:12])} ...)")
    if frame[by].null_count():
        raise KernmlopsError(f"cannot split by {by!r}: {frame[by].null_count()} rows have no value")
    groups = sorted(frame[by].unique().to_list(), key=lambda v: (str(type(v)), v))
    random.Random(seed).shuffle(groups)
    return groups


def _side(data: Data, frame: pl.DataFrame, info: dict[str, Any]) -> Data:
    if isinstance(data, Features):
        return data.with_frame(frame, split=info)  # type: ignore[return-value]
    return frame  # type: ignore[return-value]


def split(data: Data, by: str = "collection_id", test: float = 0.2, seed: int = 0) -> tuple[Data, Data]:
    """Split rows into ``(train, test)`` by whole groups of ``by``.

    ``by``: ``"collection_id"`` (runs), ``"combo_id"`` (every repeat of one
    setting on the same side), or any column. ``test``: the fraction of groups
    in the test side (at least one group on each side). The same ``seed``
    gives the same split; with :class:`Features` the split (groups on each
    side, seed) is recorded in ``features.split`` and in the data card.
    """
    if not 0 < test < 1:
        raise KernmlopsError(f"test={test}: expected a fraction between 0 and 1")
    frame = _frame(data)
    groups = _groups(frame, by, seed)
    if len(groups) < 2:
        raise KernmlopsError(f"cannot split by {by!r}: {len(groups)} group(s), need at least 2")
    n_test = min(len(groups) - 1, max(1, math.ceil(test * len(groups))))
    test_groups, train_groups = groups[:n_test], groups[n_test:]
    info = {"by": by, "seed": seed, "test": test, "train_groups": sorted(map(str, train_groups)), "test_groups": sorted(map(str, test_groups))}
    return (
        _side(data, frame.filter(pl.col(by).is_in(train_groups)), {**info, "side": "train"}),
        _side(data, frame.filter(pl.col(by).is_in(test_groups)), {**info, "side": "test"}),
    )


def kfold(data: Data, k: int = 5, by: str = "collection_id", seed: int = 0) -> list[tuple[Data, Data]]:
    """``k`` (train, test) pairs; each group is in exactly one test side, never in both sides of a pair."""
    frame = _frame(data)
    groups = _groups(frame, by, seed)
    if not 2 <= k <= len(groups):
        raise KernmlopsError(f"k={k} folds over {len(groups)} groups of {by!r}: need 2 <= k <= groups")
    folds = [groups[i::k] for i in range(k)]
    out = []
    for i, test_groups in enumerate(folds):
        train_groups = [g for j, f in enumerate(folds) if j != i for g in f]
        info = {"by": by, "seed": seed, "fold": i, "k": k, "train_groups": sorted(map(str, train_groups)), "test_groups": sorted(map(str, test_groups))}
        out.append(
            (
                _side(data, frame.filter(pl.col(by).is_in(train_groups)), {**info, "side": "train"}),
                _side(data, frame.filter(pl.col(by).is_in(test_groups)), {**info, "side": "test"}),
            )
        )
    return out
