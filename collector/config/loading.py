"""Loading a source: YAML in, a checked :class:`Source` out, or :class:`SourceError` with every
problem as one line naming the file and the field (at most ``MAX_PROBLEMS``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from collector.config.checks import _capped, _deep_checks
from collector.config.source import Source
from collector.errors import ConfigError
from collector.policy.ttl import alignment_problems


class SourceError(ConfigError):
    """A source file is invalid; ``problems`` holds one actionable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


SourceError.__module__ = "collector.config"  # its public home (the error tree draws it there)


def _format_location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in {"jsonl", "postgres"}:  # discriminator tags add noise to the path
            continue
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(top level)"


def _problems_from(exc: ValidationError, label: str) -> list[str]:
    lines = []
    for error in exc.errors():
        where = _format_location(tuple(error["loc"]))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `collector schema` lists every key)"
        elif error["type"] == "missing":
            message = "required key is missing"
        # A validator that finds several problems raises them one a line (TTL pairs, seed
        # URLs): each is a problem line of its own, at the same place.
        lines += [f"{label}: {where}: {line}" for line in message.splitlines() or [message]]
    return lines


def parse_source(data: Any, *, label: str, base_dir: Path) -> Source:
    """Check a parsed YAML/JSON document as a source; raise SourceError with every problem."""
    if not isinstance(data, dict):
        raise SourceError([f"{label}: the file must be a mapping of keys (name, seeds, ...)"])
    try:
        source = Source.model_validate({**data, "base_dir": base_dir})
    except ValidationError as exc:
        problems = _problems_from(exc, label)
        ttl = data.get("ttl")
        if isinstance(ttl, dict) and not any(": ttl: " in p for p in problems):
            # Field errors stop pydantic before the cross-field check; run it on the raw values
            # so every problem is reported at once.
            problems += [f"{label}: ttl: {problem}" for problem in alignment_problems(ttl)]
        raise SourceError(_capped(problems, label)) from None
    problems = _deep_checks(source, label)
    if problems:
        raise SourceError(_capped(problems, label))
    return source


def load_source(path: str | os.PathLike[str]) -> Source:
    """Read and check a source file (YAML or JSON)."""
    file = Path(path)
    label = str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SourceError([f"{label}: file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError([f"{label}: cannot read: {exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SourceError([f"{label}: invalid YAML: {where}{problem}"]) from None
    return parse_source(data, label=label, base_dir=file.resolve().parent)


def source_json_schema() -> dict[str, Any]:
    """The JSON schema of a source file (what `collector schema` prints)."""
    schema = Source.model_json_schema(by_alias=True)
    schema.get("properties", {}).pop("base_dir", None)
    return schema
