"""The exact wandb.init arguments and settings each writer gets (pure), and one writer started
the way a Ray worker starts it: in a process with none of the driver's W&B environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ray_wandb_nodes._config.options import build_options
from ray_wandb_nodes._config.secrets import CapturedEnv, Secret
from ray_wandb_nodes._config.values import Mode
from ray_wandb_nodes._wandb.writers import BUFFER_SAMPLES, Role, node_dir, node_spec, primary_spec
from tests.support.env import DUMMY_KEY, WANDB_TABLES
from tests.support.wandb_backend import WandbTestBackend

ENV = CapturedEnv(base_url="http://127.0.0.1:9", project="env-proj", entity="env-ent", api_key=Secret("k" * 40))


def make_primary(mode: Mode = Mode.ONLINE, **options: Any) -> Any:
    init_kwargs = {k: options.pop(k) for k in ("id", "job_type", "settings") if k in options}
    return primary_spec(
        build_options(
            sampling_interval_s=2, init_timeout_s=30, finish_timeout_s=20, wandb_init_kwargs=init_kwargs, **options
        ),
        ENV,
        mode=mode,
        run_id="exp-abc",
        label="node-head-aaaaaa",
        display_name="exp",
        group=None,
        config={"lr": 0.1},
        default_dir="/driver/cwd",
    )


def test_primary_creates_the_shared_run_and_owns_its_state() -> None:
    spec = make_primary(gpu_device_ids=[0, 1], tags=["t"], job_type="train", settings={"x_stats_buffer_size": 5})
    assert spec.role is Role.PRIMARY
    assert spec.init_kwargs == {
        "id": "exp-abc",
        "project": "env-proj",
        "entity": "env-ent",
        "name": "exp",
        "tags": ["t"],
        "config": {"lr": 0.1},
        "resume": "allow",
        "save_code": False,
        "job_type": "train",
        "dir": "/driver/cwd",
    }
    assert spec.settings == {
        "console": "off",
        "x_stats_buffer_size": 5,
        "x_stats_sampling_interval": 2.0,
        "x_stats_gpu_device_ids": [0, 1],
        "init_timeout": 30.0,
        "finish_timeout": 20.0,
        "base_url": "http://127.0.0.1:9",
        "mode": "shared",
        "x_primary": True,
        "x_label": "node-head-aaaaaa",
        "x_update_finish_state": True,
    }


def test_options_win_over_the_captured_environment() -> None:
    spec = make_primary(project="opt-proj", entity="opt-ent", name="shown", group="g", id="fixed-id")
    assert spec.init_kwargs["project"] == "opt-proj"
    assert spec.init_kwargs["entity"] == "opt-ent"
    assert spec.init_kwargs["name"] == "shown"
    assert spec.init_kwargs["group"] == "g"
    assert spec.run_id == "fixed-id"


def test_node_writer_joins_as_non_primary_without_finishing_the_run() -> None:
    primary = make_primary()
    spec = node_spec(primary, label="node-w1-bbbbbb", entity="resolved-ent", project="resolved-proj")
    assert spec.role is Role.NODE
    assert spec.init_kwargs == {
        "id": "exp-abc",
        "entity": "resolved-ent",
        "project": "resolved-proj",
        "dir": "/driver/cwd",
    }
    assert spec.settings == {
        "x_stats_sampling_interval": 2.0,
        "x_stats_buffer_size": BUFFER_SAMPLES,  # the node summaries are read from these
        "init_timeout": 30.0,
        "finish_timeout": 20.0,
        "base_url": "http://127.0.0.1:9",
        "mode": "shared",
        "x_primary": False,
        "x_update_finish_state": False,
        "x_label": "node-w1-bbbbbb",
        "console": "off",
        "x_disable_meta": True,
        "disable_git": True,
        "save_code": False,
    }
    # Never the settings that would silence system metrics.
    assert not {"x_disable_stats", "x_disable_machine_info"} & set(spec.settings)


def test_offline_writers_write_their_own_offline_runs_under_the_run_id() -> None:
    primary = make_primary(mode=Mode.OFFLINE)
    node = node_spec(primary, label="node-w1-bbbbbb", entity=None, project=None)
    assert primary.settings["mode"] == node.settings["mode"] == "offline"
    assert primary.run_id == node.run_id == "exp-abc"
    assert node.settings["x_label"] == "node-w1-bbbbbb"
    assert node.init_kwargs["project"] == "env-proj"


def test_the_key_travels_as_a_secret_never_in_kwargs_or_settings() -> None:
    spec = make_primary()
    node = node_spec(spec, label="n", entity=None, project=None)
    for s in (spec, node):
        assert s.api_key == Secret("k" * 40)
        assert "k" * 40 not in repr(s.init_kwargs) + repr(s.settings) + repr(s)


def test_node_dir_is_one_folder_per_label_with_a_temp_fallback(tmp_path: Path) -> None:
    assert node_dir(str(tmp_path), "run", "node-a") == str(tmp_path / "ray_wandb_nodes" / "node-a")
    assert node_dir(str(tmp_path), "run", "node-a") != node_dir(str(tmp_path), "run", "node-b")
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    fallback = node_dir(str(blocked), "run", "node-a")
    assert fallback.endswith(os.path.join("ray_wandb_nodes", "run", "node-a")) and os.path.isdir(fallback)


def test_importing_the_package_needs_neither_ray_nor_wandb_loaded() -> None:
    code = "import sys, ray_wandb_nodes; print('ray' in sys.modules, 'wandb' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def without_wandb_env(**extra: str) -> dict[str, str]:
    """This process's environment less every W&B setting (as a Ray worker has it), silenced, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return {**env, "WANDB_SILENT": "true", **extra}


