"""The standard Train run of the end-to-end tests: two workers of a small model that report
``REPORTS`` times, with ``WandbNodesCallback`` set for short runs, and the trainer every test builds.

Ray workers import ``train_loop`` by this module's name (``tests.support.training``): the
clusters' processes have the repository root on their ``PYTHONPATH`` (see ``tests/conftest.py``).
"""

from __future__ import annotations

from typing import Any

from tests.support.env import FAST

REPORTS = 4


def train_loop(config: dict[str, Any]) -> None:
    import time

    import ray
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    step_loss = torch_model(config["lr"]) if config.get("torch") else plain_model(config["lr"])
    if config.get("entries"):  # when this worker entered the train function, and where
        import os

        entered = f"{ray.get_runtime_context().get_node_id()}-{rank}-{time.time()!r}"
        open(os.path.join(config["entries"], entered), "w").close()
    for step in range(config.get("reports", REPORTS)):
        loss = step_loss()
        print(said(rank, step))  # the rank's console (rank_console)
        if config.get("fail_at") == step and rank == config.get("fail_rank", 0):
            if config.get("print_secrets"):  # what a user's code may print: masked on its node
                print(SECRETS)
            raise ValueError("training blew up on purpose")
        script = config.get("gpu_script")  # {"step", "path", "index", "values"}: a scripted GPU changes
        if script and script["step"] == step and rank == 0:
            from tests.support.nvml import ScriptedGpus

            ScriptedGpus.read(script["path"]).set(script["index"], **script["values"])
        metrics = {
            "step": step,
            "rank": rank,
            "score": 100 * rank + step,
            "loss": loss,
            "nested": {"depth": step},
        }
        time.sleep(config.get("step_sleep_s", 0))
        # {"step", "rank", "seconds", "until"?}: a rank stops (a hang) for ``seconds``, or until
        # the file ``until`` exists (an event the test makes), ``seconds`` then only its ceiling
        stall = config.get("stall")
        if stall and stall["step"] == step and stall["rank"] == rank:
            stalled_read(stall["seconds"], stall.get("until"))
        if config.get("report_free_cpus"):
            metrics["free_cpus"] = ray.available_resources().get("CPU", 0.0)
        report(metrics, checkpoint_step=step if config.get("checkpoint") and rank == 0 else None)


# A line of made-up secrets a rank prints (``print_secrets``), and how it reaches the run's console.
SECRETS = (
    "WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567 "
    "url https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE&X-Amz-Signature=0a1b2c3d"
)
SECRETS_MASKED = "WANDB_API_KEY=*** url https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***"


def said(rank: int, step: int) -> str:
    """What ``train_loop`` prints on ``rank`` at each step (its console, in the run's Logs tab)."""
    return f"rank {rank} is at step {step}"


def stalled_read(seconds: float, until: str | None = None) -> None:
    """A read that stalls (a file system, say) for ``seconds``, or less once the file ``until``
    exists: the others wait for this rank in the next report."""
    import os
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end and not (until and os.path.exists(until)):
        time.sleep(0.05)  # <stalled_read>


def torch_model(lr: float) -> Any:
    """One SGD step of a small torch model per call; returns its loss."""
    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    def step() -> float:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss)

    return step


def plain_model(lr: float) -> Any:
    """The same without torch: one gradient step of a line fitted to four points per call."""
    points = [(0.0, 1.0), (1.0, 3.0), (2.0, 5.0), (3.0, 7.0)]
    w = [0.0, 0.0]

    def step() -> float:
        errors = [w[0] * x + w[1] - y for x, y in points]
        w[0] -= lr * 2 * sum(e * x for e, (x, _) in zip(errors, points, strict=True)) / len(points)
        w[1] -= lr * 2 * sum(errors) / len(points)
        return sum(e * e for e in errors) / len(points)

    return step


def trainer(loop: Any, *, torch: bool, **kwargs: Any) -> Any:
    """A Train V2 trainer of ``loop``. ``torch``: a ``TorchTrainer``, for what torch is part of:
    the smoke set (which CI runs on each end of the supported Ray range), the GPU and framework
    tests. Else Train V2's ``DataParallelTrainer``, which ``TorchTrainer`` extends: the same
    controller, worker group and callbacks, without torch's import and process group in every
    worker, which is most of a short fit here (``python -m bench.test_trainers``)."""
    if torch:
        from ray.train.torch import TorchTrainer

        return TorchTrainer(loop, **kwargs)
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return DataParallelTrainer(loop, **kwargs)


def fit_within(made: Any, timeout_s: float) -> Any:
    """``made.fit()`` (a trainer) on a thread of its own, joined within ``timeout_s`` (a fit that
    hangs fails the test, never CI): its result, or the exception it raised."""
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = made.fit()
        except BaseException as e:  # noqa: BLE001 - the test reads it
            outcome["result"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"fit() did not return within {timeout_s:.0f} s"
    return outcome["result"]


def report(metrics: dict[str, Any], *, checkpoint_step: int | None = None) -> None:
    """``ray.train.report`` from a train worker, with a checkpoint whose ``step`` file holds
    ``checkpoint_step`` when one is given."""
    import os
    import tempfile

    import ray.train

    if checkpoint_step is None:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "step"), "w") as f:
            f.write(str(checkpoint_step))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


def fit_loop(
    loop: Any,
    name: str,
    callback: Any,
    storage: str,
    /,
    *,
    workers: int = 2,
    torch_trainer: bool = False,
    run_config: dict[str, Any] | None = None,
    succeed: bool = False,
    **config: Any,
) -> Any:
    """Ray Train's result of ``loop`` on ``workers`` train workers, ``config`` its
    ``train_loop_config``, in a run named ``name`` under ``storage`` with ``callback``
    (``torch_trainer``: see :func:`trainer`; ``run_config``: more of ``RunConfig``'s fields, a
    ``storage_path`` of its own included); ``succeed``: the fit must end without an error."""
    from ray.train import RunConfig, ScalingConfig

    result = trainer(
        loop,
        torch=torch_trainer,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, callbacks=[callback], **{"storage_path": storage, **(run_config or {})}),
    ).fit()
    if succeed:
        assert result.error is None, result.error
    return result


def fit(name: str, callback: Any, storage: str, *, torch: bool = False, **loop_config: Any) -> Any:
    """``train_loop`` on two workers (see :func:`trainer` for ``torch``)."""
    return fit_loop(
        train_loop, name, callback, storage, torch_trainer=torch, **{"lr": 0.05, "torch": torch, **loop_config}
    )


def callback_options(**kwargs: Any) -> dict[str, Any]:
    """``kwargs`` with the tests' settings where they do not set their own: writers that sample and
    upload often enough for short runs, and bounds on their start and end that a loaded machine meets."""
    return {
        "project": "e2e",
        "sampling_interval_s": 0.5,
        "init_timeout_s": 30,
        "finish_timeout_s": 30,
        "settings": FAST,
        **kwargs,
    }


def make_callback(**kwargs: Any) -> Any:
    """The plugin's Train callback with the tests' settings (:func:`callback_options`)."""
    from ray_wandb_nodes import WandbNodesCallback

    return WandbNodesCallback(**callback_options(**kwargs))


def make_tune_callback(**kwargs: Any) -> Any:
    """The plugin's Tune callback with the tests' settings (:func:`callback_options`)."""
    from ray_wandb_nodes import WandbNodesTuneCallback

    return WandbNodesTuneCallback(**callback_options(**kwargs))
