"""What following the ranks' console costs a node, at thousands of lines a second.

    python -m bench.console_cost [--ranks 4] [--rates 0 1000 5000 20000] [--seconds 10]
                                 [--sinks count wandb] [--hot-path-rounds 5] [--json bench/results/console_cost.json]
                                 [--mask-only] [--mask-seconds 2] [--mask-rounds 5]

No Ray: ``--ranks`` writer processes write as Ray's train workers do, each to its own
``worker-<id>-<job>-<pid>.out``/``.err`` in one logs folder, and a tailer process (the node
logger's stand-in) follows them with ``ConsoleTailer``. Each writer, every 10 ms, writes its
share of ``rate`` prints a second (a line of about 100 bytes, each to stderr and to stdout, as
Ray Train 2.60 writes a print) and redraws a progress bar with a carriage return 20 times a
second. Every line is sent live (a plan with no limit, the most work a line can cost: split,
echo check, budget, sink). Side by side, one rate after another in one run:

- ``count``: the sink counts the lines (the tailer's own cost);
- ``wandb``: the sink is ``RunConsole`` on a node writer (shared mode, ``console="off"``) of the
  W&B test backend on 127.0.0.1: the tailer's process and its ``wandb-core`` together.

For each: CPU seconds of the tailer's process (and of wandb-core) per second, as a share of one
core; its resident memory at the start and at the end, and the peak; lines sent. Then the rank's
side: a writer that prints as fast as it can for 2 s, alone and with a tailer following its
files (``--hot-path-rounds`` rounds, alternating), its prints a second: no code of the plugin
runs in the rank, so any difference is the two processes sharing the machine's cores.

``--mask-only``: the cost of masking secrets (``_console.mask``, every line that leaves a node goes
through it) alone, in lines a second of one thread, for kinds of lines: the writers' training
prints, a mix of what ranks print (tracebacks, logging, progress bars, a metrics dict), and lines
that hold secrets; the median of ``--mask-rounds`` rounds of ``--mask-seconds`` each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WRITER_ID = "e8662b947b5a0000246bc771ba56a406fb1bfe2e481f1177727dd2b5"
TICK_S = 0.01
BAR_EVERY = 5  # ticks: a redraw 20 times a second
CLEAR = b"\r" + b" " * 56 + b"\r"


def writer(logs: Path, rate: float, seconds: float, go: Path) -> None:
    """One rank: descriptors 1 and 2 on Ray's file names, then ``rate`` prints a second."""
    pid = os.getpid()
    for fd, suffix in ((1, "out"), (2, "err")):
        target = os.open(logs / f"worker-{WRITER_ID}-01000000-{pid}.{suffix}", os.O_WRONLY | os.O_CREAT, 0o644)
        os.dup2(target, fd)
        os.close(target)
    (logs / f"{pid}.started").touch()
    while not go.exists():
        time.sleep(0.01)
    pad = "x" * 80
    start = time.monotonic()
    sent, tick = 0, 0
    while (now := time.monotonic()) - start < seconds:
        due = int((now - start) * rate) - sent
        if due > 0:
            block = "".join(f"step {sent + i:09d} loss 0.{(sent + i) % 997:03d} {pad}\n" for i in range(due))
            # The bar cleared first, as tqdm.write does: a print never continues the bar's line.
            os.write(2, CLEAR + block.encode())
            os.write(1, block.encode())
            sent += due
        if tick % BAR_EVERY == 0:
            os.write(2, f"\r{int(100 * (now - start) / seconds):3d}%|{'#' * (tick % 50):<50}|".encode())
        tick += 1
        time.sleep(TICK_S)
    os.write(2, b"\n")


def flood(logs: Path, seconds: float) -> None:
    """One rank printing as fast as it can (``print``, line-buffered as in a Ray worker)."""
    pid = os.getpid()
    for fd, suffix in ((1, "out"), (2, "err")):
        target = os.open(logs / f"worker-{WRITER_ID}-01000000-{pid}.{suffix}", os.O_WRONLY | os.O_CREAT, 0o644)
        os.dup2(target, fd)
        os.close(target)
    out = open(1, "w", buffering=1, closefd=False)  # the process's stdout for its life
    count, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(100):
            print(f"step {count:09d} loss 0.123 " + "x" * 80, file=out)
            count += 1
    (logs / "flood.json").write_text(json.dumps({"prints_per_s": count / seconds}))


