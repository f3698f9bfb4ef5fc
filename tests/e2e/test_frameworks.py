"""End to end with the real frameworks: a Hugging Face ``transformers.Trainer`` and a Lightning
``Trainer`` inside a ``TorchTrainer`` on two worker nodes, with Ray's report callbacks, as Ray's
documentation runs them, each with its own W&B logging left on (HF's ``report_to="wandb"``,
Lightning's ``WandbLogger``) and the workers set up for W&B as on a user's cluster, one of the
two ways each: HF's job has the W&B settings in its ``runtime_env`` (every process the job starts
has them from its start); Lightning's train function sets them itself. Either way the backend
sees the job's run and no other.

Tiny models built from a config here (nothing downloaded), a few steps, two reports each, and an
evaluation pass in each fit: the ranks are armed for hangs, and the frameworks' evaluation loops
run in the beacon's evaluating phase and their checkpoint saves in its checkpointing phase with no
user code (each rank notes the phase its node reads from its slot while it evaluates or saves).
Lightning's first validation lasts longer than a fixed ``hang_timeout_s`` and raises no hang
alert. One cluster for the module: a head with no CPU (the driver and the Train controller) and
two one-CPU worker nodes, one train worker each. The README's recipes are these train functions.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import assert_nothing_left, node_labels, said_by_workers
from tests.support.env import worker_env
from tests.support.runs import assert_one_writer_per_label, run_of, unique, user_rows
from tests.support.training import fit_loop, make_callback
from tests.support.wandb_backend import WandbTestBackend

# Looked up, not imported: importing transformers and lightning here took 8 s of every collection.
_MISSING = [name for name in ("transformers", "lightning") if importlib.util.find_spec(name) is None]
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(_MISSING), reason=f"needs {' and '.join(_MISSING)} (the test extra)"),
]


# The cluster: tests/e2e/conftest.py's two_nodes fixture.
TOPOLOGY = "two_nodes"
# Lightning's fit: a rank silent this long while running is hung, 3 x that before its first step.
# Its start before the sanity check (import, DDP set-up) is judged by that: on a loaded CI machine,
# two matrix lanes side by side, it took 38 s (past 3 x 10 s, an alert of the start, not of the
# validation under test). CI now runs each lane's end-to-end modules in two streams side by side,
# so the start gets twice that: 3 x 25 s = 75 s.
HANG_TIMEOUT_S = 25.0
# The fleet's poll for a fixed limit (a sixteenth of it, at least 0.25 s, at most 3 s): 1.56 s.
POLL_S = min(3.0, max(0.25, HANG_TIMEOUT_S / 16))
# Its first validation: past the running limit, the three polls that would see it (a reading
# older than the limit is taken again first) and 2 s for the evidence round to confirm it while
# the rank is still in it (without the evaluating phase it is a hang); well within the evaluating
# limit (3 x, 75 s).
SLOW_EVAL_S = HANG_TIMEOUT_S + 3 * POLL_S + 2.0


def note_phase(folder: str | None, stage: str, started: float) -> None:
    """In a rank: its phase as its node reads it (the beacon's slot file), a line of the rank's
    file in ``folder``: the stage, the phase's name, seconds since the train function started."""
    if not folder:
        return
    import ray.train

    from ray_wandb_nodes._hang import armed_rank, read_slots

    armed = armed_rank()
    slots = [s for s in read_slots(armed.beacon.directory) if s.pid == os.getpid()] if armed else []
    phase = slots[0].phase.name if slots else "not-armed"
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(folder, f"phases-{rank}.txt"), "a") as f:
        f.write(f"{stage} {phase} {time.monotonic() - started:.1f}\n")


def phases_seen(folder: Path, rank: int) -> dict[str, str]:
    """What ``note_phase`` noted on ``rank``: stage -> phase (the stage's first note)."""
    seen: dict[str, str] = {}
    for line in (folder / f"phases-{rank}.txt").read_text().splitlines():
        stage, phase, _ = line.split()
        seen.setdefault(stage, phase)
    return seen


def hang_alerts(run: Any) -> list[str]:
    """The run's hang alerts, title and text (what a failed ``== []`` should show)."""
    return [f"{a['title']}: {a['text']}" for a in run.alerts if a["title"].startswith("Hang")]


