"""What node health says to the run: an alert's shape, and the words of each GPU alert (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from .gpus import ECC_EV, IDLE_EV, LOST_EV, SLOW_EV, Gpu


@dataclass(frozen=True)
class Alert:
    title: str
    text: str
    level: str  # "INFO", "WARN" or "ERROR", as wandb.AlertLevel names them
    node: str  # the node's label
    kind: str  # "straggler", "recovered", "lost", or a GPU rule's ("slow-gpu", ...; "-recovered")


def ranks_text(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "no train workers"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"


def gpu_alert(
    gpu: Gpu,
    kind: str,
    recovered: bool,
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
    model = f" ({gpu.model})" if gpu.model else ""
    if gpu.ranks:
        on = ranks_text(gpu.ranks)
    elif unmapped:  # Ray's ids of these ranks have no NVML index (MIG, an unknown UUID)
        on = f"{ranks_text(unmapped)} on this node; which GPU each uses is not known"
    else:
        on = "no rank" if node_ranks else "no train workers"
    who = f"GPU {gpu.index}{model} of {label} (host {hostname or '?'}, {on})"
    where = f"{label} GPU {gpu.index}"
    if kind == SLOW_EV:
        peers = f"{gpu.model} GPUs" if gpu.model else "GPUs"
        figures = (
            f"SM clock {_n(gpu.sm)} MHz against {_n(gpu.slow.median)} MHz, the median of the job's other busy "
            f"{peers}; at {_n(gpu.util)} % utilisation, {_n(gpu.temp)} C, {_n(gpu.power)} W of {_n(gpu.limit)} W"
        )
        if recovered:
            return Alert(
                f"Slow GPU recovered: {where}", f"{who} has recovered: {figures}.", "INFO", label, kind + "-recovered"
            )
        text = f"{who} is slow: {figures} (below {threshold:g} x that median for {window_s:g}s)."
        return Alert(f"Slow GPU: {where}", text, "WARN", label, kind)
    if kind == IDLE_EV:
        figures = f"utilisation {_n(gpu.util)} %; the other ranks' GPUs' median {_n(gpu.idle.median)} %"
        if recovered:
            return Alert(
                f"Idle GPU recovered: {where}", f"{who} is busy again: {figures}.", "INFO", label, kind + "-recovered"
            )
        return Alert(f"Idle GPU: {where}", f"{who} is idle: {figures} (for {window_s:g}s).", "WARN", label, kind)
    if kind == ECC_EV:
        text = (
            f"{who} reports uncorrectable memory (ECC) errors: {_n(gpu.ecc_u)}, up from {_n(gpu.ecc_first)} when "
            f"the run first saw it (corrected: {_n(gpu.ecc_c)}). Its results may be wrong: replace it or drain "
            "its node."
        )
        return Alert(f"GPU memory errors: {where}", text, "ERROR", label, kind)
    if kind == LOST_EV:
        if recovered:
            return Alert(f"GPU back: {where}", f"{who} reports again.", "INFO", label, kind + "-recovered")
        text = (
            f"{who} stopped reporting while its node samples on (for {window_s:g}s): it fell off the bus, "
            "or every NVML call for it fails."
        )
        return Alert(f"GPU lost: {where}", text, "ERROR", label, kind)
    raise ValueError(f"unknown GPU event {kind!r}")


def _n(value: float | None) -> str:
    """A reading as W&B shows it: whole MHz, W, C, % and counts."""
    return "n/a" if value is None else f"{value:.0f}"
