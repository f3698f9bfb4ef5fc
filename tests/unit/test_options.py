"""Option validation and the callback object itself (no cluster, no W&B)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from ray_wandb_nodes import WandbNodesCallback
from ray_wandb_nodes._options import build_options, resolve_mode


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"mode": "shared"}, ["mode", "'shared'", "online, offline, disabled"]),
        ({"mode": "fast"}, ["mode", "'fast'", "online, offline, disabled"]),
        ({"nodes": "all"}, ["nodes", "'all'", "'workers', 'cluster'"]),
        ({"offline_transfer": "s3"}, ["offline_transfer", "'s3'", "'auto', 'ray', 'storage'"]),
        ({"sampling_interval_s": 0}, ["sampling_interval_s", "0", "greater than 0"]),
        ({"sampling_interval_s": -1.0}, ["sampling_interval_s", "-1.0"]),
        ({"sampling_interval_s": 0.05}, ["sampling_interval_s", "0.05", "at least 0.1"]),
        ({"sampling_interval_s": float("nan")}, ["sampling_interval_s", "nan"]),
        ({"init_timeout_s": 0}, ["init_timeout_s", "0"]),
        ({"finish_timeout_s": -5}, ["finish_timeout_s", "-5"]),
        ({"finish_timeout_s": "10"}, ["finish_timeout_s", "'10'"]),
        ({"gpu_device_ids": [0, -1]}, ["gpu_device_ids", "[0, -1]", ">= 0"]),
        ({"gpu_device_ids": "0,1"}, ["gpu_device_ids", "'0,1'"]),
        ({"project": "a/b"}, ["project", "'a/b'"]),
        ({"project": ""}, ["project", "''"]),
        ({"tags": "one"}, ["tags", "'one'", "list of strings"]),
        ({"excludes": [1]}, ["excludes", "[1]"]),
        ({"log_config": "yes"}, ["log_config", "'yes'"]),
        ({"config": [1, 2]}, ["config", "[1, 2]"]),
        ({"api_key": "x" * 40, "api_key_file": "/k"}, ["api_key", "api_key_file", "only one"]),
        ({"reinit": True}, ["reinit", "manages it"]),
        ({"resum": "allow"}, ["resum", "not a wandb.init parameter"]),
        ({"settings": {"x_primary": True}}, ["settings", "x_primary"]),
        ({"settings": 3}, ["settings", "3", "wandb.Settings"]),
        ({"straggler_metric": ""}, ["straggler_metric", "''", "non-empty string or None"]),
        ({"straggler_metric": 3}, ["straggler_metric", "3"]),
        ({"straggler_mode": "mean"}, ["straggler_mode", "'mean'", "'max'", "'min'"]),
        ({"straggler_threshold": 0}, ["straggler_threshold", "0", "(0, 1]"]),
        ({"straggler_threshold": 1.5}, ["straggler_threshold", "1.5", "(0, 1]"]),
        ({"straggler_threshold": True}, ["straggler_threshold", "True"]),
        ({"straggler_window_s": 0}, ["straggler_window_s", "0", "greater than 0"]),
        ({"alerts": "on"}, ["alerts", "'on'", "True or False"]),
    ],
)
def test_invalid_option_names_option_value_and_what_is_allowed(kwargs: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        WandbNodesCallback(project=kwargs.pop("project", "p"), **kwargs)
    for text in names:
        assert text in str(info.value)


def test_api_key_is_never_echoed_in_errors() -> None:
    secret = "s" * 40
    with pytest.raises(ValueError) as info:
        WandbNodesCallback(project="p", api_key=secret, api_key_file="/some/file")
    assert secret not in str(info.value)
    with pytest.raises(ValueError) as info:
        WandbNodesCallback(project="p", settings={"api_key": secret})
    assert secret not in str(info.value)


def test_defaults() -> None:
    options = build_options()
    assert options.mode == "online"
    assert options.nodes == "workers"
    assert options.sampling_interval_s == 15.0
    assert options.log_config is True
    assert options.gpu_device_ids is None
    assert options.offline_transfer == "auto"


@pytest.mark.parametrize(
    ("option", "env", "expected"),
    [
        (None, None, "online"),
        (None, "offline", "offline"),
        (None, "dryrun", "offline"),
        (None, "DISABLED", "disabled"),
        ("online", "offline", "online"),
        ("offline", None, "offline"),
    ],
)
def test_mode_comes_from_option_then_wandb_mode(option: str | None, env: str | None, expected: str) -> None:
    assert resolve_mode(option, env) == expected


def test_bad_wandb_mode_in_env_is_named() -> None:
    with pytest.raises(ValueError, match="WANDB_MODE='turbo'"):
        resolve_mode(None, "turbo")


def test_wandb_mode_is_read_when_the_callback_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert WandbNodesCallback(project="p").options.mode == "offline"
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    assert WandbNodesCallback(project="p").options.mode == "disabled"


def test_settings_object_and_extra_init_kwargs_are_kept() -> None:
    import wandb

    cb = WandbNodesCallback(
        project="p", job_type="train", settings=wandb.Settings(x_file_stream_transmit_interval=2), gpu_device_ids=(1, 0)
    )
    assert cb.options.wandb_init_kwargs == {"job_type": "train"}
    assert cb.options.settings == {"x_file_stream_transmit_interval": 2}
    assert cb.options.gpu_device_ids == (1, 0)


def test_callback_pickles_with_its_options_and_captured_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("WANDB_ENTITY", "team")
    cb = WandbNodesCallback(project="p", tags=["a"], excludes=["lr"], api_key="q" * 40)
    clone = pickle.loads(pickle.dumps(cb))
    assert clone.options == cb.options
    assert clone._env == cb._env
    assert clone._env.entity == "team" and clone._env.base_url == "http://127.0.0.1:1"
    assert clone._env.api_key is not None and clone._env.api_key.reveal() == "q" * 40
    assert clone._run is None


def test_repr_never_shows_the_key() -> None:
    secret = "z" * 40
    cb = WandbNodesCallback(project="p", api_key=secret)
    assert secret not in repr(cb)
    assert secret not in repr(cb._env)
    assert secret not in repr(cb.__dict__)


def test_callback_is_a_train_v2_callback_and_not_a_user_callback() -> None:
    # A UserCallback would be routed only through Train's user-callback handler,
    # which never calls the controller and worker-group hooks the plugin needs.
    from ray.train import RunConfig, UserCallback

    cb = WandbNodesCallback(project="p")
    assert not isinstance(cb, UserCallback)
    assert RunConfig(callbacks=[cb]).callbacks == [cb]
