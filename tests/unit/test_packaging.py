"""The wheel as users get it: built by setuptools from pyproject.toml (in a copy of the sources,
with this environment's setuptools: no network), it carries ``py.typed`` and the SPDX license,
and the build prints no deprecation of ours (``project.license`` as a TOML table is one).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_carries_py_typed_and_builds_without_deprecations(tmp_path: Path) -> None:
    import setuptools

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (required,) = [Requirement(r) for r in pyproject["build-system"]["requires"] if r.startswith("setuptools")]
    assert Version(setuptools.__version__) in required.specifier  # the setuptools a build pulls
    assert pyproject["project"]["license"] == "Apache-2.0"
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "ray_wandb_nodes", src / "ray_wandb_nodes", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v"]
    out = subprocess.run([*pip, "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log  # (run without check=: the log is the failure's message)
    assert "Successfully built ray-wandb-nodes" in log  # -v: the backend's own output is in the log
    assert "deprecat" not in log.lower(), log
    (wheel,) = tmp_path.glob("ray_wandb_nodes-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        text = z.read(metadata).decode()
    assert "ray_wandb_nodes/py.typed" in names
    assert "License-Expression: Apache-2.0" in text.splitlines()