def tailer(logs: Path, pids: list[int], seconds: float, sink_kind: str, result: Path) -> None:
    """The node logger's stand-in: follow ``pids`` for ``seconds``, then finish; write the figures."""
    from bench._procs import rss_mib, usage
    from ray_wandb_nodes._config.values import ConsoleMode
    from ray_wandb_nodes._console import ConsolePlan, ConsoleTailer, RankProcess, RunConsole

    counted = [0]
    run: Any = None
    core: list[int] = []
    if sink_kind == "wandb":
        import wandb

        run = wandb.init(
            project="bench-console",
            id=f"console-{os.getpid()}",
            dir=str(logs),  # its files in the bench's temporary folder, not the working directory
            settings=wandb.Settings(
                mode="shared", x_primary=False, x_update_finish_state=False, x_label="node-1", console="off"
            ),
        )
        sink: Any = RunConsole(run)
        core = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == os.getpid()]
    else:

        def sink(lines: Any) -> None:
            counted[0] += len(lines)

    unlimited = ConsolePlan(ConsoleMode.ALL, 10**12, 10**12, 200, 10**9, 10**9)
    rss_start = rss_mib("self")
    core_cpu_start = sum(usage(p)[2] for p in core)
    cpu_start, wall_start = time.process_time(), time.monotonic()
    t = ConsoleTailer(unlimited, logs, sink).start()
    t.watch([RankProcess(rank, pid) for rank, pid in enumerate(pids)])
    (logs / "go").touch()
    time.sleep(seconds)
    finished = t.finish(failed=False, timeout=60)
    cpu, wall = time.process_time() - cpu_start, time.monotonic() - wall_start
    core_cpu = sum(usage(p)[2] for p in core) - core_cpu_start
    rss_end = rss_mib("self")
    if run is not None:
        finish_start = time.monotonic()
        run.finish()
        finish_s = time.monotonic() - finish_start
    else:
        finish_s = 0.0
    figures = {
        "finished": finished,
        "lines_sent": t.sent,
        "tailer_cpu_share": cpu / wall,
        "wandb_core_cpu_share": core_cpu / wall,
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_end,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "run_finish_s": finish_s,
    }
    result.write_text(json.dumps(figures))


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "bench.console_cost", *args])


def _wait_file(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.01)


def one_rate(rate: float, ranks: int, seconds: float, sink: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rwn-console-bench-") as folder:
        logs = Path(folder)
        procs = [_spawn("--role", "writer", str(logs), str(rate / ranks), str(seconds)) for _ in range(ranks)]
        for p in procs:
            _wait_file(logs / f"{p.pid}.started")
        result = logs / "result.json"
        tail = _spawn(
            "--role", "tailer", str(logs), ",".join(str(p.pid) for p in procs), str(seconds), sink, str(result)
        )
        for p in procs:
            p.wait()
        tail.wait()
        figures: dict[str, Any] = json.loads(result.read_text())
        written = sum(os.path.getsize(logs / n) for n in os.listdir(logs) if n.startswith("worker-"))
        figures.update(rate=rate, sink=sink, bytes_written_mib=written / 2**20)
        return figures


def hot_path(rounds: int) -> dict[str, float]:
    """A rank's prints a second for 2 s, alone and followed by a tailer, in alternating rounds."""
    alone: list[float] = []
    followed: list[float] = []
    for round_ in range(rounds):
        for with_tailer in (round_ % 2 == 0, round_ % 2 == 1):
            with tempfile.TemporaryDirectory(prefix="rwn-console-hot-") as folder:
                logs = Path(folder)
                rank = _spawn("--role", "flood", str(logs), "2")
                tail = None
                if with_tailer:
                    _wait_file(logs / f"worker-{WRITER_ID}-01000000-{rank.pid}.out")
                    tail = _spawn("--role", "tailer", str(logs), str(rank.pid), "2.5", "count", str(logs / "t.json"))
                rank.wait()
                if tail is not None:
                    tail.wait()
                rate = json.loads((logs / "flood.json").read_text())["prints_per_s"]
                (followed if with_tailer else alone).append(rate)
    return {
        "prints_per_s_alone": statistics.median(alone),
        "prints_per_s_followed": statistics.median(followed),
        "ratio": statistics.median(followed) / statistics.median(alone),
    }


MASK_LINES: dict[str, list[str]] = {
    "training prints": [f"step {i:09d} loss 0.{i % 997:03d} {'x' * 80}" for i in range(1000)],
    "what ranks print": [
        '  File "/home/user/project/train.py", line 59, in train_loop',
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)",
        "Epoch 3: 100%|##########| 500/500 [01:23<00:00, 6.00it/s, loss=0.123, v_num=1]",
        "INFO 2026-12-05 12:00:00,123 trainer.py:88 -- Reporting metrics: {'loss': 0.23, 'accuracy': 0.91}",
        "[rank0]:[W reducer.cpp:1360] Warning: find_unused_parameters=True was specified in DDP constructor",
        "Downloading shard https://huggingface.co/api/models/bert-base/resolve/main/model.safetensors?download=true",
    ]
    * 200,
    "lines with secrets": [
        "WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567",
        "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE&X-Amz-Signature=0a1b2c3d4e5f",
        "headers={'Authorization': 'Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc'}",
        "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyzABCDEFGH aws_secret_access_key=wJalrXUtnFEMI/K7MDENG",
    ]
    * 250,
}