# A writer as a Train controller or a node logger starts it: its spec carries the driver's host
# and key; the process's environment has no W&B setting, its home no netrc or wandb settings.
_LONE_WRITER = """
import sys, time, warnings
import wandb
from ray_wandb_nodes._config.options import build_options
from ray_wandb_nodes._config.secrets import CapturedEnv, Secret
from ray_wandb_nodes._config.values import Mode
from ray_wandb_nodes._wandb.runs import health_table, init_writer
from ray_wandb_nodes._wandb.writers import primary_spec

base_url, key, run_id, folder = sys.argv[1:]
env = CapturedEnv(base_url=base_url, project="lone", entity=None, api_key=Secret(key))
options = build_options(sampling_interval_s=1, finish_timeout_s=20, wandb_init_kwargs={})
spec = primary_spec(options, env, mode=Mode.ONLINE, run_id=run_id, label="node-lone-aaaaaa", display_name=run_id,
                    group=None, config={}, default_dir=folder)
run = init_writer(spec)
process = wandb.setup().settings
print("process host", process.base_url, "key", process.api_key == key)
started = time.monotonic()
with warnings.catch_warnings():
    warnings.simplefilter("error")  # a table that cannot be logged is a warning from wandb
    for step in range(3):
        run.log({"nodes": health_table(["node", "state"], [["node-lone-aaaaaa", "ok"]]), "step": step})
run.finish(exit_code=0)
print("logged and finished in", round(time.monotonic() - started, 1), "s")
"""