# the train functions (Ray's workers import them from this module) ------------------------------
def hf_loop(config: dict[str, Any]) -> None:
    started = time.monotonic()  # the train function starts
    import tempfile

    import torch
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    class NotePhase(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            note_phase(config.get("dir"), "step", started)

        def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            note_phase(config.get("dir"), "eval", started)  # inside HF's evaluation loop

    class NotedModel(GPT2LMHeadModel):  # type: ignore[misc]
        def save_pretrained(self, *args: Any, **kwargs: Any) -> Any:
            note_phase(config.get("dir"), "save", started)  # inside HF's checkpoint save (rank 0 writes)
            return super().save_pretrained(*args, **kwargs)

    if config.get("env_at_start"):  # the job's runtime_env gave this process the W&B settings at its start
        assert os.environ.get("WANDB_PROJECT") == config["env_at_start"], "the runtime_env did not reach the worker"
    os.environ.update(config.get("worker_env") or {})  # W&B reachable from the workers, as on a user's cluster
    torch.manual_seed(0)
    model = NotedModel(GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    tokens = torch.randint(0, 32, (16, 8))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=4,
        per_device_train_batch_size=2,
        logging_steps=1,
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,  # each save's evaluation first
        per_device_eval_batch_size=2,
        save_only_model=True,
        report_to=config["report_to"],
        use_cpu=True,
        disable_tqdm=True,
    )
    callbacks = [RayTrainReportCallback(), NotePhase()]
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4], callbacks=callbacks)
    prepare_trainer(trainer).train()


def lightning_loop(config: dict[str, Any]) -> None:
    started = time.monotonic()  # the train function starts
    import lightning.pytorch as pl
    import torch
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
    from torch.utils.data import DataLoader, TensorDataset

    os.environ.update(config.get("worker_env") or {})

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            note_phase(config.get("dir"), f"step-{self.global_step}", started)
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            # Lightning's evaluation loop: its sanity check before the first step, then each epoch's end
            stage = "sanity" if self.trainer.sanity_checking else f"validation-{self.current_epoch}"
            note_phase(config.get("dir"), stage, started)
            if stage == "validation-0":
                time.sleep(config.get("slow_eval_s", 0.0))  # a long pass: no step, no report
                note_phase(config.get("dir"), "validation-0-end", started)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            # inside Lightning's Trainer.save_checkpoint, which Ray's report callback calls each epoch
            note_phase(config.get("dir"), f"save-{self.current_epoch}", started)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
    val_loader = DataLoader(TensorDataset(torch.randn(4, 4), torch.randn(4, 1)), batch_size=2)  # a batch a rank
    logger: Any = False
    if config.get("wandb_logger"):
        from lightning.pytorch.loggers import WandbLogger

        logger = WandbLogger()
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    prepare_trainer(trainer).fit(Tiny(), train_dataloaders=loader, val_dataloaders=val_loader)
    if config.get("user_logs") and trainer.global_rank == 0:
        import wandb

        # The user's own logging, where the WandbLogger's run is wandb.run: it logs nothing, said once.
        wandb.log({"mine": 1.0})
        wandb.run.log({"mine": 2.0})


# A framework's loop on two workers under TorchTrainer (its process group: what the frameworks need).
def fit(*args: Any, **kwargs: Any) -> Any:
    """``fit_loop`` under TorchTrainer; a function (``ray.remote`` takes no ``partial``)."""
    return fit_loop(*args, torch_trainer=True, **kwargs)


