"""The hang core stands alone: it imports no other part of the plugin, no Ray and no wandb, and
torch only inside functions (the optimizer hook, the flight recorder)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
