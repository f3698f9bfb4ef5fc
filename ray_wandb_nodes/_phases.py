"""Long phases on a train worker: the frameworks' evaluation loops, and :func:`long_phase` for a
loop of the user's own.

An evaluation pass runs no optimizer step and reports nothing for as long as it lasts; judged as
a running rank it would be a hang. So on an armed rank (hang detection on), the evaluation and
prediction loops of Hugging Face transformers and Lightning run in the beacon's evaluating phase,
allowed three times the running limit (``_hang.policy``), with no user code: each entry point is
wrapped once its module is imported, before or after the plugin's set-up on the worker
(``_on_import``). A wrapper returns what the loop returns and lets its exceptions through, the
phase it interrupted taken up again either way; on a rank that is not armed it calls the loop and
nothing else.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ._hang import Phase, armed_rank, in_phase
from ._on_import import when_imported

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

_KINDS = {"evaluating": Phase.EVALUATING, "checkpointing": Phase.CHECKPOINTING}


def long_phase(kind: str) -> contextlib.AbstractContextManager[None]:
    """A long phase of your own loop on a Ray Train rank, for hang detection.

    Hang detection judges a rank by its progress: optimizer steps and reports. An evaluation pass
    or a checkpoint save of your own has neither for as long as it lasts; inside ``long_phase``
    the rank is allowed three times the running limit (and at least ten minutes under
    ``hang_timeout_s="auto"``), and while it is, the ranks that wait for it are not judged hung.
    The phase it was entered in (a report, say) is taken up again when the block ends, however it
    ends. Hugging Face's and Lightning's evaluation loops are in the evaluating phase already, with
    no code.

    Outside a train worker armed for hang detection (outside Ray, or with ``hang_timeout_s=None``)
    it does nothing.

    Example:
        ```python
        from ray_wandb_nodes import long_phase

        def train_func(config):
            for epoch in range(epochs):
                train_one_epoch(model, loader, optimizer)
                with long_phase("evaluating"):
                    metrics = evaluate(model, val_loader)
                ray.train.report(metrics)
        ```

    Args:
        kind: ``"evaluating"`` or ``"checkpointing"`` (a save of your own, before its report).

    Raises:
        ValueError: ``kind`` is neither.
    """
    phase = _KINDS.get(kind.strip().lower()) if isinstance(kind, str) else None
    if phase is None:
        raise ValueError(f'long_phase(kind={kind!r}): expected "evaluating" or "checkpointing"')
    return in_phase(phase)


def hook_evaluation() -> None:
    """On an armed rank: every entry point of :data:`ENTRY_POINTS` runs in the evaluating phase,
    wrapped now where its module is imported and as it is imported otherwise. Idempotent."""
    for module, cls, methods in ENTRY_POINTS:
        when_imported(module, WrapMethods(cls, methods))


@dataclass(frozen=True)
class WrapMethods:
    """A patch for ``_on_import``: the methods of class ``cls`` of a module in the evaluating
    phase (equal patches are one: awaited once)."""

    cls: str
    methods: tuple[str, ...]

    def __call__(self, module: ModuleType) -> None:
        owner = getattr(module, self.cls, None)
        if not isinstance(owner, type):
            return  # a release without it: left alone
        for name in self.methods:
            method = owner.__dict__.get(name)
            if callable(method) and not getattr(method, MARK, False):
                setattr(owner, name, evaluating(method))


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