def test_a_writer_in_a_process_without_w_and_b_environment_sends_every_call_to_its_own_host(
    backend: WandbTestBackend, tmp_path: Path
) -> None:
    """wandb looks artifacts up (0.28 and 0.29: each table logged again) with the process's
    settings: with the writer's host not made the process's, they went to the default W&B host and
    the table log waited for a timeout, holding the writer's thread (a Ray 2.50 CI failure)."""
    run_id = f"lone-{os.getpid()}"
    env = without_wandb_env(HOME=str(tmp_path), WANDB_DIR=str(tmp_path), WANDB_ERROR_REPORTING="false")
    started = len(backend.requests)
    out = subprocess.run(
        [sys.executable, "-c", _LONE_WRITER, backend.base_url, DUMMY_KEY, run_id, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"process host {backend.base_url} key True" in out.stdout
    run = next(r for r in backend.runs.values() if r.run_id == run_id)
    assert run.exit_codes == [0]
    assert len(run.tables("nodes")) == 3 or not WANDB_TABLES
    # The artifact lookups wandb made (0.28, 0.29; 0.31 makes none for a table) reached this backend.
    ops = [op for _, _, op in backend.requests[started:]]
    assert ops.count("ArtifactByID") >= (0 if WANDB_TABLES else 1), ops


_SHARE = """
import os, sys, wandb
from ray_wandb_nodes._wandb.runs import share_host_with_process

share_host_with_process(wandb, dict(eval(sys.argv[1])))
print(os.environ.get("WANDB_BASE_URL"), wandb.setup().settings.base_url, wandb.setup().settings.api_key)
"""


def shared_with_process(settings: dict[str, Any], **environ: str) -> list[str]:
    """What a fresh process's wandb holds after ``share_host_with_process(settings)``:
    [WANDB_BASE_URL, the process settings' base_url, their api_key]."""
    env = without_wandb_env(WANDB_MODE="offline", **environ)  # offline: no service call
    out = subprocess.run(
        [sys.executable, "-c", _SHARE, repr(settings)], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_the_process_gets_the_writer_s_host_and_key_unless_it_has_a_host_of_its_own(tmp_path: Path) -> None:
    home = str(tmp_path)  # no netrc, no wandb settings file
    mine = {"base_url": "http://127.0.0.1:9", "api_key": DUMMY_KEY}
    assert shared_with_process(mine, HOME=home) == ["http://127.0.0.1:9", "http://127.0.0.1:9", DUMMY_KEY]
    # No host of its own (the default W&B host): the key still reaches the process.
    env_url, url, key = shared_with_process({"api_key": DUMMY_KEY}, HOME=home)
    assert env_url == "None" and url != "http://127.0.0.1:9" and key == DUMMY_KEY
    # A process whose WANDB_BASE_URL names another host keeps its host and key.
    other = shared_with_process(mine, HOME=home, WANDB_BASE_URL="http://127.0.0.1:7")
    assert other[:2] == ["http://127.0.0.1:7", "http://127.0.0.1:7"] and other[2] != DUMMY_KEY


def test_a_log_the_run_s_end_brings_in_is_flushed_each_second_where_wandb_can() -> None:
    """A relayed or offline writer's log is what the run's end brings in: flushed every second
    (within the wait a relayed writer's finish gets once its relay is gone) where wandb has the
    setting (0.31 on), a user's shorter interval kept, nothing asked of an older wandb."""
    import wandb

    from ray_wandb_nodes._fleet.hosted import RELAY_LOST_FINISH_S
    from ray_wandb_nodes._wandb.runs import BROUGHT_IN_FLUSH_S, brought_in_log_settings

    class Older:
        model_fields: dict[str, Any] = {"x_stats_sampling_interval": None}

    class Newer:
        model_fields: dict[str, Any] = {"x_transaction_log_flush_interval": None}

    key = "x_transaction_log_flush_interval"
    assert brought_in_log_settings(Older, {"x_stats_sampling_interval": 15}) == {}
    assert brought_in_log_settings(Newer, {"x_stats_sampling_interval": 15}) == {key: BROUGHT_IN_FLUSH_S}
    assert brought_in_log_settings(Newer, {key: 0.25}) == {key: 0.25}  # the user's, shorter
    assert brought_in_log_settings(Newer, {key: 30.0}) == {key: BROUGHT_IN_FLUSH_S}
    assert BROUGHT_IN_FLUSH_S <= RELAY_LOST_FINISH_S / 2  # on disk, with a margin, before it is collected
    asked = brought_in_log_settings(wandb.Settings, {})
    assert wandb.Settings(**asked)  # what is asked of the wandb installed is a setting it takes
