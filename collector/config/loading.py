"""Loading a source: YAML in, a checked :class:`Source` out, or :class:`SourceError` with every
problem as one line naming the file and the field (at most ``MAX_PROBLEMS``)."""

from __future__ import annotations

import difflib
import os
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from collector.config.checks import _capped, _deep_checks, unresolved_references
from collector.config.problems import SourceError
from collector.config.source import Source
from collector.policy.ttl import alignment_problems


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing a key given twice in one mapping. YAML requires
    unique keys, but PyYAML keeps the last one silently: a second ``ttl:`` section, or a setting
    written twice, would undo the first without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # a merge key (<<) may be overridden; other keys are checked below
            key = self.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice (first on line {first_line[key]}); YAML would "
                    "keep only the last: remove one, or merge them",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


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


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    """An unknown key's problem, with the closest key the file may have meant."""
    close = difflib.get_close_matches(str(loc[-1]), sorted(_keys_at(loc[:-1])), n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]!r}? `collector schema` lists every key)"
    return "unknown key (check the spelling; `collector schema` lists every key)"


def _keys_at(loc: tuple[int | str, ...]) -> set[str]:
    """The keys a source file may have at ``loc`` (a pydantic error location): the fields, by
    their names in the file, of every model that can stand there."""
    models: list[type[BaseModel]] = [Source]
    for step in loc:
        if isinstance(step, int):
            continue  # a list index: the same models
        following: list[type[BaseModel]] = []
        for model in models:
            field = _field_named(model, step)
            if field is not None:
                following += _models_in(field.annotation)
            elif _is_tagged(model, step):
                following.append(model)  # a discriminator tag in the path (sink.jsonl...)
        models = following
    return {field.alias or name for model in models for name, field in model.model_fields.items()}


def _field_named(model: type[BaseModel], key: str) -> FieldInfo | None:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _is_tagged(model: type[BaseModel], tag: str) -> bool:
    field = model.model_fields.get("type")
    return field is not None and tag in typing.get_args(field.annotation)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation can hold (through Optional, unions, lists, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _problems_from(exc: ValidationError, label: str) -> list[str]:
    lines = []
    for error in exc.errors():
        where = _format_location(tuple(error["loc"]))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = _unknown_key(tuple(error["loc"]))
        elif error["type"] == "missing":
            message = "required key is missing"
        # A validator that finds several problems raises them one a line (TTL pairs, seed
        # URLs): each is a problem line of its own, at the same place.
        lines += [f"{label}: {where}: {line}" for line in message.splitlines() or [message]]
    return lines


def parse_source(data: Any, *, label: str, base_dir: Path, deep: bool = True) -> Source:
    """Check a parsed YAML/JSON document as a source; raise SourceError with every problem.

    ``deep=False`` skips the checks of what only a run uses (the suite, seed files, hooks):
    commands that only look at a source's stores (``status``, ``batches``, ``deadletters
    list``) still answer while the user is fixing one of those.
    """
    if not isinstance(data, dict):
        raise SourceError([f"{label}: the file must be a mapping of keys (name, seeds, ...)"])
    unresolved = [f"{label}: {problem}" for problem in unresolved_references(data)]
    try:
        source = Source.model_validate({**data, "base_dir": base_dir})
    except ValidationError as exc:
        problems = _problems_from(exc, label) + unresolved
        ttl = data.get("ttl")
        if isinstance(ttl, dict) and not any(": ttl: " in p for p in problems):
            # Field errors stop pydantic before the cross-field check; run it on the raw values
            # so every problem is reported at once.
            problems += [f"{label}: ttl: {problem}" for problem in alignment_problems(ttl)]
        raise SourceError(_capped(problems, label)) from None
    problems = unresolved + (_deep_checks(source, label) if deep else [])
    if problems:
        raise SourceError(_capped(problems, label))
    return source


_SOURCE_SUFFIXES = (".yaml", ".yml", ".json")


def _nearby(file: Path) -> str:
    """A hint for a source file not found: the file a user most likely meant beside it.

    The commonest slips are the source's name given for its file (``collector status shop``
    for ``shop.yaml``) and a misspelt name; both leave the right file in the same folder (the
    suite and deployment files ``collector init`` writes beside a source are not sources)."""
    try:
        names = sorted(
            p.name
            for p in file.parent.iterdir()
            if p.suffix in _SOURCE_SUFFIXES
            and not p.name.endswith((".suite.json", ".deployment.yaml"))
            and p.is_file()
        )
    except OSError:  # the folder itself is missing or unreadable: nothing to suggest
        return ""

    def shown(name: str) -> str:
        return name if file.parent == Path() else str(file.parent / name)

    exact = [name for name in names if name in {file.name + s for s in _SOURCE_SUFFIXES}]
    if exact:
        return f" ({shown(exact[0])} is there: give the source's file, not its name)"
    import difflib

    close = difflib.get_close_matches(file.name, names, n=1, cutoff=0.75)
    return f" (did you mean {shown(close[0])}?)" if close else ""


def load_source(path: str | os.PathLike[str], *, deep: bool = True) -> Source:
    """Read and check a source file (YAML or JSON); ``deep`` as for :func:`parse_source`."""
    file = Path(path)
    label = str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SourceError([f"{label}: file not found{_nearby(file)}"]) from None
    except IsADirectoryError:
        raise SourceError([f"{label}: is a folder; give the source's .yaml file in it"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError([f"{label}: cannot read: {exc}"]) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SourceError([f"{label}: invalid YAML: {where}{problem}"]) from None
    return parse_source(data, label=label, base_dir=file.resolve().parent, deep=deep)


def source_json_schema() -> dict[str, Any]:
    """The JSON schema of a source file (what `collector schema` prints)."""
    schema = Source.model_json_schema(by_alias=True)
    schema.get("properties", {}).pop("base_dir", None)
    return schema
