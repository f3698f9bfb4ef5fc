"""A framework's own ``wandb.init`` on a train worker returns a disabled run (``_frameworks``):
which callers count as a framework, once-only warning, the real wandb imported after the patch,
and the user's own calls that land on the disabled run said once."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from typing import Any

import pytest

from ray_wandb_nodes._worker import frameworks as _frameworks


def call_from(module: str, fake: Any, **kwargs: Any) -> Any:
    """``wandb.init(**kwargs)`` as code of ``module`` calls it."""
    scope: dict[str, Any] = {"__name__": module, "wandb": fake, "kwargs": kwargs}
    exec("result = wandb.init(**kwargs)", scope)
    return scope["result"]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    module = types.ModuleType("fake_wandb")
    module.init = lambda **kwargs: kwargs  # type: ignore[attr-defined]
    state = {"warned": False, "rank": None, "run_id": None, "framework": None, "swallowed": False}
    monkeypatch.setattr(_frameworks, "_state", state)
    return module


def test_frameworks_get_a_disabled_run_and_the_user_code_its_own(fake: Any, caplog: Any) -> None:
    _frameworks._state.update(rank=0, run_id="job-1")
    _frameworks._patch(fake)
    _frameworks._patch(fake)  # once
    assert getattr(fake.init, _frameworks.MARK)
    with caplog.at_level(logging.WARNING, logger="ray_wandb_nodes"):
        assert call_from("transformers.integrations.integration_utils", fake, project="p") == {
            "project": "p",
            "mode": "disabled",
        }
        assert call_from("lightning.pytorch.loggers.wandb", fake, mode="online")["mode"] == "disabled"
        assert call_from("train_script", fake, project="mine") == {"project": "mine"}  # the user's own
        assert call_from("transformers_fork", fake) == {}  # a prefix of a name is not the framework
    (record,) = caplog.records  # said once per process, for the first framework
    assert record.getMessage().startswith(
        'ray_wandb_nodes: the Hugging Face Trainer\'s W&B logging (report_to="wandb") on rank 0 was turned off: '
        "it would write a second W&B run beside this job's run job-1,"
    )
    assert record.getMessage().endswith('Set report_to="none" to silence this.')


@pytest.mark.parametrize(
    ("module", "said"),
    [
        ("lightning.pytorch.loggers.wandb", "Leave WandbLogger out of Trainer(logger=...) to silence this."),
        ("pytorch_lightning.loggers.wandb", "Leave WandbLogger out of Trainer(logger=...) to silence this."),
        ("accelerate.tracking", 'Leave "wandb" out of Accelerator(log_with=...) to silence this.'),
        ("transformers", 'Set report_to="none" to silence this.'),
    ],
)
def test_each_framework_is_named_with_the_setting_that_turns_it_off(module: str, said: str) -> None:
    found = _frameworks.framework_of(module)
    assert found is not None and _frameworks.message(*found, 0, "job").endswith(said)
    assert _frameworks.framework_of("ray.train.torch") is None and _frameworks.framework_of(None) is None


@pytest.mark.parametrize("looked_up", [False, True], ids=["import", "find_spec-then-import"])
def test_wandb_imported_after_the_patch_gives_frameworks_a_real_disabled_run(tmp_path: Any, looked_up: bool) -> None:
    """In a fresh process (a train worker): the patch waits for ``import wandb``, also past a
    lookup that imports nothing (transformers' ``importlib.util.find_spec("wandb")``); the real
    client's disabled run takes the framework's calls and sends nothing."""
    lookup = "import importlib.util; assert importlib.util.find_spec('wandb') is not None" if looked_up else ""
    code = f"""
import sys
from ray_wandb_nodes._worker.frameworks import quiet_frameworks
quiet_frameworks(0, "job-2")
assert "wandb" not in sys.modules
{lookup}
import wandb
scope = {{"__name__": "lightning.pytorch.loggers.wandb", "wandb": wandb}}
exec("run = wandb.init(project='p'); run.log({{'loss': 1.0}}); run.finish()", scope)
print(scope["run"].settings.mode, scope["run"].disabled)
"""
    env = {"WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_API_KEY": "k" * 40, "WANDB_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**env, "PATH": ""}
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["disabled", "True"]
    assert "Lightning's WandbLogger on rank 0 was turned off" in out.stderr


def test_the_users_own_calls_that_land_on_the_disabled_run_are_said_once(tmp_path: Any, backend: Any) -> None:
    """In a fresh process with the real client: after a framework's ``wandb.init`` got the disabled
    run, the user's ``wandb.log`` and ``wandb.run.log`` log nothing, and the first of them says so
    once, naming ``ray.train.report``; the framework's own calls on the run say nothing more; the
    user's own ``wandb.init`` makes a run of its own (even with ``reinit="return_previous"``, wandb
    does not hand the disabled run back), left alone."""
    code = """
import logging, sys
from ray_wandb_nodes._worker.frameworks import quiet_frameworks
said = []
class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("ray_wandb_nodes").addHandler(Keep())
quiet_frameworks(0, "job-3")
import wandb
framework = {"__name__": "transformers.integrations.integration_utils", "wandb": wandb}
user = {"__name__": "train_script", "wandb": wandb}
exec("run = wandb.init(project='p'); wandb.log({'loss': 1.0}); run.log({'loss': 2.0})", framework)
print(len(said))
exec("wandb.log({'mine': 1.0}); wandb.run.log({'mine': 2.0}); wandb.log({'mine': 3.0})", user)
print(len(said))
exec("again = wandb.init(project='p', reinit='return_previous', mode='disabled')", user)
print(user["again"] is framework["run"], user["again"].disabled, len(said))
exec("own = wandb.init(project='users-own-run'); wandb.log({'mine': 4.0})", user)
print(user["own"] is framework["run"], user["own"].settings.mode, len(said))
user["own"].finish()
print(said[-1])
"""
    env = {"WANDB_BASE_URL": backend.base_url, "WANDB_API_KEY": "k" * 40, "WANDB_DIR": str(tmp_path)}
    env.update(WANDB_SILENT="true", NO_PROXY="127.0.0.1")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**env, "PATH": ""}
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # 1: the framework's warning; its own logs say nothing more
    assert lines[:4] == ["1", "2", "False True 2", "False online 2"], lines
    (own,) = backend.runs_in("users-own-run")  # the user's own run, left alone: its value is there
    assert [row["mine"] for row in own.history] == [4.0]
    assert lines[4] == (
        "ray_wandb_nodes: wandb.log() on rank 0 logged nothing: wandb.run in this train worker is the "
        'disabled run that the Hugging Face Trainer\'s W&B logging (report_to="wandb") got (one history writer '
        "per run). To log to this job's run job-3, report the values with ray.train.report(metrics): rank 0's "
        'reports are logged, every rank\'s with rank_metrics="reduce" or "all".'
    )
