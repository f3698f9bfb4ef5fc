"""A multi-host Ray cluster on one machine: each worker node a host of its own in Linux namespaces.

Topology (``N`` is the cluster's slot, 0-15; 198.18.0.0/15 is RFC 2544's range for benchmarking
network devices, which no real network routes)::

    the machine (root namespaces)                     host "a" (its own namespaces)
    pytest: the driver, the Train controller,         network: eth0 198.18.N.10/24, lo, no
            the primary writer                          default route: nothing past the bridge
    Ray head (PID + mount namespace of its own)       UTS: its own hostname
    W&B test backend (a thread of pytest)             mount: its own /dev/shm (tmpfs),
                                                        /etc/hosts, /etc/hostname, /tmp, /proc
      198.18.N.1 head ─┐                              PID: its init (host_init.py), its raylet
      198.18.N.2 W&B  ─┤  bridge rwnhN                  (``ray start --address``) and all that
                       ├── veth rwnhN-a ── eth0          the raylet starts
                       └── veth rwnhN-b ── eth0       host "b": 198.18.N.11, the same

**Why the head is on the machine.** The driver must be on the head's node: Ray Train's controller
and the plugin's primary writer run on the driver's node, as they do where a user's job runs on
the head (or a login node) that reaches W&B. A head in namespaces of its own would need pytest
inside them too. The head runs no rank (no CPU), so its hostname and ``/dev/shm`` are not what
the tests look at; it has a PID namespace all the same, so that every process it starts dies
with it. Its address, and the W&B backend's, are on the bridge, where every host reaches them.

**Traffic stays on the bridge.** Hosts have one route, the bridge's /24; the machine forwards
nothing of theirs (a bridge, no NAT, no route into the hosts' subnet from anywhere else). The
slot's /24 is checked unused on the machine before the cluster takes it.

**Faults**, on and off at any time of a run:

- :meth:`Host.block` / :meth:`Host.unblock`: the host loses its way to one address (the W&B
  backend's, the head's, another host's), by a route in its own table (:class:`Block`: no route,
  a prohibiting route, or a silent drop);
- :meth:`Host.cut_off_from_head` / :meth:`Host.reconnect_to_head`: a partition, the host alive
  and reaching W&B, the head out of its reach;
- :meth:`Host.kill`: the whole host dies at once (its init is killed, so the kernel ends every
  process of its PID namespace) and its link goes down, so nothing answers for it any more;
  :meth:`Host.start` boots it again (a new raylet: a new Ray node, the same hostname and address).

**Memory limits** (``HostSpec(memory_bytes=...)``): the host gets a memory cgroup of its own
(``tests/support/host_memory.py``), made under the machine's cgroup of this process (v1 where the
memory controller is mounted as v1, as here; v2 otherwise; found at run time), with the limit and
no swap beyond it. The host's init and everything under it are in it (its starter joins the cgroup
before it execs; :meth:`Host.command` joins it before ``nsenter``), and the host has a cgroup
namespace of its own with that cgroup mounted where a container has its own (v1
``/sys/fs/cgroup/memory``, v2 ``/sys/fs/cgroup``): Ray's memory monitor reads the host's limit
there, the kernel's OOM killer acts inside it as in a pod, and ``oom_kill`` counts it. Removed
with the host's other leftovers: on stop, and by the sweep of a slot no live process holds.
``host_memory.memory_limits_unsupported()`` says why a machine cannot (no memory controller; a
v2 cgroup that cannot give its children one).

**HTTPS** (``tls=True``): the backend serves TLS with a certificate for its address, signed by an
authority the test makes (``tests/support/tls.py``) in the shared folder; every process of the
head and the hosts trusts it (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``), as a node trusts W&B's.

**What is shared** (what these hosts do not prove): one kernel, one clock, one CPU and memory
budget, and the file system outside the private mounts: the code and the venv, root's home, and
the ``shared`` folders (pytest's base temp: the runs' storage, as a cluster's shared file system).

**Cleanup.** Every name starts with ``rwnh<N>``. Each process of a host dies with its init; each
init dies with the pytest thread that started it (``setpriv --pdeathsig``, then
``unshare --kill-child``), even when pytest is killed. :meth:`HostCluster.stop` (fixture
finalizers, and ``atexit``) kills the inits, deletes the namespaces (their veths go with them),
the memory cgroups, the bridge and the folder. A slot is held by a lock for the cluster's life; at start, every slot
no live process holds is swept of what a crashed run left.

``python -m tests.support.hosts`` says whether this machine can run them (``.ci/run`` does).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tests.support import host_memory
from tests.support.host_net import Block, Network, sweep_leftovers, take_slot
from tests.support.nvml import Gpu, ScriptedGpus
from tests.support.tls import Certificate, make_certificate
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend

__all__ = ["Block", "Host", "HostCluster", "HostSpec", "host_cluster", "memory_limits_unsupported", "unsupported"]

memory_limits_unsupported = host_memory.memory_limits_unsupported

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("ip", "unshare", "nsenter", "setpriv", "mount")
_NAME = re.compile(r"[a-z0-9]{1,6}")
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,62}[A-Za-z0-9])?")
# Ray's processes must never see a proxy (its gRPC breaks with one); the hosts' writers go direct.
_PROXY_VARIABLES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy", "grpc_proxy"}
OBJECT_STORE_BYTES = 200 * 1024 * 1024  # a raylet's; well under a host's 1 GiB /dev/shm
START_TIMEOUT_S = 90  # a raylet's start, several at once on 2 loaded cores


def unsupported() -> str | None:
    """Why this machine cannot run the multi-host tests, or None when it can."""
    if sys.platform != "linux":
        return f"the multi-host tests need Linux namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the multi-host tests need root (network, UTS, mount and PID namespaces, a bridge)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the multi-host tests need {', '.join(missing)} (Debian: apt-get install iproute2 util-linux)"
    if not Path("/dev/net/tun").exists():
        return "the multi-host tests need /dev/net/tun (Block.DROPPED routes into a tun device)"
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"the multi-host tests cannot make namespaces here: {probe.stderr.strip()}"
    return None


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """A worker host: ``name`` (1-6 of a-z, 0-9: in its interfaces' names), the ``hostname`` it
    calls itself (up to 64 characters: a long pod name or an FQDN as well), its Ray CPUs, its
    scripted GPUs (``tests/support/nvml.py``; Ray's ``num_gpus`` is their count), more
    environment for its processes and a memory limit (``memory_bytes``)."""

    name: str
    hostname: str
    cpus: int = 1
    gpus: tuple[Gpu, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    memory_bytes: int | None = None  # a memory limit: the host in a memory cgroup of its own (see the module)

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"HostSpec name {self.name!r}: 1-6 characters of a-z and 0-9")
        if not _HOSTNAME.fullmatch(self.hostname):
            raise ValueError(f"HostSpec hostname {self.hostname!r}: up to 64 of A-Z, a-z, 0-9, '.' and '-'")


class Host:
    """One worker host: its namespaces, its init, its raylet (``node_id``), and its faults."""

    def __init__(self, cluster: HostCluster, spec: HostSpec, address: str) -> None:
        self.cluster, self.spec, self.address = cluster, spec, address
        self.name, self.hostname = spec.name, spec.hostname
        self.folder = cluster.folder / spec.name
        self.gpus: ScriptedGpus | None = None
        if spec.gpus:
            gpus_file = cluster.shared_folder / f"gpus-{spec.name}.txt"
            self.gpus = ScriptedGpus(gpus_file, [dataclasses.replace(g) for g in spec.gpus], node=spec.name)
        self.node_id = ""  # the Ray node of the raylet now running here
        self.past_node_ids: list[str] = []  # of the raylets that ran here before a kill
        self.init_pid: int | None = None  # the host's init, as the machine numbers it
        self.cgroup: Path | None = None  # its memory cgroup, with ``memory_bytes`` (the machine's path)
        self._starter: subprocess.Popen[bytes] | None = None

    # inside the host -----------------------------------------------------------------------
    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside the host: every namespace of its init, from the repository."""
        if self.init_pid is None:
            raise RuntimeError(f"host {self.name} is not running")
        spaces = ["--net", "--uts", "--mount", "--pid", *(["--cgroup"] if self.cgroup else [])]
        return self._in_cgroup(["nsenter", f"--target={self.init_pid}", *spaces, f"--wd={REPO}", *argv])

    def _in_cgroup(self, argv: list[str]) -> list[str]:
        """``argv`` run in the host's memory cgroup (where it has one), and all that it starts."""
        if self.cgroup is None:
            return argv
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.cgroup), *argv]

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """What the host's processes get: the cluster's environment (:meth:`HostCluster.environment`),
        the host's scripted GPUs, the spec's ``env``, then ``extra``."""
        env = self.cluster.environment()
        if self.gpus is not None:
            env.update(self.gpus.env())
        env.update(self.spec.env)
        env.update(extra or {})
        return env

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the host and wait for it (its output captured, as text)."""
        return subprocess.run(
            self.command(argv), env=self.environment(env), capture_output=True, text=True, timeout=timeout, check=check
        )

    @property
    def shm(self) -> Path:
        """The host's ``/dev/shm``, as the machine reaches it (while the host runs)."""
        if self.init_pid is None:
            raise RuntimeError(f"host {self.name} is not running: its /dev/shm went with it")
        return Path(f"/proc/{self.init_pid}/root/dev/shm")

    @property
    def tmp(self) -> Path:
        """The host's own ``/tmp`` on the machine's disk (it outlives the host until the cluster stops)."""
        return self.folder / "tmp"

    # faults ----------------------------------------------------------------------------------
    def block(self, address: str, how: Block = Block.NO_ROUTE) -> None:
        """From now on the host cannot reach ``address`` (nor answer it), as ``how`` says; again
        with another ``how`` switches how. It stays, over a kill and a start, until :meth:`unblock`."""
        self.cluster.network.block(self.name, address, how)

    def unblock(self, address: str) -> None:
        """The host reaches ``address`` again (nothing happens where it was not blocked)."""
        self.cluster.network.unblock(self.name, address)

    def blocks(self) -> dict[str, Block]:
        """The addresses this host cannot reach now, and how."""
        return self.cluster.network.blocks(self.name)

    def shape(self, address: str, rate: str) -> None:
        """From now on the host sends to ``address`` at ``rate`` at most (``"64kbit"``: tc's
        units), its other traffic as it was: a link gone slow, until :meth:`unshape`."""
        self.cluster.network.shape(self.name, address, rate)

    def unshape(self) -> None:
        """The host's link at its own speed again."""
        self.cluster.network.unshape(self.name)

    def cut_off_from_head(self, how: Block = Block.DROPPED) -> None:
        """A partition: the host loses the head (Ray's GCS, the driver, the Train controller,
        the primary writer), silently by default, while it still reaches W&B and the other hosts,
        and every process of it runs on. Ray judges the node dead once its health checks go
        unanswered (the cluster's ``system_config``); the raylet ends itself when it hears so,
        or once it has not reached the GCS for Ray's reconnect timeout (60 s)."""
        self.block(self.cluster.head_address, how)

    def reconnect_to_head(self) -> None:
        """The partition heals (a raylet Ray judged dead meanwhile ends itself: :meth:`kill`
        and :meth:`start` boot the host anew)."""
        self.unblock(self.cluster.head_address)

    def kill(self) -> None:
        """The host dies as a machine does: every process at once (the kernel ends a PID
        namespace whose init is killed) and its link down, so nothing answers for it, not even a
        reset: the head learns of it when its health checks go unanswered."""
        if self.init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        if self._starter is not None:
            self._starter.wait(30)
        self.cluster.network.link(self.name, up=False)
        self.init_pid, self._starter = None, None
        if self.node_id:
            self.past_node_ids.append(self.node_id)
            self.node_id = ""

    def start(self) -> None:
        """Boot the host (again, after :meth:`kill`): its init, then its raylet, and wait for
        its Ray node. Call it from the main thread: the host dies with the thread that started it."""
        self._await(self._begin())

    def _begin(self) -> subprocess.Popen[bytes]:
        """Start the host's init, then ``ray start`` inside (not waited for)."""
        self.cluster.network.link(self.name, up=True)
        self._start_init()
        log = open(self.folder / "ray-start.log", "ab")
        argv = [
            "ray", "start", f"--address={self.cluster.address}", f"--node-ip-address={self.address}",
            f"--num-cpus={self.spec.cpus}", f"--num-gpus={len(self.spec.gpus)}",
            f"--object-store-memory={OBJECT_STORE_BYTES}", "--temp-dir=/tmp/ray", "--disable-usage-stats",
        ]  # fmt: skip
        with log:
            return subprocess.Popen(self.command(argv), env=self.environment(), stdout=log, stderr=subprocess.STDOUT)

    def _await(self, ray_start: subprocess.Popen[bytes]) -> None:
        import ray

        if ray_start.wait(START_TIMEOUT_S) != 0:
            log = (self.folder / "ray-start.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"host {self.name}: ray start exited with {ray_start.returncode}:\n{log}")

        def joined() -> str:
            for node in ray.nodes():
                if node["Alive"] and node["NodeManagerAddress"] == self.address:
                    if node["NodeID"] not in self.past_node_ids:
                        return str(node["NodeID"])
            return ""

        self.node_id = wait_until(joined, START_TIMEOUT_S, f"host {self.name}'s raylet to join the cluster")

    def _start_init(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "tmp").mkdir(exist_ok=True)
        etc = self.folder / "etc"
        etc.mkdir(exist_ok=True)
        (etc / "hostname").write_text(self.hostname + "\n")
        (etc / "hosts").write_text(self.cluster.etc_hosts())
        shares = [arg for folder in self.cluster.host_shares() for arg in ("--share", str(folder))]
        cgroup: list[str] = []
        if self.spec.memory_bytes is not None:
            self.cgroup = host_memory.create(self.cluster.network.slot, self.name, self.spec.memory_bytes)
            cgroup = ["--cgroup", str(host_memory.version())]
        argv = self._in_cgroup([
            "setpriv", "--pdeathsig", "KILL", "--",
            "nsenter", f"--net=/run/netns/{self.cluster.network.netns(self.name)}", "--",
            "unshare", "--uts", "--mount", "--pid", *(["--cgroup"] if cgroup else []), "--fork", "--kill-child",
            "--mount-proc", "--", sys.executable, "-m", "tests.support.host_init",
            "--hostname", self.hostname, "--etc", str(etc), "--tmp", str(self.folder / "tmp"), *shares, *cgroup,
        ])  # fmt: skip
        self._starter, self.init_pid = _start_init(argv, self.environment(), self.folder / "init.log")

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.hostname}, {self.address}, node {self.node_id[:8] or '-'})"


