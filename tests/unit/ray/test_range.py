"""The Ray releases the plugin serves (2.50 to 2.60), and the error anywhere else."""

from __future__ import annotations

import pytest
import ray

from ray_wandb_nodes import WandbNodesCallback, WandbNodesTuneCallback
from ray_wandb_nodes._config.values import Mode
from ray_wandb_nodes._ray import train_callback_bases
from ray_wandb_nodes._ray.range import SUPPORTED_RAY, minor, unsupported_ray

pytestmark = pytest.mark.smoke


@pytest.mark.parametrize(
    ("version", "expected"),
    [("2.50.1", (2, 50)), ("2.60.0", (2, 60)), ("3.0.0rc1", (3, 0)), ("2.61.0.dev0", (2, 61)), ("weird", None)],
)
def test_minor_reads_major_and_minor(version: str, expected: tuple[int, int] | None) -> None:
    assert minor(version) == expected


@pytest.mark.parametrize("version", ["2.50.0", "2.50.1", "2.55.1", "2.56.1", "2.60.0"])
def test_every_release_in_the_range_is_served(version: str) -> None:
    assert unsupported_ray(version, train=True, v2_enabled=True) is None
    assert unsupported_ray(version, train=False) is None


@pytest.mark.parametrize("version", ["2.49.2", "2.48.0", "2.9.3", "2.61.0", "3.0.0", "weird"])
def test_a_release_outside_the_range_is_named_with_the_range(version: str) -> None:
    for train in (True, False):
        problem = unsupported_ray(version, train=train, v2_enabled=True)
        assert problem is not None
        assert f"ray {version} is installed" in problem
        assert "Ray 2.50 to 2.60" in problem and SUPPORTED_RAY in problem


def test_no_ray_at_all_is_named() -> None:
    problem = unsupported_ray(None, train=True)
    assert problem is not None and problem.startswith("Ray is not installed") and SUPPORTED_RAY in problem


def test_train_v2_off_on_2_50_says_to_turn_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_TRAIN_V2_ENABLED", raising=False)
    problem = unsupported_ray("2.50.1", train=True, v2_enabled=False)
    assert problem is not None
    assert "ray 2.50.1" in problem and "RAY_TRAIN_V2_ENABLED unset" in problem
    assert "set RAY_TRAIN_V2_ENABLED=1 before ray.train is imported" in problem
    assert unsupported_ray("2.50.1", train=False, v2_enabled=False) is None  # Tune needs no Train V2


def test_train_v2_off_on_a_later_release_says_to_unset_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_TRAIN_V2_ENABLED", "0")
    problem = unsupported_ray("2.55.1", train=True, v2_enabled=False)
    assert problem is not None
    assert "ray 2.55.1" in problem and "RAY_TRAIN_V2_ENABLED='0'" in problem and "unset RAY_TRAIN_V2_ENABLED" in problem


def test_the_installed_ray_is_in_the_range_and_has_the_callback_classes() -> None:
    assert unsupported_ray(ray.__version__, train=False) is None
    assert train_callback_bases() != (object,)


def test_building_the_train_callback_with_train_v2_off_fails_naming_version_and_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAY_TRAIN_V2_ENABLED", "0")
    with pytest.raises(RuntimeError) as info:
        WandbNodesCallback(project="p", mode="disabled")
    text = str(info.value)
    assert f"ray {ray.__version__}" in text and "RAY_TRAIN_V2_ENABLED='0'" in text


def test_the_callbacks_subclass_the_replica_group_callback_where_ray_has_one() -> None:
    try:
        from ray.train.v2._internal.execution.callback import ReplicaGroupCallback, WorkerGroupCallback
    except ImportError:
        pytest.skip(f"ray {ray.__version__} has no replica groups (2.56+)")
    cb = WandbNodesCallback(project="p", mode="disabled")
    # Ray calls replica-group hooks only on callbacks that are worker-group callbacks too.
    assert isinstance(cb, ReplicaGroupCallback) and isinstance(cb, WorkerGroupCallback)


def test_the_tune_callback_builds_on_every_supported_ray() -> None:
    assert WandbNodesTuneCallback(project="p", mode="disabled").options.mode is Mode.DISABLED
