"""Turning what rank 0 reported into a W&B history row (pure functions)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# report -> (row to log, run config update, keys skipped)
RowBuilder = Callable[[Any], tuple[dict[str, Any], dict[str, Any], list[str]]]
# Keys Ray adds to results that are not metrics.
_RAY_EXCLUDES = ("done", "should_checkpoint")
# A history value this long is text, not a metric; W&B's rows are meant to stay small.
MAX_STRING = 64 * 1024


def flatten(metrics: Mapping[str, Any], sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """Nested dicts become ``a/b`` keys; everything else is kept as it is."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, sep, name))
        else:
            out[name] = value
    return out


def is_excluded(key: str, excludes: Sequence[str]) -> bool:
    """``excludes`` match a key exactly or as a ``/``-separated prefix, as in Ray's callback."""
    return any(key == item or key.startswith(item + "/") for item in excludes)


def scalar(value: Any) -> Any:
    """A loggable value, or ``_SKIP``: numbers (numpy and torch scalars too), bools, strings."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Number) and not isinstance(value, complex):
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING else _SKIP
    item = getattr(value, "item", None)
    size = getattr(value, "size", None)
    numel = getattr(value, "numel", None)
    if callable(item):
        # numpy scalars and 0-d or 1-element arrays; torch tensors with one element.
        one = (size == 1) if isinstance(size, int) else (callable(numel) and numel() == 1)
        if one:
            try:
                return scalar(item())
            except Exception:  # noqa: BLE001 - an odd tensor is skipped, not fatal
                return _SKIP
    if hasattr(value, "_log_type") or type(value).__module__.startswith("wandb"):
        return value  # wandb.Image, wandb.Histogram, ...: wandb logs these itself
    return _SKIP


def number(value: Any) -> float | None:
    """A finite float of a numeric value (numpy and torch scalars too), else None; bools are not numbers."""
    value = scalar(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


class _Skip:
    def __repr__(self) -> str:
        return "<skip>"


_SKIP = _Skip()


def to_row(metrics: Mapping[str, Any], excludes: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The history row for one report, and the keys skipped because W&B cannot chart them."""
    row: dict[str, Any] = {}
    skipped: list[str] = []
    all_excludes = (*_RAY_EXCLUDES, *excludes)
    for key, value in flatten(metrics).items():
        if is_excluded(key, all_excludes):
            continue
        cleaned = scalar(value)
        if cleaned is _SKIP:
            what = f"a string of {len(value)} characters" if isinstance(value, str) else f"a {type(value).__name__}"
            skipped.append(f"{key!r} ({what}, not a number or a short string)")
        else:
            row[key] = cleaned
    return row, skipped


class Stepper:
    """The run's own step: shared mode ignores ``step=``, so rows carry ``key`` as a value.

    Rows that bring their own numeric ``key`` set it; others get the next report count.
    ``start`` continues a resumed run where it stopped.
    """

    def __init__(self, key: str, start: int = 0) -> None:
        self.key = key
        self.value = start

    def stamp(self, row: dict[str, Any]) -> dict[str, Any]:
        given = row.get(self.key)
        if isinstance(given, (int, float)) and not isinstance(given, bool):
            self.value = int(given)
        else:
            self.value += 1
            row[self.key] = self.value
        return row

    @classmethod
    def resuming(cls, key: str, run: Any) -> Stepper:
        """A stepper that continues ``run``'s last ``key`` (0 for a fresh run)."""
        try:
            last = run.summary.get(key)
        except Exception:  # noqa: BLE001 - a fresh run has no summary to read
            last = None
        return cls(key, int(last) if isinstance(last, (int, float)) and not isinstance(last, bool) else 0)


def jsonable(value: Any, depth: int = 0, path: str = "", replaced: list[str] | None = None) -> Any:
    """A JSON-serialisable copy of run config: unknown objects become their ``repr``.

    The dotted paths of the entries replaced so are appended to ``replaced``.
    """
    if depth > 20:
        if replaced is not None:
            replaced.append(path)
        return repr(value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else str(f)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, depth + 1, f"{path}.{k}" if path else str(k), replaced) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, depth + 1, f"{path}[{i}]", replaced) for i, v in enumerate(value)]
    clean = scalar(value)
    if clean is not _SKIP and clean is not value:
        return jsonable(clean, depth + 1, path, replaced)
    if replaced is not None:
        replaced.append(path)
    return repr(value)


def config_for_wandb(config: Mapping[str, Any], warn: Any) -> dict[str, Any]:
    """``jsonable(config)``, with one warning naming what W&B could not have serialised."""
    replaced: list[str] = []
    clean = jsonable(dict(config), replaced=replaced)
    if replaced:
        shown = ", ".join(replaced[:10]) + (f" and {len(replaced) - 10} more" if len(replaced) > 10 else "")
        warn("config:replaced", f"run config entries W&B cannot serialise were logged as their repr: {shown}")
    return dict(clean)
