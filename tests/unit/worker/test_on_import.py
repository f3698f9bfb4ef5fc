"""Patching a module whether it is imported before or after the patch is asked for (``_on_import``):
once a module, never on a lookup that imports nothing, and the finder out of the way once
nothing is awaited. A package written into a temporary folder stands for a framework."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from ray_wandb_nodes._worker import on_import as _on_import


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No name awaited and this test's own ``sys.meta_path``; ``fakefw`` importable from a folder."""
    monkeypatch.setattr(_on_import, "_awaited", {})
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    package = tmp_path / "fakefw"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "loops.py").write_text("class Loop:\n    def run(self):\n        return 'ran'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n == "fakefw" or n.startswith("fakefw.")]:
        del sys.modules[name]


def finders() -> list[object]:
    return [f for f in sys.meta_path if type(f).__name__ == "_PatchOnImport"]


class Count:
    """A patch that counts the modules it was given (equal instances are one patch)."""

    def __init__(self) -> None:
        self.seen: list[ModuleType] = []

    def __call__(self, module: ModuleType) -> None:
        self.seen.append(module)


def test_a_module_imported_after_is_patched_right_after_its_code_ran(fresh: Path) -> None:
    patch = Count()
    _on_import.when_imported("fakefw.loops", patch)
    _on_import.when_imported("fakefw.loops", patch)  # asked twice: awaited once
    assert _on_import.awaited() == ["fakefw.loops"] and len(finders()) == 1
    assert importlib.util.find_spec("fakefw.loops") is not None  # a lookup imports nothing
    assert patch.seen == [] and _on_import.awaited() == ["fakefw.loops"]
    import fakefw.loops  # type: ignore[import-not-found]

    assert patch.seen == [fakefw.loops] and hasattr(patch.seen[0], "Loop")  # after the module's code
    assert _on_import.awaited() == [] and finders() == []  # nothing awaited: out of every import's way
    _on_import.when_imported("fakefw.loops", patch)  # imported now: patched at once, again
    assert patch.seen == [fakefw.loops, fakefw.loops] and finders() == []


def test_a_module_imported_before_is_patched_at_once(fresh: Path) -> None:
    import fakefw.loops

    patch = Count()
    _on_import.when_imported("fakefw.loops", patch)
    assert patch.seen == [fakefw.loops] and _on_import.awaited() == [] and finders() == []


def test_other_imports_pass_and_a_failed_import_stays_awaited(fresh: Path) -> None:
    (fresh / "fakefw" / "broken.py").write_text("raise RuntimeError('broken at import')\n")
    patch = Count()
    _on_import.when_imported("fakefw.broken", patch)
    import fakefw  # type: ignore[import-not-found]  # not awaited: the real finders as ever

    assert fakefw.__spec__ is not None and type(fakefw.__spec__.loader).__name__ != "_PatchingLoader"
    with pytest.raises(RuntimeError, match="broken at import"):
        import fakefw.broken  # type: ignore[import-not-found]
    assert patch.seen == [] and _on_import.awaited() == ["fakefw.broken"]


def test_a_name_that_does_not_exist_is_not_found_and_stays_awaited(fresh: Path) -> None:
    _on_import.when_imported("fakefw.missing", Count())
    with pytest.raises(ModuleNotFoundError):
        import fakefw.missing  # type: ignore[import-not-found]  # noqa: F401
    assert _on_import.awaited() == ["fakefw.missing"]


def test_a_patch_that_raises_leaves_the_module_and_its_import_as_they_are(
    fresh: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(module: ModuleType) -> None:
        raise AttributeError("no such class in this release")

    _on_import.when_imported("fakefw.loops", broken)
    import fakefw.loops

    assert fakefw.loops.Loop().run() == "ran" and _on_import.awaited() == []
    assert [r.getMessage() for r in caplog.records] == [
        "ray_wandb_nodes: fakefw.loops was not patched and is left as it is "
        "(AttributeError: no such class in this release)"
    ]
