"""The package's shape, read from its source with ``ast`` (nothing is imported): imports run down
a declared order of layers (``tests/support/layers.py``, from the adapters to the leaves), no module of a
package imports itself back through others, no private name crosses from one package into
another, every import is one a reader can see; a module over 400 lines or a class over 250
(``end_lineno - lineno + 1``) is said, as a guide.

A unit is a subpackage of ``ray_wandb_nodes`` (``_fleet/``, ``_health/``, ``offline/``,
``report/``, any new one) or one top-level module (``_session.py``). Top-level modules are units
of their own, not one root package: the adapters (``train.py``) sit above the packages and the
utilities (``_warn.py``, ``_ray.py``) below them, so one root node would be a cycle by
construction. A cycle between units that passes through a subpackage is a package cycle.

A name is private to its package when it starts with ``_`` (a module's name aside: ``from ..
import _ray`` names a module), when it is a base class's ``self._attr`` read by a subclass in
another unit, or when it is not in the package's interface: its ``__init__``'s ``__all__``,
which may list submodules, whose public names are then the package's too.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.layers import LAYERS

ROOT = Path(__file__).resolve().parents[2] / "ray_wandb_nodes"
MAX_MODULE_LINES, MAX_CLASS_LINES = 400, 250


@dataclass(frozen=True)
class Module:
    name: str  # dotted: ray_wandb_nodes._fleet.pool
    rel: str  # relative path: _fleet/pool.py
    unit: str  # "_fleet/" for a subpackage's module, "_session.py" for a top-level one
    is_package: bool
    tree: ast.Module
    lines: int


@dataclass
class Layout:
    """A package's modules and what the checks found, each finding a stable key (no line numbers)
    and a detail that says where."""

    modules: dict[str, Module]
    findings: dict[str, dict[str, str]] = field(default_factory=dict)
    edges: dict[str, dict[str, str]] = field(default_factory=dict)  # unit -> unit it imports -> one place it does
    module_edges: dict[str, dict[str, str]] = field(default_factory=dict)  # the same, between a unit's modules

    def find(self, kind: str, key: str, detail: str, label: str = "") -> None:
        self.findings.setdefault(kind, {}).setdefault(f"{label or kind}: {key}", detail)


def read_modules(root: Path) -> dict[str, Module]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        parts = [root.name, *rel.with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        unit = f"{rel.parts[0]}/" if len(rel.parts) > 1 else rel.name
        text = path.read_text()
        tree = ast.parse(text, str(path))
        out[".".join(parts)] = Module(".".join(parts), rel.as_posix(), unit, is_package, tree, len(text.splitlines()))
    return out


@dataclass(frozen=True)
class Import:
    module: Module  # the importer
    line: int
    target: str  # the module imported from
    name: str | None  # the name imported from it; None for `import a.b` and for a submodule
    alias: str


def imports(modules: dict[str, Module], module: Module) -> Iterator[Import]:
    """Every import of the package's own modules, wherever it sits (functions, TYPE_CHECKING)."""
    pkg = next(iter(modules)).split(".")[0]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == pkg:
                    yield Import(module, node.lineno, a.name, None, a.asname or a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.name.split(".")[: None if module.is_package else -1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != pkg:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in modules:
                    yield Import(module, node.lineno, sub, None, a.asname or a.name)
                else:
                    yield Import(module, node.lineno, target, a.name, a.asname or a.name)


def interface(module: Module) -> set[str] | None:
    """A package's ``__all__``, read from its ``__init__``; None when it declares none."""
    for node in module.tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value = ast.literal_eval(node.value)
            return set(value)
    return None


def analyse(root: Path) -> Layout:
    layout = Layout(read_modules(root))
    modules = layout.modules
    edges = layout.edges
    for module in modules.values():
        _dynamic_imports(layout, module)
        _sizes(layout, module)
        module_aliases: dict[str, Module] = {}
        classes: dict[str, tuple[Module, str]] = {}
        for imp in imports(modules, module):
            target = modules.get(imp.target)
            if target is not None and target.unit == module.unit and target is not module and not target.is_package:
                layout.module_edges.setdefault(module.name, {}).setdefault(target.name, f"{module.rel}:{imp.line}")
            if target is None or target.unit == module.unit:
                continue
            edges.setdefault(module.unit, {}).setdefault(target.unit, f"{module.rel}:{imp.line}")
            _private_import(layout, imp, target)
            if imp.name is None:
                module_aliases[imp.alias] = target
            else:
                classes[imp.alias] = (target, imp.name)
        _private_attributes(layout, module, module_aliases, classes)
    _cycles(layout, edges)
    _module_cycles(layout)
    return layout


def layer_findings(layout: Layout, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Units no layer places, and each import that does not go down the layers."""
    level = {unit: i for i, units in enumerate(layers) for unit in units}
    units = sorted({m.unit for m in layout.modules.values()})
    found = [f"{unit} is in no layer: place it in LAYERS" for unit in units if unit not in level]
    for unit, targets in sorted(layout.edges.items()):
        for target, where in sorted(targets.items()):
            if unit in level and target in level and level[target] <= level[unit] and level[unit] > 0:
                found.append(f"{unit} (layer {level[unit]}) imports {target} (layer {level[target]}) at {where}")
    return found


def _module_cycles(layout: Layout) -> None:
    # Modules of one package that import each other back (type-checking imports too): the circle
    # is a sign that one of them holds what both need (a value type, a protocol).
    for scc in _strongly_connected(layout.module_edges):
        if len(scc) > 1:
            start = min(scc)
            path = _cycle_through(start, scc, layout.module_edges)
            steps = " -> ".join(
                f"{a} ({layout.module_edges[a][b]})" for a, b in zip(path, [*path[1:], path[0]], strict=True)
            )
            layout.find("module-cycle", " ".join(sorted(scc)), f"{steps} -> {path[0]}")


def _dynamic_imports(layout: Layout, module: Module) -> None:
    # An import the graph cannot see could hide a cycle: every import must be a statement.
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                layout.find("dynamic", f"{module.rel} {name}", f"{module.rel}:{node.lineno} calls {name}")


def _sizes(layout: Layout, module: Module) -> None:
    if module.lines > MAX_MODULE_LINES:
        layout.find("module", module.rel, f"{module.rel} is {module.lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ClassDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > MAX_CLASS_LINES:
                layout.find(
                    "class",
                    f"{module.rel} {node.name}",
                    f"{module.rel}:{node.lineno} class {node.name} is {n} lines (at most {MAX_CLASS_LINES})",
                )


def _private_import(layout: Layout, imp: Import, target: Module) -> None:
    where = f"{imp.module.rel}:{imp.line}"
    name = imp.name or target.name.rsplit(".", 1)[-1]
    if imp.name is not None and _private(imp.name):
        layout.find("private", f"{imp.module.rel} imports {name} from {target.rel}", f"{where} imports {name}")
        return
    if not target.unit.endswith("/"):
        return  # a top-level module: its public names are its interface
    if imp.name is None and target.is_package:
        return  # the package itself, used through its names
    package = layout.modules[f"{target.name.split('.')[0]}.{target.unit.rstrip('/')}"]
    offered = interface(package)
    if offered is None:
        layout.find("interface", f"{target.unit} declares no __all__", f"{where} imports from {target.unit}")
        return
    # The path inside the package: a name it offers, or a public name of a submodule it offers.
    inner = target.name.split(".")[2:]
    public = name in offered or (bool(inner) and inner[0] in offered and not name.startswith("_"))
    if not public:
        layout.find(
            "interface",
            f"{imp.module.rel} imports {name} from {target.rel}",
            f"{where} imports {name}, which {target.unit}__init__.py's __all__ does not offer",
        )


def _private_attributes(
    layout: Layout, module: Module, module_aliases: dict[str, Module], classes: dict[str, tuple[Module, str]]
) -> None:
    for node in ast.walk(module.tree):
        # `_index._helper` where `_index` is another package's module
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in module_aliases
            and _private(node.attr)
        ):
            target = module_aliases[node.value.id]
            layout.find(
                "private",
                f"{module.rel} reads {node.attr} of {target.rel}",
                f"{module.rel}:{node.lineno} reads {node.value.id}.{node.attr}",
            )
        # a subclass of another package's class that reads its base's private state
        if isinstance(node, ast.ClassDef):
            bases = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in classes]
            if not bases:
                continue
            own = _own_attributes(node)
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                    and _private(sub.attr)
                    and sub.attr not in own
                ):
                    base = classes[bases[0]][1]
                    layout.find(
                        "private",
                        f"{module.rel} {node.name} reads {base}.{sub.attr}",
                        f"{module.rel}:{sub.lineno} {node.name} reads self.{sub.attr}, which {base} defines",
                        label="base-private",
                    )


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_attributes(cls: ast.ClassDef) -> set[str]:
    """What a class itself defines: its methods, class attributes, and `self.x = ...` targets."""
    own = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own.add(node.name)
        elif isinstance(node, ast.Assign):
            own.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
    for node in ast.walk(cls):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else []
        )
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                own.add(t.attr)
    return own


def _cycles(layout: Layout, edges: dict[str, dict[str, str]]) -> None:
    for scc in _strongly_connected(edges):
        packages = sorted(u for u in scc if u.endswith("/"))
        if len(scc) < 2 or not packages:
            continue  # top-level modules importing each other: one package, no package cycle
        path = _cycle_through(packages[0], scc, edges)
        steps = " -> ".join(f"{a} ({edges[a][b]})" for a, b in zip(path, [*path[1:], path[0]], strict=True))
        layout.find("cycle", " ".join(sorted(scc)), f"{steps} -> {path[0]}")


def _strongly_connected(edges: dict[str, dict[str, str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative enough for a package's few dozen units."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.add(w)
                if w == v:
                    break
            out.append(scc)

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def _cycle_through(start: str, scc: set[str], edges: dict[str, dict[str, str]]) -> list[str]:
    """The shortest way from ``start`` back to itself inside its component (breadth first)."""
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, {})):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return path[::-1]
                if w in scc and w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a component without a cycle through it: {scc}")


@pytest.fixture(scope="module")
def layout() -> Layout:
    return analyse(ROOT)


def _unexpected(layout: Layout, kind: str) -> list[str]:
    return sorted(layout.findings.get(kind, {}).values())


def test_packages_import_one_way(layout: Layout) -> None:
    assert not _unexpected(layout, "cycle"), "packages that import each other:\n" + "\n".join(
        _unexpected(layout, "cycle")
    )


def test_imports_run_down_the_layers(layout: Layout) -> None:
    found = layer_findings(layout, LAYERS)
    assert not found, "imports against the layer order (tests/support/layers.py, LAYERS):\n" + "\n".join(found)


def test_no_module_imports_itself_back(layout: Layout) -> None:
    found = _unexpected(layout, "module-cycle")
    assert not found, "modules of a package that import each other back:\n" + "\n".join(found)


def test_no_private_name_crosses_a_package(layout: Layout) -> None:
    found = _unexpected(layout, "private")
    assert not found, "private names of another package:\n" + "\n".join(found)


def test_a_package_is_used_through_its_interface(layout: Layout) -> None:
    found = _unexpected(layout, "interface")
    assert not found, "names a package does not offer in its __all__:\n" + "\n".join(found)


def test_every_import_is_a_statement(layout: Layout) -> None:
    found = _unexpected(layout, "dynamic")
    assert not found, "imports the layout check cannot see:\n" + "\n".join(found)


def test_a_module_over_400_lines_or_a_class_over_250_is_said(layout: Layout) -> None:
    # A guide, not a gate: a module or class past it is named (a pytest warning in every run), so
    # that a reader asks whether it still has one job; a test that failed on it invited moving a
    # method out of its class to pass. Split by job, never squeeze.
    for found in (*_unexpected(layout, "module"), *_unexpected(layout, "class")):
        warnings.warn(f"size guide: {found}: does it still have one job?", stacklevel=1)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """Each check on a small package with one of each fault, and on its mended twin."""
    big_class = "class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES
    files = {
        "pkg/__init__.py": "",
        "pkg/_util.py": "def helper() -> None: ...\n",
        "pkg/top.py": "from .a import A\nfrom .c.big import Big\n",
        "pkg/a/__init__.py": "from .m import A\n__all__ = ['A', 'm']\n",
        "pkg/a/m.py": "from ..b.n import thing\nclass A:\n    def __init__(self):\n        self._state = 1\n",
        "pkg/a/hidden.py": "SECRET = 1\n",
        "pkg/b/__init__.py": "__all__ = ['n']\n",
        "pkg/b/n.py": (
            "from ..a.m import _private_thing\nfrom ..a.hidden import SECRET\nfrom ..a import m as _m\n"
            "from ..a import A\nfrom .. import _util\nthing = _m._low\n"
            "class B(A):\n    def f(self):\n        self._own = 1\n        return self._state + self._own\n"
        ),
        "pkg/c/__init__.py": "import importlib\nmod = importlib.import_module('.x', __name__)\n",
        "pkg/c/big.py": big_class + "\n" * (MAX_MODULE_LINES - MAX_CLASS_LINES),
    }
    _write(tmp_path, files)
    found = analyse(tmp_path / "pkg").findings
    assert set(found["cycle"]) == {"cycle: a/ b/"}
    assert found["cycle"]["cycle: a/ b/"] == "a/ (a/m.py:1) -> b/ (b/n.py:1) -> a/"
    assert set(found["private"]) == {
        "private: b/n.py imports _private_thing from a/m.py",
        "private: b/n.py reads _low of a/m.py",
        "base-private: b/n.py B reads A._state",
    }
    assert set(found["interface"]) == {
        "interface: b/n.py imports SECRET from a/hidden.py",
        "interface: c/ declares no __all__",
    }
    assert set(found["dynamic"]) == {"dynamic: c/__init__.py import_module"}
    layers = (("__init__.py", "top.py"), ("a/",), ("b/", "c/"))
    assert layer_findings(analyse(tmp_path / "pkg"), layers) == [
        "_util.py is in no layer: place it in LAYERS",
        "b/ (layer 2) imports a/ (layer 1) at b/n.py:1",
    ]
    assert set(found["module"]) == {"module: c/big.py"}
    assert set(found["class"]) == {"class: c/big.py Big"}

    # the same package with each fault mended: nothing found
    files["pkg/a/m.py"] = "class A:\n    def __init__(self):\n        self._state = 1\n"
    files["pkg/b/n.py"] = "from ..a import A\nfrom .. import _util\nclass B(A):\n    def f(self):\n        return 1\n"
    files["pkg/c/__init__.py"] = "from . import big\n__all__ = ['big']\n"
    files["pkg/c/big.py"] = "class Big:\n" + "    x = 1\n" * (MAX_CLASS_LINES - 1)
    (tmp_path / "pkg/a/hidden.py").unlink()
    del files["pkg/a/hidden.py"]
    _write(tmp_path, files)
    assert analyse(tmp_path / "pkg").findings == {}
