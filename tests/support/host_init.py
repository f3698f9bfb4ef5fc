"""The first process of a test host (``tests/support/hosts.py``): PID 1 of the host's PID namespace.

It makes the host's own file system view in its mount namespace, then reaps every process of the
host for as long as the host lives: the processes ``ray start`` leaves behind are reparented to it,
as they are to init on a real machine. When it dies (the host is killed), the kernel kills every
other process of its PID namespace.

A worker host (``--hostname``) gets, before it says ``ready`` on its standard output:

- its hostname (its own UTS namespace);
- an empty ``/dev/shm`` of its own (tmpfs): hang beacons and Ray's object store stay on the host;
- ``/etc/hosts`` and ``/etc/hostname`` from ``--etc``: its name resolves to its own address, so
  gloo (torch.distributed) announces that address to the other ranks;
- ``/sys`` of its network namespace (its interfaces, as ``ip netns exec`` gives);
- with ``--cgroup 1`` or ``2`` (a host with a memory limit, started in its memory cgroup and a
  cgroup namespace of its own), that cgroup mounted as a container's is: v1 at
  ``/sys/fs/cgroup/memory``, v2 at ``/sys/fs/cgroup``, the host's cgroup as the root, where Ray's
  memory monitor and the plugin read the limit, the usage and the OOM kills;
- a ``/tmp`` of its own (``--tmp``), with the ``--share`` folders that lie under ``/tmp`` bound
  into it at their own paths: the runs' storage, as a cluster's shared file system is.

The head (``--head``) only reaps: it shares the machine's file system with the driver (Ray's
sockets in its session folder), and has a PID namespace so that all its processes die with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

SHM_SIZE = "1g"


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def make_host(hostname: str, etc: Path, tmp: Path, shared: list[Path], cgroup: int | None = None) -> None:
    socket.sethostname(hostname)
    mount("-t", "tmpfs", "-o", f"size={SHM_SIZE},mode=1777", "tmpfs", "/dev/shm")
    mount("-t", "sysfs", "sysfs", "/sys")
    if cgroup == 1:  # the host's memory cgroup as a container sees its own (the cgroup namespace's root)
        mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", "/sys/fs/cgroup")
        os.mkdir("/sys/fs/cgroup/memory")
        mount("-t", "cgroup", "-o", "memory", "cgroup", "/sys/fs/cgroup/memory")
    elif cgroup == 2:
        mount("-t", "cgroup2", "cgroup2", "/sys/fs/cgroup")
    for name in ("hosts", "hostname"):
        mount("--bind", str(etc / name), f"/etc/{name}")
    for folder in shared:
        relative = folder.relative_to("/tmp") if folder.is_relative_to("/tmp") else None
        if relative is not None:  # bound into the private /tmp at its own path
            (tmp / relative).mkdir(parents=True, exist_ok=True)
            mount("--bind", str(folder), str(tmp / relative))
    mount("--rbind", str(tmp), "/tmp")


def reap_forever() -> None:
    """Wait for SIGCHLD and reap every child that has ended (orphans of the host included)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while True:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        signal.sigwait({signal.SIGCHLD})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head", action="store_true")
    parser.add_argument("--hostname")
    parser.add_argument("--etc", type=Path)
    parser.add_argument("--tmp", type=Path)
    parser.add_argument("--share", type=Path, action="append", default=[])
    parser.add_argument("--cgroup", type=int, choices=(1, 2))
    args = parser.parse_args()
    if os.getpid() != 1:
        sys.exit("host_init must be the first process of a PID namespace (unshare --pid --fork)")
    if not args.head:
        make_host(args.hostname, args.etc, args.tmp, args.share, args.cgroup)
    print("ready", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the starter stops reading
    reap_forever()


if __name__ == "__main__":
    main()
