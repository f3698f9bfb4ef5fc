"""What node health says to the run (pure): an alert's shape, and the words of every alert, a
node's (straggler, recovered, lost) and a GPU's. A GPU rule's finding is written once
(:func:`gpu_finding`) for the live alert and the offline report's flag alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .kinds import EventKind

if TYPE_CHECKING:
    from .gpu import Gpu, GpuEvent


@dataclass(frozen=True)
class Alert:
    title: str
    text: str
    level: str  # "INFO", "WARN" or "ERROR", as wandb.AlertLevel names them
    node: str  # the node's label
    kind: EventKind
    recovered: bool = False  # a recovery from ``kind`` (a GPU back to normal)
    gpus: tuple[int, ...] = ()  # the NVML indices of the node's GPUs it is about (GPU alerts)


# W&B drops an alert whose title it got less than this ago (``run.alert``'s ``wait_duration``):
# a backstop under the hold of a flapping GPU, and for a node that flaps.
ALERT_WAIT_S = 300.0


def ranks_text(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "no train workers"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"


# nodes ------------------------------------------------------------------------------------------
def node_who(label: str, hostname: str, ranks: tuple[int, ...]) -> str:
    return f"{label} (host {hostname or '?'}, {ranks_text(ranks)})"


def lost_alert(label: str, who: str, last_age: float | None) -> Alert:
    age = f"; its last sample is {last_age:.0f}s old" if last_age is not None else ""
    return Alert(f"Node lost: {label}", f"{who} left the cluster{age}.", "ERROR", label, EventKind.NODE_LOST)


def straggler_alert(
    label: str,
    who: str,
    kind: EventKind,
    *,
    what: str,
    value: float | None,
    median: float | None,
    bound: str,
    window_s: float,
) -> Alert:
    """A straggler alert (``kind`` STRAGGLER) or its recovery (RECOVERED): ``what`` the rule
    compares (``"cpu"``, ``"gpu:<model>"`` or the metric), ``bound`` the rule's ("0.7 x")."""
    name = "CPU (%)" if what == "cpu" else _gpu_name(what) if what.startswith("gpu:") else what
    figures = f"{name} {_fmt(value)}; the other nodes' median {_fmt(median)}"
    if kind is EventKind.STRAGGLER:
        text = f"{who} is a straggler: {figures} (worse than {bound} that median for {window_s:g}s)."
        return Alert(f"Straggler: {label}", text, "WARN", label, kind)
    return Alert(f"Straggler recovered: {label}", f"{who} has recovered: {figures}.", "INFO", label, kind)


# GPUs -------------------------------------------------------------------------------------------
_TITLES = {
    EventKind.SLOW_GPU: ("Slow GPU", "Slow GPU recovered", "WARN"),
    EventKind.IDLE_GPU: ("Idle GPU", "Idle GPU recovered", "WARN"),
    EventKind.GPU_MEMORY_ERRORS: ("GPU memory errors", "GPU memory errors", "ERROR"),
    EventKind.GPU_LOST: ("GPU lost", "GPU back", "ERROR"),
}


def gpu_finding(event: GpuEvent, *, threshold: float, window_s: float) -> str:
    """What a GPU rule found, said of its GPU without naming it ("is slow: SM clock ...")."""
    gpu, kind, recovered = event
    if kind is EventKind.SLOW_GPU:
        peers = f"{gpu.model} GPUs" if gpu.model else "GPUs"
        clock = gpu.busy_sm if gpu.busy_sm is not None else gpu.sm  # the clock judged: its busy samples'
        figures = (
            f"SM clock {_n(clock)} MHz against {_n(gpu.slow.median)} MHz, the median of the job's other busy "
            f"{peers}; at {_n(gpu.util)} % utilisation, {_n(gpu.temp)} C, {_n(gpu.power)} W of {_n(gpu.limit)} W"
        )
        if recovered:
            return f"has recovered: {figures}."
        return f"is slow: {figures} (below {threshold:g} x that median for {window_s:g}s)."
    if kind is EventKind.IDLE_GPU:
        figures = f"utilisation {_n(gpu.util)} %; the other ranks' GPUs' median {_n(gpu.idle.median)} %"
        return f"is busy again: {figures}." if recovered else f"is idle: {figures} (for {window_s:g}s)."
    if kind is EventKind.GPU_MEMORY_ERRORS:
        base = gpu.ecc.base if gpu.ecc.base is not None else gpu.ecc_first
        since = "after its count was reset" if gpu.ecc.resets else "when the run first saw it"
        return (
            f"reports uncorrectable memory (ECC) errors: {_n(gpu.ecc_u)}, up from {_n(base)} {since} "
            f"(corrected: {_n(gpu.ecc_c)}). Its results may be wrong: replace it or drain its node."
        )
    if kind is EventKind.GPU_LOST:
        if recovered:
            return "reports again."
        return (
            f"stopped reporting while its node samples on (for {window_s:g}s): it fell off the bus, "
            "or every NVML call for it fails."
        )
    raise ValueError(f"not a GPU event: {kind!r}")


def gpu_name(gpu: Gpu) -> str:
    """``GPU <index>`` and its model."""
    return f"GPU {gpu.index} ({gpu.model})" if gpu.model else f"GPU {gpu.index}"


def gpu_alert(
    event: GpuEvent,
    *,
    label: str,
    hostname: str,
    node_ranks: tuple[int, ...],
    unmapped: tuple[int, ...],
    threshold: float,
    window_s: float,
) -> Alert:
    """The alert for one GPU event: it names the node, the host, ``GPU <index>`` and its model,
    the ranks Ray assigned to it, the value and the others' median."""
    gpu, kind, recovered = event
    if gpu.ranks:
        on = ranks_text(gpu.ranks)
    elif unmapped:  # Ray's ids of these ranks have no NVML index (MIG, an unknown UUID)
        on = f"{ranks_text(unmapped)} on this node; which GPU each uses is not known"
    else:
        on = "no rank" if node_ranks else "no train workers"
    who = f"{gpu_name(gpu)} of {label} (host {hostname or '?'}, {on})"
    flagged, back, level = _TITLES[kind]
    title = f"{back if recovered else flagged}: {label} GPU {gpu.index}"
    text = f"{who} {gpu_finding(event, threshold=threshold, window_s=window_s)}"
    return Alert(title, text, "INFO" if recovered else level, label, kind, recovered, (gpu.index,))


def _gpu_name(kind: str) -> str:
    model = kind[len("gpu:") :]
    return f"GPU utilisation (%, {model})" if model else "GPU utilisation (%)"


def _n(value: float | None) -> str:
    """A reading as W&B shows it: whole MHz, W, C, % and counts."""
    return "n/a" if value is None else f"{value:.0f}"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
