"""The hang core stands alone: it imports no other part of the plugin, no Ray and no wandb, and
torch only inside functions (the optimizer hook, the flight recorder)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "ray_wandb_nodes" / "_hang"
FORBIDDEN = ("ray", "wandb", "torch", "ray_wandb_nodes._fleet", "ray_wandb_nodes._health",
             "ray_wandb_nodes.offline", "ray_wandb_nodes.report")  # fmt: skip


def test_module_level_imports_are_the_standard_library_and_the_package_itself() -> None:
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: torch may be imported inside a function
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # a relative import stays inside _hang
                    continue
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name == "__future__" or name.split(".")[0] in sys.stdlib_module_names, (path.name, name)


def test_importing_it_loads_none_of_the_forbidden() -> None:
    code = (
        "import sys, ray_wandb_nodes._hang\n"
        f"print(sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout.strip()  # fmt: skip
    assert out == "[]"


def test_arming_a_rank_loads_no_torch(tmp_path: Path) -> None:
    """A worker of XGBoost or JAX, with torch installed: arming it (the beacon, the evidence, the
    flight recorder's variable, the evaluation and save patches) loads no torch, and still names
    the flight recorder's variable of the installed torch's version."""
    code = f"""
import os, sys
import ray_wandb_nodes._worker.setup
from ray_wandb_nodes._worker import phases as _phases
from ray_wandb_nodes._hang import arm_rank, disarm_rank, hook_steps, train_starts
arm_rank("no-torch", 0, root={str(tmp_path)!r})
_phases.hook_saves()
_phases.hook_evaluation()
hook_steps()
train_starts()
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(loaded, sorted(k for k in os.environ if k.startswith("TORCH_")))
disarm_rank()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**env, "PYTHONPATH": str(REPO)},
    ).stdout.strip()  # fmt: skip
    from importlib.util import find_spec

    # torch 2.8 and later (the test extra's) read TORCH_FR_BUFFER_SIZE; without torch both are set.
    names = (
        "['TORCH_FR_BUFFER_SIZE']" if find_spec("torch") else "['TORCH_FR_BUFFER_SIZE', 'TORCH_NCCL_TRACE_BUFFER_SIZE']"
    )
    assert out == f"[] {names}"
