"""The API key reaches every writer and nothing else; bad metrics and config never kill a run.

The nodes of the test cluster start without any WANDB_* setting: what a node writer knows
it got from the callback.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import assert_nothing_left, node_labels, session_log_text
from tests.support.runs import run_of, unique, user_rows
from tests.support.training import fit_loop, make_callback
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster

SECRET = "s3cr3t" + "q" * 40


# The cluster: tests/e2e/conftest.py's two_nodes fixture.
TOPOLOGY = "two_nodes"


def plain_loop(config: dict[str, Any]) -> None:
    import ray.train

    # No pause a step: the plugin's start hold has every node's writer joined (and, wandb 0.31,
    # sampled) before this function starts.
    for step in range(3):
        ray.train.report({"step": step})


def actor_table_bytes() -> bytes:
    """Every actor's GCS record (runtime_env, name, call site, ...), as `ray list actors --detail` reads it."""
    import ray._private.state as state

    accessor = state.state._connect_and_get_accessor()
    return b"".join(accessor.get_actor_table(None, None))


@pytest.mark.parametrize("source", ["api_key", "api_key_file", "WANDB_API_KEY", "netrc"])
def test_the_key_reaches_every_writer_and_appears_nowhere_else(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:

    monkeypatch.delenv("WANDB_API_KEY")
    kwargs: dict[str, Any] = {}
    if source == "api_key":
        kwargs["api_key"] = SECRET
    elif source == "api_key_file":
        (tmp_path / "key").write_text(SECRET + "\n")
        kwargs["api_key_file"] = str(tmp_path / "key")
    elif source == "WANDB_API_KEY":
        monkeypatch.setenv("WANDB_API_KEY", SECRET)
    else:
        netrc = tmp_path / "netrc"
        netrc.write_text(f"machine 127.0.0.1\n  login user\n  password {SECRET}\n")
        netrc.chmod(0o600)
        monkeypatch.setenv("NETRC", str(netrc))
    name = unique(f"key-{source.lower()}")
    callback = make_callback(project="secrets", **kwargs)
    assert fit_loop(plain_loop, name, callback, str(tmp_path / "storage")).error is None

    run = run_of(backend, name)
    assert run.labels == set(node_labels().values())
    # Every writer (the primary and both node writers) authenticated with the key.
    assert set(run.api_keys) == run.client_ids and len(run.client_ids) == 3
    assert all(keys == {SECRET} for keys in run.api_keys.values())
    # ... and it is nowhere else.
    assert SECRET not in str(run.config) + str(run.summary) + str(run.wandb_config_by_client)
    assert SECRET.encode() not in actor_table_bytes()
    assert SECRET not in session_log_text(cluster)
    for path in glob.glob(str(tmp_path / "storage" / "**" / "*"), recursive=True):
        if os.path.isfile(path):
            assert SECRET.encode() not in Path(path).read_bytes(), path
    assert_nothing_left()


def odd_loop(config: dict[str, Any]) -> None:
    import numpy as np
    import ray.train

    metrics: dict[str, Any] = {
        "nan": float("nan"),
        "inf": float("inf"),
        "none": None,
        "text": "warmup",
        "nested": {"a": {"b": 1.5}},
        "a list": [1, 2, 3],
        "np_scalar": np.float32(0.25),
        "np_int": np.int64(7),
        "np_array": np.zeros(4),
        "huge": "x" * 1_000_000,
        "key/with slash": 1,
        "key with spaces": 2,
    }
    metrics.update({f"many/k{i}": i for i in range(10_000)})
    for step in range(2):
        ray.train.report({**metrics, "step": step})


def test_odd_metrics_and_config_are_logged_or_named_never_fatal(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path
) -> None:

    name = unique("odd-input")
    callback = make_callback(project="input", finish_timeout_s=60)
    config = {"lr": 0.1, "fn": print, "obj": object(), "nested": {"ok": 1, "bad": {1, 2}}}
    assert fit_loop(odd_loop, name, callback, str(tmp_path), **config).error is None
    run = run_of(backend, name)
    rows = user_rows(run)
    assert [row["step"] for row in rows] == [0, 1]
    row = rows[0]
    assert str(row["nan"]).lower() == "nan" and row["inf"] in (float("inf"), "Infinity", "inf")
    assert row["text"] == "warmup" and row["nested/a/b"] == 1.5
    # (Ray itself refuses torch tensors in reported metrics; the unit tests cover them.)
    assert row["np_scalar"] == 0.25 and row["np_int"] == 7
    assert row["key/with slash"] == 1 and row["key with spaces"] == 2
    assert sum(1 for k in row if k.startswith("many/")) == 10_000 and row["many/k9999"] == 9999
    for skipped in ("none", "a list", "np_array", "huge"):
        assert skipped not in row
    logs = session_log_text(cluster)
    for skipped in (
        "'none' (a NoneType",
        "'a list' (a list",
        "'np_array' (a ndarray",
        "'huge' (a string of 1000000",
    ):
        assert logs.count(skipped) == 1, skipped
    assert run.config["lr"]["value"] == 0.1 and run.config["fn"]["value"].startswith("<")  # its repr
    assert "run config entries W&B cannot serialise were logged as their repr: fn, obj" in logs
    assert run.config["nested"]["value"] == {"ok": 1, "bad": [1, 2]}  # a set becomes a list
    assert run.exit_codes == [0]
    assert_nothing_left()
