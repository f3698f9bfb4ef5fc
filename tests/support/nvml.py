"""Scripted GPUs for the test clusters: the NVML stand-in (``scripted_nvml.c``) built with the
system C compiler, and the file of GPUs it reads, which a test rewrites to change a GPU mid-run.

A node started with :meth:`ScriptedGpus.env` in its raylet's environment loads the stand-in
where it would load NVIDIA's ``libnvidia-ml.so.1``, so wandb's real system monitor on that node
reports the scripted GPUs. What that proves is the path (NVML, wandb's monitor, the writer, the
run, the plugin's summaries and rules), not what real GPUs report: that needs a GPU machine
(``bench/gpu_check.py``).

``python -m tests.support.nvml`` builds the library and prints its folder (``.ci/run`` does,
so that a machine without a C compiler fails before any test runs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tests.support import clib

SOURCE = Path(__file__).with_name("scripted_nvml.c")
LIBRARY = "libnvidia-ml.so.1"


def build() -> Path:
    """The folder holding the built stand-in (``libnvidia-ml.so.1`` and ``libnvidia-ml.so``, the
    name nvml-wrapper and pynvml ask for too), built once per version of the source."""
    return clib.build(SOURCE, LIBRARY, flags=("-lpthread",), aliases=("libnvidia-ml.so",))


@dataclasses.dataclass
class Gpu:
    """One scripted GPU: what NVML reports for it (units as NVML's callers see them)."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    util: int = 95  # %
    mem_used_mib: int = 40960
    mem_total_mib: int = 81920
    temp: int = 60  # C
    power_w: float = 500.0
    power_limit_w: float = 700.0
    sm_clock: int = 1980  # MHz
    mem_clock: int = 2619  # MHz
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    fan: int = 40  # %
    # "ok"; "lost": every NVML call for it fails as for a GPU off the bus; "mig": in MIG mode,
    # NVML answers NOT_SUPPORTED for its utilisation and everything else as for "ok"
    state: str = "ok"
    # NVML's other ECC counters: the aggregate (lifetime) ones (never reported below the volatile
    # ecc_corrected / ecc_uncorrected, which count device memory since the driver loaded) and the
    # uncorrected SRAM errors; wandb reads the volatile device-memory ones
    ecc_corrected_aggregate: int = 0
    ecc_uncorrected_aggregate: int = 0
    ecc_uncorrected_sram: int = 0

    @property
    def memory_allocated(self) -> float:
        """wandb's ``gpu.{i}.memoryAllocated``: used over total, %."""
        return 100.0 * self.mem_used_mib / self.mem_total_mib

    def line(self) -> str:
        fields = [getattr(self, f.name) for f in dataclasses.fields(self)]
        text = [str(v) for v in fields]
        if any("|" in t or "\n" in t for t in text):
            raise ValueError(f"a scripted GPU's fields cannot hold '|' or a newline: {self}")
        return "|".join(text)


class ScriptedGpus:
    """The GPUs of one node: a file the stand-in reads, rewritten atomically on every change."""

    def __init__(self, path: str | os.PathLike[str], gpus: Iterable[Gpu], node: str = "node") -> None:
        self.path = Path(path)
        self.gpus = list(gpus)
        self.node_id = ""  # the Ray node that sees these GPUs, once started
        for i, gpu in enumerate(self.gpus):
            if not gpu.uuid:
                gpu.uuid = f"GPU-{hashlib.md5(f'{node}-{i}'.encode()).hexdigest()[:8]}-0000-0000-0000-{i:012d}"
        self.write()

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ScriptedGpus:
        """The GPUs a file holds: how a train worker changes a node's GPUs mid-run."""
        fields = dataclasses.fields(Gpu)
        gpus = []
        for line in Path(path).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                values = line.split("|")
                gpus.append(
                    Gpu(**{f.name: type(getattr(Gpu(), f.name))(v) for f, v in zip(fields, values, strict=True)})
                )
        out = cls.__new__(cls)
        out.path, out.gpus, out.node_id = Path(path), gpus, ""
        return out

    @classmethod
    @contextlib.contextmanager
    def locked(cls, path: str | os.PathLike[str]) -> Iterator[ScriptedGpus]:
        """The GPUs a file holds, to change and write back while no other process does (the
        processes of one node sharing its file)."""
        with open(f"{path}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            gpus = cls.read(path)
            yield gpus

    def write(self) -> None:
        text = "# scripted GPUs, one a line (see tests/support/scripted_nvml.c)\n"
        text += "".join(g.line() + "\n" for g in self.gpus)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)  # the stand-in sees a new inode: it reads the whole new file

    def set(self, index: int, **values: object) -> None:
        """Change GPU ``index`` (``util=40``, ``state="lost"``, ...) for every reader from now on."""
        self.gpus[index] = dataclasses.replace(self.gpus[index], **values)  # type: ignore[arg-type]
        self.write()

    def set_all(self, **values: object) -> None:
        self.gpus = [dataclasses.replace(g, **values) for g in self.gpus]  # type: ignore[arg-type]
        self.write()

    def env(self, trace: str | os.PathLike[str] | None = None) -> dict[str, str]:
        """The environment a raylet (and so every process of its node) needs to see these GPUs."""
        library = str(build())
        inherited = os.environ.get("LD_LIBRARY_PATH")
        env = {
            "LD_LIBRARY_PATH": os.pathsep.join(p for p in (library, inherited) if p),
            "SCRIPTED_NVML_GPUS": str(self.path),
        }
        if trace is not None:
            env["SCRIPTED_NVML_TRACE"] = str(trace)
        return env


if __name__ == "__main__":
    print(build())
