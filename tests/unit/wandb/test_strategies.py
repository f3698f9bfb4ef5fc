"""Strategy planning and rank reductions (pure)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from ray_wandb_nodes import WandbNodesCallback
from ray_wandb_nodes._config.values import RankMetrics, RunsPer
from ray_wandb_nodes._wandb.strategies import Placement, child_run_id, combine_ranks, plan_runs

PLACEMENTS = [
    Placement(rank=0, node_id="aaaaaa01", hostname="gpu-a", gpu_ids=("0",)),
    Placement(rank=1, node_id="aaaaaa01", hostname="gpu-a", gpu_ids=("1",)),
    Placement(rank=2, node_id="bbbbbb02", hostname="gpu-b", gpu_ids=("0",)),
    Placement(rank=3, node_id="bbbbbb02", hostname="gpu-b", gpu_ids=("1",)),
]


def test_node_strategy_plans_one_run_per_node_for_its_lowest_rank() -> None:
    runs = plan_runs(RunsPer.NODE, list(reversed(PLACEMENTS)), "exp-123")
    assert [(r.name, r.node_id, r.rank, r.label) for r in runs] == [
        ("node-gpu-a-aaaaaa", "aaaaaa01", 0, "node-gpu-a-aaaaaa"),
        ("node-gpu-b-bbbbbb", "bbbbbb02", 2, "node-gpu-b-bbbbbb"),
    ]
    assert [r.run_id for r in runs] == ["exp-123-node-gpu-a-aaaaaa", "exp-123-node-gpu-b-bbbbbb"]


def test_all_strategy_plans_one_run_per_rank_on_its_node_with_its_gpus() -> None:
    runs = plan_runs(RunsPer.RANK, PLACEMENTS, "exp-123")
    assert [(r.run_id, r.name, r.node_id, r.gpu_ids) for r in runs] == [
        ("exp-123-rank-0", "rank-0", "aaaaaa01", ("0",)),
        ("exp-123-rank-1", "rank-1", "aaaaaa01", ("1",)),
        ("exp-123-rank-2", "rank-2", "bbbbbb02", ("0",)),
        ("exp-123-rank-3", "rank-3", "bbbbbb02", ("1",)),
    ]


def test_run_ids_do_not_depend_on_where_a_rank_runs() -> None:
    moved = [Placement(rank=p.rank, node_id="cccccc03", hostname="gpu-c") for p in PLACEMENTS]
    runs = plan_runs(RunsPer.RANK, moved, "x")
    assert [r.run_id for r in runs] == [r.run_id for r in plan_runs(RunsPer.RANK, PLACEMENTS, "x")]


def test_child_run_ids_stay_short_and_safe() -> None:
    long_id = child_run_id("a" * 60, "node-some-very-long-hostname-abcdef")
    assert len(long_id) <= 64 and re.fullmatch(r"[A-Za-z0-9_-]+", long_id)
    assert long_id != child_run_id("a" * 60, "node-some-very-long-hostname-abcdeg")


def test_rank0_and_all_modes() -> None:
    ranks = [{"loss": 1.0, "opt": {"lr": 0.1}}, {"loss": 3.0}]
    assert combine_ranks(ranks, RankMetrics.RANK0) == {"loss": 1.0, "opt": {"lr": 0.1}}
    assert combine_ranks(ranks, RankMetrics.ALL) == {"rank_0/loss": 1.0, "rank_0/opt/lr": 0.1, "rank_1/loss": 3.0}


def test_reduce_over_ranks_with_different_keys_and_types() -> None:
    ranks = [
        {"loss": 1.0, "tok_s": np.float32(100.0), "phase": "warm", "t": torch.tensor(2.0)},
        {"loss": 3.0, "tok_s": 40, "extra": 5},
        {"loss": 2.0, "tok_s": 90, "phase": "hot", "t": torch.tensor(4.0)},
    ]
    row = combine_ranks(ranks, RankMetrics.REDUCE)
    assert row["loss/mean"] == 2.0 and row["loss/min"] == 1.0 and row["loss/max"] == 3.0
    assert row["loss/std"] == pytest.approx(math.sqrt(2 / 3))
    assert (row["loss/argmax_rank"], row["loss/argmin_rank"]) == (1, 0)
    assert (row["tok_s/argmin_rank"], row["tok_s/min"]) == (1, 40.0)  # the straggler
    assert (row["extra/mean"], row["extra/argmax_rank"]) == (5.0, 1)
    assert (row["t/mean"], row["t/argmax_rank"]) == (3.0, 2)  # rank 1 has no t
    assert row["phase"] == "warm"  # not numeric: as rank 0 reported it
    assert "loss" not in row


def test_reduce_leaves_out_nan_and_mixed_types_as_rank0_had_them() -> None:
    row = combine_ranks([{"x": float("nan"), "y": "a"}, {"x": 1.0, "y": 2}], RankMetrics.REDUCE)
    assert math.isnan(row["x"]) and row["y"] == "a"


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [({"strategy": "rank0"}, "strategy='rank0'"), ({"rank_metrics": "mean"}, "rank_metrics='mean'")],
)
def test_bad_strategy_or_rank_metrics_is_named(kwargs: dict[str, str], text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(text)):
        WandbNodesCallback(project="p", **kwargs)  # type: ignore[arg-type]
