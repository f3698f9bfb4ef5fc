"""What follows from the options table: the callbacks' signatures and Args sections, and the options page.

``python -m ray_wandb_nodes._config.options_doc`` rewrites, from ``_options.OPTIONS``, the ``__init__``
signatures and the docstrings' Args sections of ``train.py`` and ``tune.py`` (in the source, so
that IDEs, ``help()`` and mkdocstrings, which reads docstrings statically, all see them) and writes
docs/options.md; ``--check`` only says which of them are out of date (exit status 1). A developer's
tool, run from a checkout: it is not imported by the package.
"""

from __future__ import annotations

import ast
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from .options import OPTIONS, POSITIONAL, SECTIONS, TRAIN, TUNE, VAR_KEYWORD, Option, options_of

PACKAGE = Path(__file__).resolve().parents[1]
PAGE = PACKAGE.parent / "docs" / "options.md"
# callback -> (the module that defines it, its class)
CALLBACKS = {TRAIN: (PACKAGE / "train.py", "WandbNodesCallback"), TUNE: (PACKAGE / "tune.py", "WandbNodesTuneCallback")}
WIDTH = 112  # docstring lines, indent included
_LABEL = {TRAIN: "Train", TUNE: "Tune"}


def literal(value: Any) -> str:
    """A default as the source writes it (double-quoted strings, as ruff formats them)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def param_name(o: Option) -> str:
    return f"**{o.name}" if o.name == VAR_KEYWORD else o.name


def signature_lines(callback: str) -> list[str]:
    """The parameter lines of ``callback``'s ``__init__`` after ``self``."""
    lines, keyword_only = [], False
    for o in options_of(callback):
        if o.name == VAR_KEYWORD:
            lines.append(f"        **{o.name}: {o.annotation},")
            continue
        if not keyword_only and o.name not in POSITIONAL[callback]:
            lines.append("        *,")
            keyword_only = True
        lines.append(f"        {o.name}: {o.annotation} = {literal(o.default_for(callback))},")
    return lines


def args_lines(callback: str) -> list[str]:
    """The Args section of ``callback``'s docstring: one entry per option, the table's line of doc."""
    lines = ["    Args:"]
    for o in options_of(callback):
        lines += textwrap.wrap(
            f"{param_name(o)}: {o.doc}",
            WIDTH,
            initial_indent=" " * 8,
            subsequent_indent=" " * 12,
            break_on_hyphens=False,
        )
    return lines


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def rewrite(source: str, callback: str) -> str:
    """``source`` (train.py or tune.py) with its callback's signature and Args section from the table."""
    class_name = CALLBACKS[callback][1]
    lines = source.split("\n")
    init = next(
        n for n in _class(ast.parse(source), class_name).body if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    )
    start = init.lineno  # 0-based index of the line after ``def __init__(``
    if lines[start].strip() != "self,":
        raise ValueError(f"{class_name}.__init__ must open with 'def __init__(' and 'self,' on lines of their own")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("    ) -> None:"))
    lines[start + 1 : end] = signature_lines(callback)
    doc = _class(ast.parse("\n".join(lines)), class_name).body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and doc.end_lineno):
        raise ValueError(f"{class_name} has no docstring")
    first, last = doc.lineno - 1, doc.end_lineno - 1  # last: the closing quotes, on a line of their own
    args = next((i for i in range(first, last) if lines[i] == "    Args:"), None)
    if args is None or lines[last].strip() != '"""':
        raise ValueError(f"{class_name}'s docstring must end with its Args section, then its closing quotes")
    lines[args:last] = args_lines(callback)
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def _default(o: Option) -> str:
    if o.name == VAR_KEYWORD:
        return ""
    train, tune = o.default_for(TRAIN), o.default_for(TUNE)
    if len(o.callbacks) == 2 and train != tune:
        return f"`{literal(train)}` (Train), `{literal(tune)}` (Tune)"
    return f"`{literal(train)}`"


def page() -> str:
    """docs/options.md."""
    out = [
        "# Options",
        "",
        "*This page is generated from the table of options in `ray_wandb_nodes/_config/options.py`: edit the "
        "table, then run `python -m ray_wandb_nodes._config.options_doc` to rewrite this page and the callbacks' "
        "signatures and docstrings. A test fails when they differ.*",
        "",
        "`WandbNodesCallback` (Ray Train) and `WandbNodesTuneCallback` (Ray Tune) take these options as keyword "
        "arguments; the column *callbacks* says which takes each. `WandbNodesCallback` also takes `project` by "
        "position, and `WandbNodesTuneCallback` takes the arguments of Ray's `WandbLoggerCallback` by position, "
        f"in its order: {', '.join(f'`{n}`' for n in POSITIONAL[TUNE])}.",
        "",
        "A value that is not allowed raises `ValueError` when the callback is built, before any resource is taken; "
        "the message names the option, the value and what is allowed.",
    ]
    for key, (title, about) in SECTIONS.items():
        out += ["", f"## {title}", "", about, "", "| option | callbacks | default | what it does | allowed |"]
        out.append("| --- | --- | --- | --- | --- |")
        for o in (o for o in OPTIONS if o.section == key):
            label = ", ".join(_LABEL[cb] for cb in o.callbacks)
            cells = [f"`{param_name(o)}`", label, _default(o), _cell(o.doc), _cell(o.check.allowed)]
            out.append(f"| {' | '.join(cells)} |")
    return "\n".join(out) + "\n"


def targets() -> dict[Path, str]:
    """Each generated file and the text it should have."""
    want = {path: rewrite(path.read_text(), callback) for callback, (path, _) in CALLBACKS.items()}
    want[PAGE] = page()
    return want


def main(argv: list[str]) -> int:
    stale = [path for path, text in targets().items() if not path.exists() or path.read_text() != text]
    if "--check" in argv:
        for path in stale:
            print(f"{path} is out of date: run python -m ray_wandb_nodes._config.options_doc", file=sys.stderr)
        return 1 if stale else 0
    for path, text in targets().items():
        if path in stale:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
