"""Where a command's CPU goes, by kind of process: what the test suite's time is made of.

    python -m bench.cpu_by_process -- python -m pytest -q tests/e2e/test_strategies.py

Runs the command and, every 0.5 s until it ends, reads the CPU time of every process on the
machine from /proc. Each process is named by its Ray title when it has one (``ray::TrainController``,
``ray::NodeLogger``, ``ray::IDLE`` for a pooled worker, ...), else by what it runs (``raylet``,
``wandb-core``, ...); a worker's time before Ray titles it (Python starting, ``import ray``) is
``default_worker (untitled)``. Prints the CPU seconds by kind, the machine's busy share over the
command's wall time, and each Ray worker's path through its titles with its CPU. Processes that
start and end between two samples are missed: the figures are a floor. Run it on a quiet machine
(no other Ray cluster or wandb-core running).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def kind_of(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return None
    if "wandb-core" in cmd or comm.startswith("wandb-core"):
        return "wandb-core"
    if cmd.startswith("ray::"):  # Ray retitles its workers: ray::<Actor>[.<method>]
        return cmd.split(" ")[0].split(".")[0][:40]
    if "default_worker" in cmd:
        return "default_worker (untitled)"
    if comm == "raylet":
        return "raylet"
    for name in ("gcs_server", "dashboard_agent", "runtime_env", "log_monitor", "monitor.py", "dashboard.py", "pytest"):
        if name in cmd:
            return name
    return comm or None


def cpu_ticks(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- python -m pytest -q tests/e2e/test_strategies.py")

    before = {pid for pid in os.listdir("/proc") if pid.isdigit()}
    last: dict[str, int] = {}
    kinds: dict[str, str] = {}
    paths: dict[str, list[str]] = collections.defaultdict(list)
    by_kind: collections.Counter[str] = collections.Counter()
    by_pid: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    proc = subprocess.Popen(command)
    while True:
        done = proc.poll() is not None
        for pid in (p for p in os.listdir("/proc") if p.isdigit() and p not in before):
            ticks = cpu_ticks(pid)
            kind = kind_of(pid) or kinds.get(pid)
            if ticks is None or kind is None:
                continue
            kinds[pid] = kind
            if not paths[pid] or paths[pid][-1] != kind:
                paths[pid].append(kind)
            delta = ticks - last.get(pid, 0)  # a process first seen: all its time so far
            last[pid] = ticks
            by_kind[kind] += delta
            by_pid[pid] += delta
        if done:
            break
        time.sleep(0.5)
    wall = time.monotonic() - started

    total = sum(by_kind.values())
    print(f"command exit code {proc.returncode}; {total / HZ:.1f} CPU-s over {wall:.1f} s wall", end="")
    print(f" ({100 * total / HZ / wall / (os.cpu_count() or 1):.0f} % of {os.cpu_count()} CPUs)")
    print("\nCPU by kind of process:")
    for kind, ticks in by_kind.most_common(25):
        print(f"  {ticks / HZ:8.1f} s {100 * ticks / max(total, 1):5.1f} %  {kind}")
    print("\nRay workers by their titles (processes, CPU, titles in order):")
    counts: collections.Counter[str] = collections.Counter()
    cpu: collections.Counter[str] = collections.Counter()
    for pid, titles in paths.items():
        if any(t.startswith(("ray::", "default_worker")) for t in titles):
            key = " > ".join(titles)
            counts[key] += 1
            cpu[key] += by_pid[pid]
    for key, n in counts.most_common(25):
        print(f"  {n:4d} {cpu[key] / HZ:7.1f} s  {key}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
