"""The values of options that are more than a plain type: each parsed once, when the callback is
built (a clear ``ValueError`` naming the option, the value and what is allowed), into a value the
rest of the package reads without asking again."""

from __future__ import annotations

import math
from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class HangTimeout:
    """A validated ``hang_timeout_s``: off (``None``), ``"auto"``, or a fixed number of seconds."""

    seconds: float | None = None
    auto: bool = False

    @property
    def enabled(self) -> bool:
        return self.auto or self.seconds is not None


def parse_hang_timeout(value: object) -> HangTimeout:
    """``hang_timeout_s`` as given by a user; a clear ``ValueError`` for anything else."""
    if value is None:
        return HangTimeout()
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return HangTimeout(auto=True)
        raise ValueError(
            f'hang_timeout_s={value!r}: expected a number of seconds > 0, "auto" (follow the job\'s cadence) '
            "or None (off)"
        )
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f'hang_timeout_s={value!r}: expected a number of seconds > 0, "auto" (follow the job\'s cadence) '
            "or None (off)"
        )
    return HangTimeout(seconds=float(value))
