"""The memory-error rule (pure): a GPU whose uncorrectable ECC count goes up.

An uncorrectable ECC error corrupts what the GPU computes and is never noise: an increase of a
GPU's (volatile) uncorrected count over what it was when the run first saw it is an ERROR at
once, not after a window. The baseline is the count of the writer's first sample (the oldest of
its first block), so errors within that block are judged too; a count that goes back down (a GPU
reset or a driver reload zeroes the volatile count) is a new baseline, so new errors after a
reset are alerted even below the old maximum. One alert per *episode*: further increases while the count keeps
rising belong to the same one; an episode ends once the count has stayed put for the window
(and the minimum of samples), and a later increase is a new episode. The GPU's state stays
``memory errors`` for the rest of the run. Corrected counts are not judged (they go to the table).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .rule import NodeStreak, advance


@dataclass
class EccWatch:
    """One GPU's uncorrected ECC count as the rule has seen it."""

    last: float | None = None  # the newest count (the first one seen is the baseline)
    episode: bool = False  # rising now
    ever: bool = False  # rose at least once in this run
    quiet: NodeStreak = field(default_factory=NodeStreak)  # samples without an increase, in an episode
    resets: int = 0  # times the count went back down (a reset): each a new baseline
    base: float | None = None  # the baseline: the first count, or the count after the latest reset


def ecc_step(
    watch: EccWatch, count: float, samples: int, start: float, end: float, window_s: float, min_samples: int
) -> bool:
    """A new uncorrected ``count`` (over ``samples`` samples from ``start`` to ``end``); whether an
    episode begins now (the one time to alert). ``watch`` is updated."""
    if watch.last is None:
        watch.last = watch.base = count
        return False
    if watch.base is None:
        watch.base = watch.last
    if count < watch.last:  # a GPU reset or a driver reload zeroed the volatile count: a new baseline
        watch.last = watch.base = count
        watch.resets += 1
        return False
    rose = count > watch.last
    watch.last = count
    if rose:
        watch.quiet.reset()
        began = not watch.episode
        watch.episode = watch.ever = True
        return began
    if watch.episode:
        # ``advance`` on a flagged streak counts the samples that are no longer "worse".
        watch.quiet.flagged = True
        if advance(watch.quiet, False, samples, start, end, window_s, min_samples):
            watch.episode = False
            watch.quiet = NodeStreak()
    return False
