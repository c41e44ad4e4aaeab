"""Everything wrong with a source file at once, in the order of the file.

A load stops at the first stage that fails: pydantic's field errors hide the deep checks (the
suite file, the seed file), and those hide GX's kwargs check. ``collector validate`` promises
every problem in one go, so :func:`validation_problems` runs each stage that can still run
(the suite file is checked from the raw YAML when the model refused the source) and sorts the
lines by where each problem is in the file, as an editor shows them.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from collector.config.problems import MORE_NOT_SHOWN, SourceError

if TYPE_CHECKING:
    from collector.config.source import Source

__all__ = ["in_file_order", "key_lines", "validation_problems"]


def validation_problems(file: Path) -> tuple[Source | None, list[str]]:
    """The source in ``file`` if it loads, and every problem of it (``[]`` when it is valid),
    one line each, deduplicated and in file order: the model's, the deep checks', every seed
    line's and GX's verdict on the suite's kwargs."""
    from collector.config.checks import seed_file_problems, suite_kwargs_problems
    from collector.config.loading import load_source

    label = str(file)
    source: Source | None
    try:
        source = load_source(file)
    except SourceError as exc:
        source = None
        problems = list(exc.problems)
        problems += _unloaded_suite_problems(file, label)
    else:
        problems = seed_file_problems(source, label, first=None)
        problems += suite_kwargs_problems(source, label)
    return source, in_file_order(list(dict.fromkeys(problems)), file)


def _unloaded_suite_problems(file: Path, label: str) -> list[str]:
    """The suite's problems (GX's included) for a source the model refused: read from the raw
    YAML, so a typo elsewhere in the file does not hide them."""
    from collector.config.source import write_inline_suite
    from collector.settle.suite import kwargs_problems

    validation = _raw(file).get("validation")
    suite = validation.get("suite") if isinstance(validation, dict) else None
    if isinstance(suite, dict):
        with tempfile.TemporaryDirectory() as folder:
            try:
                inline = write_inline_suite(suite, Path(folder) / "inline.json")
            except (TypeError, ValueError):
                return []  # the model's problems already say what is wrong with it
            found = [
                line.replace(str(inline), "(inline suite)") for line in kwargs_problems(inline)
            ]
    elif isinstance(suite, str) and suite.strip():
        path = Path(suite).expanduser()
        found = kwargs_problems(path if path.is_absolute() else file.resolve().parent / path)
    else:
        return []
    return [f"{label}: validation.suite: {line}" for line in found]


def _raw(file: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def in_file_order(problems: Iterable[str], file: Path) -> list[str]:
    """``problems`` (``FILE: key.path: message``) sorted by the line of the key each names;
    a key that is not in the file (a required one missing) sorts at its nearest parent, and a
    problem of the whole file first. Lines on one key keep their order."""
    problems = list(problems)
    try:
        lines = key_lines(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return problems
    prefix = f"{file}: "
    cut = [problem for problem in problems if problem.startswith(f"{prefix}{MORE_NOT_SHOWN}")]
    ordered = sorted(
        (problem for problem in problems if problem not in cut),
        key=lambda problem: _line_of(problem, prefix, lines),
    )
    return ordered + cut  # "more problems not shown" stays the last line


_LAST_SEGMENT = re.compile(r"(\.[^.\[]*|\[\d+\])$")


def _line_of(problem: str, prefix: str, lines: dict[str, int]) -> int:
    if not problem.startswith(prefix):
        return 0
    path = problem[len(prefix) :].split(": ", 1)[0]
    while path:
        if path in lines:
            return lines[path]
        trimmed = _LAST_SEGMENT.sub("", path)
        if trimmed == path:
            break
        path = trimmed
    return 0


def key_lines(text: str) -> dict[str, int]:
    """The 1-based line of every key and list item of a YAML document, by the path problems
    use (``ttl.rules[0].pattern``)."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    lines: dict[str, int] = {}
    if root is not None:
        _walk(root, "", lines)
    return lines


def _walk(node: yaml.Node, path: str, lines: dict[str, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = f"{path}.{key.value}" if path else str(key.value)
            lines.setdefault(name, key.start_mark.line + 1)
            _walk(value, name, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            name = f"{path}[{index}]"
            lines.setdefault(name, item.start_mark.line + 1)
            _walk(item, name, lines)