def fit_in_job(env: dict[str, str], loop: Any, name: str, callback: Any, storage: str, **config: Any) -> Any:
    """``fit`` as a job whose ``runtime_env`` holds ``env`` (``ray job submit --runtime-env-json``):
    Ray gives it to every process the job starts, the Train controller and its workers included,
    from their start. Here a task on the driver's node carries that ``runtime_env`` and runs the
    fit (a driver connected again with a ``runtime_env`` attaches to any raylet of its IP on Ray
    2.50, where the Train controller would then run)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    job = ray.remote(num_cpus=0, runtime_env={"env_vars": env}, scheduling_strategy=here)(fit)
    return ray.get(job.remote(loop, name, callback, storage, **config))


def assert_the_only_new_run(backend: WandbTestBackend, before: set[Any], run: Any) -> None:
    """The backend saw one run since ``before``: the job's (no framework's run beside it)."""
    assert set(backend.runs) - before == {(run.entity, run.project, run.run_id)}, sorted(set(backend.runs) - before)


def assert_every_node_and_one_primary(run: Any) -> None:
    labels = set(node_labels().values())  # the head (the controller's primary) and both worker nodes
    assert run.labels == labels and len(labels) == 3
    assert_one_writer_per_label(run)
    for label in labels:
        assert "memory_percent" in run.system_metrics()[label], label
    assert run.exit_codes == [0]


# Hugging Face -------------------------------------------------------------------------------------
@pytest.mark.smoke
def test_hf_trainer_values_checkpoints_every_node_and_its_own_wandb_logging_makes_no_second_run(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    # HF's own W&B logging on (report_to="wandb", the W&B settings in the job's runtime_env as
    # on a cluster set up for W&B): its values and checkpoints reach the job's run through
    # Ray's report, and HF's own run is never created.
    name, own = unique("hf"), unique("huggingface")
    env = worker_env(backend, own, tmp_path)
    callback = make_callback(upload_checkpoints=True)
    before = set(backend.runs)
    result = fit_in_job(
        env, hf_loop, name, callback, str(tmp_path), report_to="wandb", env_at_start=own, dir=str(tmp_path)
    )
    assert result.error is None
    # HF's evaluation (each save's) in the evaluating phase, its save (rank 0 writes) in the
    # checkpointing phase, its steps running.
    assert phases_seen(tmp_path, 0) == {"step": "RUNNING", "eval": "EVALUATING", "save": "CHECKPOINTING"}
    assert phases_seen(tmp_path, 1) == {"step": "RUNNING", "eval": "EVALUATING"}
    run = run_of(backend, name)
    assert_the_only_new_run(backend, before, run)
    rows = user_rows(run)
    # Ray's HF callback reports at each save (save_steps=2 of 4): HF's logged values, merged.
    assert [(r["training_iteration"], r["step"]) for r in rows] == [(1, 2), (2, 4)]
    for row in rows:
        assert {"loss", "learning_rate", "grad_norm", "epoch"} <= set(row), row
        assert isinstance(row["loss"], float) and row["epoch"] > 0
    assert rows[0]["epoch"] < rows[1]["epoch"]
    assert_every_node_and_one_primary(run)
    arts = run.models
    assert len(arts) == 2 and all(a.committed and "latest" in a.aliases for a in arts)
    assert all({"checkpoint/config.json", "checkpoint/model.safetensors"} <= set(a.files) for a in arts)
    assert backend.runs_in(own) == []  # HF's run from rank 0 was never created
    said = '(report_to="wandb") on rank 0 was turned off: it would write a second W&B run beside this job\'s run '
    assert said_by_workers(cluster, said + f"{run.run_id},") == 1  # once, from rank 0: the only rank HF logs from
    assert hang_alerts(run) == []
    assert_nothing_left()


# Lightning ----------------------------------------------------------------------------------------
@pytest.mark.smoke
def test_lightning_trainer_values_checkpoints_every_node_and_its_wandb_logger_makes_no_second_run(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    # The W&B settings set inside the train function this time, and the user's own wandb.log
    # after the fit, on the WandbLogger's disabled run.
    name, own = unique("lightning"), unique("lightning-own")
    env = worker_env(backend, own, tmp_path)
    # Hang detection with a fixed limit, and a first validation longer than it (no step, no
    # report): the evaluating phase allows it 3 x, so no hang is raised.
    callback = make_callback(upload_checkpoints=True, hang_timeout_s=HANG_TIMEOUT_S)
    before = set(backend.runs)
    config = {"dir": str(tmp_path), "slow_eval_s": SLOW_EVAL_S}
    result = fit(
        lightning_loop, name, callback, str(tmp_path), wandb_logger=True, worker_env=env, user_logs=True, **config
    )
    assert result.error is None
    for rank in (0, 1):
        print(f"rank {rank}:", (tmp_path / f"phases-{rank}.txt").read_text().replace("\n", "; "))
        assert phases_seen(tmp_path, rank) == {
            "sanity": "EVALUATING",  # before the first step
            "step-0": "RUNNING",
            "step-1": "RUNNING",
            "validation-0": "EVALUATING",
            "validation-0-end": "EVALUATING",  # after SLOW_EVAL_S, longer than the running limit
            "step-2": "RUNNING",
            "step-3": "RUNNING",
            "validation-1": "EVALUATING",
            "save-0": "CHECKPOINTING",  # Trainer.save_checkpoint, each epoch's end (Ray's report callback)
            "save-1": "CHECKPOINTING",
        }, rank
    run = run_of(backend, name)
    assert_the_only_new_run(backend, before, run)
    rows = user_rows(run)
    # Ray's Lightning callback reports at each epoch's end: callback_metrics, epoch, global step.
    assert [(r["training_iteration"], r["epoch"], r["step"]) for r in rows] == [(1, 0, 2), (2, 1, 4)]
    assert all(isinstance(r["train_loss"], float) for r in rows)
    assert_every_node_and_one_primary(run)
    arts = run.models
    assert len(arts) == 2 and all(a.committed and "checkpoint.ckpt" in a.files for a in arts)
    assert backend.runs_in(own) == []  # the WandbLogger's run was never created
    said = "Lightning's WandbLogger on rank 0 was turned off: it would write a second W&B run beside this job's run "
    assert said_by_workers(cluster, said + f"{run.run_id},") == 1
    assert all("mine" not in row for row in run.history)
    swallowed = "wandb.log() on rank 0 logged nothing: wandb.run in this train worker is the disabled run that "
    swallowed += f"Lightning's WandbLogger got (one history writer per run). To log to this job's run {run.run_id}, "
    swallowed += "report the values with ray.train.report(metrics)"
    assert said_by_workers(cluster, swallowed) == 1  # once, for both of the user's calls
    assert hang_alerts(run) == []  # the long validation is no hang
    assert_nothing_left()
