"""Tune results to W&B rows, the way Ray's ``WandbLoggerCallback`` turns them (pure but for wandb types).

Users switching from Ray's callback keep what they rely on: keys flattened with ``/``,
``excludes`` (plus ``done`` and ``should_checkpoint``, plus ``config`` unless ``log_config``),
Ray's auto-filled keys (trial id, hostname, node ip, ...) as run config instead of history,
3-D and 4-D numpy arrays as images, 5-D as videos, and anything that is not a number or a
W&B media value left out of the history.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from .._wandb.metrics import flatten, is_excluded

# As in ray.air.integrations.wandb.WandbLoggerCallback.
AUTO_CONFIG_KEYS = ("trial_id", "experiment_tag", "node_ip", "experiment_id", "hostname", "pid", "date")
EXCLUDE_RESULTS = ("done", "should_checkpoint")
# Keys Tune adds that are not metrics; left out without a word, as Ray's callback does.
_QUIET = ("checkpoint_dir_name",)


def _is_media(obj: Any, wandb: Any) -> bool:
    return isinstance(obj, wandb.sdk.data_types.base_types.wb_value.WBValue)


def _allowed(obj: Any, wandb: Any) -> bool:
    """What Ray's callback logs: numbers (1-element arrays too) and W&B values."""
    import numpy as np

    if isinstance(obj, np.ndarray) and obj.size == 1:
        return isinstance(obj.item(), numbers.Number)
    if isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)) and len(obj) > 0:
        return _is_media(obj[0], wandb)
    return isinstance(obj, numbers.Number) or _is_media(obj, wandb)


class Unloggable:
    """A value that could not become W&B media (say, no pillow or moviepy installed)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Unloggable({self.reason!r})"


def _media(make: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return make(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - one unloggable value must not cost the row
        first = str(e).strip().splitlines()
        return Unloggable(f"{type(e).__name__}: {first[0] if first else ''}")


def clean(obj: Any, wandb: Any, image_kwargs: Mapping[str, Any], video_kwargs: Mapping[str, Any]) -> Any:
    """Arrays to media, unserialisable objects to str (then int or float when they parse).

    wandb needs a ``format`` for videos made from arrays; ``gif`` unless ``video_kwargs`` says.
    """
    import numpy as np

    video_kwargs = {"format": "gif", **video_kwargs}

    if isinstance(obj, dict):
        return {k: clean(v, wandb, image_kwargs, video_kwargs) for k, v in obj.items()}
    if isinstance(obj, (list, set)):
        return [clean(v, wandb, image_kwargs, video_kwargs) for v in obj]
    if isinstance(obj, tuple):
        return tuple(clean(v, wandb, image_kwargs, video_kwargs) for v in obj)
    if isinstance(obj, np.ndarray) and obj.ndim == 3:
        return _media(wandb.Image, obj, **image_kwargs)  # one image (H, W, C)
    if isinstance(obj, np.ndarray) and obj.ndim in (4, 5):  # images (N, H, W, C); videos (N, T, C, W, H)
        make = wandb.Image if obj.ndim == 4 else wandb.Video
        kwargs = image_kwargs if obj.ndim == 4 else video_kwargs
        items = [_media(make, v, **kwargs) for v in obj]
        failed = [i for i in items if isinstance(i, Unloggable)]
        if failed:
            return failed[0]
        return items if len(items) > 1 else items[0]
    if _allowed(obj, wandb):
        return obj
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        text = str(obj)
        for convert in (int, float):
            try:
                return convert(text)
            except ValueError:
                pass
        return text


def describe_skip(value: Any, original: Any) -> str:
    return value.reason if isinstance(value, Unloggable) else f"a {type(original).__name__}, not a number or media"


def tune_rows(
    result: Mapping[str, Any],
    *,
    excludes: Sequence[str],
    log_config: bool,
    wandb: Any,
    image_kwargs: Mapping[str, Any] | None = None,
    video_kwargs: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(history row, run config update, keys left out) for one Tune result."""
    cleaned = clean(dict(result), wandb, image_kwargs or {}, video_kwargs or {})
    exclude = (*EXCLUDE_RESULTS, *excludes, *(() if log_config else ("config",)))
    config_update = dict(cleaned.get("config") or {}) if isinstance(cleaned.get("config"), dict) else {}
    config_update.pop("callbacks", None)
    row: dict[str, Any] = {}
    skipped: list[str] = []
    originals = flatten(dict(result))
    for key, value in flatten(cleaned).items():
        if is_excluded(key, exclude):
            continue
        if is_excluded(key, AUTO_CONFIG_KEYS):
            config_update[key] = value
        elif _allowed(value, wandb):
            row[key] = value
        elif not is_excluded(key, _QUIET):
            skipped.append(f"{key} ({describe_skip(value, originals.get(key, value))})")
    return row, config_update, skipped
