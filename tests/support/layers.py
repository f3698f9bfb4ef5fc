"""The package's layers, top to bottom, and the page section drawn from them.

A unit (a folder of ``ray_wandb_nodes/`` or one of its top-level modules) imports only units of
the layers below its own; the adapters may also import each other (``cli`` and ``__init__``
name the package's version). ``tests/unit/test_layout.py`` holds the imports to this order, and
``tests/unit/test_docs.py`` the architecture page's "Where things live" to :func:`tree_section`:
the tree explains itself, each unit in one line from its own docstring.

    python -m tests.support.layers            print the section
    python -m tests.support.layers --write    write it into docs/architecture.md
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "ray_wandb_nodes"
PAGE = REPO / "docs" / "architecture.md"
HEADING = "## Where things live"

# Which process runs each: the adapters, ``_run`` and ``report`` on the driver side (the Train
# controller, the Tune driver, the command line); ``_fleet`` there and in each node's logger
# actor; ``_worker`` inside the train workers; the rest wherever their callers are.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__.py", "train.py", "tune.py", "cli.py"),  # the adapters: Ray's hooks in, calls on a run out
    ("_run/", "report/"),  # the driver side: runs, sessions, primary writers; the command line's reports
    ("_fleet/", "_worker/"),  # the node fleet and its logger actors; the train workers' set-up
    ("_health/",),  # judging nodes, GPUs and ranks
    ("_failure/", "_console/", "_egress/"),  # failures named; ranks' consoles; the relay to W&B
    ("_hang/", "_steps/"),  # progress beacons, evidence, verdicts; each rank's step taken apart
    ("_wandb/",),  # the writer kit
    ("_config/",),  # the options and their values
    ("_ray/", "offline/"),  # Ray's internals; offline run folders
    # the leaves: the flight recorder's dump read, GPU ids, secrets masked, statistics, warnings
    ("_flight.py", "_gpu_ids.py", "_mask.py", "_stats.py", "_warn.py"),
)


def purpose(unit: str) -> str:
    """The first sentence of the unit's docstring (a package's ``__init__``, else the module's)."""
    path = PACKAGE / unit / "__init__.py" if unit.endswith("/") else PACKAGE / unit
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split()).replace("``", "`")
    match = re.match(r"(.+?\.)(\s|$)", text)
    return (match.group(1) if match else text).rstrip(".")


def tree_section() -> str:
    """The architecture page's section: every unit, in layer order, in one line each."""
    rows = [f"| {i} | `{unit}` | {purpose(unit)} |" for i, units in enumerate(LAYERS) for unit in units]
    return "\n".join(
        [
            HEADING,
            "",
            "Each folder (or top-level module) of `ray_wandb_nodes/`, in the order its imports run: a layer",
            "imports only the layers below it (`tests/unit/test_layout.py` holds the code to it). Each line",
            "is the first sentence of the unit's own docstring (`python -m tests.support.layers --write`",
            "draws this section; `tests/unit/test_docs.py` holds the page to the tree). Within a folder,",
            "its `__init__.py` says what each module is for.",
            "",
            "| layer | unit | what it is |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )


def page_section(text: str) -> str | None:
    match = re.search(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    return match.group(0) if match else None


def main() -> None:
    section = tree_section()
    if "--write" not in sys.argv:
        print(section)
        return
    text = PAGE.read_text()
    old = page_section(text)
    PAGE.write_text(text.replace(old, section + "\n") if old else text.rstrip() + "\n\n" + section)


if __name__ == "__main__":
    main()
