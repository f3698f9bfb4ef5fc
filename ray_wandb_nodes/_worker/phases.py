"""Long phases on a train worker: the frameworks' evaluation loops and saves, and
:func:`long_phase` for the user's own.

An evaluation pass or a checkpoint save runs no optimizer step and reports nothing for as long as
it lasts; judged as a running rank it would be a hang. So on an armed rank (hang detection on),
with no user code:

- the evaluation and prediction loops of Hugging Face transformers and Lightning run in the
  beacon's evaluating phase (:data:`ENTRY_POINTS`);
- the saves run in its checkpointing phase (:data:`SAVE_METHODS`, :data:`SAVE_FUNCTIONS`): the
  frameworks' (Hugging Face's ``Trainer._save_checkpoint`` and ``save_model``, Lightning's
  ``Trainer.save_checkpoint``, which ``ModelCheckpoint`` calls, and ``Fabric.save``, DeepSpeed's
  engine's ``save_checkpoint``) and the libraries' under them and under the user's own saves
  (``torch.save``, ``torch.distributed.checkpoint``'s ``save``, ``async_save`` and
  ``save_state_dict``, safetensors' ``save_file`` and ``save_model``).

Both are allowed three times the running limit (``_hang.policy``). Each entry point is wrapped
once its module is imported, before or after the plugin's set-up on the worker (``_on_import``).
A wrapper returns what it wraps returns and lets its exceptions through, the phase it
interrupted taken up again either way; on a rank that is not armed it calls through and does
nothing else. A save inside a long phase (``torch.save`` inside Hugging Face's save, or inside
an evaluation) leaves the outer phase as it is, and a save on a thread other than the training
thread (``async_save``'s upload, Lightning's ``AsyncCheckpointIO``) runs beside training and is
no phase of the rank's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .._hang import Phase, armed_rank, enter_phase, in_phase, leave_phase
from .on_import import when_imported

MARK = "_ray_wandb_nodes_phase"

# (module, class, methods): checked on transformers 5.24 and Lightning 2.6.6 (lightning and
# pytorch_lightning ship the same loops). HF's public ``evaluate`` and ``predict`` and the loop
# both call (``evaluation_loop``): a subclass that overrides one of them still runs in the phase.
# Lightning's evaluation loop runs validation (the sanity check and fit's included) and test; its
# prediction loop, predict.
ENTRY_POINTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("transformers.trainer", "Trainer", ("evaluate", "predict", "evaluation_loop")),
    *(
        (f"{package}.loops.{module}", cls, ("run",))
        for package in ("lightning.pytorch", "pytorch_lightning")
        for module, cls in (("evaluation_loop", "_EvaluationLoop"), ("prediction_loop", "_PredictionLoop"))
    ),
)

# Saves, checked on transformers 5.24, Lightning 2.6.6 (lightning, pytorch_lightning and
# lightning_fabric), torch 2.13 and safetensors 0.8; DeepSpeed by its names (``DeepSpeedEngine``
# in ``deepspeed.runtime.engine`` since 0.3; the pipeline engine inherits it). HF's checkpoint
# save calls ``save_model``, which a user also calls at the end of training.
SAVE_METHODS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("transformers.trainer", "Trainer", ("_save_checkpoint", "save_model")),
    ("lightning.pytorch.trainer.trainer", "Trainer", ("save_checkpoint",)),
    ("pytorch_lightning.trainer.trainer", "Trainer", ("save_checkpoint",)),
    ("lightning.fabric.fabric", "Fabric", ("save",)),
    ("lightning_fabric.fabric", "Fabric", ("save",)),
    ("deepspeed.runtime.engine", "DeepSpeedEngine", ("save_checkpoint",)),
)
# Module-level save functions, where they are defined and where they are re-exported (a
# re-export imported before the patch still holds the original): ``torch.save`` is
# ``torch.serialization.save``, ``torch.distributed.checkpoint.save`` is ``state_dict_saver``'s.
_DCP = ("save", "async_save", "save_state_dict")
SAVE_FUNCTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch.serialization", ("save",)),
    ("torch", ("save",)),
    ("torch.distributed.checkpoint.state_dict_saver", _DCP),
    ("torch.distributed.checkpoint", _DCP),
    ("safetensors.torch", ("save_file", "save_model")),
)

_KINDS = {"evaluating": Phase.EVALUATING, "checkpointing": Phase.CHECKPOINTING, "preparing": Phase.PREPARING}


def long_phase(kind: str) -> contextlib.AbstractContextManager[None]:
    """A long phase of your own code on a Ray Train rank, for hang detection.

    Hang detection judges a rank by its progress: optimizer steps and reports. An evaluation, a
    save or a preparation of your own has neither for as long as it lasts; inside ``long_phase``
    the rank is allowed three times the running limit (and at least ten minutes under
    ``hang_timeout_s="auto"``), and while it is, the ranks that wait for it are not judged hung.
    The phase it was entered in (a report, say) is taken up again when the block ends, however it
    ends. Hugging Face's and Lightning's evaluation loops and saves, DeepSpeed's saves,
    ``torch.save``, ``torch.distributed.checkpoint`` and safetensors' saves are in their phase
    already, with no code.

    The kinds:

    - ``"evaluating"``: an evaluation or prediction loop of your own;
    - ``"checkpointing"``: a save of your own that none of the above makes (a copy to network
      storage, an upload), before its report;
    - ``"preparing"``: a long preparation inside the train function: a data download,
      tokenisation, a compilation, a warm-up. It gets the same long limit: a preparation longer
      than that (ten minutes under ``"auto"``, 3 x a fixed limit) belongs before ``fit()``, or
      needs a larger ``hang_timeout_s``.

    Outside a train worker armed for hang detection (outside Ray, or with ``hang_timeout_s=None``)
    it does nothing.

    Example:
        ```python
        from ray_wandb_nodes import long_phase

        def train_func(config):
            with long_phase("preparing"):
                dataset = download_and_tokenize(config["data"])
            for epoch in range(epochs):
                train_one_epoch(model, loader, optimizer)
                with long_phase("evaluating"):
                    metrics = evaluate(model, val_loader)
                ray.train.report(metrics)
        ```

    Args:
        kind: ``"evaluating"``, ``"checkpointing"`` or ``"preparing"``.

    Raises:
        ValueError: ``kind`` is none of them.
    """
    phase = _KINDS.get(kind.strip().lower()) if isinstance(kind, str) else None
    if phase is None:
        raise ValueError(f'long_phase(kind={kind!r}): expected "evaluating", "checkpointing" or "preparing"')
    return in_phase(phase)


def hook_evaluation() -> None:
    """On an armed rank: every entry point of :data:`ENTRY_POINTS` runs in the evaluating phase,
    wrapped now where its module is imported and as it is imported otherwise. Idempotent."""
    for module, cls, methods in ENTRY_POINTS:
        when_imported(module, WrapMethods(cls, methods))


def hook_saves() -> None:
    """On an armed rank: every save of :data:`SAVE_METHODS` and :data:`SAVE_FUNCTIONS` runs in
    the checkpointing phase, wrapped now where its module is imported and as it is imported
    otherwise. Imports nothing (a worker without torch loads none). Idempotent."""
    for module, cls, methods in SAVE_METHODS:
        when_imported(module, WrapMethods(cls, methods, Phase.CHECKPOINTING))
    for module, names in SAVE_FUNCTIONS:
        when_imported(module, WrapFunctions(names))


@dataclass(frozen=True)
class WrapMethods:
    """A patch for ``_on_import``: the methods of class ``cls`` of a module in ``phase`` (the
    evaluating phase, or the checkpointing phase of a save); equal patches are one: awaited once."""

    cls: str
    methods: tuple[str, ...]
    phase: Phase = Phase.EVALUATING

    def __call__(self, module: ModuleType) -> None:
        owner = getattr(module, self.cls, None)
        if not isinstance(owner, type):
            return  # a release without it: left alone
        wrap = checkpointing if self.phase is Phase.CHECKPOINTING else evaluating
        for name in self.methods:
            method = owner.__dict__.get(name)
            if callable(method) and not getattr(method, MARK, False):
                setattr(owner, name, wrap(method))


@dataclass(frozen=True)
class WrapFunctions:
    """A patch for ``_on_import``: a module's save functions ``names`` in the checkpointing
    phase. A function defined in one module and re-exported by another gets one wrapper."""

    names: tuple[str, ...]

    def __call__(self, module: ModuleType) -> None:
        for name in self.names:
            function = module.__dict__.get(name)
            if callable(function) and not getattr(function, MARK, False):
                setattr(module, name, _wrapped.setdefault(function, checkpointing(function)))


_wrapped: dict[Callable[..., Any], Callable[..., Any]] = {}  # a save function -> its one wrapper


def evaluating(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` in the evaluating phase on an armed rank; as it is elsewhere."""

    @functools.wraps(method)
    def in_evaluation(*args: Any, **kwargs: Any) -> Any:
        if armed_rank() is None:
            return method(*args, **kwargs)
        with in_phase(Phase.EVALUATING):
            return method(*args, **kwargs)

    setattr(in_evaluation, MARK, True)
    return in_evaluation


def checkpointing(save: Callable[..., Any]) -> Callable[..., Any]:
    """``save`` in the checkpointing phase on an armed rank's training thread, unless the rank is
    in a long phase already (``_hang.enter_phase``); as it is elsewhere. Called often with small
    objects (``torch.save`` of a tensor): a plain function, no context manager, and nothing but
    one call and a global's read where no rank is armed (``bench/save_wrapper_cost.py``)."""

    enter, leave, phase = enter_phase, leave_phase, Phase.CHECKPOINTING  # bound once: no lookups a call

    @functools.wraps(save)
    def in_checkpoint(*args: Any, **kwargs: Any) -> Any:
        entered = enter(phase)
        if entered is None:
            return save(*args, **kwargs)
        try:
            return save(*args, **kwargs)
        finally:
            leave(entered)

    setattr(in_checkpoint, MARK, True)
    return in_checkpoint