def mask_rates(seconds: float, rounds: int) -> dict[str, float]:
    """Lines a second ``_console.mask`` takes on one thread, for each kind of :data:`MASK_LINES`."""
    from ray_wandb_nodes._mask import mask

    out: dict[str, float] = {}
    for kind, lines in MASK_LINES.items():
        rates = []
        for _ in range(rounds):
            done, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds:
                for line in lines:
                    mask(line)
                done += len(lines)
            rates.append(done / elapsed)
        out[kind] = statistics.median(rates)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--role"]:
        role, rest = argv[1], argv[2:]
        if role == "writer":
            writer(Path(rest[0]), float(rest[1]), float(rest[2]), Path(rest[0]) / "go")
        elif role == "flood":
            flood(Path(rest[0]), float(rest[1]))
        else:
            tailer(Path(rest[0]), [int(p) for p in rest[1].split(",")], float(rest[2]), rest[3], Path(rest[4]))
        return {}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rates", type=float, nargs="+", default=[0, 1000, 5000, 20000])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sinks", nargs="+", default=["count", "wandb"], choices=["count", "wandb"])
    parser.add_argument("--hot-path-rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    parser.add_argument("--mask-only", action="store_true", help="only the cost of masking secrets, in lines a second")
    parser.add_argument("--mask-seconds", type=float, default=2.0)
    parser.add_argument("--mask-rounds", type=int, default=5)
    args = parser.parse_args(argv)
    masking = mask_rates(args.mask_seconds, args.mask_rounds)
    for kind, rate in masking.items():
        print(f"masking secrets, {kind}: {rate:,.0f} lines a second ({1e6 / rate:.1f} us a line)")
    if args.mask_only:
        return {"mask_lines_per_s": masking}
    from bench._harness import test_backend

    rows = []
    with test_backend():
        print(f"{'sink':6s} {'prints/s':>9s} {'lines sent':>10s} {'MiB written':>11s} {'tailer CPU':>10s} "
              f"{'wandb-core':>10s} {'RSS start':>9s} {'RSS end':>8s} {'peak':>6s}")  # fmt: skip
        for sink in args.sinks:
            for rate in args.rates:
                row = one_rate(rate, args.ranks, args.seconds, sink)
                rows.append(row)
                print(
                    f"{sink:6s} {rate:9.0f} {row['lines_sent']:10d} {row['bytes_written_mib']:11.1f} "
                    f"{100 * row['tailer_cpu_share']:9.1f}% {100 * row['wandb_core_cpu_share']:9.1f}% "
                    f"{row['rss_start_mib']:9.1f} {row['rss_end_mib']:8.1f} {row['peak_rss_mib']:6.1f}"
                )
    hot = hot_path(args.hot_path_rounds) if args.hot_path_rounds else {}
    if hot:
        print(
            f"a rank's prints/s alone {hot['prints_per_s_alone']:.0f}, followed {hot['prints_per_s_followed']:.0f} "
            f"(ratio {hot['ratio']:.3f}, median of {args.hot_path_rounds} rounds each)"
        )
    result = {"ranks": args.ranks, "seconds": args.seconds, "rows": rows, "hot_path": hot, "mask_lines_per_s": masking}
    if args.json:
        from bench._harness import write_result

        write_result(args.json, result)
    return result


if __name__ == "__main__":
    main()
