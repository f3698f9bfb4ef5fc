"""The test support's C libraries, built with the system C compiler into a cache keyed by the
source's hash: the scripted NVML (``nvml.py``) and the GIL holder (``gil_holder.c``: a C call that
keeps the GIL, so that no Python runs in its process; the hang tests' rank that Python cannot
reach). ``.ci/run`` fails at its start on a machine without a compiler; elsewhere a test that
needs one skips, saying why (:func:`gil_holder_or_skip`)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).parent
GIL_HOLDER = HERE / "gil_holder.c"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ray_wandb_nodes"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(source: Path, library: str, flags: Sequence[str] = (), aliases: Sequence[str] = ()) -> Path:
    """The folder holding ``library`` built from ``source`` (and ``aliases``, links to it), built
    once per version of the source. Concurrent builders never see half a library: each builds in a
    folder of its own and renames it into place."""
    folder = cache_root() / f"{source.stem}-{hashlib.sha256(source.read_bytes()).hexdigest()[:16]}"
    if (folder / library).exists():
        return folder
    cc = compiler()
    if not cc:
        raise RuntimeError(
            f"the tests need a C compiler to build {source.relative_to(HERE.parent.parent)}: none found as $CC, "
            "cc or gcc; install one (Debian: apt-get install gcc)"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{source.stem}-", dir=folder.parent))
    try:
        out = subprocess.run(
            [cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", str(staging / library), str(source), *flags],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(f"building {source} with {cc} failed:\n{out.stderr}")
        for alias in aliases:
            os.symlink(library, staging / alias)
        try:
            staging.rename(folder)
        except OSError:  # another process built it first
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def gil_holder() -> Path:
    """The built GIL holder, ``libgil_holder.so`` (raises without a C compiler)."""
    return build(GIL_HOLDER, "libgil_holder.so") / "libgil_holder.so"


def gil_holder_or_skip() -> str:
    """The GIL holder's path for a test; the test skips, saying why, where no compiler builds it."""
    import pytest

    if compiler() is None:
        pytest.skip("no C compiler ($CC, cc or gcc) for tests/support/gil_holder.c")
    return str(gil_holder())
