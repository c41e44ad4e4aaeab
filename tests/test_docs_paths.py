"""docs/architecture.md names files and functions that exist; the site's nav names each page once.

The architecture page is read to find where something lives, so a path or a function it cites
must be where it says: every ``.py`` path in it exists (a bare name in a table row about a folder,
`` `frontier/` ``, is looked for in that folder; one in prose anywhere in the project), and every
`` `module.py` `name` `` citation names something the module defines (a function, a class, a
constant, ``Class.method``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
_PATH = re.compile(r"(?<![\w/.<>-])((?:[\w.-]+/)*[\w-]+\.py)\b")
_CITATION = re.compile(r"`((?:[\w-]+/)*[\w-]+\.py)` `([A-Za-z_][\w.]*)(?:\(\))?`")
_ROW_FOLDER = re.compile(r"^\| `([\w/-]+)`")  # a table row about a folder or a file in one
_CODE = ("collector", "flows", "blocks", "infra", "tools", "bench", "tests")


def _candidates(path: str, folder: str | None) -> list[Path]:
    bases = [ROOT, ROOT / "collector"]
    if folder is not None:
        bases = [ROOT / folder, ROOT / "collector" / folder, *bases]
    return [base / path for base in bases]


def _resolve(path: str, folder: str | None) -> Path | None:
    found = next((p for p in _candidates(path, folder) if p.is_file()), None)
    if found is None and "/" not in path and folder is None:  # a bare name in prose
        found = next((p for d in _CODE for p in (ROOT / d).rglob(path) if p.is_file()), None)
    return found


def _defined(module: Path) -> set[str]:
    """Top-level names of a module, and ``Class.member`` for its classes' members."""
    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{member.name}")
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_every_python_path_in_architecture_md_exists() -> None:
    missing = []
    for number, line in enumerate(ARCHITECTURE.read_text(encoding="utf-8").splitlines(), 1):
        row = _ROW_FOLDER.match(line)
        folder = None
        if row:  # `frontier/` is the folder; `infra/bootstrap` is in `infra`
            first = row.group(1)
            folder = first.rstrip("/") if first.endswith("/") else first.rpartition("/")[0] or None
        for path in _PATH.findall(line):
            if "<" not in path and _resolve(path, folder) is None:
                missing.append(f"line {number}: {path}")
    assert not missing, "docs/architecture.md names files that do not exist:\n" + "\n".join(missing)


def test_every_function_architecture_md_cites_is_in_the_module_it_names() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    citations = _CITATION.findall(text)
    assert citations, "the pattern finds no citation: the test would check nothing"
    wrong = []
    for path, name in citations:
        module = _resolve(path, None)
        if module is None or name not in _defined(module):
            wrong.append(f"`{path}` `{name}`")
    assert not wrong, "docs/architecture.md cites names their module does not define: " + ", ".join(
        wrong
    )


def test_the_site_nav_lists_each_page_once() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    pages: list[str] = []

    def walk(items: object) -> None:
        if isinstance(items, list):
            for item in items:
                walk(item)
        elif isinstance(items, dict):
            for value in items.values():
                walk(value)
        elif isinstance(items, str):
            pages.append(items)

    walk(config["nav"])
    twice = sorted({page for page in pages if pages.count(page) > 1})
    assert not twice, f"mkdocs.yml nav lists {twice} more than once"