def _start_init(argv: list[str], env: Mapping[str, str], log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start an init (``host_init.py``) under ``unshare --fork``; wait for its ``ready``; the
    ``unshare`` process and the init's pid on the machine."""
    with open(log, "ab") as err:
        starter = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=dict(env), cwd=REPO)
    assert starter.stdout is not None
    ready, _, _ = select.select([starter.stdout], [], [], 30)
    line = starter.stdout.readline() if ready else b""
    starter.stdout.close()
    if line.strip() != b"ready":
        starter.kill()
        starter.wait()
        raise RuntimeError(f"an init did not start ({' '.join(argv)}):\n{log.read_text(errors='replace')[-3000:]}")
    children = Path(f"/proc/{starter.pid}/task/{starter.pid}/children").read_text().split()
    return starter, int(children[0])


class HostCluster:
    """A Ray head on the machine, worker hosts in namespaces (``hosts``, by name), and a W&B test
    backend on an address of its own (``backend``, at ``wandb_address``); the driver is connected
    to the head once :meth:`start` returns. See the module's docstring."""

    def __init__(
        self,
        specs: Sequence[HostSpec],
        *,
        shared: Sequence[str | os.PathLike[str]] = (),
        system_config: Mapping[str, Any] | None = None,
        tls: bool = False,
    ) -> None:
        if len({s.name for s in specs}) != len(specs) or len({s.hostname for s in specs}) != len(specs):
            raise ValueError(f"hosts need names and hostnames of their own: {[(s.name, s.hostname) for s in specs]}")
        self.specs = list(specs)
        self.shared = [Path(p).resolve() for p in shared]
        self.system_config = dict(system_config or {})
        self.tls = tls
        self.certificate: Certificate | None = None  # the backend's, with tls (its authority every process trusts)
        self.hosts: dict[str, Host] = {}
        self.seconds: dict[str, float] = {}  # "start", "stop": the fixture's own cost
        self._lock: IO[bytes] | None = None  # the slot's, held while the cluster lives
        self._head: tuple[subprocess.Popen[bytes], int] | None = None  # its unshare, its init
        self._backend: WandbTestBackend | None = None
        self._network: Network | None = None
        self.address = ""  # the head's GCS, host:port

    def host_shares(self) -> list[Path]:
        """What each host sees of the machine's ``/tmp`` (its own is private): the ``shared``
        folders, and the code and the Python it runs (the repository, the virtual environment)
        where they lie under ``/tmp``, as in a clone CI makes there."""
        code = [p for p in (REPO, Path(sys.prefix).resolve()) if p.is_relative_to("/tmp")]
        outer = [p for p in code if not any(p != q and p.is_relative_to(q) for q in code)]
        return [*self.shared, *(p for p in outer if p not in self.shared)]

    @property
    def network(self) -> Network:
        if self._network is None:
            raise RuntimeError("the host cluster is not started")
        return self._network

    @property
    def folder(self) -> Path:
        """The cluster's folder on the machine: each host's ``/tmp`` and logs, the head's Ray folder."""
        return self.network.folder

    @property
    def backend(self) -> WandbTestBackend:
        """The W&B test backend, listening on :attr:`wandb_address` only."""
        if self._backend is None:
            raise RuntimeError("the host cluster is not started")
        return self._backend

    # addresses -------------------------------------------------------------------------------
    @property
    def head_address(self) -> str:
        return self.network.address(1)

    @property
    def wandb_address(self) -> str:
        """The W&B backend's address: a host that blocks it has no way to W&B."""
        return self.network.address(2)

    @property
    def shared_folder(self) -> Path:
        """A folder every host sees at the same path (the scripted GPUs' files)."""
        folder = (self.shared[0] if self.shared else self.folder) / f"rwn-hosts-{self.network.slot}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def etc_hosts(self) -> str:
        """Every host's ``/etc/hosts``: localhost, the head by the machine's name, every host."""
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost", f"{self.head_address} {socket.gethostname()}"]
        lines += [f"{h.address} {h.hostname}" for h in self.hosts.values()]
        return "\n".join(lines) + "\n"

    def host_of(self, node_id: str) -> Host:
        """The host whose raylet is (or was) the Ray node ``node_id``."""
        for host in self.hosts.values():
            if node_id == host.node_id or node_id in host.past_node_ids:
                return host
        raise KeyError(f"no host ran Ray node {node_id}: {list(self.hosts.values())}")

    # life ------------------------------------------------------------------------------------
    def start(self) -> HostCluster:
        started = time.monotonic()
        _LIVE.add(self)
        slot, self._lock = take_slot()
        self._network = Network(slot)
        self.folder.mkdir(parents=True)
        self.network.create_bridge()
        context = None
        if self.tls:  # in the shared folder: every host reads the authority at the same path
            self.certificate = make_certificate(self.shared_folder / "tls", self.wandb_address)
            context = self.certificate.server_context()
        self._backend = WandbTestBackend(host=self.wandb_address, tls=context).start()
        for i, spec in enumerate(self.specs):
            self.network.add_host(spec.name, 10 + i)
            self.hosts[spec.name] = Host(self, spec, self.network.address(10 + i))
        self._start_head()
        starts = [(host, host._begin()) for host in self.hosts.values()]
        for host, ray_start in starts:
            host._await(ray_start)
        self.seconds["start"] = time.monotonic() - started
        return self

    def _start_head(self) -> None:
        import ray

        from tests.support.cluster import stop_shared_cluster

        stop_shared_cluster()  # the driver joins one cluster at a time
        if ray.is_initialized():
            ray.shutdown()
        env = self.environment()
        argv = [
            "setpriv", "--pdeathsig", "KILL", "--",
            "unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
            sys.executable, "-m", "tests.support.host_init", "--head",
        ]  # fmt: skip
        self._head = _start_init(argv, env, self.folder / "head-init.log")
        (self.folder / "head.pid").write_text(str(self._head[1]))
        port = _free_port(self.head_address)
        self.address = f"{self.head_address}:{port}"
        head = [
            "nsenter", f"--target={self._head[1]}", "--mount", "--pid", f"--wd={REPO}",
            "ray", "start", "--head", f"--node-ip-address={self.head_address}", f"--port={port}",
            "--num-cpus=0", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
            f"--object-store-memory={OBJECT_STORE_BYTES}", f"--temp-dir={self.folder / 'ray'}",
        ]  # fmt: skip
        if self.system_config:
            head.append(f"--system-config={json.dumps(self.system_config)}")
        out = subprocess.run(head, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        if out.returncode != 0:
            raise RuntimeError(f"the head did not start: {out.stdout[-2000:]}{out.stderr[-2000:]}")
        ray.init(address=self.address, _node_ip_address=self.head_address, log_to_driver=False)

    def environment(self) -> dict[str, str]:
        """What the head's and the hosts' processes get: the driver's environment less W&B's
        variables (a node has none: what a writer needs comes through the callback), proxy
        variables and ``RAY_ADDRESS``; the venv's ``bin`` first on ``PATH``, the repository on
        ``PYTHONPATH``."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("WANDB_") and k.lower() not in _PROXY_VARIABLES and k != "RAY_ADDRESS"
        }
        env["PATH"] = os.pathsep.join((os.path.dirname(sys.executable), env.get("PATH", "")))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        if self.certificate is not None:  # wandb-core (Go), Python's ssl and requests trust the test's authority
            env["SSL_CERT_FILE"] = env["REQUESTS_CA_BUNDLE"] = str(self.certificate.ca)
        # Ray 2.60's `ray start --head` turns token auth on where RAY_AUTH_MODE is unset and a token
        # lies in ~/.ray (a local ray.init() leaves one there), which the driver would then lack.
        env.setdefault("RAY_AUTH_MODE", "disabled")
        return env

    def stop(self) -> None:
        """Everything the cluster made, gone: the driver's connection, every process, namespace,
        link and address, the backend and the folder. Safe to call twice, or after a failed start."""
        started = time.monotonic()
        _LIVE.discard(self)
        with contextlib.suppress(Exception):
            import ray

            ray.shutdown()
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.kill()
        if self._head is not None:
            starter, pid = self._head
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            starter.wait(30)
            self._head = None
        if self._backend is not None:
            self._backend.stop()
            self._backend = None
        if self._network is not None and self._lock is not None:
            sweep_leftovers(self._network.slot)  # the namespaces, their veths, the bridge, the folder
            self._lock.close()
            self._lock = None
        self.seconds["stop"] = time.monotonic() - started

    def log_text(self) -> str:
        """Everything the Ray processes of the head and of every host wrote to their log files."""
        out = []
        for root in [self.folder / "ray", *(h.tmp / "ray" for h in self.hosts.values())]:
            for path in root.glob("session_*/logs/**/*"):
                if path.is_file() and path.suffix in (".err", ".out", ".log"):
                    out.append(path.read_text(errors="replace"))
        return "\n".join(out)


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


_LIVE: set[HostCluster] = set()


@atexit.register
def _stop_live() -> None:
    for cluster in list(_LIVE):
        cluster.stop()


@contextlib.contextmanager
def host_cluster(
    specs: Sequence[HostSpec],
    *,
    shared: Sequence[str | os.PathLike[str]] = (),
    system_config: Mapping[str, Any] | None = None,
    tls: bool = False,
) -> Iterator[HostCluster]:
    """A started :class:`HostCluster` of ``specs``, stopped on the way out (a failure too)."""
    cluster = HostCluster(specs, shared=shared, system_config=system_config, tls=tls)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


if __name__ == "__main__":
    reason = unsupported()
    if reason:
        sys.exit(reason)
    print("ready (root; ip, unshare, nsenter, setpriv, mount; namespaces can be made)")
