"""The README and the documentation pages: a front page of at most 200 lines, links that lead
somewhere, a module map that matches the package, a site nav that holds every page, and code
that names only what the package exports (pure: files only, no Ray, no mkdocs)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.layers import page_section, tree_section

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "ray_wandb_nodes"
README_MAX_LINES = 200

# [text](target) and ![alt](target); the target ends at whitespace or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def pages() -> list[Path]:
    """Every Markdown file a reader follows links in: the README, the site's pages, the bench index."""
    found = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    bench = ROOT / "bench" / "README.md"
    return [*found, bench] if bench.exists() else found


def prose(text: str) -> str:
    """The text without code blocks or inline code, where a bracket is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def relative_links(path: Path) -> list[str]:
    targets = LINK.findall(prose(path.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def code_blocks(path: Path, language: str) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_readme_is_a_front_page_of_at_most_200_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}: move a topic to docs/"


def test_every_relative_link_points_to_a_file_that_exists() -> None:
    broken = []
    for page in pages():
        for target in relative_links(page):
            file = target.split("#", 1)[0]
            if file and not (page.parent / file).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n  " + "\n  ".join(broken)


def anchors(page: Path) -> set[str]:
    """The heading ids of a page, made as Python-Markdown's toc makes them."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", FENCE.sub("", page.read_text(encoding="utf-8")), re.MULTILINE)
    slugs = set()
    for heading in headings:
        text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        slugs.add(re.sub(r"[-\s]+", "-", text))
    return slugs


def test_every_link_into_a_page_names_a_heading_it_has() -> None:
    broken = []
    for page in pages():
        for target in relative_links(page):
            file, _, fragment = target.partition("#")
            linked = page.parent / file
            if fragment and file.endswith(".md") and linked.exists() and fragment not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to headings that do not exist:\n  " + "\n  ".join(broken)


def test_the_link_check_sees_links_and_skips_code(tmp_path: Path) -> None:
    sample = tmp_path / "sample.md"
    text = '[a](a.md) ![b](img/b.png "t") [c](https://x.org) [d](#top) `[e](e.md)`\n```\n[f](f.md)\n```\n'
    sample.write_text(text, encoding="utf-8")
    assert relative_links(sample) == ["a.md", "img/b.png"]


def test_the_architecture_page_shows_the_tree_as_it_is() -> None:
    """ "Where things live" is drawn from the package (``tests/support/layers.py``): every unit in
    its layer, each in its docstring's words."""
    on_page = page_section((DOCS / "architecture.md").read_text(encoding="utf-8"))
    assert on_page is not None, "docs/architecture.md has no '## Where things live' section"
    assert on_page.rstrip() == tree_section().rstrip(), (
        "docs/architecture.md's 'Where things live' is not the tree's: python -m tests.support.layers --write"
    )


def nav_pages() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    return re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.MULTILINE)


def test_the_site_nav_holds_every_page_and_only_pages() -> None:
    # options.md is generated from the code's table of options; the nav must name it either way.
    listed = nav_pages()
    assert "options.md" in listed
    on_disk = {p.name for p in DOCS.glob("*.md")} | {"options.md"}
    assert sorted(set(listed) ^ on_disk) == [], f"nav {sorted(listed)} against docs/ {sorted(on_disk)}"


def exported() -> set[str]:
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("ray_wandb_nodes/__init__.py has no __all__")


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_code_imports_only_what_the_package_exports(page: Path) -> None:
    names = set()
    for block in code_blocks(page, "python"):
        for match in re.finditer(r"^from ray_wandb_nodes import (.+)$", block, re.MULTILINE):
            names |= {n.strip() for n in match.group(1).split(",")}
    assert names <= exported(), f"{page.relative_to(ROOT)} imports {sorted(names - exported())}, not exported"


def test_the_readme_commands_name_files_and_extras_that_exist() -> None:
    commands = "\n".join(code_blocks(ROOT / "README.md", "bash"))
    assert "bash .ci/run" in commands and (ROOT / ".ci" / "run").exists()
    scripts = re.findall(r"python (\S+\.py)", commands)
    assert scripts, "README.md: no `python <script>.py` in its commands"
    for script in scripts:
        assert (ROOT / script).exists(), f"README.md runs {script}, which does not exist"
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for extras in re.findall(r"\.\[([\w,]+)\]", commands):
        for extra in extras.split(","):
            assert re.search(rf"^{extra} = \[", pyproject, re.MULTILINE), f"README.md installs extra {extra!r}"
