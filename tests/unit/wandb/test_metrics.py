"""Reported metrics to W&B history rows, and the run config (pure)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ray_wandb_nodes._wandb.metrics import flatten, jsonable, to_row


def test_nested_metrics_flatten_with_slashes() -> None:
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": {}}) == {"a/b": 1, "a/c/d": 2, "e": {}}


def test_row_keeps_numbers_and_strings_and_applies_excludes() -> None:
    metrics = {
        "loss": 0.5,
        "step": np.int64(3),
        "acc": np.float32(0.25),
        "t": torch.tensor(2.5),
        "flag": True,
        "phase": "warmup",
        "opt": {"lr": 0.1, "mom": 0.9},
        "secret_stuff": 1,
        "done": False,
        "should_checkpoint": True,
    }
    row, skipped = to_row(metrics, excludes=["opt/mom", "secret_stuff"])
    assert row == {"loss": 0.5, "step": 3, "acc": 0.25, "t": 2.5, "flag": True, "phase": "warmup", "opt/lr": 0.1}
    assert skipped == []


def test_row_skips_what_wandb_cannot_chart_and_names_it() -> None:
    metrics = {"ok": 1, "vec": [1, 2], "arr": np.zeros(3), "obj": object(), "none": None, "big": "x" * 70_000}
    row, skipped = to_row(metrics, excludes=[])
    assert row == {"ok": 1}
    assert skipped == [
        "'vec' (a list, not a number or a short string)",
        "'arr' (a ndarray, not a number or a short string)",
        "'obj' (a object, not a number or a short string)",
        "'none' (a NoneType, not a number or a short string)",
        "'big' (a string of 70000 characters, not a number or a short string)",
    ]


def test_row_keeps_nan_inf_and_odd_keys_as_wandb_logs_them() -> None:
    row, skipped = to_row(
        {"nan": float("nan"), "inf": float("-inf"), "a key/with space": 1, "t": torch.tensor([3])}, []
    )
    assert math.isnan(row["nan"]) and row["inf"] == float("-inf")
    assert row["a key/with space"] == 1 and row["t"] == 3 and skipped == []


def test_exclude_prefix_matches_whole_path_segments_only() -> None:
    row, _ = to_row({"lr": 1, "lr_decay": 2, "lr/group0": 3}, excludes=["lr"])
    assert row == {"lr_decay": 2}


def test_config_names_what_wandb_cannot_serialise() -> None:
    from ray_wandb_nodes._wandb.metrics import config_for_wandb

    warnings: list[str] = []
    out = config_for_wandb(
        {"lr": 0.1, "model": {"fn": print, "layers": [1, object()]}}, lambda k, m: warnings.append(m)
    )
    assert out["lr"] == 0.1 and out["model"]["fn"] == repr(print)
    assert len(warnings) == 1 and "model.fn" in warnings[0] and "model.layers[1]" in warnings[0]


def test_jsonable_config() -> None:
    out = jsonable({"a": np.int64(2), "b": (1, 2.0), "c": float("inf"), "d": object, "e": {"f": None}})
    assert out["a"] == 2 and isinstance(out["a"], int)
    assert out["b"] == [1, 2.0]
    assert out["c"] == "inf"
    assert out["d"] == repr(object)
    assert out["e"] == {"f": None}
    assert not any(isinstance(v, float) and math.isnan(v) for v in out.values())
