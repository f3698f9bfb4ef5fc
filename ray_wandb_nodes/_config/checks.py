"""The validators of the options table: each normalises one value or raises naming it.

A ``Check`` carries what is allowed in words, so that the error a user gets and the options page
say the same thing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from .values import Mode, parse_hang_timeout, spellings

_E = TypeVar("_E", bound=Enum)
MODES = spellings(Mode)
# wandb's own spellings that mean one of ours.
_MODE_ALIASES = {"dryrun": "offline", "run": "online"}
_ONE_OF_MODES = f"one of {', '.join(MODES)}"
# W&B rejects project names with these characters.
_BAD_PROJECT_CHARS = re.compile(r"[/\\#?%:]")


class RejectedError(Exception):
    """A value a check does not take; ``allowed`` overrides the check's own words."""

    def __init__(self, allowed: str | None = None) -> None:
        super().__init__(allowed)
        self.allowed = allowed


def invalid(option: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"ray_wandb_nodes: invalid {option}={value!r}; {allowed}")


@dataclass(frozen=True)
class Check:
    """One option's validator: ``normalise`` returns the value the run uses or raises ``RejectedError``."""

    allowed: str  # what is allowed, as the options page and the error say it
    normalise: Callable[[Any], Any]

    def __call__(self, option: str, value: Any) -> Any:
        try:
            return self.normalise(value)
        except RejectedError as e:
            raise invalid(option, value, f"expected {e.allowed or self.allowed}") from None


def choice(choices: type[_E]) -> Check:
    """One of ``choices``' members, as a user spells it (exactly: case and spaces count)."""
    values = spellings(choices)

    def normalise(value: Any) -> _E:
        if not isinstance(value, str) or value not in values:
            raise RejectedError
        return choices(value)

    return Check(f"one of {', '.join(repr(v) for v in values)}", normalise)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise RejectedError
    return value


BOOLEAN = Check("True or False", _boolean)


def seconds(minimum: float | None = None) -> Check:
    def normalise(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise RejectedError("a finite number of seconds greater than 0")
        if minimum is not None and value < minimum:
            raise RejectedError
        return float(value)

    at_least = f", at least {minimum}" if minimum is not None else " greater than 0"
    return Check(f"a finite number of seconds{at_least}", normalise)


def _text_or_none(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise RejectedError
    return value  # type: ignore[no-any-return]


TEXT_OR_NONE = Check("a non-empty string or None", _text_or_none)


def _project(value: Any) -> str | None:
    _text_or_none(value)
    if value is not None and (len(value) > 128 or _BAD_PROJECT_CHARS.search(value)):
        raise RejectedError("a W&B project name: at most 128 characters without / \\ # ? % :")
    return value  # type: ignore[no-any-return]


PROJECT = Check("a W&B project name (at most 128 characters without / \\ # ? % :) or None", _project)


def _notes(value: Any) -> str | None:
    return value if value is None else str(value)


NOTES = Check("a string or None", _notes)


def _text_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise RejectedError("a list of strings")
    items = tuple(value)
    if not all(isinstance(v, str) and v for v in items):
        raise RejectedError("a list of non-empty strings")
    return items


TEXT_LIST = Check("a list of non-empty strings or None", _text_list)


def dict_or_none(what: str) -> Check:
    def normalise(value: Any) -> dict[str, Any]:
        if value is not None and not isinstance(value, Mapping):
            raise RejectedError
        return dict(value or {})

    return Check(f"a dict of {what} or None", normalise)


def _gpu_ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    ids = tuple(value) if isinstance(value, Iterable) and not isinstance(value, str) else None
    if ids is None or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise RejectedError
    return ids


GPU_IDS = Check("a list of GPU indices >= 0 (as nvidia-smi numbers them) or None", _gpu_ids)


def mode_value(value: Any, source: str = "mode") -> Mode:
    """One of MODES in any case (wandb's aliases accepted); ``source`` names where the value came from."""
    if not isinstance(value, str):
        raise invalid(source, value, f"expected {_ONE_OF_MODES}")
    mode = _MODE_ALIASES.get(value.strip().lower(), value.strip().lower())
    if mode not in MODES:
        extra = " (shared mode is what the plugin uses underneath online runs)" if mode == "shared" else ""
        raise invalid(source, value, f"expected {_ONE_OF_MODES}{extra}")
    return Mode(mode)


def _mode(value: Any) -> Mode | None:
    return None if value is None else mode_value(value)


MODE = Check(_ONE_OF_MODES, _mode)


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= 1:
        raise RejectedError
    return float(value)


FRACTION = Check("a number in (0, 1]: the fraction of the other nodes' median", _fraction)


def _writers(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RejectedError
    return value


WRITERS = Check("a whole number of node writers, at least 1 (W&B tests 300 a run)", _writers)


def _api_key(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        # The value itself is never shown: it may be a real key with a typo.
        raise ValueError("ray_wandb_nodes: invalid api_key (not shown); expected a non-empty string")
    return value  # type: ignore[no-any-return]


API_KEY = Check("a non-empty string or None", _api_key)


def _key_file(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise RejectedError
    return value  # type: ignore[no-any-return]


KEY_FILE = Check("the path of a file holding the W&B API key, or None", _key_file)
INIT_KWARGS = Check("wandb.init keyword arguments", lambda value: dict(value or {}))


def _hang_timeout(value: Any) -> Any:
    try:
        return parse_hang_timeout(value)
    except ValueError:
        raise RejectedError from None


HANG_TIMEOUT = Check(
    'a number of seconds > 0, "auto" (follow the job\'s cadence, below the process-group timeout) or None (off)',
    _hang_timeout,
)
