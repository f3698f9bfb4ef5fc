"""Every pass of the loop timed on the rank's clock (``_worker.step_loops``), on real torch: two
ranks over gloo, in real processes, run a DDP over BatchNorm, gradient accumulation under
``no_sync()`` and FSDP2, each balanced and with one rank slowed, and the windows of their totals
name the slow rank and its cause (and no rank in a balanced job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ray_wandb_nodes._health.rank_rule import RankRule
from ray_wandb_nodes._steps import Cause, RankWindow, Sources, StepTotals, attribute, rank_window
from tests.support.loop_ranks import ACCUMULATE, PASS_S, SLOW_S

CASES = (
    *("ddp_bn:none:1", "ddp_bn:input:1", "accum:none:1", "accum:compute:1", "fsdp2:none:1", "fsdp2:compute:1"),
    *("ddp_count:none:1", "ddp_count:input:1", "ddp_bn_compiled:input:1", "fsdp2_compiled:compute:1"),
    *("lightning:none:1", "lightning:input:1", "lightning_accum:compute:1"),
)
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[RankWindow]]:
    """Every case's windows (rank 0, rank 1), from one run of two real ranks."""
    pytest.importorskip("torch")
    directory = tmp_path_factory.mktemp("loops")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in (0, 1):
        cmd = [sys.executable, "-m", "tests.support.loop_ranks", "--rank", str(rank), "--cases", ",".join(CASES)]
        cmd += ["--store", str(directory / "store"), "--out", str(directory / f"{rank}.json")]
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True))
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    outs = [json.loads((directory / f"{rank}.json").read_text()) for rank in (0, 1)]
    windows: dict[str, list[RankWindow]] = {}
    for case in CASES:
        for rank in (0, 1):
            first, last = (StepTotals(Sources(t[0]), *t[1:]) for t in outs[rank][case])
            window = rank_window(rank, first, last)
            assert window is not None
            windows.setdefault(case, []).append(window)
    return windows


@pytest.mark.parametrize("kind", ["ddp_bn", "accum", "fsdp2", "ddp_count", "lightning"])
def test_a_balanced_job_of_each_loop_kind_names_no_rank(runs: dict[str, list[RankWindow]], kind: str) -> None:
    windows = runs[f"{kind}:none:1"]
    for w in windows:  # measured on every loop kind: every pass on the host's clock (a CPU model)
        assert w.host_compute_s is not None and w.wait_s is not None and w.passes is not None
    verdict = attribute(windows)
    assert verdict.basis == "wait"
    assert verdict.slow == ()
    # FSDP2 over gloo on a loaded host may wait 30 % of its step from the start: that is the
    # job's pace, and the rule says nothing of it however long it goes on
    rule = RankRule(window_s=60.0)
    assert [a for t in range(0, 600, 10) for a in rule.judge(windows, float(t), {})] == []


def test_under_ddp_with_batchnorm_the_rank_late_for_its_input_is_named_with_cause_input(
    runs: dict[str, list[RankWindow]],
) -> None:
    fast, late = runs["ddp_bn:input:1"]
    # DDP's own forward timer holds rank 0's wait in the buffer broadcast: it looks slow to compute
    assert fast.forward_s is not None and late.forward_s is not None
    assert fast.forward_s - late.forward_s > SLOW_S / 2
    # timed apart, that is rank 0's wait; the computes are alike
    assert fast.wait_s is not None and fast.wait_s > SLOW_S / 2
    assert fast.compute_s is not None and late.compute_s is not None
    assert abs(fast.compute_s - late.compute_s) < SLOW_S / 2
    verdict = attribute([fast, late])
    assert [(f.rank, f.cause) for f in verdict.slow] == [(1, Cause.INPUT)]


def test_with_gradient_accumulation_every_micro_batch_is_compute(runs: dict[str, list[RankWindow]]) -> None:
    fast, slow = runs["accum:compute:1"]
    assert fast.passes == slow.passes == ACCUMULATE
    # every micro-batch's compute is in the slow rank's, not only the synced one DDP times
    assert slow.compute_s is not None and fast.compute_s is not None
    assert slow.compute_s - fast.compute_s > ACCUMULATE * SLOW_S * 0.8
    assert slow.forward_s is not None and slow.forward_s < 2 * (PASS_S + SLOW_S)  # DDP's: one pass
    verdict = attribute([fast, slow])
    assert [(f.rank, f.cause) for f in verdict.slow] == [(1, Cause.COMPUTE)]


