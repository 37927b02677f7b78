"""Splits put whole groups on one side, for every mode, reproducibly."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import kernmlops


def frame() -> pl.DataFrame:
    n = 600
    return pl.DataFrame(
        {
            "collection_id": [f"c{i % 12}" for i in range(n)],
            "combo_id": [f"k{i % 12 // 3}" for i in range(n)],
            "host": [["a", "b", "c"][i % 3] for i in range(n)],
            "x": list(range(n)),
        }
    )


@pytest.mark.parametrize("by", ["collection_id", "combo_id", "host"])
def test_no_group_on_both_sides(by: str) -> None:
    df = frame()
    train, test = kernmlops.split(df, by=by, test=0.25, seed=4)
    assert set(train[by]).isdisjoint(set(test[by]))
    assert train.height + test.height == df.height
    assert train.height and test.height
    folds = kernmlops.kfold(df, k=3, by=by, seed=4)
    seen = []
    for tr, te in folds:
        assert set(tr[by]).isdisjoint(set(te[by]))
        assert tr.height + te.height == df.height
        seen += sorted(set(te[by]))
    assert sorted(seen) == sorted(set(df[by]))


def test_the_same_seed_gives_the_same_split() -> None:
    df = frame()
    a = kernmlops.split(df, test=0.3, seed=11)
    b = kernmlops.split(df, test=0.3, seed=11)
    assert a[1]["x"].to_list() == b[1]["x"].to_list()
    others = {tuple(sorted(set(kernmlops.split(df, test=0.3, seed=s)[1]["collection_id"]))) for s in range(8)}
    assert len(others) > 1


def test_split_of_features_is_recorded(experiment_dir: Path) -> None:
    f = kernmlops.features(kernmlops.open_experiment(experiment_dir), every="100ms")
    train, test = kernmlops.split(f, by="combo_id", test=0.5, seed=2)
    assert isinstance(train, kernmlops.Features)
    assert set(train.frame["combo_id"]).isdisjoint(set(test.frame["combo_id"]))
    assert test.split["side"] == "test" and test.split["by"] == "combo_id"
    assert test.card()["split"]["test_groups"] == sorted(set(test.frame["combo_id"]))


def test_split_refuses_what_cannot_be_split() -> None:
    with pytest.raises(kernmlops.KernmlopsError, match="no such column"):
        kernmlops.split(frame(), by="nope")
    with pytest.raises(kernmlops.KernmlopsError, match="need at least 2"):
        kernmlops.split(frame().filter(pl.col("host") == "a"), by="host")
    with pytest.raises(kernmlops.KernmlopsError, match="between 0 and 1"):
        kernmlops.split(frame(), test=1.5)
