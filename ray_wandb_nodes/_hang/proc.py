"""What ``/proc`` says of a rank's process without ptrace: how often a thread has gone to sleep of
its own accord, whether it is stopped, and whether the process still catches a signal.

``dumps`` reads these to prove that a rank's Python cannot run before it signals the rank for
faulthandler's dump (see its rules); each reads Linux's text files and says "unknown" (None, or
False) where they cannot be read.
"""

from __future__ import annotations


def task_status(pid: int, tid: int) -> str:
    """``/proc/<pid>/task/<tid>/status`` ("" where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            return f.read()
    except OSError:
        return ""


def field(status: str, name: str) -> str:
    """One field of a ``status`` file ("" where it has none)."""
    for line in status.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return ""


def thread_wakes(pid: int, tid: int) -> int | None:
    """How many times thread ``tid`` of ``pid`` has gone to sleep of its own accord (None: unknown)."""
    try:
        return int(field(task_status(pid, tid), "voluntary_ctxt_switches"))
    except ValueError:
        return None


def thread_stopped(pid: int, tid: int) -> bool:
    """Whether thread ``tid`` of ``pid`` is stopped (SIGSTOP, or a debugger)."""
    return field(task_status(pid, tid), "State")[:1] in ("T", "t")


def signal_caught(pid: int, signum: int) -> bool:
    """Whether ``pid`` still catches ``signum`` (``SigCgt`` of ``/proc/<pid>/status``): a C-level
    handler, which faulthandler's is. False where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = int(field(f.read(), "SigCgt"), 16)
    except (OSError, ValueError):
        return False
    return signum > 0 and bool(mask >> (signum - 1) & 1)