def test_fsdp2_names_the_rank_slow_to_compute_by_its_waits(runs: dict[str, list[RankWindow]]) -> None:
    fast, slow = runs["fsdp2:compute:1"]
    assert fast.ddp_samples == slow.ddp_samples == 0  # no DDP: FSDP2's own collectives were timed
    assert fast.wait_s is not None and slow.wait_s is not None and fast.wait_s - slow.wait_s > SLOW_S / 2
    verdict = attribute([fast, slow])
    assert verdict.basis == "wait"
    assert [(f.rank, f.cause) for f in verdict.slow] == [(1, Cause.COMPUTE)]


def test_a_collective_between_the_fetch_and_the_pass_is_the_others_wait(runs: dict[str, list[RankWindow]]) -> None:
    """The Hugging Face ``Trainer`` all-gathers each step's token count after its fetch, before its
    forward: the ranks wait there for the one late for its input, outside any pass."""
    fast, late = runs["ddp_count:input:1"]
    assert fast.wait_s is not None and late.wait_s is not None and fast.wait_s - late.wait_s > SLOW_S / 2
    assert fast.compute_s is not None and late.compute_s is not None
    assert abs(fast.compute_s - late.compute_s) < SLOW_S / 2  # the wait is not taken for compute
    verdict = attribute([fast, late])
    assert [(f.rank, f.cause) for f in verdict.slow] == [(1, Cause.INPUT)]


@pytest.mark.parametrize(
    ("case", "cause"), [("ddp_bn_compiled:input:1", Cause.INPUT), ("fsdp2_compiled:compute:1", Cause.COMPUTE)]
)
def test_under_torch_compile_the_passes_are_still_timed(
    runs: dict[str, list[RankWindow]], case: str, cause: Cause
) -> None:
    windows = runs[case]
    for w in windows:  # dynamo runs DDP's forward and FSDP2's root hooks as they are: one pass a step
        assert w.passes == 1 and w.host_compute_s is not None and w.wait_s is not None
    verdict = attribute(windows)
    assert [(f.rank, f.cause) for f in verdict.slow] == [(1, cause)]


def test_lightning_s_loops_time_the_input_and_name_the_rank_late_for_it(runs: dict[str, list[RankWindow]]) -> None:
    """Lightning's fit loop fetches through its data fetcher (one batch ahead) on the training
    thread, and steps through its DDP strategy: the late rank's wait is input, the others' a wait."""
    fast, late = runs["lightning:input:1"]
    assert late.input_s is not None and fast.input_s is not None and late.input_s - fast.input_s > SLOW_S * 0.8
    assert fast.wait_s is not None and late.wait_s is not None and fast.wait_s - late.wait_s > SLOW_S / 2
    verdict = attribute([fast, late])
    assert [(f.rank, f.cause) for f in verdict.slow] == [(1, Cause.INPUT)]


def test_lightning_accumulating_counts_every_micro_batch_s_compute_on_every_rank(
    runs: dict[str, list[RankWindow]],
) -> None:
    """Lightning's ``accumulate_grad_batches`` (its own ``no_sync()``): each rank's compute is its
    micro-batches' passes, the rank that waits for the slow one included (its wait is not taken
    out of its compute twice)."""
    fast, slow = runs["lightning_accum:compute:1"]
    assert fast.passes == slow.passes == ACCUMULATE
    assert fast.compute_s is not None and slow.compute_s is not None
    assert fast.compute_s > ACCUMULATE * PASS_S * 0.8, fast  # its own passes, not zero
    assert slow.compute_s - fast.compute_s > ACCUMULATE * SLOW_S * 0.8
    verdict = attribute([fast, slow])
    assert [(f.rank, f.cause) for f in verdict.slow] == [(1, Cause.COMPUTE)]
