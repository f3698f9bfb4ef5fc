"""Pure parts: labels, run ids, node selection, metric rows, captured environment."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ray_wandb_nodes._metrics import flatten, jsonable, to_row
from ray_wandb_nodes._naming import node_label, train_run_id
from ray_wandb_nodes._nodes import NodeInfo, alive_nodes, reconcile, select_nodes
from ray_wandb_nodes._secrets import Secret, capture_env

# labels ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hostname", "node_id", "label"),
    [
        ("vm", "c2634912abcdef", "node-vm-c26349"),
        ("gpu-node-7.cluster.local", "fd6f8e1f00", "node-gpu-node-7.cluster.local-fd6f8e"),
        ("weird host/name", "0123456789", "node-weird-host-name-012345"),
        ("", "abcdef1234", "node-host-abcdef"),
        (None, "abcdef1234", "node-host-abcdef"),
    ],
)
def test_node_label_is_readable_and_keyed_by_node_id(hostname: str | None, node_id: str, label: str) -> None:
    assert node_label(hostname, node_id) == label


def test_nodes_sharing_a_hostname_get_distinct_labels() -> None:
    assert node_label("vm", "aaaaaa11") != node_label("vm", "bbbbbb11")


# run ids ---------------------------------------------------------------------------------------


def test_run_id_is_stable_for_the_same_storage_and_name() -> None:
    assert train_run_id("/tmp/results", "exp") == train_run_id("/tmp/results/", "exp")
    assert train_run_id("/tmp/results", "exp").startswith("exp-")


def test_run_id_differs_by_storage_path_and_by_name() -> None:
    ids = {train_run_id("/a", "exp"), train_run_id("/b", "exp"), train_run_id("/a", "exp2")}
    assert len(ids) == 3


def test_run_id_uses_only_characters_wandb_accepts() -> None:
    run_id = train_run_id("s3://bucket/x", "my run/with: odd#chars" * 5)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", run_id)
    assert len(run_id) <= 64


# node selection ------------------------------------------------------------------------------

RECORDS: list[dict[str, Any]] = [
    {"NodeID": "head", "Alive": True, "NodeManagerHostname": "h", "NodeManagerAddress": "10.0.0.1"},
    {"NodeID": "w1", "Alive": True, "NodeManagerHostname": "a", "NodeManagerAddress": "10.0.0.2"},
    {"NodeID": "w2", "Alive": True, "NodeManagerHostname": "a", "NodeManagerAddress": "10.0.0.2"},
    {"NodeID": "dead", "Alive": False, "NodeManagerHostname": "d", "NodeManagerAddress": "10.0.0.3"},
    {"NodeID": "idle", "Alive": True, "NodeManagerHostname": "i", "NodeManagerAddress": "10.0.0.4"},
]


def test_alive_nodes_drops_dead_ones_and_keeps_nodes_sharing_an_ip() -> None:
    alive = alive_nodes(RECORDS)
    assert sorted(alive) == ["head", "idle", "w1", "w2"]
    assert alive["w1"] == NodeInfo("w1", "a", "10.0.0.2")


@pytest.mark.parametrize(
    ("selection", "workers", "primary", "expected"),
    [
        ("workers", ["w1", "w2"], "head", ["w1", "w2"]),
        ("workers", ["head", "w1"], "head", ["w1"]),  # the primary covers its own node
        ("workers", ["head", "head"], "head", []),  # one node: no node writer at all
        ("workers", ["w1", "dead"], "head", ["w1"]),  # a dead node gets no writer
        ("cluster", ["w1"], "head", ["idle", "w1", "w2"]),
        ("cluster", [], "w1", ["head", "idle", "w2"]),
    ],
)
def test_select_nodes(selection: str, workers: list[str], primary: str, expected: list[str]) -> None:
    assert list(select_nodes(selection, workers, alive_nodes(RECORDS), primary)) == expected


def test_reconcile_starts_new_nodes_and_retires_gone_ones() -> None:
    assert reconcile(["w1", "w2"], ["w2", "w3"]) == (["w3"], ["w1"])
    assert reconcile([], []) == ([], [])


# metric rows -----------------------------------------------------------------------------------


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
    from ray_wandb_nodes._metrics import config_for_wandb

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


# captured environment --------------------------------------------------------------------------


def test_key_comes_from_argument_then_file_then_env_then_netrc(tmp_path: Path) -> None:
    env = {"WANDB_API_KEY": "env" * 14, "WANDB_BASE_URL": "http://wb.example:8080"}
    key_file = tmp_path / "key"
    key_file.write_text("\n  file-key-0123456789012345678901234567890  \n")
    netrc = tmp_path / "netrc"
    netrc.write_text("machine wb.example login user password netrc-key\n")
    netrc.chmod(0o600)

    got = capture_env(env, api_key="arg", api_key_file=None, netrc_path=str(netrc))
    assert (got.api_key, got.api_key_source) == (Secret("arg"), "api_key")
    got = capture_env(env, api_key_file=str(key_file), netrc_path=str(netrc))
    assert (got.api_key, got.api_key_source) == (Secret("file-key-0123456789012345678901234567890"), "api_key_file")
    got = capture_env(env, netrc_path=str(netrc))
    assert (got.api_key, got.api_key_source) == (Secret("env" * 14), "WANDB_API_KEY")
    got = capture_env({"WANDB_BASE_URL": env["WANDB_BASE_URL"]}, netrc_path=str(netrc))
    assert (got.api_key, got.api_key_source) == (Secret("netrc-key"), "netrc")
    assert capture_env({}, netrc_path=str(tmp_path / "none")).api_key is None


def test_unreadable_or_empty_key_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"api_key_file=.*cannot be read"):
        capture_env({}, api_key_file=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n\n")
    with pytest.raises(ValueError, match=r"api_key_file=.*is empty"):
        capture_env({}, api_key_file=str(tmp_path / "empty"))


def test_captured_env_holds_the_driver_settings() -> None:
    env = {
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "WANDB_PROJECT": "p",
        "WANDB_ENTITY": "e",
        "WANDB_MODE": "offline",
        "WANDB_DIR": "/d",
        "WANDB_API_KEY": "k" * 40,
    }
    got = capture_env(env)
    assert (got.base_url, got.project, got.entity, got.mode, got.dir) == (
        "http://127.0.0.1:9",
        "p",
        "e",
        "offline",
        "/d",
    )
    assert "k" * 40 not in repr(got) and "k" * 40 not in str(got.api_key)


def test_a_run_whose_end_fails_does_not_hold_the_other_runs_ends(caplog: pytest.LogCaptureFixture) -> None:
    from ray_wandb_nodes._fleet import NodeFleet, _Logger, _Retirement
    from ray_wandb_nodes._nodes import NodeInfo
    from ray_wandb_nodes._warn import Warner

    class RefusingIndex:
        folder = "/nowhere"

        def set_writer(self, entry: dict[str, Any]) -> None:
            raise RuntimeError("the index refused")

    fleet = NodeFleet(init_timeout_s=1.0, warner=Warner())
    logger = _Logger(node=NodeInfo("a" * 56, "host", "10.0.0.1"), actor=None, pg_key=0)
    ended: list[str] = []
    failing = _Retirement(
        run_id="run-a", refs={}, deadline=0.0, timeout=1.0, then=None, index=RefusingIndex(), sources=[logger]
    )
    failing.collectors = []  # its collection is over; recording what was left fails
    fine = _Retirement(run_id="run-b", refs={}, deadline=0.0, timeout=1.0, then=lambda: ended.append("run-b"))
    fleet._retirements = [failing, fine]
    fleet._check_retirements()
    assert ended == ["run-b"] and fleet._retirements == []
    assert "ending the W&B run run-a failed (RuntimeError: the index refused)" in caplog.text
